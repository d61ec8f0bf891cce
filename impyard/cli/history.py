"""``impyard history``: read and clear the host's channel history (impyard/conversation/history.py) for an imp."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

import click
from sqlalchemy.exc import SQLAlchemyError

from impyard.cli.database import database
from impyard.cli.errors import CliError
from impyard.cli.output import Output, output_options
from impyard.clock import SystemClock, iso
from impyard.conversation.history import History, ShownMessage, transcript
from impyard.conversation.responder_history import ResponderHistory, import_legacy_homes
from impyard.imps.store import ImpError, ImpNotFound, ImpStore, validate_name

DEFAULT_SHOWN = 20
MAX_SHOWN = 1000


@click.group("history")
def history_group() -> None:
    """The host's history: the messages of each channel an imp sees, and what became of each turn.

    \b
    Example:
      impyard history show pip
      impyard history show pip terminal:alice -n 50
      impyard history clear pip terminal:alice
    """


@contextmanager
def history_store() -> Iterator[History]:
    with database() as db:
        yield History(db, SystemClock())


def _check_imp(name: str, history: History) -> list[str]:
    """The imp's channels; an unknown name with no history is refused, listing the imps there are."""
    try:
        validate_name(name)
    except ImpError as exc:
        raise CliError(str(exc)) from exc
    channels = history.channels_of(name)
    if not channels:
        try:
            ImpStore().get(name)
        except ImpNotFound as exc:
            raise CliError(str(exc)) from exc
        except ImpError:
            pass  # a broken imp.toml: it is still an imp
    return channels


@history_group.command("show")
@click.argument("imp")
@click.argument("channel", required=False)
@click.option("-n", "limit", type=click.IntRange(1, MAX_SHOWN), default=DEFAULT_SHOWN, show_default=True,
              help="How many of the latest messages.")  # fmt: skip
@output_options
def show_command(imp: str, channel: str | None, limit: int, out: Output) -> None:
    """The latest messages IMP sees in CHANNEL (default: in all its channels), oldest first.

    \b
    Each message that woke the imp and got no reply says why: it chose not to
    reply, the turn failed (and the error), the reply waits for approval, or it
    was missed. Times are UTC. --json gives every field in full.
    Examples:
      impyard history show pip
      impyard history show pip terminal:alice -n 100 --json
    """
    with history_store() as history:
        channels = _check_imp(imp, history)
        if channel is not None:
            channels = [channel]
        messages = history.shown(imp, channels, limit)
    if out.as_json:
        out.json([_message_json(message) for message in messages])
        return
    if not messages:
        where = f"in channel {channel}" if channel is not None else "yet"
        click.echo(f"no history for {imp} {where}")
        return
    for line in transcript(imp, messages):
        click.echo(line)


def _message_json(message: ShownMessage) -> dict[str, object]:
    return {
        "channel_id": message.channel_id,
        "message_id": message.message_id,
        "author": {"id": message.author_id, "name": message.author_name, "bot": message.author_bot},
        "from_imp": message.from_imp,
        "content": message.content,
        "created_at": iso(message.created_at),
        "reply_to_id": message.reply_to_id,
        "attachments": message.attachments,
        "woke": message.woke,
        "outcome": message.outcome,
        "error": message.error,
    }


@history_group.command("clear")
@click.argument("imp")
@click.argument("channel")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def clear_command(imp: str, channel: str, yes: bool) -> None:
    """Forget CHANNEL's history on the host, so IMP's next turn there starts without it.

    \b
    The channel's messages are deleted from the host's database (every imp in
    the channel sees the same history, so they forget it too). What the imp
    remembers is not touched: see `impyard memory forget`. Cannot be undone.
    Example:
      impyard history clear pip terminal:alice
    """
    with history_store() as history:
        channels = _check_imp(imp, history)
        if channel not in channels:
            theirs = f"its channels: {', '.join(channels)}" if channels else "it has no history yet"
            raise CliError(f"{imp} has no history in channel {channel!r} ({theirs})")
        count = history.count(channel)
        others = [name for name in history.imps_in(channel) if name != imp]
        if not yes:
            shared = f" It is shared: {', '.join(others)} will forget it too." if others else ""
            click.confirm(
                f"Forget the {count} messages of channel {channel}?{shared} This cannot be undone.",
                abort=True,
            )
        removed = history.clear(channel)
        # Each imp's own copy of its exchanges there (kept by the host, issue 22) goes too; an older home's
        # history file is imported first, so its lines of this channel cannot come back later.
        own = ResponderHistory(history.db, SystemClock())
        store = ImpStore()
        try:
            import_legacy_homes(own, [(name, store.state_dir(name)) for name in [imp, *others]])
            own.forget_channel(channel)
        except (OSError, sqlite3.Error, SQLAlchemyError) as exc:
            click.echo(f"could not forget {channel} in the imps' own history lines: {exc}", err=True)
    click.echo(f"Forgot {removed} messages of channel {channel}.")
