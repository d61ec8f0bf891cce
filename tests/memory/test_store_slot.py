"""The accessibility slot on the host (issue 14): ``memory.construct`` with ``slot``, ``memory.slot``,
``memory.slot.refresh`` (mechanisms 74, 84-88; subtle point 13), per imp and scope, through the service."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from impyard.backends.base import BoxSpec
from impyard.clock import FixedClock
from impyard.memory.service import MemoryService
from impyard.memory.store import MemoryStore
from impyard.storage.db import Database
from tests.memory.conftest import GUILD, IMP, axis, moment, one, rows
from tests.memory.test_store_constructs import ask

pytestmark = pytest.mark.anyio


@pytest.fixture
def mdb(any_engine_db: Database) -> Database:
    """The slot's laws hold alike on SQLite and on PostgreSQL: this module runs on both."""
    return any_engine_db


class Mind:
    """One box's view of its slot: forms constructs a minute apart and names them by their statement."""

    def __init__(self, service: MemoryService, box: BoxSpec, clock: FixedClock) -> None:
        self.service, self.box, self.clock = service, box, clock
        self.ids: dict[str, str] = {}
        self.names: dict[str, str] = {}
        self._axis = 0

    async def form(self, kind: str, statement: str, intensity: float = 0.5, slot: bool = True) -> Any:
        self.clock.advance(minutes=1)
        self._axis += 1
        formed = await ask(self.service, self.box, "memory.construct", {
            "construct_kind": kind, "statement": statement, "intensity": intensity, "vector": axis(self._axis),
            "slot": slot,
        })  # fmt: skip
        self.ids[statement] = formed.record_id
        self.names[formed.record_id] = statement
        return formed

    def held(self, entries: Any) -> list[str]:
        return [self.names.get(e.record.id, e.record.id) for e in entries]

    async def slot(self) -> list[str]:
        return self.held((await ask(self.service, self.box, "memory.slot", {})).entries)

    async def refresh(self, *statements: str) -> list[str]:
        ids = [self.ids.get(s, s) for s in statements]
        return self.held(
            (await ask(self.service, self.box, "memory.slot.refresh", {"record_ids": ids})).entries
        )


@pytest.fixture
def guild_mind(service: MemoryService, guild_box: BoxSpec, clock: FixedClock) -> Mind:
    return Mind(service, guild_box, clock)


@pytest.fixture
def dm_mind(service: MemoryService, dm_box: BoxSpec, clock: FixedClock) -> Mind:
    return Mind(service, dm_box, clock)


def slot_rows(store: MemoryStore) -> list[tuple[str, str]]:
    found = rows(store.db, "SELECT scope, record_id FROM memory_slots ORDER BY scope, record_id")
    return [(str(r["scope"]), str(r["record_id"])) for r in found]


# ------------------------------------------------------------------ 74, 84, 85: what enters


async def test_m74_a_formed_construct_is_activated_and_the_answer_carries_the_slot(guild_mind: Mind) -> None:
    formed = await guild_mind.form("thought", "the bread rose well")
    assert guild_mind.held(formed.slot) == ["the bread rose well"]
    assert formed.slot[0].activated_at == guild_mind.clock.now()
    assert await guild_mind.slot() == ["the bread rose well"]


async def test_without_slot_a_construct_is_kept_but_not_brought_to_mind(
    guild_mind: Mind, store: MemoryStore
) -> None:
    await guild_mind.form("thought", "held")
    formed = await guild_mind.form("belief", "not held", slot=False)
    assert guild_mind.held(formed.slot) == ["held"] and await guild_mind.slot() == ["held"]
    assert one(store.db, "SELECT COUNT(*) FROM memory_records") == 2


async def test_m84_beliefs_and_thoughts_use_all_three_places_while_no_act_is_held(guild_mind: Mind) -> None:
    for statement in ("one", "two", "three"):
        await guild_mind.form("thought", statement)
    assert await guild_mind.slot() == ["one", "two", "three"]


async def test_m84_an_arriving_act_displaces_the_oldest_free_entry(guild_mind: Mind) -> None:
    await guild_mind.form("thought", "one", intensity=0.1)
    await guild_mind.form("belief", "two", intensity=0.9)
    await guild_mind.form("thought", "three", intensity=0.9)
    formed = await guild_mind.form("decision", "leave early", intensity=0.1)
    assert guild_mind.held(formed.slot) == ["two", "three", "leave early"]


@pytest.mark.parametrize("newer", ["decision", "goal", "dream"])
async def test_m84_decisions_goals_and_dreams_share_one_place_the_newer_replaces(
    guild_mind: Mind, newer: str
) -> None:
    await guild_mind.form("thought", "one")
    await guild_mind.form("goal", "the old act")
    formed = await guild_mind.form(newer, "the new act")
    assert guild_mind.held(formed.slot) == ["one", "the new act"]


@pytest.mark.parametrize(
    ("intensity", "held"),
    [
        (0.39, ["a", "b", "c"]),  # weaker than every held one: it does not enter
        (
            0.4,
            ["b", "c", "new"],
        ),  # as strong as the weakest: enters, displaces the OLDEST (a), not the weakest
        (0.95, ["b", "c", "new"]),
    ],
)
async def test_m85_into_full_free_places_only_as_strong_as_the_weakest_and_it_displaces_the_oldest(
    guild_mind: Mind, intensity: float, held: list[str]
) -> None:
    await guild_mind.form("belief", "a", intensity=0.8)
    await guild_mind.form("thought", "b", intensity=0.4)  # the weakest, not the oldest
    await guild_mind.form("thought", "c", intensity=0.6)
    formed = await guild_mind.form("thought", "new", intensity=intensity)
    assert guild_mind.held(formed.slot) == held
    assert await guild_mind.slot() == held


async def test_m85_with_an_act_held_two_free_places_are_compared(guild_mind: Mind) -> None:
    await guild_mind.form("decision", "act", intensity=0.1)
    await guild_mind.form("thought", "a", intensity=0.5)
    await guild_mind.form("thought", "b", intensity=0.7)
    weak = await guild_mind.form("thought", "weak", intensity=0.45)
    assert guild_mind.held(weak.slot) == ["act", "a", "b"]
    strong = await guild_mind.form("thought", "strong", intensity=0.5)
    assert guild_mind.held(strong.slot) == ["act", "b", "strong"]


# ------------------------------------------------------------------ 86: re-activation


async def test_m86_refreshing_a_held_construct_only_moves_its_time(guild_mind: Mind) -> None:
    for statement in ("a", "b", "c"):
        await guild_mind.form("thought", statement)
    guild_mind.clock.advance(minutes=5)
    assert await guild_mind.refresh("a") == ["b", "c", "a"]  # oldest first: a is now the newest
    answer = await ask(guild_mind.service, guild_mind.box, "memory.slot", {})
    assert [e.activated_at for e in answer.entries][-1] == guild_mind.clock.now()


async def test_m86_refreshing_ids_not_held_changes_nothing(guild_mind: Mind, store: MemoryStore) -> None:
    await guild_mind.form("thought", "a")
    await guild_mind.form("thought", "kept aside", slot=False)
    before = rows(store.db, "SELECT record_id, activated_at FROM memory_slots")
    assert len(before) == 1
    assert await guild_mind.refresh("kept aside", "no-such-id", "' OR 1=1 --") == ["a"]
    assert rows(store.db, "SELECT record_id, activated_at FROM memory_slots") == before


async def test_m86_a_recurring_thought_is_reactivated_not_added_twice(
    guild_mind: Mind, service: MemoryService, guild_box: BoxSpec
) -> None:
    await guild_mind.form("thought", "a")
    await guild_mind.form("thought", "b")
    guild_mind.clock.advance(minutes=1)
    again = await ask(service, guild_box, "memory.construct", {
        "construct_kind": "thought", "statement": "a again", "intensity": 0.5, "vector": axis(1),
    })  # fmt: skip
    assert again.created is False
    assert guild_mind.held(again.slot) == ["b", "a"]


# ------------------------------------------------------------------ 87, 88: loading


async def test_m87_a_construct_not_activated_for_seven_days_leaves_the_slot_but_not_the_store(
    guild_mind: Mind, store: MemoryStore
) -> None:
    await guild_mind.form("thought", "old")
    guild_mind.clock.advance(days=3)
    await guild_mind.form("thought", "newer")
    guild_mind.clock.advance(days=4)  # "old": 7 days and 1 minute ago; "newer": 4 days ago
    assert await guild_mind.slot() == ["newer"]
    assert [r for _, r in slot_rows(store)] == [guild_mind.ids["newer"]]  # dropped from the stored slot too
    assert one(store.db, "SELECT COUNT(*) FROM memory_records WHERE id = :id", id=guild_mind.ids["old"]) == 1


async def test_m87_exactly_seven_days_is_still_held(guild_mind: Mind) -> None:
    await guild_mind.form("thought", "edge")
    guild_mind.clock.advance(days=7)
    assert await guild_mind.slot() == ["edge"]


async def test_m87_a_deleted_construct_leaves_the_slot(guild_mind: Mind, store: MemoryStore) -> None:
    await guild_mind.form("thought", "about Zora's boat")
    await guild_mind.form("thought", "mine")
    forgotten = store.forget_person(IMP, ["z1"], ["Zora"])
    assert forgotten.records == 1
    assert await guild_mind.slot() == ["mine"]
    assert [r for _, r in slot_rows(store)] == [guild_mind.ids["mine"]]


async def test_m88_the_slot_persists_for_the_next_box_of_the_same_scope(
    guild_mind: Mind, service: MemoryService, clock: FixedClock
) -> None:
    await guild_mind.form("goal", "finish the boat")
    await ask(service, guild_mind.box, "memory.slot", {})
    later = BoxSpec(IMP, "g2", Path("/nonexistent"), run_id="run-later")  # another channel of the same guild
    service.open(later, GUILD)
    clock.advance(days=2)
    answer = await ask(service, later, "memory.slot", {})
    assert [e.record.statement for e in answer.entries] == ["finish the boat"]
    assert answer.entries[0].record.felt < answer.entries[0].record.intensity  # felt now, faded


async def test_m88_a_dm_and_a_guild_hold_different_slots(
    guild_mind: Mind, dm_mind: Mind, store: MemoryStore
) -> None:
    await dm_mind.form("decision", "keep Pat's secret")
    await guild_mind.form("belief", "the guild likes bread")
    assert await dm_mind.slot() == ["keep Pat's secret"]
    assert await guild_mind.slot() == ["the guild likes bread"]
    assert [s for s, _ in slot_rows(store)] == ["dm:p1", "guild:G1"]
    refreshed = await guild_mind.refresh(dm_mind.ids["keep Pat's secret"])
    assert refreshed == ["the guild likes bread"]


async def test_a_lived_record_never_enters_the_slot(
    guild_mind: Mind, store: MemoryStore, service: MemoryService, guild_box: BoxSpec
) -> None:
    lived = await ask(
        service, guild_box, "memory.encode", moment("we baked", vector=axis(40)).model_dump(mode="json")
    )
    await guild_mind.form("thought", "a")
    assert await guild_mind.refresh(lived.record_id) == ["a"]
    assert [r for _, r in slot_rows(store)] == [guild_mind.ids["a"]]


# ------------------------------------------------------------------ the operator's view


async def test_the_operator_sees_each_scopes_slot_without_changing_it(
    guild_mind: Mind, dm_mind: Mind, store: MemoryStore
) -> None:
    await dm_mind.form("dream", "a house by the sea")
    await guild_mind.form("thought", "stale")
    guild_mind.clock.advance(days=8)
    await guild_mind.form("belief", "fresh")
    shown = [(scope, e.record.statement) for scope, e in store.slot_view(IMP)]
    assert shown == [("guild:G1", "fresh")]  # the dream and "stale" were last activated 8 days ago
    assert len(slot_rows(store)) == 2  # "stale" was dropped by the guild's load (form); the dm's row stays
    assert store.slot_view(IMP, "dm:p1") == [] and store.slot_view("other") == []
