"""Which memory scopes a session writes and reads (docs/memory.md, issue 23), and who else is present (10).

Everything the memory engine stores carries the scope it was formed in:

* ``guild:<guild id>`` for a server channel (the channels of one guild share it). A guild channel whose
  guild the host does not know yet gets ``guild:channel:<channel id>``: that channel alone, so a channel
  of unknown origin never reads another guild's memories.
* ``dm:<person id>`` for a direct message with that person. A DM whose partner the host has not seen
  speak yet gets ``dm:channel:<channel id>``, the channel alone.
* ``terminal`` for the operator's terminal (and the host's own task channels, which are terminal channels).

A guild session reads only its guild. A DM with P reads ``dm:P`` plus ``guild:G`` for every guild G in
which P has spoken (the host's history: ``history.author_id`` joined with ``channels.guild_id``; history is
trimmed per channel, so a guild whose messages by P were all trimmed away drops out). The terminal reads
``terminal``. A task box gets the scopes of its channel: a known guild or DM channel's, else ``terminal``
for the host's task channels. A channel the host has never recorded gets no scopes (``None``: memory off),
so nothing the operator said in the terminal can reach a channel the host knows nothing about.

``decide`` is the rule (pure); ``scopes_of`` / ``resolve`` read the facts from the host database;
``presence`` lists the imp's other live conversations that this session may know about (mechanism 10).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection

from box.memory.laws import DEFAULTS
from box.protocol.memory import PresenceEntry, SessionMemory
from impyard.clock import iso, parse_iso
from impyard.db import Database
from impyard.portable import bytewise
from impyard.tables import channels, history, wakes

TERMINAL = "terminal"
PRESENCE_LOOKBACK = timedelta(days=1)  # a stretch of talk is traced back at most this far for joined_at
MAX_PRESENCE = 20


@dataclass(frozen=True)
class SessionScopes:
    """The scope a session writes and the scopes it reads; the writes scope is always among the reads."""

    writes: str
    reads: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.writes:
            raise ValueError("a session writes one named scope")
        reads = tuple(dict.fromkeys((self.writes, *self.reads)))  # writes first, no duplicates
        object.__setattr__(self, "reads", reads)

    def session_memory(self) -> SessionMemory:
        """What ``box.init`` tells the box (``BoxInitParams.memory``)."""
        return SessionMemory(writes=self.writes, reads=list(self.reads))


def guild_scope(guild_id: str) -> str:
    return f"guild:{guild_id}"


def dm_scope(person_id: str) -> str:
    return f"dm:{person_id}"


def decide(
    kind: str | None,
    channel_id: str,
    guild_id: str | None = None,
    partner_id: str | None = None,
    partner_guilds: Iterable[str] = (),
) -> SessionScopes | None:
    """The scopes of a session in a channel of ``kind`` (None: a channel the host has no record of)."""
    if kind == "guild":
        scope = guild_scope(guild_id) if guild_id else f"guild:channel:{channel_id}"
        return SessionScopes(scope, (scope,))
    if kind == "dm":
        if not partner_id:
            scope = f"dm:channel:{channel_id}"
            return SessionScopes(scope, (scope,))
        guilds = sorted({g for g in partner_guilds if g})
        return SessionScopes(dm_scope(partner_id), (dm_scope(partner_id), *map(guild_scope, guilds)))
    if kind in ("terminal", "task"):
        return SessionScopes(TERMINAL, (TERMINAL,))
    return None


# ------------------------------------------------------------------ facts from the host database


_DM_PARTNER = (
    select(history.c.author_id)
    .where(
        history.c.channel_id == bindparam("channel_id"),
        history.c.from_imp.is_(None),
        history.c.author_bot == 0,
    )
    .order_by(history.c.seq.desc())
    .limit(1)
)
_GUILDS_OF = (
    select(channels.c.guild_id)
    .distinct()
    .select_from(history.join(channels, channels.c.channel_id == history.c.channel_id))
    .where(
        history.c.author_id == bindparam("person_id"), history.c.from_imp.is_(None), channels.c.kind == "guild",
        channels.c.guild_id.is_not(None),
    )
)  # fmt: skip
_CHANNEL = select(channels.c.kind, channels.c.guild_id).where(
    channels.c.channel_id == bindparam("channel_id")
)
_PRESENCE = (
    select(
        wakes.c.channel_id, history.c.author_id, history.c.author_name, history.c.created_at, channels.c.kind,
        channels.c.name, channels.c.guild_id,
    )
    .select_from(
        wakes.join(history, (history.c.channel_id == wakes.c.channel_id) & (history.c.message_id == wakes.c.message_id))
        .join(channels, channels.c.channel_id == wakes.c.channel_id)
    )
    .where(
        wakes.c.imp == bindparam("imp"), history.c.from_imp.is_(None),
        bytewise(history.c.created_at) >= bindparam("since"),
    )
    .order_by(bytewise(history.c.created_at), history.c.seq)
)  # fmt: skip


def dm_partner(conn: Connection, channel_id: str) -> str | None:
    """The person on the other side of a DM: the latest author there who is not an imp."""
    row = conn.execute(_DM_PARTNER, {"channel_id": channel_id}).first()
    return str(row[0]) if row else None


def guilds_of(conn: Connection, person_id: str) -> list[str]:
    """The guilds in whose channels ``person_id`` has spoken (as far as the host's history goes)."""
    return sorted(str(r[0]) for r in conn.execute(_GUILDS_OF, {"person_id": person_id}))


def scopes_of(db: Database, imp: str, channel_id: str) -> SessionScopes | None:
    """The scopes of ``imp``'s session in ``channel_id``, from the channels table and history (blocking)."""
    del imp  # scopes depend on the channel and its people, the same for every imp; the store keys by imp

    def read(conn: Connection) -> SessionScopes | None:
        row = conn.execute(_CHANNEL, {"channel_id": channel_id}).first()
        if row is None:
            return None
        kind, guild_id = str(row[0]), row[1]
        partner = dm_partner(conn, channel_id) if kind == "dm" else None
        guilds = guilds_of(conn, partner) if partner else []
        return decide(kind, channel_id, guild_id, partner, guilds)

    return db.read(read)


async def resolve(db: Database, imp: str, channel_id: str) -> SessionScopes | None:
    """``scopes_of`` on a database worker thread: call it when the box starts, before ``box.init``."""
    return await db.run(scopes_of, db, imp, channel_id)


# ------------------------------------------------------------------ presence (mechanism 10)


def _label(kind: str, name: str) -> str:
    if kind == "dm":
        return "a direct message"
    if kind in ("terminal", "task"):
        return "the terminal"
    return f"#{name}" if name else "a server channel"


def presence(
    db: Database,
    imp: str,
    *,
    channel_id: str,
    person_id: str | None,
    scopes: SessionScopes,
    now: datetime,
    stale_s: float = DEFAULTS.presence_stale_seconds,
) -> list[PresenceEntry]:
    """Mechanism 10: the imp's other live conversations that this session may know about (blocking).

    A conversation is one person's talk with the imp in one channel, from the ``wakes`` and ``history``
    tables: ``joined_at`` is the first message of its current stretch (no gap over ``stale_s``),
    ``last_input_at`` its latest, ``turns`` the messages in the stretch that woke the imp. It is live when
    its last input is at most ``stale_s`` old, and listed only when its scope is one this session reads:
    a guild session never learns that a DM is going on. The session's own conversation (``channel_id``
    with ``person_id``) is left out. Newest first, at most 20.
    """
    params = {"imp": imp, "since": iso(now - PRESENCE_LOOKBACK)}
    rows = db.read(lambda conn: conn.execute(_PRESENCE, params).all())
    talks: dict[tuple[str, str], list[Any]] = {}  # rows of _PRESENCE
    for row in rows:
        talks.setdefault((str(row[0]), str(row[1])), []).append(row)
    entries: list[PresenceEntry] = []
    for (chan, author), messages in talks.items():
        if chan == channel_id and author == person_id:
            continue
        times = [parse_iso(str(m[3])) for m in messages]
        last = times[-1]
        if (now - last).total_seconds() > stale_s:
            continue
        kind, name, guild_id = str(messages[-1][4]), str(messages[-1][5] or ""), messages[-1][6]
        scope = decide(kind, chan, guild_id, author if kind == "dm" else None)
        if scope is None or scope.writes not in scopes.reads:
            continue
        start = len(times) - 1
        while start > 0 and (times[start] - times[start - 1]).total_seconds() <= stale_s:
            start -= 1
        entries.append(
            PresenceEntry(
                person=str(messages[-1][2]),
                channel=_label(kind, name),
                joined_at=times[start],
                last_input_at=last,
                turns=len(times) - start,
            )
        )
    entries.sort(key=lambda e: e.last_input_at, reverse=True)
    return entries[:MAX_PRESENCE]
