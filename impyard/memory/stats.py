"""``impyard memory stats``: what an imp keeps, per scope, how its day stands, and the database's size."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import ColumnElement, case, func, select
from sqlalchemy.engine import Connection

from box.common import laws
from impyard.memory import wakefulness
from impyard.storage.db import Database
from impyard.storage.tables import memory_conversations as _C
from impyard.storage.tables import memory_dispositions as _D
from impyard.storage.tables import memory_episodes as _E
from impyard.storage.tables import memory_records as _R
from impyard.storage.tables import memory_slots as _S

_SCOPE_COUNTS = ("records", "episodes", "constructs", "given", "conversations", "slot")


@dataclass(frozen=True)
class ScopeStats:
    """One scope of an imp's memory, counted (``stats``)."""

    scope: str
    records: int = 0
    episodes: int = 0
    constructs: int = 0
    given: int = 0
    conversations: int = 0
    slot: int = 0


@dataclass(frozen=True)
class ClockStats:
    """The imp's day as the supervisor's clock keeps it (``wakefulness.Wakefulness``; mechanisms 104-107): the
    part the operator is shown."""

    TIMES: ClassVar[tuple[str, ...]] = (
        "woke_at", "slept_at", "last_activity_at", "last_reflection_at", "last_sleep_at", "last_consolidation_at",
    )  # fmt: skip

    awake: bool
    woke_at: datetime | None = None
    slept_at: datetime | None = None
    last_activity_at: datetime | None = None
    last_reflection_at: datetime | None = None
    last_sleep_at: datetime | None = None
    last_consolidation_at: datetime | None = None


@dataclass(frozen=True)
class MemoryStats:
    """``impyard memory stats``: what an imp keeps, per scope, and how its day stands."""

    imp: str
    scopes: list[ScopeStats]
    rules: int
    active_rules: int
    clock: ClockStats | None  # None: the supervisor's clock has not seen the imp yet
    database_bytes: int


def clock_of(conn: Connection, imp: str) -> ClockStats | None:
    """The imp's day as the operator is shown it (``impyard memory stats``, the console's Imps page); None when the
    supervisor's clock has not seen the imp yet."""
    clock = wakefulness.seen(conn, imp)
    if clock is None:
        return None
    return ClockStats(awake=clock.awake, **{k: getattr(clock, k) for k in ClockStats.TIMES})


def days(db: Database, imps: Sequence[str]) -> dict[str, ClockStats | None]:
    """``clock_of`` for each of ``imps``, in one read (blocking)."""
    return db.read(lambda conn: {imp: clock_of(conn, imp) for imp in imps})


def gather(db: Database, imp: str) -> MemoryStats:
    """Per scope records, episodes, constructs, given records and slot entries; the learned rules and saved
    conversations; the clock's state (``memory_wakefulness``); the host database's size (on disk for SQLite;
    every imp's memory is in it, with the rest of the host's)."""

    def read(conn: Connection) -> MemoryStats:
        per: dict[str, dict[str, int]] = {}

        def add(statement: Any, *names: str) -> None:
            for row in conn.execute(statement):
                counted = per.setdefault(str(row[0]), dict.fromkeys(_SCOPE_COUNTS, 0))
                for index, name in enumerate(names, start=1):
                    counted[name] = int(row[index] or 0)

        def counted(condition: ColumnElement[bool]) -> Any:
            return func.sum(case((condition, 1), else_=0))

        add(
            select(_R.c.scope, func.count(), counted(_R.c.kind == "construct"), counted(_R.c.origin == "given"))
            .where(_R.c.imp == imp).group_by(_R.c.scope),
            "records", "constructs", "given",
        )  # fmt: skip
        for table, name in ((_E, "episodes"), (_C, "conversations"), (_S, "slot")):
            add(select(table.c.scope, func.count()).where(table.c.imp == imp).group_by(table.c.scope), name)
        rules = conn.execute(
            select(func.count(), counted(func.abs(_D.c.weight) > laws.DORMANT_WEIGHT)).where(_D.c.imp == imp)
        ).one()
        clock = clock_of(conn, imp)
        if conn.dialect.name == "postgresql":
            size = int(conn.execute(select(func.pg_database_size(func.current_database()))).scalar_one())
        else:
            size = sum(
                path.stat().st_size
                for path in (db.path, db.path.with_name(db.path.name + "-wal"))
                if path.exists()
            )
        return MemoryStats(
            imp=imp,
            scopes=[ScopeStats(scope=scope, **per[scope]) for scope in sorted(per)],
            rules=int(rules[0] or 0),
            active_rules=int(rules[1] or 0),
            clock=clock,
            database_bytes=size,
        )  # fmt: skip

    return db.read(read)
