"""The memory clock's transitional reader (docs/storage.md): a statement run on the engine's ``Connection`` or on
a legacy sqlite3 connection, for callers that still hold one."""

from __future__ import annotations

import sqlite3
from typing import Any

from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection

_SQLITE = sqlite.dialect()


def execute(conn: Connection | sqlite3.Connection, statement: Any, params: dict[str, Any]) -> list[Any]:
    """``statement``'s rows (name-addressable) on the engine's ``Connection``, or on a legacy sqlite3 connection
    (a caller inside ``db.transaction()``, until it moves to the engine API): there the same statement compiled
    for SQLite. Transitional, as the legacy connection is (docs/storage.md)."""
    if isinstance(conn, Connection):
        result = conn.execute(statement, params)
        return list(result.mappings()) if result.returns_rows else []
    expanded = statement.compile(dialect=_SQLITE).construct_expanded_state(params)
    return conn.execute(expanded.statement, expanded.positional_parameters).fetchall()
