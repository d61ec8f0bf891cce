"""Schedules: fire times, the missed-run policies, and the store that turns due fires into tasks (fixed clock)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from impyard.clock import FixedClock
from impyard.durations import DurationError, format_duration, parse_duration
from impyard.imps.store import ImpNotFound, ImpStore
from impyard.storage.db import Database
from impyard.storage.tables import channels, schedules, tasks
from impyard.tasks import TaskError, TaskStore
from impyard.tasks.schedules import ScheduleRequest, ScheduleStore
from impyard.tasks.triggers import (
    MAX_CATCH_UP,
    MAX_QUEUED_PER_SCHEDULE,
    ScheduleError,
    Trigger,
    due_runs,
    first_run,
    next_after,
    parse_cron,
    parse_every,
    parse_timezone,
    recent_fires,
)
from tests.racing import RACE_ROUNDS, race, reopen, two_racers

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)  # a Monday


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc,arg-type]


def every(interval: str, anchor: datetime = T0) -> Trigger:
    return Trigger(every=parse_every(interval), anchor=anchor)


def cron(expression: str, tz: str = "UTC") -> Trigger:
    return Trigger(cron=parse_cron(expression), tz=tz)


# --- parsing -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("10m", 600),
        ("1h30m", 5400),
        ("24h", 86_400),
        ("2d", 172_800),
        ("45", 45),
        ("1.5h", 5400),
        (" 2H ", 7200),
    ],
)
def test_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["", "soon", "10 minutes", "-5m", "1x", "h"])
def test_bad_durations_say_how_to_write_one(text: str) -> None:
    with pytest.raises(DurationError, match="write e.g. 90s, 10m"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"), [(86_400, "1d"), (5400, "1h30m"), (45, "45s"), (0, "0s"), (90_061, "1d1h1m1s")]
)
def test_durations_format_back(seconds: int, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["30s", "400d", "0"])
def test_every_is_bounded(text: str) -> None:
    with pytest.raises(ScheduleError, match="out of range"):
        parse_every(text)


@pytest.mark.parametrize(
    "expression",
    ["0 9 * *", "0 9 * * * *", "61 * * * *", "0 25 * * *", "* * * * mon-xyz", "every day", "", "@reboot"],
)
def test_a_cron_expression_that_does_not_parse_is_refused(expression: str) -> None:
    with pytest.raises(ScheduleError, match="does not parse"):
        parse_cron(expression)


@pytest.mark.parametrize(
    ("expression", "normal"),
    [("0  9 * * 1-5", "0 9 * * 1-5"), ("@DAILY", "@daily"), ("*/15 * * * *", "*/15 * * * *")],
)
def test_good_cron_expressions_are_normalised(expression: str, normal: str) -> None:
    assert parse_cron(expression) == normal


@pytest.mark.parametrize(
    "name", ["Mars/Olympus_Mons", "", "../../etc/passwd", "/etc/localtime", "Europe/" + "x" * 80]
)
def test_an_unknown_timezone_is_refused(name: str) -> None:
    with pytest.raises(ScheduleError, match="unknown timezone"):
        parse_timezone(name)


def test_a_cron_that_never_fires_is_refused_when_asked_for_its_next_run() -> None:
    with pytest.raises(ScheduleError, match="never fires"):
        next_after(cron("0 0 31 2 *"), T0)


# --- fire times --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("trigger", "after", "expected"),
    [
        (every("24h"), T0, T0 + timedelta(days=1)),  # strictly after
        (every("24h"), T0 - timedelta(hours=1), T0),  # before the anchor: the anchor
        (every("24h"), T0 + timedelta(days=3, minutes=1), T0 + timedelta(days=4)),  # on the anchor's grid
        (every("90m"), T0 + timedelta(minutes=89), T0 + timedelta(minutes=90)),
        (cron("0 9 * * 1-5"), utc(2026, 3, 2, 8, 59), utc(2026, 3, 2, 9, 0)),
        (cron("0 9 * * 1-5"), utc(2026, 3, 2, 9, 0), utc(2026, 3, 3, 9, 0)),  # strictly after
        (cron("0 9 * * 1-5"), utc(2026, 3, 6, 9, 30), utc(2026, 3, 9, 9, 0)),  # Friday → Monday
        (cron("0 9 * * *", "Europe/Oslo"), utc(2026, 1, 10, 12, 0), utc(2026, 1, 11, 8, 0)),  # CET = UTC+1
        (cron("0 9 * * *", "Europe/Oslo"), utc(2026, 7, 10, 12, 0), utc(2026, 7, 11, 7, 0)),  # CEST = UTC+2
        (cron("0 9 * * *", "America/New_York"), utc(2026, 1, 10, 15, 0), utc(2026, 1, 11, 14, 0)),
        # DST starts in Oslo on 2026-03-29: 02:30 does not exist that day; it fires right after the jump.
        (cron("30 2 * * *", "Europe/Oslo"), utc(2026, 3, 28, 12, 0), utc(2026, 3, 29, 1, 0)),
        # DST ends in Oslo on 2026-10-25: 02:30 happens twice; it fires once, at the first.
        (cron("30 2 * * *", "Europe/Oslo"), utc(2026, 10, 24, 12, 0), utc(2026, 10, 25, 0, 30)),
        (cron("30 2 * * *", "Europe/Oslo"), utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)),
        (cron("@daily"), utc(2026, 3, 2, 0, 0), utc(2026, 3, 3, 0, 0)),
    ],
)
def test_next_after(trigger: Trigger, after: datetime, expected: datetime) -> None:
    assert next_after(trigger, after) == expected


@pytest.mark.parametrize(
    ("trigger", "now_flag", "expected"),
    [
        (every("24h"), False, T0 + timedelta(days=1)),  # no immediate first fire
        (every("24h"), True, T0),
        (cron("0 9 * * 1-5"), False, utc(2026, 3, 2, 9, 0)),
        (cron("0 9 * * 1-5"), True, T0),  # --now fires at once even off the cron grid
    ],
)
def test_first_run(trigger: Trigger, now_flag: bool, expected: datetime) -> None:
    assert first_run(trigger, T0, now=now_flag) == expected


def test_recent_fires_is_bounded_however_long_the_downtime() -> None:
    times, complete = recent_fires(every("1m"), T0, T0 + timedelta(days=365), 5)
    assert not complete and times == [
        T0 + timedelta(days=365) - timedelta(minutes=k) for k in (4, 3, 2, 1, 0)
    ]
    times, complete = recent_fires(cron("* * * * *"), T0, T0 + timedelta(days=365), 3)
    assert not complete and times[-1] == T0 + timedelta(days=365) and len(times) == 3
    assert recent_fires(cron("0 9 * * *"), T0, T0 + timedelta(days=2), 10) == (
        [utc(2026, 3, 2, 9), utc(2026, 3, 3, 9)],
        True,
    )


# --- the missed-run policies -------------------------------------------------------------------------

DAILY = cron("0 9 * * *")
D = [utc(2026, 3, day, 9, 0) for day in range(2, 8)]  # 09:00 on Mar 2..7


@pytest.mark.parametrize(
    ("policy", "next_run", "now", "fire", "next_expected", "missed"),
    [
        # On time (the loop is a second late): every policy runs it, once.
        ("skip", D[0], D[0] + timedelta(seconds=1), [D[0]], D[1], 0),
        ("once", D[0], D[0] + timedelta(seconds=1), [D[0]], D[1], 0),
        ("all", D[0], D[0] + timedelta(seconds=1), [D[0]], D[1], 0),
        # Not yet due: nothing.
        ("once", D[1], D[0] + timedelta(hours=1), [], D[1], 0),
        # Down from Mar 2 08:00 to Mar 5 12:00: three fires missed (Mar 2, 3, 4) and Mar 5 09:00 is 3 h late.
        ("skip", D[0], utc(2026, 3, 5, 12), [], D[4], 4),
        ("once", D[0], utc(2026, 3, 5, 12), [D[3]], D[4], 3),
        ("all", D[0], utc(2026, 3, 5, 12), [D[0], D[1], D[2], D[3]], D[4], 0),
        # Back up 30 s after a fire: skip still runs the one that is due now, not the missed ones.
        ("skip", D[0], D[3] + timedelta(seconds=30), [D[3]], D[4], 3),
        ("once", D[0], D[3] + timedelta(seconds=30), [D[3]], D[4], 3),
    ],
)
def test_due_runs_apply_the_missed_run_policy(
    policy: str, next_run: datetime, now: datetime, fire: list[datetime], next_expected: datetime, missed: int
) -> None:
    runs = due_runs(DAILY, next_run, now, policy)  # type: ignore[arg-type]
    assert list(runs.fire) == fire
    assert runs.next_run == next_expected
    assert runs.missed == missed


def test_the_next_run_counts_from_the_schedule_not_from_when_a_run_finished() -> None:
    trigger = every("1h")
    # The 08:00 fire is handled at 08:00:00.4; its task finishing at 08:40 changes nothing: next is 09:00.
    runs = due_runs(trigger, T0, T0 + timedelta(milliseconds=400), "once")
    assert runs.fire == (T0,) and runs.next_run == T0 + timedelta(hours=1)


def test_all_is_bounded_after_a_very_long_downtime() -> None:
    runs = due_runs(every("1m"), T0, T0 + timedelta(days=30), "all")
    assert len(runs.fire) == MAX_CATCH_UP and runs.fire[-1] == T0 + timedelta(days=30)
    assert runs.missed > 0


# --- the store ----------------------------------------------------------------------------------------


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(T0)


@pytest.fixture
def db(any_engine_db: Database) -> Database:
    """The store's tests run on SQLite and on PostgreSQL (issue 21)."""
    return any_engine_db


@pytest.fixture
def store(db: Database, clock: FixedClock, impyard_home: Path) -> ScheduleStore:
    imps = ImpStore()
    imps.add("pip")
    return ScheduleStore(db, clock, TaskStore(db, clock, imps), imps)


def count(db: Database, table: sa.Table, *where: sa.ColumnElement[bool]) -> int:
    return db.read(
        lambda conn: conn.execute(sa.select(sa.func.count()).select_from(table).where(*where)).scalar_one()
    )


def counts(db: Database) -> tuple[int, int]:
    return count(db, schedules), count(db, tasks)


@pytest.mark.parametrize(
    ("request_", "error", "message"),
    [
        (ScheduleRequest("pip", "x", cron="0 9 * *"), ScheduleError, "does not parse"),
        (ScheduleRequest("pip", "x", cron="0 9 * * *", tz="Mars/Base"), ScheduleError, "unknown timezone"),
        (ScheduleRequest("pip", "x", every="24h", tz="Europe/Oslo"), ScheduleError, "--tz applies to --cron"),
        (ScheduleRequest("pip", "x"), ScheduleError, "exactly one of --every"),
        (ScheduleRequest("pip", "x", every="24h", cron="0 9 * * *"), ScheduleError, "exactly one of --every"),
        (ScheduleRequest("pip", "x", every="10s"), ScheduleError, "out of range"),
        (ScheduleRequest("pip", "x", every="24h", missed="sometimes"), ScheduleError, "missed-run policy"),
        (ScheduleRequest("pip", "x", every="24h", ceiling="0s"), TaskError, "out of range"),
        (ScheduleRequest("pip", "x", every="24h", ceiling="7h"), TaskError, "out of range"),
        (ScheduleRequest("pip", "y" * 8001, every="24h"), TaskError, "at most 8000"),
        (ScheduleRequest("nobody", "x", every="24h"), ImpNotFound, "no imp named 'nobody'"),
    ],
)
def test_bad_schedules_are_refused_and_nothing_is_written(
    store: ScheduleStore, db: Database, request_: ScheduleRequest, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        store.add(request_)
    assert counts(db) == (0, 0)


def test_a_schedule_fires_on_time_and_exactly_once_per_fire(
    store: ScheduleStore, clock: FixedClock, db: Database
) -> None:
    schedule = store.add(ScheduleRequest("pip", "daily summary", cron="0 9 * * *", channel_id="123"))
    assert schedule.next_run == utc(2026, 3, 2, 9)
    assert store.fire_due() == []  # 08:00: not yet
    clock.set(utc(2026, 3, 2, 9, 0, 0) + timedelta(milliseconds=300))
    [task] = store.fire_due()
    assert (task.imp, task.prompt, task.channel_id, task.origin, task.schedule_id) == (
        "pip",
        "daily summary",
        "123",
        "schedule",
        schedule.id,
    )
    assert task.scheduled_for == utc(2026, 3, 2, 9) and task.state == "queued"
    assert store.fire_due() == []  # the same fire is never queued twice
    assert store.get(schedule.id).next_run == utc(2026, 3, 3, 9) and store.get(schedule.id).fired == 1


def test_no_immediate_first_fire_unless_asked(store: ScheduleStore, clock: FixedClock) -> None:
    quiet = store.add(ScheduleRequest("pip", "later", every="1h"))
    eager = store.add(ScheduleRequest("pip", "now", every="1h", now=True))
    fired = store.fire_due()
    assert [task.prompt for task in fired] == ["now"]
    clock.advance(hours=1)
    assert sorted(task.prompt or "" for task in store.fire_due()) == ["later", "now"]
    assert store.get(quiet.id).next_run == store.get(eager.id).next_run == T0 + timedelta(hours=2)


@pytest.mark.parametrize(("policy", "queued"), [("skip", 0), ("once", 1), ("all", 3)])
def test_after_downtime_the_store_applies_the_policy(
    store: ScheduleStore, clock: FixedClock, db: Database, policy: str, queued: int
) -> None:
    store.add(ScheduleRequest("pip", "x", cron="0 9 * * *", missed=policy))
    clock.set(utc(2026, 3, 4, 12, 0))  # Mar 2, 3, 4 at 09:00 were missed
    assert len(store.fire_due()) == queued
    assert counts(db)[1] == queued


def test_pause_and_resume_do_not_make_up_for_the_pause(store: ScheduleStore, clock: FixedClock) -> None:
    schedule = store.add(ScheduleRequest("pip", "x", every="1h"))
    store.pause(schedule.id)
    clock.advance(hours=5, minutes=30)
    assert store.fire_due() == []
    resumed = store.resume(schedule.id)
    assert not resumed.paused and resumed.next_run == T0 + timedelta(hours=6)
    assert store.fire_due() == []


def test_remove_and_unknown_ids(store: ScheduleStore, db: Database) -> None:
    schedule = store.add(ScheduleRequest("pip", "x", every="1h"))
    store.remove(schedule.id)
    assert counts(db) == (0, 0)
    for action in (store.get, store.remove, store.pause, store.resume):
        with pytest.raises(ScheduleError, match="no schedule 's-nope'"):
            action("s-nope")


def test_a_schedule_that_cannot_keep_up_stops_growing_the_queue(
    store: ScheduleStore, clock: FixedClock
) -> None:
    store.add(ScheduleRequest("pip", "x", every="1m", missed="all"))
    clock.advance(minutes=30)
    assert len(store.fire_due()) == MAX_QUEUED_PER_SCHEDULE  # nothing runs them here; the backlog is capped
    clock.advance(minutes=1)
    assert store.fire_due() == []


def test_the_default_channel_is_the_imps_trusted_task_log(store: ScheduleStore, db: Database) -> None:
    schedule = store.add(ScheduleRequest("pip", "x", every="1h"))
    assert schedule.channel_id == "task:pip"
    query = sa.select(channels.c.kind, channels.c.surface).where(channels.c.channel_id == "task:pip")
    assert db.read(lambda conn: tuple(conn.execute(query).one())) == ("terminal", "terminal")


# --- two supervisors (two processes, as on two hosts) race for the same due fires (issue 21) -----------------


def fire_when_told(where: dict[str, Any], told: Any, results: Any, barrier: Any) -> None:
    """A worker process, a supervisor of its own: each time it is told, fire whatever is due, with the other."""
    db = reopen(where)
    clock = FixedClock(T0)
    store = ScheduleStore(db, clock, TaskStore(db, clock))
    try:
        while (schedule_id := told.get()) is not None:
            barrier.wait()  # both processes fire together
            results.put((schedule_id, [(task.schedule_id, task.id) for task in store.fire_due()]))
    finally:
        db.close()


@pytest.fixture
def supervisors(db: Database) -> Iterator[tuple[list[Any], Any]]:
    with two_racers(fire_when_told, db) as racing:
        yield racing


def test_a_due_fire_raced_by_two_supervisors_is_queued_once(
    store: ScheduleStore, db: Database, supervisors: tuple[list[Any], Any]
) -> None:
    inboxes, results = supervisors
    for _ in range(RACE_ROUNDS):
        schedule = store.add(ScheduleRequest("pip", "x", every="1h", now=True))  # due now, and only it
        answers = race(inboxes, results, schedule.id)
        queued = [task for _, fired in answers for task in fired]
        assert [schedule_id for schedule_id, _ in queued] == [schedule.id], answers  # one of them queued it
        assert count(db, tasks, tasks.c.schedule_id == schedule.id) == 1
        fired = store.get(schedule.id)
        assert fired.fired == 1 and fired.next_run == T0 + timedelta(hours=1)
