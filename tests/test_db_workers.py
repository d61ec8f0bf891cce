"""The database's worker threads (issue 18): ``Database.run`` hands blocking work to a worker thread and back at
a fraction of a general thread hop's cost, and keeps the hop's promises — the loop never runs SQLite, results
and errors come back as themselves, a cancelled caller waits for its transaction to end, and a long call never
holds up the next."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa

from impyard.storage.db import Database, open_database

pytestmark = pytest.mark.anyio


async def test_work_runs_off_the_loop_on_a_connection_of_its_own_thread(db: Database) -> None:
    loop_thread = threading.get_ident()

    def where() -> tuple[int, int]:
        with db.connect() as conn:
            return threading.get_ident(), id(conn)

    thread, connection = await db.run(where)
    assert thread != loop_thread
    with db.connect() as conn:
        assert id(conn) != connection  # the loop thread's own connection is another one


def _sql(db: Database, sql: str, params: tuple[object, ...] = ()) -> int:
    return db.write(lambda conn: conn.exec_driver_sql(sql, params).rowcount)


def _rows(db: Database, sql: str) -> list[sa.Row[Any]]:
    return db.read(lambda conn: list(conn.exec_driver_sql(sql).all()))


async def test_results_and_errors_come_back_as_themselves(db: Database) -> None:
    _sql(db, "CREATE TABLE t (x INTEGER PRIMARY KEY)")
    assert await db.run(_sql, db, "INSERT INTO t VALUES (?)", (1,)) == 1
    assert [row.x for row in await db.run(_rows, db, "SELECT x FROM t")] == [1]
    with pytest.raises(sa.exc.IntegrityError) as caught:
        await db.run(_sql, db, "INSERT INTO t VALUES (?)", (1,))
    assert isinstance(caught.value.orig, sqlite3.IntegrityError)
    with pytest.raises(KeyError, match="missing"):  # keyword arguments reach the work
        await db.run(lambda **kw: kw["missing"], kwargs=1)


async def test_a_cancelled_caller_waits_for_its_transaction_to_end(db: Database) -> None:
    _sql(db, "CREATE TABLE t (x INTEGER)")
    started = threading.Event()

    def slow_write() -> None:
        with db.begin() as conn:
            conn.exec_driver_sql("INSERT INTO t VALUES (1)")
            started.set()
            time.sleep(0.3)
            conn.exec_driver_sql("INSERT INTO t VALUES (2)")

    with anyio.move_on_after(0.05) as scope:
        await db.run(slow_write)
    assert scope.cancelled_caught
    # Cancelled, but only once the transaction was committed: nothing runs on behind the caller's back.
    assert [row[0] for row in _rows(db, "SELECT x FROM t ORDER BY x")] == [1, 2]


async def test_a_long_call_never_holds_up_the_next(db: Database) -> None:
    release = threading.Event()
    order: list[str] = []

    def long() -> None:
        release.wait(10)
        order.append("long")

    def short() -> None:
        order.append("short")
        release.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(db.run, long)
            await anyio.sleep(0.05)
            await db.run(short)  # answered while the long call still holds its thread
    assert order == ["short", "long"]


async def test_a_worker_keeps_its_engine_connection_between_transactions(db: Database) -> None:
    """Issue 18: a pool checkout and check-in cost more than a short SQLite transaction, so a worker thread keeps
    one engine connection: many transactions, checked out of the pool once per worker that ran them."""
    checkouts: list[int] = []
    sa.event.listen(db.engine, "checkout", lambda *_: checkouts.append(threading.get_ident()))

    def one() -> int:
        db.write(lambda conn: conn.execute(sa.text("SELECT 1")).scalar_one())
        db.read(lambda conn: conn.execute(sa.text("SELECT 1")).scalar_one())
        return threading.get_ident()

    workers = {await db.run(one) for _ in range(20)}
    assert len(checkouts) == len(workers), (checkouts, workers)  # once per worker thread, not per transaction
    assert set(checkouts) == workers


async def test_a_nested_transaction_on_a_worker_takes_a_connection_of_its_own(db: Database) -> None:
    """A read inside a write on one worker thread cannot share the kept connection (it is in a transaction)."""

    def nested() -> tuple[int, int]:
        return db.write(
            lambda outer: (
                id(outer.connection.dbapi_connection),
                db.read(lambda inner: id(inner.connection.dbapi_connection)),
            )
        )

    outer, inner = await db.run(nested)
    assert outer != inner
    assert await db.run(lambda: db.read(lambda conn: conn.execute(sa.text("SELECT 2")).scalar_one())) == 2


async def test_a_closed_database_lets_go_of_every_kept_connection(tmp_path: Path) -> None:
    db = open_database(tmp_path / "kept.db")
    await db.run(lambda: db.write(lambda conn: conn.execute(sa.text("SELECT 1"))))
    pool = db.engine.pool
    assert pool.checkedout() >= 1  # type: ignore[attr-defined]  # the worker's kept connection
    db.close()
    assert pool.checkedout() == 0  # type: ignore[attr-defined]
    reopened = await db.run(lambda: db.read(lambda conn: conn.execute(sa.text("SELECT 3")).scalar_one()))
    assert reopened == 3  # a closed database opens again on its next use
    db.close()
