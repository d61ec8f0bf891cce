"""Which Discord shard a host serves (``impyard serve --shard I/N``), and which guilds and channels that makes its.

Discord splits a bot's gateway traffic by guild: shard ``I`` of ``N`` gets the events of the guilds with
``(guild_id >> 22) % N == I``, and every event without a guild (DMs among them) arrives on shard 0 only.
Each host connects as one shard (discord.py's ``shard_id`` / ``shard_count``), so several hosts split the
guilds between them; REST calls are not sharded, so any host may post anywhere. Without ``--shard`` a host
identifies unsharded and gets everything, exactly as before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from impyard.channels.store import ChannelInfo
from impyard.errors import ImpyardError

SHARD_FORMAT = "I/N, the shard I (from 0) of N shards, e.g. 0/2"
_SHAPE = re.compile(r"\s*(\d{1,6})\s*/\s*(\d{1,6})\s*")  # Discord's biggest bots run thousands, not millions


class ShardError(ImpyardError):
    """A --shard value Discord would refuse; the message says what is wrong."""


def shard_of(guild_id: int, count: int) -> int:
    """The shard that gets a guild's events (Discord's rule: the id's timestamp bits, modulo the count)."""
    return (guild_id >> 22) % count


@dataclass(frozen=True)
class Shard:
    """One shard of ``count``: ``id`` is from 0 to ``count - 1``."""

    id: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ShardError(f"the shard count must be at least 1 (got {self.count})")
        if not 0 <= self.id < self.count:
            raise ShardError(f"shard {self.id} is not below the shard count {self.count}")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"1/2"`` → shard 1 of 2; a value of another shape names the format."""
        found = _SHAPE.fullmatch(text)
        if found is None:
            raise ShardError(f"{text!r} is not a shard: write {SHARD_FORMAT}")
        return cls(int(found[1]), int(found[2]))

    @property
    def gets_direct_messages(self) -> bool:
        """Events without a guild — DMs, and commands run in DMs — come to shard 0 only."""
        return self.id == 0

    def covers(self, guild_id: int | None) -> bool:
        """Whether this shard gets the events of a guild (None: a DM channel, shard 0's)."""
        if guild_id is None:
            return self.gets_direct_messages
        return shard_of(guild_id, self.count) == self.id

    def owns_channel(self, info: ChannelInfo | None) -> bool:
        """Whether a channel the host knows is this shard's to act on unasked (answering what a restart left
        unanswered): a server channel by its server's shard; a DM, or a channel whose server is unknown, by
        shard 0's; the terminal and the task log belong to no shard, so to every host."""
        if info is not None and info.kind in ("terminal", "task"):
            return True
        if info is not None and info.kind == "guild" and info.guild_id and info.guild_id.isdigit():
            return self.covers(int(info.guild_id))
        return self.gets_direct_messages

    def __str__(self) -> str:
        return f"{self.id}/{self.count}"
