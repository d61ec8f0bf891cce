"""Schedules: recurring tasks for ``impyard supervise`` (issue 8); when they fire is ``impyard.tasks.triggers``.

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
from datetime import datetime, timedelta

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.engine import Connection

from impyard.clock import Clock, iso, parse_iso
from impyard.imps.store import ImpStore
from impyard.storage.db import Database, Store
from impyard.storage.portable import bytewise
from impyard.storage.rows import OfRow, Row, RowMapper
from impyard.storage.tables import schedules
from impyard.storage.tables import tasks as tasks_table
from impyard.tasks import Task, TaskRequest, TaskStore, ValidTask, log_transition, validate_request
from impyard.tasks.sql import ensure_task_channel, insert_task, tasks_by_id
from impyard.tasks.triggers import (
    DEFAULT_MISSED,
    MAX_QUEUED_PER_SCHEDULE,
    MissedPolicy,
    ScheduleError,
    Trigger,
    due_runs,
    first_run,
    next_after,
    parse_cron,
    parse_every,
    parse_missed,
    parse_timezone,
)

log = logging.getLogger("impyard.schedules")


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
