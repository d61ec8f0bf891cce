"""Departures on the host (mechanism 103; docs/memory.md, "Departure"): a person who left is thought over once.

A conversation is one person's talk with a memory imp in one channel (``memory_conversations``). The person
has left it when their last input there is more than the presence window (mechanism 10, 1800 s) old, or
when they say so (``/quit`` in ``impyard chat``). Each departure queues one task of kind ``depart`` for the
imp, in the conversation's channel, naming the person: its box reflects once, quietly, and learns (103).

The person's last input is the latest message by them (``history.author_id``) that woke the imp in that
channel (``wakes``); where the history was trimmed, the time the conversation itself saved as its last input,
else the time it was last saved.

**Exactly once.** A departure is a row of ``memory_departures`` keyed by the stretch of talk it ends: (imp,
channel, person, last input). The row and its task are written in one transaction (``db.write``), the row
with ``ON CONFLICT DO NOTHING``: a second scan, a second host on the same database or a restart inserts nothing, so
queues nothing. A stretch already departed at a later (or the same) last input is not departed again; a new
message starts a new stretch, which departs in its turn. Only memory imps depart, and only conversations
whose last input is at most ``LOOKBACK`` old (turning memory on never makes an imp reflect on every
conversation it ever had).

**What a departure taught from** (issue 32, ``taught`` and ``known_people``): the host keeps a learned rule only
when the rule law (``box.common.laws.rule_refusal``) finds nothing of a scope in it. The law reads, from the
host's own tables, never from the box: the people the imp knows — every author of its channels' history (the
channels that ever woke it) and of its memories — and the departure's conversation itself: its channel's
history of the last ``LOOKBACK`` (at most ``TAUGHT_MESSAGES`` messages, the imp's own replies included), with
its people (its authors, and everyone it names explicitly, ``@name``), whose names are refused in any case.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import anyio
from sqlalchemy import ColumnElement, bindparam, func, select, update
from sqlalchemy.engine import Connection, RowMapping

from box.common.laws import DEFAULTS, explicit_mentions
from impyard.clock import iso, parse_iso
from impyard.imps.store import ImpConfig, ImpStore
from impyard.storage.db import Database
from impyard.storage.portable import bytewise, per_dialect, upsert
from impyard.storage.tables import (
    history,
    memory_conversations,
    memory_departures,
    memory_episodes,
    memory_records,
    wakes,
)
from impyard.tasks import (
    FINISHED_STATES,
    Task,
    TaskError,
    TaskRequest,
    TaskStore,
    ValidTask,
    validate_request,
)

log = logging.getLogger("impyard.memory.departures")

DEPART_KIND = "depart"  # the task kind a box answers with ChatMemory.depart (box/program.py)
STALE_S = DEFAULTS.presence_stale_seconds  # mechanism 10: 1800 s without input and the person has left
DEPART_CEILING = timedelta(seconds=300)  # one quiet reflection and one learning call fit well inside
LOOKBACK = timedelta(days=7)  # an older stretch of talk is never departed (see the module's text)
MAX_PER_SCAN = 50  # a scan queues at most this many; the next scan takes the rest
TAUGHT_MESSAGES = 500  # the departure's conversation as the rule law reads it: its channel's newest messages
KNOWN_PEOPLE = 5_000  # names of people per source (history, memories) the rule law reads


@dataclass(frozen=True)
class Due:
    """A conversation whose person has left: the stretch of talk that ended at ``last_input_at``."""

    imp: str
    channel_id: str
    person_id: str
    last_input_at: datetime


def memory_imps(imps: ImpStore) -> frozenset[str]:
    """The imps of this home whose imp.toml loads and has ``[memory] enabled`` (blocking: reads every imp.toml)."""
    return frozenset(
        name for name, config in imps.scan() if isinstance(config, ImpConfig) and config.memory.enabled
    )


def _when(value: Any) -> datetime | None:
    """A time from the database or a conversation's saved JSON; None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_iso(value)
    except ValueError:
        return None


_C, _DEP = memory_conversations, memory_departures
_HEARD = (
    select(func.max(history.c.created_at))
    .select_from(
        history.join(
            wakes,
            (wakes.c.imp == _C.c.imp) & (wakes.c.channel_id == history.c.channel_id)
            & (wakes.c.message_id == history.c.message_id),
        )
    )
    .where(history.c.channel_id == _C.c.channel_id, history.c.author_id == _C.c.person, history.c.from_imp.is_(None))
    .scalar_subquery()
)  # fmt: skip
_DEPARTED = (
    select(func.max(_DEP.c.last_input_at))
    .where(_DEP.c.imp == _C.c.imp, _DEP.c.channel_id == _C.c.channel_id, _DEP.c.person == _C.c.person)
    .scalar_subquery()
)
_CONVERSATIONS = select(
    _C.c.imp, _C.c.channel_id, _C.c.person, _C.c.state, _C.c.updated_at, _HEARD.label("heard"),
    _DEPARTED.label("departed"),
)  # fmt: skip
_LATER = select(_DEP.c.imp).where(
    _DEP.c.imp == bindparam("imp"), _DEP.c.channel_id == bindparam("channel_id"), _DEP.c.person == bindparam("person"),
    bytewise(_DEP.c.last_input_at) >= bindparam("last"),
)  # fmt: skip
_TASK_OF = update(_DEP).where(
    _DEP.c.imp == bindparam("k_imp"), _DEP.c.channel_id == bindparam("k_channel_id"),
    _DEP.c.person == bindparam("k_person"), _DEP.c.last_input_at == bindparam("k_last"),
)  # fmt: skip


@per_dialect
def _RECORD(dialect: str) -> Any:  # noqa: N802 - a statement
    """The departure's row, once per stretch of talk (its key): a second insert does nothing (rowcount 0)."""
    return (
        upsert(dialect)(_DEP)
        .values(
            imp=bindparam("imp"), channel_id=bindparam("channel_id"), person=bindparam("person"),
            last_input_at=bindparam("last"), task_id=None, queued_at=bindparam("queued_at"),
        )
        .on_conflict_do_nothing(index_elements=[_DEP.c.imp, _DEP.c.channel_id, _DEP.c.person, _DEP.c.last_input_at])
    )  # fmt: skip


@dataclass(frozen=True)
class _Talk:
    due: Due
    departed: bool  # already departed at this last input or a later one


def _talk(row: RowMapping) -> _Talk:
    try:
        state = json.loads(row["state"])
    except ValueError:
        state = {}
    state = state if isinstance(state, dict) else {}
    last = _when(row["heard"]) or _when(state.get("last_input_at")) or parse_iso(row["updated_at"])
    marks = (_when(row["departed"]), _when(state.get("departed_at")))  # ours, and the box's own (103)
    departed = any(mark is not None and mark >= last for mark in marks)
    return _Talk(Due(row["imp"], row["channel_id"], row["person"], last), departed)


def _talks(conn: Connection, *where: ColumnElement[bool]) -> list[_Talk]:
    return [_talk(row) for row in conn.execute(_CONVERSATIONS.where(*where)).mappings()]


def due(
    conn: Connection,
    now: datetime,
    imps: Collection[str],
    *,
    stale_s: float = STALE_S,
    lookback: timedelta = LOOKBACK,
    limit: int = MAX_PER_SCAN,
) -> list[Due]:
    """The conversations of ``imps`` (the memory imps) whose person left more than ``stale_s`` ago and that
    have not departed since their last input; oldest last input first, at most ``limit``."""
    if not imps:
        return []
    names = sorted(imps)
    found = []
    for talk in _talks(conn, _C.c.imp.in_(names)):
        age = (now - talk.due.last_input_at).total_seconds()
        if not talk.departed and stale_s < age <= lookback.total_seconds():
            found.append(talk.due)
    found.sort(key=lambda item: (item.last_input_at, item.imp, item.channel_id, item.person_id))
    return found[: max(0, limit)]


def _request(item: Due) -> ValidTask:
    return validate_request(
        TaskRequest(
            imp=item.imp, prompt=None, kind=DEPART_KIND, channel_id=item.channel_id, ceiling=DEPART_CEILING,
            origin="event", person=item.person_id,
        )
    )  # fmt: skip


def queue(db: Database, tasks: TaskStore, item: Due) -> str | None:
    """Record the departure of ``item`` and queue its task, in one transaction; the task id, or None when this
    stretch of talk has departed already (another scan, host or run got there first) or cannot be a task."""
    try:
        request: ValidTask | None = _request(item)
    except (TaskError, ValueError) as exc:  # e.g. a channel id no task can name: recorded, never retried
        log.warning(
            "departure of %s from %s (%s) cannot be queued: %s",
            item.person_id,
            item.channel_id,
            item.imp,
            exc,
        )
        request = None
    last = iso(item.last_input_at)
    key = {"imp": item.imp, "channel_id": item.channel_id, "person": item.person_id, "last": last}
    queued_at = iso(tasks.clock.now())

    def write(conn: Connection) -> str | None:  # database work only: PostgreSQL may run it again
        if conn.execute(_LATER, key).first() is not None:
            return None
        inserted = conn.execute(_RECORD(conn.dialect.name), {**key, "queued_at": queued_at}).rowcount
        if inserted != 1 or request is None:  # mechanism 103: exactly once per stretch of talk
            return None
        task_id = tasks.insert(conn, request)
        conn.execute(_TASK_OF.values(task_id=task_id), {f"k_{name}": value for name, value in key.items()})
        return task_id

    task_id = db.write(write)
    if task_id is None:
        return None
    log.info(
        "departure of %s from %s (%s), last input %s: task %s",
        item.person_id,
        item.channel_id,
        item.imp,
        last,
        task_id,
    )
    return task_id


def queue_due(
    db: Database,
    tasks: TaskStore,
    now: datetime,
    imps: Collection[str],
    *,
    stale_s: float = STALE_S,
) -> list[tuple[Due, str]]:
    """One scan (blocking): every departure due now, queued exactly once; returns what this call queued."""
    queued = []
    for item in db.read(lambda conn: due(conn, now, imps, stale_s=stale_s)):
        task_id = queue(db, tasks, item)
        if task_id is not None:
            queued.append((item, task_id))
    return queued


def depart_now(
    db: Database, tasks: TaskStore, imp: str, channel_id: str, person_id: str, *, memory: bool = True
) -> str | None:
    """The person says they leave (``/quit``): their conversation departs now, whatever its age (blocking).

    ``memory``: whether the imp has memory on (a memory-off imp never departs). Returns the task id; None when
    there is no conversation, or its stretch of talk has departed already."""
    if not memory:
        return None
    talks = db.read(
        lambda conn: _talks(conn, _C.c.imp == imp, _C.c.channel_id == channel_id, _C.c.person == person_id)
    )
    if not talks or talks[0].departed:
        return None
    return queue(db, tasks, talks[0].due)


async def wait_finished(
    db: Database, tasks: TaskStore, task_id: str, timeout_s: float, poll_s: float = 0.1
) -> Task:
    """The task once it finished, or as it is when ``timeout_s`` passed (or it was deferred to a later window)."""
    with anyio.move_on_after(timeout_s):
        while True:
            task = await db.run(tasks.get, task_id)
            if task.state in FINISHED_STATES or (task.state == "queued" and task.deferrals > 0):
                return task
            await anyio.sleep(poll_s)
    return await db.run(tasks.get, task_id)


# ------------------------------------------------------------------ what a departure taught from (issue 32)


@dataclass(frozen=True)
class Taught:
    """What the rule law reads of a departure: the people the imp knows, the people of the conversation (who
    wrote in it, whom it @mentioned), and what was said."""

    names: tuple[str, ...]
    said: tuple[str, ...]
    speakers: tuple[str, ...] = ()


_HISTORY_PEOPLE = (
    select(history.c.author_name)
    .where(history.c.channel_id.in_(select(wakes.c.channel_id).where(wakes.c.imp == bindparam("imp")).distinct()))
    .distinct()
    .limit(KNOWN_PEOPLE)
)  # fmt: skip
_MEMORY_PEOPLE = [
    select(table.c.author).where(table.c.imp == bindparam("imp")).distinct().limit(KNOWN_PEOPLE)
    for table in (memory_records, memory_episodes)
]
_SAID = (
    select(history.c.author_name, history.c.content)
    .where(history.c.channel_id == bindparam("channel_id"), bytewise(history.c.created_at) >= bindparam("since"))
    .order_by(history.c.seq.desc())
    .limit(TAUGHT_MESSAGES)
)  # fmt: skip


def known_people(conn: Connection, imp: str, *, memories: bool = True) -> list[str]:
    """The names of the people ``imp`` knows: the authors of its channels' history, and (``memories``) of its
    records and episodes; at most ``KNOWN_PEOPLE`` from each."""
    names = [row[0] for row in conn.execute(_HISTORY_PEOPLE, {"imp": imp})]
    if memories:
        for statement in _MEMORY_PEOPLE:
            names.extend(row[0] for row in conn.execute(statement, {"imp": imp}))
    return list(dict.fromkeys(name for name in names if isinstance(name, str) and name.strip()))


def taught(conn: Connection, imp: str, channel_id: str, now: datetime) -> Taught:
    """Issue 32: what the rule law reads when ``imp`` learns a rule in ``channel_id`` (a departure's box):
    the people it knows (``known_people``), the conversation — the channel's newest messages of the last
    ``LOOKBACK``, from the host's history — and its people: who wrote in it, and whom it names with ``@``."""
    rows = conn.execute(_SAID, {"channel_id": channel_id, "since": iso(now - LOOKBACK)}).all()
    said = tuple(str(content) for _, content in rows if content)
    speakers = [str(author) for author, _ in rows] + [
        name for text in said for name in explicit_mentions(text)
    ]
    return Taught(
        tuple(dict.fromkeys(n for n in known_people(conn, imp) if n.strip())),
        said,
        tuple(dict.fromkeys(n for n in speakers if n.strip())),
    )
