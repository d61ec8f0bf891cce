"""What each host is doing now (issue 34, the console's Now page): turns in flight, queued messages, warm boxes.

The console (``impyard console``) is a process of its own, maybe on another machine, so what a host does reaches it
through the shared database: each ``impyard chat`` and ``impyard serve`` keeps one ``host_activity`` row, keyed by
its lease record's name (``host:<hostname>/<pid>``, ``impyard.storage.leases``), holding a bounded snapshot of its
live sessions (``SessionManager.activity``: read from memory). The ``ActivityPublisher`` writes it from a task of
its own, looked at every ``PUBLISH_EVERY`` and written only when it changed — a turn never waits on it, and a
host whose turns fly by writes at most once a second — and deletes it when the host stops cleanly. A reader
(``read_now``) shows a row only while the host lease of the same name is held by the same process: a killed host's
row is never shown as live (the next host to start deletes it).

Stages: the box announces each stage of its turn machine (``turn.stage``, docs/protocol.md); the Now page says
them as an operator reads them (``NOW_STAGES``): ``context`` is *reading* (the history, what it remembers),
``tools`` and ``decision`` are *thinking* (the model's reply calls, memory's searches), ``render`` and ``send``
are *writing* (the reply made and posted), ``post`` is *remembering* (history and memory kept after delivery),
``failed`` is *failed* (the turn ends without a reply); before the box's first stage a turn is *starting* (its
box starting or being handed the messages).

Recent outcomes are the history's: each turn's outcome is kept on its messages' wakes (``History.finish``), which
``impyard history`` reads too; ``read_now`` lists the newest, one row per turn.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Any

import anyio
from anyio.abc import TaskGroup
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import delete, desc, insert, select, update
from sqlalchemy.engine import Connection

from impyard.channels.store import ChannelInfo, channel_label, infos
from impyard.clock import Clock, SystemClock, iso, parse_iso
from impyard.conversation.sessions import SessionActivity
from impyard.gateway.surfaces import surface_of
from impyard.storage import liveness
from impyard.storage.db import STORAGE_ERRORS, Database
from impyard.storage.leases import HOST_PREFIX, TASK_PREFIX, host_lease_name, task_lease_name
from impyard.storage.liveness import Holder
from impyard.storage.tables import host_activity, leases, tasks, wakes

log = logging.getLogger("impyard.activity")

PUBLISH_EVERY = timedelta(
    seconds=1
)  # a host's snapshot is looked at this often, and written only when it changed
MAX_SESSIONS = 200  # sessions one snapshot lists (the busiest first); the rest are counted in ``more``
RECENT_OUTCOMES = 20  # turns ``read_now`` lists by default
MAX_RECENT_OUTCOMES = 200
MAX_ERROR_CHARS = 300  # a failed turn's reason, as the Now page shows it: its first line
SNAPSHOT_VERSION = 1

STARTING = "starting"  # handed to its box, no stage announced yet
NOW_STAGES: Mapping[str, str] = {
    "context": "reading",
    "tools": "thinking",
    "decision": "thinking",
    "render": "writing",
    "send": "writing",
    "post": "remembering",
    "failed": "failed",
}


def now_stage(box_stage: str | None) -> str:
    """A turn's stage as the Now page says it (``NOW_STAGES``); ``starting`` before its box announced one."""
    if box_stage is None:
        return STARTING
    return NOW_STAGES.get(box_stage, box_stage)


# ---------------------------------------------------------------- the snapshot, as stored

_Short = Annotated[str, Field(max_length=256)]


class _Session(BaseModel):
    """One session in a stored snapshot; read back validated, as anything read from a shared table is."""

    model_config = ConfigDict(extra="ignore")
    imp: _Short
    channel_id: _Short
    warm: bool = False
    in_turn: Annotated[int, Field(ge=0)] = 0
    stage: Annotated[str, Field(max_length=32)] | None = None
    turn_since: Annotated[str, Field(max_length=40)] | None = None
    stage_since: Annotated[str, Field(max_length=40)] | None = None
    waiting: Annotated[int, Field(ge=0)] = 0


class _Snapshot(BaseModel):
    model_config = ConfigDict(extra="ignore")
    v: int = SNAPSHOT_VERSION
    sessions: Annotated[list[_Session], Field(max_length=MAX_SESSIONS)] = []
    more: Annotated[int, Field(ge=0)] = 0  # live sessions left out of ``sessions``


def _when(value: datetime | None) -> str | None:
    return iso(value) if value is not None else None


def snapshot_text(sessions: Sequence[SessionActivity]) -> str:
    """The stored form of a host's sessions: turns in flight first, then sessions with messages waiting, then warm
    boxes, at most ``MAX_SESSIONS`` (the rest counted). Stable for the same state, so "changed" is a text compare."""
    busiest = sorted(sessions, key=lambda s: (not s.in_turn, not s.waiting, s.imp, s.channel_id))
    shown = busiest[:MAX_SESSIONS]
    return json.dumps(
        {
            "v": SNAPSHOT_VERSION,
            "sessions": [
                {
                    "imp": s.imp,
                    "channel_id": s.channel_id,
                    "warm": s.warm,
                    "in_turn": s.in_turn,
                    "stage": s.stage,
                    "turn_since": _when(s.turn_since),
                    "stage_since": _when(s.stage_since),
                    "waiting": s.waiting,
                }  # fmt: skip
                for s in shown
            ],
            "more": len(busiest) - len(shown),
        },
        sort_keys=True,
    )


def _parse_snapshot(text: str) -> _Snapshot | None:
    try:
        return _Snapshot.model_validate_json(text)
    except ValidationError:
        return None  # a row no impyard of this version wrote, or garbled: shown as a host with nothing known


# ---------------------------------------------------------------- writing (the host's side)


def put_activity(db: Database, host: str, holder: Holder, snapshot: str, now: datetime) -> None:
    """Replace ``host``'s snapshot (blocking: ``await db.run(put_activity, ...)``)."""
    values = {"holder": str(holder), "updated_at": iso(now), "snapshot": snapshot}

    def txn(conn: Connection) -> None:
        changed = conn.execute(update(host_activity).where(host_activity.c.host == host).values(**values))
        if not changed.rowcount:
            conn.execute(insert(host_activity).values(host=host, **values))

    db.write(txn)


def withdraw_activity(db: Database, host: str, holder: Holder) -> None:
    """Delete ``host``'s row, when this process wrote it (a clean stop)."""
    where = (host_activity.c.host == host) & (host_activity.c.holder == str(holder))
    db.write(lambda conn: conn.execute(delete(host_activity).where(where)))


def forget_stale_activity(db: Database, now: datetime) -> int:
    """Delete the rows of hosts that no longer hold their lease record (killed, or lost the database): never shown
    again anyway, and nobody else deletes them."""

    def txn(conn: Connection) -> int:
        rows = conn.execute(select(host_activity.c.host, host_activity.c.holder)).all()
        held = _held_hosts(conn, now)
        stale = [host for host, holder in rows if held.get(host) != holder]
        if stale:
            conn.execute(delete(host_activity).where(host_activity.c.host.in_(stale)))
        return len(stale)

    return int(db.write(txn))


def _held_hosts(conn: Connection, now: datetime) -> dict[str, str]:
    """Each host record whose lease has not expired: its name → its holder's text."""
    query = select(leases.c.name, leases.c.holder, leases.c.expires_at).where(
        leases.c.name.startswith(HOST_PREFIX)
    )
    return {name: holder for name, holder, expires in conn.execute(query).all() if _after(expires, now)}


def _after(text: str | None, now: datetime) -> bool:
    try:
        return text is not None and parse_iso(text) > now
    except ValueError:
        return False  # a garbled time counts as long expired


class ActivityPublisher:
    """Keeps this host's ``host_activity`` row: ``async with ActivityPublisher(db) as publisher``, then
    ``publisher.follow(sessions.activity)``. Writes from its own task, at most once a ``every`` and only when the
    snapshot changed; deletes the row when the block ends (on every path but a kill)."""

    def __init__(
        self,
        db: Database,
        clock: Clock | None = None,
        *,
        me: Holder | None = None,
        every: timedelta = PUBLISH_EVERY,
    ) -> None:
        self.db = db
        self.clock = clock or SystemClock()
        self.me = me or liveness.this_process()
        self.host = host_lease_name(self.me)
        self.every_s = every.total_seconds()
        self.writes = 0  # rows written (a test and the benchmark count them)
        self._source: Callable[[], Sequence[SessionActivity]] = lambda: ()
        self._written: str | None = None
        self._tg: TaskGroup | None = None
        self._failing = False

    def follow(self, source: Callable[[], Sequence[SessionActivity]]) -> None:
        """What to publish: the session manager's ``activity`` (read in memory, every ``every``)."""
        self._source = source

    async def __aenter__(self) -> ActivityPublisher:
        try:
            await self.db.run(forget_stale_activity, self.db, self.clock.now())
        except STORAGE_ERRORS as exc:  # a nicety: the next host to start tries again
            log.warning("could not forget stopped hosts' activity: %s", exc)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._run, name="activity publisher")
        return self

    async def __aexit__(self, *exc_info: object) -> bool | None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        try:
            return await self._tg.__aexit__(*exc_info)  # type: ignore[arg-type]
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await self.db.run(withdraw_activity, self.db, self.host, self.me)
                except STORAGE_ERRORS as exc:  # it is ignored once this host's lease expires
                    log.warning("could not withdraw this host's activity: %s", exc)

    async def _run(self) -> None:
        while True:
            await self.publish()
            await anyio.sleep(self.every_s)

    async def publish(self) -> bool:
        """Write the snapshot if it changed since the last write; whether it wrote."""
        try:
            snapshot = snapshot_text(self._source())
        except Exception as exc:  # noqa: BLE001 - a view of the host never stops the host
            log.warning("could not read this host's activity: %s", exc)
            return False
        if snapshot == self._written:
            return False
        try:
            await self.db.run(put_activity, self.db, self.host, self.me, snapshot, self.clock.now())
        except STORAGE_ERRORS as exc:
            if not self._failing:  # said once per outage, tried again every ``every``
                log.warning("could not publish this host's activity (trying again): %s", exc)
            self._failing = True
            return False
        self._failing = False
        self._written = snapshot
        self.writes += 1
        return True


# ---------------------------------------------------------------- reading (the console's and the CLI's side)


@dataclass(frozen=True)
class HostNow:
    """A running host (its lease record is held): what it is and when it last said what it does."""

    host: str  # the lease record's name: host:<hostname>/<pid>
    hostname: str
    pid: int | None
    command: str  # chat | serve
    shard: str | None
    activity_at: datetime | None  # when its snapshot was written (None: it publishes none)
    sessions_left_out: int  # live sessions its snapshot did not list (beyond MAX_SESSIONS)


@dataclass(frozen=True)
class SessionNow:
    """One live session of a running host: a turn in flight (``in_turn``), messages queued, its warm box."""

    host: str
    hostname: str
    pid: int | None
    imp: str
    channel_id: str
    channel: str  # as an operator recognises it (``channel_label``)
    surface: str  # discord | terminal | log
    warm: bool
    in_turn: int  # messages the turn running now answers; 0: no turn runs
    box_stage: str | None  # the box's own word (context, tools, …)
    turn_since: datetime | None
    stage_since: datetime | None
    waiting: int  # messages queued behind the turn

    @property
    def stage(self) -> str | None:
        """reading, thinking, writing, remembering (``NOW_STAGES``), starting or failed; None when no turn runs."""
        return now_stage(self.box_stage) if self.in_turn else None


@dataclass(frozen=True)
class TaskNow:
    """A task run under way (``impyard supervise``, or a host's departures), held by a live host."""

    task_id: str
    imp: str
    kind: str
    channel_id: str
    channel: str
    started_at: datetime | None
    hostname: str | None
    pid: int | None


@dataclass(frozen=True)
class OutcomeNow:
    """A finished turn, from the history's wakes: one row per turn (the messages it answered together)."""

    imp: str
    channel_id: str
    channel: str
    surface: str
    outcome: str  # sent | silent | pending | failed (| missed | busy: never answered)
    error: str | None  # a failed turn's reason, its first line
    messages: int
    woken_at: datetime | None  # the first of its messages woke the imp
    finished_at: datetime

    @property
    def took_s(self) -> float | None:
        """From the first message's wake to the outcome (time queued included)."""
        return round((self.finished_at - self.woken_at).total_seconds(), 3) if self.woken_at else None


@dataclass(frozen=True)
class Now:
    """Everything the Now page shows, as of ``at``."""

    at: datetime
    hosts: list[HostNow]
    sessions: list[SessionNow]
    tasks: list[TaskNow]
    recent: list[OutcomeNow]

    @property
    def turns(self) -> list[SessionNow]:
        """The turns in flight, oldest first."""
        running = [s for s in self.sessions if s.in_turn]
        return sorted(running, key=lambda s: (s.turn_since is None, s.turn_since, s.imp, s.channel_id))

    @property
    def queued(self) -> int:
        return sum(s.waiting for s in self.sessions)

    @property
    def warm_boxes(self) -> int:
        return sum(1 for s in self.sessions if s.warm)

    def as_json(self) -> dict[str, Any]:
        """The same, as JSON values (times ISO-8601 UTC, ages in seconds as of ``at``): ``impyard now --json``."""

        def when(value: datetime | None) -> str | None:
            return iso(value) if value is not None else None

        def age(value: datetime | None) -> float | None:
            return round((self.at - value).total_seconds(), 3) if value is not None else None

        return {
            "at": iso(self.at),
            "hosts": [
                {"host": h.hostname, "pid": h.pid, "command": h.command, "shard": h.shard,
                 "activity_at": when(h.activity_at), "sessions_left_out": h.sessions_left_out}
                for h in self.hosts
            ],
            "sessions": [
                {"host": s.hostname, "pid": s.pid, "imp": s.imp, "channel_id": s.channel_id, "channel": s.channel,
                 "surface": s.surface, "warm": s.warm, "in_turn": s.in_turn, "stage": s.stage,
                 "box_stage": s.box_stage, "turn_since": when(s.turn_since), "turn_s": age(s.turn_since),
                 "stage_since": when(s.stage_since), "stage_s": age(s.stage_since), "queued": s.waiting}
                for s in self.sessions
            ],
            "tasks": [
                {"task": t.task_id, "imp": t.imp, "kind": t.kind, "channel_id": t.channel_id, "channel": t.channel,
                 "started_at": when(t.started_at), "running_s": age(t.started_at), "host": t.hostname,
                 "pid": t.pid}
                for t in self.tasks
            ],
            "recent": [
                {"imp": o.imp, "channel_id": o.channel_id, "channel": o.channel, "surface": o.surface,
                 "outcome": o.outcome, "error": o.error, "messages": o.messages, "woken_at": when(o.woken_at),
                 "finished_at": when(o.finished_at), "took_s": o.took_s}
                for o in self.recent
            ],
        }  # fmt: skip


def _time(text: str | None) -> datetime | None:
    try:
        return parse_iso(text) if text else None
    except ValueError:
        return None


def _first_line(text: str | None) -> str | None:
    if not text:
        return None
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:MAX_ERROR_CHARS] or None


@dataclass(frozen=True)
class _LeaseRow:
    name: str
    holder_text: str
    holder: Holder | None
    detail: dict[str, Any]


def _live_leases(
    conn: Connection, now: datetime, alive: Callable[[Holder], bool | None]
) -> dict[str, _LeaseRow]:
    """The host records and task-run leases held now: not expired, and not held by a process of this machine that
    is gone (``impyard hosts`` calls it dead)."""
    query = select(leases.c.name, leases.c.holder, leases.c.expires_at, leases.c.detail).where(
        leases.c.name.startswith(HOST_PREFIX) | leases.c.name.startswith(TASK_PREFIX)
    )
    found: dict[str, _LeaseRow] = {}
    for name, holder_text, expires, detail in conn.execute(query).all():
        holder = Holder.parse(holder_text)
        if not _after(expires, now) or (holder is not None and alive(holder) is False):
            continue
        try:
            parsed = json.loads(detail or "{}")
        except ValueError:
            parsed = {}
        found[name] = _LeaseRow(name, holder_text, holder, parsed if isinstance(parsed, dict) else {})
    return found


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def read_now(
    db: Database,
    now: datetime | None = None,
    *,
    recent: int = RECENT_OUTCOMES,
    alive: Callable[[Holder], bool | None] = liveness.alive,
) -> Now:
    """What every host on this database is doing now (blocking: ``await db.run(read_now, db)`` from async code):
    the running hosts, their live sessions (turns in flight with their stage, queued messages, warm boxes), the
    task runs under way, and the ``recent`` newest turn outcomes. One read transaction; no message text."""
    at = now or SystemClock().now()
    recent = max(0, min(recent, MAX_RECENT_OUTCOMES))

    def txn(conn: Connection) -> Now:
        live = _live_leases(conn, at, alive)
        snapshots = {
            host: (holder, updated, snapshot)
            for host, holder, updated, snapshot in conn.execute(
                select(
                    host_activity.c.host,
                    host_activity.c.holder,
                    host_activity.c.updated_at,
                    host_activity.c.snapshot,
                )
            ).all()  # fmt: skip
        }
        hosts: list[HostNow] = []
        found: list[tuple[HostNow, _Session]] = []
        for name, lease in sorted(live.items()):
            if not name.startswith(HOST_PREFIX):
                continue
            hostname = lease.holder.host if lease.holder else name.removeprefix(HOST_PREFIX).rsplit("/", 1)[0]
            stored = snapshots.get(name)
            snapshot = (
                _parse_snapshot(stored[2]) if stored is not None and stored[0] == lease.holder_text else None
            )  # a row of another process of that name (a recycled pid) is not this host's
            host = HostNow(
                name, hostname, lease.holder.pid if lease.holder else None,
                _text(lease.detail.get("command")) or "?", _text(lease.detail.get("shard")),
                _time(stored[1]) if snapshot is not None and stored is not None else None,
                snapshot.more if snapshot is not None else 0,
            )  # fmt: skip
            hosts.append(host)
            found.extend((host, session) for session in (snapshot.sessions if snapshot else ()))
        running = conn.execute(
            select(tasks.c.id, tasks.c.imp, tasks.c.kind, tasks.c.channel_id, tasks.c.run_id, tasks.c.started_at)
            .where(tasks.c.state == "running")
        ).all()  # fmt: skip
        held_runs = [
            (row, live[lease_name])
            for row in running
            if row.run_id and (lease_name := task_lease_name(row.id, row.run_id)) in live
        ]
        outcomes = conn.execute(
            select(wakes.c.imp, wakes.c.channel_id, wakes.c.woken_at, wakes.c.outcome, wakes.c.error,
                   wakes.c.finished_at)
            .where(wakes.c.finished_at.is_not(None))
            .order_by(desc(wakes.c.finished_at))
            .limit(recent * 4)  # a turn answers several messages at most this often; grouped below
        ).all() if recent else []  # fmt: skip
        channel_ids = {s.channel_id for _, s in found} | {row.channel_id for row, _ in held_runs}
        channel_ids |= {row.channel_id for row in outcomes}
        known = infos(conn, channel_ids)
        return Now(
            at,
            hosts,
            [_session_now(host, session, known.get(session.channel_id)) for host, session in found],
            [_task_now(row, lease, known.get(row.channel_id)) for row, lease in held_runs],
            _outcomes(outcomes, known, recent),
        )

    return db.read(txn)


def _session_now(host: HostNow, session: _Session, info: ChannelInfo | None) -> SessionNow:
    return SessionNow(
        host.host, host.hostname, host.pid, session.imp, session.channel_id,
        channel_label(session.channel_id, info), surface_of(session.channel_id, info.surface if info else None),
        session.warm, session.in_turn, session.stage if session.in_turn else None,
        _time(session.turn_since) if session.in_turn else None,
        _time(session.stage_since) if session.in_turn else None, session.waiting,
    )  # fmt: skip


def _task_now(row: Any, lease: _LeaseRow, info: ChannelInfo | None) -> TaskNow:
    return TaskNow(
        row.id, row.imp, row.kind, row.channel_id, channel_label(row.channel_id, info), _time(row.started_at),
        lease.holder.host if lease.holder else None, lease.holder.pid if lease.holder else None,
    )  # fmt: skip


def _outcomes(rows: Sequence[Any], known: Mapping[str, ChannelInfo], limit: int) -> list[OutcomeNow]:
    """One row per turn: the messages a turn answered together share their imp, channel, outcome and end."""
    turns: list[OutcomeNow] = []
    for row in rows:
        finished = _time(row.finished_at)
        if finished is None:
            continue
        last = turns[-1] if turns else None
        if last is not None and (last.imp, last.channel_id, last.outcome, last.finished_at) == (
            row.imp,
            row.channel_id,
            row.outcome,
            finished,
        ):
            woken = _time(row.woken_at)
            first = min((t for t in (last.woken_at, woken) if t is not None), default=None)
            turns[-1] = OutcomeNow(
                last.imp, last.channel_id, last.channel, last.surface, last.outcome, last.error,
                last.messages + 1, first, last.finished_at,
            )  # fmt: skip
            continue
        if len(turns) == limit:
            break
        info = known.get(row.channel_id)
        turns.append(
            OutcomeNow(
                row.imp,
                row.channel_id,
                channel_label(row.channel_id, info),
                surface_of(row.channel_id, info.surface if info else None),
                str(row.outcome),
                _first_line(row.error),
                1,
                _time(row.woken_at),
                finished,
            )  # fmt: skip
        )
    return turns
