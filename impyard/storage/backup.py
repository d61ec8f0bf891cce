"""A consistent copy of a SQLite host database while hosts write to it (issue 36, ``impyard backup``).

SQLite's online backup API copies the database page by page under one read transaction: in WAL mode writers go on
meanwhile (their commits land in the WAL, after the snapshot being copied), so the copy is the database as it was
at one instant, every committed transaction whole or not at all. The copy is written beside its target, checked
(``PRAGMA integrity_check``), flushed to disk, then renamed into place: a target that exists is always whole.

PostgreSQL is backed up with its own tools (``pg_dump``; docs/storage.md "Backing up").
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from impyard.errors import ImpyardError
from impyard.storage.db import Database

PG_DUMP_HINT = (
    'the database is PostgreSQL: back it up with pg_dump (pg_dump --format=custom "$IMPYARD_DATABASE_URL" '
    '> impyard.dump; docs/storage.md, "Backing up")'
)


class BackupError(ImpyardError):
    """A backup that cannot be made, with the reason and the fix in one line."""


@dataclass(frozen=True)
class DatabaseCopy:
    path: Path
    bytes: int


def copy_sqlite(db: Database, target: Path) -> DatabaseCopy:
    """Copy ``db`` (a SQLite file, possibly being written by running hosts) to ``target``, which must not exist."""
    if db.dialect != "sqlite":
        raise BackupError(PG_DUMP_HINT)
    if target.exists():
        raise BackupError(f"{target} already exists: name a new file (a backup never overwrites one)")
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    source = sqlite3.connect(db.path, timeout=30)
    try:
        copy = sqlite3.connect(partial)
        try:
            source.backup(copy)  # one step: one snapshot; writers go on in the WAL meanwhile
            verdict = copy.execute("PRAGMA integrity_check").fetchone()
            if verdict is None or verdict[0] != "ok":
                raise BackupError(
                    f"the copy of {db.path} failed its integrity check ({verdict}): nothing was kept"
                )
            copy.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, no -wal beside it
        finally:
            copy.close()
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        source.close()
    with open(partial, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(partial, target)
    return DatabaseCopy(path=target, bytes=target.stat().st_size)
