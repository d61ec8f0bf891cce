"""Schedules: recurring tasks for ``impyard supervise`` (issue 8).

A schedule fires ``every`` a fixed interval (counted from its anchor) or on a
``cron`` expression in a timezone (croniter, zoneinfo). Rules are pure
functions of plain values, so their tests are tables on a fixed clock:

* ``first_run``: no immediate first fire unless asked (``--now``).
* ``next_after``: the next fire time is computed from the *scheduled* time,
  never from when the last run finished, so a slow run does not drift the
  schedule.
* ``due_runs``: after downtime, the missed-run policy decides what still runs:
  ``skip`` (only a run that is due right now), ``once`` (one run for the lot;
  the default) or ``all`` (every missed run, bounded).

``ScheduleStore`` keeps schedules in the host database (SQLite or PostgreSQL,
docs/storage.md) and turns due fires into queued tasks: the tasks and the
schedule's new ``next_run`` are written in one transaction, whose conditional
UPDATE of ``next_run`` claims the fire, and a (schedule, scheduled time) pair is
unique, so a fire is enqueued exactly once, however many supervisors (hosts)
share the database (issue 21).
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter
from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.engine import Connection

from impyard.clock import Clock, iso, parse_iso
from impyard.durations import DurationError, format_duration, parse_duration
from impyard.errors import ImpyardError
from impyard.imps.store import ImpStore
from impyard.storage.db import Database, Store
from impyard.storage.portable import bytewise
from impyard.storage.rows import OfRow, Row, RowMapper
from impyard.storage.tables import schedules
from impyard.storage.tables import tasks as tasks_table
from impyard.tasks import Task, TaskRequest, TaskStore, ValidTask, log_transition, validate_request
from impyard.tasks.sql import ensure_task_channel, insert_task, tasks_by_id

log = logging.getLogger("impyard.schedules")

MissedPolicy = Literal["skip", "once", "all"]
MISSED_POLICIES: tuple[MissedPolicy, ...] = ("skip", "once", "all")
DEFAULT_MISSED: MissedPolicy = "once"
MIN_EVERY = timedelta(minutes=1)
MAX_EVERY = timedelta(days=366)
ON_TIME = timedelta(
    seconds=60
)  # a fire this late still counts as "now", not as missed (the loop ticks every second)
MAX_CATCH_UP = 100  # ``all`` runs at most this many missed fires; the older ones are dropped (and logged)
MAX_QUEUED_PER_SCHEDULE = 10  # a schedule whose tasks cannot keep up stops piling more onto the queue

_CRON_ALIASES = frozenset({"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"})


class ScheduleError(ImpyardError, ValueError):
    """A schedule that cannot be accepted (or found); the message is one line that says what to do."""


# ------------------------------------------------------------------ parsing (pure)


def parse_every(text: str) -> timedelta:
    try:
        every = parse_duration(text, what="--every")
    except DurationError as exc:
        raise ScheduleError(str(exc)) from None
    if not MIN_EVERY <= every <= MAX_EVERY:
        raise ScheduleError(
            f"--every {text!r} is out of range: a schedule fires at most every {format_duration(MIN_EVERY)} "
            f"and at least every {format_duration(MAX_EVERY)}"
        )
    return every


def parse_timezone(name: str) -> ZoneInfo:
    """An IANA timezone; an unknown one is refused (never silently UTC)."""
    text = str(name).strip()
    if not text or len(text) > 64 or text.startswith(("/", ".")) or ".." in text:
        raise ScheduleError(
            f"unknown timezone {name!r}: use an IANA name such as Europe/Oslo, America/New_York or UTC"
        )
    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError(
            f"unknown timezone {name!r}: use an IANA name such as Europe/Oslo, America/New_York or UTC"
        ) from None


def parse_cron(expression: str) -> str:
    """Five fields (minute hour day-of-month month day-of-week) or an alias like ``@daily``."""
    text = " ".join(str(expression).split())
    fields = text.split(" ")
    if text.lower() in _CRON_ALIASES:
        return text.lower()
    if len(fields) != 5:
        raise ScheduleError(
            f"cron expression {expression!r} does not parse: it needs 5 fields (minute hour day month weekday), "
            'e.g. "0 9 * * 1-5" for 09:00 on weekdays'
        )
    try:
        croniter(text, datetime(2000, 1, 1, tzinfo=UTC))
    except (CroniterBadCronError, CroniterError, ValueError, KeyError) as exc:
        raise ScheduleError(
            f"cron expression {expression!r} does not parse ({str(exc)[:120]}): "
            'write 5 fields, e.g. "0 9 * * 1-5" for 09:00 on weekdays'
        ) from None
    return text


def parse_missed(value: str) -> MissedPolicy:
    text = str(value).strip().lower()
    if text not in MISSED_POLICIES:
        raise ScheduleError(f"unknown missed-run policy {value!r}: use skip, once (the default) or all")
    return text


# ------------------------------------------------------------------ the trigger and its rules (pure)


@dataclass(frozen=True)
class Trigger:
    """When a schedule fires: ``every`` (from ``anchor``) xor ``cron`` (in ``tz``)."""

    every: timedelta | None = None
    cron: str | None = None
    tz: str = "UTC"
    anchor: datetime | None = None  # every: fire times are anchor + k * every

    def __post_init__(self) -> None:
        if (self.every is None) == (self.cron is None):
            raise ScheduleError("a schedule needs exactly one of --every and --cron")
        if self.every is not None and self.anchor is None:
            raise ScheduleError("an every-schedule needs an anchor time")

    def describe(self) -> str:
        if self.every is not None:
            return f"every {format_duration(self.every)}"
        return f"cron {self.cron}" + ("" if self.tz == "UTC" else f" ({self.tz})")


def _is_second_occurrence(local: datetime, zone: ZoneInfo) -> bool:
    """True for the repeat of a wall-clock time when DST ends (the hour that happens twice)."""
    naive = local.replace(tzinfo=None)
    first = naive.replace(tzinfo=zone, fold=0).astimezone(UTC)
    return first != local.astimezone(UTC)


def next_after(trigger: Trigger, after: datetime) -> datetime:
    """The first fire time strictly after ``after`` (UTC in, UTC out).

    cron: in the trigger's timezone; a wall time skipped when DST starts fires at
    the first moment after the jump, and one that happens twice when DST ends
    fires once, at its first occurrence.
    """
    after = after.astimezone(UTC)
    if trigger.every is not None:
        assert trigger.anchor is not None
        anchor = trigger.anchor.astimezone(UTC)
        if after < anchor:
            return anchor
        periods = int((after - anchor) / trigger.every) + 1
        return anchor + periods * trigger.every
    assert trigger.cron is not None
    zone = parse_timezone(trigger.tz)
    iterator = croniter(trigger.cron, after.astimezone(zone))
    for _ in range(4):  # at most one repeat to skip; the bound is only a guard
        try:
            candidate: datetime = iterator.get_next(datetime)
        except CroniterBadDateError:
            raise ScheduleError(
                f"cron expression {trigger.cron!r} never fires (e.g. a day that does not exist)"
            ) from None
        if not _is_second_occurrence(candidate, zone):
            return candidate.astimezone(UTC)
    raise ScheduleError(
        f"cron expression {trigger.cron!r}: no next fire time could be found"
    )  # pragma: no cover


def first_run(trigger: Trigger, created: datetime, *, now: bool = False) -> datetime:
    """When a new schedule first fires: at ``created`` only if asked, else its first fire time after it."""
    return created.astimezone(UTC) if now else next_after(trigger, created)


def recent_fires(
    trigger: Trigger, after: datetime, until: datetime, limit: int
) -> tuple[list[datetime], bool]:
    """The newest ``limit`` fire times in (after, until], oldest first, and whether that is all of them.

    Bounded work however long the downtime: arithmetic for ``every``, a walk
    backwards from ``until`` for cron.
    """
    after, until = after.astimezone(UTC), until.astimezone(UTC)
    if until <= after or limit <= 0:
        return [], until <= after
    if trigger.every is not None:
        assert trigger.anchor is not None
        anchor = trigger.anchor.astimezone(UTC)
        if until < anchor:
            return [], True
        last = (until - anchor) // trigger.every
        first = 0 if after < anchor else (after - anchor) // trigger.every + 1
        if first > last:
            return [], True
        start = max(first, last - limit + 1)
        return [anchor + k * trigger.every for k in range(start, last + 1)], start == first
    assert trigger.cron is not None
    zone = parse_timezone(trigger.tz)
    iterator = croniter(trigger.cron, (until + timedelta(seconds=1)).astimezone(zone))
    newest_first: list[datetime] = []
    while len(newest_first) <= limit:
        try:
            candidate: datetime = iterator.get_prev(datetime)
        except CroniterBadDateError:
            return list(reversed(newest_first)), True
        if _is_second_occurrence(candidate, zone):
            continue
        when = candidate.astimezone(UTC)
        if when > until:
            continue
        if when <= after:
            return list(reversed(newest_first)), True
        newest_first.append(when)
    return list(reversed(newest_first[:limit])), False


@dataclass(frozen=True)
class DueRuns:
    """What a due schedule does now: enqueue a task per ``fire`` time, then wait for ``next_run``."""

    fire: tuple[datetime, ...]
    next_run: datetime
    missed: (
        int  # fire times that passed without a run (dropped by the policy); a lower bound after long downtime
    )


def due_runs(
    trigger: Trigger, next_run: datetime, now: datetime, policy: MissedPolicy, *, on_time: timedelta = ON_TIME
) -> DueRuns:
    """Apply the missed-run policy to the fire times from ``next_run`` up to ``now``.

    A fire time at most ``on_time`` old is due now and runs under every policy;
    older ones were missed (downtime): ``skip`` drops them, ``once`` runs one
    (attributed to the latest) for the lot, ``all`` runs each (the newest
    MAX_CATCH_UP). The next run is the first fire time after ``now``: counted
    from the schedule, never from when a run finished.
    """
    next_run, now = next_run.astimezone(UTC), now.astimezone(UTC)
    if next_run > now:
        return DueRuns((), next_run, 0)
    later, complete = recent_fires(trigger, next_run, now, MAX_CATCH_UP)
    times = (
        [next_run] if complete else []
    ) + later  # next_run is a fire time by definition (or the --now fire)
    total = len(times) if complete else len(times) + 1
    times = times[-MAX_CATCH_UP:]
    if policy == "skip":
        fire = [when for when in times if now - when <= on_time][-1:]
    elif policy == "once":
        fire = times[-1:]
    else:
        fire = times
    return DueRuns(tuple(fire), next_after(trigger, now), total - len(fire))


# ------------------------------------------------------------------ the store


@dataclass(frozen=True)
class ScheduleRequest:
    """What ``impyard schedule add`` asks for (validated by ``ScheduleStore.add``)."""

    imp: str
    prompt: str | None
    every: str | None = None
    cron: str | None = None
    tz: str | None = None
    missed: str = DEFAULT_MISSED
    now: bool = False
    channel_id: str | None = None
    ceiling: str | float | None = None
    kind: str = "prompt"
    wake_on_resolve: bool = False
    briefing: bool = False


@dataclass(frozen=True)
class Schedule:
    id: str
    imp: str
    kind: str
    prompt: str | None
    channel_id: str
    ceiling_s: float
    wake_on_resolve: bool
    briefing: bool
    trigger: Trigger
    missed: MissedPolicy
    next_run: datetime
    paused: bool
    last_fired: datetime | None
    fired: int
    created_at: datetime

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "imp": self.imp,
            "kind": self.kind,
            "prompt": self.prompt,
            "channel_id": self.channel_id,
            "ceiling_s": self.ceiling_s,
            "wake_on_resolve": self.wake_on_resolve,
            "briefing": self.briefing,
            "every_s": self.trigger.every.total_seconds() if self.trigger.every else None,
            "cron": self.trigger.cron,
            "tz": self.trigger.tz,
            "trigger": self.trigger.describe(),
            "missed": self.missed,
            "next_run": iso(self.next_run),
            "paused": self.paused,
            "last_fired": iso(self.last_fired) if self.last_fired else None,
            "fired": self.fired,
            "created_at": iso(self.created_at),
        }


def _trigger(row: Row) -> Trigger:
    every = timedelta(seconds=row["every_s"]) if row["every_s"] is not None else None
    return Trigger(every=every, cron=row["cron"], tz=row["tz"], anchor=parse_iso(row["anchor"]))


_row_to_schedule = RowMapper(Schedule, trigger=OfRow(_trigger))


@dataclass(frozen=True)
class _Fired:
    """What one fire of a schedule did, for the log lines written once it is committed."""

    task_ids: tuple[str, ...] = ()
    dropped: int = 0  # fires not queued: too many of the schedule's tasks still queued or running
    backlog: int = 0
    missed: int = 0  # fires the missed-run policy dropped
    policy: MissedPolicy = DEFAULT_MISSED


def _schedule_row(conn: Connection, schedule_id: str) -> Schedule | None:
    return _row_to_schedule.first(conn, select(schedules).where(schedules.c.id == schedule_id))


def _not_found(schedule_id: str) -> ScheduleError:
    return ScheduleError(f"no schedule {schedule_id!r}; `impyard schedule ls` lists them")


class ScheduleStore(Store):
    def __init__(self, db: Database, clock: Clock, tasks: TaskStore, imps: ImpStore | None = None) -> None:
        self.db = db
        self.clock = clock
        self.tasks = tasks
        self.imps = imps

    # ------------------------------------------------------------ adding (validated before anything is written)

    def add(self, request: ScheduleRequest) -> Schedule:
        if (request.every is None) == (request.cron is None):
            raise ScheduleError('give exactly one of --every (e.g. 24h) and --cron (e.g. "0 9 * * 1-5")')
        if request.every is not None and request.tz is not None:
            raise ScheduleError(
                "--tz applies to --cron schedules only; an --every interval is the same in every timezone"
            )
        missed = parse_missed(request.missed)
        now = self.clock.now()
        if request.every is not None:
            trigger = Trigger(every=parse_every(request.every), anchor=now)
        else:
            cron = parse_cron(request.cron or "")
            tz = request.tz or "UTC"
            parse_timezone(tz)
            trigger = Trigger(cron=cron, tz=tz)
        task = validate_request(
            TaskRequest(
                imp=request.imp, prompt=request.prompt, kind=request.kind, channel_id=request.channel_id,
                ceiling=request.ceiling, origin="schedule", wake_on_resolve=request.wake_on_resolve,
                briefing=request.briefing,
            ),
            self.imps,
        )  # fmt: skip
        next_run = first_run(trigger, now, now=request.now)
        schedule_id = f"s-{secrets.token_hex(4)}"
        row = insert(schedules).values(
            id=schedule_id, imp=task.imp, kind=task.kind, prompt=task.prompt, channel_id=task.channel_id,
            ceiling_s=task.ceiling_s, wake_on_resolve=int(task.wake_on_resolve), briefing=int(task.briefing),
            every_s=trigger.every.total_seconds() if trigger.every else None, cron=trigger.cron, tz=trigger.tz,
            missed=missed, anchor=iso(trigger.anchor or now), next_run=iso(next_run), created_at=iso(now),
            updated_at=iso(now),
        )  # fmt: skip

        def add_it(conn: Connection) -> None:
            ensure_task_channel(conn, task.channel_id, now)
            conn.execute(row)

        self.db.write(add_it)
        schedule = self.get(schedule_id)
        log.info(
            "schedule %s added: imp=%s %s next_run=%s",
            schedule.id,
            schedule.imp,
            trigger.describe(),
            iso(next_run),
        )
        return schedule

    # ------------------------------------------------------------ reading

    def get(self, schedule_id: str) -> Schedule:
        schedule = self.db.read(lambda conn: _schedule_row(conn, schedule_id))
        if schedule is None:
            raise _not_found(schedule_id)
        return schedule

    def all_for(self, imp: str | None = None) -> list[Schedule]:
        """Every schedule (of ``imp``, when given), the next to run first."""
        query = select(schedules).order_by(bytewise(schedules.c.next_run), bytewise(schedules.c.id))
        if imp is not None:
            query = query.where(schedules.c.imp == imp)
        return self.db.read(lambda conn: _row_to_schedule.all(conn, query))

    # ------------------------------------------------------------ operator changes

    def remove(self, schedule_id: str) -> Schedule:
        def remove_it(conn: Connection) -> Schedule:
            schedule = _schedule_row(conn, schedule_id)
            if schedule is None:
                raise _not_found(schedule_id)
            conn.execute(delete(schedules).where(schedules.c.id == schedule_id))  # its queued tasks stay
            return schedule

        schedule = self.db.write(remove_it)
        log.info("schedule %s removed", schedule_id)
        return schedule

    def pause(self, schedule_id: str) -> Schedule:
        now = iso(self.clock.now())
        paused = update(schedules).where(schedules.c.id == schedule_id).values(paused=1, updated_at=now)
        if self.db.write(lambda conn: conn.execute(paused).rowcount) != 1:
            raise _not_found(schedule_id)
        log.info("schedule %s paused", schedule_id)
        return self.get(schedule_id)

    def resume(self, schedule_id: str) -> Schedule:
        """Resume from now on: fires that fell in the pause are not made up for."""
        now = self.clock.now()

        def resume_it(conn: Connection) -> datetime:
            schedule = _schedule_row(conn, schedule_id)
            if schedule is None:
                raise _not_found(schedule_id)
            next_run = schedule.next_run if schedule.next_run > now else next_after(schedule.trigger, now)
            conn.execute(
                update(schedules)
                .where(schedules.c.id == schedule_id)
                .values(paused=0, next_run=iso(next_run), updated_at=iso(now))
            )
            return next_run

        next_run = self.db.write(resume_it)
        log.info("schedule %s resumed; next run %s", schedule_id, iso(next_run))
        return self.get(schedule_id)

    # ------------------------------------------------------------ firing

    def fire_due(self) -> list[Task]:
        """Queue a task for each due fire of every active schedule; one transaction per schedule."""
        now = self.clock.now()
        due = (
            select(schedules.c.id)
            .where(schedules.c.paused == 0, schedules.c.next_run <= iso(now))
            .order_by(bytewise(schedules.c.next_run), bytewise(schedules.c.id))
        )
        queued: list[Task] = []
        for schedule_id in self.db.read(lambda conn: list(conn.scalars(due))):
            queued.extend(self._fire(schedule_id, now))
        return queued

    def _claim_fire(self, conn: Connection, schedule_id: str, now: datetime) -> _Fired | None:
        """One due schedule's fire, claimed by exactly one supervisor (issue 21, "Exactly once across hosts"):
        the due row is locked (PostgreSQL: FOR UPDATE SKIP LOCKED, so another host passes it by; SQLite: the
        write lock) and its ``next_run`` moved by a conditional UPDATE that matches only the ``next_run`` read, so
        of two supervisors one queues the fire and the other finds it gone. None: not due (any more)."""
        row = conn.execute(
            select(schedules)
            .where(schedules.c.id == schedule_id, schedules.c.paused == 0, schedules.c.next_run <= iso(now))
            .with_for_update(skip_locked=True)
        ).mappings().first()  # fmt: skip
        if row is None:
            return None  # removed, paused, or being fired or fired by someone else meanwhile
        schedule = _row_to_schedule(row)
        runs = due_runs(schedule.trigger, schedule.next_run, now, schedule.missed)
        claimed = conn.execute(
            update(schedules)
            .where(schedules.c.id == schedule.id, schedules.c.next_run == row["next_run"])
            .values(next_run=iso(runs.next_run), updated_at=iso(now))
        )
        if claimed.rowcount != 1:
            return None
        backlog = conn.execute(
            select(func.count())
            .select_from(tasks_table)
            .where(tasks_table.c.schedule_id == schedule.id, tasks_table.c.state.in_(("queued", "running")))
        ).scalar_one()
        room = max(0, MAX_QUEUED_PER_SCHEDULE - backlog)
        task = ValidTask(
            imp=schedule.imp, kind=schedule.kind, prompt=schedule.prompt, person=None, origin="schedule",
            channel_id=schedule.channel_id, ceiling_s=schedule.ceiling_s, wake_on_resolve=schedule.wake_on_resolve,
            briefing=schedule.briefing,
        )  # fmt: skip
        task_ids: list[str] = []
        for when in runs.fire[len(runs.fire) - room :] if room else ():
            task_id = f"t-{secrets.token_hex(5)}"
            if insert_task(
                conn, task, task_id=task_id, now=now, schedule_id=schedule.id, scheduled_for=when,
                not_before=now,
            ):  # fmt: skip
                task_ids.append(task_id)
        if task_ids:
            conn.execute(
                update(schedules)
                .where(schedules.c.id == schedule.id)
                .values(last_fired=iso(now), fired=schedules.c.fired + len(task_ids))
            )
        return _Fired(tuple(task_ids), max(0, len(runs.fire) - room), backlog, runs.missed, schedule.missed)

    def _fire(self, schedule_id: str, now: datetime) -> list[Task]:
        fired = self.db.write(lambda conn: self._claim_fire(conn, schedule_id, now))
        if fired is None:
            return []
        if fired.dropped:
            log.warning(
                "schedule %s: %d run(s) still queued or running; %d fire(s) dropped so the queue does not grow",
                schedule_id, fired.backlog, fired.dropped,
            )  # fmt: skip
        if fired.missed and fired.policy != "all":
            log.info(
                "schedule %s: %d missed run(s) dropped by its missed-run policy %r",
                schedule_id,
                fired.missed,
                fired.policy,
            )
        found = self.db.read(lambda conn: tasks_by_id(conn, fired.task_ids))
        queued = [found[task_id] for task_id in fired.task_ids]
        for task in queued:
            log_transition(
                task.id,
                task.imp,
                "new",
                "queued",
                kind=task.kind,
                origin=task.origin,
                channel=task.channel_id,
            )
            log.info(
                "task %s queued by schedule %s (scheduled for %s)", task.id, schedule_id,
                iso(task.scheduled_for) if task.scheduled_for else "?",
            )  # fmt: skip
        return queued


def describe_next(schedule: Schedule) -> str:
    """The next run in the schedule's own timezone (and UTC when that differs)."""
    zone = parse_timezone(schedule.trigger.tz)
    local = schedule.next_run.astimezone(zone)
    text = f"{local:%Y-%m-%d %H:%M} {schedule.trigger.tz}"
    if schedule.trigger.tz != "UTC":
        text += f" ({schedule.next_run:%H:%M} UTC)"
    return text
