"""The host's attestation of a task run: its state from what actually happened (pure rules)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from impyard.durations import format_duration
from impyard.failure_words import task_failure
from impyard.gateway.gates import OPEN_STATES
from impyard.tasks.states import TaskState


@dataclass(frozen=True)
class RunFacts:
    """A run as the host's own records tell it: the audit rows and gates of its run id."""

    model_calls: int = 0
    cost_micros: int = 0
    sent: int = 0  # discord.send delivered
    refused: int = 0  # denied, rate limited, budget exhausted, unreachable, error
    budget_refused: bool = False
    gates: tuple[tuple[str, str], ...] = ()  # (gate id, state) of every gate the run opened

    @property
    def acted(self) -> bool:
        """Something left the box for the world (a post, or a request for one)."""
        return self.sent > 0 or bool(self.gates)

    @property
    def open_gates(self) -> list[str]:
        return [gate_id for gate_id, state in self.gates if state in OPEN_STATES]

    def describe(self) -> str:
        parts = [
            f"{self.model_calls} model call{'s' if self.model_calls != 1 else ''} (${self.cost_micros / 1e6:.4f})"
        ]
        parts.append(f"{self.sent} post{'s' if self.sent != 1 else ''} delivered")
        if self.gates:
            parts.append(f"{len(self.gates)} gated")
        if self.refused:
            parts.append(f"{self.refused} refused")
        return ", ".join(parts)


@dataclass(frozen=True)
class RunEnd:
    """How the box run ended, as the host saw it."""

    box_outcome: str | None = None  # the box's answer to task.run: done | failed | pending; None = no answer
    box_summary: str = ""
    ceiling_s: float = 0.0
    ceiling_hit: bool = False
    died: str | None = None  # could not start, died, broke the protocol, refused the task
    cancelled: bool = False  # the operator cancelled it while it ran


@dataclass(frozen=True)
class Attestation:
    state: TaskState  # queued means: deferred to the next budget window
    outcome: str
    deferred: bool = False


def gates_verdict(gates: Sequence[tuple[str, str]]) -> Attestation | None:
    """For a task whose acts were gated: still waiting, all sent, or not (all decided)."""
    if not gates:
        return None
    waiting = [gate_id for gate_id, state in gates if state in OPEN_STATES]
    if waiting:
        return Attestation("needs_review", f"waiting for approval: {', '.join(waiting)}")
    refused = [f"{gate_id} {state}" for gate_id, state in gates if state != "executed"]
    if refused:
        return Attestation("failed", f"gated act not sent: {', '.join(refused)}")
    return Attestation(
        "done",
        f"gated act{'s' if len(gates) > 1 else ''} approved and sent: {', '.join(g for g, _ in gates)}",
    )


def attest(end: RunEnd, facts: RunFacts) -> Attestation:
    """The task's state from what happened; the box's claim only decides between outcomes the host allows."""
    seen = facts.describe()
    if end.cancelled:
        return Attestation(
            "cancelled", f"cancelled by the operator while running; the box was killed ({seen})"
        )
    if end.ceiling_hit:
        return Attestation("failed", f"killed at its ceiling of {format_duration(end.ceiling_s)} ({seen})")
    if end.died is not None:
        return Attestation("failed", f"the box failed: {end.died[:300]} ({seen})")
    if facts.budget_refused and end.box_outcome != "done" and not facts.acted:
        return Attestation("queued", f"deferred: the imp's budget is exhausted ({seen})", deferred=True)
    gated = gates_verdict(facts.gates)
    if gated is not None and gated.state == "needs_review":
        return Attestation("needs_review", f"{gated.outcome} ({seen})")
    if end.box_outcome == "failed":
        return Attestation(
            "failed",
            f"the box reported failure: {task_failure(end.box_summary)[:300]} ({seen})",  # issue 19 #5
        )
    if end.box_outcome == "pending" and gated is None:
        return Attestation(
            "needs_review", f"the box said pending, but it opened no gate; check its report ({seen})"
        )
    if gated is not None:
        return Attestation(gated.state, f"{gated.outcome} ({seen})")
    if end.box_outcome == "done":
        return Attestation("done", f"done ({seen})")
    return Attestation("failed", f"the box gave no answer ({seen})")  # pragma: no cover - died covers it


ReclaimAction = Literal["requeue", "failed", "needs_review", "cancelled"]


def reclaim_decision(
    *, attempts: int, max_attempts: int, acted: bool, cancel_requested: bool
) -> tuple[ReclaimAction, str]:
    """A task left ``running`` by a supervisor that died: run it again only when that cannot act twice."""
    if cancel_requested:
        return "cancelled", "cancelled by the operator; its supervisor had stopped"
    if acted:
        return (
            "needs_review",
            "interrupted after it acted (a post or a gate); not rerun, so nothing is done twice",
        )
    if attempts >= max_attempts:
        return "failed", f"interrupted {attempts} time(s); not retried again (max {max_attempts} attempts)"
    return "requeue", f"requeued: its supervisor stopped during attempt {attempts}"
