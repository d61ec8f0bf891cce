"""The task store: queued tasks in the host database (SQLite or PostgreSQL, docs/storage.md), each state move one
conditional UPDATE in ``Database.write`` whose rowcount decides it, logged once it is committed.

Every move names the state it leaves (``WHERE state = 'queued'``, ``... AND run_id = <the run>``), so of two
supervisors (one host, or two sharing the database: issue 21) exactly one claims a queued task, and only the run
that holds a task ends it. On PostgreSQL the write is SERIALIZABLE and runs again after a conflict, when the
loser's UPDATE then matches no row.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, exists, select, update
from sqlalchemy.engine import Connection

from impyard.clock import Clock, iso
from impyard.gateway.audit import AuditRecord, row_to_record
from impyard.gateway.gates import FINAL_STATES, OPEN_STATES, Gate, row_to_gate
from impyard.imps.store import ImpStore
from impyard.storage.db import Database, Store
from impyard.storage.portable import bytewise
from impyard.storage.tables import audit, gates, task_runs, tasks
from impyard.tasks.attestation import Attestation, ReclaimAction, RunEnd, RunFacts, gates_verdict
from impyard.tasks.prompts import JournalEntry, continuation_prompt
from impyard.tasks.request import TaskError, TaskRequest, ValidTask, validate_request
from impyard.tasks.rows import Task, TaskRun, row_to_run, row_to_task
from impyard.tasks.sql import ID_CHUNK, ensure_task_channel, insert_task, tasks_by_id

log = logging.getLogger("impyard.tasks")

MAX_BOX_SUMMARY_CHARS = 2_000  # what is kept of the box's own report
JOURNAL_ENTRIES = 10
FINISHED_STATES = ("done", "failed", "needs_review")  # what the journal shows
REFUSED_VERDICTS = ("denied", "rate_limited", "budget_exhausted", "unreachable", "error")


def log_transition(task_id: str, imp: str, old: str, new: str, **fields: object) -> None:
    """One structured line per state change: ``task t-… queued -> running imp=pip run=…``."""
    extra = " ".join(f"{key}={json.dumps(value) if isinstance(value, str) and ' ' in value else value}"
                     for key, value in fields.items() if value is not None)  # fmt: skip
    log.info("task %s %s -> %s imp=%s%s", task_id, old, new, imp, f" {extra}" if extra else "")


def _task_row(conn: Connection, task_id: str) -> Task | None:
    return row_to_task.first(conn, select(tasks).where(tasks.c.id == task_id))


def _not_found(task_id: str) -> TaskError:
    return TaskError(f"no task {task_id!r}; `impyard task ls` lists them")


class TaskStore(Store):
    def __init__(self, db: Database, clock: Clock, imps: ImpStore | None = None) -> None:
        self.db = db
        self.clock = clock
        self.imps = imps

    def _c(self, column: ColumnElement[str]) -> ColumnElement[str]:
        """A text column ordered byte by byte on either engine (ISO times, ids)."""
        return bytewise(column)

    def _rows(self, query: Select[Any]) -> list[Task]:
        return self.db.read(lambda conn: row_to_task.all(conn, query))

    def _move(self, task_id: str, moved: Any) -> Task | None:
        """One conditional UPDATE of a task in its own transaction: the task, moved, or None when it did not match."""
        if self.db.write(lambda conn: conn.execute(moved).rowcount) != 1:
            return None
        return self.get(task_id)

    # ------------------------------------------------------------ adding

    def ensure_channel(self, conn: Connection, channel_id: str) -> None:
        """The imp's task log is the host's own channel (trusted like the terminal); others are left as they are."""
        ensure_task_channel(conn, channel_id, self.clock.now())

    def insert(
        self,
        conn: Connection,
        request: TaskRequest | ValidTask,
        *,
        schedule_id: str | None = None,
        scheduled_for: datetime | None = None,
        not_before: datetime | None = None,
        parent_task: str | None = None,
        parent_gate: str | None = None,
    ) -> str | None:
        """Insert a queued task in the caller's transaction (``Database.write``); None when it exists already (same
        fire or gate). Database work only, so it may run again; the caller logs the task once it is committed."""
        task = request if isinstance(request, ValidTask) else validate_request(request)
        task_id = f"t-{secrets.token_hex(5)}"
        added = insert_task(
            conn, task, task_id=task_id, now=self.clock.now(), schedule_id=schedule_id, scheduled_for=scheduled_for,
            not_before=not_before, parent_task=parent_task, parent_gate=parent_gate,
        )  # fmt: skip
        return task_id if added else None

    def _queued(self, task_id: str) -> Task:
        task = self.get(task_id)
        log_transition(
            task.id, task.imp, "new", "queued", kind=task.kind, origin=task.origin, channel=task.channel_id,
            scope=task.scope,
        )  # fmt: skip
        return task

    def add(self, request: TaskRequest) -> Task:
        """Validate (the imp must exist when the store knows the imps) and queue; nothing is written on a refusal."""
        task = validate_request(request, self.imps)
        task_id = self.db.write(lambda conn: self.insert(conn, task))
        assert task_id is not None
        return self._queued(task_id)

    # ------------------------------------------------------------ reading

    def get(self, task_id: str) -> Task:
        task = self.db.read(lambda conn: _task_row(conn, task_id))
        if task is None:
            raise _not_found(task_id)
        return task

    def by_ids(self, task_ids: Collection[str]) -> dict[str, Task]:
        """The tasks of ``task_ids`` that exist, by id (one query per ``ID_CHUNK`` ids; the rest are absent)."""
        return self.db.read(lambda conn: tasks_by_id(conn, task_ids))

    def latest(
        self, *, imp: str | None = None, states: Collection[str] | None = None, limit: int = 100
    ) -> list[Task]:
        """The newest tasks first (of ``imp``, in ``states``, when given), at most ``limit``."""
        query = select(tasks)
        if imp is not None:
            query = query.where(tasks.c.imp == imp)
        if states:
            query = query.where(tasks.c.state.in_(sorted(states)))
        return self._rows(
            query.order_by(self._c(tasks.c.created_at).desc(), self._c(tasks.c.id)).limit(max(0, limit))
        )

    def ready(
        self, limit: int, kinds: Collection[str] | None = None, *, imps: Collection[str] | None = None
    ) -> list[Task]:
        """Queued tasks whose time has come, oldest first (only of ``kinds`` and of ``imps``, when given)."""
        query = select(tasks).where(
            tasks.c.state == "queued",
            tasks.c.cancel_requested == 0,
            tasks.c.not_before <= iso(self.clock.now()),
        )
        if kinds is not None:
            query = query.where(tasks.c.kind.in_(sorted(kinds)))
        if imps is not None:
            query = query.where(tasks.c.imp.in_(sorted(imps)))
        order = (self._c(tasks.c.not_before), self._c(tasks.c.created_at), self._c(tasks.c.id))
        return self._rows(query.order_by(*order).limit(max(0, limit)))

    def has_ready(self, kinds: Collection[str] | None = None, *, imps: Collection[str] | None = None) -> bool:
        return bool(self.ready(1, kinds, imps=imps))

    def running(self) -> list[Task]:
        query = select(tasks).where(tasks.c.state == "running")
        return self._rows(query.order_by(self._c(tasks.c.started_at), self._c(tasks.c.id)))

    def cancel_requested(self, task_ids: Collection[str]) -> list[str]:
        ids = sorted(set(task_ids))

        def requested(conn: Connection) -> list[str]:
            found: list[str] = []
            for start in range(0, len(ids), ID_CHUNK):
                query = select(tasks.c.id).where(
                    tasks.c.cancel_requested == 1, tasks.c.id.in_(ids[start : start + ID_CHUNK])
                )
                found.extend(conn.scalars(query))
            return found

        return self.db.read(requested) if ids else []

    def runs(self, task_id: str) -> list[TaskRun]:
        query = select(task_runs).where(task_runs.c.task_id == task_id).order_by(task_runs.c.attempt)
        return self.db.read(lambda conn: row_to_run.all(conn, query))

    def run(self, run_id: str) -> TaskRun | None:
        query = select(task_runs).where(task_runs.c.run_id == run_id)
        return self.db.read(lambda conn: row_to_run.first(conn, query))

    def audit_trail(self, task_id: str) -> list[AuditRecord]:
        """Every audit row of every run of the task (requests and gate transitions), oldest first."""
        query = (
            select(audit)
            .join(task_runs, audit.c.run_id == task_runs.c.run_id)
            .where(task_runs.c.task_id == task_id)
            .order_by(audit.c.id)
        )
        return self.db.read(lambda conn: row_to_record.all(conn, query))

    def gates_of(self, task_id: str) -> list[Gate]:
        query = (
            select(gates)
            .join(task_runs, gates.c.run_id == task_runs.c.run_id)
            .where(task_runs.c.task_id == task_id)
            .order_by(self._c(gates.c.created_at), self._c(gates.c.id))
        )
        return self.db.read(lambda conn: row_to_gate.all(conn, query))

    def run_facts(self, run_id: str) -> RunFacts:
        """What the host's records say the run did (never what the box says)."""
        requests = select(audit.c.method, audit.c.verdict, audit.c.cost_micros).where(
            audit.c.run_id == run_id, audit.c.method != "gate"
        )
        held = (
            select(gates.c.id, gates.c.state)
            .where(gates.c.run_id == run_id)
            .order_by(self._c(gates.c.created_at), self._c(gates.c.id))
        )
        rows, gated = self.db.read(
            lambda conn: (conn.execute(requests).mappings().all(), conn.execute(held).mappings().all())
        )
        return RunFacts(
            model_calls=sum(1 for r in rows if r["method"] == "model.request" and r["verdict"] == "allowed"),
            cost_micros=sum(int(r["cost_micros"] or 0) for r in rows),
            sent=sum(1 for r in rows if r["method"] == "discord.send" and r["verdict"] == "allowed"),
            refused=sum(1 for r in rows if r["verdict"] in REFUSED_VERDICTS),
            budget_refused=any(r["verdict"] == "budget_exhausted" for r in rows),
            gates=tuple((g["id"], g["state"]) for g in gated),
        )

    def journal(
        self, imp: str, *, limit: int = JOURNAL_ENTRIES, exclude: str | None = None
    ) -> list[JournalEntry]:
        """The imp's own finished tasks, newest first (never another imp's)."""
        query = (
            select(tasks)
            .where(
                tasks.c.imp == imp, tasks.c.state.in_(FINISHED_STATES), tasks.c.finished_at.is_not(None),
                tasks.c.id != (exclude or ""),
            )
            .order_by(self._c(tasks.c.finished_at).desc(), self._c(tasks.c.id))
            .limit(max(0, limit))
        )  # fmt: skip
        return [
            JournalEntry(task.id, task.kind, task.origin, task.state, task.outcome or "", task.box_summary or "",
                         task.finished_at)
            for task in self._rows(query) if task.finished_at is not None
        ]  # fmt: skip

    # ------------------------------------------------------------ transitions

    def claim(self, task_id: str, run_id: str, backend: str) -> Task | None:
        """queued → running with a new run; None when it is no longer queued (cancelled, or claimed)."""
        now = iso(self.clock.now())

        def claim_it(conn: Connection) -> bool:
            attempt = conn.execute(
                update(tasks)
                .where(tasks.c.id == task_id, tasks.c.state == "queued", tasks.c.cancel_requested == 0)
                .values(
                    state="running", attempts=tasks.c.attempts + 1, run_id=run_id, started_at=now,
                    finished_at=None, updated_at=now,
                )
                .returning(tasks.c.attempts)
            ).scalar_one_or_none()  # fmt: skip
            if attempt is None:
                return (
                    False  # the conditional UPDATE matched nothing: someone else has it, or it was cancelled
                )
            conn.execute(
                task_runs.insert().values(
                    run_id=run_id, task_id=task_id, attempt=attempt, backend=backend, started_at=now
                )
            )
            return True

        if not self.db.write(claim_it):
            return None
        task = self.get(task_id)
        log_transition(
            task.id, task.imp, "queued", "running", run=run_id, attempt=task.attempts, backend=backend
        )
        return task

    def record_pid(self, run_id: str, pid: int) -> None:
        recorded = update(task_runs).where(task_runs.c.run_id == run_id).values(box_pid=pid)
        self.db.write(lambda conn: conn.execute(recorded))

    def finish(
        self,
        task_id: str,
        run_id: str,
        attestation: Attestation,
        end: RunEnd,
        *,
        returncode: int | None = None,
        not_before: datetime | None = None,
    ) -> Task | None:
        """running → the attested state (or queued, deferred to ``not_before``); None if the run is not current."""
        now = iso(self.clock.now())
        final = attestation.state != "queued"
        result = {"cancelled": "cancelled", "queued": "deferred"}.get(attestation.state, attestation.state)
        if end.ceiling_hit:
            result = "ceiling"
        elif end.died is not None:
            result = "died"
        ended = (
            update(tasks)
            .where(tasks.c.id == task_id, tasks.c.state == "running", tasks.c.run_id == run_id)
            .values(
                state=attestation.state, outcome=attestation.outcome[:2_000], box_outcome=end.box_outcome,
                box_summary=end.box_summary[:MAX_BOX_SUMMARY_CHARS] or None, updated_at=now,
                finished_at=now if final else None,
                not_before=iso(not_before) if not_before else tasks.c.not_before,
                deferrals=tasks.c.deferrals + int(attestation.deferred),
            )
        )  # fmt: skip
        run_ended = (
            update(task_runs)
            .where(task_runs.c.run_id == run_id)
            .values(finished_at=now, result=result, returncode=returncode, detail=attestation.outcome[:2_000])
        )
        task = self._end_run(task_id, ended, run_ended)
        if task is not None:
            log_transition(
                task.id, task.imp, "running", task.state, run=run_id, outcome=attestation.outcome,
                until=iso(not_before) if not_before else None,
            )  # fmt: skip
        return task

    def _end_run(self, task_id: str, ended: Any, run_ended: Any | None) -> Task | None:
        """The task's conditional UPDATE and, when it matched, its run's: one transaction."""

        def end(conn: Connection) -> bool:
            if conn.execute(ended).rowcount != 1:
                return False
            if run_ended is not None:
                conn.execute(run_ended)
            return True

        return self.get(task_id) if self.db.write(end) else None

    def interrupt(self, task_id: str, run_id: str, reason: str) -> Task | None:
        """running → queued: the supervisor is shutting down; the next one runs it again."""
        now = iso(self.clock.now())
        ended = (
            update(tasks)
            .where(tasks.c.id == task_id, tasks.c.state == "running", tasks.c.run_id == run_id)
            .values(state="queued", outcome=reason, updated_at=now)
        )
        run_ended = (
            update(task_runs)
            .where(task_runs.c.run_id == run_id)
            .values(finished_at=now, result="interrupted", detail=reason)
        )
        task = self._end_run(task_id, ended, run_ended)
        if task is not None:
            log_transition(task.id, task.imp, "running", "queued", run=run_id, reason=reason)
        return task

    def reclaim(self, task_id: str, run_id: str | None, action: ReclaimAction, reason: str) -> Task | None:
        """A task left ``running`` by a dead supervisor: requeue it or end it (see ``reclaim_decision``)."""
        now = iso(self.clock.now())
        state = "queued" if action == "requeue" else action
        ended = (
            update(tasks)
            .where(
                tasks.c.id == task_id, tasks.c.state == "running", tasks.c.run_id.is_not_distinct_from(run_id)
            )
            .values(
                state=state, outcome=reason, updated_at=now, finished_at=None if state == "queued" else now
            )
        )
        run_ended = (
            None
            if run_id is None
            else update(task_runs)
            .where(task_runs.c.run_id == run_id)
            .values(finished_at=now, result="reclaimed", detail=reason)
        )
        task = self._end_run(task_id, ended, run_ended)
        if task is not None:
            log_transition(task.id, task.imp, "running", state, run=run_id, reason=reason)
        return task

    def defer(self, task_id: str, until: datetime, reason: str) -> Task | None:
        """A queued task waits for ``until`` (its imp's next budget window)."""
        task = self._move(
            task_id,
            update(tasks)
            .where(tasks.c.id == task_id, tasks.c.state == "queued")
            .values(
                not_before=iso(until), deferrals=tasks.c.deferrals + 1, outcome=reason,
                updated_at=iso(self.clock.now()),
            ),
        )  # fmt: skip
        if task is not None:
            log_transition(task.id, task.imp, "queued", "queued", until=iso(until), reason=reason)
        return task

    def hold(self, task_id: str, until: datetime, reason: str) -> Task | None:
        """A queued task is blocked until ``until`` (issue 19 #6: its imp.toml is broken): it keeps its tries
        and its deferrals, shows ``reason`` as its outcome, and is looked at again then."""
        task = self._move(
            task_id,
            update(tasks)
            .where(tasks.c.id == task_id, tasks.c.state == "queued")
            .values(not_before=iso(until), outcome=reason, updated_at=iso(self.clock.now())),
        )
        if task is not None:
            log_transition(task.id, task.imp, "queued", "queued", until=iso(until), reason=reason)
        return task

    def box_runs_since(self, since: datetime) -> list[tuple[str, str, int]]:
        """``(run_id, imp, box_pid)`` of every run started since ``since`` that recorded a process box
        (issue 19 #4: what a restarted supervisor sweeps)."""
        query = (
            select(task_runs.c.run_id, tasks.c.imp, task_runs.c.box_pid)
            .join(tasks, tasks.c.id == task_runs.c.task_id)
            .where(task_runs.c.box_pid.is_not(None), task_runs.c.started_at >= iso(since))
            .order_by(self._c(task_runs.c.started_at), self._c(task_runs.c.run_id))
        )
        rows = self.db.read(lambda conn: conn.execute(query).all())
        return [(run_id, imp, int(pid)) for run_id, imp, pid in rows]

    def fail(self, task_id: str, reason: str) -> Task | None:
        """queued → failed before any box ran (e.g. the imp was removed)."""
        now = iso(self.clock.now())
        task = self._move(
            task_id,
            update(tasks)
            .where(tasks.c.id == task_id, tasks.c.state == "queued")
            .values(state="failed", outcome=reason, updated_at=now, finished_at=now),
        )
        if task is not None:
            log_transition(task.id, task.imp, "queued", "failed", reason=reason)
        return task

    def request_cancel(self, task_id: str) -> Task:
        """A queued task is cancelled now; a running one is stopped by its supervisor (its box killed)."""
        now = iso(self.clock.now())

        def cancel(conn: Connection) -> Task:
            task = _task_row(conn, task_id)
            if task is None:
                raise _not_found(task_id)
            if task.state == "queued":
                conn.execute(
                    update(tasks)
                    .where(tasks.c.id == task_id, tasks.c.state == "queued")
                    .values(
                        state="cancelled", cancel_requested=1, outcome="cancelled by the operator before it ran",
                        updated_at=now, finished_at=now,
                    )
                )  # fmt: skip
            elif task.state == "running":
                conn.execute(
                    update(tasks)
                    .where(tasks.c.id == task_id, tasks.c.state == "running")
                    .values(cancel_requested=1, updated_at=now)
                )
            else:
                raise TaskError(
                    f"task {task_id} is already {task.state}; only queued or running tasks can be cancelled"
                )
            return task

        task = self.db.write(cancel)
        cancelled = self.get(task_id)
        if cancelled.state == "cancelled":
            log_transition(task_id, task.imp, "queued", "cancelled", reason="operator")
        else:
            log.info("task %s cancel requested imp=%s (its supervisor stops it)", task_id, task.imp)
        return cancelled

    # ------------------------------------------------------------ gates: follow-ups and review

    def decided_gates_to_follow(self) -> list[tuple[Task, Gate]]:
        """Decided gates of wake-on-resolve tasks that have no follow-up yet."""
        follow_up = tasks.alias("follow_up")
        query = (
            select(tasks, *(column.label(f"gate_{column.name}") for column in gates.columns))
            .select_from(
                gates.join(task_runs, task_runs.c.run_id == gates.c.run_id).join(
                    tasks, tasks.c.id == task_runs.c.task_id
                )
            )
            .where(
                tasks.c.wake_on_resolve == 1,
                gates.c.state.in_(FINAL_STATES),
                ~exists().where(follow_up.c.parent_gate == gates.c.id),
            )
            .order_by(self._c(gates.c.decided_at).nulls_first(), self._c(gates.c.id))
        )

        def pairs(conn: Connection) -> list[tuple[Task, Gate]]:
            found = []
            for row in conn.execute(query).mappings():
                gate = {column.name: row[f"gate_{column.name}"] for column in gates.columns}
                found.append((row_to_task(row), row_to_gate(gate)))
            return found

        return self.db.read(pairs)

    def add_continuation(self, task: Task, gate: Gate) -> Task | None:
        """Queue the follow-up of ``task`` for its decided ``gate``, at most once per gate (UNIQUE parent_gate).

        The follow-up does not itself wake on its own gates: one follow-up per decision, never a chain.
        """
        request = ValidTask(
            imp=task.imp, kind=task.kind, prompt=continuation_prompt(task.id, task.prompt, gate), person=task.person,
            origin="continuation", channel_id=task.channel_id, ceiling_s=task.ceiling_s, wake_on_resolve=False,
            briefing=task.briefing, scope=task.scope, args=task.args,
        )  # fmt: skip
        task_id = self.db.write(
            lambda conn: self.insert(conn, request, parent_task=task.id, parent_gate=gate.id)
        )
        if task_id is None:
            return None
        log.info("task %s follows up task %s: gate %s %s", task_id, task.id, gate.id, gate.state)
        return self._queued(task_id)

    def settle_reviews(self) -> list[Task]:
        """needs_review tasks whose gates are all decided become done (all sent) or failed."""
        gated = (
            select(gates.c.id)
            .join(task_runs, gates.c.run_id == task_runs.c.run_id)
            .where(task_runs.c.task_id == tasks.c.id)
        )
        query = (
            select(tasks.c.id)
            .where(
                tasks.c.state == "needs_review",
                gated.exists(),
                ~gated.where(gates.c.state.in_(OPEN_STATES)).exists(),
            )
            .order_by(self._c(tasks.c.id))
        )
        settled = []
        for task_id in self.db.read(lambda conn: list(conn.scalars(query))):
            verdict = gates_verdict([(gate.id, gate.state) for gate in self.gates_of(task_id)])
            if verdict is None:
                continue
            task = self._move(
                task_id,
                update(tasks)
                .where(tasks.c.id == task_id, tasks.c.state == "needs_review")
                .values(state=verdict.state, outcome=verdict.outcome, updated_at=iso(self.clock.now())),
            )
            if task is not None:
                log_transition(task.id, task.imp, "needs_review", task.state, outcome=verdict.outcome)
                settled.append(task)
        return settled
