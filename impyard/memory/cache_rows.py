"""What the vector cache loads (its ``Loader``): a scope's vector rows, all or those written since a generation.

The cache calls this, never the store: a recall walks one way, ``search`` → ``cache`` → ``cache_rows``
(→ the database), and the ranked ids go back up to ``search``, which reads the rows through the reach.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection

from impyard.clock import parse_iso
from impyard.memory import generations
from impyard.memory.cache import EpisodeRows, Generation, Loader, RecordRows
from impyard.storage.db import Database
from impyard.storage.tables import memory_episodes as _E
from impyard.storage.tables import memory_records as _R


def _loader_rows(since: bool) -> tuple[Any, Any]:
    """The cache loader's two reads: every vector row of (imp, scope, dims), or those written after ``since``."""
    records = select(
        _R.c.id, _R.c.kind, _R.c.valence, _R.c.intensity, _R.c.last_felt, _R.c.conclusion, _R.c.vector,
        _R.c.statement,
    ).where(
        _R.c.imp == bindparam("imp"), _R.c.scope == bindparam("scope"), _R.c.dims == bindparam("dims"),
        _R.c.vector.is_not(None), *([_R.c.gen > bindparam("since")] if since else []),
    )  # fmt: skip
    episodes = select(_E.c.id, _E.c.record_id, _E.c.as_happened, _E.c.vector).where(
        _E.c.imp == bindparam("imp"), _E.c.scope == bindparam("scope"), _E.c.dims == bindparam("dims"),
        _E.c.vector.is_not(None), *([_E.c.gen > bindparam("since")] if since else []),
    )  # fmt: skip
    return records, episodes


_LOADER_ROWS = {since: _loader_rows(since) for since in (False, True)}


class CacheRows(Loader):
    """The cache's loader over the host database. ``seen``: the generations one search already read for
    ``imp`` (one read, not one per scope); any other is read when the cache asks."""

    def __init__(self, db: Database, imp: str = "", seen: Mapping[str, Generation] | None = None) -> None:
        self.db, self.imp, self.seen = db, imp, dict(seen or {})

    def generation(self, imp: str, scope: str) -> Generation:
        found = self.seen.get(scope) if imp == self.imp else None
        if found is not None:
            return found
        return self.db.read(lambda conn: generations.generation(conn, imp, scope))

    def rows(self, imp: str, scope: str, dims: int, since: int | None) -> tuple[RecordRows, EpisodeRows]:
        record_sql, episode_sql = _LOADER_ROWS[since is not None]
        params = {"imp": imp, "scope": scope, "dims": dims, "since": since}

        def read(conn: Connection) -> tuple[RecordRows, EpisodeRows]:
            records = RecordRows()
            for row in conn.execute(record_sql, params):
                records.ids.append(row[0])
                records.construct.append(row[1] == "construct")
                records.valence.append(float(row[2]))
                records.intensity.append(float(row[3]))
                records.last_felt_s.append(parse_iso(row[4]).timestamp())
                records.texts.append(f"{row[7]} {row[5]}" if row[7] else str(row[5]))  # as written (issue 32)
                records.blobs.append(bytes(row[6]))
            episodes = EpisodeRows()
            for row in conn.execute(episode_sql, params):
                episodes.ids.append(row[0])
                episodes.record_ids.append(row[1])
                episodes.texts.append(str(row[2]))  # as written: a name is matched as a name (issue 32)
                episodes.blobs.append(bytes(row[3]))
            return records, episodes

        return self.db.read(read)
