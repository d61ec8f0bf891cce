"""Issue 18: ``Database.quick`` — bounded database work on the event loop (SQLite), on a worker otherwise.

A short SQLite transaction costs less than the trip to a worker thread and back, where each statement also fights
the event loop for the GIL. Quick work runs on the loop on a connection of its own that never waits for the write
lock: another writer holding it sends the work, untouched, to a worker. What is checked here: where it runs, that
the loop is never held while another writer has the lock and the work is done once, the rule that makes running it
again safe (reads, then at most one write, last), that the loop's connection settings never reach a pooled
connection, and that the WAL is checkpointed off the loop.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from impyard.storage import quick as quick_module
from impyard.storage.db import Database, open_database
from impyard.storage.engines import BUSY_TIMEOUT_S

pytestmark = pytest.mark.anyio


def _scratch(db: Database) -> None:
    blob = "BYTEA" if db.dialect == "postgresql" else "BLOB"
    db.write(
        lambda conn: conn.exec_driver_sql(f"CREATE TABLE IF NOT EXISTS scratch (n INTEGER, payload {blob})")
    )


def _insert(n: int, payload: bytes = b"") -> Callable[[Connection], None]:
    def txn(conn: Connection) -> None:
        conn.execute(
            sa.text("INSERT INTO scratch (n, payload) VALUES (:n, :payload)"), {"n": n, "payload": payload}
        )

    return txn


def _count(db: Database, n: int) -> int:
    return int(
        db.read(
            lambda conn: conn.execute(
                sa.text("SELECT count(*) FROM scratch WHERE n = :n"), {"n": n}
            ).scalar_one()
        )
    )


async def test_quick_work_runs_on_the_event_loop_on_sqlite_and_on_a_worker_on_postgresql(
    any_engine_db: Database,
) -> None:
    db = any_engine_db
    _scratch(db)
    loop_thread = threading.get_ident()
    ran_on: list[int] = []

    def work(conn: Connection) -> None:
        ran_on.append(threading.get_ident())
        _insert(1)(conn)

    await db.quick(db.write, work)
    expected_inline = db.dialect == "sqlite"
    assert (ran_on == [loop_thread]) is expected_inline, (db.dialect, ran_on, loop_thread)
    assert (db.quick_counts.inline, db.quick_counts.on_worker) == ((1, 0) if expected_inline else (0, 1))
    assert _count(db, 1) == 1


async def test_another_writer_holding_the_lock_sends_quick_work_to_a_worker_without_holding_the_loop(
    db: Database,
) -> None:
    """A second connection (another process, the CLI) holds SQLite's write lock: the quick write does not wait
    on the event loop (other tasks keep running), waits on a worker instead, and is done exactly once."""
    _scratch(db)
    other = sqlite3.connect(db.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    ticks = 0
    done = anyio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await anyio.sleep(0.01)

    async def write() -> None:
        await db.quick(db.write, _insert(7))
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        tg.start_soon(write)
        await anyio.sleep(0.3)
        assert not done.is_set()  # still waiting for the lock
        held_ticks = ticks
        other.execute("COMMIT")  # the other writer lets go
        with anyio.fail_after(10):
            await done.wait()
    other.close()
    assert held_ticks >= 10, held_ticks  # the loop ran on while the lock was held (0.3 s, a tick each 10 ms)
    assert _count(db, 7) == 1
    assert (db.quick_counts.inline, db.quick_counts.on_worker) == (0, 1)


def _shape(*steps: str) -> Callable[[Database], None]:
    """Quick work as a sequence of transactions: "r" a read, "w" a write."""

    def work(db: Database) -> None:
        for i, step in enumerate(steps):
            if step == "r":
                db.read(lambda conn: conn.exec_driver_sql("SELECT count(*) FROM scratch").scalar_one())
            else:
                db.write(_insert(100 + i))

    return work


@pytest.mark.parametrize(
    ("steps", "allowed"),
    [
        (("r",), True),
        (("w",), True),
        (("r", "r", "w"), True),
        (("w", "w"), False),  # a second write: work that met the lock at it could not run again whole
        (("w", "r"), False),  # nothing after the write
        (("r", "w", "w"), False),
    ],
)
async def test_quick_work_is_reads_then_at_most_one_write(
    db: Database, steps: tuple[str, ...], allowed: bool
) -> None:
    _scratch(db)
    work = _shape(*steps)
    if allowed:
        await db.quick(work, db)
    else:
        with pytest.raises(RuntimeError, match="at most one write"):
            await db.quick(work, db)
    work(db)  # the same work through ``run``'s rules (a worker's, or here a plain call): any shape goes


async def test_a_nested_transaction_in_quick_work_is_refused(db: Database) -> None:
    _scratch(db)

    def nested(conn: Connection) -> None:
        db.read(lambda inner: inner.exec_driver_sql("SELECT 1").scalar_one())

    with pytest.raises(RuntimeError, match="one transaction at a time"):
        await db.quick(db.write, nested)


async def test_a_connection_borrowed_from_the_pool_waits_for_the_lock_as_before(db: Database) -> None:
    """The event loop's connection never waits for the lock and never checkpoints; a connection any other
    thread borrows, after quick work and after the loop's connection was dropped and replaced, still does."""
    _scratch(db)
    await db.quick(db.write, _insert(1))
    db._quick._loop.writer.invalidate()  # dropped (a broken connection): replaced on the next quick call
    await db.quick(db.write, _insert(2))

    def settings() -> list[tuple[int, int]]:
        conns = [db.engine.connect() for _ in range(6)]  # more than the pool keeps: every pooled one is seen
        try:
            return [
                (
                    conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one(),
                    conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar_one(),
                )
                for conn in conns
            ]
        finally:
            for conn in conns:
                conn.close()

    seen = await anyio.to_thread.run_sync(settings)
    assert seen == [(int(BUSY_TIMEOUT_S * 1000), 1000)] * 6


async def test_the_wal_is_checkpointed_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop's connection does not checkpoint (that copies pages and syncs the file): every
    ``CHECKPOINT_EVERY`` quick writes a worker does, and the WAL is reused instead of growing with every write."""
    monkeypatch.setattr(quick_module, "CHECKPOINT_EVERY", 16)
    db = open_database(tmp_path / "impyard.db")
    try:
        _scratch(db)
        payload = b"x" * 8000  # two pages a row
        checkpoints: list[int] = []
        original = quick_module.QuickPath._checkpoint

        def counted(self: quick_module.QuickPath) -> None:
            checkpoints.append(threading.get_ident())
            original(self)

        monkeypatch.setattr(quick_module.QuickPath, "_checkpoint", counted)
        for n in range(400):  # 800 pages and more: a WAL never checkpointed holds 3.2 MB
            await db.quick(db.write, _insert(n, payload))
            await anyio.sleep(0.001)  # time for the worker's checkpoint
        wal = Path(f"{db.path}-wal").stat().st_size
    finally:
        db.close()
    assert checkpoints and threading.get_ident() not in checkpoints
    assert wal < 1_500_000, wal


async def test_quick_work_too_heavy_for_the_loop_is_logged_once(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """By its CPU time: never for a function's first call (it may compile its statements), then once per
    function. Waiting (here a sleep; in life a core busy elsewhere) is not the work's weight."""

    def slow() -> None:
        until = time.thread_time() + quick_module.QUICK_SLOW_S * 1.5
        while time.thread_time() < until:
            pass

    def waits() -> None:
        time.sleep(quick_module.QUICK_SLOW_S * 1.5)

    caplog.set_level(logging.WARNING, logger="impyard.db")
    seen: list[int] = []
    for _ in range(3):
        await db.quick(waits)
        await db.quick(slow)
        seen.append(sum("of CPU on the event loop" in r.getMessage() for r in caplog.records))
    assert seen == [0, 1, 1]
    assert "slow" in caplog.records[-1].getMessage()


async def test_a_quick_read_refuses_to_write_after_quick_writes(db: Database) -> None:
    """The loop's read connection keeps ``query_only``: a read transaction never writes, as on PostgreSQL."""
    _scratch(db)
    await db.quick(db.write, _insert(1))
    with pytest.raises(sa.exc.OperationalError, match="readonly"):
        await db.quick(db.read, _insert(2))
    await db.quick(db.write, _insert(3))  # and the write connection still writes
    assert (_count(db, 1), _count(db, 2), _count(db, 3)) == (1, 0, 1)


async def test_a_checkpoint_still_queued_when_the_database_closed_does_nothing(db: Database) -> None:
    """It opens no connection on the closed database (the worker would keep it, and the file, open)."""
    _scratch(db)
    await db.quick(db.write, _insert(1))
    db.close()
    db._quick._checkpoint()
    assert db._engine is None and db._kept == []


async def test_closing_the_database_waits_for_a_running_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint runs on a worker inside SQLite: the database closes (and the process may exit) only once it
    has ended, never with a thread still in SQLite on a connection of a disposed engine."""
    monkeypatch.setattr(quick_module, "CHECKPOINT_EVERY", 1)
    db = open_database(tmp_path / "impyard.db")
    _scratch(db)
    inside, release = threading.Event(), threading.Event()
    order: list[str] = []
    original = quick_module.QuickPath._checkpoint

    def held(self: quick_module.QuickPath) -> None:
        inside.set()
        release.wait(60)
        original(self)
        order.append("checkpoint ended")

    monkeypatch.setattr(quick_module.QuickPath, "_checkpoint", held)
    await db.quick(db.write, _insert(1))  # the first write owes a checkpoint: a worker starts it
    assert await anyio.to_thread.run_sync(inside.wait, 60)

    def close() -> None:
        db.close()
        order.append("closed")

    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.to_thread.run_sync, close)
        await anyio.sleep(
            0.2
        )  # close() is waiting for the checkpoint (were it not, "closed" would come first)
        release.set()
    assert order == ["checkpoint ended", "closed"]
