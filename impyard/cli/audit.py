"""``impyard audit``: what the gateway decided, one row per box request and gate transition."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Column, Table

from impyard.audit import AuditLog
from impyard.cli.errors import CliError
from impyard.clock import SystemClock
from impyard.db import DatabaseError, open_database


@click.group("audit")
def audit_group() -> None:
    """The gateway's audit log."""


@audit_group.command("tail")
@click.option("--imp", default=None, help="Only this imp's rows.")
@click.option(
    "-n", "count", type=click.IntRange(1, 10_000), default=20, show_default=True, help="How many rows."
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def tail_command(imp: str | None, count: int, as_json: bool) -> None:
    """Show the latest audit rows, oldest first.

    \b
    Examples:
      impyard audit tail
      impyard audit tail --imp pip -n 50 --json
    """
    try:
        db = open_database()
    except DatabaseError as exc:
        raise CliError(str(exc)) from exc
    records = AuditLog(db, SystemClock()).tail(count, imp=imp)
    db.close()
    if as_json:
        for record in records:
            click.echo(json.dumps(record.to_json()))
        return
    if not records:
        click.echo("no audit rows yet")
        return
    table = Table(
        Column("time (UTC)", no_wrap=True), "imp", "method", "purpose", "verdict", Column("rule", no_wrap=True),
        "cost $", "gate", "ms", "detail",
    )  # fmt: skip
    for r in records:
        table.add_row(
            f"{r.at:%m-%d %H:%M:%S}" if r.at else "", r.imp, r.method, r.purpose, r.verdict, r.rule,
            f"{r.cost_micros / 1_000_000:.6f}" if r.cost_micros else "", r.gate_id or "",
            f"{r.latency_ms:.1f}" if r.latency_ms is not None else "", (r.reason or r.detail)[:80],
        )  # fmt: skip
    Console().print(table)
