"""The two engines under the host database (docs/storage.md): how a SQLAlchemy engine is made for a SQLite file or a
PostgreSQL server, and how each engine's transaction begins (a write's lock or isolation, a read's snapshot).

Pure settings and recipes, no state: ``impyard.storage.db.Database`` holds the engine and its connections.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from impyard.storage.urls import DatabaseUrl
from impyard.storage.workers import MAX_WORKERS

BUSY_TIMEOUT_S = 15.0  # how long a writer waits for another writer's transaction
CONNECT_TIMEOUT_S = 10  # PostgreSQL: how long opening a connection may take before it is an error
RETRY_SQLSTATES = frozenset({"40001", "40P01"})  # serialization_failure, deadlock_detected
SQLITE_PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=NORMAL",  # safe with WAL; a crash loses at most the last commit
    "PRAGMA foreign_keys=ON",
)

_SERIALIZABLE, _LOCKING, _READ = (
    psycopg.IsolationLevel.SERIALIZABLE,
    psycopg.IsolationLevel.READ_COMMITTED,
    psycopg.IsolationLevel.REPEATABLE_READ,
)


def is_retryable(exc: BaseException) -> bool:
    """A PostgreSQL serialization failure or deadlock: the transaction did nothing and may simply run again."""
    orig = getattr(exc, "orig", None)
    return getattr(orig, "sqlstate", None) in RETRY_SQLSTATES


def sqlite_engine(path: Path) -> Engine:
    """SQLAlchemy on the SQLite file, with the pysqlite recipe for real transactions: the driver's own BEGIN is
    off (isolation_level=None) and each transaction starts with our BEGIN (``sqlite_begin``)."""
    engine = sa.create_engine(
        sa.URL.create("sqlite+pysqlite", database=str(path)),
        connect_args={"timeout": BUSY_TIMEOUT_S, "check_same_thread": False},
        poolclass=sa.QueuePool,
        pool_size=4,
        max_overflow=MAX_WORKERS + 4,
    )

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        for pragma in SQLITE_PRAGMAS:
            dbapi_connection.execute(pragma)

    return engine


def sqlite_begin(conn: Connection, read_only: bool) -> None:
    """Start ``conn``'s transaction on SQLite: ``BEGIN IMMEDIATE`` for a write (the write lock up front, so
    check-then-write is atomic), ``BEGIN DEFERRED`` with ``query_only`` for a read, which refuses to write as
    PostgreSQL's READ ONLY does (a store tested here behaves the same there).

    Straight on the driver's connection, and not in a ``begin`` event: an engine with a connection event
    dispatches events on every statement, which cost more than the statements (issue 18). SQLAlchemy's own
    begin is a no-op on pysqlite, and its commit or rollback ends this transaction. The pragma is set only when
    the mode changes on that connection."""
    fairy = conn.connection
    driver: Any = fairy.driver_connection
    if fairy.info.get("impyard_query_only") is not read_only:
        driver.execute(f"PRAGMA query_only = {1 if read_only else 0}")
        fairy.info["impyard_query_only"] = read_only
    driver.execute("BEGIN DEFERRED" if read_only else "BEGIN IMMEDIATE")


def postgresql_begin(conn: Connection, read_only: bool, locking: bool) -> None:
    """Set ``conn``'s next transaction on PostgreSQL: SERIALIZABLE for a write (READ COMMITTED for one that locks
    what it checks), REPEATABLE READ, READ ONLY for a read. Set on the driver's connection, which puts them in the
    BEGIN it sends with the first statement: no round trip of their own, where SQLAlchemy's execution options
    cost one to set them and one to reset them (issue 18). Only what changed is set."""
    driver: Any = conn.connection.driver_connection
    level = _READ if read_only else _LOCKING if locking else _SERIALIZABLE
    if driver.isolation_level != level:
        driver.isolation_level = level
    if driver.read_only is not read_only:
        driver.read_only = read_only


def postgresql_engine(target: DatabaseUrl) -> Engine:
    return sa.create_engine(
        target.url,
        pool_pre_ping=True,  # a server restart costs one failed ping, not a failed turn
        pool_size=4,
        max_overflow=MAX_WORKERS + 4,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_S, "application_name": "impyard"},
    )
