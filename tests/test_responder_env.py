"""SPEC-001's responder contract, one named test per rule, through the box protocol.

Each runs the real box program in this process (``testing.inprocess``) against a ScriptedHost; the
ones that need a seam inside the box (a fake sleep for the backoff, a memory engine, a slow synchronous
tool) inject it (``in_process_box``). The rules whose
exact upstream request bodies matter are in ``test_responder_gateway.py`` (the real gateway and
the fake OpenAI): ENV-15, ENV-19 .. ENV-24.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from box.context import LAYOUT_NOTE, split_context, turn_context
from box.memory import CommittedTurn, MemoryTurn, NoTurn, TurnFacts
from box.protocol import ErrorCode, RpcError
from box.protocol.history import HistoryLine
from box.protocol.models import Author, HistoryEntry, MailboxEventParams, ModelRequestResult
from box.tools import Tool, ToolRegistry
from impyard.backends import BoxSpec
from impyard.backends.statedir import FOREIGN_WRITER_MARK
from impyard.conversation.responder_history import HistoryBounds
from testing.inprocess import InProcessBackend
from tests.scripted import (
    NOW,
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


async def run_turns(
    tmp_path: Path,
    host: ScriptedHost,
    *deliveries: Any,
    kind: str = "dm",
    channel_name: str = "",
    **settings: Any,
) -> list[Any]:
    async with InProcessBackend().open(spec(tmp_path), host) as running:
        await running.init(
            init_params(kind=kind, channel_name=channel_name, **{"retry_backoff_s": 0, **settings}),
            timeout=30,
        )
        return [await running.deliver(params, timeout=30) for params in deliveries]


def stored(host: ScriptedHost) -> list[dict[str, Any]]:
    """The box's own lines as the host keeps them (issue 22: no history file under /state)."""
    return [asdict(record) for record in host.history.lines("pip")]


def seed(host: ScriptedHost, channel_id: str, records: list[dict[str, Any]]) -> None:
    """Lines kept before the test's turns, committed the way a box commits them."""
    host.history.commit("pip", channel_id, [HistoryLine.model_validate(r) for r in records])


def files_under(root: Path) -> list[str]:
    """Files the box wrote (the host's own mark beside the state dir is not one of them)."""
    return sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name != FOREIGN_WRITER_MARK
    )


class Sleeps:
    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


async def test_env_01_the_answer_reaches_the_user(tmp_path: Path) -> None:
    host = ScriptedHost(answers=[chat_result(envelope("hello ann", answer_needed=True))])
    [result] = await run_turns(tmp_path, host, deliver_params("hi pip"))
    assert (result.outcome, result.message_ids) == ("sent", ["out-1"])
    [sent] = host.sent
    assert (sent.channel_id, sent.content, sent.reply_to, sent.kind) == ("c1", "hello ann", "m1", "reply")  # type: ignore[attr-defined]


async def test_env_02_a_suppressed_answer_stays_silent(tmp_path: Path) -> None:
    host = ScriptedHost(answers=[chat_result(envelope("I could say something", answer_needed=False))])
    [result] = await run_turns(
        tmp_path, host, deliver_params("nice weather", mode="judge", reason="group"), kind="guild"
    )
    assert result.outcome == "silent" and host.sent == []


async def test_env_03_a_staff_note_forces_delivery_and_goes_to_the_staff_channel(tmp_path: Path) -> None:
    host = ScriptedHost(
        answers=[
            chat_result(
                envelope("Someone will help you.", answer_needed=False, staff="ann asks for a refund")
            )
        ]
    )
    [result] = await run_turns(
        tmp_path, host, deliver_params("I want a refund", mode="judge", reason="group"),
        kind="guild", channel_name="shop", staff_channel="staff-1",
    )  # fmt: skip
    assert result.outcome == "sent"
    reply, note = host.sent
    assert (reply.channel_id, reply.content, reply.kind) == ("c1", "Someone will help you.", "reply")  # type: ignore[attr-defined]
    assert (note.channel_id, note.kind, note.reply_to) == ("staff-1", "staff", None)  # type: ignore[attr-defined]
    assert "ann asks for a refund" in note.content and "#shop" in note.content  # type: ignore[attr-defined]


async def test_env_03_without_a_staff_channel_the_note_is_logged_not_dropped(tmp_path: Path) -> None:
    """Issue 38: without a staff channel ``staff`` is not asked; a note that comes anyway is logged, never
    posted and never dropped silently."""
    host = ScriptedHost(answers=[chat_result(envelope("ok", staff="check this user"))])
    await run_turns(tmp_path, host, deliver_params("hi"))
    assert [sent.kind for sent in host.sent] == ["reply"]  # type: ignore[attr-defined]
    assert any("check this user" in log.message and log.level == "warning" for log in host.logs)  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", ["respond", "judge"])
async def test_env_04_direct_messages_are_always_answered(tmp_path: Path, mode: str) -> None:
    host = ScriptedHost(answers=[chat_result(envelope("here I am", answer_needed=False))])
    [result] = await run_turns(tmp_path, host, deliver_params("psst", mode=mode, reason="dm"))
    assert result.outcome == "sent" and host.sent[0].content == "here I am"  # type: ignore[attr-defined]


async def test_env_05_short_path_archives_without_a_model_call(tmp_path: Path) -> None:
    host = ScriptedHost(history_bounds=HistoryBounds(limit=3))
    results = await run_turns(
        tmp_path, host, *(deliver_params(f"release {n}", f"m{n}") for n in range(4)),
        kind="guild", channel_name="announcements", short_path=[("^announcements$", ".*")], history_limit=3,
    )  # fmt: skip
    assert [r.outcome for r in results] == ["silent"] * 4
    assert host.model_calls == 0 and host.sent == [] and host.stages == []  # outside the machine
    assert [r["content"] for r in stored(host)] == [
        "release 1",
        "release 2",
        "release 3",
    ]  # appended, trimmed, persisted


async def test_env_07_history_is_trimmed_before_and_after_the_call(tmp_path: Path) -> None:
    old = [
        {"id": f"old-{n}", "role": "user", "author": "ann", "content": f"old {n}",
         "at": (NOW - timedelta(hours=1, minutes=-n)).isoformat()}
        for n in range(6)
    ]  # fmt: skip
    host = ScriptedHost(
        answers=[chat_result(envelope(f"reply {n}")) for n in range(3)], history_bounds=HistoryBounds(3, 3)
    )
    seed(host, "c1", old)  # six lines kept under an older, larger limit
    turns = [deliver_params(f"q{n}", f"m{n}", now=NOW + timedelta(minutes=n)) for n in range(3)]
    await run_turns(tmp_path, host, *turns, history_limit=3, history_per_channel=3)
    for (
        request
    ) in host.model_requests:  # before: at most the limit, besides the system message and the question
        assert len(request.body["messages"]) <= 3 + 2
    first = host.model_requests[0].body["messages"]
    assert [m["content"] for m in first[1:-1]] == ["ann: old 3", "ann: old 4", "ann: old 5"]
    assert len(stored(host)) == 3  # after: trimmed again once the pair was appended
    assert [r["content"] for r in stored(host)] == ["reply 1", "q2", "reply 2"]


async def test_env_08_markdown_links_are_unwrapped(tmp_path: Path) -> None:
    host = ScriptedHost(
        answers=[
            chat_result(
                envelope("Read [the guide](https://x.example/g), @[Ann](https://discord.com/users/1).")
            )
        ]
    )
    await run_turns(tmp_path, host, deliver_params("help"))
    assert host.sent[0].content == "Read https://x.example/g, Ann."  # type: ignore[attr-defined]


@pytest.mark.parametrize("channel", [None, "none", "", "c1"])
async def test_env_09_a_missing_channel_falls_back_to_the_message_channel(
    tmp_path: Path, channel: str | None
) -> None:
    host = ScriptedHost(answers=[chat_result(envelope("hi", channel=channel))])
    await run_turns(tmp_path, host, deliver_params("hello"))
    assert (host.sent[0].channel_id, host.sent[0].kind, host.sent[0].reply_to) == ("c1", "reply", "m1")  # type: ignore[attr-defined]


async def test_env_09_another_channel_is_an_act_of_its_own(tmp_path: Path) -> None:
    host = ScriptedHost(
        answers=[chat_result(envelope("announcing!", channel="news-9"))], send_status="pending"
    )
    [result] = await run_turns(tmp_path, host, deliver_params("tell everyone"), post_channels=["news-9"])
    [sent] = host.sent
    assert (sent.channel_id, sent.kind, sent.reply_to) == ("news-9", "other", None)  # type: ignore[attr-defined]
    assert result.outcome == "pending"  # the host's gateway judges (here: gates) a send elsewhere


class OwlTurn(NoTurn):
    def __init__(self, memory: OwlMemory) -> None:
        self.memory = memory

    def block(self) -> str | None:
        return "Ann likes owls."

    async def commit(self, turn: CommittedTurn) -> None:
        self.memory.committed.append(turn)


class OwlMemory:
    """A memory engine double (the async seam of issue 23): remembers one thing, records what PostSend and
    events hand it."""

    def __init__(self) -> None:
        self.committed: list[CommittedTurn] = []
        self.events: list[tuple[str, str]] = []

    async def begin(self, facts: TurnFacts) -> MemoryTurn:
        return OwlTurn(self)

    async def search(self, query: str, limit: int) -> list[str]:
        return [f"ann told you about {query}"]

    async def record_event(self, channel_id: str, text: str) -> None:
        self.events.append((channel_id, text))


async def test_env_10_dynamic_context_reaches_the_system_prompt(tmp_path: Path) -> None:
    host = ScriptedHost(answers=[chat_result(envelope("hoot"))])
    persona = "You are Pip. It is {date} {time}.\n{news}\n{memory}"
    memory = OwlMemory()
    async with in_process_box(host, tmp_path / "state", memory=memory) as box:
        await box.init(init_params(persona=persona, news="The owl show is on Friday."))
        await box.deliver(deliver_params("any news?"))
    messages = host.model_requests[0].body["messages"]
    system = messages[0]["content"]
    assert (
        system == f"You are Pip. It is  .\n\n{LAYOUT_NOTE}" and "{" not in system
    )  # legacy placeholders stripped
    # issue 33: the context opens the current message, after the history, not the system text (docs/conversation.md)
    suffix, said = split_context(messages[-1]["content"])
    assert said == "ann: any news?" and "## Context" not in system
    assert suffix.startswith("## Context\nDate: 2026-12-02 (Wednesday)\nTime: 10:00 UTC\n")
    assert "### News\nThe owl show is on Friday." in suffix and "### Memory\nAnn likes owls." in suffix
    assert [turn.delivered for turn in memory.committed] == [
        "hoot"
    ]  # PostSend hands memory the delivered turn


async def test_env_10_no_news_and_no_memory_no_sections(tmp_path: Path) -> None:
    host = ScriptedHost(answers=[chat_result(envelope("hi"))])
    await run_turns(tmp_path, host, deliver_params("hi"))
    context = turn_context(host.model_requests[0].body["messages"])
    assert context.startswith("## Context\n") and "News" not in context and "Memory" not in context


async def test_env_11_per_channel_shrink_prefers_busy_channels(tmp_path: Path) -> None:
    quiet = {"id": "q-0", "role": "user", "author": "bob", "content": "old but alone",
             "at": (NOW - timedelta(days=1)).isoformat()}  # fmt: skip
    host = ScriptedHost(
        answers=[chat_result(envelope(f"r{n}")) for n in range(3)], history_bounds=HistoryBounds(4, 2)
    )
    seed(host, "quiet", [quiet])  # another channel of the imp: the host trims across the imp's channels
    turns = [deliver_params(f"q{n}", f"m{n}", now=NOW + timedelta(minutes=n)) for n in range(3)]
    await run_turns(tmp_path, host, *turns, history_limit=4, history_per_channel=2)
    kept = stored(host)
    # The oldest record survives: its channel is not busy; c1's oldest go first.
    assert [r["content"] for r in kept] == ["old but alone", "r1", "q2", "r2"]


async def test_env_12_three_failed_attempts_raise_spaced_by_exponential_backoff(tmp_path: Path) -> None:
    host = ScriptedHost(answers=[ModelRequestResult(status=500, body={"error": {"message": "boom"}})])
    sleeps = Sleeps()
    async with in_process_box(host, tmp_path / "state", sleep=sleeps) as box:
        await box.init(init_params(retry_backoff_s=1.5))
        result = await box.deliver(deliver_params("hi"))
    assert result.outcome == "failed" and "no usable answer after 3 attempts" in (result.error or "")
    assert host.model_calls == 3
    assert sleeps.calls == [1.5, 3.0]  # a sleep between consecutive attempts, doubling; none after the last


async def test_env_13_reaction_clear_is_recorded(tmp_path: Path) -> None:
    host = ScriptedHost(answers=[chat_result(envelope("oh no, my reactions"))])
    event = MailboxEventParams(
        kind="reaction_clear", channel_id="c1", message_id="m0", reactions=["👍", "🎉"], at=NOW
    )
    async with InProcessBackend().open(spec(tmp_path), host) as running:
        await running.init(init_params(), timeout=30)
        await running.peer.notify("mailbox.event", event)
        await running.peer.notify(
            "mailbox.event", event.model_copy(update={"kind": "future_thing"})
        )  # ignored
        await running.deliver(deliver_params("what happened?", now=NOW + timedelta(minutes=1)), timeout=30)
    [record] = [r for r in stored(host) if r["role"] == "event"]
    assert record["channel_id"] == "c1" and "m0" in record["content"] and "👍, 🎉" in record["content"]
    messages = host.model_requests[0].body["messages"]
    assert messages[1] == {"role": "user", "content": "[the reactions on message m0 were cleared (👍, 🎉)]"}


async def test_env_13_an_event_no_turn_followed_is_kept_when_the_box_shuts_down(tmp_path: Path) -> None:
    """A notification never waits on the host: its line is held, and sent at the latest when the box ends."""
    host = ScriptedHost()
    event = MailboxEventParams(
        kind="reaction_clear", channel_id="c1", message_id="m0", reactions=["👍"], at=NOW
    )
    async with InProcessBackend().open(spec(tmp_path), host) as running:
        await running.init(init_params(), timeout=30)
        await running.peer.notify("mailbox.event", event)
    [record] = stored(host)
    assert record["role"] == "event" and "m0" in record["content"]
    assert [method for method, _ in host.calls if method.startswith("history.")] == ["history.commit"]


async def test_env_13_the_event_reaches_the_memory_engine(tmp_path: Path) -> None:
    memory = OwlMemory()
    async with in_process_box(ScriptedHost(), tmp_path / "state", memory=memory) as box:
        await box.init(init_params())
        await box.notify(
            "mailbox.event", MailboxEventParams(kind="reaction_clear", channel_id="c1", message_id="m0")
        )
        await box.deliver(deliver_params("sync point"))  # handled after the notification, in order
    assert memory.events == [("c1", "the reactions on message m0 were cleared (all reactions)")]


async def test_env_16_model_calls_are_never_served_from_a_cache(tmp_path: Path) -> None:
    host = ScriptedHost(answers=[chat_result(envelope("first")), chat_result(envelope("second"))])
    same = deliver_params("the same question", "m1")
    results = await run_turns(
        tmp_path,
        host,
        same,
        same.model_copy(update={"message": same.message.model_copy(update={"id": "m2"})}),
    )
    assert [r.outcome for r in results] == ["sent", "sent"]
    assert host.model_calls == 2 and [s.content for s in host.sent] == ["first", "second"]  # type: ignore[attr-defined]
    # No response cache anywhere the box writes (nor a history file: the host keeps the lines, issue 22).
    assert files_under(tmp_path / "state") == ["journal.jsonl"]


async def test_env_17_sync_tools_run_in_a_worker_thread(tmp_path: Path) -> None:
    threads: list[int] = []

    def lookup(arguments: dict[str, Any]) -> str:  # a slow, blocking lookup (numpy, a big index)
        threads.append(threading.get_ident())
        time.sleep(0.3)
        return f"ann told you about {arguments['query']}"

    schema = {
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
        "additionalProperties": False,
    }
    registry = ToolRegistry([Tool("lookup", "Look something up.", schema, lookup)])
    host = ScriptedHost(
        answers=[
            tool_calls_result(("lookup", {"query": "owls"}, "call_1")),
            chat_result(envelope("You told me about owls.")),
        ]
    )
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            ticks.append(time.monotonic())
            await anyio.sleep(0.02)

    async with in_process_box(host, tmp_path / "state", tools=registry) as box:
        await box.init(init_params(tools=["lookup"]))
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            started = time.monotonic()
            result = await box.deliver(deliver_params("what did I tell you?"))
            tg.cancel_scope.cancel()
    assert result.outcome == "sent"
    assert threads and threads[0] != threading.get_ident()  # not the event loop's thread
    during = [t for t in ticks if started < t < started + 0.3]
    assert len(during) >= 5  # the loop kept running while the lookup blocked
    tool_message = host.model_requests[1].body["messages"][-1]
    assert tool_message == {"role": "tool", "tool_call_id": "call_1", "content": "ann told you about owls"}


async def test_env_18_malformed_or_refused_output_is_a_failed_attempt(tmp_path: Path) -> None:
    refusal = ModelRequestResult(
        status=200,
        body={"choices": [{"message": {"role": "assistant", "content": None, "refusal": "I can't."}}]},
    )
    wrong_shape = chat_result({"answer": "hi"})  # valid JSON, not the envelope: no relaxed fallback
    host = ScriptedHost(
        answers=[chat_result("{not json"), refusal, wrong_shape, chat_result(envelope("finally"))]
    )
    sleeps = Sleeps()
    async with in_process_box(host, tmp_path / "state", sleep=sleeps) as box:
        await box.init(init_params())
        failed = await box.deliver(deliver_params("one", "m1"))
        ok = await box.deliver(deliver_params("two", "m2"))
    assert (
        failed.outcome == "failed"
        and "not a valid envelope" in (failed.error or "")
        and "refused" in (failed.error or "")
    )
    assert ok.outcome == "sent" and host.sent[0].content == "finally"  # type: ignore[attr-defined]
    assert host.model_calls == 4 and {r.purpose for r in host.model_requests} == {"reply"}  # no repair model
    first_three = [r.body for r in host.model_requests[:3]]
    assert (
        first_three[0] == first_three[1] == first_three[2]
    )  # the same strict call again, not a fix() prompt
    assert sleeps.calls == [1.0, 2.0]


async def test_a_gateway_rate_limit_is_a_failed_attempt_but_a_budget_stop_is_final(tmp_path: Path) -> None:
    limited = RpcError(ErrorCode.RATE_LIMITED, "rate limited", {"retry_after": 4.0, "rule": "r"})
    host = ScriptedHost(answers=[limited, chat_result(envelope("ok"))])
    sleeps = Sleeps()
    async with in_process_box(host, tmp_path / "state", sleep=sleeps) as box:
        await box.init(init_params())
        assert (await box.deliver(deliver_params("hi"))).outcome == "sent"
    assert sleeps.calls == [4.0]  # waited as long as the host asked

    budget = RpcError(
        ErrorCode.BUDGET_EXHAUSTED, "budget exhausted", {"ledger": "imp:pip/day", "retry_after": 60}
    )
    host = ScriptedHost(answers=[budget])
    async with in_process_box(host, tmp_path / "state2", sleep=Sleeps()) as box:
        await box.init(init_params())
        result = await box.deliver(deliver_params("hi"))
    assert result.outcome == "failed" and host.model_calls == 1


def _other_author(name: str) -> Author:
    return Author(id=f"id-{name}", name=name)


async def test_recent_history_from_the_host_reaches_the_prompt(tmp_path: Path) -> None:
    recent = [
        HistoryEntry(id="h1", author=_other_author("bob"), content="anyone here?", created_at=NOW - timedelta(minutes=2)),
        HistoryEntry(id="h2", author=Author(id="imp", name="pip", bot=True), content="I am!", created_at=NOW - timedelta(minutes=1), from_imp=True),
        HistoryEntry(id="m1", author=Author(id="u1", name="ann"), content="hi all", created_at=NOW),
    ]  # fmt: skip
    host = ScriptedHost(answers=[chat_result(envelope("hi ann"))])
    await run_turns(tmp_path, host, deliver_params("hi all", recent=recent))
    messages = host.model_requests[0].body["messages"]
    assert messages[1:-1] == [
        {"role": "user", "content": "bob: anyone here?"},
        {"role": "assistant", "content": "I am!"},
    ]
    assert messages[-1]["role"] == "user" and split_context(messages[-1]["content"])[1] == "ann: hi all"
