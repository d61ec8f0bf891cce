"""Portable SQL helpers of the host's stores (docs/storage.md): what SQLAlchemy Core says differently per engine.

* ``upsert(dialect)``: the dialect's ``insert`` with ``on_conflict_do_nothing`` / ``on_conflict_do_update``
  (SQLite and PostgreSQL spell ``ON CONFLICT`` alike, but Core keeps the construct per dialect).
* ``bytewise(text)``: text ordered and compared byte by byte, as SQLite's BINARY collation does; on PostgreSQL
  ``COLLATE "C"``, since a database's default collation (en_US.UTF-8, ICU …) may order ids and scopes otherwise.
* ``per_dialect(build)``: a statement built once per dialect and kept, so SQLAlchemy's compiled cache hits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.visitors import InternalTraversal

T = TypeVar("T")


class bytewise(ColumnElement[str]):  # noqa: N801 - used like a SQL function
    """``clause`` compared and ordered byte by byte (SQLite: as it is; PostgreSQL: ``COLLATE "C"``)."""

    inherit_cache = True
    _traverse_internals = [("clause", InternalTraversal.dp_clauseelement)]

    def __init__(self, clause: ColumnElement[Any]) -> None:
        self.clause = clause
        self.type = clause.type


@compiles(bytewise)
def _bytewise(element: bytewise, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.clause, **kw)


@compiles(bytewise, "postgresql")
def _bytewise_pg(element: bytewise, compiler: SQLCompiler, **kw: Any) -> str:
    return f'{compiler.process(element.clause, **kw)} COLLATE "C"'


def upsert(dialect: str) -> Callable[..., Any]:
    """The ``insert`` that has ``on_conflict_do_nothing`` / ``on_conflict_do_update`` on ``dialect``."""
    return postgresql.insert if dialect == "postgresql" else sqlite.insert


class per_dialect:  # noqa: N801 - a decorator
    """A statement built once per dialect (``build(dialect)``), then reused."""

    __slots__ = ("build", "built")

    def __init__(self, build: Callable[[str], Any]) -> None:
        self.build = build
        self.built: dict[str, Any] = {}

    def __call__(self, dialect: str) -> Any:
        statement = self.built.get(dialect)
        if statement is None:
            statement = self.built[dialect] = self.build(dialect)
        return statement
