"""One migrated PostgreSQL database per test session (per xdist worker), emptied before each test that asks for
one, instead of a database created and dropped for every test (issue 35: a ``CREATE DATABASE … TEMPLATE`` and its
``DROP`` cost a store test far more than its own work).

Emptying is the cheapest that leaves what a new database would be: the tables that hold rows are truncated, the
sequences that were drawn from restart, and the connections a test left behind are ended (they could hold a
lock, or see rows of a test gone). A test that changed the schema (``DROP TABLE``, a scratch table, another
revision) leaves a schema whose fingerprint differs: a table of its own is dropped, anything else has the database
dropped and migrated anew, so the next test never inherits it. ``alembic_version`` is kept (the migrations' own rows); a revision that fills any other
table at migration time is refused here, since emptying would delete its rows.
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from bench.pgcluster import PostgresServer
from impyard.storage.db import open_database

KEPT_TABLES = frozenset({"alembic_version"})

# What a test could change of the schema: every relation's columns, the indexes, the constraints, the triggers
# and the revision; md5 over them, in one round trip.
_FINGERPRINT = sa.text(
    """
    SELECT md5(coalesce(string_agg(item, ';' ORDER BY item), '')) FROM (
        SELECT c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        WHERE c.relnamespace = current_schema()::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
        UNION ALL SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema()
        UNION ALL SELECT conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
        FROM pg_constraint WHERE connamespace = current_schema()::regnamespace
        UNION ALL SELECT tgrelid::regclass || ' ' || tgname FROM pg_trigger WHERE NOT tgisinternal
        UNION ALL SELECT 'revision ' || version_num FROM alembic_version
    ) AS schema(item)
    """
)
_TABLES = sa.text("SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename")
_DRAWN_SEQUENCES = sa.text(
    "SELECT sequencename FROM pg_sequences WHERE schemaname = current_schema() AND last_value IS NOT NULL"
)
_END_OTHER_CONNECTIONS = sa.text(
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class SessionDatabase:
    """A migrated database on ``server`` for a whole test session; ``fresh()`` empties it and gives its URL."""

    def __init__(self, server: PostgresServer, prefix: str = "impyard_session") -> None:
        self.server = server
        self.prefix = prefix
        self.name = ""
        self._admin = sa.create_engine(server.admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
        self._engine: sa.Engine | None = None
        self._tables: tuple[str, ...] = ()
        self._fingerprint = ""
        self._create()

    @property
    def url(self) -> str:
        return self.server.url_of(self.name)

    def _create(self) -> None:
        self.name = f"{self.prefix}_{uuid.uuid4().hex[:12]}"
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {_quote(self.name)}")
        open_database(url=self.url).close()  # migrated to the newest revision, then let go
        # One connection of its own, kept for the session: emptying costs a round trip or three, not a login.
        self._engine = sa.create_engine(
            self.url, isolation_level="AUTOCOMMIT", pool_size=1, max_overflow=0, pool_pre_ping=True
        )
        with self._engine.connect() as conn:
            self._fingerprint = str(conn.execute(_FINGERPRINT).scalar_one())
            self._tables = tuple(str(t) for t in conn.execute(_TABLES).scalars() if t not in KEPT_TABLES)
            filled = [
                t for t in self._tables if conn.exec_driver_sql(f"SELECT 1 FROM {_quote(t)} LIMIT 1").first()
            ]
        if filled:
            raise RuntimeError(
                f"the migrations left rows in {filled}: emptying between tests would delete them "
                "(tests/postgres_session.py keeps only alembic_version's)"
            )

    def _drop(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {_quote(self.name)} WITH (FORCE)")

    def fresh(self) -> str:
        """The database as just migrated: no rows, no drawn sequence, no other connection; its URL."""
        assert self._engine is not None
        with self._engine.connect() as conn:
            conn.execute(_END_OTHER_CONNECTIONS)
            changed = self._schema_changed(conn)
            if changed:  # a scratch table of a test's own is the common change: dropping it undoes it
                extra = set(conn.execute(_TABLES).scalars()) - set(self._tables) - KEPT_TABLES
                if extra:
                    conn.exec_driver_sql(f"DROP TABLE {', '.join(map(_quote, sorted(extra)))} CASCADE")
                    changed = self._schema_changed(conn)
            if not changed:
                filled = conn.exec_driver_sql(
                    " UNION ALL ".join(
                        f"(SELECT {i} FROM {_quote(t)} LIMIT 1)" for i, t in enumerate(self._tables)
                    )
                ).scalars()
                dirty = [self._tables[i] for i in filled]
                if dirty:
                    conn.exec_driver_sql(f"TRUNCATE {', '.join(map(_quote, dirty))} RESTART IDENTITY CASCADE")
                for sequence in conn.execute(_DRAWN_SEQUENCES).scalars():
                    conn.exec_driver_sql(f"ALTER SEQUENCE {_quote(sequence)} RESTART")
        if changed:  # a test changed the schema: start again from nothing rather than undo its change
            self._drop()
            self._create()
        return self.url

    def _schema_changed(self, conn: sa.Connection) -> bool:
        try:
            return bool(conn.execute(_FINGERPRINT).scalar_one() != self._fingerprint)
        except sa.exc.DBAPIError:  # alembic_version itself is gone
            return True

    def close(self) -> None:
        self._drop()
        self._admin.dispose()
