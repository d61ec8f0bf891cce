"""Tasks: one-shot work run by ``impyard supervise`` in a governed box (issue 8; docs/tasks.md).

A task moves ``queued → running → done | failed | needs_review | cancelled``;
a running task whose imp is over budget goes back to ``queued`` for the next
budget window, and a ``needs_review`` task waiting on its gates becomes
``done`` or ``failed`` when they are decided. Every move is one conditional
UPDATE (``WHERE state = <expected>``) in one ``Database.write`` (SQLite or
PostgreSQL: of two supervisors sharing the database, one claims a task) and is
logged, once committed, as ``task <id> <from> -> <to>`` with its fields.

The state is **attested by the host** (``attest``, a pure rule) from what
actually happened: how the box run ended (answer, ceiling, death), the audit
rows of its run and the gates it opened. The box's own answer is kept as a
report (``box_outcome``, ``box_summary``) and never decides the state alone.

Each box run of a task has its own run id (``task_runs``): it labels the box
(the container's ``org.impyard.run``), the audit rows and the gates of that
run, so ``impyard task show`` can print the task's whole trail.

Task kinds are an open set (``prompt``; the memory engine's ``depart``, queued by
``impyard.memory.departures``; ``reflect`` and ``sleep``, queued by the memory clock,
``impyard.memory.wakefulness``): nothing here gives a kind a meaning (a supervisor may
run only some kinds: ``ready(kinds=…)``); a box that does not know a kind answers
``failed``. A task may carry a memory ``scope`` and its kind's ``args`` (plain values,
handed to the box as ``TaskSpec.args``).

Modules: ``states`` (the lifecycle), ``request`` (validation), ``attestation`` (the pure rules),
``prompts`` (prompt text), ``rows`` (the row types), ``sql`` (queueing a task in portable SQL, shared with the
schedules), ``store`` (``TaskStore``).

May import: the foundations, ``storage``, ``backends``, ``imps``, ``channels``, ``gateway``.
"""

from impyard.tasks.attestation import (
    Attestation,
    ReclaimAction,
    RunEnd,
    RunFacts,
    attest,
    gates_verdict,
    reclaim_decision,
)
from impyard.tasks.prompts import (
    BRIEFING_MAX_CHARS,
    JournalEntry,
    compose_prompt,
    continuation_prompt,
    render_briefing,
)
from impyard.tasks.request import (
    DEFAULT_CEILING,
    DEFAULT_KIND,
    KIND_PATTERN,
    MAX_CEILING,
    MAX_CHANNEL_CHARS,
    MAX_PERSON_CHARS,
    MAX_PROMPT_CHARS,
    MIN_CEILING,
    ORIGINS,
    TASK_CHANNEL_PREFIX,
    Origin,
    TaskArg,
    TaskError,
    TaskRequest,
    ValidTask,
    default_channel,
    parse_ceiling,
    validate_request,
)
from impyard.tasks.rows import (
    Task,
    TaskRun,
)
from impyard.tasks.states import (
    FINISHED_STATES,
    TASK_STATES,
    TaskState,
)
from impyard.tasks.store import (
    JOURNAL_ENTRIES,
    MAX_BOX_SUMMARY_CHARS,
    TaskStore,
    log_transition,
)

__all__ = [
    "Attestation",
    "BRIEFING_MAX_CHARS",
    "DEFAULT_CEILING",
    "DEFAULT_KIND",
    "FINISHED_STATES",
    "JOURNAL_ENTRIES",
    "JournalEntry",
    "KIND_PATTERN",
    "MAX_BOX_SUMMARY_CHARS",
    "MAX_CEILING",
    "MAX_CHANNEL_CHARS",
    "MAX_PERSON_CHARS",
    "MAX_PROMPT_CHARS",
    "MIN_CEILING",
    "ORIGINS",
    "Origin",
    "ReclaimAction",
    "RunEnd",
    "RunFacts",
    "TASK_CHANNEL_PREFIX",
    "TASK_STATES",
    "Task",
    "TaskArg",
    "TaskError",
    "TaskRequest",
    "TaskRun",
    "TaskState",
    "TaskStore",
    "ValidTask",
    "attest",
    "compose_prompt",
    "continuation_prompt",
    "default_channel",
    "gates_verdict",
    "log_transition",
    "parse_ceiling",
    "reclaim_decision",
    "render_briefing",
    "validate_request",
]
