"""The quick path (issue 18; docs/storage.md): bounded database work run right on the event loop on SQLite.

``await db.quick(fn, ...)`` is for work of a few indexed statements — reads, then at most one write, which is its
last transaction — as each phase of a turn does. On SQLite it runs on the event loop, on two connections of the
loop's own that never wait for the write lock: such a transaction costs less than the trip to a worker thread and
back, where each of its statements also fights the event loop for the GIL. When another writer holds the lock the
work has written nothing (its one write is its last transaction), and it runs again whole on a worker
(``Database.run``), which waits for the lock. On PostgreSQL every statement is a round trip: it is ``run``.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from impyard.storage import faults as storage_faults
from impyard.storage import workers
from impyard.storage.engines import BUSY_TIMEOUT_S, sqlite_begin

if TYPE_CHECKING:
    from impyard.storage.db import Database

log = logging.getLogger("impyard.db")

QUICK_SLOW_S = 0.02  # quick work using more CPU than this on the event loop is logged (once per function)
CHECKPOINT_CLOSE_WAIT_S = 10.0  # how long closing the database waits for a running checkpoint (it is short)
CHECKPOINT_EVERY = 64  # write commits made on the event loop between two WAL checkpoints (run on a worker)

P = ParamSpec("P")
T = TypeVar("T")

_LOOP = threading.local()  # ``call``: the quick call running on this thread's event loop, if any


class Busy(BaseException):
    """Quick work on the event loop found SQLite's lock taken by another writer. Nothing of it was written (its
    one write is its last transaction): ``quick`` runs it again on a worker, which waits for the lock. A
    BaseException, like a cancellation, so that no store's ``except Exception`` keeps it from ``quick``."""


@dataclass
class InlineCall:
    """The state of one quick call running on the event loop."""

    path: QuickPath
    wrote: bool = False  # its one write transaction committed: nothing may follow it
    busy: bool = False  # it met the lock: every later transaction of it is refused the same way


@dataclass
class QuickCounts:
    """How quick calls ran: on the event loop, or on a worker (PostgreSQL, or SQLite's lock taken)."""

    inline: int = 0
    on_worker: int = 0


class QuickPath:
    """One database's quick path: its calls, the loop's two connections, and the WAL checkpoints its writes
    owe (the loop's connections never checkpoint)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self.counts = QuickCounts()
        self._loop = (
            threading.local()
        )  # the loop thread's two connections, and whether one is in a transaction
        self._writes = 0  # write commits on the event loop since the last checkpoint
        self._checkpointing = False
        self._checkpoint_done = threading.Event()  # set while no checkpoint runs: close() waits for one
        self._checkpoint_done.set()
        self._named: set[str] = set()  # quick functions called at least once
        self._slow_named: set[str] = set()  # quick functions already logged as slow

    def current(self) -> InlineCall | None:
        """The quick call of this database running on this thread, if any: its transactions are the loop's."""
        call: InlineCall | None = getattr(_LOOP, "call", None)
        return call if call is not None and call.path is self else None

    def forget(self) -> None:
        """The database closed (and discarded the loop's connections): the next quick call opens new ones."""
        self._loop = threading.local()

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``Database.quick``."""
        db = self._db
        if db.dialect == "sqlite" and getattr(_LOOP, "call", None) is None:
            call = InlineCall(self)
            _LOOP.call = call
            started, cpu = time.perf_counter(), time.thread_time()
            try:
                result = fn(*args, **kwargs)
            except Busy:
                pass
            finally:
                _LOOP.call = None
            if not call.busy:  # (a function that swallowed the lock's refusal still goes to a worker)
                self.counts.inline += 1
                self._note_slow(fn, time.thread_time() - cpu, time.perf_counter() - started)
                return result
        self.counts.on_worker += 1
        return await db.run(fn, *args, **kwargs)

    @contextmanager
    def begin(self, call: InlineCall, read_only: bool) -> Iterator[Connection]:
        """``Database.begin`` inside a quick call. Its rule: reads, then at most one write, which is its last
        transaction, so that work which meets the lock has written nothing and runs again whole on a worker.
        Breaking the rule is a bug in the caller, refused here every time (not only under contention)."""
        if call.busy:
            raise Busy
        if call.wrote:
            raise RuntimeError(
                "quick database work runs reads, then at most one write, as its last transaction; "
                "use db.run for more"
            )
        try:
            with self._connection(read_only) as conn:
                sqlite_begin(conn, read_only)
                with conn.begin():
                    yield conn
        except (sqlite3.OperationalError, DBAPIError) as exc:
            if storage_faults.classify(exc).kind != "busy":
                raise
            call.busy = True
            raise Busy from exc
        if not read_only:
            call.wrote = True
            self._wrote()

    @contextmanager
    def _connection(self, reading: bool) -> Iterator[Connection]:
        """The event loop thread's own connection for quick reads, or for quick writes: it never waits for
        SQLite's lock (``busy_timeout`` 0: another writer sends the work to a worker instead) and never checkpoints
        the WAL on the loop (``_wrote`` has a worker do it). Two, so that neither ever switches ``query_only`` (a
        statement of its own each time, issue 18). Kept for the thread and never given back to the pool (the
        database's ``close`` discards them), so that no setting of theirs reaches a connection another thread
        borrows."""
        if getattr(self._loop, "busy", False):
            raise RuntimeError("quick database work opens one transaction at a time (no nested one)")
        name = "reader" if reading else "writer"
        conn: Connection | None = getattr(self._loop, name, None)
        if conn is None or conn.invalidated or conn.closed:
            dropped, conn = conn, self._db.engine.connect()
            driver: Any = conn.connection.driver_connection
            driver.execute("PRAGMA busy_timeout = 0")
            driver.execute("PRAGMA wal_autocheckpoint = 0")
            setattr(self._loop, name, conn)
            self._db.keep(conn, instead_of=dropped)
            if dropped is not None:
                dropped.invalidate()  # its settings never go back to the pool
                dropped.close()
        self._loop.busy = True
        try:
            yield conn
        finally:
            self._loop.busy = False

    def _wrote(self) -> None:
        """Count a write committed on the event loop; every ``CHECKPOINT_EVERY`` a worker checkpoints the WAL."""
        self._writes += 1
        if self._writes < CHECKPOINT_EVERY or self._checkpointing:
            return
        self._writes, self._checkpointing = 0, True
        self._checkpoint_done.clear()
        workers.start(self._checkpoint)

    def wait_checkpoint(self, timeout_s: float = CHECKPOINT_CLOSE_WAIT_S) -> bool:
        """Before the database closes: let a checkpoint running on a worker end, so that no thread is inside SQLite
        on a connection of an engine being disposed (or of a process exiting). False: it was still running."""
        return self._checkpoint_done.wait(timeout_s)

    def _checkpoint(self) -> None:
        """On a worker: copy the WAL's pages into the database file and start the WAL over, so that it is reused
        from its start instead of growing. RESTART, since a PASSIVE checkpoint under steady writes never catches
        up with them (each write lands while it copies); waiting for nobody (``busy_timeout`` 0 for it): with a
        writer or a reader in the way it copies what it can and the next one tries again. While it copies, it
        holds the write lock, and quick writes meet it and run on a worker. A failure is logged."""
        db = self._db
        if db.closed:
            self._checkpointing = False
            self._checkpoint_done.set()
            return
        try:
            with db.connect() as conn:
                driver: Any = conn.connection.driver_connection
                driver.execute("PRAGMA busy_timeout = 0")
                try:
                    driver.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
                finally:
                    driver.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        except (SQLAlchemyError, sqlite3.Error, OSError) as exc:
            log.warning("could not checkpoint %s: %s", db.url.where(), storage_faults.describe(exc))
        finally:
            self._checkpointing = False
            self._checkpoint_done.set()

    def _note_slow(self, fn: Callable[..., Any], cpu_s: float, wall_s: float) -> None:
        """Log quick work too heavy for the loop, once per function, and never its first call (which may compile
        its statements). Heavy by its own CPU time: a busy machine that leaves the host waiting for a core makes
        any call slow on the clock, on a worker as much as on the loop."""
        inner = getattr(fn, "func", fn)  # a functools.partial: its function
        name = getattr(inner, "__qualname__", None) or type(inner).__name__
        if name not in self._named:
            self._named.add(name)
            return
        if cpu_s > QUICK_SLOW_S and name not in self._slow_named:
            self._slow_named.add(name)
            log.warning(
                "quick database work %s spent %.1f ms of CPU on the event loop (more than %.0f; %.1f ms in all): "
                "it should use db.run",
                name, cpu_s * 1000, QUICK_SLOW_S * 1000, wall_s * 1000,
            )  # fmt: skip
