"""What the imps spent per UTC day and purpose group, and the reservations in flight (issue 34: the console's Budget
page and ``impyard budget spend`` read it here, so the two agree).

Read from the ledger's rows — the budget's own truth, the rows ``budget show`` sums — in one read bounded to the
days asked (the ``ledger_day`` index). A row counts on the UTC day it was reserved (the window it was charged
against): its measured cost once settled, its reservation while in flight. Purposes are grouped as the operator
thinks of them (``purpose_group``): a call a task run made is **tasks** whatever its purpose; else **reply** (the
reply and the pictures it posts), **memory** (every memory purpose, the embedding too) or **other**.
"""

from __future__ import annotations

import typing
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from box.protocol.models import MemoryPurpose
from impyard.clock import parse_iso
from impyard.gateway.ledger import ALL_IMPS
from impyard.storage.db import Database
from impyard.storage.liveness import Holder
from impyard.storage.tables import ledger, task_runs

GROUPS = ("reply", "memory", "tasks", "other")  # the order of a bar's segments and of the tables' columns
REPLY_PURPOSES = frozenset({"reply", "image"})  # the imp's reply, and the pictures posted with it
MEMORY_PURPOSES = (
    frozenset(typing.get_args(MemoryPurpose)) - REPLY_PURPOSES
)  # arrival, appraisal, … embedding
DEFAULT_DAYS = 14
MAX_DAYS = 92  # a quarter: the read stays bounded whatever a browser or a script asks


def purpose_group(purpose: str, *, from_task: bool) -> str:
    """The group a model call's spend counts under: tasks (any call of a task run), reply, memory or other."""
    if from_task:
        return "tasks"
    if purpose in REPLY_PURPOSES:
        return "reply"
    if purpose in MEMORY_PURPOSES:
        return "memory"
    return "other"


def window(last_day: date, days: int) -> tuple[str, ...]:
    """The ``days`` UTC days ending with ``last_day``, oldest first, as the ledger keys them (YYYY-MM-DD)."""
    if not 1 <= days <= MAX_DAYS:
        raise ValueError(f"days is a whole number from 1 to {MAX_DAYS}, not {days}")
    return tuple((last_day - timedelta(days=back)).isoformat() for back in range(days - 1, -1, -1))


@dataclass(frozen=True)
class DaySpend:
    """One scope's one UTC day: micro-USD charged per group, and what is still reserved."""

    day: str
    charged: Mapping[str, int] = field(default_factory=dict)  # group -> settled micro-USD
    in_flight: int = 0  # reservations not settled yet

    @property
    def charged_total(self) -> int:
        return sum(self.charged.values())

    @property
    def total(self) -> int:
        """What the day's window counts (as ``budget show``'s "today"): charged and in flight."""
        return self.charged_total + self.in_flight

    def group(self, name: str) -> int:
        return self.charged.get(name, 0)


@dataclass(frozen=True)
class ScopeSpend:
    """An imp's (or all imps', scope ``*``) days, every day of the window, oldest first."""

    scope: str
    days: tuple[DaySpend, ...]

    @property
    def total(self) -> int:
        return sum(day.total for day in self.days)

    def group_total(self, name: str) -> int:
        return sum(day.group(name) for day in self.days)

    @property
    def in_flight(self) -> int:
        return sum(day.in_flight for day in self.days)

    @property
    def spent_days(self) -> tuple[DaySpend, ...]:
        """The days with any spend or reservation."""
        return tuple(day for day in self.days if day.total)


@dataclass(frozen=True)
class SpendReport:
    """The window's days and one ``ScopeSpend`` each: all imps first (unless one imp was asked), then each imp
    with a ledger row in the window, by name."""

    days: tuple[str, ...]
    scopes: tuple[ScopeSpend, ...]

    def of(self, scope: str) -> ScopeSpend:
        """The scope's spend (all days empty for a scope that spent nothing in the window)."""
        found = next((s for s in self.scopes if s.scope == scope), None)
        return found or ScopeSpend(scope, tuple(DaySpend(day) for day in self.days))


@dataclass(frozen=True)
class SpendRow:
    """The ledger summed by imp, day, purpose and origin: what ``read_spend`` reads."""

    imp: str
    day: str
    purpose: str
    from_task: bool
    charged: int
    in_flight: int


def report_of(rows: Iterable[SpendRow], days: tuple[str, ...], *, imp: str | None = None) -> SpendReport:
    """The report of summed rows (a pure function: grouping, the all-imps sum, the empty days)."""
    charged: dict[tuple[str, str], Counter[str]] = {}
    held: Counter[tuple[str, str]] = Counter()
    imps: set[str] = set()
    for row in rows:
        if row.day not in days:
            continue
        imps.add(row.imp)
        group = purpose_group(row.purpose, from_task=row.from_task)
        for scope in (row.imp, ALL_IMPS):
            charged.setdefault((scope, row.day), Counter())[group] += row.charged
            held[(scope, row.day)] += row.in_flight
    scopes = sorted(imps) if imp is not None else [ALL_IMPS, *sorted(imps)]

    def day_of(scope: str, day: str) -> DaySpend:
        groups = charged.get((scope, day), Counter())
        return DaySpend(day, {g: groups[g] for g in GROUPS if groups[g]}, held[(scope, day)])

    return SpendReport(days, tuple(ScopeSpend(s, tuple(day_of(s, d) for d in days)) for s in scopes))


def read_spend(
    db: Database, *, last_day: date, days: int = DEFAULT_DAYS, imp: str | None = None
) -> SpendReport:
    """Spend per imp, UTC day and purpose group for the ``days`` days ending with ``last_day`` (one read)."""
    keys = window(last_day, days)
    from_task = sa.case((task_runs.c.run_id.is_not(None), 1), else_=0)
    query = (
        sa.select(
            ledger.c.imp,
            ledger.c.day,
            ledger.c.purpose,
            from_task.label("from_task"),
            sa.func.coalesce(
                sa.func.sum(sa.case((ledger.c.state == "settled", ledger.c.cost_micros), else_=0)), 0
            ),
            sa.func.coalesce(
                sa.func.sum(sa.case((ledger.c.state == "reserved", ledger.c.reserved_micros), else_=0)), 0
            ),
        )
        .select_from(ledger.outerjoin(task_runs, task_runs.c.run_id == ledger.c.run_id))
        .where(ledger.c.day >= keys[0], ledger.c.day <= keys[-1])
        .group_by(ledger.c.imp, ledger.c.day, ledger.c.purpose, from_task)
    )
    if imp is not None:
        query = query.where(ledger.c.imp == imp)

    def read(conn: Connection) -> list[SpendRow]:
        return [
            SpendRow(str(who), str(day), str(purpose), bool(task), int(charged or 0), int(held or 0))
            for who, day, purpose, task, charged, held in conn.execute(query).all()
        ]

    return report_of(db.read(read), keys, imp=imp)


@dataclass(frozen=True)
class InFlight:
    """A reservation not settled yet: a model call under way (or one a crashed host left, until it is settled)."""

    id: int
    imp: str
    reserved_micros: int
    purpose: str
    model: str
    since: datetime
    holder: Holder | None  # the process that made the call, where it was recorded


MAX_IN_FLIGHT = 500  # listed at most; a fleet has a few calls under way at a time


def read_in_flight(db: Database, *, imp: str | None = None, limit: int = MAX_IN_FLIGHT) -> list[InFlight]:
    """The ledger's open reservations, oldest first (the ``ledger_reserved`` index)."""
    query = (
        sa.select(
            ledger.c.id,
            ledger.c.imp,
            ledger.c.reserved_micros,
            ledger.c.purpose,
            ledger.c.model,
            ledger.c.created_at,
            ledger.c.owner,
        )  # fmt: skip
        .where(ledger.c.state == "reserved")
        .order_by(ledger.c.created_at, ledger.c.id)
        .limit(limit)
    )
    if imp is not None:
        query = query.where(ledger.c.imp == imp)
    rows = db.read(lambda conn: conn.execute(query).all())
    return [
        InFlight(
            int(row.id),
            str(row.imp),
            int(row.reserved_micros),
            str(row.purpose),
            str(row.model),
            parse_iso(row.created_at),
            Holder.parse(row.owner),
        )  # fmt: skip
        for row in rows
    ]
