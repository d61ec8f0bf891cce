"""Fixtures for the host's memory store: a temp database, a fixed clock, a hashing embedder, a session."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import text

from box.protocol import memory as mem
from impyard.backends.base import BoxSpec
from impyard.clock import FixedClock
from impyard.memory.cache import VectorCache
from impyard.memory.scopes import SessionScopes
from impyard.memory.service import MemoryService
from impyard.memory.store import MemoryStore
from impyard.storage.db import Database

T0 = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)
IMP = "ana"
GUILD = SessionScopes("guild:G1", ("guild:G1",))
DM = SessionScopes("dm:p1", ("dm:p1", "guild:G1"))


def embed(text: str, dims: int = 64) -> list[float]:
    """The tests' hashing embedder: md5 buckets of lowercase word tokens, L2-normalised."""
    vector = [0.0] * dims
    for token in re.findall(r"\w+", text.lower()):
        vector[int(hashlib.md5(token.encode()).hexdigest(), 16) % dims] += 1.0
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm else vector


def axis(i: int, dims: int = 64) -> list[float]:
    """A unit vector along axis ``i``: cosines between axes are exactly 0 or 1."""
    return [1.0 if j == i else 0.0 for j in range(dims)]


def moment(
    conclusion: str,
    *,
    author: str = "Bob",
    author_id: str = "b1",
    valence: float = 0.5,
    intensity: float = 0.8,
    vector: list[float] | None = None,
    episode: str | None = None,
    episode_vector: list[float] | None = None,
    message_id: str | None = None,
    join: str | None = None,
    restore: list[mem.Restore] | None = None,
    kind: str = "lived",
    construct_kind: str | None = None,
) -> mem.EncodeParams:
    """An encode request as the box would send it; the record's vector defaults to embed(conclusion)."""
    text = episode or f"{author} said: {conclusion} / ana replied: I see."
    record = (
        None
        if join
        else mem.NewRecord(
            kind=kind,  # type: ignore[arg-type]
            construct_kind=construct_kind,  # type: ignore[arg-type]
            author=author,
            author_id=author_id,
            feeling="calm",
            conclusion=conclusion,
            valence=valence,
            intensity=intensity,
            vector=vector if vector is not None else embed(conclusion),
        )
    )
    return mem.EncodeParams(
        record=record,
        join=join,
        episode=mem.NewEpisode(
            author=author, author_id=author_id, message_id=message_id, as_happened=text, vector=episode_vector
        ),
        restore=restore or [],
    )


def rows(db: Database, sql: str, **params: object) -> list[dict[str, object]]:
    """A portable query's rows as dicts, on either engine (a read snapshot)."""
    return db.read(lambda conn: [dict(row) for row in conn.execute(text(sql), params).mappings()])


def one(db: Database, sql: str, **params: object) -> object:
    """A portable query's one value (``SELECT COUNT(*) …``)."""
    return db.read(lambda conn: conn.execute(text(sql), params).scalar_one())


def write(db: Database, sql: str, **params: object) -> None:
    """A portable statement, committed (a test's own setup or damage)."""
    db.write(lambda conn: conn.execute(text(sql), params))


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(T0)


@pytest.fixture
def mdb(tmp_path: Path, fresh_sqlite: Callable[[Path], Database]) -> Iterator[Database]:
    database = fresh_sqlite(tmp_path / "memory.db")
    yield database
    database.close()


@pytest.fixture
def cache() -> VectorCache:
    return VectorCache(64 * 1024 * 1024)


@pytest.fixture
def store(mdb: Database, clock: FixedClock, cache: VectorCache) -> MemoryStore:
    return MemoryStore(mdb, clock.now, cache)


@pytest.fixture
def service(store: MemoryStore) -> MemoryService:
    return MemoryService(store)


@pytest.fixture
def guild_box(service: MemoryService) -> BoxSpec:
    spec = BoxSpec(IMP, "g1", Path("/nonexistent"), run_id="run-guild")
    service.open(spec, GUILD)
    return spec


@pytest.fixture
def dm_box(service: MemoryService) -> BoxSpec:
    spec = BoxSpec(IMP, "d1", Path("/nonexistent"), run_id="run-dm")
    service.open(spec, DM)
    return spec
