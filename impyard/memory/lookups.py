"""Looking records up within a reach: the most recently felt, those by or about a person, by id, and each
record's episodes (mechanisms 16, 27, 28, 32, 116).

Every read here is filtered through its ``Reach`` (``impyard.memory.reach``). ``LIKE`` is only a prefilter
(both sides lowercased in Python) before a whole-word check (``laws.mentions``); text that is ordered is
ordered byte by byte (``bytewise``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import ColumnElement, bindparam, func, or_, select
from sqlalchemy.engine import Connection, RowMapping

from box.common import laws
from box.protocol.memory import BOTH_KINDS, EpisodeView, RecordView
from impyard.memory import generations
from impyard.memory.reach import Reach, per_reach
from impyard.memory.records import (
    EPISODE_COLUMNS,
    EPISODE_NAMES,
    RECORD_COLUMNS,
    RECORD_NAMES,
    episode_view,
    like_pattern,
    row_text,
)
from impyard.storage.portable import bytewise
from impyard.storage.tables import memory_episodes as _E
from impyard.storage.tables import memory_records as _R

ABOUT_SCAN_CHARS = 1_000_000  # issue 32 #5: record text one memory.about reads for its name, strongest first


def _records_stmt(shape: str) -> Any:
    return select(*RECORD_COLUMNS).where(Reach.criterion(_R, shape))


_NEWEST_FILTERS: dict[str, tuple[ColumnElement[bool], ...]] = {
    "any": (),
    "kinds": (_R.c.kind.in_(bindparam("kinds", expanding=True)),),
    "construct": (_R.c.kind == "construct", _R.c.construct_kind == bindparam("construct_kind")),
}


def _newest_stmt(filter_: str) -> Callable[[str], Any]:
    """The most recently felt records of one scope (its index: imp, scope, last_felt, gen), filtered."""

    def build(shape: str) -> Any:
        return (
            _records_stmt(shape)
            .where(*_NEWEST_FILTERS[filter_])
            .order_by(bytewise(_R.c.last_felt).desc(), _R.c.gen.desc())
            .limit(bindparam("k"))
        )

    return build


_NEWEST = {filter_: _newest_stmt(filter_) for filter_ in _NEWEST_FILTERS}


def _about_stmt(shape: str) -> Any:
    return (
        _records_stmt(shape)
        .where(
            _R.c.kind.in_(bindparam("kinds", expanding=True)),
            or_(
                _R.c.author == bindparam("person"), _R.c.author_id == bindparam("person"),
                _R.c.mention_text.like(bindparam("pattern"), escape="\\"),
            ),
        )
        .order_by(_R.c.intensity.desc(), bytewise(_R.c.last_felt).desc(), bytewise(_R.c.id))
    )  # fmt: skip


def _rows_by_id(shape: str) -> Any:
    """The rows of ``ids`` within the reach: looked up by id first (a scope scan would be slow on SQLite)."""
    ids = select(_R).where(_R.c.id.in_(bindparam("ids", expanding=True))).limit(bindparam("n")).subquery("r")
    return select(*(ids.c[name] for name in RECORD_NAMES)).where(Reach.criterion(ids, shape))  # type: ignore[arg-type]


def _newest_episodes(shape: str) -> Any:
    """Each named record's newest ``per`` episodes within the reach, in one query (newest first). Ranked by
    record id first (its index), the reach checked outside: an episode is always in its record's scope."""
    rank = (
        func.row_number()
        .over(
            partition_by=_E.c.record_id,
            order_by=(bytewise(_E.c.happened_at).desc(), _E.c.gen.desc(), bytewise(_E.c.id)),
        )
        .label("rank")
    )
    ranked = (
        select(*EPISODE_COLUMNS, _E.c.imp, _E.c.scope, rank)
        .where(_E.c.record_id.in_(bindparam("ids", expanding=True)))
        .subquery("e")
    )
    return (
        select(*(ranked.c[name] for name in EPISODE_NAMES))
        .where(ranked.c.rank <= bindparam("per"), Reach.criterion(ranked, shape))  # type: ignore[arg-type]
        .order_by(ranked.c.record_id, ranked.c.rank)
    )


def _episodes_by_ids(shape: str) -> Any:
    return select(*EPISODE_COLUMNS).where(
        _E.c.id.in_(bindparam("ids", expanding=True)), Reach.criterion(_E, shape)
    )


def records(
    conn: Connection,
    reach: Reach,
    *where: ColumnElement[bool],
    order: Sequence[Any] = (bytewise(_R.c.last_felt).desc(), _R.c.gen.desc()),
    limit: int | None = None,
) -> list[RowMapping]:
    """Record rows within ``reach`` (the one scope filter), with extra conditions and an order."""
    statement = per_reach("records", reach, _records_stmt).where(*where).order_by(*order)
    if limit is not None:
        statement = statement.limit(limit)
    return list(conn.execute(statement, reach.params()).mappings())


def newest(conn: Connection, reach: Reach, filter_: str, k: int, **params: Any) -> list[RowMapping]:
    """The ``k`` most recently felt records within ``reach`` (``_NEWEST_FILTERS``: "any", "kinds" or
    "construct"): one indexed query per scope, merged."""
    scopes = reach.scopes if reach.scopes is not None else tuple(generations.scopes_of(conn, reach.imp))
    rows: list[RowMapping] = []
    for scope in scopes:
        one = Reach(reach.imp, (scope,))
        statement = per_reach(f"newest-{filter_}", one, _NEWEST[filter_])
        rows.extend(conn.execute(statement, one.params(k=k, **params)).mappings())
    rows.sort(key=lambda r: (r["last_felt"], r["gen"]), reverse=True)
    return rows[:k]


def records_by_id(conn: Connection, reach: Reach, ids: Sequence[str]) -> list[RowMapping]:
    """The rows of ``ids`` within ``reach`` (the ids are looked up first: a scope scan would be slow)."""
    if not ids:
        return []
    statement = per_reach("by_id", reach, _rows_by_id)
    return list(conn.execute(statement, reach.params(ids=list(ids), n=len(ids))).mappings())


def episodes_of(
    conn: Connection, reach: Reach, record_ids: Sequence[str], per_record: int
) -> dict[str, list[EpisodeView]]:
    """Each record's newest ``per_record`` episodes, newest first (mechanism 116), in one query."""
    found: dict[str, list[EpisodeView]] = {}
    if per_record <= 0 or not record_ids:
        return found
    statement = per_reach("episodes", reach, _newest_episodes)
    for row in conn.execute(statement, reach.params(ids=list(record_ids), per=per_record)).mappings():
        found.setdefault(row["record_id"], []).append(episode_view(row))
    return found


def with_episodes(
    conn: Connection,
    reach: Reach,
    views: list[RecordView],
    per_record: int,
    matched: dict[str, tuple[str, ...]] | None = None,
) -> list[RecordView]:
    """Load each record's episodes, ``per_record`` at most: a search's best-matching ones first (the hit
    episode first of all: mechanism 16), then the newest (116) to fill the rest.

    The seed loads the hit and the 3 newest; on a long record (a session of one feeling holds dozens of
    turns) that showed one turn the words are about and three that happened to be last (issue 32)."""
    if per_record <= 0:
        return views
    newest_of = episodes_of(conn, reach, [view.id for view in views], per_record)
    shown = {e.id for episodes in newest_of.values() for e in episodes}
    missing = [eid for ids in (matched or {}).values() for eid in ids[:per_record] if eid not in shown]
    loaded: dict[str, EpisodeView] = {}
    if missing:  # one read for every matched episode that is not among its record's newest
        statement = per_reach("episodes-by-id", reach, _episodes_by_ids)
        for row in conn.execute(statement, reach.params(ids=missing)).mappings():
            loaded[row["id"]] = episode_view(row)
    for view in views:
        episodes = newest_of.get(view.id, [])
        wanted = list((matched or {}).get(view.id, ()))[:per_record]
        if wanted:
            have = {e.id: e for e in episodes} | loaded
            first = [have[eid] for eid in wanted if eid in have]
            ids = {e.id for e in first}
            episodes = (first + [e for e in episodes if e.id not in ids])[:per_record]
        view.episodes = episodes
    return views


def about(
    conn: Connection,
    reach: Reach,
    person: str,
    k: int,
    exclude: Iterable[str] = (),
    kinds: Sequence[str] = BOTH_KINDS,
) -> list[RowMapping]:
    """Records authored by ``person`` (exact name or id) or naming them, strongest stored intensity first.

    The name is looked for in at most ``ABOUT_SCAN_CHARS`` of record text a request (issue 32 #5): a box
    asking about a common word ("the") is answered from the strongest records read by then, never made to
    scan every record of a large memory."""
    excluded = set(exclude)
    found: list[RowMapping] = []
    budget = ABOUT_SCAN_CHARS
    statement = per_reach("about", reach, _about_stmt)
    params = reach.params(kinds=list(kinds), person=person, pattern=like_pattern(person.strip().lower()))
    for row in conn.execute(statement, params).mappings():
        if row["id"] in excluded:
            continue
        if row["author"] != person and row["author_id"] != person:
            text = row_text(row)
            budget -= len(text)
            if budget < 0:
                break  # the request's name work is spent: what it found among the strongest stands
            if not laws.mentions(text, [person]):
                continue
        found.append(row)
        if len(found) >= k:
            break
    return found
