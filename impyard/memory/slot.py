"""The slot (issue 14; mechanisms 84-88): the constructs an imp holds in mind, kept per imp **and scope**
(``memory_slots``) and changed only through the pure law of ``box.common.slot``.

Every change is decided with the scope's generation row locked (``generations.lock``). As loaded (87), a
construct a week unrefreshed, deleted or over the slot's size leaves it, and the stored slot follows.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import and_, bindparam, delete, insert, select
from sqlalchemy.engine import Connection

from box.common import slot as slot_law
from box.protocol.memory import SlotEntry
from impyard.clock import iso, parse_iso
from impyard.memory import generations, lookups
from impyard.memory.reach import Reach
from impyard.memory.records import record_view
from impyard.storage.db import Database
from impyard.storage.tables import memory_records as _R
from impyard.storage.tables import memory_slots as _S

INSERT_SLOT = insert(_S)
_found = _R.alias("r")
_HELD = (
    select(_S.c.record_id, _S.c.activated_at, _found.c.id.label("found"), _found.c.construct_kind, _found.c.intensity)
    .select_from(
        _S.outerjoin(
            _found,
            and_(
                _found.c.id == _S.c.record_id, _found.c.imp == _S.c.imp, _found.c.scope == _S.c.scope,
                _found.c.kind == "construct",
            ),
        )
    )
    .where(_S.c.imp == bindparam("imp"), _S.c.scope == bindparam("scope"))
)  # fmt: skip
_SLOT_SCOPES = select(_S.c.scope).distinct().where(_S.c.imp == bindparam("imp"))
_CLEAR_SLOT = delete(_S).where(_S.c.imp == bindparam("imp"), _S.c.scope == bindparam("scope"))
_CONSTRUCT = select(_R.c.construct_kind, _R.c.intensity).where(
    _R.c.id == bindparam("rid"), _R.c.imp == bindparam("imp"), _R.c.scope == bindparam("scope"),
    _R.c.kind == "construct",
)  # fmt: skip


def _stored(conn: Connection, imp: str, scope: str) -> tuple[list[slot_law.Held], set[str]]:
    """The slot of (imp, scope) as stored, and which of its constructs are still in the store."""
    rows = conn.execute(_HELD, {"imp": imp, "scope": scope}).mappings().all()
    stored = [
        slot_law.Held(
            str(row["record_id"]), str(row["construct_kind"] or "thought"), float(row["intensity"] or 0.0),
            parse_iso(row["activated_at"]),
        )
        for row in rows
    ]  # fmt: skip
    return stored, {str(row["record_id"]) for row in rows if row["found"] is not None}


def held(conn: Connection, imp: str, scope: str, now: datetime) -> list[slot_law.Held]:
    """Mechanisms 87-88: the slot of (imp, scope) as loaded; rows that left it are deleted."""
    stored, existing = _stored(conn, imp, scope)
    kept = slot_law.loaded(stored, now, existing)
    if len(kept) != len(stored):
        write(conn, imp, scope, kept)
    return kept


def write(conn: Connection, imp: str, scope: str, kept: Sequence[slot_law.Held]) -> None:
    """The stored slot of (imp, scope) made ``kept``."""
    conn.execute(_CLEAR_SLOT, {"imp": imp, "scope": scope})
    if kept:
        conn.execute(
            INSERT_SLOT,
            [
                {"imp": imp, "scope": scope, "record_id": h.id, "activated_at": iso(h.activated_at)}
                for h in kept
            ],
        )


def activated(conn: Connection, imp: str, scope: str, record_id: str, now: datetime) -> list[slot_law.Held]:
    """Mechanisms 84-86: the slot after the construct ``record_id`` (in ``scope``) is brought to mind."""
    before = held(conn, imp, scope, now)
    row = conn.execute(_CONSTRUCT, {"rid": record_id, "imp": imp, "scope": scope}).first()
    if row is None:
        return before
    after = slot_law.activate(before, slot_law.Held(record_id, str(row[0]), float(row[1]), now))
    if after != before:
        write(conn, imp, scope, after)
    return after


def entries(
    conn: Connection,
    imp: str,
    scope: str,
    kept: Sequence[slot_law.Held],
    now: datetime,
    *,
    operator: bool = False,
) -> list[SlotEntry]:
    """The held constructs as the box sees them (felt now), oldest activation first."""
    rows = {r["id"]: r for r in lookups.records_by_id(conn, Reach(imp, (scope,)), [h.id for h in kept])}
    return [
        SlotEntry(record=record_view(rows[h.id], now, False, operator=operator), activated_at=h.activated_at)
        for h in slot_law.ordered(kept)
        if h.id in rows
    ]


def load(db: Database, imp: str, scope: str, now: datetime) -> list[SlotEntry]:
    """Mechanisms 87-88: the scope's slot as loaded now, oldest activation first; what left it (a week
    unrefreshed, deleted, over size) is dropped from the stored slot."""

    def change(conn: Connection) -> list[SlotEntry]:
        generations.lock(conn, [(imp, scope)])  # what leaves the slot is decided locked
        return entries(conn, imp, scope, held(conn, imp, scope, now), now)

    return generations.locked(db, change)


def refresh(db: Database, imp: str, scope: str, record_ids: Sequence[str], now: datetime) -> list[SlotEntry]:
    """Mechanism 86: held constructs brought to mind again get activated now; other ids are ignored."""

    def change(conn: Connection) -> list[SlotEntry]:
        generations.lock(conn, [(imp, scope)])
        before = held(conn, imp, scope, now)
        after = list(before)
        for record_id in dict.fromkeys(record_ids):
            twin = next((h for h in after if h.id == record_id), None)
            if twin is not None:
                after = slot_law.activate(after, slot_law.Held(twin.id, twin.kind, twin.intensity, now))
        if after != before:
            write(conn, imp, scope, after)
        return entries(conn, imp, scope, after, now)

    return generations.locked(db, change)


def view(db: Database, imp: str, scope: str | None, now: datetime) -> list[tuple[str, SlotEntry]]:
    """``impyard memory slot``: what ``imp`` holds in mind in each scope (or ``scope``), as it would be loaded
    now (87); read only: nothing is dropped here. Each entry's record is a ``StoredRecord``."""

    def read(conn: Connection) -> list[tuple[str, SlotEntry]]:
        if scope is None:
            scopes = sorted(str(r[0]) for r in conn.execute(_SLOT_SCOPES, {"imp": imp}))
        else:
            scopes = [scope]
        shown: list[tuple[str, SlotEntry]] = []
        for where in scopes:
            stored, existing = _stored(conn, imp, where)
            kept = slot_law.loaded(stored, now, existing)
            shown.extend((where, entry) for entry in entries(conn, imp, where, kept, now, operator=True))
        return shown

    return db.read(read)
