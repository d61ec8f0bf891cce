"""``impyard audit``: what the gateway decided, one row per box request and gate transition."""

from __future__ import annotations

import click

from impyard.cli.database import database
from impyard.cli.output import Col, Output, output_options
from impyard.clock import SystemClock
from impyard.gateway.audit import AuditFilter, AuditLog, AuditRecord

AUDIT_COLUMNS = (
    Col("time (UTC)", no_wrap=True), "imp", "method", "purpose", "verdict", Col("rule", no_wrap=True),
    "cost $", "gate", "ms", "detail",
)  # fmt: skip


def _audit_row(r: AuditRecord) -> tuple[str, ...]:
    return (
        f"{r.at:%m-%d %H:%M:%S}" if r.at else "", r.imp, r.method, r.purpose, r.verdict, r.rule,
        f"{r.cost_micros / 1_000_000:.6f}" if r.cost_micros else "", r.gate_id or "",
        f"{r.latency_ms:.1f}" if r.latency_ms is not None else "", (r.reason or r.detail)[:80],
    )  # fmt: skip


@click.group("audit")
def audit_group() -> None:
    """The gateway's audit log.

    One row per box request and gate transition. A box that keeps sending requests the protocol refuses gets a
    row for each up to its budget; a "(folded)" row then counts the rest, by what was refused (e.g.
    "model.request refused 2 more times the same way (-32602)"). Requests the gateway refused always have a
    row of their own.

    \b
    Example:
      impyard audit tail --imp pip -n 50
    """


@audit_group.command("tail")
@click.option("--imp", default=None, help="Only this imp's rows.")
@click.option(
    "-n", "count", type=click.IntRange(1, 10_000), default=20, show_default=True, help="How many rows."
)
@click.option("--method", default=None, help="Only rows of this method (model.request, discord.send, gate…).")
@click.option("--rule", default=None, help="Only rows decided by this policy rule.")
@click.option("--verdict", default=None, help="Only rows with this verdict (allowed, denied, gated, error…).")
@output_options
def tail_command(
    imp: str | None, count: int, method: str | None, rule: str | None, verdict: str | None, out: Output
) -> None:
    """Show the latest audit rows, oldest first; with --json, one JSON object per line.

    Filters match whole values; the console's Audit page offers the same ones.

    \b
    Examples:
      impyard audit tail
      impyard audit tail --imp pip -n 50 --json
      impyard audit tail --verdict denied --rule send-untrusted
    """
    where = AuditFilter(imp=imp, method=method, rule=rule, verdict=verdict)
    with database() as db:
        records = AuditLog(db, SystemClock()).search(count, where)[::-1]
    out.listing(
        [record.to_json() for record in records],
        columns=AUDIT_COLUMNS,
        rows=(_audit_row(record) for record in records),
        empty="no audit rows yet",
        one_per_line=True,
    )
