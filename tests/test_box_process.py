"""The real box program (`python -m box`) driven through the process backend, and misbehaving boxes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest

from box.context import split_context
from box.protocol import ErrorCode, RpcError
from box.protocol.models import TaskRunParams, TaskSpec
from impyard.backends import BoxDied, BoxSpec, BoxTimeout
from impyard.backends.process import ProcessBackend, box_command, box_environment
from tests.scripted import NOW, ScriptedHost, chat_result, deliver_params, envelope, init_params

pytestmark = pytest.mark.anyio

BAD_BOX = str(Path(__file__).parent / "boxes" / "bad_box.py")


def spec(tmp_path: Path) -> BoxSpec:
    return BoxSpec(imp="pip", channel_id="c1", state_dir=tmp_path / "state")


async def test_box_refuses_everything_before_init(tmp_path: Path) -> None:
    async with ProcessBackend(warn=False).open(spec(tmp_path), ScriptedHost()) as running:
        with pytest.raises(RpcError) as caught:
            await running.deliver(deliver_params(), timeout=10)
        assert caught.value.code == ErrorCode.NOT_INITIALISED
        await running.init(init_params())  # and then works


async def test_box_survives_garbage_on_stdin_and_answers_after(tmp_path: Path) -> None:
    """The box's side of the bad-input list, with raw bytes on its real stdin."""
    process = await anyio.open_process(box_command(), env=box_environment(tmp_path), cwd=tmp_path)
    async with process:
        assert process.stdin is not None and process.stdout is not None
        init = json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "box.init", "params": init_params().model_dump(mode="json")}
        )
        await process.stdin.send(
            b"not json\n" + b"y" * (1024 * 1024 + 10) + b"\n" + b'{"x": 1}\n' + init.encode() + b"\n"
        )
        received = b""
        with anyio.fail_after(10):
            while received.count(b"\n") < 4:
                received += await process.stdout.receive()
        frames = [json.loads(line) for line in received.splitlines()]
        assert [frame.get("error", {}).get("code") for frame in frames[:3]] == [-32700, -32600, -32600]
        assert frames[3] == {"jsonrpc": "2.0", "id": 1, "result": {"protocol": 1, "box": "0.1.0"}}
        await process.stdin.aclose()  # closing stdin ends the session
        with anyio.fail_after(10):
            assert await process.wait() == 0


async def test_a_scripted_conversation(tmp_path: Path) -> None:
    host = ScriptedHost(
        answers=[
            chat_result(envelope("hello ann")),
            chat_result(envelope(None, answer_needed=False)),
            chat_result("{not json"),
        ]
    )
    async with ProcessBackend(warn=False).open(spec(tmp_path), host) as running:
        assert (await running.init(init_params())).protocol == 1
        first = await running.deliver(deliver_params("hi pip", "m1"), timeout=10)
        second = await running.deliver(deliver_params("just chatting", "m2", mode="judge"), timeout=10)
        third = await running.deliver(deliver_params("again", "m3"), timeout=10)
    assert (first.outcome, first.message_ids) == ("sent", ["out-1"])
    assert second.outcome == "silent"
    assert third.outcome == "failed" and "not a valid envelope" in (third.error or "")
    assert [sent.content for sent in host.sent] == ["hello ann"]  # type: ignore[attr-defined]
    assert host.sent[0].channel_id == "c1" and host.sent[0].reply_to == "m1"  # type: ignore[attr-defined]
    # The request the box made is the strict envelope call of docs/conversation.md.
    model_calls = [params for method, params in host.calls if method == "model.request"]
    body = model_calls[0].body  # type: ignore[attr-defined]
    assert body["response_format"]["json_schema"]["name"] == "envelope"
    assert body["response_format"]["json_schema"]["strict"] is True
    assert body["messages"][-1]["role"] == "user"
    assert (
        split_context(body["messages"][-1]["content"])[1] == "ann: hi pip"
    )  # after the turn's context (issue 33)
    assert host.stages[:5] == ["context", "tools", "render", "send", "post"]  # the turn machine (seed 003)
    assert (tmp_path / "state" / "journal.jsonl").read_text().count("\n") == 3  # its files live under /state


async def test_pending_send_and_refused_model_call(tmp_path: Path) -> None:
    denied = RpcError(
        ErrorCode.BUDGET_EXHAUSTED, "budget exhausted", {"ledger": "imp:pip:day", "retry_after": 60}
    )
    host = ScriptedHost(answers=[chat_result(envelope("needs approval")), denied], send_status="pending")
    async with ProcessBackend(warn=False).open(spec(tmp_path), host) as running:
        await running.init(init_params())
        pending = await running.deliver(deliver_params("one"), timeout=10)
        refused = await running.deliver(deliver_params("two", "m2"), timeout=10)
    assert pending.outcome == "pending"
    assert refused.outcome == "failed" and "budget exhausted" in (refused.error or "")


async def test_prompt_task_posts_through_the_host(tmp_path: Path) -> None:
    host = ScriptedHost(answers=[chat_result(envelope("daily summary: all quiet"))])
    async with ProcessBackend(warn=False).open(spec(tmp_path), host) as running:
        await running.init(init_params(kind="task"))
        result = await running.run_task(
            TaskRunParams(task=TaskSpec(id="t1", kind="prompt", prompt="Summarise the day"), now=NOW)
        )
        unknown = await running.run_task(TaskRunParams(task=TaskSpec(id="t2", kind="dance"), now=NOW))
    assert (result.outcome, result.summary) == ("done", "daily summary: all quiet")
    assert host.sent[0].kind == "other"  # type: ignore[attr-defined]
    assert unknown.outcome == "failed" and "dance" in unknown.summary


async def test_shutdown_exits_zero(tmp_path: Path) -> None:
    async with ProcessBackend(warn=False).open(spec(tmp_path), ScriptedHost()) as running:
        await running.init(init_params())
    assert running.returncode == 0


async def test_the_box_never_sees_host_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-very-secret")
    monkeypatch.setenv("IMPYARD_DISCORD_TOKEN_PIP", "discord-secret")
    env = box_environment(tmp_path)
    assert "sk-very-secret" not in json.dumps(env) and "discord-secret" not in json.dumps(env)


# ------------------------------------------------------------------ misbehaving boxes


@pytest.mark.parametrize("mode", ["garbage", "exit", "flood", "extra-field", "wrong-type"])
async def test_a_misbehaving_box_fails_pending_requests_and_is_reaped(tmp_path: Path, mode: str) -> None:
    backend = ProcessBackend(command=[sys.executable, BAD_BOX, mode], warn=False)
    with anyio.fail_after(20):
        async with backend.open(spec(tmp_path), ScriptedHost()) as running:
            await running.init(init_params())
            with pytest.raises(BoxDied) as caught:
                await running.deliver(deliver_params(), timeout=15)
            with anyio.fail_after(10):
                await running.exited.wait()
    assert running.returncode is not None
    assert "mailbox.deliver got no answer" in str(caught.value)
    if mode == "exit":
        assert "exit code 3" in str(caught.value)
    else:
        assert "protocol violation" in str(caught.value)


async def test_a_box_that_never_answers_times_out_and_is_killed(tmp_path: Path) -> None:
    backend = ProcessBackend(command=[sys.executable, BAD_BOX, "silent"], warn=False)
    with anyio.fail_after(20):
        async with backend.open(spec(tmp_path), ScriptedHost()) as running:
            await running.init(init_params())
            with pytest.raises(BoxTimeout):
                await running.deliver(deliver_params(), timeout=0.3)
    assert running.exited.is_set()


async def test_cancelling_the_host_reaps_the_box(tmp_path: Path) -> None:
    backend = ProcessBackend(command=[sys.executable, BAD_BOX, "silent"], warn=False)
    boxes = []
    with anyio.move_on_after(1):
        async with backend.open(spec(tmp_path), ScriptedHost()) as running:
            boxes.append(running)
            await running.init(init_params())
            await running.deliver(deliver_params())  # never answered: cancelled by the scope
    assert boxes[0].exited.is_set() and boxes[0].process.returncode is not None


async def test_a_request_the_protocol_refuses_is_still_reported_to_the_host(tmp_path: Path) -> None:
    class RecordingRefusals(ScriptedHost):
        def __init__(self) -> None:
            super().__init__()
            self.refusals: list[tuple[str, int, str]] = []

        async def refused(self, spec: BoxSpec, method: str, code: int, reason: str) -> None:
            self.refusals.append((method, code, reason))

    host = RecordingRefusals()
    backend = ProcessBackend(command=[sys.executable, BAD_BOX, "bad-request"], warn=False)
    async with backend.open(spec(tmp_path), host) as running:
        await running.init(init_params())
        result = await running.deliver(deliver_params(), timeout=15)
    assert result.outcome == "failed"
    ((method, code, reason),) = host.refusals
    assert (method, code) == ("model.request", ErrorCode.INVALID_PARAMS) and "path" in reason
    assert [m for m, _ in host.calls if m == "model.request"] == []  # the handler never ran


async def test_the_refuse_all_host_denies_every_request_and_ignores_notifications(tmp_path: Path) -> None:
    from box.protocol.models import ModelRequestParams, TurnStageParams
    from impyard.backends import RefuseAllHost

    host = RefuseAllHost()
    with pytest.raises(RpcError) as caught:
        await host.serve(
            spec(tmp_path),
            "model.request",
            ModelRequestParams(path="/embeddings", body={}, purpose="embedding"),
        )
    assert caught.value.code == ErrorCode.DENIED and caught.value.data["rule"] == "refuse-all"
    assert (
        await host.serve(spec(tmp_path), "turn.stage", TurnStageParams(message_id="m", stage="post")) is None
    )
