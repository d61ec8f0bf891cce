"""One ``--json`` flag and one way to print results (impyard/cli/output.py, issue 12): every command that
takes ``--json`` takes it from ``output_options``, and the helpers print exactly what scripts parse."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from impyard.audit import AuditLog, AuditRecord
from impyard.cli import cli
from impyard.cli.output import (
    JSON_HELP,
    Col,
    JsonOption,
    Output,
    json_line,
    json_text,
    output_options,
    table_of,
)
from impyard.clock import SystemClock
from impyard.db import open_database

# Commands that speak JSON today; the walk must find at least these, so it cannot pass by finding nothing.
KNOWN_JSON_COMMANDS = {
    "approvals approve", "approvals deny", "approvals ls", "approvals show", "audit tail", "box check",
    "budget show", "channel ls", "channel show", "doctor", "imp ls", "imp show", "policy check", "schedule add",
    "schedule ls", "schedule pause", "schedule resume", "schedule rm", "task add", "task cancel", "task ls",
    "task show",
}  # fmt: skip


def commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    """Every leaf command under ``group``, by its path (``"task ls"``)."""
    found: dict[str, click.Command] = {}
    for name, command in group.commands.items():
        path = f"{prefix}{name}"
        if isinstance(command, click.Group):
            found.update(commands(command, f"{path} "))
        else:
            found[path] = command
    return found


def json_flags(command: click.Command) -> list[click.Parameter]:
    return [param for param in command.params if "--json" in param.opts]


def test_every_json_flag_comes_from_output_options() -> None:
    speaking = {path: flags for path, command in commands(cli).items() if (flags := json_flags(command))}
    assert KNOWN_JSON_COMMANDS <= speaking.keys()
    for path, flags in speaking.items():
        assert [type(flag) for flag in flags] == [JsonOption], f"{path}: --json is not from output_options"
        assert flags[0].help == JSON_HELP == "Machine-readable output.", path
        assert flags[0].name == "out", path


@pytest.mark.parametrize(("args", "as_json"), [([], False), (["--json"], True)])
def test_output_options_calls_the_command_with_an_output(args: list[str], as_json: bool) -> None:
    seen: list[Output] = []

    @click.command()
    @output_options
    def probe(out: Output) -> None:
        seen.append(out)

    result = CliRunner().invoke(probe, args)
    assert result.exit_code == 0, result.output
    assert seen == [Output(as_json=as_json)]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ({"b": 1, "a": [1, None]}, '{\n  "b": 1,\n  "a": [\n    1,\n    null\n  ]\n}'),  # keys as given
        ([], "[]"),
        ({}, "{}"),
        (
            "caf\u00e9 \u2014 rtl\u202e",
            '"caf\\u00e9 \\u2014 rtl\\u202e"',
        ),  # no raw bidi control to a terminal
        ({"ok": True, "n": 1.5}, '{\n  "ok": true,\n  "n": 1.5\n}'),
    ],
)
def test_json_text_is_what_the_commands_printed_before(value: object, text: str) -> None:
    assert json_text(value) == text


@pytest.mark.parametrize(
    ("value", "line"),
    [
        ({"b": 1, "a": "\u00fc"}, '{"b": 1, "a": "\\u00fc"}'),
        ({"detail": "two\nlines"}, '{"detail": "two\\nlines"}'),
    ],
)
def test_json_line_is_one_line(value: object, line: str) -> None:
    assert json_line(value) == line


@pytest.mark.parametrize(
    ("as_json", "text"),
    [(True, '{\n  "id": "t-1"\n}\n'), (False, "queued t-1\n")],
)
def test_show_prints_the_value_or_the_text(
    as_json: bool, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    Output(as_json=as_json).show({"id": "t-1"}, "queued t-1")
    assert capsys.readouterr().out == text


ROWS = [("t-1", "pip"), ("t-2", "bob")]


@pytest.mark.parametrize(
    ("as_json", "values", "one_per_line", "empty", "text"),
    [
        (True, [{"id": "t-1"}, {"id": "t-2"}], False, None, '[\n  {\n    "id": "t-1"\n  },\n  {\n    "id": "t-2"\n  }\n]\n'),
        (True, [{"id": "t-1"}, {"id": "t-2"}], True, None, '{"id": "t-1"}\n{"id": "t-2"}\n'),
        (True, [], False, "no tasks", "[]\n"),
        (True, [], True, "no tasks", ""),
        (False, [], False, "no tasks", "no tasks\n"),
    ],
)  # fmt: skip
def test_listing_prints_json_or_the_empty_text(
    as_json: bool,
    values: list[object],
    one_per_line: bool,
    empty: str | None,
    text: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    Output(as_json=as_json).listing(values, ("task", "imp"), ROWS, empty=empty, one_per_line=one_per_line)
    assert capsys.readouterr().out == text


def test_listing_for_people_is_a_table_of_the_rows(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    Output(as_json=False).listing([{"id": "t-1"}, {"id": "t-2"}], ("task", "imp"), ROWS, empty="no tasks")
    lines = capsys.readouterr().out.splitlines()
    assert [line.split() for line in lines if line.startswith("│")] == [
        ["│", "t-1", "│", "pip", "│"],
        ["│", "t-2", "│", "bob", "│"],
    ]
    # no rows and no empty text: the table with its headers only (channel ls)
    Output(as_json=False).listing([], ("task", "imp"), [], title="Tasks")
    shown = [line.strip() for line in capsys.readouterr().out.splitlines()]
    assert shown == ["Tasks", "┏━━━━━━┳━━━━━┓", "┃ task ┃ imp ┃", "┡━━━━━━╇━━━━━┩", "└──────┴─────┘"]


@pytest.mark.parametrize(("min_width", "widest"), [(None, 40), (160, 101)])
def test_a_wide_listing_is_not_squeezed_into_a_narrow_terminal(
    min_width: int | None, widest: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    Output(as_json=False).table(("task", "outcome"), [("t-1", "x" * 90)], min_width=min_width)
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) == widest


def test_table_of_holds_the_rows_under_the_columns() -> None:
    table = table_of((Col("task", no_wrap=True), "imp"), ROWS, title="Tasks")
    assert [column.header for column in table.columns] == ["task", "imp"]
    assert [column.no_wrap for column in table.columns] == [True, False]
    assert list(zip(*(column.cells for column in table.columns), strict=True)) == ROWS
    assert table.title == "Tasks"


def test_a_column_spec_in_two_tables_carries_no_rows_over() -> None:
    columns = (Col("task", no_wrap=True), "imp")  # a module-level constant in the commands
    table_of(columns, ROWS)
    again = table_of(columns, [("t-3", "kim")])
    assert [list(column.cells) for column in again.columns] == [["t-3"], ["kim"]]


def test_a_second_listing_in_one_process_shows_only_its_own_rows() -> None:
    db = open_database()
    audit = AuditLog(db, SystemClock(), [])
    for imp in ("pip", "bob"):
        audit.write(AuditRecord(imp=imp, method="model.request", verdict="allowed", rule=f"rule-{imp}"))
    db.close()
    runner = CliRunner(env={"COLUMNS": "200"})
    assert "rule-pip" in runner.invoke(cli, ["audit", "tail", "--imp", "pip"]).output
    bob = runner.invoke(cli, ["audit", "tail", "--imp", "bob"]).output
    assert (
        "rule-bob" in bob and "rule-pip" not in bob
    )  # the "rule" column is a Col spec, not a shared rich Column
    assert [
        json.loads(line)["rule"]
        for line in runner.invoke(cli, ["audit", "tail", "--json"]).output.splitlines()
    ] == [
        "rule-pip",
        "rule-bob",
    ]
