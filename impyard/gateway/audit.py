"""The audit log (docs/security.md): one row per box request and per gate transition.

Rows hold what was asked and what was decided, never credentials: every text
field passes ``redact`` with the host's known secrets before it is written,
as a second line of defence behind code that never puts them there.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from sqlalchemy import bindparam, insert, select
from sqlalchemy.engine import Connection

from impyard.clock import Clock, iso, parse_iso
from impyard.storage.db import Database, Store
from impyard.storage.liveness import this_process
from impyard.storage.prepared import Prepared
from impyard.storage.rows import RowMapper
from impyard.storage.tables import audit

REDACTED = "[redacted]"
MIN_SECRET_CHARS = 8  # shorter "secrets" would redact ordinary words
MAX_FIELD_CHARS = 2_000
SECRET_ENV_NAMES = ("OPENAI_API_KEY",)
SECRET_ENV_PREFIXES = ("IMPYARD_DISCORD_TOKEN",)
SECRET_URL_ENV_NAMES = ("OPENAI_BASE_URL",)  # their userinfo and query values are credentials (issue 11 #9)

Verdict = str  # allowed | denied | rate_limited | budget_exhausted | unreachable | interrupted | gated | error | <gate state>


def known_secrets(environ: dict[str, str] | None = None) -> list[str]:
    """The credentials this host holds: the model key, any Discord tokens, and the model base URL's
    userinfo and query values (a proxy's ``user:password@``, a ``?key=``)."""
    env = os.environ if environ is None else environ
    found = [
        value
        for name, value in env.items()
        if (name in SECRET_ENV_NAMES or name.startswith(SECRET_ENV_PREFIXES))
        and len(value) >= MIN_SECRET_CHARS
    ]
    for name in SECRET_URL_ENV_NAMES:
        found += url_secrets(env.get(name) or "")
    return found


def url_secrets(url: str) -> list[str]:
    """A URL's userinfo and query values, raw and decoded, as ``redact`` should know them (short ones skipped)."""
    try:
        parts = urlsplit(url)
        username, password = parts.username, parts.password
    except ValueError:
        return [url] if len(url) >= MIN_SECRET_CHARS else []
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    values = [userinfo, username or "", password or "", unquote(username or ""), unquote(password or "")]
    values += [parts.query] + [value for _key, value in parse_qsl(parts.query, keep_blank_values=True)]
    values += [raw.partition("=")[2] for raw in parts.query.split("&")]
    # longest first, so "user:password" is replaced whole before its parts
    return sorted({value for value in values if len(value) >= MIN_SECRET_CHARS}, key=len, reverse=True)


def redact_url(url: str) -> str:
    """A URL as it may be shown: userinfo and query values replaced by [redacted], no fragment."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{REDACTED}@{host}" if "@" in parts.netloc else host
    query = (
        "&".join(f"{raw.partition('=')[0]}={REDACTED}" for raw in parts.query.split("&"))
        if parts.query
        else ""
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def redact(text: str, secrets: Iterable[str]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):  # a longer secret before any secret inside it
        if secret and len(secret) >= MIN_SECRET_CHARS and secret in text:
            text = text.replace(secret, REDACTED)
    return text


FACET_ROWS = 5_000
MAX_FILTER_CHARS = 200


@dataclass(frozen=True)
class AuditFilter:
    """Which audit rows to show: each field given must match whole; ``before``: rows older than that id (a page)."""

    imp: str | None = None
    method: str | None = None
    rule: str | None = None
    verdict: str | None = None
    before: int | None = None

    def columns(self) -> dict[str, str]:
        """The column filters given (an empty value is no filter; longer than any stored value: no match)."""
        values = {"imp": self.imp, "method": self.method, "rule": self.rule, "verdict": self.verdict}
        return {name: value[:MAX_FILTER_CHARS] for name, value in values.items() if value}


@dataclass
class AuditRecord:
    imp: str
    method: str  # a box method, or "gate" for a gate transition
    verdict: Verdict = "error"
    run_id: str = ""
    channel_id: str = ""
    purpose: str = ""
    rule: str = ""
    reason: str = ""
    cost_micros: int = 0
    gate_id: str | None = None
    latency_ms: float | None = None
    detail: str = ""
    at: datetime | None = None
    host: str = ""  # <hostname>/<pid> of the process that wrote the row (issue 21); set when it is written
    id: int | None = field(default=None, compare=False)
    # Not a column: the row is written later by whoever finishes the act (a model call its box left, issue 19 #4).
    deferred: bool = field(default=False, compare=False, repr=False)
    # Not a column: when the request came in (time.perf_counter), for a row written in the trip that ends the act
    # (issue 18), before the gateway's own end of the request: its latency is measured up to that trip.
    started: float | None = field(default=None, compare=False, repr=False)

    def finish_latency(self) -> None:
        """``latency_ms`` from ``started`` to now (nothing when it was not started)."""
        if self.started is not None:
            self.latency_ms = round((time.perf_counter() - self.started) * 1000, 3)

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        del data["deferred"], data["started"]
        data["at"] = iso(self.at) if self.at else None
        data["cost_usd"] = self.cost_micros / 1_000_000
        return data


_COLUMNS = (
    "at", "imp", "run_id", "channel_id", "method", "purpose", "verdict", "rule", "reason",
    "cost_micros", "gate_id", "latency_ms", "detail", "host",
)  # fmt: skip
row_to_record = RowMapper(AuditRecord, at=parse_iso)  # every row has its time (``AuditLog.row``)
_INSERT = Prepared(insert(audit))  # the lean path on SQLite (issue 18): a row every act
_TAIL = (
    select(audit.c.id, *(audit.c[name] for name in _COLUMNS))
    .order_by(audit.c.id.desc())
    .limit(bindparam("n"))
)
_TAIL_OF = (
    select(audit.c.id, *(audit.c[name] for name in _COLUMNS))
    .where(audit.c.imp == bindparam("imp"))
    .order_by(audit.c.id.desc())
    .limit(bindparam("n"))
)


def writer() -> str:
    """This process as an audit row names it: ``<hostname>/<pid>`` (hosts sharing one database, issue 21)."""
    me = this_process()
    return f"{me.host}/{me.pid}"


class AuditLog(Store):
    def __init__(self, db: Database, clock: Clock, secrets: Sequence[str] | None = None) -> None:
        self.db = db
        self.clock = clock
        self.secrets = list(secrets) if secrets is not None else known_secrets()

    def write(self, record: AuditRecord, conn: Connection | None = None) -> None:
        """Append one row (inside the caller's write transaction when ``conn`` is given)."""
        values = self.row(record)
        if conn is not None:
            _INSERT.run(conn, values)
        else:
            self.db.write(lambda conn: _INSERT.run(conn, values))

    def row(self, record: AuditRecord) -> dict[str, Any]:
        """The record as its row: every text redacted and bounded (its time set to now when it has none)."""
        record.at = record.at or self.clock.now()
        record.host = record.host or writer()
        values = {name: getattr(record, name) for name in _COLUMNS}  # the row's columns, nothing deep-copied
        for name, value in values.items():
            if isinstance(value, str):
                values[name] = redact(value, self.secrets)[:MAX_FIELD_CHARS]
        values["at"] = iso(record.at)
        return values

    def tail(self, n: int = 20, imp: str | None = None) -> list[AuditRecord]:
        """The last ``n`` rows (oldest first), optionally for one imp."""
        params: dict[str, Any] = {"n": max(0, n), "imp": imp}
        statement = _TAIL if imp is None else _TAIL_OF
        newest_first = self.db.read(lambda conn: row_to_record.all(conn, statement, params))
        return newest_first[::-1]

    def search(self, n: int, where: AuditFilter | None = None) -> list[AuditRecord]:
        """The newest ``n`` rows that match ``where`` (newest first): ``impyard audit tail``'s filters and the
        console's Audit page. Every value is compared whole (no patterns)."""
        where = where or AuditFilter()
        statement = select(audit.c.id, *(audit.c[name] for name in _COLUMNS))
        for name, value in where.columns().items():
            statement = statement.where(audit.c[name] == value)
        if where.before is not None:
            statement = statement.where(audit.c.id < where.before)
        statement = statement.order_by(audit.c.id.desc()).limit(max(0, n))
        return self.db.read(lambda conn: row_to_record.all(conn, statement, {}))

    def facets(self, recent: int = FACET_ROWS) -> dict[str, list[str]]:
        """The imps, methods, rules and verdicts of the newest ``recent`` rows, sorted: what a filter offers.
        Bounded so that a long log costs one indexed read, never a scan of every row."""
        columns = select(audit.c.imp, audit.c.method, audit.c.rule, audit.c.verdict)
        newest = columns.order_by(audit.c.id.desc()).limit(recent).subquery()

        def read(conn: Connection) -> dict[str, list[str]]:
            rows = conn.execute(select(newest)).all()
            return {
                name: sorted({row[i] for row in rows if row[i]})
                for i, name in enumerate(("imp", "method", "rule", "verdict"))
            }

        return self.db.read(read)
