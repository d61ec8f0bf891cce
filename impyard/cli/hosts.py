"""``impyard hosts``: the hosts serving from this database, and who holds each shard, terminal channel and task run.

Read from the ``leases`` table (impyard.storage.leases), so it sees every host that shares the database — two homes on
one machine, or several machines on one PostgreSQL — not only this home: each ``impyard serve`` and
``impyard chat`` keeps a ``host:<hostname>/<pid>`` record there (home, command, shard, warm boxes, start),
renewed while it runs, beside the shard and channel leases it holds (issue 21, "Seeing the cluster").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import click
from rich.markup import escape

from impyard.cli.database import database
from impyard.cli.output import Col, Output, output_options
from impyard.clock import SystemClock, iso
from impyard.durations import format_duration
from impyard.storage import liveness
from impyard.storage.leases import HOST_PREFIX, LeaseInfo, LeaseStore
from impyard.storage.liveness import Holder

HOST_COLUMNS = (
    Col("host", no_wrap=True), Col("pid", no_wrap=True), "command", "shard", "warm boxes", "holds", "home",
    Col("started", no_wrap=True), Col("renewed", no_wrap=True), Col("expires", no_wrap=True), "state",
)  # fmt: skip
LEASE_COLUMNS = (
    Col("lease", no_wrap=True), Col("holder", no_wrap=True), Col("pid", no_wrap=True), "token",
    Col("held since", no_wrap=True), Col("expires", no_wrap=True), "state",
)  # fmt: skip
NO_HOSTS = (
    "no hosts on this database yet: each `impyard serve` and `impyard chat` registers itself while it runs"
)


def lease_state(info: LeaseInfo, now: datetime, alive: Callable[[Holder], bool | None]) -> str:
    """``held`` while its holder renews it; ``expired`` (or released) once it stopped; ``dead`` when its holder
    is a process of this machine that is gone (the next claimant takes it at once)."""
    if info.expired(now):
        return "expired"
    if info.holder is not None and alive(info.holder) is False:
        return "dead"
    return "held"


def _seconds(later: datetime, earlier: datetime) -> float:
    return round((later - earlier).total_seconds(), 3)


def _relative(when: datetime, now: datetime) -> str:
    delta = when - now
    if abs(delta.total_seconds()) < 1:
        return "now"
    return f"in {format_duration(delta)}" if delta.total_seconds() > 0 else f"{format_duration(-delta)} ago"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def host_entry(info: LeaseInfo, holds: Sequence[str], now: datetime, state: str) -> dict[str, Any]:
    detail = info.detail
    return {
        "host": info.holder.host if info.holder else info.name.removeprefix(HOST_PREFIX).rsplit("/", 1)[0],
        "pid": info.holder.pid if info.holder else None,
        "command": _text(detail.get("command")),
        "home": _text(detail.get("home")),
        "shard": _text(detail.get("shard")),
        "warm_boxes": _int(detail.get("warm_boxes")),
        "spare_boxes": _int(detail.get("spare_boxes")),  # issue 37: started ahead, not yet claimed
        "holds": list(holds),
        "started_at": _text(detail.get("started_at")) or iso(info.acquired_at),
        "renewed_at": iso(info.renewed_at),
        "expires_at": iso(info.expires_at),
        "lease_age_s": _seconds(now, info.renewed_at),
        "expires_in_s": _seconds(info.expires_at, now),
        "state": state,
    }


def lease_entry(info: LeaseInfo, now: datetime, state: str) -> dict[str, Any]:
    return {
        "name": info.name,
        "host": info.holder.host if info.holder else None,
        "pid": info.holder.pid if info.holder else None,
        "token": info.token,
        "acquired_at": iso(info.acquired_at),
        "renewed_at": iso(info.renewed_at),
        "expires_at": iso(info.expires_at),
        "expires_in_s": _seconds(info.expires_at, now),
        "state": state,
    }


def cluster(
    infos: Sequence[LeaseInfo], now: datetime, alive: Callable[[Holder], bool | None] = liveness.alive
) -> dict[str, list[dict[str, Any]]]:
    """What ``impyard hosts --json`` prints: every host record, and every other lease with its holder."""
    others = [info for info in infos if not info.name.startswith(HOST_PREFIX)]
    states = {info.name: lease_state(info, now, alive) for info in infos}
    hosts = [
        host_entry(
            info,
            [o.name for o in others if o.holder == info.holder and states[o.name] == "held"],
            now,
            states[info.name],
        )
        for info in infos
        if info.name.startswith(HOST_PREFIX)
    ]
    return {"hosts": hosts, "leases": [lease_entry(info, now, states[info.name]) for info in others]}


def _boxes(warm: int | None, spares: int | None) -> str:
    """The warm boxes cell: ``2``, or ``2 (+1 spare)`` while spares wait (issue 37)."""
    shown = "?" if warm is None else str(warm)
    return f"{shown} (+{spares} spare{'s' if spares != 1 else ''})" if spares else shown


def _host_row(host: dict[str, Any], now: datetime) -> tuple[str, ...]:
    started = datetime.fromisoformat(host["started_at"]) if host["started_at"] else None
    return tuple(
        escape(cell)
        for cell in (
            host["host"],
            str(host["pid"] or "?"),
            host["command"] or "?",
            host["shard"] or "-",
            _boxes(host["warm_boxes"], host.get("spare_boxes")),
            ", ".join(host["holds"]) or "-",
            host["home"] or "?",
            _relative(started, now) if started else "?",
            _relative(datetime.fromisoformat(host["renewed_at"]), now),
            _relative(datetime.fromisoformat(host["expires_at"]), now),
            host["state"],
        )  # fmt: skip
    )


def _lease_row(lease: dict[str, Any], now: datetime) -> tuple[str, ...]:
    return tuple(
        escape(cell)
        for cell in (
            lease["name"],
            lease["host"] or "?",
            str(lease["pid"] or "?"),
            str(lease["token"]),
            _relative(datetime.fromisoformat(lease["acquired_at"]), now),
            _relative(datetime.fromisoformat(lease["expires_at"]), now),
            lease["state"],
        )  # fmt: skip
    )


@click.command("hosts")
@output_options
def hosts_command(out: Output) -> None:
    """List the hosts serving from this database, and who holds each shard and terminal channel.

    \b
    Every `impyard serve` and `impyard chat` registers itself while it runs,
    renewing its record every 10 s: a host whose record expired stopped (or
    lost the database). "dead" is a holder of this machine that is gone: its
    shard or channel is taken over at once by the next host that asks.
    Examples:
      impyard hosts
      IMPYARD_DATABASE_URL=postgresql://imp@db/yard impyard hosts --json
    """
    now = SystemClock().now()
    with database() as db:
        found = cluster(LeaseStore(db).list(), now)
    if out.as_json:
        out.json(found)
        return
    if not found["hosts"] and not found["leases"]:
        click.echo(NO_HOSTS)
        return
    out.table(HOST_COLUMNS, (_host_row(host, now) for host in found["hosts"]), title="Hosts")
    if found["leases"]:
        click.echo()
        out.table(LEASE_COLUMNS, (_lease_row(lease, now) for lease in found["leases"]), title="Leases")
