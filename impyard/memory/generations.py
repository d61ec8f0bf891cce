"""The scopes' generations (``memory_generations``): the row every write of a scope locks first and moves on.

Every write of a scope's records, episodes or slot locks the scope's generation row first (``lock``: in one
order, imp then scope; a message's lock before any, for ``encode`` and ``forget_message``), then reads what
it decides on: on PostgreSQL it runs at READ COMMITTED (``locked``, ``db.write(locking=True)``), so the
writers of one scope queue on that row instead of failing to serialize. Three writes keep SERIALIZABLE, each
saying why: ``copy_imp``, ``learn``, ``conversation_put``.

A write moves the scope's ``version`` on (``bump``), a delete its ``deletes`` as well: the vector cache and
the record counts follow them, from any process (``cache``, ``counts``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from sqlalchemy import Integer, bindparam, cast, func, select, tuple_
from sqlalchemy.engine import Connection

from impyard.memory.cache import Generation
from impyard.storage.db import Database
from impyard.storage.portable import bytewise, per_dialect, upsert
from impyard.storage.tables import memory_generations as _G

_T = TypeVar("_T")

# pg_advisory_xact_lock(MESSAGE_LOCK_CLASS, key): one message's episodes, taken by ``encode`` and ``forget_message``
# (b"memo"; the two-key space is apart from the one-key space of the migrator's lock).
MESSAGE_LOCK_CLASS = 0x6D656D6F

# The scopes' generation rows, locked in one order (imp, then scope, byte by byte) before a write reads what it
# decides on (``lock``); the rows not there yet are made first, at the ``Generation()`` they stand for.
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
_GENERATION = select(_G.c.version, _G.c.deletes).where(
    _G.c.imp == bindparam("imp"), _G.c.scope == bindparam("scope")
)
_SCOPES_OF = select(_G.c.scope).where(_G.c.imp == bindparam("imp"))
_GENERATIONS = select(_G.c.scope, _G.c.version, _G.c.deletes).where(
    _G.c.imp == bindparam("imp"), _G.c.scope.in_(bindparam("scopes", expanding=True))
)


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


def locked(db: Database, fn: Callable[[Connection], _T]) -> _T:
    """``db.write(fn, locking=True)``: ``fn`` locks the generation rows of the scopes it reads to decide and
    writes (``lock``) before it reads them, so on PostgreSQL it runs at READ COMMITTED and the writers of one
    scope queue on its row, each reading what the one before it left, instead of failing to serialize and
    running again (docs/storage.md, ``db.write(fn, locking=True)``). On SQLite ``BEGIN IMMEDIATE`` is the lock."""
    return db.write(fn, locking=True)


def lock(conn: Connection, keys: Iterable[tuple[str, str]]) -> None:
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
    conn.execute(_NEW_GENERATION(conn.dialect.name), [{"imp": imp, "scope": scope} for imp, scope in ordered])
    conn.execute(_LOCK_GENERATIONS, {"keys": ordered}).all()


def lock_imp(conn: Connection, imp: str) -> None:
    """Lock every generation row of ``imp``, in ``lock``'s order (a write over all its scopes)."""
    if conn.dialect.name == "postgresql":
        conn.execute(_LOCK_IMP, {"imp": imp}).all()


def lock_message(conn: Connection, channel_id: str, message_id: str) -> None:
    """The lock of one message's episodes (PostgreSQL; taken before any generation row): ``encode`` checks
    that the message was not deleted and keeps its episode, ``forget_message`` marks it deleted and takes its
    episodes, and neither between the other's check and write (each of them in any imp's scope)."""
    if conn.dialect.name != "postgresql":
        return
    digest = hashlib.sha256(f"{channel_id}\0{message_id}".encode()).digest()
    key = int.from_bytes(digest[:4], "big", signed=True)
    conn.execute(_LOCK_MESSAGE, {"lock_class": MESSAGE_LOCK_CLASS, "lock_key": key}).all()


def bump(conn: Connection, imp: str, scope: str, *, deleted: bool = False) -> int:
    """The scope's next generation (inside the caller's write transaction)."""
    params = {"imp": imp, "scope": scope, "deletes": 1 if deleted else 0}
    return int(conn.execute(_BUMP(conn.dialect.name), params).scalar_one())


def generation(conn: Connection, imp: str, scope: str) -> Generation:
    """The scope's generation (a scope never written is at ``Generation()``)."""
    row = conn.execute(_GENERATION, {"imp": imp, "scope": scope}).first()
    return Generation(int(row[0]), int(row[1])) if row else Generation()


def generations(conn: Connection, imp: str, scopes: Sequence[str]) -> dict[str, Generation]:
    """The generations of ``scopes`` (one query; a scope never written is at ``Generation()``)."""
    found = dict.fromkeys(scopes, Generation())
    for row in conn.execute(_GENERATIONS, {"imp": imp, "scopes": list(found)}):
        found[str(row[0])] = Generation(int(row[1]), int(row[2]))
    return found


def scopes_of(conn: Connection, imp: str) -> list[str]:
    """Every scope of ``imp`` that has a generation row (every scope ever written), byte order."""
    return sorted(str(r[0]) for r in conn.execute(_SCOPES_OF, {"imp": imp}))
