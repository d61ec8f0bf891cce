"""The host database's one migration history, for SQLite and PostgreSQL alike: Alembic, configured in code.

Revisions live in ``versions/`` and are numbered ``0001``, ``0002``, ... in one line (no branches). ``0001`` is
the baseline: exactly the schema the ten legacy SQLite migrations of ``impyard.storage.migrations.legacy.MIGRATIONS`` built. A
developer adds a revision with ``python -m impyard.storage.migrations revision -m "what it does"`` (docs/storage.md).
"""

from __future__ import annotations

import functools
import sys
import threading
from pathlib import Path
from typing import Any

from alembic.config import Config
from alembic.runtime.environment import EnvironmentContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

HERE = Path(__file__).resolve().parent
BASELINE = "0001"  # the schema of legacy user_version 10
_ALEMBIC_PROXIES = threading.Lock()


def config(connection: Any = None, url: str | None = None, target_metadata: Any = None) -> Config:
    """An Alembic configuration without alembic.ini: the scripts shipped in this package, and either an open
    connection (in its transaction) or a URL to connect to."""
    cfg = Config(stdout=sys.stdout)  # the stream of now (alembic's default is the one at its import)
    cfg.set_main_option("script_location", str(HERE))
    cfg.set_main_option("version_locations", str(HERE / "versions"))
    cfg.set_main_option("path_separator", "os")
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["connection"] = connection
    cfg.attributes["target_metadata"] = target_metadata
    return cfg


def script_directory() -> ScriptDirectory:
    """The revisions shipped here, read once per process (reading them is most of what opening costs)."""
    return _script_directory(HERE)


@functools.cache
def _script_directory(here: Path) -> ScriptDirectory:
    return ScriptDirectory.from_config(config())


def upgrade(connection: Connection, destination: str = "head") -> None:
    """Run the revisions from the database's own to ``destination`` on ``connection``, in its transaction."""
    script = script_directory()
    _run(
        connection, script, lambda current, _context: script._upgrade_revs(destination, current), destination
    )


def stamp(connection: Connection, revision: str) -> None:
    """Record ``revision`` as the database's own without running anything (a legacy home at the baseline)."""
    script = script_directory()
    _run(connection, script, lambda current, _context: script._stamp_revs(revision, current), revision)


def _run(connection: Connection, script: ScriptDirectory, fn: Any, destination: str) -> None:
    """What ``alembic upgrade``/``stamp`` do, without env.py: on the caller's connection, joining its transaction.
    One at a time in a process: Alembic's ``context`` and ``op`` are module-wide proxies."""
    with (
        _ALEMBIC_PROXIES,
        EnvironmentContext(config(connection=connection), script, fn=fn, destination_rev=destination) as env,
    ):
        env.configure(connection=connection)
        with env.begin_transaction():  # the caller's transaction is open: this joins it
            env.run_migrations()


def head() -> str:
    """The newest revision this impyard knows."""
    heads = script_directory().get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"the migration history must be one line; it has the heads {heads}")
    return heads[0]


def position(revision: str) -> int | None:
    """How many revisions ``revision`` is past the baseline (0 for the baseline); None for one unknown here."""
    script = script_directory()
    try:
        found = script.get_revision(revision)
    except Exception:  # noqa: BLE001 - alembic raises several kinds for an id it does not know
        return None
    if found is None:
        return None
    return len(list(script.iterate_revisions(revision, "base"))) - 1


def next_revision_id() -> str:
    """The id of the next revision: one more than the head's number, four digits."""
    return f"{int(head()) + 1:04d}"
