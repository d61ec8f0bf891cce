"""Issue 36, "one shard layout per database", in the store on both engines: the first serving host fixes how the
database's hosts split Discord (N of ``--shard I/N``, or none), inside the transaction of its first lease; a host of
another layout is refused with one line naming the lease, host and pid that hold the one in force and how to change
it, until no live lease holds it. (Through real ``impyard serve`` processes: tests/test_discord_shards.py.)"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import sqlalchemy as sa

from impyard.clock import FixedClock
from impyard.storage import shard_layout
from impyard.storage.db import Database
from impyard.storage.leases import LeaseStore
from impyard.storage.liveness import Holder
from impyard.storage.shard_layout import UNSHARDED, Layout, LayoutHeld
from impyard.storage.tables import leases
from impyard.storage.tables import shard_layout as shard_layout_table

ALPHA = Holder("alpha", "b00t", 100, "5")
BETA = Holder("beta", "f00d", 200, "7")
GAMMA = Holder("gamma", "cafe", 300, "9")
TTL = timedelta(seconds=30)
SERVE_UNSHARDED = {"command": "serve", "home": "/srv/u", "shard": None}


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock()


class Host:
    """One serving process on the database: its lease store, and ``start`` as ``hold_host`` takes its first lease."""

    def __init__(self, db: Database, me: Holder, clock: FixedClock, *, alive: bool | None = None) -> None:
        self.me = me
        self.store = LeaseStore(db, clock, me=me, alive=lambda holder: alive)

    def start(self, shard: str | None) -> None:
        """``impyard serve --shard <shard>`` (None: without --shard)."""
        wanted = Layout(int(shard.split("/")[1]) if shard else None)
        asked = f"--shard {shard}" if shard else "no --shard"
        store = self.store

        def guard(conn: sa.Connection, now: object) -> None:
            shard_layout.take(conn, wanted, asked, me=store.me, now=now, alive=store.alive)  # type: ignore[arg-type]

        if shard is None:
            detail = {**SERVE_UNSHARDED}
            store.acquire(f"host:{self.me.host}/{self.me.pid}", detail, TTL, guard=guard)
        else:
            store.acquire(f"shard:{shard}", {}, TTL, guard=guard)
            store.acquire(f"host:{self.me.host}/{self.me.pid}", {"command": "serve", "shard": shard}, TTL)


def in_force(db: Database, clock: FixedClock) -> shard_layout.LayoutInForce | None:
    return db.read(lambda conn: shard_layout.in_force(conn, GAMMA, clock.now(), lambda holder: None))


def lease_names(db: Database) -> list[str]:
    return db.read(lambda conn: sorted(conn.execute(sa.select(leases.c.name)).scalars()))


def test_the_first_sharded_host_fixes_n_and_another_n_is_refused_naming_the_holder(
    any_engine_db: Database, clock: FixedClock
) -> None:
    alpha, beta = Host(any_engine_db, ALPHA, clock), Host(any_engine_db, BETA, clock)
    assert in_force(any_engine_db, clock) is None
    alpha.start("0/2")
    beta.start("1/2")  # the same layout: welcome
    found = in_force(any_engine_db, clock)
    assert found is not None and found.layout == Layout(2) and found.fixed_by == ALPHA
    assert [(hold.lease, hold.holder) for hold in found.holds] == [("shard:0/2", ALPHA), ("shard:1/2", BETA)]
    gamma = Host(any_engine_db, GAMMA, clock)
    with pytest.raises(LayoutHeld) as refused:
        gamma.start("0/3")
    assert str(refused.value) == (
        "this database is served as 2 shards (shard:0/2 is held by alpha (pid 100)), not 3: start this host with "
        "--shard I/2, or to change the number of shards, stop every `impyard serve` of this database (`impyard "
        "hosts` lists them), then start each with --shard I/3"
    )
    with pytest.raises(LayoutHeld) as unsharded:
        gamma.start(None)
    assert str(unsharded.value) == (
        "this database is served as 2 shards (shard:0/2 is held by alpha (pid 100)): a `serve` without --shard "
        "would answer their messages a second time; start it with --shard I/2, or to serve without shards, stop "
        "every `impyard serve` of this database (`impyard hosts` lists them), then start each without --shard"
    )
    assert "\n" not in str(refused.value) + str(unsharded.value)
    # Refused inside the lease's transaction: nothing of the refused host was written.
    assert lease_names(any_engine_db) == ["host:alpha/100", "host:beta/200", "shard:0/2", "shard:1/2"]
    assert in_force(any_engine_db, clock).layout == Layout(2)  # type: ignore[union-attr]


def test_a_sharded_host_is_refused_beside_an_unsharded_serve_and_the_reverse(
    any_engine_db: Database, clock: FixedClock
) -> None:
    alpha, beta = Host(any_engine_db, ALPHA, clock), Host(any_engine_db, BETA, clock)
    alpha.start(None)
    beta.start(None)  # two unsharded hosts (each serving its own imps, say): one layout
    with pytest.raises(LayoutHeld) as refused:
        Host(any_engine_db, GAMMA, clock).start("0/2")
    assert str(refused.value) == (
        "this database is served without shards: an `impyard serve` without --shard runs on alpha (pid 100) and "
        "gets every server, so a host with --shard 0/2 would answer messages a second time; to shard it, stop "
        "every `impyard serve` of this database (`impyard hosts` lists them), then start each with --shard I/N"
    )
    assert in_force(any_engine_db, clock).layout == UNSHARDED  # type: ignore[union-attr]


def test_a_chat_host_record_or_an_expired_or_dead_holder_does_not_hold_the_layout(
    any_engine_db: Database, clock: FixedClock
) -> None:
    """The layout is free once no live lease holds it: a new N may be fixed, and the old N's leases are forgotten."""
    Host(any_engine_db, ALPHA, clock).start("0/2")
    Host(any_engine_db, BETA, clock).store.acquire("host:beta/200", {"command": "chat", "shard": None}, TTL)
    clock.advance(seconds=31)  # alpha stopped renewing (killed on another machine): expired
    Host(any_engine_db, BETA, clock).store.acquire("host:beta/200", {"command": "chat", "shard": None}, TTL)
    Host(any_engine_db, GAMMA, clock).start("2/3")
    found = in_force(any_engine_db, clock)
    assert found is not None and (found.layout, found.fixed_by) == (Layout(3), GAMMA)
    assert lease_names(any_engine_db) == ["host:alpha/100", "host:beta/200", "host:gamma/300", "shard:2/3"]
    # A holder this machine knows is dead frees it at once, without waiting for its expiry.
    with pytest.raises(LayoutHeld):
        Host(any_engine_db, ALPHA, clock, alive=True).start(None)
    Host(any_engine_db, ALPHA, clock, alive=False).start(None)
    assert in_force(any_engine_db, clock).layout == UNSHARDED  # type: ignore[union-attr]


def test_a_free_layout_shows_no_holds(any_engine_db: Database, clock: FixedClock) -> None:
    alpha = Host(any_engine_db, ALPHA, clock)
    alpha.start("0/1")
    (lease,) = [lease for lease in alpha.store.list() if lease.name == "shard:0/1"]
    held = in_force(any_engine_db, clock)
    assert held is not None and len(held.holds) == 1
    clock.advance(seconds=31)
    free = in_force(any_engine_db, clock)
    assert free is not None and free.layout == Layout(1) and free.holds == ()
    assert lease.name == "shard:0/1"


@pytest.mark.parametrize(
    ("name", "shards"),
    [("shard:0/2", 2), ("shard:12/40", 40), ("shard:0/0", None), ("shard:x", None), ("host:a/1", None),
     ("channel:terminal:ann", None), ("shard:1/two", None)],
)  # fmt: skip
def test_the_layout_of_a_lease_is_the_n_of_its_name(name: str, shards: int | None) -> None:
    assert shard_layout.shards_of(name) == shards


def test_two_hosts_of_different_layouts_starting_at_once_are_never_both_let_in(
    any_engine_db: Database, clock: FixedClock
) -> None:
    """The layout is taken in the transaction of the first lease: of ``--shard 0/2`` and ``--shard 0/3`` starting at
    the same moment, exactly one starts (SQLite's write lock; PostgreSQL's SERIALIZABLE runs the loser again)."""
    rounds, barrier = 20, threading.Barrier(2)
    for _ in range(rounds):
        any_engine_db.write(
            lambda conn: (conn.execute(sa.delete(leases)), conn.execute(sa.delete(shard_layout_table)))
        )
        outcomes: dict[str, str] = {}

        def start(me: Holder, shard: str, outcomes: dict[str, str] = outcomes) -> None:
            barrier.wait()
            try:
                Host(any_engine_db, me, clock).start(shard)
                outcomes[shard] = "started"
            except LayoutHeld:
                outcomes[shard] = "refused"

        racers = [threading.Thread(target=start, args=args) for args in ((ALPHA, "0/2"), (BETA, "0/3"))]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join(timeout=60)
        assert sorted(outcomes.values()) == ["refused", "started"], outcomes
        found = in_force(any_engine_db, clock)
        winner = next(shard for shard, outcome in outcomes.items() if outcome == "started")
        assert found is not None and found.layout == Layout(int(winner.split("/")[1]))


def test_impyard_hosts_and_the_console_say_the_layout_in_force(impyard_home: object) -> None:
    """Issue 36: `impyard hosts` shows the layout (a line, and "layout" in --json); the console's Hosts page the same line."""
    import json

    from click.testing import CliRunner

    from impyard.cli import cli
    from impyard.clock import SystemClock
    from impyard.console.render import environment
    from impyard.storage.cluster import read_cluster
    from impyard.storage.db import open_database

    db = open_database()
    try:
        Host(db, ALPHA, FixedClock(SystemClock().now())).start("0/2")
        found = read_cluster(db, SystemClock().now(), alive=lambda holder: None)
    finally:
        db.close()
    assert found.layout is not None and found.layout["shards"] == 2 and found.layout["state"] == "held"
    line = found.layout_line
    assert line is not None and line.startswith("Shard layout: Discord is served as 2 shards (--shard I/2)")
    shown = CliRunner().invoke(cli, ["hosts", "--json"])
    assert json.loads(shown.output)["layout"]["shards"] == 2
    page = environment().get_template("_hosts_tables.html").render(cluster=found, ago=lambda when: "now")
    assert 'id="shard-layout"' in page and "served as 2 shards" in page
