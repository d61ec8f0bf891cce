"""The budget ledger and the price table: atomic reservations, windows, overrides, measured costs."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
import sqlalchemy as sa

from impyard.clock import FixedClock
from impyard.gateway.ledger import (
    ALL_IMPS,
    BudgetExhausted,
    Ledger,
    seconds_to_next_day,
    seconds_to_next_month,
)
from impyard.gateway.policy import policy_from_text
from impyard.gateway.policy_models import Price
from impyard.gateway.prices import (
    PROMPT_OVERHEAD_TOKENS,
    PriceMissing,
    Usage,
    bound_output,
    estimate_micros,
    measured_micros,
    token_cost_micros,
    usage_from_response,
)
from impyard.storage import migrations, tables
from impyard.storage import urls as dburl
from impyard.storage.db import Database, open_database
from impyard.storage.liveness import Holder, this_process
from impyard.storage.migrations.legacy import LEGACY_VERSION
from tests import sqlfile

pytestmark = pytest.mark.anyio

POLICY = policy_from_text(
    """
[budgets.all]
daily_usd = 1.0
monthly_usd = 3.0
[budgets.per_imp]
daily_usd = 0.5
monthly_usd = 2.0
[budgets.imps.big]
daily_usd = 0.9
"""
)
START = datetime(2026, 3, 31, 23, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(START)


@pytest.fixture
def db(any_engine_db: Database) -> Database:
    """The store-level tests run on both engines: SQLite, and PostgreSQL where a server can start."""
    return any_engine_db


@pytest.fixture
def ledger(db: Database, clock: FixedClock) -> Ledger:
    return Ledger(db, POLICY, clock)


# --- the database ------------------------------------------------------------------------------


def test_the_database_is_wal_and_migrations_run_once(tmp_path: Path) -> None:  # SQLite's own
    """The ledger's file is WAL and opening it again migrates nothing (migrations themselves, Alembic's and the
    frozen legacy list's, are tests/test_store_schema.py's)."""
    path = tmp_path / "x.db"
    db = open_database(path)
    assert sqlfile.query(db, "PRAGMA journal_mode")[0][0] == "wal"
    version, revision = db.version, db.revision
    assert revision == migrations.head()
    assert db.migrate() == version  # idempotent
    db.close()
    again = open_database(path)
    assert (again.version, again.revision) == (version, revision)
    again.close()


# --- reserve and settle -------------------------------------------------------------------------


def test_reserve_then_settle_charges_the_measured_cost(ledger: Ledger) -> None:
    reservation = ledger.reserve("pip", 300_000)
    ledger.settle(reservation, 120_000)
    ledger.settle(reservation, 999_999)  # settling twice is a no-op
    row = {r.scope: r for r in ledger.summary()}["pip"]
    assert (row.daily_spent, row.monthly_spent, row.reserved) == (120_000, 120_000, 0)


def test_settling_never_charges_more_than_was_reserved(ledger: Ledger) -> None:
    """issue 11 #3: the reserve step checked the limits against the reservation; settling above it would overspend."""
    reservation = ledger.reserve("pip", 400_000)
    assert ledger.settle(reservation, 5_000_000) == 400_000  # the upstream reported 12x the worst case
    row = {r.scope: r for r in ledger.summary()}["pip"]
    assert row.daily_spent == 400_000 <= row.daily_limit  # type: ignore[operator]
    assert ledger.settle(reservation, 1) == 0  # settled already: a no-op
    assert (
        ledger.settle(ledger.reserve("pip", 50_000), 20_000) == 20_000
    )  # below the reservation: the measured cost


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1.0, 1e300])
def test_an_override_must_be_a_finite_sane_amount(ledger: Ledger, bad: float) -> None:
    with pytest.raises(ValueError, match="budget limit is a number of USD"):
        ledger.set_limits("pip", daily_usd=bad, monthly_usd=None)
    assert ledger.limits("pip").source == "policy"  # nothing written


def test_the_hard_stop_refuses_when_the_window_is_spent_and_says_which(ledger: Ledger) -> None:
    ledger.settle(ledger.reserve("pip", 500_000), 500_000)  # pip's whole day
    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("pip", 1)
    assert caught.value.ledger == "imp:pip/day"
    assert caught.value.retry_after_s == 3600  # 23:00 -> midnight UTC
    ledger.reserve("other", 1)  # other imps are unaffected


def test_an_estimate_that_would_overspend_is_refused_too(ledger: Ledger) -> None:
    ledger.reserve("pip", 400_000)
    with pytest.raises(BudgetExhausted):
        ledger.reserve("pip", 100_001)
    ledger.reserve("pip", 100_000)  # exactly to the limit is fine


def test_in_flight_reservations_count_against_the_budget(ledger: Ledger) -> None:
    ledger.reserve("pip", 500_000)  # not settled yet
    with pytest.raises(BudgetExhausted):
        ledger.reserve("pip", 1)


def test_the_all_imps_window_stops_everyone(ledger: Ledger) -> None:
    ledger.settle(ledger.reserve("big", 900_000), 900_000)
    ledger.settle(ledger.reserve("pip", 100_000), 100_000)
    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("third", 1)
    assert caught.value.ledger == "all/day"


def test_day_and_month_windows_reset_on_the_utc_calendar(ledger: Ledger, clock: FixedClock) -> None:
    ledger.settle(ledger.reserve("pip", 500_000), 500_000)
    clock.advance(hours=1)  # 2026-04-01 00:00: a new day and a new month
    ledger.settle(ledger.reserve("pip", 500_000), 500_000)
    for _ in range(3):
        clock.advance(days=1)
        ledger.settle(ledger.reserve("pip", 500_000), 500_000)
    with pytest.raises(BudgetExhausted) as caught:  # 2.0 USD in April for pip
        clock.advance(days=1)
        ledger.reserve("pip", 1)
    assert caught.value.ledger == "imp:pip/month"
    assert caught.value.retry_after_s == seconds_to_next_month(clock.now())


def test_operator_overrides_replace_the_policy_limits(ledger: Ledger) -> None:
    assert ledger.limits("pip").daily == 500_000 and ledger.limits("pip").source == "policy"
    assert ledger.limits("big").daily == 900_000 and ledger.limits("big").monthly == 2_000_000
    ledger.set_limits("pip", daily_usd=0.25, monthly_usd=None)
    limits = ledger.limits("pip")
    assert (limits.daily, limits.monthly, limits.source) == (250_000, 2_000_000, "policy, daily override")
    ledger.set_limits("pip", daily_usd=None, monthly_usd=5)
    assert ledger.limits("pip").daily == 250_000 and ledger.limits("pip").source == "override"
    with pytest.raises(BudgetExhausted):
        ledger.reserve("pip", 250_001)
    ledger.set_limits(ALL_IMPS, daily_usd=0, monthly_usd=None)
    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("big", 0)  # nothing left means nothing, even for a free call
    assert caught.value.ledger == "all/day"
    assert ledger.clear_limits(ALL_IMPS)
    ledger.reserve("big", 1)


def _holder(**change: object) -> Holder:
    return dataclasses.replace(this_process(), **change)  # type: ignore[arg-type]


def _dead_pid() -> int:
    """A pid no process has now: a child that has exited and been reaped."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_dead_holders_reservation_is_settled_at_once_in_full(db: Database, clock: FixedClock) -> None:
    # Issue 19 #4: the host that made the call was killed (kill -9): nothing will settle it, so the next host
    # charges it at once (the model API may have billed it), not an hour later.
    crashed = Ledger(db, POLICY, clock, holder=_holder(pid=_dead_pid()))
    crashed.reserve("pip", 200_000, method="model.request", purpose="reply", model="gpt-x")
    host = Ledger(db, POLICY, clock)
    orphans = host.settle_orphans()
    assert [(o.imp, o.reserved_micros, o.purpose, o.model, o.why) for o in orphans] == [
        ("pip", 200_000, "reply", "gpt-x", "holder-dead")
    ]
    assert "stopped before it was settled" in orphans[0].reason
    assert host.settled_total("pip") == 200_000
    assert host.settle_orphans() == []  # settled once


def test_a_living_holders_reservation_is_never_settled_by_another_host(
    db: Database, clock: FixedClock
) -> None:
    # `impyard supervise` starting beside a running `impyard chat` must not charge the chat's call in flight.
    Ledger(db, POLICY, clock).reserve("pip", 200_000)
    clock.advance(hours=5)
    assert Ledger(db, POLICY, clock).settle_orphans() == []
    assert Ledger(db, POLICY, clock).settled_total("pip") == 0


def test_a_recycled_pid_or_a_reboot_does_not_pass_for_the_holder(db: Database, clock: FixedClock) -> None:
    me = this_process()
    if not me.start:
        pytest.skip("no /proc here: only the pid can be checked")
    Ledger(db, POLICY, clock, holder=_holder(start=str(int(me.start) + 1))).reserve(
        "pip", 1
    )  # same pid, later
    Ledger(db, POLICY, clock, holder=_holder(boot="00000000")).reserve("pip", 2)  # before a reboot
    assert sorted(o.reserved_micros for o in Ledger(db, POLICY, clock).settle_orphans()) == [1, 2]


def test_an_unknown_holders_reservation_is_charged_after_an_hour(db: Database, clock: FixedClock) -> None:
    # Another machine's holder (a shared database), or a row from before holders were recorded: its age decides.
    Ledger(db, POLICY, clock, holder=_holder(host="elsewhere")).reserve("pip", 200_000)
    db.write(lambda conn: conn.execute(sa.insert(tables.ledger).values(
        imp="old", day="2026-03-31", month="2026-03", state="reserved", reserved_micros=5, created_at=START.isoformat(),
    )))  # fmt: skip
    clock.advance(minutes=30)
    assert Ledger(db, POLICY, clock).settle_orphans() == []
    clock.advance(hours=1)
    orphans = Ledger(db, POLICY, clock).settle_orphans()
    assert sorted((o.imp, o.why) for o in orphans) == [("old", "too-old"), ("pip", "too-old")]
    assert "never settled by its host" in orphans[0].reason
    assert Ledger(db, POLICY, clock).settled_total("pip") == 200_000


@pytest.mark.parametrize(
    ("now", "day_s", "month_s"),
    [
        (datetime(2026, 1, 31, 23, 59, 30, tzinfo=UTC), 30, 30),
        (datetime(2026, 2, 1, 0, 0, tzinfo=UTC), 86_400, 28 * 86_400),
        (datetime(2026, 12, 31, 12, 0, tzinfo=UTC), 43_200, 43_200),
    ],
)
def test_retry_after_is_the_time_to_the_window_reset(now: datetime, day_s: int, month_s: int) -> None:
    assert (seconds_to_next_day(now), seconds_to_next_month(now)) == (day_s, month_s)


# --- concurrency: the hard stop is atomic --------------------------------------------------------


def test_100_concurrent_threads_never_overspend(tmp_path: Path, clock: FixedClock) -> None:
    db = open_database(tmp_path / "race.db")
    ledger = Ledger(db, POLICY, clock)  # pip: 0.50 USD per day
    estimate = 7_000  # 71 fit in 500_000, not 100
    barrier = threading.Barrier(100)
    outcomes: list[str] = []
    lock = threading.Lock()

    def one() -> None:
        barrier.wait()  # every thread (each with its own connection) reserves at once
        try:
            reservation = ledger.reserve("pip", estimate)
        except BudgetExhausted:
            result = "refused"
        else:
            ledger.settle(reservation, estimate)
            result = "ok"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=one) for _ in range(100)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(outcomes) == 100
    assert outcomes.count("ok") == 500_000 // estimate
    assert ledger.settled_total("pip") <= 500_000
    db.close()


async def test_100_concurrent_tasks_and_two_databases_never_overspend(
    tmp_path: Path, clock: FixedClock
) -> None:
    """Two Database objects on one file stand for two host processes; tasks reserve through worker threads."""
    path = tmp_path / "race.db"
    ledgers = [Ledger(open_database(path), POLICY, clock), Ledger(open_database(path), POLICY, clock)]
    settled: list[int] = []

    async def one(index: int) -> None:
        ledger = ledgers[index % 2]
        try:
            reservation = await ledger.db.run(ledger.reserve, "pip", 9_000)
        except BudgetExhausted:
            return
        await anyio.lowlevel.checkpoint()
        await ledger.db.run(ledger.settle, reservation, 9_000)
        settled.append(9_000)

    async with anyio.create_task_group() as tg:
        for index in range(100):
            tg.start_soon(one, index)
    assert sum(settled) == ledgers[0].settled_total("pip") <= 500_000
    assert len(settled) == 500_000 // 9_000
    for ledger in ledgers:
        ledger.db.close()


# --- the running totals: four rows per check, always the sums of the rows ---------------------------------------


def sums_of_rows(db: Database) -> dict[tuple[str, str], tuple[int, int]]:
    """What ledger_totals must hold, summed from the ledger's rows (the truth): (reserved, settled) per window."""
    ledger = tables.ledger
    with db.begin(read_only=True) as conn:
        rows = conn.execute(
            sa.select(ledger.c.imp, ledger.c.day, ledger.c.month, ledger.c.state, ledger.c.reserved_micros,
                      ledger.c.cost_micros)
        ).all()  # fmt: skip
    sums: dict[tuple[str, str], tuple[int, int]] = {}
    for imp, day, month, state, reserved, cost in rows:
        held, charged = (reserved, 0) if state == "reserved" else (0, cost or 0)
        for key in (
            (imp, f"day:{day}"),
            (imp, f"month:{month}"),
            (ALL_IMPS, f"day:{day}"),
            (ALL_IMPS, f"month:{month}"),
        ):
            was = sums.get(key, (0, 0))
            sums[key] = (was[0] + held, was[1] + charged)
    return sums


def nonzero(totals: dict[tuple[str, str], tuple[int, int]]) -> dict[tuple[str, str], tuple[int, int]]:
    return {key: amounts for key, amounts in totals.items() if amounts != (0, 0)}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_totals_are_the_sums_of_the_rows_after_any_sequence(
    db: Database, clock: FixedClock, seed: int
) -> None:
    rng = random.Random(seed)
    roomy = policy_from_text(
        "[budgets.per_imp]\ndaily_usd = 0.02\nmonthly_usd = 0.1\n[budgets.all]\ndaily_usd = 0.04\n"
    )
    host = Ledger(db, roomy, clock)
    crashed = Ledger(db, roomy, clock, holder=_holder(pid=_dead_pid()))
    elsewhere = Ledger(db, roomy, clock, holder=_holder(host="elsewhere"))
    open_: list[tuple[Ledger, int]] = []
    counts = {"granted": 0, "refused": 0, "settled": 0, "orphans": 0}
    for _ in range(80):
        move = rng.random()
        if move < 0.45:
            ledger = rng.choice([host, host, crashed, elsewhere])
            try:
                reservation = ledger.reserve(rng.choice(["pip", "big", "bob"]), rng.randrange(0, 15_000))
            except BudgetExhausted:
                counts["refused"] += 1
            else:
                counts["granted"] += 1
                open_.append((ledger, reservation.id))
        elif move < 0.8 and open_:
            ledger, reservation_id = open_.pop(rng.randrange(len(open_)))
            ledger.settle(reservation_id, rng.choice([0, rng.randrange(0, 12_000)]))  # at or under or over
            counts["settled"] += 1
        elif move < 0.9:
            counts["orphans"] += len(host.settle_orphans())
        else:
            clock.advance(hours=rng.choice([1, 7, 30]))  # across days and (from 31 March) a month
        assert nonzero(host.totals()) == nonzero(sums_of_rows(db))
    assert all(counts.values()), counts  # every kind of step happened, refusals too


def test_a_check_reads_the_totals_not_the_rows(ledger: Ledger, db: Database) -> None:
    """The hard stop follows ledger_totals: a total moved by hand (as a row would move it) refuses the next call."""
    ledger.reserve("pip", 100_000)
    with db.begin() as conn:
        conn.execute(
            sa.update(tables.ledger_totals)
            .where(
                tables.ledger_totals.c.scope == "pip",
                tables.ledger_totals.c.period == f"day:{START:%Y-%m-%d}",
            )
            .values(settled_micros=400_000)
        )
    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("pip", 1)
    assert caught.value.ledger == "imp:pip/day" and caught.value.spent_micros == 500_000


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_an_upgraded_home_gets_its_totals_from_its_rows(
    engine: str, tmp_path: Path, clock: FixedClock, request: pytest.FixtureRequest
) -> None:
    """Revision 0003's data step: a home with ledger rows from before it keeps its caps."""
    url = (
        f"sqlite:///{tmp_path / 'old.db'}" if engine == "sqlite" else request.getfixturevalue("postgres_url")
    )
    before = sa.create_engine(dburl.parse(url).url, poolclass=sa.NullPool)
    rows = [
        ("pip", "2026-03-31", "reserved", 300_000, None),
        ("pip", "2026-03-31", "settled", 200_000, 150_000),
        ("pip", "2026-03-30", "settled", 400_000, 400_000),
        ("bob", "2026-03-31", "settled", 10, 0),
    ]
    with before.begin() as conn:
        migrations.upgrade(conn, "0002")
        if engine == "sqlite":
            conn.exec_driver_sql(f"PRAGMA user_version = {LEGACY_VERSION + 1}")  # what 0002 left
        for imp, day, state, reserved, cost in rows:
            conn.execute(sa.insert(tables.ledger).values(
                imp=imp, day=day, month=day[:7], state=state, reserved_micros=reserved, cost_micros=cost,
                created_at=START.isoformat(),
            ))  # fmt: skip
    before.dispose()
    db = open_database(url=url)
    try:
        assert db.revision == migrations.head()
        ledger = Ledger(db, POLICY, clock)
        assert nonzero(ledger.totals()) == nonzero(sums_of_rows(db))
        assert ledger.totals()[(ALL_IMPS, "month:2026-03")] == (300_000, 550_000)
        with pytest.raises(BudgetExhausted) as caught:  # pip's day: 300_000 in flight + 150_000 settled
            ledger.reserve("pip", 50_001)
        assert caught.value.ledger == "imp:pip/day"
        ledger.reserve("pip", 50_000)
    finally:
        db.close()


# --- the race across processes: one imp's cap holds for hosts sharing one database (issue 21) ---------------

RACER = """
import json, sys, time
from datetime import datetime
from pathlib import Path
from impyard.clock import FixedClock
from impyard.storage.db import open_database
from impyard.gateway.ledger import BudgetExhausted, Ledger
from impyard.gateway.policy import policy_from_text

url, here, me, processes = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
calls, estimate, policy, window = int(sys.argv[5]), int(sys.argv[6]), sys.argv[7], sys.argv[8]
clock = FixedClock(datetime.fromisoformat(sys.argv[9]))
ledger = Ledger(open_database(url=url), policy_from_text(policy), clock)
rounds = []
for at in sys.argv[9:]:
    clock.set(datetime.fromisoformat(at))
    (here / f"{at}.{me}").touch()  # a barrier: every racer connected and at this round, then all go at once
    while len(list(here.glob(f"{at}.*"))) < processes:
        time.sleep(0.0005)
    granted, refused = [], 0
    for _ in range(calls):
        try:
            granted.append(ledger.reserve("pip", estimate, method="model.request").reserved_micros)
        except BudgetExhausted as exc:
            assert exc.ledger == window, exc.ledger
            refused += 1
    rounds.append({"at": at, "granted": granted, "refused": refused})
print(json.dumps(rounds), flush=True)
ledger.db.close()
"""
RACE_PROCESSES = 2
RACE_ROUNDS = 10  # windows raced for, one after the other: each a fresh day (or month) of the one imp
RACE_CALLS = 5  # per process and round: 2 x 10 x 5 = 100 racing reservations, 50 per process
RACE_ESTIMATE = 7_000
RACE_FIT = 7  # reservations that fit in the window's cap, of the 10 made for it
RACE_CAP_USD = RACE_FIT * RACE_ESTIMATE / 1_000_000 + 0.000_006  # 7 fit, an 8th would not
RACE_WINDOWS = {  # the window that binds (the other is roomy), and where each round's window starts
    "imp:pip/day": (f"[budgets.per_imp]\ndaily_usd = {RACE_CAP_USD}\nmonthly_usd = 100.0\n", "day"),
    "imp:pip/month": (f"[budgets.per_imp]\ndaily_usd = 100.0\nmonthly_usd = {RACE_CAP_USD}\n", "month"),
}


def _race_rounds(step: str) -> list[datetime]:
    first = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    if step == "day":
        return [first + timedelta(days=index) for index in range(RACE_ROUNDS)]
    return [first.replace(month=1 + index) for index in range(RACE_ROUNDS)]


@pytest.mark.parametrize("window", sorted(RACE_WINDOWS))
@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_racing_processes_never_overspend_an_imps_cap(
    engine: str, window: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two processes (two hosts on one database) reserve for one imp at once, 50 each, racing for ten windows
    in turn: in every window the sum granted stays within the cap, and exactly as many are granted as fit."""
    url = (
        f"sqlite:///{tmp_path / 'race.db'}" if engine == "sqlite" else request.getfixturevalue("postgres_url")
    )
    text, step = RACE_WINDOWS[window]
    db = open_database(url=url)
    ledger = Ledger(db, policy_from_text(text), FixedClock(START))
    limits = ledger.limits("pip")
    cap = limits.daily if step == "day" else limits.monthly
    assert cap is not None and cap // RACE_ESTIMATE == RACE_FIT < RACE_PROCESSES * RACE_CALLS
    assert RACE_FIT > RACE_CALLS  # the race is real: no process alone fills a window
    rounds = [at.isoformat() for at in _race_rounds(step)]
    racers = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RACER,
                url,
                str(tmp_path),
                str(index),
                str(RACE_PROCESSES),
                str(RACE_CALLS),
                str(RACE_ESTIMATE),
                text,
                window,
                *rounds,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for index in range(RACE_PROCESSES)
    ]
    try:
        outputs = [racer.communicate(timeout=180) for racer in racers]
    finally:
        for racer in racers:
            racer.kill()
    for racer, (_, err) in zip(racers, outputs, strict=True):
        assert racer.returncode == 0, err[-2000:]
    per_process = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    for index, at in enumerate(rounds):
        results = [process[index] for process in per_process]
        assert {result["at"] for result in results} == {at}
        granted = [amount for result in results for amount in result["granted"]]
        assert sum(granted) <= cap, at  # 0 overspend
        assert len(granted) == RACE_FIT, at  # exactly as many as fit were granted, the rest refused
        assert sum(result["refused"] for result in results) == RACE_PROCESSES * RACE_CALLS - RACE_FIT, at
    assert all(any(r["granted"] for r in process) for process in per_process)  # every process got some
    assert nonzero(ledger.totals()) == nonzero(sums_of_rows(db))
    with db.begin(read_only=True) as conn:  # the rows agree: no window holds more than its cap
        column = tables.ledger.c.day if step == "day" else tables.ledger.c.month
        spent = conn.execute(
            sa.select(column, sa.func.sum(tables.ledger.c.reserved_micros), sa.func.count()).group_by(column)
        ).all()
    assert sorted((key, int(amount), count) for key, amount, count in spent) == [
        (at[:10] if step == "day" else at[:7], RACE_FIT * RACE_ESTIMATE, RACE_FIT) for at in rounds
    ]
    db.close()


# --- prices ------------------------------------------------------------------------------------

TEXT = Price(input=2.0, cached_input=0.5, output=8.0)
EMBED = Price(input=0.02)
IMAGE = Price(input=5.0, output=40.0, image=0.25)


@pytest.mark.parametrize(
    ("path", "response", "price", "micros"),
    [
        pytest.param(
            "/chat/completions",
            {
                "usage": {
                    "prompt_tokens": 1000,
                    "completion_tokens": 500,
                    "prompt_tokens_details": {"cached_tokens": 400},
                }
            },
            TEXT,
            600 * 2 + 400 * 0.5 + 500 * 8,
            id="chat-with-cache",
        ),
        pytest.param(
            "/responses",
            {
                "usage": {
                    "input_tokens": 1_000_000,
                    "output_tokens": 1_000_000,
                    "input_tokens_details": {"cached_tokens": 0},
                }
            },
            TEXT,
            10_000_000,
            id="responses-a-million-each-is-10-usd",
        ),
        pytest.param(
            "/embeddings",
            {"usage": {"prompt_tokens": 5000, "total_tokens": 5000}},
            EMBED,
            100,
            id="embeddings",
        ),
        pytest.param("/images/generations", {"data": [{}, {}]}, IMAGE, 500_000, id="images-per-image"),
        pytest.param(
            "/images/generations",
            {"data": [{}], "usage": {"input_tokens": 100, "output_tokens": 1000}},
            IMAGE,
            100 * 5 + 1000 * 40,
            id="images-by-token-usage",
        ),
        pytest.param("/chat/completions", {"choices": []}, TEXT, None, id="no-usage-reported"),
        pytest.param("/chat/completions", "not json", TEXT, None, id="not-an-object"),
    ],
)
def test_measured_cost_from_usage_matches_the_price_table(
    path: str, response: object, price: Price, micros: float | None
) -> None:
    assert measured_micros(path, response, price) == (None if micros is None else round(micros))


def test_cached_tokens_never_exceed_the_input() -> None:
    assert token_cost_micros(TEXT, Usage(input_tokens=10, cached_tokens=50)) == 5
    assert usage_from_response("/chat/completions", {"usage": {"prompt_tokens": "x"}}) == Usage()


W = PROMPT_OVERHEAD_TOKENS  # the provider's own headers around the body
VISION = Price(input=2.0, cached_input=0.5, output=8.0, image_input_tokens=1000)
TIERED = Price(input=2.0, output=8.0, service_tiers={"priority": 2.0, "flex": 0.5})
EDITS = Price(input=5.0, output=40.0, image=0.25, image_input_tokens=100)


@pytest.mark.parametrize(
    ("path", "body", "body_bytes", "price", "extra", "micros"),
    [
        pytest.param("/chat/completions", {"model": "m", "max_completion_tokens": 1000}, 300, TEXT, {},
                     (300 + W) * 2 + 1000 * 8, id="every-byte-a-token-plus-the-cap"),
        pytest.param("/chat/completions", {"model": "m", "max_tokens": 10, "n": 3}, 30, TEXT, {},
                     (30 + W) * 2 + 3 * 10 * 8, id="n-choices-each-write-the-cap"),
        pytest.param("/chat/completions", {"model": "m"}, 3, TEXT, {}, (3 + W) * 2 + 4096 * 8, id="no-cap-the-default"),
        pytest.param("/responses", {"model": "m", "max_output_tokens": 50}, 3, TEXT, {}, (3 + W) * 2 + 50 * 8, id="responses"),
        pytest.param("/responses", {"model": "m", "max_tokens": 50}, 3, TEXT, {}, (3 + W) * 2 + 4096 * 8,
                     id="a-chat-cap-does-not-bound-responses"),
        pytest.param("/embeddings", {"model": "e"}, 3000, EMBED, {}, (3000 + W) * 0.02, id="embeddings"),
        pytest.param("/images/generations", {"model": "i", "n": 2}, 30, IMAGE, {}, 500_000 + (30 + W) * 5, id="images-full-price"),
        pytest.param("/chat/completions", {"model": "m", "max_tokens": 10}, 5600, VISION,
                     {"input_images": 2, "inline_image_bytes": 5000}, (600 + W + 2 * 1000) * 2 + 10 * 8,
                     id="input-images-at-their-worst-case-not-their-bytes"),
        pytest.param("/images/edits", {"model": "i"}, 1030, EDITS, {"input_images": 2, "inline_image_bytes": 1000},
                     250_000 + (30 + W + 2 * 100) * 5, id="edit-images"),
        pytest.param("/responses", {"model": "m", "max_output_tokens": 50}, 3, TEXT, {"stored_context_tokens": 10_000},
                     (3 + W + 10_000) * 2 + 50 * 8, id="stored-context-at-the-policys-worst-case"),
        pytest.param("/chat/completions", {"model": "m", "max_tokens": 10, "service_tier": "priority"}, 30, TIERED, {},
                     2 * ((30 + W) * 2 + 10 * 8), id="priority-tier-multiplied"),
        pytest.param("/chat/completions", {"model": "m", "max_tokens": 10, "service_tier": "default"}, 30, TIERED, {},
                     (30 + W) * 2 + 10 * 8, id="default-tier"),
    ],
)  # fmt: skip
def test_the_estimate_is_the_worst_case(
    path: str, body: dict, body_bytes: int, price: Price, extra: dict, micros: float
) -> None:
    estimate = estimate_micros(path, body, body_bytes, price, default_output_tokens=4096, **extra)
    assert estimate == math.ceil(micros - 1e-9)


@pytest.mark.parametrize(
    ("path", "body", "forwarded"),
    [
        pytest.param("/chat/completions", {"model": "m"}, {"model": "m", "max_completion_tokens": 500}, id="chat-gets-one"),
        pytest.param("/chat/completions", {"model": "m", "max_tokens": 9}, {"model": "m", "max_tokens": 9}, id="chat-keeps-its-own"),
        pytest.param("/responses", {"model": "m"}, {"model": "m", "max_output_tokens": 500}, id="responses-gets-one"),
        pytest.param("/responses", {"model": "m", "max_output_tokens": 7}, {"model": "m", "max_output_tokens": 7}, id="responses-keeps-its-own"),
        pytest.param("/embeddings", {"model": "e"}, {"model": "e"}, id="embeddings-write-nothing"),
        pytest.param("/images/generations", {"model": "i"}, {"model": "i"}, id="images-priced-per-image"),
    ],
)  # fmt: skip
def test_a_text_call_without_an_output_cap_is_sent_one(path: str, body: dict, forwarded: dict) -> None:
    assert bound_output(path, body, 500) == forwarded


@pytest.mark.parametrize(
    ("path", "body", "price", "extra", "missing"),
    [
        ("/images/generations", {}, Price(input=1.0, output=1.0), {}, "per-image price"),
        ("/chat/completions", {}, Price(image=1.0), {}, "input price"),
        ("/chat/completions", {}, Price(input=1.0), {}, "output price"),
        ("/chat/completions", {}, TEXT, {"input_images": 1}, "add image_input_tokens"),
        (
            "/chat/completions",
            {"service_tier": "priority"},
            TEXT,
            {},
            "service_tiers = { priority = MULTIPLIER }",
        ),
        ("/responses", {"service_tier": "scale"}, TIERED, {}, "'scale' is not priced"),
    ],
)
def test_an_incomplete_price_refuses_rather_than_assumes_zero(
    path: str, body: dict, price: Price, extra: dict, missing: str
) -> None:
    with pytest.raises(PriceMissing, match=re.escape(missing)):
        estimate_micros(path, {"model": "m", **body}, 10, price, default_output_tokens=10, **extra)


def test_summary_lists_every_imp_with_spending_or_limits(ledger: Ledger, clock: FixedClock) -> None:
    ledger.settle(ledger.reserve("pip", 10), 7)
    ledger.set_limits("quiet", daily_usd=1, monthly_usd=None)
    rows = {row.scope: row for row in ledger.summary()}
    assert set(rows) == {ALL_IMPS, "pip", "quiet", "big"}
    assert rows[ALL_IMPS].daily_spent == 7 and rows["quiet"].daily_limit == 1_000_000
    clock.advance(timedelta(days=1))  # a new month: pip has spent nothing in it
    rows = {row.scope: row for row in ledger.summary()}
    assert "pip" not in rows and rows[ALL_IMPS].monthly_spent == 0
