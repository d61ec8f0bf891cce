"""The task rows as read from the store (``Task``, ``TaskRun``), built from a row's columns by name
(``impyard.storage.rows``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from impyard.clock import iso
from impyard.storage.rows import RowMapper, json_of
from impyard.tasks.request import ValidTask
from impyard.tasks.states import TaskState


@dataclass(frozen=True, kw_only=True)
class Task(ValidTask):
    """A stored task: what it was asked to do (``ValidTask``) and where it stands."""

    id: str
    state: TaskState
    attempts: int
    deferrals: int
    not_before: datetime
    cancel_requested: bool
    run_id: str | None
    outcome: str | None
    box_outcome: str | None
    box_summary: str | None
    schedule_id: str | None
    scheduled_for: datetime | None
    parent_task: str | None
    parent_gate: str | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    def elapsed(self, now: datetime) -> timedelta | None:
        """How long it has run (running) or ran (finished)."""
        if self.started_at is None:
            return None
        end = now if self.state == "running" else (self.finished_at or now)
        return max(timedelta(0), end - self.started_at)

    def to_json(self, now: datetime | None = None) -> dict[str, Any]:
        def when(value: datetime | None) -> str | None:
            return iso(value) if value else None

        elapsed = self.elapsed(now) if now is not None else None
        return {
            "id": self.id,
            "imp": self.imp,
            "kind": self.kind,
            "prompt": self.prompt,
            "person": self.person,
            "origin": self.origin,
            "channel_id": self.channel_id,
            "ceiling_s": self.ceiling_s,
            "wake_on_resolve": self.wake_on_resolve,
            "briefing": self.briefing,
            "state": self.state,
            "attempts": self.attempts,
            "deferrals": self.deferrals,
            "not_before": iso(self.not_before),
            "cancel_requested": self.cancel_requested,
            "run_id": self.run_id,
            "outcome": self.outcome,
            "box_outcome": self.box_outcome,
            "box_summary": self.box_summary,
            "schedule_id": self.schedule_id,
            "scheduled_for": when(self.scheduled_for),
            "parent_task": self.parent_task,
            "parent_gate": self.parent_gate,
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
            "started_at": when(self.started_at),
            "finished_at": when(self.finished_at),
            "elapsed_s": round(elapsed.total_seconds(), 3) if elapsed is not None else None,
            "scope": self.scope,
            "args": dict(self.args),
        }


@dataclass(frozen=True)
class TaskRun:
    run_id: str
    task_id: str
    attempt: int
    backend: str
    box_pid: int | None
    started_at: datetime
    finished_at: datetime | None
    result: str | None
    returncode: int | None
    detail: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "attempt": self.attempt,
            "backend": self.backend,
            "box_pid": self.box_pid,
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at) if self.finished_at else None,
            "result": self.result,
            "returncode": self.returncode,
            "detail": self.detail,
        }


row_to_task = RowMapper(
    Task, args=json_of(dict)
)  # args: written only by ``insert``; unreadable ones are none
row_to_run = RowMapper(TaskRun)
