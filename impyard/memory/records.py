"""Records and their episodes (mechanisms 116-117): the rows, their views, and how they are written,
re-felt and deleted.

Records and episodes are separate tables (mechanism 116): an episode belongs to exactly one record, and a
record has no event of its own; its valence is written once and never updated (117). Fading happens at
read time with ``box.common.laws`` on the host's clock (67, 122); re-feeling writes the faded strength
restored toward the new one, and ``last_felt = now`` always (69, 70).

The record text that names are matched against (mechanism 15, ``row_text``): the conclusion for a lived
record; for a construct its statement and its conclusion (the statement is what it believes, decides or
wants, mechanism 83: "I believe: <statement>"). Names are matched in it as written (a name counts only
written as one, issue 32); its lowercased copy ``mention_text`` (``record_text``) is only a ``LIKE``
prefilter. uuid4-hex ids and fixed-width ISO-8601 UTC text times.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, delete, func, insert, select, update
from sqlalchemy.engine import Connection, RowMapping

from box.common import laws
from box.protocol.memory import EpisodeView, RecordView, Restore
from impyard.clock import iso, parse_iso
from impyard.memory import generations
from impyard.memory.reach import Reach, per_reach
from impyard.memory.vectors import pack, unpack
from impyard.storage.tables import memory_episodes as _E
from impyard.storage.tables import memory_records as _R

SELF = "Self"  # the author of a given record (mechanism 115)

RECORD_NAMES = (
    "id", "kind", "construct_kind", "origin", "author", "author_id", "feeling", "conclusion", "valence", "intensity",
    "happened_at", "last_felt", "dims", "vector", "scope", "gen", "statement",
)  # fmt: skip
EPISODE_NAMES = (
    "id", "record_id", "author", "author_id", "message_id", "as_happened", "told", "channel_id", "happened_at",
)  # fmt: skip
RECORD_COLUMNS = tuple(_R.c[name] for name in RECORD_NAMES)
EPISODE_COLUMNS = tuple(_E.c[name] for name in EPISODE_NAMES)
# The columns a view takes as they are stored; the rest are computed (``record_view``, ``episode_view``).
_RECORD_AS_STORED = ("id", "kind", "construct_kind", "origin", "author", "author_id", "feeling", "conclusion",
                     "statement")  # fmt: skip
_EPISODE_AS_STORED = tuple(name for name in EPISODE_NAMES if name != "happened_at")

INSERT_RECORD = insert(_R)
INSERT_EPISODE = insert(_E)
REFEEL = (
    update(_R)
    .where(_R.c.id == bindparam("rid"))
    .values(intensity=bindparam("intensity"), last_felt=bindparam("at"), gen=bindparam("gen"))
)
_EPISODE_OWNER = select(_E.c.record_id, _E.c.imp, _E.c.scope).where(_E.c.id == bindparam("eid"))
_DELETE_EPISODE = delete(_E).where(_E.c.id == bindparam("eid"))
_EPISODES_LEFT = select(func.count()).select_from(_E).where(_E.c.record_id == bindparam("rid"))
_RECORD_OWNER = select(_R.c.imp, _R.c.scope).where(_R.c.id == bindparam("rid"))
_DELETE_EPISODES_OF = delete(_E).where(_E.c.record_id == bindparam("rid"))
_DELETE_RECORD = delete(_R).where(_R.c.id == bindparam("rid"))


def new_id() -> str:
    return uuid.uuid4().hex


def record_text(conclusion: str, statement: str | None = None) -> str:
    """The lowercased text a record's names are matched in (see the module doc)."""
    return (f"{statement} {conclusion}" if statement else conclusion).lower()


def row_text(row: RowMapping) -> str:
    """A row's text for a whole-word name check: its conclusion, after a construct's statement."""
    statement = row["statement"]
    return f"{statement} {row['conclusion']}" if statement else str(row["conclusion"])


def like_pattern(name: str) -> str:
    """A ``LIKE … ESCAPE '\\'`` pattern finding ``name`` anywhere, its % and _ taken literally."""
    escaped = name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


class StoredRecord(RecordView):
    """A record as the operator sees it: with its scope (a box's views leave it out: it knows its own)."""

    scope: str


def _as_stored(row: RowMapping, names: Sequence[str]) -> dict[str, Any]:
    """The view fields a row holds as they are (the one row-to-view mapping of records and episodes)."""
    return {name: row[name] for name in names}


def record_view(row: RowMapping, now: datetime, with_vector: bool, *, operator: bool = False) -> RecordView:
    """The row as a box sees it; for the operator (``operator``), a ``StoredRecord`` with its scope."""
    last_felt = parse_iso(row["last_felt"])
    valence, intensity = float(row["valence"]), float(row["intensity"])
    vector = (
        unpack(int(row["dims"]), bytes(row["vector"])).tolist() if with_vector and row["vector"] else None
    )
    fields = _as_stored(row, _RECORD_AS_STORED) | dict(
        valence=valence,
        intensity=intensity,
        felt=laws.felt_strength(intensity, valence, last_felt, now),  # mechanism 67, at the host's now
        happened_at=parse_iso(row["happened_at"]),
        last_felt=last_felt,
        vector=vector,
    )
    return StoredRecord(scope=row["scope"], **fields) if operator else RecordView(**fields)


def episode_view(row: RowMapping) -> EpisodeView:
    return EpisodeView(**_as_stored(row, _EPISODE_AS_STORED), happened_at=parse_iso(row["happened_at"]))


def insert_record(
    conn: Connection,
    *,
    imp: str,
    scope: str,
    gen: int,
    kind: str,
    construct_kind: str | None,
    origin: str,
    author: str,
    author_id: str | None,
    feeling: str,
    conclusion: str,
    valence: float,
    intensity: float,
    happened_at: datetime,
    last_felt: datetime,
    vector: Sequence[float] | None,
    now: datetime,
    statement: str | None = None,
) -> str:
    """A new record in ``scope`` at generation ``gen`` (the caller bumped it); returns its id."""
    record_id = new_id()
    dims, blob = pack(vector) if vector is not None else (0, None)
    conn.execute(
        INSERT_RECORD,
        dict(
            id=record_id, imp=imp, scope=scope, kind=kind, construct_kind=construct_kind, origin=origin,
            author=author, author_id=author_id, feeling=feeling, conclusion=conclusion,
            mention_text=record_text(conclusion, statement), valence=valence, intensity=intensity,
            happened_at=iso(happened_at), last_felt=iso(last_felt), dims=dims, vector=blob, gen=gen,
            created_at=iso(now), statement=statement,
        ),
    )  # fmt: skip
    return record_id


def insert_episode(
    conn: Connection,
    *,
    record_id: str,
    imp: str,
    scope: str,
    gen: int,
    channel_id: str,
    message_id: str | None,
    author: str,
    author_id: str | None,
    as_happened: str,
    told: str | None,
    happened_at: datetime,
    vector: Sequence[float] | None,
) -> str:
    """A new episode of ``record_id`` (in its record's scope) at generation ``gen``; returns its id."""
    episode_id = new_id()
    dims, blob = pack(vector) if vector is not None else (0, None)
    conn.execute(
        INSERT_EPISODE,
        dict(
            id=episode_id, record_id=record_id, imp=imp, scope=scope, channel_id=channel_id,
            message_id=message_id, author=author, author_id=author_id, as_happened=as_happened, told=told,
            happened_at=iso(happened_at), dims=dims, vector=blob, gen=gen,
        ),
    )  # fmt: skip
    return episode_id


@dataclass(frozen=True)
class Deletion:
    """What ``delete_memories`` would take now (``plan_deletion``): read only, so a confirmation can count it."""

    episodes: dict[str, str]  # the episodes named that exist, each with its record's id
    records: tuple[
        str, ...
    ]  # the records that go whole: those named that exist, and those left without an episode
    episode_count: int  # every episode that goes: those named, and the rest of each record that goes
    touched: frozenset[tuple[str, str]]  # the (imp, scope) pairs whose generations move on


def plan_deletion(conn: Connection, episode_ids: set[str], record_ids: set[str]) -> Deletion:
    """What deleting ``episode_ids`` and then ``record_ids`` takes: records left without an episode go too."""
    touched: set[tuple[str, str]] = set()
    owners: dict[str, str] = {}
    for episode_id in sorted(episode_ids):
        row = conn.execute(_EPISODE_OWNER, {"eid": episode_id}).first()
        if row is not None:
            owners[episode_id] = str(row[0])
            touched.add((str(row[1]), str(row[2])))
    named_of: dict[str, int] = {}
    for record_id in owners.values():
        named_of[record_id] = named_of.get(record_id, 0) + 1
    whole = set(record_ids)
    for record_id in sorted(set(named_of) - record_ids):
        if conn.execute(_EPISODES_LEFT, {"rid": record_id}).scalar_one() <= named_of[record_id]:
            whole.add(record_id)
    records: list[str] = []
    episodes = len(owners)
    for record_id in sorted(whole):
        owner = conn.execute(_RECORD_OWNER, {"rid": record_id}).first()
        if owner is None:
            continue
        records.append(record_id)
        episodes += conn.execute(_EPISODES_LEFT, {"rid": record_id}).scalar_one() - named_of.get(record_id, 0)
        touched.add((str(owner[0]), str(owner[1])))
    return Deletion(owners, tuple(records), episodes, frozenset(touched))


def delete_memories(
    conn: Connection, episode_ids: set[str], record_ids: set[str]
) -> tuple[int, int, set[tuple[str, str]]]:
    """Delete episodes, then records (with their episodes), then records left without an episode
    (``plan_deletion``, carried out in the caller's transaction, which locked the scopes first).

    Returns (records, episodes, the (imp, scope) pairs touched); the caller bumps their generations.
    """
    plan = plan_deletion(conn, episode_ids, record_ids)
    episodes = 0
    for episode_id in plan.episodes:
        episodes += conn.execute(_DELETE_EPISODE, {"eid": episode_id}).rowcount
    records = 0
    for record_id in plan.records:
        episodes += conn.execute(_DELETE_EPISODES_OF, {"rid": record_id}).rowcount
        records += conn.execute(_DELETE_RECORD, {"rid": record_id}).rowcount
    return records, episodes, set(plan.touched)


# ------------------------------------------------------------------ re-feeling (mechanisms 65, 66, 69, 70)


def _scopes_of_ids(shape: str) -> Any:
    return (
        select(_R.c.scope)
        .distinct()
        .where(_R.c.id.in_(bindparam("ids", expanding=True)), Reach.criterion(_R, shape))
    )


def _refeel_row(shape: str) -> Any:
    return select(_R.c.intensity, _R.c.valence, _R.c.last_felt, _R.c.scope).where(
        _R.c.id == bindparam("rid"), Reach.criterion(_R, shape)
    )


def restored_scopes(conn: Connection, reach: Reach, items: Sequence[Restore]) -> set[str]:
    """The scopes (within ``reach``) of the records ``items`` name: the rows a restore locks first. A
    record's scope never changes, so reading it before the lock is safe."""
    ids = list(dict.fromkeys(item.record_id for item in items))
    if not ids:
        return set()
    statement = per_reach("scopes_of_ids", reach, _scopes_of_ids)
    return {str(row[0]) for row in conn.execute(statement, reach.params(ids=ids))}


def refeel(
    conn: Connection,
    reach: Reach,
    items: Sequence[Restore],
    now: datetime,
    gens: dict[str, int],
    locked: set[str],
) -> int:
    """Mechanisms 65, 66, 69, 70: each named record in reach re-felt at ``now``; others ignored, not counted.
    ``gens`` (scope -> generation bumped in this transaction) is the caller's, filled in here; ``locked``: the
    scopes the caller locked first (``restored_scopes``): a record read is re-felt from what it holds now."""
    statement = per_reach("refeel", reach, _refeel_row)
    restored = 0
    for item in items:
        row = conn.execute(statement, reach.params(rid=item.record_id)).mappings().first()
        if row is None or str(row["scope"]) not in locked:  # not locked: none (a record's scope is fixed)
            continue
        scope = str(row["scope"])
        if scope not in gens:
            gens[scope] = generations.bump(conn, reach.imp, scope)
        intensity = laws.refelt(
            float(row["intensity"]), float(row["valence"]), parse_iso(row["last_felt"]), now, item.toward
        )
        # valence and happened_at are never written here (mechanisms 70, 117); last_felt is now, always
        conn.execute(
            REFEEL, {"intensity": intensity, "at": iso(now), "gen": gens[scope], "rid": item.record_id}
        )
        restored += 1
    return restored
