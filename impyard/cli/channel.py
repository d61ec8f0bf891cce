"""``impyard channel``: response mode and trust per channel (design.md §6)."""

from __future__ import annotations

import json
from dataclasses import asdict

import click
from rich.console import Console
from rich.table import Table

from impyard.channels import ChannelError, ChannelStore
from impyard.cli.errors import CliError
from impyard.clock import SystemClock
from impyard.db import DatabaseError, open_database
from impyard.trust import ALWAYS_TRUSTED_KINDS, ChannelInfo


def _store() -> ChannelStore:
    try:
        return ChannelStore(open_database(), SystemClock())
    except DatabaseError as exc:
        raise CliError(str(exc)) from exc


def _trusted(info: ChannelInfo) -> str:
    if info.kind in ALWAYS_TRUSTED_KINDS:
        return f"yes (always, {info.kind})"
    return "yes" if info.trusted else "no"


def _echo(info: ChannelInfo, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(asdict(info), indent=2))
        return
    click.echo(
        f"{info.channel_id}  surface={info.surface} kind={info.kind} name={info.name or '-'} "
        f"mode={info.mode} trusted={_trusted(info)}"
    )


@click.group("channel")
def channel_group() -> None:
    """Channels: response mode (all | mention) and trust."""


@channel_group.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def ls_command(as_json: bool) -> None:
    """List the channels impyard has seen or been told about.

    \b
    Example:
      impyard channel ls
    """
    channels = _store().all()
    if as_json:
        click.echo(json.dumps([asdict(info) for info in channels], indent=2))
        return
    table = Table(title="Channels")
    for column in ("id", "surface", "kind", "name", "mode", "trusted"):
        table.add_column(column)
    for info in channels:
        table.add_row(info.channel_id, info.surface, info.kind, info.name, info.mode, _trusted(info))
    Console().print(table)


@channel_group.command("show")
@click.argument("channel_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def show_command(channel_id: str, as_json: bool) -> None:
    """Show one channel's mode and trust.

    \b
    Example:
      impyard channel show 123456789012345678
    """
    info = _store().info(channel_id)
    if info is None:
        raise CliError(
            f"no channel {channel_id!r} yet: it appears once a message arrives, or set its mode or trust"
        )
    _echo(info, as_json)


@channel_group.command("mode")
@click.argument("channel_id")
@click.argument("mode")
def mode_command(channel_id: str, mode: str) -> None:
    """Set a channel's response mode: all (every message wakes the imp) or mention.

    \b
    Works for a channel impyard has not seen yet (the setting is recorded).
    In mention mode, only @mentions, replies to the imp and DMs wake it; other
    messages are still kept in the channel's history.
    Example:
      impyard channel mode 123456789012345678 mention
    """
    try:
        _echo(_store().set_mode(channel_id, mode), False)
    except ChannelError as exc:
        raise CliError(str(exc)) from exc


@channel_group.command("trust")
@click.argument("channel_id")
def trust_command(channel_id: str) -> None:
    """Trust a channel: the imp's replies there are sent without approval.

    \b
    Example:
      impyard channel trust 123456789012345678
    """
    try:
        _echo(_store().set_trusted(channel_id, True), False)
    except ChannelError as exc:
        raise CliError(str(exc)) from exc


@channel_group.command("untrust")
@click.argument("channel_id")
def untrust_command(channel_id: str) -> None:
    """Stop trusting a channel: replies there wait for approval (DMs stay trusted).

    \b
    Example:
      impyard channel untrust 123456789012345678
    """
    try:
        _echo(_store().set_trusted(channel_id, False), False)
    except ChannelError as exc:
        raise CliError(str(exc)) from exc
