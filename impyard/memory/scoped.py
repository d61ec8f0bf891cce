"""The session's view of the memory store (``ScopedMemory``): the only way a box's request reaches it.

It is built for one session (imp, the scope it writes, the scopes it reads, its channel): each of its
queries is filtered by ``imp = ? AND scope IN (reads)`` through its ``Reach``, and its writes always carry
the writes scope. No request names a scope, so no box can ask past its session. Each method hands its work
to the module of its aggregate: records and episodes (``lookups``, ``search``, ``moments``), constructs and
the slot (``constructs``, ``slot``), learned rules (``dispositions``), saved conversations
(``conversations``) and the night (``night``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.engine import Connection, RowMapping

from box.protocol.memory import (
    BOTH_KINDS,
    ConsolidateResult,
    ConstructKind,
    ConstructParams,
    DispositionView,
    EncodeParams,
    EpisodeView,
    LearnParams,
    LearnResult,
    RecordView,
    Restore,
    SlotEntry,
)
from impyard.memory import constructs, conversations, dispositions, lookups, moments, night, search, slot
from impyard.memory.cache import VectorCache
from impyard.memory.counts import RecordCounts
from impyard.memory.reach import Reach
from impyard.memory.records import record_view
from impyard.memory.scopes import SessionScopes
from impyard.storage.db import Database


class MemoryParts(Protocol):
    """What a session's view works with: the store's database (fenced per request, ``service``), its clock,
    and what it keeps across sessions (the vector cache, the record counts, the people rules are checked
    against). ``MemoryStore`` is one."""

    db: Database
    clock: Callable[[], datetime]
    cache: VectorCache
    counts: RecordCounts
    people: dispositions.KnownPeople


class ScopedMemory:
    """One session's memory: every query is filtered by its imp and read scopes, every write is in its
    writes scope. Built per session (``MemoryStore.scoped``); the service holds nothing else."""

    def __init__(self, store: MemoryParts, imp: str, scopes: SessionScopes, channel_id: str) -> None:
        self.store = store
        self.imp = imp
        self.scopes = scopes
        self.channel_id = channel_id
        self.reach = Reach(imp, scopes.reads)

    def count(self) -> int:
        """Mechanism 3: the records of every kind in the scopes this session reads."""
        return self.store.counts.count(self.store.db, self.imp, self.scopes.reads)

    # ------------------------------------------------------------ records and episodes

    def search(
        self,
        vector: Sequence[float],
        names: Sequence[str] = (),
        k: int = 10,
        kinds: Sequence[str] = BOTH_KINDS,
        episodes: int = 3,
        with_vectors: bool = False,
    ) -> list[RecordView]:
        """Mechanisms 14-17, 30: the ranked search over the scopes this session reads."""
        store = self.store
        return search.ranked(
            store.db, store.cache, store.clock(), self.reach, vector, names, k, kinds, episodes, with_vectors
        )

    def _read_views(
        self, rows_of: Callable[[Connection], list[RowMapping]], episodes: int, with_vectors: bool
    ) -> list[RecordView]:
        """Rows read in one snapshot, as views with their newest episodes."""
        now = self.store.clock()

        def read(conn: Connection) -> list[RecordView]:
            views = [record_view(r, now, with_vectors) for r in rows_of(conn)]
            return lookups.with_episodes(conn, self.reach, views, episodes)

        return self.store.db.read(read)

    def recent(
        self, k: int = 5, kinds: Sequence[str] = ("lived",), episodes: int = 3, with_vectors: bool = False
    ) -> list[RecordView]:
        """Mechanisms 32, 92, 115: the ``k`` most recently felt records of ``kinds``."""
        return self._read_views(
            lambda conn: lookups.newest(conn, self.reach, "kinds", k, kinds=list(kinds)),
            episodes,
            with_vectors,
        )

    def about(
        self,
        person: str,
        k: int = 6,
        exclude: Iterable[str] = (),
        kinds: Sequence[str] = BOTH_KINDS,
        episodes: int = 3,
        with_vectors: bool = False,
    ) -> list[RecordView]:
        """Mechanism 28 (aboutPerson): by or naming ``person``, strongest stored intensity first."""
        return self._read_views(
            lambda conn: lookups.about(conn, self.reach, person, k, exclude, kinds), episodes, with_vectors
        )

    def constructs(self, construct_kind: ConstructKind, k: int = 3, episodes: int = 0) -> list[RecordView]:
        """Mechanism 27 (ownOfKind): the ``k`` most recently felt constructs of one kind."""
        return self._read_views(
            lambda conn: lookups.newest(conn, self.reach, "construct", k, construct_kind=construct_kind),
            episodes,
            False,
        )

    def episodes(self, record_ids: Sequence[str], per_record: int = 3) -> list[EpisodeView]:
        """Each named record's newest episodes, newest first; a record outside the scopes gives nothing."""
        ids = list(dict.fromkeys(record_ids))
        newest = self.store.db.read(lambda conn: lookups.episodes_of(conn, self.reach, ids, per_record))
        return [episode for record_id in ids for episode in newest.get(record_id, [])]

    def encode(self, params: EncodeParams) -> tuple[str, str]:
        """Mechanisms 61-66: keep one moment, atomically: a new record or a join, its episode, the restores.

        A join names a record this session reads *and* writes (its writes scope), else it is refused
        (``MemoryDenied``) and nothing is written. Restores of records outside the read scopes are ignored.
        An episode of a message deleted meanwhile (``forget_message``) is refused (``MemoryForgotten``): the
        turn kept nothing of it, whichever of the two came first.
        """
        now = self.store.clock()
        return moments.encode(self.store.db, self.reach, self.scopes.writes, self.channel_id, params, now)

    def restore(self, items: Sequence[Restore]) -> int:
        """Re-feel records in this session's scopes; returns how many were (others are ignored)."""
        return moments.restore(self.store.db, self.reach, items, self.store.clock())

    # ------------------------------------------------------------ constructs and the slot (issue 14)

    def construct(self, params: ConstructParams) -> tuple[str, bool, str | None, list[SlotEntry]]:
        """Mechanisms 74-77, 81-86: form a construct in the writes scope (``constructs.construct``)."""
        now = self.store.clock()
        return constructs.construct(self.store.db, self.imp, self.scopes.writes, params, now)

    def slot(self) -> list[SlotEntry]:
        """Mechanisms 87-88: the writes scope's slot as loaded now, oldest activation first; what left it
        (a week unrefreshed, deleted, over size) is dropped from the stored slot."""
        return slot.load(self.store.db, self.imp, self.scopes.writes, self.store.clock())

    def slot_refresh(self, record_ids: Sequence[str]) -> list[SlotEntry]:
        """Mechanism 86: held constructs brought to mind again get activated now; other ids are ignored."""
        return slot.refresh(self.store.db, self.imp, self.scopes.writes, record_ids, self.store.clock())

    # ------------------------------------------------------------ dispositions (issue 14; per imp, every scope)

    def dispositions(self, k: int = 100, active_only: bool = False) -> list[DispositionView]:
        """Mechanisms 94, 98-99: the ``k`` strongest rules by |weight|; ``active_only`` leaves dormant ones out.
        Only rules the rule law keeps are served (``served_rules``, issue 32)."""
        return dispositions.served(self.store.db, self.store.people, self.imp, k, active_only)

    def learn(self, params: LearnParams) -> LearnResult:
        """Mechanisms 95-97 (``dispositions.learn``), after the rule law with what this channel taught."""
        return dispositions.learn(self.store.db, self.imp, self.channel_id, params, self.store.clock)

    # ------------------------------------------------------------ saved conversations

    def conversation_get(self, person: str) -> tuple[dict[str, Any] | None, datetime | None]:
        return conversations.get(self.store.db, self.reach, self.channel_id, person)

    def conversation_put(self, person: str, state: dict[str, Any]) -> None:
        """Save the conversation's state in the writes scope (``conversations.put``)."""
        conversations.put(
            self.store.db, self.imp, self.scopes.writes, self.channel_id, person, state, self.store.clock()
        )

    # ------------------------------------------------------------ the night (issue 15; the writes scope only)

    def night(self, since: datetime, k: int = 200, episodes: int = 6) -> list[RecordView]:
        """Mechanism 107: the writes scope's records since ``since``, newest first (``night.night_records``)."""
        return night.night_records(
            self.store.db, self.imp, self.scopes.writes, since, self.store.clock(), k, episodes
        )

    def consolidate(self, groups: Sequence[tuple[str, Sequence[str]]]) -> ConsolidateResult:
        """Mechanisms 108-111, 113: fold groups within the writes scope; every rule checked again here."""
        return night.consolidate_scope(self.store.db, self.imp, self.scopes.writes, groups)

    def forget(self) -> tuple[int, int]:
        """Mechanisms 112-113: the forgetting curve over the writes scope; returns (records, episodes)."""
        return night.forget_scope(self.store.db, self.imp, self.scopes.writes, self.store.clock())
