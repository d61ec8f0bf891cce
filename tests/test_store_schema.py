"""One schema and one migration history for SQLite and PostgreSQL (issue 21): Alembic's baseline is exactly the
schema the ten legacy migrations built; an older home is brought to it and stamped; two openers never both
migrate; a database newer than this impyard is refused; the stores' tables (impyard.storage.tables) are the migrated ones."""

from __future__ import annotations

import shutil
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

import impyard.storage.migrate
from impyard.storage import migrations, tables
from impyard.storage.db import Database, DatabaseError, open_database
from impyard.storage.migrations.legacy import LEGACY_VERSION, MIGRATIONS, split_statements
from tests import sqlfile

EXPECTED_TABLES = 28
# Tables of revisions after the baseline (0002 leases, 0003 ledger_totals, 0007 shard_layout, 0008 imp_settings,
# 0009 host_activity): a legacy home gets them at upgrade.
AFTER_BASELINE = {"leases", "ledger_totals", "shard_layout", "imp_settings", "host_activity"}
COLUMNS_AFTER_BASELINE = {
    "audit": {"host"},
    "channels": {"audience"},
    "ledger": {"run_id"},  # 0006: the box run that made the call (issue 34's spend per origin)
}  # columns the revisions after the baseline added to older tables
INDEXES_AFTER_BASELINE = {
    "wakes": {"wakes_finished"}
}  # and their indexes (0009: the Now page's recent outcomes)


def at_baseline(schema: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A migrated schema without what the revisions after the baseline added: what the legacy list built."""
    return {
        table: {
            **found,
            "columns": [c for c in found["columns"] if c[0] not in COLUMNS_AFTER_BASELINE.get(table, ())],
            "indexes": [i for i in found["indexes"] if i[0] not in INDEXES_AFTER_BASELINE.get(table, ())],
        }
        for table, found in schema.items()
        if table not in AFTER_BASELINE
    }


def legacy_home(path: Path, upto: int = len(MIGRATIONS)) -> None:
    """A home as an impyard before Alembic left it: the legacy migrations 1..upto, user_version upto."""
    conn = sqlite3.connect(path, isolation_level=None)
    for migration in MIGRATIONS[:upto]:
        for statement in split_statements(migration.sql):
            conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {upto}")
    conn.close()


def shape(engine: sa.Engine, *, types: bool = True) -> dict[str, dict[str, Any]]:
    """Everything about a schema a store can tell apart: tables, columns in order (type, nullable, default),
    primary keys, indexes, unique constraints, foreign keys."""
    found: dict[str, dict[str, Any]] = {}
    with engine.connect() as conn:
        inspector = sa.inspect(conn)
        for table in sorted(inspector.get_table_names()):
            if table in ("alembic_version", "sqlite_sequence"):
                continue
            columns = [
                (c["name"], str(c["type"]) if types else "", c["nullable"] if types else "", c.get("default"))
                for c in inspector.get_columns(table)
            ]
            if not types:  # across engines a default reads differently ('0' vs '0'::integer): its presence;
                # a row id's sequence is PostgreSQL's way to do what the rowid does on SQLite
                columns = [
                    (name, t, n, default is not None and not str(default).startswith("nextval("))
                    for name, t, n, default in columns
                ]
            found[table] = {
                "columns": columns,
                "primary_key": inspector.get_pk_constraint(table)["constrained_columns"],
                "indexes": sorted(
                    (i["name"], tuple(i["column_names"]), bool(i["unique"]))
                    for i in inspector.get_indexes(table)
                    if not i.get("duplicates_constraint")  # PostgreSQL lists a unique constraint's index too
                ),
                "unique": sorted(tuple(u["column_names"]) for u in inspector.get_unique_constraints(table)),
                "foreign_keys": _foreign_keys(conn, inspector, table),
            }
    return found


def _foreign_keys(conn: sa.Connection, inspector: Any, table: str) -> list[tuple[Any, ...]]:
    if (
        conn.dialect.name == "sqlite"
    ):  # SQLAlchemy's reflection misses an inline ON DELETE here; SQLite does not
        rows = conn.exec_driver_sql(f"PRAGMA foreign_key_list({table})").mappings()
        return sorted((r["from"], r["table"], r["to"], r["on_delete"]) for r in rows)
    return sorted(
        (",".join(f["constrained_columns"]), f["referred_table"], ",".join(f["referred_columns"]),
         (f.get("options") or {}).get("ondelete") or "NO ACTION")
        for f in inspector.get_foreign_keys(table)
    )  # fmt: skip


def sqlite_engine(path: Path) -> sa.Engine:
    return sa.create_engine(f"sqlite:///{path}", poolclass=sa.NullPool)


def autoincrement_tables(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall()
    finally:
        conn.close()
    return {name for name, sql in rows if "AUTOINCREMENT" in (sql or "").upper()}


@pytest.fixture
def counted_upgrades(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every Alembic upgrade run, slowed down so that two openers overlap in it if they can."""
    runs: list[str] = []
    real = migrations.upgrade
    # no fresh file built from SQL this process recorded
    monkeypatch.setattr(impyard.storage.migrate, "_FRESH_SQLITE", {})

    def upgrade(connection: sa.Connection, destination: str = "head") -> None:
        runs.append(destination)
        threading.Event().wait(0.3)
        real(connection, destination)

    monkeypatch.setattr(migrations, "upgrade", upgrade)
    yield runs


def open_at_once(open_one: Callable[[], Database], count: int = 3) -> list[BaseException]:
    errors: list[BaseException] = []
    opened: list[Database] = []
    start = threading.Barrier(count)

    def worker() -> None:
        start.wait()
        try:
            opened.append(open_one())
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for db in opened:
        db.close()
    return errors


# --- one schema ---------------------------------------------------------------------------------------------


def test_alembic_builds_exactly_the_schema_the_legacy_migrations_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(impyard.storage.migrate, "_FRESH_SQLITE", {})  # Alembic itself, not a recording
    legacy_home(tmp_path / "legacy.db")
    open_database(tmp_path / "fresh.db").close()
    legacy, whole = shape(sqlite_engine(tmp_path / "legacy.db")), shape(sqlite_engine(tmp_path / "fresh.db"))
    assert len(whole) == EXPECTED_TABLES
    fresh = at_baseline(whole)
    for table in sorted(set(legacy) | set(fresh)):
        assert fresh.get(table) == legacy.get(table), table
    # INTEGER PRIMARY KEY AUTOINCREMENT where the legacy said so (a trimmed row's number is never reused)
    assert autoincrement_tables(tmp_path / "fresh.db") == autoincrement_tables(tmp_path / "legacy.db")
    assert autoincrement_tables(tmp_path / "fresh.db") == {"history", "responder_lines"}


def test_a_fresh_file_built_again_from_the_recorded_sql_is_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(impyard.storage.migrate, "_FRESH_SQLITE", {})
    open_database(tmp_path / "first.db").close()  # by Alembic, recorded
    assert impyard.storage.migrate._FRESH_SQLITE
    open_database(tmp_path / "second.db").close()  # from the recording
    first, second = Database(tmp_path / "first.db"), Database(tmp_path / "second.db")
    assert shape(sqlite_engine(tmp_path / "second.db")) == shape(sqlite_engine(tmp_path / "first.db"))
    assert (
        (second.revision, second.version)
        == (first.revision, first.version)
        == (migrations.head(), LEGACY_VERSION + (migrations.position(migrations.head()) or 0))
    )
    assert autoincrement_tables(tmp_path / "second.db") == {"history", "responder_lines"}
    first.close()
    second.close()


def test_a_row_id_is_still_the_rowid_on_sqlite(tmp_path: Path) -> None:
    db = open_database(tmp_path / "impyard.db")
    with db.begin() as conn:
        conn.execute(sa.insert(tables.audit).values(at="t", imp="pip", method="m", verdict="allow"))
        assert conn.exec_driver_sql("SELECT id = rowid FROM audit").scalar_one() == 1
    db.close()


def test_the_same_schema_on_postgresql(tmp_path: Path, postgres_url: str) -> None:
    open_database(tmp_path / "fresh.db").close()
    db = open_database(url=postgres_url)
    try:
        on_sqlite, on_postgres = (
            shape(sqlite_engine(tmp_path / "fresh.db"), types=False),
            shape(db.engine, types=False),
        )
    finally:
        db.close()
    assert len(on_postgres) == EXPECTED_TABLES
    for table in sorted(set(on_sqlite) | set(on_postgres)):
        assert on_postgres.get(table) == on_sqlite.get(table), table


def test_the_postgresql_types_are_the_portable_ones(postgres_url: str) -> None:
    db = open_database(url=postgres_url)
    try:
        inspector = sa.inspect(db.engine)
        types = {c["name"]: str(c["type"]) for c in inspector.get_columns("ledger")}
        assert types["id"] == types["reserved_micros"] == types["cost_micros"] == "BIGINT"
        assert {c["name"]: str(c["type"]) for c in inspector.get_columns("memory_records")}[
            "vector"
        ] == "BYTEA"
        assert {c["name"]: str(c["type"]) for c in inspector.get_columns("tasks")}[
            "ceiling_s"
        ] == "DOUBLE PRECISION"
        with db.begin() as conn:  # a row id is generated by the server, as on SQLite
            ids = [
                conn.execute(sa.insert(tables.audit).values(at="t", imp="pip", method="m", verdict="v")
                             .returning(tables.audit.c.id)).scalar_one()
                for _ in range(2)
            ]  # fmt: skip
        assert ids == [1, 2]
    finally:
        db.close()


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_the_stores_tables_are_the_migrated_schema(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """impyard.storage.tables (what a ported store's SQL names) has no difference from a database at the head."""
    if engine == "sqlite":
        db = open_database(tmp_path / "impyard.db")
    else:
        db = open_database(url=request.getfixturevalue("postgres_url"))
    try:
        with db.begin(read_only=True) as conn:
            context = MigrationContext.configure(
                conn, opts={"compare_type": True, "compare_server_default": True}
            )
            differences = compare_metadata(context, tables.metadata)
    finally:
        db.close()
    if engine == "postgresql":  # every key column is NOT NULL there, whatever the legacy SQLite declared
        differences = [d for d in differences if not _key_made_not_null(d)]
    assert differences == []


def _key_made_not_null(difference: Any) -> bool:
    if not isinstance(difference, list) or len(difference) != 1:
        return False
    kind, _schema, table, column, _existing, _old, new = difference[0]
    return kind == "modify_nullable" and new is True and tables.metadata.tables[table].c[column].primary_key


# --- one history --------------------------------------------------------------------------------------------


def test_the_history_is_one_line_from_the_baseline() -> None:
    script = migrations.script_directory()
    revisions = list(script.walk_revisions())
    assert [r.revision for r in reversed(revisions)] == [f"{n:04d}" for n in range(1, len(revisions) + 1)]
    assert revisions[-1].revision == migrations.BASELINE and migrations.head() == revisions[0].revision


def test_the_helper_shows_the_head(capsys: pytest.CaptureFixture[str]) -> None:
    from impyard.storage.migrations.__main__ import main

    main(["heads"])
    assert f"{migrations.head()} (head)" in capsys.readouterr().out


def test_a_fresh_database_is_built_by_alembic_and_numbered_for_older_impyards(tmp_path: Path) -> None:
    db = open_database(tmp_path / "impyard.db")
    assert db.revision == migrations.head()
    assert db.version == LEGACY_VERSION + (migrations.position(migrations.head()) or 0)  # user_version
    assert db.migrate() == db.version  # idempotent
    db.close()


@pytest.mark.parametrize("upto", [1, 5, 9, 10])
def test_an_older_home_is_brought_to_version_ten_then_stamped(tmp_path: Path, upto: int) -> None:
    path = tmp_path / "impyard.db"
    legacy_home(path, upto)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("INSERT INTO channels (channel_id, updated_at) VALUES ('discord:1', 't')")
    conn.close()
    db = open_database(path)
    assert db.revision == migrations.head()
    assert db.version == LEGACY_VERSION + (migrations.position(migrations.head()) or 0)
    assert [tuple(r) for r in sqlfile.query(db, "SELECT channel_id FROM channels")] == [
        ("discord:1",)
    ]  # kept
    db.close()
    legacy_home(tmp_path / "reference.db")
    assert at_baseline(shape(sqlite_engine(path))) == shape(sqlite_engine(tmp_path / "reference.db"))


def test_a_failed_upgrade_of_an_older_home_leaves_it_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "impyard.db"
    legacy_home(path, 5)

    def broken_stamp(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("stamp failed")

    monkeypatch.setattr(migrations, "stamp", broken_stamp)
    with pytest.raises(RuntimeError, match="stamp failed"):
        Database(path).migrate()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 5  # legacy 6-10 rolled back with it
    assert not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'responder_lines'").fetchall()
    conn.close()


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_openers_at_once_migrate_once(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest, counted_upgrades: list[str]
) -> None:
    if engine == "sqlite":
        errors = open_at_once(lambda: open_database(tmp_path / "impyard.db"))
        check = open_database(tmp_path / "impyard.db")
    else:
        url = request.getfixturevalue("postgres_url")
        errors = open_at_once(lambda: open_database(url=url))
        check = open_database(url=url)
    assert errors == []
    assert counted_upgrades == ["head"]  # the others waited for the lock, then found the head
    assert check.revision == migrations.head()
    check.close()


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_a_database_newer_than_this_impyard_is_refused(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if engine == "sqlite":

        def reopen() -> Database:
            return open_database(tmp_path / "impyard.db")
    else:
        url = request.getfixturevalue("postgres_url")

        def reopen() -> Database:
            return open_database(url=url)

    db = reopen()
    with db.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
    db.close()
    with pytest.raises(
        DatabaseError,
        match=f"schema revision 9999, newer than this impyard knows .{migrations.head()}.; upgrade impyard",
    ):
        reopen()


def test_a_legacy_home_newer_than_the_legacy_list_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "impyard.db"
    legacy_home(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA user_version = 42")
    conn.close()
    with pytest.raises(DatabaseError, match="schema version 42, newer than this impyard knows"):
        open_database(path)


def test_a_postgresql_database_with_foreign_tables_is_refused(postgres_url: str) -> None:
    engine = sa.create_engine(postgres_url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE someone_elses (x INTEGER)")
    engine.dispose()
    with pytest.raises(DatabaseError, match="has tables but no impyard migration history"):
        open_database(url=postgres_url)


NEXT_REVISION = """
import sqlalchemy as sa
from alembic import op

revision = "{next}"
down_revision = "{head}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("channels", sa.Column("note", sa.Text(), nullable=False, server_default=""))
"""


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_a_later_revision_upgrades_an_open_database_and_older_impyards_refuse_it(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if engine == "sqlite":
        legacy_home(tmp_path / "impyard.db", 7)  # from the legacy list, through the baseline, to the next one

        def reopen() -> Database:
            return open_database(tmp_path / "impyard.db")
    else:
        url = request.getfixturevalue("postgres_url")

        def reopen() -> Database:
            return open_database(url=url)

    reopen().close()
    head = migrations.head()
    newer = tmp_path / "newer"
    shutil.copytree(migrations.HERE, newer, ignore=shutil.ignore_patterns("__pycache__"))
    next_id = f"{int(head) + 1:04d}"
    (newer / "versions" / f"{next_id}_note.py").write_text(NEXT_REVISION.format(next=next_id, head=head))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(migrations, "HERE", newer)
        db = reopen()
        assert db.revision == next_id
        assert (
            db.version == LEGACY_VERSION + int(next_id) - 1
        )  # SQLite's user_version: an older impyard refuses
        with db.begin(read_only=True) as conn:
            assert "note" in {c["name"] for c in sa.inspect(conn).get_columns("channels")}
        db.close()
    with pytest.raises(DatabaseError, match=f"schema revision {next_id}, newer than this impyard knows"):
        reopen()
