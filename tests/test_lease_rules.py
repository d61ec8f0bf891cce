"""Issue 21, one holder at a time: who may take a lease, and when an act under a lease is refused (tables)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from impyard.storage.lease_rules import (
    Decision,
    LeaseRow,
    Outcome,
    decide,
    granted,
    reclaims,
    refusal,
    verify,
)
from impyard.storage.liveness import Holder

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
ME = Holder("alpha", "b00t", 100, "555")
OTHER = Holder("beta", "f00d", 200, "777")
SAME_MACHINE = Holder("alpha", "b00t", 300, "999")


def row(holder: Holder | None, token: int, expires_in_s: float) -> LeaseRow:
    return LeaseRow("shard:1/2", holder, token, NOW + timedelta(seconds=expires_in_s))


@pytest.mark.parametrize(
    ("current", "alive", "expected"),
    [
        (None, None, Decision(Outcome.FREE, 1)),
        (row(ME, 4, 20), True, Decision(Outcome.MINE, 4)),
        (row(ME, 4, -5), True, Decision(Outcome.MINE, 4)),  # nobody took it meanwhile: renewing is safe
        (row(OTHER, 4, 20), None, Decision(Outcome.HELD, 4)),  # another machine: its expiry decides
        (row(OTHER, 4, 0), None, Decision(Outcome.EXPIRED, 5)),  # expiring now counts as expired
        (row(OTHER, 4, -1), None, Decision(Outcome.EXPIRED, 5)),
        (row(SAME_MACHINE, 4, 20), True, Decision(Outcome.HELD, 4)),
        (row(SAME_MACHINE, 4, 20), False, Decision(Outcome.DEAD, 5)),  # kill -9 here: no need to wait
        (row(None, 9, 20), None, Decision(Outcome.HELD, 9)),  # a garbled holder: only its expiry frees it
        (row(None, 9, -1), None, Decision(Outcome.EXPIRED, 10)),
    ],
)
def test_who_may_take_a_lease(current: LeaseRow | None, alive: bool | None, expected: Decision) -> None:
    decision = decide(current, ME, NOW, alive)
    assert decision == expected
    assert decision.granted is (expected.outcome is not Outcome.HELD)


@pytest.mark.parametrize(
    ("current", "token", "refused_because"),
    [
        (row(ME, 3, 20), 3, None),
        (None, 3, "the lease was released"),
        (row(ME, 3, 0), 3, "the lease expired before it was renewed"),
        (row(ME, 4, 20), 3, "the lease passed to alpha pid 100 (token 4, this host held 3)"),
        (row(OTHER, 4, 20), 3, "the lease passed to beta pid 200 (token 4, this host held 3)"),
        (row(OTHER, 3, 20), 3, "the lease passed to beta pid 200 (token 3, this host held 3)"),
    ],
)
def test_an_act_under_a_stale_token_is_refused(
    current: LeaseRow | None, token: int, refused_because: str | None
) -> None:
    assert verify(current, ME, token, NOW) == refused_because


def test_a_refusal_names_the_holder_and_when_the_lease_frees_itself() -> None:
    assert refusal("shard 1/2", row(OTHER, 2, 12.2), NOW) == (
        "shard 1/2 is held by beta (pid 200); it is free once that process stops, or in 13 s if it stops renewing"
    )
    assert refusal("shard 1/2", row(None, 2, -3), NOW).endswith("or in 0 s if it stops renewing")


@pytest.mark.parametrize(
    ("current", "alive", "claimed", "reclaimed"),
    [
        (None, None, True, True),  # a run of before run leases (or let go without ending): anyone may end it
        (row(ME, 4, 20), True, True, False),  # this process's own run: another supervisor of it runs it
        (row(ME, 4, -5), True, True, False),  # (expired or not: it is still this process's to end)
        (row(OTHER, 4, 20), None, False, False),  # a live host of another machine runs it
        (row(OTHER, 4, -1), None, True, True),  # it stopped renewing: its run is over
        (row(SAME_MACHINE, 4, 20), True, False, False),  # a live process of this machine runs it
        (row(SAME_MACHINE, 4, 20), False, True, True),  # killed here: reclaimed at once, not after 30 s
        (row(None, 9, 20), None, False, False),  # a garbled holder: only its expiry frees it
        (row(None, 9, -1), None, True, True),
    ],
)
def test_who_may_take_a_lease_and_who_may_reclaim_a_task_run_under_it(
    current: LeaseRow | None, alive: bool | None, claimed: bool, reclaimed: bool
) -> None:
    decision = decide(current, ME, NOW, alive)
    assert (granted(decision), reclaims(decision)) == (claimed, reclaimed)
