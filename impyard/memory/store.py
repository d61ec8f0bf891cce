"""The host's memory store (issue 23; docs/memory.md): records, episodes, conversations, in privacy scopes.

Records and episodes are separate tables (mechanism 116): an episode belongs to exactly one record, and a
record has no event of its own; its valence is written once and never updated (117). Fading happens at
read time with ``box.memory.laws`` on the host's clock (67, 122); re-feeling writes the faded strength
restored toward the new one, and ``last_felt = now`` always (69, 70).

**Every read and write for a box goes through ``ScopedMemory``**: it is built for one session (imp,
the scope it writes, the scopes it reads, its channel) and each of its queries is filtered by
``imp = ? AND scope IN (reads)`` through ``_Reach``, the one place that clause is made; its writes
always carry the writes scope. No request names a scope, so no box can ask past its session.
The operator API on ``MemoryStore`` (``show``, ``search``, ``remember``, ``forget_person``,
``forget_message``, ``count``) sees every scope, filtered by its optional arguments; its views say which scope
each record is in (``StoredRecord``). Forgetting a person matches ids and exact author names, and mentions
only of names that are not too short or too common (``mentions_are_forgettable``: "the" would name everyone).
Forgetting a message leaves a mark for a week, so a turn that was still running keeps nothing of it.

The record text that names are matched against (mechanism 15, ``mention_text``): the conclusion for a
lived record; for a construct its statement and its conclusion (the statement is what it believes, decides
or wants, mechanism 83: "I believe: <statement>").

Constructs, the slot and dispositions (issue 14; ``ScopedMemory.construct``, ``slot``, ``slot_refresh``,
``dispositions``, ``learn``): a construct is formed in the session's writes scope and compared only with the
constructs of its own kind there (75, 82); the slot is kept per imp **and scope** (``memory_slots``) and
changed only through the pure law of ``box.memory.slot`` (84-88); learned rules are per imp, shared by
every scope, and name no one (90-98).

The SQL is kept portable, for PostgreSQL later (docs/architecture.md, "State"): uuid4-hex ids, ISO-8601 UTC text times, no SQLite-only
functions; ``LIKE`` is only a prefilter (both sides lowercased in Python) before a whole-word check.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import unicodedata
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar, Literal

import numpy as np

from box.memory import laws
from box.memory import slot as slot_law
from box.protocol.memory import (
    BOTH_KINDS,
    MAX_CONCLUSION_CHARS,
    MAX_CONVERSATION_STATE_BYTES,
    MAX_RULE_CHARS,
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
from impyard.clock import iso, parse_iso
from impyard.db import Database, Store
from impyard.errors import ImpyardError
from impyard.memory.cache import (
    DEFAULT_CACHE_BYTES,
    EpisodeRows,
    Generation,
    Hit,
    Loader,
    RecordRows,
    VectorCache,
)
from impyard.memory.scopes import SessionScopes, dm_scope
from impyard.memory.vectors import normalised, pack, unpack, unpack_many

Clock = Callable[[], datetime]
SELF = "Self"  # the author of a given record (mechanism 115)
_WORD = re.compile(r"\w+")

_RECORD_COLUMNS = (
    "id, kind, construct_kind, origin, author, author_id, feeling, conclusion, valence, intensity,"
    " happened_at, last_felt, dims, vector, scope, gen, statement"
)
_EPISODE_COLUMNS = "id, record_id, author, author_id, message_id, as_happened, told, channel_id, happened_at"


class MemoryStoreError(ImpyardError):
    """Base of the store's refusals."""


class MemoryDenied(MemoryStoreError):
    """A request names a record outside the session's scopes (the box is answered DENIED)."""

    rule = "memory-scopes"


class MemoryForgotten(MemoryDenied):
    """An episode of a message deleted on its surface, its turn still running then (answered DENIED)."""

    rule = "memory-forgotten"


class MemoryInvalid(MemoryStoreError, ValueError):
    """A request the store cannot take (too large, malformed); the box is answered INVALID_PARAMS."""


def new_id() -> str:
    return uuid.uuid4().hex


def record_text(conclusion: str, statement: str | None = None) -> str:
    """The lowercased text a record's names are matched in (see the module doc)."""
    return (f"{statement} {conclusion}" if statement else conclusion).lower()


def _row_text(row: sqlite3.Row) -> str:
    """A row's text for a whole-word name check: its conclusion, after a construct's statement."""
    statement = row["statement"]
    return f"{statement} {row['conclusion']}" if statement else str(row["conclusion"])


def clean_rule(rule: str) -> str:
    """A learned rule as kept: control characters out, whitespace runs made one space, at most
    ``MAX_RULE_CHARS``; refuses a rule left empty."""
    text = "".join(" " if unicodedata.category(ch) == "Cc" else ch for ch in rule)
    text = " ".join(text.split())[:MAX_RULE_CHARS].strip()
    if not text:
        raise MemoryInvalid("a learned rule needs some text")
    return text


def _disposition(row: sqlite3.Row) -> DispositionView:
    return DispositionView(
        id=row["id"], rule=row["rule"], weight=float(row["weight"]), count=int(row["count"]),
        updated_at=parse_iso(row["updated_at"]),
    )  # fmt: skip


def _dispositions(
    conn: sqlite3.Connection, imp: str, limit: int | None, *, active_only: bool
) -> list[DispositionView]:
    """Mechanisms 94, 98-99: the imp's rules, strongest |weight| first (ties: the most recently learned);
    ``active_only``: only |weight| above ``laws.DORMANT_WEIGHT``."""
    active = " AND abs(weight) > ?" if active_only else ""
    rows = conn.execute(
        f"SELECT {_DISPOSITION_COLUMNS} FROM memory_dispositions WHERE imp = ?{active}"
        " ORDER BY abs(weight) DESC, updated_at DESC, created_at DESC, id"
        + ("" if limit is None else f" LIMIT {int(limit)}"),
        [imp, *([laws.DORMANT_WEIGHT] if active_only else [])],
    ).fetchall()
    return [_disposition(row) for row in rows]


def _marks(values: Sequence[object]) -> str:
    """``?, ?, …`` for an ``IN (…)``; a never-true ``NULL`` for none (``x IN (NULL)`` matches no row)."""
    return ", ".join("?" for _ in values) or "NULL"


def like_pattern(name: str) -> str:
    """A ``LIKE … ESCAPE '\\'`` pattern finding ``name`` anywhere, its % and _ taken literally."""
    escaped = name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


MAX_CACHED_COUNTS = 10_000  # (imp, scope) totals kept between writes
MAX_RULES = 1_000  # learned rules kept per imp: past it the weakest goes (dormant first, then oldest)
MAX_CONVERSATIONS_PER_CHANNEL = (
    200  # people whose conversation state a channel keeps (the most recently saved)
)
_DISPOSITION_COLUMNS = "id, rule, weight, count, created_at, updated_at"
FORGOTTEN_MESSAGE_KEEP = timedelta(days=7)  # a deleted message's mark outlives any turn that could still end


def mentions_are_forgettable(name: str) -> bool:
    """Whether ``forget_person`` takes the records and episodes that merely mention ``name``.

    Only when a word of it has at least 3 letters and is not a common word: forgetting everyone who wrote
    "the", "I" or "Al" would take unrelated memories with them. Authorship under such a name still counts.
    """
    return any(
        sum(ch.isalpha() for ch in word) >= laws.NAME_MIN_LETTERS and word not in laws.STOP_WORDS
        for word in _WORD.findall(name.casefold())
    )


class StoredRecord(RecordView):
    """A record as the operator sees it: with its scope (a box's views leave it out: it knows its own)."""

    scope: str


@dataclass(frozen=True)
class Forgotten:
    """What ``forget_person`` took, and how: by one of the person's ids, or only by a name."""

    records: int = 0  # records matched, and records left without an episode
    episodes: int = 0  # episodes matched, and the episodes of records taken
    conversations: int = 0
    by_id: int = 0  # records and episodes written under one of the ids
    by_name: int = 0  # records and episodes written under one of the names, or naming one (whole word)
    mentions_of: tuple[str, ...] = ()  # the names whose mentions were matched
    author_only: tuple[str, ...] = ()  # names too short or too common: matched only as who wrote it


@dataclass(frozen=True)
class _Person:
    """Whom ``forget_person`` matches a record or an episode against."""

    ids: tuple[str, ...]
    names: tuple[str, ...]
    mentioned: tuple[str, ...]  # the names whose whole-word mentions count

    def match(self, author_id: str | None, author: str, text: str) -> Literal["id", "name"] | None:
        """How a record or an episode is theirs: "id", "name", or None (neither theirs nor about them)."""
        if author_id is not None and author_id in self.ids:
            return "id"
        if author in self.names or laws.mentions(text, self.mentioned):
            return "name"
        return None


@dataclass(frozen=True)
class _Reach:
    """Whose memories a query may touch: one imp, and its scopes (None: every scope — the operator only)."""

    imp: str
    scopes: tuple[str, ...] | None

    def clause(self, alias: str = "") -> tuple[str, list[Any]]:
        prefix = f"{alias}." if alias else ""
        if self.scopes is None:
            return f"{prefix}imp = ?", [self.imp]
        if not self.scopes:
            return "1 = 0", []
        marks = ", ".join("?" for _ in self.scopes)
        return f"{prefix}imp = ? AND {prefix}scope IN ({marks})", [self.imp, *self.scopes]


# ------------------------------------------------------------------ the night's rules (pure; issue 15)

_CHUNK = 500  # ids in one IN (…), rows in one batch read while copying
# Records forgotten per transaction: short enough not to hold the database long from other writers, large
# enough that the pages a batch dirties are written a few times, not once per record.
_FORGET_BATCH = 2000
# Every table holding an imp's memory (``has_memory``, ``copy_imp``'s refusal).
_IMP_TABLES = (
    "memory_records",
    "memory_episodes",
    "memory_conversations",
    "memory_slots",
    "memory_dispositions",
)


def protected(kind: str, origin: str) -> bool:
    """Mechanism 113: constructs and given records are never absorbed and never forgotten."""
    return kind == "construct" or origin == "given"


def anchor_refusal(
    kind: str, origin: str, intensity: float, params: laws.Params = laws.DEFAULTS
) -> str | None:
    """Mechanisms 108, 113 (subtle point 16): why a record cannot anchor a group, or None when it can: it
    must not be a construct and its stored intensity must be at least ``anchor_minimum`` (a given record
    may anchor)."""
    if kind == "construct":
        return "a construct"
    if intensity < params.anchor_minimum:
        return f"weaker than {params.anchor_minimum:g}"
    return None


def member_refusal(
    record_id: str,
    kind: str,
    origin: str,
    intensity: float,
    *,
    anchor: str,
    anchor_intensity: float,
    absorbed: set[str] | frozenset[str] = frozenset(),
) -> str | None:
    """Mechanisms 108, 113 (subtle point 16): why a record cannot be folded into ``anchor``, or None: it
    must not be protected, must not be the anchor, must not be stronger (stored intensity) than the anchor
    and must not have been absorbed already."""
    if protected(kind, origin):
        return "protected"
    if record_id == anchor:
        return "the anchor itself"
    if intensity > anchor_intensity:
        return "stronger than the anchor"
    if record_id in absorbed:
        return "absorbed already"
    return None


def combined_intensity(intensities: Iterable[float]) -> float:
    """Mechanism 110: 1 − Π(1 − I) over the anchor and its members (within 0 and 1)."""
    left = 1.0
    for intensity in intensities:
        left *= 1.0 - min(1.0, max(0.0, intensity))
    return 1.0 - left


def forgets(
    kind: str,
    origin: str,
    intensity: float,
    last_felt: datetime,
    now: datetime,
    params: laws.Params = laws.DEFAULTS,
) -> bool:
    """Mechanisms 112-113 (subtle points 6, 17): whether sleep deletes a record: its **stored** intensity is
    below the threshold for its age since it was last felt; protected records never are."""
    if protected(kind, origin):
        return False
    age_days = (now - last_felt).total_seconds() / laws.DAY_S
    return intensity < laws.forgetting_threshold(age_days, params)


def _chunks(ids: Sequence[str]) -> Iterator[list[str]]:
    """``ids`` in lists of ``_CHUNK``: one ``IN (…)`` each, well under any SQLite's bound on variables."""
    for start in range(0, len(ids), _CHUNK):
        yield list(ids[start : start + _CHUNK])


def _renamed(value: Any, ids: set[str], copied: Callable[[str], str]) -> Any:
    """A saved conversation's JSON with every string that is one of ``ids`` made its copy's id."""
    if isinstance(value, str):
        return copied(value) if value in ids else value
    if isinstance(value, list):
        return [_renamed(item, ids, copied) for item in value]
    if isinstance(value, dict):
        return {key: _renamed(item, ids, copied) for key, item in value.items()}
    return value


def _when(text: str | None) -> datetime | None:
    return parse_iso(text) if text else None


_SCOPE_COUNTS = ("records", "episodes", "constructs", "given", "conversations", "slot")


@dataclass(frozen=True)
class ScopeStats:
    """One scope of an imp's memory, counted (``MemoryStore.stats``)."""

    scope: str
    records: int = 0
    episodes: int = 0
    constructs: int = 0
    given: int = 0
    conversations: int = 0
    slot: int = 0


@dataclass(frozen=True)
class Wakefulness:
    """The imp's day as the supervisor's clock keeps it (``memory_wakefulness``; mechanisms 104-107)."""

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
    clock: Wakefulness | None  # None: the supervisor's clock has not seen the imp yet
    database_bytes: int


# ------------------------------------------------------------------ the store


class MemoryStore(Store, Loader):
    """The memory tables of the host database, with the vector cache that ranks them."""

    def __init__(self, db: Database, clock: Clock, cache: VectorCache | None = None) -> None:
        self.db = db
        self.clock = clock
        self.cache = cache if cache is not None else VectorCache(DEFAULT_CACHE_BYTES)
        self._counts: dict[
            tuple[str, str], tuple[Generation, int]
        ] = {}  # (imp, scope) -> (generation, count)
        self._counts_lock = threading.Lock()

    def scoped(self, imp: str, scopes: SessionScopes, channel_id: str) -> ScopedMemory:
        """The session's view: the only way a box's request reaches the store."""
        return ScopedMemory(self, imp, scopes, channel_id)

    # ------------------------------------------------------------ the cache's loader

    def generation(self, imp: str, scope: str) -> Generation:
        row = (
            self.db.connection()
            .execute(
                "SELECT version, deletes FROM memory_generations WHERE imp = ? AND scope = ?", (imp, scope)
            )
            .fetchone()
        )
        return Generation(int(row[0]), int(row[1])) if row else Generation()

    def rows(self, imp: str, scope: str, dims: int, since: int | None) -> tuple[RecordRows, EpisodeRows]:
        conn = self.db.connection()
        after = "" if since is None else " AND gen > ?"
        args: list[Any] = [imp, scope, dims] + ([] if since is None else [since])
        records = RecordRows()
        for row in conn.execute(
            "SELECT id, kind, valence, intensity, last_felt, mention_text, vector FROM memory_records"
            " WHERE imp = ? AND scope = ? AND dims = ? AND vector IS NOT NULL" + after,
            args,
        ):
            records.ids.append(row[0])
            records.construct.append(row[1] == "construct")
            records.valence.append(float(row[2]))
            records.intensity.append(float(row[3]))
            records.last_felt_s.append(parse_iso(row[4]).timestamp())
            records.texts.append(row[5])
            records.blobs.append(row[6])
        episodes = EpisodeRows()
        for row in conn.execute(
            "SELECT id, record_id, as_happened, vector FROM memory_episodes"
            " WHERE imp = ? AND scope = ? AND dims = ? AND vector IS NOT NULL" + after,
            args,
        ):
            episodes.ids.append(row[0])
            episodes.record_ids.append(row[1])
            episodes.texts.append(str(row[2]).lower())
            episodes.blobs.append(row[3])
        return records, episodes

    # ------------------------------------------------------------ shared by the scoped view and the operator

    def _bump(self, conn: sqlite3.Connection, imp: str, scope: str, *, deleted: bool = False) -> int:
        """The scope's next generation (inside the caller's write transaction)."""
        conn.execute(
            "INSERT INTO memory_generations (imp, scope, version, deletes) VALUES (?, ?, 0, 0)"
            " ON CONFLICT (imp, scope) DO NOTHING",
            (imp, scope),
        )
        conn.execute(
            "UPDATE memory_generations SET version = version + 1, deletes = deletes + ?"
            " WHERE imp = ? AND scope = ?",
            (1 if deleted else 0, imp, scope),
        )
        row = conn.execute(
            "SELECT version FROM memory_generations WHERE imp = ? AND scope = ?", (imp, scope)
        ).fetchone()
        return int(row[0])

    def _scopes_of(self, imp: str) -> list[str]:
        rows = (
            self.db.connection()
            .execute("SELECT scope FROM memory_generations WHERE imp = ? ORDER BY scope", (imp,))
            .fetchall()
        )
        return [str(r[0]) for r in rows]

    def _view(
        self, row: sqlite3.Row, now: datetime, with_vector: bool, *, operator: bool = False
    ) -> RecordView:
        """The row as a box sees it; for the operator (``operator``), a ``StoredRecord`` with its scope."""
        last_felt = parse_iso(row["last_felt"])
        valence, intensity = float(row["valence"]), float(row["intensity"])
        vector = unpack(int(row["dims"]), row["vector"]).tolist() if with_vector and row["vector"] else None
        fields: dict[str, Any] = dict(
            id=row["id"],
            kind=row["kind"],
            construct_kind=row["construct_kind"],
            origin=row["origin"],
            author=row["author"],
            author_id=row["author_id"],
            feeling=row["feeling"],
            conclusion=row["conclusion"],
            valence=valence,
            intensity=intensity,
            felt=laws.felt_strength(intensity, valence, last_felt, now),  # mechanism 67, at the host's now
            happened_at=parse_iso(row["happened_at"]),
            last_felt=last_felt,
            statement=row["statement"],
            vector=vector,
        )
        return StoredRecord(scope=row["scope"], **fields) if operator else RecordView(**fields)

    @staticmethod
    def _episode(row: sqlite3.Row) -> EpisodeView:
        return EpisodeView(
            id=row["id"],
            record_id=row["record_id"],
            author=row["author"],
            author_id=row["author_id"],
            message_id=row["message_id"],
            as_happened=row["as_happened"],
            told=row["told"],
            channel_id=row["channel_id"],
            happened_at=parse_iso(row["happened_at"]),
        )

    def _records(
        self,
        reach: _Reach,
        where: str = "",
        args: Sequence[Any] = (),
        order: str = "last_felt DESC, gen DESC",
        limit: int | None = None,
    ) -> Iterable[sqlite3.Row]:
        """Record rows within ``reach`` (the one scope filter), with an extra condition and order."""
        clause, reach_args = reach.clause()
        sql = f"SELECT {_RECORD_COLUMNS} FROM memory_records WHERE {clause}"
        if where:
            sql += f" AND ({where})"
        sql += f" ORDER BY {order}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return self.db.connection().execute(sql, [*reach_args, *args])

    def _newest(self, reach: _Reach, where: str, args: Sequence[Any], k: int) -> list[sqlite3.Row]:
        """The ``k`` most recently felt records within ``reach``: one indexed query per scope, merged."""
        scopes = reach.scopes if reach.scopes is not None else tuple(self._scopes_of(reach.imp))
        rows: list[sqlite3.Row] = []
        for scope in scopes:
            rows.extend(self._records(_Reach(reach.imp, (scope,)), where, args, limit=k))
        rows.sort(key=lambda r: (r["last_felt"], r["gen"]), reverse=True)
        return rows[:k]

    def _records_by_id(self, reach: _Reach, ids: Sequence[str]) -> list[sqlite3.Row]:
        """The rows of ``ids`` within ``reach`` (the ids are looked up first: a scope scan would be slow)."""
        if not ids:
            return []
        clause, args = reach.clause("r")
        marks = ", ".join("?" for _ in ids)
        return (
            self.db.connection()
            .execute(
                f"SELECT {_RECORD_COLUMNS} FROM (SELECT * FROM memory_records WHERE id IN ({marks})"
                f" LIMIT {len(ids)}) AS r WHERE {clause}",
                [*ids, *args],
            )
            .fetchall()
        )

    def _episodes_of(self, reach: _Reach, record_id: str, limit: int) -> list[EpisodeView]:
        """The record's newest ``limit`` episodes, newest first (mechanism 116)."""
        if limit <= 0:
            return []
        clause, args = reach.clause()
        rows = (
            self.db.connection()
            .execute(
                f"SELECT {_EPISODE_COLUMNS} FROM memory_episodes WHERE record_id = ? AND {clause}"
                f" ORDER BY happened_at DESC, gen DESC, id LIMIT {int(limit)}",
                [record_id, *args],
            )
            .fetchall()
        )
        return [self._episode(r) for r in rows]

    def _episode_by_id(self, reach: _Reach, episode_id: str) -> EpisodeView | None:
        clause, args = reach.clause()
        row = (
            self.db.connection()
            .execute(
                f"SELECT {_EPISODE_COLUMNS} FROM memory_episodes WHERE id = ? AND {clause}",
                [episode_id, *args],
            )
            .fetchone()
        )
        return self._episode(row) if row else None

    def _with_episodes(
        self,
        reach: _Reach,
        views: list[RecordView],
        per_record: int,
        hits: dict[str, str | None] | None = None,
    ) -> list[RecordView]:
        """Load each record's newest episodes; a search's hit episode goes first (mechanisms 16, 116)."""
        for view in views:
            if per_record <= 0:
                continue
            episodes = self._episodes_of(reach, view.id, per_record)
            hit_id = (hits or {}).get(view.id)
            if hit_id is not None:
                hit = next((e for e in episodes if e.id == hit_id), None) or self._episode_by_id(
                    reach, hit_id
                )
                if hit is not None:
                    episodes = [hit, *(e for e in episodes if e.id != hit_id)]
            view.episodes = episodes
        return views

    def _search(
        self,
        reach: _Reach,
        vector: Sequence[float],
        names: Sequence[str],
        k: int,
        kinds: Sequence[str] = BOTH_KINDS,
        episodes: int = 3,
        with_vectors: bool = False,
        operator: bool = False,
    ) -> list[RecordView]:
        """Mechanisms 14-17, 30: the cache ranks, then the rows are read back through ``reach`` again."""
        now = self.clock()
        scopes = reach.scopes if reach.scopes is not None else tuple(self._scopes_of(reach.imp))
        ranked: list[Hit] = self.cache.search(
            self, reach.imp, scopes, vector, names, k, kinds, now.timestamp()
        )
        if not ranked:
            return []
        rows = {r["id"]: r for r in self._records_by_id(reach, [h.record_id for h in ranked])}
        views: list[RecordView] = []
        for hit in ranked:
            row = rows.get(hit.record_id)
            if row is None:  # deleted since the cache saw it, or (never) outside the reach
                continue
            view = self._view(row, now, with_vectors, operator=operator)
            view.score = hit.score
            view.hit_episode = hit.hit_episode
            views.append(view)
        return self._with_episodes(reach, views, episodes, {h.record_id: h.hit_episode for h in ranked})

    def _about(
        self,
        reach: _Reach,
        person: str,
        k: int,
        exclude: Iterable[str] = (),
        kinds: Sequence[str] = BOTH_KINDS,
    ) -> list[sqlite3.Row]:
        """Records authored by ``person`` (exact name or id) or naming them, strongest stored intensity first."""
        excluded = set(exclude)
        kind_marks = ", ".join("?" for _ in kinds)
        found: list[sqlite3.Row] = []
        cursor = self._records(
            reach,
            f"kind IN ({kind_marks}) AND (author = ? OR author_id = ? OR mention_text LIKE ? ESCAPE '\\')",
            [*kinds, person, person, like_pattern(person.strip().lower())],
            order="intensity DESC, last_felt DESC, id",
        )
        for row in cursor:
            if row["id"] in excluded:
                continue
            if (
                row["author"] == person
                or row["author_id"] == person
                or laws.mentions(_row_text(row), [person])
            ):
                found.append(row)
                if len(found) >= k:
                    break
        return found

    def _refeel(
        self,
        conn: sqlite3.Connection,
        reach: _Reach,
        items: Sequence[Restore],
        now: datetime,
        gens: dict[str, int],
    ) -> int:
        """Mechanisms 65, 66, 69, 70: each named record in reach re-felt at ``now``; others ignored, not counted."""
        clause, args = reach.clause()
        restored = 0
        for item in items:
            row = conn.execute(
                f"SELECT intensity, valence, last_felt, scope FROM memory_records WHERE id = ? AND {clause}",
                [item.record_id, *args],
            ).fetchone()
            if row is None:
                continue
            scope = str(row["scope"])
            if scope not in gens:
                gens[scope] = self._bump(conn, reach.imp, scope)
            intensity = laws.refelt(
                float(row["intensity"]), float(row["valence"]), parse_iso(row["last_felt"]), now, item.toward
            )
            # valence and happened_at are never written here (mechanisms 70, 117); last_felt is now, always
            conn.execute(
                "UPDATE memory_records SET intensity = ?, last_felt = ?, gen = ? WHERE id = ?",
                (intensity, iso(now), gens[scope], item.record_id),
            )
            restored += 1
        return restored

    def _insert_record(
        self,
        conn: sqlite3.Connection,
        *,
        imp: str,
        scope: str,
        gen: int,
        kind: str,
        construct_kind: str | None,
        origin: str,
        author: str,
        author_id: str | None,
        feeling: str,
        conclusion: str,
        valence: float,
        intensity: float,
        happened_at: datetime,
        last_felt: datetime,
        vector: Sequence[float] | None,
        now: datetime,
        statement: str | None = None,
    ) -> str:
        record_id = new_id()
        dims, blob = pack(vector) if vector is not None else (0, None)
        conn.execute(
            "INSERT INTO memory_records (id, imp, scope, kind, construct_kind, origin, author, author_id, feeling,"
            " conclusion, mention_text, valence, intensity, happened_at, last_felt, dims, vector, gen, created_at,"
            " statement) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                record_id, imp, scope, kind, construct_kind, origin, author, author_id, feeling, conclusion,
                record_text(conclusion, statement), valence, intensity, iso(happened_at), iso(last_felt), dims, blob,
                gen, iso(now), statement,
            ),
        )  # fmt: skip
        return record_id

    def _insert_episode(
        self,
        conn: sqlite3.Connection,
        *,
        record_id: str,
        imp: str,
        scope: str,
        gen: int,
        channel_id: str,
        message_id: str | None,
        author: str,
        author_id: str | None,
        as_happened: str,
        told: str | None,
        happened_at: datetime,
        vector: Sequence[float] | None,
    ) -> str:
        episode_id = new_id()
        dims, blob = pack(vector) if vector is not None else (0, None)
        conn.execute(
            "INSERT INTO memory_episodes (id, record_id, imp, scope, channel_id, message_id, author, author_id,"
            " as_happened, told, happened_at, dims, vector, gen) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                episode_id, record_id, imp, scope, channel_id, message_id, author, author_id, as_happened, told,
                iso(happened_at), dims, blob, gen,
            ),
        )  # fmt: skip
        return episode_id

    def _delete(
        self, conn: sqlite3.Connection, episode_ids: set[str], record_ids: set[str]
    ) -> tuple[int, int, set[tuple[str, str]]]:
        """Delete episodes, then records (with their episodes), then records left without an episode.

        Returns (records, episodes, the (imp, scope) pairs touched); the caller bumps their generations.
        """
        touched: set[tuple[str, str]] = set()
        orphans: set[str] = set()
        episodes = 0
        for episode_id in episode_ids:
            row = conn.execute(
                "SELECT record_id, imp, scope FROM memory_episodes WHERE id = ?", (episode_id,)
            ).fetchone()
            if row is None:
                continue
            conn.execute("DELETE FROM memory_episodes WHERE id = ?", (episode_id,))
            episodes += 1
            orphans.add(str(row[0]))
            touched.add((str(row[1]), str(row[2])))
        for record_id in orphans - record_ids:
            left = conn.execute(
                "SELECT COUNT(*) FROM memory_episodes WHERE record_id = ?", (record_id,)
            ).fetchone()[0]
            if not left:
                record_ids = record_ids | {record_id}
        records = 0
        for record_id in record_ids:
            row = conn.execute("SELECT imp, scope FROM memory_records WHERE id = ?", (record_id,)).fetchone()
            if row is None:
                continue
            episodes += conn.execute("DELETE FROM memory_episodes WHERE record_id = ?", (record_id,)).rowcount
            conn.execute("DELETE FROM memory_records WHERE id = ?", (record_id,))
            records += 1
            touched.add((str(row[0]), str(row[1])))
        return records, episodes, touched

    # ------------------------------------------------------------ constructs and the slot (shared)

    def _twin(
        self,
        conn: sqlite3.Connection,
        imp: str,
        scope: str,
        construct_kind: str,
        vector: Sequence[float] | None,
    ) -> sqlite3.Row | None:
        """Mechanisms 75, 82 (subtle point 12): the construct of the same kind in ``scope`` most like
        ``vector``, if its cosine is at least ``construct_duplicate``; vectors of another length never compare."""
        if vector is None:
            return None
        query = normalised(vector)
        rows = conn.execute(
            "SELECT id, intensity, valence, last_felt, statement, vector FROM memory_records"
            " WHERE imp = ? AND scope = ? AND kind = 'construct' AND construct_kind = ? AND dims = ?"
            " AND vector IS NOT NULL ORDER BY last_felt DESC, gen DESC",
            (imp, scope, construct_kind, int(query.size)),
        ).fetchall()
        if not rows:
            return None
        matrix = unpack_many(int(query.size), [row["vector"] for row in rows])
        norms = np.linalg.norm(matrix, axis=1)
        cosines = (matrix @ query) / np.where(norms > 0, norms, 1.0)
        best = int(np.argmax(cosines))  # the most recently felt of equals
        return rows[best] if float(cosines[best]) >= laws.DEFAULTS.construct_duplicate else None

    def _held(self, conn: sqlite3.Connection, imp: str, scope: str, now: datetime) -> list[slot_law.Held]:
        """Mechanisms 87-88: the slot of (imp, scope) as loaded; rows that left it are deleted."""
        rows = conn.execute(
            "SELECT s.record_id, s.activated_at, r.id AS found, r.construct_kind, r.intensity FROM memory_slots s"
            " LEFT JOIN memory_records r ON r.id = s.record_id AND r.imp = s.imp AND r.scope = s.scope"
            " AND r.kind = 'construct' WHERE s.imp = ? AND s.scope = ?",
            (imp, scope),
        ).fetchall()
        stored = [
            slot_law.Held(
                str(row["record_id"]), str(row["construct_kind"] or "thought"), float(row["intensity"] or 0.0),
                parse_iso(row["activated_at"]),
            )
            for row in rows
        ]  # fmt: skip
        existing = {str(row["record_id"]) for row in rows if row["found"] is not None}
        held = slot_law.loaded(stored, now, existing)
        if len(held) != len(stored):
            self._write_slot(conn, imp, scope, held)
        return held

    @staticmethod
    def _write_slot(conn: sqlite3.Connection, imp: str, scope: str, held: Sequence[slot_law.Held]) -> None:
        conn.execute("DELETE FROM memory_slots WHERE imp = ? AND scope = ?", (imp, scope))
        conn.executemany(
            "INSERT INTO memory_slots (imp, scope, record_id, activated_at) VALUES (?, ?, ?, ?)",
            [(imp, scope, h.id, iso(h.activated_at)) for h in held],
        )

    def _activated(
        self, conn: sqlite3.Connection, imp: str, scope: str, record_id: str, now: datetime
    ) -> list[slot_law.Held]:
        """Mechanisms 84-86: the slot after the construct ``record_id`` (in ``scope``) is brought to mind."""
        held = self._held(conn, imp, scope, now)
        row = conn.execute(
            "SELECT construct_kind, intensity FROM memory_records WHERE id = ? AND imp = ? AND scope = ?"
            " AND kind = 'construct'",
            (record_id, imp, scope),
        ).fetchone()
        if row is None:
            return held
        new = slot_law.Held(record_id, str(row["construct_kind"]), float(row["intensity"]), now)
        after = slot_law.activate(held, new)
        if after != held:
            self._write_slot(conn, imp, scope, after)
        return after

    def _entries(
        self, imp: str, scope: str, held: Sequence[slot_law.Held], now: datetime, *, operator: bool = False
    ) -> list[SlotEntry]:
        """The held constructs as the box sees them (felt now), oldest activation first."""
        rows = {r["id"]: r for r in self._records_by_id(_Reach(imp, (scope,)), [h.id for h in held])}
        return [
            SlotEntry(
                record=self._view(rows[h.id], now, False, operator=operator), activated_at=h.activated_at
            )
            for h in slot_law.ordered(held)
            if h.id in rows
        ]

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
        reach = _Reach(imp, (scope,) if scope is not None else None)
        now = self.clock()
        if person is None:
            rows = self._newest(reach, "", (), limit)
        else:
            rows = self._about(reach, person, limit)
            rows.sort(key=lambda r: (r["last_felt"], r["id"]), reverse=True)
        return self._with_episodes(reach, [self._view(r, now, False, operator=True) for r in rows], episodes)

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
        reach = _Reach(imp, tuple(scopes) if scopes is not None else None)
        return self._search(reach, vector, names, k, episodes=episodes, operator=True)

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
        """Mechanism 115: a given record (author Self, origin given) with one episode, dated ``age_hours`` ago.

        ``happened_at = last_felt = now − age``, so it fades from its past date. Returns the record id.
        """
        event = event.strip()
        if not event or len(event) > MAX_CONCLUSION_CHARS:
            raise MemoryInvalid(f"an event is 1 to {MAX_CONCLUSION_CHARS} characters of text")
        if not -1.0 <= valence <= 1.0 or not 0.0 <= intensity <= 1.0:
            raise MemoryInvalid("valence is between -1 and 1, intensity between 0 and 1")
        if not age_hours >= 0.0:
            raise MemoryInvalid("the age is zero or more hours")
        now = now or self.clock()
        happened = now - timedelta(hours=age_hours)
        with self.db.transaction() as conn:
            gen = self._bump(conn, imp, scope)
            record_id = self._insert_record(
                conn, imp=imp, scope=scope, gen=gen, kind="lived", construct_kind=None, origin="given",
                author=SELF, author_id=None, feeling="", conclusion=event, valence=valence, intensity=intensity,
                happened_at=happened, last_felt=happened, vector=vector, now=now,
            )  # fmt: skip
            self._insert_episode(
                conn, record_id=record_id, imp=imp, scope=scope, gen=gen, channel_id="", message_id=None,
                author=SELF, author_id=None, as_happened=event, told=event, happened_at=happened, vector=vector,
            )  # fmt: skip
        return record_id

    def forget_person(self, imp: str, ids: Sequence[str], names: Sequence[str] = ()) -> Forgotten:
        """Everything by or about a person, in every scope of ``imp`` (``/forget-me``, ``memory forget``).

        A record or an episode is theirs when it was written under one of ``ids``, or under one of ``names``
        (exactly), or when its text mentions one of the names as a whole word (``laws.mentions``) — only names
        ``mentions_are_forgettable`` lets count. Taken: those records with every episode, those episodes in
        other records, records left without an episode, and their conversations (kept under an id or a name).
        """
        if isinstance(ids, str) or isinstance(names, str):
            raise TypeError("forget_person takes sequences of ids and names, not one string")
        names = tuple(dict.fromkeys(name.strip() for name in names if name.strip()))
        mentioned = tuple(name for name in names if mentions_are_forgettable(name))
        person = _Person(tuple(dict.fromkeys(i for i in ids if i)), names, mentioned)
        keys = [*person.ids, *person.names]
        if not keys:
            return Forgotten()
        clause, args = _Reach(imp, None).clause()
        found = {"id": 0, "name": 0}
        with self.db.transaction() as conn:
            # SQL finds the candidates; the whole-word check is Python's (laws.mentions), portable and exact.
            likes = " OR ".join(["mention_text LIKE ? ESCAPE '\\'"] * len(mentioned)) or "1 = 0"
            records: set[str] = set()
            for row in conn.execute(
                f"SELECT id, author, author_id, conclusion, statement FROM memory_records WHERE {clause} AND"
                f" (author_id IN ({_marks(person.ids)}) OR author IN ({_marks(person.names)}) OR {likes})",
                [*args, *person.ids, *person.names, *(like_pattern(name.lower()) for name in mentioned)],
            ):
                if (how := person.match(row["author_id"], row["author"], _row_text(row))) is not None:
                    records.add(str(row["id"]))
                    found[how] += 1
            # The imp's own thoughts formed in a DM with them go with that DM's scope, as its lived records do.
            dm_scopes = [dm_scope(person_id) for person_id in person.ids]
            for row in conn.execute(
                f"SELECT id FROM memory_records WHERE {clause} AND kind = 'construct'"
                f" AND scope IN ({_marks(dm_scopes)})",
                [*args, *dm_scopes],
            ):
                if str(row["id"]) not in records:
                    records.add(str(row["id"]))
                    found["id"] += 1
            episodes: set[str] = set()
            for row in conn.execute(
                f"SELECT id, author, author_id, as_happened FROM memory_episodes WHERE {clause}", args
            ):  # every episode of the imp: their text is not lowercased for a LIKE
                if (how := person.match(row["author_id"], row["author"], row["as_happened"])) is not None:
                    episodes.add(str(row["id"]))
                    found[how] += 1
            n_records, n_episodes, touched = self._delete(conn, episodes, records)
            n_conversations = conn.execute(
                f"DELETE FROM memory_conversations WHERE {clause} AND person IN ({_marks(keys)})",
                [*args, *keys],
            ).rowcount
            # Their departures name them too; with the conversations gone, no departure is queued again.
            conn.execute(
                f"DELETE FROM memory_departures WHERE {clause} AND person IN ({_marks(keys)})", [*args, *keys]
            )
            for imp_, scope in sorted(touched):
                self._bump(conn, imp_, scope, deleted=True)
        return Forgotten(
            records=n_records, episodes=n_episodes, conversations=n_conversations, by_id=found["id"],
            by_name=found["name"], mentions_of=mentioned, author_only=tuple(n for n in names if n not in mentioned),
        )  # fmt: skip

    def forget_message(self, channel_id: str, message_id: str) -> dict[str, int]:
        """A deleted message: its episodes, for every imp; a record left with no episode goes too.

        The message is marked forgotten too (for ``FORGOTTEN_MESSAGE_KEEP``), so a turn still running on it
        keeps nothing of it when it ends: ``ScopedMemory.encode`` refuses an episode of a marked message.
        """
        now = self.clock()
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT INTO memory_forgotten_messages (channel_id, message_id, forgotten_at) VALUES (?, ?, ?)"
                " ON CONFLICT (channel_id, message_id) DO NOTHING",
                (channel_id, message_id, iso(now)),
            )
            conn.execute(
                "DELETE FROM memory_forgotten_messages WHERE forgotten_at < ?",
                (iso(now - FORGOTTEN_MESSAGE_KEEP),),
            )
            episodes = {
                str(r[0])
                for r in conn.execute(
                    "SELECT id FROM memory_episodes WHERE channel_id = ? AND message_id = ?",
                    (channel_id, message_id),
                )
            }
            n_records, n_episodes, touched = self._delete(conn, episodes, set())
            for imp, scope in sorted(touched):
                self._bump(conn, imp, scope, deleted=True)
        return {"records": n_records, "episodes": n_episodes}

    def forget_imp(self, imp: str) -> dict[str, int]:
        """Everything the imp remembers, in every scope (``impyard imp rm --purge``, ``impyard memory
        delete``; mechanism 118): records, episodes, saved conversations, the slots, learned rules,
        departures, and its day's clock (``memory_wakefulness``: it starts again asleep, as a new imp). The
        scopes' generations move on (kept, not deleted), so every cache drops them."""
        with self.db.transaction() as conn:
            scopes = [
                str(r[0])
                for r in conn.execute(
                    "SELECT scope FROM memory_generations WHERE imp = ? UNION"
                    " SELECT DISTINCT scope FROM memory_records WHERE imp = ?",
                    (imp, imp),
                )
            ]
            conn.execute("DELETE FROM memory_wakefulness WHERE imp = ?", (imp,))
            slots = conn.execute("DELETE FROM memory_slots WHERE imp = ?", (imp,)).rowcount
            episodes = conn.execute("DELETE FROM memory_episodes WHERE imp = ?", (imp,)).rowcount
            records = conn.execute("DELETE FROM memory_records WHERE imp = ?", (imp,)).rowcount
            conversations = conn.execute("DELETE FROM memory_conversations WHERE imp = ?", (imp,)).rowcount
            rules = conn.execute("DELETE FROM memory_dispositions WHERE imp = ?", (imp,)).rowcount
            departures = conn.execute("DELETE FROM memory_departures WHERE imp = ?", (imp,)).rowcount
            for scope in scopes:
                self._bump(conn, imp, scope, deleted=True)
        return {
            "records": records, "episodes": episodes, "conversations": conversations, "slots": slots,
            "rules": rules, "departures": departures,
        }  # fmt: skip

    def rules(self, imp: str, limit: int | None = None) -> list[DispositionView]:
        """``impyard memory rules``: what ``imp`` has learned, strongest |weight| first (dormant ones too)."""
        return _dispositions(self.db.connection(), imp, limit, active_only=False)

    def slot_view(self, imp: str, scope: str | None = None) -> list[tuple[str, SlotEntry]]:
        """``impyard memory slot``: what ``imp`` holds in mind in each scope (or ``scope``), as it would be
        loaded now (87); read only: nothing is dropped here. Each entry's record is a ``StoredRecord``."""
        now = self.clock()
        conn = self.db.connection()
        if scope is None:
            scopes = [
                str(r[0])
                for r in conn.execute(
                    "SELECT DISTINCT scope FROM memory_slots WHERE imp = ? ORDER BY scope", (imp,)
                )
            ]
        else:
            scopes = [scope]
        shown: list[tuple[str, SlotEntry]] = []
        for where in scopes:
            rows = conn.execute(
                "SELECT s.record_id, s.activated_at, r.construct_kind, r.intensity FROM memory_slots s"
                " JOIN memory_records r ON r.id = s.record_id AND r.imp = s.imp AND r.scope = s.scope"
                " WHERE s.imp = ? AND s.scope = ?",
                (imp, where),
            ).fetchall()
            stored = [
                slot_law.Held(str(r["record_id"]), str(r["construct_kind"]), float(r["intensity"]),
                              parse_iso(r["activated_at"]))
                for r in rows
            ]  # fmt: skip
            held = slot_law.loaded(stored, now)
            shown.extend((where, entry) for entry in self._entries(imp, where, held, now, operator=True))
        return shown

    def count(self, imp: str, scopes: Sequence[str] | None = None) -> int:
        """Records of every kind of ``imp`` in ``scopes`` (None: all).

        Every ``memory.*`` result says this total (mechanism 3), so a scope's count is kept per generation:
        it is counted again only after a write or a delete moved the scope's generation (from any process).
        """
        if scopes is not None:
            return sum(self._scope_count(imp, scope) for scope in dict.fromkeys(scopes))
        clause, args = _Reach(imp, None).clause()
        return int(
            self.db.connection()
            .execute(f"SELECT COUNT(*) FROM memory_records WHERE {clause}", args)
            .fetchone()[0]
        )

    def _scope_count(self, imp: str, scope: str) -> int:
        generation = self.generation(imp, scope)
        with self._counts_lock:
            cached = self._counts.get((imp, scope))
        if cached is not None and cached[0] == generation:
            return cached[1]
        count = int(
            self.db.connection()
            .execute("SELECT COUNT(*) FROM memory_records WHERE imp = ? AND scope = ?", (imp, scope))
            .fetchone()[0]
        )
        with self._counts_lock:
            if len(self._counts) >= MAX_CACHED_COUNTS:
                self._counts.clear()  # a bound, not a policy: counts are cheap to take again
            self._counts[(imp, scope)] = (generation, count)
        return count

    # ------------------------------------------------------------ the night (issue 15: mechanisms 107-114)

    def night_records(
        self, imp: str, scope: str, since: datetime, k: int = 200, episodes: int = 6
    ) -> list[RecordView]:
        """Mechanism 107 (subtle point 16): ``scope``'s records that happened at or after ``since`` (the
        imp's waking), newest first, at most ``k``, each with its newest ``episodes``; constructs and given
        records come too (the box marks them protected)."""
        reach = _Reach(imp, (scope,))
        now = self.clock()
        rows = self._records(
            reach, "happened_at >= ?", [iso(since)], order="happened_at DESC, gen DESC, id", limit=k
        )
        return self._with_episodes(reach, [self._view(r, now, False) for r in rows], episodes)

    def consolidate_scope(
        self, imp: str, scope: str, groups: Sequence[tuple[str, Sequence[str]]]
    ) -> ConsolidateResult:
        """Mechanisms 108-111, 113, in one transaction, within ``scope`` only: each group's anchor and
        members are checked here whatever the plan says (``anchor_refusal``, ``member_refusal``); a group
        left with no member is skipped. The members' episodes are re-filed under the anchor (109), the
        anchor's stored intensity becomes ``combined_intensity`` (110), the members are deleted. No text,
        valence or time changes (111). ``refused`` counts each refused anchor (its whole group) and member.
        """
        applied = absorbed_n = moved = refused = 0
        absorbed: set[str] = set()
        with self.db.transaction() as conn:
            gen: int | None = None

            def row_of(record_id: str) -> sqlite3.Row | None:
                return conn.execute(
                    "SELECT id, kind, origin, intensity FROM memory_records WHERE id = ? AND imp = ? AND scope = ?",
                    (record_id, imp, scope),
                ).fetchone()

            for anchor_id, member_ids in groups:
                anchor = row_of(anchor_id)  # an anchor absorbed earlier in this call is gone: refused
                if anchor is None or anchor_refusal(
                    anchor["kind"], anchor["origin"], float(anchor["intensity"])
                ):
                    refused += 1
                    continue
                strength = float(anchor["intensity"])
                members: list[sqlite3.Row] = []
                for member_id in member_ids:
                    member = row_of(member_id)
                    if member is None or member_refusal(
                        member["id"], member["kind"], member["origin"], float(member["intensity"]),
                        anchor=anchor_id, anchor_intensity=strength, absorbed=absorbed,
                    ):  # fmt: skip
                        refused += 1
                        continue
                    absorbed.add(str(member["id"]))
                    members.append(member)
                if not members:
                    continue
                if gen is None:
                    gen = self._bump(conn, imp, scope, deleted=True)
                ids = [str(m["id"]) for m in members]
                marks = _marks(ids)
                conn.execute(
                    "UPDATE memory_records SET intensity = ?, gen = ? WHERE id = ?",
                    (
                        combined_intensity([strength, *(float(m["intensity"]) for m in members)]),
                        gen,
                        anchor_id,
                    ),
                )
                moved += conn.execute(
                    f"UPDATE memory_episodes SET record_id = ?, gen = ? WHERE record_id IN ({marks})"
                    " AND imp = ? AND scope = ?",
                    [anchor_id, gen, *ids, imp, scope],
                ).rowcount
                conn.execute(f"DELETE FROM memory_records WHERE id IN ({marks})", ids)
                applied += 1
                absorbed_n += len(ids)
        return ConsolidateResult(groups=applied, absorbed=absorbed_n, episodes=moved, refused=refused)

    def forget_scope(self, imp: str, scope: str) -> tuple[int, int]:
        """Mechanisms 112-113, within ``scope`` only: every record ``forgets`` at the store's now is deleted
        with its episodes. Returns (records, episodes). The host calls this directly for the scopes the imp
        did not live in that day (forgetting needs no model); ``memory.forget`` too.

        The candidates are read first, then deleted in transactions of ``_FORGET_BATCH`` records, each
        checking the rule again under the write lock (a record felt again meanwhile stays): a first night
        over a large old memory never holds the database from the imp's other boxes for long, and a crash
        midway leaves only records the next night forgets."""
        now = self.clock()
        curve = laws.DEFAULTS.forgetting_curve
        # A prefilter only (the rule is ``forgets``): none younger than the first knot, none at the top value.
        youngest = now - timedelta(days=curve[0][0])
        top = max(value for _, value in curve)
        candidates = [
            str(row["id"])
            for row in self.db.connection().execute(
                "SELECT id, kind, origin, intensity, last_felt FROM memory_records"
                " WHERE imp = ? AND scope = ? AND intensity < ? AND last_felt <= ?",
                (imp, scope, top, iso(youngest)),
            )
            if forgets(row["kind"], row["origin"], float(row["intensity"]), parse_iso(row["last_felt"]), now)
        ]
        records = episodes = 0
        for start in range(0, len(candidates), _FORGET_BATCH):
            with self.db.transaction() as conn:
                doomed: list[str] = []
                for ids in _chunks(candidates[start : start + _FORGET_BATCH]):
                    # By id alone (the primary key): with imp and scope in the WHERE, SQLite may scan the scope.
                    doomed.extend(
                        str(row["id"])
                        for row in conn.execute(
                            "SELECT id, imp, scope, kind, origin, intensity, last_felt FROM memory_records"
                            f" WHERE id IN ({_marks(ids)})",
                            ids,
                        )
                        if row["imp"] == imp
                        and row["scope"] == scope
                        and forgets(
                            row["kind"],
                            row["origin"],
                            float(row["intensity"]),
                            parse_iso(row["last_felt"]),
                            now,
                        )
                    )
                for ids in _chunks(doomed):
                    marks = _marks(ids)
                    episodes += conn.execute(
                        f"DELETE FROM memory_episodes WHERE record_id IN ({marks})", ids
                    ).rowcount
                    records += conn.execute(f"DELETE FROM memory_records WHERE id IN ({marks})", ids).rowcount
                if doomed:
                    self._bump(conn, imp, scope, deleted=True)
        return records, episodes

    def scopes_lived_in(self, imp: str, since: datetime | None = None) -> list[str]:
        """The scopes of ``imp`` holding records (that happened at or after ``since``), the one with the
        newest such record first: where a night has something to fold or forget."""
        after = "" if since is None else " AND happened_at >= ?"
        rows = (
            self.db.connection()
            .execute(
                f"SELECT scope, MAX(happened_at) AS newest FROM memory_records WHERE imp = ?{after}"
                " GROUP BY scope ORDER BY newest DESC, scope",
                [imp, *([] if since is None else [iso(since)])],
            )
            .fetchall()
        )
        return [str(row["scope"]) for row in rows]

    # ------------------------------------------------------------ copy and stats (issue 15: mechanism 118)

    def has_memory(self, imp: str) -> bool:
        """Whether ``imp`` keeps anything at all: a record, an episode, a conversation, a rule or a slot."""
        conn = self.db.connection()
        return any(
            conn.execute(f"SELECT 1 FROM {table} WHERE imp = ? LIMIT 1", (imp,)).fetchone()
            for table in _IMP_TABLES
        )

    def copy_imp(self, src: str, new: str) -> dict[str, int]:
        """Mechanism 118: copy everything ``src`` remembers to ``new``, in one transaction: records,
        episodes, saved conversations, the slots and learned rules, each scope into the same scope, with
        vectors and times as they are. Every id gets a suffix of this copy (``<id>-<8 hex>``) and the ids
        inside a saved conversation are those of the copies. ``src`` is only read. Refused (``MemoryInvalid``)
        when ``new`` is ``src`` or already keeps anything. Not copied: its wakefulness (the copy starts
        asleep, like any new imp) and pending departures (they are ``src``'s conversations' to end)."""
        if src == new:
            raise MemoryInvalid("a copy needs two different imps")
        suffix = new_id()[:8]

        def copied(old_id: str) -> str:
            return f"{old_id.split('-')[0][:64]}-{suffix}"

        counts = dict.fromkeys(("records", "episodes", "conversations", "slots", "rules"), 0)
        with self.db.transaction() as conn:
            if any(
                conn.execute(f"SELECT 1 FROM {table} WHERE imp = ? LIMIT 1", (new,)).fetchone()
                for table in _IMP_TABLES
            ):
                raise MemoryInvalid(
                    f"{new} already remembers something; a copy goes only into an empty memory"
                )
            scopes = sorted(
                {
                    str(row[0])
                    for table in ("memory_records", "memory_conversations", "memory_slots")
                    for row in conn.execute(f"SELECT DISTINCT scope FROM {table} WHERE imp = ?", (src,))
                }
            )
            gens = {scope: self._bump(conn, new, scope) for scope in scopes}
            ids: set[str] = set()

            def rows(sql: str) -> Iterable[list[sqlite3.Row]]:
                cursor = self.db.connection().cursor().execute(sql, (src,))
                while batch := cursor.fetchmany(_CHUNK):
                    yield batch

            for batch in rows(
                f"SELECT {_RECORD_COLUMNS}, mention_text, created_at FROM memory_records WHERE imp = ?"
            ):
                ids.update(str(r["id"]) for r in batch)
                counts["records"] += conn.executemany(
                    "INSERT INTO memory_records (id, imp, scope, kind, construct_kind, origin, author, author_id,"
                    " feeling, conclusion, mention_text, valence, intensity, happened_at, last_felt, dims, vector,"
                    " gen, created_at, statement) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (
                            copied(r["id"]), new, r["scope"], r["kind"], r["construct_kind"], r["origin"], r["author"],
                            r["author_id"], r["feeling"], r["conclusion"], r["mention_text"], r["valence"],
                            r["intensity"], r["happened_at"], r["last_felt"], r["dims"], r["vector"], gens[r["scope"]],
                            r["created_at"], r["statement"],
                        )
                        for r in batch
                    ],
                ).rowcount  # fmt: skip
            for batch in rows(
                f"SELECT {_EPISODE_COLUMNS}, scope, dims, vector FROM memory_episodes WHERE imp = ?"
            ):
                ids.update(str(r["id"]) for r in batch)
                counts["episodes"] += conn.executemany(
                    "INSERT INTO memory_episodes (id, record_id, imp, scope, channel_id, message_id, author,"
                    " author_id, as_happened, told, happened_at, dims, vector, gen)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (
                            copied(r["id"]), copied(r["record_id"]), new, r["scope"], r["channel_id"], r["message_id"],
                            r["author"], r["author_id"], r["as_happened"], r["told"], r["happened_at"], r["dims"],
                            r["vector"], gens[r["scope"]],
                        )
                        for r in batch
                    ],
                ).rowcount  # fmt: skip
            for batch in rows(
                "SELECT scope, channel_id, person, state, updated_at FROM memory_conversations WHERE imp = ?"
            ):
                counts["conversations"] += conn.executemany(
                    "INSERT INTO memory_conversations (imp, scope, channel_id, person, state, updated_at)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    [
                        (new, r["scope"], r["channel_id"], r["person"],
                         json.dumps(_renamed(json.loads(r["state"]), ids, copied), ensure_ascii=False,
                                    separators=(",", ":")), r["updated_at"])
                        for r in batch
                    ],
                ).rowcount  # fmt: skip
            for batch in rows("SELECT scope, record_id, activated_at FROM memory_slots WHERE imp = ?"):
                counts["slots"] += conn.executemany(
                    "INSERT INTO memory_slots (imp, scope, record_id, activated_at) VALUES (?, ?, ?, ?)",
                    [(new, r["scope"], copied(r["record_id"]), r["activated_at"]) for r in batch],
                ).rowcount
            for batch in rows(f"SELECT {_DISPOSITION_COLUMNS} FROM memory_dispositions WHERE imp = ?"):
                counts["rules"] += conn.executemany(
                    "INSERT INTO memory_dispositions (id, imp, rule, weight, count, created_at, updated_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [
                        (copied(r["id"]), new, r["rule"], r["weight"], r["count"], r["created_at"], r["updated_at"])
                        for r in batch
                    ],
                ).rowcount  # fmt: skip
        return counts

    def stats(self, imp: str) -> MemoryStats:
        """``impyard memory stats``: per scope records, episodes, constructs, given records and slot
        entries; the learned rules and saved conversations; the clock's state (``memory_wakefulness``);
        the host database's size on disk (every imp's memory is in it, with the rest of the host's)."""
        conn = self.db.connection()
        per: dict[str, dict[str, int]] = {}

        def add(sql: str, *names: str) -> None:
            for row in conn.execute(sql, (imp,)):
                counted = per.setdefault(str(row[0]), dict.fromkeys(_SCOPE_COUNTS, 0))
                for index, name in enumerate(names, start=1):
                    counted[name] = int(row[index] or 0)

        add(
            "SELECT scope, COUNT(*), SUM(CASE WHEN kind = 'construct' THEN 1 ELSE 0 END),"
            " SUM(CASE WHEN origin = 'given' THEN 1 ELSE 0 END) FROM memory_records WHERE imp = ? GROUP BY scope",
            "records", "constructs", "given",
        )  # fmt: skip
        add("SELECT scope, COUNT(*) FROM memory_episodes WHERE imp = ? GROUP BY scope", "episodes")
        add("SELECT scope, COUNT(*) FROM memory_conversations WHERE imp = ? GROUP BY scope", "conversations")
        add("SELECT scope, COUNT(*) FROM memory_slots WHERE imp = ? GROUP BY scope", "slot")
        rules = conn.execute(
            "SELECT COUNT(*), SUM(CASE WHEN abs(weight) > ? THEN 1 ELSE 0 END) FROM memory_dispositions"
            " WHERE imp = ?",
            (laws.DORMANT_WEIGHT, imp),
        ).fetchone()
        clock = conn.execute(
            "SELECT awake, woke_at, slept_at, last_activity_at, last_reflection_at, last_sleep_at,"
            " last_consolidation_at FROM memory_wakefulness WHERE imp = ?",
            (imp,),
        ).fetchone()
        size = sum(
            path.stat().st_size
            for path in (self.db.path, self.db.path.with_name(self.db.path.name + "-wal"))
            if path.exists()
        )
        return MemoryStats(
            imp=imp,
            scopes=[ScopeStats(scope=scope, **per[scope]) for scope in sorted(per)],
            rules=int(rules[0] or 0),
            active_rules=int(rules[1] or 0),
            clock=None if clock is None else Wakefulness(
                awake=bool(clock["awake"]), **{k: _when(clock[k]) for k in Wakefulness.TIMES},
            ),
            database_bytes=size,
        )  # fmt: skip


# ------------------------------------------------------------------ the session's view


class ScopedMemory:
    """One session's memory: every query is filtered by its imp and read scopes, every write is in its
    writes scope. Built per session (``MemoryStore.scoped``); the service holds nothing else."""

    def __init__(self, store: MemoryStore, imp: str, scopes: SessionScopes, channel_id: str) -> None:
        self.store = store
        self.imp = imp
        self.scopes = scopes
        self.channel_id = channel_id
        self._reach = _Reach(imp, scopes.reads)

    def count(self) -> int:
        """Mechanism 3: the records of every kind in the scopes this session reads."""
        return self.store.count(self.imp, self.scopes.reads)

    def search(
        self,
        vector: Sequence[float],
        names: Sequence[str] = (),
        k: int = 10,
        kinds: Sequence[str] = BOTH_KINDS,
        episodes: int = 3,
        with_vectors: bool = False,
    ) -> list[RecordView]:
        return self.store._search(self._reach, vector, names, k, kinds, episodes, with_vectors)

    def recent(
        self, k: int = 5, kinds: Sequence[str] = ("lived",), episodes: int = 3, with_vectors: bool = False
    ) -> list[RecordView]:
        """Mechanisms 32, 92, 115: the ``k`` most recently felt records of ``kinds``."""
        marks = ", ".join("?" for _ in kinds)
        now = self.store.clock()
        rows = self.store._newest(self._reach, f"kind IN ({marks})", list(kinds), k)
        return self.store._with_episodes(
            self._reach, [self.store._view(r, now, with_vectors) for r in rows], episodes
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
        now = self.store.clock()
        rows = self.store._about(self._reach, person, k, exclude, kinds)
        return self.store._with_episodes(
            self._reach, [self.store._view(r, now, with_vectors) for r in rows], episodes
        )

    def constructs(self, construct_kind: ConstructKind, k: int = 3, episodes: int = 0) -> list[RecordView]:
        """Mechanism 27 (ownOfKind): the ``k`` most recently felt constructs of one kind."""
        now = self.store.clock()
        rows = self.store._newest(
            self._reach, "kind = 'construct' AND construct_kind = ?", [construct_kind], k
        )
        return self.store._with_episodes(
            self._reach, [self.store._view(r, now, False) for r in rows], episodes
        )

    def episodes(self, record_ids: Sequence[str], per_record: int = 3) -> list[EpisodeView]:
        """Each named record's newest episodes, newest first; a record outside the scopes gives nothing."""
        found: list[EpisodeView] = []
        for record_id in dict.fromkeys(record_ids):
            found.extend(self.store._episodes_of(self._reach, record_id, per_record))
        return found

    def encode(self, params: EncodeParams) -> tuple[str, str]:
        """Mechanisms 61-66: keep one moment, atomically: a new record or a join, its episode, the restores.

        A join names a record this session reads *and* writes (its writes scope), else it is refused
        (``MemoryDenied``) and nothing is written. Restores of records outside the read scopes are ignored.
        An episode of a message deleted meanwhile (``forget_message``) is refused (``MemoryForgotten``): the
        turn kept nothing of it, whichever of the two came first.
        """
        now = self.store.clock()
        store, writes = self.store, self.scopes.writes
        message_id = params.episode.message_id
        with store.db.transaction() as conn:
            if (
                message_id is not None
                and conn.execute(
                    "SELECT 1 FROM memory_forgotten_messages WHERE channel_id = ? AND message_id = ?",
                    (self.channel_id, message_id),
                ).fetchone()
            ):
                raise MemoryForgotten(
                    f"memory.encode: message {message_id[:40]!r} was deleted; nothing of it is kept"
                )
            gens = {writes: store._bump(conn, self.imp, writes)}
            if params.record is not None:
                new = params.record
                record_id = store._insert_record(
                    conn, imp=self.imp, scope=writes, gen=gens[writes], kind=new.kind,
                    construct_kind=new.construct_kind, origin="lived", author=new.author, author_id=new.author_id,
                    feeling=new.feeling, conclusion=new.conclusion, valence=new.valence, intensity=new.intensity,
                    happened_at=now, last_felt=now, vector=new.vector, now=now,
                )  # fmt: skip
            else:
                assert params.join is not None
                clause, args = self._reach.clause()
                row = conn.execute(
                    f"SELECT scope FROM memory_records WHERE id = ? AND {clause}", [params.join, *args]
                ).fetchone()
                if row is None or row["scope"] != writes:
                    raise MemoryDenied(
                        f"memory.encode: no record {params.join[:40]!r} to join in this conversation's scope"
                    )
                record_id = params.join
            episode = params.episode
            episode_id = store._insert_episode(
                conn, record_id=record_id, imp=self.imp, scope=writes, gen=gens[writes], channel_id=self.channel_id,
                message_id=episode.message_id, author=episode.author, author_id=episode.author_id,
                as_happened=episode.as_happened, told=episode.told, happened_at=now, vector=episode.vector,
            )  # fmt: skip
            store._refeel(conn, self._reach, params.restore, now, gens)
        return record_id, episode_id

    def restore(self, items: Sequence[Restore]) -> int:
        """Re-feel records in this session's scopes; returns how many were (others are ignored)."""
        now = self.store.clock()
        with self.store.db.transaction() as conn:
            return self.store._refeel(conn, self._reach, items, now, {})

    # ------------------------------------------------------------ constructs and the slot (issue 14)

    def construct(self, params: ConstructParams) -> tuple[str, bool, str | None, list[SlotEntry]]:
        """Mechanisms 74-77, 81-86: form a construct in the writes scope, atomically, and bring it to mind.

        Compared only with the constructs of its kind in the writes scope (cosine ≥ 0.90, same length): a
        recurring thought is re-felt toward ``intensity`` (75); a duplicate of another kind gains +0.1 (max 1)
        without fading first (82); both are felt now and not written again. Otherwise a construct record is
        written: author Self, origin lived. With ``slot`` it is activated in the writes scope's slot.
        Returns (record id, created, the earlier one's statement when it was not created, the slot).
        """
        now = self.store.clock()
        store, writes = self.store, self.scopes.writes
        with store.db.transaction() as conn:
            gen = store._bump(conn, self.imp, writes)
            twin = store._twin(conn, self.imp, writes, params.construct_kind, params.vector)
            previous: str | None = None
            if twin is not None:
                record_id, previous = str(twin["id"]), twin["statement"]
                stored = float(twin["intensity"])
                if params.construct_kind == "thought":  # mechanism 75: settle, then close 0.6 toward now
                    intensity = laws.refelt(
                        stored, float(twin["valence"]), parse_iso(twin["last_felt"]), now, params.intensity
                    )
                else:  # mechanism 82: +0.1 on the stored intensity, no settling first
                    intensity = min(1.0, stored + laws.DEFAULTS.construct_reinforcement)
                conn.execute(
                    "UPDATE memory_records SET intensity = ?, last_felt = ?, gen = ? WHERE id = ?",
                    (intensity, iso(now), gen, record_id),
                )
            else:
                record_id = store._insert_record(
                    conn, imp=self.imp, scope=writes, gen=gen, kind="construct",
                    construct_kind=params.construct_kind, origin="lived", author=SELF, author_id=None,
                    feeling=params.feeling, conclusion=params.conclusion, valence=params.valence,
                    intensity=params.intensity, happened_at=now, last_felt=now, vector=params.vector, now=now,
                    statement=params.statement,
                )  # fmt: skip
            if params.slot:
                held = store._activated(conn, self.imp, writes, record_id, now)
            else:
                held = store._held(conn, self.imp, writes, now)
            entries = store._entries(self.imp, writes, held, now)
        return record_id, twin is None, previous, entries

    def slot(self) -> list[SlotEntry]:
        """Mechanisms 87-88: the writes scope's slot as loaded now, oldest activation first; what left it
        (a week unrefreshed, deleted, over size) is dropped from the stored slot."""
        now = self.store.clock()
        with self.store.db.transaction() as conn:
            held = self.store._held(conn, self.imp, self.scopes.writes, now)
            return self.store._entries(self.imp, self.scopes.writes, held, now)

    def slot_refresh(self, record_ids: Sequence[str]) -> list[SlotEntry]:
        """Mechanism 86: held constructs brought to mind again get activated now; other ids are ignored."""
        now = self.store.clock()
        store, writes = self.store, self.scopes.writes
        with store.db.transaction() as conn:
            held = store._held(conn, self.imp, writes, now)
            after = list(held)
            for record_id in dict.fromkeys(record_ids):
                twin = next((h for h in after if h.id == record_id), None)
                if twin is not None:
                    after = slot_law.activate(after, slot_law.Held(twin.id, twin.kind, twin.intensity, now))
            if after != held:
                store._write_slot(conn, self.imp, writes, after)
            return store._entries(self.imp, writes, after, now)

    # ------------------------------------------------------------ dispositions (issue 14; per imp, every scope)

    def dispositions(self, k: int = 100, active_only: bool = False) -> list[DispositionView]:
        """Mechanisms 94, 98-99: the ``k`` strongest rules by |weight|; ``active_only`` leaves dormant ones out."""
        return _dispositions(self.store.db.connection(), self.imp, k, active_only=active_only)

    def learn(self, params: LearnParams) -> LearnResult:
        """Mechanisms 95-97, atomically: ``same`` is counted (and takes this text and weight only if this one
        pulls harder); else ``contradicts`` is weakened toward 0 by |weight| and this rule added; else added.
        A rule named must be this imp's (else ``MemoryDenied``). At most ``MAX_RULES`` are kept per imp."""
        rule = clean_rule(params.rule)
        now = iso(self.store.clock())
        with self.store.db.transaction() as conn:

            def named(rule_id: str) -> sqlite3.Row:
                row = conn.execute(
                    "SELECT id, rule, weight FROM memory_dispositions WHERE id = ? AND imp = ?",
                    (rule_id, self.imp),
                ).fetchone()
                if row is None:
                    raise MemoryDenied(f"memory.dispositions.learn: no rule {rule_id[:40]!r} of this imp")
                return row

            if params.same is not None:  # mechanisms 95-96: counted; never summed
                old = named(params.same)
                text, weight, replaced = laws.same_rule(
                    old["rule"], float(old["weight"]), rule, params.weight, params.avoidance_weight
                )
                conn.execute(
                    "UPDATE memory_dispositions SET rule = ?, weight = ?, count = count + 1, updated_at = ?"
                    " WHERE id = ?",
                    (text, weight, now, params.same),
                )
                return LearnResult(id=params.same, action="replaced" if replaced else "counted")
            weakened: str | None = None
            if params.contradicts is not None:  # mechanism 97: toward 0 by |new w|, never past it
                old = named(params.contradicts)
                conn.execute(
                    "UPDATE memory_dispositions SET weight = ?, updated_at = ? WHERE id = ?",
                    (laws.weakened(float(old["weight"]), params.weight), now, params.contradicts),
                )
                weakened = params.contradicts
            rule_id = new_id()
            conn.execute(
                "INSERT INTO memory_dispositions (id, imp, rule, weight, count, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, 1, ?, ?)",
                (rule_id, self.imp, rule, params.weight, now, now),
            )
            excess = (
                conn.execute(
                    "SELECT COUNT(*) FROM memory_dispositions WHERE imp = ?", (self.imp,)
                ).fetchone()[0]
                - MAX_RULES
            )
            if excess > 0:  # the weakest go: dormant ones first, then the smallest |weight|, oldest first
                conn.execute(
                    "DELETE FROM memory_dispositions WHERE id IN (SELECT id FROM memory_dispositions"
                    " WHERE imp = ? AND id != ? ORDER BY abs(weight) > ?, abs(weight), updated_at, created_at, id"
                    f" LIMIT {int(excess)})",
                    (self.imp, rule_id, laws.DORMANT_WEIGHT),
                )
            return LearnResult(id=rule_id, action="added", weakened=weakened)

    def conversation_get(self, person: str) -> tuple[dict[str, Any] | None, datetime | None]:
        clause, args = self._reach.clause()
        row = (
            self.store.db.connection()
            .execute(
                f"SELECT state, updated_at FROM memory_conversations WHERE {clause} AND channel_id = ? AND person = ?",
                [*args, self.channel_id, person],
            )
            .fetchone()
        )
        if row is None:
            return None, None
        return json.loads(row["state"]), parse_iso(row["updated_at"])

    def conversation_put(self, person: str, state: dict[str, Any]) -> None:
        """Save the conversation's state in the writes scope (at most 256 KiB of JSON).

        A channel keeps the conversations of its ``MAX_CONVERSATIONS_PER_CHANNEL`` most recently saved people;
        saving one more lets go of the longest untouched, which had gone stale anyway (a new conversation
        starts after the person's absence). So a box naming made-up people holds at most that many states of
        256 KiB per channel, however many it invents.
        """
        text = conversation_json(state)
        now = self.store.clock()
        with self.store.db.transaction() as conn:
            conn.execute(
                "INSERT INTO memory_conversations (imp, scope, channel_id, person, state, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (imp, channel_id, person) DO UPDATE SET"
                " scope = excluded.scope, state = excluded.state, updated_at = excluded.updated_at",
                (self.imp, self.scopes.writes, self.channel_id, person, text, iso(now)),
            )
            conn.execute(
                "DELETE FROM memory_conversations WHERE imp = ? AND channel_id = ? AND person NOT IN ("
                " SELECT person FROM memory_conversations WHERE imp = ? AND channel_id = ?"
                " ORDER BY updated_at DESC, person = ? DESC LIMIT ?)",
                (self.imp, self.channel_id, self.imp, self.channel_id, person, MAX_CONVERSATIONS_PER_CHANNEL),
            )

    # ------------------------------------------------------------ the night (issue 15; the writes scope only)

    def night(self, since: datetime, k: int = 200, episodes: int = 6) -> list[RecordView]:
        """Mechanism 107: the writes scope's records since ``since``, newest first (``MemoryStore.night_records``)."""
        return self.store.night_records(self.imp, self.scopes.writes, since, k, episodes)

    def consolidate(self, groups: Sequence[tuple[str, Sequence[str]]]) -> ConsolidateResult:
        """Mechanisms 108-111, 113: fold groups within the writes scope; every rule checked again here."""
        return self.store.consolidate_scope(self.imp, self.scopes.writes, groups)

    def forget(self) -> tuple[int, int]:
        """Mechanisms 112-113: the forgetting curve over the writes scope; returns (records, episodes)."""
        return self.store.forget_scope(self.imp, self.scopes.writes)


def conversation_json(state: dict[str, Any]) -> str:
    """The state as stored; refuses more than ``MAX_CONVERSATION_STATE_BYTES`` and non-finite numbers."""
    try:
        text = json.dumps(state, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise MemoryInvalid(f"a conversation's state must be plain JSON: {exc}") from None
    size = len(text.encode())
    if size > MAX_CONVERSATION_STATE_BYTES:
        raise MemoryInvalid(
            f"a conversation's state is at most {MAX_CONVERSATION_STATE_BYTES} bytes of JSON (got {size}); "
            "cut the focus or the summary"
        )
    return text
