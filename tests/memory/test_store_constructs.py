"""``memory.construct`` on the host (issue 14): constructs formed, recurring and reinforced (mechanisms 74-83).

Every request goes to ``MemoryService.serve`` as the box's peer sends it: JSON text parsed by the protocol
model, and the answer back through JSON.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from pydantic import BaseModel

from box.protocol import ErrorCode, RpcError
from box.protocol import memory as mem
from box.protocol.models import HOST_METHODS
from impyard.backends.base import BoxSpec
from impyard.clock import FixedClock
from impyard.memory.service import MemoryService
from impyard.memory.store import MemoryStore
from impyard.storage.db import Database
from tests.memory.conftest import axis, embed, one, rows

pytestmark = pytest.mark.anyio


@pytest.fixture
def mdb(any_engine_db: Database) -> Database:
    """Constructs are formed alike on SQLite and on PostgreSQL: this module runs on both."""
    return any_engine_db


async def ask(service: MemoryService, spec: BoxSpec, method: str, params: dict[str, Any]) -> Any:
    """As the box's peer: the params as JSON text parsed strictly, the answer back through JSON."""
    spec_of = HOST_METHODS[method]
    sent = spec_of.params.model_validate_json(json.dumps(params))
    answer = await service.serve(spec, method, sent)
    assert spec_of.result is not None and isinstance(answer, BaseModel)
    return spec_of.result.model_validate_json(answer.model_dump_json())


def leaning(cos: float, dims: int = 64) -> list[float]:
    """A unit vector whose cosine with ``axis(0)`` is ``cos``."""
    return [cos, math.sqrt(1.0 - cos * cos), *([0.0] * (dims - 2))]


def construct(kind: str, statement: str, **fields: Any) -> dict[str, Any]:
    return {"construct_kind": kind, "statement": statement, **fields}


def row(store: MemoryStore, record_id: str) -> dict[str, Any]:
    [found] = rows(
        store.db,
        "SELECT kind, construct_kind, origin, author, author_id, scope, statement, feeling, conclusion, valence,"
        " intensity, last_felt, mention_text FROM memory_records WHERE id = :id",
        id=record_id,
    )
    return found


def constructs_in(store: MemoryStore, scope: str) -> int:
    counted = one(
        store.db,
        "SELECT COUNT(*) FROM memory_records WHERE kind = 'construct' AND scope = :scope",
        scope=scope,
    )
    assert isinstance(counted, int)
    return counted


# ------------------------------------------------------------------ a new construct


async def test_m74_a_construct_is_kept_as_the_imps_own_in_the_writes_scope(
    service: MemoryService, dm_box: BoxSpec, store: MemoryStore
) -> None:
    formed = await ask(service, dm_box, "memory.construct", construct(
        "belief", "Pat keeps the promises she makes", feeling="trusting", conclusion="I can rely on her",
        valence=0.6, intensity=0.7, vector=axis(5),
    ))  # fmt: skip
    assert isinstance(formed, mem.ConstructResult)
    assert formed.created is True and formed.previous is None
    assert row(store, formed.record_id) == {
        "kind": "construct", "construct_kind": "belief", "origin": "lived", "author": "Self", "author_id": None,
        "scope": "dm:p1", "statement": "Pat keeps the promises she makes", "feeling": "trusting",
        "conclusion": "I can rely on her", "valence": 0.6, "intensity": 0.7, "last_felt": "2026-01-15T12:00:00.000000+00:00",
        "mention_text": "pat keeps the promises she makes i can rely on her",
    }  # fmt: skip


async def test_m83_every_read_carries_a_constructs_statement(service: MemoryService, dm_box: BoxSpec) -> None:
    formed = await ask(service, dm_box, "memory.construct", construct(
        "goal", "learn to bake rye bread", conclusion="it matters to me", intensity=0.6, vector=embed("rye bread"),
    ))  # fmt: skip
    reads = [
        await ask(service, dm_box, "memory.search", {"vector": embed("rye bread"), "kinds": ["construct"]}),
        await ask(service, dm_box, "memory.recent", {"kinds": ["construct"]}),
        await ask(service, dm_box, "memory.constructs", {"construct_kind": "goal"}),
        await ask(service, dm_box, "memory.about", {"person": "Self"}),
    ]
    for answer in reads:
        assert [(r.id, r.statement) for r in answer.records] == [
            (formed.record_id, "learn to bake rye bread")
        ]
    slot = await ask(service, dm_box, "memory.slot", {})
    assert [e.record.statement for e in slot.entries] == ["learn to bake rye bread"]


async def test_m15_a_construct_is_recalled_by_a_name_in_its_statement(
    service: MemoryService, guild_box: BoxSpec
) -> None:
    formed = await ask(service, guild_box, "memory.construct", construct(
        "decision", "tell Maren about the broken oar", conclusion="she should know", intensity=0.5,
        vector=axis(7),
    ))  # fmt: skip
    found = await ask(service, guild_box, "memory.search", {"vector": axis(7), "names": ["maren"]})
    # 1 × (0.75 + 0.25 × 0.5) (issue 32's weight of fading) + 0.5 bonus
    assert [(r.id, round(r.score, 6)) for r in found.records] == [(formed.record_id, 1.375)]
    about = await ask(service, guild_box, "memory.about", {"person": "Maren"})
    assert [r.id for r in about.records] == [formed.record_id]


async def test_a_new_construct_is_found_by_a_search_that_ran_before_it(
    service: MemoryService, guild_box: BoxSpec
) -> None:
    """The vector cache is kept in step: a scope's generation moves with the write."""
    before = await ask(service, guild_box, "memory.search", {"vector": axis(9), "kinds": ["construct"]})
    assert before.records == []
    formed = await ask(service, guild_box, "memory.construct", construct("dream", "a house by the sea",
                                                                         vector=axis(9)))  # fmt: skip
    after = await ask(service, guild_box, "memory.search", {"vector": axis(9), "kinds": ["construct"]})
    assert [r.id for r in after.records] == [formed.record_id]


# ------------------------------------------------------------------ recurring (75) and reinforced (82)


@pytest.mark.parametrize(("cos", "recurs"), [(0.95, True), (0.91, True), (0.89, False), (0.0, False)])
async def test_m75_a_thought_at_cosine_090_or_more_recurs_and_is_not_written(
    service: MemoryService,
    guild_box: BoxSpec,
    store: MemoryStore,
    clock: FixedClock,
    cos: float,
    recurs: bool,
) -> None:
    first = await ask(service, guild_box, "memory.construct", construct(
        "thought", "the lake was colder than I thought", valence=0.3, intensity=0.4, vector=axis(0),
    ))  # fmt: skip
    clock.advance(days=3)
    again = await ask(service, guild_box, "memory.construct", construct(
        "thought", "the lake is always cold", valence=0.3, intensity=0.9, vector=leaning(cos),
    ))  # fmt: skip
    assert again.created is not recurs
    assert constructs_in(store, "guild:G1") == (1 if recurs else 2)
    if recurs:
        assert again.record_id == first.record_id
        assert again.previous == "the lake was colder than I thought"
        stored = row(store, first.record_id)
        # mechanism 75: settled first (0.4 × (0.3 + 0.7·e^−1) = 0.223006), then 0.6 of the gap toward 0.9
        assert stored["intensity"] == pytest.approx(0.629203, abs=1e-6)
        assert stored["last_felt"] == "2026-01-18T12:00:00.000000+00:00"
        assert stored["statement"] == "the lake was colder than I thought"  # the old one is not rewritten
    else:
        assert again.previous is None and row(store, again.record_id)["intensity"] == 0.9


@pytest.mark.parametrize(
    ("stored", "expected"), [(0.5, 0.6), (0.95, 1.0), (1.0, 1.0)], ids=["plus-a-tenth", "capped", "full"]
)
async def test_m82_a_duplicate_belief_gains_a_tenth_without_settling(
    service: MemoryService, guild_box: BoxSpec, store: MemoryStore, clock: FixedClock, stored: float,
    expected: float,
) -> None:  # fmt: skip
    first = await ask(service, guild_box, "memory.construct", construct(
        "belief", "storms come from the west", valence=-0.2, intensity=stored, vector=axis(0),
    ))  # fmt: skip
    clock.advance(days=10)  # faded to about a third: a settle first would show
    again = await ask(service, guild_box, "memory.construct", construct(
        "belief", "storms always come from the west", valence=-0.2, intensity=0.1, vector=leaning(0.93),
    ))  # fmt: skip
    assert (again.record_id, again.created) == (first.record_id, False)
    kept = row(store, first.record_id)
    assert kept["intensity"] == pytest.approx(expected, abs=1e-9)
    assert kept["last_felt"] == "2026-01-25T12:00:00.000000+00:00"
    assert constructs_in(store, "guild:G1") == 1


async def test_m82_constructs_are_compared_only_with_their_own_kind(
    service: MemoryService, guild_box: BoxSpec, store: MemoryStore
) -> None:
    ids = set()
    for kind in ("thought", "belief", "decision", "goal", "dream"):
        formed = await ask(service, guild_box, "memory.construct", construct(kind, f"the same words {kind}",
                                                                             vector=axis(0)))  # fmt: skip
        assert formed.created is True
        ids.add(formed.record_id)
    assert len(ids) == 5 and constructs_in(store, "guild:G1") == 5


async def test_m82_only_the_writes_scope_is_compared_not_the_scopes_read(
    service: MemoryService, guild_box: BoxSpec, dm_box: BoxSpec, store: MemoryStore
) -> None:
    """A DM reads its guild's memories but forms its own constructs: the guild's is neither found nor raised."""
    guild = await ask(service, guild_box, "memory.construct", construct("belief", "bread needs time",
                                                                        intensity=0.5, vector=axis(0)))  # fmt: skip
    dm = await ask(service, dm_box, "memory.construct", construct("belief", "bread needs time",
                                                                  intensity=0.5, vector=axis(0)))  # fmt: skip
    assert dm.created is True and dm.record_id != guild.record_id
    assert row(store, dm.record_id)["scope"] == "dm:p1"
    assert row(store, guild.record_id)["intensity"] == 0.5


@pytest.mark.parametrize("vector", [None, [1.0] + [0.0] * 31], ids=["no-vector", "another-length"])
async def test_m30_a_construct_without_a_comparable_vector_is_new(
    service: MemoryService, guild_box: BoxSpec, store: MemoryStore, vector: list[float] | None
) -> None:
    await ask(service, guild_box, "memory.construct", construct("thought", "one", vector=axis(0)))
    again = await ask(service, guild_box, "memory.construct", construct("thought", "one", vector=vector))
    assert again.created is True and constructs_in(store, "guild:G1") == 2


# ------------------------------------------------------------------ scopes and bad input


async def test_a_construct_formed_in_a_dm_never_reaches_a_guild_session(
    service: MemoryService, guild_box: BoxSpec, dm_box: BoxSpec
) -> None:
    secret = await ask(service, dm_box, "memory.construct", construct(
        "decision", "keep Pat's pineapple secret", conclusion="she trusted me", intensity=1.0,
        vector=embed("pineapple secret"),
    ))  # fmt: skip
    answers = [
        await ask(
            service,
            guild_box,
            "memory.search",
            {
                "vector": embed("pineapple secret"),
                "names": ["Pat", "pineapple"],
                "k": 50,
                "kinds": ["construct"],
            },
        ),  # fmt: skip
        await ask(service, guild_box, "memory.recent", {"k": 50, "kinds": ["lived", "construct"]}),
        await ask(service, guild_box, "memory.constructs", {"construct_kind": "decision", "k": 50}),
        await ask(service, guild_box, "memory.about", {"person": "Pat", "k": 50}),
        await ask(service, guild_box, "memory.slot", {}),
        await ask(service, guild_box, "memory.slot.refresh", {"record_ids": [secret.record_id]}),
    ]
    # the guild forms the same decision: its own, not the DM's raised
    own = await ask(service, guild_box, "memory.construct", construct("decision", "keep Pat's pineapple secret",
                                                                      vector=embed("pineapple secret")))  # fmt: skip
    assert own.created is True
    answers.append(own)
    for answer in answers:
        text = answer.model_dump_json()
        assert secret.record_id not in text and "trusted" not in text
    refreshed = await ask(service, guild_box, "memory.restore", {"items": [{"record_id": secret.record_id,
                                                                            "toward": 1.0}]})  # fmt: skip
    assert refreshed.restored == 0


@pytest.mark.parametrize(
    "params",
    [
        {"construct_kind": "wish", "statement": "x"},
        {"construct_kind": "belief", "statement": ""},
        {"construct_kind": "belief", "statement": "x" * (mem.MAX_STATEMENT_CHARS + 1)},
        {"construct_kind": "belief", "statement": "x", "intensity": 1.5},
        {"construct_kind": "belief", "statement": "x", "vector": []},
        {"construct_kind": "belief", "statement": "x", "scope": "dm:p1"},
    ],
    ids=["kind", "empty", "too-long", "intensity", "empty-vector", "names-a-scope"],
)
async def test_a_malformed_construct_is_refused_before_the_host(params: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        HOST_METHODS["memory.construct"].params.model_validate_json(json.dumps(params))


async def test_a_construct_with_a_non_finite_vector_writes_nothing(
    service: MemoryService, guild_box: BoxSpec, store: MemoryStore
) -> None:
    """Built past the protocol's check (as a buggy peer might), the store still refuses it whole."""
    params = mem.ConstructParams.model_construct(
        construct_kind="belief", statement="x", feeling="", conclusion="", valence=0.0, intensity=0.5,
        vector=[math.nan] * 64, slot=True,
    )  # fmt: skip
    with pytest.raises(RpcError) as caught:
        await service.serve(guild_box, "memory.construct", params)
    assert caught.value.code == ErrorCode.INVALID_PARAMS
    assert constructs_in(store, "guild:G1") == 0
    assert one(store.db, "SELECT COUNT(*) FROM memory_slots") == 0
