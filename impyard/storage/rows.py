"""A store's objects from its rows: a dataclass built from a row's columns by name (``RowMapper``).

Each field takes the column of its name; how a column's value becomes the field's is read once from the field's
type (an ISO text becomes a ``datetime``, ``None`` or empty staying ``None`` where the field may be; an integer
column becomes a ``bool``) unless the store names a converter for that field. What no column holds (a value built
from several columns, a second reading of one) the store passes when it maps the row. A field with a default
that the row lacks keeps its default.
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Mapping
from dataclasses import MISSING, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar, Union, get_args, get_origin, get_type_hints

from impyard.clock import parse_iso

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")
Convert = Callable[[Any], Any]  # a column's value -> the field's
Row = Mapping[Any, Any]  # one row's columns by name (SQLAlchemy's ``RowMapping``, on either engine)


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
    """Builds a ``cls`` (a dataclass) from a row; ``convert`` names a field's own converter (its column's value in)."""

    def __init__(self, cls: type[T], **convert: Convert) -> None:
        hints = get_type_hints(cls)
        self.cls = cls
        names = {field.name for field in fields(cls)}
        unknown = set(convert) - names
        if unknown:
            raise TypeError(f"{cls.__name__} has no field {', '.join(sorted(unknown))}")
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
        """The object of ``row``; ``given``: the fields no single column holds, as they are."""
        values = dict(given)
        for name, convert, optional in self._plan:
            if name in values or (optional and name not in row):
                continue
            value = row[name]
            values[name] = value if convert is None else convert(value)
        return self.cls(**values)
