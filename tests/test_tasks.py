"""Tasks: validation, the host's attestation rule, reclaim, follow-ups, the journal, and the store's transitions."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from impyard.clock import FixedClock
from impyard.gateway.audit import AuditLog
from impyard.gateway.gates import Approver, Gate, GateStore
from impyard.gateway.ledger import ALL_IMPS, BudgetRow
from impyard.imps.store import ImpNameError, ImpNotFound, ImpStore
from impyard.storage import tables
from impyard.storage.db import Database
from impyard.supervisor import budget_wait
from impyard.tasks import (
    MAX_PROMPT_CHARS,
    Attestation,
    JournalEntry,
    RunEnd,
    RunFacts,
    TaskError,
    TaskRequest,
    TaskStore,
    attest,
    compose_prompt,
    continuation_prompt,
    gates_verdict,
    reclaim_decision,
    render_briefing,
)
from tests.racing import RACE_ROUNDS, race, reopen, two_racers

NOW = datetime(2026, 4, 10, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(NOW)


@pytest.fixture
def db(any_engine_db: Database) -> Database:
    """The store's tests run on SQLite and on PostgreSQL (issue 21)."""
    return any_engine_db


@pytest.fixture
def store(db: Database, clock: FixedClock, impyard_home: Path) -> TaskStore:
    imps = ImpStore()
    imps.add("pip")
    imps.add("bob")
    return TaskStore(db, clock, imps)


def count(db: Database, table: sa.Table) -> int:
    return db.read(lambda conn: conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def task_count(db: Database) -> int:
    return count(db, tables.tasks)


# --- validation: every bad input refused, nothing written --------------------------------------------


@pytest.mark.parametrize(
    ("request_", "error", "message"),
    [
        (TaskRequest("nobody", "x"), ImpNotFound, "no imp named 'nobody'"),
        (TaskRequest("Not A Name", "x"), ImpNameError, "invalid imp name"),
        (TaskRequest("pip", "x", ceiling="0"), TaskError, "a ceiling of 0s is out of range"),
        (TaskRequest("pip", "x", ceiling="0s"), TaskError, "out of range"),
        (TaskRequest("pip", "x", ceiling="9s"), TaskError, "out of range"),
        (TaskRequest("pip", "x", ceiling="6h1s"), TaskError, "out of range"),
        (TaskRequest("pip", "x", ceiling="100000d"), TaskError, "out of range"),
        (TaskRequest("pip", "x", ceiling="forever"), TaskError, "is not a duration"),
        (TaskRequest("pip", "y" * (MAX_PROMPT_CHARS + 1)), TaskError, f"at most {MAX_PROMPT_CHARS}"),
        (TaskRequest("pip", "a\x00b"), TaskError, "NUL"),
        (TaskRequest("pip", None), TaskError, "needs its prompt text"),
        (TaskRequest("pip", "x", kind="Reflect!"), TaskError, "task kind"),
        (TaskRequest("pip", "x", channel_id="has space"), TaskError, "not a channel id"),
        (TaskRequest("pip", "x", channel_id="c" * 129), TaskError, "not a channel id"),
        (TaskRequest("pip", "x", channel_id="task:bob"), TaskError, "another imp's task log"),
        (TaskRequest("pip", "x", origin="sneaky"), TaskError, "unknown task origin"),  # type: ignore[arg-type]
    ],
)
def test_bad_tasks_are_refused_and_nothing_is_written(
    store: TaskStore, db: Database, request_: TaskRequest, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        store.add(request_)
    assert task_count(db) == 0
    assert count(db, tables.channels) == 0


@pytest.mark.parametrize(
    ("ceiling", "seconds"), [(None, 600), ("10s", 10), ("6h", 21_600), ("1h30m", 5400), (45, 45)]
)
def test_ceilings_within_bounds(store: TaskStore, ceiling: str | int | None, seconds: float) -> None:
    assert store.add(TaskRequest("pip", "x", ceiling=ceiling)).ceiling_s == seconds


def test_kinds_are_an_open_set_and_only_prompt_needs_a_prompt(store: TaskStore) -> None:
    task = store.add(TaskRequest("pip", None, kind="reflect", person="user-7", origin="event"))
    assert (task.kind, task.prompt, task.person, task.origin, task.state) == (
        "reflect",
        None,
        "user-7",
        "event",
        "queued",
    )


# --- the attestation rule (pure) -------------------------------------------------------------------

SPENT = RunFacts(model_calls=1, cost_micros=420, sent=1)
GATED = RunFacts(model_calls=1, gates=(("g-1", "pending"),))


@pytest.mark.parametrize(
    ("end", "facts", "state", "says"),
    [
        (RunEnd("done", "posted"), SPENT, "done", "1 model call ($0.0004), 1 post delivered"),
        (
            RunEnd("failed", "model returned HTTP 500"),
            RunFacts(model_calls=1),
            "failed",
            "the box reported failure: model returned HTTP 500",
        ),
        # The box's claim is a report: the host decides from what happened.
        (
            RunEnd("done", "all good", ceiling_s=600, ceiling_hit=True),
            SPENT,
            "failed",
            "killed at its ceiling of 10m",
        ),
        (RunEnd(None, died="exit code 3"), RunFacts(), "failed", "the box failed: exit code 3"),
        (RunEnd("done", "all posted"), GATED, "needs_review", "waiting for approval: g-1"),
        (RunEnd("pending", ""), GATED, "needs_review", "waiting for approval: g-1"),
        (
            RunEnd("pending", "sent"),
            RunFacts(model_calls=1),
            "needs_review",
            "said pending, but it opened no gate",
        ),
        (RunEnd("done", ""), RunFacts(gates=(("g-1", "executed"),)), "done", "approved and sent: g-1"),
        (
            RunEnd("pending", ""),
            RunFacts(gates=(("g-1", "denied"),)),
            "failed",
            "gated act not sent: g-1 denied",
        ),
        (RunEnd("done", "x", cancelled=True), SPENT, "cancelled", "cancelled by the operator"),
        # Over budget and nothing left the box: deferred to the next window, not failed.
        (
            RunEnd("failed", "budget exhausted"),
            RunFacts(refused=1, budget_refused=True),
            "queued",
            "deferred",
        ),
        # Over budget after it already posted: never rerun (it would post twice).
        (
            RunEnd("failed", "budget exhausted"),
            RunFacts(sent=1, refused=1, budget_refused=True),
            "failed",
            "reported failure",
        ),
    ],
)
def test_the_host_attests_the_state(end: RunEnd, facts: RunFacts, state: str, says: str) -> None:
    attestation = attest(end, facts)
    assert attestation.state == state
    assert says in attestation.outcome
    assert attestation.deferred == (state == "queued")


@pytest.mark.parametrize(
    ("gates", "expected"),
    [
        ((), None),
        ((("g-1", "pending"), ("g-2", "executed")), Attestation("needs_review", "waiting for approval: g-1")),
        ((("g-1", "executing"),), Attestation("needs_review", "waiting for approval: g-1")),
        ((("g-1", "executed"), ("g-2", "expired")), Attestation("failed", "gated act not sent: g-2 expired")),
        (
            (("g-1", "executed"), ("g-2", "executed")),
            Attestation("done", "gated acts approved and sent: g-1, g-2"),
        ),
    ],
)
def test_gates_verdict(gates: tuple[tuple[str, str], ...], expected: Attestation | None) -> None:
    assert gates_verdict(gates) == expected


@pytest.mark.parametrize(
    ("attempts", "acted", "cancel", "action"),
    [(1, False, False, "requeue"), (2, False, False, "requeue"), (3, False, False, "failed"),
     (1, True, False, "needs_review"), (1, False, True, "cancelled"), (3, True, True, "cancelled")],
)  # fmt: skip
def test_reclaim_decision(attempts: int, acted: bool, cancel: bool, action: str) -> None:
    assert (
        reclaim_decision(attempts=attempts, max_attempts=3, acted=acted, cancel_requested=cancel)[0] == action
    )


def row(
    scope: str,
    daily: tuple[int | None, int] = (None, 0),
    monthly: tuple[int | None, int] = (None, 0),
    reserved: int = 0,
) -> BudgetRow:
    return BudgetRow(scope, daily[0], daily[1], monthly[0], monthly[1], reserved, "policy")


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([row(ALL_IMPS, (5, 1)), row("pip", (2, 1))], None),
        ([row(ALL_IMPS, (5, 1)), row("pip", (2, 2))], (12 * 3600, "imp pip: daily budget")),
        ([row(ALL_IMPS, (5, 5)), row("pip", (2, 0))], (12 * 3600, "all imps: daily budget")),
        ([row("bob", (2, 9))], None),  # another imp's spending is not pip's
        (
            [row("pip", (2, 2), (20, 20))],
            (21 * 86_400 - 12 * 3600, "imp pip: monthly budget"),
        ),  # the longer wait
        (
            [row("pip", (2, 2), reserved=1)],
            None,
        ),  # in flight, not yet spent: let it try (the hard stop still holds)
    ],
)
def test_budget_wait(rows: list[BudgetRow], expected: tuple[int, str] | None) -> None:
    assert budget_wait(rows, "pip", NOW) == expected


# --- transitions ---------------------------------------------------------------------------------------


def test_a_task_moves_queued_running_done_and_logs_each_move(
    store: TaskStore, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="impyard.tasks"):
        task = store.add(TaskRequest("pip", "hello", channel_id="123"))
        claimed = store.claim(task.id, "run-1", "process")
        assert claimed is not None and claimed.state == "running" and claimed.attempts == 1
        assert store.claim(task.id, "run-2", "process") is None  # claimed once
        done = store.finish(
            task.id,
            "run-1",
            Attestation("done", "done (1 model call)"),
            RunEnd("done", "hi there"),
            returncode=0,
        )
    assert done is not None and done.state == "done" and done.outcome == "done (1 model call)"
    assert (done.box_outcome, done.box_summary) == ("done", "hi there")
    [run] = store.runs(task.id)
    assert (run.run_id, run.attempt, run.result, run.returncode) == ("run-1", 1, "done", 0)
    lines = [r.getMessage() for r in caplog.records if r.name == "impyard.tasks"]
    assert any(f"task {task.id} new -> queued" in line for line in lines)
    assert any(f"task {task.id} queued -> running imp=pip run=run-1" in line for line in lines)
    assert any(f"task {task.id} running -> done" in line for line in lines)


def test_a_stale_run_cannot_finish_a_task(store: TaskStore) -> None:
    task = store.add(TaskRequest("pip", "x"))
    store.claim(task.id, "run-1", "process")
    assert store.finish(task.id, "run-old", Attestation("done", "x"), RunEnd("done")) is None
    assert store.get(task.id).state == "running"


def test_cancel(store: TaskStore) -> None:
    queued = store.add(TaskRequest("pip", "x"))
    assert store.request_cancel(queued.id).state == "cancelled"
    running = store.add(TaskRequest("pip", "y"))
    store.claim(running.id, "run-1", "process")
    asked = store.request_cancel(running.id)
    assert asked.state == "running" and asked.cancel_requested
    assert store.cancel_requested([running.id]) == [
        running.id
    ]  # the supervisor's question about its own tasks
    with pytest.raises(TaskError, match="already cancelled"):
        store.request_cancel(queued.id)
    with pytest.raises(TaskError, match="no task 't-nope'"):
        store.request_cancel("t-nope")


def test_deferral_and_readiness(store: TaskStore, clock: FixedClock) -> None:
    task = store.add(TaskRequest("pip", "x"))
    assert [t.id for t in store.ready(10)] == [task.id]
    store.defer(task.id, NOW + timedelta(hours=12), "budget")
    assert store.ready(10) == [] and store.get(task.id).deferrals == 1
    clock.advance(hours=12)
    assert [t.id for t in store.ready(10)] == [task.id]


# --- follow-ups, the journal, the briefing -------------------------------------------------------------


def open_gate(db: Database, clock: FixedClock, run_id: str) -> Gate:
    return GateStore(db, clock, AuditLog(db, clock, [])).open(
        imp="pip", run_id=run_id, session_channel="123", origin_guild=None, act="discord.send", target="123",
        payload={"channel_id": "123", "content": "Today's summary", "reply_to": None, "files": [], "kind": "other"},
        reason="the session's own channel is not trusted: gate", deadline=timedelta(hours=24),
    )  # fmt: skip


def test_a_decided_gate_queues_exactly_one_follow_up(
    store: TaskStore, db: Database, clock: FixedClock
) -> None:
    task = store.add(TaskRequest("pip", "Post the summary", channel_id="123", wake_on_resolve=True))
    store.claim(task.id, "run-1", "process")
    gate = open_gate(db, clock, "run-1")
    store.finish(task.id, "run-1", attest(RunEnd("pending"), store.run_facts("run-1")), RunEnd("pending"))
    assert store.get(task.id).state == "needs_review"
    assert store.decided_gates_to_follow() == []  # still pending
    GateStore(db, clock, AuditLog(db, clock, [])).decide(
        gate.id, Approver("operator", "ann"), approve=False, note="not today"
    )
    [(parent, decided)] = store.decided_gates_to_follow()
    follow = store.add_continuation(parent, decided)
    assert follow is not None and follow.origin == "continuation" and follow.parent_gate == gate.id
    assert not follow.wake_on_resolve  # one follow-up per decision, never a chain
    assert "was denied by operator:ann" in (follow.prompt or "") and "not today" in (follow.prompt or "")
    assert "> Post the summary" in (follow.prompt or "") and "> Today's summary" in (follow.prompt or "")
    assert store.add_continuation(parent, decided) is None  # exactly once, even if asked again
    assert store.decided_gates_to_follow() == []
    [settled] = store.settle_reviews()
    assert settled.id == task.id and settled.state == "failed" and "denied" in (settled.outcome or "")


def test_a_task_without_wake_on_resolve_gets_no_follow_up(
    store: TaskStore, db: Database, clock: FixedClock
) -> None:
    task = store.add(TaskRequest("pip", "x", channel_id="123"))
    store.claim(task.id, "run-1", "process")
    gate = open_gate(db, clock, "run-1")
    GateStore(db, clock, AuditLog(db, clock, [])).decide(gate.id, Approver("operator", "ann"), approve=False)
    assert store.decided_gates_to_follow() == []


@pytest.mark.parametrize(
    ("state", "expected"),
    [("executed", "was approved by operator:ann and sent (message ids: m1)"), ("expired", "expired without a decision"),
     ("failed", "delivery failed: boom")],
)  # fmt: skip
def test_continuation_prompt_says_what_became_of_the_gate(state: str, expected: str) -> None:
    gate = Gate(
        id="g-1", imp="pip", run_id="r", session_channel="123", origin_guild=None, act="discord.send", target="123",
        payload={"channel_id": "123", "content": "hello"}, payload_sha256="", reason="", state=state, created_at=NOW, deadline=NOW,  # type: ignore[arg-type]
        decided_by="operator:ann" if state != "expired" else None, message_ids=["m1"], error="boom",
    )  # fmt: skip
    text = continuation_prompt("t-1", "y" * 10_000, gate)
    assert expected in text and len(text) <= MAX_PROMPT_CHARS and "[…]" in text


def test_the_journal_holds_only_the_imps_own_finished_tasks(store: TaskStore, clock: FixedClock) -> None:
    for imp, prompt, summary in (
        ("pip", "a", "posted the Monday summary"),
        ("bob", "b", "bob's secret"),
        ("pip", "c", "posted Tuesday"),
    ):
        task = store.add(TaskRequest(imp, prompt))
        store.claim(task.id, f"run-{prompt}", "process")
        clock.advance(minutes=1)
        store.finish(task.id, f"run-{prompt}", Attestation("done", "done"), RunEnd("done", summary))
    store.add(TaskRequest("pip", "still queued"))
    entries = store.journal("pip")
    assert [entry.box_summary for entry in entries] == ["posted Tuesday", "posted the Monday summary"]
    briefing = render_briefing(entries)
    assert briefing is not None and "bob's secret" not in briefing
    assert briefing.index("posted Tuesday") < briefing.index("Monday")


def test_the_briefing_is_bounded_and_composed_before_the_task() -> None:
    entries = [
        JournalEntry(f"t-{i}", "prompt", "schedule", "done", "done", "z" * 500, NOW) for i in range(50)
    ]
    briefing = render_briefing(entries, max_chars=1_000)
    assert briefing is not None and len(briefing) <= 1_000
    assert render_briefing([]) is None
    assert compose_prompt("do it", None) == "do it"
    assert compose_prompt(None, "## brief") == "## brief"
    assert compose_prompt("do it", "## brief") == "## brief\n\n## This task\ndo it"


def test_run_facts_come_from_the_audit_not_the_box(store: TaskStore, db: Database, clock: FixedClock) -> None:
    rows = [("model.request", "allowed", "run-9", 300), ("discord.send", "allowed", "run-9", 0),
            ("model.request", "budget_exhausted", "run-9", 0), ("http.fetch", "denied", "run-9", 0),
            ("model.request", "allowed", "other-run", 999)]  # fmt: skip
    db.write(
        lambda conn: conn.execute(
            sa.insert(tables.audit),
            [{"at": "2026-04-10T12:00:00.000000+00:00", "imp": "pip", "method": method, "verdict": verdict,
              "run_id": run_id, "cost_micros": cost} for method, verdict, run_id, cost in rows],
        )
    )  # fmt: skip
    facts = store.run_facts("run-9")
    assert (facts.model_calls, facts.cost_micros, facts.sent, facts.refused, facts.budget_refused) == (
        1,
        300,
        1,
        2,
        True,
    )
    assert facts.acted


# --- two supervisors (two processes, as on two hosts) race for the same queued tasks (issue 21) -------------


def claim_and_finish(where: dict[str, Any], told: Any, results: Any, barrier: Any) -> None:
    """A worker process, a supervisor of its own: claim each task it is told of and, if it is its, finish it."""
    db = reopen(where)
    store = TaskStore(db, FixedClock(NOW))
    try:
        while (task_id := told.get()) is not None:
            run_id = f"run-{os.getpid()}-{task_id}"
            barrier.wait()  # both processes claim together
            claimed = store.claim(task_id, run_id, "process") is not None
            if claimed:
                store.finish(task_id, run_id, Attestation("done", "done"), RunEnd("done", run_id))
            results.put((task_id, claimed))
    finally:
        db.close()


@pytest.fixture
def supervisors(db: Database) -> Iterator[tuple[list[Any], Any]]:
    with two_racers(claim_and_finish, db) as racing:
        yield racing


def test_a_queued_task_raced_by_two_supervisors_runs_once(
    store: TaskStore, supervisors: tuple[list[Any], Any]
) -> None:
    inboxes, results = supervisors
    for _ in range(RACE_ROUNDS):
        task = store.add(TaskRequest("pip", "x"))
        answers = race(inboxes, results, task.id)
        assert sorted(claimed for _, claimed in answers) == [False, True], answers  # exactly one claims it
        done = store.get(task.id)
        [run] = store.runs(task.id)
        assert (done.state, done.attempts, done.run_id, done.box_summary) == (
            "done",
            1,
            run.run_id,
            run.run_id,
        )
