"""What a memory turn costs (issue 33, bench/memory_cost.py): the cacheable share, the prompt cache's rule, tokens
and USD, each against figures worked out by hand."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bench.fake_model import filter_answer
from bench.memory import shipped_prices
from bench.memory_cost import (
    Sent,
    Turn,
    at_turn,
    before_reply,
    cached_tokens,
    call_micros,
    conversation_costs,
    input_tokens,
    path_figures,
    prompt_text,
    share_figures,
    shared_prefix_share,
    usd_per_1000_turns,
)
from impyard.gateway.policy_models import Price
from testing.fake_openai import RecordedRequest

GPT_5_1 = Price(input=1.25, cached_input=0.125, output=10.0)  # policies/default.toml, USD per 1M tokens
EMBEDDING = Price(input=0.02)
SCHEMA_CHARS = 1000


@pytest.mark.parametrize(
    ("previous", "current", "share"),
    [
        ("abc", "abc", 1.0),
        ("abc", "abd", 2 / 3),
        ("abc", "abcdef", 0.5),  # the current request is longer: its new tail is not shared
        ("abcdef", "abc", 1.0),  # all of the current one was sent before
        ("xbc", "abc", 0.0),  # the first character differs: nothing is shared from the start
        ("abc", "", 0.0),
        ("", "abc", 0.0),
        ("a" * 5000 + "X", "a" * 5000 + "Y" + "b" * 999, 5000 / 6000),  # past the first 4,096-character slice
        ("a" * 8192, "a" * 8192 + "c" * 8192, 0.5),  # whole slices alike
    ],
)
def test_the_shared_prefix_share_is_the_identical_start_over_the_current_length(
    previous: str, current: str, share: float
) -> None:
    assert shared_prefix_share(previous, current) == pytest.approx(share)


@pytest.mark.parametrize(
    ("shared", "total", "cached"),
    [
        (1023, 5000, 0),  # under OpenAI's 1,024-token minimum nothing is cached
        (1024, 5000, 1024),
        (1151, 5000, 1024),  # beyond it, whole steps of 128 only
        (1152, 5000, 1152),
        (4000, 5000, 3968),  # 1024 + 23 × 128
        (3000, 2000, 1920),  # never more than the input: 1024 + 7 × 128 of the 2,000
    ],
)
def test_the_prompt_cache_serves_1024_tokens_and_steps_of_128(shared: int, total: int, cached: int) -> None:
    assert cached_tokens(shared, total) == cached


def test_a_call_costs_the_ledgers_arithmetic_and_1000_turns_are_its_mean_times_a_thousand() -> None:
    # 10,000 in × 1.25 + 100 out × 10 = 12,500 + 1,000 micro-USD
    assert call_micros(GPT_5_1, 10_000, 100) == 13_500
    # 8,192 of the 10,000 cached: 1,808 × 1.25 + 8,192 × 0.125 + 1,000 = 2,260 + 1,024 + 1,000
    assert call_micros(GPT_5_1, 10_000, 100, 8_192) == 4_284
    assert call_micros(EMBEDDING, 50, 0) == 1  # 50 × 0.02 = 1 micro-USD
    assert usd_per_1000_turns(13_500) == pytest.approx(13.5)
    assert usd_per_1000_turns(4_284.5) == pytest.approx(4.2845)


def test_the_shipped_price_table_prices_the_reply_model_with_its_cached_input() -> None:
    price = shipped_prices()["gpt-5.1"]
    assert (price.input, price.cached_input, price.output) == (1.25, 0.125, 10.0)


def test_input_tokens_count_the_messages_their_framing_and_the_schema() -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "envel", "schema": {"type": "object"}}}
    body = {
        "model": "gpt-5.1",
        "messages": [
            {"role": "system", "content": "s" * 40},
            {"role": "user", "content": [{"type": "text", "text": "u" * 80}]},
        ],
        "response_format": schema,
        "max_completion_tokens": 4096,
    }
    schema_chars = len(json.dumps(schema, separators=(",", ":")))
    assert schema_chars == 80
    # (40 + 80 + 80) / 4 = 50, + 3 a message, + 3 to prime the answer
    assert input_tokens("/chat/completions", body) == 50 + 6 + 3
    assert input_tokens("/embeddings", {"model": "text-embedding-3-small", "input": "x" * 41}) == 11
    # the prompt puts the schema first, then each message in order; the model and the cap are no part of it
    text = prompt_text("/chat/completions", body)
    assert text.startswith(json.dumps(schema, separators=(",", ":")) + "\x00system\x00" + "s" * 40)
    assert "gpt-5.1" not in text and "4096" not in text


def sent(
    purpose: str, start: float, end: float, prompt: str = "", tokens_in: int = 0, tokens_out: int = 0
) -> Sent:
    model = "text-embedding-3-small" if purpose == "embedding" else "gpt-5.1"
    path = "/embeddings" if purpose == "embedding" else "/chat/completions"
    head = SCHEMA_CHARS if purpose == "reply" else 0  # the reply prompts below open with a schema this long
    return Sent("imp", "dm", path, purpose, model, start, end, prompt, tokens_in, tokens_out, head)


def test_calls_before_the_reply_are_those_started_before_the_reply_call() -> None:
    normal = Turn(
        5, landed=3.1,
        sent=(sent("embedding", 0, 1), sent("filter", 1, 2), sent("reply", 2, 3), sent("appraisal", 3.2, 4)),
    )  # fmt: skip
    assert [s.purpose for s in before_reply(normal)] == ["embedding", "filter"]
    assert path_figures(normal) == {
        "before_reply": 2, "sequential_before_reply": 2,
        "before_reply_by_purpose": {"embedding": 1, "filter": 1},
        "in_all": 4, "in_all_by_purpose": {"appraisal": 1, "embedding": 1, "filter": 1, "reply": 1},
    }  # fmt: skip
    # a memory question: the first draft is a call before the reply that is sent; the summary ran beside
    question = Turn(
        9, landed=5.5,
        sent=(
            sent("embedding", 0, 1), sent("summary", 0, 2), sent("filter", 1, 2), sent("reply", 2, 3),
            sent("embedding", 3, 4), sent("reply", 4, 5),
        ),
    )  # fmt: skip
    figures = path_figures(question)
    assert figures["before_reply"] == 5 and figures["sequential_before_reply"] == 4
    assert figures["before_reply_by_purpose"] == {"embedding": 2, "filter": 1, "reply": 1, "summary": 1}


def test_a_conversation_in_tokens_shares_and_usd() -> None:
    stable = "P" * 6000
    turns = [
        Turn(9, 1.5, (sent("embedding", 0, 0.1, "w9", 10), sent("reply", 0.2, 1, stable + "A" * 2000, 2000, 50))),
        Turn(10, 2.5, (sent("embedding", 2, 2.1, "w10", 10), sent("reply", 2.2, 2.4, stable + "B" * 2000, 2000, 50))),
        Turn(
            11, 4.5,
            (
                sent("embedding", 3, 3.1, "w11", 10),
                sent("reply", 3.2, 3.4, stable + "B" * 1000 + "C" * 3000, 2500, 50),
                sent("reply", 4.0, 4.2, stable + "B" * 1000 + "C" * 3000 + "D" * 2000, 3000, 60),
            ),
        ),
    ]  # fmt: skip
    costs = conversation_costs(turns, {"gpt-5.1": GPT_5_1, "text-embedding-3-small": EMBEDDING})
    # turn 9 is the conversation's first reply request: no share, nothing cached
    assert costs[0].shares == () and costs[0].cached_tokens == 0
    assert costs[0].micros == 1 + 2000 * 1.25 + 50 * 10 == 3001  # the embedding's 10 × 0.02 = 0.2, rounded up
    # turn 10 against turn 9: 6,000 of 8,000 characters = 0.75 of 2,000 tokens = 1,500 → 1,024 + 3 × 128 cached
    assert costs[1].shares == (
        ("turn", 0.75, 5000 / 7000),
    )  # the messages alone: 5,000 of 7,000 after the schema
    assert costs[1].cached_tokens == 1408
    assert costs[1].micros_cached == 1 + (592 * 1.25 + 1408 * 0.125 + 500) == 1417
    # turn 11: 7,000 of 10,000 against turn 10; the second hop 10,000 of 12,000 against the first
    assert costs[2].shares == (
        ("turn", 0.7, pytest.approx(6000 / 9000)),
        ("hop", pytest.approx(10_000 / 12_000), pytest.approx(9000 / 11_000)),
    )
    assert costs[2].cached_tokens == 1664 + 2432  # floor(0.7 × 2,500) = 1,750 → 1,664; 2,500 → 2,432
    assert costs[2].calls == {"embedding": 1, "reply": 2}
    shares = share_figures(costs, 10)
    assert shares["all"] == {"n": 3, "mean": pytest.approx(0.761, abs=1e-3), "min": 0.7}
    assert shares["turn"]["n"] == 2 and shares["hop"] == {"n": 1, "mean": 0.833, "min": 0.833}
    assert shares["messages_only"] == {"n": 3, "mean": 0.733, "min": 0.667}  # (0.714 + 0.667 + 0.818) / 3
    at_10 = at_turn(costs, 10)
    assert at_10 is not None and at_10["turns"] == [9, 10, 11]
    assert at_10["input_tokens"] == round((2010 + 2010 + 5510) / 3)
    assert at_10["input_tokens_per_call"] == {"embedding": 10, "reply": 2375}  # 9,500 over 4 reply calls
    assert at_10["calls_per_turn"] == {"embedding": 1.0, "reply": 1.33}
    micros = [c.micros for c in costs]
    assert micros == [3001, 3001, 1 + (5500 * 1.25 + 110 * 10)]
    assert at_10["usd_per_1000_turns"] == round(sum(micros) / 3 * 1000 / 1_000_000, 3)
    assert at_turn(costs, 40) is None  # not reached


def test_an_unpriced_model_is_named_not_counted_free() -> None:
    costs = conversation_costs([Turn(1, 2.0, (sent("reply", 0, 1, "x", 100, 10),))], {})
    assert costs[0].micros == 0 and costs[0].unpriced == frozenset({"gpt-5.1"})
    at = at_turn(costs, 1)
    assert at is not None and at["unpriced"] == ["gpt-5.1"]


def filter_request(words: str) -> RecordedRequest:
    body: dict[str, Any] = {
        "model": "gpt-5.1",
        "messages": [
            {"role": "system", "content": "pick memories"},
            {"role": "user", "content": f"THE WORDS\n{words}"},
        ],
    }
    return RecordedRequest("/v1/chat/completions", {}, body, "filter", 0.0)


def test_the_fake_filter_reads_a_memory_question_as_asking_for_memory() -> None:
    assert filter_answer(filter_request("What did I tell you about thing 3?"))["asks_for_memory"] is True
    assert filter_answer(filter_request("hello pip, how is your day going?"))["asks_for_memory"] is False
