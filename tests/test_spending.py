"""Spend per UTC day and purpose group, and the reservations in flight (issue 34: the Budget page, `budget spend`).

The grouping is a table; the read runs on both engines against ledger rows written by the ledger itself, a task
run's rows told apart by the run that made them."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from impyard.clock import FixedClock
from impyard.gateway.ledger import ALL_IMPS, Ledger
from impyard.gateway.policy import policy_from_text
from impyard.gateway.spending import (
    DaySpend,
    SpendRow,
    purpose_group,
    read_in_flight,
    read_spend,
    report_of,
    window,
)
from impyard.storage.db import Database
from impyard.storage.liveness import this_process
from impyard.tasks.request import TaskRequest
from impyard.tasks.store import TaskStore

POLICY = policy_from_text("[budgets.per_imp]\ndaily_usd = 10.0\n")


@pytest.mark.parametrize(
    ("purpose", "from_task", "group"),
    [
        ("reply", False, "reply"),
        ("image", False, "reply"),  # the pictures posted with the reply
        ("arrival", False, "memory"),
        ("appraisal", False, "memory"),
        ("filter", False, "memory"),
        ("summary", False, "memory"),
        ("introspection", False, "memory"),
        ("selection", False, "memory"),
        ("learning", False, "memory"),
        ("classification", False, "memory"),
        ("sleep", False, "memory"),
        ("embedding", False, "memory"),
        ("reply", True, "tasks"),  # a task run's calls are tasks, whatever their purpose
        ("sleep", True, "tasks"),
        ("probe", False, "other"),
        ("", False, "other"),
    ],
)
def test_each_purpose_has_one_group(purpose: str, from_task: bool, group: str) -> None:
    assert purpose_group(purpose, from_task=from_task) == group


def test_the_window_is_the_days_ending_with_the_last_oldest_first() -> None:
    assert window(date(2026, 3, 2), 3) == ("2026-02-28", "2026-03-01", "2026-03-02")
    for bad in (0, 93):
        with pytest.raises(ValueError, match="days is a whole number from 1 to 92"):
            window(date(2026, 3, 2), bad)


def test_a_report_sums_groups_per_scope_and_keeps_the_empty_days() -> None:
    days = ("2026-05-09", "2026-05-10")
    rows = [
        SpendRow("pip", "2026-05-10", "reply", False, 700, 0),
        SpendRow("pip", "2026-05-10", "image", False, 300, 50),
        SpendRow("pip", "2026-05-10", "reply", True, 2_000, 0),
        SpendRow("bo", "2026-05-10", "summary", False, 40, 0),
        SpendRow("bo", "2026-05-08", "summary", False, 9_999, 0),  # outside the window: not counted
    ]
    report = report_of(rows, days)
    assert [scope.scope for scope in report.scopes] == [ALL_IMPS, "bo", "pip"]
    pip = report.of("pip")
    assert pip.days == (
        DaySpend("2026-05-09"),
        DaySpend("2026-05-10", {"reply": 1_000, "tasks": 2_000}, 50),
    )
    assert (pip.days[1].charged_total, pip.days[1].total, pip.total, pip.group_total("tasks")) == (
        3_000, 3_050, 3_050, 2_000,
    )  # fmt: skip
    assert report.of(ALL_IMPS).days[1] == DaySpend(
        "2026-05-10", {"reply": 1_000, "memory": 40, "tasks": 2_000}, 50
    )
    assert report.of("nobody").total == 0 and len(report.of("nobody").days) == 2
    assert [s.scope for s in report_of(rows, days, imp="pip").scopes] == [
        "bo",
        "pip",
    ]  # as given: no all-imps row


@pytest.fixture
def db(any_engine_db: Database) -> Database:
    return any_engine_db


def test_spend_is_read_per_day_purpose_and_origin_on_both_engines(db: Database) -> None:
    clock = FixedClock(datetime(2026, 5, 8, 9, 0, tzinfo=UTC))
    ledger = Ledger(db, POLICY, clock)
    tasks = TaskStore(db, clock)
    task = tasks.add(TaskRequest("pip", "say hi", channel_id="c1"))
    assert tasks.claim(task.id, "task-run-1", "process") is not None

    def call(imp: str, purpose: str, cost: int, run_id: str = "box-1", *, reserve: int = 50_000) -> None:
        ledger.settle(
            ledger.reserve(imp, reserve, method="model.request", purpose=purpose, run_id=run_id), cost
        )

    call("pip", "reply", 8_000)
    call("pip", "summary", 3_600)
    clock.advance(days=2)  # 2026-05-10
    call("pip", "reply", 8_000)
    call("pip", "appraisal", 1_000)
    call("pip", "embedding", 1_000)
    call("pip", "reply", 12_000, run_id="task-run-1")
    call("pip", "sleep", 500, run_id="task-run-1")
    call("pip", "probe", 1_800)
    call("bo", "reply", 100)
    call("pip", "reply", 999_999, reserve=2_000)  # settled at most at its reservation
    held = ledger.reserve("pip", 5_000, method="model.request", purpose="reply", model="gpt-4.1-mini")

    report = read_spend(db, last_day=date(2026, 5, 10), days=14)
    pip = report.of("pip")
    assert len(pip.days) == 14 and pip.days[-1].day == "2026-05-10"
    assert [day.day for day in pip.spent_days] == ["2026-05-08", "2026-05-10"]
    assert pip.spent_days[0] == DaySpend("2026-05-08", {"reply": 8_000, "memory": 3_600}, 0)
    assert pip.spent_days[1] == DaySpend(
        "2026-05-10", {"reply": 10_000, "memory": 2_000, "tasks": 12_500, "other": 1_800}, 5_000
    )
    assert report.of(ALL_IMPS).spent_days[1].total == 10_000 + 2_000 + 12_500 + 1_800 + 5_000 + 100
    # today's window as the budget counts it (summary, `budget show`) is the day's bar
    [mine] = [row for row in ledger.summary() if row.scope == "pip"]
    assert mine.daily_spent == pip.spent_days[1].total and mine.reserved == 5_000

    assert read_spend(db, last_day=date(2026, 5, 9), days=1).scopes == (report_of([], ("2026-05-09",)).scopes)
    only_bo = read_spend(db, last_day=date(2026, 5, 10), days=3, imp="bo")
    assert [s.scope for s in only_bo.scopes] == ["bo"] and only_bo.of("bo").total == 100

    [flying] = read_in_flight(db)
    assert (flying.id, flying.imp, flying.reserved_micros, flying.purpose, flying.model) == (
        held.id, "pip", 5_000, "reply", "gpt-4.1-mini",
    )  # fmt: skip
    assert flying.since == clock.now() and flying.holder == this_process()
    assert read_in_flight(db, imp="bo") == []
    ledger.settle(held, 4_000)
    assert read_in_flight(db) == []
    assert read_spend(db, last_day=date(2026, 5, 10), days=1).of("pip").days[0].charged == {
        "reply": 14_000, "memory": 2_000, "tasks": 12_500, "other": 1_800,
    }  # fmt: skip
