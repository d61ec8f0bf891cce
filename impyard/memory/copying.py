"""Copying an imp's memory (mechanism 118): everything ``src`` remembers, into an imp that keeps nothing yet.

Every id gets a suffix of this copy (``<id>-<8 hex>``) and the ids inside a saved conversation are those of
the copies. Not copied: its wakefulness (the copy starts asleep, like any new imp) and pending departures
(they are ``src``'s conversations' to end).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from sqlalchemy import Table, bindparam, insert, literal, select
from sqlalchemy.engine import Connection, RowMapping

from impyard.memory import generations
from impyard.memory.dispositions import DISPOSITION_NAMES
from impyard.memory.errors import MemoryInvalid
from impyard.memory.records import EPISODE_NAMES, INSERT_EPISODE, INSERT_RECORD, RECORD_NAMES, new_id
from impyard.memory.slot import INSERT_SLOT
from impyard.storage.db import Database
from impyard.storage.tables import memory_conversations as _C
from impyard.storage.tables import memory_dispositions as _D
from impyard.storage.tables import memory_episodes as _E
from impyard.storage.tables import memory_records as _R
from impyard.storage.tables import memory_slots as _S

COPY_BATCH = 500  # rows read in one batch while copying
# Every table holding an imp's memory (``has_memory``, ``copy_imp``'s refusal).
_IMP_TABLES = (_R, _E, _C, _S, _D)
_ANY_OF_IMP = [
    select(literal(1)).select_from(table).where(table.c.imp == bindparam("imp")).limit(1)
    for table in _IMP_TABLES
]


def keeps_anything(conn: Connection, imp: str) -> bool:
    """Whether ``imp`` keeps anything at all: a record, an episode, a conversation, a rule or a slot."""
    return any(conn.execute(statement, {"imp": imp}).first() for statement in _ANY_OF_IMP)


def _renamed(value: Any, ids: set[str], copied: Callable[[str], str]) -> Any:
    """A saved conversation's JSON with every string that is one of ``ids`` made its copy's id."""
    if isinstance(value, str):
        return copied(value) if value in ids else value
    if isinstance(value, list):
        return [_renamed(item, ids, copied) for item in value]
    if isinstance(value, dict):
        return {key: _renamed(item, ids, copied) for key, item in value.items()}
    return value


def copy_imp(db: Database, src: str, new: str) -> dict[str, int]:
    """Mechanism 118: copy everything ``src`` remembers to ``new``, in one transaction: records, episodes,
    saved conversations, the slots and learned rules, each scope into the same scope, with vectors and times
    as they are. ``src`` is only read. Refused (``MemoryInvalid``) when ``new`` is ``src`` or already keeps
    anything."""
    if src == new:
        raise MemoryInvalid("a copy needs two different imps")
    suffix = new_id()[:8]

    def copied(old_id: str) -> str:
        return f"{old_id.split('-')[0][:64]}-{suffix}"

    def batches(conn: Connection, table: Table, names: Sequence[str]) -> Iterator[Sequence[RowMapping]]:
        statement = select(*(table.c[name] for name in names)).where(table.c.imp == src)
        yield from conn.execute(statement.execution_options(yield_per=COPY_BATCH)).mappings().partitions()

    def write(conn: Connection) -> dict[str, int]:
        counts = dict.fromkeys(("records", "episodes", "conversations", "slots", "rules"), 0)
        if keeps_anything(conn, new):
            raise MemoryInvalid(f"{new} already remembers something; a copy goes only into an empty memory")
        scopes = sorted(
            {
                str(row[0])
                for table in (_R, _C, _S)
                for row in conn.execute(select(table.c.scope).distinct().where(table.c.imp == src))
            }
        )
        gens = {scope: generations.bump(conn, new, scope) for scope in scopes}
        ids: set[str] = set()
        for batch in batches(conn, _R, (*RECORD_NAMES, "mention_text", "created_at")):
            ids.update(str(r["id"]) for r in batch)
            conn.execute(
                INSERT_RECORD,
                [{**r, "id": copied(r["id"]), "imp": new, "gen": gens[r["scope"]]} for r in batch],
            )
            counts["records"] += len(batch)
        for batch in batches(conn, _E, (*EPISODE_NAMES, "scope", "dims", "vector")):
            ids.update(str(r["id"]) for r in batch)
            conn.execute(
                INSERT_EPISODE,
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
            conn.execute(INSERT_SLOT, [{**r, "imp": new, "record_id": copied(r["record_id"])} for r in batch])
            counts["slots"] += len(batch)
        for batch in batches(conn, _D, DISPOSITION_NAMES):
            conn.execute(insert(_D), [{**r, "id": copied(r["id"]), "imp": new} for r in batch])
            counts["rules"] += len(batch)
        return counts

    # SERIALIZABLE, not locking: the copy reads ``src`` in many statements that must see one moment of it
    # (an episode whose record came later would name no copy); a snapshot gives that without holding ``src``'s
    # writers, and nothing else writes into the empty ``new``.
    return db.write(write)
