"""The task rows as read from the store (``Task``, ``TaskRun``), built from a row's columns by name (SQLAlchemy's
``RowMapping``, on either engine)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from impyard.clock import iso, parse_iso
from impyard.tasks.request import Origin, TaskArg
from impyard.tasks.states import TaskState

Row = Mapping[Any, Any]  # the columns of one row, by name


@dataclass(frozen=True)
class Task:
    id: str
    imp: str
    kind: str
    prompt: str | None
    person: str | None
    origin: Origin
    channel_id: str
    ceiling_s: float
    wake_on_resolve: bool
    briefing: bool
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
    scope: str | None = None  # a memory task's privacy scope (issue 15: a ``sleep`` task's one scope)
    args: dict[str, TaskArg] = field(default_factory=dict)  # the kind's own arguments (``TaskSpec.args``)

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


def _when(row: Row, name: str) -> datetime | None:
    return parse_iso(row[name]) if row[name] else None


def _args(text: str | None) -> dict[str, TaskArg]:
    """A task's arguments from their JSON text; none when absent or unreadable (written only by ``insert``)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def row_to_task(row: Row) -> Task:
    return Task(
        id=row["id"],
        imp=row["imp"],
        kind=row["kind"],
        prompt=row["prompt"],
        person=row["person"],
        origin=row["origin"],
        channel_id=row["channel_id"],
        ceiling_s=row["ceiling_s"],
        wake_on_resolve=bool(row["wake_on_resolve"]),
        briefing=bool(row["briefing"]),
        state=row["state"],
        attempts=row["attempts"],
        deferrals=row["deferrals"],
        not_before=parse_iso(row["not_before"]),
        cancel_requested=bool(row["cancel_requested"]),
        run_id=row["run_id"],
        outcome=row["outcome"],
        box_outcome=row["box_outcome"],
        box_summary=row["box_summary"],
        schedule_id=row["schedule_id"],
        scheduled_for=_when(row, "scheduled_for"),
        parent_task=row["parent_task"],
        parent_gate=row["parent_gate"],
        created_at=parse_iso(row["created_at"]),
        updated_at=parse_iso(row["updated_at"]),
        started_at=_when(row, "started_at"),
        finished_at=_when(row, "finished_at"),
        scope=row["scope"],
        args=_args(row["args"]),
    )


def row_to_run(row: Row) -> TaskRun:
    return TaskRun(
        run_id=row["run_id"],
        task_id=row["task_id"],
        attempt=row["attempt"],
        backend=row["backend"],
        box_pid=row["box_pid"],
        started_at=parse_iso(row["started_at"]),
        finished_at=_when(row, "finished_at"),
        result=row["result"],
        returncode=row["returncode"],
        detail=row["detail"],
    )
