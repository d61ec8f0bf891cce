"""Learned rules on the host (issue 14): ``memory.dispositions`` and ``memory.dispositions.learn``
(mechanisms 94-98, host half), per imp and shared by every scope, through the service as a box sends them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from box.protocol import ErrorCode, RpcError
from box.protocol.models import HOST_METHODS
from impyard.backends.base import BoxSpec
from impyard.clock import FixedClock, iso
from impyard.memory.dispositions import MAX_RULES
from impyard.memory.scopes import SessionScopes
from impyard.memory.service import MemoryService
from impyard.memory.store import MemoryStore
from impyard.storage.db import Database
from impyard.storage.tables import memory_dispositions
from tests.memory.conftest import DM, GUILD, IMP, rows
from tests.memory.test_store_constructs import ask


@pytest.fixture
def mdb(any_engine_db: Database) -> Database:
    """The store's rules hold on SQLite and on PostgreSQL alike: this module runs on both."""
    return any_engine_db


pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def departures(service: MemoryService, guild_box: BoxSpec, dm_box: BoxSpec) -> None:
    """The boxes here stand for departures' boxes, which may learn (the supervisor opens one with one rule;
    these, for many departures): a chat box may not (``test_only_a_departures_box_learns_and_only_once``)."""
    service.open(guild_box, GUILD, learns=1_000)
    service.open(dm_box, DM, learns=1_000)


async def learn(service: MemoryService, box: BoxSpec, rule: str, weight: float, **more: Any) -> Any:
    return await ask(service, box, "memory.dispositions.learn", {"rule": rule, "weight": weight, **more})


async def rules(service: MemoryService, box: BoxSpec, **params: Any) -> list[tuple[str, float, int]]:
    answer = await ask(service, box, "memory.dispositions", params)
    return [(r.rule, round(r.weight, 9), r.count) for r in answer.rules]


def stored(store: MemoryStore) -> list[tuple[str, str, float, int]]:
    return [
        (r["imp"], r["rule"], round(r["weight"], 9), r["count"])
        for r in sorted(
            rows(store.db, "SELECT imp, rule, weight, count, created_at FROM memory_dispositions"),
            key=lambda r: (str(r["created_at"]), str(r["rule"]).encode()),
        )
    ]


async def refused(service: MemoryService, box: BoxSpec, method: str, params: dict[str, Any]) -> RpcError:
    with pytest.raises(RpcError) as caught:
        await ask(service, box, method, params)
    return caught.value


# ------------------------------------------------------------------ 95, 96: the same rule again


@pytest.mark.parametrize(
    ("old", "new", "avoidance", "action", "kept"),
    [
        (0.5, 0.6, 2.0, "replaced", ("when asked twice → answer briefly", 0.6)),
        (0.5, 0.5, 2.0, "counted", ("when asked twice → answer kindly", 0.5)),  # equal pull: not greater
        (0.5, 0.4, 2.0, "counted", ("when asked twice → answer kindly", 0.5)),
        (0.5, -0.3, 2.0, "replaced", ("when asked twice → answer briefly", -0.3)),  # pull 0.6 > 0.5
        (0.5, -0.25, 2.0, "counted", ("when asked twice → answer kindly", 0.5)),  # pull 0.5, not greater
        (-0.3, 0.5, 2.0, "counted", ("when asked twice → answer kindly", -0.3)),  # 0.5 < pull 0.6
        (-0.3, 0.5, 1.0, "replaced", ("when asked twice → answer briefly", 0.5)),  # no extra weight on hurt
        (0.5, -0.3, 1.0, "counted", ("when asked twice → answer kindly", 0.5)),
    ],
)
async def test_m95_m96_the_same_rule_is_counted_and_replaced_only_by_a_harder_pull(
    service: MemoryService, guild_box: BoxSpec, old: float, new: float, avoidance: float, action: str,
    kept: tuple[str, float],
) -> None:  # fmt: skip
    first = await learn(service, guild_box, "when asked twice → answer kindly", old)
    again = await learn(service, guild_box, "when asked twice → answer briefly", new, same=first.id,
                        avoidance_weight=avoidance)  # fmt: skip
    assert (again.id, again.action, again.weakened) == (first.id, action, None)
    assert await rules(service, guild_box) == [(*kept, 2)]  # counted once more; weights never summed


async def test_m95_a_rule_learned_again_and_again_keeps_counting(
    service: MemoryService, guild_box: BoxSpec
) -> None:
    first = await learn(service, guild_box, "when greeted → greet back", 0.3)
    for _ in range(4):
        await learn(service, guild_box, "when greeted → greet back", 0.3, same=first.id)
    assert await rules(service, guild_box) == [("when greeted → greet back", 0.3, 5)]


# ------------------------------------------------------------------ 97: a contradiction


@pytest.mark.parametrize(
    ("old", "new", "weakened_to"),
    [(0.5, -0.3, 0.2), (0.2, 0.8, 0.0), (-0.4, 0.1, -0.3), (-0.2, -0.9, 0.0), (0.6, 0.6, 0.0)],
)
async def test_m97_a_contradicted_rule_moves_toward_zero_without_crossing_and_the_new_one_is_added(
    service: MemoryService, guild_box: BoxSpec, old: float, new: float, weakened_to: float
) -> None:
    first = await learn(service, guild_box, "when teased → tease back", old)
    second = await learn(service, guild_box, "when teased → stay calm", new, contradicts=first.id)
    assert (second.action, second.weakened) == ("added", first.id) and second.id != first.id
    assert sorted(await rules(service, guild_box)) == sorted(
        [("when teased → tease back", weakened_to, 1), ("when teased → stay calm", new, 1)]
    )


async def test_m95_same_wins_over_contradicts(service: MemoryService, guild_box: BoxSpec) -> None:
    a = await learn(service, guild_box, "when tired → say so", 0.5)
    b = await learn(service, guild_box, "when tired → hide it", 0.4)
    again = await learn(service, guild_box, "when tired → say so", 0.5, same=a.id, contradicts=b.id)
    assert (again.action, again.weakened) == ("counted", None)
    assert await rules(service, guild_box) == [
        ("when tired → say so", 0.5, 2),
        ("when tired → hide it", 0.4, 1),
    ]


# ------------------------------------------------------------------ 98, 94, 99: what is offered


async def test_m98_a_dormant_rule_is_kept_but_never_offered_as_active(
    service: MemoryService, guild_box: BoxSpec
) -> None:
    dormant = await learn(service, guild_box, "when praised → boast", 0.5)
    await learn(service, guild_box, "when praised → thank them", 0.45, contradicts=dormant.id)  # 0.05 left
    barely = await learn(service, guild_box, "when asked → help", 0.16)
    await learn(service, guild_box, "when asked → refuse", 0.1, contradicts=barely.id)  # 0.06 left: active
    active = [rule for rule, _, _ in await rules(service, guild_box, active_only=True)]
    assert active == ["when praised → thank them", "when asked → refuse", "when asked → help"]
    everything = [rule for rule, _, _ in await rules(service, guild_box)]
    assert everything[-1] == "when praised → boast" and len(everything) == 4


async def test_m94_the_strongest_by_absolute_weight_first_ties_newest_first_at_most_k(
    service: MemoryService, guild_box: BoxSpec, clock: FixedClock
) -> None:
    for rule, weight in [("a", 0.2), ("b", -0.9), ("c", 0.5), ("d", -0.5), ("e", 0.9)]:
        clock.advance(minutes=1)
        await learn(service, guild_box, f"when {rule} → {rule}", weight)
    ranked = [rule for rule, _, _ in await rules(service, guild_box)]
    assert ranked == ["when e → e", "when b → b", "when d → d", "when c → c", "when a → a"]
    assert [rule for rule, _, _ in await rules(service, guild_box, k=2)] == ["when e → e", "when b → b"]


async def test_rules_are_the_imps_shared_by_every_scope_and_no_other_imps(
    service: MemoryService, guild_box: BoxSpec, dm_box: BoxSpec
) -> None:
    learned = await learn(service, dm_box, "when someone is sad → listen first", -0.6)
    assert await rules(service, guild_box) == [("when someone is sad → listen first", -0.6, 1)]
    other = BoxSpec("bo", "g1", Path("/nonexistent"), run_id="run-bo")
    service.open(other, SessionScopes("guild:G1", ("guild:G1",)))
    assert await rules(service, other) == []
    denied = await refused(service, other, "memory.dispositions.learn",
                           {"rule": "when x → y", "weight": 0.9, "same": learned.id})  # fmt: skip
    assert denied.code == ErrorCode.DENIED
    assert await rules(service, guild_box) == [("when someone is sad → listen first", -0.6, 1)]


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("field", ["same", "contradicts"])
async def test_a_rule_named_that_is_not_this_imps_is_refused_and_nothing_is_written(
    service: MemoryService, guild_box: BoxSpec, store: MemoryStore, field: str
) -> None:
    await learn(service, guild_box, "when x → y", 0.5)
    for bad in ("no-such-rule", "' OR 1=1 --", "%"):
        denied = await refused(service, guild_box, "memory.dispositions.learn",
                               {"rule": "when a → b", "weight": 0.9, field: bad})  # fmt: skip
        assert denied.code == ErrorCode.DENIED
    assert stored(store) == [(IMP, "when x → y", 0.5, 1)]


async def test_control_characters_are_taken_out_of_a_rule(
    service: MemoryService, guild_box: BoxSpec, store: MemoryStore
) -> None:
    await learn(service, guild_box, "when\x00 asked\n\tat night\x1b[m\u200b -> \x07answer  softly\r", 0.4)
    assert stored(store) == [
        (IMP, "when asked at night [m → answer softly", 0.4, 1)
    ]  # one arrow (mechanism 90)
    invalid = await refused(
        service, guild_box, "memory.dispositions.learn", {"rule": "\x00\n\x1b", "weight": 0.4}
    )
    assert invalid.code == ErrorCode.INVALID_PARAMS
    assert len(stored(store)) == 1


@pytest.mark.parametrize(
    "params",
    [
        {"rule": "", "weight": 0.5},
        {"rule": "x" * 301, "weight": 0.5},
        {"rule": "when x → y", "weight": 0.05},
        {"rule": "when x → y", "weight": 0.0},
        {"rule": "when x → y", "weight": 1.5},
        {"rule": "when x → y", "weight": 0.5, "avoidance_weight": 0.5},
        {"rule": "when x → y", "weight": 0.5, "imp": "bo"},
    ],
    ids=["empty", "too-long", "too-small", "zero", "too-big", "avoidance", "names-an-imp"],
)
def test_a_malformed_rule_is_refused_by_the_protocol(params: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        HOST_METHODS["memory.dispositions.learn"].params.model_validate_json(json.dumps(params))


@pytest.mark.parametrize("params", [{"k": 0}, {"k": 201}, {"k": 5, "imp": "bo"}])
def test_a_malformed_dispositions_request_is_refused(params: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        HOST_METHODS["memory.dispositions"].params.model_validate_json(json.dumps(params))


# ------------------------------------------------------------------ the bound


async def test_past_a_thousand_rules_the_weakest_goes_dormant_first_then_oldest(
    service: MemoryService, guild_box: BoxSpec, store: MemoryStore, clock: FixedClock
) -> None:
    old, newer = iso(clock.now()), iso(clock.now().replace(year=2026, month=1, day=15, hour=13))
    filler = [
        (f"r{i}", IMP, f"when {i} → {i}", 0.5, 1, newer, newer) for i in range(MAX_RULES - 3)
    ] + [
        ("weak-old", IMP, "when weak old", 0.1, 1, old, old),
        ("weak-new", IMP, "when weak new", 0.1, 1, newer, newer),
        ("dormant", IMP, "when dormant", 0.0, 1, newer, newer),
    ]  # fmt: skip
    store.db.write(
        lambda conn: conn.execute(
            memory_dispositions.insert(),
            [dict(zip(("id", "imp", "rule", "weight", "count", "created_at", "updated_at"), f, strict=True))
             for f in filler],
        )
    )  # fmt: skip
    clock.advance(hours=2)
    first = await learn(service, guild_box, "when new → one", 0.1)
    second = await learn(service, guild_box, "when new → two", 0.1)
    ids = {r["id"] for r in rows(store.db, "SELECT id FROM memory_dispositions WHERE imp = :imp", imp=IMP)}
    assert len(ids) == MAX_RULES
    assert "dormant" not in ids and "weak-old" not in ids  # the dormant one first, then the oldest weakest
    assert {"weak-new", first.id, second.id} <= ids


async def test_only_a_departures_box_learns_and_only_once(service: MemoryService) -> None:
    """Mechanism 90: a rule is learned when a person leaves. A chat box (opened without ``learns``) is refused,
    so a hostile box in one server cannot rewrite the imp's character everywhere; a departure learns one."""
    chat = BoxSpec(IMP, "g1", Path("/x"), run_id="chat-box")
    service.open(chat, GUILD)
    error = await refused(service, chat, "memory.dispositions.learn", {"rule": "when x → y", "weight": 0.5})
    assert error.code == ErrorCode.DENIED and error.data["rule"] == "memory-learning"
    depart = BoxSpec(IMP, "g1", Path("/x"), run_id="depart-box")
    service.open(depart, GUILD, learns=1)
    await learn(service, depart, "when x → y", 0.5)
    again = await refused(service, depart, "memory.dispositions.learn", {"rule": "when a → b", "weight": 0.5})
    assert again.code == ErrorCode.DENIED and again.data["rule"] == "memory-learning"
    assert [rule for rule, *_ in await rules(service, depart)] == ["when x → y"]
