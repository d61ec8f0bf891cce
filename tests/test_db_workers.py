"""The database's worker threads (issue 18): ``Database.run`` hands blocking work to a worker thread and back at
a fraction of a general thread hop's cost, and keeps the hop's promises — the loop never runs SQLite, results
and errors come back as themselves, a cancelled caller waits for its transaction to end, and a long call never
holds up the next."""

from __future__ import annotations

import sqlite3
import threading
import time

import anyio
import pytest

from impyard.db import Database

pytestmark = pytest.mark.anyio


async def test_work_runs_off_the_loop_on_a_connection_of_its_own_thread(db: Database) -> None:
    loop_thread = threading.get_ident()

    def where() -> tuple[int, int]:
        return threading.get_ident(), id(db.connection())

    thread, connection = await db.run(where)
    assert thread != loop_thread
    assert connection != id(db.connection())  # the loop thread's own connection is another one


async def test_results_and_errors_come_back_as_themselves(db: Database) -> None:
    db.execute("CREATE TABLE t (x INTEGER PRIMARY KEY)")
    assert await db.run(db.execute, "INSERT INTO t VALUES (?)", (1,)) is not None
    assert [row["x"] for row in await db.run(db.query, "SELECT x FROM t")] == [1]
    with pytest.raises(sqlite3.IntegrityError):
        await db.run(db.execute, "INSERT INTO t VALUES (?)", (1,))
    with pytest.raises(KeyError, match="missing"):  # keyword arguments reach the work
        await db.run(lambda **kw: kw["missing"], kwargs=1)


async def test_a_cancelled_caller_waits_for_its_transaction_to_end(db: Database) -> None:
    db.execute("CREATE TABLE t (x INTEGER)")
    started = threading.Event()

    def slow_write() -> None:
        with db.transaction() as conn:
            conn.execute("INSERT INTO t VALUES (1)")
            started.set()
            time.sleep(0.3)
            conn.execute("INSERT INTO t VALUES (2)")

    with anyio.move_on_after(0.05) as scope:
        await db.run(slow_write)
    assert scope.cancelled_caught
    # Cancelled, but only once the transaction was committed: nothing runs on behind the caller's back.
    assert [row[0] for row in db.query("SELECT x FROM t ORDER BY x")] == [1, 2]


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
