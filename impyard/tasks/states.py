"""A task's lifecycle states: ``queued → running → done | failed | needs_review | cancelled``."""

from __future__ import annotations

from typing import Literal

TaskState = Literal["queued", "running", "done", "failed", "needs_review", "cancelled"]
TASK_STATES: tuple[TaskState, ...] = ("queued", "running", "done", "failed", "needs_review", "cancelled")
FINISHED_STATES: tuple[TaskState, ...] = ("done", "failed", "needs_review", "cancelled")
