"""Departures on the host (mechanism 103): who has left, queued exactly once, run in a one-shot box.

The scan (``impyard.memory.departures``) over a real host database: the person's last input comes from the
host's history and wakes, the presence window is 1800 s, and the ``memory_departures`` key makes a second scan,
a second host on the same file or a restart queue nothing. The supervisor runs the ``depart`` task in a fresh
process box with the scopes of the conversation's channel; the box program answers it with its memory engine
(a stand-in here: ``tests/boxes/departing_box.py``; the real ``ChatMemory.depart`` is tested with the engine).
Expected values are written out, never read from the module under test.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from box.protocol.models import (
    Author,
    BoxInitParams,
    ImpSpec,
    MemorySettings,
    Message,
    SessionInfo,
    TaskRunParams,
    TaskSpec,
)
from impyard.backends.process import ProcessBackend
from impyard.channels.store import ChannelInfo, ChannelStore
from impyard.clock import FixedClock
from impyard.conversation.history import History
from impyard.gateway.broker import UpstreamConfig
from impyard.gateway.core import Gateway
from impyard.gateway.policy import load_policy
from impyard.gateway.surfaces import RecordingSurface
from impyard.host import build_gateway
from impyard.imps.store import ImpStore
from impyard.memory.departures import Due, depart_now, due, memory_imps, queue, queue_due
from impyard.memory.scopes import scopes_of
from impyard.memory.service import memory_service
from impyard.memory.store import MemoryStore
from impyard.storage.db import Database, open_database
from impyard.supervisor import Supervisor, SupervisorSettings
from impyard.tasks import Task, TaskRequest, TaskStore
from testing.inprocess import InProcessBackend
from tests import scripted, sqlfile

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 5, 11, 9, 0, tzinfo=UTC)
GUILD_CHANNEL = "300000000000000001"  # #general of guild 200…1
GUILD = "200000000000000001"
DM_CHANNEL = "300000000000000002"  # a DM with Ann
ANN, BOB = "100000000000000001", "100000000000000002"
DEPARTING_BOX = Path(__file__).parent / "boxes" / "departing_box.py"
FAST = SupervisorSettings(tick_s=0.05, shutdown_grace_s=2.0)
DEPARTURES = SupervisorSettings(tick_s=0.05, shutdown_grace_s=2.0, kinds=frozenset({"depart"}))  # chat's loop


def departing_box(mode: str = "report") -> ProcessBackend:
    return ProcessBackend(command=[sys.executable, str(DEPARTING_BOX), mode], warn=False)


@pytest.fixture
def imps() -> ImpStore:
    store = ImpStore()
    store.add("pip", box={"backend": "process"}, memory={"enabled": True, "embedder": "hashing"})
    store.add("quiet", box={"backend": "process"}, memory={"enabled": False})
    return store


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(T0)


@pytest.fixture
def channels(db: Database, clock: FixedClock) -> ChannelStore:
    store = ChannelStore(db, clock)
    store.upsert(ChannelInfo(GUILD_CHANNEL, kind="guild", name="general", guild_id=GUILD))
    store.upsert(ChannelInfo(DM_CHANNEL, kind="dm", name="Ann"))
    return store


def talk(
    db: Database, imp: str, channel: str, person: str, at: datetime, *, name: str = "Ann", woke: bool = True
) -> None:
    """``person`` said something at ``at`` that woke ``imp`` (unless ``woke`` is False), and the imp's box kept
    the conversation (``memory.conversation.put``) in that channel's scope, as a committed turn does."""
    clock = FixedClock(at)
    history = History(db, clock)
    message = Message(id=f"m-{uuid.uuid4().hex[:12]}", author=Author(id=person, name=name), content="hi",
                      created_at=at)  # fmt: skip
    history.record(channel, message)
    if woke:
        history.record_wake(imp, channel, message.id)
    scopes = scopes_of(db, imp, channel)
    assert scopes is not None
    state = {"version": 1, "person": name, "person_id": person, "last_input_at": at.isoformat()}
    MemoryStore(db, clock.now).scoped(imp, scopes, channel).conversation_put(person, state)


def due_in(db: Database, now: datetime, imps: Collection[str], **options: Any) -> list[Due]:
    """``due`` in one read snapshot of the host database."""
    return db.read(lambda conn: due(conn, now, imps, **options))


def departure_rows(db: Database) -> list[tuple[str, str, str, str, str | None]]:
    rows = sqlfile.query(
        db,
        "SELECT imp, channel_id, person, last_input_at, task_id FROM memory_departures ORDER BY last_input_at",
    )
    return [(r["imp"], r["channel_id"], r["person"], r["last_input_at"], r["task_id"]) for r in rows]


def depart_tasks(tasks: TaskStore) -> list[Task]:
    return [task for task in reversed(tasks.latest()) if task.kind == "depart"]


# ------------------------------------------------------------------ the scan: who has left (mechanism 103)


def test_m103_a_person_has_left_only_after_more_than_1800_s_without_input(
    db: Database, imps: ImpStore, channels: ChannelStore
) -> None:
    talk(db, "pip", GUILD_CHANNEL, ANN, T0)
    assert due_in(db, T0 + timedelta(seconds=1800), {"pip"}) == []  # mechanism 10: still present at 1800 s
    assert due_in(db, T0 + timedelta(seconds=1801), {"pip"}) == [Due("pip", GUILD_CHANNEL, ANN, T0)]


def test_m103_the_last_input_is_the_latest_message_that_woke_the_imp_there(
    db: Database, imps: ImpStore, channels: ChannelStore
) -> None:
    talk(db, "pip", GUILD_CHANNEL, ANN, T0)
    talk(db, "pip", GUILD_CHANNEL, ANN, T0 + timedelta(minutes=10))
    later = T0 + timedelta(minutes=20)
    History(db, FixedClock(later)).record(  # Ann spoke again, but not to pip: not an input of this talk
        GUILD_CHANNEL,
        Message(id="m-aside", author=Author(id=ANN, name="Ann"), content="hm", created_at=later),
    )
    now = T0 + timedelta(minutes=10, seconds=1801)
    assert due_in(db, now, {"pip"}) == [Due("pip", GUILD_CHANNEL, ANN, T0 + timedelta(minutes=10))]


def test_m103_trimmed_history_falls_back_to_the_conversations_own_last_input(
    db: Database, imps: ImpStore, channels: ChannelStore
) -> None:
    talk(db, "pip", GUILD_CHANNEL, ANN, T0)
    sqlfile.execute(db, "DELETE FROM history")  # trimmed away
    saved_later = T0 + timedelta(hours=1)
    sqlfile.execute(db, "UPDATE memory_conversations SET updated_at = ?", (saved_later.isoformat(),))
    assert due_in(db, T0 + timedelta(seconds=1801), {"pip"}) == [Due("pip", GUILD_CHANNEL, ANN, T0)]
    sqlfile.execute(
        db, "UPDATE memory_conversations SET state = '{}'"
    )  # no last input saved either: the save time
    assert due_in(db, T0 + timedelta(seconds=1801), {"pip"}) == []
    assert due_in(db, saved_later + timedelta(seconds=1801), {"pip"}) == [
        Due("pip", GUILD_CHANNEL, ANN, saved_later)
    ]


def test_m103_a_conversation_the_box_marked_departed_is_not_departed_again(
    db: Database, imps: ImpStore, channels: ChannelStore
) -> None:
    talk(db, "pip", GUILD_CHANNEL, ANN, T0)
    state = {"version": 1, "person": "Ann", "person_id": ANN, "last_input_at": T0.isoformat(),
             "departed_at": (T0 + timedelta(seconds=5)).isoformat()}  # fmt: skip
    sqlfile.execute(db, "UPDATE memory_conversations SET state = ?", (json.dumps(state),))
    assert due_in(db, T0 + timedelta(hours=1), {"pip"}) == []


def test_m103_only_memory_imps_depart_and_only_recent_talk(
    db: Database, imps: ImpStore, channels: ChannelStore
) -> None:
    talk(db, "pip", GUILD_CHANNEL, ANN, T0)
    talk(db, "quiet", GUILD_CHANNEL, BOB, T0, name="Bob")
    talk(db, "ghost", GUILD_CHANNEL, BOB, T0, name="Bob")  # an imp that no longer exists
    assert memory_imps(imps) == frozenset({"pip"})
    now = T0 + timedelta(hours=1)
    assert due_in(db, now, memory_imps(imps)) == [Due("pip", GUILD_CHANNEL, ANN, T0)]
    assert due_in(db, T0 + timedelta(days=7), {"pip"}) == [Due("pip", GUILD_CHANNEL, ANN, T0)]
    assert due_in(db, T0 + timedelta(days=7, seconds=1), {"pip"}) == []  # older talk never departs


# ------------------------------------------------------------------ exactly once


def test_m103_a_departure_is_queued_exactly_once_across_scans(
    db: Database, imps: ImpStore, channels: ChannelStore
) -> None:
    talk(db, "pip", GUILD_CHANNEL, ANN, T0)
    now = T0 + timedelta(seconds=1801)
    tasks = TaskStore(db, FixedClock(now), imps)
    [(item, task_id)] = queue_due(db, tasks, now, {"pip"})
    assert item == Due("pip", GUILD_CHANNEL, ANN, T0)
    assert due_in(db, now, {"pip"}) == []  # departed: no longer due
    assert queue_due(db, tasks, now, {"pip"}) == []  # a second scan
    assert queue_due(db, tasks, now + timedelta(hours=2), {"pip"}) == []  # a later one
    [task] = depart_tasks(tasks)
    assert task.id == task_id
    assert (task.imp, task.kind, task.prompt, task.person, task.channel_id, task.origin, task.ceiling_s) == (
        "pip", "depart", None, ANN, GUILD_CHANNEL, "event", 300.0,
    )  # fmt: skip
    assert (task.state, task.not_before) == ("queued", now)
    assert departure_rows(db) == [("pip", GUILD_CHANNEL, ANN, "2026-05-11T09:00:00.000000+00:00", task_id)]


def test_forgetting_a_person_forgets_their_departures_and_none_is_queued_again(
    db: Database, imps: ImpStore, channels: ChannelStore
) -> None:
    """``impyard memory forget --person`` / ``/forget-me``: the departure rows name the person, so they go with
    the person's conversations; with the conversations gone, a later scan has nothing to depart."""
    talk(db, "pip", GUILD_CHANNEL, ANN, T0)
    talk(db, "pip", GUILD_CHANNEL, BOB, T0, name="Bob")
    now = T0 + timedelta(seconds=1801)
    tasks = TaskStore(db, FixedClock(now), imps)
    assert len(queue_due(db, tasks, now, {"pip"})) == 2
    MemoryStore(db, FixedClock(now).now).forget_person("pip", [ANN], ["Ann"])
    assert [row[2] for row in departure_rows(db)] == [BOB]
    assert queue_due(db, tasks, now + timedelta(hours=1), {"pip"}) == []


def test_m103_two_hosts_on_one_database_queue_one_departure(
    tmp_path: Path, db: Database, imps: ImpStore, channels: ChannelStore
) -> None:
    """Two stores over the same file, scanning at the same moment from two threads: one task between them."""
    talk(db, "pip", GUILD_CHANNEL, ANN, T0)
    talk(db, "pip", DM_CHANNEL, ANN, T0 + timedelta(seconds=30))
    now = T0 + timedelta(hours=1)
    other = open_database(db.path)
    try:
        hosts = [(db, TaskStore(db, FixedClock(now), imps)), (other, TaskStore(other, FixedClock(now), imps))]
        barrier = threading.Barrier(len(hosts))
        queued: list[list[tuple[Due, str]]] = []

        def scan(database: Database, tasks: TaskStore) -> None:
            barrier.wait()
            queued.append(queue_due(database, tasks, now, {"pip"}))

        threads = [threading.Thread(target=scan, args=host) for host in hosts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    finally:
        other.close()
    assert sorted(len(batch) for batch in queued) in ([0, 2], [1, 1])  # whoever won, each departure once
    tasks = depart_tasks(TaskStore(db, FixedClock(now), imps))
    assert sorted((t.channel_id, t.person) for t in tasks) == [(GUILD_CHANNEL, ANN), (DM_CHANNEL, ANN)]
    assert len(departure_rows(db)) == 2


def test_m103_a_new_stretch_of_talk_departs_again(
    db: Database, imps: ImpStore, channels: ChannelStore
) -> None:
    talk(db, "pip", GUILD_CHANNEL, ANN, T0)
    tasks = TaskStore(db, FixedClock(T0), imps)
    assert len(queue_due(db, tasks, T0 + timedelta(seconds=1801), {"pip"})) == 1
    back = T0 + timedelta(hours=1)
    talk(db, "pip", GUILD_CHANNEL, ANN, back)  # Ann comes back: a new stretch of talk
    assert queue_due(db, tasks, back + timedelta(seconds=1800), {"pip"}) == []
    [(item, _)] = queue_due(db, tasks, back + timedelta(seconds=1801), {"pip"})
    assert item == Due("pip", GUILD_CHANNEL, ANN, back)
    assert [row[3] for row in departure_rows(db)] == [
        "2026-05-11T09:00:00.000000+00:00",
        "2026-05-11T10:00:00.000000+00:00",
    ]
    assert len(depart_tasks(tasks)) == 2


def test_m103_depart_now_departs_at_once_and_only_once(
    db: Database, imps: ImpStore, channels: ChannelStore
) -> None:
    talk(db, "pip", DM_CHANNEL, ANN, T0)
    tasks = TaskStore(db, FixedClock(T0 + timedelta(seconds=3)), imps)
    assert (
        depart_now(db, tasks, "pip", DM_CHANNEL, ANN, memory=False) is None
    )  # a memory-off imp never departs
    assert depart_now(db, tasks, "pip", DM_CHANNEL, BOB) is None  # Bob never talked here
    task_id = depart_now(db, tasks, "pip", DM_CHANNEL, ANN)  # 3 s after the last input: /quit does not wait
    assert task_id is not None
    assert depart_now(db, tasks, "pip", DM_CHANNEL, ANN) is None
    assert queue_due(db, tasks, T0 + timedelta(hours=1), {"pip"}) == []  # the scan finds it departed
    assert departure_rows(db) == [("pip", DM_CHANNEL, ANN, "2026-05-11T09:00:00.000000+00:00", task_id)]


def test_m103_a_stretch_departed_at_a_later_input_is_never_queued_again(
    db: Database, imps: ImpStore, channels: ChannelStore
) -> None:
    """A scan that read the conversation before /quit departed it (at a later last input) queues nothing: the
    check is made again inside the transaction that would write the departure."""
    talk(db, "pip", GUILD_CHANNEL, ANN, T0)
    stale_view = due_in(db, T0 + timedelta(hours=1), {"pip"})  # what a slow scanner read …
    talk(db, "pip", GUILD_CHANNEL, ANN, T0 + timedelta(minutes=5))
    tasks = TaskStore(db, FixedClock(T0 + timedelta(minutes=6)), imps)
    assert depart_now(db, tasks, "pip", GUILD_CHANNEL, ANN) is not None  # … before /quit departed it
    assert [queue(db, tasks, item) for item in stale_view] == [None]
    assert (
        queue(db, tasks, Due("pip", GUILD_CHANNEL, ANN, T0 + timedelta(minutes=5))) is None
    )  # the same stretch
    assert [row[3] for row in departure_rows(db)] == ["2026-05-11T09:05:00.000000+00:00"]
    assert len(depart_tasks(tasks)) == 1


def test_m103_a_departure_that_cannot_be_a_task_is_recorded_and_never_retried(
    db: Database, imps: ImpStore, channels: ChannelStore
) -> None:
    channels.upsert(ChannelInfo("task:other", surface="terminal", kind="terminal"))
    talk(db, "pip", "task:other", ANN, T0)  # another imp's task log: no task of pip may name it
    tasks = TaskStore(db, FixedClock(T0), imps)
    now = T0 + timedelta(hours=1)
    assert queue_due(db, tasks, now, {"pip"}) == [] and queue_due(db, tasks, now, {"pip"}) == []
    assert departure_rows(db) == [("pip", "task:other", ANN, "2026-05-11T09:00:00.000000+00:00", None)]
    assert depart_tasks(tasks) == []


def test_ready_tasks_can_be_limited_to_some_kinds(db: Database, imps: ImpStore) -> None:
    tasks = TaskStore(db, FixedClock(T0), imps)
    prompt = tasks.add(TaskRequest("pip", "Summarise the week"))
    depart = tasks.add(TaskRequest("pip", None, kind="depart", person=ANN))
    assert sorted(t.id for t in tasks.ready(10)) == sorted([prompt.id, depart.id])
    assert [t.id for t in tasks.ready(10, frozenset({"depart"}))] == [depart.id]
    assert tasks.has_ready(frozenset({"prompt"})) and not tasks.has_ready(frozenset({"reflect"}))


# ------------------------------------------------------------------ the supervisor runs it in a box


@dataclass
class Yard:
    db: Database
    clock: FixedClock
    gateway: Gateway
    imps: ImpStore

    def supervisor(self, backend: Any, settings: SupervisorSettings = FAST) -> Supervisor:
        return Supervisor(db=self.db, gateway=self.gateway, imps=self.imps, backend_for=lambda imp: backend,
                          clock=self.clock, settings=settings)  # fmt: skip

    @property
    def tasks(self) -> TaskStore:
        return TaskStore(self.db, self.clock, self.imps)


@asynccontextmanager
async def yard(db: Database, imps: ImpStore, clock: FixedClock) -> AsyncIterator[Yard]:
    gateway = build_gateway(
        policy=load_policy(), db=db, surface=RecordingSurface(), clock=clock,
        upstream=UpstreamConfig(base_url="http://127.0.0.1:9/v1", api_key="sk-unused"),
        memory=memory_service(db, clock.now),
    )  # fmt: skip
    try:
        yield Yard(db, clock, gateway, imps)
    finally:
        await gateway.aclose()


def seen_by_box(task: Task) -> dict[str, Any]:
    """What the stand-in engine saw when it departed (its summary)."""
    assert task.box_summary is not None and task.box_summary.startswith("departed "), task.box_summary
    seen: dict[str, Any] = json.loads(task.box_summary.removeprefix("departed "))
    return seen


async def test_m103_the_depart_task_runs_in_a_box_with_the_conversation_channels_scopes(
    db: Database, imps: ImpStore, clock: FixedClock, channels: ChannelStore
) -> None:
    talk(db, "pip", GUILD_CHANNEL, BOB, T0, name="Bob")  # Bob speaks in guild G: his DM reads guild:G too
    talk(db, "pip", DM_CHANNEL, BOB, T0 + timedelta(seconds=10), name="Bob")
    clock.set(T0 + timedelta(seconds=1900))
    async with yard(db, imps, clock) as y:
        supervisor = y.supervisor(departing_box())
        await supervisor.run(once=True)
        guild, dm = sorted(depart_tasks(y.tasks), key=lambda task: task.channel_id)  # 300…1, then 300…2
    assert (guild.channel_id, guild.state, dm.channel_id, dm.state) == (
        GUILD_CHANNEL,
        "done",
        DM_CHANNEL,
        "done",
    )
    assert seen_by_box(guild) == {
        "person": BOB,
        "now": "2026-05-11T09:31:40+00:00",
        "channel_id": GUILD_CHANNEL,
        "channel_kind": "guild",
        "channel_name": "general",
        "writes": f"guild:{GUILD}",
        "reads": [f"guild:{GUILD}"],
        "conversation": {"version": 1, "person": "Bob", "person_id": BOB, "last_input_at": "2026-05-11T09:00:00+00:00"},
    }  # fmt: skip
    seen = seen_by_box(dm)
    assert (seen["channel_kind"], seen["writes"], seen["reads"]) == (
        "dm",
        f"dm:{BOB}",
        [f"dm:{BOB}", f"guild:{GUILD}"],
    )
    assert (
        seen["conversation"]["last_input_at"] == "2026-05-11T09:00:10+00:00"
    )  # the DM's own, from its own scope


async def test_m103_a_restart_or_a_second_supervisor_queues_nothing_more(
    db: Database, imps: ImpStore, clock: FixedClock, channels: ChannelStore
) -> None:
    talk(db, "pip", GUILD_CHANNEL, ANN, T0)
    clock.set(T0 + timedelta(seconds=1801))
    async with yard(db, imps, clock) as y:
        await y.supervisor(departing_box()).run(once=True)
        [task] = depart_tasks(y.tasks)
        assert task.state == "done"
        clock.advance(hours=3)
        await y.supervisor(departing_box()).run(once=True)  # a restart: a new supervisor over the same file
        await y.supervisor(departing_box(), DEPARTURES).run(once=True)  # chat's departures loop
        assert [t.id for t in depart_tasks(y.tasks)] == [task.id]


async def test_m103_the_supervisor_looks_for_departures_every_30_s(
    db: Database, imps: ImpStore, clock: FixedClock, channels: ChannelStore
) -> None:
    talk(db, "pip", GUILD_CHANNEL, ANN, T0)
    clock.set(T0 + timedelta(seconds=1790))
    async with yard(db, imps, clock) as y:
        supervisor = y.supervisor(departing_box())
        async with anyio.create_task_group() as tg:
            await supervisor.tick(tg)  # scanned at 1790 s: nobody has left
            clock.advance(seconds=20)  # 1810 s: Ann has left, but the next scan is due at 1820 s
            await supervisor.tick(tg)
            assert depart_tasks(y.tasks) == []
            clock.advance(seconds=10)
            await supervisor.tick(tg)
            assert len(depart_tasks(y.tasks)) == 1
            tg.cancel_scope.cancel()


async def test_m103_memory_off_imps_never_get_a_departure(
    db: Database, imps: ImpStore, clock: FixedClock, channels: ChannelStore
) -> None:
    talk(db, "quiet", GUILD_CHANNEL, ANN, T0)
    clock.set(T0 + timedelta(hours=1))
    async with yard(db, imps, clock) as y:
        await y.supervisor(departing_box()).run(once=True)
        assert y.tasks.latest() == [] and departure_rows(db) == []


async def test_m103_a_real_box_with_memory_off_answers_done_with_nothing_to_reflect_on(
    db: Database, imps: ImpStore, clock: FixedClock, channels: ChannelStore
) -> None:
    async with yard(db, imps, clock) as y:
        task = y.tasks.add(TaskRequest("quiet", None, kind="depart", channel_id=GUILD_CHANNEL, person=ANN))
        await y.supervisor(InProcessBackend()).run(once=True)  # the real box program, in this process
        done = y.tasks.get(task.id)
    assert (done.state, done.box_outcome, done.box_summary) == (
        "done",
        "done",
        "memory is off: nothing to reflect on",
    )


async def test_m103_a_departure_that_fails_in_the_box_fails_the_task(
    db: Database, imps: ImpStore, clock: FixedClock, channels: ChannelStore
) -> None:
    talk(db, "pip", GUILD_CHANNEL, ANN, T0)
    clock.set(T0 + timedelta(hours=1))
    async with yard(db, imps, clock) as y:
        await y.supervisor(departing_box("fail")).run(once=True)
        [task] = depart_tasks(y.tasks)
    assert (task.state, task.box_outcome) == ("failed", "failed")
    assert task.box_summary == "departure failed: RuntimeError: the stand-in cannot think today"


async def test_a_departures_only_supervisor_runs_nothing_else_and_reclaims_only_stale_departures(
    db: Database, imps: ImpStore, clock: FixedClock, channels: ChannelStore
) -> None:
    async with yard(db, imps, clock) as y:
        tasks = y.tasks
        prompt = tasks.add(TaskRequest("pip", "Summarise the week"))
        depart = {"kind": "depart", "channel_id": GUILD_CHANNEL, "ceiling": "5m"}
        fresh = tasks.add(TaskRequest("pip", None, person=ANN, **depart))  # type: ignore[arg-type]
        stale = tasks.add(TaskRequest("pip", None, person=BOB, **depart))  # type: ignore[arg-type]
        other = tasks.add(TaskRequest("pip", "Old work"))
        for task, started in ((stale, T0 - timedelta(seconds=361)), (fresh, T0 - timedelta(seconds=359)),
                              (other, T0 - timedelta(days=1))):  # fmt: skip
            TaskStore(db, FixedClock(started), imps).claim(task.id, f"run-{task.id}", "process")
        supervisor = y.supervisor(departing_box(), DEPARTURES)
        reclaimed = await supervisor.reclaim()
        assert [t.id for t in reclaimed] == [stale.id]  # 300 s ceiling + 60 s: no supervisor can still run it
        assert [tasks.get(t.id).state for t in (fresh, other)] == ["running", "running"]  # maybe someone's
        await supervisor.run(once=True)
        assert tasks.get(stale.id).state == "done"  # requeued, then run
        assert tasks.get(prompt.id).state == "queued"  # left to `impyard supervise`


# ------------------------------------------------------------------ the box program answers `depart`


@dataclass
class Departs:
    """A memory engine that departs: remembers who left and when, answers a summary."""

    left: list[tuple[str, datetime]]

    async def begin(self, facts: Any) -> Any:
        raise AssertionError("no turn in a departure")

    async def search(self, query: str, limit: int) -> list[str]:
        return []

    async def record_event(self, channel_id: str, text: str) -> None:
        return None

    async def depart(self, *, person_id: str, now: datetime) -> str:
        self.left.append((person_id, now))
        return "thought it over; learned nothing"


def init_params(memory_on: bool) -> BoxInitParams:
    return BoxInitParams(
        protocol=1, imp=ImpSpec(name="pip", memory=MemorySettings(enabled=memory_on, embedder="hashing")),
        session=SessionInfo(id="task:t-1", channel_id="c1", channel_kind="dm"), now=T0,
    )  # fmt: skip


def depart_params(person: str | None) -> TaskRunParams:
    return TaskRunParams(
        task=TaskSpec(id="t-1", kind="depart", person=person), now=T0 + timedelta(minutes=31)
    )


async def test_m103_the_box_hands_the_person_who_left_to_its_memory_engine(tmp_path: Path) -> None:
    engine = Departs([])
    async with scripted.in_process_box(scripted.ScriptedHost(), tmp_path / "state", memory=engine) as box:
        await box.init(init_params(memory_on=True))
        result = await box.run_task(depart_params(ANN))
        nobody = await box.run_task(depart_params(None))
    assert (result.outcome, result.summary) == ("done", "thought it over; learned nothing")
    assert engine.left == [(ANN, datetime(2026, 5, 11, 9, 31, tzinfo=UTC))]  # no reply, no post: just this
    assert (nobody.outcome, nobody.summary) == ("failed", "a depart task names the person who left")
    journal = [json.loads(line) for line in (tmp_path / "state" / "journal.jsonl").read_text().splitlines()]
    assert [(j["kind"], j["outcome"]) for j in journal] == [("depart", "done"), ("depart", "failed")]


async def test_m103_a_box_without_memory_has_nothing_to_reflect_on(tmp_path: Path) -> None:
    host = scripted.ScriptedHost()
    async with scripted.in_process_box(host, tmp_path / "state") as box:
        await box.init(init_params(memory_on=False))
        result = await box.run_task(depart_params(ANN))
    assert (result.outcome, result.summary) == ("done", "memory is off: nothing to reflect on")
    assert [method for method, _ in host.calls] == []  # no model call, no memory request, no post


def test_the_departures_table_key_is_the_stretch_of_talk(db: Database) -> None:
    """The exactly-once rule rests on this key: a second row for the same stretch is refused by SQLite."""
    row = (
        "pip",
        GUILD_CHANNEL,
        ANN,
        "2026-05-11T09:00:00.000000+00:00",
        None,
        "2026-05-11T09:31:00.000000+00:00",
    )
    sql = "INSERT INTO memory_departures (imp, channel_id, person, last_input_at, task_id, queued_at) VALUES (?,?,?,?,?,?)"
    sqlfile.execute(db, sql, row)
    with pytest.raises(sqlite3.IntegrityError):
        sqlfile.execute(db, sql, row)
