"""What a failure of the host's own database was (impyard.storage.faults; issue 19 #1, issue 21): a table of
errors as each engine and the disk raise them, and the kind and words each one gets."""

from __future__ import annotations

import errno
import sqlite3

import psycopg
import pytest
from sqlalchemy.exc import OperationalError as SAOperationalError

from impyard.storage.faults import CommitUncertain, Fault, classify, waits_for, words


def _sqlite(message: str, code: int | None) -> sqlite3.Error:
    error = sqlite3.OperationalError(message)
    if code is not None:
        error.sqlite_errorcode = code  # what the library sets on an error it raised
    return error


def _wrapped(orig: BaseException) -> SAOperationalError:
    """As SQLAlchemy hands a driver's error on: the driver's in ``orig``."""
    return SAOperationalError("SELECT 1", {}, orig)


CASES = [
    # (what, error, kind)
    ("SQLite: disk full, by code", _sqlite("database or disk is full", 13), "full"),
    ("SQLite: disk full, words only", _sqlite("database or disk is full", None), "full"),
    (
        "SQLite: read-only file (SQLITE_READONLY_DBMOVED)",
        _sqlite("attempt to write a readonly database", 1032),
        "full",
    ),
    ("SQLite: I/O error", _sqlite("disk I/O error", 10), "full"),
    ("SQLite: locked past the busy timeout", _sqlite("database is locked", 5), "busy"),
    ("SQLite: something else", _sqlite("no such table: x", 1), "failed"),
    ("SQLite through SQLAlchemy", _wrapped(_sqlite("database or disk is full", 13)), "full"),
    ("OS: no space", OSError(errno.ENOSPC, "No space left on device"), "full"),
    ("OS: read-only file system", OSError(errno.EROFS, "Read-only file system"), "full"),
    ("OS: permission denied is not the disk", OSError(errno.EACCES, "Permission denied"), "failed"),
    (
        "PostgreSQL: connection refused (no SQLSTATE)",
        _wrapped(psycopg.OperationalError("connection refused")),
        "unreachable",
    ),
    ("PostgreSQL: connection failure 08006", _wrapped(psycopg.errors.ConnectionFailure("x")), "unreachable"),
    ("PostgreSQL: admin shutdown 57P01", _wrapped(psycopg.errors.AdminShutdown("x")), "unreachable"),
    ("PostgreSQL: starting up 57P03", _wrapped(psycopg.errors.CannotConnectNow("x")), "unreachable"),
    ("PostgreSQL: disk full 53100", _wrapped(psycopg.errors.DiskFull("x")), "full"),
    ("PostgreSQL: read-only transaction 25006", _wrapped(psycopg.errors.ReadOnlySqlTransaction("x")), "full"),
    ("PostgreSQL: serialization failure 40001", _wrapped(psycopg.errors.SerializationFailure("x")), "busy"),
    ("PostgreSQL: deadlock 40P01", _wrapped(psycopg.errors.DeadlockDetected("x")), "busy"),
    ("PostgreSQL: a unique violation is no outage", _wrapped(psycopg.errors.UniqueViolation("x")), "failed"),
    ("PostgreSQL: a query cancelled is no outage", _wrapped(psycopg.errors.QueryCanceled("x")), "failed"),
    ("a commit whose fate is not known", CommitUncertain("lost while saving"), "uncertain"),
    ("a bug is no storage fault", ValueError("nope"), "failed"),
]


@pytest.mark.parametrize(("what", "error", "kind"), CASES, ids=[case[0] for case in CASES])
def test_each_failure_gets_its_kind(what: str, error: BaseException, kind: str) -> None:
    assert classify(error).kind == kind, what


def test_a_cause_names_the_kind_of_its_wrapper() -> None:
    try:
        try:
            raise psycopg.errors.AdminShutdown("terminating connection due to administrator command")
        except psycopg.Error as inner:
            raise RuntimeError("the store failed") from inner
    except RuntimeError as outer:
        assert classify(outer).kind == "unreachable"


@pytest.mark.parametrize(
    ("fault", "line"),
    [
        (Fault("full"), "impyard can't write its database (disk full or read-only)"),
        (
            Fault("unreachable", "database 'impyard' on db.example:5432"),
            "impyard can't reach its database (database 'impyard' on db.example:5432 is not answering)",
        ),
        (
            Fault("uncertain", "database 'impyard' on db.example:5432"),
            "impyard lost its database (database 'impyard' on db.example:5432) while saving; whether that was "
            "kept is not known, so it was not done again",
        ),
        (Fault("busy"), "impyard's database was too busy (writers kept colliding); try again"),
        (Fault("failed"), "impyard's database failed"),
    ],
)
def test_each_kind_has_its_words(fault: Fault, line: str) -> None:
    assert words(fault) == line


def test_only_a_server_that_went_away_is_waited_for() -> None:
    """Waiting helps an outage; it does not help a full disk, a bug, or a commit that may have been kept."""
    assert waits_for(_wrapped(psycopg.errors.AdminShutdown("x")))
    assert waits_for(_wrapped(psycopg.OperationalError("server closed the connection unexpectedly")))
    assert not waits_for(_wrapped(psycopg.errors.DiskFull("x")))
    assert not waits_for(CommitUncertain("x"))
    assert not waits_for(_sqlite("database is locked", 5))
    assert not waits_for(_wrapped(psycopg.errors.UniqueViolation("x")))
