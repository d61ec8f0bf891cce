"""The tool registry and the bounded tool loop, the memory `search` seam, and the edges of the envelope acts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from box.memory import NoMemory
from box.protocol import ErrorCode, RpcError
from box.protocol.models import Attachment, ModelRequestResult
from box.tools import Tool, ToolCall, ToolRegistry, search_tool
from impyard.backends import BoxSpec
from testing.inprocess import InProcessBackend
from tests.scripted import (
    ScriptedHost,
    chat_result,
    deliver_params,
    envelope,
    in_process_box,
    init_params,
    tool_calls_result,
)

pytestmark = pytest.mark.anyio


def spec(tmp_path: Path) -> BoxSpec:
    return BoxSpec(imp="pip", channel_id="c1", state_dir=tmp_path / "state")


async def run_turn(tmp_path: Path, host: ScriptedHost, params: Any = None, **settings: Any) -> Any:
    async with InProcessBackend().open(spec(tmp_path), host) as running:
        await running.init(init_params(**{"retry_backoff_s": 0, **settings}), timeout=30)
        return await running.deliver(params or deliver_params("hi"), timeout=30)


async def test_the_search_seam_finds_nothing_without_a_memory_engine() -> None:
    tool = search_tool(NoMemory())
    registry = ToolRegistry([tool])
    assert await registry.execute(ToolCall("c1", "search", '{"query": "owls"}')) == "nothing found in memory"
    assert tool.parameters["required"] == ["query"] and tool.parameters["additionalProperties"] is False


async def test_model_mistakes_come_back_as_legible_results() -> None:
    registry = ToolRegistry([search_tool(NoMemory())])
    assert "no tool named 'nope'" in await registry.execute(ToolCall("c1", "nope", "{}"))
    assert "not valid JSON" in await registry.execute(ToolCall("c1", "search", "{oops"))
    assert "JSON object" in await registry.execute(ToolCall("c1", "search", "[1]"))
    assert registry.selected(["search", "web_fetch", "search"]) == [
        registry.selected(["search"])[0]
    ]  # unknown skipped


async def test_the_chat_tool_loop_is_bounded_then_forced_to_answer(tmp_path: Path) -> None:
    host = ScriptedHost(
        answers=[
            tool_calls_result(("search", {"query": "a"}, "c1")),
            tool_calls_result(
                ("search", {"query": "b"}, "c2"), ("search", {"query": "c"}, "c3")
            ),  # parallel calls
            chat_result(envelope("done looking")),
        ]
    )
    result = await run_turn(tmp_path, host, tools=["search"], tool_rounds=2)
    assert result.outcome == "sent"
    bodies = [r.body for r in host.model_requests]
    assert ["tools" in body for body in bodies] == [
        True,
        True,
        False,
    ]  # two tool rounds, then a tool-less answer
    last = bodies[-1]["messages"]
    assert [m["tool_call_id"] for m in last if m["role"] == "tool"] == ["c1", "c2", "c3"]


async def test_tool_rounds_zero_attaches_no_tools(tmp_path: Path) -> None:
    host = ScriptedHost(answers=[chat_result(envelope("plain"))])
    await run_turn(tmp_path, host, tools=["search", "web_fetch"], tool_rounds=0)
    assert "tools" not in host.model_requests[0].body


async def test_a_refused_fetch_is_a_result_the_model_reads(tmp_path: Path) -> None:
    denied = RpcError(ErrorCode.DENIED, "denied by policy rule default-deny: not on the allow-list")
    host = ScriptedHost(
        answers=[
            tool_calls_result(("web_fetch", {"url": "https://x.example"}, "c1")),
            chat_result(envelope("can't look")),
        ],
        fetches=[denied],
    )
    result = await run_turn(tmp_path, host, tools=["web_fetch"])
    assert result.outcome == "sent"
    assert host.model_requests[1].body["messages"][-1]["content"] == (
        "refused by the host: denied by policy rule default-deny: not on the allow-list"
    )


async def test_a_tool_that_breaks_fails_the_turn_cleanly(tmp_path: Path) -> None:
    def explode(arguments: dict[str, Any]) -> str:
        raise ValueError("the index is corrupt")

    broken = ToolRegistry(
        [
            Tool(
                "lookup",
                "breaks",
                {"type": "object", "properties": {}, "required": [], "additionalProperties": False},
                explode,
            )
        ]
    )
    host = ScriptedHost(answers=[tool_calls_result(("lookup", {}, "c1")), chat_result(envelope("never"))])
    async with in_process_box(host, tmp_path / "state", tools=broken) as box:
        await box.init(init_params(tools=["lookup"]))
        result = await box.deliver(deliver_params("hi"))
    assert result.outcome == "failed" and "the index is corrupt" in (result.error or "")
    assert host.stages[-1] == "failed" and host.sent == [] and host.model_calls == 1
    assert host.history.lines("pip") == []  # nothing committed


async def test_the_memory_search_seam_feeds_the_tool(tmp_path: Path) -> None:
    class Remembers(NoMemory):
        async def search(self, query: str, limit: int) -> list[str]:
            return [f"{query} #{n}" for n in range(limit)]

    host = ScriptedHost(
        answers=[tool_calls_result(("search", {"query": "owls"}, "c1")), chat_result(envelope("found"))]
    )
    async with in_process_box(host, tmp_path / "state", memory=Remembers()) as box:
        await box.init(init_params(tools=["search"]))
        await box.deliver(deliver_params("remember?"))
    assert host.model_requests[1].body["messages"][-1]["content"] == "\n".join(
        f"- owls #{n}" for n in range(5)
    )


# ------------------------------------------------------------------ envelope acts: edges


def _images(*payloads: str) -> ModelRequestResult:
    return ModelRequestResult(status=200, body={"data": [{"b64_json": p} for p in payloads]})


async def test_pictures_too_large_for_one_line_are_dropped_not_fatal(tmp_path: Path) -> None:
    half = (
        "A" * 515_000
    )  # the image result fits one 1 MiB line; with 20,000 characters of text the send does not
    text = "o" * 20_000
    host = ScriptedHost(
        answers=[chat_result(envelope(text, picture="owls", picture_count=2)), _images(half, half)]
    )
    result = await run_turn(tmp_path, host)
    assert result.outcome == "sent"
    [sent] = host.sent
    assert [f.filename for f in sent.files] == ["picture-1.jpeg"]  # type: ignore[attr-defined]
    assert any("too large for one line" in log.message for log in host.logs)  # type: ignore[attr-defined]


async def test_an_image_result_too_large_for_the_pipe_leaves_the_text(tmp_path: Path) -> None:
    big = "A" * 600_000  # two of these: the host cannot hand the result over one line
    host = ScriptedHost(
        answers=[chat_result(envelope("two pictures", picture="owls", picture_count=2)), _images(big, big)]
    )
    result = await run_turn(tmp_path, host)
    assert result.outcome == "sent"
    [sent] = host.sent
    assert sent.files == [] and sent.content == "two pictures\n(I couldn't make the picture this time.)"  # type: ignore[attr-defined]


async def test_picture_count_is_clamped_and_edit_without_an_image_makes_a_new_picture(tmp_path: Path) -> None:
    host = ScriptedHost(
        answers=[
            chat_result(envelope("here", picture="an owl", picture_count=9, picture_edit=True)),
            _images("QUJD"),
        ]
    )
    await run_turn(tmp_path, host)
    image = host.model_requests[1]
    assert (image.path, image.body["n"]) == ("/images/generations", 4)


async def test_a_picture_without_text_is_still_a_reply(tmp_path: Path) -> None:
    host = ScriptedHost(answers=[chat_result(envelope(None, picture="an owl")), _images("QUJD")])
    result = await run_turn(tmp_path, host)
    assert result.outcome == "sent" and host.sent[0].content == "" and len(host.sent[0].files) == 1  # type: ignore[attr-defined]


async def test_edit_with_an_image_uses_the_message_text_when_the_envelope_names_no_prompt(
    tmp_path: Path,
) -> None:
    photo = Attachment(filename="a.png", content_type="image/png", size=3, data_b64="QUJD")
    host = ScriptedHost(
        answers=[chat_result(envelope("hatted", picture=None, picture_edit=True)), _images("QUJD")]
    )
    result = await run_turn(tmp_path, host, deliver_params("put a hat on it", attachments=[photo]))
    # picture_edit with an image but no picture prompt: answer text exists, so the edit runs on the message's words
    assert result.outcome == "sent"
    edit = host.model_requests[1]
    assert edit.path == "/images/edits" and edit.body["prompt"] == "put a hat on it"
    assert edit.body["images"] == [{"image_url": "data:image/png;base64,QUJD"}]


async def test_hack_without_a_staff_channel_is_not_asked_and_one_sent_anyway_is_logged(
    tmp_path: Path,
) -> None:
    """Issue 38: ``hack`` is asked only where a report can go (ENV-03: the staff channel); a server that sends
    it anyway is logged as ignored, and the reply stands."""
    host = ScriptedHost(answers=[chat_result(envelope("no.", hack=True))])
    await run_turn(tmp_path, host)
    assert [s.kind for s in host.sent] == ["reply"]  # type: ignore[attr-defined]
    assert any("not asked" in log.message and "hack=True" in log.message for log in host.logs)  # type: ignore[attr-defined]
    assert not any("subvert" in log.message for log in host.logs)  # type: ignore[attr-defined]
    journal = [json.loads(line) for line in (tmp_path / "state" / "journal.jsonl").read_text().splitlines()]
    assert "hack" not in journal[-1]
