"""A test's own look into a SQLite database file, behind the stores' backs: plain sqlite3 on ``db.path``.

What a test plants (a row a store would never write, a date moved back) or reads (an audit row, a count) in the raw
goes through here, never through ``Database``, whose only way in is the engine API (docs/storage.md). One
connection per database and thread, in autocommit mode, with rows that answer by name (``sqlite3.Row``).
"""

from __future__ import annotations

import sqlite3
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from impyard.storage.db import Database
from impyard.storage.engines import BUSY_TIMEOUT_S, SQLITE_PRAGMAS

_OPEN: weakref.WeakKeyDictionary[Database, threading.local] = weakref.WeakKeyDictionary()
_OPEN_LOCK = threading.Lock()

Params = Sequence[Any] | dict[str, Any]


def connection(db: Database) -> sqlite3.Connection:
    """This thread's connection to ``db``'s file (opened on first use, closed when ``db`` is gone)."""
    with _OPEN_LOCK:
        local = _OPEN.setdefault(db, threading.local())
    conn: sqlite3.Connection | None = getattr(local, "conn", None)
    if conn is None:
        conn = sqlite3.connect(db.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        for pragma in SQLITE_PRAGMAS:
            conn.execute(pragma)
        local.conn = conn
        weakref.finalize(db, conn.close)
    return conn


def query(db: Database, sql: str, params: Params = ()) -> list[sqlite3.Row]:
    return connection(db).execute(sql, params).fetchall()


def execute(db: Database, sql: str, params: Params = ()) -> sqlite3.Cursor:
    """One statement in autocommit mode."""
    return connection(db).execute(sql, params)


@contextmanager
def transaction(db: Database) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` ... COMMIT, or ROLLBACK when the block raises."""
    conn = connection(db)
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    else:
        conn.execute("COMMIT")
