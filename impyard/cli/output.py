"""One ``--json`` flag for every command, and one way to print a result as JSON or for people (issue 12).

A command decorated with :func:`output_options` is called with ``out``, an :class:`Output`; it hands
its result to ``out``, which prints JSON for scripts (``--json``) or text and rich tables for people.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import click
from rich.console import Console
from rich.table import Table

JSON_HELP = "Machine-readable output."
JSON_INDENT = 2  # what scripts and tests have parsed since the first --json; keep the bytes as they are

Command = TypeVar("Command", bound=Callable[..., object])


def json_text(value: object) -> str:
    """A command's JSON: indented, keys in the order given, non-ASCII escaped (no box text reaches a
    terminal raw through ``--json``)."""
    return json.dumps(value, indent=JSON_INDENT)


def json_line(value: object) -> str:
    """One record of a JSON-lines listing, e.g. ``audit tail --json``."""
    return json.dumps(value)


@dataclass(frozen=True)
class Col:
    """A table column that is more than its header. A spec, not a rich ``Column``: a rich one keeps the
    cells of every table it was put in, so a module-level one would carry rows from one listing to the next."""

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
        """Print a table for people, at least ``min_width`` columns wide when given (wide listings)."""
        console = Console() if min_width is None else Console(width=max(Console().width, min_width))
        console.print(table_of(columns, rows, title=title))

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
            self.table(columns, rows, title=title, min_width=min_width)


class JsonOption(click.Option):
    """The ``--json`` flag as :func:`output_options` declares it; its class marks the one shared flag."""


def _output(ctx: click.Context, param: click.Parameter, as_json: bool) -> Output:
    return Output(as_json=as_json)


def output_options(command: Command) -> Command:
    """Give a command the shared ``--json`` flag; the command is called with ``out``, an :class:`Output`."""
    flag = click.option("--json", "out", cls=JsonOption, is_flag=True, help=JSON_HELP, callback=_output)
    return flag(command)
