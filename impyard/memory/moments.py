"""Moments kept (mechanisms 61-66, 115): a lived moment a session encodes, the records it re-feels, and a
given record the operator writes.

Each is one transaction: the scopes it writes are locked first (``generations.lock``), then what it decides
on is read. An episode of a message deleted meanwhile is refused (``forgetting.message_forgotten``): the
turn keeps nothing of it, whichever of the two came first.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection

from box.protocol.memory import MAX_CONCLUSION_CHARS, EncodeParams, Restore
from impyard.memory import generations
from impyard.memory.errors import MemoryDenied, MemoryForgotten, MemoryInvalid
from impyard.memory.forgetting import message_forgotten
from impyard.memory.reach import Reach, per_reach
from impyard.memory.records import SELF, insert_episode, insert_record, refeel, restored_scopes
from impyard.storage.db import Database
from impyard.storage.tables import memory_records as _R


def _scope_in_reach(shape: str) -> Any:
    return select(_R.c.scope).where(_R.c.id == bindparam("rid"), Reach.criterion(_R, shape))


def encode(
    db: Database, reach: Reach, writes: str, channel_id: str, params: EncodeParams, now: datetime
) -> tuple[str, str]:
    """Mechanisms 61-66: keep one moment, atomically: a new record or a join, its episode, the restores.

    A join names a record this session reads *and* writes (its ``writes`` scope), else it is refused
    (``MemoryDenied``) and nothing is written. Restores of records outside the reach are ignored.
    An episode of a message deleted meanwhile (``forget_message``) is refused (``MemoryForgotten``).
    """
    imp, message_id = reach.imp, params.episode.message_id

    def write(conn: Connection) -> tuple[str, str]:
        if message_id is not None:  # the message's lock, then its mark (``forget_message``)
            generations.lock_message(conn, channel_id, message_id)
            if message_forgotten(conn, channel_id, message_id):
                raise MemoryForgotten(
                    f"memory.encode: message {message_id[:40]!r} was deleted; nothing of it is kept"
                )
        locked = {writes, *restored_scopes(conn, reach, params.restore)}
        generations.lock(conn, [(imp, scope) for scope in locked])
        gens: dict[str, int] = {}
        # A join is decided locked: no other write of the scope is taking the record meanwhile.
        if params.join is not None:
            scope = conn.execute(
                per_reach("scope_of", reach, _scope_in_reach), reach.params(rid=params.join)
            ).scalar()
            if scope != writes:
                raise MemoryDenied(
                    f"memory.encode: no record {params.join[:40]!r} to join in this conversation's scope"
                )
        gens[writes] = generations.bump(conn, imp, writes)
        if params.record is not None:
            new = params.record
            record_id = insert_record(
                conn, imp=imp, scope=writes, gen=gens[writes], kind=new.kind,
                construct_kind=new.construct_kind, origin="kept" if new.lasting else "lived",  # issue 32
                author=new.author, author_id=new.author_id,
                feeling=new.feeling, conclusion=new.conclusion, valence=new.valence, intensity=new.intensity,
                happened_at=now, last_felt=now, vector=new.vector, now=now,
            )  # fmt: skip
        else:
            assert params.join is not None
            record_id = params.join
        episode = params.episode
        episode_id = insert_episode(
            conn, record_id=record_id, imp=imp, scope=writes, gen=gens[writes], channel_id=channel_id,
            message_id=episode.message_id, author=episode.author, author_id=episode.author_id,
            as_happened=episode.as_happened, told=episode.told, happened_at=now, vector=episode.vector,
        )  # fmt: skip
        refeel(conn, reach, params.restore, now, gens, locked)
        return record_id, episode_id

    return generations.locked(db, write)


def restore(db: Database, reach: Reach, items: Sequence[Restore], now: datetime) -> int:
    """Re-feel records within ``reach``; returns how many were (others are ignored)."""

    def write(conn: Connection) -> int:
        locked = restored_scopes(conn, reach, items)
        generations.lock(conn, [(reach.imp, scope) for scope in locked])
        return refeel(conn, reach, items, now, {}, locked)

    return generations.locked(db, write)


def remember(
    db: Database,
    imp: str,
    scope: str,
    event: str,
    valence: float,
    intensity: float,
    age_hours: float,
    vector: Sequence[float] | None,
    now: datetime,
) -> str:
    """Mechanism 115: a given record (author Self, origin given) with one episode, dated ``age_hours`` ago.

    ``happened_at = last_felt = now − age``, so it fades from its past date. Returns the record id.
    """
    event = event.strip()
    if not event or len(event) > MAX_CONCLUSION_CHARS:
        raise MemoryInvalid(f"an event is 1 to {MAX_CONCLUSION_CHARS} characters of text")
    if not -1.0 <= valence <= 1.0 or not 0.0 <= intensity <= 1.0:
        raise MemoryInvalid("valence is between -1 and 1, intensity between 0 and 1")
    if not age_hours >= 0.0:
        raise MemoryInvalid("the age is zero or more hours")
    happened = now - timedelta(hours=age_hours)

    def write(conn: Connection) -> str:  # nothing read: the bump locks the scope's row, first
        gen = generations.bump(conn, imp, scope)
        record_id = insert_record(
            conn, imp=imp, scope=scope, gen=gen, kind="lived", construct_kind=None, origin="given",
            author=SELF, author_id=None, feeling="", conclusion=event, valence=valence, intensity=intensity,
            happened_at=happened, last_felt=happened, vector=vector, now=now,
        )  # fmt: skip
        insert_episode(
            conn, record_id=record_id, imp=imp, scope=scope, gen=gen, channel_id="", message_id=None,
            author=SELF, author_id=None, as_happened=event, told=event, happened_at=happened, vector=vector,
        )  # fmt: skip
        return record_id

    return generations.locked(db, write)
