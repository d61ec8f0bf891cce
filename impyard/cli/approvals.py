"""``impyard approvals``: the gates waiting for a decision, and the operator's decisions."""

from __future__ import annotations

import click

from impyard.cli.database import open_or_fail
from impyard.cli.errors import CliError
from impyard.cli.output import Col, Output, output_options
from impyard.clock import SystemClock
from impyard.gateway.audit import AuditLog
from impyard.gateway.gates import (
    Gate,
    GateError,
    GateStore,
    decision_line,
    operator_approver,
    who_may_decide,
)
from impyard.storage.db import Database


def _store() -> tuple[Database, GateStore]:
    db, clock = open_or_fail(), SystemClock()
    return db, GateStore(db, clock, AuditLog(db, clock))


def _describe(gate: Gate) -> str:
    content = gate.send.content
    files = gate.send.files
    lines = [
        f"gate {gate.id}: {gate.state}",
        f"  imp       {gate.imp} (session channel {gate.session_channel}, run {gate.run_id})",
        f"  act       {gate.act} to channel {gate.target} (kind {gate.send.kind})",
        f"  why gated {gate.reason}",
        f"  deciders  {who_may_decide(gate)}",
        f"  created   {gate.created_at:%Y-%m-%d %H:%M:%S} UTC, deadline {gate.deadline:%Y-%m-%d %H:%M:%S} UTC",
    ]
    if gate.decided_by:
        lines.append(
            f"  decided   by {gate.decided_by}" + (f": {gate.decision_note}" if gate.decision_note else "")
        )
    if gate.state == "executed":
        lines.append(f"  sent      message ids {', '.join(gate.message_ids)}")
    if gate.error:
        lines.append(f"  error     {gate.error}")
    lines.append(f"  files     {', '.join(f.filename for f in files) or 'none'}")
    lines.append("  content   " + content.replace("\n", "\n            "))
    return "\n".join(lines)


def _gate_row(gate: Gate) -> tuple[str, ...]:
    content = gate.send.content.replace("\n", " ")
    return (
        gate.id, gate.state, gate.imp, gate.act, gate.target, f"{gate.deadline:%Y-%m-%d %H:%M}",
        content[:60] + ("…" if len(content) > 60 else ""),
    )  # fmt: skip


@click.group("approvals")
def approvals_group() -> None:
    """Gated acts waiting for a human decision (docs/security.md, "Approvals").

    \b
    Example:
      impyard approvals ls
      impyard approvals approve g-1a2b3c4d5e6f --note "fine"
    """


@approvals_group.command("ls")
@click.option("--all", "show_all", is_flag=True, help="Every gate, not only the pending ones.")
@output_options
def ls_command(show_all: bool, out: Output) -> None:
    """List pending gates (past-deadline ones are expired first).

    \b
    Example:
      impyard approvals ls
    """
    db, store = _store()
    store.expire_due()
    gates = store.latest(None if show_all else ("pending",))
    db.close()
    out.listing(
        [gate.to_json() for gate in gates],
        columns=(Col("gate", no_wrap=True), "state", "imp", "act", "target", "deadline (UTC)", "content"),
        rows=(_gate_row(gate) for gate in gates),
        empty="no gates" if show_all else "no pending gates",
    )


@approvals_group.command("show")
@click.argument("gate_id")
@output_options
def show_command(gate_id: str, out: Output) -> None:
    """Show one gate with its frozen payload.

    \b
    Example:
      impyard approvals show g-1a2b3c4d5e6f
    """
    db, store = _store()
    try:
        store.expire_due()
        gate = store.get(gate_id)
    except GateError as exc:
        raise CliError(str(exc)) from exc
    finally:
        db.close()
    out.show(gate.to_json(), _describe(gate))


def _decide(gate_id: str, approve: bool, note: str, out: Output) -> None:
    db, store = _store()
    try:
        gate = store.decide(gate_id, operator_approver(), approve=approve, note=note)
    except GateError as exc:
        raise CliError(str(exc)) from exc
    finally:
        db.close()
    out.show(gate.to_json(), decision_line(gate))


@approvals_group.command("approve")
@click.argument("gate_id")
@click.option("--note", default="", help="Why (kept with the decision and in the audit).")
@output_options
def approve_command(gate_id: str, note: str, out: Output) -> None:
    """Approve a pending gate as the host operator.

    \b
    Example:
      impyard approvals approve g-1a2b3c4d5e6f --note "fine to post"
    """
    _decide(gate_id, True, note, out)


@approvals_group.command("deny")
@click.argument("gate_id")
@click.option("--note", default="", help="Why (kept with the decision and in the audit).")
@output_options
def deny_command(gate_id: str, note: str, out: Output) -> None:
    """Deny a pending gate as the host operator (it also resets the imp's earned trust there).

    \b
    Example:
      impyard approvals deny g-1a2b3c4d5e6f --note "not in that channel"
    """
    _decide(gate_id, False, note, out)
