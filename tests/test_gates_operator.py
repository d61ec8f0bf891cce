"""What every operator surface (``impyard approvals``, the console's Approvals page) says of a gate, and who the
operator is: pure rules in ``impyard.gateway.gates``, as tables; the recently decided gates on both engines."""

from __future__ import annotations

import getpass
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from impyard.clock import FixedClock
from impyard.gateway.audit import AuditLog
from impyard.gateway.gates import (
    Approver,
    Gate,
    GateError,
    GateStore,
    already_decided,
    decision_line,
    is_gate_id,
    may_decide,
    operator_approver,
    time_left,
    who_may_decide,
)
from impyard.storage.db import Database

NOW = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
GATE = Gate(
    id="g-0123456789ab", imp="pip", run_id="r1", session_channel="111", origin_guild="g1", act="discord.send",
    target="111", payload={"channel_id": "111", "content": "hi"}, payload_sha256="x", reason="untrusted",
    state="pending", created_at=NOW, deadline=NOW + timedelta(hours=24), target_guild="g1",
)  # fmt: skip


def test_the_operator_is_the_account_that_runs_the_command() -> None:
    me = operator_approver()
    assert me == Approver("operator", getpass.getuser()) and me.label == f"operator:{getpass.getuser()}"
    assert operator_approver("ann").label == "operator:ann"
    assert may_decide(operator_approver("ann"), GATE, owners=())[0]  # the operator may decide every gate


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("g-0123456789ab", True),
        ("g-abcdef", True),
        ("g-" + "a" * 32, True),
        ("g-abcde", False),
        ("g-" + "a" * 33, False),
        ("g-0123456789AB", False),
        ("G-0123456789ab", False),
        ("g-0123456789ab\n", False),
        (" g-0123456789ab", False),
        ("g-../../etc", False),
        ("", False),
    ],
)
def test_a_gate_id_has_one_form(text: str, ok: bool) -> None:
    assert is_gate_id(text) is ok


@pytest.mark.parametrize(
    ("left", "says"),
    [
        (timedelta(hours=24), "1d left"),
        (timedelta(hours=23, minutes=59, seconds=59, milliseconds=900), "23h59m left"),
        (timedelta(hours=1, seconds=30), "1h left"),
        (timedelta(minutes=59, seconds=59), "59m59s left"),
        (timedelta(seconds=1), "1s left"),
        (timedelta(milliseconds=999), "past its deadline"),
        (timedelta(0), "past its deadline"),
        (timedelta(hours=-3), "past its deadline"),
    ],
)
def test_time_left_is_never_rounded_up(left: timedelta, says: str) -> None:
    assert time_left(GATE, GATE.deadline - left) == says


DECIDED_AT = NOW + timedelta(minutes=5)


@pytest.mark.parametrize(
    ("state", "by", "says"),
    [
        ("approved", "user:discord:7", "g-0123456789ab was already approved by user:discord:7 at 2026-06-01 09:05:00 UTC"),
        ("executing", "operator:ann", "g-0123456789ab was already approved by operator:ann at 2026-06-01 09:05:00 UTC (now executing)"),
        ("executed", "operator:ann", "g-0123456789ab was already approved by operator:ann at 2026-06-01 09:05:00 UTC (now executed)"),
        ("failed", "operator:ann", "g-0123456789ab was already approved by operator:ann at 2026-06-01 09:05:00 UTC (now failed)"),
        ("denied", "user:discord:7", "g-0123456789ab was already denied by user:discord:7 at 2026-06-01 09:05:00 UTC"),
        ("expired", None, "g-0123456789ab already expired at 2026-06-01 09:05:00 UTC, its deadline; it can no longer be decided"),
        ("pending", None, "g-0123456789ab is still pending"),
    ],
)  # fmt: skip
def test_already_decided_says_who_decided_first_and_when(state: str, by: str | None, says: str) -> None:
    gate = replace(GATE, state=state, decided_by=by, decided_at=None if state == "pending" else DECIDED_AT)  # type: ignore[arg-type]
    assert already_decided(gate) == says


@pytest.mark.parametrize(
    ("state", "says"),
    [
        ("approved", "approved g-0123456789ab; the running impyard host sends it exactly once"),
        ("executed", "approved g-0123456789ab; the running impyard host sends it exactly once"),
        ("denied", "denied g-0123456789ab; it will not be sent"),
        ("expired", "g-0123456789ab is expired"),
    ],
)
def test_a_decision_in_one_line(state: str, says: str) -> None:
    assert decision_line(replace(GATE, state=state)) == says  # type: ignore[arg-type]


def test_who_may_decide_names_the_guild_whose_admins_may() -> None:
    assert who_may_decide(GATE) == "the operator, owners of pip, admins of guild g1"
    elsewhere = replace(GATE, target="222", target_guild=None)
    assert who_may_decide(elsewhere) == (
        "the operator, owners of pip (no guild admin: a DM, or a guild this host does not know)"
    )


def test_the_recently_decided_come_by_decision_time_newest_first(any_engine_db: Database) -> None:
    clock = FixedClock(NOW)
    store = GateStore(any_engine_db, clock, AuditLog(any_engine_db, clock, []))

    def held(minutes: int = 60 * 24) -> str:
        return store.open(
            imp="pip", run_id="r", session_channel="111", origin_guild="g1", act="discord.send", target="111",
            payload={"channel_id": "111", "content": "hi"}, reason="untrusted", deadline=timedelta(minutes=minutes),
        ).id  # fmt: skip

    first, second, late, waiting = held(), held(), held(minutes=1), held()
    clock.advance(timedelta(minutes=2))
    store.decide(second, operator_approver("ann"), approve=False)
    clock.advance(timedelta(minutes=1))
    store.expire_due()  # late
    clock.advance(timedelta(minutes=1))
    store.decide(first, Approver("user", "discord:7"), approve=True, owners=("discord:7",))
    store.claim(first)
    store.finish(first, message_ids=["m1"])
    with pytest.raises(
        GateError, match=f"{first} was already approved by user:discord:7 at .* UTC \\(now executed\\)"
    ):
        store.decide(first, operator_approver("ann"), approve=False)
    recent = store.decided_recently()
    assert [(g.id, g.state) for g in recent] == [(first, "executed"), (late, "expired"), (second, "denied")]
    assert waiting not in [g.id for g in recent]
    assert [g.id for g in store.decided_recently(limit=1)] == [first]
