"""Constructs (issue 14; mechanisms 74-77, 81-86): the imp's own thoughts, beliefs, decisions, goals and dreams.

A construct is formed in the session's writes scope and compared only with the constructs of its own kind
there (75, 82): a recurring one is felt again instead of written twice. Formed with ``slot``, it is brought
to mind (``impyard.memory.slot``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np
from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection, RowMapping

from box.common import laws
from box.protocol.memory import ConstructParams, SlotEntry
from impyard.clock import iso, parse_iso
from impyard.memory import generations, slot
from impyard.memory.records import REFEEL, SELF, insert_record
from impyard.memory.vectors import normalised, unpack_many
from impyard.storage.db import Database
from impyard.storage.portable import bytewise
from impyard.storage.tables import memory_records as _R

_TWINS = (
    select(_R.c.id, _R.c.intensity, _R.c.valence, _R.c.last_felt, _R.c.statement, _R.c.vector)
    .where(
        _R.c.imp == bindparam("imp"), _R.c.scope == bindparam("scope"), _R.c.kind == "construct",
        _R.c.construct_kind == bindparam("construct_kind"), _R.c.dims == bindparam("dims"), _R.c.vector.is_not(None),
    )
    .order_by(bytewise(_R.c.last_felt).desc(), _R.c.gen.desc())
)  # fmt: skip


def twin(
    conn: Connection, imp: str, scope: str, construct_kind: str, vector: Sequence[float] | None
) -> RowMapping | None:
    """Mechanisms 75, 82 (subtle point 12): the construct of the same kind in ``scope`` most like
    ``vector``, if its cosine is at least ``construct_duplicate``; vectors of another length never compare."""
    if vector is None:
        return None
    query = normalised(vector)
    params = {"imp": imp, "scope": scope, "construct_kind": construct_kind, "dims": int(query.size)}
    rows = conn.execute(_TWINS, params).mappings().all()
    if not rows:
        return None
    matrix = unpack_many(int(query.size), [bytes(row["vector"]) for row in rows])
    norms = np.linalg.norm(matrix, axis=1)
    cosines = (matrix @ query) / np.where(norms > 0, norms, 1.0)
    best = int(np.argmax(cosines))  # the most recently felt of equals
    return rows[best] if float(cosines[best]) >= laws.DEFAULTS.construct_duplicate else None


def construct(
    db: Database, imp: str, scope: str, params: ConstructParams, now: datetime
) -> tuple[str, bool, str | None, list[SlotEntry]]:
    """Mechanisms 74-77, 81-86: form a construct in ``scope``, atomically, and bring it to mind.

    Compared only with the constructs of its kind in the scope (cosine ≥ 0.90, same length): a recurring
    thought is re-felt toward ``intensity`` (75); a duplicate of another kind gains +0.1 (max 1) without
    fading first (82); both are felt now and not written again. Otherwise a construct record is written:
    author Self, origin lived. With ``slot`` it is activated in the scope's slot.
    Returns (record id, created, the earlier one's statement when it was not created, the slot).
    """

    def write(conn: Connection) -> tuple[str, bool, str | None, list[SlotEntry]]:
        generations.lock(conn, [(imp, scope)])  # the twin and the slot are decided locked
        earlier = twin(conn, imp, scope, params.construct_kind, params.vector)
        gen = generations.bump(conn, imp, scope)
        previous: str | None = None
        if earlier is not None:
            record_id, previous = str(earlier["id"]), earlier["statement"]
            stored = float(earlier["intensity"])
            if params.construct_kind == "thought":  # mechanism 75: settle, then close 0.6 toward now
                intensity = laws.refelt(
                    stored, float(earlier["valence"]), parse_iso(earlier["last_felt"]), now, params.intensity
                )
            else:  # mechanism 82: +0.1 on the stored intensity, no settling first
                intensity = min(1.0, stored + laws.DEFAULTS.construct_reinforcement)
            conn.execute(REFEEL, {"intensity": intensity, "at": iso(now), "gen": gen, "rid": record_id})
        else:
            record_id = insert_record(
                conn, imp=imp, scope=scope, gen=gen, kind="construct",
                construct_kind=params.construct_kind, origin="lived", author=SELF, author_id=None,
                feeling=params.feeling, conclusion=params.conclusion, valence=params.valence,
                intensity=params.intensity, happened_at=now, last_felt=now, vector=params.vector, now=now,
                statement=params.statement,
            )  # fmt: skip
        if params.slot:
            kept = slot.activated(conn, imp, scope, record_id, now)
        else:
            kept = slot.held(conn, imp, scope, now)
        return record_id, earlier is None, previous, slot.entries(conn, imp, scope, kept, now)

    return generations.locked(db, write)
