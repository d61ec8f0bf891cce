"""Every failure reads the same (issue 19 #5), end to end: the real box program says which failure ended its
turn, the session manager posts that failure's own line, a failed task's show says it, and messages missed
across a restart are mentioned to their person exactly once."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from box.protocol import ErrorCode, RpcError
from box.protocol.models import Author, Message
from impyard.clock import FixedClock
from impyard.conversation.responder_history import ResponderHistory
from impyard.conversation.sessions import SessionSettings
from impyard.discord.shards import Shard
from impyard.failure_words import WORDS, words_for
from impyard.gateway.core import storage_failed
from impyard.gateway.surfaces import RecordingSurface
from impyard.imps.store import ImpStore
from impyard.runtime import open_runtime
from impyard.tasks.attestation import RunEnd, RunFacts, attest
from testing.fake_openai import FakeOpenAI
from testing.inprocess import InProcessBackend
from tests.scripted import ScriptedHost, chat_result, deliver_params, in_process_box, init_params
from tests.test_sessions import Recorder, delivery, manager

pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(env=True, answer="hello there")]


async def no_sleep(_: float) -> None:
    pass  # ENV-12's backoff, without waiting


def http(status: int) -> object:
    return chat_result({"error": {"message": "upstream says no"}}, status=status)


UNREACHABLE_HUNG = RpcError(
    ErrorCode.UPSTREAM_UNREACHABLE,
    "model API unreachable: the model API did not answer within 40 s",
    {"reason": "the model API did not answer within 40 s"},
)
DENIED = RpcError(ErrorCode.DENIED, "denied by policy rule no-models: not today", {"rule": "no-models"})
BUDGET = RpcError(
    ErrorCode.BUDGET_EXHAUSTED,
    "budget exhausted: budget imp:pip/day has $0.0000 of $0.0000 left; it resets in 3600 s",
    {"ledger": "imp:pip/day", "retry_after": 3600},
)


@pytest.mark.parametrize(
    ("answer", "words", "calls"),
    [
        (http(429), "The model is rate-limiting us — try again in a minute.", 3),
        (http(500), "The model service is having trouble — try again in a few minutes.", 3),
        (UNREACHABLE_HUNG, "The model didn't answer in time — try again in a moment.", 3),
        (DENIED, "That was blocked by policy, so I didn't answer.", 1),
        (BUDGET, "I'm over today's budget (resets at 00:00 UTC).", 1),
    ],
    ids=["429", "500", "hung", "denied", "budget"],
)
async def test_the_box_says_which_failure_ended_the_turn(
    tmp_path: Path, answer: object, words: str, calls: int
) -> None:
    host = ScriptedHost(answers=[answer])  # type: ignore[list-item]
    async with in_process_box(host, tmp_path / "state", sleep=no_sleep) as box:
        await box.init(init_params())
        result = await box.deliver(deliver_params())
    assert result.outcome == "failed" and host.model_calls == calls
    assert words_for(result.error) == words
    assert host.sent == []


async def test_a_store_failure_of_the_host_reads_as_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(self: ResponderHistory, imp: str, channel_id: str) -> object:
        raise storage_failed()  # what the gateway answers when its database can't be written: a full disk

    monkeypatch.setattr(ResponderHistory, "load", full)
    host = ScriptedHost(answers=[storage_failed()])
    async with in_process_box(host, tmp_path / "state", sleep=no_sleep) as box:
        await box.init(init_params())
        result = await box.deliver(deliver_params())
    # The history lines are context: the turn goes on without them, and the model call meets the same disk.
    assert result.outcome == "failed" and (result.error or "").startswith("[store] ")
    assert words_for(result.error) == WORDS["store"] and host.model_calls == 1


async def test_a_send_refused_by_its_rate_limit_is_not_blamed_on_the_model(tmp_path: Path) -> None:
    host = ScriptedHost(
        send_errors=[RpcError(ErrorCode.RATE_LIMITED, "rate limited by rule send-own-channel")]
    )
    async with in_process_box(host, tmp_path / "state", sleep=no_sleep) as box:
        await box.init(init_params())
        result = await box.deliver(deliver_params())
    assert words_for(result.error) == WORDS["send_limited"]


async def test_the_channel_gets_that_failures_own_line(tmp_path: Path) -> None:
    host, recorder = ScriptedHost(answers=[DENIED]), Recorder()
    async with manager(tmp_path, host, recorder, SessionSettings(failure_notice="sorry!")) as sessions:
        sessions.deliver(delivery(1))
        await recorder.until(lambda: recorder.notices)
    assert recorder.notices == ["That was blocked by policy, so I didn't answer."]  # not "sorry!"
    assert recorder.outcomes[0][1].outcome == "failed"


async def test_an_empty_failure_notice_still_posts_nothing(tmp_path: Path) -> None:
    host, recorder = ScriptedHost(answers=[DENIED]), Recorder()
    async with manager(tmp_path, host, recorder, SessionSettings(failure_notice=None)) as sessions:
        sessions.deliver(delivery(1))
        await recorder.until(lambda: recorder.outcomes)
    assert recorder.notices == []


def test_task_show_says_which_failure() -> None:
    end = RunEnd("failed", "[rate_limited] no usable answer after 3 attempts: model returned HTTP 429")
    said = attest(end, RunFacts(model_calls=3)).outcome
    assert said.startswith(
        "the box reported failure: The model is rate-limiting us — try again in a minute. (no usable answer"
    )


# --- missed across a restart: mentioned once ---------------------------------------------------------

CHANNEL = "900"


async def test_messages_missed_across_a_restart_are_mentioned_exactly_once(fake: FakeOpenAI) -> None:
    ImpStore().add("pip", "You are Pip.")
    clock = FixedClock()
    backend = InProcessBackend()
    surface = RecordingSurface()
    stale = clock.now() - timedelta(minutes=30)

    def start():  # type: ignore[no-untyped-def]
        return open_runtime(["pip"], surface, clock=clock, backends={"pip": backend}, surfaces=("discord",))

    async with start() as rt:  # a crash between "woken" and "answered", written directly
        rt.channels.seen(CHANNEL, surface="discord", kind="dm")
        rt.channels.seen("terminal:ann", surface="terminal", kind="terminal")
        for n, channel in ((1, CHANNEL), (2, CHANNEL), (3, "terminal:ann")):
            msg = Message(
                id=f"m{n}", author=Author(id="ann", name="ann"), content=f"q{n}",
                created_at=stale + timedelta(minutes=n),
            )  # fmt: skip
            rt.history.record(channel, msg)
            rt.history.record_wake("pip", channel, msg.id)
    for _ in range(2):  # restarted twice: mentioned after the first only
        async with start() as rt:
            assert rt.history.outcome("pip", CHANNEL, "m1") == "missed"
    stamp = f"{stale + timedelta(minutes=1):%H:%M}–{stale + timedelta(minutes=2):%H:%M}"
    assert [(s.channel_id, s.kind, s.content) for s in surface.sent] == [
        (
            CHANNEL,
            "notice",
            f"I missed your 2 messages from {stamp} UTC while I was restarting — please send them again.",
        )
    ]  # the terminal's missed message is not printed into Discord: that host does not reach it
    # ... nor marked missed there (issue 19 #5): it waits for the host that reaches the terminal channel.
    async with start() as rt:
        assert rt.history.outcome("pip", "terminal:ann", "m3") is None
    surface.sent.clear()
    async with open_runtime(
        ["pip"], surface, clock=clock, backends={"pip": backend}, surfaces=("terminal",)
    ) as rt:
        assert rt.history.outcome("pip", "terminal:ann", "m3") == "missed"
        assert rt.history.outcome("pip", CHANNEL, "m1") == "missed"  # untouched: marked by the Discord host
    assert [(s.channel_id, s.kind) for s in surface.sent] == [("terminal:ann", "notice")]
    assert "I missed your message from" in surface.sent[0].content


async def test_after_a_restart_a_shard_host_answers_only_its_own_shards_channels(fake: FakeOpenAI) -> None:
    """Issue 21: hosts serving two shards of one database each recover the messages of their own shard's
    servers (and shard 0 the DMs); another shard's are left, unmarked, to the host that serves it."""
    ImpStore().add("pip", "You are Pip.")
    clock = FixedClock()
    backend = InProcessBackend()
    surface = RecordingSurface()
    stale = clock.now() - timedelta(minutes=30)
    even, odd = str(2_000 << 22), str(2_001 << 22)  # servers of shard 0 and shard 1 of 2

    def start(shard: Shard | None):  # type: ignore[no-untyped-def]
        return open_runtime(
            ["pip"], surface, clock=clock, backends={"pip": backend}, surfaces=("discord",),
            owns_channel=shard.owns_channel if shard is not None else None,
        )  # fmt: skip

    async with start(None) as rt:
        rt.channels.seen("even-c", surface="discord", kind="guild", guild_id=even)
        rt.channels.seen("odd-c", surface="discord", kind="guild", guild_id=odd)
        rt.channels.seen("dm-c", surface="discord", kind="dm")
        for n, channel in enumerate(("even-c", "odd-c", "dm-c")):
            msg = Message(id=f"m{n}", author=Author(id="ann", name="ann"), content="q", created_at=stale)
            rt.history.record(channel, msg)
            rt.history.record_wake("pip", channel, msg.id)
    async with start(Shard(1, 2)) as rt:
        assert [rt.history.outcome("pip", c, f"m{n}") for n, c in enumerate(("even-c", "odd-c", "dm-c"))] == [
            None,
            "missed",
            None,
        ]
    assert [s.channel_id for s in surface.sent] == ["odd-c"]
    async with start(Shard(0, 2)) as rt:
        assert [rt.history.outcome("pip", c, f"m{n}") for n, c in enumerate(("even-c", "odd-c", "dm-c"))] == [
            "missed",
            "missed",
            "missed",
        ]
    assert sorted(s.channel_id for s in surface.sent) == ["dm-c", "even-c", "odd-c"]  # each mentioned once
