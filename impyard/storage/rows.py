"""A store's objects from its rows: a dataclass built from a row's columns by name (``RowMapper``).

Each field takes the column of its name; how a column's value becomes the field's is read once from the field's
type (an ISO text becomes a ``datetime``, ``None`` or empty staying ``None`` where the field may be; an integer
column becomes a ``bool``) unless the store names a converter for that field. A field no one column holds is
built from the whole row (``OfRow``), or passed when the row is mapped (what the row does not know). A field
with a default that the row lacks keeps its default.
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar, Union, get_args, get_origin, get_type_hints

from sqlalchemy.engine import Connection
from sqlalchemy.sql import Executable

from impyard.clock import parse_iso

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")
Convert = Callable[[Any], Any]  # a column's value -> the field's
Row = Mapping[Any, Any]  # one row's columns by name (SQLAlchemy's ``RowMapping``, on either engine)


@dataclass(frozen=True)
class OfRow:
    """A field no one column holds, built from the whole row."""

    build: Callable[[Row], Any]


def iso_or_none(text: str | None) -> datetime | None:
    """A stored ISO time, or None for a NULL (or empty) one."""
    return parse_iso(text) if text else None


def json_of(kind: type[Any]) -> Convert:
    """A JSON column's value when it is a ``kind`` (dict, list); an empty ``kind`` when absent or unreadable."""

    def convert(text: str | None) -> Any:
        if not text:
            return kind()
        try:
            value = json.loads(text)
        except ValueError:
            return kind()
        return value if isinstance(value, kind) else kind()

    return convert


def _by_type(hint: Any) -> Convert | None:
    """The conversion a field's type implies (None: the column's value as it is)."""
    if hint is datetime:
        return parse_iso
    if hint is bool:
        return bool
    if get_origin(hint) in (Union, types.UnionType) and set(get_args(hint)) == {datetime, type(None)}:
        return iso_or_none
    return None


class RowMapper(Generic[T]):
    """Builds a ``cls`` (a dataclass) from a row; ``convert`` names a field's own converter (its column's value
    in), or ``OfRow`` for a field built from the whole row."""

    def __init__(self, cls: type[T], **convert: Convert | OfRow) -> None:
        hints = get_type_hints(cls)
        unknown = set(convert) - {field.name for field in fields(cls)}
        if unknown:
            raise TypeError(f"{cls.__name__} has no field {', '.join(sorted(unknown))}")
        self.cls = cls
        self._plan = tuple(
            (
                field.name,
                convert.get(field.name) or _by_type(hints[field.name]),
                field.default is not MISSING or field.default_factory is not MISSING,
            )
            for field in fields(cls)
            if field.init
        )

    def __call__(self, row: Row, **given: Any) -> T:
        """The object of ``row``; ``given``: fields the row does not know, as they are."""
        values = dict(given)
        for name, convert, optional in self._plan:
            if name in values:
                continue
            if isinstance(convert, OfRow):
                values[name] = convert.build(row)
            elif not optional or name in row:
                value = row[name]
                values[name] = value if convert is None else convert(value)
        return self.cls(**values)

    def first(
        self, conn: Connection, statement: Executable, params: Mapping[str, Any] | None = None
    ) -> T | None:
        """The object of the statement's first row, or None when it returned none."""
        row = conn.execute(statement, params).mappings().first()
        return None if row is None else self(row)

    def all(
        self, conn: Connection, statement: Executable, params: Mapping[str, Any] | None = None
    ) -> list[T]:
        """The objects of every row the statement returns, in its order."""
        return [self(row) for row in conn.execute(statement, params).mappings()]
