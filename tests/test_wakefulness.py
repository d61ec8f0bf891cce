"""The imp's day on the host (mechanisms 104-107; subtle point 18): the clock's rules, its state, and the
supervisor that ticks it, with a stand-in box (``tests/boxes/night_box.py``) over the real host store.

The rules are tables (``activity``, ``tick``); the supervisor tests run a whole simulated day on a fixed clock:
a message wakes the imp → the pending reflection runs → 10 minutes of silence → one reflection → 2 hours →
asleep → 10 minutes later → one sleep task per lived-in scope (its box folds and forgets there) and the host
forgets in the other scopes, exactly once, across restarts too. Expected values are written out.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import pytest
from click.testing import CliRunner
from sqlalchemy.engine import Connection

from box.protocol.models import Author, Message
from impyard.backends.process import ProcessBackend
from impyard.channels.store import ChannelInfo, ChannelStore
from impyard.cli import cli
from impyard.clock import FixedClock, iso
from impyard.conversation.history import History
from impyard.gateway.broker import UpstreamConfig
from impyard.gateway.core import Gateway
from impyard.gateway.policy import load_policy
from impyard.gateway.surfaces import RecordingSurface
from impyard.host import build_gateway
from impyard.imps.store import ImpStore
from impyard.memory.compact import compact, pays
from impyard.memory.scopes import SessionScopes
from impyard.memory.service import memory_service
from impyard.memory.store import MemoryStore
from impyard.memory.wakefulness import (
    ASLEEP,
    Activity,
    Wakefulness,
    activities,
    activity,
    load,
    save,
    step,
    tick,
)
from impyard.storage.db import Database
from impyard.supervisor import Supervisor, SupervisorSettings
from impyard.tasks import Task, TaskRequest, TaskStore
from testing.inprocess import InProcessBackend
from tests import sqlfile
from tests.memory.conftest import moment

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 5, 11, 9, 0, tzinfo=UTC)
GUILD = "200000000000000001"
GUILD_CHANNEL = "300000000000000001"  # #general of guild 200…1
DM_CHANNEL = "300000000000000002"  # a DM with Ann
ANN = "100000000000000001"
GUILD_SCOPE, DM_SCOPE = f"guild:{GUILD}", f"dm:{ANN}"
NIGHT_BOX = Path(__file__).parent / "boxes" / "night_box.py"
FAST = SupervisorSettings(tick_s=0.05, shutdown_grace_s=2.0)


def s(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# ------------------------------------------------------------------ the rules (subtle point 18)

AWAKE = Wakefulness(
    awake=True, woke_at=s(0), last_activity_at=s(0), last_channel="c1", consolidated=False, introspected_idle=True
)  # fmt: skip


@pytest.mark.parametrize(
    ("before", "at", "channel", "after"),
    [
        pytest.param(  # mechanism 104: waking from sleep asks for a reflection and opens the day's work
            replace(ASLEEP, slept_at=s(-9000), last_activity_at=s(-16000), last_channel="c0"), 0, "c1",
            Wakefulness(awake=True, woke_at=s(0), slept_at=s(-9000), last_activity_at=s(0), last_channel="c1",
                        wake_pending=True, introspected_idle=False, consolidated=False),
            id="m104-wakes-from-sleep",
        ),
        pytest.param(  # awake already: the silence ends; it does not wake again
            AWAKE, 300, "c2",
            Wakefulness(awake=True, woke_at=s(0), last_activity_at=s(300), last_channel="c2",
                        wake_pending=False, introspected_idle=False, consolidated=False),
            id="m104-awake-activity-ends-the-silence",
        ),
        pytest.param(  # asleep and not folded yet: it wakes, and waking starts a new day (woke_at = now)
            replace(AWAKE, awake=False, slept_at=s(7200), last_activity_at=s(0)), 7500, "c1",
            Wakefulness(awake=True, woke_at=s(7500), slept_at=s(7200), last_activity_at=s(7500), last_channel="c1",
                        wake_pending=True, introspected_idle=False, consolidated=False),
            id="m104-wakes-during-sleep",
        ),
        pytest.param(  # a new imp: asleep with nothing to fold
            ASLEEP, 10, "c1",
            Wakefulness(awake=True, woke_at=s(10), last_activity_at=s(10), last_channel="c1", wake_pending=True,
                        consolidated=False),
            id="m104-new-imp",
        ),
    ],
)  # fmt: skip
def test_m104_activity(before: Wakefulness, at: float, channel: str, after: Wakefulness) -> None:
    assert activity(before, s(at), channel) == after


@pytest.mark.parametrize(
    ("before", "at", "after", "actions"),
    [
        pytest.param(  # mechanism 104: the pending reflection first thing, whatever the silence
            replace(AWAKE, wake_pending=True, introspected_idle=False), 7300,
            replace(AWAKE, wake_pending=False, introspected_idle=True, last_reflection_at=s(7300)), ("reflect",),
            id="m104-pending-reflection",
        ),
        pytest.param(replace(AWAKE, introspected_idle=False), 599, replace(AWAKE, introspected_idle=False), (),
                     id="m105-599s-nothing"),
        pytest.param(
            replace(AWAKE, introspected_idle=False), 600,
            replace(AWAKE, introspected_idle=True, last_reflection_at=s(600)), ("reflect",),
            id="m105-600s-one-reflection",
        ),
        pytest.param(AWAKE, 900, AWAKE, (), id="m105-once-per-silence"),
        pytest.param(AWAKE, 7199, AWAKE, (), id="m106-7199s-still-awake"),
        pytest.param(
            AWAKE, 7200, replace(AWAKE, awake=False, slept_at=s(7200)), (), id="m106-asleep-reflected-already"
        ),
        pytest.param(
            replace(AWAKE, introspected_idle=False), 7200,
            replace(AWAKE, awake=False, slept_at=s(7200), introspected_idle=True, last_reflection_at=s(7200)),
            ("reflect",),
            id="m106-reflects-first-then-asleep",
        ),
        pytest.param(
            replace(AWAKE, awake=False, slept_at=s(7200)), 7799, replace(AWAKE, awake=False, slept_at=s(7200)), (),
            id="m107-599s-into-sleep-nothing",
        ),
        pytest.param(
            replace(AWAKE, awake=False, slept_at=s(7200)), 7800,
            replace(AWAKE, awake=False, slept_at=s(7200), consolidated=True, last_sleep_at=s(7800),
                    last_consolidation_at=s(7800)),
            ("sleep",),
            id="m107-600s-into-sleep-folds-and-forgets",
        ),
        pytest.param(
            replace(AWAKE, awake=False, slept_at=s(7200), consolidated=True), 90000,
            replace(AWAKE, awake=False, slept_at=s(7200), consolidated=True), (),
            id="m107-once-per-sleep",
        ),
        pytest.param(  # never woke (no woke_at): it forgets but has nothing to fold
            Wakefulness(slept_at=s(0), consolidated=False), 600,
            Wakefulness(slept_at=s(0), consolidated=True, last_sleep_at=s(600)), ("sleep",),
            id="m107-nothing-to-fold",
        ),
        pytest.param(ASLEEP, 90000, ASLEEP, (), id="a-new-imp-sleeps-on"),
    ],
)  # fmt: skip
def test_m105_m107_tick(before: Wakefulness, at: float, after: Wakefulness, actions: tuple[str, ...]) -> None:
    assert tick(before, s(at)) == (after, actions)


def test_m104_m107_a_day_ticked_every_30_s() -> None:
    """A new imp hears a message at 0 s and another at 120 s, then nothing: what every 30 s tick does."""
    state, done = ASLEEP, []
    for at in range(0, 4 * 3600, 30):
        for heard in (0, 120):
            if at == heard:
                state = activity(state, s(at), "c1")
        state, actions = tick(state, s(at + 1))
        done += [(at, action) for action in actions]
    assert done == [(0, "reflect"), (720, "reflect"), (7920, "sleep")]
    assert (state.awake, state.woke_at, state.slept_at, state.consolidated) == (False, s(0), s(7321), True)


# ------------------------------------------------------------------ the state and the activity in the database


def test_the_state_is_kept_per_imp_and_a_new_imp_is_asleep(db: Database) -> None:
    state = Wakefulness(
        awake=True, woke_at=s(0), slept_at=s(-50), last_activity_at=s(10), last_channel="c1", wake_pending=True,
        introspected_idle=False, consolidated=False, last_reflection_at=s(5), last_sleep_at=s(-40),
        last_consolidation_at=s(-40),
    )  # fmt: skip
    db.write(lambda conn: save(conn, "pip", state, s(10)))
    db.write(lambda conn: save(conn, "pip", state, s(11)))  # written again: one row
    assert read(db, load, "pip") == state
    assert read(db, load, "bee") == ASLEEP == Wakefulness(awake=False, consolidated=True)
    assert [tuple(r) for r in sqlfile.query(db, "SELECT imp, updated_at FROM memory_wakefulness")] == [
        ("pip", iso(s(11)))
    ]


P = ParamSpec("P")
T = TypeVar("T")


def read(db: Database, fn: Callable[Concatenate[Connection, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(conn, *args)`` in a read-only snapshot of ``db``."""
    return db.read(lambda conn: fn(conn, *args, **kwargs))


def say(db: Database, imp: str, channel: str, at: datetime, *, woke: bool = True) -> None:
    """Ann said something in ``channel`` at ``at`` that woke ``imp`` (unless ``woke`` is False)."""
    history = History(db, FixedClock(at))
    message = Message(id=f"m-{uuid.uuid4().hex[:12]}", author=Author(id=ANN, name="Ann"), content="hi",
                      created_at=at)  # fmt: skip
    history.record(channel, message)
    if woke:
        history.record_wake(imp, channel, message.id)


def finished_task(db: Database, imps: ImpStore, kind: str, channel: str, at: datetime) -> Task:
    """A task of ``kind`` of pip that finished (done) at ``at``."""
    tasks = TaskStore(db, FixedClock(at), imps)
    task = tasks.add(TaskRequest("pip", None, kind=kind, channel_id=channel, person=ANN))
    sqlfile.execute(db, "UPDATE tasks SET state = 'done', finished_at = ? WHERE id = ?", (iso(at), task.id))
    return tasks.get(task.id)


def test_m104_activity_is_a_message_that_woke_the_imp_or_a_departure(
    db: Database, imps: ImpStore, channels: ChannelStore
) -> None:
    say(db, "pip", GUILD_CHANNEL, s(0))
    say(db, "pip", GUILD_CHANNEL, s(100), woke=False)  # heard, but it did not wake pip: not pip's activity
    say(db, "bee", GUILD_CHANNEL, s(200))  # another imp's
    say(db, "pip", DM_CHANNEL, s(300))
    finished_task(db, imps, "reflect", GUILD_CHANNEL, s(400))  # the clock's own tasks are never activity
    finished_task(db, imps, "sleep", GUILD_CHANNEL, s(450))
    assert read(db, activities, "pip", None) == [Activity(s(0), GUILD_CHANNEL), Activity(s(300), DM_CHANNEL)]
    assert read(db, activities, "pip", s(0)) == [Activity(s(300), DM_CHANNEL)]
    assert read(db, activities, "pip", s(300)) == []
    finished_task(db, imps, "depart", DM_CHANNEL, s(2200))  # Ann left the DM: pip thought it over
    assert read(db, activities, "pip", s(300)) == [Activity(s(2200), DM_CHANNEL)]
    assert read(db, activities, "quiet", None) == []


def test_m104_a_step_takes_in_the_first_activity_as_the_waking(db: Database, imps: ImpStore) -> None:
    """Two messages between ticks: the imp woke at the first; its silence runs from the latest."""
    say(db, "pip", GUILD_CHANNEL, s(0))
    say(db, "pip", DM_CHANNEL, s(20))
    done = step(db, TaskStore(db, FixedClock(s(30)), imps), "pip", s(30))
    assert (done.state.woke_at, done.state.last_activity_at, done.state.last_channel) == (
        s(0),
        s(20),
        DM_CHANNEL,
    )
    assert done.actions == ("reflect",)


# ------------------------------------------------------------------ the supervisor's clock


@pytest.fixture
def imps() -> ImpStore:
    store = ImpStore()
    for name in ("pip", "bee"):
        store.add(name, box={"backend": "process"}, memory={"enabled": True, "embedder": "hashing"})
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


def remember(db: Database, imp: str, scope: str, at: datetime, text: str, intensity: float) -> str:
    """A lived record formed at ``at`` in ``scope``, written as a box's ``memory.encode`` writes it."""
    scoped = MemoryStore(db, FixedClock(at).now).scoped(imp, SessionScopes(scope, (scope,)), GUILD_CHANNEL)
    record_id, _ = scoped.encode(moment(text, intensity=intensity, valence=0.1))
    return record_id


def conclusions(db: Database, imp: str) -> list[tuple[str, str]]:
    rows = sqlfile.query(
        db, "SELECT scope, conclusion FROM memory_records WHERE imp = ? ORDER BY scope, conclusion", (imp,)
    )
    return [(r["scope"], r["conclusion"]) for r in rows]


def night_box(mode: str = "report") -> ProcessBackend:
    return ProcessBackend(command=[sys.executable, str(NIGHT_BOX), mode], warn=False)


@dataclass
class Yard:
    db: Database
    clock: FixedClock
    gateway: Gateway
    imps: ImpStore

    def supervisor(self, settings: SupervisorSettings = FAST) -> Supervisor:
        backend = night_box()
        return Supervisor(db=self.db, gateway=self.gateway, imps=self.imps, backend_for=lambda imp: backend,
                          clock=self.clock, settings=settings)  # fmt: skip

    @property
    def tasks(self) -> TaskStore:
        return TaskStore(self.db, self.clock, self.imps)

    def clock_tasks(self, imp: str = "pip") -> list[Task]:
        """The imp's reflect and sleep tasks, oldest first."""
        return [t for t in reversed(self.tasks.latest(imp=imp)) if t.kind in ("reflect", "sleep")]

    def day(self, imp: str = "pip") -> list[tuple[str, float, str]]:
        """(kind, seconds after T0 it was queued, state) of every reflect and sleep task of ``imp``."""
        return [(t.kind, (t.created_at - T0).total_seconds(), t.state) for t in self.clock_tasks(imp)]

    async def at(self, supervisor: Supervisor, seconds: float) -> None:
        """Move the clock to T0 + ``seconds`` and let the supervisor run what is due."""
        self.clock.set(s(seconds))
        await supervisor.run(once=True)


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


def seen(task: Task) -> dict[str, Any]:
    """What the stand-in box saw (its summary after ``reflected `` or ``slept ``)."""
    assert task.state == "done" and task.box_summary is not None, (task.state, task.outcome, task.box_summary)
    word, _, text = task.box_summary.partition(" ")
    assert word == {"reflect": "reflected", "sleep": "slept"}[task.kind]
    found: dict[str, Any] = json.loads(text)
    return found


async def test_m104_m107_a_whole_day_through_the_supervisor(
    db: Database, imps: ImpStore, clock: FixedClock, channels: ChannelStore
) -> None:
    say(db, "pip", GUILD_CHANNEL, s(0))
    remember(db, "pip", GUILD_SCOPE, s(0), "Ann brought a cake", 0.8)  # today, in the guild
    remember(db, "pip", GUILD_SCOPE, s(-30 * 86400), "the old picnic", 0.9)  # strong: kept at 30 days (0.6)
    remember(db, "pip", GUILD_SCOPE, s(-30 * 86400), "a faint chat", 0.3)  # faded below 0.6 at 30 days
    remember(db, "pip", DM_SCOPE, s(-30 * 86400), "a faint DM", 0.3)  # a scope pip did not live in today
    remember(db, "pip", DM_SCOPE, s(-30 * 86400), "a vivid DM", 0.95)
    async with yard(db, imps, clock) as y:
        supervisor = y.supervisor()
        await y.at(supervisor, 5)  # mechanism 104: woke at 0 s; the pending reflection runs first thing
        assert y.day() == [("reflect", 5, "done")]
        [woke] = y.clock_tasks()
        assert seen(woke) == {
            "kind": "reflect", "args": {}, "now": iso(s(5)).replace(".000000", ""), "channel_id": GUILD_CHANNEL,
            "channel_kind": "guild", "writes": GUILD_SCOPE, "reads": [GUILD_SCOPE],
        }  # fmt: skip
        say(db, "pip", GUILD_CHANNEL, s(60))  # Ann goes on: a new silence starts at 60 s
        await y.at(supervisor, 300)
        await y.at(supervisor, 630)  # (the memory clock ticks every 30 s)
        assert len(y.day()) == 1  # still within the silence window
        await y.at(supervisor, 660)  # mechanism 105: 600 s of silence, one reflection
        await y.at(supervisor, 1260)
        await y.at(supervisor, 7230)
        assert y.day() == [("reflect", 5, "done"), ("reflect", 660, "done")]  # once per silence
        await y.at(supervisor, 7260)  # mechanism 106: asleep; it reflected in this silence already
        await y.at(supervisor, 7830)
        assert len(y.day()) == 2 and not read(db, load, "pip").awake
        assert conclusions(db, "pip") == [
            (DM_SCOPE, "a faint DM"),
            (DM_SCOPE, "a vivid DM"),
            (GUILD_SCOPE, "Ann brought a cake"),
            (GUILD_SCOPE, "a faint chat"),
            (GUILD_SCOPE, "the old picnic"),
        ]  # fmt: skip  (nothing forgotten before the night)
        await y.at(supervisor, 7860)  # mechanism 107: 600 s into sleep, the night, in the lived-in scope
        await y.at(supervisor, 3 * 3600)
        await y.at(supervisor, 86400)
        assert y.day() == [("reflect", 5, "done"), ("reflect", 660, "done"), ("sleep", 7860, "done")]
        night = y.clock_tasks()[-1]
        assert (night.scope, night.channel_id, night.args) == (
            GUILD_SCOPE,
            "task:pip",
            {"since": iso(s(0)), "consolidate": True},
        )
        assert seen(night) == {
            "kind": "sleep",
            "args": {"since": iso(s(0)), "consolidate": True},
            "now": iso(s(7860)).replace(".000000", ""),
            "channel_id": "task:pip",
            "channel_kind": "task",
            "writes": GUILD_SCOPE,
            "reads": [GUILD_SCOPE],
            "night": ["Ann brought a cake"],
            "forgot": 1,
        }  # fmt: skip  (its box works in the guild alone: the DM is none of its business)
    assert conclusions(db, "pip") == [
        (DM_SCOPE, "a vivid DM"),
        (GUILD_SCOPE, "Ann brought a cake"),
        (GUILD_SCOPE, "the old picnic"),
    ]  # fmt: skip  (the box forgot in the guild, the host in the DM scope)
    state = read(db, load, "pip")
    assert state == Wakefulness(
        awake=False, woke_at=s(0), slept_at=s(7260), last_activity_at=s(60), last_channel=GUILD_CHANNEL,
        wake_pending=False, introspected_idle=True, consolidated=True, last_reflection_at=s(660),
        last_sleep_at=s(7860), last_consolidation_at=s(7860),
    )  # fmt: skip


async def test_m106_a_long_silence_seen_late_reflects_before_sleep(
    db: Database, imps: ImpStore, clock: FixedClock, channels: ChannelStore
) -> None:
    say(db, "pip", DM_CHANNEL, s(0))
    remember(db, "pip", DM_SCOPE, s(0), "a quiet word", 0.8)
    async with yard(db, imps, clock) as y:
        supervisor = y.supervisor()
        await y.at(supervisor, 1)
        say(db, "pip", DM_CHANNEL, s(60))
        await y.at(supervisor, 60 + 7205)  # no tick saw the 600 s mark: it reflects, then falls asleep
        assert y.day() == [("reflect", 1, "done"), ("reflect", 7265, "done")]
        assert seen(y.clock_tasks()[-1])["channel_kind"] == "dm"  # in the channel of the latest activity
        assert read(db, load, "pip").slept_at == s(7265)
        await y.at(supervisor, 7265 + 600)
        assert y.day()[2:] == [("sleep", 7865, "done")]


async def test_m104_activity_during_sleep_wakes_the_imp_and_its_night_waits_for_the_next_sleep(
    db: Database, imps: ImpStore, clock: FixedClock, channels: ChannelStore
) -> None:
    say(db, "pip", GUILD_CHANNEL, s(0))
    remember(db, "pip", GUILD_SCOPE, s(0), "morning talk", 0.8)
    async with yard(db, imps, clock) as y:
        supervisor = y.supervisor()
        for at in (1, 7200):  # woke (and reflected) at once, asleep 2 h later
            await y.at(supervisor, at)
        say(db, "pip", GUILD_CHANNEL, s(7500))  # 300 s into sleep, before the night's work
        remember(db, "pip", GUILD_SCOPE, s(7500), "evening talk", 0.8)
        await y.at(supervisor, 7510)  # woken: the pending reflection
        await y.at(supervisor, 7800)  # awake: no night now
        assert y.day() == [("reflect", 1, "done"), ("reflect", 7510, "done")]
        state = read(db, load, "pip")
        assert (state.awake, state.woke_at, state.consolidated) == (True, s(7500), False)
        for at in (7500 + 7200, 7500 + 7200 + 600):
            await y.at(supervisor, at)
        assert y.day()[2:] == [("sleep", 15300, "done")]
        assert seen(y.clock_tasks()[-1])["night"] == ["evening talk"]  # since the second waking


async def test_m104_m107_two_imps_are_ticked_independently(
    db: Database, imps: ImpStore, clock: FixedClock, channels: ChannelStore
) -> None:
    say(db, "pip", GUILD_CHANNEL, s(0))
    remember(db, "pip", GUILD_SCOPE, s(0), "pip's day", 0.8)
    async with yard(db, imps, clock) as y:
        supervisor = y.supervisor()
        await y.at(supervisor, 1)
        say(db, "pip", GUILD_CHANNEL, s(60))
        await y.at(supervisor, 660)
        say(db, "bee", DM_CHANNEL, s(3600))  # an hour later, bee hears from Ann
        remember(db, "bee", DM_SCOPE, s(3600), "bee's day", 0.8)
        await y.at(supervisor, 3601)
        say(db, "bee", DM_CHANNEL, s(3660))
        for at in (4260, 7260, 7860):
            await y.at(supervisor, at)
        assert y.day("pip") == [("reflect", 1, "done"), ("reflect", 660, "done"), ("sleep", 7860, "done")]
        assert y.day("bee") == [("reflect", 3601, "done"), ("reflect", 4260, "done")]  # bee is still awake
        assert read(db, load, "bee").awake
        for at in (3660 + 7200, 3660 + 7800):
            await y.at(supervisor, at)
        assert y.day("bee")[2:] == [("sleep", 11460, "done")]
        assert seen(y.clock_tasks("bee")[-1])["writes"] == DM_SCOPE
        assert len(y.day("pip")) == 3  # pip's sleep was not run again
        assert y.day("quiet") == [] and read(db, load, "quiet") == ASLEEP  # memory off: no clock


async def test_m107_a_crash_mid_sleep_never_runs_the_night_twice(
    db: Database, imps: ImpStore, clock: FixedClock, channels: ChannelStore
) -> None:
    say(db, "pip", GUILD_CHANNEL, s(0))
    remember(db, "pip", GUILD_SCOPE, s(0), "today", 0.8)
    async with yard(db, imps, clock) as y:
        supervisor = y.supervisor()
        for at in (1, 7200):
            await y.at(supervisor, at)
        clock.set(s(7800))
        done = step(db, y.tasks, "pip", s(7800))  # the tick queued the night (state and task: one commit) ...
        [night_id] = done.queued
        assert (
            y.tasks.claim(night_id, "run-crashed", "process") is not None
        )  # ... its box started, then: crash
        restarted = y.supervisor()  # a new supervisor over the same file
        await y.at(restarted, 7830)  # reclaims the night and runs it; queues nothing new
        await y.at(y.supervisor(), 9000)  # and another restart, later
        assert y.day() == [("reflect", 1, "done"), ("sleep", 7800, "done")]
        night = y.tasks.get(night_id)
        assert [run.result for run in y.tasks.runs(night_id)] == ["reclaimed", "done"]
        assert seen(night)["night"] == ["today"]


async def test_m107_a_night_already_waiting_is_not_queued_again(
    db: Database, imps: ImpStore, clock: FixedClock, channels: ChannelStore
) -> None:
    """An imp over budget has its tasks deferred; the next silence or night finds them waiting and adds none."""
    say(db, "pip", GUILD_CHANNEL, s(0))
    remember(db, "pip", GUILD_SCOPE, s(0), "today", 0.8)
    remember(db, "pip", DM_SCOPE, s(0), "today too", 0.8)
    tasks = TaskStore(db, clock, imps)
    first = step(db, tasks, "pip", s(1))
    assert first.actions == ("reflect",) and len(first.queued) == 1
    say(db, "pip", GUILD_CHANNEL, s(60))
    again = step(db, tasks, "pip", s(660))  # the silence reflection: the first one has not run yet
    assert (again.actions, again.queued) == (("reflect",), ())
    sqlfile.execute(db, "UPDATE tasks SET state = 'done' WHERE kind = 'reflect'")
    step(db, tasks, "pip", s(7260))
    night = step(db, tasks, "pip", s(7860))
    assert len(night.queued) == 2 and night.forget == ()
    assert sorted(t.scope or "" for t in tasks.latest(imp="pip") if t.kind == "sleep") == [
        DM_SCOPE,
        GUILD_SCOPE,
    ]
    say(db, "pip", GUILD_CHANNEL, s(8000))  # a new day; its night comes while the last one's tasks still wait
    remember(db, "pip", GUILD_SCOPE, s(8000), "tomorrow", 0.8)
    remember(db, "pip", DM_SCOPE, s(8000), "tomorrow too", 0.8)
    for at in (8001, 8000 + 7200):
        step(db, tasks, "pip", s(at))
    later = step(db, tasks, "pip", s(8000 + 7800))
    assert (later.actions, later.queued, later.forget) == (
        ("sleep",),
        (),
        (),
    )  # each scope's night is waiting


def test_m107_a_night_queues_at_most_20_sleep_tasks_and_the_host_forgets_in_the_rest(
    db: Database, imps: ImpStore
) -> None:
    say(db, "pip", GUILD_CHANNEL, s(0))
    for n in range(22):
        remember(db, "pip", f"dm:{n:03d}", s(n), f"talk {n}", 0.8)  # dm:021 is the newest
    remember(db, "pip", "terminal", s(-86400), "yesterday", 0.8)
    tasks = TaskStore(db, FixedClock(s(0)), imps)
    for at in (30, 7200):
        step(db, tasks, "pip", s(at))
    night = step(db, tasks, "pip", s(7800))
    queued = sorted((tasks.get(task_id).scope or "" for task_id in night.queued), reverse=True)
    assert queued == [f"dm:{n:03d}" for n in range(21, 1, -1)]
    assert sorted(night.forget) == ["dm:000", "dm:001", "terminal"]


# ------------------------------------------------------------------ settings, the CLI, compaction


@pytest.mark.parametrize(
    ("tick_s", "ok"), [(0.5, False), (1.0, True), (30.0, True), (600.0, True), (601.0, False)]
)
def test_the_memory_tick_is_1_to_600_s(tick_s: float, ok: bool) -> None:
    if ok:
        assert SupervisorSettings(memory_tick_s=tick_s).memory_tick_s == tick_s
    else:
        with pytest.raises(ValueError, match="memory_tick_s"):
            SupervisorSettings(memory_tick_s=tick_s)


async def test_the_memory_clock_ticks_every_memory_tick_s(
    db: Database, imps: ImpStore, clock: FixedClock, channels: ChannelStore
) -> None:
    async with yard(db, imps, clock) as y:
        supervisor = y.supervisor(replace(FAST, memory_tick_s=60.0))
        await y.at(supervisor, 0)  # ticked at 0 s: nothing has happened
        say(db, "pip", GUILD_CHANNEL, s(10))
        await y.at(supervisor, 59)  # the next tick is due at 60 s
        assert y.day() == []
        await y.at(supervisor, 60)
        assert y.day() == [("reflect", 60, "done")]


async def test_a_kinds_limited_supervisor_runs_no_memory_clock(
    db: Database, imps: ImpStore, clock: FixedClock, channels: ChannelStore
) -> None:
    say(db, "pip", GUILD_CHANNEL, s(0))
    async with yard(db, imps, clock) as y:
        await y.at(y.supervisor(replace(FAST, kinds=frozenset({"depart"}))), 5)  # chat's departures loop
        assert y.day() == [] and read(db, load, "pip") == ASLEEP


def test_supervise_takes_memory_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    got: list[tuple[Any, ...]] = []

    async def fake(*args: Any, **metrics: Any) -> None:  # and where its metrics listen (none asked here)
        got.append(args)
        assert metrics == {"metrics_host": "127.0.0.1", "metrics_port": None}

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setattr("impyard.cli.supervise.supervise", fake)
    assert CliRunner().invoke(cli, ["supervise", "--once", "--memory-tick", "5"]).exit_code == 0
    assert got == [(3, True, None, 5.0)]
    bad = CliRunner().invoke(cli, ["supervise", "--memory-tick", "0.1"])
    assert bad.exit_code == 2 and "--memory-tick" in bad.output


@pytest.mark.parametrize(
    ("free", "pages", "expected"),
    [(0, 0, False), (0, 100, False), (25, 100, False), (26, 100, True), (90, 100, True)],
)
def test_compacting_pays_over_a_quarter_of_free_pages(free: int, pages: int, expected: bool) -> None:
    assert pays(free, pages) is expected


def test_the_database_shrinks_after_forgetting_when_it_pays(db: Database) -> None:
    for n in range(400):
        remember(db, "pip", GUILD_SCOPE, s(n), f"moment {n} " + "words " * 50, 0.8)
    sqlfile.execute(db, "PRAGMA wal_checkpoint(TRUNCATE)")
    size = db.path.stat().st_size
    assert compact(db) is False  # nothing free: no VACUUM
    sqlfile.execute(db, "DELETE FROM memory_records WHERE imp = 'pip'")
    assert compact(db) is True
    assert db.path.stat().st_size < size / 2
    assert compact(db) is False


async def test_m104_m113_a_day_and_a_night_in_real_boxes(
    db: Database, imps: ImpStore, clock: FixedClock, channels: ChannelStore
) -> None:
    """Issue 15, done when: an imp left alone for a simulated night has slept, consolidated and forgotten through
    the supervisor — here with the real box program (``python -m box`` in process boxes), the real store and the
    fake OpenAI for the night's plan. Its reflections find no readable thought in the fake's default answer and
    end quietly; the night folds the day's two records and forgets the faded one."""
    from testing.fake_openai import FakeOpenAI

    say(db, "pip", GUILD_CHANNEL, s(0))
    remember(db, "pip", GUILD_SCOPE, s(60), "Ann brought a cake", 0.6)  # the night's plan: 1, the anchor
    remember(db, "pip", GUILD_SCOPE, s(120), "the cake had cherries", 0.3)  # 2, absorbed
    remember(db, "pip", GUILD_SCOPE, s(-30 * 86400), "a faint chat", 0.3)  # faded below 0.6 at 30 days
    with FakeOpenAI() as fake:
        fake.script({"groups": [{"anchor": 1, "absorbed": [2], "summary_fact": "a cake"}]}, purpose="sleep")
        gateway = build_gateway(
            policy=load_policy(), db=db, surface=RecordingSurface(), clock=clock,
            upstream=UpstreamConfig(base_url=fake.base_url, api_key=fake.api_key),
            memory=memory_service(db, clock.now),
        )  # fmt: skip
        try:
            real_box = InProcessBackend()
            supervisor = Supervisor(
                db=db,
                gateway=gateway,
                imps=imps,
                backend_for=lambda imp: real_box,
                clock=clock,
                settings=FAST,
            )
            y = Yard(db, clock, gateway, imps)
            for at in (5, 660, 7260, 7860, 86400):  # woke; silence; asleep at 7200 s; 600 s into sleep
                await y.at(supervisor, at)
        finally:
            await gateway.aclose()
        assert [r.purpose for r in fake.requests if r.purpose == "sleep"] == ["sleep"]  # one plan, one scope
    assert [(kind, state) for kind, _, state in y.day()] == [
        ("reflect", "done"),
        ("sleep", "done"),
    ]  # fmt: skip  (waking's reflection is this silence's: one message, one reflection)
    night = y.clock_tasks()[-1]
    assert night.box_summary == "folded 1 record into 1; forgot 1 record", night.box_summary
    rows = sqlfile.query(
        db,
        "SELECT conclusion, intensity, (SELECT COUNT(*) FROM memory_episodes e WHERE e.record_id = r.id) AS n"
        " FROM memory_records r WHERE imp = 'pip'",
    )
    assert [(r["conclusion"], round(r["intensity"], 4), r["n"]) for r in rows] == [
        ("Ann brought a cake", round(1 - 0.4 * 0.7, 4), 2),
    ]  # folded (109, 110), and the faded chat forgotten (112)
    assert not read(db, load, "pip").awake
