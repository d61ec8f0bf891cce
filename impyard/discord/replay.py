"""Messages sent while no host served (issue 36): read back from Discord's history when a host starts.

Discord does not redeliver what arrived while no bot connection of the shard was up (a host stopped, restarted,
or killed and its shard not yet taken over). So at start — which is also how a shard is taken over — a ``serve``
host notes, before its bots connect, the newest message it kept of each channel (:func:`marks`: the channels of its
shard in the host's history, and on shard 0 the imp's DMs), and once connected reads, for each, the messages
Discord has after that one (:func:`read_gap`), newest first and bounded (:class:`ReplayBounds`). They go through
the imp's inbound worker as if they arrived now (``Conversations.replay``: answered when fresh, told once they were
missed when stale, each claimed once across hosts). A channel the host never kept a message of is not read: there
is nothing to measure the gap from.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import discord

from impyard.channels.store import ChannelInfo
from impyard.conversation.history import History
from impyard.discord.inbound import SURFACE, skip_reason
from impyard.discord.shards import Shard
from impyard.errors import ImpyardError

PER_CHANNEL_ENV = "IMPYARD_REPLAY_PER_CHANNEL"
TOTAL_ENV = "IMPYARD_REPLAY_TOTAL"
DEFAULT_PER_CHANNEL = 50
DEFAULT_TOTAL = 500
MAX_PER_CHANNEL = 1_000
MAX_TOTAL = 10_000
COUNTED_BEYOND = (
    100  # messages beyond a channel's bound read to count them (one more page at most): not replayed
)


class ReplayBoundsError(ImpyardError, ValueError):
    """IMPYARD_REPLAY_PER_CHANNEL or IMPYARD_REPLAY_TOTAL is not a whole number in its range."""


@dataclass(frozen=True)
class ReplayBounds:
    """At most ``per_channel`` messages of one channel (the newest) and ``total`` of all channels are replayed
    at a start; 0 in either turns the replay off."""

    per_channel: int = DEFAULT_PER_CHANNEL
    total: int = DEFAULT_TOTAL

    @property
    def off(self) -> bool:
        return self.per_channel == 0 or self.total == 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ReplayBounds:
        env = os.environ if environ is None else environ
        return cls(
            per_channel=_bound(env, PER_CHANNEL_ENV, DEFAULT_PER_CHANNEL, MAX_PER_CHANNEL),
            total=_bound(env, TOTAL_ENV, DEFAULT_TOTAL, MAX_TOTAL),
        )


def _bound(env: Mapping[str, str], name: str, default: int, most: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) > most:
        raise ReplayBoundsError(f"{name} must be a whole number of messages from 0 to {most} (got {raw!r})")
    return int(raw)


@dataclass(frozen=True)
class Mark:
    """A channel to read the gap of: Discord's messages after ``after`` (the newest one the host kept)."""

    channel_id: int
    after: int
    guild_id: int | None  # None: a DM


def marks(history: History, infos: Sequence[ChannelInfo], imp: str, shard: Shard | None) -> list[Mark]:
    """The channels of ``imp`` a host serving ``shard`` (None: every one) reads back at start, the most recently
    active first: the Discord server channels of its shard the history keeps messages of (whether the imp's bot
    is in their server is known once it is connected), and on shard 0 the DMs the imp was written to in."""
    known = {info.channel_id: info for info in infos if info.surface == SURFACE}
    dms: set[str] | None = None
    found = []
    for channel_id, message_id in history.last_kept():
        info = known.get(channel_id)
        if info is None or not channel_id.isdigit() or not message_id.isdigit():
            continue
        if info.kind == "guild" and info.guild_id is not None and info.guild_id.isdigit():
            guild_id = int(info.guild_id)
            if shard is None or shard.covers(guild_id):
                found.append(Mark(int(channel_id), int(message_id), guild_id))
        elif info.kind == "dm" and (shard is None or shard.gets_direct_messages):
            dms = set(history.channels_of(imp)) if dms is None else dms
            if channel_id in dms:
                found.append(Mark(int(channel_id), int(message_id), None))
    return found


@dataclass
class Gap:
    """What one channel's read found: the messages to replay (oldest first), and what was left out."""

    messages: list[discord.Message]
    beyond: (
        int  # people's messages older than the newest ``per_channel``, not replayed (counted up to a page)
    )
    ignored: int  # bots' and system messages: never replayed


async def read_gap(channel: discord.abc.Messageable, after: int, most: int) -> Gap:
    """The newest ``most`` messages of people after message ``after``, oldest first (one request for up to 100:
    newest first, as discord.py reads ``before`` pages, filtered to those after the mark)."""
    read = [
        message
        async for message in channel.history(
            limit=most + COUNTED_BEYOND, after=discord.Object(after), oldest_first=False
        )
    ]
    people = [m for m in read if not m.author.bot and m.webhook_id is None and skip_reason(m) is None]
    taken = people[:most]
    return Gap(list(reversed(taken)), len(people) - len(taken), len(read) - len(people))


@dataclass
class ReplayTally:
    """One start's replay of one imp, in counts (never text), for its one log line."""

    channels: int = 0  # channels read
    beyond: int = 0  # messages over a channel's bound, not replayed
    over: int = 0  # channels that had more than their bound
    unread: int = 0  # channels not read: the total bound was reached
    unreadable: int = 0  # channels Discord would not give (gone, or the bot lost access)
    ignored: int = 0  # bots' and system messages read
    outcomes: Counter[str] = field(default_factory=Counter)

    @property
    def replayed(self) -> int:
        return sum(self.outcomes.values())

    def line(self, imp: str, bounds: ReplayBounds) -> str:
        outcomes = " ".join(f"{name}={count}" for name, count in sorted(self.outcomes.items())) or "none"
        return (
            f"replay imp={imp} channels={self.channels} replayed={self.replayed} outcomes: {outcomes}; "
            f"not replayed: {self.beyond} over the bound of {bounds.per_channel} a channel (in {self.over} "
            f"channels), {self.unread} channels past the total bound of {bounds.total}, {self.unreadable} "
            f"channels unreadable; {self.ignored} bot or system messages"
        )
