"""The prompt text a task's box gets: a gate's follow-up, the imp's briefing of its past tasks (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from impyard.gateway.gates import Gate
from impyard.tasks.request import MAX_PROMPT_CHARS

BRIEFING_MAX_CHARS = 4_000


def _quote(text: str, limit: int) -> str:
    text = text.strip()
    if len(text) > limit:
        text = text[:limit].rstrip() + " […]"
    return "\n".join(f"> {line}" for line in text.splitlines() or [""])


def continuation_prompt(task_id: str, task_prompt: str | None, gate: Gate) -> str:
    """The follow-up's prompt: the gate's outcome, what was asked, and the original task (host-written)."""
    decided = f" by {gate.decided_by}" if gate.decided_by else ""
    note = f' (note: "{gate.decision_note[:300]}")' if gate.decision_note else ""
    outcome = {
        "executed": f"was approved{decided}{note} and sent (message ids: {', '.join(gate.message_ids) or 'none'})",
        "failed": f"was approved{decided}{note}, but delivery failed: {(gate.error or 'unknown error')[:300]}",
        "denied": f"was denied{decided}{note}; it was not sent",
        "expired": "expired without a decision; it was not sent",
    }.get(gate.state, f"is {gate.state}")
    lines = [
        f"## Follow-up to your task {task_id}",
        f"Your request ({gate.act} to channel {gate.target}, gate {gate.id}) {outcome}.",
    ]
    content = gate.send.content
    if content:
        lines += ["What you asked to send:", _quote(content, 1_500)]
    if task_prompt:
        lines += ["The original task:", _quote(task_prompt, 3_000)]
    lines.append("Decide whether anything else needs doing now; if nothing does, answer without posting.")
    return "\n".join(lines)[:MAX_PROMPT_CHARS]


@dataclass(frozen=True)
class JournalEntry:
    task_id: str
    kind: str
    origin: str
    state: str
    outcome: str
    box_summary: str
    finished_at: datetime


def render_briefing(entries: Sequence[JournalEntry], max_chars: int = BRIEFING_MAX_CHARS) -> str | None:
    """The imp's own past task outcomes, newest first, bounded; None when there are none."""
    if not entries:
        return None
    lines = ["## Your recent tasks (the host's records, newest first)"]
    for entry in entries:
        said = " ".join(entry.box_summary.split())
        said = f' You reported: "{said[:280]}{"…" if len(said) > 280 else ""}"' if said else ""
        line = (
            f"- {entry.finished_at:%Y-%m-%d %H:%M} UTC, {entry.kind} ({entry.origin}): {entry.state}.{said}"
        )
        if sum(len(item) + 1 for item in lines) + len(line) > max_chars:
            break
        lines.append(line)
    return "\n".join(lines) if len(lines) > 1 else None


def compose_prompt(prompt: str | None, briefing: str | None) -> str | None:
    """What the box gets as the task's prompt: the briefing (when asked for) as context, then the task."""
    if not briefing:
        return prompt
    if not prompt:
        return briefing
    return f"{briefing}\n\n## This task\n{prompt}"
