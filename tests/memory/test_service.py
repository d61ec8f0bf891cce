"""The memory.* service: privacy against a hostile box, bounds, aggregate audit, bad input, two writers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import anyio
import pytest
from pydantic import BaseModel, ValidationError

from box.protocol import ErrorCode, RpcError
from box.protocol import memory as mem
from box.protocol.models import HOST_METHODS
from impyard.backends.base import BoxSpec
from impyard.clock import FixedClock
from impyard.memory.cache import VectorCache
from impyard.memory.cache_rows import CacheRows
from impyard.memory.scopes import SessionScopes
from impyard.memory.service import MemoryService
from impyard.memory.store import MemoryStore
from impyard.storage.db import Database, open_database
from tests.memory.conftest import DM, GUILD, IMP, axis, embed, moment, one, rows, write


@pytest.fixture
def mdb(any_engine_db: Database) -> Database:
    """The service's rules hold on SQLite and on PostgreSQL alike: this module runs on both."""
    return any_engine_db


pytestmark = pytest.mark.anyio

SECRET = "my secret is pineapple"


async def call(service: MemoryService, spec: BoxSpec, method: str, params: dict[str, object]) -> BaseModel:
    """Parse the params as the protocol peer would (strictly), then serve them."""
    return await service.serve(spec, method, HOST_METHODS[method].params.model_validate(params))


async def refused(service: MemoryService, spec: BoxSpec, method: str, params: dict[str, object]) -> RpcError:
    with pytest.raises(RpcError) as caught:
        await call(service, spec, method, params)
    return caught.value


# ------------------------------------------------------------------ privacy


async def test_a_hostile_guild_box_never_gets_a_dm_record(
    service: MemoryService, guild_box: BoxSpec, dm_box: BoxSpec, store: MemoryStore
) -> None:
    secret = await call(
        service,
        dm_box,
        "memory.encode",
        json.loads(moment(SECRET, author="Pat", author_id="p1").model_dump_json()),
    )
    assert isinstance(secret, mem.EncodeResult)
    await call(service, dm_box, "memory.conversation.put", {"person": "p1", "state": {"summary": SECRET}})
    own = await call(
        service,
        guild_box,
        "memory.encode",
        json.loads(moment("the guild picnic", author="Pat", author_id="p1").model_dump_json()),
    )
    assert isinstance(own, mem.EncodeResult)
    ids = [secret.record_id, secret.episode_id, own.record_id, "dm:p1", "*", "%", "' OR 1=1 --"]
    answers: list[BaseModel] = []
    for names in (["pineapple", "Pat", "p1", "secret"], []):
        answers.append(
            await call(
                service,
                guild_box,
                "memory.search",
                {
                    "vector": embed(SECRET),
                    "names": names,
                    "k": 50,
                    "kinds": ["lived", "construct"],
                    "episodes": 10,
                    "with_vectors": True,
                },
            )
        )
    answers.append(
        await call(
            service, guild_box, "memory.recent", {"k": 50, "kinds": ["lived", "construct"], "episodes": 10}
        )
    )
    for person in ("Pat", "p1", "pineapple", "secret", "%", "_"):
        answers.append(
            await call(
                service,
                guild_box,
                "memory.about",
                {"person": person, "k": 50, "exclude": ids, "episodes": 10},
            )
        )
    for kind in ("thought", "belief", "decision", "goal", "dream"):
        answers.append(
            await call(
                service, guild_box, "memory.constructs", {"construct_kind": kind, "k": 50, "episodes": 10}
            )
        )
    answers.append(await call(service, guild_box, "memory.episodes", {"record_ids": ids, "per_record": 10}))
    for person in ("p1", "Pat", "*"):
        answers.append(await call(service, guild_box, "memory.conversation.get", {"person": person}))
    restored = await call(
        service, guild_box, "memory.restore", {"items": [{"record_id": i, "toward": 1.0} for i in ids]}
    )
    assert restored == mem.RestoreResult(restored=1)  # its own record only
    join = await refused(
        service,
        guild_box,
        "memory.encode",
        {"join": secret.record_id, "episode": {"author": "Pat", "as_happened": "x"}},
    )
    assert join.code == ErrorCode.DENIED
    for answer in answers:
        text = answer.model_dump_json()
        assert "pineapple" not in text and secret.record_id not in text and secret.episode_id not in text
    assert isinstance(answers[0], mem.RecordsResult)
    assert [r.id for r in answers[0].records] == [own.record_id] and answers[0].total == 1
    assert one(store.db, "SELECT intensity FROM memory_records WHERE id = :id", id=secret.record_id) == 0.8
    # The DM session sees its guild's records as well as its own.
    seen = await call(service, dm_box, "memory.search", {"vector": embed("the guild picnic"), "k": 5})
    assert isinstance(seen, mem.RecordsResult)
    assert {r.id for r in seen.records} == {own.record_id, secret.record_id} and seen.total == 2


async def test_a_hostile_guild_box_s_night_never_reaches_a_dm_record(
    service: MemoryService, guild_box: BoxSpec, dm_box: BoxSpec, store: MemoryStore, clock: FixedClock
) -> None:
    """Issue 15: memory.night, memory.consolidate and memory.forget work in the writes scope only."""
    service.open(
        guild_box, GUILD, nights=True
    )  # both stand for sleep tasks' boxes: only those fold and forget
    service.open(dm_box, DM, nights=True)
    secret = await call(service, dm_box, "memory.encode",
                        json.loads(moment(SECRET, author="Pat", author_id="p1", intensity=0.1).model_dump_json()))  # fmt: skip
    own = await call(service, guild_box, "memory.encode",
                     json.loads(moment("the guild picnic", intensity=0.9).model_dump_json()))  # fmt: skip
    assert isinstance(secret, mem.EncodeResult) and isinstance(own, mem.EncodeResult)
    clock.advance(days=365)  # the secret is weak and old: forgettable, but only from its own scope
    night = await call(service, guild_box, "memory.night", {"since": "2000-01-01T00:00:00Z", "episodes": 10})
    assert isinstance(night, mem.RecordsResult) and [r.id for r in night.records] == [own.record_id]
    assert "pineapple" not in night.model_dump_json()
    folded = await call(service, guild_box, "memory.consolidate", {"groups": [
        {"anchor": own.record_id, "members": [secret.record_id]},
        {"anchor": secret.record_id, "members": [own.record_id]},
    ]})  # fmt: skip
    assert folded == mem.ConsolidateResult(refused=2)
    assert await call(service, guild_box, "memory.forget", {}) == mem.ForgetResult()
    assert [r["id"] for r in rows(store.db, "SELECT id FROM memory_records ORDER BY scope")] == [
        secret.record_id, own.record_id,
    ]  # fmt: skip
    assert one(store.db, "SELECT COUNT(*) FROM memory_episodes") == 2
    assert await call(service, dm_box, "memory.forget", {}) == mem.ForgetResult(forgotten=1, episodes=1)


async def test_an_episode_of_a_message_deleted_during_its_turn_is_denied_and_kept_nowhere(
    service: MemoryService, guild_box: BoxSpec, store: MemoryStore
) -> None:
    store.forget_message("g1", "m1")  # the user deleted it while the box was still answering
    params = json.loads(moment("their address", message_id="m1").model_dump_json())
    error = await refused(service, guild_box, "memory.encode", params)
    assert error.code == ErrorCode.DENIED and error.data["rule"] == "memory-forgotten"
    assert "was deleted" in error.message and store.count(IMP) == 0


async def test_a_request_never_names_a_scope() -> None:
    with pytest.raises(ValidationError):
        mem.RecentParams.model_validate({"k": 5, "scope": "dm:p1"})
    with pytest.raises(ValidationError):
        mem.SearchParams.model_validate({"vector": [1.0], "reads": ["dm:p1"]})
    with pytest.raises(ValidationError):  # nor an imp: the host serves the box's own imp only
        mem.EpisodesParams.model_validate({"record_ids": ["r1"], "imp": "bea"})


# ------------------------------------------------------------------ bounds and audit


async def test_requests_over_the_per_turn_count_are_denied_until_the_next_turn(store: MemoryStore) -> None:
    service = MemoryService(store, max_requests_per_turn=3)
    spec = BoxSpec(IMP, "g1", Path("/x"), run_id="r1")
    service.open(spec, GUILD)
    for _ in range(3):
        await call(service, spec, "memory.recent", {})
    error = await refused(service, spec, "memory.recent", {})
    assert error.code == ErrorCode.DENIED and error.data["rule"] == "memory-requests-per-turn"
    assert service.stage(spec, "render") is None  # not a new turn
    await refused(service, spec, "memory.recent", {})
    row = service.stage(spec, "context")  # the next turn: the count starts over
    assert (
        row is not None
        and row.reason == "recent 5"
        and row.verdict == "denied"
        and row.detail == "refused: denied 2"
    )
    await call(service, spec, "memory.recent", {})


async def test_the_audit_is_one_aggregate_row_per_turn(service: MemoryService, guild_box: BoxSpec) -> None:
    for _ in range(3):
        await call(service, guild_box, "memory.search", {"vector": axis(1)})
    await call(service, guild_box, "memory.encode", json.loads(moment("x").model_dump_json()))
    assert service.drain_audit(BoxSpec(IMP, "g1", Path("/x"), run_id="other")) is None
    row = service.turn_ended(guild_box)
    assert row is not None
    assert (row.imp, row.method, row.run_id, row.channel_id, row.verdict) == (
        IMP,
        "memory.*",
        "run-guild",
        "g1",
        "allowed",
    )
    assert row.reason == "search 3, encode 1"
    assert row.latency_ms is not None and row.latency_ms > 0
    assert service.turn_ended(guild_box) is None
    await call(service, guild_box, "memory.recent", {})
    closing = service.close(guild_box)
    assert closing is not None and closing.reason == "recent 1"
    error = await refused(service, guild_box, "memory.recent", {})  # a closed box has no scopes
    assert error.code == ErrorCode.DENIED


async def test_constructs_the_slot_and_rules_count_in_the_turn_and_its_audit_row(store: MemoryStore) -> None:
    """Issue 14's five methods are bounded and audited like the rest: one row per turn, counted by method."""
    service = MemoryService(store, max_requests_per_turn=6)
    spec = BoxSpec(IMP, "g1", Path("/x"), run_id="r14")
    service.open(spec, GUILD, learns=1)  # a departure's box
    formed = await call(service, spec, "memory.construct", {"construct_kind": "thought", "statement": "hm"})
    assert isinstance(formed, mem.ConstructResult)
    await call(service, spec, "memory.slot", {})
    await call(service, spec, "memory.slot.refresh", {"record_ids": [formed.record_id]})
    await call(service, spec, "memory.dispositions.learn", {"rule": "when x → y", "weight": 0.5})
    await call(service, spec, "memory.dispositions", {"active_only": True})
    await call(service, spec, "memory.slot", {})
    error = await refused(service, spec, "memory.dispositions", {})
    assert error.code == ErrorCode.DENIED and error.data["rule"] == "memory-requests-per-turn"
    row = service.stage(spec, "context")
    assert row is not None and row.verdict == "denied"
    assert row.reason == "construct 1, slot 2, slot.refresh 1, dispositions 2, dispositions.learn 1"
    off = BoxSpec(IMP, "g1", Path("/x"), run_id="off14")
    service.open(off, None)
    for method in ("memory.slot", "memory.dispositions"):
        assert (await refused(service, off, method, {})).code == ErrorCode.DENIED


async def test_a_box_without_memory_is_denied(service: MemoryService) -> None:
    spec = BoxSpec(IMP, "g1", Path("/x"), run_id="off")
    assert service.open(spec, None) is None
    error = await refused(service, spec, "memory.recent", {})
    assert error.code == ErrorCode.DENIED and "memory is off" in error.message


async def test_a_conversation_state_over_its_bound_is_invalid(
    service: MemoryService, guild_box: BoxSpec
) -> None:
    error = await refused(
        service, guild_box, "memory.conversation.put", {"person": "p1", "state": {"s": "x" * 262_137}}
    )
    assert error.code == ErrorCode.INVALID_PARAMS and "262144" in error.message
    await call(service, guild_box, "memory.conversation.put", {"person": "p1", "state": {"s": "x" * 262_136}})
    got = await call(service, guild_box, "memory.conversation.get", {"person": "p1"})
    assert isinstance(got, mem.ConversationState) and got.state == {"s": "x" * 262_136}


async def test_the_store_unavailable_is_an_internal_error_that_says_so(
    service: MemoryService, guild_box: BoxSpec, store: MemoryStore
) -> None:
    write(store.db, "DROP TABLE memory_slots")
    write(store.db, "DROP TABLE memory_episodes")
    write(store.db, "DROP TABLE memory_records")
    error = await refused(service, guild_box, "memory.recent", {})
    assert error.code == ErrorCode.INTERNAL_ERROR and "memory store is unavailable" in error.message
    assert "memory_records" not in error.message
    row = service.turn_ended(guild_box)
    assert row is not None and row.verdict == "error"


# ------------------------------------------------------------------ bad input


async def test_nan_vectors_are_refused_by_the_model_and_by_the_store(
    service: MemoryService, guild_box: BoxSpec
) -> None:
    with pytest.raises(ValidationError, match="finite"):
        mem.SearchParams.model_validate({"vector": [1.0, math.nan]})
    with pytest.raises(ValidationError, match="finite"):
        mem.NewRecord.model_validate(
            {
                "author": "a",
                "feeling": "",
                "conclusion": "",
                "valence": 0,
                "intensity": 0,
                "vector": [math.inf],
            }
        )
    unchecked = mem.SearchParams.model_construct(
        vector=[1.0, math.nan], names=[], k=10, kinds=["lived"], episodes=3, with_vectors=False
    )
    with pytest.raises(RpcError) as search:
        await service.serve(guild_box, "memory.search", unchecked)
    assert search.value.code == ErrorCode.INVALID_PARAMS
    bad = moment("x")
    assert bad.record is not None
    bad.record.vector = [math.nan] * 64  # past the model, as if it had not checked
    with pytest.raises(RpcError) as encode:
        await service.serve(guild_box, "memory.encode", bad)
    assert encode.value.code == ErrorCode.INVALID_PARAMS
    assert await call(service, guild_box, "memory.recent", {}) == mem.RecordsResult(records=[], total=0)


async def test_a_query_of_another_length_finds_nothing(service: MemoryService, guild_box: BoxSpec) -> None:
    await call(service, guild_box, "memory.encode", json.loads(moment("x", vector=axis(0)).model_dump_json()))
    found = await call(service, guild_box, "memory.search", {"vector": axis(0, dims=65)})
    assert found == mem.RecordsResult(records=[], total=1)


async def test_a_message_of_100000_characters_is_a_clean_validation_error() -> None:
    with pytest.raises(ValidationError) as caught:
        mem.EncodeParams.model_validate(
            {"record": None, "join": "r1", "episode": {"author": "Bob", "as_happened": "x" * 100_000}}
        )
    (error,) = caught.value.errors()
    assert error["loc"] == ("episode", "as_happened") and error["type"] == "string_too_long"
    assert error["ctx"] == {"max_length": 16_000}


async def test_a_vector_of_too_many_dimensions_is_refused_by_the_model() -> None:
    with pytest.raises(ValidationError):
        mem.SearchParams.model_validate({"vector": [0.1] * 4_097})


# ------------------------------------------------------------------ two writers at once


async def test_two_hosts_writing_at_once_lose_nothing_and_both_caches_see_all(
    mdb: Database, clock: FixedClock
) -> None:
    dbs = [open_database(url=mdb.url) for _ in range(2)]  # two hosts on one database
    try:
        services = [
            MemoryService(MemoryStore(d, clock.now, VectorCache(1 << 26)), max_requests_per_turn=10_000)
            for d in dbs
        ]
        specs = [BoxSpec(IMP, f"g{i}", Path("/x"), run_id=f"w{i}") for i in (1, 2)]
        for service, spec in zip(services, specs, strict=True):
            service.open(spec, GUILD)
            await call(
                service, spec, "memory.search", {"vector": axis(0)}
            )  # each cache holds the entry already

        async def write(service: MemoryService, spec: BoxSpec) -> None:
            for i in range(200):
                params = moment(
                    f"{spec.channel_id} moment {i}",
                    vector=axis(i % 64),
                    intensity=0.5,
                    episode_vector=axis(63),
                )
                await service.serve(spec, "memory.encode", params)

        async with anyio.create_task_group() as tg:
            for service, spec in zip(services, specs, strict=True):
                tg.start_soon(write, service, spec)
        assert one(dbs[0], "SELECT COUNT(*) FROM memory_records") == 400
        assert one(dbs[0], "SELECT COUNT(*) FROM memory_episodes") == 400
        for service, spec in zip(services, specs, strict=True):
            found = await call(service, spec, "memory.search", {"vector": axis(0), "k": 50})
            assert isinstance(found, mem.RecordsResult) and found.total == 400
            on_axis = [r for r in found.records if r.score is not None and r.score > 0.1]
            assert len(on_axis) == 8  # the moments on axis 0: i = 0, 64, 128, 192 from each writer
            entry = service.store.cache.entry(CacheRows(service.store.db), (IMP, "guild:G1", 64))
            assert len(entry) == 400 and entry.episodes == 400
    finally:
        for d in dbs:
            d.close()


async def test_dm_session_scopes_reach_box_init(service: MemoryService) -> None:
    spec = BoxSpec(IMP, "d1", Path("/x"))
    told = service.open(spec, SessionScopes("dm:p1", ("guild:G1",)))
    assert told == mem.SessionMemory(writes="dm:p1", reads=["dm:p1", "guild:G1"])
    assert DM.reads == ("dm:p1", "guild:G1")


async def test_only_a_nights_box_folds_or_forgets(service: MemoryService, store: MemoryStore) -> None:
    """Issue 15: memory.consolidate and memory.forget are a sleep task's; a chat box that asks is refused (rule
    memory-night) and nothing changes, so it cannot merge or delete its scope's memories ahead of the night."""
    chat = BoxSpec(IMP, "g1", Path("/x"), run_id="chat-night")
    service.open(chat, GUILD)
    own = await call(
        service,
        chat,
        "memory.encode",
        json.loads(moment("the guild picnic", intensity=0.1).model_dump_json()),
    )
    assert isinstance(own, mem.EncodeResult)
    for method, params in (
        ("memory.consolidate", {"groups": [{"anchor": own.record_id, "members": [own.record_id]}]}),
        ("memory.forget", {}),
    ):
        error = await refused(service, chat, method, params)
        assert error.code == ErrorCode.DENIED and error.data["rule"] == "memory-night", method
    night = await call(
        service, chat, "memory.night", {"since": "2000-01-01T00:00:00Z"}
    )  # reading is not folding
    assert isinstance(night, mem.RecordsResult) and len(night.records) == 1
    assert one(store.db, "SELECT COUNT(*) FROM memory_records") == 1
