"""The channel store: per channel its surface, kind, name, trust and response mode (design.md §6).

The same store serves ``impyard channel …`` on the CLI and ``/channel …`` in
Discord. A mode or trust can be set for a channel impyard has not seen yet; it
is recorded and applies when the first message arrives.
"""

from __future__ import annotations

from impyard.clock import iso
from impyard.errors import ImpyardError
from impyard.trust import ChannelInfo, DbChannelTrust
from impyard.wake import CHANNEL_MODES, ChannelMode


class ChannelError(ImpyardError, ValueError):
    """A channel setting that cannot be taken (a bad channel id or mode); the message says what to use."""


class ChannelModeError(ChannelError):
    def __init__(self, value: str) -> None:
        super().__init__(
            f"unknown mode {value!r}: use 'all' (every message wakes the imp) or 'mention' (only mentions and DMs)"
        )


def parse_mode(value: str) -> ChannelMode:
    mode = value.strip().lower()
    if mode not in CHANNEL_MODES:
        raise ChannelModeError(value)
    return mode


class ChannelStore(DbChannelTrust):
    """Channel trust (what the gateway asks) plus what the conversation needs: mode, first sight, listing."""

    def seen(
        self, channel_id: str, *, surface: str, kind: str, name: str = "", guild_id: str | None = None
    ) -> ChannelInfo:
        """Record a channel as messages arrive: its kind and name follow the surface; trust and mode are kept."""
        self.db.execute(
            """INSERT INTO channels (channel_id, surface, kind, name, guild_id, trusted, updated_at)
               VALUES (?, ?, ?, ?, ?, 0, ?)
               ON CONFLICT (channel_id) DO UPDATE SET surface = excluded.surface, kind = excluded.kind,
                 name = CASE WHEN excluded.name = '' THEN channels.name ELSE excluded.name END,
                 guild_id = COALESCE(excluded.guild_id, channels.guild_id), updated_at = excluded.updated_at""",
            (channel_id, surface, kind, name, guild_id, iso(self.clock.now())),
        )
        info = self.info(channel_id)
        assert info is not None
        return info

    def set_mode(self, channel_id: str, mode: str) -> ChannelInfo:
        checked = parse_mode(mode)
        self._set(channel_id, "mode", checked)
        return self._info(channel_id)

    def set_trusted(self, channel_id: str, trusted: bool) -> ChannelInfo:
        self._set(channel_id, "trusted", int(trusted))
        return self._info(channel_id)

    def mode(self, channel_id: str) -> ChannelMode:
        info = self.info(channel_id)
        return info.mode if info else "all"  # type: ignore[return-value]

    def all(self) -> list[ChannelInfo]:
        return [
            ChannelInfo(
                r["channel_id"],
                r["surface"],
                r["kind"],
                r["name"],
                r["guild_id"],
                bool(r["trusted"]),
                r["mode"],
            )
            for r in self.db.query(
                "SELECT channel_id, surface, kind, name, guild_id, trusted, mode FROM channels ORDER BY surface, channel_id"
            )
        ]

    def _set(self, channel_id: str, column: str, value: object) -> None:
        assert column in ("mode", "trusted")  # never a caller-chosen column name
        if not channel_id.strip() or len(channel_id) > 128:
            raise ChannelError("a channel id is 1-128 characters (a Discord channel id, or terminal:<name>)")
        self.db.execute(
            f"""INSERT INTO channels (channel_id, {column}, updated_at) VALUES (?, ?, ?)
                ON CONFLICT (channel_id) DO UPDATE SET {column} = excluded.{column}, updated_at = excluded.updated_at""",
            (channel_id, value, iso(self.clock.now())),
        )

    def _info(self, channel_id: str) -> ChannelInfo:
        info = self.info(channel_id)
        assert info is not None
        return info
