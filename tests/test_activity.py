"""Issue 34, the console's Now page: what each host is doing now reaches another process through the database.

A serving host's turn held in flight (the fake model holds its reply) shows in ``read_now`` — from another Database
object on the same file — with its stage and the messages queued behind it; when the turn ends it is gone and its
outcome leads the recent outcomes; a host whose lease expired (or whose process is gone) is never shown; the row
goes when the host stops cleanly; a host writes its snapshot only when it changed.
"""

from __future__ import annotations

import getpass
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pexpect
import pytest
from click.testing import CliRunner
from sqlalchemy import select

from impyard.channels.store import ChannelInfo, channel_label
from impyard.cli import cli
from impyard.clock import FixedClock
from impyard.conversation.activity import (
    ActivityPublisher,
    Now,
    now_stage,
    put_activity,
    read_now,
    snapshot_text,
)
from impyard.conversation.history import History
from impyard.conversation.sessions import SessionActivity
from impyard.discord.shards import Shard
from impyard.imps.store import ImpStore
from impyard.storage.db import Database, open_database
from impyard.storage.leases import LeaseStore, host_lease_name, task_lease_name
from impyard.storage.liveness import Holder
from impyard.storage.tables import host_activity
from impyard.tasks.request import TaskRequest
from impyard.tasks.store import TaskStore
from testing.fake_openai import FakeOpenAI, RecordedRequest, envelope
from tests.discord_yard import ALICE, BOB, CAROL, GENERAL, serving

NOW = datetime(2026, 12, 7, 2, 0, tzinfo=UTC)
FAR = Holder("far-away", "b00t", 4242, "9")  # a host of another machine: only its lease says whether it lives
WAIT_S = 30.0
IMPYARD = str(Path(sys.executable).parent / "impyard")
pytestmark = pytest.mark.fake_model()


@pytest.mark.parametrize(
    ("box_stage", "shown"),
    [
        (None, "starting"),
        ("context", "reading"),
        ("tools", "thinking"),
        ("decision", "thinking"),
        ("render", "writing"),
        ("send", "writing"),
        ("post", "remembering"),
        ("failed", "failed"),
    ],
)
def test_a_box_stage_is_said_as_the_now_page_says_it(box_stage: str | None, shown: str) -> None:
    assert now_stage(box_stage) == shown


@pytest.mark.parametrize(
    ("channel_id", "info", "label"),
    [
        ("1001", ChannelInfo("1001", kind="guild", name="general"), "#general"),
        ("1100", ChannelInfo("1100", kind="dm", name="DM with carol"), "DM with carol"),
        ("terminal:ann", ChannelInfo("terminal:ann", surface="terminal", kind="terminal"), "terminal (ann)"),
        ("1002", None, "1002"),  # a channel the store never saw: its id
        ("1003", ChannelInfo("1003", kind="guild", name=""), "1003"),
    ],
)
def test_a_channel_is_labelled_as_an_operator_knows_it(
    channel_id: str, info: ChannelInfo | None, label: str
) -> None:
    assert channel_label(channel_id, info) == label


def session(imp: str = "pip", channel: str = "1001", **changes: Any) -> SessionActivity:
    fields: dict[str, Any] = {
        "warm": True, "in_turn": 1, "stage": "tools", "turn_since": NOW - timedelta(seconds=3),
        "stage_since": NOW - timedelta(seconds=1), "waiting": 2,
    }  # fmt: skip
    fields.update(changes)
    return SessionActivity(imp, channel, **fields)


def publish_as(db: Database, holder: Holder, *sessions: SessionActivity, at: datetime = NOW) -> None:
    put_activity(db, host_lease_name(holder), holder, snapshot_text(sessions), at)


def test_a_host_is_shown_only_while_it_holds_its_lease(any_engine_db: Database) -> None:
    db = any_engine_db
    clock = FixedClock(NOW)
    elsewhere = LeaseStore(db, clock, me=FAR)
    elsewhere.acquire(host_lease_name(FAR), {"command": "serve", "shard": "0/2"}, timedelta(seconds=30))
    publish_as(db, FAR, session(), session(channel="1002", in_turn=0, stage=None, waiting=0))

    now = read_now(db, NOW + timedelta(seconds=5), alive=lambda holder: None)
    assert [(h.hostname, h.pid, h.command, h.shard) for h in now.hosts] == [
        ("far-away", 4242, "serve", "0/2")
    ]
    assert [(t.imp, t.channel_id, t.stage, t.box_stage, t.waiting, t.hostname) for t in now.turns] == [
        ("pip", "1001", "thinking", "tools", 2, "far-away")
    ]
    assert (now.queued, now.warm_boxes, len(now.sessions)) == (2, 2, 2)
    assert now.turns[0].turn_since == NOW - timedelta(seconds=3)

    expired = read_now(db, NOW + timedelta(seconds=31), alive=lambda holder: None)
    assert (expired.hosts, expired.sessions) == ([], [])  # its lease expired: nothing of it is live
    dead = read_now(db, NOW + timedelta(seconds=5), alive=lambda holder: False)
    assert (dead.hosts, dead.sessions) == ([], [])  # a process of this machine that is gone: not live either


def test_a_snapshot_another_process_of_that_name_wrote_is_not_shown(any_engine_db: Database) -> None:
    """A recycled pid: the lease record is held by a new process, the row is still the old one's."""
    db = any_engine_db
    LeaseStore(db, FixedClock(NOW), me=FAR).acquire(host_lease_name(FAR), {"command": "chat"})
    publish_as(db, Holder("far-away", "b00t", 4242, "1"), session())  # the same name, an older process
    now = read_now(db, NOW, alive=lambda holder: None)
    assert [h.hostname for h in now.hosts] == ["far-away"]  # the host lives, and says nothing yet
    assert now.sessions == [] and now.hosts[0].activity_at is None


def test_a_garbled_snapshot_shows_the_host_with_nothing_known(any_engine_db: Database) -> None:
    db = any_engine_db
    LeaseStore(db, FixedClock(NOW), me=FAR).acquire(host_lease_name(FAR), {"command": "serve"})
    put_activity(db, host_lease_name(FAR), FAR, '{"sessions": [{"imp": 3}]}', NOW)
    now = read_now(db, NOW, alive=lambda holder: None)
    assert [h.hostname for h in now.hosts] == ["far-away"] and now.sessions == []


def test_recent_outcomes_are_the_newest_turns_one_row_each(any_engine_db: Database) -> None:
    db = any_engine_db
    clock = FixedClock(NOW)
    history = History(db, clock)
    for n in range(5):
        history.record_wake("pip", "1001", f"m{n}")
    clock.advance(timedelta(seconds=2))
    history.finish("pip", "1001", ["m0"], "sent")
    clock.advance(timedelta(seconds=2))
    history.finish("pip", "1001", ["m1", "m2"], "failed", "model: the model server refused\nmore detail")
    clock.advance(timedelta(seconds=2))
    history.finish("pip", "1001", ["m3"], "silent")
    now = read_now(db, NOW + timedelta(minutes=1), recent=2)
    assert [(o.outcome, o.messages, o.error, o.channel, o.surface) for o in now.recent] == [
        ("silent", 1, None, "1001", "discord"),
        ("failed", 2, "model: the model server refused", "1001", "discord"),
    ]
    assert now.recent[1].finished_at == NOW + timedelta(seconds=4)
    assert now.recent[1].woken_at == NOW
    assert [o.outcome for o in read_now(db, NOW, recent=10).recent] == ["silent", "failed", "sent"]


@pytest.mark.anyio
async def test_a_host_writes_its_snapshot_only_when_it_changed(db: Database) -> None:
    state = [session(stage="context")]
    async with ActivityPublisher(db, FixedClock(NOW), me=FAR, every=timedelta(hours=1)) as publisher:
        publisher.follow(lambda: state)
        with anyio.fail_after(WAIT_S):
            while publisher.writes < 1:  # the first look writes at once
                await anyio.sleep(0.01)
        assert not await publisher.publish()  # nothing changed: no write
        state = [session(stage="tools")]
        assert await publisher.publish()
        assert not await publisher.publish()
        assert publisher.writes == 2
        rows = db.read(lambda conn: conn.execute(select(host_activity.c.host)).scalars().all())
        assert rows == [host_lease_name(FAR)]
    assert db.read(lambda conn: conn.execute(select(host_activity.c.host)).scalars().all()) == []


# ---------------------------------------------------------------- a real serving host, its turn held


class HeldReply:
    """The fake model's reply call waits until ``release``: the turn stays in flight, at its ``tools`` stage."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.calls = 0

    def __call__(self, request: RecordedRequest) -> Any:
        self.calls += 1
        self.released.wait(WAIT_S)
        return envelope(answer=f"reply {self.calls}", answer_needed=True)


@pytest.fixture
def held(fake: FakeOpenAI) -> Iterator[HeldReply]:
    reply = HeldReply()
    fake.script(reply, purpose="reply")  # memory's calls, if any, are answered at once
    yield reply
    reply.released.set()  # never leave the fake's handler waiting


def read_elsewhere() -> Now:
    """What a console process would read: its own Database object on the same file."""
    db = open_database()
    try:
        return read_now(db)
    finally:
        db.close()


async def until_now(predicate: Callable[[Now], bool]) -> Now:
    with anyio.fail_after(WAIT_S):
        while True:
            found = await anyio.to_thread.run_sync(read_elsewhere)
            if predicate(found):
                return found
            await anyio.sleep(0.05)


@pytest.mark.anyio
async def test_a_turn_held_in_flight_shows_with_its_stage_then_its_outcome(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI, held: HeldReply
) -> None:
    async with serving(monkeypatch, model, answer=None, shard=Shard(0, 1)) as yard:
        yard.fake.post_message(GENERAL, ALICE, "hello pip")
        now = await until_now(lambda now: any(t.stage == "thinking" for t in now.turns))
        (turn,) = now.turns
        (host,) = now.hosts
        assert (turn.imp, turn.channel_id, turn.channel, turn.surface, turn.box_stage) == (
            "pip", str(GENERAL), "#general", "discord", "tools",
        )  # fmt: skip
        assert (turn.in_turn, turn.waiting, turn.warm) == (1, 0, True)
        assert (host.command, host.shard, host.pid) == ("serve", "0/1", turn.pid)
        assert turn.turn_since is not None and turn.stage_since is not None
        assert turn.turn_since <= turn.stage_since <= now.at

        # Two more messages wait behind the turn in flight.
        yard.fake.post_message(GENERAL, BOB, "are you there?")
        yard.fake.post_message(GENERAL, CAROL, "pip?")
        now = await until_now(lambda now: now.queued == 2)
        assert [(t.channel, t.stage, t.waiting) for t in now.turns] == [("#general", "thinking", 2)]
        # ``impyard now`` says the same (TSV when piped): the turn, its stage, the two queued behind it.
        shown = CliRunner().invoke(cli, ["now"])
        assert shown.exit_code == 0, shown.output
        header, row = shown.output.splitlines()
        assert header.split("\t") == [
            "imp", "channel", "surface", "stage", "for", "messages", "queued", "box", "host", "pid",
        ]  # fmt: skip
        cells = row.split("\t")
        assert cells[:4] + cells[5:9] == [
            "pip",
            "#general",
            "discord",
            "thinking",
            "1",
            "2",
            "warm",
            turn.hostname,
        ]
        listed = json.loads(CliRunner().invoke(cli, ["now", "--json"]).output)
        assert [(s["stage"], s["box_stage"], s["queued"]) for s in listed["sessions"]] == [
            ("thinking", "tools", 2)
        ]
        assert listed["recent"] == []

        held.released.set()  # both turns answer now: the first, then the two queued messages together
        now = await until_now(lambda now: not now.turns and len(now.recent) >= 2)
        assert [(o.imp, o.channel, o.outcome, o.messages) for o in now.recent[:2]] == [
            ("pip", "#general", "sent", 2),
            ("pip", "#general", "sent", 1),
        ]
        assert [(s.channel, s.warm, s.stage, s.waiting) for s in now.sessions] == [
            ("#general", True, None, 0)
        ]  # a warm box, waiting for the next message
    # Stopped cleanly: its lease record and its activity row are gone.
    db = open_database()
    try:
        assert db.read(lambda conn: conn.execute(select(host_activity)).all()) == []
        assert read_now(db).hosts == []
    finally:
        db.close()


def test_an_impyard_chat_turn_in_flight_shows_from_another_process(
    tmp_path: Path, model: FakeOpenAI, held: HeldReply
) -> None:
    """The real ``impyard chat`` process publishes; this process reads the database as a console would."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    env = {
        **os.environ, "IMPYARD_HOME": str(tmp_path / "home"), "IMPYARD_DATABASE_URL": url,
        "OPENAI_API_KEY": str(model.api_key), "OPENAI_BASE_URL": model.base_url, "PROMPT_TOOLKIT_NO_CPR": "1",
    }  # fmt: skip
    user = getpass.getuser()

    def until(predicate: Callable[[Now], bool]) -> Now:
        deadline = time.monotonic() + WAIT_S
        while True:
            db = open_database(url=url)
            try:
                found = read_now(db)
            finally:
                db.close()
            if predicate(found) or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    chat = pexpect.spawn(
        IMPYARD, ["chat", "--backend", "process"], env=env, encoding="utf-8", timeout=WAIT_S, dimensions=(40, 200)
    )  # fmt: skip
    try:
        chat.expect("you> ")
        chat.sendline("hello pip")
        now = until(lambda now: any(t.stage == "thinking" for t in now.turns))
        assert [(t.imp, t.channel, t.surface, t.stage, t.pid) for t in now.turns] == [
            ("pip", f"terminal ({user})", "terminal", "thinking", chat.pid)
        ]
        assert [(h.command, h.pid) for h in now.hosts] == [("chat", chat.pid)]
        held.released.set()
        chat.expect("pip> reply 1")
        now = until(lambda now: not now.turns and bool(now.recent))
        assert not now.turns
        assert [(o.imp, o.channel, o.surface, o.outcome) for o in now.recent] == [
            ("pip", f"terminal ({user})", "terminal", "sent")
        ]
    finally:
        held.released.set()  # a failed assertion above leaves no turn to wait for
        chat.sendline("/quit")
        chat.expect(pexpect.EOF)
        chat.close()
    assert chat.exitstatus == 0
    db = open_database(url=url)
    try:
        assert (
            db.read(lambda conn: conn.execute(select(host_activity)).all()) == []
        )  # withdrawn as it stopped
    finally:
        db.close()


def test_a_task_run_held_by_a_live_host_shows_and_one_whose_lease_expired_does_not(
    any_engine_db: Database,
) -> None:
    db = any_engine_db
    clock = FixedClock(NOW)
    ImpStore().add("pip")
    store = TaskStore(db, clock)
    running = store.add(TaskRequest(imp="pip", prompt="water the plants", kind="prompt"))
    assert store.claim(running.id, "r-1", "process") is not None
    LeaseStore(db, clock, me=FAR).acquire(task_lease_name(running.id, "r-1"), ttl=timedelta(seconds=30))
    (task,) = read_now(db, NOW + timedelta(seconds=5), alive=lambda holder: None).tasks
    assert (task.task_id, task.imp, task.kind, task.hostname, task.pid, task.started_at) == (
        running.id, "pip", "prompt", "far-away", 4242, NOW,
    )  # fmt: skip
    assert read_now(db, NOW + timedelta(seconds=31), alive=lambda holder: None).tasks == []


def test_now_on_a_database_no_host_runs_on_says_who_shows_there() -> None:
    result = CliRunner().invoke(cli, ["now"])
    assert result.exit_code == 0
    assert result.output.startswith("no host is running on this database")
    listed = json.loads(CliRunner().invoke(cli, ["now", "--json"]).output)
    assert (listed["hosts"], listed["sessions"], listed["tasks"], listed["recent"]) == ([], [], [], [])


def test_now_lists_the_recent_outcomes_when_nothing_runs() -> None:
    db = open_database()
    try:
        history = History(db, FixedClock(NOW))
        history.record_wake("pip", "1001", "m1")
        history.finish("pip", "1001", ["m1"], "failed", "the box died\ntrace")
    finally:
        db.close()
    result = CliRunner().invoke(cli, ["now"])
    assert result.exit_code == 0, result.output
    header, row = result.output.splitlines()
    assert header.split("\t")[1:] == ["imp", "channel", "surface", "outcome", "messages", "took", "error"]
    assert row.split("\t")[1:] == ["pip", "1001", "discord", "failed", "1", "0s", "the box died"]
    refused = CliRunner().invoke(cli, ["now", "--recent", "-1"])
    assert refused.exit_code == 2 and "Traceback" not in refused.output
