"""One root for impyard's errors, and how the CLI shows them: a user's mistake is one line (exit 1),
a bug is its traceback and a request for a report (exit 2) — never one dressed as the other (issue 12)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
from collections.abc import Callable

import click
import pytest
from click.testing import CliRunner, Result

import impyard
from impyard import __version__
from impyard.backends.base import BoxDied, BoxError, BoxStartError, BoxTimeout
from impyard.backends.image import BoxImageError
from impyard.channels.store import ChannelError, ChannelModeError, ChannelStore
from impyard.cli import cli, main
from impyard.cli.errors import CliError
from impyard.conversation.history import RetentionError, retention_from_env
from impyard.discord.client import DiscordSetupError
from impyard.durations import DurationError
from impyard.errors import ImpyardError
from impyard.gateway.broker import UpstreamUnreachable
from impyard.gateway.fetch import FetchFailed, FetchRefused, TextRefused
from impyard.gateway.gates import GateError
from impyard.gateway.ledger import BudgetExhausted, BudgetLimitError, Ledger
from impyard.gateway.policy import PolicyError
from impyard.gateway.prices import PriceMissing
from impyard.gateway.surfaces import SurfaceError
from impyard.imps.config import ImpConfigError, ImpError, ImpExists, ImpNameError, ImpNotFound
from impyard.imps.store import ImpStore
from impyard.storage.db import DatabaseError
from impyard.storage.instance import AlreadyRunning
from impyard.tasks import TaskError
from impyard.tasks.triggers import ScheduleError
from impyard.terminal import chat as terminal

BUG_LINE = "impyard hit a bug: this is not your mistake"

# Every error a CLI command may show a user or operator, written out: each is an ImpyardError.
USER_ERRORS = [
    AlreadyRunning, BoxDied, BoxError, BoxImageError, BoxStartError, BoxTimeout, BudgetExhausted,
    BudgetLimitError, ChannelError, ChannelModeError, CliError, DatabaseError, DiscordSetupError, DurationError,
    FetchFailed, FetchRefused, GateError, ImpConfigError, ImpError, ImpExists, ImpNameError, ImpNotFound,
    PolicyError, PriceMissing, RetentionError, ScheduleError, SurfaceError, TaskError, TextRefused,
    UpstreamUnreachable,
]  # fmt: skip
# Those that were ValueErrors before stay ValueErrors, so a caller that catches ValueError still does.
STILL_VALUE_ERRORS = [
    BudgetLimitError, ChannelError, ChannelModeError, DurationError, ImpNameError, RetentionError, ScheduleError,
    TaskError,
]  # fmt: skip
# Exceptions of impyard/ that are internal signalling, never shown to a user: the only ones outside the root.
INTERNAL = {
    "impyard.gateway.judge._Outside",
    "impyard.gateway.broker.ResponseTooLarge",
    "impyard.memory.vectors.VectorError",
    "impyard.terminal.console.Interrupted",
    "impyard.backends.engine.EngineError",  # the engine API's refusal: the Docker backend says it as a BoxError
    "impyard.backends.multiplex.MultiplexError",  # a malformed attach stream: that box ends, as a BoxError
    "impyard.storage.quick.Busy",  # quick work met SQLite's lock: it runs again on a worker (Database.quick), never shown
    "impyard.memory.service._LeaseLostInFlight",  # a fenced memory write rolled back: the box is refused (lease)
    "impyard.gateway.model_act._EndedWithBox",  # a local server's call ended with its box: audited "interrupted"
    "impyard.conversation.spares.SpareFailed",  # a claimed spare failed before its work: a box is started instead
    "impyard.cli.box_probe.SpareCheckError",  # box check's spare did not get through: shown as its failed row
}


def run(*args: str) -> Result:
    return CliRunner(env={"COLUMNS": "200"}).invoke(cli, list(args))


def error_lines(result: Result) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith("Error:")]


def fail_with(exc: BaseException) -> Callable[..., None]:
    """A stand-in for a function a command calls, raising ``exc``."""

    def fail(*args: object, **kwargs: object) -> None:
        raise exc

    return fail


# --- one root ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("error", USER_ERRORS, ids=lambda cls: cls.__name__)
def test_every_error_a_user_may_see_is_an_impyard_error(error: type[Exception]) -> None:
    assert issubclass(error, ImpyardError)


@pytest.mark.parametrize("error", STILL_VALUE_ERRORS, ids=lambda cls: cls.__name__)
def test_errors_that_were_value_errors_still_are(error: type[Exception]) -> None:
    assert issubclass(error, ValueError)


def test_every_exception_class_of_the_host_is_a_user_error_or_named_internal() -> None:
    """A new error class picks a side: derive from ImpyardError, or be listed here as internal signalling."""
    found: set[str] = set()
    for module_info in pkgutil.walk_packages(impyard.__path__, "impyard."):
        module = importlib.import_module(module_info.name)
        for name, value in vars(module).items():
            own = inspect.isclass(value) and value.__module__ == module.__name__
            if own and issubclass(value, BaseException) and not issubclass(value, ImpyardError):
                found.add(f"{module.__name__}.{name}")
    assert found == INTERNAL


@pytest.mark.parametrize(
    ("error", "shown"),
    [
        (ImpyardError("the store is locked"), "the store is locked"),
        (ImpyardError("the store is locked", hint="stop the other impyard first"),
         "the store is locked; stop the other impyard first"),
        (CliError("no such channel", hint="run impyard channel ls"), "no such channel; run impyard channel ls"),
        (GateError("not_found", "no gate g1"), "no gate g1"),
    ],
)  # fmt: skip
def test_the_shown_message_is_the_message_then_the_hint(error: ImpyardError, shown: str) -> None:
    assert error.user_message() == shown


def test_constructors_and_messages_are_unchanged() -> None:
    """Subclasses keep their own signatures and messages; the root adds only the hint."""
    gate = GateError("expired", "the gate expired")
    assert (gate.kind, str(gate), gate.hint) == ("expired", "the gate expired", None)
    assert str(ChannelModeError("loud")).startswith("unknown mode 'loud': use 'all'")
    assert UpstreamUnreachable("down", sent=True).sent is True


# --- the CLI: user errors are one line, exit 1 ----------------------------------------------------------


def test_a_user_error_from_a_command_is_one_error_line_and_exit_1() -> None:
    result = run("channel", "mode", "123456789012345678", "loud")
    assert result.exit_code == 1
    assert error_lines(result) == [f"Error: {ChannelModeError('loud')}"]
    assert "Traceback" not in result.output and BUG_LINE not in result.output


@pytest.mark.parametrize(
    ("error", "shown"),
    [
        (DatabaseError("the database is newer than this impyard: upgrade impyard"),
         "Error: the database is newer than this impyard: upgrade impyard"),
        (ImpyardError("the channel store is busy", hint="try again in a moment"),
         "Error: the channel store is busy; try again in a moment"),
        (BudgetExhausted("imp:pip/day", 60, 1_000_000, 1_000_000, 10), "Error: budget imp:pip/day has $0.0000"),
    ],
)  # fmt: skip
def test_an_impyard_error_escaping_a_command_is_one_line_with_its_hint(
    monkeypatch: pytest.MonkeyPatch, error: ImpyardError, shown: str
) -> None:
    monkeypatch.setattr(ChannelStore, "all", fail_with(error))
    result = run("channel", "ls")
    assert result.exit_code == 1
    assert len(error_lines(result)) == 1 and error_lines(result)[0].startswith(shown)
    assert "Traceback" not in result.output and BUG_LINE not in result.output


def test_a_user_error_alone_in_a_task_group_is_still_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    locked = DatabaseError("the database is locked: stop the other host")
    wrapped = ExceptionGroup("unhandled errors in a TaskGroup", [ExceptionGroup("nested", [locked])])
    monkeypatch.setattr(ChannelStore, "all", fail_with(wrapped))
    result = run("channel", "ls")
    assert result.exit_code == 1 and error_lines(result) == [f"Error: {locked}"]
    assert "Traceback" not in result.output


def test_a_bad_budget_limit_is_still_a_user_error() -> None:
    ImpStore().add("pip")  # budget set refuses an imp that does not exist (issue 17)
    result = run("budget", "set", "pip", "--daily", "nan")
    assert result.exit_code == 1
    assert error_lines(result) == ["Error: a budget limit is a number of USD from 0 to 1e+06 (got nan)"]


def test_a_bad_history_retention_setting_stops_chat_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chat no longer catches every ValueError: the setting's own error is shown by the root, as before."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("IMPYARD_HISTORY_RETENTION", "lots")

    async def run_chat(
        name: str, *, backend: str | None = None, log_path: object = None, as_name: str | None = None
    ) -> None:  # no fileno
        retention_from_env()  # what the runtime checks first

    monkeypatch.setattr(terminal, "run_chat", run_chat)
    result = run("chat")
    assert result.exit_code == 1
    assert error_lines(result) == [
        "Error: IMPYARD_HISTORY_RETENTION must be a whole number of messages >= 1 (got 'lots')"
    ]
    assert "Traceback" not in result.output


def test_click_and_cli_errors_are_unchanged() -> None:
    usage = run("channel", "mode", "123")
    assert usage.exit_code == 2 and "Usage:" in usage.output and "Missing argument" in usage.output
    assert BUG_LINE not in usage.output
    missing = run("channel", "show", "123")
    assert missing.exit_code == 1
    [line] = error_lines(missing)
    assert line.startswith("Error: no channel '123' yet:")
    assert run("channel", "--help").exit_code == 0 and run("--version").exit_code == 0


@pytest.mark.parametrize(
    ("raised", "exit_code", "output"),
    [
        (click.Abort(), 1, "Aborted!\n"),
        (EOFError(), 1, "\nAborted!\n"),
        (BrokenPipeError(32, "Broken pipe"), 1, ""),
    ],
)
def test_click_s_own_ways_out_stay_click_s(
    monkeypatch: pytest.MonkeyPatch, raised: BaseException, exit_code: int, output: str
) -> None:
    """A refused prompt (Abort, EOF on stdin) or a closed pipe (impyard audit ls | head) is no bug."""
    monkeypatch.setattr(ChannelStore, "all", fail_with(raised))
    result = run("channel", "ls")
    assert (result.exit_code, result.output) == (exit_code, output)


# --- the CLI: bugs are a traceback and a report line, exit 2 --------------------------------------------


def assert_reported_bug(result: Result, raised: str) -> None:
    assert result.exit_code == 2
    assert "Traceback (most recent call last)" in result.stderr and raised in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(BUG_LINE) and "report it with the traceback above" in last and __version__ in last
    assert not error_lines(result)


def test_a_bug_prints_its_traceback_and_asks_for_a_report(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ChannelStore, "all", fail_with(ZeroDivisionError("division by zero")))
    assert_reported_bug(run("channel", "ls"), "ZeroDivisionError: division by zero")


@pytest.mark.parametrize("args", [("channel", "mode", "123", "all"), ("channel", "trust", "123")])
def test_a_value_error_from_a_bug_in_channel_commands_is_not_a_user_error(
    monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]
) -> None:
    bug = fail_with(ValueError("too many values to unpack (expected 2)"))
    monkeypatch.setattr(ChannelStore, "set_mode", bug)
    monkeypatch.setattr(ChannelStore, "set_trusted", bug)
    assert_reported_bug(run(*args), "ValueError: too many values to unpack (expected 2)")


@pytest.mark.parametrize("also", [[], [DatabaseError("locked")]], ids=["alone", "with-a-user-error"])
def test_a_task_group_holding_a_bug_is_a_bug(monkeypatch: pytest.MonkeyPatch, also: list[Exception]) -> None:
    group = ExceptionGroup("unhandled errors in a TaskGroup", [*also, ZeroDivisionError("division by zero")])
    monkeypatch.setattr(ChannelStore, "all", fail_with(group))
    assert_reported_bug(run("channel", "ls"), "ZeroDivisionError: division by zero")


def test_a_value_error_from_a_bug_in_budget_set_is_not_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Ledger, "set_limits", fail_with(ValueError("math domain error")))
    ImpStore().add("pip")
    assert_reported_bug(run("budget", "set", "pip", "--daily", "1"), "ValueError: math domain error")


def test_ctrl_c_exits_130_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ChannelStore, "all", fail_with(KeyboardInterrupt()))
    result = run("channel", "ls")
    assert result.exit_code == 130
    assert result.output == ""


def test_the_impyard_script_shows_errors_the_same_way(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["impyard", "channel", "ls"])
    monkeypatch.setattr(ChannelStore, "all", fail_with(ZeroDivisionError("division by zero")))
    with pytest.raises(SystemExit) as bug:
        main()
    err = capsys.readouterr().err
    assert bug.value.code == 2 and "ZeroDivisionError" in err
    assert err.strip().splitlines()[-1].startswith(BUG_LINE)

    locked = DatabaseError("the database is locked: stop the other host")
    monkeypatch.setattr(ChannelStore, "all", fail_with(locked))
    with pytest.raises(SystemExit) as user:
        main()
    err = capsys.readouterr().err
    assert user.value.code == 1 and err == f"Error: {locked}\n"
