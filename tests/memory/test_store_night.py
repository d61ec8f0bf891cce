"""The night on the host (issue 15): ``memory.night``, ``memory.consolidate``, ``memory.forget`` (mechanisms
107-113, the host half) and ``MemoryStore.forget_scope`` for the scopes a day did not touch.

Requests go to ``MemoryService.serve`` as the box's peer sends them: JSON text parsed by the protocol model,
the answer back through JSON. The records a test starts from are written through the session's own view
(``ScopedMemory.encode``), as a box's ``memory.encode`` writes them.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from box.protocol import ErrorCode, RpcError
from box.protocol import memory as mem
from box.protocol.models import HOST_METHODS
from impyard.backends.base import BoxSpec
from impyard.clock import FixedClock, iso
from impyard.memory import night as night_module
from impyard.memory.night import anchor_refusal, combined_intensity, forgets, member_refusal
from impyard.memory.scopes import SessionScopes
from impyard.memory.service import MemoryService
from impyard.memory.store import MemoryStore
from impyard.storage.db import Database
from tests.memory.conftest import DM, GUILD, IMP, T0, axis, moment, rows


@pytest.fixture
def mdb(any_engine_db: Database) -> Database:
    """The store's rules hold on SQLite and on PostgreSQL alike: this module runs on both."""
    return any_engine_db


pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def nights(service: MemoryService, guild_box: BoxSpec, dm_box: BoxSpec) -> None:
    """The boxes here stand for sleep tasks' boxes, which may fold and forget (a chat box may not:
    tests/memory/test_service.py::test_only_a_nights_box_folds_or_forgets)."""
    service.open(guild_box, GUILD, nights=True)
    service.open(dm_box, DM, nights=True)


async def ask(service: MemoryService, spec: BoxSpec, method: str, params: dict[str, Any]) -> Any:
    """As the box's peer: the params as JSON text parsed strictly, the answer back through JSON."""
    spec_of = HOST_METHODS[method]
    sent = spec_of.params.model_validate_json(json.dumps(params))
    answer = await service.serve(spec, method, sent)
    assert spec_of.result is not None and isinstance(answer, BaseModel)
    return spec_of.result.model_validate_json(answer.model_dump_json())


def lived(
    store: MemoryStore,
    conclusion: str,
    intensity: float,
    *,
    scopes: SessionScopes = GUILD,
    episodes: int = 1,
    valence: float = 0.5,
    vector: list[float] | None = None,
    episode_vector: list[float] | None = None,
) -> str:
    """A lived record written as a box writes it, with ``episodes`` episodes (joins), at the clock's now."""
    scoped = store.scoped(IMP, scopes, "g1")
    record_id, _ = scoped.encode(
        moment(conclusion, intensity=intensity, valence=valence, vector=vector, episode=f"{conclusion} #0",
               episode_vector=episode_vector)
    )  # fmt: skip
    for n in range(1, episodes):
        scoped.encode(
            moment(conclusion, join=record_id, episode=f"{conclusion} #{n}", episode_vector=episode_vector)
        )
    return record_id


def thought(store: MemoryStore, statement: str, intensity: float, scopes: SessionScopes = GUILD) -> str:
    params = mem.ConstructParams(construct_kind="thought", statement=statement, intensity=intensity)
    record_id, _, _, _ = store.scoped(IMP, scopes, "g1").construct(params)
    return record_id


def record(store: MemoryStore, record_id: str) -> dict[str, Any] | None:
    found = rows(
        store.db,
        "SELECT conclusion, feeling, valence, intensity, happened_at, last_felt, scope FROM memory_records"
        " WHERE id = :id",
        id=record_id,
    )
    return found[0] if found else None


def episodes_of(store: MemoryStore, record_id: str) -> list[str]:
    found = rows(store.db, "SELECT as_happened FROM memory_episodes WHERE record_id = :id", id=record_id)
    return sorted(str(r["as_happened"]) for r in found)


def all_episodes(store: MemoryStore) -> set[str]:
    return {str(r["as_happened"]) for r in rows(store.db, "SELECT as_happened FROM memory_episodes")}


def snapshot(store: MemoryStore) -> list[tuple[Any, ...]]:
    records = sorted(rows(store.db, "SELECT * FROM memory_records"), key=lambda r: str(r["id"]))
    episodes = sorted(rows(store.db, "SELECT * FROM memory_episodes"), key=lambda r: str(r["id"]))
    return [tuple(r.values()) for r in records] + [tuple(e.values()) for e in episodes]


# ------------------------------------------------------------------ memory.night (107)


async def test_m107_night_lists_the_writes_scope_since_waking_newest_first(
    service: MemoryService, store: MemoryStore, clock: FixedClock, guild_box: BoxSpec, dm_box: BoxSpec
) -> None:
    before = lived(store, "the morning before I woke", 0.5)
    clock.advance(hours=1)
    woke = clock.now()
    first = lived(store, "a walk by the river", 0.6, episodes=8)
    clock.advance(minutes=5)
    mine = thought(store, "rivers carry things away", 0.4)
    clock.advance(minutes=5)
    given = store.remember(IMP, "guild:G1", "I was born in a storm", 0.2, 0.7, age_hours=0.0)
    dm_secret = lived(store, "a secret told in a DM", 0.9, scopes=DM)
    clock.advance(minutes=5)

    night = await ask(service, guild_box, "memory.night", {"since": iso(woke)})
    assert [r.id for r in night.records] == [given, mine, first]  # newest first; not before waking
    assert [(r.kind, r.origin) for r in night.records] == [("lived", "given"), ("construct", "lived"),
                                                           ("lived", "lived")]  # fmt: skip
    assert len(night.records[2].episodes) == 6  # six episodes per record by default
    assert before not in {r.id for r in night.records} and dm_secret not in {r.id for r in night.records}

    # The DM session reads the guild too, but a night is the writes scope's only.
    dm_night = await ask(service, dm_box, "memory.night", {"since": iso(woke), "episodes": 0})
    assert [r.id for r in dm_night.records] == [dm_secret] and dm_night.records[0].episodes == []
    limited = await ask(service, guild_box, "memory.night", {"since": iso(woke), "k": 2})
    assert [r.id for r in limited.records] == [given, mine]


async def test_night_params_out_of_bounds_are_invalid() -> None:
    for bad in ({"since": iso(T0), "k": 0}, {"since": iso(T0), "k": 201}, {"since": iso(T0), "episodes": 11},
                {}, {"since": iso(T0), "scope": "dm:p1"}):  # fmt: skip
        with pytest.raises(ValidationError):
            mem.NightParams.model_validate_json(json.dumps(bad))


# ------------------------------------------------------------------ the checks in code (108, 113; subtle point 16)


@pytest.mark.parametrize(
    ("kind", "origin", "intensity", "why"),
    [
        ("lived", "lived", 0.4, None),  # at the minimum
        ("lived", "lived", 0.95, None),
        ("lived", "given", 0.5, None),  # a given record may anchor (113)
        ("lived", "lived", 0.39, "weaker than 0.4"),
        ("construct", "lived", 0.9, "a construct"),
    ],
)
def test_m108_m113_anchor_checks(kind: str, origin: str, intensity: float, why: str | None) -> None:
    assert anchor_refusal(kind, origin, intensity) == why


@pytest.mark.parametrize(
    ("record_id", "kind", "origin", "intensity", "absorbed", "why"),
    [
        ("m", "lived", "lived", 0.5, set(), None),  # as strong as the anchor: may be folded
        ("m", "lived", "lived", 0.1, set(), None),
        ("m", "lived", "lived", 0.51, set(), "stronger than the anchor"),
        ("m", "construct", "lived", 0.1, set(), "protected"),
        ("m", "lived", "given", 0.1, set(), "protected"),
        ("a", "lived", "lived", 0.5, set(), "the anchor itself"),
        ("m", "lived", "lived", 0.1, {"m"}, "absorbed already"),
    ],
)
def test_m108_m113_member_checks(
    record_id: str, kind: str, origin: str, intensity: float, absorbed: set[str], why: str | None
) -> None:
    assert member_refusal(record_id, kind, origin, intensity, anchor="a", anchor_intensity=0.5,
                          absorbed=absorbed) == why  # fmt: skip


@pytest.mark.parametrize(
    ("intensities", "combined"),
    [([0.5], 0.5), ([0.5, 0.4, 0.2], 0.76), ([0.6, 0.6], 0.84), ([0.4, 0.0], 0.4), ([0.9, 1.0], 1.0)],
)
def test_m110_anchor_intensity_is_one_minus_the_product(intensities: list[float], combined: float) -> None:
    assert combined_intensity(intensities) == pytest.approx(combined)


# ------------------------------------------------------------------ memory.consolidate (108-111, 113)


async def test_m109_m110_m111_members_fold_into_the_anchor_and_no_episode_is_lost(
    service: MemoryService, store: MemoryStore, guild_box: BoxSpec
) -> None:
    anchor = lived(store, "a day of baking with Carol", 0.5, episodes=2, vector=axis(0))
    first = lived(store, "the rye loaf rose at last", 0.4, episodes=3, vector=axis(1), episode_vector=axis(3))
    second = lived(store, "flour on the floor", 0.2, episodes=1, valence=-0.3, vector=axis(2))
    kept_before = record(store, anchor)
    episodes_before = all_episodes(store)
    # Warm the vector cache: the fold must reach it (the scope's generation moves).
    warm = await ask(service, guild_box, "memory.search", {"vector": axis(3), "k": 1})
    assert [r.id for r in warm.records] == [first]

    result = await ask(service, guild_box, "memory.consolidate", {"groups": [{"anchor": anchor,
                                                                               "members": [first, second]}]})  # fmt: skip
    assert result == mem.ConsolidateResult(groups=1, absorbed=2, episodes=4, refused=0)
    after = record(store, anchor)
    assert after is not None and kept_before is not None
    assert after["intensity"] == pytest.approx(1 - 0.5 * 0.6 * 0.8)  # 0.76 (110)
    # Nothing but the intensity changed: no text from any plan (111), valence and times as they were.
    assert {k: v for k, v in after.items() if k != "intensity"} == {
        k: v for k, v in kept_before.items() if k != "intensity"
    }
    assert record(store, first) is None and record(store, second) is None
    assert all_episodes(store) == episodes_before  # not one episode lost (109)
    assert len(episodes_of(store, anchor)) == 6
    # Recall finds the absorbed moment under its anchor now, by its moved episode, which comes first.
    found = await ask(service, guild_box, "memory.search", {"vector": axis(3), "k": 1, "episodes": 10})
    assert [r.id for r in found.records] == [anchor] and found.total == 1
    assert found.records[0].hit_episode is not None and len(found.records[0].episodes) == 6
    assert found.records[0].episodes[0].as_happened.startswith("the rye loaf rose at last")


async def test_m111_a_plan_s_summary_has_no_way_in() -> None:
    """The summary_fact is the box's to drop: a group that carries text is refused by the protocol."""
    with pytest.raises(ValidationError):
        mem.ConsolidateParams.model_validate_json(json.dumps(
            {"groups": [{"anchor": "a", "members": ["b"], "summary_fact": "we baked"}]}
        ))  # fmt: skip


async def test_m108_m113_the_host_refuses_what_the_checks_refuse_whatever_the_plan_says(
    service: MemoryService, store: MemoryStore, guild_box: BoxSpec
) -> None:
    strong = lived(store, "the storm took the boat", 0.6)
    weak_anchor = lived(store, "a grey afternoon", 0.3)
    stronger = lived(store, "the wave that hit me", 0.7)
    given = store.remember(IMP, "guild:G1", "my grandmother's boat", 0.5, 0.2)
    mine = thought(store, "boats are fragile", 0.3)
    other_scope = lived(store, "a DM about boats", 0.1, scopes=DM)
    small = lived(store, "a bit of rope", 0.1)
    before, generation = snapshot(store), store.generation(IMP, "guild:G1")

    result = await ask(service, guild_box, "memory.consolidate", {"groups": [
        {"anchor": mine, "members": [small]},  # a construct never anchors
        {"anchor": weak_anchor, "members": [small]},  # 0.3 < 0.4
        {"anchor": "no-such-record", "members": [small]},
        {"anchor": other_scope, "members": [small]},  # not in this session's writes scope
        {"anchor": strong, "members": [stronger, given, mine, strong, other_scope, "no-such-record"]},
    ]})  # fmt: skip
    assert result == mem.ConsolidateResult(groups=0, absorbed=0, episodes=0, refused=10)
    assert snapshot(store) == before  # nothing written: no generation moved either
    assert store.generation(IMP, "guild:G1") == generation

    # A given record may anchor; what the checks let through is folded, the rest stays.
    given_anchor = store.remember(IMP, "guild:G1", "the harbour where I grew up", 0.4, 0.9)
    mixed = await ask(service, guild_box, "memory.consolidate", {"groups": [
        {"anchor": given_anchor, "members": [small, mine, given]},
    ]})  # fmt: skip
    assert mixed == mem.ConsolidateResult(groups=1, absorbed=1, episodes=1, refused=2)
    assert record(store, small) is None and record(store, mine) and record(store, given)
    assert record(store, other_scope) is not None


async def test_m108_a_record_is_absorbed_once_and_an_absorbed_anchor_anchors_nothing(
    service: MemoryService, store: MemoryStore, guild_box: BoxSpec
) -> None:
    a = lived(store, "the first picnic", 0.8, episodes=2)
    b = lived(store, "the second picnic", 0.6, episodes=2)
    c = lived(store, "ants in the basket", 0.3)
    d = lived(store, "rain at the picnic", 0.5)
    result = await ask(service, guild_box, "memory.consolidate", {"groups": [
        {"anchor": b, "members": [c, c]},  # the second c: absorbed already
        {"anchor": a, "members": [b, c]},  # b (0.6 → 0.72 now) folds in; c is gone
        {"anchor": b, "members": [d]},  # b was absorbed in this call: no anchor
    ]})  # fmt: skip
    assert result == mem.ConsolidateResult(groups=2, absorbed=2, episodes=4, refused=3)  # c's 1, then b's 3
    assert record(store, b) is None and record(store, c) is None and record(store, d) is not None
    assert len(episodes_of(store, a)) == 5
    a_now = record(store, a)
    assert a_now is not None and a_now["intensity"] == pytest.approx(1 - 0.2 * (1 - 0.72))


async def test_consolidate_params_out_of_bounds_are_invalid() -> None:
    for bad in (
        {"groups": [{"anchor": "a", "members": []}]},
        {"groups": [{"anchor": "a", "members": [f"m{i}" for i in range(51)]}]},
        {"groups": [{"anchor": "a", "members": ["b"]}] * 51},
        {"groups": [{"anchor": "", "members": ["b"]}]},
    ):
        with pytest.raises(ValidationError):
            mem.ConsolidateParams.model_validate_json(json.dumps(bad))


# ------------------------------------------------------------------ memory.forget (112, 113)

# (age since last felt in days, stored intensity, kept). Thresholds: 0 under a day; 0.2@1, 0.4@7, 0.5@10,
# 0.6@30, 0.8@180 and after; linear in ln(days) between (3 days: 0.2 + 0.2·ln3/ln7 ≈ 0.313).
FORGETTING = [
    (0.5, 0.01, True),
    (1, 0.19, False),
    (1, 0.2, True),  # at the threshold: kept (only below it goes)
    (3, 0.30, False),
    (3, 0.32, True),
    (7, 0.39, False),
    (7, 0.45, True),  # felt now ≈ 0.17, but the stored intensity is what counts (subtle point 6)
    (10, 0.49, False),
    (10, 0.51, True),
    (30, 0.59, False),
    (30, 0.61, True),
    (180, 0.79, False),
    (180, 0.8, True),
    (400, 0.79, False),
]


@pytest.mark.parametrize(("days", "intensity", "kept"), FORGETTING)
def test_m112_the_forgetting_rule(days: float, intensity: float, kept: bool) -> None:
    assert forgets("lived", "lived", intensity, T0, T0 + timedelta(days=days)) is not kept
    assert forgets("construct", "lived", intensity, T0, T0 + timedelta(days=days)) is False  # 113
    assert forgets("lived", "given", intensity, T0, T0 + timedelta(days=days)) is False


@pytest.mark.parametrize(("days", "intensity", "kept"), FORGETTING)
async def test_m112_forget_deletes_a_record_below_its_age_s_threshold_with_its_episodes(
    service: MemoryService, store: MemoryStore, clock: FixedClock, guild_box: BoxSpec, days: float,
    intensity: float, kept: bool,
) -> None:  # fmt: skip
    target = lived(store, "a passing moment", intensity, episodes=3)
    clock.advance(days=days)
    result = await ask(service, guild_box, "memory.forget", {})
    assert result == (mem.ForgetResult() if kept else mem.ForgetResult(forgotten=1, episodes=3))
    assert (record(store, target) is not None) is kept
    assert len(episodes_of(store, target)) == (3 if kept else 0)


@pytest.mark.parametrize("batch", [2000, 3])  # one transaction, or several (a large night's forgetting)
async def test_m112_m113_a_night_s_forgetting_over_a_mixed_memory(
    service: MemoryService, store: MemoryStore, clock: FixedClock, guild_box: BoxSpec,
    monkeypatch: pytest.MonkeyPatch, batch: int,
) -> None:  # fmt: skip
    """One forget over records of every age: exactly the expected ones go; protected ones never."""
    monkeypatch.setattr(night_module, "FORGET_BATCH", batch)
    monkeypatch.setattr(night_module, "CHUNK", 2)
    start = clock.now()
    ids: dict[tuple[float, float], str] = {}
    for days, intensity, _ in FORGETTING:  # each written so that it is ``days`` old at the end
        clock.set(start + timedelta(days=400 - days))
        ids[(days, intensity)] = lived(store, f"moment {days} {intensity}", intensity, episodes=2)
    clock.set(start)
    old_thought = thought(store, "nothing lasts", 0.01)
    old_given = store.remember(IMP, "guild:G1", "a faint childhood memory", 0.1, 0.01, age_hours=24 * 300)
    clock.set(start + timedelta(days=400))

    result = await ask(service, guild_box, "memory.forget", {})
    gone = [key for key, record_id in ids.items() if record(store, record_id) is None]
    assert sorted(gone) == sorted((d, i) for d, i, kept in FORGETTING if not kept)
    assert result == mem.ForgetResult(forgotten=len(gone), episodes=2 * len(gone))
    assert record(store, old_thought) is not None and record(store, old_given) is not None  # 113
    again = await ask(service, guild_box, "memory.forget", {})
    assert again == mem.ForgetResult()


async def test_m112_age_is_counted_from_the_last_time_it_was_felt(
    service: MemoryService, store: MemoryStore, clock: FixedClock, guild_box: BoxSpec
) -> None:
    old = lived(store, "an old joke", 0.9)
    clock.advance(days=40)
    store.scoped(IMP, GUILD, "g1").restore([mem.Restore(record_id=old, toward=0.1)])  # felt again: 0.9 × fade
    felt_now = record(store, old)
    assert felt_now is not None and felt_now["intensity"] == pytest.approx(0.9 * 0.3, abs=0.01)
    clock.advance(hours=12)  # 0.27 stored, half a day since last felt: nothing is forgotten under a day
    assert await ask(service, guild_box, "memory.forget", {}) == mem.ForgetResult()
    clock.advance(days=2)  # 2.5 days: threshold ≈ 0.29 > 0.27
    assert await ask(service, guild_box, "memory.forget", {}) == mem.ForgetResult(forgotten=1, episodes=1)


# ------------------------------------------------------------------ scopes: a night stays in its scope


async def test_a_night_in_one_scope_never_touches_another(
    service: MemoryService, store: MemoryStore, clock: FixedClock, guild_box: BoxSpec, dm_box: BoxSpec
) -> None:
    guild_weak = lived(store, "a forgettable guild moment", 0.1)
    dm_weak = lived(store, "a forgettable DM moment", 0.1, scopes=DM)
    dm_anchor = lived(store, "a long talk in the DM", 0.9, scopes=DM)
    guild_anchor = lived(store, "the guild's game night", 0.9)
    clock.advance(days=30)
    dm_before = [r for r in snapshot(store) if "dm:p1" in r]

    # The guild box cannot fold a DM record, nor fold into one.
    crossed = await ask(service, guild_box, "memory.consolidate", {"groups": [
        {"anchor": guild_anchor, "members": [dm_weak]}, {"anchor": dm_anchor, "members": [guild_weak]},
    ]})  # fmt: skip
    assert crossed == mem.ConsolidateResult(refused=2)
    # The DM box reads the guild, but writes (and so folds and forgets) only in its DM.
    crossed = await ask(service, dm_box, "memory.consolidate", {"groups": [
        {"anchor": dm_anchor, "members": [guild_weak]}, {"anchor": guild_anchor, "members": [dm_weak]},
    ]})  # fmt: skip
    assert crossed == mem.ConsolidateResult(refused=2)
    forgot = await ask(service, guild_box, "memory.forget", {})
    assert forgot == mem.ForgetResult(forgotten=1, episodes=1)
    assert record(store, guild_weak) is None
    assert [r for r in snapshot(store) if "dm:p1" in r] == dm_before  # the DM untouched, row for row
    assert await ask(service, dm_box, "memory.forget", {}) == mem.ForgetResult(forgotten=1, episodes=1)
    assert record(store, dm_weak) is None and record(store, guild_anchor) is not None


async def test_the_host_forgets_in_a_scope_directly_and_the_cache_follows(
    service: MemoryService, store: MemoryStore, clock: FixedClock, guild_box: BoxSpec
) -> None:
    weak = lived(store, "a faint thing", 0.15, episodes=2, vector=axis(4))
    strong = lived(store, "a vivid thing", 0.85, vector=axis(5))
    found = await ask(service, guild_box, "memory.search", {"vector": axis(4), "k": 5})
    assert weak in {r.id for r in found.records}  # in the cache now
    clock.advance(days=8)
    assert store.forget_scope(IMP, "dm:p1") == (0, 0)
    assert store.forget_scope(IMP, "guild:G1") == (1, 2)
    found = await ask(service, guild_box, "memory.search", {"vector": axis(4), "k": 5})
    assert [r.id for r in found.records] == [strong] and found.total == 1


async def test_scopes_lived_in_lists_the_scopes_with_records_since_a_time(
    store: MemoryStore, clock: FixedClock
) -> None:
    lived(store, "an old guild day", 0.5)
    clock.advance(hours=1)
    lived(store, "a DM this morning", 0.5, scopes=DM)
    woke = clock.advance(minutes=1)
    clock.advance(hours=1)
    lived(store, "the guild tonight", 0.5)
    assert store.scopes_lived_in(IMP) == ["guild:G1", "dm:p1"]
    assert store.scopes_lived_in(IMP, since=woke) == ["guild:G1"]
    assert store.scopes_lived_in("nobody") == []


async def test_the_night_s_requests_are_denied_with_memory_off_and_audited_by_name(
    service: MemoryService, guild_box: BoxSpec
) -> None:
    await ask(service, guild_box, "memory.night", {"since": iso(T0)})
    await ask(service, guild_box, "memory.consolidate", {"groups": []})
    await ask(service, guild_box, "memory.forget", {})
    row = service.turn_ended(guild_box)
    assert row is not None and row.reason == "night 1, consolidate 1, forget 1" and row.verdict == "allowed"
    off = BoxSpec(IMP, "g1", guild_box.state_dir, run_id="off15")
    service.open(off, None)
    for method, params in (
        ("memory.night", {"since": iso(T0)}),
        ("memory.consolidate", {}),
        ("memory.forget", {}),
    ):
        with pytest.raises(RpcError) as caught:
            await ask(service, off, method, params)
        assert caught.value.code == ErrorCode.DENIED
