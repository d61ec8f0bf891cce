"""Tasks: one-shot work run by ``impyard supervise`` in a governed box (issue 8; design.md §1, §5).

A task moves ``queued → running → done | failed | needs_review | cancelled``;
a running task whose imp is over budget goes back to ``queued`` for the next
budget window, and a ``needs_review`` task waiting on its gates becomes
``done`` or ``failed`` when they are decided. Every move is one conditional
UPDATE (``WHERE state = <expected>``) inside ``BEGIN IMMEDIATE`` and is logged
as ``task <id> <from> -> <to>`` with its fields.

The state is **attested by the host** (``attest``, a pure rule) from what
actually happened: how the box run ended (answer, ceiling, death), the audit
rows of its run and the gates it opened. The box's own answer is kept as a
report (``box_outcome``, ``box_summary``) and never decides the state alone.

Each box run of a task has its own run id (``task_runs``): it labels the box
(the container's ``org.impyard.run``), the audit rows and the gates of that
run, so ``impyard task show`` can print the task's whole trail.

Task kinds are an open set (``prompt`` today; the memory engine's ``reflect``,
``sleep``, ``depart`` later): nothing here looks at the kind; a box that does
not know a kind answers ``failed``.
"""

from __future__ import annotations

import builtins
import json
import logging
import re
import secrets
import sqlite3
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from impyard.audit import AuditLog, AuditRecord
from impyard.clock import Clock, iso, parse_iso
from impyard.db import Database, Store
from impyard.durations import DurationError, format_duration, parse_duration
from impyard.errors import ImpyardError
from impyard.gates import OPEN_STATES, Gate, GateStore
from impyard.imps import ImpStore, validate_name

log = logging.getLogger("impyard.tasks")

TaskState = Literal["queued", "running", "done", "failed", "needs_review", "cancelled"]
TASK_STATES: tuple[TaskState, ...] = ("queued", "running", "done", "failed", "needs_review", "cancelled")
FINISHED_STATES: tuple[TaskState, ...] = ("done", "failed", "needs_review", "cancelled")
Origin = Literal["manual", "schedule", "continuation", "event"]
ORIGINS: tuple[Origin, ...] = ("manual", "schedule", "continuation", "event")

DEFAULT_KIND = "prompt"
KIND_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,39}$")  # the protocol's TaskSpec.kind
DEFAULT_CEILING = timedelta(minutes=10)
MIN_CEILING = timedelta(seconds=10)
MAX_CEILING = timedelta(hours=6)
MAX_PROMPT_CHARS = 8_000
MAX_CHANNEL_CHARS = 128  # the protocol's Id
MAX_PERSON_CHARS = 128
MAX_BOX_SUMMARY_CHARS = 2_000  # what is kept of the box's own report
TASK_CHANNEL_PREFIX = "task:"  # task:<imp> is the imp's task log (printed on the host's surface)
JOURNAL_ENTRIES = 10
BRIEFING_MAX_CHARS = 4_000
_CHANNEL_PATTERN = re.compile(r"^[^\s\x00-\x1f\x7f]+$")


class TaskError(ImpyardError, ValueError):
    """A task that cannot be added, found or changed; the message is one line that says what to do."""


def default_channel(imp: str) -> str:
    """Where a task posts when no channel is given: the imp's task log on the host's own surface."""
    return f"{TASK_CHANNEL_PREFIX}{imp}"


# ------------------------------------------------------------------ requests (validated before anything is written)


@dataclass(frozen=True)
class TaskRequest:
    imp: str
    prompt: str | None
    kind: str = DEFAULT_KIND
    channel_id: str | None = None
    ceiling: str | float | timedelta | None = None
    origin: Origin = "manual"
    wake_on_resolve: bool = False
    briefing: bool = False
    person: str | None = None


@dataclass(frozen=True)
class ValidTask:
    imp: str
    kind: str
    prompt: str | None
    person: str | None
    origin: Origin
    channel_id: str
    ceiling_s: float
    wake_on_resolve: bool
    briefing: bool


def parse_ceiling(value: str | float | timedelta | None) -> float:
    """A task's ceiling in seconds: 10 s to 6 h (default 10 min)."""
    if value is None:
        return DEFAULT_CEILING.total_seconds()
    try:
        ceiling = value if isinstance(value, timedelta) else parse_duration(value, what="--ceiling")
    except DurationError as exc:
        raise TaskError(str(exc)) from None
    if not MIN_CEILING <= ceiling <= MAX_CEILING:
        raise TaskError(
            f"a ceiling of {format_duration(ceiling)} is out of range: give a task from "
            f"{format_duration(MIN_CEILING)} to {format_duration(MAX_CEILING)} (e.g. --ceiling 10m)"
        )
    return ceiling.total_seconds()


def validate_request(request: TaskRequest, imps: ImpStore | None = None) -> ValidTask:
    """Check every field; ``imps`` also checks that the imp exists (ImpNotFound lists the imps there are)."""
    validate_name(request.imp)  # ImpNameError: never a path built from a bad name
    if imps is not None:
        imps.get(request.imp)  # ImpNotFound / ImpConfigError
    if not isinstance(request.kind, str) or not KIND_PATTERN.match(request.kind):
        raise TaskError(
            f"task kind {str(request.kind)[:60]!r} is not valid: 1-40 lowercase letters, digits and underscores, "
            "starting with a letter (e.g. prompt)"
        )
    if request.origin not in ORIGINS:
        raise TaskError(f"unknown task origin {request.origin!r}: one of {', '.join(ORIGINS)}")
    prompt = request.prompt if request.prompt else None
    if prompt is not None:
        if len(prompt) > MAX_PROMPT_CHARS:
            raise TaskError(
                f"the prompt is {len(prompt)} characters; a task prompt may be at most {MAX_PROMPT_CHARS}: shorten it"
            )
        if "\x00" in prompt:
            raise TaskError("the prompt contains a NUL character; remove it")
    elif request.kind == DEFAULT_KIND:
        raise TaskError('a prompt task needs its prompt text, e.g. impyard task add pip "Summarise the week"')
    channel = request.channel_id if request.channel_id is not None else default_channel(request.imp)
    if not channel or len(channel) > MAX_CHANNEL_CHARS or not _CHANNEL_PATTERN.match(channel):
        raise TaskError(
            f"channel {channel[:60]!r} is not a channel id: 1-{MAX_CHANNEL_CHARS} characters without spaces "
            "(a Discord channel id; leave --channel out for the imp's task log)"
        )
    if channel.startswith(TASK_CHANNEL_PREFIX) and channel != default_channel(request.imp):
        raise TaskError(
            f"channel {channel!r} is another imp's task log; leave --channel out for {default_channel(request.imp)}"
        )
    person = request.person
    if person is not None and (not person or len(person) > MAX_PERSON_CHARS):
        raise TaskError(f"person must be 1-{MAX_PERSON_CHARS} characters")
    return ValidTask(
        imp=request.imp,
        kind=request.kind,
        prompt=prompt,
        person=person,
        origin=request.origin,
        channel_id=channel,
        ceiling_s=parse_ceiling(request.ceiling),
        wake_on_resolve=bool(request.wake_on_resolve),
        briefing=bool(request.briefing),
    )


# ------------------------------------------------------------------ what the host saw, and what it makes of it (pure)


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
            "failed", f"the box reported failure: {end.box_summary[:200] or 'no reason given'} ({seen})"
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


# ------------------------------------------------------------------ follow-ups and briefings (pure)


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


# ------------------------------------------------------------------ rows


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


def _when(row: sqlite3.Row, name: str) -> datetime | None:
    return parse_iso(row[name]) if row[name] else None


def _row_to_task(row: sqlite3.Row) -> Task:
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
    )


def _row_to_run(row: sqlite3.Row) -> TaskRun:
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
                 created_at, updated_at)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?)""",
            (task_id, task.imp, task.kind, task.prompt, task.person, task.origin, task.channel_id, task.ceiling_s,
             int(task.wake_on_resolve), int(task.briefing), iso(not_before or now), schedule_id,
             iso(scheduled_for) if scheduled_for else None, parent_task, parent_gate, iso(now), iso(now)),
        )  # fmt: skip
        if cursor.rowcount != 1:
            return None
        log_transition(
            task_id, task.imp, "new", "queued", kind=task.kind, origin=task.origin, channel=task.channel_id
        )
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
        return _row_to_task(rows[0])

    def list(
        self, *, imp: str | None = None, states: Collection[str] | None = None, limit: int = 100
    ) -> list[Task]:
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
        return [_row_to_task(row) for row in self.db.query(sql, args)]

    def ready(self, limit: int) -> builtins.list[Task]:
        """Queued tasks whose time has come, oldest first."""
        rows = self.db.query(
            """SELECT * FROM tasks WHERE state = 'queued' AND cancel_requested = 0 AND not_before <= ?
               ORDER BY not_before, created_at, id LIMIT ?""",
            (iso(self.clock.now()), max(0, limit)),
        )
        return [_row_to_task(row) for row in rows]

    def has_ready(self) -> bool:
        return bool(self.ready(1))

    def running(self) -> builtins.list[Task]:
        return [
            _row_to_task(row)
            for row in self.db.query("SELECT * FROM tasks WHERE state = 'running' ORDER BY started_at")
        ]

    def cancel_requested(self, task_ids: Collection[str]) -> builtins.list[str]:
        if not task_ids:
            return []
        rows = self.db.query(
            f"SELECT id FROM tasks WHERE cancel_requested = 1 AND id IN ({', '.join('?' for _ in task_ids)})",
            list(task_ids),
        )
        return [row["id"] for row in rows]

    def runs(self, task_id: str) -> builtins.list[TaskRun]:
        rows = self.db.query("SELECT * FROM task_runs WHERE task_id = ? ORDER BY attempt", (task_id,))
        return [_row_to_run(row) for row in rows]

    def run(self, run_id: str) -> TaskRun | None:
        rows = self.db.query("SELECT * FROM task_runs WHERE run_id = ?", (run_id,))
        return _row_to_run(rows[0]) if rows else None

    def audit_trail(self, task_id: str) -> builtins.list[AuditRecord]:
        """Every audit row of every run of the task (requests and gate transitions), oldest first."""
        rows = self.db.query(
            """SELECT a.* FROM audit a JOIN task_runs r ON a.run_id = r.run_id
               WHERE r.task_id = ? ORDER BY a.id""",
            (task_id,),
        )
        return [AuditLog._record(row) for row in rows]

    def gates_of(self, task_id: str) -> builtins.list[Gate]:
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
    ) -> builtins.list[JournalEntry]:
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
            task = _row_to_task(row)
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

    def decided_gates_to_follow(self) -> builtins.list[tuple[Task, Gate]]:
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
            briefing=task.briefing,
        )  # fmt: skip
        with self.db.transaction() as conn:
            task_id = self.insert(conn, request, parent_task=task.id, parent_gate=gate.id)
        if task_id is None:
            return None
        log.info("task %s follows up task %s: gate %s %s", task_id, task.id, gate.id, gate.state)
        return self.get(task_id)

    def settle_reviews(self) -> builtins.list[Task]:
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
