"""Leases in the database: one holder at a time for a shard, a terminal channel, a task run, and each host's own
record.

The rules (who may take a lease, when an act under it is refused) are pure and live in ``impyard.storage.lease_rules``;
this module reads and writes the ``leases`` rows through the engine API (``db.write``/``db.read``), so it runs
on SQLite and on PostgreSQL alike, and keeps the leases a process holds:

* ``LeaseStore``: ``acquire`` (or ``LeaseHeld``, naming the holder's host and pid), ``renew`` (or ``LeaseLost``,
  saying who took it), ``release`` (the row and its token stay, so the next holder's token is one more),
  ``verify`` (why an act under a token must be refused), ``list`` (for ``impyard hosts``).
* ``LeaseKeeper``: renews every ``RENEW_EVERY`` (and writes what a holder says of itself as soon as it changed,
  ``DETAIL_EVERY`` at most) and, when a lease is lost or could not be renewed before its local deadline, says so
  once (``on_lost``). It is also the host's ``LeaseGuard``: ``check()`` answers from a monotonic deadline kept in
  memory, so a host that cannot reach the database stops acting when its lease may have expired, without a
  database hop per act.
* ``hold_host``: what ``impyard serve`` and ``impyard chat`` hold for their lives — their shard or channel, and
  ``host:<hostname>/<pid>``, the record ``impyard hosts`` lists (home, command, shard, warm boxes, start).
* ``task_lease_name``: the lease a task run holds from its claim to its end (``task:<task>/<run>``), taken by the
  supervisor (``impyard.supervisor``), and taken over only to reclaim a run whose holder stopped.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import anyio
from sqlalchemy import delete, insert, or_, select, update
from sqlalchemy.engine import Connection, RowMapping
from sqlalchemy.exc import SQLAlchemyError

from impyard import metrics
from impyard.clock import Clock, SystemClock, iso
from impyard.errors import ImpyardError
from impyard.storage import liveness, shard_layout
from impyard.storage.db import Database, DatabaseError, Store, open_database
from impyard.storage.lease_rules import (
    DEFAULT_TTL,
    DETAIL_EVERY,
    HOST_PREFIX,
    RENEW_EVERY,
    Decision,
    LeaseRow,
    Outcome,
    decide,
    granted,
    lease_time,
    refusal,
    verify,
)
from impyard.storage.liveness import Holder
from impyard.storage.rows import OfRow, RowMapper
from impyard.storage.tables import leases
from impyard.threads import in_thread

log = logging.getLogger("impyard.leases")

TASK_PREFIX = "task:"  # a task run's lease: task:<task id>/<run id>, from its claim to its end
HOST_ROWS_KEPT = timedelta(days=1)  # a host record (or a run's lease) expired longer ago is forgotten
FORGOTTEN_PREFIXES = (HOST_PREFIX, TASK_PREFIX)  # leases whose names are never taken again once they ended
MAX_DETAIL_CHARS = (
    16_000  # what a holder says about itself is small: a line of `impyard hosts`, its imps' boxes
)
RENEW_ERRORS = (
    DatabaseError,
    SQLAlchemyError,
    OSError,
)  # the database is away: try again, the deadline decides


class LeaseHeld(ImpyardError):
    """Someone alive holds the lease; the message names its host and pid (``lease_rules.refusal``)."""

    def __init__(self, name: str, message: str, holder: Holder | None) -> None:
        super().__init__(message)
        self.name = name
        self.holder = holder


class LeaseLost(ImpyardError):
    """The lease passed to another holder, was released, or expired; ``reason`` is ``lease_rules.verify``'s."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"lost lease {name}: {reason}")
        self.name = name
        self.reason = reason


@dataclass(eq=False)
class Lease:
    """A lease this process holds: its fencing token, its expiry in the database, and a local deadline.

    ``deadline`` is on the monotonic clock, taken before the request that set the expiry left this process, so
    it never falls after the expiry the database holds (whatever the wall clocks say)."""

    name: str
    token: int
    expires_at: datetime
    holder: Holder
    deadline: float
    monotonic: Callable[[], float] = field(default=time.monotonic, repr=False)
    lost: str | None = None  # why, once a renewal found it lost (lease_rules.verify's reason)
    taken_from: Holder | None = None  # the holder it was taken over from (expired or dead), if any

    def valid(self) -> bool:
        """Whether this process may still act under the lease, by its own clock (no database hop)."""
        return self.monotonic() < self.deadline

    def remaining_s(self) -> float:
        return self.deadline - self.monotonic()


@dataclass(frozen=True)
class LeaseInfo:
    """A lease row as ``impyard hosts`` shows it."""

    name: str
    holder: Holder | None
    holder_text: str
    token: int
    acquired_at: datetime
    renewed_at: datetime
    expires_at: datetime
    detail: dict[str, Any]

    def expired(self, now: datetime) -> bool:
        return self.expires_at <= now


def _detail_text(detail: Mapping[str, Any] | None) -> str:
    text = json.dumps(dict(detail or {}), sort_keys=True, default=str)
    return text if len(text) <= MAX_DETAIL_CHARS else json.dumps({"truncated": True})


def _detail(text: str | None) -> dict[str, Any]:
    try:
        found = json.loads(text or "{}")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


_LEASE_INFO = RowMapper(
    LeaseInfo, holder=Holder.parse, holder_text=OfRow(lambda row: row["holder"]), token=int, acquired_at=lease_time,
    renewed_at=lease_time, expires_at=lease_time, detail=_detail,
)  # fmt: skip


def _row(found: RowMapping | None) -> LeaseRow | None:
    if found is None:
        return None
    return LeaseRow(
        found["name"], Holder.parse(found["holder"]), int(found["token"]), lease_time(found["expires_at"])
    )


def host_lease_name(holder: Holder) -> str:
    """The record a process keeps of itself: one per host name and pid."""
    return f"{HOST_PREFIX}{holder.host}/{holder.pid}"


def task_lease_name(task_id: str, run_id: str) -> str:
    """The lease a task run holds from its claim to its end: one per run, so a run id is never held twice."""
    return f"{TASK_PREFIX}{task_id}/{run_id}"


class LeaseStore(Store):
    """The ``leases`` rows, for the process ``me`` (default: this one). Blocking; ``store.db.run(store.m)`` awaits."""

    def __init__(
        self,
        db: Database,
        clock: Clock | None = None,
        *,
        me: Holder | None = None,
        alive: Callable[[Holder], bool | None] = liveness.alive,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        self.clock = clock or SystemClock()
        self.me = me or liveness.this_process()
        self.alive = alive
        self.monotonic = monotonic

    def _read(self, conn: Connection, name: str) -> RowMapping | None:
        return conn.execute(select(leases).where(leases.c.name == name)).mappings().first()

    def acquire(
        self,
        name: str,
        detail: Mapping[str, Any] | None = None,
        ttl: timedelta = DEFAULT_TTL,
        *,
        takes: Callable[[Decision], bool] = granted,
        guard: Callable[[Connection, datetime], None] | None = None,
    ) -> Lease:
        """Take ``name`` for ``ttl`` (or renew it, when this process holds it already); ``LeaseHeld`` when
        someone alive holds it. A takeover (expired, or a dead holder on this machine) gets the next token.
        ``takes``: which of ``lease_rules.decide``'s outcomes take the lease (``lease_rules.reclaims``: a
        takeover to reclaim a task run, never a lease of this process); the others raise ``LeaseHeld``. ``guard``:
        checks made in the same transaction, first (``shard_layout.take``); it raises to refuse, and nothing is
        written."""
        me, detail_text = self.me, _detail_text(detail)

        def txn(
            conn: Connection,
        ) -> tuple[bool, LeaseRow | None, int, datetime]:  # may run again: DB work only
            now = self.clock.now()
            if guard is not None:
                guard(conn, now)
            found = self._read(conn, name)
            row = _row(found)
            other = row.holder if row is not None and row.holder is not None and row.holder != me else None
            decision = decide(row, me, now, self.alive(other) if other is not None else None)
            if not takes(decision):  # granted (the default), or reclaims: never a HELD lease
                return False, row, decision.token, now
            values = {
                "holder": str(me), "token": decision.token, "renewed_at": iso(now), "expires_at": iso(now + ttl),
                "detail": detail_text,
            }  # fmt: skip
            if found is None:
                conn.execute(insert(leases).values(name=name, acquired_at=iso(now), **values))
            else:
                if decision.outcome is not Outcome.MINE:
                    values["acquired_at"] = iso(now)
                conn.execute(update(leases).where(leases.c.name == name).values(**values))
            return True, row, decision.token, now + ttl

        started = self.monotonic()
        taken, row, token, when = self.db.write(txn)
        if not taken:
            if row is None:  # a free lease refused by ``takes``: nobody holds it
                raise LeaseHeld(name, f"{name} is free, and was not taken", None)
            raise LeaseHeld(name, refusal(name, row, when), row.holder)
        previous = row.holder if row is not None and row.holder != me else None
        return Lease(
            name, token, when, me, started + ttl.total_seconds(), self.monotonic, taken_from=previous
        )

    def renew(
        self, lease: Lease, detail: Mapping[str, Any] | None = None, ttl: timedelta = DEFAULT_TTL
    ) -> datetime:
        """Push the lease's expiry ``ttl`` on (and replace its detail, when given); ``LeaseLost`` when it is no
        longer this process's under the same token."""
        me, detail_text = self.me, None if detail is None else _detail_text(detail)

        def txn(conn: Connection) -> tuple[str | None, datetime]:
            row, now = _row(self._read(conn, lease.name)), self.clock.now()
            if row is None or row.holder != me or row.token != lease.token:  # expired but untaken: still ours
                return verify(row, me, lease.token, now) or "the lease was taken over", now
            values = {"renewed_at": iso(now), "expires_at": iso(now + ttl)}
            if detail_text is not None:
                values["detail"] = detail_text
            conn.execute(update(leases).where(leases.c.name == lease.name).values(**values))
            return None, now + ttl

        started = self.monotonic()
        reason, when = self.db.write(txn)
        if reason is not None:
            lease.deadline, lease.lost = -math.inf, reason
            raise LeaseLost(lease.name, reason)
        lease.expires_at, lease.deadline = when, started + ttl.total_seconds()
        return when

    def release(self, lease: Lease, *, forget: bool = False) -> bool:
        """Give the lease up: it expires now and keeps its token (the next holder's is one more); ``forget``
        deletes the row instead (a host's own record, whose name is never taken again). False when it was no
        longer this process's to give."""
        me = self.me
        lease.deadline = -math.inf

        def txn(conn: Connection) -> bool:
            row, now = _row(self._read(conn, lease.name)), self.clock.now()
            if row is None or row.holder != me or row.token != lease.token:
                return False
            where = leases.c.name == lease.name
            if forget:
                conn.execute(delete(leases).where(where))
            else:
                conn.execute(update(leases).where(where).values(renewed_at=iso(now), expires_at=iso(now)))
            return True

        return bool(self.db.write(txn))

    def verify(self, name: str, token: int) -> str | None:
        """Why an act under ``token`` must be refused (``lease_rules.verify``), or None while it is ours."""

        def txn(conn: Connection) -> str | None:
            return verify(_row(self._read(conn, name)), self.me, token, self.clock.now())

        return self.db.read(txn)

    def list(self) -> list[LeaseInfo]:
        """Every lease row, by name."""
        return self.db.read(lambda conn: _LEASE_INFO.all(conn, select(leases).order_by(leases.c.name)))

    def forget_stale(self, kept: timedelta = HOST_ROWS_KEPT) -> int:
        """Delete the records of hosts, and the leases of task runs, that expired more than ``kept`` ago (killed
        processes leave theirs; no name of either is taken again). A shard's or channel's lease keeps its token."""

        def txn(conn: Connection) -> int:
            cutoff = iso(self.clock.now() - kept)
            named = or_(*(leases.c.name.startswith(prefix) for prefix in FORGOTTEN_PREFIXES))
            gone = conn.execute(delete(leases).where(named, leases.c.expires_at < cutoff))
            return int(gone.rowcount or 0)

        return int(self.db.write(txn))


class LeaseGuard(Protocol):
    """What the gateway asks before an act: None while this host may act, else the one-line reason."""

    def check(self) -> str | None: ...


class LeaseKeeper:
    """Renews a process's leases while it runs (``await keeper.run()``, in the caller's task group).

    ``on_lost(why)`` is called once, with one line naming the lease and who took it, when a renewal finds the
    lease lost or when none succeeded before the lease's local deadline; the keeper then stops. ``details``:
    a function per lease name whose result replaces the row's detail at each renewal, and at once when it
    changed (looked at every ``detail_every``, in memory; a write only when it changed, so at most one a
    ``detail_every``, in the keeper's own task: never on the path of a turn). ``written``: the details the
    leases were acquired with."""

    def __init__(
        self,
        store: LeaseStore,
        held: Sequence[Lease],
        *,
        renew_every: timedelta = RENEW_EVERY,
        ttl: timedelta = DEFAULT_TTL,
        on_lost: Callable[[str], None] | None = None,
        details: Mapping[str, Callable[[], Mapping[str, Any]]] | None = None,
        detail_every: timedelta = DETAIL_EVERY,
        written: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.store = store
        self.held = list(held)
        self.renew_every_s = renew_every.total_seconds()
        self.ttl = ttl
        self.on_lost = on_lost
        self.details = dict(details or {})
        self.detail_every_s = detail_every.total_seconds()
        self._written = {name: dict(detail) for name, detail in (written or {}).items()}
        self.lost: str | None = None  # one line: which lease, and who took it
        self.lost_error: LeaseLost | None = None  # the same, to raise once the host has stopped
        self._scope: anyio.CancelScope | None = None

    def check(self) -> str | None:
        """LeaseGuard: why this host must act no more (a lease lost, or past its local deadline), or None."""
        if self.lost is not None:
            return self.lost
        for lease in self.held:
            if not lease.valid():
                return f"lost lease {lease.name}: it could not be renewed before it expired"
        return None

    def token(self, name: str) -> int | None:
        """The fencing token held for ``name`` (for an act checked against the database), or None."""
        return next((lease.token for lease in self.held if lease.name == name), None)

    def leases_held(self) -> list[str]:
        """``metrics.LeaseCensus``: the leases this process may still act under (none once one is lost)."""
        if self.lost is not None:
            return []
        return [lease.name for lease in self.held if lease.valid()]

    async def run(self) -> None:
        """Until a lease is lost, or the caller's scope ends; its leases count in ``impyard_leases_held`` meanwhile."""
        with metrics.counting_leases(self):
            await self._run()

    async def _run(self) -> None:
        async with anyio.create_task_group() as tg:
            self._scope = tg.cancel_scope
            for lease in self.held:
                tg.start_soon(self._keep, lease, name=f"lease {lease.name}")
            tg.start_soon(self._watch_deadlines, name="lease deadlines")

    async def _keep(self, lease: Lease) -> None:
        """Renew every ``renew_every``; in between, write the lease's detail as soon as it changed."""
        describe = self.details.get(lease.name)
        written = self._written.get(lease.name)
        due = anyio.current_time() + self.renew_every_s
        while True:
            wait = due - anyio.current_time()
            await anyio.sleep(max(0.0, wait if describe is None else min(wait, self.detail_every_s)))
            detail = dict(describe()) if describe is not None else None
            if anyio.current_time() < due and detail == written:
                continue  # nothing new to say, and no renewal due yet: no write
            try:
                await self.store.db.run(self.store.renew, lease, detail, self.ttl)
            except LeaseLost as exc:
                self._lose(lease, exc.reason)
                return
            except RENEW_ERRORS as exc:  # the deadline watch decides when this stops being a hiccup
                log.warning(
                    "could not renew lease %s (%s); trying again in %.0f s",
                    lease.name,
                    exc,
                    self.renew_every_s,
                )
            written = detail  # (after a failure too: the next renewal writes the detail of then)
            due = anyio.current_time() + self.renew_every_s

    async def _watch_deadlines(self) -> None:
        while True:
            lease = min(self.held, key=Lease.remaining_s)
            left = lease.remaining_s()
            if left <= 0:
                self._lose(
                    lease,
                    lease.lost
                    or "it could not be renewed before it expired (the database could not be reached)",
                )
                return
            await anyio.sleep(min(left, self.renew_every_s) + 0.001)

    def _lose(self, lease: Lease, reason: str) -> None:
        if self.lost is None:
            self.lost_error = LeaseLost(lease.name, reason)
            self.lost = str(self.lost_error)
            lease.deadline = -math.inf
            if self.on_lost is not None:
                self.on_lost(self.lost)  # the host logs it as it stops
            else:
                log.error("%s; stopping", self.lost)
        if self._scope is not None:
            self._scope.cancel()


@asynccontextmanager
async def holding(
    store: LeaseStore,
    names: Sequence[str],
    *,
    details: Mapping[str, Callable[[], Mapping[str, Any]]] | None = None,
    ttl: timedelta | None = None,
    renew_every: timedelta | None = None,
    forget: Callable[[str], bool] = lambda name: name.startswith(HOST_PREFIX),
    guard: Callable[[Connection, datetime], None] | None = None,
) -> AsyncIterator[LeaseKeeper]:
    """Hold ``names`` for the block (``LeaseHeld`` at once when one is held: those taken are given back),
    renewed by a keeper; released on every exit path (``forget``: the names whose row goes with them). ``guard``
    runs in the transaction that takes the first name (``LeaseStore.acquire``)."""
    details = dict(details or {})
    ttl, renew_every = (
        ttl or DEFAULT_TTL,
        renew_every or RENEW_EVERY,
    )  # looked up now: a test may shorten them
    held: list[Lease] = []
    written: dict[str, Mapping[str, Any]] = {}
    try:
        for index, name in enumerate(names):
            describe = details.get(name)
            if describe is not None:
                written[name] = dict(describe())
            checks = guard if index == 0 else None
            with anyio.CancelScope(shield=True):  # taken, then released: even by a start stopped meanwhile
                lease = await store.db.run(store.acquire, name, written.get(name), ttl, guard=checks)
            held.append(lease)
        keeper = LeaseKeeper(
            store, held, renew_every=renew_every, ttl=ttl, details=details, written=written,
            detail_every=DETAIL_EVERY,
        )  # fmt: skip
        async with anyio.create_task_group() as tg:
            tg.start_soon(keeper.run, name="lease keeper")
            try:
                yield keeper
            finally:
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            for lease in reversed(held):
                try:
                    await store.db.run(store.release, lease, forget=forget(lease.name))
                except RENEW_ERRORS as exc:  # it expires by itself
                    log.warning("could not release lease %s: %s", lease.name, exc)


@dataclass(frozen=True)
class ImpBoxes:
    """What a host says of one imp it serves (issue 34, the console's Imps page): its warm boxes there, the
    backend they run on, and their OCI runtime (``runsc``, ``runc``; None: not known before its first Docker box,
    or the process backend), with the runtime setting that chose it (``RuntimeChoice.describe``)."""

    imp: str
    warm: int
    backend: str
    runtime: str | None = None
    runtime_setting: str | None = None

    def detail(self) -> dict[str, Any]:
        return {
            "imp": self.imp, "warm": self.warm, "backend": self.backend, "runtime": self.runtime,
            "runtime_setting": self.runtime_setting,
        }  # fmt: skip

    @classmethod
    def from_detail(cls, value: Any) -> ImpBoxes | None:
        """One entry of a host record's ``boxes``, or None for one that is not (a record is another process's
        words: nothing in it is trusted to be well formed)."""
        if not isinstance(value, dict):
            return None
        imp, warm, backend = value.get("imp"), value.get("warm"), value.get("backend")
        runtime, setting = value.get("runtime"), value.get("runtime_setting")
        if not (isinstance(imp, str) and isinstance(backend, str)):
            return None
        if not isinstance(warm, int) or isinstance(warm, bool) or warm < 0:
            return None
        return cls(
            imp[:MAX_BOX_WORDS], warm, backend[:MAX_BOX_WORDS],
            runtime[:MAX_BOX_WORDS] if isinstance(runtime, str) else None,
            setting[:MAX_BOX_WORDS] if isinstance(setting, str) else None,
        )  # fmt: skip


MAX_BOX_WORDS = 80  # an imp's name, a backend, a runtime: short words


def _boxes_detail(boxes: Sequence[ImpBoxes], room: int) -> tuple[list[dict[str, Any]], int]:
    """The boxes a record can hold within ``room`` characters of JSON: the imps with warm boxes first, then by
    name; the rest are counted (``boxes_more``), never a record too big to keep."""
    ordered = sorted(boxes, key=lambda box: (-box.warm, box.imp))
    kept: list[dict[str, Any]] = []
    used = 0
    for box in ordered:
        entry = box.detail()
        size = len(json.dumps(entry, sort_keys=True)) + 2
        if used + size > room:
            break
        kept.append(entry)
        used += size
    return kept, len(ordered) - len(kept)


MAX_IMPS_SAID = 100  # imps whose revision a host record names
MAX_IMP_NAME = 40


@dataclass
class HostCard:
    """What a serving or chatting process says about itself in its ``host:`` record (``impyard hosts``)."""

    command: str
    home: str
    shard: str | None = None
    started_at: str = field(default_factory=lambda: iso(datetime.now(UTC)))
    warm_boxes: Callable[[], int] = field(default=lambda: 0, repr=False)  # set once the sessions run
    spare_boxes: Callable[[], int] = field(
        default=lambda: 0, repr=False
    )  # issue 37: started ahead, unclaimed
    boxes: Callable[[], Sequence[ImpBoxes]] | None = field(default=None, repr=False)  # per imp: once they run
    # Issue 36: the revision of each imp's settings this host runs (impyard.imps.shared), once it knows them.
    imp_revisions: Callable[[], Mapping[str, int]] | None = field(default=None, repr=False)

    def detail(self) -> dict[str, Any]:
        """The record's detail; ``boxes`` (each imp it serves, issue 34) once the sessions run, as many as fit the
        record (``boxes_more`` counts the rest)."""
        try:
            warm = int(self.warm_boxes())
        except Exception:  # noqa: BLE001 - a count is never worth a lost lease
            warm = 0
        try:
            spares = int(self.spare_boxes())
        except Exception:  # noqa: BLE001 - a count is never worth a lost lease
            spares = 0
        found: dict[str, Any] = {
            "home": self.home, "command": self.command, "shard": self.shard, "warm_boxes": warm,
            "spare_boxes": spares, "started_at": self.started_at,
        }  # fmt: skip
        if self.imp_revisions is not None:
            try:
                revisions = dict(self.imp_revisions())
            except Exception:  # noqa: BLE001 - nor are the revisions
                revisions = {}
            found["imps"] = {
                str(name)[:MAX_IMP_NAME]: int(rev) for name, rev in sorted(revisions.items())[:MAX_IMPS_SAID]
            }
        if self.boxes is None:
            return found
        try:
            boxes = list(self.boxes())
        except Exception:  # noqa: BLE001 - nor is a list of boxes
            boxes = []
        room = MAX_DETAIL_CHARS - len(json.dumps(found, sort_keys=True, default=str)) - 100
        found["boxes"], more = _boxes_detail(boxes, room)
        if more:
            found["boxes_more"] = more
        return found


@asynccontextmanager
async def hold_host(
    card: HostCard, claims: Sequence[str] = (), *, layout: shard_layout.Layout | None = None
) -> AsyncIterator[LeaseKeeper]:
    """What ``impyard serve``/``chat`` hold for their lives: ``claims`` (``shard:I/N``, ``channel:<id>``) and
    this process's ``host:`` record, on the database of ``IMPYARD_DATABASE_URL`` / the home (opened through the
    engine, so on either engine). ``LeaseHeld`` before anything else starts when a claim is held. ``layout``
    (``impyard serve``, issue 36): the Discord shard layout it serves, taken with its first lease
    (``shard_layout.take``; ``LayoutHeld`` when a host of another layout runs)."""
    db = await in_thread(open_database)
    try:
        store = LeaseStore(db)
        await store.db.run(store.forget_stale)
        me = host_lease_name(store.me)
        guard = None
        if layout is not None:
            wanted = layout
            asked = f"--shard {card.shard}" if card.shard is not None else "no --shard"

            def guard(conn: Connection, now: datetime) -> None:
                shard_layout.take(conn, wanted, asked, me=store.me, now=now, alive=store.alive)

        async with holding(store, [*claims, me], details={me: card.detail}, guard=guard) as keeper:
            yield keeper
    finally:
        db.close()
