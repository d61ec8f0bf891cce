"""The task store: queued tasks in SQLite, each state move one conditional UPDATE, logged."""

from __future__ import annotations

import json
import logging
import secrets
import sqlite3
from collections.abc import Collection
from datetime import datetime

from impyard.audit import AuditLog, AuditRecord
from impyard.clock import Clock, iso, parse_iso
from impyard.db import Database, Store
from impyard.gates import OPEN_STATES, Gate, GateStore
from impyard.imps import ImpStore
from impyard.tasks.attestation import Attestation, ReclaimAction, RunEnd, RunFacts, gates_verdict
from impyard.tasks.prompts import JournalEntry, continuation_prompt
from impyard.tasks.request import TASK_CHANNEL_PREFIX, TaskError, TaskRequest, ValidTask, validate_request
from impyard.tasks.rows import Task, TaskRun, row_to_run, row_to_task

log = logging.getLogger("impyard.tasks")

MAX_BOX_SUMMARY_CHARS = 2_000  # what is kept of the box's own report
JOURNAL_ENTRIES = 10
ID_CHUNK = 500  # ids per `IN (...)` query: well under SQLite's bound on parameters


def log_transition(task_id: str, imp: str, old: str, new: str, **fields: object) -> None:
    """One structured line per state change: ``task t-… queued -> running imp=pip run=…``."""
    extra = " ".join(f"{key}={json.dumps(value) if isinstance(value, str) and ' ' in value else value}"
                     for key, value in fields.items() if value is not None)  # fmt: skip
    log.info("task %s %s -> %s imp=%s%s", task_id, old, new, imp, f" {extra}" if extra else "")


_OPEN_GATE_SQL = ", ".join(f"'{state}'" for state in OPEN_STATES)
_FINAL_GATE_SQL = "'denied', 'expired', 'executed', 'failed'"


class TaskStore(Store):
    def __init__(self, db: Database, clock: Clock, imps: ImpStore | None = None) -> None:
        self.db = db
        self.clock = clock
        self.imps = imps

    # ------------------------------------------------------------ adding

    def ensure_channel(self, conn: sqlite3.Connection, channel_id: str) -> None:
        """The imp's task log is the host's own channel (trusted like the terminal); others are left as they are."""
        if channel_id.startswith(TASK_CHANNEL_PREFIX):
            conn.execute(
                """INSERT OR IGNORE INTO channels (channel_id, surface, kind, name, trusted, updated_at)
                   VALUES (?, 'terminal', 'terminal', ?, 0, ?)""",
                (channel_id, f"tasks of {channel_id[len(TASK_CHANNEL_PREFIX) :]}", iso(self.clock.now())),
            )

    def insert(
        self,
        conn: sqlite3.Connection,
        request: TaskRequest | ValidTask,
        *,
        schedule_id: str | None = None,
        scheduled_for: datetime | None = None,
        not_before: datetime | None = None,
        parent_task: str | None = None,
        parent_gate: str | None = None,
    ) -> str | None:
        """Insert a queued task in the caller's transaction; None when it exists already (same fire or gate)."""
        task = request if isinstance(request, ValidTask) else validate_request(request)
        now = self.clock.now()
        task_id = f"t-{secrets.token_hex(5)}"
        self.ensure_channel(conn, task.channel_id)
        cursor = conn.execute(
            """INSERT OR IGNORE INTO tasks (id, imp, kind, prompt, person, origin, channel_id, ceiling_s,
                 wake_on_resolve, briefing, state, not_before, schedule_id, scheduled_for, parent_task, parent_gate,
                 created_at, updated_at, scope, args)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            (task_id, task.imp, task.kind, task.prompt, task.person, task.origin, task.channel_id, task.ceiling_s,
             int(task.wake_on_resolve), int(task.briefing), iso(not_before or now), schedule_id,
             iso(scheduled_for) if scheduled_for else None, parent_task, parent_gate, iso(now), iso(now),
             task.scope, json.dumps(dict(task.args), sort_keys=True) if task.args else None),
        )  # fmt: skip
        if cursor.rowcount != 1:
            return None
        log_transition(
            task_id, task.imp, "new", "queued", kind=task.kind, origin=task.origin, channel=task.channel_id,
            scope=task.scope,
        )  # fmt: skip
        return task_id

    def add(self, request: TaskRequest) -> Task:
        """Validate (the imp must exist when the store knows the imps) and queue; nothing is written on a refusal."""
        task = validate_request(request, self.imps)
        with self.db.transaction() as conn:
            task_id = self.insert(conn, task)
        assert task_id is not None
        return self.get(task_id)

    # ------------------------------------------------------------ reading

    def get(self, task_id: str) -> Task:
        rows = self.db.query("SELECT * FROM tasks WHERE id = ?", (task_id,))
        if not rows:
            raise TaskError(f"no task {task_id!r}; `impyard task ls` lists them")
        return row_to_task(rows[0])

    def by_ids(self, task_ids: Collection[str]) -> dict[str, Task]:
        """The tasks of ``task_ids`` that exist, by id (one query per ``ID_CHUNK`` ids; the rest are absent)."""
        ids = sorted(set(task_ids))
        found: dict[str, Task] = {}
        for start in range(0, len(ids), ID_CHUNK):
            chunk = ids[start : start + ID_CHUNK]
            rows = self.db.query(f"SELECT * FROM tasks WHERE id IN ({', '.join('?' for _ in chunk)})", chunk)
            found.update((row["id"], row_to_task(row)) for row in rows)
        return found

    def latest(
        self, *, imp: str | None = None, states: Collection[str] | None = None, limit: int = 100
    ) -> list[Task]:
        """The newest tasks first (of ``imp``, in ``states``, when given), at most ``limit``."""
        where: list[str] = []
        args: list[object] = []
        if imp is not None:
            where.append("imp = ?")
            args.append(imp)
        if states:
            where.append(f"state IN ({', '.join('?' for _ in states)})")
            args.extend(states)
        sql = "SELECT * FROM tasks" + (f" WHERE {' AND '.join(where)}" if where else "")
        sql += " ORDER BY created_at DESC, id LIMIT ?"
        args.append(limit)
        return [row_to_task(row) for row in self.db.query(sql, args)]

    def ready(
        self, limit: int, kinds: Collection[str] | None = None, *, imps: Collection[str] | None = None
    ) -> list[Task]:
        """Queued tasks whose time has come, oldest first (only of ``kinds`` and of ``imps``, when given)."""
        only = f" AND kind IN ({', '.join('?' for _ in kinds)})" if kinds is not None else ""
        if imps is not None:
            only += f" AND imp IN ({', '.join('?' for _ in imps)})"
        rows = self.db.query(
            f"""SELECT * FROM tasks WHERE state = 'queued' AND cancel_requested = 0 AND not_before <= ?{only}
               ORDER BY not_before, created_at, id LIMIT ?""",
            (iso(self.clock.now()), *sorted(kinds or ()), *sorted(imps or ()), max(0, limit)),
        )
        return [row_to_task(row) for row in rows]

    def has_ready(self, kinds: Collection[str] | None = None, *, imps: Collection[str] | None = None) -> bool:
        return bool(self.ready(1, kinds, imps=imps))

    def running(self) -> list[Task]:
        return [
            row_to_task(row)
            for row in self.db.query("SELECT * FROM tasks WHERE state = 'running' ORDER BY started_at")
        ]

    def cancel_requested(self, task_ids: Collection[str]) -> list[str]:
        if not task_ids:
            return []
        rows = self.db.query(
            f"SELECT id FROM tasks WHERE cancel_requested = 1 AND id IN ({', '.join('?' for _ in task_ids)})",
            list(task_ids),
        )
        return [row["id"] for row in rows]

    def runs(self, task_id: str) -> list[TaskRun]:
        rows = self.db.query("SELECT * FROM task_runs WHERE task_id = ? ORDER BY attempt", (task_id,))
        return [row_to_run(row) for row in rows]

    def run(self, run_id: str) -> TaskRun | None:
        rows = self.db.query("SELECT * FROM task_runs WHERE run_id = ?", (run_id,))
        return row_to_run(rows[0]) if rows else None

    def audit_trail(self, task_id: str) -> list[AuditRecord]:
        """Every audit row of every run of the task (requests and gate transitions), oldest first."""
        rows = self.db.query(
            """SELECT a.* FROM audit a JOIN task_runs r ON a.run_id = r.run_id
               WHERE r.task_id = ? ORDER BY a.id""",
            (task_id,),
        )
        return [AuditLog._record(row) for row in rows]

    def gates_of(self, task_id: str) -> list[Gate]:
        rows = self.db.query(
            "SELECT g.id FROM gates g JOIN task_runs r ON g.run_id = r.run_id WHERE r.task_id = ? ORDER BY g.created_at",
            (task_id,),
        )
        store = GateStore(self.db, self.clock, AuditLog(self.db, self.clock, []))
        return [store.get(row["id"]) for row in rows]

    def run_facts(self, run_id: str) -> RunFacts:
        """What the host's records say the run did (never what the box says)."""
        rows = self.db.query(
            "SELECT method, verdict, cost_micros FROM audit WHERE run_id = ? AND method != 'gate'", (run_id,)
        )
        gates = self.db.query(
            "SELECT id, state FROM gates WHERE run_id = ? ORDER BY created_at, id", (run_id,)
        )
        refused_verdicts = ("denied", "rate_limited", "budget_exhausted", "unreachable", "error")
        return RunFacts(
            model_calls=sum(1 for r in rows if r["method"] == "model.request" and r["verdict"] == "allowed"),
            cost_micros=sum(int(r["cost_micros"] or 0) for r in rows),
            sent=sum(1 for r in rows if r["method"] == "discord.send" and r["verdict"] == "allowed"),
            refused=sum(1 for r in rows if r["verdict"] in refused_verdicts),
            budget_refused=any(r["verdict"] == "budget_exhausted" for r in rows),
            gates=tuple((g["id"], g["state"]) for g in gates),
        )

    def journal(
        self, imp: str, *, limit: int = JOURNAL_ENTRIES, exclude: str | None = None
    ) -> list[JournalEntry]:
        """The imp's own finished tasks, newest first (never another imp's)."""
        rows = self.db.query(
            """SELECT id, kind, origin, state, outcome, box_summary, finished_at FROM tasks
               WHERE imp = ? AND state IN ('done', 'failed', 'needs_review') AND finished_at IS NOT NULL AND id != ?
               ORDER BY finished_at DESC, id LIMIT ?""",
            (imp, exclude or "", limit),
        )
        return [
            JournalEntry(r["id"], r["kind"], r["origin"], r["state"], r["outcome"] or "", r["box_summary"] or "",
                         parse_iso(r["finished_at"]))
            for r in rows
        ]  # fmt: skip

    # ------------------------------------------------------------ transitions

    def claim(self, task_id: str, run_id: str, backend: str) -> Task | None:
        """queued → running with a new run; None when it is no longer queued (cancelled, or claimed)."""
        now = iso(self.clock.now())
        with self.db.transaction() as conn:
            cursor = conn.execute(
                """UPDATE tasks SET state = 'running', attempts = attempts + 1, run_id = ?, started_at = ?,
                     finished_at = NULL, updated_at = ?
                   WHERE id = ? AND state = 'queued' AND cancel_requested = 0""",
                (run_id, now, now, task_id),
            )
            if cursor.rowcount != 1:
                return None
            attempt = conn.execute("SELECT attempts FROM tasks WHERE id = ?", (task_id,)).fetchone()[0]
            conn.execute(
                "INSERT INTO task_runs (run_id, task_id, attempt, backend, started_at) VALUES (?, ?, ?, ?, ?)",
                (run_id, task_id, attempt, backend, now),
            )
        task = self.get(task_id)
        log_transition(
            task.id, task.imp, "queued", "running", run=run_id, attempt=task.attempts, backend=backend
        )
        return task

    def record_pid(self, run_id: str, pid: int) -> None:
        self.db.execute("UPDATE task_runs SET box_pid = ? WHERE run_id = ?", (pid, run_id))

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
        now = self.clock.now()
        final = attestation.state != "queued"
        with self.db.transaction() as conn:
            cursor = conn.execute(
                """UPDATE tasks SET state = ?, outcome = ?, box_outcome = ?, box_summary = ?, updated_at = ?,
                     finished_at = ?, not_before = COALESCE(?, not_before), deferrals = deferrals + ?
                   WHERE id = ? AND state = 'running' AND run_id = ?""",
                (attestation.state, attestation.outcome[:2_000], end.box_outcome,
                 end.box_summary[:MAX_BOX_SUMMARY_CHARS] or None, iso(now), iso(now) if final else None,
                 iso(not_before) if not_before else None, int(attestation.deferred), task_id, run_id),
            )  # fmt: skip
            if cursor.rowcount != 1:
                return None
            result = {"cancelled": "cancelled", "queued": "deferred"}.get(
                attestation.state, attestation.state
            )
            if end.ceiling_hit:
                result = "ceiling"
            elif end.died is not None:
                result = "died"
            conn.execute(
                "UPDATE task_runs SET finished_at = ?, result = ?, returncode = ?, detail = ? WHERE run_id = ?",
                (iso(now), result, returncode, attestation.outcome[:2_000], run_id),
            )
        task = self.get(task_id)
        log_transition(
            task.id, task.imp, "running", task.state, run=run_id, outcome=attestation.outcome,
            until=iso(not_before) if not_before else None,
        )  # fmt: skip
        return task

    def interrupt(self, task_id: str, run_id: str, reason: str) -> Task | None:
        """running → queued: the supervisor is shutting down; the next one runs it again."""
        now = iso(self.clock.now())
        with self.db.transaction() as conn:
            cursor = conn.execute(
                """UPDATE tasks SET state = 'queued', outcome = ?, updated_at = ?
                   WHERE id = ? AND state = 'running' AND run_id = ?""",
                (reason, now, task_id, run_id),
            )
            if cursor.rowcount != 1:
                return None
            conn.execute(
                "UPDATE task_runs SET finished_at = ?, result = 'interrupted', detail = ? WHERE run_id = ?",
                (now, reason, run_id),
            )
        task = self.get(task_id)
        log_transition(task.id, task.imp, "running", "queued", run=run_id, reason=reason)
        return task

    def reclaim(self, task_id: str, run_id: str | None, action: ReclaimAction, reason: str) -> Task | None:
        """A task left ``running`` by a dead supervisor: requeue it or end it (see ``reclaim_decision``)."""
        now = iso(self.clock.now())
        state = "queued" if action == "requeue" else action
        with self.db.transaction() as conn:
            cursor = conn.execute(
                """UPDATE tasks SET state = ?, outcome = ?, updated_at = ?, finished_at = ?
                   WHERE id = ? AND state = 'running' AND run_id IS ?""",
                (state, reason, now, None if state == "queued" else now, task_id, run_id),
            )
            if cursor.rowcount != 1:
                return None
            if run_id is not None:
                conn.execute(
                    "UPDATE task_runs SET finished_at = ?, result = 'reclaimed', detail = ? WHERE run_id = ?",
                    (now, reason, run_id),
                )
        task = self.get(task_id)
        log_transition(task.id, task.imp, "running", state, run=run_id, reason=reason)
        return task

    def defer(self, task_id: str, until: datetime, reason: str) -> Task | None:
        """A queued task waits for ``until`` (its imp's next budget window)."""
        cursor = self.db.execute(
            """UPDATE tasks SET not_before = ?, deferrals = deferrals + 1, outcome = ?, updated_at = ?
               WHERE id = ? AND state = 'queued'""",
            (iso(until), reason, iso(self.clock.now()), task_id),
        )
        if cursor.rowcount != 1:
            return None
        task = self.get(task_id)
        log_transition(task.id, task.imp, "queued", "queued", until=iso(until), reason=reason)
        return task

    def hold(self, task_id: str, until: datetime, reason: str) -> Task | None:
        """A queued task is blocked until ``until`` (issue 19 #6: its imp.toml is broken): it keeps its tries
        and its deferrals, shows ``reason`` as its outcome, and is looked at again then."""
        cursor = self.db.execute(
            """UPDATE tasks SET not_before = ?, outcome = ?, updated_at = ? WHERE id = ? AND state = 'queued'""",
            (iso(until), reason, iso(self.clock.now()), task_id),
        )
        if cursor.rowcount != 1:
            return None
        task = self.get(task_id)
        log_transition(task.id, task.imp, "queued", "queued", until=iso(until), reason=reason)
        return task

    def box_runs_since(self, since: datetime) -> list[tuple[str, str, int]]:
        """``(run_id, imp, box_pid)`` of every run started since ``since`` that recorded a process box
        (issue 19 #4: what a restarted supervisor sweeps)."""
        rows = self.db.query(
            """SELECT r.run_id, t.imp, r.box_pid FROM task_runs r JOIN tasks t ON t.id = r.task_id
               WHERE r.box_pid IS NOT NULL AND r.started_at >= ? ORDER BY r.started_at""",
            (iso(since),),
        )
        return [(row["run_id"], row["imp"], int(row["box_pid"])) for row in rows]

    def fail(self, task_id: str, reason: str) -> Task | None:
        """queued → failed before any box ran (e.g. the imp was removed)."""
        now = iso(self.clock.now())
        cursor = self.db.execute(
            """UPDATE tasks SET state = 'failed', outcome = ?, updated_at = ?, finished_at = ?
               WHERE id = ? AND state = 'queued'""",
            (reason, now, now, task_id),
        )
        if cursor.rowcount != 1:
            return None
        task = self.get(task_id)
        log_transition(task.id, task.imp, "queued", "failed", reason=reason)
        return task

    def request_cancel(self, task_id: str) -> Task:
        """A queued task is cancelled now; a running one is stopped by its supervisor (its box killed)."""
        now = iso(self.clock.now())
        with self.db.transaction() as conn:
            row = conn.execute("SELECT * FROM tasks WHERE id = ?", (task_id,)).fetchone()
            if row is None:
                raise TaskError(f"no task {task_id!r}; `impyard task ls` lists them")
            task = row_to_task(row)
            if task.state == "queued":
                conn.execute(
                    """UPDATE tasks SET state = 'cancelled', cancel_requested = 1, outcome = ?, updated_at = ?,
                         finished_at = ? WHERE id = ? AND state = 'queued'""",
                    ("cancelled by the operator before it ran", now, now, task_id),
                )
            elif task.state == "running":
                conn.execute(
                    "UPDATE tasks SET cancel_requested = 1, updated_at = ? WHERE id = ? AND state = 'running'",
                    (now, task_id),
                )
            else:
                raise TaskError(
                    f"task {task_id} is already {task.state}; only queued or running tasks can be cancelled"
                )
        cancelled = self.get(task_id)
        if cancelled.state == "cancelled":
            log_transition(task_id, task.imp, "queued", "cancelled", reason="operator")
        else:
            log.info("task %s cancel requested imp=%s (its supervisor stops it)", task_id, task.imp)
        return cancelled

    # ------------------------------------------------------------ gates: follow-ups and review

    def decided_gates_to_follow(self) -> list[tuple[Task, Gate]]:
        """Decided gates of wake-on-resolve tasks that have no follow-up yet."""
        rows = self.db.query(
            f"""SELECT g.id AS gate_id, t.id AS task_id FROM gates g
                JOIN task_runs r ON r.run_id = g.run_id JOIN tasks t ON t.id = r.task_id
                WHERE t.wake_on_resolve = 1 AND g.state IN ({_FINAL_GATE_SQL})
                  AND NOT EXISTS (SELECT 1 FROM tasks c WHERE c.parent_gate = g.id)
                ORDER BY g.decided_at, g.id"""
        )
        store = GateStore(self.db, self.clock, AuditLog(self.db, self.clock, []))
        return [(self.get(row["task_id"]), store.get(row["gate_id"])) for row in rows]

    def add_continuation(self, task: Task, gate: Gate) -> Task | None:
        """Queue the follow-up of ``task`` for its decided ``gate``, at most once per gate (UNIQUE parent_gate).

        The follow-up does not itself wake on its own gates: one follow-up per decision, never a chain.
        """
        request = ValidTask(
            imp=task.imp, kind=task.kind, prompt=continuation_prompt(task.id, task.prompt, gate), person=task.person,
            origin="continuation", channel_id=task.channel_id, ceiling_s=task.ceiling_s, wake_on_resolve=False,
            briefing=task.briefing, scope=task.scope, args=task.args,
        )  # fmt: skip
        with self.db.transaction() as conn:
            task_id = self.insert(conn, request, parent_task=task.id, parent_gate=gate.id)
        if task_id is None:
            return None
        log.info("task %s follows up task %s: gate %s %s", task_id, task.id, gate.id, gate.state)
        return self.get(task_id)

    def settle_reviews(self) -> list[Task]:
        """needs_review tasks whose gates are all decided become done (all sent) or failed."""
        rows = self.db.query(
            f"""SELECT t.id FROM tasks t WHERE t.state = 'needs_review'
                AND EXISTS (SELECT 1 FROM gates g JOIN task_runs r ON g.run_id = r.run_id WHERE r.task_id = t.id)
                AND NOT EXISTS (SELECT 1 FROM gates g JOIN task_runs r ON g.run_id = r.run_id
                                WHERE r.task_id = t.id AND g.state IN ({_OPEN_GATE_SQL}))"""
        )
        settled = []
        for row in rows:
            gates = [(gate.id, gate.state) for gate in self.gates_of(row["id"])]
            verdict = gates_verdict(gates)
            if verdict is None:
                continue
            now = iso(self.clock.now())
            cursor = self.db.execute(
                "UPDATE tasks SET state = ?, outcome = ?, updated_at = ? WHERE id = ? AND state = 'needs_review'",
                (verdict.state, verdict.outcome, now, row["id"]),
            )
            if cursor.rowcount == 1:
                task = self.get(row["id"])
                log_transition(task.id, task.imp, "needs_review", task.state, outcome=verdict.outcome)
                settled.append(task)
        return settled
