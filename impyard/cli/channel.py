"""``impyard channel``: response mode and trust per channel (docs/conversation.md)."""

from __future__ import annotations

from dataclasses import asdict

import click

from impyard.channels.store import ChannelError, ChannelStore, audience_words, kind_words, trust_words
from impyard.cli.database import open_or_fail
from impyard.cli.errors import CliError
from impyard.cli.output import Output, output_options
from impyard.clock import SystemClock
from impyard.gateway.trust import ALWAYS_TRUSTED_KINDS, ChannelInfo, channel_is_trusted


def _store() -> ChannelStore:
    return ChannelStore(open_or_fail(), SystemClock())


def channel_json(info: ChannelInfo) -> dict[str, object]:
    """A channel for scripts, agreeing with the table: ``trusted`` is whether the imp's replies there go out
    without approval (DMs and the terminal always), ``always_trusted`` whether that is by its kind."""
    return {
        **asdict(info),
        "trusted": channel_is_trusted(info),
        "always_trusted": info.kind in ALWAYS_TRUSTED_KINDS,
    }


def _line(info: ChannelInfo) -> str:
    return (
        f"{info.channel_id}  surface={info.surface} kind={info.kind} name={info.name or '-'} "
        f"mode={info.mode} trusted={trust_words(info)} audience={audience_words(info)}"
    )


@click.group("channel")
def channel_group() -> None:
    """Channels: response mode (all | mention) and trust.

    \b
    Example:
      impyard channel ls
      impyard channel mode 123456789012345678 mention
      impyard channel trust 123456789012345678
    """


@channel_group.command("ls")
@output_options
def ls_command(out: Output) -> None:
    """List the channels impyard has seen or been told about.

    \b
    Example:
      impyard channel ls
    """
    channels = _store().all()
    out.listing(
        [channel_json(info) for info in channels],
        columns=("id", "surface", "kind", "name", "mode", "trusted"),
        rows=((i.channel_id, i.surface, kind_words(i), i.name, i.mode, trust_words(i)) for i in channels),
        title="Channels",
    )


@channel_group.command("show")
@click.argument("channel_id")
@output_options
def show_command(channel_id: str, out: Output) -> None:
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
    out.show(channel_json(info), _line(info))


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
        click.echo(_line(_store().set_mode(channel_id, mode)))
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
        click.echo(_line(_store().set_trusted(channel_id, True)))
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
        click.echo(_line(_store().set_trusted(channel_id, False)))
    except ChannelError as exc:
        raise CliError(str(exc)) from exc
