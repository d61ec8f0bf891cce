"""The engine API a ported store uses (issue 21), on SQLite and on PostgreSQL: ``db.write(fn)`` is atomic
check-then-write (BEGIN IMMEDIATE; SERIALIZABLE with retries), ``db.read(fn)`` a snapshot, ``db.run`` carries
either to a worker thread; the legacy connection is refused on PostgreSQL in one line; a wrong password or an
unreachable server is one line naming the host and the database, never the password."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from impyard.storage import tables
from impyard.storage import urls as dburl
from impyard.storage.db import Database, DatabaseError, NotPortedError, open_database
from tests import sqlfile

RACERS = 2
BOTH_READ_WAIT_S = 1.0  # how long a racer waits, after its check, for the other to have checked too


def add_channel(conn: Connection, channel_id: str) -> None:
    conn.execute(sa.insert(tables.channels).values(channel_id=channel_id, updated_at="2026-01-01T00:00:00Z"))


def channel_ids(db: Database) -> list[str]:
    return db.read(
        lambda conn: list(conn.scalars(sa.select(tables.channels.c.channel_id).order_by("channel_id")))
    )


def test_a_write_commits_and_a_read_sees_it(any_engine_db: Database) -> None:
    any_engine_db.write(lambda conn: add_channel(conn, "discord:1"))
    assert channel_ids(any_engine_db) == ["discord:1"]
    row = any_engine_db.read(lambda conn: conn.execute(sa.select(tables.channels)).mappings().one())
    assert (row["surface"], row["kind"], row["trusted"], row["mode"]) == (
        "discord",
        "guild",
        0,
        "all",
    )  # defaults


def test_a_read_refuses_to_write_on_both_engines(any_engine_db: Database) -> None:
    with pytest.raises(DBAPIError, match="(?i)read-?only"):
        any_engine_db.read(lambda conn: add_channel(conn, "discord:1"))
    any_engine_db.write(lambda conn: add_channel(conn, "discord:2"))  # the pooled connection writes again
    assert channel_ids(any_engine_db) == ["discord:2"]


def test_a_write_that_raises_leaves_nothing(any_engine_db: Database) -> None:
    def half(conn: Connection) -> None:
        add_channel(conn, "discord:1")
        raise ValueError("changed my mind")

    with pytest.raises(ValueError, match="changed my mind"):
        any_engine_db.write(half)
    assert channel_ids(any_engine_db) == []


def test_an_error_that_is_no_serialization_failure_is_not_retried(any_engine_db: Database) -> None:
    any_engine_db.write(lambda conn: add_channel(conn, "discord:1"))
    runs: list[int] = []

    def duplicate(conn: Connection) -> None:
        runs.append(1)
        add_channel(conn, "discord:1")

    with pytest.raises(IntegrityError):
        any_engine_db.write(duplicate)
    assert len(runs) == 1


def test_foreign_keys_hold_on_both_engines(any_engine_db: Database) -> None:
    orphan = sa.insert(tables.task_runs).values(run_id="r", task_id="missing", attempt=1, started_at="t")
    with pytest.raises(IntegrityError):
        any_engine_db.write(lambda conn: conn.execute(orphan))


def test_a_check_then_write_race_inserts_once(any_engine_db: Database) -> None:
    """Two threads each check 'is there a reservation for pip today?' and insert one when not; both check before
    either writes (where the engine lets them). Exactly one row: on SQLite the second waits for the write lock; on
    PostgreSQL the loser's transaction fails to serialize and runs again, and then sees the winner's row."""
    db, both_checked, runs = any_engine_db, threading.Barrier(RACERS, timeout=BOTH_READ_WAIT_S), []
    errors: list[BaseException] = []

    def reserve_once(conn: Connection) -> bool:
        runs.append(1)
        mine = sa.select(sa.func.count()).select_from(tables.ledger).where(tables.ledger.c.imp == "pip")
        if conn.execute(mine).scalar_one():
            return False
        try:
            both_checked.wait()  # on SQLite the other is still waiting for the lock: this times out
        except threading.BrokenBarrierError:
            pass
        conn.execute(
            sa.insert(tables.ledger).values(
                imp="pip", day="2026-01-01", month="2026-01", state="reserved", reserved_micros=1,
                created_at="t",
            )
        )  # fmt: skip
        return True

    def racer() -> None:
        try:
            db.write(reserve_once)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=racer) for _ in range(RACERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    count = db.read(
        lambda conn: conn.execute(sa.select(sa.func.count()).select_from(tables.ledger)).scalar_one()
    )
    assert count == 1
    if db.dialect == "postgresql":
        assert len(runs) == RACERS + 1  # both checked in parallel; the loser ran again


def test_retries_run_out_as_the_serialization_error(any_engine_db: Database) -> None:
    """With one run allowed, the loser of a PostgreSQL race gets the serialization failure itself."""
    if any_engine_db.dialect != "postgresql":
        pytest.skip("SQLite takes the write lock up front: there is no serialization failure to run out of")
    db = any_engine_db
    db.write(lambda conn: add_channel(conn, "discord:1"))
    first_read, second_done = threading.Event(), threading.Event()
    trusted = tables.channels.c.trusted

    def slow(conn: Connection) -> None:
        conn.execute(sa.select(trusted)).all()
        first_read.set()
        second_done.wait(10)
        conn.execute(sa.update(tables.channels).values(trusted=trusted + 1))

    def fast(conn: Connection) -> None:
        conn.execute(sa.update(tables.channels).values(trusted=trusted + 10))

    failure: list[BaseException] = []
    thread = threading.Thread(target=lambda: _collect(failure, lambda: db.write(slow, attempts=1)))
    thread.start()
    first_read.wait(10)
    db.write(fast)
    second_done.set()
    thread.join(30)
    assert len(failure) == 1 and isinstance(failure[0], OperationalError)
    assert getattr(failure[0].orig, "sqlstate", None) == "40001"
    assert db.read(lambda conn: conn.execute(sa.select(trusted)).scalar_one()) == 10


def _collect(into: list[BaseException], work: object) -> None:
    try:
        work()  # type: ignore[operator]
    except BaseException as exc:  # noqa: BLE001
        into.append(exc)


@pytest.mark.anyio
async def test_run_carries_engine_work_to_a_worker_thread(any_engine_db: Database) -> None:
    loop_thread = threading.get_ident()

    def add(conn: Connection) -> int:
        add_channel(conn, "discord:2")
        return threading.get_ident()

    assert await any_engine_db.run(any_engine_db.write, add) != loop_thread
    assert await any_engine_db.run(channel_ids, any_engine_db) == ["discord:2"]


# --- PostgreSQL: each transaction's isolation -------------------------------------------------------------


def _characteristics(conn: Connection) -> tuple[str, str]:
    return (
        str(conn.exec_driver_sql("SHOW transaction_isolation").scalar_one()),
        str(conn.exec_driver_sql("SHOW transaction_read_only").scalar_one()),
    )


def _every_kind(db: Database) -> list[tuple[str, str]]:
    """A write, a locking write, a read, and a write again: each sets its own, whatever came before on the
    connection (a worker keeps one connection across all of them)."""
    return [
        db.write(_characteristics),
        db.write(_characteristics, locking=True),
        db.read(_characteristics),
        db.write(_characteristics),
        db.read(_characteristics),
    ]


EXPECTED_CHARACTERISTICS = [
    ("serializable", "off"),
    ("read committed", "off"),
    ("repeatable read", "on"),
    ("serializable", "off"),
    ("repeatable read", "on"),
]


@pytest.mark.anyio
async def test_each_transaction_has_its_isolation_on_postgresql(migrated_postgres_url: str) -> None:
    """Set on the driver's connection (in the BEGIN it sends, no round trip of its own): checked on the
    server, from a worker thread (one kept connection) and from another thread (the pool)."""
    db = open_database(url=migrated_postgres_url)
    try:
        assert await db.run(_every_kind, db) == EXPECTED_CHARACTERISTICS
        assert _every_kind(db) == EXPECTED_CHARACTERISTICS
    finally:
        db.close()


# --- SQLite: the pysqlite recipe ----------------------------------------------------------------------------


def test_sqlite_writes_take_the_write_lock_up_front(tmp_path: Path) -> None:
    db = open_database(tmp_path / "impyard.db")
    other = sqlite3.connect(tmp_path / "impyard.db", timeout=0, isolation_level=None)
    with db.begin():  # no statement yet: the lock is held from BEGIN
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("BEGIN IMMEDIATE")
    with db.begin(read_only=True):  # a read takes no write lock
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    other.close()
    db.close()


def test_sqlite_engine_connections_are_wal_with_a_busy_timeout(tmp_path: Path) -> None:
    db = open_database(tmp_path / "impyard.db")
    with db.begin(read_only=True) as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar_one() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar_one() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one() >= 10_000
    db.close()


def test_a_plain_sqlite3_reader_of_the_file_sees_what_the_engine_wrote(tmp_path: Path) -> None:
    db = open_database(tmp_path / "impyard.db")
    db.write(lambda conn: add_channel(conn, "discord:1"))
    assert [row[0] for row in sqlfile.query(db, "SELECT channel_id FROM channels")] == ["discord:1"]
    db.close()


# --- PostgreSQL: what is not ported, and connection failures -------------------------------------------------


def test_asking_a_postgresql_database_for_its_sqlite_file_is_refused_naming_the_caller(
    postgres_url: str,
) -> None:
    db = open_database(url=postgres_url)
    try:
        with pytest.raises(NotPortedError) as caught:
            db.path  # noqa: B018 - the property is what refuses
        message = str(caught.value)
        assert "test_asking_a_postgresql_database_for_its_sqlite_file_is_refused_naming_the_caller" in message
        assert "needs a SQLite file" in message and db.url.where() in message
        with pytest.raises(NotPortedError):
            sqlfile.query(db, "SELECT 1")  # a test's raw look needs the file too
    finally:
        db.close()


def _broken(url: str, **changes: object) -> str:
    return make_url(url).set(**changes).render_as_string(hide_password=False)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"password": "wrong-Secret-77"}, "password authentication failed"),
        ({"port": 1}, "refused"),
        ({"database": "no_such_db"}, "does not exist"),
    ],
)
def test_a_failed_connection_is_one_line_naming_host_and_database_never_the_password(
    postgres_url: str, change: dict[str, object], says: str
) -> None:
    url = _broken(postgres_url, **change)
    target = dburl.parse(url)
    with pytest.raises(DatabaseError) as caught:
        open_database(url=url)
    message = caught.value.user_message()
    assert says in message and "\n" not in message
    assert f"database {target.url.database!r} on 127.0.0.1:{target.url.port}" in message
    for secret in {make_url(postgres_url).password, target.password} - {None}:
        assert secret and secret not in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
