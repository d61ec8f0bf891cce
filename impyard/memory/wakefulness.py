"""The imp's day on the host (mechanisms 104-107, 114; subtle point 18; docs/memory.md, "The imp's day").

A memory imp is awake or asleep. Activity wakes it: a message that woke it (``wakes`` joined with the
message's time in ``history``), or a departure it thought over (a finished ``depart`` task). Boxes are
short-lived, so the clock lives here, on the host: every tick of the supervisor takes in the activity
since the last one and runs the state machine, and what falls due becomes a task run in a one-shot box:

* waking from sleep asks for one reflection first thing (104); 600 s of silence, one reflection, once per
  silence (105); 7200 s, the imp falls asleep, reflecting first if it has not yet (106): a ``reflect`` task
  in the channel of the imp's latest activity, with that channel's scopes; it posts nothing;
* 600 s into sleep, once per sleep (107): one ``sleep`` task per scope the imp lived in since it woke (its
  records that happened since then; at most ``MAX_SLEEP_SCOPES``, the newest first), each folding and then
  forgetting within that scope alone; every other scope of the imp is forgotten in by the host itself
  (forgetting needs no model).

``activity`` and ``tick`` are the pure rules. ``step`` is one imp's tick on the database: its state, the
activity it takes in and the tasks it queues are read and written in ONE transaction (``db.write``: pure
database work, run again on PostgreSQL after a serialization failure; the log line comes after it), so a crash never
runs a sleep twice and never loses one (the state says ``consolidated`` as soon as the sleep is queued; an
imp over budget has its task deferred by the supervisor's dispatch, never queued again). ``queue_night``
is ``impyard memory night`` (114): a sleep now, whatever the clock. New imps start asleep with nothing to
fold, so the first tick after their first activity runs a reflection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection

from box.common.laws import DEFAULTS, Params
from impyard.clock import iso, parse_iso
from impyard.memory.night import scopes_by_newest
from impyard.memory.sql import execute
from impyard.storage.db import Database
from impyard.storage.portable import bytewise, per_dialect, upsert
from impyard.storage.tables import history, memory_wakefulness, wakes
from impyard.storage.tables import tasks as task_rows
from impyard.tasks import TaskError, TaskRequest, TaskStore, ValidTask, default_channel, validate_request

log = logging.getLogger("impyard.memory.wakefulness")

REFLECT_KIND = "reflect"  # an idle reflection: ChatMemory.reflect_idle in the box (box/program.py)
SLEEP_KIND = "sleep"  # consolidation (if asked) then forgetting, in one scope: ChatMemory.night
REFLECT_CEILING = timedelta(seconds=300)  # one quiet reflection fits well inside
SLEEP_CEILING = timedelta(minutes=15)  # one plan call over at most 200 records, then the folding
MAX_SLEEP_SCOPES = 20  # sleep tasks a night queues; the other scopes are forgotten in by the host
MAX_NIGHT_SCOPES = 100  # `impyard memory night`: the same, for the operator's night
NIGHT_LOOKBACK = timedelta(
    hours=24
)  # `impyard memory night`: "since waking" when the clock never saw it wake

Action = Literal["reflect", "sleep"]
ForgetScope = Callable[
    [str, str], tuple[int, int]
]  # MemoryStore.forget_scope(imp, scope): (records, episodes)


@dataclass(frozen=True)
class Wakefulness:
    """One imp's clock state (a row of ``memory_wakefulness``); the default is a new imp: asleep, nothing to fold."""

    awake: bool = False
    woke_at: datetime | None = None  # when the current (or last) awake period began
    slept_at: datetime | None = None
    last_activity_at: datetime | None = None
    last_channel: str | None = None  # where that activity was: an idle reflection's channel
    wake_pending: bool = False
    introspected_idle: bool = False  # reflected in this silence already
    consolidated: bool = True
    last_reflection_at: datetime | None = None
    last_sleep_at: datetime | None = None
    last_consolidation_at: datetime | None = None


ASLEEP = Wakefulness()


# ------------------------------------------------------------------ the pure rules (subtle point 18)


def activity(state: Wakefulness, now: datetime, channel_id: str) -> Wakefulness:
    """Mechanism 104: activity wakes the imp. Waking from sleep starts an awake period (``woke_at``) with a
    reflection pending and the night's work still to do; any activity ends the silence."""
    if not state.awake:
        state = replace(state, awake=True, wake_pending=True, woke_at=now, consolidated=False)
    return replace(state, introspected_idle=False, last_activity_at=now, last_channel=channel_id)


def _seconds(now: datetime, since: datetime | None) -> float:
    return 0.0 if since is None else (now - since).total_seconds()


def tick(
    state: Wakefulness, now: datetime, params: Params = DEFAULTS
) -> tuple[Wakefulness, tuple[Action, ...]]:
    """One tick: the new state and what is due now (a reflection, a sleep, or nothing)."""
    if state.awake:
        if state.wake_pending:  # mechanism 104: the reflection waking asked for
            woken = replace(state, wake_pending=False, introspected_idle=True, last_reflection_at=now)
            return woken, ("reflect",)
        idle = _seconds(now, state.last_activity_at)
        if idle >= params.sleep_after_seconds:  # mechanism 106: asleep, reflecting first if not yet
            asleep = replace(state, awake=False, slept_at=now, introspected_idle=True)
            if state.introspected_idle:
                return asleep, ()
            return replace(asleep, last_reflection_at=now), ("reflect",)
        if idle >= params.silence_seconds and not state.introspected_idle:  # mechanism 105: once per silence
            return replace(state, introspected_idle=True, last_reflection_at=now), ("reflect",)
        return state, ()
    if (
        not state.consolidated
        and state.slept_at is not None
        and _seconds(now, state.slept_at) >= params.consolidate_after_sleep_seconds
    ):  # mechanism 107: once per sleep
        folds = state.woke_at is not None
        return replace(
            state, consolidated=True, last_sleep_at=now,
            last_consolidation_at=now if folds else state.last_consolidation_at,
        ), ("sleep",)  # fmt: skip
    return state, ()


# ------------------------------------------------------------------ the state in the database

_TIMES = (
    "woke_at",
    "slept_at",
    "last_activity_at",
    "last_reflection_at",
    "last_sleep_at",
    "last_consolidation_at",
)
_FLAGS = ("awake", "wake_pending", "introspected_idle", "consolidated")


def _when(value: object) -> datetime | None:
    return parse_iso(value) if isinstance(value, str) and value else None


_W = memory_wakefulness
_LOAD = select(_W).where(_W.c.imp == bindparam("imp"))


@per_dialect
def _SAVE(dialect: str) -> Any:  # noqa: N802 - a statement
    statement = upsert(dialect)(_W)
    names = (*_FLAGS, *_TIMES, "last_channel", "updated_at")
    return statement.on_conflict_do_update(
        index_elements=[_W.c.imp], set_={name: statement.excluded[name] for name in names}
    )


def load(conn: Connection, imp: str) -> Wakefulness:
    """The imp's state; ``ASLEEP`` when the clock has never seen it."""
    return seen(conn, imp) or ASLEEP


def seen(conn: Connection, imp: str) -> Wakefulness | None:
    """The imp's state as stored; None when the clock has never seen it (``impyard memory stats`` says so)."""
    rows = execute(conn, _LOAD, {"imp": imp})
    if not rows:
        return None
    row = rows[0]
    return Wakefulness(
        awake=bool(row["awake"]),
        woke_at=_when(row["woke_at"]),
        slept_at=_when(row["slept_at"]),
        last_activity_at=_when(row["last_activity_at"]),
        last_channel=row["last_channel"],
        wake_pending=bool(row["wake_pending"]),
        introspected_idle=bool(row["introspected_idle"]),
        consolidated=bool(row["consolidated"]),
        last_reflection_at=_when(row["last_reflection_at"]),
        last_sleep_at=_when(row["last_sleep_at"]),
        last_consolidation_at=_when(row["last_consolidation_at"]),
    )


def save(conn: Connection, imp: str, state: Wakefulness, now: datetime) -> None:
    """Write the imp's state (in the caller's transaction). Flags are 0/1 integers on both engines."""
    values: dict[str, Any] = {name: int(getattr(state, name)) for name in _FLAGS}
    values.update({name: iso(when) if (when := getattr(state, name)) else None for name in _TIMES})
    execute(
        conn,
        _SAVE(conn.dialect.name),
        {"imp": imp, **values, "last_channel": state.last_channel, "updated_at": iso(now)},
    )


# ------------------------------------------------------------------ activity, from the host's own records


@dataclass(frozen=True)
class Activity:
    at: datetime
    channel_id: str


_heard = bytewise(history.c.created_at)
_finished = bytewise(task_rows.c.finished_at)
_WAKES = (
    select(history.c.created_at.label("at"), wakes.c.channel_id)
    .select_from(
        wakes.join(
            history,
            (history.c.channel_id == wakes.c.channel_id) & (history.c.message_id == wakes.c.message_id),
        )
    )
    .where(wakes.c.imp == bindparam("imp"), _heard > bindparam("since"))
    .limit(1)
)
_DEPARTURES = (
    select(task_rows.c.finished_at.label("at"), task_rows.c.channel_id)
    .where(
        task_rows.c.imp == bindparam("imp"), task_rows.c.kind == "depart", task_rows.c.state.in_(("done", "failed", "needs_review")),
        _finished > bindparam("since"),
    )
    .limit(1)
)  # fmt: skip
_ACTIVITY = (
    _WAKES.order_by(_heard.asc()), _WAKES.order_by(_heard.desc()),
    _DEPARTURES.order_by(_finished.asc()), _DEPARTURES.order_by(_finished.desc()),
)  # fmt: skip


def activities(conn: Connection, imp: str, after: datetime | None) -> list[Activity]:
    """The imp's first and latest activity after ``after`` (all of it when None), oldest first: a message
    that woke it, or a departure it thought over (mechanism 104). Reflections and sleeps are never activity.
    The first one matters when the imp was asleep (it woke then); the latest, for the silence and its channel."""
    found: list[Activity] = []
    params = {"imp": imp, "since": iso(after) if after is not None else ""}
    for statement in _ACTIVITY:
        for row in execute(conn, statement, params):
            found.append(Activity(parse_iso(row["at"]), row["channel_id"]))
    if not found:
        return []
    first = min(found, key=lambda item: item.at)
    last = max(found, key=lambda item: item.at)
    return [first] if first == last else [first, last]


# ------------------------------------------------------------------ the tasks a tick queues


def lived_in_scopes(conn: Connection, imp: str, since: datetime, limit: int) -> list[str]:
    """The scopes with records that happened at or after ``since``, the newest activity first."""
    return scopes_by_newest(conn, imp, since, limit)


def scopes_with_records(conn: Connection, imp: str) -> list[str]:
    """Every scope in which the imp has a record, the newest record first."""
    return scopes_by_newest(conn, imp)


def reflect_request(imp: str, channel_id: str | None) -> ValidTask:
    """An idle reflection in the channel of the imp's latest activity (the imp's task log when unknown)."""

    def request(channel: str | None) -> ValidTask:
        return validate_request(
            TaskRequest(imp=imp, prompt=None, kind=REFLECT_KIND, channel_id=channel, ceiling=REFLECT_CEILING,
                        origin="event")
        )  # fmt: skip

    try:
        return request(channel_id)
    except TaskError:  # a channel no task can name: the task log instead
        return request(None)


def sleep_request(imp: str, scope: str, since: datetime, *, consolidate: bool) -> ValidTask:
    """A night in ``scope`` alone: fold the records since ``since`` (if ``consolidate``), then forget."""
    return validate_request(
        TaskRequest(
            imp=imp, prompt=None, kind=SLEEP_KIND, channel_id=default_channel(imp), ceiling=SLEEP_CEILING,
            origin="event", scope=scope, args={"since": iso(since), "consolidate": consolidate},
        )
    )  # fmt: skip


_QUEUED = select(task_rows.c.id, task_rows.c.scope).where(
    task_rows.c.imp == bindparam("imp"), task_rows.c.kind == bindparam("kind"), task_rows.c.state == "queued"
)


def _queued(conn: Connection, imp: str, kind: str) -> list[tuple[str, str | None]]:
    """The imp's tasks of ``kind`` still waiting to run (an imp over budget has them deferred): (id, scope)."""
    return [(str(row[0]), row[1]) for row in conn.execute(_QUEUED, {"imp": imp, "kind": kind})]


@dataclass(frozen=True)
class Step:
    """What one tick of one imp did: its new state, the actions due, the tasks queued, and the scopes the host
    forgets in itself (those no sleep task works in tonight)."""

    state: Wakefulness
    actions: tuple[Action, ...] = ()
    queued: tuple[str, ...] = ()
    forget: tuple[str, ...] = ()


def _insert(conn: Connection, tasks: TaskStore, request: ValidTask) -> str:
    task_id = tasks.insert(conn, request)
    assert task_id is not None  # a fresh id: nothing to collide with
    return task_id


def step(db: Database, tasks: TaskStore, imp: str, now: datetime, params: Params = DEFAULTS) -> Step:
    """One tick of ``imp`` (blocking): take in its activity, run the rules, write the state and queue what is
    due, all in one transaction. A reflection already waiting to run covers a new one; a sleep task already
    waiting in a scope (deferred: the imp is over budget) covers that scope, from its earlier waking."""

    def write(conn: Connection) -> Step:  # database work only: PostgreSQL may run it again
        before = load(conn, imp)
        state = before
        for item in activities(conn, imp, state.last_activity_at):
            state = activity(state, item.at, item.channel_id)
        state, actions = tick(state, now, params)
        queued: list[str] = []
        forget: list[str] = []
        if "reflect" in actions and not _queued(conn, imp, REFLECT_KIND):
            queued.append(_insert(conn, tasks, reflect_request(imp, state.last_channel)))
        if "sleep" in actions:
            waiting = {scope for _, scope in _queued(conn, imp, SLEEP_KIND)}
            lived = lived_in_scopes(conn, imp, state.woke_at, MAX_SLEEP_SCOPES) if state.woke_at else []
            for scope in lived:
                if scope not in waiting:
                    assert state.woke_at is not None
                    queued.append(
                        _insert(conn, tasks, sleep_request(imp, scope, state.woke_at, consolidate=True))
                    )
            forget = [scope for scope in scopes_with_records(conn, imp) if scope not in lived]
        if state != before:
            save(conn, imp, state, now)
        return Step(state, actions, tuple(queued), tuple(forget))

    done = db.write(write)
    state, actions, queued = done.state, done.actions, done.queued
    if actions:
        log.info(
            "memory clock: %s %s (%s); tasks %s", imp, " and ".join(actions),
            "awake" if state.awake else "asleep", ", ".join(queued) or "none",
        )  # fmt: skip
    return done


def queue_night(
    db: Database, tasks: TaskStore, imp: str, now: datetime, *, consolidate: bool
) -> tuple[list[tuple[str, str]], list[str], datetime]:
    """Mechanism 114 (``impyard memory night``), blocking: a sleep task for every scope of ``imp`` with records
    (the newest first, at most ``MAX_NIGHT_SCOPES``; the rest are for the host to forget in), folding the
    records since the imp woke (24 h ago when the clock never saw it wake) if ``consolidate``, in one
    transaction. The clock's own state is left as it is, but for the times of the last sleep and folding.
    Returns ([(scope, task id)], the scopes left to the host, since)."""

    def write(conn: Connection) -> tuple[list[tuple[str, str]], list[str], datetime]:
        state = load(conn, imp)
        since = state.woke_at or now - NIGHT_LOOKBACK
        scopes = scopes_with_records(conn, imp)
        queued = [
            (scope, _insert(conn, tasks, sleep_request(imp, scope, since, consolidate=consolidate)))
            for scope in scopes[:MAX_NIGHT_SCOPES]
        ]
        if queued:
            state = replace(
                state,
                last_sleep_at=now,
                last_consolidation_at=now if consolidate else state.last_consolidation_at,
            )
            save(conn, imp, state, now)
        return queued, scopes[MAX_NIGHT_SCOPES:], since

    return db.write(write)


def forget_scopes(forget_scope: ForgetScope, imp: str, scopes: Sequence[str]) -> tuple[int, int]:
    """The host's own forgetting in ``scopes`` (blocking; ``MemoryStore.forget_scope``): (records, episodes)."""
    records = episodes = 0
    for scope in scopes:
        gone, gone_episodes = forget_scope(imp, scope)
        records += gone
        episodes += gone_episodes
    if records:
        log.info("memory clock: %s forgot %d record(s), %d episode(s) in %d scope(s)", imp, records, episodes,
                 len(scopes))  # fmt: skip
    return records, episodes
