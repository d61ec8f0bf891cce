"""The one-time move of a private channel's memories into its own scope (issue 32 #4; docs/memory.md).

Before issue 32 every channel of a server wrote the server's scope, ``guild:<guild id>``, private ones
included. The host now records each channel's audience (``channels.audience``, revision 0005) as its messages
arrive; a row written before that revision starts NULL, "not known yet". The first time a channel that the
host already knew is found ``private``, :func:`move_to_own_scope` runs in the same transaction that records
the audience (``ChannelStore.seen``): every memory formed in that channel leaves the server's scope for
``channel:<channel id>``, where only that channel's sessions read it. It runs once per channel: the audience
never becomes NULL again, and a later change of audience moves nothing (a memory keeps the scope it was
formed in).

What moves, for every imp: each record in the server's scope (or ``guild:channel:<channel id>``, the scope of
a channel whose server was not known) with at least one moment (episode) said in the channel, whole — with
all its episodes, even those from elsewhere (a night may have folded moments of two channels into one
record: it goes where the narrower audience is, never the wider) — its place in the slot, and the channel's
saved conversations. What cannot move: the imp's own thoughts formed with no moment of their own
(constructs from a reflection), which record no channel; before issue 32 they were formed over the whole
server scope anyway. Each scope touched has its generation moved on as a deletion, so every host's vector
cache loads both again whole.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sqlalchemy import bindparam, select, update
from sqlalchemy.engine import Connection

from impyard.memory import generations
from impyard.memory.scopes import channel_scope, guild_scope
from impyard.storage.tables import (
    memory_conversations,
    memory_episodes,
    memory_records,
    memory_slots,
)

log = logging.getLogger("impyard.memory.audience")

_R, _E, _C, _S = memory_records, memory_episodes, memory_conversations, memory_slots
_CHUNK = 500

_FORMED_IN = (
    select(_E.c.record_id, _E.c.imp, _E.c.scope)
    .distinct()
    .where(_E.c.channel_id == bindparam("channel_id"), _E.c.scope.in_(bindparam("sources", expanding=True)))
)
_MOVE_RECORDS = (
    update(_R)
    .where(_R.c.id.in_(bindparam("ids", expanding=True)), _R.c.imp == bindparam("b_imp"),
           _R.c.scope == bindparam("source"))
    .values(scope=bindparam("dest"))
)  # fmt: skip
_MOVE_EPISODES = (
    update(_E)
    .where(_E.c.record_id.in_(bindparam("ids", expanding=True)), _E.c.imp == bindparam("b_imp"))
    .values(scope=bindparam("dest"))
)
_MOVE_SLOTS = (
    update(_S)
    .where(_S.c.record_id.in_(bindparam("ids", expanding=True)), _S.c.imp == bindparam("b_imp"),
           _S.c.scope == bindparam("source"))
    .values(scope=bindparam("dest"))
)  # fmt: skip
_CONVERSATION_IMPS = (
    select(_C.c.imp, _C.c.scope)
    .distinct()
    .where(_C.c.channel_id == bindparam("b_channel"), _C.c.scope.in_(bindparam("sources", expanding=True)))
)
_MOVE_CONVERSATIONS = (
    update(_C)
    .where(_C.c.channel_id == bindparam("b_channel"), _C.c.scope.in_(bindparam("sources", expanding=True)))
    .values(scope=bindparam("dest"))
)


def sources(channel_id: str, guild_id: str | None) -> list[str]:
    """The scopes a guild channel wrote before its audience was known."""
    found = [guild_scope(guild_id)] if guild_id else []
    return [*found, f"guild:channel:{channel_id}"]


def _chunks(ids: Sequence[str]) -> list[list[str]]:
    return [list(ids[i : i + _CHUNK]) for i in range(0, len(ids), _CHUNK)]


def move_to_own_scope(conn: Connection, channel_id: str, guild_id: str | None) -> dict[str, int]:
    """Move what was formed in ``channel_id`` to ``channel:<channel_id>`` (in the caller's write transaction).

    Returns the counts: records, episodes, conversations moved."""
    dest = channel_scope(channel_id)
    froms = sources(channel_id, guild_id)
    by_scope: dict[tuple[str, str], list[str]] = {}
    for record_id, imp, scope in conn.execute(_FORMED_IN, {"channel_id": channel_id, "sources": froms}):
        by_scope.setdefault((str(imp), str(scope)), []).append(str(record_id))
    touched: set[tuple[str, str]] = set()
    for imp, source in by_scope:
        touched |= {(imp, source), (imp, dest)}
    for imp, scope in conn.execute(_CONVERSATION_IMPS, {"b_channel": channel_id, "sources": froms}).all():
        touched |= {(str(imp), str(scope)), (str(imp), dest)}
    # The generation rows first, in the store's one order (imp, then scope): its writers lock them first too.
    for imp, scope in sorted(touched):
        generations.bump(conn, imp, scope, deleted=True)  # a deletion: caches load both scopes again whole
    counts = {"records": 0, "episodes": 0, "conversations": 0}
    for (imp, source), ids in sorted(by_scope.items()):
        for chunk in _chunks(sorted(set(ids))):
            where = {"ids": chunk, "b_imp": imp, "source": source, "dest": dest}
            counts["records"] += conn.execute(_MOVE_RECORDS, where).rowcount
            counts["episodes"] += conn.execute(_MOVE_EPISODES, where).rowcount
            conn.execute(_MOVE_SLOTS, where)
    counts["conversations"] = conn.execute(
        _MOVE_CONVERSATIONS, {"b_channel": channel_id, "sources": froms, "dest": dest}
    ).rowcount
    if any(counts.values()):
        log.info(
            "channel %s is private: its memories moved to %s (%d records, %d moments, %d conversations)",
            channel_id, dest, counts["records"], counts["episodes"], counts["conversations"],
        )  # fmt: skip
    return counts
