"""Which database the host uses: ``IMPYARD_DATABASE_URL`` (docs/storage.md).

Unset: the embedded SQLite file ``IMPYARD_HOME/impyard.db`` (the default, as always). ``sqlite:///PATH``: another
SQLite file. ``postgresql://USER:PASSWORD@HOST:PORT/DATABASE`` (or ``postgresql+psycopg://``, ``postgres://``): a
PostgreSQL server, reached with psycopg 3. Everything here is pure: parsing and wording, no connection.

The password is a secret of the operator's: no message, log line or ``redacted()`` form ever holds it. An error
names the host and the database (what an operator needs to find the problem) and the fix, in one line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sqlalchemy.engine import URL, make_url

from impyard.errors import ImpyardError
from impyard.paths import home

ENV = "IMPYARD_DATABASE_URL"
DB_FILENAME = "impyard.db"
PSYCOPG_DRIVER = "postgresql+psycopg"  # psycopg 3: the one PostgreSQL driver impyard installs
DEFAULT_PG_PORT = 5432
EXAMPLE = "postgresql://USER:PASSWORD@HOST:5432/DATABASE"
FIX = f"set {ENV} to {EXAMPLE} (or sqlite:///PATH), or unset it to use the SQLite file under IMPYARD_HOME"

Dialect = Literal["sqlite", "postgresql"]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]{0,40})://")
_POSTGRES_SCHEMES = {"postgresql", "postgres", "postgresql+psycopg"}
_SQLITE_SCHEMES = {"sqlite", "sqlite+pysqlite"}


class DatabaseUrlError(ImpyardError):
    """IMPYARD_DATABASE_URL cannot be used; the message names what is wrong (never the password) and the fix."""


@dataclass(frozen=True)
class DatabaseUrl:
    """A checked database address: the SQLAlchemy URL to connect with, and how to speak of it safely."""

    dialect: Dialect
    url: URL  # holds the password: hand it to create_engine, never to a message
    path: Path | None = None  # SQLite: the file

    def redacted(self) -> str:
        """The URL with its password masked, for logs, ``doctor`` and error messages."""
        if self.path is not None:
            return f"sqlite:///{self.path}"
        return self.url.render_as_string(hide_password=True)

    def where(self) -> str:
        """Where the database is, in words: 'the SQLite file X' or 'database D on HOST:PORT'."""
        if self.path is not None:
            return f"the SQLite file {self.path}"
        return f"database {self.url.database!r} on {server_of(self.url)}"

    @property
    def password(self) -> str | None:
        """The password, so that a message about this database can be scrubbed of it."""
        return None if self.url.password is None else str(self.url.password)


def server_of(url: URL) -> str:
    """HOST:PORT of a PostgreSQL URL, or the socket directory it names (``?host=/run/postgresql``)."""
    host = url.host or url.query.get("host")
    if isinstance(host, tuple):  # a query parameter given twice
        host = host[0] if host else None
    if not host:
        return "the local socket"
    if str(host).startswith("/"):
        return f"the socket in {host}"
    return f"{host}:{url.port or DEFAULT_PG_PORT}"


def default_url() -> DatabaseUrl:
    path = home() / DB_FILENAME
    return DatabaseUrl("sqlite", URL.create("sqlite+pysqlite", database=str(path)), path)


def sqlite_url(path: Path) -> DatabaseUrl:
    path = Path(path)
    return DatabaseUrl("sqlite", URL.create("sqlite+pysqlite", database=str(path)), path)


def from_env(environ: Mapping[str, str] | None = None) -> DatabaseUrl:
    """The database this host uses: ``IMPYARD_DATABASE_URL``, or the SQLite file under IMPYARD_HOME."""
    text = (os.environ if environ is None else environ).get(ENV, "").strip()
    return parse(text) if text else default_url()


def parse(text: str) -> DatabaseUrl:
    """Check a database URL; raises ``DatabaseUrlError`` with one line that never holds the password."""
    text = text.strip()
    scheme_match = _SCHEME.match(text)
    if scheme_match is None:
        raise DatabaseUrlError(f"{ENV} is not a database URL (it has no 'SCHEME://'); {FIX}")
    scheme = scheme_match.group(1).lower()
    if scheme not in _POSTGRES_SCHEMES | _SQLITE_SCHEMES:
        if scheme.startswith(("postgres", "postgresql+")):
            raise DatabaseUrlError(
                f"{ENV} asks for the driver {scheme!r}; impyard speaks to PostgreSQL with psycopg 3 only: "
                f"use postgresql:// or postgresql+psycopg://"
            )
        raise DatabaseUrlError(
            f"{ENV} has the scheme {scheme!r}; impyard runs on SQLite or PostgreSQL only: {FIX}"
        )
    try:
        url = make_url(text)
        port = url.port  # make_url reads it lazily in some versions
    except Exception as exc:  # noqa: BLE001 - its message may quote the password: never passed on
        raise DatabaseUrlError(
            f"{ENV} is not a well-formed {scheme} URL ({_why_malformed(exc)}); {FIX}"
        ) from None
    if scheme in _SQLITE_SCHEMES:
        return _sqlite(url)
    return _postgresql(url, port)


def _why_malformed(exc: BaseException) -> str:
    if isinstance(exc, ValueError) and "int()" in str(exc):
        return "its port is not a number"
    return "it cannot be split into user, host, port and database"


def _sqlite(url: URL) -> DatabaseUrl:
    if not url.database or url.database == ":memory:":
        raise DatabaseUrlError(
            f"{ENV} names no SQLite file (an in-memory database would vanish with each connection): "
            "use sqlite:///relative/path.db or sqlite:////absolute/path.db"
        )
    path = Path(url.database).expanduser()
    return DatabaseUrl("sqlite", URL.create("sqlite+pysqlite", database=str(path)), path)


def _postgresql(url: URL, port: int | None) -> DatabaseUrl:
    url = url.set(drivername=PSYCOPG_DRIVER)
    server = server_of(url)
    if not url.database:
        raise DatabaseUrlError(f"{ENV} names no database on {server}: add it after the host, as in {EXAMPLE}")
    if port is not None and not 0 < port < 65536:
        raise DatabaseUrlError(
            f"{ENV} has the port {port} for database {url.database!r} on {url.host}, "
            "which is no TCP port (1-65535): fix the port"
        )
    return DatabaseUrl("postgresql", url)


def scrub(text: str, secret: str | None) -> str:
    """``text`` with ``secret`` cut out, on one line: for a driver's message about a connection."""
    if secret:
        text = text.replace(secret, "***")
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def connect_problem(target: DatabaseUrl, exc: BaseException) -> str:
    """One line for a failed connection: where, why in words, the driver's reason (scrubbed), and the fix."""
    reason = scrub(str(getattr(exc, "orig", None) or exc), target.password)
    lowered = reason.lower()
    if "password authentication failed" in lowered or "no password supplied" in lowered:
        fix = f"check the user and password in {ENV}"
    elif "does not exist" in lowered and "database" in lowered:
        fix = f"create the database (createdb {target.url.database}) or fix its name in {ENV}"
    elif "role" in lowered and "does not exist" in lowered:
        fix = f"create the user on the server or fix the user in {ENV}"
    elif any(
        word in lowered for word in ("refused", "timeout", "timed out", "could not translate", "no route")
    ):
        fix = f"start the server or fix the host and port in {ENV}"
    else:
        fix = f"check the server and {ENV}"
    if len(reason) > 300:
        reason = reason[:297] + "..."
    return (
        f"cannot connect to {target.where()} as {target.url.username or 'the default user'}: {reason}; {fix}"
    )
