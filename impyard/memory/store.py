"""The host's memory store (issue 23; docs/memory.md): records, episodes, conversations, in privacy scopes.

``MemoryStore`` is the front of the memory tables: it holds what lasts across sessions (the database, the
clock, the vector cache, the record counts, the people rules are checked against), hands each session its
view (``scoped``: ``ScopedMemory``, the only way a box's request reaches the store) and is the operator API
(``impyard memory …``: ``show``, ``search``, ``remember``, ``forget_person`` and its ``person_preview``,
``forget_record``, ``records_by_id``, ``forget_message``, ``count``,
``stats``…), which sees every scope, filtered by its optional arguments; its views say which scope each record
is in (``StoredRecord``). Each method hands its work to the module of its aggregate:

* ``records`` (rows, views, writes and deletes of records and episodes), ``lookups`` (reads within a
  ``reach``), ``search`` (the ranked search: the cache ranks, loading through ``cache_rows``), ``moments``
  (a moment encoded, records re-felt, a given record remembered);
* ``constructs`` and ``slot`` (issue 14), ``dispositions`` (learned rules and the rule law, issue 32),
  ``conversations`` (saved conversation state);
* ``night`` (folding and forgetting, issue 15), ``forgetting`` (a person, a message, an imp), ``copying``,
  ``stats``, ``counts``;
* ``generations`` (the lock every write of a scope takes first, and the version caches follow), ``reach``
  (the one scope filter), ``errors``.

The SQL is SQLAlchemy Core over ``impyard.storage.tables`` (docs/storage.md), the same on SQLite and PostgreSQL:
reads in ``db.read`` snapshots, writes in ``db.write`` functions that do database work only (PostgreSQL may run
one again; caches are touched only after it returns). Statements of a fixed shape are built once, with bind
parameters, so SQLAlchemy's compiled cache serves every turn (issue 18).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from sqlalchemy.engine import Connection

from box.protocol.memory import ConsolidateResult, DispositionView, RecordView, SlotEntry
from impyard.memory import (
    copying,
    dispositions,
    forgetting,
    generations,
    lookups,
    moments,
    night,
    search,
    slot,
    stats,
)
from impyard.memory.cache import DEFAULT_CACHE_BYTES, Generation, VectorCache
from impyard.memory.counts import RecordCounts
from impyard.memory.reach import Reach
from impyard.memory.records import record_view
from impyard.memory.scoped import ScopedMemory
from impyard.memory.scopes import SessionScopes
from impyard.memory.stats import MemoryStats
from impyard.storage.db import Database, Store
from impyard.storage.tables import memory_records

Clock = Callable[[], datetime]


class MemoryStore(Store):
    """The memory tables of the host database, with the vector cache that ranks them."""

    def __init__(self, db: Database, clock: Clock, cache: VectorCache | None = None) -> None:
        self.db = db
        self.clock = clock
        self.cache = cache if cache is not None else VectorCache(DEFAULT_CACHE_BYTES)
        self.counts = RecordCounts()
        self.people = dispositions.KnownPeople()  # issue 32: whom the rules served must not name

    def scoped(self, imp: str, scopes: SessionScopes, channel_id: str) -> ScopedMemory:
        """The session's view: the only way a box's request reaches the store."""
        return ScopedMemory(self, imp, scopes, channel_id)

    def generation(self, imp: str, scope: str) -> Generation:
        """The scope's generation: what the vector cache and the counts follow."""
        return self.db.read(lambda conn: generations.generation(conn, imp, scope))

    def count(self, imp: str, scopes: Sequence[str] | None = None) -> int:
        """Records of every kind of ``imp`` in ``scopes`` (None: all); kept per generation (``counts``)."""
        return self.counts.count(self.db, imp, scopes)

    # ------------------------------------------------------------ operator API (every scope)

    def show(
        self,
        imp: str,
        person: str | None = None,
        scope: str | None = None,
        limit: int = 50,
        episodes: int = 3,
    ) -> list[RecordView]:
        """``impyard memory show``: the most recently felt records, by or about ``person`` (a name or an id).

        Each is a ``StoredRecord``: the operator sees every scope, so each view says which it is in."""
        reach = Reach(imp, (scope,) if scope is not None else None)
        now = self.clock()

        def read(conn: Connection) -> list[RecordView]:
            if person is None:
                rows = lookups.newest(conn, reach, "any", limit)
            else:
                rows = lookups.about(conn, reach, person, limit)
                rows.sort(key=lambda r: (r["last_felt"], r["id"]), reverse=True)
            views = [record_view(r, now, False, operator=True) for r in rows]
            return lookups.with_episodes(conn, reach, views, episodes)

        return self.db.read(read)

    def search(
        self,
        imp: str,
        vector: Sequence[float],
        names: Sequence[str] = (),
        k: int = 10,
        scopes: Sequence[str] | None = None,
        episodes: int = 3,
    ) -> list[RecordView]:
        """``impyard memory search``: the plain search (top ``k``, no filter) over every scope, or ``scopes``;
        ``StoredRecord`` views, as ``show``'s."""
        reach = Reach(imp, tuple(scopes) if scopes is not None else None)
        return search.ranked(
            self.db, self.cache, self.clock(), reach, vector, names, k, episodes=episodes, operator=True
        )

    def remember(
        self,
        imp: str,
        scope: str,
        event: str,
        valence: float,
        intensity: float,
        age_hours: float = 0.0,
        vector: Sequence[float] | None = None,
        now: datetime | None = None,
    ) -> str:
        """``impyard memory remember`` (mechanism 115): a given record with one episode (``moments.remember``)."""
        return moments.remember(
            self.db, imp, scope, event, valence, intensity, age_hours, vector, now or self.clock()
        )

    def forget_person(self, imp: str, ids: Sequence[str], names: Sequence[str] = ()) -> forgetting.Forgotten:
        """Everything by or about a person, in every scope of ``imp`` (``forgetting.forget_person``)."""
        return forgetting.forget_person(self.db, imp, ids, names)

    def person_preview(self, imp: str, ids: Sequence[str], names: Sequence[str] = ()) -> forgetting.Forgotten:
        """What ``forget_person`` would take now, changing nothing (``forgetting.person_preview``)."""
        return forgetting.person_preview(self.db, imp, ids, names)

    def records_by_id(
        self, imp: str, id_or_prefix: str, scope: str | None = None, limit: int = 2, episodes: int = 10
    ) -> list[RecordView]:
        """``impyard memory forget --record``, the console: the records of ``imp`` (in ``scope``, when given)
        whose id is ``id_or_prefix`` or starts with it, at most ``limit``; ``StoredRecord`` views."""
        if not id_or_prefix or not all(ch in "0123456789abcdef" for ch in id_or_prefix):
            return []  # ids are uuid4 hex: anything else names no record (and no LIKE pattern is made of it)
        reach = Reach(imp, (scope,) if scope is not None else None)
        now = self.clock()

        def read(conn: Connection) -> list[RecordView]:
            rows = lookups.records(
                conn,
                reach,
                memory_records.c.id.like(f"{id_or_prefix}%"),
                order=(memory_records.c.id,),
                limit=limit,
            )
            views = [record_view(r, now, False, operator=True) for r in rows]
            return lookups.with_episodes(conn, reach, views, episodes)

        return self.db.read(read)

    def forget_record(self, imp: str, scope: str, record_id: str) -> dict[str, int]:
        """One record of ``imp`` in ``scope`` with its episodes (``forgetting.forget_record``)."""
        return forgetting.forget_record(self.db, imp, scope, record_id)

    def forget_message(self, channel_id: str, message_id: str) -> dict[str, int]:
        """A deleted message: its episodes, for every imp, and its mark (``forgetting.forget_message``)."""
        return forgetting.forget_message(self.db, channel_id, message_id, self.clock())

    def forget_imp(self, imp: str) -> dict[str, int]:
        """Everything the imp remembers, in every scope (``forgetting.forget_imp``; mechanism 118)."""
        return forgetting.forget_imp(self.db, imp)

    def rules(self, imp: str, limit: int | None = None) -> list[DispositionView]:
        """``impyard memory rules``: what ``imp`` has learned, strongest |weight| first (dormant ones too)."""
        return self.db.read(lambda conn: dispositions.rules(conn, imp, limit, active_only=False))

    def slot_view(self, imp: str, scope: str | None = None) -> list[tuple[str, SlotEntry]]:
        """``impyard memory slot``: what ``imp`` holds in mind in each scope (or ``scope``), read only."""
        return slot.view(self.db, imp, scope, self.clock())

    def has_memory(self, imp: str) -> bool:
        """Whether ``imp`` keeps anything at all: a record, an episode, a conversation, a rule or a slot."""
        return self.db.read(lambda conn: copying.keeps_anything(conn, imp))

    def copy_imp(self, src: str, new: str) -> dict[str, int]:
        """``impyard memory copy`` (mechanism 118): everything ``src`` remembers, into an empty ``new``."""
        return copying.copy_imp(self.db, src, new)

    def stats(self, imp: str) -> MemoryStats:
        """``impyard memory stats``: per scope counts, the learned rules, the clock, the database's size."""
        return stats.gather(self.db, imp)

    # ------------------------------------------------------------ the night (issue 15: mechanisms 107-114)

    def night_records(
        self, imp: str, scope: str, since: datetime, k: int = 200, episodes: int = 6
    ) -> list[RecordView]:
        """Mechanism 107: ``scope``'s records since ``since``, newest first (``night.night_records``)."""
        return night.night_records(self.db, imp, scope, since, self.clock(), k, episodes)

    def consolidate_scope(
        self, imp: str, scope: str, groups: Sequence[tuple[str, Sequence[str]]]
    ) -> ConsolidateResult:
        """Mechanisms 108-111, 113: fold groups within ``scope`` (``night.consolidate_scope``)."""
        return night.consolidate_scope(self.db, imp, scope, groups)

    def forget_scope(self, imp: str, scope: str) -> tuple[int, int]:
        """Mechanisms 112-113: the forgetting curve over ``scope`` at the store's now (``night.forget_scope``)."""
        return night.forget_scope(self.db, imp, scope, self.clock())

    def scopes_lived_in(self, imp: str, since: datetime | None = None) -> list[str]:
        """The scopes of ``imp`` holding records (that happened at or after ``since``), the one with the
        newest such record first: where a night has something to fold or forget."""
        return self.db.read(lambda conn: night.scopes_by_newest(conn, imp, since))
