"""The root of impyard's own errors: a mistake a user or operator can fix, as opposed to a bug.

The CLI shows an ``ImpyardError`` as one line (``Error: <message>``, and the
hint when there is one), exit code 1; any other exception escaping a command is
a bug and is shown with its traceback (impyard/cli/__init__.py).
"""

from __future__ import annotations


class ImpyardError(Exception):
    """Something a user or operator can fix; the message says what is wrong, ``hint`` (optional) what to do."""

    hint: str | None = None  # a subclass may set a fixed hint; an instance may carry its own

    def __init__(self, *args: object, hint: str | None = None) -> None:
        super().__init__(*args)
        if hint is not None:
            self.hint = hint

    def user_message(self) -> str:
        """The message as the CLI shows it: the message, then the hint when there is one."""
        message = str(self)
        return f"{message}; {self.hint}" if self.hint else message
