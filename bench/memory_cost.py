"""What a memory turn costs (issue 33): tokens, the prompt cache's share, USD — pure functions over request bodies.

The ``memory_turn`` scenario (``bench/memory.py``) captures every request that leaves the host for the model API
(the broker's exact bytes) and the answer; these functions turn them into figures.

* **Tokens** are estimated from the request as sent, as characters / 4 (no GPT tokenizer is a dependency:
  ``tokenizers`` is in the environment only for sentence-transformers, without an OpenAI vocabulary). The count
  is what the provider bills as input: the text of every message (or Responses ``instructions`` and input item),
  3 tokens of framing per message and 3 to prime the answer (OpenAI's cookbook count for chat models), and the
  structured-output schema and function tools, which the API counts as input too. The fake model's own usage
  counts message text only, so it is lower; output tokens are its ``completion_tokens`` (characters / 4 of what
  it wrote).
* **The cacheable share** of a request against the one before it: the length of the prefix the two prompts
  share, over the current prompt's length, with the prompt written in the order the provider reads it (the
  function tools and the response schema, then every message in order). OpenAI's prompt cache holds a prefix
  only from 1,024 tokens, and in steps of 128 beyond (openai-cookbook, ``examples/Prompt_Caching_201.ipynb``,
  "Cache hits require an exact, repeated prefix match and works automatically for prompts containing 1024 tokens
  or more, with cache hits occurring in increments of 128 tokens"; schemas and tools are part of the prefix):
  ``cached_tokens`` applies that rule to a shared prefix.
* **USD** from the shipped price table (``policies/default.toml``: input, cached input and output per million
  tokens), with ``impyard.gateway.prices.token_cost_micros``, the ledger's own arithmetic.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from box.common.request_bodies import shared_prefix_share
from impyard.gateway.policy_models import Price
from impyard.gateway.prices import MICROS_PER_USD, Usage, token_cost_micros

CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 3  # <|start|>role … <|end|> around each message
TOKENS_TO_PRIME = 3  # the assistant's answer is primed with <|start|>assistant<|message|>
CACHE_MIN_TOKENS = 1024  # OpenAI caches a prompt prefix only from this length …
CACHE_STEP_TOKENS = 128  # … and in steps of this beyond it
TURNS_PER_PRICE = 1_000  # the README's unit: USD per 1,000 turns


def _text_of(content: Any) -> str:
    """The text of a message's content: a string, or the ``text`` of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            _text_of(part.get("text") if "text" in part else part.get("content"))
            for part in content
            if isinstance(part, dict)
        )
    return ""


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=False)


def schema_and_tools(path: str, body: Mapping[str, Any]) -> str:
    """What the provider puts before the messages: the function tools, then the structured-output schema."""
    parts = []
    if body.get("tools"):
        parts.append(_json(body["tools"]))
    fmt = (
        body.get("response_format") if path == "/chat/completions" else (body.get("text") or {}).get("format")
    )
    if fmt:
        parts.append(_json(fmt))
    return "".join(parts)


def _items(path: str, body: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(role, text) of every message in order (Responses: ``instructions`` first, then the input items)."""
    if path == "/chat/completions":
        messages = body.get("messages")
        return [
            (
                str(m.get("role", "")),
                _text_of(m.get("content")) + (_json(m["tool_calls"]) if m.get("tool_calls") else ""),
            )
            for m in messages or ()
            if isinstance(m, dict)
        ]
    items: list[tuple[str, str]] = []
    if isinstance(body.get("instructions"), str):
        items.append(("developer", body["instructions"]))
    given = body.get("input")
    if isinstance(given, str):
        items.append(("user", given))
    elif isinstance(given, list):
        for item in given:
            if isinstance(item, dict):
                text = _text_of(item.get("content") if "content" in item else item.get("output"))
                items.append((str(item.get("role", item.get("type", ""))), text or _json(item)))
    return items


def prompt_text(path: str, body: Mapping[str, Any]) -> str:
    """The prompt as the provider reads it, for prefix comparison: tools and schema, then each message's role
    and text in order (the rest of the body, model name and output cap, is no part of the cached prefix)."""
    if path == "/embeddings":
        return _json(body.get("input"))
    return schema_and_tools(path, body) + "".join(
        f"\x00{role}\x00{text}" for role, text in _items(path, body)
    )


def input_tokens(path: str, body: Mapping[str, Any]) -> int:
    """Input tokens of a request, estimated as characters / 4 plus the chat framing (see the module doc)."""
    if path == "/embeddings":
        given = body.get("input")
        texts = [given] if isinstance(given, str) else [t for t in given or () if isinstance(t, str)]
        return sum(math.ceil(len(t) / CHARS_PER_TOKEN) for t in texts)
    items = _items(path, body)
    chars = len(schema_and_tools(path, body)) + sum(len(text) for _role, text in items)
    return math.ceil(chars / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(items) + TOKENS_TO_PRIME


def output_tokens(response: Any) -> int:
    """Output tokens from the answer's usage (chat: completion_tokens; Responses: output_tokens)."""
    usage = response.get("usage") if isinstance(response, dict) else None
    if not isinstance(usage, dict):
        return 0
    for key in ("completion_tokens", "output_tokens"):
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def messages_share(share: float, prompt: str, head: int) -> float:
    """The share of the messages alone, from a share of the whole prompt whose first ``head`` characters are the
    tools and schema (the same in both, or the share stops inside them: then 0)."""
    shared = round(share * len(prompt))
    if shared < head or len(prompt) <= head:
        return 0.0
    return (shared - head) / (len(prompt) - head)


def cached_tokens(shared_prefix_tokens: int, input_tokens: int) -> int:
    """What OpenAI's prompt cache would serve of a request whose first ``shared_prefix_tokens`` were sent just
    before: nothing under 1,024 tokens, else 1,024 and whole steps of 128, never more than the input."""
    shared = min(shared_prefix_tokens, input_tokens)
    if shared < CACHE_MIN_TOKENS:
        return 0
    return CACHE_MIN_TOKENS + (shared - CACHE_MIN_TOKENS) // CACHE_STEP_TOKENS * CACHE_STEP_TOKENS


def call_micros(price: Price, tokens_in: int, tokens_out: int, tokens_cached: int = 0) -> int:
    """A call's cost in micro-USD at ``price``, as the ledger counts it (cached input at ``cached_input``)."""
    return token_cost_micros(
        price, Usage(input_tokens=tokens_in, cached_tokens=tokens_cached, output_tokens=tokens_out)
    )


def usd_per_1000_turns(micros_per_turn: float) -> float:
    """USD per 1,000 turns from the mean micro-USD a turn costs."""
    return micros_per_turn * TURNS_PER_PRICE / MICROS_PER_USD


# ------------------------------------------------------------------ one conversation's turns, in figures


@dataclass(frozen=True)
class Sent:
    """One request that reached the model API (the broker's call): who asked, for what, its prompt and tokens."""

    imp: str
    channel_id: str
    path: str
    purpose: str
    model: str
    start: float  # perf_counter seconds
    end: float
    prompt: str  # prompt_text: what the prompt cache compares
    tokens_in: int
    tokens_out: int
    head: int = 0  # characters of the prompt before the messages: the function tools and the response schema


@dataclass(frozen=True)
class Turn:
    """One turn of a conversation (``number`` counts from its first message, 1-based) and what it sent."""

    number: int
    landed: float  # when the reply reached the surface (perf_counter seconds)
    sent: tuple[Sent, ...]


@dataclass(frozen=True)
class TurnCost:
    """A turn in tokens and micro-USD, with the cacheable share of each of its reply requests."""

    number: int
    calls: dict[str, int]  # purpose -> calls
    tokens_in: dict[str, int]  # purpose -> input tokens
    tokens_out: dict[str, int]
    micros: int  # at the shipped prices, no prompt cache
    micros_cached: int  # the same with what the prompt cache would serve at cached-input prices
    cached_tokens: int
    # ("turn" | "hop", share, share of the messages alone) per reply request after the conversation's first
    shares: tuple[tuple[str, float, float], ...]
    unpriced: frozenset[str] = frozenset()


def before_reply(turn: Turn) -> list[Sent]:
    """The calls a turn made before its reply call: the last reply request started before the reply landed is
    the reply call; everything started before it (a discarded draft included) came first."""
    replies = [s for s in turn.sent if s.purpose == "reply" and s.start < turn.landed]
    if not replies:
        return [s for s in turn.sent if s.start < turn.landed]
    reply = max(replies, key=lambda s: s.start)
    return [s for s in turn.sent if s.start < reply.start]


def chain(sent: list[Sent]) -> int:
    """The longest chain of calls each started after the one before it ended: calls waited for in a row."""
    count, free_at = 0, float("-inf")
    for call in sorted(sent, key=lambda s: s.end):
        if call.start >= free_at:
            count, free_at = count + 1, call.end
    return count


def path_figures(turn: Turn) -> dict[str, Any]:
    """Model API calls before the reply call (in all and in a row, by purpose) and in the whole turn."""
    first = before_reply(turn)
    by_purpose: Counter[str] = Counter(s.purpose for s in first)
    return {
        "before_reply": len(first),
        "sequential_before_reply": chain(first),
        "before_reply_by_purpose": dict(sorted(by_purpose.items())),
        "in_all": len(turn.sent),
        "in_all_by_purpose": dict(sorted(Counter(s.purpose for s in turn.sent).items())),
    }


def conversation_costs(turns: Sequence[Turn], prices: Mapping[str, Price]) -> list[TurnCost]:
    """Each turn of one conversation in tokens and micro-USD. A request's cacheable prefix is what it shares
    with the conversation's previous request of the same purpose and model (the reply: the previous reply
    request, a hop of the same turn or the last of the turn before); embeddings are never cached."""
    last: dict[tuple[str, str], tuple[int, str]] = {}  # (purpose, model) -> (turn number, prompt)
    out: list[TurnCost] = []
    for turn in turns:
        calls: Counter[str] = Counter()
        tokens_in: Counter[str] = Counter()
        tokens_out: Counter[str] = Counter()
        micros = micros_cached = cached_total = 0
        shares: list[tuple[str, float, float]] = []
        unpriced: set[str] = set()
        for sent in sorted(turn.sent, key=lambda s: s.start):
            calls[sent.purpose] += 1
            tokens_in[sent.purpose] += sent.tokens_in
            tokens_out[sent.purpose] += sent.tokens_out
            key = (sent.purpose, sent.model)
            cached = 0
            if key in last and sent.path != "/embeddings":
                number, prompt = last[key]
                share = shared_prefix_share(prompt, sent.prompt)
                cached = cached_tokens(math.floor(share * sent.tokens_in), sent.tokens_in)
                if sent.purpose == "reply":
                    kind = "hop" if number == turn.number else "turn"
                    shares.append((kind, share, messages_share(share, sent.prompt, sent.head)))
            last[key] = (turn.number, sent.prompt)
            price = prices.get(sent.model)
            if price is None:
                unpriced.add(sent.model)
                continue
            micros += call_micros(price, sent.tokens_in, sent.tokens_out)
            micros_cached += call_micros(price, sent.tokens_in, sent.tokens_out, cached)
            cached_total += cached
        out.append(
            TurnCost(
                turn.number, dict(calls), dict(tokens_in), dict(tokens_out), micros, micros_cached,
                cached_total, tuple(shares), frozenset(unpriced),
            )
        )  # fmt: skip
    return out


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def at_turn(costs: Sequence[TurnCost], number: int) -> dict[str, Any] | None:
    """A conversation at turn ``number``: the mean of turns ``number - 1`` to ``number + 1`` (what is there of
    them), so a call made every third turn (the summary) counts a third, as in a long run. None: not reached."""
    window = [c for c in costs if number - 1 <= c.number <= number + 1]
    if not any(c.number == number for c in costs):
        return None
    purposes = sorted({p for c in window for p in c.calls})
    calls = {p: sum(c.calls.get(p, 0) for c in window) for p in purposes}
    tokens_in = {p: sum(c.tokens_in.get(p, 0) for c in window) for p in purposes}
    n = len(window)
    micros = _mean([c.micros for c in window])
    micros_cached = _mean([c.micros_cached for c in window])
    return {
        "turns": [c.number for c in window],
        "input_tokens": round(_mean([sum(c.tokens_in.values()) for c in window])),
        "output_tokens": round(_mean([sum(c.tokens_out.values()) for c in window])),
        "cached_tokens": round(_mean([c.cached_tokens for c in window])),
        "input_tokens_by_purpose": {p: round(tokens_in[p] / n) for p in purposes},
        "input_tokens_per_call": {p: round(tokens_in[p] / calls[p]) for p in purposes if calls[p]},
        "calls_per_turn": {p: round(calls[p] / n, 2) for p in purposes},
        "usd_per_1000_turns": round(usd_per_1000_turns(micros), 3),
        "usd_per_1000_turns_cached": round(usd_per_1000_turns(micros_cached), 3),
        "unpriced": sorted({m for c in window for m in c.unpriced}),
    }


def share_figures(costs: Sequence[TurnCost], from_turn: int) -> dict[str, Any]:
    """The cacheable share of reply requests from turn ``from_turn`` on: against the previous turn's and between
    the hops of one turn, each mean and min (None where there were none)."""

    def stats(values: list[float]) -> dict[str, Any]:
        return {
            "n": len(values),
            "mean": round(_mean(values), 3) if values else None,
            "min": round(min(values), 3) if values else None,
        }

    picked = [share for c in costs if c.number >= from_turn for share in c.shares]
    return {
        "from_turn": from_turn,
        "all": stats([s for _k, s, _m in picked]),
        "turn": stats([s for k, s, _m in picked if k == "turn"]),
        "hop": stats([s for k, s, _m in picked if k == "hop"]),
        "messages_only": stats([m for _k, _s, m in picked]),
    }
