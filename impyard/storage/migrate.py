"""Migration at open (docs/storage.md, "How migrations run"): bring a database's schema to the newest revision.

The schema has one history for both engines: the Alembic revisions in ``impyard.storage.migrations``. A fresh
database is built by Alembic; a SQLite home from before Alembic (``PRAGMA user_version`` 1-10) is brought to 10 by
the frozen legacy list (``impyard.storage.migrations.legacy``) and stamped at Alembic's baseline, all inside one
``BEGIN IMMEDIATE``. Two processes opening the same database never both migrate (SQLite: the write lock;
PostgreSQL: an advisory lock). A database newer than this impyard is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from impyard.storage import migrations
from impyard.storage.errors import DatabaseError
from impyard.storage.migrations.legacy import LEGACY_VERSION, Migration, split_statements

if TYPE_CHECKING:
    from impyard.storage.db import Database

MIGRATION_LOCK_KEY = 0x696D7079617264  # pg_advisory_xact_lock key of "the migrator": b"impyard"


def migrate(db: Database, legacy: Sequence[Migration]) -> None:
    """Bring ``db``'s schema to the newest revision. ``legacy``: the frozen list this impyard knows (a test's older
    impyard knows fewer)."""
    expected = list(range(1, len(legacy) + 1))
    if [m.version for m in legacy] != expected:
        raise DatabaseError("migrations must be numbered 1, 2, 3, ... in order")
    if db.dialect == "sqlite":
        with db.begin() as conn:  # BEGIN IMMEDIATE, the write lock: one migrator at a time
            _migrate_sqlite(conn, legacy, db.path, db.url.where())
    else:
        with db.engine.connect() as conn, conn.begin():
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(MIGRATION_LOCK_KEY)))
            _migrate_postgresql(conn, db.url.where())


def mirrored_version() -> int:
    """SQLite's ``user_version`` at the newest revision: 10 at the baseline, one more for each revision past it."""
    return LEGACY_VERSION + (migrations.position(migrations.head()) or 0)


def _migrate_sqlite(conn: Connection, legacy: Sequence[Migration], path: Path, where: str) -> None:
    version = int(conn.exec_driver_sql("PRAGMA user_version").scalar_one())
    tables = set(sa.inspect(conn).get_table_names()) - {"sqlite_sequence"}
    managed = "alembic_version" in tables
    # A fresh file: Alembic builds it (unless the list given stops short of the baseline: a test's older impyard).
    if not tables and version == 0 and len(legacy) >= LEGACY_VERSION:
        _build_fresh_sqlite(conn)
        _mirror_version(conn)
        version, managed = mirrored_version(), True
    if not managed and version > len(legacy):
        raise DatabaseError(
            f"{path} has schema version {version}, newer than this impyard knows ({len(legacy)}); upgrade impyard"
        )
    for migration in legacy[version:]:  # a legacy home, brought to 10 by the frozen list
        for statement in split_statements(migration.sql):
            conn.exec_driver_sql(statement)
        conn.exec_driver_sql(f"PRAGMA user_version = {int(migration.version)}")
        version = migration.version
    if not managed and version >= LEGACY_VERSION:
        migrations.stamp(conn, migrations.BASELINE)
        managed = True
    if managed and _upgrade(conn, where):
        _mirror_version(conn)


def _migrate_postgresql(conn: Connection, where: str) -> None:
    tables = set(sa.inspect(conn).get_table_names())
    if not tables:
        migrations.upgrade(conn)
    elif "alembic_version" not in tables:
        raise DatabaseError(
            f"{where} has tables but no impyard migration history: give impyard a database of its own "
            "(createdb impyard)"
        )
    else:
        _upgrade(conn, where)


def _upgrade(conn: Connection, where: str) -> bool:
    """Alembic from the database's revision to the head; True when it moved. Refuses a newer database."""
    from alembic.runtime.migration import MigrationContext

    current = MigrationContext.configure(conn).get_current_revision()
    head = migrations.head()
    if current == head:
        return False
    if current is not None and migrations.position(current) is None:
        raise DatabaseError(
            f"{where} has schema revision {current}, newer than this impyard knows ({head}); upgrade impyard"
        )
    migrations.upgrade(conn)
    return True


def _mirror_version(conn: Connection) -> None:
    """SQLite: user_version follows Alembic, so an impyard from before Alembic refuses a newer file."""
    conn.exec_driver_sql(f"PRAGMA user_version = {mirrored_version()}")


# The statements Alembic ran to build a fresh SQLite file, by (history, head): the next fresh file of this process
# gets them again, as SQL. Building the revisions' SQLAlchemy objects is most of what a new file costs, and
# the tests make thousands.
_FRESH_SQLITE: dict[tuple[str, str], list[tuple[str, Any]]] = {}


def _build_fresh_sqlite(conn: Connection) -> None:
    key = (str(migrations.HERE), migrations.head())
    recorded = _FRESH_SQLITE.get(key)
    if recorded is not None:
        for statement, parameters in recorded:
            conn.exec_driver_sql(statement, parameters)
        return
    statements: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
        statements.append((statement, parameters))

    sa.event.listen(conn, "before_cursor_execute", record)
    try:
        migrations.upgrade(conn)
    finally:
        sa.event.remove(conn, "before_cursor_execute", record)
    _FRESH_SQLITE[key] = statements
