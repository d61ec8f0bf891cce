"""Reading a console page's tables as a test compares them: each ``<tr>`` of a table, its attributes and cell texts."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser


@dataclass
class Row:
    attrs: dict[str, str]
    cells: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return " | ".join(self.cells)


class _Rows(HTMLParser):
    def __init__(self, table_id: str) -> None:
        super().__init__()
        self.table_id = table_id
        self.depth = 0  # inside the wanted table: nesting of tables
        self.rows: list[Row] = []
        self.cell: list[str] | None = None
        self.found = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = {k: v or "" for k, v in attrs}
        if tag == "table":
            if self.depth or named.get("id") == self.table_id:
                self.depth += 1
                self.found = True
            return
        if not self.depth:
            return
        if tag == "tr":
            self.rows.append(Row(named))
        elif tag in ("td", "th") and self.rows:
            self.cell = []
        elif tag == "br" and self.cell is not None:
            self.cell.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag == "table" and self.depth:
            self.depth -= 1
        elif tag in ("td", "th") and self.cell is not None and self.rows:
            self.rows[-1].cells.append(" ".join("".join(self.cell).split()))
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def table_rows(html: str, table_id: str, *, keyed_by: str | None = None) -> list[Row]:
    """The rows of ``<table id=table_id>`` (the header row included unless ``keyed_by`` names an attribute every
    wanted row carries); AssertionError when the page has no such table."""
    parser = _Rows(table_id)
    parser.feed(html)
    assert parser.found, f"no table #{table_id} on the page"
    return [row for row in parser.rows if keyed_by is None or keyed_by in row.attrs]
