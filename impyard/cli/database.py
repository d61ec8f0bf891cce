"""The host's database as a command opens it: a database that cannot be opened is a one-line CLI error."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from impyard.cli.errors import CliError
from impyard.storage.db import Database, DatabaseError, open_database


def open_or_fail() -> Database:
    """The database of this IMPYARD_HOME (the caller closes it); one that cannot be opened is a ``CliError``."""
    try:
        return open_database()
    except DatabaseError as exc:
        raise CliError(str(exc)) from exc


@contextmanager
def database(*refusals: type[Exception]) -> Iterator[Database]:
    """The database of this IMPYARD_HOME, closed at the end; ``refusals`` raised inside become one-line CLI
    errors (the first line of their message)."""
    db = open_or_fail()
    try:
        yield db
    except refusals as exc:
        raise CliError(str(exc).splitlines()[0]) from exc
    finally:
        db.close()
