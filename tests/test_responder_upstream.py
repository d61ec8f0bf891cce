"""SPEC-001 rules seen where they matter — at the upstream: the real box → the real gateway → the fake OpenAI.

Each test here fails on a responder that breaks its rule, where a test of the box's own bookkeeping would
pass: ENV-16 (an in-memory cache of model calls: two identical requests must both reach the upstream),
ENV-12 (attempts spaced in time: a fake clock drives the backoff and the upstream notes when it saw each
attempt), ENV-22 (the factual and the retry model on the Responses path), ENV-23 (the default of four tool
rounds), ENV-19 (the pinned envelope schema in the bodies of both paths).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from testing.fake_openai import FakeOpenAI, RecordedRequest, envelope, error, tool_call
from tests.scripted import deliver_params, in_process_box, init_params
from tests.test_envelope_schema import PINNED_FOR_OPENAI
from tests.test_responder_gateway import ALL_ASKED, Rig, open_rig

KEY = "sk-impyard-test-upstream-4e2a"
pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(key=KEY)]
REAL_WAIT_S = 0.05  # each fake sleep takes this long in real time


@pytest.fixture
async def rig(tmp_path: Path, fake: FakeOpenAI) -> AsyncIterator[Rig]:
    async with open_rig(tmp_path, fake, key=KEY) as opened:
        yield opened


# ------------------------------------------------------------------ ENV-16


async def test_env_16_two_identical_reply_requests_both_reach_the_upstream(rig: Rig) -> None:
    rig.fake.script(envelope(answer="first"), purpose="reply", times=1)
    rig.fake.script(envelope(answer="second"), purpose="reply")
    asked = deliver_params("the same question", "m1")
    again = asked.model_copy(update={"message": asked.message.model_copy(update={"id": "m2"})})
    # history_limit 0: the second prompt does not carry the first exchange, so the two requests are the same
    results = await rig.turns(asked, again, history_limit=0)
    first, second = rig.fake.requests_for("/chat/completions")
    assert first.body == second.body  # byte for byte the same request …
    assert [r.outcome for r in results] == ["sent", "sent"]
    assert [sent.content for sent in rig.surface.sent] == ["first", "second"]  # … answered twice, not cached


async def test_env_16_two_identical_picture_requests_both_reach_the_upstream(rig: Rig) -> None:
    rig.fake.script(envelope(answer=None, picture="an owl at dusk"), purpose="reply")
    asked = deliver_params("draw me an owl", "m1")
    again = asked.model_copy(update={"message": asked.message.model_copy(update={"id": "m2"})})
    await rig.turns(asked, again, history_limit=0)
    first, second = rig.fake.requests_for("/images/generations")
    assert first.body == second.body and first.body["prompt"] == "an owl at dusk"
    assert [len(sent.files) for sent in rig.surface.sent] == [1, 1]


# ------------------------------------------------------------------ ENV-12


class FakeTime:
    """A fake clock for the box's backoff: time moves only while the box sleeps, by what it asked for — and
    only once the sleep is over (a short real wait first), so an attempt that did not wait for its sleep
    reaches the upstream before the clock has moved."""

    def __init__(self) -> None:
        self.now = 0.0

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(REAL_WAIT_S)
        self.now += seconds


def seen_at(time: FakeTime, answers: list[Any], seen: list[float]) -> Any:
    """An upstream answer that notes the fake time at which each attempt reached the upstream."""

    def answer(request: RecordedRequest) -> Any:
        seen.append(time.now)
        return answers[min(len(seen), len(answers)) - 1]

    return answer


async def test_env_12_attempts_reach_the_upstream_spaced_by_exponential_backoff(rig: Rig) -> None:
    time, seen = FakeTime(), list[float]()
    boom = error(500, "the upstream is having a moment")
    rig.fake.script(seen_at(time, [boom, boom, envelope(answer="third time lucky")], seen), purpose="reply")
    async with in_process_box(rig.gateway, rig.state_dir, sleep=time.sleep) as box:  # type: ignore[arg-type]
        await box.init(init_params(retry_backoff_s=1.5))
        result = await box.deliver(deliver_params("hi"))
    assert result.outcome == "sent"
    assert seen == [0.0, 1.5, 4.5]  # 1.5 s, then 3 s between consecutive attempts


async def test_env_12_three_failures_raise_and_nothing_waits_after_the_last(rig: Rig) -> None:
    time, seen = FakeTime(), list[float]()
    rig.fake.script(seen_at(time, [error(500, "down")], seen), purpose="reply")
    async with in_process_box(rig.gateway, rig.state_dir, sleep=time.sleep) as box:  # type: ignore[arg-type]
        await box.init(init_params(retry_backoff_s=2.0))
        result = await box.deliver(deliver_params("hi"))
    assert result.outcome == "failed" and "no usable answer after 3 attempts" in (result.error or "")
    assert seen == [0.0, 2.0, 6.0]
    assert time.now == 6.0  # the third failure raises at once


async def test_env_12_a_retry_after_from_the_upstream_stretches_the_wait(rig: Rig) -> None:
    time, seen = FakeTime(), list[float]()
    answers = [error(429, "slow down", retry_after=5), error(500, "down"), envelope(answer="ok")]
    rig.fake.script(seen_at(time, answers, seen), purpose="reply")
    async with in_process_box(rig.gateway, rig.state_dir, sleep=time.sleep) as box:  # type: ignore[arg-type]
        await box.init(init_params(retry_backoff_s=1.0))
        assert (await box.deliver(deliver_params("hi"))).outcome == "sent"
    assert seen == [0.0, 5.0, 7.0]  # max(1 s, the 5 s asked for), then 2 s


# ------------------------------------------------------------------ ENV-22


async def test_env_22_the_factual_model_reads_tool_results_on_the_responses_path(rig: Rig) -> None:
    rig.fake.script(tool_call("search", {"query": "owls"}, call_id="call_1"), path="/responses", times=1)
    rig.fake.script(envelope(answer="owls, yes"), purpose="reply")
    [result] = await rig.turns(
        deliver_params("owls?"),
        use_responses_api=True,
        tools=["search"],
        model="gpt-5.1",
        factual_model="gpt-4.1",
    )
    assert result.outcome == "sent" and rig.fake.requests_for("/chat/completions") == []
    assert [body["model"] for body in rig.bodies("/responses")] == ["gpt-5.1", "gpt-4.1"]


async def test_env_22_the_retry_model_after_a_rate_limit_on_the_responses_path(rig: Rig) -> None:
    rig.fake.script(error(429, "slow down"), path="/responses", times=1)
    rig.fake.script(envelope(answer="here"), purpose="reply")
    results = await rig.turns(
        deliver_params("one", "m1"), deliver_params("two", "m2"),
        use_responses_api=True, model="gpt-5.1", retry_model="gpt-4.1-nano",
    )  # fmt: skip
    assert [r.outcome for r in results] == ["sent", "sent"] and rig.fake.requests_for(
        "/chat/completions"
    ) == []
    # ENV-15 on this path: the retry model after the 429, the configured model again after a success
    assert [body["model"] for body in rig.bodies("/responses")] == ["gpt-5.1", "gpt-4.1-nano", "gpt-5.1"]


# ------------------------------------------------------------------ ENV-23


async def test_env_23_four_tool_rounds_by_default_then_a_tool_less_answer(rig: Rig) -> None:
    rig.fake.script(tool_call("search", {"query": "deeper"}), path="/responses", times=4)
    rig.fake.script(envelope(answer="that is all I found"), purpose="reply")
    [result] = await rig.turns(deliver_params("dig"), use_responses_api=True, tools=["search"])
    assert result.outcome == "sent" and rig.surface.sent[0].content == "that is all I found"
    assert ["tools" in body for body in rig.bodies("/responses")] == [True, True, True, True, False]


# ------------------------------------------------------------------ ENV-19 on the wire


async def test_env_19_both_paths_send_the_pinned_schema_strict_and_named_envelope(rig: Rig) -> None:
    rig.fake.script(envelope(answer="ok"), purpose="reply")
    await rig.turns(deliver_params("chat path", "m1"), **ALL_ASKED)
    await rig.turns(deliver_params("responses path", "m2"), use_responses_api=True, **ALL_ASKED)
    [chat] = rig.bodies()
    [responses] = rig.bodies("/responses")
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "envelope", "strict": True, "schema": PINNED_FOR_OPENAI},
    }
    assert responses["text"] == {
        "format": {"type": "json_schema", "name": "envelope", "strict": True, "schema": PINNED_FOR_OPENAI}
    }
