"""One ``--json`` flag and one way to print results (impyard/cli/output.py, issue 12): every command that
takes ``--json`` takes it from ``output_options``, and the helpers print exactly what scripts parse."""

from __future__ import annotations

import json
import re

import click
import pytest
from click.testing import CliRunner

from impyard.backends.lockdown import evaluate
from impyard.channels.store import ChannelStore
from impyard.cli import cli
from impyard.cli.output import (
    JSON_HELP,
    Col,
    JsonOption,
    Output,
    fit_widths,
    json_line,
    json_text,
    least_width,
    output_options,
    shorten,
    table_of,
    tsv_field,
)
from impyard.clock import SystemClock
from impyard.gateway.audit import AuditLog, AuditRecord
from impyard.gateway.trust import ChannelInfo
from impyard.imps.store import ImpStore
from impyard.storage.db import open_database

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def plain(text: str) -> str:
    """Terminal output without its colours and styles."""
    return ANSI.sub("", text)


def terminal(monkeypatch: pytest.MonkeyPatch, columns: int) -> None:
    """Make stdout count as a terminal of ``columns`` cells (rich honours TTY_COMPATIBLE)."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setenv("NO_COLOR", "1")


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
    terminal(monkeypatch, 40)
    Output(as_json=False).listing([{"id": "t-1"}, {"id": "t-2"}], ("task", "imp"), ROWS, empty="no tasks")
    lines = plain(capsys.readouterr().out).splitlines()
    assert [line.split() for line in lines if line.startswith("│")] == [
        ["│", "t-1", "│", "pip", "│"],
        ["│", "t-2", "│", "bob", "│"],
    ]
    # no rows and no empty text: the table with its headers only (channel ls)
    Output(as_json=False).listing([], ("task", "imp"), [], title="Tasks")
    shown = [line.strip() for line in plain(capsys.readouterr().out).splitlines()]
    assert shown == ["Tasks", "┏━━━━━━┳━━━━━┓", "┃ task ┃ imp ┃", "┡━━━━━━╇━━━━━┩", "└──────┴─────┘"]


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


# --- tables for people and for scripts (issue 17) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("natural", "least", "available", "widths"),
    [
        ([10, 40], [10, 5], 60, [10, 40]),  # fits: untouched
        ([10, 40], [10, 5], 30, [10, 20]),  # the shrinkable column gives
        ([30, 30], [4, 4], 40, [20, 20]),  # the widest gives first, so they end even
        ([30, 10], [25, 4], 20, [25, 4]),  # never below the least: wider than asked
        ([12, 8], [12, 8], 10, [12, 8]),  # nothing shrinkable
    ],
)
def test_columns_shrink_widest_first_and_never_below_a_whole_word(
    natural: list[int], least: list[int], available: int, widths: list[int]
) -> None:
    assert fit_widths(natural, least, available) == widths


@pytest.mark.parametrize(
    ("text", "least"),
    [("t-1a2b3c4d", 10), ("denied by rule model-text", 7), ("a\nlonger-first-word here", 18), ("", 0)],
)
def test_the_least_width_keeps_the_first_word_whole(text: str, least: int) -> None:
    assert least_width(text) == least


@pytest.mark.parametrize(
    ("text", "width", "shown"),
    [
        ("the quick brown fox", 30, "the quick brown fox"),
        ("the quick brown fox", 16, "the quick brown…"),
        ("the quick brown fox", 15, "the quick…"),
        ("the quick brown fox", 10, "the quick…"),
        ("the quick brown fox", 9, "the…"),
        (
            "https://example.com/a/very/long/url",
            10,
            "https://example.com/a/very/long/url",
        ),  # one token: whole
        ("one two three\nfour five six", 9, "one two…\nfour…"),
    ],
)
def test_a_value_is_shortened_after_a_whole_word(text: str, width: int, shown: str) -> None:
    from rich.text import Text

    assert shorten(Text(text), width).plain == shown


def test_a_terminal_table_fits_its_width_and_cuts_no_token(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal(monkeypatch, 50)
    outcome = "the turn failed because the budget for today is exhausted"
    Output(as_json=False).table(("task", "outcome"), [("t-1a2b3c4d5e6f", outcome)])
    lines = plain(capsys.readouterr().out).splitlines()
    assert max(len(line) for line in lines) == 50
    row = next(line for line in lines if "t-1a2b3c4d5e6f" in line)
    cell = row.split("│")[2].strip()
    assert cell.endswith("…") and outcome.startswith(cell[:-1]) and outcome[len(cell) - 1] == " "
    # a value of one token is never cut: the table is as wide as it needs
    token = "x" * 90
    Output(as_json=False).table(("task", "outcome"), [("t-1", token)])
    assert token in plain(capsys.readouterr().out)


def test_a_pipe_gets_tab_separated_full_values(capsys: pytest.CaptureFixture[str]) -> None:
    long = "word " * 60 + "end"
    rows = [("t-1", "[green]ok[/]"), ("t-2", f"\\[redacted] a\tb\nc {long}")]  # cells are markup
    Output(as_json=False).listing([{}, {}], (Col("task", no_wrap=True), "outcome"), rows, title="Tasks")
    assert capsys.readouterr().out.splitlines() == [
        "task\toutcome",
        "t-1\tok",
        f"t-2\t[redacted] a\\tb\\nc {long}",
    ]


@pytest.mark.parametrize(
    ("value", "field"),
    [("a\\b", "a\\\\b"), ("a\tb", "a\\tb"), ("a\r\nb", "a\\r\\nb"), ("\x1b[2J", "\\x1b[2J"), ("é", "é")],
)
def test_a_tsv_field_is_one_line_without_tabs(value: str, field: str) -> None:
    assert tsv_field(value) == field


def channel_rows(output: str) -> dict[str, dict[str, str]]:
    header, *lines = output.splitlines()
    names = header.split("\t")
    return {line.split("\t")[0]: dict(zip(names, line.split("\t"), strict=True)) for line in lines}


def test_channel_ls_json_agrees_with_the_table() -> None:
    db = open_database()
    store = ChannelStore(db, SystemClock())
    store.upsert(ChannelInfo("terminal:alice", surface="terminal", kind="terminal"))
    store.upsert(ChannelInfo("111", kind="dm"))
    store.upsert(ChannelInfo("222", kind="guild", name="general chat"))
    store.upsert(ChannelInfo("333", kind="guild", trusted=True))
    db.close()
    runner = CliRunner()
    table = channel_rows(runner.invoke(cli, ["channel", "ls"]).output)
    listed = {
        item["channel_id"]: item
        for item in json.loads(runner.invoke(cli, ["channel", "ls", "--json"]).output)
    }
    assert {key: row["trusted"] for key, row in table.items()} == {
        "terminal:alice": "yes (always, terminal)", "111": "yes (always, dm)", "222": "no", "333": "yes",
    }  # fmt: skip
    for key, row in table.items():
        assert listed[key]["trusted"] is row["trusted"].startswith("yes"), key
        assert listed[key]["always_trusted"] is ("always" in row["trusted"]), key
    shown = json.loads(runner.invoke(cli, ["channel", "show", "terminal:alice", "--json"]).output)
    assert shown["trusted"] is True and shown["always_trusted"] is True


def test_channel_ls_in_a_narrow_terminal_shortens_names_at_a_word(monkeypatch: pytest.MonkeyPatch) -> None:
    db = open_database()
    ChannelStore(db, SystemClock()).upsert(
        ChannelInfo("123456789012345678", name="a channel with a rather long name")
    )
    db.close()
    result = CliRunner(env={"TTY_COMPATIBLE": "1", "COLUMNS": "70", "NO_COLOR": "1"}).invoke(
        cli, ["channel", "ls"]
    )
    lines = plain(result.output).splitlines()
    assert max(len(line) for line in lines) <= 70 and "123456789012345678" in result.output
    assert any("a channel with a…" in line or "a channel…" in line for line in lines), result.output
    assert "rather long name" not in result.output


def test_budget_set_refuses_an_imp_that_does_not_exist() -> None:
    runner = CliRunner()
    refused = runner.invoke(cli, ["budget", "set", "pipp", "--daily", "1"])
    assert refused.exit_code == 1 and "no imp named 'pipp'" in refused.output, refused.output
    assert [r["scope"] for r in json.loads(runner.invoke(cli, ["budget", "show", "--json"]).output)] == [
        "all"
    ]
    ImpStore().add("pip")
    assert runner.invoke(cli, ["budget", "set", "pip", "--daily", "1"]).exit_code == 0
    ImpStore().remove("pip")  # a removed imp's override can still be cleared, and only cleared
    assert runner.invoke(cli, ["budget", "set", "pip", "--daily", "2"]).exit_code == 1
    cleared = runner.invoke(cli, ["budget", "set", "pip", "--clear"])
    assert cleared.exit_code == 0 and "(policy)" in cleared.output
    assert runner.invoke(cli, ["budget", "set", "pip", "--clear"]).exit_code == 1  # nothing left to clear


# --- box check reads naturally: expected vs observed, in words (issue 17) ------------------------------------


@pytest.mark.parametrize(
    ("report", "name", "expected", "observed", "ok"),
    [
        ({"root_writable": False}, "read-only root", "read-only", "read-only", True),
        ({"root_writable": True}, "read-only root", "read-only", "writable", False),
        ({}, "read-only root", "read-only", "not reported", False),
        ({"state_writable": True}, "state mount writable", "writable", "writable", True),
        ({"state_writable": False}, "state mount writable", "writable", "not writable", False),
        ({"can_route_out": False}, "no route out", "no route out", "no route out", True),
        ({"can_route_out": True}, "no route out", "no route out", "a route out", False),
        ({"uid": 1000}, "non-root user", "a uid other than 0", "uid 1000", True),
        ({"interfaces": "lo,eth0"}, "no network", "only lo", "lo,eth0", False),
        ({"cap_eff": 0}, "no capabilities", "CapEff=0", "CapEff=0", True),
        ({"memory_limit": "536870912"}, "memory limit", "at most 512 MiB", "512 MiB", True),
        ({"memory_limit": "max"}, "memory limit", "at most 512 MiB", "no limit (max)", False),
        ({"pids_limit": "128"}, "pids limit", "128 processes", "128 processes", True),
    ],
)
def test_each_lockdown_row_says_what_is_expected_and_what_was_observed(
    report: dict[str, object], name: str, expected: str, observed: str, ok: bool
) -> None:
    check = next(c for c in evaluate(report, memory="512m", pids_limit=128) if c.name == name)  # type: ignore[arg-type]
    assert (check.expected, check.observed, check.ok) == (expected, observed, ok)
    assert observed not in ("True", "False") and expected not in ("True", "False")


def test_box_check_prints_expected_before_observed() -> None:
    result = CliRunner().invoke(cli, ["box", "check", "--backend", "process", "--json", "--no-spare"])
    report = json.loads(result.stdout)["observed"]
    table = CliRunner().invoke(cli, ["box", "check", "--backend", "process"])
    header, *lines = table.stdout.strip().splitlines()
    names = header.split("\t")
    assert names[:2] == ["box", "property"]  # each row names its box (issue 37)
    rows = {tuple(line.split("\t")[:2]): dict(zip(names, line.split("\t"), strict=True)) for line in lines}
    assert {box for box, _ in rows} == {"started", "spare (unclaimed)", "spare (claimed)"}
    for box in ("started", "spare (claimed)"):
        root = rows[box, "read-only root"]
        assert (root["expected"], root["inside"]) == (
            "read-only",
            "writable" if report["root_writable"] else "read-only",
        )
        assert root["result"] == ("MISSING" if report["root_writable"] else "ok")
        assert root["outside"] == "–"  # the process backend: nothing to see from outside


# --- every group's --help shows an example (issue 17) -----------------------------------------------------------


def groups(group: click.Group, prefix: str = "") -> list[str]:
    found = [prefix.strip()]
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += groups(command, f"{prefix}{name} ")
    return found


def test_every_group_and_command_help_has_an_example() -> None:
    runner = CliRunner()
    assert len(groups(cli)) >= 12  # the walk finds the groups: it cannot pass by finding none
    for path in [*groups(cli), *commands(cli)]:
        result = runner.invoke(cli, [*path.split(), "--help"])
        assert result.exit_code == 0, path
        assert "Example" in result.output and "impyard " in result.output.split("Example", 1)[1], (
            path or "impyard"
        )
