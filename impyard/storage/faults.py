"""What a failure of the host's own database was, in words (issue 19 #1, issue 21: "the database going away").

Pure rules. ``classify(exc)`` reads an error the store layer raised — SQLite's, PostgreSQL's through psycopg (by
SQLSTATE, never by message), or the operating system's — and names its kind:

* ``full``: the database cannot be written (a full disk, a read-only file or mount, a PostgreSQL disk full).
* ``unreachable``: the server is not answering (connection refused or lost, the server shutting down or
  starting): worth waiting for, since it may come back (``Database.write`` waits up to its patience).
* ``uncertain``: the connection was lost while a commit was on its way, so whether it was kept is not known;
  never run again, so nothing is executed twice.
* ``busy``: writers kept colliding (serialization failures, deadlocks or SQLite's lock, past every retry).
* ``failed``: anything else the database said.

``words(fault)`` is the one line a log, an audit row and the box's error carry; it never holds a password (an
error's text is never quoted: the kind and, for a server, its host and database name).
"""

from __future__ import annotations

import errno
import sqlite3
from dataclasses import dataclass
from typing import Literal

from impyard.errors import ImpyardError

FaultKind = Literal["full", "unreachable", "uncertain", "busy", "failed"]

# PostgreSQL SQLSTATEs (Appendix A of its manual), by what they mean for the host.
CONNECTION_CLASS = "08"  # connection_exception, and its subclasses (08000, 08003, 08006, 08001, 08004, ...)
SERVER_GOING = frozenset({"57P01", "57P02", "57P03"})  # admin_shutdown, crash_shutdown, cannot_connect_now
SERVER_FULL = frozenset(
    {"53100", "25006"}
)  # disk_full; read_only_sql_transaction (a standby, read-only mode)
COLLIDING = frozenset(
    {"40001", "40P01", "55P03"}
)  # serialization_failure, deadlock_detected, lock_not_available
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EIO})


class CommitUncertain(ImpyardError):  # noqa: N818 - a condition, named for what it says
    """The connection was lost while a commit was on its way: the transaction may or may not have been kept.
    ``Database.write`` raises it (from the driver's error) instead of running the work again."""


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    where: str = ""  # "PostgreSQL at HOST:PORT/DB", or "" for the SQLite file


def classify(exc: BaseException, where: str = "") -> Fault:
    """The kind of a database failure; ``where`` names the server (never its password) for the words."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:  # the cause chain: a wrapper names no kind itself
        seen.add(id(current))
        kind = _kind_of(current)
        if kind is not None:
            return Fault(kind, where)
        current = getattr(current, "orig", None) or current.__cause__ or current.__context__
    return Fault("failed", where)


def _kind_of(exc: BaseException) -> FaultKind | None:
    if isinstance(exc, CommitUncertain):
        return "uncertain"
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(sqlstate, str):
        if sqlstate.startswith(CONNECTION_CLASS) or sqlstate in SERVER_GOING:
            return "unreachable"
        if sqlstate in SERVER_FULL:
            return "full"
        if sqlstate in COLLIDING:
            return "busy"
        return None
    if _is_psycopg_connection_error(exc):
        return "unreachable"  # raised before any SQLSTATE: refused, reset, closed by the server
    if isinstance(exc, sqlite3.Error):
        return _sqlite_kind(exc)
    if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
        return "full"
    return None


def _is_psycopg_connection_error(exc: BaseException) -> bool:
    """psycopg's OperationalError with no SQLSTATE: the connection failed or broke (no server said anything)."""
    module = type(exc).__module__
    return module.startswith("psycopg") and type(exc).__name__ == "OperationalError"


# SQLite's own fixed words for its result codes (sqlite3ErrStr), for an error that carries no code.
_SQLITE_WORDS = {
    "database or disk is full": sqlite3.SQLITE_FULL,
    "attempt to write a readonly database": sqlite3.SQLITE_READONLY,
    "disk i/o error": sqlite3.SQLITE_IOERR,
    "unable to open database file": sqlite3.SQLITE_CANTOPEN,
    "database is locked": sqlite3.SQLITE_BUSY,
    "database table is locked": sqlite3.SQLITE_LOCKED,
}


def _sqlite_kind(exc: sqlite3.Error) -> FaultKind | None:
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else _SQLITE_WORDS.get(str(exc).strip().lower())
    if primary in (
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_CANTOPEN,
    ):
        return "full"
    if primary in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return "busy"
    return None


def words(fault: Fault) -> str:
    """One line: what happened to the host's database, and what an operator does about it."""
    server = fault.where or "the database"
    return {
        "full": "impyard can't write its database (disk full or read-only)",
        "unreachable": f"impyard can't reach its database ({server} is not answering)",
        "uncertain": (
            f"impyard lost its database ({server}) while saving; whether that was kept is not known, "
            "so it was not done again"
        ),
        "busy": "impyard's database was too busy (writers kept colliding); try again",
        "failed": "impyard's database failed",
    }[fault.kind]


def describe(exc: BaseException, where: str = "") -> str:
    """``words(classify(exc, where))``."""
    return words(classify(exc, where))


def waits_for(exc: BaseException) -> bool:
    """Whether a failed transaction is worth running again once the server answers: it never reached a commit
    (``uncertain`` is not) and the server was not there."""
    return classify(exc).kind == "unreachable"
