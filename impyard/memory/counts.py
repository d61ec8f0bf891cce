"""How many records an imp keeps in some scopes (mechanism 3: every ``memory.*`` result says this total).

A scope's count is kept per generation (``RecordCounts``): it is counted again only after a write or a
delete moved the scope's generation, from any process.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from sqlalchemy import bindparam, func, select
from sqlalchemy.engine import Connection

from impyard.memory import generations
from impyard.memory.cache import Generation
from impyard.storage.db import Database
from impyard.storage.tables import memory_records as _R

MAX_CACHED_COUNTS = 10_000  # (imp, scope) totals kept between writes
_SCOPE_COUNT = (
    select(func.count()).select_from(_R).where(_R.c.imp == bindparam("imp"), _R.c.scope == bindparam("scope"))
)


class RecordCounts:
    """Records of every kind of an imp, per scope, each kept with the generation it was counted at."""

    def __init__(self) -> None:
        self._counts: dict[
            tuple[str, str], tuple[Generation, int]
        ] = {}  # (imp, scope) -> (generation, count)
        self._lock = threading.Lock()

    def count(self, db: Database, imp: str, scopes: Sequence[str] | None = None) -> int:
        """Records of every kind of ``imp`` in ``scopes`` (None: all, counted afresh)."""
        if scopes is None:
            statement = select(func.count()).select_from(_R).where(_R.c.imp == imp)
            return int(db.read(lambda conn: conn.execute(statement).scalar_one()))
        wanted = list(dict.fromkeys(scopes))

        def read(conn: Connection) -> list[tuple[str, Generation, int]]:
            counted = []
            for scope, generation in generations.generations(conn, imp, wanted).items():
                with self._lock:
                    cached = self._counts.get((imp, scope))
                if cached is not None and cached[0] == generation:
                    count = cached[1]
                else:
                    count = int(conn.execute(_SCOPE_COUNT, {"imp": imp, "scope": scope}).scalar_one())
                counted.append((scope, generation, count))
            return counted

        counted = db.read(read)  # one snapshot: each count is its generation's
        with self._lock:
            if len(self._counts) + len(counted) > MAX_CACHED_COUNTS:
                self._counts.clear()  # a bound, not a policy: counts are cheap to take again
            for scope, generation, count in counted:
                self._counts[(imp, scope)] = (generation, count)
        return sum(count for _, _, count in counted)
