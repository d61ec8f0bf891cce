"""What a failure of the host's own database is (docs/storage.md): the errors it raises in impyard's words, and
every exception either engine or the disk under it may raise (``impyard.storage.faults`` says which kind)."""

from __future__ import annotations

import sqlite3

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from impyard.errors import ImpyardError
from impyard.storage.faults import CommitUncertain


class DatabaseError(ImpyardError):
    """The database cannot be opened or migrated; the message says what to do."""


class NotPortedError(DatabaseError):
    """Code that needs a SQLite file was asked to run on PostgreSQL."""


# What a failure of the host's own database can raise, from either engine or the disk under it (issue 19 #1,
# issue 21); impyard.storage.faults says which kind it was.
STORAGE_ERRORS = (sqlite3.Error, DBAPIError, sa.exc.TimeoutError, DatabaseError, OSError, CommitUncertain)
