"""The cluster as ``impyard hosts`` and the console's Hosts page show it: every host record of the database, each with
the leases it holds, and every other lease (shards, terminal channels, task runs) with its holder (issue 21, "Seeing
the cluster"; issue 34).

Read from the ``leases`` table (``impyard.storage.leases``), so it sees every host that shares the database, not only
this home's. ``lease_state`` is the one rule of what a row means now: ``held`` while its holder renews it,
``expired`` once it stopped renewing (or released it), ``dead`` when its holder is a process of this machine that is
gone. ``cluster`` turns lease rows into typed rows (``HostRow``, ``LeaseRow``); ``as_json`` is what
``impyard hosts --json`` prints.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal

from impyard.clock import iso
from impyard.durations import relative_time
from impyard.storage import liveness, shard_layout
from impyard.storage.db import Database
from impyard.storage.leases import HOST_PREFIX, TASK_PREFIX, ImpBoxes, LeaseInfo, LeaseStore
from impyard.storage.liveness import Holder
from impyard.storage.shard_layout import LayoutInForce

LeaseState = Literal["held", "expired", "dead"]
Alive = Callable[[Holder], "bool | None"]


def lease_state(info: LeaseInfo, now: datetime, alive: Alive) -> LeaseState:
    """``held`` while its holder renews it; ``expired`` (or released) once it stopped; ``dead`` when its holder
    is a process of this machine that is gone (the next claimant takes it at once)."""
    if info.expired(now):
        return "expired"
    if info.holder is not None and alive(info.holder) is False:
        return "dead"
    return "held"


def lease_kind(name: str) -> str:
    """What a lease is for, from its name: ``host``, ``shard``, ``channel`` (a terminal chat), ``task`` (a run)."""
    if name.startswith(HOST_PREFIX):
        return "host"
    if name.startswith(TASK_PREFIX):
        return "task"
    head, sep, _ = name.partition(":")
    return head if sep and head in ("shard", "channel") else "other"


def _seconds(later: datetime, earlier: datetime) -> float:
    return round((later - earlier).total_seconds(), 3)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _time(text: str | None) -> datetime | None:
    """A time a holder wrote about itself; None when it is not one (it is shown as "?", never a failure)."""
    if not text:
        return None
    try:
        found = datetime.fromisoformat(text)
    except ValueError:
        return None
    return found if found.tzinfo is not None else found.replace(tzinfo=UTC)


@dataclass(frozen=True)
class HostRow:
    """One ``impyard serve`` or ``impyard chat`` process, as its ``host:`` record says (``leases.HostCard``)."""

    name: str  # the record's lease name: host:<hostname>/<pid>
    host: str
    pid: int | None
    command: str | None
    home: str | None
    shard: str | None
    warm_boxes: int | None
    spare_boxes: int | None  # issue 37: started ahead, not yet claimed (None: the host did not say)
    holds: tuple[str, ...]  # the leases it holds now, by name
    started_text: str  # as the host wrote it (``--json`` prints it so)
    started_at: datetime | None
    renewed_at: datetime
    expires_at: datetime
    lease_age_s: float
    expires_in_s: float
    state: LeaseState
    boxes: tuple[ImpBoxes, ...] | None  # per imp it serves; None: the host did not say (an older impyard)
    imp_revisions: dict[str, int] | None = None  # issue 36: the revision of each imp's settings it runs

    @property
    def boxes_text(self) -> str:
        """The warm boxes cell: ``2``, or ``2 (+1 spare)`` while spares wait (issue 37)."""
        shown = "?" if self.warm_boxes is None else str(self.warm_boxes)
        spares = self.spare_boxes
        return f"{shown} (+{spares} spare{'s' if spares != 1 else ''})" if spares else shown

    @property
    def revisions_text(self) -> str:
        """``pip@3, bo@1``: what ``impyard hosts`` and the console show (``-`` for a host that does not say)."""
        if not self.imp_revisions:
            return "-"
        return ", ".join(f"{name}@{rev}" for name, rev in sorted(self.imp_revisions.items()))

    @property
    def live(self) -> bool:
        return self.state == "held"

    def as_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "host": self.host, "pid": self.pid, "command": self.command, "home": self.home, "shard": self.shard,
            "warm_boxes": self.warm_boxes, "spare_boxes": self.spare_boxes, "holds": list(self.holds),
            "started_at": self.started_text,
            "renewed_at": iso(self.renewed_at), "expires_at": iso(self.expires_at), "lease_age_s": self.lease_age_s,
            "expires_in_s": self.expires_in_s, "state": self.state,
        }  # fmt: skip
        if self.boxes is not None:
            found["boxes"] = [box.detail() for box in self.boxes]
        if self.imp_revisions is not None:
            found["imps"] = dict(self.imp_revisions)
        return found


@dataclass(frozen=True)
class LeaseRow:
    """A lease other than a host record: a shard, a terminal channel, a task run, with its holder."""

    name: str
    host: str | None
    pid: int | None
    token: int
    acquired_at: datetime
    renewed_at: datetime
    expires_at: datetime
    expires_in_s: float
    state: LeaseState

    @property
    def kind(self) -> str:
        return lease_kind(self.name)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "host": self.host, "pid": self.pid, "token": self.token,
            "acquired_at": iso(self.acquired_at), "renewed_at": iso(self.renewed_at),
            "expires_at": iso(self.expires_at), "expires_in_s": self.expires_in_s, "state": self.state,
        }  # fmt: skip


@dataclass(frozen=True)
class Cluster:
    """Every host record and every other lease of the database, by name, at ``now``."""

    now: datetime
    hosts: tuple[HostRow, ...]
    leases: tuple[LeaseRow, ...]
    layout: dict[str, Any] | None = (
        None  # issue 36: the shard layout in force (``layout_entry``); None: none yet
    )

    def as_json(self) -> dict[str, Any]:
        """What ``impyard hosts --json`` prints."""
        return {
            "hosts": [host.as_json() for host in self.hosts],
            "leases": [lease.as_json() for lease in self.leases],
            "layout": self.layout,
        }

    @property
    def layout_line(self) -> str | None:
        """One line above the tables: the layout in force, who fixed it, and whether another may be started."""
        layout = self.layout
        if layout is None:
            return None
        shards = layout["shards"]
        what = (
            "without shards (serve without --shard)"
            if shards is None
            else f"as {shards} shards (--shard I/{shards})"
        )
        fixer = layout["fixed_by"]
        fixed = f"{fixer['host']} (pid {fixer['pid']})" if fixer else "an unknown host"
        since = relative_time(datetime.fromisoformat(layout["fixed_at"]), self.now)
        if layout["state"] == "held":
            held = len(layout["held_by"])
            state = f"held by {held} lease{'s' if held != 1 else ''}: a host of another layout is refused"
        else:
            state = "free: no host holds it, the next host may start with another layout"
        return f"Shard layout: Discord is served {what}, fixed by {fixed} {since}; {state}"

    def serving(self, imp: str) -> list[tuple[HostRow, ImpBoxes]]:
        """The live hosts that serve ``imp`` (their record names it), with what each says of its boxes."""
        return [(host, box) for host in self.hosts if host.live for box in host.boxes or () if box.imp == imp]


def _revisions(value: Any) -> dict[str, int] | None:
    """A host record's ``imps`` (name → revision), its bad entries skipped."""
    if not isinstance(value, dict):
        return None
    return {
        name[:40]: rev
        for name, rev in value.items()
        if isinstance(name, str) and isinstance(rev, int) and rev > 0
    }


def layout_entry(found: LayoutInForce | None) -> dict[str, Any] | None:
    """The shard layout as ``impyard hosts --json`` prints it: ``shards`` (N of ``--shard I/N``; null: served
    without --shard), who fixed it and when, the live leases that hold it; ``state`` ``held`` (a host of another
    layout is refused) or ``free`` (no host holds it: the next may start with another N). None before any ``serve``."""
    if found is None:
        return None
    return {
        "shards": found.layout.shards,
        "fixed_by": {"host": found.fixed_by.host, "pid": found.fixed_by.pid} if found.fixed_by else None,
        "fixed_at": iso(found.fixed_at),
        "held_by": [
            {
                "lease": hold.lease,
                "host": hold.holder.host if hold.holder else None,
                "pid": hold.holder.pid if hold.holder else None,
            }
            for hold in found.holds
        ],
        "state": "held" if found.holds else "free",
    }


def _boxes(value: Any) -> tuple[ImpBoxes, ...] | None:
    if not isinstance(value, list):
        return None
    return tuple(box for item in value if (box := ImpBoxes.from_detail(item)) is not None)


def host_row(info: LeaseInfo, holds: Sequence[str], now: datetime, state: LeaseState) -> HostRow:
    detail = info.detail
    started = _text(detail.get("started_at")) or iso(info.acquired_at)
    return HostRow(
        name=info.name,
        host=info.holder.host if info.holder else info.name.removeprefix(HOST_PREFIX).rsplit("/", 1)[0],
        pid=info.holder.pid if info.holder else None,
        command=_text(detail.get("command")),
        home=_text(detail.get("home")),
        shard=_text(detail.get("shard")),
        warm_boxes=_int(detail.get("warm_boxes")),
        spare_boxes=_int(detail.get("spare_boxes")),
        holds=tuple(holds),
        started_text=started,
        started_at=_time(started),
        renewed_at=info.renewed_at,
        expires_at=info.expires_at,
        lease_age_s=_seconds(now, info.renewed_at),
        expires_in_s=_seconds(info.expires_at, now),
        state=state,
        boxes=_boxes(detail.get("boxes")),
        imp_revisions=_revisions(detail.get("imps")),
    )


def lease_row(info: LeaseInfo, now: datetime, state: LeaseState) -> LeaseRow:
    return LeaseRow(
        name=info.name,
        host=info.holder.host if info.holder else None,
        pid=info.holder.pid if info.holder else None,
        token=info.token,
        acquired_at=info.acquired_at,
        renewed_at=info.renewed_at,
        expires_at=info.expires_at,
        expires_in_s=_seconds(info.expires_at, now),
        state=state,
    )


def cluster(infos: Sequence[LeaseInfo], now: datetime, alive: Alive = liveness.alive) -> Cluster:
    """Every host record, each with the other leases its holder holds now, and every other lease."""
    others = [info for info in infos if not info.name.startswith(HOST_PREFIX)]
    states = {info.name: lease_state(info, now, alive) for info in infos}
    hosts = tuple(
        host_row(
            info,
            [o.name for o in others if o.holder == info.holder and states[o.name] == "held"],
            now,
            states[info.name],
        )
        for info in infos
        if info.name.startswith(HOST_PREFIX)
    )
    return Cluster(now, hosts, tuple(lease_row(info, now, states[info.name]) for info in others))


def read_cluster(db: Database, now: datetime, alive: Alive = liveness.alive) -> Cluster:
    """The cluster of ``db`` at ``now``, with its shard layout (blocking: ``await db.run(read_cluster, db, now)``)."""
    store = LeaseStore(db)
    found = cluster(store.list(), now, alive)
    layout = layout_entry(db.read(lambda conn: shard_layout.in_force(conn, store.me, now, alive)))
    return replace(found, layout=layout)
