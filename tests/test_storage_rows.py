"""``RowMapper``: a dataclass from a row's columns by name, converted by the field's type or the store's word."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from impyard.storage.rows import OfRow, RowMapper, iso_or_none, json_of

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


def test_a_field_of_the_whole_row() -> None:
    mapper = RowMapper(Thing, note=OfRow(lambda row: f"{row['id']}:{row['count']}"))
    assert mapper(ROW).note == "x:3"


def test_first_and_all_run_the_statement() -> None:
    engine = create_engine("sqlite://")
    mapper = RowMapper(Thing, tags=json_of(list))
    query = text(
        "SELECT 'x' AS id, :n AS count, 0 AS \"on\", '2026-03-01T12:00:00+00:00' AS at, NULL AS ended, NULL AS tags"
    )
    with engine.connect() as conn:
        assert mapper.all(conn, query, {"n": 2}) == [Thing(id="x", count=2, on=False, at=WHEN, ended=None)]
        assert mapper.first(conn, query, {"n": 5}) == Thing(id="x", count=5, on=False, at=WHEN, ended=None)
        assert mapper.first(conn, text("SELECT 1 WHERE 0")) is None
    engine.dispose()


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
