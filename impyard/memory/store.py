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
or wants, mechanism 83: "I believe: <statement>"). Names are matched in it as written (a name counts only
written as one, issue 32); its lowercased copy ``mention_text`` is only a ``LIKE`` prefilter.

Constructs, the slot and dispositions (issue 14; ``ScopedMemory.construct``, ``slot``, ``slot_refresh``,
``dispositions``, ``learn``): a construct is formed in the session's writes scope and compared only with the
constructs of its own kind there (75, 82); the slot is kept per imp **and scope** (``memory_slots``) and
changed only through the pure law of ``box.memory.slot`` (84-88); learned rules are per imp, shared by
every scope, and name no one (90-98).

The SQL is SQLAlchemy Core over ``impyard.storage.tables`` (docs/storage.md), the same on SQLite and PostgreSQL:
reads in ``db.read`` snapshots, writes in ``db.write`` functions that do database work only (PostgreSQL may run
one again; caches are touched only after it returns). Every write of a scope's records, episodes or slot locks
the scope's ``memory_generations`` row first (``_lock``: in one order, imp then scope; a message's lock before
any, for ``encode`` and ``forget_message``), then reads what it decides on: on PostgreSQL it runs at READ
COMMITTED (``db.write(locking=True)``), so the writers of one scope queue on that row instead of failing to
serialize. Three writes keep SERIALIZABLE, each saying why: ``copy_imp``, ``learn``, ``conversation_put``.
uuid4-hex ids and fixed-width ISO-8601 UTC text times; text that is ordered is ordered byte by byte
(``bytewise``); ``LIKE`` is only a prefilter (both sides lowercased in Python) before a whole-word check.
Statements of a fixed shape are built once, with bind parameters, so SQLAlchemy's compiled cache serves every
turn (issue 18).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, ClassVar, Literal, TypeVar

import numpy as np
from sqlalchemy import (
    ColumnElement,
    Integer,
    Table,
    and_,
    bindparam,
    case,
    cast,
    delete,
    false,
    func,
    insert,
    literal,
    or_,
    select,
    tuple_,
    union,
    update,
)
from sqlalchemy.engine import Connection, RowMapping

from box.common import laws
from box.common import slot as slot_law
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
from impyard.memory.departures import Taught, known_people, taught
from impyard.memory.scopes import SessionScopes, dm_scope
from impyard.memory.vectors import normalised, pack, unpack, unpack_many
from impyard.storage.db import Database, Store
from impyard.storage.portable import bytewise, per_dialect, upsert
from impyard.storage.tables import (
    memory_conversations,
    memory_departures,
    memory_dispositions,
    memory_episodes,
    memory_forgotten_messages,
    memory_generations,
    memory_records,
    memory_slots,
    memory_wakefulness,
)

Clock = Callable[[], datetime]
_T = TypeVar("_T")
SELF = "Self"  # the author of a given record (mechanism 115)
_WORD = re.compile(r"\w+")

_R, _E, _G = memory_records, memory_episodes, memory_generations
_C, _S, _D = memory_conversations, memory_slots, memory_dispositions
_RECORD_NAMES = (
    "id", "kind", "construct_kind", "origin", "author", "author_id", "feeling", "conclusion", "valence", "intensity",
    "happened_at", "last_felt", "dims", "vector", "scope", "gen", "statement",
)  # fmt: skip
_EPISODE_NAMES = (
    "id", "record_id", "author", "author_id", "message_id", "as_happened", "told", "channel_id", "happened_at",
)  # fmt: skip
_RECORD_COLUMNS = tuple(_R.c[name] for name in _RECORD_NAMES)
_EPISODE_COLUMNS = tuple(_E.c[name] for name in _EPISODE_NAMES)


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


def _row_text(row: RowMapping) -> str:
    """A row's text for a whole-word name check: its conclusion, after a construct's statement."""
    statement = row["statement"]
    return f"{statement} {row['conclusion']}" if statement else str(row["conclusion"])


def clean_rule(rule: str) -> str:
    """A learned rule as kept (``laws.clean_rule``): one line, control and format characters out, the arrow
    written one way, at most ``MAX_RULE_CHARS``; refuses a rule left empty. Cleaning only: the rule law is
    ``rule_refused``."""
    text = laws.clean_rule(rule)[:MAX_RULE_CHARS].strip()
    if not text:
        raise MemoryInvalid("a learned rule needs some text")
    return text


KNOWN_PEOPLE_S = 60.0  # how long the names checked as rules are served are kept (``KnownPeople``)


class RuleRefused(MemoryDenied):
    """Issue 32: a learned rule that could carry what a scope holds (the box is answered DENIED)."""

    rule = "memory-rule-law"


def rule_refused(rule: str, lesson: Taught) -> None:
    """The rule law on the host (mechanism 90, issue 32; ``laws.rule_refusal``): raises ``RuleRefused`` for a
    rule holding a name the host knows, a number, an address, a link, a quotation or the conversation's words.

    A rule is the imp's character, read by every scope's boxes (``dispositions``), so only the host can be
    trusted to keep a DM's words out of it: the box that learned it may be hostile."""
    why = laws.rule_refusal(rule, names=lesson.names, said=lesson.said, speakers=lesson.speakers)
    if why is not None:
        raise RuleRefused(f"memory.dispositions.learn: rule refused by {RuleRefused.rule}: {why}")


class KnownPeople:
    """The names of the people each imp knows (``departures.known_people``), read again at most every
    ``KNOWN_PEOPLE_S`` seconds: serving rules checks them every turn, and reading them costs tens of ms over a
    large history. Learning a rule always reads them afresh (``taught``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: dict[str, tuple[float, tuple[str, ...]]] = {}

    def of(self, conn: Connection, imp: str) -> tuple[str, ...]:
        now = time.monotonic()
        with self._lock:
            kept = self._names.get(imp)
        if kept is not None and now - kept[0] < KNOWN_PEOPLE_S:
            return kept[1]
        names = tuple(known_people(conn, imp, memories=False))
        with self._lock:
            self._names[imp] = (now, names)
            while len(self._names) > MAX_CACHED_COUNTS:
                self._names.pop(next(iter(self._names)))
        return names


def served_rules(rules: Sequence[DispositionView], names: Sequence[str]) -> list[DispositionView]:
    """The rules a box may be given: those the rule law keeps with the people the imp knows now. A rule kept
    before issue 32 (when only the box checked), or one naming someone the imp met since, is never served."""
    people = laws.people(tuple(names))
    return [rule for rule in rules if laws.rule_refusal(rule.rule, names=people) is None]


def _disposition(row: RowMapping) -> DispositionView:
    return DispositionView(
        id=row["id"], rule=row["rule"], weight=float(row["weight"]), count=int(row["count"]),
        updated_at=parse_iso(row["updated_at"]),
    )  # fmt: skip


def _dispositions(
    conn: Connection, imp: str, limit: int | None, *, active_only: bool
) -> list[DispositionView]:
    """Mechanisms 94, 98-99: the imp's rules, strongest |weight| first (ties: the most recently learned);
    ``active_only``: only |weight| above ``laws.DORMANT_WEIGHT``."""
    statement = _DISPOSITIONS[active_only]
    if limit is not None:
        statement = statement.limit(bindparam("limit"))
    params = {"imp": imp, "dormant": laws.DORMANT_WEIGHT, "limit": limit}
    return [_disposition(row) for row in conn.execute(statement, params).mappings()]


def like_pattern(name: str) -> str:
    """A ``LIKE … ESCAPE '\\'`` pattern finding ``name`` anywhere, its % and _ taken literally."""
    escaped = name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


# pg_advisory_xact_lock(MESSAGE_LOCK_CLASS, key): one message's episodes, taken by ``encode`` and ``forget_message``
# (b"memo"; the two-key space is apart from the one-key space of the migrator's lock).
MESSAGE_LOCK_CLASS = 0x6D656D6F
MAX_CACHED_COUNTS = 10_000  # (imp, scope) totals kept between writes
ABOUT_SCAN_CHARS = 1_000_000  # issue 32 #5: record text one memory.about reads for its name, strongest first
MAX_RULES = 1_000  # learned rules kept per imp: past it the weakest goes (dormant first, then oldest)
MAX_CONVERSATIONS_PER_CHANNEL = (
    200  # people whose conversation state a channel keeps (the most recently saved)
)
_DISPOSITION_NAMES = ("id", "rule", "weight", "count", "created_at", "updated_at")
_DISPOSITIONS = {
    active_only: select(*(_D.c[name] for name in _DISPOSITION_NAMES))
    .where(_D.c.imp == bindparam("imp"), *([func.abs(_D.c.weight) > bindparam("dormant")] if active_only else []))
    .order_by(
        func.abs(_D.c.weight).desc(), bytewise(_D.c.updated_at).desc(), bytewise(_D.c.created_at).desc(),
        bytewise(_D.c.id),
    )
    for active_only in (False, True)
}  # fmt: skip
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
        if author in self.names or laws.mentions_in_any_case(text, self.mentioned):  # "carol" too
            return "name"
        return None


@dataclass(frozen=True)
class _Reach:
    """Whose memories a query may touch: one imp, and its scopes (None: every scope — the operator only)."""

    imp: str
    scopes: tuple[str, ...] | None

    @property
    def shape(self) -> str:
        """What the clause looks like (statements are kept per shape): every scope, some, or none."""
        return "all" if self.scopes is None else "some" if self.scopes else "none"

    @staticmethod
    def criterion(table: Table, shape: str) -> ColumnElement[bool]:
        """The one scope filter, with the bind parameters ``reach_imp`` and ``reach_scopes`` (``params``)."""
        if shape == "none":
            return false()
        imp = table.c.imp == bindparam("reach_imp")
        if shape == "all":
            return imp
        return and_(imp, table.c.scope.in_(bindparam("reach_scopes", expanding=True)))

    def where(self, table: Table) -> ColumnElement[bool]:
        return self.criterion(table, self.shape)

    def params(self, **more: Any) -> dict[str, Any]:
        return {"reach_imp": self.imp, "reach_scopes": list(self.scopes or ()), **more}


_BUILT: dict[tuple[str, str], Any] = {}


def _per_reach(name: str, reach: _Reach, build: Callable[[str], Any]) -> Any:
    """A statement of a fixed shape, built once per reach shape (``_Reach.criterion``) and kept."""
    key = (name, reach.shape)
    statement = _BUILT.get(key)
    if statement is None:
        statement = _BUILT[key] = build(reach.shape)
    return statement


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
    """Mechanism 113: constructs and given records are never absorbed and never forgotten. Nor are kept
    records (issue 32, a departure from the seed: docs/memory.md "Keeping"): what someone told the imp that
    a friend would still know months on is not lost with the small talk around it."""
    return kind == "construct" or origin in ("given", "kept")


def anchor_refusal(
    kind: str, origin: str, intensity: float, params: laws.Params = laws.DEFAULTS
) -> str | None:
    """Mechanisms 108, 113 (subtle point 16): why a record cannot anchor a group, or None when it can: it
    must not be a construct and its stored intensity must be at least ``anchor_minimum`` (a given record
    may anchor)."""
    if kind == "construct":
        return "a construct"
    if origin == "kept":  # issue 32: small talk folded into a kept record would never fade
        return "kept"
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
    """``ids`` in lists of ``_CHUNK``: one ``IN (…)`` each, well under either engine's bound on parameters."""
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


# ------------------------------------------------------------------ statements of a fixed shape (built once)

# The scopes' generation rows, locked in one order (imp, then scope, byte by byte) before a write reads what it
# decides on (``MemoryStore._lock``); the rows not there yet are made first, at the ``Generation()`` they stand for.
_LOCK_GENERATIONS = (
    select(_G.c.imp, _G.c.scope)
    .where(tuple_(_G.c.imp, _G.c.scope).in_(bindparam("keys", expanding=True)))
    .order_by(bytewise(_G.c.imp), bytewise(_G.c.scope))
    .with_for_update()
)
_LOCK_IMP = (
    select(_G.c.scope).where(_G.c.imp == bindparam("imp")).order_by(bytewise(_G.c.scope)).with_for_update()
)
_LOCK_MESSAGE = select(
    func.pg_advisory_xact_lock(cast(bindparam("lock_class"), Integer), cast(bindparam("lock_key"), Integer))
)
_SCOPES_OF_MESSAGE = (
    select(_E.c.imp, _E.c.scope)
    .distinct()
    .where(_E.c.channel_id == bindparam("channel_id"), _E.c.message_id == bindparam("message_id"))
)
_GENERATION = select(_G.c.version, _G.c.deletes).where(
    _G.c.imp == bindparam("imp"), _G.c.scope == bindparam("scope")
)
_SCOPES_OF = select(_G.c.scope).where(_G.c.imp == bindparam("imp"))
_GENERATIONS = select(_G.c.scope, _G.c.version, _G.c.deletes).where(
    _G.c.imp == bindparam("imp"), _G.c.scope.in_(bindparam("scopes", expanding=True))
)


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


@per_dialect
def _BUMP(dialect: str) -> Any:  # noqa: N802 - a statement
    """The scope's next generation, in one statement: created at 1, else moved on by one (RETURNING it)."""
    statement = upsert(dialect)(_G).values(
        imp=bindparam("imp"), scope=bindparam("scope"), version=1, deletes=bindparam("deletes")
    )
    return statement.on_conflict_do_update(
        index_elements=[_G.c.imp, _G.c.scope],
        set_={"version": _G.c.version + 1, "deletes": _G.c.deletes + statement.excluded.deletes},
    ).returning(_G.c.version)


@per_dialect
def _NEW_GENERATION(dialect: str) -> Any:  # noqa: N802 - a statement
    """A scope's generation row made at 0 (what a scope never written stands at), or left as it is."""
    return (
        upsert(dialect)(_G)
        .values(imp=bindparam("imp"), scope=bindparam("scope"), version=0, deletes=0)
        .on_conflict_do_nothing(index_elements=[_G.c.imp, _G.c.scope])
    )


@per_dialect
def _MARK_FORGOTTEN(dialect: str) -> Any:  # noqa: N802 - a statement
    return (
        upsert(dialect)(memory_forgotten_messages)
        .values(
            channel_id=bindparam("channel_id"),
            message_id=bindparam("message_id"),
            forgotten_at=bindparam("at"),
        )
        .on_conflict_do_nothing(index_elements=["channel_id", "message_id"])
    )


@per_dialect
def _SAVE_CONVERSATION(dialect: str) -> Any:  # noqa: N802 - a statement
    statement = upsert(dialect)(_C).values(
        imp=bindparam("imp"), scope=bindparam("scope"), channel_id=bindparam("channel_id"),
        person=bindparam("person"), state=bindparam("state"), updated_at=bindparam("at"),
    )  # fmt: skip
    return statement.on_conflict_do_update(
        index_elements=[_C.c.imp, _C.c.channel_id, _C.c.person],
        set_={
            "scope": statement.excluded.scope,
            "state": statement.excluded.state,
            "updated_at": statement.excluded.updated_at,
        },
    )


_kept = (
    select(_C.c.person)
    .where(_C.c.imp == bindparam("imp"), _C.c.channel_id == bindparam("channel_id"))
    .order_by(bytewise(_C.c.updated_at).desc(), (_C.c.person == bindparam("person")).desc())
    .limit(bindparam("keep"))
)
# The channel's most recently saved people are kept; the portable form of a LIMIT in a DELETE: NOT IN (SELECT …).
_TRIM_CONVERSATIONS = delete(_C).where(
    _C.c.imp == bindparam("imp"), _C.c.channel_id == bindparam("channel_id"), _C.c.person.not_in(_kept)
)
_INSERT_RECORD = insert(_R)
_INSERT_EPISODE = insert(_E)
_INSERT_SLOT = insert(_S)
_REFEEL = (
    update(_R)
    .where(_R.c.id == bindparam("rid"))
    .values(intensity=bindparam("intensity"), last_felt=bindparam("at"), gen=bindparam("gen"))
)
_EPISODE_OWNER = select(_E.c.record_id, _E.c.imp, _E.c.scope).where(_E.c.id == bindparam("eid"))
_DELETE_EPISODE = delete(_E).where(_E.c.id == bindparam("eid"))
_EPISODES_LEFT = select(func.count()).select_from(_E).where(_E.c.record_id == bindparam("rid"))
_RECORD_OWNER = select(_R.c.imp, _R.c.scope).where(_R.c.id == bindparam("rid"))
_DELETE_EPISODES_OF = delete(_E).where(_E.c.record_id == bindparam("rid"))
_DELETE_RECORD = delete(_R).where(_R.c.id == bindparam("rid"))
_TWINS = (
    select(_R.c.id, _R.c.intensity, _R.c.valence, _R.c.last_felt, _R.c.statement, _R.c.vector)
    .where(
        _R.c.imp == bindparam("imp"), _R.c.scope == bindparam("scope"), _R.c.kind == "construct",
        _R.c.construct_kind == bindparam("construct_kind"), _R.c.dims == bindparam("dims"), _R.c.vector.is_not(None),
    )
    .order_by(bytewise(_R.c.last_felt).desc(), _R.c.gen.desc())
)  # fmt: skip
_found = _R.alias("r")
_HELD = (
    select(_S.c.record_id, _S.c.activated_at, _found.c.id.label("found"), _found.c.construct_kind, _found.c.intensity)
    .select_from(
        _S.outerjoin(
            _found,
            and_(
                _found.c.id == _S.c.record_id, _found.c.imp == _S.c.imp, _found.c.scope == _S.c.scope,
                _found.c.kind == "construct",
            ),
        )
    )
    .where(_S.c.imp == bindparam("imp"), _S.c.scope == bindparam("scope"))
)  # fmt: skip
_SLOT_VIEW = (
    select(_S.c.record_id, _S.c.activated_at, _found.c.construct_kind, _found.c.intensity)
    .select_from(
        _S.join(
            _found,
            and_(_found.c.id == _S.c.record_id, _found.c.imp == _S.c.imp, _found.c.scope == _S.c.scope),
        )
    )
    .where(_S.c.imp == bindparam("imp"), _S.c.scope == bindparam("scope"))
)
_SLOT_SCOPES = select(_S.c.scope).distinct().where(_S.c.imp == bindparam("imp"))
_CLEAR_SLOT = delete(_S).where(_S.c.imp == bindparam("imp"), _S.c.scope == bindparam("scope"))
_CONSTRUCT = select(_R.c.construct_kind, _R.c.intensity).where(
    _R.c.id == bindparam("rid"), _R.c.imp == bindparam("imp"), _R.c.scope == bindparam("scope"),
    _R.c.kind == "construct",
)  # fmt: skip
_SCOPE_COUNT = (
    select(func.count()).select_from(_R).where(_R.c.imp == bindparam("imp"), _R.c.scope == bindparam("scope"))
)
_FORGOTTEN = select(literal(1)).where(
    memory_forgotten_messages.c.channel_id == bindparam("channel_id"),
    memory_forgotten_messages.c.message_id == bindparam("message_id"),
)
_TABLES = {table.name: table for table in (_R, _E, _C, _S, _D)}
_ANY_OF_IMP = {table: select(literal(1)).select_from(_TABLES[table]).where(
    _TABLES[table].c.imp == bindparam("imp")).limit(1) for table in _IMP_TABLES}  # fmt: skip
_SCOPE_OF_RECORD = select(_R.c.scope).where(_R.c.id == bindparam("rid"))
_UPDATE_RULE = update(_D).where(_D.c.id == bindparam("rid"))
_NAMED_RULE = select(_D.c.id, _D.c.rule, _D.c.weight).where(
    _D.c.id == bindparam("rid"), _D.c.imp == bindparam("imp")
)
_RULES_OF = select(func.count()).select_from(_D).where(_D.c.imp == bindparam("imp"))
_weakest = (
    select(_D.c.id)
    .where(_D.c.imp == bindparam("imp"), _D.c.id != bindparam("rid"))
    .order_by(
        func.abs(_D.c.weight) > bindparam("dormant"), func.abs(_D.c.weight), bytewise(_D.c.updated_at),
        bytewise(_D.c.created_at), bytewise(_D.c.id),
    )
    .limit(bindparam("excess"))
)  # fmt: skip
_TRIM_RULES = delete(_D).where(_D.c.id.in_(_weakest))  # the weakest go: dormant first, then smallest |weight|


def _records_stmt(shape: str) -> Any:
    return select(*_RECORD_COLUMNS).where(_Reach.criterion(_R, shape))


_NEWEST_FILTERS: dict[str, tuple[ColumnElement[bool], ...]] = {
    "any": (),
    "kinds": (_R.c.kind.in_(bindparam("kinds", expanding=True)),),
    "construct": (_R.c.kind == "construct", _R.c.construct_kind == bindparam("construct_kind")),
}


def _newest_stmt(filter_: str) -> Callable[[str], Any]:
    """The most recently felt records of one scope (its index: imp, scope, last_felt, gen), filtered."""

    def build(shape: str) -> Any:
        return (
            _records_stmt(shape)
            .where(*_NEWEST_FILTERS[filter_])
            .order_by(bytewise(_R.c.last_felt).desc(), _R.c.gen.desc())
            .limit(bindparam("k"))
        )

    return build


_NEWEST = {filter_: _newest_stmt(filter_) for filter_ in _NEWEST_FILTERS}


def _about_stmt(shape: str) -> Any:
    return (
        _records_stmt(shape)
        .where(
            _R.c.kind.in_(bindparam("kinds", expanding=True)),
            or_(
                _R.c.author == bindparam("person"), _R.c.author_id == bindparam("person"),
                _R.c.mention_text.like(bindparam("pattern"), escape="\\"),
            ),
        )
        .order_by(_R.c.intensity.desc(), bytewise(_R.c.last_felt).desc(), bytewise(_R.c.id))
    )  # fmt: skip


def _hit_first(hit: Hit) -> tuple[str, ...]:
    """A hit's best-matching episodes with its hit episode first (mechanism 16)."""
    if hit.hit_episode is None:
        return hit.matched
    return (hit.hit_episode, *(e for e in hit.matched if e != hit.hit_episode))


def _rows_by_id(shape: str) -> Any:
    """The rows of ``ids`` within the reach: looked up by id first (a scope scan would be slow on SQLite)."""
    ids = select(_R).where(_R.c.id.in_(bindparam("ids", expanding=True))).limit(bindparam("n")).subquery("r")
    return select(*(ids.c[name] for name in _RECORD_NAMES)).where(_Reach.criterion(ids, shape))  # type: ignore[arg-type]


def _newest_episodes(shape: str) -> Any:
    """Each named record's newest ``per`` episodes within the reach, in one query (newest first). Ranked by
    record id first (its index), the reach checked outside: an episode is always in its record's scope."""
    rank = (
        func.row_number()
        .over(
            partition_by=_E.c.record_id,
            order_by=(bytewise(_E.c.happened_at).desc(), _E.c.gen.desc(), bytewise(_E.c.id)),
        )
        .label("rank")
    )
    ranked = (
        select(*_EPISODE_COLUMNS, _E.c.imp, _E.c.scope, rank)
        .where(_E.c.record_id.in_(bindparam("ids", expanding=True)))
        .subquery("e")
    )
    return (
        select(*(ranked.c[name] for name in _EPISODE_NAMES))
        .where(ranked.c.rank <= bindparam("per"), _Reach.criterion(ranked, shape))  # type: ignore[arg-type]
        .order_by(ranked.c.record_id, ranked.c.rank)
    )


def _episodes_by_ids(shape: str) -> Any:
    return select(*_EPISODE_COLUMNS).where(
        _E.c.id.in_(bindparam("ids", expanding=True)), _Reach.criterion(_E, shape)
    )


def _scopes_of_ids(shape: str) -> Any:
    return (
        select(_R.c.scope)
        .distinct()
        .where(_R.c.id.in_(bindparam("ids", expanding=True)), _Reach.criterion(_R, shape))
    )


def _refeel_row(shape: str) -> Any:
    return select(_R.c.intensity, _R.c.valence, _R.c.last_felt, _R.c.scope).where(
        _R.c.id == bindparam("rid"), _Reach.criterion(_R, shape)
    )


def _conversation(shape: str) -> Any:
    return select(_C.c.state, _C.c.updated_at).where(
        _Reach.criterion(_C, shape),
        _C.c.channel_id == bindparam("channel_id"),
        _C.c.person == bindparam("person"),
    )


# ------------------------------------------------------------------ the store


class _Seen(Loader):
    """The store as the cache's loader, with the generations of one search already read (one read, not one per
    scope); the rows still come from the store."""

    def __init__(self, store: MemoryStore, imp: str, seen: dict[str, Generation]) -> None:
        self.store, self.imp, self.seen = store, imp, seen

    def generation(self, imp: str, scope: str) -> Generation:
        found = self.seen.get(scope) if imp == self.imp else None
        return found if found is not None else self.store.generation(imp, scope)

    def rows(self, imp: str, scope: str, dims: int, since: int | None) -> tuple[RecordRows, EpisodeRows]:
        return self.store.rows(imp, scope, dims, since)


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
        self.people = KnownPeople()  # issue 32: whom the rules served must not name

    def _locked(self, fn: Callable[[Connection], _T]) -> _T:
        """``db.write(fn, locking=True)``: ``fn`` locks the generation rows of the scopes it reads to decide and
        writes (``_lock``) before it reads them, so on PostgreSQL it runs at READ COMMITTED and the writers of one
        scope queue on its row, each reading what the one before it left, instead of failing to serialize and
        running again (docs/storage.md, ``db.write(fn, locking=True)``). On SQLite ``BEGIN IMMEDIATE`` is the lock."""
        return self.db.write(fn, locking=True)

    @staticmethod
    def _lock(conn: Connection, keys: Iterable[tuple[str, str]]) -> None:
        """Lock the generation rows of ``keys`` ((imp, scope) pairs) in one order, imp then scope byte by byte,
        before anything they guard is read: every write of a scope's records, episodes or slot takes its row
        first (``encode`` and ``forget_message`` take a message's lock before that), so none waits on another
        in a circle. A row not there yet is made first, at 0 (what a scope never written stands at), so a
        scope's first writers queue too. PostgreSQL only: SQLite's ``BEGIN IMMEDIATE`` holds the whole database."""
        if conn.dialect.name != "postgresql":
            return
        ordered = sorted(set(keys), key=lambda key: (key[0].encode(), key[1].encode()))
        if not ordered:
            return
        conn.execute(
            _NEW_GENERATION(conn.dialect.name), [{"imp": imp, "scope": scope} for imp, scope in ordered]
        )
        conn.execute(_LOCK_GENERATIONS, {"keys": ordered}).all()

    @staticmethod
    def _lock_imp(conn: Connection, imp: str) -> None:
        """Lock every generation row of ``imp``, in ``_lock``'s order (a write over all its scopes)."""
        if conn.dialect.name == "postgresql":
            conn.execute(_LOCK_IMP, {"imp": imp}).all()

    @staticmethod
    def _lock_message(conn: Connection, channel_id: str, message_id: str) -> None:
        """The lock of one message's episodes (PostgreSQL; taken before any generation row): ``encode`` checks
        that the message was not deleted and keeps its episode, ``forget_message`` marks it deleted and takes its
        episodes, and neither between the other's check and write (each of them in any imp's scope)."""
        if conn.dialect.name != "postgresql":
            return
        digest = hashlib.sha256(f"{channel_id}\0{message_id}".encode()).digest()
        key = int.from_bytes(digest[:4], "big", signed=True)
        conn.execute(_LOCK_MESSAGE, {"lock_class": MESSAGE_LOCK_CLASS, "lock_key": key}).all()

    @staticmethod
    def _restored_scopes(conn: Connection, reach: _Reach, items: Sequence[Restore]) -> set[str]:
        """The scopes (within ``reach``) of the records ``items`` name: the rows a restore locks first. A
        record's scope never changes, so reading it before the lock is safe."""
        ids = list(dict.fromkeys(item.record_id for item in items))
        if not ids:
            return set()
        statement = _per_reach("scopes_of_ids", reach, _scopes_of_ids)
        return {str(row[0]) for row in conn.execute(statement, reach.params(ids=ids))}

    def scoped(self, imp: str, scopes: SessionScopes, channel_id: str) -> ScopedMemory:
        """The session's view: the only way a box's request reaches the store."""
        return ScopedMemory(self, imp, scopes, channel_id)

    # ------------------------------------------------------------ the cache's loader

    def generation(self, imp: str, scope: str) -> Generation:
        row = self.db.read(lambda conn: conn.execute(_GENERATION, {"imp": imp, "scope": scope}).first())
        return Generation(int(row[0]), int(row[1])) if row else Generation()

    @staticmethod
    def _generations(conn: Connection, imp: str, scopes: Sequence[str]) -> dict[str, Generation]:
        """The generations of ``scopes`` (one query; a scope never written is at ``Generation()``)."""
        found = dict.fromkeys(scopes, Generation())
        for row in conn.execute(_GENERATIONS, {"imp": imp, "scopes": list(found)}):
            found[str(row[0])] = Generation(int(row[1]), int(row[2]))
        return found

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

    # ------------------------------------------------------------ shared by the scoped view and the operator

    @staticmethod
    def _bump(conn: Connection, imp: str, scope: str, *, deleted: bool = False) -> int:
        """The scope's next generation (inside the caller's write transaction)."""
        params = {"imp": imp, "scope": scope, "deletes": 1 if deleted else 0}
        return int(conn.execute(_BUMP(conn.dialect.name), params).scalar_one())

    def _scopes_of(self, conn: Connection, imp: str) -> list[str]:
        return sorted(str(r[0]) for r in conn.execute(_SCOPES_OF, {"imp": imp}))

    def _view(
        self, row: RowMapping, now: datetime, with_vector: bool, *, operator: bool = False
    ) -> RecordView:
        """The row as a box sees it; for the operator (``operator``), a ``StoredRecord`` with its scope."""
        last_felt = parse_iso(row["last_felt"])
        valence, intensity = float(row["valence"]), float(row["intensity"])
        vector = (
            unpack(int(row["dims"]), bytes(row["vector"])).tolist() if with_vector and row["vector"] else None
        )
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
    def _episode(row: RowMapping) -> EpisodeView:
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

    @staticmethod
    def _records(
        conn: Connection,
        reach: _Reach,
        *where: ColumnElement[bool],
        order: Sequence[Any] = (bytewise(_R.c.last_felt).desc(), _R.c.gen.desc()),
        limit: int | None = None,
    ) -> list[RowMapping]:
        """Record rows within ``reach`` (the one scope filter), with extra conditions and an order."""
        statement = _per_reach("records", reach, _records_stmt).where(*where).order_by(*order)
        if limit is not None:
            statement = statement.limit(limit)
        return list(conn.execute(statement, reach.params()).mappings())

    def _newest(
        self, conn: Connection, reach: _Reach, filter_: str, k: int, **params: Any
    ) -> list[RowMapping]:
        """The ``k`` most recently felt records within ``reach`` (``_NEWEST_FILTERS``): one indexed query per
        scope, merged."""
        scopes = reach.scopes if reach.scopes is not None else tuple(self._scopes_of(conn, reach.imp))
        rows: list[RowMapping] = []
        for scope in scopes:
            one = _Reach(reach.imp, (scope,))
            statement = _per_reach(f"newest-{filter_}", one, _NEWEST[filter_])
            rows.extend(conn.execute(statement, one.params(k=k, **params)).mappings())
        rows.sort(key=lambda r: (r["last_felt"], r["gen"]), reverse=True)
        return rows[:k]

    @staticmethod
    def _records_by_id(conn: Connection, reach: _Reach, ids: Sequence[str]) -> list[RowMapping]:
        """The rows of ``ids`` within ``reach`` (the ids are looked up first: a scope scan would be slow)."""
        if not ids:
            return []
        statement = _per_reach("by_id", reach, _rows_by_id)
        return list(conn.execute(statement, reach.params(ids=list(ids), n=len(ids))).mappings())

    def _episodes_of(
        self, conn: Connection, reach: _Reach, record_ids: Sequence[str], per_record: int
    ) -> dict[str, list[EpisodeView]]:
        """Each record's newest ``per_record`` episodes, newest first (mechanism 116), in one query."""
        found: dict[str, list[EpisodeView]] = {}
        if per_record <= 0 or not record_ids:
            return found
        statement = _per_reach("episodes", reach, _newest_episodes)
        for row in conn.execute(statement, reach.params(ids=list(record_ids), per=per_record)).mappings():
            found.setdefault(row["record_id"], []).append(self._episode(row))
        return found

    def _with_episodes(
        self,
        conn: Connection,
        reach: _Reach,
        views: list[RecordView],
        per_record: int,
        matched: dict[str, tuple[str, ...]] | None = None,
    ) -> list[RecordView]:
        """Load each record's episodes, ``per_record`` at most: a search's best-matching ones first (the hit
        episode first of all: mechanism 16), then the newest (116) to fill the rest.

        The seed loads the hit and the 3 newest; on a long record (a session of one feeling holds dozens of
        turns) that showed one turn the words are about and three that happened to be last (issue 32)."""
        if per_record <= 0:
            return views
        newest = self._episodes_of(conn, reach, [view.id for view in views], per_record)
        shown = {e.id for episodes in newest.values() for e in episodes}
        missing = [eid for ids in (matched or {}).values() for eid in ids[:per_record] if eid not in shown]
        loaded: dict[str, EpisodeView] = {}
        if missing:  # one read for every matched episode that is not among its record's newest
            statement = _per_reach("episodes-by-id", reach, _episodes_by_ids)
            for row in conn.execute(statement, reach.params(ids=missing)).mappings():
                loaded[row["id"]] = self._episode(row)
        for view in views:
            episodes = newest.get(view.id, [])
            wanted = list((matched or {}).get(view.id, ()))[:per_record]
            if wanted:
                have = {e.id: e for e in episodes} | loaded
                first = [have[eid] for eid in wanted if eid in have]
                ids = {e.id for e in first}
                episodes = (first + [e for e in episodes if e.id not in ids])[:per_record]
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

        def generations(conn: Connection) -> dict[str, Generation]:
            scopes = reach.scopes if reach.scopes is not None else self._scopes_of(conn, reach.imp)
            return self._generations(conn, reach.imp, scopes)

        seen = self.db.read(generations)  # every scope's generation in one read: the cache checks them
        ranked: list[Hit] = self.cache.search(
            _Seen(self, reach.imp, seen), reach.imp, tuple(seen), vector, names, k, kinds, now.timestamp(),
            per_record=episodes,
        )  # fmt: skip
        if not ranked:
            return []

        def read(conn: Connection) -> list[RecordView]:
            rows = {r["id"]: r for r in self._records_by_id(conn, reach, [h.record_id for h in ranked])}
            views: list[RecordView] = []
            for hit in ranked:
                row = rows.get(hit.record_id)
                if row is None:  # deleted since the cache saw it, or (never) outside the reach
                    continue
                view = self._view(row, now, with_vectors, operator=operator)
                view.score = hit.score
                view.hit_episode = hit.hit_episode
                views.append(view)
            matched = {h.record_id: _hit_first(h) for h in ranked}
            return self._with_episodes(conn, reach, views, episodes, matched)

        return self.db.read(read)

    def _about(
        self,
        conn: Connection,
        reach: _Reach,
        person: str,
        k: int,
        exclude: Iterable[str] = (),
        kinds: Sequence[str] = BOTH_KINDS,
    ) -> list[RowMapping]:
        """Records authored by ``person`` (exact name or id) or naming them, strongest stored intensity first.

        The name is looked for in at most ``ABOUT_SCAN_CHARS`` of record text a request (issue 32 #5): a box
        asking about a common word ("the") is answered from the strongest records read by then, never made to
        scan every record of a large memory."""
        excluded = set(exclude)
        found: list[RowMapping] = []
        budget = ABOUT_SCAN_CHARS
        statement = _per_reach("about", reach, _about_stmt)
        params = reach.params(kinds=list(kinds), person=person, pattern=like_pattern(person.strip().lower()))
        for row in conn.execute(statement, params).mappings():
            if row["id"] in excluded:
                continue
            if row["author"] != person and row["author_id"] != person:
                text = _row_text(row)
                budget -= len(text)
                if budget < 0:
                    break  # the request's name work is spent: what it found among the strongest stands
                if not laws.mentions(text, [person]):
                    continue
            found.append(row)
            if len(found) >= k:
                break
        return found

    def _refeel(
        self,
        conn: Connection,
        reach: _Reach,
        items: Sequence[Restore],
        now: datetime,
        gens: dict[str, int],
        locked: set[str],
    ) -> int:
        """Mechanisms 65, 66, 69, 70: each named record in reach re-felt at ``now``; others ignored, not counted.
        ``gens`` (scope -> generation bumped in this transaction) is the caller's, filled in here; ``locked``: the
        scopes the caller locked first (``_restored_scopes``): a record read is re-felt from what it holds now."""
        statement = _per_reach("refeel", reach, _refeel_row)
        restored = 0
        for item in items:
            row = conn.execute(statement, reach.params(rid=item.record_id)).mappings().first()
            if row is None or str(row["scope"]) not in locked:  # not locked: none (a record's scope is fixed)
                continue
            scope = str(row["scope"])
            if scope not in gens:
                gens[scope] = self._bump(conn, reach.imp, scope)
            intensity = laws.refelt(
                float(row["intensity"]), float(row["valence"]), parse_iso(row["last_felt"]), now, item.toward
            )
            # valence and happened_at are never written here (mechanisms 70, 117); last_felt is now, always
            conn.execute(
                _REFEEL, {"intensity": intensity, "at": iso(now), "gen": gens[scope], "rid": item.record_id}
            )
            restored += 1
        return restored

    @staticmethod
    def _insert_record(
        conn: Connection,
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
            _INSERT_RECORD,
            dict(
                id=record_id, imp=imp, scope=scope, kind=kind, construct_kind=construct_kind, origin=origin,
                author=author, author_id=author_id, feeling=feeling, conclusion=conclusion,
                mention_text=record_text(conclusion, statement), valence=valence, intensity=intensity,
                happened_at=iso(happened_at), last_felt=iso(last_felt), dims=dims, vector=blob, gen=gen,
                created_at=iso(now), statement=statement,
            ),
        )  # fmt: skip
        return record_id

    @staticmethod
    def _insert_episode(
        conn: Connection,
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
            _INSERT_EPISODE,
            dict(
                id=episode_id, record_id=record_id, imp=imp, scope=scope, channel_id=channel_id,
                message_id=message_id, author=author, author_id=author_id, as_happened=as_happened, told=told,
                happened_at=iso(happened_at), dims=dims, vector=blob, gen=gen,
            ),
        )  # fmt: skip
        return episode_id

    @staticmethod
    def _delete(
        conn: Connection, episode_ids: set[str], record_ids: set[str]
    ) -> tuple[int, int, set[tuple[str, str]]]:
        """Delete episodes, then records (with their episodes), then records left without an episode.

        Returns (records, episodes, the (imp, scope) pairs touched); the caller bumps their generations.
        """
        touched: set[tuple[str, str]] = set()
        orphans: set[str] = set()
        episodes = 0
        for episode_id in sorted(episode_ids):
            row = conn.execute(_EPISODE_OWNER, {"eid": episode_id}).first()
            if row is None:
                continue
            conn.execute(_DELETE_EPISODE, {"eid": episode_id})
            episodes += 1
            orphans.add(str(row[0]))
            touched.add((str(row[1]), str(row[2])))
        for record_id in sorted(orphans - record_ids):
            if not conn.execute(_EPISODES_LEFT, {"rid": record_id}).scalar_one():
                record_ids = record_ids | {record_id}
        records = 0
        for record_id in sorted(record_ids):
            owner = conn.execute(_RECORD_OWNER, {"rid": record_id}).first()
            if owner is None:
                continue
            episodes += conn.execute(_DELETE_EPISODES_OF, {"rid": record_id}).rowcount
            conn.execute(_DELETE_RECORD, {"rid": record_id})
            records += 1
            touched.add((str(owner[0]), str(owner[1])))
        return records, episodes, touched

    # ------------------------------------------------------------ constructs and the slot (shared)

    @staticmethod
    def _twin(
        conn: Connection,
        imp: str,
        scope: str,
        construct_kind: str,
        vector: Sequence[float] | None,
    ) -> RowMapping | None:
        """Mechanisms 75, 82 (subtle point 12): the construct of the same kind in ``scope`` most like
        ``vector``, if its cosine is at least ``construct_duplicate``; vectors of another length never compare."""
        if vector is None:
            return None
        query = normalised(vector)
        params = {"imp": imp, "scope": scope, "construct_kind": construct_kind, "dims": int(query.size)}
        rows = conn.execute(_TWINS, params).mappings().all()
        if not rows:
            return None
        matrix = unpack_many(int(query.size), [bytes(row["vector"]) for row in rows])
        norms = np.linalg.norm(matrix, axis=1)
        cosines = (matrix @ query) / np.where(norms > 0, norms, 1.0)
        best = int(np.argmax(cosines))  # the most recently felt of equals
        return rows[best] if float(cosines[best]) >= laws.DEFAULTS.construct_duplicate else None

    def _held(self, conn: Connection, imp: str, scope: str, now: datetime) -> list[slot_law.Held]:
        """Mechanisms 87-88: the slot of (imp, scope) as loaded; rows that left it are deleted."""
        rows = conn.execute(_HELD, {"imp": imp, "scope": scope}).mappings().all()
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
    def _write_slot(conn: Connection, imp: str, scope: str, held: Sequence[slot_law.Held]) -> None:
        conn.execute(_CLEAR_SLOT, {"imp": imp, "scope": scope})
        if held:
            conn.execute(
                _INSERT_SLOT,
                [
                    {"imp": imp, "scope": scope, "record_id": h.id, "activated_at": iso(h.activated_at)}
                    for h in held
                ],
            )

    def _activated(
        self, conn: Connection, imp: str, scope: str, record_id: str, now: datetime
    ) -> list[slot_law.Held]:
        """Mechanisms 84-86: the slot after the construct ``record_id`` (in ``scope``) is brought to mind."""
        held = self._held(conn, imp, scope, now)
        row = conn.execute(_CONSTRUCT, {"rid": record_id, "imp": imp, "scope": scope}).first()
        if row is None:
            return held
        new = slot_law.Held(record_id, str(row[0]), float(row[1]), now)
        after = slot_law.activate(held, new)
        if after != held:
            self._write_slot(conn, imp, scope, after)
        return after

    def _entries(
        self,
        conn: Connection,
        imp: str,
        scope: str,
        held: Sequence[slot_law.Held],
        now: datetime,
        *,
        operator: bool = False,
    ) -> list[SlotEntry]:
        """The held constructs as the box sees them (felt now), oldest activation first."""
        rows = {r["id"]: r for r in self._records_by_id(conn, _Reach(imp, (scope,)), [h.id for h in held])}
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

        def read(conn: Connection) -> list[RecordView]:
            if person is None:
                rows = self._newest(conn, reach, "any", limit)
            else:
                rows = self._about(conn, reach, person, limit)
                rows.sort(key=lambda r: (r["last_felt"], r["id"]), reverse=True)
            return self._with_episodes(
                conn, reach, [self._view(r, now, False, operator=True) for r in rows], episodes
            )

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

        def write(conn: Connection) -> str:  # nothing read: the bump locks the scope's row, first
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

        return self._locked(write)

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
        # The imp's own thoughts formed in a DM with them go with that DM's scope, as its lived records do.
        dm_scopes = [dm_scope(person_id) for person_id in person.ids]

        def write(conn: Connection) -> Forgotten:
            # Every scope of the imp is locked first: what is read below is what no write of those scopes is
            # changing. A scope first written meanwhile is not (it had no row): a record or an episode of it
            # committed before a read below is taken (a record left without an episode goes too), one after it
            # is as if it came after this forgetting.
            self._lock_imp(conn, imp)
            found = {"id": 0, "name": 0}
            # SQL finds the candidates; the whole-word check is Python's (laws.mentions), portable and exact.
            candidates = select(_R.c.id, _R.c.author, _R.c.author_id, _R.c.conclusion, _R.c.statement).where(
                _R.c.imp == imp,
                or_(
                    _R.c.author_id.in_(person.ids), _R.c.author.in_(person.names),
                    *(_R.c.mention_text.like(like_pattern(name.lower()), escape="\\") for name in mentioned),
                ),
            )  # fmt: skip
            records: set[str] = set()
            for row in conn.execute(candidates).mappings():
                if (how := person.match(row["author_id"], row["author"], _row_text(row))) is not None:
                    records.add(str(row["id"]))
                    found[how] += 1
            constructs = select(_R.c.id).where(
                _R.c.imp == imp, _R.c.kind == "construct", _R.c.scope.in_(dm_scopes)
            )
            for (construct_id,) in conn.execute(constructs):
                if str(construct_id) not in records:
                    records.add(str(construct_id))
                    found["id"] += 1
            episodes: set[str] = set()
            every = select(_E.c.id, _E.c.author, _E.c.author_id, _E.c.as_happened).where(_E.c.imp == imp)
            # Every episode of the imp: their text is not lowercased for a LIKE.
            for episode_id, author, author_id, as_happened in conn.execute(every):
                if (how := person.match(author_id, author, as_happened)) is not None:
                    episodes.add(str(episode_id))
                    found[how] += 1
            n_records, n_episodes, touched = self._delete(conn, episodes, records)
            n_conversations = conn.execute(delete(_C).where(_C.c.imp == imp, _C.c.person.in_(keys))).rowcount
            # Their departures name them too; with the conversations gone, no departure is queued again.
            conn.execute(
                delete(memory_departures).where(
                    memory_departures.c.imp == imp, memory_departures.c.person.in_(keys)
                )
            )
            for imp_, scope in sorted(touched):
                self._bump(conn, imp_, scope, deleted=True)
            return Forgotten(
                records=n_records, episodes=n_episodes, conversations=n_conversations, by_id=found["id"],
                by_name=found["name"], mentions_of=mentioned, author_only=tuple(n for n in names if n not in mentioned),
            )  # fmt: skip

        return self._locked(write)

    def forget_message(self, channel_id: str, message_id: str) -> dict[str, int]:
        """A deleted message: its episodes, for every imp; a record left with no episode goes too.

        The message is marked forgotten too (for ``FORGOTTEN_MESSAGE_KEEP``), so a turn still running on it
        keeps nothing of it when it ends: ``ScopedMemory.encode`` refuses an episode of a marked message.
        """
        now = self.clock()
        marks = memory_forgotten_messages

        def write(conn: Connection) -> dict[str, int]:
            # The message's lock, then the scopes holding its episodes: an ``encode`` of it either finished
            # before (its episode is found below) or finds the mark (it keeps nothing). No episode of it can
            # enter another scope meanwhile: that ``encode`` waits on the message's lock.
            self._lock_message(conn, channel_id, message_id)
            where = {"channel_id": channel_id, "message_id": message_id}
            self._lock(conn, [(str(r[0]), str(r[1])) for r in conn.execute(_SCOPES_OF_MESSAGE, where)])
            conn.execute(
                _MARK_FORGOTTEN(conn.dialect.name),
                {"channel_id": channel_id, "message_id": message_id, "at": iso(now)},
            )
            conn.execute(
                delete(marks).where(bytewise(marks.c.forgotten_at) < iso(now - FORGOTTEN_MESSAGE_KEEP))
            )
            of_message = select(_E.c.id).where(_E.c.channel_id == channel_id, _E.c.message_id == message_id)
            episodes = {str(r[0]) for r in conn.execute(of_message)}
            n_records, n_episodes, touched = self._delete(conn, episodes, set())
            for imp, scope in sorted(touched):
                self._bump(conn, imp, scope, deleted=True)
            return {"records": n_records, "episodes": n_episodes}

        return self._locked(write)

    def forget_imp(self, imp: str) -> dict[str, int]:
        """Everything the imp remembers, in every scope (``impyard imp rm --purge``, ``impyard memory
        delete``; mechanism 118): records, episodes, saved conversations, the slots, learned rules,
        departures, and its day's clock (``memory_wakefulness``: it starts again asleep, as a new imp). The
        scopes' generations move on (kept, not deleted), so every cache drops them."""

        def gone(conn: Connection, table: Table) -> int:
            return int(conn.execute(delete(table).where(table.c.imp == imp)).rowcount)

        def write(conn: Connection) -> dict[str, int]:
            self._lock_imp(conn, imp)  # as forget_person: every scope's row first
            scopes = union(
                select(_G.c.scope).where(_G.c.imp == imp),
                select(_R.c.scope).distinct().where(_R.c.imp == imp),
            )
            every = sorted(str(r[0]) for r in conn.execute(scopes))
            gone(conn, memory_wakefulness)
            counts = {
                "slots": gone(conn, _S), "episodes": gone(conn, _E), "records": gone(conn, _R),
                "conversations": gone(conn, _C), "rules": gone(conn, _D), "departures": gone(conn, memory_departures),
            }  # fmt: skip
            for scope in every:
                self._bump(conn, imp, scope, deleted=True)
            return counts

        counts = self._locked(write)
        return {
            name: counts[name]
            for name in ("records", "episodes", "conversations", "slots", "rules", "departures")
        }

    def rules(self, imp: str, limit: int | None = None) -> list[DispositionView]:
        """``impyard memory rules``: what ``imp`` has learned, strongest |weight| first (dormant ones too)."""
        return self.db.read(lambda conn: _dispositions(conn, imp, limit, active_only=False))

    def slot_view(self, imp: str, scope: str | None = None) -> list[tuple[str, SlotEntry]]:
        """``impyard memory slot``: what ``imp`` holds in mind in each scope (or ``scope``), as it would be
        loaded now (87); read only: nothing is dropped here. Each entry's record is a ``StoredRecord``."""
        now = self.clock()

        def read(conn: Connection) -> list[tuple[str, SlotEntry]]:
            if scope is None:
                scopes = sorted(str(r[0]) for r in conn.execute(_SLOT_SCOPES, {"imp": imp}))
            else:
                scopes = [scope]
            shown: list[tuple[str, SlotEntry]] = []
            for where in scopes:
                stored = [
                    slot_law.Held(str(r[0]), str(r[2]), float(r[3]), parse_iso(r[1]))
                    for r in conn.execute(_SLOT_VIEW, {"imp": imp, "scope": where})
                ]
                held = slot_law.loaded(stored, now)
                shown.extend(
                    (where, entry) for entry in self._entries(conn, imp, where, held, now, operator=True)
                )
            return shown

        return self.db.read(read)

    def count(self, imp: str, scopes: Sequence[str] | None = None) -> int:
        """Records of every kind of ``imp`` in ``scopes`` (None: all).

        Every ``memory.*`` result says this total (mechanism 3), so a scope's count is kept per generation:
        it is counted again only after a write or a delete moved the scope's generation (from any process).
        """
        if scopes is not None:
            return self._scopes_count(imp, list(dict.fromkeys(scopes)))
        statement = select(func.count()).select_from(_R).where(_R.c.imp == imp)
        return int(self.db.read(lambda conn: conn.execute(statement).scalar_one()))

    def _scopes_count(self, imp: str, scopes: list[str]) -> int:
        def read(conn: Connection) -> list[tuple[str, Generation, int]]:
            counted = []
            for scope, generation in self._generations(conn, imp, scopes).items():
                with self._counts_lock:
                    cached = self._counts.get((imp, scope))
                if cached is not None and cached[0] == generation:
                    count = cached[1]
                else:
                    count = int(conn.execute(_SCOPE_COUNT, {"imp": imp, "scope": scope}).scalar_one())
                counted.append((scope, generation, count))
            return counted

        counted = self.db.read(read)  # one snapshot: each count is its generation's
        with self._counts_lock:
            if len(self._counts) + len(counted) > MAX_CACHED_COUNTS:
                self._counts.clear()  # a bound, not a policy: counts are cheap to take again
            for scope, generation, count in counted:
                self._counts[(imp, scope)] = (generation, count)
        return sum(count for _, _, count in counted)

    # ------------------------------------------------------------ the night (issue 15: mechanisms 107-114)

    def night_records(
        self, imp: str, scope: str, since: datetime, k: int = 200, episodes: int = 6
    ) -> list[RecordView]:
        """Mechanism 107 (subtle point 16): ``scope``'s records that happened at or after ``since`` (the
        imp's waking), newest first, at most ``k``, each with its newest ``episodes``; constructs and given
        records come too (the box marks them protected)."""
        reach = _Reach(imp, (scope,))
        now = self.clock()

        def read(conn: Connection) -> list[RecordView]:
            rows = self._records(
                conn, reach, bytewise(_R.c.happened_at) >= iso(since),
                order=(bytewise(_R.c.happened_at).desc(), _R.c.gen.desc(), bytewise(_R.c.id)), limit=k,
            )  # fmt: skip
            return self._with_episodes(conn, reach, [self._view(r, now, False) for r in rows], episodes)

        return self.db.read(read)

    def consolidate_scope(
        self, imp: str, scope: str, groups: Sequence[tuple[str, Sequence[str]]]
    ) -> ConsolidateResult:
        """Mechanisms 108-111, 113, in one transaction, within ``scope`` only: each group's anchor and
        members are checked here whatever the plan says (``anchor_refusal``, ``member_refusal``); a group
        left with no member is skipped. The members' episodes are re-filed under the anchor (109), the
        anchor's stored intensity becomes ``combined_intensity`` (110), the members are deleted. No text,
        valence or time changes (111). ``refused`` counts each refused anchor (its whole group) and member.
        """
        one = select(_R.c.id, _R.c.kind, _R.c.origin, _R.c.intensity).where(
            _R.c.id == bindparam("rid"), _R.c.imp == imp, _R.c.scope == scope
        )

        def write(conn: Connection) -> ConsolidateResult:  # everything below is per run: PostgreSQL may retry
            self._lock(conn, [(imp, scope)])  # the rows below are read as no other write leaves them
            applied = absorbed_n = moved = refused = 0
            absorbed: set[str] = set()
            gen: int | None = None

            def row_of(record_id: str) -> RowMapping | None:
                return conn.execute(one, {"rid": record_id}).mappings().first()

            for anchor_id, member_ids in groups:
                anchor = row_of(anchor_id)  # an anchor absorbed earlier in this call is gone: refused
                if anchor is None or anchor_refusal(
                    anchor["kind"], anchor["origin"], float(anchor["intensity"])
                ):
                    refused += 1
                    continue
                strength = float(anchor["intensity"])
                members: list[RowMapping] = []
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
                combined = combined_intensity([strength, *(float(m["intensity"]) for m in members)])
                conn.execute(update(_R).where(_R.c.id == anchor_id).values(intensity=combined, gen=gen))
                moved += conn.execute(
                    update(_E)
                    .where(_E.c.record_id.in_(ids), _E.c.imp == imp, _E.c.scope == scope)
                    .values(record_id=anchor_id, gen=gen)
                ).rowcount
                conn.execute(delete(_R).where(_R.c.id.in_(ids)))
                applied += 1
                absorbed_n += len(ids)
            return ConsolidateResult(groups=applied, absorbed=absorbed_n, episodes=moved, refused=refused)

        return self._locked(write)

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
        prefilter = select(_R.c.id, _R.c.kind, _R.c.origin, _R.c.intensity, _R.c.last_felt).where(
            _R.c.imp == imp,
            _R.c.scope == scope,
            _R.c.intensity < top,
            bytewise(_R.c.last_felt) <= iso(youngest),
        )
        candidates = [
            str(row[0])
            for row in self.db.read(lambda conn: conn.execute(prefilter).all())
            if forgets(row[1], row[2], float(row[3]), parse_iso(row[4]), now)
        ]
        # By id alone (the primary key): with imp and scope in the WHERE, SQLite may scan the scope.
        again = select(
            _R.c.id, _R.c.imp, _R.c.scope, _R.c.kind, _R.c.origin, _R.c.intensity, _R.c.last_felt
        ).where(_R.c.id.in_(bindparam("ids", expanding=True)))
        drop_episodes = delete(_E).where(_E.c.record_id.in_(bindparam("ids", expanding=True)))
        drop_records = delete(_R).where(_R.c.id.in_(bindparam("ids", expanding=True)))

        def write(conn: Connection, *, batch: Sequence[str]) -> tuple[int, int]:
            self._lock(conn, [(imp, scope)])  # the rule is checked again on what no write is changing
            doomed: list[str] = []
            for ids in _chunks(batch):
                doomed.extend(
                    str(row[0])
                    for row in conn.execute(again, {"ids": ids})
                    if row[1] == imp
                    and row[2] == scope
                    and forgets(row[3], row[4], float(row[5]), parse_iso(row[6]), now)
                )
            records = episodes = 0
            for ids in _chunks(doomed):
                episodes += conn.execute(drop_episodes, {"ids": ids}).rowcount
                records += conn.execute(drop_records, {"ids": ids}).rowcount
            if doomed:
                self._bump(conn, imp, scope, deleted=True)
            return records, episodes

        records = episodes = 0
        for start in range(0, len(candidates), _FORGET_BATCH):
            batch = candidates[start : start + _FORGET_BATCH]
            gone, gone_episodes = self._locked(partial(write, batch=batch))
            records += gone
            episodes += gone_episodes
        return records, episodes

    def scopes_lived_in(self, imp: str, since: datetime | None = None) -> list[str]:
        """The scopes of ``imp`` holding records (that happened at or after ``since``), the one with the
        newest such record first: where a night has something to fold or forget."""
        return self.db.read(lambda conn: scopes_by_newest(conn, imp, since))

    # ------------------------------------------------------------ copy and stats (issue 15: mechanism 118)

    def has_memory(self, imp: str) -> bool:
        """Whether ``imp`` keeps anything at all: a record, an episode, a conversation, a rule or a slot."""
        return self.db.read(lambda conn: _keeps_anything(conn, imp))

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

        def batches(conn: Connection, table: Table, names: Sequence[str]) -> Iterator[Sequence[RowMapping]]:
            statement = select(*(table.c[name] for name in names)).where(table.c.imp == src)
            yield from conn.execute(statement.execution_options(yield_per=_CHUNK)).mappings().partitions()

        def write(conn: Connection) -> dict[str, int]:
            counts = dict.fromkeys(("records", "episodes", "conversations", "slots", "rules"), 0)
            if _keeps_anything(conn, new):
                raise MemoryInvalid(
                    f"{new} already remembers something; a copy goes only into an empty memory"
                )
            scopes = sorted(
                {
                    str(row[0])
                    for table in (_R, _C, _S)
                    for row in conn.execute(select(table.c.scope).distinct().where(table.c.imp == src))
                }
            )
            gens = {scope: self._bump(conn, new, scope) for scope in scopes}
            ids: set[str] = set()
            record_names = (*_RECORD_NAMES, "mention_text", "created_at")
            for batch in batches(conn, _R, record_names):
                ids.update(str(r["id"]) for r in batch)
                conn.execute(
                    _INSERT_RECORD,
                    [{**r, "id": copied(r["id"]), "imp": new, "gen": gens[r["scope"]]} for r in batch],
                )
                counts["records"] += len(batch)
            for batch in batches(conn, _E, (*_EPISODE_NAMES, "scope", "dims", "vector")):
                ids.update(str(r["id"]) for r in batch)
                conn.execute(
                    _INSERT_EPISODE,
                    [
                        {**r, "id": copied(r["id"]), "record_id": copied(r["record_id"]), "imp": new,
                         "gen": gens[r["scope"]]}
                        for r in batch
                    ],
                )  # fmt: skip
                counts["episodes"] += len(batch)
            for batch in batches(conn, _C, ("scope", "channel_id", "person", "state", "updated_at")):
                conn.execute(
                    insert(_C),
                    [
                        {**r, "imp": new, "state": json.dumps(_renamed(json.loads(r["state"]), ids, copied),
                                                              ensure_ascii=False, separators=(",", ":"))}
                        for r in batch
                    ],
                )  # fmt: skip
                counts["conversations"] += len(batch)
            for batch in batches(conn, _S, ("scope", "record_id", "activated_at")):
                conn.execute(
                    _INSERT_SLOT, [{**r, "imp": new, "record_id": copied(r["record_id"])} for r in batch]
                )
                counts["slots"] += len(batch)
            for batch in batches(conn, _D, _DISPOSITION_NAMES):
                conn.execute(insert(_D), [{**r, "id": copied(r["id"]), "imp": new} for r in batch])
                counts["rules"] += len(batch)
            return counts

        # SERIALIZABLE, not locking: the copy reads ``src`` in many statements that must see one moment of it
        # (an episode whose record came later would name no copy); a snapshot gives that without holding ``src``'s
        # writers, and nothing else writes into the empty ``new``.
        return self.db.write(write)

    def stats(self, imp: str) -> MemoryStats:
        """``impyard memory stats``: per scope records, episodes, constructs, given records and slot
        entries; the learned rules and saved conversations; the clock's state (``memory_wakefulness``);
        the host database's size (on disk for SQLite; every imp's memory is in it, with the rest of the host's)."""

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
                add(
                    select(table.c.scope, func.count()).where(table.c.imp == imp).group_by(table.c.scope),
                    name,
                )
            rules = conn.execute(
                select(func.count(), counted(func.abs(_D.c.weight) > laws.DORMANT_WEIGHT)).where(
                    _D.c.imp == imp
                )
            ).one()
            w = memory_wakefulness
            clock = conn.execute(
                select(w.c.awake, *(w.c[k] for k in Wakefulness.TIMES)).where(w.c.imp == imp)
            ).first()
            if conn.dialect.name == "postgresql":
                size = int(conn.execute(select(func.pg_database_size(func.current_database()))).scalar_one())
            else:
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
                    awake=bool(clock[0]), **{k: _when(clock[i]) for i, k in enumerate(Wakefulness.TIMES, start=1)},
                ),
                database_bytes=size,
            )  # fmt: skip

        return self.db.read(read)


def _keeps_anything(conn: Connection, imp: str) -> bool:
    return any(conn.execute(_ANY_OF_IMP[table], {"imp": imp}).first() for table in _IMP_TABLES)


def scopes_by_newest(
    conn: Connection, imp: str, since: datetime | None = None, limit: int | None = None
) -> list[str]:
    """The scopes of ``imp`` with records (that happened at or after ``since``), the newest record first
    (ties: by scope, byte order); at most ``limit``. Shared with the imp's clock (``wakefulness``)."""
    newest = func.max(_R.c.happened_at).label("newest")
    statement = (
        select(_R.c.scope, newest)
        .where(_R.c.imp == imp, *([] if since is None else [bytewise(_R.c.happened_at) >= iso(since)]))
        .group_by(_R.c.scope)
    )
    rows = [(str(row[1]), str(row[0])) for row in conn.execute(statement)]
    rows.sort(key=lambda item: item[1].encode())  # ties: by scope, byte order (the sort below is stable)
    rows.sort(key=lambda item: item[0].encode(), reverse=True)
    scopes = [scope for _, scope in rows]
    return scopes if limit is None else scopes[: max(0, limit)]


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

    def _read_views(
        self, rows_of: Callable[[Connection], list[RowMapping]], episodes: int, with_vectors: bool
    ) -> list[RecordView]:
        """Rows read in one snapshot, as views with their newest episodes."""
        store, now = self.store, self.store.clock()

        def read(conn: Connection) -> list[RecordView]:
            views = [store._view(r, now, with_vectors) for r in rows_of(conn)]
            return store._with_episodes(conn, self._reach, views, episodes)

        return store.db.read(read)

    def recent(
        self, k: int = 5, kinds: Sequence[str] = ("lived",), episodes: int = 3, with_vectors: bool = False
    ) -> list[RecordView]:
        """Mechanisms 32, 92, 115: the ``k`` most recently felt records of ``kinds``."""
        return self._read_views(
            lambda conn: self.store._newest(conn, self._reach, "kinds", k, kinds=list(kinds)),
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
            lambda conn: self.store._about(conn, self._reach, person, k, exclude, kinds),
            episodes,
            with_vectors,
        )

    def constructs(self, construct_kind: ConstructKind, k: int = 3, episodes: int = 0) -> list[RecordView]:
        """Mechanism 27 (ownOfKind): the ``k`` most recently felt constructs of one kind."""
        return self._read_views(
            lambda conn: self.store._newest(conn, self._reach, "construct", k, construct_kind=construct_kind),
            episodes,
            False,
        )

    def episodes(self, record_ids: Sequence[str], per_record: int = 3) -> list[EpisodeView]:
        """Each named record's newest episodes, newest first; a record outside the scopes gives nothing."""
        ids = list(dict.fromkeys(record_ids))
        newest = self.store.db.read(lambda conn: self.store._episodes_of(conn, self._reach, ids, per_record))
        return [episode for record_id in ids for episode in newest.get(record_id, [])]

    def encode(self, params: EncodeParams) -> tuple[str, str]:
        """Mechanisms 61-66: keep one moment, atomically: a new record or a join, its episode, the restores.

        A join names a record this session reads *and* writes (its writes scope), else it is refused
        (``MemoryDenied``) and nothing is written. Restores of records outside the read scopes are ignored.
        An episode of a message deleted meanwhile (``forget_message``) is refused (``MemoryForgotten``): the
        turn kept nothing of it, whichever of the two came first.
        """
        now = self.store.clock()
        store, writes, reach = self.store, self.scopes.writes, self._reach
        message_id = params.episode.message_id

        def write(conn: Connection) -> tuple[str, str]:
            if message_id is not None:  # the message's lock, then its mark (``forget_message``)
                store._lock_message(conn, self.channel_id, message_id)
                if conn.execute(
                    _FORGOTTEN, {"channel_id": self.channel_id, "message_id": message_id}
                ).first():
                    raise MemoryForgotten(
                        f"memory.encode: message {message_id[:40]!r} was deleted; nothing of it is kept"
                    )
            locked = {writes, *store._restored_scopes(conn, reach, params.restore)}
            store._lock(conn, [(self.imp, scope) for scope in locked])
            gens: dict[str, int] = {}
            # A join is decided locked: no other write of the scope is taking the record meanwhile.
            if params.join is not None:
                scope = conn.execute(
                    _per_reach("scope_of", reach, _scope_in_reach), reach.params(rid=params.join)
                ).scalar()
                if scope != writes:
                    raise MemoryDenied(
                        f"memory.encode: no record {params.join[:40]!r} to join in this conversation's scope"
                    )
            gens[writes] = store._bump(conn, self.imp, writes)
            if params.record is not None:
                new = params.record
                record_id = store._insert_record(
                    conn, imp=self.imp, scope=writes, gen=gens[writes], kind=new.kind,
                    construct_kind=new.construct_kind, origin="kept" if new.lasting else "lived",  # issue 32
                    author=new.author, author_id=new.author_id,
                    feeling=new.feeling, conclusion=new.conclusion, valence=new.valence, intensity=new.intensity,
                    happened_at=now, last_felt=now, vector=new.vector, now=now,
                )  # fmt: skip
            else:
                assert params.join is not None
                record_id = params.join
            episode = params.episode
            episode_id = store._insert_episode(
                conn, record_id=record_id, imp=self.imp, scope=writes, gen=gens[writes], channel_id=self.channel_id,
                message_id=episode.message_id, author=episode.author, author_id=episode.author_id,
                as_happened=episode.as_happened, told=episode.told, happened_at=now, vector=episode.vector,
            )  # fmt: skip
            store._refeel(conn, reach, params.restore, now, gens, locked)
            return record_id, episode_id

        return store._locked(write)

    def restore(self, items: Sequence[Restore]) -> int:
        """Re-feel records in this session's scopes; returns how many were (others are ignored)."""
        now = self.store.clock()
        store, reach = self.store, self._reach

        def write(conn: Connection) -> int:
            locked = store._restored_scopes(conn, reach, items)
            store._lock(conn, [(self.imp, scope) for scope in locked])
            return store._refeel(conn, reach, items, now, {}, locked)

        return store._locked(write)

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

        def write(conn: Connection) -> tuple[str, bool, str | None, list[SlotEntry]]:
            store._lock(conn, [(self.imp, writes)])  # the twin and the slot are decided locked
            twin = store._twin(conn, self.imp, writes, params.construct_kind, params.vector)
            gen = store._bump(conn, self.imp, writes)
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
                conn.execute(_REFEEL, {"intensity": intensity, "at": iso(now), "gen": gen, "rid": record_id})
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
            entries = store._entries(conn, self.imp, writes, held, now)
            return record_id, twin is None, previous, entries

        return store._locked(write)

    def slot(self) -> list[SlotEntry]:
        """Mechanisms 87-88: the writes scope's slot as loaded now, oldest activation first; what left it
        (a week unrefreshed, deleted, over size) is dropped from the stored slot."""
        now = self.store.clock()
        store, writes = self.store, self.scopes.writes

        def write(conn: Connection) -> list[SlotEntry]:
            store._lock(conn, [(self.imp, writes)])  # what leaves the slot is decided locked
            held = store._held(conn, self.imp, writes, now)
            return store._entries(conn, self.imp, writes, held, now)

        return store._locked(write)

    def slot_refresh(self, record_ids: Sequence[str]) -> list[SlotEntry]:
        """Mechanism 86: held constructs brought to mind again get activated now; other ids are ignored."""
        now = self.store.clock()
        store, writes = self.store, self.scopes.writes

        def write(conn: Connection) -> list[SlotEntry]:
            store._lock(conn, [(self.imp, writes)])
            held = store._held(conn, self.imp, writes, now)
            after = list(held)
            for record_id in dict.fromkeys(record_ids):
                twin = next((h for h in after if h.id == record_id), None)
                if twin is not None:
                    after = slot_law.activate(after, slot_law.Held(twin.id, twin.kind, twin.intensity, now))
            if after != held:
                store._write_slot(conn, self.imp, writes, after)
            return store._entries(conn, self.imp, writes, after, now)

        return store._locked(write)

    # ------------------------------------------------------------ dispositions (issue 14; per imp, every scope)

    def dispositions(self, k: int = 100, active_only: bool = False) -> list[DispositionView]:
        """Mechanisms 94, 98-99: the ``k`` strongest rules by |weight|; ``active_only`` leaves dormant ones out.
        Only rules the rule law keeps are served (``served_rules``, issue 32)."""

        def read(conn: Connection) -> list[DispositionView]:
            rules = _dispositions(conn, self.imp, k, active_only=active_only)
            return served_rules(rules, self.store.people.of(conn, self.imp)) if rules else []

        return self.store.db.read(read)

    def learn(self, params: LearnParams) -> LearnResult:
        """Mechanisms 95-97, atomically: ``same`` is counted (and takes this text and weight only if this one
        pulls harder); else ``contradicts`` is weakened toward 0 by |weight| and this rule added; else added.
        A rule named must be this imp's (else ``MemoryDenied``). At most ``MAX_RULES`` are kept per imp.
        First the rule law (``rule_refused``, issue 32) with what the session's channel taught: a refused rule
        changes nothing, not even the rules it names."""
        rule = clean_rule(params.rule)
        now = iso(self.store.clock())
        rule_refused(
            rule, self.store.db.read(lambda conn: taught(conn, self.imp, self.channel_id, self.store.clock()))
        )

        def write(conn: Connection) -> LearnResult:
            def named(rule_id: str) -> RowMapping:
                row = conn.execute(_NAMED_RULE, {"rid": rule_id, "imp": self.imp}).mappings().first()
                if row is None:
                    raise MemoryDenied(f"memory.dispositions.learn: no rule {rule_id[:40]!r} of this imp")
                return row

            if params.same is not None:  # mechanisms 95-96: counted; never summed
                old = named(params.same)
                text, weight, replaced = laws.same_rule(
                    old["rule"], float(old["weight"]), rule, params.weight, params.avoidance_weight
                )
                conn.execute(
                    _UPDATE_RULE.values(rule=text, weight=weight, count=_D.c.count + 1, updated_at=now),
                    {"rid": params.same},
                )
                return LearnResult(id=params.same, action="replaced" if replaced else "counted")
            weakened: str | None = None
            if params.contradicts is not None:  # mechanism 97: toward 0 by |new w|, never past it
                old = named(params.contradicts)
                conn.execute(
                    _UPDATE_RULE.values(
                        weight=laws.weakened(float(old["weight"]), params.weight), updated_at=now
                    ),
                    {"rid": params.contradicts},
                )
                weakened = params.contradicts
            rule_id = new_id()
            conn.execute(
                insert(_D),
                dict(
                    id=rule_id,
                    imp=self.imp,
                    rule=rule,
                    weight=params.weight,
                    count=1,
                    created_at=now,
                    updated_at=now,
                ),
            )
            excess = int(conn.execute(_RULES_OF, {"imp": self.imp}).scalar_one()) - MAX_RULES
            if excess > 0:  # the weakest go: dormant ones first, then the smallest |weight|, oldest first
                conn.execute(
                    _TRIM_RULES,
                    {"imp": self.imp, "rid": rule_id, "dormant": laws.DORMANT_WEIGHT, "excess": excess},
                )
            return LearnResult(id=rule_id, action="added", weakened=weakened)

        # SERIALIZABLE, not locking: rules are per imp, with no row of their own to lock (the count and the trim
        # read them all), and only a departure's box learns, once: never a hot spot.
        return self.store.db.write(write)

    def conversation_get(self, person: str) -> tuple[dict[str, Any] | None, datetime | None]:
        statement = _per_reach("conversation", self._reach, _conversation)
        params = self._reach.params(channel_id=self.channel_id, person=person)
        row = self.store.db.read(lambda conn: conn.execute(statement, params).first())
        if row is None:
            return None, None
        return json.loads(row[0]), parse_iso(row[1])

    def conversation_put(self, person: str, state: dict[str, Any]) -> None:
        """Save the conversation's state in the writes scope (at most 256 KiB of JSON).

        A channel keeps the conversations of its ``MAX_CONVERSATIONS_PER_CHANNEL`` most recently saved people;
        saving one more lets go of the longest untouched, which had gone stale anyway (a new conversation
        starts after the person's absence). So a box naming made-up people holds at most that many states of
        256 KiB per channel, however many it invents.
        """
        text = conversation_json(state)
        params = {
            "imp": self.imp, "scope": self.scopes.writes, "channel_id": self.channel_id, "person": person,
            "state": text, "at": iso(self.store.clock()), "keep": MAX_CONVERSATIONS_PER_CHANNEL,
        }  # fmt: skip

        def write(conn: Connection) -> None:
            conn.execute(_SAVE_CONVERSATION(conn.dialect.name), params)
            conn.execute(_TRIM_CONVERSATIONS, params)

        # SERIALIZABLE, not locking: the trim reads every saved conversation of the channel, which no generation
        # row guards; two saves of one imp in one channel at once are rare (one box per channel) and run again.
        self.store.db.write(write)

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


def _scope_in_reach(shape: str) -> Any:
    return select(_R.c.scope).where(_R.c.id == bindparam("rid"), _Reach.criterion(_R, shape))


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
