"""The memory clock's reader: a statement's rows, name-addressable, in the caller's transaction."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection


def execute(conn: Connection, statement: Any, params: dict[str, Any]) -> list[Any]:
    """``statement``'s rows (name-addressable) on the engine's ``Connection``; none for a statement that returns
    none."""
    result = conn.execute(statement, params)
    return list(result.mappings()) if result.returns_rows else []
