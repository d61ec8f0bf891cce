"""Issue 34 (the console's Memory page, ``impyard memory forget --record``): forgetting one record, finding a record by
its id, counting what forgetting a person would take before it is done (the same matching, changing nothing), and
the imp's day as the page reads it; on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest

from impyard.clock import FixedClock
from impyard.memory import wakefulness
from impyard.memory.cache import VectorCache
from impyard.memory.day import DAY_WINDOW, Day, day
from impyard.memory.forgetting import Forgotten
from impyard.memory.scoped import ScopedMemory
from impyard.memory.store import MemoryStore
from impyard.memory.wakefulness import Wakefulness, reflect_request, sleep_request
from impyard.storage.db import Database
from impyard.tasks import TaskStore
from tests.memory.conftest import IMP, axis, moment
from tests.memory.test_store import dm as dm  # noqa: F401 - the fixtures
from tests.memory.test_store import guild as guild  # noqa: F401


@pytest.fixture
def store(any_engine_db: Database, clock: FixedClock, cache: VectorCache) -> MemoryStore:
    """The store on SQLite and on PostgreSQL in turn (the PostgreSQL run skips, saying why, with no server)."""
    return MemoryStore(any_engine_db, clock.now, cache)


def people(guild: ScopedMemory, dm: ScopedMemory) -> None:
    """Records and episodes by, about and beside p1 ("Robin"), across two scopes, with a conversation."""
    dm.encode(moment("told me things", author="Robin", author_id="p1"))
    guild.encode(moment("I worry about Robin a lot", author="Eve", author_id="e1"))
    kept, _ = guild.encode(moment("lunch with Eve", author="Eve", author_id="e1"))
    guild.encode(moment("", join=kept, author="Robin", author_id="p1"))
    alone, _ = guild.encode(moment("only their words", author="Robin", author_id="p1"))
    guild.encode(moment("", join=alone, author="Robin", author_id="p1", episode="Robin said: again"))
    guild.encode(moment("Al and the band", author="Eve", author_id="e1"))
    dm.conversation_put("p1", {"summary": "secret"})


@pytest.mark.parametrize(
    ("ids", "names"),
    [
        pytest.param(["p1"], ["Robin"], id="id-and-name"),
        pytest.param(["nobody"], ["Robin"], id="name-only"),
        pytest.param(["p1"], [], id="id-only"),
        pytest.param(["e1"], ["Eve", "Al"], id="with-a-short-name"),
        pytest.param(["nobody"], ["nobody"], id="no-one"),
    ],
)
def test_the_preview_counts_what_forgetting_then_takes_and_changes_nothing(
    store: MemoryStore, guild: ScopedMemory, dm: ScopedMemory, ids: list[str], names: list[str]
) -> None:
    people(guild, dm)
    before = [(r.id, len(r.episodes)) for r in store.show(IMP, episodes=10)]
    coming = store.person_preview(IMP, ids, names)
    assert [(r.id, len(r.episodes)) for r in store.show(IMP, episodes=10)] == before
    assert store.forget_person(IMP, ids, names) == coming


def test_the_preview_of_p1_counts_records_left_without_an_episode(
    store: MemoryStore, guild: ScopedMemory, dm: ScopedMemory
) -> None:
    people(guild, dm)
    coming = store.person_preview(IMP, ["p1"], ["Robin"])
    # their DM record, the one naming them, their own record (2 episodes); their moment in "lunch with Eve"
    assert (coming.records, coming.episodes, coming.conversations) == (3, 5, 1)
    assert store.person_preview(IMP, [], []) == Forgotten()


def test_forget_record_takes_it_with_its_episodes_only_in_its_scope(
    store: MemoryStore, guild: ScopedMemory, dm: ScopedMemory
) -> None:
    target, _ = guild.encode(moment("the lake", vector=axis(3)))
    guild.encode(moment("", join=target, author="Eve", author_id="e1"))
    other, _ = dm.encode(moment("the lake too", vector=axis(3)))
    assert [r.id for r in store.search(IMP, axis(3), scopes=["guild:G1"])] == [target]  # the cache holds it
    assert store.forget_record(IMP, "dm:p1", target) == {"records": 0, "episodes": 0}  # not its scope
    assert store.forget_record("bea", "guild:G1", target) == {"records": 0, "episodes": 0}  # not its imp
    assert store.forget_record(IMP, "guild:G1", target) == {"records": 1, "episodes": 2}
    assert store.search(IMP, axis(3), scopes=["guild:G1"]) == []  # the cache dropped it with the generation
    assert [r.id for r in store.show(IMP)] == [other]
    assert store.forget_record(IMP, "guild:G1", target) == {"records": 0, "episodes": 0}


def test_records_by_id_takes_a_prefix_within_an_imp_and_a_scope(
    store: MemoryStore, guild: ScopedMemory, dm: ScopedMemory
) -> None:
    target, _ = guild.encode(moment("the lake"))
    guild.encode(moment("", join=target, author="Eve", author_id="e1"))
    [found] = store.records_by_id(IMP, target)
    assert found.id == target and found.scope == "guild:G1" and len(found.episodes) == 2  # type: ignore[attr-defined]
    assert [r.id for r in store.records_by_id(IMP, target[:8])] == [target]
    assert store.records_by_id(IMP, target, scope="dm:p1") == []
    assert store.records_by_id("bea", target) == []
    for bad in ("", "%", "_" * 8, target[:8] + "%", "ZZZZZZZZ"):
        assert (
            store.records_by_id(IMP, bad) == []
        )  # only hex names a record; no LIKE pattern is made of the rest
    ids = [target, *(guild.encode(moment(f"thing {i}"))[0] for i in range(40))]
    first = max("0123456789abcdef", key=lambda ch: sum(i.startswith(ch) for i in ids))  # 41 ids: 3 share one
    assert len(store.records_by_id(IMP, first, limit=2)) == 2
    assert len(store.records_by_id(IMP, first, limit=50)) == sum(i.startswith(first) for i in ids)


def test_the_day_lists_the_clock_reflections_and_only_this_scopes_nights(
    store: MemoryStore, clock: FixedClock
) -> None:
    now = clock.now()
    db = store.db
    db.write(lambda conn: wakefulness.save(conn, IMP, Wakefulness(
        awake=False, woke_at=now - timedelta(hours=5), slept_at=now - timedelta(hours=1),
        last_activity_at=now - timedelta(hours=3),
    ), now))  # fmt: skip
    tasks = TaskStore(db, clock)
    db.write(lambda conn: tasks.insert(conn, reflect_request(IMP, None)))
    db.write(lambda conn: tasks.insert(conn, sleep_request(IMP, "guild:G1", now, consolidate=True)))
    db.write(lambda conn: tasks.insert(conn, sleep_request(IMP, "dm:p1", now, consolidate=True)))
    db.write(lambda conn: tasks.insert(conn, reflect_request("bea", None)))
    today = day(db, IMP, "guild:G1", now)
    assert not today.awake and today.clock is not None
    assert [(e.kind, e.state) for e in today.events[2:]] == [
        ("asleep", None),
        ("activity", None),
        ("woke", None),
    ]
    assert sorted((e.kind, e.state) for e in today.events[:2]) == [
        ("night", "queued"),
        ("reflection", "queued"),
    ]
    assert (
        day(db, IMP, "guild:G1", now + timedelta(days=8)).events == ()
    )  # a week later: nothing in the window
    assert day(db, "bo", "guild:G1", now) == Day("bo", "guild:G1", now - DAY_WINDOW, None, ())
