"""The channel store: per channel its surface, kind, name, trust, response mode and audience (docs/conversation.md).

One store for the ``channels`` table. The same store serves ``impyard channel …`` on the CLI, ``/channel …``
in Discord, the conversation (first sight, mode) and the gateway, which asks it only what
``impyard.gateway.trust.ChannelTrust`` names (is this channel trusted?). A mode or trust can be set for a channel
impyard has not seen yet; it is recorded and applies when the first message arrives.

A guild channel's ``audience`` (issue 32 #4) says who can read it, as the surface reads it with each message:
``guild`` (everyone in the server), ``private`` (fewer: Discord's permission overwrites, a private thread, a
thread of a private channel) or None (not known yet: the channel was recorded before the host read audiences,
or only by a slash command). Memory scopes follow it (``impyard.memory.scopes.decide``). The first time a
channel the host already knew is found private, its memories move to its own scope in the same transaction
(``impyard.memory.audience``): once, since a known audience is never forgotten again.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from sqlalchemy import bindparam, case, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from impyard.clock import Clock, iso
from impyard.errors import ImpyardError
from impyard.storage.db import Database, Store
from impyard.storage.prepared import Prepared
from impyard.storage.tables import channels

# The wake rule's per-channel setting (seed 004 §1, docs/conversation.md): a fact of the channel.
ChannelMode = Literal["all", "mention"]
CHANNEL_MODES: tuple[ChannelMode, ...] = ("all", "mention")
DEFAULT_MODE: ChannelMode = "all"

PUBLIC = "guild"  # audience: everyone in the guild can read the channel
PRIVATE = "private"  # audience: fewer than everyone in the guild can (issue 32 #4)
AUDIENCES = frozenset({PUBLIC, PRIVATE})
ALWAYS_TRUSTED_KINDS = frozenset({"dm", "terminal"})  # DMs and the operator's terminal (docs/conversation.md)
_c = channels.c
_SELECT = select(_c.channel_id, _c.surface, _c.kind, _c.name, _c.guild_id, _c.trusted, _c.mode, _c.audience)
_INFO = Prepared(_SELECT.where(_c.channel_id == bindparam("channel_id")))  # hot: the lean path (issue 18)
_ALL = _SELECT.order_by(_c.surface, _c.channel_id)  # re-sorted by code point: PostgreSQL's collation differs


@dataclass(frozen=True)
class ChannelInfo:
    channel_id: str
    surface: str = "discord"
    kind: str = "guild"  # dm | guild | terminal | task
    name: str = ""
    guild_id: str | None = None
    trusted: bool = False
    mode: str = "all"  # all | mention: the wake rule's per-channel setting (docs/conversation.md)
    audience: str | None = None  # guild | private | None (not known yet): who can read it (issue 32 #4)


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


def _row_to_info(row: Any) -> ChannelInfo:
    return ChannelInfo(row[0], row[1], row[2], row[3], row[4], bool(row[5]), row[6], row[7])


@cache
def _upserts(dialect: str) -> dict[str, Any]:
    """The dialect's INSERT ... ON CONFLICT (channel_id) DO UPDATE statements, built once."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    whole = insert(channels)
    seen = insert(channels)
    mode = insert(channels)
    trusted = insert(channels)
    key = [_c.channel_id]
    return {
        "whole": whole.on_conflict_do_update(
            index_elements=key,
            set_={
                name: whole.excluded[name]
                for name in ("surface", "kind", "name", "guild_id", "trusted", "audience", "updated_at")
            },
        ),  # fmt: skip
        "seen": seen.on_conflict_do_update(
            index_elements=key,
            set_={
                "surface": seen.excluded.surface,
                "kind": seen.excluded.kind,
                "name": case((seen.excluded.name == "", _c.name), else_=seen.excluded.name),
                "guild_id": func.coalesce(seen.excluded.guild_id, _c.guild_id),
                "audience": func.coalesce(seen.excluded.audience, _c.audience),  # a known one stays known
                "updated_at": seen.excluded.updated_at,
            },
        ),
        "mode": mode.on_conflict_do_update(
            index_elements=key, set_={"mode": mode.excluded.mode, "updated_at": mode.excluded.updated_at}
        ),
        "trusted": trusted.on_conflict_do_update(
            index_elements=key,
            set_={"trusted": trusted.excluded.trusted, "updated_at": trusted.excluded.updated_at},
        ),
    }


# (conn, channel_id, guild_id): called inside the write that first records a known guild channel as private.
BecamePrivate = Callable[[Connection, str, "str | None"], object]


class ChannelStore(Store):
    """The ``channels`` table: what the gateway asks (``info``, ``is_trusted``), and what the conversation and the
    operator need (first sight, mode, trust, listing)."""

    def __init__(self, db: Database, clock: Clock, *, on_private: BecamePrivate | None = None) -> None:
        """``on_private``: what else moves, in the same transaction, when a known guild channel is first found
        private (issue 32 #4: the host passes memory's ``move_to_own_scope``; the channels know no memory)."""
        self.db = db
        self.clock = clock
        self.on_private = on_private

    # ------------------------------------------------------------ reading

    def info(self, channel_id: str, *, conn: Connection | None = None) -> ChannelInfo | None:
        """What the host knows of a channel; ``conn``: inside the caller's transaction (issue 18: a job that
        composes several stores' reads in one), else in a read of its own."""
        if conn is None:
            return self.db.read(lambda conn: _info(conn, channel_id))
        return _info(conn, channel_id)

    def is_trusted(self, channel_id: str, *, conn: Connection | None = None) -> bool:
        return channel_is_trusted(self.info(channel_id, conn=conn))

    def kind(self, channel_id: str) -> str | None:
        info = self.info(channel_id)
        return info.kind if info else None

    def mode(self, channel_id: str) -> ChannelMode:
        info = self.info(channel_id)
        return info.mode if info else "all"  # type: ignore[return-value]

    def all(self) -> list[ChannelInfo]:
        rows = self.db.read(lambda conn: conn.execute(_ALL).all())
        return sorted((_row_to_info(row) for row in rows), key=lambda info: (info.surface, info.channel_id))

    # ------------------------------------------------------------ writing

    def upsert(self, info: ChannelInfo) -> None:
        """Every field of a channel at once (tests and imports; the surfaces use ``seen``)."""
        row = {
            "channel_id": info.channel_id, "surface": info.surface, "kind": info.kind, "name": info.name,
            "guild_id": info.guild_id, "trusted": int(info.trusted), "audience": info.audience,
            "updated_at": iso(self.clock.now()),
        }  # fmt: skip
        self.db.write(lambda conn: conn.execute(_upserts(conn.dialect.name)["whole"], row))

    def seen(
        self,
        channel_id: str,
        *,
        surface: str,
        kind: str,
        name: str = "",
        guild_id: str | None = None,
        audience: str | None = None,
        conn: Connection | None = None,
    ) -> ChannelInfo:
        """Record a channel as messages arrive: its kind, name and audience follow the surface; trust and mode
        are kept, and so is a known audience when the surface says none (None: it cannot tell).

        Written only when the surface says something new of it: most messages come from a channel as it was,
        and on its own (no ``conn``) a read takes no write lock (issue 18). ``conn``: inside the caller's write
        transaction. The first time a known channel is found private, its memories move to its own scope in
        the same transaction (issue 32 #4: ``on_private``)."""
        if audience is not None and audience not in AUDIENCES:
            raise ChannelError(
                f"unknown audience {audience!r}: a channel's audience is one of {sorted(AUDIENCES)}"
            )
        row = {"channel_id": channel_id, "surface": surface, "kind": kind, "name": name, "guild_id": guild_id,
               "trusted": 0, "audience": audience, "updated_at": iso(self.clock.now())}  # fmt: skip
        if conn is not None:
            return _seen(conn, row, self.on_private)
        known = self.info(channel_id)
        if _same(known, row):
            assert known is not None
            return known
        return self.db.write(lambda conn: _seen(conn, row, self.on_private))

    def set_mode(self, channel_id: str, mode: str) -> ChannelInfo:
        checked = parse_mode(mode)
        return self._set(channel_id, "mode", checked)

    def set_trusted(self, channel_id: str, trusted: bool) -> ChannelInfo:
        return self._set(channel_id, "trusted", int(trusted))

    def _set(self, channel_id: str, column: str, value: object) -> ChannelInfo:
        assert column in ("mode", "trusted")  # never a caller-chosen column name
        if not channel_id.strip() or len(channel_id) > 128:
            raise ChannelError("a channel id is 1-128 characters (a Discord channel id, or terminal:<name>)")
        row = {"channel_id": channel_id, column: value, "updated_at": iso(self.clock.now())}

        def txn(conn: Connection) -> ChannelInfo:
            conn.execute(_upserts(conn.dialect.name)[column], row)
            info = _info(conn, channel_id)
            assert info is not None
            return info

        return self.db.write(txn)


def _info(conn: Connection, channel_id: str) -> ChannelInfo | None:
    row = _INFO.run(conn, {"channel_id": channel_id}).first()
    return _row_to_info(row) if row else None


def infos(conn: Connection, channel_ids: Collection[str]) -> dict[str, ChannelInfo]:
    """What the store knows of each of ``channel_ids`` (those it has never seen are left out), in one query."""
    found: dict[str, ChannelInfo] = {}
    ids = sorted(set(channel_ids))
    for start in range(0, len(ids), 500):  # under every engine's limit of bound parameters
        rows = conn.execute(_SELECT.where(_c.channel_id.in_(ids[start : start + 500]))).all()
        found.update((row[0], _row_to_info(row)) for row in rows)
    return found


def channel_label(channel_id: str, info: ChannelInfo | None) -> str:
    """A channel as an operator recognises it, never a message: ``#general`` for a server channel whose name the
    store knows, ``DM with ann`` for a DM, ``terminal (ann)`` for ``impyard chat``'s; else its id."""
    if channel_id.startswith("terminal:"):
        return f"terminal ({channel_id.removeprefix('terminal:')})"
    if info is None or not info.name:
        return channel_id
    return info.name if info.kind != "guild" else f"#{info.name}"


def _seen(conn: Connection, row: dict[str, Any], on_private: BecamePrivate | None) -> ChannelInfo:
    """``seen`` in a write transaction: the upsert only when the surface says something new."""
    known = _info(conn, row["channel_id"])
    if _same(known, row):
        assert known is not None
        return known
    conn.execute(_upserts(conn.dialect.name)["seen"], row)
    info = _info(conn, row["channel_id"])
    assert info is not None
    known_public = known is not None and known.audience is None
    if on_private is not None and known_public and info.audience == PRIVATE and info.kind == "guild":
        # Issue 32 #4, the data half of the upgrade: a channel known before its audience was is private.
        on_private(conn, info.channel_id, info.guild_id)
    return info


def _same(known: ChannelInfo | None, row: dict[str, Any]) -> bool:
    """Whether the surface says nothing new of a channel the host knows."""
    return (
        known is not None
        and (known.surface, known.kind) == (row["surface"], row["kind"])
        and (not row["name"] or known.name == row["name"])
        and (row["guild_id"] is None or known.guild_id == row["guild_id"])
        and (row["audience"] is None or known.audience == row["audience"])
    )


# ------------------------------------------------------------------ a channel in words (`impyard channel ls`, the console)


def trust_words(info: ChannelInfo) -> str:
    """Whether the imp's replies there go out without approval: ``yes (always, dm)`` by its kind, ``yes``, ``no``."""
    if info.kind in ALWAYS_TRUSTED_KINDS:
        return f"yes (always, {info.kind})"
    return "yes" if info.trusted else "no"


def audience_words(info: ChannelInfo) -> str:
    """Who can read a server channel, as Discord last said (issue 32 #4: a private one remembers alone)."""
    if info.kind != "guild":
        return "-"
    return {PUBLIC: "everyone", PRIVATE: "private"}.get(info.audience or "", "not known yet")


def kind_words(info: ChannelInfo) -> str:
    """A listing's kind: a server channel only some members can read is "private" (its audience in full:
    ``channel show``, ``--json``), so a table still fits a narrow terminal."""
    return "private" if info.kind == "guild" and info.audience == PRIVATE else info.kind
