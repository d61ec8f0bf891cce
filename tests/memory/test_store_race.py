"""Two processes (two hosts on one database) writing one memory scope at once (issue 21): every write of a scope
locks its generation row first, so on PostgreSQL the writers queue at READ COMMITTED instead of failing to
serialize. Each worker runs every write once (``attempts=1``): a write that failed to serialize or deadlocked
would fail the test, not run again."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from box.protocol import memory as mem
from impyard.clock import FixedClock
from impyard.memory.cache import Generation, VectorCache
from impyard.memory.errors import MemoryForgotten
from impyard.memory.store import MemoryStore
from impyard.storage.db import Database
from tests.memory.conftest import GUILD, IMP, T0, axis, moment, one, rows
from tests.racing import RACE_ROUNDS, race, reopen, two_racers

CACHE_BYTES = 8 * 1024 * 1024
CHANNEL = "g1"


def _store(where: dict[str, Any], clock: FixedClock) -> MemoryStore:
    """The worker's store on the shared database, each write run once."""
    db = reopen(where)
    db.write = functools.partial(Database.write, db, attempts=1)  # type: ignore[method-assign]
    return MemoryStore(db, clock.now, VectorCache(CACHE_BYTES))


def at_round(number: int) -> Any:
    return T0 + timedelta(minutes=number)


# --- many writes of one scope -------------------------------------------------------------------------------


def form_and_keep(where: dict[str, Any], rounds_in: Any, results: Any, barrier: Any) -> None:
    """A worker: in each round, form the round's thought (the other process forms the same one) and keep a moment
    of its own that re-feels the record both share."""
    clock = FixedClock(T0)
    store = _store(where, clock)
    guild = store.scoped(IMP, GUILD, CHANNEL)
    try:
        while (item := rounds_in.get()) is not None:
            number, shared = item
            clock.set(at_round(number))
            thought = mem.ConstructParams(
                construct_kind="thought", statement=f"round {number}", intensity=0.5, vector=axis(number),
                slot=True,
            )  # fmt: skip
            barrier.wait()  # both processes write together
            try:
                record_id, created, _, _ = guild.construct(thought)
                kept = moment(f"moment {number} of {os.getpid()}", vector=axis(63), restore=[
                    mem.Restore(record_id=shared, toward=0.9)
                ])  # fmt: skip
                guild.encode(kept)
                results.put((os.getpid(), record_id, created, None))
            except Exception as exc:  # noqa: BLE001 - the test says what went wrong
                results.put((os.getpid(), None, None, f"{type(exc).__name__}: {exc}"))
    finally:
        store.db.close()


@pytest.fixture
def store(any_engine_db: Database, clock: FixedClock) -> MemoryStore:
    return MemoryStore(any_engine_db, clock.now, VectorCache(CACHE_BYTES))


@pytest.fixture
def formers(any_engine_db: Database) -> Iterator[tuple[list[Any], Any]]:
    with two_racers(form_and_keep, any_engine_db) as racing:
        yield racing


def test_two_processes_writing_one_scope_keep_every_write_and_count_each_once(
    store: MemoryStore, formers: tuple[list[Any], Any]
) -> None:
    inboxes, results = formers
    shared = store.remember(IMP, "guild:G1", "the harbour flooded", 0.4, 0.5, vector=axis(62))
    pids: set[int] = set()
    for number in range(RACE_ROUNDS):
        answers = race(inboxes, results, (number, shared))
        assert [error for *_, error in answers] == [None, None], answers
        assert sorted(created for _, _, created, _ in answers) == [False, True], (
            answers
        )  # one formed, one recurred
        assert len({record_id for _, record_id, _, _ in answers}) == 1, answers  # the same thought
        pids.update(pid for pid, *_ in answers)
    assert len(pids) == 2
    # 1 given record, then per round: one thought and two moments, each moment with its one episode
    assert rows(store.db, "SELECT kind, origin, COUNT(*) AS n FROM memory_records GROUP BY kind, origin "
                "ORDER BY kind, origin") == [
        {"kind": "construct", "origin": "lived", "n": RACE_ROUNDS},
        {"kind": "lived", "origin": "given", "n": 1},
        {"kind": "lived", "origin": "lived", "n": 2 * RACE_ROUNDS},
    ]  # fmt: skip
    kept = rows(store.db, "SELECT conclusion FROM memory_records WHERE kind = 'lived' AND origin = 'lived'")
    assert sorted(str(r["conclusion"]) for r in kept) == sorted(
        f"moment {number} of {pid}" for number in range(RACE_ROUNDS) for pid in pids
    )
    assert one(store.db, "SELECT COUNT(*) FROM memory_episodes") == 2 * RACE_ROUNDS + 1
    # the given record, then two thoughts and two moments a round: each a write of the scope, counted once
    assert store.generation(IMP, "guild:G1") == Generation(version=1 + 4 * RACE_ROUNDS, deletes=0)
    assert rows(store.db, "SELECT last_felt FROM memory_records WHERE id = :id", id=shared) == [
        {"last_felt": "2026-01-15T12:49:00.000000+00:00"}  # re-felt in the last round (T0 + 49 minutes)
    ]
    store.clock = lambda: at_round(RACE_ROUNDS - 1)
    held = [entry.record.statement for _, entry in store.slot_view(IMP)]
    assert held == ["round 47", "round 48", "round 49"]  # three places: the last three rounds' thoughts


# --- a message deleted while a turn keeps it ----------------------------------------------------------------


def keep_or_forget(where: dict[str, Any], messages_in: Any, results: Any, barrier: Any) -> None:
    """A worker: for each message, one process keeps a moment of it while the other forgets it (deleted on its
    surface); which does which is the barrier's to say."""
    clock = FixedClock(T0)
    store = _store(where, clock)
    guild = store.scoped(IMP, GUILD, CHANNEL)
    try:
        while (message_id := messages_in.get()) is not None:
            keeps = barrier.wait() == 0
            try:
                if keeps:
                    guild.encode(moment(f"said in {message_id}", message_id=message_id, vector=axis(1)))
                    results.put(("kept", message_id))
                else:
                    results.put(("forgot", store.forget_message(CHANNEL, message_id)))
            except MemoryForgotten:
                results.put(("refused", message_id))
            except Exception as exc:  # noqa: BLE001 - the test says what went wrong
                results.put(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        store.db.close()


@pytest.fixture
def keepers(any_engine_db: Database) -> Iterator[tuple[list[Any], Any]]:
    with two_racers(keep_or_forget, any_engine_db) as racing:
        yield racing


def test_a_message_deleted_while_a_process_keeps_it_leaves_nothing_whichever_came_first(
    store: MemoryStore, keepers: tuple[list[Any], Any]
) -> None:
    inboxes, results = keepers
    outcomes = {"kept": 0, "refused": 0}
    for number in range(RACE_ROUNDS):
        message_id = f"m{number}"
        answers = dict(race(inboxes, results, message_id))
        assert set(answers) in ({"kept", "forgot"}, {"refused", "forgot"}), answers
        if "kept" in answers:  # kept first: its record, left with no episode, went with the message
            assert answers["forgot"] == {"records": 1, "episodes": 1}, answers
            outcomes["kept"] += 1
        else:  # forgotten first: the turn kept nothing of it
            assert answers["forgot"] == {"records": 0, "episodes": 0}, answers
            outcomes["refused"] += 1
        assert one(store.db, "SELECT COUNT(*) FROM memory_episodes WHERE message_id = :m", m=message_id) == 0
    assert one(store.db, "SELECT COUNT(*) FROM memory_records") == 0
    assert sum(outcomes.values()) == RACE_ROUNDS
    # a moment kept moved the scope on once, and its forgetting once more (a delete)
    assert store.generation(IMP, "guild:G1") == Generation(
        version=2 * outcomes["kept"], deletes=outcomes["kept"]
    )
