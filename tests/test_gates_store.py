"""The gate store on both engines (issue 21): every transition is one conditional UPDATE in ``Database.write``,
so a gate approved once executes once — also when two processes (two hosts) share the database and race for it.
Assertions go through the store or portable SQL on impyard.storage.tables, never SQLite's own rows."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from impyard.clock import FixedClock
from impyard.gateway.audit import AuditLog
from impyard.gateway.gates import Approver, Gate, GateError, GateStore
from impyard.storage.db import Database
from impyard.storage.tables import audit, earned_trust, gates
from tests.racing import RACE_ROUNDS, race, reopen, two_racers

NOW = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
OPERATOR = Approver("operator", "root")
OWNER = Approver("user", "owner-1")
OWNERS = ("owner-1",)


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(NOW)


@pytest.fixture
def store(any_engine_db: Database, clock: FixedClock) -> GateStore:
    return GateStore(any_engine_db, clock, AuditLog(any_engine_db, clock, ["s3cret-token-value"]))


def open_gate(store: GateStore, *, target: str = "chat", content: str = "hello", hours: int = 24) -> Gate:
    return store.open(
        imp="pip", run_id="run-1", session_channel="chat", origin_guild="g1", act="discord.send", target=target,
        payload={"channel_id": target, "content": content}, reason="untrusted", deadline=timedelta(hours=hours),
    )  # fmt: skip


def transitions(db: Database, gate_id: str) -> list[str]:
    query = sa.select(audit.c.verdict).where(audit.c.method == "gate", audit.c.gate_id == gate_id)
    return db.read(lambda conn: list(conn.scalars(query.order_by(audit.c.id))))


def clean_approvals(db: Database, target: str = "chat") -> int | None:
    query = sa.select(earned_trust.c.clean_approvals).where(earned_trust.c.target == target)
    return db.read(lambda conn: conn.scalar(query))


def test_a_gate_moves_approved_executing_executed_once_with_its_audit_rows(
    store: GateStore, any_engine_db: Database
) -> None:
    gate = open_gate(store, content="exact words")
    assert (gate.state, gate.payload["content"], gate.deadline - gate.created_at) == (
        "pending",
        "exact words",
        timedelta(hours=24),
    )
    approved = store.decide(gate.id, OPERATOR, approve=True, note="ok")
    assert (approved.state, approved.decided_by, approved.decision_note) == (
        "approved",
        "operator:root",
        "ok",
    )
    assert store.claim(gate.id) is not None
    assert store.claim(gate.id) is None  # claimed: nobody else executes it
    done = store.finish(gate.id, message_ids=["m-1"])
    assert (done.state, done.message_ids) == ("executed", ["m-1"])
    assert store.finish(gate.id, error="late").state == "executed"  # an outcome is written once
    assert transitions(any_engine_db, gate.id) == ["approved", "executing", "executed"]


def test_a_refused_decision_changes_nothing(store: GateStore, any_engine_db: Database) -> None:
    gate = open_gate(store)
    with pytest.raises(GateError) as caught:
        store.decide(gate.id, Approver("user", "stranger"), approve=True)
    assert caught.value.kind == "not_authorised"
    with pytest.raises(GateError) as missing:
        store.decide("g-none", OPERATOR, approve=True)
    assert missing.value.kind == "not_found"
    assert store.get(gate.id).state == "pending" and transitions(any_engine_db, gate.id) == []
    assert clean_approvals(any_engine_db) is None
    store.decide(gate.id, OWNER, approve=False, note="no", owners=OWNERS)
    with pytest.raises(GateError, match="already denied"):
        store.decide(gate.id, OPERATOR, approve=True)
    assert store.claim(gate.id) is None and store.get(gate.id).state == "denied"


def test_earned_trust_counts_clean_approvals_and_a_denial_resets_it(
    store: GateStore, any_engine_db: Database
) -> None:
    for _ in range(3):
        store.decide(open_gate(store).id, OWNER, approve=True, owners=OWNERS)
    assert clean_approvals(any_engine_db) == 3
    store.decide(open_gate(store).id, OWNER, approve=False, owners=OWNERS)
    assert clean_approvals(any_engine_db) == 0
    store.decide(open_gate(store).id, OWNER, approve=True, owners=OWNERS)
    assert clean_approvals(any_engine_db) == 1 and clean_approvals(any_engine_db, "elsewhere") is None


def test_a_late_approval_expires_the_gate_and_the_sweep_expires_the_rest(
    store: GateStore, clock: FixedClock, any_engine_db: Database
) -> None:
    first, second = open_gate(store, hours=1), open_gate(store, hours=2)
    third = open_gate(store, hours=48)
    clock.advance(hours=1)
    with pytest.raises(GateError) as caught:
        store.decide(first.id, OPERATOR, approve=True)
    assert caught.value.kind == "expired"  # refused, and the expiry is committed
    assert store.get(first.id).state == "expired" and transitions(any_engine_db, first.id) == ["expired"]
    clock.advance(hours=1)
    assert [gate.id for gate in store.expire_due()] == [second.id]
    assert store.expire_due() == [] and store.get(third.id).state == "pending"


def test_the_newest_gates_come_first(store: GateStore, clock: FixedClock) -> None:
    opened = []
    for _ in range(3):
        opened.append(open_gate(store).id)
        clock.advance(seconds=1)
    store.decide(opened[1], OPERATOR, approve=True)
    assert [gate.id for gate in store.latest()] == opened[::-1]
    assert [gate.id for gate in store.latest(limit=2)] == opened[:0:-1]
    assert [gate.id for gate in store.approved_waiting()] == [opened[1]]
    assert [gate.id for gate in store.latest(states=("pending",))] == [opened[2], opened[0]]


def test_a_learned_target_guild_only_fills_a_gap(store: GateStore) -> None:
    unknown, own = open_gate(store, target="far"), open_gate(store, target="chat")
    assert store.learn_target_guild(unknown.id, "g2").target_guild == "g2"
    assert store.learn_target_guild(unknown.id, "g9").target_guild == "g2"  # never changes a recorded guild
    assert store.learn_target_guild(own.id, "g9").target_guild == "g1"  # nor the session's own channel's


def test_a_tampered_payload_is_not_executed(store: GateStore, any_engine_db: Database) -> None:
    gate = open_gate(store, content="original")
    tamper = sa.update(gates).where(gates.c.id == gate.id).values(payload='{"content":"tampered"}')
    any_engine_db.write(lambda conn: conn.execute(tamper))
    store.decide(gate.id, OPERATOR, approve=True)
    with pytest.raises(GateError) as caught:
        store.claim(gate.id)
    assert caught.value.kind == "tampered" and store.get(gate.id).state == "failed"


def test_audit_rows_of_transitions_are_redacted(store: GateStore, any_engine_db: Database) -> None:
    gate = open_gate(store)
    store.decide(gate.id, OPERATOR, approve=True, note="token s3cret-token-value")
    reasons = any_engine_db.read(
        lambda conn: list(conn.scalars(sa.select(audit.c.reason).where(audit.c.gate_id == gate.id)))
    )
    assert reasons == ["token [redacted]"]


# --- two processes race for the same gates (issue 21, "Exactly once across hosts") ----------------------------


def approve_and_execute(where: dict[str, Any], gates_in: Any, results: Any, barrier: Any) -> None:
    """A worker process, a host of its own: for each gate, approve it and execute it if it is its to execute."""
    db = reopen(where)
    clock = FixedClock(NOW)
    store = GateStore(db, clock, AuditLog(db, clock, []))
    try:
        while (gate_id := gates_in.get()) is not None:
            barrier.wait()  # both processes start on the gate together
            try:
                store.decide(gate_id, OPERATOR, approve=True)
                decided = True
            except GateError:
                decided = False
            claimed = store.claim(gate_id) is not None
            if claimed:
                store.finish(gate_id, message_ids=[f"pid-{os.getpid()}"])
            results.put((gate_id, decided, claimed))
    finally:
        db.close()


@pytest.fixture
def racers(any_engine_db: Database) -> Iterator[tuple[list[Any], Any]]:
    with two_racers(approve_and_execute, any_engine_db) as racing:
        yield racing


def test_a_gate_approved_and_executed_by_two_processes_executes_once(
    store: GateStore, any_engine_db: Database, racers: tuple[list[Any], Any]
) -> None:
    inboxes, results = racers
    for _ in range(RACE_ROUNDS):
        gate = open_gate(store)
        answers = race(inboxes, results, gate.id)
        assert sorted(decided for _, decided, _ in answers) == [False, True], answers  # one approval wins
        assert sorted(claimed for _, _, claimed in answers) == [False, True], answers  # one executor claims
        done = store.get(gate.id)
        assert done.state == "executed" and len(done.message_ids) == 1
        assert transitions(any_engine_db, gate.id) == ["approved", "executing", "executed"]
    assert clean_approvals(any_engine_db) == RACE_ROUNDS  # each gate's approval counted once
