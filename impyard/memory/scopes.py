"""Which memory scopes a session writes and reads (docs/memory.md, issues 23 and 32), and who else is present (10).

Everything the memory engine stores carries the scope it was formed in. Scopes follow who can read
(issue 32 #4): a memory is kept where only the people who could read its channel can meet it again.

* ``guild:<guild id>`` for a server channel that everyone in the server can read (its *public* channels
  share it). A guild channel whose guild the host does not know yet gets ``guild:channel:<channel id>``:
  that channel alone, so a channel of unknown origin never reads another guild's memories.
* ``channel:<channel id>`` for a server channel (or thread) whose audience is narrower than the server's:
  ``channels.audience`` is ``private`` (Discord's permission overwrites, read on the host as each message
  arrives: ``impyard.discord.inbound.audience_of``). It writes only there; it reads there and the server's
  public ``guild:<guild id>`` (everyone who can read the private channel is in the server and can read its
  public channels, so nothing public is news to them). No other session reads a ``channel:`` scope.
* ``dm:<person id>`` for a direct message with that person. A DM whose partner the host has not seen
  speak yet gets ``dm:channel:<channel id>``, the channel alone.
* ``terminal`` for the operator's terminal (and the host's own task channels, which are terminal channels).

A public guild session reads only its guild's public scope. A DM with P reads ``dm:P`` plus ``guild:G``
for every guild G in which P has spoken (the host's history: ``history.author_id`` joined with
``channels.guild_id``; history is trimmed per channel, so a guild whose messages by P were all trimmed away
drops out) — never a ``channel:`` scope: the host cannot tell from its records that P may read a private
channel (having spoken there once does not mean P still may), so it never assumes so. The terminal reads
``terminal``. A task box gets the scopes of its channel: a known guild or DM channel's, else ``terminal``
for the host's task channels. A channel the host has never recorded gets no scopes (``None``: memory off),
so nothing the operator said in the terminal can reach a channel the host knows nothing about.

A guild channel whose audience the host has not learned yet (``audience`` NULL: a channel recorded before
issue 32, not spoken in since) is treated as it was before: the guild's scope. When its audience is first
learned and it is private, its memories move to its own scope once (``impyard.memory.audience``). A memory
keeps its scope when the audience changes later: a private channel turned public does not publish its past,
a public channel turned private keeps its new memories in its own scope.

``decide`` is the rule (pure); ``scopes_of`` / ``resolve`` read the facts from the host database;
``presence`` lists the imp's other live conversations that this session may know about (mechanism 10);
``parse_scope`` checks a scope name an operator typed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection

from box.common.laws import DEFAULTS
from box.protocol.memory import PresenceEntry, SessionMemory
from impyard.channels.store import PRIVATE
from impyard.clock import iso, parse_iso
from impyard.errors import ImpyardError
from impyard.storage.db import Database
from impyard.storage.portable import bytewise
from impyard.storage.tables import channels, history, wakes

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


def channel_scope(channel_id: str) -> str:
    """The scope of a channel whose audience is narrower than its guild's (issue 32 #4)."""
    return f"channel:{channel_id}"


_ID = r"[A-Za-z0-9_.:-]{1,128}"
SCOPE_PATTERN = re.compile(rf"terminal|(?:guild|dm):(?:channel:)?{_ID}|channel:{_ID}")
SCOPE_FORMS = (
    "terminal, guild:<server id>, channel:<channel id> (a private channel or thread), dm:<person id>, "
    "guild:channel:<channel id> or dm:channel:<channel id> (e.g. guild:123456789012345678)"
)


class ScopeNameError(ImpyardError, ValueError):
    """A scope name that is none of the forms the host writes; the message lists them."""


def parse_scope(text: str) -> str:
    """``text`` as a scope name, or ``ScopeNameError`` saying which forms there are."""
    if not isinstance(text, str) or not SCOPE_PATTERN.fullmatch(text):
        raise ScopeNameError(f"{str(text)[:60]!r} is not a memory scope: write {SCOPE_FORMS}")
    return text


def decide(
    kind: str | None,
    channel_id: str,
    guild_id: str | None = None,
    partner_id: str | None = None,
    partner_guilds: Iterable[str] = (),
    audience: str | None = None,
) -> SessionScopes | None:
    """The scopes of a session in a channel of ``kind`` (None: a channel the host has no record of).

    ``audience`` (guild channels): ``"guild"`` everyone in the guild can read it, ``"private"`` fewer can,
    None not known yet (treated as the guild's, as before the host read audiences)."""
    if kind == "guild":
        public = guild_scope(guild_id) if guild_id else f"guild:channel:{channel_id}"
        if audience == PRIVATE:
            own = channel_scope(channel_id)
            return SessionScopes(own, (own, guild_scope(guild_id)) if guild_id else (own,))
        return SessionScopes(public, (public,))
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
_CHANNEL = select(channels.c.kind, channels.c.guild_id, channels.c.audience).where(
    channels.c.channel_id == bindparam("channel_id")
)
_PRESENCE = (
    select(
        wakes.c.channel_id, history.c.author_id, history.c.author_name, history.c.created_at, channels.c.kind,
        channels.c.name, channels.c.guild_id, channels.c.audience,
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
        kind, guild_id, audience = str(row[0]), row[1], row[2]
        partner = dm_partner(conn, channel_id) if kind == "dm" else None
        guilds = guilds_of(conn, partner) if partner else []
        return decide(kind, channel_id, guild_id, partner, guilds, audience)

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
    a guild session never learns that a DM is going on, and a public channel's or a DM's session never that a
    private channel's is (issue 32 #4: its scope is ``channel:<id>``, read by that channel alone). The
    session's own conversation (``channel_id`` with ``person_id``) is left out. Newest first, at most 20.
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
        # The channel's audience now: a conversation in a private channel is its scope's (issue 32 #4).
        scope = decide(kind, chan, guild_id, author if kind == "dm" else None, audience=messages[-1][7])
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
