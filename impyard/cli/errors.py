"""One-line CLI errors: what is wrong and what to do, non-zero exit, never a traceback."""

from __future__ import annotations

import click


class CliError(click.ClickException):
    """Printed as ``Error: <message>`` with exit code 1."""
