"""How the CLI shows what went wrong: a user's mistake is one line (exit 1), a bug its traceback (exit 2)."""

from __future__ import annotations

import errno
import traceback
from typing import Any, NoReturn

import click

from impyard import __version__
from impyard.errors import ImpyardError

USER_ERROR_EXIT = 1  # an ImpyardError: the message says what is wrong and what to do
BUG_EXIT = 2  # anything else escaping a command is impyard's fault
INTERRUPTED_EXIT = 130  # 128 + SIGINT, what a shell expects after ctrl-C

# click's own ways out of a command (usage errors, --help, "Aborted!"): shown by click, unchanged
_CLICK_EXITS = (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort, EOFError)


class CliError(click.ClickException, ImpyardError):
    """Printed as ``Error: <message>`` (and the hint, when given) with exit code 1."""

    exit_code = USER_ERROR_EXIT

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        if hint is not None:
            self.hint = hint

    def format_message(self) -> str:
        return self.user_message()


def bug_report_line() -> str:
    return (
        "impyard hit a bug: this is not your mistake — please report it with the traceback above "
        f"(impyard {__version__})"
    )


class ImpyardGroup(click.Group):
    """The root group: what escapes a command is shown as a user error or as a bug, never confused."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except _CLICK_EXITS:
            raise
        except KeyboardInterrupt:
            raise click.exceptions.Exit(INTERRUPTED_EXIT) from None
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise  # the reader went away (impyard audit ls | head): click exits quietly
            _report_bug()
        except Exception as exc:
            user_error = _sole_user_error(exc)  # an ImpyardError, bare or alone in a task group
            if user_error is None:
                _report_bug()
            raise CliError(user_error.user_message()) from exc


def _sole_user_error(exc: BaseException) -> ImpyardError | None:
    """``exc`` if it is an ImpyardError, or the one a task group wrapped alone (anyio groups even one error)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, ImpyardError) else None


def _report_bug() -> NoReturn:
    """The traceback of the exception being handled, then the line that asks for a report; exit 2."""
    click.echo(traceback.format_exc(), err=True, nl=False)
    click.echo(bug_report_line(), err=True)
    raise click.exceptions.Exit(BUG_EXIT)
