"""One ``--json`` flag for every command, and one way to print a result as JSON or for people (issue 12).

A command decorated with :func:`output_options` is called with ``out``, an :class:`Output`; it hands
its result to ``out``, which prints JSON for scripts (``--json``), a table fitted to the terminal for
people, or tab-separated values when stdout is not a terminal (issue 17; see :func:`output_options`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import click
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

JSON_HELP = "Machine-readable output."
JSON_INDENT = 2  # what scripts and tests have parsed since the first --json; keep the bytes as they are
ELLIPSIS = "…"
TABLE_OVERHEAD_PER_COLUMN = 3  # rich's default box: one border and one space of padding on each side
TABLE_OVERHEAD_EDGE = 1  # the table's right-hand edge
_WORD = re.compile(r"\S+")
_TSV_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}

Command = TypeVar("Command", bound=Callable[..., object])


def json_text(value: object) -> str:
    """A command's JSON: indented, keys in the order given, non-ASCII escaped (no box text reaches a
    terminal raw through ``--json``)."""
    return json.dumps(value, indent=JSON_INDENT)


def json_line(value: object) -> str:
    """One record of a JSON-lines listing, e.g. ``audit tail --json``."""
    return json.dumps(value)


def stdout_is_terminal() -> bool:
    """Whether stdout is a terminal, as rich sees it (``TTY_COMPATIBLE=1`` or ``FORCE_COLOR`` count as one)."""
    return Console().is_terminal


@dataclass(frozen=True)
class Col:
    """A table column that is more than its header. A spec, not a rich ``Column``: a rich one keeps the
    cells of every table it was put in, so a module-level one would carry rows from one listing to the next.

    ``no_wrap``: the column's values are never shortened (ids, times), even when they hold spaces."""

    header: str
    no_wrap: bool = False


def table_of(
    columns: Sequence[str | Col], rows: Iterable[Sequence[str]], *, title: str | None = None
) -> Table:
    """A rich table of ``rows`` under ``columns``; cells are rich markup (escape text that is not)."""
    table = Table(title=title)
    for column in columns:
        if isinstance(column, Col):
            table.add_column(column.header, no_wrap=column.no_wrap)
        else:
            table.add_column(column)
    for row in rows:
        table.add_row(*row)
    return table


# ------------------------------------------------------------------ fitting a table to the terminal (pure)


def natural_width(text: str) -> int:
    """The cells ``text`` takes on its widest line."""
    return max((cell_len(line) for line in text.split("\n")), default=0)


def least_width(text: str) -> int:
    """The narrowest ``text`` may be shortened to without cutting a word: each line's first word and an
    ellipsis (a line of one word is never shortened)."""
    least = 0
    for line in text.split("\n"):
        words = _WORD.findall(line)
        if len(words) <= 1 or cell_len(line) <= cell_len(words[0]) + 1:
            least = max(least, cell_len(line))
        else:
            least = max(least, cell_len(line[: line.index(words[0]) + len(words[0])]) + len(ELLIPSIS))
    return least


def fit_widths(natural: Sequence[int], least: Sequence[int], available: int) -> list[int]:
    """Column widths that fit ``available`` cells: the widest shrinkable column gives first, none below its
    ``least``; when even the least widths do not fit, they are returned (the table is wider than asked)."""
    widths = list(natural)
    excess = sum(widths) - available
    while excess > 0:
        shrinkable = [i for i, width in enumerate(widths) if width > least[i]]
        if not shrinkable:
            break
        widest = max(shrinkable, key=lambda i: widths[i])
        widths[widest] -= 1
        excess -= 1
    return widths


def shorten(text: Text, width: int) -> Text:
    """``text`` with each line longer than ``width`` cut after its last whole word that fits, and an
    ellipsis; a line whose first word does not fit is left whole (never cut mid-token)."""
    lines = text.split("\n", allow_blank=True)
    out = []
    for line in lines:
        plain = line.plain
        if cell_len(plain) <= width:
            out.append(line)
            continue
        cut = None
        for word in _WORD.finditer(plain):
            if cell_len(plain[: word.end()]) + len(ELLIPSIS) > width:
                break
            cut = word.end()
        if cut is None:
            out.append(line)
            continue
        short = line[:cut]
        short.append(ELLIPSIS)
        out.append(short)
    return Text("\n").join(out)


def fitted_table(
    columns: Sequence[str | Col], rows: Iterable[Sequence[str]], width: int, *, title: str | None = None
) -> tuple[Table, int]:
    """A rich table of ``rows`` that fits ``width`` cells when its values allow, and the width it takes:
    free text is shortened at a word boundary with an ellipsis; one-word values and ``Col(no_wrap=True)``
    columns are shown whole, so a table with too many of them is wider than ``width``. Every cell is one
    line per line of its value."""
    specs = [column if isinstance(column, Col) else Col(column) for column in columns]
    cells = [[Text.from_markup(cell) for cell in row] for row in rows]
    natural = [cell_len(spec.header) for spec in specs]
    least = list(natural)
    for row in cells:
        for index, cell in enumerate(row):
            natural[index] = max(natural[index], natural_width(cell.plain))
            shortest = natural_width(cell.plain) if specs[index].no_wrap else least_width(cell.plain)
            least[index] = max(least[index], shortest)
    overhead = TABLE_OVERHEAD_PER_COLUMN * len(specs) + TABLE_OVERHEAD_EDGE
    widths = fit_widths(natural, least, width - overhead)
    table = Table(title=title)
    for spec, column_width in zip(specs, widths, strict=True):
        table.add_column(spec.header, no_wrap=True, width=column_width, overflow="ignore")
    for row in cells:
        table.add_row(*(shorten(cell, widths[index]) for index, cell in enumerate(row)))
    return table, sum(widths) + overhead


def tsv_field(text: str) -> str:
    r"""One TSV field: backslash, tab, newline and carriage return escaped as ``\\``, ``\t``, ``\n``, ``\r``,
    other control characters as ``\xNN``, so that a row is always one line of ``columns`` fields."""
    out = []
    for char in text:
        if char in _TSV_ESCAPES:
            out.append(_TSV_ESCAPES[char])
        elif ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return "".join(out)


def tsv_lines(columns: Sequence[str | Col], rows: Iterable[Sequence[str]]) -> list[str]:
    """The header line and one line per row, every cell's markup rendered to its plain text."""
    headers = [column.header if isinstance(column, Col) else column for column in columns]
    lines = ["\t".join(tsv_field(header) for header in headers)]
    for row in rows:
        lines.append("\t".join(tsv_field(Text.from_markup(cell).plain) for cell in row))
    return lines


@dataclass(frozen=True)
class Output:
    """How a command shows its result: JSON for scripts (``--json``), or text and tables for people."""

    as_json: bool

    def json(self, value: object) -> None:
        click.echo(json_text(value))

    def json_lines(self, values: Iterable[object]) -> None:
        for value in values:
            click.echo(json_line(value))

    def show(self, value: object, text: str) -> None:
        """One result: ``value`` as JSON, or ``text`` for people."""
        click.echo(json_text(value) if self.as_json else text)

    def table(
        self,
        columns: Sequence[str | Col],
        rows: Iterable[Sequence[str]],
        *,
        title: str | None = None,
        min_width: int | None = None,
    ) -> None:
        """A table fitted to the terminal's width, or TSV when stdout is not a terminal (see
        :func:`output_options`). ``min_width`` is no longer needed (values are shortened at word
        boundaries, never cut mid-token) and is ignored; it stays for the commands that still pass it."""
        if not stdout_is_terminal():
            for line in tsv_lines(columns, rows):
                click.echo(line)
            return
        table, width = fitted_table(columns, rows, Console().width, title=title)
        Console(width=max(Console().width, width)).print(table)  # wider only when whole tokens need it

    def listing(
        self,
        values: Sequence[object],
        columns: Sequence[str | Col],
        rows: Iterable[Sequence[str]],
        *,
        empty: str | None = None,
        title: str | None = None,
        min_width: int | None = None,
        one_per_line: bool = False,
    ) -> None:
        """A listing: ``values`` as one JSON list (or one JSON object per line), or else a table of
        ``rows``; with no values and an ``empty`` text, that text instead of an empty table."""
        if self.as_json:
            if one_per_line:
                self.json_lines(values)
            else:
                self.json(values)
        elif not values and empty is not None:
            click.echo(empty)
        else:
            self.table(columns, rows, title=title)


class JsonOption(click.Option):
    """The ``--json`` flag as :func:`output_options` declares it; its class marks the one shared flag."""


def _output(ctx: click.Context, param: click.Parameter, as_json: bool) -> Output:
    return Output(as_json=as_json)


def output_options(command: Command) -> Command:
    r"""Give a command the shared ``--json`` flag; the command is called with ``out``, an :class:`Output`.

    What ``out`` prints (issue 17):

    * ``--json``: JSON, the same on a terminal or in a pipe (``Output.json`` / ``json_lines``).
    * stdout is a terminal: tables fitted to its width. A value too long for its column is shortened
      after its last whole word, with an ellipsis; a one-word value (an id, a model name, a URL) and a
      ``Col(no_wrap=True)`` column are never shortened, so a table of many of them may be wider than the
      terminal. Nothing is ever cut mid-token.
    * stdout is not a terminal (a pipe, a file, a test's runner): tables as TSV, every value in full: a
      header line of the column names, then one line per row, markup rendered to plain text, and
      backslash, tab, newline and carriage return written as ``\\``, ``\t``, ``\n``, ``\r`` (other
      control characters as ``\xNN``), so ``impyard task ls | cut -f1`` works. A table's title is not
      printed; text lines (``Output.show``, a listing's empty text) are printed as they are.
      ``TTY_COMPATIBLE=1`` (or ``FORCE_COLOR``) makes rich, and so impyard, treat stdout as a terminal.
    """
    flag = click.option("--json", "out", cls=JsonOption, is_flag=True, help=JSON_HELP, callback=_output)
    return flag(command)
