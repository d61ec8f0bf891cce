"""The tasks' rows in portable SQL (impyard.storage.tables; SQLite and PostgreSQL, docs/storage.md): queueing a task and
its task-log channel, and reading tasks by id. Each function runs inside the caller's ``Database.write`` or
``Database.read``, whose transaction it joins, so it does database work only (a write may run more than once)."""

from __future__ import annotations

import json
from collections.abc import Collection
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.engine import Connection

from impyard.clock import iso
from impyard.storage.portable import upsert
from impyard.storage.tables import channels, tasks
from impyard.tasks.request import TASK_CHANNEL_PREFIX, ValidTask
from impyard.tasks.rows import Task, row_to_task

ID_CHUNK = 500  # ids per `IN (...)`: well under either engine's bound on parameters


def ensure_task_channel(conn: Connection, channel_id: str, now: datetime) -> None:
    """The imp's task log is the host's own channel (trusted like the terminal); others are left as they are."""
    if channel_id.startswith(TASK_CHANNEL_PREFIX):
        conn.execute(
            upsert(conn.dialect.name)(channels)
            .values(
                channel_id=channel_id, surface="terminal", kind="terminal",
                name=f"tasks of {channel_id[len(TASK_CHANNEL_PREFIX) :]}", trusted=0, updated_at=iso(now),
            )
            .on_conflict_do_nothing(index_elements=[channels.c.channel_id])
        )  # fmt: skip


def insert_task(
    conn: Connection,
    task: ValidTask,
    *,
    task_id: str,
    now: datetime,
    schedule_id: str | None = None,
    scheduled_for: datetime | None = None,
    not_before: datetime | None = None,
    parent_task: str | None = None,
    parent_gate: str | None = None,
) -> bool:
    """Queue ``task`` as ``task_id``; False when it exists already: the same fire of a schedule (UNIQUE
    schedule_id, scheduled_for) or the follow-up of the same gate (UNIQUE parent_gate)."""
    ensure_task_channel(conn, task.channel_id, now)
    added = conn.execute(
        upsert(conn.dialect.name)(tasks)
        .values(
            id=task_id, imp=task.imp, kind=task.kind, prompt=task.prompt, person=task.person, origin=task.origin,
            channel_id=task.channel_id, ceiling_s=task.ceiling_s, wake_on_resolve=int(task.wake_on_resolve),
            briefing=int(task.briefing), state="queued", not_before=iso(not_before or now), schedule_id=schedule_id,
            scheduled_for=iso(scheduled_for) if scheduled_for else None, parent_task=parent_task,
            parent_gate=parent_gate, created_at=iso(now), updated_at=iso(now), scope=task.scope,
            args=json.dumps(dict(task.args), sort_keys=True) if task.args else None,
        )
        .on_conflict_do_nothing()
        .returning(tasks.c.id)
    )  # fmt: skip
    return (
        added.scalar_one_or_none() is not None
    )  # RETURNING: the row inserted (rowcount is not portable here)


def tasks_by_id(conn: Connection, task_ids: Collection[str]) -> dict[str, Task]:
    """The tasks of ``task_ids`` that exist, by id (one query per ``ID_CHUNK`` ids; the rest are absent)."""
    ids = sorted(set(task_ids))
    found: dict[str, Task] = {}
    for start in range(0, len(ids), ID_CHUNK):
        rows = conn.execute(select(tasks).where(tasks.c.id.in_(ids[start : start + ID_CHUNK]))).mappings()
        found.update((row["id"], row_to_task(row)) for row in rows)
    return found
