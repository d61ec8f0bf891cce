"""Forgetting on request: a person (``/forget-me``, ``impyard memory forget``), one record (``forget --record``,
the console), a deleted message, a whole imp; and what forgetting a person would take (``person_preview``).

Forgetting a person matches ids and exact author names, and mentions only of names that are not too short or
too common (``mentions_are_forgettable``: "the" would name everyone). Forgetting a message leaves a mark for a
week (``FORGOTTEN_MESSAGE_KEEP``), so a turn that was still running keeps nothing of it
(``message_forgotten``, checked by ``moments.encode``). Every scope touched moves its generation on as a
delete, so every cache drops what went.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Table, bindparam, delete, func, literal, or_, select, union
from sqlalchemy.engine import Connection

from box.common import laws
from impyard.clock import iso
from impyard.memory import generations
from impyard.memory.records import delete_memories, like_pattern, plan_deletion, row_text
from impyard.memory.scopes import dm_scope
from impyard.storage.db import Database
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

_R, _E, _C = memory_records, memory_episodes, memory_conversations
_WORD = re.compile(r"\w+")
FORGOTTEN_MESSAGE_KEEP = timedelta(days=7)  # a deleted message's mark outlives any turn that could still end

_SCOPES_OF_MESSAGE = (
    select(_E.c.imp, _E.c.scope)
    .distinct()
    .where(_E.c.channel_id == bindparam("channel_id"), _E.c.message_id == bindparam("message_id"))
)
_FORGOTTEN = select(literal(1)).where(
    memory_forgotten_messages.c.channel_id == bindparam("channel_id"),
    memory_forgotten_messages.c.message_id == bindparam("message_id"),
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


def mentions_are_forgettable(name: str) -> bool:
    """Whether ``forget_person`` takes the records and episodes that merely mention ``name``.

    Only when a word of it has at least 3 letters and is not a common word: forgetting everyone who wrote
    "the", "I" or "Al" would take unrelated memories with them. Authorship under such a name still counts.
    """
    return any(
        sum(ch.isalpha() for ch in word) >= laws.NAME_MIN_LETTERS and word not in laws.STOP_WORDS
        for word in _WORD.findall(name.casefold())
    )


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


def message_forgotten(conn: Connection, channel_id: str, message_id: str) -> bool:
    """Whether the message was deleted on its surface within ``FORGOTTEN_MESSAGE_KEEP`` (its mark is there)."""
    return conn.execute(_FORGOTTEN, {"channel_id": channel_id, "message_id": message_id}).first() is not None


def _person(ids: Sequence[str], names: Sequence[str]) -> _Person:
    if isinstance(ids, str) or isinstance(names, str):
        raise TypeError("forget_person takes sequences of ids and names, not one string")
    names = tuple(dict.fromkeys(name.strip() for name in names if name.strip()))
    mentioned = tuple(name for name in names if mentions_are_forgettable(name))
    return _Person(tuple(dict.fromkeys(i for i in ids if i)), names, mentioned)


@dataclass(frozen=True)
class _Theirs:
    """What ``forget_person`` takes of one person: matched records and episodes, counted by how they matched."""

    records: set[str]
    episodes: set[str]
    by_id: int
    by_name: int


def _theirs(conn: Connection, imp: str, person: _Person) -> _Theirs:
    """The records and episodes of ``imp`` by or about ``person`` (in every scope)."""
    found = {"id": 0, "name": 0}
    # SQL finds the candidates; the whole-word check is Python's (laws.mentions), portable and exact.
    candidates = select(_R.c.id, _R.c.author, _R.c.author_id, _R.c.conclusion, _R.c.statement).where(
        _R.c.imp == imp,
        or_(
            _R.c.author_id.in_(person.ids), _R.c.author.in_(person.names),
            *(_R.c.mention_text.like(like_pattern(name.lower()), escape="\\") for name in person.mentioned),
        ),
    )  # fmt: skip
    records: set[str] = set()
    for row in conn.execute(candidates).mappings():
        if (how := person.match(row["author_id"], row["author"], row_text(row))) is not None:
            records.add(str(row["id"]))
            found[how] += 1
    # The imp's own thoughts formed in a DM with them go with that DM's scope, as its lived records do.
    dm_scopes = [dm_scope(person_id) for person_id in person.ids]
    constructs = select(_R.c.id).where(_R.c.imp == imp, _R.c.kind == "construct", _R.c.scope.in_(dm_scopes))
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
    return _Theirs(records, episodes, found["id"], found["name"])


def _conversations_of(imp: str, keys: Sequence[str]) -> Any:
    return _C.c.imp == imp, _C.c.person.in_(keys)


def forget_person(db: Database, imp: str, ids: Sequence[str], names: Sequence[str] = ()) -> Forgotten:
    """Everything by or about a person, in every scope of ``imp`` (``/forget-me``, ``memory forget``).

    A record or an episode is theirs when it was written under one of ``ids``, or under one of ``names``
    (exactly), or when its text mentions one of the names as a whole word (``laws.mentions``) — only names
    ``mentions_are_forgettable`` lets count. Taken: those records with every episode, those episodes in
    other records, records left without an episode, and their conversations (kept under an id or a name).
    """
    person = _person(ids, names)
    keys = [*person.ids, *person.names]
    if not keys:
        return Forgotten()

    def write(conn: Connection) -> Forgotten:
        # Every scope of the imp is locked first: what is read below is what no write of those scopes is
        # changing. A scope first written meanwhile is not (it had no row): a record or an episode of it
        # committed before a read below is taken (a record left without an episode goes too), one after it
        # is as if it came after this forgetting.
        generations.lock_imp(conn, imp)
        theirs = _theirs(conn, imp, person)
        n_records, n_episodes, touched = delete_memories(conn, theirs.episodes, theirs.records)
        n_conversations = conn.execute(delete(_C).where(*_conversations_of(imp, keys))).rowcount
        # Their departures name them too; with the conversations gone, no departure is queued again.
        conn.execute(
            delete(memory_departures).where(
                memory_departures.c.imp == imp, memory_departures.c.person.in_(keys)
            )
        )
        for imp_, scope in sorted(touched):
            generations.bump(conn, imp_, scope, deleted=True)
        return Forgotten(
            records=n_records, episodes=n_episodes, conversations=n_conversations, by_id=theirs.by_id,
            by_name=theirs.by_name, mentions_of=person.mentioned,
            author_only=tuple(n for n in person.names if n not in person.mentioned),
        )  # fmt: skip

    return generations.locked(db, write)


def person_preview(db: Database, imp: str, ids: Sequence[str], names: Sequence[str] = ()) -> Forgotten:
    """What ``forget_person`` would take now, counted the same way, changing nothing (a confirmation's counts)."""
    person = _person(ids, names)
    keys = [*person.ids, *person.names]
    if not keys:
        return Forgotten()

    def read(conn: Connection) -> Forgotten:
        theirs = _theirs(conn, imp, person)
        plan = plan_deletion(conn, theirs.episodes, theirs.records)
        talks = conn.execute(select(func.count()).select_from(_C).where(*_conversations_of(imp, keys)))
        return Forgotten(
            records=len(plan.records), episodes=plan.episode_count, conversations=int(talks.scalar_one()),
            by_id=theirs.by_id, by_name=theirs.by_name, mentions_of=person.mentioned,
            author_only=tuple(n for n in person.names if n not in person.mentioned),
        )  # fmt: skip

    return db.read(read)


def forget_record(db: Database, imp: str, scope: str, record_id: str) -> dict[str, int]:
    """One record of ``imp`` in ``scope``, with every episode of it (``impyard memory forget --record``, the
    console's Forget). A record of another imp or scope is not touched: ``{"records": 0, "episodes": 0}``."""

    def write(conn: Connection) -> dict[str, int]:
        generations.lock(conn, [(imp, scope)])
        owner = conn.execute(
            select(_R.c.id).where(_R.c.id == record_id, _R.c.imp == imp, _R.c.scope == scope)
        )
        if owner.first() is None:
            return {"records": 0, "episodes": 0}
        n_records, n_episodes, touched = delete_memories(conn, set(), {record_id})
        for imp_, scope_ in sorted(touched):
            generations.bump(conn, imp_, scope_, deleted=True)
        return {"records": n_records, "episodes": n_episodes}

    return generations.locked(db, write)


def forget_message(db: Database, channel_id: str, message_id: str, now: datetime) -> dict[str, int]:
    """A deleted message: its episodes, for every imp; a record left with no episode goes too.

    The message is marked forgotten too (for ``FORGOTTEN_MESSAGE_KEEP``), so a turn still running on it
    keeps nothing of it when it ends: ``moments.encode`` refuses an episode of a marked message.
    """
    marks = memory_forgotten_messages

    def write(conn: Connection) -> dict[str, int]:
        # The message's lock, then the scopes holding its episodes: an ``encode`` of it either finished
        # before (its episode is found below) or finds the mark (it keeps nothing). No episode of it can
        # enter another scope meanwhile: that ``encode`` waits on the message's lock.
        generations.lock_message(conn, channel_id, message_id)
        where = {"channel_id": channel_id, "message_id": message_id}
        generations.lock(conn, [(str(r[0]), str(r[1])) for r in conn.execute(_SCOPES_OF_MESSAGE, where)])
        conn.execute(
            _MARK_FORGOTTEN(conn.dialect.name),
            {"channel_id": channel_id, "message_id": message_id, "at": iso(now)},
        )
        conn.execute(delete(marks).where(bytewise(marks.c.forgotten_at) < iso(now - FORGOTTEN_MESSAGE_KEEP)))
        of_message = select(_E.c.id).where(_E.c.channel_id == channel_id, _E.c.message_id == message_id)
        episodes = {str(r[0]) for r in conn.execute(of_message)}
        n_records, n_episodes, touched = delete_memories(conn, episodes, set())
        for imp, scope in sorted(touched):
            generations.bump(conn, imp, scope, deleted=True)
        return {"records": n_records, "episodes": n_episodes}

    return generations.locked(db, write)


def forget_imp(db: Database, imp: str) -> dict[str, int]:
    """Everything the imp remembers, in every scope (``impyard imp rm --purge``, ``impyard memory delete``;
    mechanism 118): records, episodes, saved conversations, the slots, learned rules, departures, and its
    day's clock (``memory_wakefulness``: it starts again asleep, as a new imp). The scopes' generations move
    on (kept, not deleted), so every cache drops them."""

    def gone(conn: Connection, table: Table) -> int:
        return int(conn.execute(delete(table).where(table.c.imp == imp)).rowcount)

    def write(conn: Connection) -> dict[str, int]:
        generations.lock_imp(conn, imp)  # as forget_person: every scope's row first
        scopes = union(
            select(memory_generations.c.scope).where(memory_generations.c.imp == imp),
            select(_R.c.scope).distinct().where(_R.c.imp == imp),
        )
        every = sorted(str(r[0]) for r in conn.execute(scopes))
        gone(conn, memory_wakefulness)
        counts = {
            "slots": gone(conn, memory_slots), "episodes": gone(conn, _E), "records": gone(conn, _R),
            "conversations": gone(conn, _C), "rules": gone(conn, memory_dispositions),
            "departures": gone(conn, memory_departures),
        }  # fmt: skip
        for scope in every:
            generations.bump(conn, imp, scope, deleted=True)
        return counts

    counts = generations.locked(db, write)
    return {
        name: counts[name]
        for name in ("records", "episodes", "conversations", "slots", "rules", "departures")
    }
