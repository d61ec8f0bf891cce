"""``impyard hosts``: the hosts serving from this database, and who holds each shard, terminal channel and task run.

Read from the ``leases`` table (impyard.storage.leases), so it sees every host that shares the database — two homes on
one machine, or several machines on one PostgreSQL — not only this home: each ``impyard serve`` and
``impyard chat`` keeps a ``host:<hostname>/<pid>`` record there (home, command, shard, warm boxes, start),
renewed while it runs, beside the shard and channel leases it holds (issue 21, "Seeing the cluster"). The rows and
their states are ``impyard.storage.cluster``'s, which the console's Hosts page shows too; this module prints them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import click
from rich.markup import escape

from impyard.cli.database import database
from impyard.cli.output import Col, Output, output_options
from impyard.clock import SystemClock
from impyard.durations import relative_time
from impyard.storage import liveness
from impyard.storage.cluster import Alive, HostRow, LeaseRow, lease_state, read_cluster
from impyard.storage.cluster import cluster as cluster_rows
from impyard.storage.leases import LeaseInfo

HOST_COLUMNS = (
    Col("host", no_wrap=True), Col("pid", no_wrap=True), "command", "shard", "warm boxes", "imp settings", "holds", "home",
    Col("started", no_wrap=True), Col("renewed", no_wrap=True), Col("expires", no_wrap=True), "state",
)  # fmt: skip
LEASE_COLUMNS = (
    Col("lease", no_wrap=True), Col("holder", no_wrap=True), Col("pid", no_wrap=True), "token",
    Col("held since", no_wrap=True), Col("expires", no_wrap=True), "state",
)  # fmt: skip
NO_HOSTS = (
    "no hosts on this database yet: each `impyard serve` and `impyard chat` registers itself while it runs"
)
__all__ = ["cluster", "hosts_command", "lease_state"]


def cluster(
    infos: Sequence[LeaseInfo], now: datetime, alive: Alive = liveness.alive
) -> dict[str, list[dict[str, Any]]]:
    """What ``impyard hosts --json`` prints for these lease rows (``impyard.storage.cluster.cluster``'s rows)."""
    return cluster_rows(infos, now, alive).as_json()


def _host_row(host: HostRow, now: datetime) -> tuple[str, ...]:
    return tuple(
        escape(cell)
        for cell in (
            host.host,
            str(host.pid or "?"),
            host.command or "?",
            host.shard or "-",
            host.boxes_text,
            host.revisions_text,
            ", ".join(host.holds) or "-",
            host.home or "?",
            relative_time(host.started_at, now) if host.started_at else "?",
            relative_time(host.renewed_at, now),
            relative_time(host.expires_at, now),
            host.state,
        )  # fmt: skip
    )


def _lease_row(lease: LeaseRow, now: datetime) -> tuple[str, ...]:
    return tuple(
        escape(cell)
        for cell in (
            lease.name,
            lease.host or "?",
            str(lease.pid or "?"),
            str(lease.token),
            relative_time(lease.acquired_at, now),
            relative_time(lease.expires_at, now),
            lease.state,
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
    shard or channel is taken over at once by the next host that asks. The
    shard layout line says how the serving hosts split Discord (N of
    --shard I/N, or without --shard): a host of another layout is refused
    while it is held (docs/hosts.md, "Changing the number of shards").
    Examples:
      impyard hosts
      IMPYARD_DATABASE_URL=postgresql://imp@db/yard impyard hosts --json
    """
    now = SystemClock().now()
    with database() as db:
        found = read_cluster(db, now)
    if out.as_json:
        out.json(found.as_json())
        return
    if found.layout_line is not None:
        click.echo(found.layout_line)
        click.echo()
    if not found.hosts and not found.leases:
        click.echo(NO_HOSTS)
        return
    out.table(HOST_COLUMNS, (_host_row(host, now) for host in found.hosts), title="Hosts")
    if found.leases:
        click.echo()
        out.table(LEASE_COLUMNS, (_lease_row(lease, now) for lease in found.leases), title="Leases")
