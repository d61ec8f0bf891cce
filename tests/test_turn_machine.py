"""The turn machine of seed 003, through the box protocol (the real box program, in this process).

The scenarios of seed 003: respond success, judge deciding to respond, judge staying silent, tool
continuation, image-assisted reply, send failure, generic failure — and PostSend's rule: history and
counters are committed only after delivery is confirmed; a pending delivery commits what the person
said, never a claim that the reply was seen; a failed turn commits nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from box.common.envelope import Envelope
from box.context import PromptPackage, turn_context
from box.machine import Stage, TurnContext, TurnInput, TurnMachine
from box.protocol import ErrorCode, RpcError
from box.protocol.models import Attachment, Framing, HttpFetchResult, ModelRequestResult
from impyard.backends import BoxSpec
from testing.fake_openai import TINY_PNG_B64
from testing.inprocess import InProcessBackend
from tests.scripted import (
    NOW,
    ScriptedHost,
    chat_result,
    deliver_params,
    envelope,
    init_params,
    tool_calls_result,
)

pytestmark = pytest.mark.anyio


def spec(tmp_path: Path) -> BoxSpec:
    return BoxSpec(imp="pip", channel_id="c1", state_dir=tmp_path / "state")


def records(host: ScriptedHost) -> list[tuple[str, str, str]]:
    """The box's own lines, as the host keeps them (issue 22)."""
    return [(r.id, r.role, r.content) for r in host.history.lines("pip")]


async def run_turns(tmp_path: Path, host: ScriptedHost, *deliveries: Any, **settings: Any) -> list[Any]:
    async with InProcessBackend().open(spec(tmp_path), host) as running:
        await running.init(init_params(**{"retry_backoff_s": 0, **settings}), timeout=30)
        return [await running.deliver(params, timeout=30) for params in deliveries]


async def test_respond_success(tmp_path: Path) -> None:
    host = ScriptedHost(answers=[chat_result(envelope("hello ann"))])
    [result] = await run_turns(tmp_path, host, deliver_params("hi pip"))
    assert (result.outcome, result.message_ids) == ("sent", ["out-1"])
    assert host.stages == [
        "context",
        "tools",
        "render",
        "send",
        "post",
    ]  # respond framing skips DecisionMaking
    assert records(host) == [("m1", "user", "hi pip"), ("out-1", "assistant", "hello ann")]
    # Issue 22: the lines are the host's; one read and one write a turn, never one request a line.
    assert [m for m, _ in host.calls if m.startswith("history.")] == ["history.load", "history.commit"]
    assert host.history.counters("pip") == {"c1": {"sent": 1}}


async def test_judge_decides_to_respond(tmp_path: Path) -> None:
    host = ScriptedHost(answers=[chat_result(envelope("I know this one", answer_needed=True))])
    [result] = await run_turns(tmp_path, host, deliver_params("who knows?", mode="judge"))
    assert result.outcome == "sent"
    assert host.stages == ["context", "tools", "decision", "render", "send", "post"]
    context = turn_context(host.model_requests[0].body["messages"])
    assert "Several people are talking here" in context  # the judge framing reaches the prompt


async def test_judge_stays_silent(tmp_path: Path) -> None:
    host = ScriptedHost(answers=[chat_result(envelope("meh", answer_needed=False))])
    [result] = await run_turns(tmp_path, host, deliver_params("just chatting", mode="judge"))
    assert result.outcome == "silent" and host.sent == []
    assert host.stages == ["context", "tools", "decision", "post"]  # nothing rendered, nothing sent
    assert records(host) == [("m1", "user", "just chatting")]  # the imp heard it
    assert host.history.counters("pip") == {"c1": {"silent": 1}}


async def test_tool_continuation(tmp_path: Path) -> None:
    host = ScriptedHost(
        answers=[
            tool_calls_result(("web_fetch", {"url": "https://example.org/hours"}, "call_1")),
            chat_result(envelope("It opens at nine.")),
        ],
        fetches=[HttpFetchResult(status=200, content_type="text/html", text="Open 9-17")],
    )
    [result] = await run_turns(
        tmp_path, host, deliver_params("when does it open?"), tools=["web_fetch"], factual_model="gpt-4.1"
    )
    assert result.outcome == "sent" and host.sent[0].content == "It opens at nine."  # type: ignore[attr-defined]
    fetch = [params for method, params in host.calls if method == "http.fetch"]
    assert [f.url for f in fetch] == ["https://example.org/hours"]  # type: ignore[attr-defined]
    first, second = (request.body for request in host.model_requests)
    assert first["model"] == "gpt-5.1" and second["model"] == "gpt-4.1"  # the factual model reads the results
    assert second["messages"][-2]["tool_calls"][0]["id"] == "call_1"
    assert second["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "HTTP 200 text/html\nOpen 9-17",
    }
    assert host.stages == ["context", "tools", "render", "send", "post"]


async def test_image_assisted_reply(tmp_path: Path) -> None:
    photo = Attachment(filename="cat.png", content_type="image/png", size=70, data_b64=TINY_PNG_B64)
    host = ScriptedHost(
        answers=[
            chat_result(envelope("A cat! Here it is as a painting.", picture="the cat as an oil painting")),
            ModelRequestResult(status=200, body={"data": [{"b64_json": TINY_PNG_B64}]}),
        ]
    )
    [result] = await run_turns(
        tmp_path, host, deliver_params("what is this?", attachments=[photo]), vision_model="gpt-4.1"
    )
    assert result.outcome == "sent"
    reply_call, image_call = host.model_requests
    assert reply_call.body["model"] == "gpt-4.1"  # the vision model reads the attached image
    assert reply_call.body["messages"][-1]["content"][1] == {
        "type": "image_url", "image_url": {"url": f"data:image/png;base64,{TINY_PNG_B64}"}
    }  # fmt: skip
    assert (image_call.path, image_call.purpose, image_call.body["prompt"]) == (
        "/images/generations", "image", "the cat as an oil painting",
    )  # fmt: skip
    [sent] = host.sent  # text and picture in one payload
    assert sent.content == "A cat! Here it is as a painting."  # type: ignore[attr-defined]
    assert [f.filename for f in sent.files] == ["picture-1.jpeg"]  # type: ignore[attr-defined]


async def test_send_failure_fails_the_turn_and_commits_nothing(tmp_path: Path) -> None:
    refused = RpcError(ErrorCode.UPSTREAM_UNREACHABLE, "the message could not be delivered: discord is down")
    host = ScriptedHost(answers=[chat_result(envelope("hello"))], send_errors=[refused])
    [result] = await run_turns(tmp_path, host, deliver_params("hi"))
    assert result.outcome == "failed" and "discord is down" in (result.error or "")
    assert host.stages == ["context", "tools", "render", "send", "failed"]
    assert records(host) == [] and host.history.counters("pip") == {}  # PostSend never ran
    journal = [json.loads(line) for line in (tmp_path / "state" / "journal.jsonl").read_text().splitlines()]
    assert journal[-1]["outcome"] == "failed" and "SendFailed" in journal[-1]["error"]


async def test_generic_failure_is_terminal_and_posts_nothing(tmp_path: Path) -> None:
    denied = RpcError(
        ErrorCode.DENIED, "denied by policy rule no-replies: pip is on a break", {"rule": "no-replies"}
    )
    host = ScriptedHost(answers=[denied])
    [result] = await run_turns(tmp_path, host, deliver_params("hi"))
    assert result.outcome == "failed" and "pip is on a break" in (result.error or "")
    assert host.stages == ["context", "tools", "failed"]
    assert host.model_calls == 1  # a policy denial is not retried
    assert host.sent == []  # the host posts the "couldn't answer" notice, never the box
    assert records(host) == []
    assert any("turn failed in tools" in log.message for log in host.logs)  # type: ignore[attr-defined]


async def test_pending_commits_what_the_person_said_never_the_reply(tmp_path: Path) -> None:
    host = ScriptedHost(answers=[chat_result(envelope("needs approval"))], send_status="pending")
    [result] = await run_turns(tmp_path, host, deliver_params("post it", "m5"))
    assert result.outcome == "pending" and result.message_ids == []
    assert records(host) == [("m5", "user", "post it")]
    assert host.history.counters("pip") == {"c1": {"pending": 1}}


async def test_a_prompt_task_runs_through_the_machine(tmp_path: Path) -> None:
    from box.protocol.models import TaskRunParams, TaskSpec

    host = ScriptedHost(answers=[chat_result(envelope("nothing to report", answer_needed=False))])
    async with InProcessBackend().open(spec(tmp_path), host) as running:
        await running.init(init_params(kind="task"), timeout=30)
        result = await running.run_task(
            TaskRunParams(task=TaskSpec(id="t1", kind="prompt", prompt="Check in"), now=NOW)
        )
    assert (result.outcome, result.summary) == ("done", "nothing to report")
    assert host.sent == [] and host.stages == ["context", "tools", "decision", "post"]
    assert "scheduled task" in turn_context(host.model_requests[0].body["messages"])


# ------------------------------------------------------------------ stages in isolation


class _NoDeps:
    """A machine whose collaborators are never touched by the stages under test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the stage used {name}")


def machine() -> TurnMachine:
    deps = _NoDeps()
    deps.init = init_params()  # type: ignore[attr-defined]
    return TurnMachine(deps)  # type: ignore[arg-type]


def context(mode: str, reason: str, **fields: Any) -> TurnContext:
    params = deliver_params("hello", mode=mode, reason=reason)
    ctx = TurnContext(TurnInput(params.message, Framing(mode=mode, reason=reason), [], NOW))  # type: ignore[arg-type]
    ctx.envelope = Envelope.model_validate(envelope(**fields))
    ctx.package = PromptPackage(prefix="p", suffix="s", messages=[])
    return ctx


@pytest.mark.parametrize(
    ("fields", "reason", "next_stage"),
    [
        ({"answer": "hi", "answer_needed": False}, "group", Stage.POST),
        ({"answer": "hi", "answer_needed": True}, "group", Stage.RENDER),
        ({"answer": "hi", "answer_needed": False, "staff": "look"}, "group", Stage.RENDER),
        (
            {"answer": None, "answer_needed": False, "hack": True},
            "group",
            Stage.RENDER,
        ),  # the alert is rendered
    ],
)
async def test_decision_making_in_isolation(fields: dict, reason: str, next_stage: Stage) -> None:
    ctx = context("judge", reason, **fields)
    assert await machine().decision_making(ctx) is next_stage


async def test_rendering_in_isolation_unwraps_and_targets() -> None:
    ctx = context("respond", "dm", answer="see [x](https://x.example)", channel="none")
    ctx.answers = True
    assert await machine().response_rendering(ctx) is Stage.SEND
    assert ctx.reply is not None
    assert (ctx.reply.channel_id, ctx.reply.content, ctx.reply.kind, ctx.reply.reply_to) == (
        "c1",
        "see https://x.example",
        "reply",
        "m1",
    )
