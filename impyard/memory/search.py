"""The ranked search (mechanisms 14-17, 30): the cache ranks a reach's records, then they are read back
through the reach again.

One way: the scopes' generations are read in one snapshot, the cache ranks (loading what it lacks through
``CacheRows``), and the ranked records are read by id within the reach, with their best-matching episodes
first (``lookups.with_episodes``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.engine import Connection

from box.protocol.memory import BOTH_KINDS, RecordView
from impyard.memory import generations, lookups
from impyard.memory.cache import Generation, Hit, VectorCache
from impyard.memory.cache_rows import CacheRows
from impyard.memory.reach import Reach
from impyard.memory.records import record_view
from impyard.storage.db import Database


def _hit_first(hit: Hit) -> tuple[str, ...]:
    """A hit's best-matching episodes with its hit episode first (mechanism 16)."""
    if hit.hit_episode is None:
        return hit.matched
    return (hit.hit_episode, *(e for e in hit.matched if e != hit.hit_episode))


def ranked(
    db: Database,
    cache: VectorCache,
    now: datetime,
    reach: Reach,
    vector: Sequence[float],
    names: Sequence[str],
    k: int,
    kinds: Sequence[str] = BOTH_KINDS,
    episodes: int = 3,
    with_vectors: bool = False,
    operator: bool = False,
) -> list[RecordView]:
    """The top ``k`` records within ``reach`` for ``vector`` and ``names``, each with ``episodes`` episodes;
    ``operator``: ``StoredRecord`` views (each says its scope)."""

    def scopes_generations(conn: Connection) -> dict[str, Generation]:
        scopes = reach.scopes if reach.scopes is not None else generations.scopes_of(conn, reach.imp)
        return generations.generations(conn, reach.imp, scopes)

    seen = db.read(scopes_generations)  # every scope's generation in one read: the cache checks them
    ranked: list[Hit] = cache.search(
        CacheRows(db, reach.imp, seen), reach.imp, tuple(seen), vector, names, k, kinds, now.timestamp(),
        per_record=episodes,
    )  # fmt: skip
    if not ranked:
        return []

    def read(conn: Connection) -> list[RecordView]:
        rows = {r["id"]: r for r in lookups.records_by_id(conn, reach, [h.record_id for h in ranked])}
        views: list[RecordView] = []
        for hit in ranked:
            row = rows.get(hit.record_id)
            if row is None:  # deleted since the cache saw it, or (never) outside the reach
                continue
            view = record_view(row, now, with_vectors, operator=operator)
            view.score = hit.score
            view.hit_episode = hit.hit_episode
            views.append(view)
        matched = {h.record_id: _hit_first(h) for h in ranked}
        return lookups.with_episodes(conn, reach, views, episodes, matched)

    return db.read(read)
