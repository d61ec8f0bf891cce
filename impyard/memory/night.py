"""The night (issue 15; mechanisms 107-114): what a scope lived since waking, folded and forgotten.

The pure rules (``protected``, ``anchor_refusal``, ``member_refusal``, ``combined_intensity``, ``forgets``)
decide; ``consolidate_scope`` and ``forget_scope`` apply them within one scope, checking every rule again
under the scope's lock whatever the box's plan says. Compaction of the file afterwards is ``compact``'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from functools import partial

from sqlalchemy import bindparam, delete, func, select, update
from sqlalchemy.engine import Connection, RowMapping

from box.common import laws
from box.protocol.memory import ConsolidateResult, RecordView
from impyard.clock import iso, parse_iso
from impyard.memory import generations, lookups
from impyard.memory.reach import Reach
from impyard.memory.records import record_view
from impyard.storage.db import Database
from impyard.storage.portable import bytewise
from impyard.storage.tables import memory_episodes as _E
from impyard.storage.tables import memory_records as _R

CHUNK = 500  # ids in one IN (…)
# Records forgotten per transaction: short enough not to hold the database long from other writers, large
# enough that the pages a batch dirties are written a few times, not once per record.
FORGET_BATCH = 2000


# ------------------------------------------------------------------ the night's rules (pure)


def protected(kind: str, origin: str) -> bool:
    """Mechanism 113: constructs and given records are never absorbed and never forgotten. Nor are kept
    records (issue 32, a departure from the seed: docs/memory.md "Keeping"): what someone told the imp that
    a friend would still know months on is not lost with the small talk around it."""
    return kind == "construct" or origin in ("given", "kept")


def anchor_refusal(
    kind: str, origin: str, intensity: float, params: laws.Params = laws.DEFAULTS
) -> str | None:
    """Mechanisms 108, 113 (subtle point 16): why a record cannot anchor a group, or None when it can: it
    must not be a construct and its stored intensity must be at least ``anchor_minimum`` (a given record
    may anchor)."""
    if kind == "construct":
        return "a construct"
    if origin == "kept":  # issue 32: small talk folded into a kept record would never fade
        return "kept"
    if intensity < params.anchor_minimum:
        return f"weaker than {params.anchor_minimum:g}"
    return None


def member_refusal(
    record_id: str,
    kind: str,
    origin: str,
    intensity: float,
    *,
    anchor: str,
    anchor_intensity: float,
    absorbed: set[str] | frozenset[str] = frozenset(),
) -> str | None:
    """Mechanisms 108, 113 (subtle point 16): why a record cannot be folded into ``anchor``, or None: it
    must not be protected, must not be the anchor, must not be stronger (stored intensity) than the anchor
    and must not have been absorbed already."""
    if protected(kind, origin):
        return "protected"
    if record_id == anchor:
        return "the anchor itself"
    if intensity > anchor_intensity:
        return "stronger than the anchor"
    if record_id in absorbed:
        return "absorbed already"
    return None


def combined_intensity(intensities: Iterable[float]) -> float:
    """Mechanism 110: 1 − Π(1 − I) over the anchor and its members (within 0 and 1)."""
    left = 1.0
    for intensity in intensities:
        left *= 1.0 - min(1.0, max(0.0, intensity))
    return 1.0 - left


def forgets(
    kind: str,
    origin: str,
    intensity: float,
    last_felt: datetime,
    now: datetime,
    params: laws.Params = laws.DEFAULTS,
) -> bool:
    """Mechanisms 112-113 (subtle points 6, 17): whether sleep deletes a record: its **stored** intensity is
    below the threshold for its age since it was last felt; protected records never are."""
    if protected(kind, origin):
        return False
    age_days = (now - last_felt).total_seconds() / laws.DAY_S
    return intensity < laws.forgetting_threshold(age_days, params)


def chunks(ids: Sequence[str]) -> Iterator[list[str]]:
    """``ids`` in lists of ``CHUNK``: one ``IN (…)`` each, well under either engine's bound on parameters."""
    for start in range(0, len(ids), CHUNK):
        yield list(ids[start : start + CHUNK])


# ------------------------------------------------------------------ the night on the store


def night_records(
    db: Database, imp: str, scope: str, since: datetime, now: datetime, k: int = 200, episodes: int = 6
) -> list[RecordView]:
    """Mechanism 107 (subtle point 16): ``scope``'s records that happened at or after ``since`` (the
    imp's waking), newest first, at most ``k``, each with its newest ``episodes``; constructs and given
    records come too (the box marks them protected)."""
    reach = Reach(imp, (scope,))

    def read(conn: Connection) -> list[RecordView]:
        rows = lookups.records(
            conn, reach, bytewise(_R.c.happened_at) >= iso(since),
            order=(bytewise(_R.c.happened_at).desc(), _R.c.gen.desc(), bytewise(_R.c.id)), limit=k,
        )  # fmt: skip
        return lookups.with_episodes(conn, reach, [record_view(r, now, False) for r in rows], episodes)

    return db.read(read)


def consolidate_scope(
    db: Database, imp: str, scope: str, groups: Sequence[tuple[str, Sequence[str]]]
) -> ConsolidateResult:
    """Mechanisms 108-111, 113, in one transaction, within ``scope`` only: each group's anchor and
    members are checked here whatever the plan says (``anchor_refusal``, ``member_refusal``); a group
    left with no member is skipped. The members' episodes are re-filed under the anchor (109), the
    anchor's stored intensity becomes ``combined_intensity`` (110), the members are deleted. No text,
    valence or time changes (111). ``refused`` counts each refused anchor (its whole group) and member.
    """
    one = select(_R.c.id, _R.c.kind, _R.c.origin, _R.c.intensity).where(
        _R.c.id == bindparam("rid"), _R.c.imp == imp, _R.c.scope == scope
    )

    def write(conn: Connection) -> ConsolidateResult:  # everything below is per run: PostgreSQL may retry
        generations.lock(conn, [(imp, scope)])  # the rows below are read as no other write leaves them
        applied = absorbed_n = moved = refused = 0
        absorbed: set[str] = set()
        gen: int | None = None

        def row_of(record_id: str) -> RowMapping | None:
            return conn.execute(one, {"rid": record_id}).mappings().first()

        for anchor_id, member_ids in groups:
            anchor = row_of(anchor_id)  # an anchor absorbed earlier in this call is gone: refused
            if anchor is None or anchor_refusal(anchor["kind"], anchor["origin"], float(anchor["intensity"])):
                refused += 1
                continue
            strength = float(anchor["intensity"])
            members: list[RowMapping] = []
            for member_id in member_ids:
                member = row_of(member_id)
                if member is None or member_refusal(
                    member["id"], member["kind"], member["origin"], float(member["intensity"]),
                    anchor=anchor_id, anchor_intensity=strength, absorbed=absorbed,
                ):  # fmt: skip
                    refused += 1
                    continue
                absorbed.add(str(member["id"]))
                members.append(member)
            if not members:
                continue
            if gen is None:
                gen = generations.bump(conn, imp, scope, deleted=True)
            ids = [str(m["id"]) for m in members]
            combined = combined_intensity([strength, *(float(m["intensity"]) for m in members)])
            conn.execute(update(_R).where(_R.c.id == anchor_id).values(intensity=combined, gen=gen))
            moved += conn.execute(
                update(_E)
                .where(_E.c.record_id.in_(ids), _E.c.imp == imp, _E.c.scope == scope)
                .values(record_id=anchor_id, gen=gen)
            ).rowcount
            conn.execute(delete(_R).where(_R.c.id.in_(ids)))
            applied += 1
            absorbed_n += len(ids)
        return ConsolidateResult(groups=applied, absorbed=absorbed_n, episodes=moved, refused=refused)

    return generations.locked(db, write)


def forget_scope(db: Database, imp: str, scope: str, now: datetime) -> tuple[int, int]:
    """Mechanisms 112-113, within ``scope`` only: every record ``forgets`` at ``now`` is deleted with its
    episodes. Returns (records, episodes). The host calls this directly for the scopes the imp did not live
    in that day (forgetting needs no model); ``memory.forget`` too.

    The candidates are read first, then deleted in transactions of ``FORGET_BATCH`` records, each
    checking the rule again under the write lock (a record felt again meanwhile stays): a first night
    over a large old memory never holds the database from the imp's other boxes for long, and a crash
    midway leaves only records the next night forgets."""
    curve = laws.DEFAULTS.forgetting_curve
    # A prefilter only (the rule is ``forgets``): none younger than the first knot, none at the top value.
    youngest = now - timedelta(days=curve[0][0])
    top = max(value for _, value in curve)
    prefilter = select(_R.c.id, _R.c.kind, _R.c.origin, _R.c.intensity, _R.c.last_felt).where(
        _R.c.imp == imp,
        _R.c.scope == scope,
        _R.c.intensity < top,
        bytewise(_R.c.last_felt) <= iso(youngest),
    )
    candidates = [
        str(row[0])
        for row in db.read(lambda conn: conn.execute(prefilter).all())
        if forgets(row[1], row[2], float(row[3]), parse_iso(row[4]), now)
    ]
    # By id alone (the primary key): with imp and scope in the WHERE, SQLite may scan the scope.
    again = select(
        _R.c.id, _R.c.imp, _R.c.scope, _R.c.kind, _R.c.origin, _R.c.intensity, _R.c.last_felt
    ).where(_R.c.id.in_(bindparam("ids", expanding=True)))
    drop_episodes = delete(_E).where(_E.c.record_id.in_(bindparam("ids", expanding=True)))
    drop_records = delete(_R).where(_R.c.id.in_(bindparam("ids", expanding=True)))

    def write(conn: Connection, *, batch: Sequence[str]) -> tuple[int, int]:
        generations.lock(conn, [(imp, scope)])  # the rule is checked again on what no write is changing
        doomed: list[str] = []
        for ids in chunks(batch):
            doomed.extend(
                str(row[0])
                for row in conn.execute(again, {"ids": ids})
                if row[1] == imp
                and row[2] == scope
                and forgets(row[3], row[4], float(row[5]), parse_iso(row[6]), now)
            )
        records = episodes = 0
        for ids in chunks(doomed):
            episodes += conn.execute(drop_episodes, {"ids": ids}).rowcount
            records += conn.execute(drop_records, {"ids": ids}).rowcount
        if doomed:
            generations.bump(conn, imp, scope, deleted=True)
        return records, episodes

    records = episodes = 0
    for start in range(0, len(candidates), FORGET_BATCH):
        batch = candidates[start : start + FORGET_BATCH]
        gone, gone_episodes = generations.locked(db, partial(write, batch=batch))
        records += gone
        episodes += gone_episodes
    return records, episodes


def scopes_by_newest(
    conn: Connection, imp: str, since: datetime | None = None, limit: int | None = None
) -> list[str]:
    """The scopes of ``imp`` with records (that happened at or after ``since``), the newest record first
    (ties: by scope, byte order); at most ``limit``. Shared with the imp's clock (``wakefulness``)."""
    newest = func.max(_R.c.happened_at).label("newest")
    statement = (
        select(_R.c.scope, newest)
        .where(_R.c.imp == imp, *([] if since is None else [bytewise(_R.c.happened_at) >= iso(since)]))
        .group_by(_R.c.scope)
    )
    rows = [(str(row[1]), str(row[0])) for row in conn.execute(statement)]
    rows.sort(key=lambda item: item[1].encode())  # ties: by scope, byte order (the sort below is stable)
    rows.sort(key=lambda item: item[0].encode(), reverse=True)
    scopes = [scope for _, scope in rows]
    return scopes if limit is None else scopes[: max(0, limit)]
