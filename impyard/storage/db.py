"""The host's one database (docs/storage.md): SQLite under IMPYARD_HOME by default, or PostgreSQL when
``IMPYARD_DATABASE_URL`` names one (impyard.storage.urls); migrated at open (impyard.storage.migrate).

The way in is SQLAlchemy Core on either engine (the tables are in impyard.storage.tables): ``db.write(fn)`` runs
``fn(connection)`` in a transaction whose check-then-write is atomic (``BEGIN IMMEDIATE`` on SQLite, SERIALIZABLE
on PostgreSQL, where it is retried on a serialization failure or deadlock, so ``fn`` must do nothing but database
work: it may run more than once); ``db.read(fn)`` runs it in a read-only snapshot; ``db.begin()`` is either
transaction as a block, without the retry. The engines themselves are made in impyard.storage.engines.

Where the work runs is said by the caller, typed, in one of two ways (docs/storage.md, "Where a store function
runs"): ``await db.run(fn, *args)`` runs ``fn(*args)`` on one of the database's worker threads
(impyard.storage.workers), since a transaction may wait on another writer and must never block the event loop;
``await db.quick(fn, *args)`` is for bounded work — a few indexed statements, as each phase of a turn does — which
on SQLite runs right on the event loop while the write lock is free (impyard.storage.quick, issue 18). A blocking
call of a CLI command is a plain call.
"""

from __future__ import annotations

import logging
import random
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import ParamSpec, TypeVar, cast

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from impyard.paths import home
from impyard.storage import faults as storage_faults
from impyard.storage import migrate as migrator
from impyard.storage import migrations, workers
from impyard.storage import urls as dburl
from impyard.storage.engines import (
    is_retryable,
    postgresql_begin,
    postgresql_engine,
    sqlite_begin,
    sqlite_engine,
)
from impyard.storage.errors import STORAGE_ERRORS, DatabaseError, NotPortedError
from impyard.storage.faults import CommitUncertain
from impyard.storage.migrations.legacy import LEGACY_VERSION, MIGRATIONS, Migration
from impyard.storage.quick import QuickCounts, QuickPath
from impyard.storage.urls import DB_FILENAME, DatabaseUrl, DatabaseUrlError

__all__ = [
    "STORAGE_ERRORS",
    "Database",
    "DatabaseError",
    "NotPortedError",
    "Store",
    "default_path",
    "open_database",
]

log = logging.getLogger("impyard.db")

WRITE_ATTEMPTS = 8  # PostgreSQL: runs of a write function before a serialization failure is the caller's
RETRY_BASE_S = 0.005  # first backoff between runs; doubles, with full jitter, up to RETRY_MAX_S
RETRY_MAX_S = 0.25
OUTAGE_PATIENCE_S = 30.0  # PostgreSQL: how long a transaction waits for a server that stopped answering
OUTAGE_PAUSE_MAX_S = 1.0  # between its tries, doubling from RETRY_BASE_S

P = ParamSpec("P")
T = TypeVar("T")


class Database:
    """The host database: a SQLAlchemy engine, its transactions, and where a call of it runs."""

    def __init__(
        self,
        path: Path | None = None,
        legacy: Sequence[Migration] = MIGRATIONS,
        *,
        url: DatabaseUrl | None = None,
        patience_s: float = OUTAGE_PATIENCE_S,
    ) -> None:
        if url is None:
            if path is None:
                raise TypeError("Database needs a path or a url")
            url = dburl.sqlite_url(Path(path))
        self.url = url
        self.dialect: dburl.Dialect = url.dialect
        self.patience_s = patience_s  # how long a transaction waits for a PostgreSQL server that went away
        self._path = url.path
        self._legacy = tuple(legacy)  # the frozen migrations this impyard knows (a test's older one: fewer)
        self._local = threading.local()
        self._kept: list[Connection] = []  # connections kept for a thread (``connect``, the quick path's)
        self._kept_lock = threading.Lock()
        self._engine: Engine | None = None
        self._engine_lock = threading.Lock()
        self._quick = QuickPath(self)
        self._closed = False  # a checkpoint still queued when the database closed does nothing

    @property
    def path(self) -> Path:
        """The SQLite file (a PostgreSQL database has none)."""
        if self._path is None:
            raise NotPortedError(f"{_caller()} needs a SQLite file, and the database is {self.url.where()}")
        return self._path

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def quick_counts(self) -> QuickCounts:
        """How ``quick`` calls ran: on the event loop, or on a worker."""
        return self._quick.counts

    # ------------------------------------------------------------ the engine and its connections

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (created on first use; its pool is shared by every thread)."""
        if self._engine is None:
            with self._engine_lock:
                if self._engine is None:
                    self._engine = (
                        sqlite_engine(self.path) if self.dialect == "sqlite" else postgresql_engine(self.url)
                    )
                    self._closed = False  # in use (again)
        return self._engine

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        """An engine connection for one transaction. A database worker thread keeps its own between transactions:
        a pool checkout and check-in cost three times what a short SQLite transaction does, and on PostgreSQL they
        are round trips (the pool's ping before it lends a connection, its rollback when it is given back; issue
        18). A kept connection that the server dropped fails its next statement and is replaced: the transaction
        never reached its commit, so ``write`` runs it again (``_transact``). Any other thread, and a nested use,
        take one from the pool (which pings it first) and give it back. Quick work on the event loop has
        connections of its own (impyard.storage.quick)."""
        kept: Connection | None = None
        if workers.on_a_worker():
            kept = getattr(self._local, "engine_conn", None)
            if kept is None or kept.invalidated or kept.closed:
                dropped, kept = kept, self.engine.connect()
                self._local.engine_conn = kept
                self.keep(kept, instead_of=dropped)
                if dropped is not None:
                    dropped.close()  # given back to the pool, which discards an invalidated one
            if getattr(self._local, "engine_busy", False):
                kept = None  # nested: this thread's connection is in a transaction already
        if kept is None:
            with self.engine.connect() as conn:
                yield conn
            return
        self._local.engine_busy = True
        try:
            yield kept
        finally:
            self._local.engine_busy = False

    def keep(self, conn: Connection, *, instead_of: Connection | None = None) -> None:
        """Note a connection kept for a thread (in place of ``instead_of``), for ``close`` to discard."""
        with self._kept_lock:
            self._kept = [c for c in self._kept if c is not instead_of] + [conn]

    # ------------------------------------------------------------ transactions

    @contextmanager
    def begin(self, *, read_only: bool = False, locking: bool = False) -> Iterator[Connection]:
        """One transaction on the engine, committed when the block ends (rolled back when it raises); no retry.

        A write (the default) is atomic check-then-write: SQLite ``BEGIN IMMEDIATE``; PostgreSQL SERIALIZABLE,
        where COMMIT may still fail with a serialization error: use ``write(fn)``, which runs it again (or, with
        ``locking``, READ COMMITTED for a caller that locks what it checks). A read is one consistent snapshot that
        refuses to write: SQLite ``BEGIN DEFERRED`` with ``query_only``; PostgreSQL REPEATABLE READ, READ ONLY."""
        call = self._quick.current()
        if call is not None:
            with self._quick.begin(call, read_only) as conn:
                yield conn
            return
        with self.connect() as conn:
            if self.dialect == "postgresql":
                postgresql_begin(conn, read_only, locking)
            else:
                sqlite_begin(conn, read_only)
            with conn.begin():
                yield conn

    def write(
        self, fn: Callable[[Connection], T], *, attempts: int = WRITE_ATTEMPTS, locking: bool = False
    ) -> T:
        """``fn(conn)`` in a write transaction (``begin()``), committed; its result.

        On PostgreSQL a serialization failure or deadlock rolls it back and runs ``fn`` again on a fresh
        transaction (up to ``attempts`` runs, with a short random backoff): so ``fn`` must do nothing but database
        work through ``conn`` — no sending, no clock-dependent side effect, no state kept across runs. On SQLite
        the write lock is taken up front and ``fn`` runs once.

        ``locking``: ``fn`` locks what it checks itself (``SELECT … FOR UPDATE`` of a few hot rows, in one
        order), so PostgreSQL runs it at READ COMMITTED: writers of the same rows queue on their locks instead of
        failing to serialize and running again (the budget's totals, which every reservation of every host moves).

        A server that stops answering (issue 21) is waited for, up to ``patience_s``, and ``fn`` runs again once
        it answers — but only where the transaction never reached its commit. A connection lost during the
        commit raises ``CommitUncertain``: it may have been kept, so it is never done twice."""
        return self._transact(fn, read_only=False, attempts=attempts, locking=locking)

    def read(self, fn: Callable[[Connection], T]) -> T:
        """``fn(conn)`` in a read-only snapshot (``begin(read_only=True)``); its result. A server that stops
        answering is waited for as ``write`` waits."""
        return self._transact(fn, read_only=True, attempts=1, locking=False)

    def _transact(self, fn: Callable[[Connection], T], *, read_only: bool, attempts: int, locking: bool) -> T:
        collisions = 0
        give_up_at: float | None = None
        pause = RETRY_BASE_S
        while True:
            committing = False
            try:
                with self.begin(read_only=read_only, locking=locking) as conn:
                    result = fn(conn)
                    committing = True  # the block's end commits: a lost connection now leaves it uncertain
                return result
            except DBAPIError as exc:
                if committing and not read_only and storage_faults.waits_for(exc):
                    raise CommitUncertain(
                        storage_faults.describe(CommitUncertain(), self.url.where())
                    ) from exc
                if is_retryable(exc) and not read_only:
                    collisions += 1
                    if collisions >= attempts:
                        raise
                    time.sleep(random.uniform(0, min(RETRY_MAX_S, RETRY_BASE_S * 2**collisions)))
                    continue
                if self.dialect != "postgresql" or not storage_faults.waits_for(exc):
                    raise
                now = time.monotonic()
                give_up_at = give_up_at if give_up_at is not None else now + self.patience_s
                if now >= give_up_at:
                    raise
                if pause == RETRY_BASE_S:
                    log.warning(
                        "%s is not answering; waiting up to %.0f s", self.url.where(), self.patience_s
                    )
                time.sleep(min(pause, max(0.0, give_up_at - now)))
                pause = min(OUTAGE_PAUSE_MAX_S, pause * 2)

    # ------------------------------------------------------------ where a call runs

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on one of the database's worker threads (that thread's own connection): any
        blocking database work of async code.

        A caller cancelled meanwhile still waits for the work to end (its transaction is committed or rolled
        back, never left running behind it), then is cancelled."""
        if args or kwargs:
            return await workers.call(lambda: fn(*args, **kwargs))
        return await workers.call(cast(Callable[[], T], fn))  # no closure when there is nothing to bind

    async def quick(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Bounded database work (a few indexed statements; reads, then at most one write as its last
        transaction): ``fn(*args, **kwargs)``, its result.

        On SQLite it runs right here on the event loop, on connections of its own that never wait for the
        write lock: a short transaction costs less than the trip to a worker thread and back, where each of its
        statements also fights the event loop for the GIL (issue 18). When another writer holds the lock, the
        work has written nothing, and it runs again whole on a worker (``run``), which waits for the lock. On
        PostgreSQL every statement is a round trip: it is ``run``."""
        return await self._quick.run(fn, *args, **kwargs)

    def close(self) -> None:
        self._closed = True  # a checkpoint queued from now on does nothing
        if not self._quick.wait_checkpoint():
            log.warning("closing %s while a WAL checkpoint still runs", self.url.where())
        with self._kept_lock:
            kept, self._kept = self._kept, []
        for engine_conn in kept:
            try:
                engine_conn.invalidate()  # closed, not pooled: the event loop's have settings of their own
                engine_conn.close()
            except SQLAlchemyError:
                pass
        self._local = threading.local()
        self._quick.forget()
        with self._engine_lock:
            engine, self._engine = self._engine, None
        if engine is not None:
            engine.dispose()

    # ------------------------------------------------------------ schema

    @property
    def version(self) -> int:
        """The schema version as a number: SQLite's ``user_version`` (10 at Alembic's baseline, one more for each
        revision past it, so an impyard from before Alembic refuses a newer file); the same count on PostgreSQL."""
        if self.dialect == "sqlite":
            with self.engine.connect() as conn:
                return int(conn.exec_driver_sql("PRAGMA user_version").scalar_one())
        revision = self.revision
        known = migrations.position(revision) if revision else None
        return 0 if known is None else LEGACY_VERSION + known

    @property
    def revision(self) -> str | None:
        """The Alembic revision the database is at (None: not under Alembic yet)."""
        from alembic.runtime.migration import MigrationContext

        with self.begin(read_only=True) as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def migrate(self) -> int:
        """Bring the schema to the newest revision (impyard.storage.migrate); returns ``version``."""
        migrator.migrate(self, self._legacy)
        return self.version


def default_path() -> Path:
    return home() / DB_FILENAME


def _caller() -> str:
    """The function outside this module that asked for what only SQLite has: named in NotPortedError."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "this command"
    return f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_qualname}"


def open_database(path: Path | None = None, *, url: DatabaseUrl | str | None = None) -> Database:
    """Open (creating and migrating as needed) the host database: ``path`` (a SQLite file), else ``url``, else
    ``IMPYARD_DATABASE_URL``, else IMPYARD_HOME/impyard.db. Every store speaks the engine API, so either engine
    serves every command (issue 21)."""
    try:
        if path is not None:
            target = dburl.sqlite_url(Path(path))
        elif isinstance(url, str):
            target = dburl.parse(url)
        else:
            target = url if url is not None else dburl.from_env()
    except DatabaseUrlError as exc:
        raise DatabaseError(str(exc)) from None
    db = Database(url=target)
    try:
        if target.path is not None:
            target.path.parent.mkdir(parents=True, exist_ok=True)
        else:
            _reach(db)
        db.migrate()
    except DatabaseError:
        db.close()
        raise
    except (OSError, sqlite3.Error, SQLAlchemyError) as exc:
        db.close()
        raise DatabaseError(f"cannot open {target.where()}: {_reason(target, exc)}") from None
    return db


def _reach(db: Database) -> None:
    """Open one connection to the server: a wrong password, host or database name is its own one-line error."""
    try:
        with db.engine.connect():
            pass
    except DBAPIError as exc:
        raise DatabaseError(dburl.connect_problem(db.url, exc)) from None


def _reason(target: DatabaseUrl, exc: BaseException) -> str:
    return dburl.scrub(str(getattr(exc, "orig", None) or exc), target.password)


class Store:
    """The base of the host's stores (issue 12): blocking methods over ``db``, plain calls for the CLI.

    Async code says where a store's method runs, in the one typed way every database call uses:
    ``await store.db.run(store.get, gate_id)`` on a worker thread, or ``await store.db.quick(store.get, gate_id)``
    for bounded work of a turn (docs/storage.md, "Where a store function runs")."""

    db: Database
