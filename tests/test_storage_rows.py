"""``RowMapper``: a dataclass from a row's columns by name, converted by the field's type or the store's word."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from impyard.storage.rows import RowMapper, iso_or_none, json_of

WHEN = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Thing:
    id: str
    count: int
    on: bool
    at: datetime
    ended: datetime | None
    tags: list[str] = field(default_factory=list)
    note: str = "none"  # no column: keeps its default


ROW: dict[str, Any] = {
    "id": "x",
    "count": 3,
    "on": 1,
    "at": "2026-03-01T12:00:00+00:00",
    "ended": None,
    "tags": '["a"]',
    "extra": "ignored",
}


def test_fields_by_name_converted_by_their_type() -> None:
    thing = RowMapper(Thing, tags=json_of(list))(ROW)
    assert thing == Thing(id="x", count=3, on=True, at=WHEN, ended=None, tags=["a"], note="none")
    assert thing.on is True


def test_given_fields_win_over_columns() -> None:
    assert RowMapper(Thing)(ROW, tags=["given"], note="n").tags == ["given"]


def test_a_field_without_a_default_needs_its_column() -> None:
    with pytest.raises(KeyError):
        RowMapper(Thing)({k: v for k, v in ROW.items() if k != "count"})


def test_a_converter_for_no_field_is_refused() -> None:
    with pytest.raises(TypeError, match="no field tagz"):
        RowMapper(Thing, tagz=json_of(list))


@pytest.mark.parametrize(
    ("text", "expected"),
    [(None, None), ("", None), ("2026-03-01T13:00:00+01:00", WHEN)],
)
def test_iso_or_none(text: str | None, expected: datetime | None) -> None:
    assert iso_or_none(text) == expected


@pytest.mark.parametrize(
    ("kind", "text", "expected"),
    [
        (dict, None, {}),
        (dict, "", {}),
        (dict, "not json", {}),
        (dict, "[1]", {}),  # another kind than asked: none
        (dict, '{"a": 1}', {"a": 1}),
        (list, '["a"]', ["a"]),
        (list, "{}", []),
    ],
)
def test_json_of(kind: type[Any], text: str | None, expected: object) -> None:
    assert json_of(kind)(text) == expected
