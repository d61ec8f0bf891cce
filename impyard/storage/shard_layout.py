"""One Discord shard layout per database (issue 36): every ``impyard serve`` of a database splits Discord the same way.

Hosts sharing a database must agree on how Discord is split between them, or two of them get the same server's
messages: ``serve --shard 0/2`` beside ``serve --shard 0/3`` (their leases, ``shard:0/2`` and ``shard:0/3``, do not
overlap by name, but their servers do), or a ``serve`` without ``--shard`` (it gets every server) beside a sharded one.

The layout is ``shards`` = N of ``--shard I/N``, or None: served by ``serve`` without ``--shard``. Who holds it is read
from the leases, so a host of any version counts: a live ``shard:I/N`` lease holds the layout of N; a live host record
(``host:…``) of a ``serve`` without a shard holds the unsharded layout. The ``shard_layout`` row (revision 0007) says
which layout is in force and who fixed it. A serving host takes the layout (``take``) inside the very transaction that
takes its first lease (``LeaseStore.acquire``'s ``guard``), so of two hosts starting at once with different layouts
one is refused (SQLite's write lock; PostgreSQL's SERIALIZABLE, which runs the loser again). A host of another layout
is refused with one line (``refusal``) while any host holds a lease of the one in force; once none does (every host
stopped, or its leases expired), the next host fixes its own. Several hosts of one layout are the point: an
unsharded ``serve`` beside another unsharded ``serve`` (each serving its own imps) is never refused here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection

from impyard.clock import iso
from impyard.errors import ImpyardError
from impyard.storage.lease_rules import HOST_PREFIX, LeaseRow, Outcome, decide, lease_time
from impyard.storage.liveness import Holder
from impyard.storage.tables import leases, shard_layout

SURFACE = "discord"
SHARD_PREFIX = "shard:"  # a shard's lease: shard:I/N
SERVE = "serve"  # the command a host record of ``impyard serve`` names (leases.HostCard)


@dataclass(frozen=True)
class Layout:
    """How a database's serving hosts split Discord: ``shards`` = N, or None (``serve`` without ``--shard``)."""

    shards: int | None

    def __str__(self) -> str:
        if self.shards is None:
            return "without shards"
        return f"as {self.shards} shard{'s' if self.shards != 1 else ''}"


UNSHARDED = Layout(None)


@dataclass(frozen=True)
class Hold:
    """A live lease of a layout: a shard's, or the host record of an unsharded ``serve``."""

    lease: str
    holder: Holder | None
    layout: Layout

    @property
    def who(self) -> str:
        return (
            f"{self.holder.host} (pid {self.holder.pid})" if self.holder is not None else "an unknown holder"
        )


@dataclass(frozen=True)
class LayoutInForce:
    """The ``shard_layout`` row and who holds that layout now (``impyard hosts``)."""

    layout: Layout
    fixed_by: Holder | None
    fixed_at: datetime
    holds: tuple[Hold, ...]  # live leases of this layout; none: free, the next host may fix another


class LayoutHeld(ImpyardError):
    """Another layout is in force and held; the message is ``refusal``'s one line."""

    def __init__(self, message: str, hold: Hold) -> None:
        super().__init__(message)
        self.hold = hold


def shards_of(name: str) -> int | None:
    """N of a shard's lease ``shard:I/N``; None for any other name (or a garbled one)."""
    if not name.startswith(SHARD_PREFIX):
        return None
    _, _, count = name.removeprefix(SHARD_PREFIX).partition("/")
    return int(count) if count.isdigit() and int(count) > 0 else None


def _unsharded_serve(detail: str | None) -> bool:
    """Whether a host record's detail (leases.HostCard) is an ``impyard serve`` without ``--shard``."""
    try:
        found = json.loads(detail or "{}")
    except ValueError:
        return False
    return isinstance(found, dict) and found.get("command") == SERVE and found.get("shard") is None


def holds(
    rows: Iterable[tuple[str, str, int, str, str | None]],
    me: Holder,
    now: datetime,
    alive: Callable[[Holder], bool | None],
) -> list[Hold]:
    """The live layout leases among ``rows`` (name, holder, token, expires_at, detail), not ``me``'s: held as
    ``lease_rules.decide`` says (not expired, and its holder not provably dead)."""
    found = []
    for name, holder_text, token, expires_at, detail in rows:
        shards = shards_of(name)
        if shards is not None:
            layout = Layout(shards)
        elif name.startswith(HOST_PREFIX) and _unsharded_serve(detail):
            layout = UNSHARDED
        else:
            continue
        holder = Holder.parse(holder_text)
        row = LeaseRow(name, holder, int(token), lease_time(expires_at))
        if decide(row, me, now, alive(holder) if holder is not None and holder != me else None).outcome is (
            Outcome.HELD
        ):
            found.append(Hold(name, holder, layout))
    return found


def refusal(wanted: Layout, live: Sequence[Hold]) -> Hold | None:
    """The hold that refuses a host of ``wanted``: the first live lease of another layout, or None."""
    return next((hold for hold in live if hold.layout != wanted), None)


def refusal_line(wanted: Layout, asked: str, hold: Hold) -> str:
    """One line: what holds the layout in force (lease, host, pid), and how to change it. ``asked``: the host's
    own flag in words (``--shard 0/3``, ``no --shard``)."""
    held = hold.layout
    change = "stop every `impyard serve` of this database (`impyard hosts` lists them), then start each"
    if held.shards is None:
        return (
            f"this database is served without shards: an `impyard serve` without --shard runs on {hold.who} and "
            f"gets every server, so a host with {asked} would answer messages a second time; to shard it, {change} "
            f"with --shard I/N"
        )
    if wanted.shards is None:
        return (
            f"this database is served {held} ({hold.lease} is held by {hold.who}): a `serve` without --shard would "
            f"answer their messages a second time; start it with --shard I/{held.shards}, or to serve without "
            f"shards, {change} without --shard"
        )
    return (
        f"this database is served {held} ({hold.lease} is held by {hold.who}), not {wanted.shards}: start this "
        f"host with --shard I/{held.shards}, or to change the number of shards, {change} with "
        f"--shard I/{wanted.shards}"
    )


def _lease_rows(conn: Connection) -> list[tuple[str, str, int, str, str | None]]:
    rows = conn.execute(
        select(leases.c.name, leases.c.holder, leases.c.token, leases.c.expires_at, leases.c.detail)
    ).all()
    return [(str(r[0]), str(r[1]), int(r[2]), str(r[3]), r[4]) for r in rows]


def take(
    conn: Connection,
    wanted: Layout,
    asked: str,
    *,
    me: Holder,
    now: datetime,
    alive: Callable[[Holder], bool | None],
) -> None:
    """Inside the transaction that takes a serving host's first lease: ``LayoutHeld`` (the transaction rolls back)
    when a live lease holds another layout; else the layout row says ``wanted`` (written, with ``me``, when it said
    another or nothing), and the lease rows of shards of another count, all stopped, are forgotten."""
    live = holds(_lease_rows(conn), me, now, alive)
    hold = refusal(wanted, live)
    if hold is not None:
        raise LayoutHeld(refusal_line(wanted, asked, hold), hold)
    row = conn.execute(select(shard_layout).where(shard_layout.c.surface == SURFACE)).mappings().first()
    values = {"shards": wanted.shards, "fixed_by": str(me), "fixed_at": iso(now)}
    if row is None:
        conn.execute(insert(shard_layout).values(surface=SURFACE, **values))
    elif row["shards"] != wanted.shards:
        conn.execute(update(shard_layout).where(shard_layout.c.surface == SURFACE).values(**values))
        stale = [
            name
            for name, *_ in _lease_rows(conn)
            if (n := shards_of(name)) is not None and n != wanted.shards
        ]  # every one stopped (else refused above): a new layout starts without the old one's leases
        if stale:
            conn.execute(delete(leases).where(leases.c.name.in_(stale)))


def in_force(
    conn: Connection, me: Holder, now: datetime, alive: Callable[[Holder], bool | None]
) -> LayoutInForce | None:
    """The layout row and the live leases of that layout (None before any serving host fixed one)."""
    row = conn.execute(select(shard_layout).where(shard_layout.c.surface == SURFACE)).mappings().first()
    if row is None:
        return None
    layout = Layout(row["shards"])
    live = tuple(hold for hold in holds(_lease_rows(conn), me, now, alive) if hold.layout == layout)
    return LayoutInForce(layout, Holder.parse(row["fixed_by"]), lease_time(row["fixed_at"]), live)
