"""The memory's model calls (box/memory/calls.py): routing, tolerant JSON, busy backoff, the call log."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from box.memory.calls import (
    CallLog,
    CallRecord,
    MemoryModel,
    parse_json_object,
)
from box.protocol import ErrorCode, RpcError
from box.protocol.models import MemorySettings, ModelRequestResult

pytestmark = pytest.mark.anyio

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


def chat(content: str | None, status: int = 200, **message: Any) -> ModelRequestResult:
    return ModelRequestResult(
        status=status, body={"choices": [{"message": {"role": "assistant", "content": content, **message}}]}
    )


def http(status: int, headers: dict[str, str] | None = None) -> ModelRequestResult:
    return ModelRequestResult(status=status, body={"error": {"message": "busy"}}, headers=headers or {})


@dataclass
class FakeClient:
    """Answers from a script (the last answer repeats) and records every request."""

    answers: Sequence[ModelRequestResult | RpcError]
    requests: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)

    async def call(self, path: str, body: dict[str, Any], purpose: str) -> ModelRequestResult:
        self.requests.append((path, json.loads(json.dumps(body)), purpose))
        answer = self.answers[min(len(self.requests), len(self.answers)) - 1]
        if isinstance(answer, RpcError):
            raise answer
        return answer


@dataclass
class Sleeps:
    """A fake sleep that advances a turn clock, so a deadline can be measured against it."""

    slept: list[float] = field(default_factory=list)

    async def __call__(self, seconds: float) -> None:
        self.slept.append(seconds)

    @property
    def total(self) -> float:
        return sum(self.slept)


def model(
    client: FakeClient,
    *,
    settings: MemorySettings | None = None,
    sleeps: Sleeps | None = None,
    call_log: CallLog | None = None,
    deadline_s: float | None = None,
    recorded: list[CallRecord] | None = None,
) -> MemoryModel:
    sleeps = sleeps if sleeps is not None else Sleeps()

    def deadline() -> float | None:
        return None if deadline_s is None else deadline_s - sleeps.total

    return MemoryModel(
        client,
        settings or MemorySettings(),
        "gpt-4.1-mini",
        call_log=call_log,
        sleep=sleeps,
        clock=lambda: NOW,
        deadline=deadline,
        recorders=(recorded.append,) if recorded is not None else (),
    )


# ------------------------------------------------------------------ mechanism 55: routing


def test_m55_unrouted_purposes_use_the_default_model() -> None:
    m = model(FakeClient([]), settings=MemorySettings(models={"appraisal": "gpt-4.1-nano"}))
    assert m.model_for("appraisal") == "gpt-4.1-nano"
    assert m.model_for("filter") == "gpt-4.1-mini"


async def test_m55_a_call_goes_to_its_purposes_model() -> None:
    client = FakeClient([chat('{"ok": true}')])
    m = model(client, settings=MemorySettings(models={"summary": "gpt-4o-mini"}))
    assert await m.chat_json("summary", "sys", "usr", temperature=0.4) == {"ok": True}
    path, body, purpose = client.requests[0]
    assert (path, body["model"], purpose) == ("/chat/completions", "gpt-4o-mini", "summary")
    assert body["messages"] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "usr"}]
    assert body["temperature"] == 0.4


async def test_m120_a_schema_asks_for_strict_structured_output() -> None:
    client = FakeClient([chat('{"keep": [1]}')])
    schema = {"type": "object", "properties": {"keep": {"type": "array"}}, "required": ["keep"]}
    assert await model(client).chat_json("filter", "s", "u", temperature=0.2, schema=schema) == {"keep": [1]}
    assert client.requests[0][1]["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "filter", "strict": True, "schema": schema},
    }


async def test_m120_without_a_schema_no_response_format_is_sent() -> None:
    client = FakeClient([chat('{"a": 1}')])
    await model(client).chat_json("sleep", "s", "u", temperature=None)
    assert "response_format" not in client.requests[0][1]
    assert "temperature" not in client.requests[0][1]


# ------------------------------------------------------------------ mechanism 120: tolerant JSON


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ('```json\n{"a": 1}\n```', {"a": 1}),
        ('```\n{"a": 1}\n```', {"a": 1}),
        ('{"valence": +0.5, "list": [+1, -2]}', {"valence": 0.5, "list": [1, -2]}),
        ('{"valence": +.5}', {"valence": 0.5}),
        (
            '{"v": +0.5, "phone": "call: +44 20"}',
            {"v": 0.5, "phone": "call: +44 20"},
        ),  # "+" in a string stays
        ('Sure! {"a": {"b": "}"}, "v": 2} and {"z": 1}', {"a": {"b": "}"}, "v": 2}),  # first {...}
        ('noise {"a": "say \\"}\\" here"} tail', {"a": 'say "}" here'}),
        ('```json\n{"v": +1}\n``` done', {"v": 1}),
        ('{"a": "ends in \\\\", "v": +1} {"z": 0}', {"a": "ends in \\", "v": 1}),  # an escaped backslash
    ],
)
def test_m120_tolerant_parse(text: str, expected: dict[str, Any]) -> None:
    assert parse_json_object(text) == expected


@pytest.mark.parametrize("text", ["", "no json here", "[1, 2]", '"a string"', "{not json}", '{"a": 1'])
def test_m120_unreadable_answers_give_none(text: str) -> None:
    assert parse_json_object(text) is None


async def test_m120_bad_json_is_asked_again_with_the_note() -> None:
    client = FakeClient([chat("I feel fine"), chat('{"feeling": "fine"}')])
    assert await model(client).chat_json("appraisal", "sys", "usr", temperature=0.4) == {"feeling": "fine"}
    assert len(client.requests) == 2
    messages = client.requests[1][1]["messages"]
    assert messages[:3] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "usr"},
        {"role": "assistant", "content": "I feel fine"},
    ]
    assert messages[3]["role"] == "user" and "NOT valid JSON" in messages[3]["content"]


async def test_m120_two_bad_answers_give_none_after_one_retry() -> None:
    client = FakeClient([chat("nope")])
    assert await model(client).chat_json("filter", "s", "u", temperature=0.2) is None
    assert len(client.requests) == 2


async def test_m46_reply_retries_twice(tmp_path: Path) -> None:
    """Mechanism 46 on the reply path itself (it never goes through ``chat_json``): the real box asks the
    reply call three times in all; a third unreadable answer fails the turn (53), and a good answer after
    two bad ones is what is said. Every attempt is the same request: no repair note (ENV-18)."""
    from datetime import timedelta

    from tests.memory.engine_kit import Kit, envelope

    kit = Kit(tmp_path)
    try:
        await kit.seed(
            "Ann and I planted tulips.", intensity=0.1, ago=timedelta(days=60)
        )  # known: no probe 25
        kit.model.script("reply", "{bad", "not json at all", "{still bad")  # a 4th call would get a good one
        async with kit.box() as box:
            failed = await box.say("hello")
        asked = kit.model.of("reply")
        kit.model.script("reply", "{bad", "{bad again", envelope("third time lucky"))
        async with kit.box() as box:
            spoken = await box.say("hello again")
        again = kit.model.of("reply")[len(asked) :]
    finally:
        kit.close()
    assert failed.outcome == "failed" and len(asked) == 3  # the first call and two retries, no fourth
    assert asked[0].body["messages"] == asked[1].body["messages"] == asked[2].body["messages"]
    assert spoken.outcome == "sent" and len(again) == 3
    assert [getattr(p, "content", "") for p in kit.host.sent] == ["third time lucky"]


async def test_m120_a_refusal_is_not_asked_again() -> None:
    client = FakeClient([chat(None, refusal="I can't help with that")])
    assert await model(client).chat_json("appraisal", "s", "u", temperature=0.4) is None
    assert len(client.requests) == 1


@pytest.mark.parametrize("body", [None, {}, {"choices": []}, {"choices": [{"message": "x"}]}])
async def test_m120_an_answer_without_a_message_gives_none(body: Any) -> None:
    client = FakeClient([ModelRequestResult(status=200, body=body)])
    assert await model(client).chat_json("summary", "s", "u", temperature=0.4) is None
    assert len(client.requests) == 1


# ------------------------------------------------------------------ mechanism 121: busy backoff


async def test_m121_429_is_retried_after_two_seconds() -> None:
    sleeps = Sleeps()
    client = FakeClient([http(429), chat('{"a": 1}')])
    assert await model(client, sleeps=sleeps).chat_json("filter", "s", "u", temperature=0.2) == {"a": 1}
    assert sleeps.slept == [2.0]


async def test_m121_busy_backoff_schedule_then_failure() -> None:
    sleeps = Sleeps()
    client = FakeClient([http(503)])
    assert await model(client, sleeps=sleeps).chat_json("filter", "s", "u", temperature=0.2) is None
    assert sleeps.slept == [2.0, 5.0, 10.0, 20.0, 40.0, 60.0]
    assert len(client.requests) == 7


async def test_m121_success_after_six_busy_answers() -> None:
    sleeps = Sleeps()
    client = FakeClient([http(500)] * 6 + [chat('{"a": 1}')])
    assert await model(client, sleeps=sleeps).chat_json("filter", "s", "u", temperature=0.2) == {"a": 1}
    assert len(sleeps.slept) == 6


@pytest.mark.parametrize("status", [400, 401, 404, 422])
async def test_m121_other_statuses_fail_at_once(status: int) -> None:
    sleeps = Sleeps()
    client = FakeClient([http(status), chat('{"a": 1}')])
    assert await model(client, sleeps=sleeps).chat_json("filter", "s", "u", temperature=0.2) is None
    assert sleeps.slept == [] and len(client.requests) == 1


async def test_m121_retry_after_longer_than_the_schedule_is_honoured() -> None:
    sleeps = Sleeps()
    client = FakeClient([http(429, {"retry-after": "7"}), chat('{"a": 1}')])
    await model(client, sleeps=sleeps).chat_json("filter", "s", "u", temperature=0.2)
    assert sleeps.slept == [7.0]


async def test_m121_backoff_never_waits_past_the_deadline() -> None:
    sleeps = Sleeps()
    client = FakeClient([http(429)])
    m = model(client, sleeps=sleeps, deadline_s=8.0)
    assert await m.chat_json("filter", "s", "u", temperature=0.2) is None
    assert sleeps.slept == [2.0, 5.0]  # 1 s left: the 10 s wait is not started
    assert len(client.requests) == 3


async def test_m121_no_call_once_the_deadline_has_passed() -> None:
    client = FakeClient([chat('{"a": 1}')])
    assert await model(client, deadline_s=0.0).chat_json("filter", "s", "u", temperature=0.2) is None
    assert client.requests == []


async def test_m121_gateway_rate_limit_is_busy_too() -> None:
    sleeps = Sleeps()
    client = FakeClient([RpcError(ErrorCode.RATE_LIMITED, "slow down", {"retry_after": 3}), chat('{"a": 1}')])
    assert await model(client, sleeps=sleeps).chat_json("filter", "s", "u", temperature=0.2) == {"a": 1}
    assert sleeps.slept == [3.0]


@pytest.mark.parametrize("code", [ErrorCode.DENIED, ErrorCode.BUDGET_EXHAUSTED, ErrorCode.INVALID_PARAMS])
async def test_m121_a_gateway_refusal_is_a_failed_call_not_an_exception(code: ErrorCode) -> None:
    sleeps = Sleeps()
    client = FakeClient([RpcError(code, "no"), chat('{"a": 1}')])
    assert await model(client, sleeps=sleeps).chat_json("filter", "s", "u", temperature=0.2) is None
    assert sleeps.slept == [] and len(client.requests) == 1


# ------------------------------------------------------------------ mechanism 119: every call recorded


async def test_m119_every_call_reaches_the_recorders_in_full() -> None:
    recorded: list[CallRecord] = []
    client = FakeClient([chat("not json"), chat('{"a": 1}')])
    await model(client, recorded=recorded).chat_json("appraisal", "SYS", "USR", temperature=0.4)
    assert [(r.purpose, r.model, r.system, r.temperature, r.format, r.status) for r in recorded] == [
        ("appraisal", "gpt-4.1-mini", "SYS", 0.4, "json", 200),
        ("appraisal", "gpt-4.1-mini", "SYS", 0.4, "json", 200),
    ]
    assert recorded[0].user == "USR" and recorded[0].answer == "not json"
    assert recorded[0].error == "answer is not a JSON object"
    assert recorded[1].user.startswith("USR") and "NOT valid JSON" in recorded[1].user
    assert recorded[1].answer == '{"a": 1}' and recorded[1].error is None
    assert recorded[0].time == "2026-12-02T10:00:00+00:00"


async def test_m119_failures_are_recorded_too(tmp_path: Path) -> None:
    log = CallLog(tmp_path / "memory-calls.jsonl", 1_000_000)
    client = FakeClient([http(400), RpcError(ErrorCode.DENIED, "denied by rule x")])
    m = model(client, call_log=log)
    await m.chat_json("summary", "s", "u", temperature=0.4, schema={"type": "object"})
    await m.chat_json("summary", "s", "u", temperature=0.4)
    lines = [json.loads(line) for line in (tmp_path / "memory-calls.jsonl").read_text().splitlines()]
    assert [(x["status"], x["format"], x["answer"]) for x in lines] == [
        (400, "json_schema", None),
        (None, "json", None),
    ]
    assert lines[0]["error"] == "HTTP 400"
    assert "denied by rule x" in lines[1]["error"]
    assert set(lines[0]) >= {"purpose", "model", "system", "user", "temperature", "format", "answer", "time"}
    assert set(lines[0]) >= {"status", "duration_s"}


async def test_m119_log_rotates_and_keeps_one_old_file(tmp_path: Path) -> None:
    path = tmp_path / "memory-calls.jsonl"
    log = CallLog(path, 1_500)
    m = model(FakeClient([chat('{"a": 1}')]), call_log=log)
    for i in range(12):
        await m.chat_json("summary", "s", f"call {i} " + "x" * 200, temperature=0.4)
    old = Path(f"{path}.1")
    assert path.stat().st_size <= 1_500 and old.stat().st_size <= 1_500
    assert not Path(f"{path}.2").exists()
    last = [json.loads(line)["user"] for line in path.read_text().splitlines()]
    assert last[-1].startswith("call 11 ")


async def test_m119_zero_bytes_disables_the_log(tmp_path: Path) -> None:
    path = tmp_path / "memory-calls.jsonl"
    m = model(FakeClient([chat('{"a": 1}')]), call_log=CallLog(path, 0))
    assert await m.chat_json("summary", "s", "u", temperature=0.4) == {"a": 1}
    assert not path.exists()


async def test_m119_a_failed_log_write_never_fails_the_call(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the state dir should be")
    m = model(FakeClient([chat('{"a": 1}')]), call_log=CallLog(blocker / "memory-calls.jsonl", 1_000))
    assert await m.chat_json("summary", "s", "u", temperature=0.4) == {"a": 1}


def test_m119_log_lives_in_the_state_dir(tmp_path: Path) -> None:
    log = CallLog.in_state_dir(tmp_path, MemorySettings(call_log_bytes=123))
    assert (log.path, log.max_bytes) == (tmp_path / "memory-calls.jsonl", 123)
