"""Issue 21, one holder at a time: leases in the database on both engines — tokens through acquire, renew,
release and takeover; two real processes racing for one lease; a holder killed with SIGKILL taken over at once
on its own machine and only after expiry from another; the keeper that renews them and says when one is lost."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa

from impyard.clock import FixedClock
from impyard.storage import leases as leases_module
from impyard.storage import liveness
from impyard.storage.db import Database, DatabaseError, open_database
from impyard.storage.leases import (
    HostCard,
    Lease,
    LeaseHeld,
    LeaseLost,
    LeaseStore,
    hold_host,
    holding,
    host_lease_name,
)
from impyard.storage.liveness import Holder
from impyard.storage.tables import leases

ME = Holder("alpha", "b00t", 100, "555")
OTHER = Holder("beta", "f00d", 200, "777")
TTL = timedelta(seconds=30)
REPO = Path(__file__).resolve().parent.parent
ROUNDS = 50


def store_for(db: Database, me: Holder, clock: FixedClock, alive: bool | None = None) -> LeaseStore:
    """A store for the process ``me``, on a fixed clock; ``alive``: what this machine says of other holders."""
    return LeaseStore(db, clock, me=me, alive=lambda holder: alive)


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock()


def tokens(db: Database) -> dict[str, int]:
    with db.begin(read_only=True) as conn:
        return {name: int(token) for name, token in conn.execute(sa.select(leases.c.name, leases.c.token))}


# --- tokens --------------------------------------------------------------------------------------------------


def test_a_free_lease_is_taken_with_token_one_and_a_second_claimant_is_refused_naming_the_holder(
    any_engine_db: Database, clock: FixedClock
) -> None:
    mine, theirs = store_for(any_engine_db, ME, clock, True), store_for(any_engine_db, OTHER, clock, True)
    lease = mine.acquire("shard:1/2", {"home": "/srv/a"}, TTL)
    assert (lease.token, lease.expires_at) == (1, clock.now() + TTL)
    with pytest.raises(LeaseHeld) as refused:
        theirs.acquire("shard:1/2", {}, TTL)
    assert str(refused.value) == (
        "shard:1/2 is held by alpha (pid 100); it is free once that process stops, or in 30 s if it stops renewing"
    )
    assert refused.value.holder == ME
    assert mine.acquire("shard:1/2", {}, TTL).token == 1  # this process again: the same token
    assert mine.verify("shard:1/2", 1) is None
    assert tokens(any_engine_db) == {"shard:1/2": 1}


def test_renewing_pushes_the_expiry_and_replaces_the_detail(
    any_engine_db: Database, clock: FixedClock
) -> None:
    mine = store_for(any_engine_db, ME, clock)
    lease = mine.acquire("host:alpha/100", {"warm_boxes": 0}, TTL)
    clock.advance(seconds=10)
    assert mine.renew(lease, {"warm_boxes": 3}, TTL) == clock.now() + TTL == lease.expires_at
    (row,) = mine.list()
    assert (row.token, row.detail, row.expires_at, row.holder) == (1, {"warm_boxes": 3}, lease.expires_at, ME)
    assert row.acquired_at == clock.now() - timedelta(seconds=10)
    assert not row.expired(clock.now())


def test_an_expired_lease_is_taken_over_with_the_next_token_and_its_old_holder_loses_it(
    any_engine_db: Database, clock: FixedClock
) -> None:
    mine, theirs = store_for(any_engine_db, ME, clock, True), store_for(any_engine_db, OTHER, clock, True)
    old = mine.acquire("shard:1/2", {}, TTL)
    clock.advance(TTL)  # expiring now counts as expired
    new = theirs.acquire("shard:1/2", {}, TTL)
    assert new.token == 2
    with pytest.raises(LeaseLost) as lost:
        mine.renew(old)
    assert (
        str(lost.value)
        == "lost lease shard:1/2: the lease passed to beta pid 200 (token 2, this host held 1)"
    )
    assert not old.valid()  # a lost lease is not acted under, whatever its local deadline said
    assert mine.verify("shard:1/2", 1) == "the lease passed to beta pid 200 (token 2, this host held 1)"
    assert theirs.verify("shard:1/2", 2) is None
    assert not mine.release(old)  # no longer its to give
    assert theirs.verify("shard:1/2", 2) is None


def test_an_expired_lease_nobody_took_is_renewed_by_its_holder(
    any_engine_db: Database, clock: FixedClock
) -> None:
    mine = store_for(any_engine_db, ME, clock)
    lease = mine.acquire("shard:0/2", {}, TTL)
    clock.advance(seconds=45)
    assert mine.verify("shard:0/2", 1) == "the lease expired before it was renewed"
    assert mine.renew(lease) == clock.now() + TTL  # no token was given to anyone meanwhile
    assert mine.verify("shard:0/2", 1) is None


def test_a_released_lease_keeps_its_row_and_the_next_holder_gets_the_next_token(
    any_engine_db: Database, clock: FixedClock
) -> None:
    mine, theirs = store_for(any_engine_db, ME, clock, True), store_for(any_engine_db, OTHER, clock, True)
    lease = mine.acquire("channel:terminal:ann", {}, TTL)
    assert mine.release(lease)
    assert mine.verify("channel:terminal:ann", 1) == "the lease expired before it was renewed"
    assert theirs.acquire("channel:terminal:ann", {}, TTL).token == 2  # at once: released, not held
    assert tokens(any_engine_db) == {"channel:terminal:ann": 2}
    with pytest.raises(LeaseLost, match="passed to beta pid 200"):
        mine.renew(lease)


def test_a_dead_holder_on_this_machine_is_taken_over_at_once(
    any_engine_db: Database, clock: FixedClock
) -> None:
    store_for(any_engine_db, OTHER, clock).acquire("shard:1/2", {}, TTL)
    assert store_for(any_engine_db, ME, clock, alive=False).acquire("shard:1/2", {}, TTL).token == 2
    store_for(any_engine_db, OTHER, clock).acquire("shard:0/2", {}, TTL)
    with pytest.raises(LeaseHeld):  # alive, or on another machine (None): only its expiry frees it
        store_for(any_engine_db, ME, clock, alive=None).acquire("shard:0/2", {}, TTL)


def test_a_holder_on_another_machine_is_taken_over_only_after_expiry(
    any_engine_db: Database, clock: FixedClock
) -> None:
    """The real liveness check: a holder whose host is another machine's name cannot be seen dead from here."""
    elsewhere = Holder("another-machine", "0ddba11", os.getpid() + 1, "1")
    store_for(any_engine_db, elsewhere, clock).acquire("shard:1/2", {}, TTL)
    here = LeaseStore(any_engine_db, clock)  # this process, liveness.alive
    clock.advance(seconds=29)
    with pytest.raises(
        LeaseHeld, match=r"held by another-machine \(pid \d+\); .* or in 1 s if it stops renewing"
    ):
        here.acquire("shard:1/2", {}, TTL)
    clock.advance(seconds=1)
    assert here.acquire("shard:1/2", {}, TTL).token == 2


def test_a_garbled_holder_is_held_until_its_expiry(any_engine_db: Database, clock: FixedClock) -> None:
    with any_engine_db.begin() as conn:
        expires = (clock.now() + TTL).isoformat()
        conn.execute(
            sa.insert(leases).values(
                name="shard:0/1",
                holder="nonsense",
                token=7,
                acquired_at="x",
                renewed_at="x",
                expires_at=expires,
            )
        )
    mine = store_for(any_engine_db, ME, clock, alive=False)
    with pytest.raises(LeaseHeld, match="held by an unknown holder"):
        mine.acquire("shard:0/1", {}, TTL)
    clock.advance(TTL)
    assert mine.acquire("shard:0/1", {}, TTL).token == 8


def test_host_records_are_forgotten_a_day_after_they_expired(
    any_engine_db: Database, clock: FixedClock
) -> None:
    mine = store_for(any_engine_db, ME, clock)
    mine.acquire("host:alpha/100", {}, TTL)
    mine.acquire("shard:0/2", {}, TTL)
    clock.advance(hours=24)
    assert mine.forget_stale() == 0  # expired 23h59m30s ago
    clock.advance(minutes=1)
    assert mine.forget_stale() == 1
    assert [row.name for row in mine.list()] == ["shard:0/2"]  # a shard's token is never forgotten


# --- the keeper ----------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_keeper_renews_and_says_once_when_another_host_took_the_lease(
    any_engine_db: Database,
) -> None:
    store = LeaseStore(any_engine_db)
    lost: list[str] = []
    async with holding(
        store,
        ["shard:1/2", "host:me/1"],
        details={"host:me/1": lambda: {"warm_boxes": 2}},
        renew_every=timedelta(seconds=0.05),
    ) as keeper:
        keeper.on_lost = lost.append
        await anyio.sleep(0.3)
        assert keeper.check() is None and lost == []
        assert {row.name: row.detail for row in store.list()}["host:me/1"] == {"warm_boxes": 2}
        with any_engine_db.begin() as conn:  # another host takes the shard over
            conn.execute(
                sa.update(leases).where(leases.c.name == "shard:1/2").values(holder=str(OTHER), token=2)
            )
        with anyio.fail_after(5):
            while not lost:
                await anyio.sleep(0.02)
        await anyio.sleep(0.2)
    assert lost == ["lost lease shard:1/2: the lease passed to beta pid 200 (token 2, this host held 1)"]
    assert keeper.check() == lost[0]
    assert isinstance(keeper.lost_error, LeaseLost)
    names = {row.name: row for row in store.list()}
    assert "host:me/1" not in names  # a host's record goes with it
    assert names["shard:1/2"].holder == OTHER  # the lost lease is not released from under its new holder


@pytest.mark.anyio
async def test_a_host_that_cannot_renew_stops_acting_at_its_local_deadline(
    any_engine_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LeaseStore(any_engine_db)
    lost: list[str] = []

    def unreachable(*args: object, **kwargs: object) -> None:
        raise DatabaseError("cannot connect to database")

    async with holding(
        store, ["shard:0/2"], ttl=timedelta(seconds=0.6), renew_every=timedelta(seconds=0.1)
    ) as keeper:
        keeper.on_lost = lost.append
        monkeypatch.setattr(store, "renew", unreachable)
        await anyio.sleep(0.25)
        assert keeper.check() is None and lost == []  # a hiccup: the lease has not expired yet
        with anyio.fail_after(5):
            while not lost:
                await anyio.sleep(0.02)
        assert keeper.check() == lost[0]
    assert lost == [
        "lost lease shard:0/2: it could not be renewed before it expired (the database could not be reached)"
    ]


@pytest.mark.anyio
async def test_holding_refuses_a_held_lease_and_gives_back_what_it_took(any_engine_db: Database) -> None:
    other = LeaseStore(any_engine_db, me=OTHER, alive=lambda holder: True)
    other.acquire("channel:terminal:ann")
    store = LeaseStore(any_engine_db)
    with pytest.raises(LeaseHeld, match=r"channel:terminal:ann is held by beta \(pid 200\)"):
        async with holding(store, ["host:me/1", "channel:terminal:ann"]):
            pytest.fail("a held lease was granted")
    assert [row.name for row in store.list()] == ["channel:terminal:ann"]


@pytest.mark.anyio
async def test_hold_host_records_this_process_and_forgets_it_at_the_end(tmp_path: Path) -> None:
    card = HostCard("serve", "/srv/home-a", "1/2", warm_boxes=lambda: 4)
    async with hold_host(card, ["shard:1/2"]) as keeper:
        assert keeper.check() is None
        db = open_database()
        try:
            rows = {row.name: row for row in LeaseStore(db).list()}
        finally:
            db.close()
    me = liveness.this_process()
    assert set(rows) == {"shard:1/2", host_lease_name(me)}
    detail = rows[host_lease_name(me)].detail
    assert detail | {"started_at": ""} == {
        "home": "/srv/home-a", "command": "serve", "shard": "1/2", "warm_boxes": 4, "spare_boxes": 0, "started_at": "",
    }  # fmt: skip
    assert rows["shard:1/2"].holder == me


# --- real processes ------------------------------------------------------------------------------------------

RACER = textwrap.dedent(
    """
    import sys
    from datetime import timedelta
    from impyard.storage.db import open_database
    from impyard.storage.leases import LeaseHeld, LeaseStore

    store = LeaseStore(open_database(url=sys.argv[1]))
    print("ready", flush=True)
    for line in sys.stdin:
        name = line.strip()
        try:
            print("won", name, store.acquire(name, {}, timedelta(seconds=60)).token, flush=True)
        except LeaseHeld as exc:
            print("lost", name, exc, flush=True)
    """
)

HOLDER = textwrap.dedent(
    """
    import sys, time
    from datetime import timedelta
    from impyard.storage.db import open_database
    from impyard.storage.leases import LeaseStore

    lease = LeaseStore(open_database(url=sys.argv[1])).acquire(sys.argv[2], {}, timedelta(seconds=60))
    print("held", lease.token, flush=True)
    time.sleep(600)
    """
)


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """One database two processes open: a SQLite file, or a throwaway PostgreSQL database."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'shared.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    open_database(url=url).close()  # migrated once, before the processes start
    yield url


def python(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args], cwd=REPO, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def line_of(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        assert process.stderr is not None
        pytest.fail(f"the process ended: {process.stderr.read()[-2000:]}")
    return line.strip()


def test_two_processes_racing_for_a_lease_give_it_to_exactly_one(database_url: str) -> None:
    racers = [python(RACER, database_url) for _ in range(2)]
    try:
        assert [line_of(racer) for racer in racers] == ["ready", "ready"]
        wins = {racer.pid: 0 for racer in racers}
        for round_ in range(ROUNDS):
            name = f"shard:{round_}/{ROUNDS}"
            for racer in racers:  # both at once: each reads its line as soon as it is written
                assert racer.stdin is not None
                racer.stdin.write(name + "\n")
                racer.stdin.flush()
            answers = {racer.pid: line_of(racer) for racer in racers}
            won = [pid for pid, answer in answers.items() if answer == f"won {name} 1"]
            assert len(won) == 1, answers
            (loser,) = set(answers) - set(won)
            assert answers[loser].startswith(
                f"lost {name} {name} is held by {socket.gethostname()} (pid {won[0]})"
            )
            wins[won[0]] += 1
        assert sum(wins.values()) == ROUNDS
    finally:
        for racer in racers:
            racer.kill()
            racer.communicate()


def test_a_holder_killed_with_sigkill_is_taken_over_at_once_on_its_machine(database_url: str) -> None:
    holder = python(HOLDER, database_url, "shard:1/2")
    try:
        assert line_of(holder) == "held 1"
        store = LeaseStore(open_database(url=database_url))
        with pytest.raises(LeaseHeld, match=rf"held by {socket.gethostname()} \(pid {holder.pid}\)"):
            store.acquire("shard:1/2")
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)  # reaped: a zombie's pid would still answer
        started = time.monotonic()
        lease = store.acquire("shard:1/2")  # at once: its lease still had a minute to run
        assert lease.token == 2 and time.monotonic() - started < 30
        assert store.verify("shard:1/2", 1) is not None and store.verify("shard:1/2", 2) is None
        store.db.close()
    finally:
        holder.kill()
        holder.communicate()


@pytest.mark.anyio
async def test_the_keeper_writes_a_holders_detail_as_soon_as_it_changed_and_only_then(
    any_engine_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a host says of itself (its warm boxes) reaches the database within a look, not at the next renewal
    (an hour away here), and a look that finds nothing new writes nothing."""
    store = LeaseStore(any_engine_db)
    writes: list[object] = []
    renew = store.renew

    def counted(lease: Lease, detail: Mapping[str, Any] | None = None, ttl: timedelta = TTL) -> datetime:
        writes.append(detail)
        return renew(lease, detail, ttl)

    monkeypatch.setattr(store, "renew", counted)
    boxes, looks = [0], [0]

    def describe() -> dict[str, int]:
        looks[0] += 1
        return {"warm_boxes": boxes[0]}

    async def after_looks(more: int) -> None:
        until = looks[0] + more
        with anyio.fail_after(10):
            while looks[0] < until:
                await anyio.sleep(0.01)

    def recorded() -> object:
        return {row.name: row.detail for row in store.list()}["host:me/1"]

    monkeypatch.setattr(leases_module, "DETAIL_EVERY", timedelta(seconds=0.01))  # a look every 10 ms
    async with holding(
        store, ["host:me/1"], details={"host:me/1": describe}, renew_every=timedelta(hours=1),
        ttl=timedelta(hours=2),
    ):  # fmt: skip
        await after_looks(20)
        assert writes == [] and recorded() == {"warm_boxes": 0}  # written once, at acquire
        boxes[0] = 2
        with anyio.fail_after(10):
            while recorded() != {"warm_boxes": 2}:
                await anyio.sleep(0.01)
        await after_looks(20)
        assert writes == [{"warm_boxes": 2}]  # one write for one change
