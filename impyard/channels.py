"""The channel store: per channel its surface, kind, name, trust and response mode (docs/conversation.md).

One store for the ``channels`` table. The same store serves ``impyard channel …`` on the CLI, ``/channel …``
in Discord, the conversation (first sight, mode) and the gateway, which asks it only what
``impyard.trust.ChannelTrust`` names (is this channel trusted?). A mode or trust can be set for a channel
impyard has not seen yet; it is recorded and applies when the first message arrives.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from impyard.clock import Clock, iso
from impyard.db import Database, Store
from impyard.errors import ImpyardError
from impyard.wake import CHANNEL_MODES, ChannelMode

ALWAYS_TRUSTED_KINDS = frozenset({"dm", "terminal"})  # DMs and the operator's terminal (docs/conversation.md)
_COLUMNS = "channel_id, surface, kind, name, guild_id, trusted, mode"


@dataclass(frozen=True)
class ChannelInfo:
    channel_id: str
    surface: str = "discord"
    kind: str = "guild"  # dm | guild | terminal | task
    name: str = ""
    guild_id: str | None = None
    trusted: bool = False
    mode: str = "all"  # all | mention: the wake rule's per-channel setting (docs/conversation.md)


def channel_is_trusted(info: ChannelInfo | None) -> bool:
    """Unknown channels are untrusted; DMs and the terminal always are trusted."""
    if info is None:
        return False
    return info.trusted or info.kind in ALWAYS_TRUSTED_KINDS


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


def _row_to_info(row: sqlite3.Row) -> ChannelInfo:
    return ChannelInfo(
        row["channel_id"], row["surface"], row["kind"], row["name"], row["guild_id"], bool(row["trusted"]),
        row["mode"],
    )  # fmt: skip


class ChannelStore(Store):
    """The ``channels`` table: what the gateway asks (``info``, ``is_trusted``), and what the conversation and the
    operator need (first sight, mode, trust, listing)."""

    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock

    # ------------------------------------------------------------ reading

    def info(self, channel_id: str) -> ChannelInfo | None:
        rows = self.db.query(f"SELECT {_COLUMNS} FROM channels WHERE channel_id = ?", (channel_id,))
        return _row_to_info(rows[0]) if rows else None

    def is_trusted(self, channel_id: str) -> bool:
        return channel_is_trusted(self.info(channel_id))

    def kind(self, channel_id: str) -> str | None:
        info = self.info(channel_id)
        return info.kind if info else None

    def mode(self, channel_id: str) -> ChannelMode:
        info = self.info(channel_id)
        return info.mode if info else "all"  # type: ignore[return-value]

    def all(self) -> list[ChannelInfo]:
        return [
            _row_to_info(row)
            for row in self.db.query(f"SELECT {_COLUMNS} FROM channels ORDER BY surface, channel_id")
        ]

    # ------------------------------------------------------------ writing

    def upsert(self, info: ChannelInfo) -> None:
        """Every field of a channel at once (tests and imports; the surfaces use ``seen``)."""
        self.db.execute(
            """INSERT INTO channels (channel_id, surface, kind, name, guild_id, trusted, updated_at)
               VALUES (?, ?, ?, ?, ?, ?, ?)
               ON CONFLICT (channel_id) DO UPDATE SET surface = excluded.surface, kind = excluded.kind,
                 name = excluded.name, guild_id = excluded.guild_id, trusted = excluded.trusted,
                 updated_at = excluded.updated_at""",
            (
                info.channel_id,
                info.surface,
                info.kind,
                info.name,
                info.guild_id,
                int(info.trusted),
                iso(self.clock.now()),
            ),
        )

    def seen(
        self, channel_id: str, *, surface: str, kind: str, name: str = "", guild_id: str | None = None
    ) -> ChannelInfo:
        """Record a channel as messages arrive: its kind and name follow the surface; trust and mode are kept.

        Written only when the surface says something new of it: most messages come from a channel as it was,
        and a read takes no write lock (issue 18)."""
        known = self.info(channel_id)
        if (
            known is not None
            and (known.surface, known.kind) == (surface, kind)
            and (not name or known.name == name)
            and (guild_id is None or known.guild_id == guild_id)
        ):
            return known
        self.db.execute(
            """INSERT INTO channels (channel_id, surface, kind, name, guild_id, trusted, updated_at)
               VALUES (?, ?, ?, ?, ?, 0, ?)
               ON CONFLICT (channel_id) DO UPDATE SET surface = excluded.surface, kind = excluded.kind,
                 name = CASE WHEN excluded.name = '' THEN channels.name ELSE excluded.name END,
                 guild_id = COALESCE(excluded.guild_id, channels.guild_id), updated_at = excluded.updated_at""",
            (channel_id, surface, kind, name, guild_id, iso(self.clock.now())),
        )
        return self._info(channel_id)

    def set_mode(self, channel_id: str, mode: str) -> ChannelInfo:
        checked = parse_mode(mode)
        self._set(channel_id, "mode", checked)
        return self._info(channel_id)

    def set_trusted(self, channel_id: str, trusted: bool) -> ChannelInfo:
        self._set(channel_id, "trusted", int(trusted))
        return self._info(channel_id)

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
