"""The ``impyard`` command line: groups are nouns, subcommands verbs (docs/contributing.md).

May import: any package (the command line is the top of the house); nothing imports it.
"""

from __future__ import annotations

import faulthandler
import io
import logging
import sys

import click

from impyard import __version__
from impyard.cli.approvals import approvals_group
from impyard.cli.audit import audit_group
from impyard.cli.backup import backup_command
from impyard.cli.box import box_group
from impyard.cli.budget import budget_group
from impyard.cli.channel import channel_group
from impyard.cli.chat import chat_command
from impyard.cli.console import console_command
from impyard.cli.discord import discord_group
from impyard.cli.doctor import doctor_command
from impyard.cli.errors import ImpyardGroup
from impyard.cli.history import history_group
from impyard.cli.hosts import hosts_command
from impyard.cli.imp import imp_group
from impyard.cli.imp_transfer import export_command, import_command
from impyard.cli.memory import memory_group
from impyard.cli.now import now_command
from impyard.cli.policy import policy_group
from impyard.cli.schedule import schedule_group
from impyard.cli.serve import serve_command
from impyard.cli.supervise import supervise_command
from impyard.cli.task import task_group


@click.group(cls=ImpyardGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="impyard")
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """impyard runs AI chat agents (imps) in locked-down boxes, governed by a gateway.

    \b
    Example:
      impyard chat            # talk to an imp in the terminal
      impyard doctor          # what is set up, and how to fix what is not
      impyard box build       # build the box image (no registry needed)
      impyard box check       # start a real box and verify its lockdown
    """
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")


cli.add_command(chat_command)
cli.add_command(channel_group)
cli.add_command(box_group)
cli.add_command(doctor_command)
cli.add_command(imp_group)
imp_group.add_command(export_command)
imp_group.add_command(import_command)
cli.add_command(history_group)
cli.add_command(memory_group)
cli.add_command(policy_group)
cli.add_command(approvals_group)
cli.add_command(audit_group)
cli.add_command(budget_group)
cli.add_command(task_group)
cli.add_command(schedule_group)
cli.add_command(supervise_command)
cli.add_command(serve_command)
cli.add_command(discord_group)
cli.add_command(hosts_command)
cli.add_command(now_command)
cli.add_command(console_command)
cli.add_command(backup_command)


def main() -> None:
    """The ``impyard`` script; user errors and bugs are shown by ``ImpyardGroup`` (cli/errors.py)."""
    try:  # a crash in native code (SQLite, numpy) leaves every thread's Python stack on stderr
        faulthandler.enable()
    except (io.UnsupportedOperation, AttributeError, ValueError):
        pass  # a stderr with no file descriptor (a test runner's capture): nothing to write a crash to
    cli(prog_name="impyard")
