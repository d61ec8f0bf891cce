"""The imp's day as it went (mechanisms 104-114; the console's Memory timeline): when it woke and fell asleep, its
reflections and its nights, from what the host keeps — the supervisor's clock (``wakefulness``: the current or
last waking, sleep and activity) and the ``reflect`` and ``sleep`` tasks the clock and ``impyard memory night``
queued (their times and how each ended).

Read for one scope: a night is one ``sleep`` task per scope, and only this scope's are listed, with the box's
one-line account of it (its counts: folded, forgotten); reflections are the imp's own (no scope), listed with
their times and outcome only — what a reflection formed belongs to the channel it ran in.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import or_, select
from sqlalchemy.engine import Connection

from impyard.clock import iso, parse_iso
from impyard.memory import wakefulness
from impyard.memory.wakefulness import REFLECT_KIND, SLEEP_KIND, Wakefulness
from impyard.storage.db import Database
from impyard.storage.portable import bytewise
from impyard.storage.tables import tasks as _T

DAY_WINDOW = timedelta(days=7)  # how far back the timeline reaches
MAX_EVENTS = 200  # tasks read for it, newest first
MAX_ACCOUNT_CHARS = 300  # a night's account as shown (the box wrote it: bounded)

EventKind = Literal["woke", "asleep", "activity", "reflection", "night"]


@dataclass(frozen=True)
class DayEvent:
    """One moment of the imp's day: ``state`` is its task's (queued, running, done, failed…) for a reflection
    or a night; ``account`` the night's one line when it finished."""

    at: datetime
    kind: EventKind
    state: str | None = None
    account: str | None = None


@dataclass(frozen=True)
class Day:
    """The imp's day for one scope: the clock (None: the supervisor never saw the imp) and its events since
    ``since``, newest first."""

    imp: str
    scope: str
    since: datetime
    clock: Wakefulness | None
    events: tuple[DayEvent, ...]

    @property
    def awake(self) -> bool:
        return self.clock is not None and self.clock.awake


def _when(row: dict[str, object], *names: str) -> datetime:
    for name in names:
        value = row.get(name)
        if isinstance(value, str) and value:
            return parse_iso(value)
    raise ValueError("a task row without a time")  # created_at is NOT NULL: never


def day(db: Database, imp: str, scope: str, now: datetime, window: timedelta = DAY_WINDOW) -> Day:
    """``imp``'s day in ``scope`` over the last ``window`` (blocking: one read)."""
    since = now - window

    def read(conn: Connection) -> Day:
        clock = wakefulness.seen(conn, imp)
        events: list[DayEvent] = []
        if clock is not None:
            for at, kind in (
                (clock.woke_at, "woke"),
                (clock.slept_at, "asleep"),
                (clock.last_activity_at, "activity"),
            ):
                if at is not None and at >= since:
                    events.append(DayEvent(at, kind))  # type: ignore[arg-type]
        rows = conn.execute(
            select(_T.c.kind, _T.c.state, _T.c.box_summary, _T.c.created_at, _T.c.started_at, _T.c.finished_at)
            .where(
                _T.c.imp == imp,
                or_(_T.c.kind == REFLECT_KIND, (_T.c.kind == SLEEP_KIND) & (_T.c.scope == scope)),
                bytewise(_T.c.created_at) >= iso(since),
            )
            .order_by(bytewise(_T.c.created_at).desc())
            .limit(MAX_EVENTS)
        ).mappings()  # fmt: skip
        for row in rows:
            at = _when(dict(row), "finished_at", "started_at", "created_at")
            if row["kind"] == REFLECT_KIND:
                events.append(DayEvent(at, "reflection", str(row["state"])))
            else:
                said = " ".join(str(row["box_summary"] or "").split())[:MAX_ACCOUNT_CHARS]
                events.append(
                    DayEvent(at, "night", str(row["state"]), said if row["state"] == "done" else None)
                )
        events.sort(key=lambda event: event.at, reverse=True)
        return Day(imp, scope, since, clock, tuple(events))

    return db.read(read)
