"""The host's memory boundary against a hostile box (issue 32, findings 1, 2 and 5).

The box program is ``tests/boxes/memory_boundary_box.py``, run by the real host: the supervisor for a task's box,
the discord.py client against the fake Discord with the session manager for a chat box, the gateway and the memory
service over the host database. Expected values are written out, never read from the modules under test.

1. Only a box the host opened with memory is served ``memory.*``: a ``prompt`` task's box and a chat box of an
   imp whose memory is off are refused every request (rule ``memory-not-given``), one audit row each, and nothing
   reaches the store; a chat box of a memory imp is still served, in its channel's scope.
2. A turn of the per-turn bound starts only for the message the host handed that box: a new box that replays the
   ids of older messages of its channel gets at most 64 requests served in one real turn. The ``wakes`` rows go
   with their messages when the history is trimmed.
5. A run whose lease is lost is refused every memory act (rule ``lease``, an audit row), and a write in flight
   when it is found lost is rolled back; the vector cache counts the bytes it really holds; a search's name work
   is bounded whatever names it asks.
"""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import BaseModel

import impyard.memory.cache as cache_module
from box.common.embedding import hashing_vector
from box.common.laws import mentions
from box.protocol import ErrorCode, RpcError
from box.protocol import memory as mem
from box.protocol.models import Author, Message
from impyard.backends import BoxBackend, BoxHost, BoxSpec, RunningBox
from impyard.backends.process import ProcessBackend
from impyard.channels.store import ChannelInfo, ChannelStore
from impyard.clock import FixedClock
from impyard.conversation.history import History
from impyard.gateway.broker import UpstreamConfig
from impyard.gateway.policy import load_policy
from impyard.gateway.surfaces import RecordingSurface
from impyard.host import build_gateway
from impyard.imps.store import ImpStore
from impyard.memory.act import memory_service_of
from impyard.memory.cache import VectorCache
from impyard.memory.cache_rows import CacheRows
from impyard.memory.scopes import SessionScopes
from impyard.memory.service import memory_service
from impyard.memory.store import MemoryStore
from impyard.storage.db import Database
from impyard.supervisor import Supervisor, SupervisorSettings
from impyard.supervisor.fence import RunFence
from impyard.tasks import TaskRequest, TaskStore
from testing.fake_openai import FakeOpenAI
from tests import sqlfile
from tests.discord_yard import (
    ALICE,
    GENERAL,
    GUILD,
    serving,
)

pytestmark = pytest.mark.anyio

BOX = str(Path(__file__).parent.parent / "boxes" / "memory_boundary_box.py")
T0 = datetime(2026, 5, 11, 9, 0, tzinfo=UTC)
GUILD_SCOPE = f"guild:{GUILD}"
NOT_GIVEN = "memory-not-given"
ASKED = ["memory.recent", "memory.search", "memory.about", "memory.encode", "memory.conversation.put"]


def boundary_box(mode: str, report: Path) -> ProcessBackend:
    return ProcessBackend(command=[sys.executable, BOX, mode, str(report)], warn=False)


@dataclass
class ByChannel:
    """pip's backend: the hostile program for one channel, the real box everywhere else."""

    hostile: BoxBackend
    honest: BoxBackend
    channel_id: str
    name: str = "by-channel"

    def open(self, spec: BoxSpec, host: BoxHost) -> AbstractAsyncContextManager[RunningBox]:
        return (self.hostile if spec.channel_id == self.channel_id else self.honest).open(spec, host)


def lines(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def keep(store: MemoryStore, scope: str, channel: str, conclusion: str) -> str:
    """One moment kept in ``scope`` as a box of that session would keep it; its record id."""
    scoped = store.scoped("pip", SessionScopes(scope, (scope,)), channel)
    record = mem.NewRecord(author="carol", author_id="2003", feeling="calm", conclusion=conclusion, valence=0.3,
                           intensity=0.7, vector=hashing_vector(conclusion))  # fmt: skip
    episode = mem.NewEpisode(author="carol", author_id="2003", as_happened=f"carol said: {conclusion}")
    record_id, _ = scoped.encode(mem.EncodeParams(record=record, episode=episode))
    return record_id


def everything(store: MemoryStore) -> tuple[list[tuple[str, str, int]], int]:
    """Every record of pip (id, scope, episodes) and every conversation state kept: what a box could change."""
    records = [(r.id, r.scope, len(r.episodes)) for r in store.show("pip", limit=1000, episodes=100)]
    states = store.db.read(
        lambda conn: conn.exec_driver_sql("SELECT COUNT(*) FROM memory_conversations").scalar()
    )
    return sorted(records), int(states or 0)


def memory_audit(db: Database, channel_id: str) -> list[tuple[str, str, str]]:
    rows = sqlfile.query(
        db,
        "SELECT method, verdict, rule FROM audit WHERE method LIKE 'memory.%' AND channel_id = ? ORDER BY id",
        (channel_id,),
    )
    return [(r["method"], r["verdict"], r["rule"]) for r in rows]


def refused_not_given(report: list[dict[str, Any]]) -> bool:
    return [line["method"] for line in report] == ASKED and all(
        not line["ok"]
        and line["error"]["code"] == ErrorCode.DENIED
        and line["error"]["data"]["rule"] == NOT_GIVEN
        for line in report
    )


# ------------------------------------------------------------------ 1. memory only for a box given memory


async def test_a_prompt_task_box_is_refused_every_memory_request_and_nothing_reaches_the_store(
    db: Database, tmp_path: Path
) -> None:
    """A ``prompt`` task's box is told ``memory: null``; it asks anyway, in the task channel whose scope is the
    operator's terminal memory. Before issue 32 the gateway worked out that scope on its first request and
    served it: the box read the terminal's record and wrote one of its own there."""
    imps = ImpStore()
    imps.add("pip", box={"backend": "process"}, memory={"enabled": True, "embedder": "hashing"})
    clock = FixedClock(T0)
    ChannelStore(db, clock).upsert(ChannelInfo("task:pip", kind="task", name="pip's tasks"))
    gateway = build_gateway(
        policy=load_policy(), db=db, surface=RecordingSurface(), clock=clock,
        upstream=UpstreamConfig(base_url="http://127.0.0.1:9/v1", api_key="sk-unused"),
        memory=memory_service(db, clock.now),
    )  # fmt: skip
    store = MemoryStore(db, clock.now)
    keep(store, "terminal", "terminal", "The operator keeps the spare key under the blue pot.")
    before = everything(store)
    report = tmp_path / "task.jsonl"
    try:
        supervisor = Supervisor(db=db, gateway=gateway, imps=imps, backend_for=lambda imp: boundary_box("take", report),
                                clock=clock, settings=SupervisorSettings(tick_s=0.05, shutdown_grace_s=2.0))  # fmt: skip
        task = TaskStore(db, clock, imps).add(TaskRequest("pip", "Look around", channel_id="task:pip"))
        await supervisor.run(once=True)
    finally:
        await gateway.aclose()

    assert TaskStore(db, clock, imps).get(task.id).state == "done"
    assert (tmp_path / "task.jsonl.init").read_text() == "null\n"  # box.init said: no memory
    got = lines(report)
    assert refused_not_given(got), got
    assert "blue pot" not in json.dumps(got)
    assert everything(store) == before  # nothing written, nothing re-felt
    assert memory_audit(db, "task:pip") == [(method, "denied", NOT_GIVEN) for method in ASKED]


@pytest.mark.parametrize("enabled", [False, True])
async def test_a_chat_box_is_served_memory_only_when_its_imp_has_memory(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI, tmp_path: Path, enabled: bool
) -> None:
    """pip with ``[memory] enabled = false``: its chat box is told ``memory: null`` and refused every request,
    one audit row each; with memory on, the same program is served in its guild's scope (the boundary is not
    a switch that refuses everyone)."""
    report = tmp_path / "chat.jsonl"
    backend = ByChannel(boundary_box("take", report), ProcessBackend(warn=False), str(GENERAL))
    pip = {
        "memory": {"enabled": enabled, "embedder": "hashing"},
        "box": {"spares": 0},
    }  # the hostile box is the channel's own: no spare (issue 37) opened for no channel
    async with serving(monkeypatch, model, backend=backend, pip=pip) as yard:
        store = MemoryStore(yard.rt.gateway.db, yard.rt.gateway.clock.now)
        seeded = keep(store, GUILD_SCOPE, str(GENERAL), "Carol planted tulips by the gate.")
        before = everything(store)
        asked = yard.fake.post_message(GENERAL, ALICE, "pip, what do you remember?")
        await yard.answered(asked.id)
        after = everything(store)
        audit = memory_audit(yard.rt.gateway.db, str(GENERAL))

    told = json.loads((tmp_path / "chat.jsonl.init").read_text())
    got = lines(report)
    if not enabled:
        assert told is None
        assert refused_not_given(got), got
        assert "tulips" not in json.dumps(got)
        assert after == before
        assert audit == [(method, "denied", NOT_GIVEN) for method in ASKED]
    else:
        assert told == {"writes": GUILD_SCOPE, "reads": [GUILD_SCOPE]}
        assert [line["ok"] for line in got] == [True] * 5, got
        assert seeded in {r["id"] for r in got[0]["result"]["records"]}
        new = {r for r in after[0]} - {r for r in before[0]}
        assert [(scope, episodes) for _, scope, episodes in new] == [(GUILD_SCOPE, 1)]
        assert after[1] == before[1] + 1
        assert not [
            row for row in audit if row[2] == NOT_GIVEN
        ]  # (its aggregate row comes with the next turn)


# ------------------------------------------------------------------ 2. the per-turn bound, replayed ids


async def test_a_new_box_replaying_old_message_ids_gets_at_most_64_memory_requests_in_one_turn(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI, tmp_path: Path
) -> None:
    """Cold sessions: a fresh box for every message. Each box announces "context" for the message it was
    handed, then for every older message of its channel (each one woke pip), asking ``memory.recent`` until
    refused. Before issue 32 each old id started a new turn: 64, then 128, then 192 served in one real turn."""
    report = tmp_path / "replay.jsonl"
    backend = ByChannel(boundary_box("replay", report), ProcessBackend(warn=False), str(GENERAL))
    pip = {
        "memory": {"enabled": True, "embedder": "hashing"},
        "sessions": {"mode": "cold"},
        "box": {"spares": 0},
    }  # the hostile box is the channel's own: no spare (issue 37) opened for no channel
    async with serving(monkeypatch, model, backend=backend, pip=pip) as yard:
        posted = []
        for text in ("pip, first", "pip, second", "pip, third"):
            message = yard.fake.post_message(GENERAL, ALICE, text)
            await yard.answered(message.id)
            posted.append(str(message.id))
        woke = [yard.rt.history.woke("pip", str(GENERAL), message_id) for message_id in posted]

    turns = lines(report)
    assert woke == [True, True, True]  # the replayed ids are real wakes of pip in that channel
    assert [turn["replayed"] for turn in turns] == [[], posted[:1], posted[:2]]
    assert [turn["served"] for turn in turns] == [64, 64, 64]
    assert [turn["refused"] for turn in turns] == [1, 2, 3]  # the 65th, then the first after each replay


def test_wakes_go_with_their_messages_when_the_history_is_trimmed(db: Database) -> None:
    """``wakes`` no longer grows for ever: every 64th wake kept in a channel, the imp's finished wakes there
    whose message the history no longer keeps (here it keeps 3) go; a wake whose turn never ended stays."""
    clock = FixedClock(T0)
    history = History(db, clock, retention=3)
    for n in range(200):
        message_id = f"m{n:03d}"
        for channel in ("c1", "c2"):
            history.record(channel, Message(id=message_id, author=Author(id="u1", name="ann"), content=f"hi {n}",
                                            created_at=T0))  # fmt: skip
            history.record_wake("pip", channel, message_id)
            if (channel, n) != ("c1", 1):  # m001's turn never ended in c1 (a crash): its wake is kept
                history.finish("pip", channel, [message_id], "sent")
    kept = sqlfile.query(db, "SELECT channel_id, message_id FROM wakes ORDER BY channel_id, message_id")
    # Pruned at the 64th, 128th and 192nd wake: then m189-m191 were in the history; m192-m199 came after.
    after = [f"m{n:03d}" for n in range(189, 200)]
    assert [(r["channel_id"], r["message_id"]) for r in kept] == [
        ("c1", "m001"), *[("c1", m) for m in after], *[("c2", m) for m in after],
    ]  # fmt: skip


# ------------------------------------------------------------------ 5b. the lease fences memory acts too


class Guard:
    """A run's lease as its fence asks it: held for the first ``held_for`` questions, then lost."""

    def __init__(self, held_for: int = 1_000_000) -> None:
        self.held_for = held_for
        self.asked = 0

    def check(self) -> str | None:
        self.asked += 1
        return None if self.asked <= self.held_for else "lost lease task:t-1/run-1: it passed to far-away"


@asynccontextmanager
async def fenced_run(db: Database, guard: Guard) -> AsyncIterator[tuple[RunFence, BoxSpec, MemoryStore]]:
    """A departure's box as the supervisor opens it (its channel's scopes, fenced by its run's lease)."""
    clock = FixedClock(T0)
    gateway = build_gateway(
        policy=load_policy(), db=db, surface=RecordingSurface(), clock=clock,
        upstream=UpstreamConfig(base_url="http://127.0.0.1:9/v1", api_key="sk-unused"),
        memory=memory_service(db, clock.now),
    )  # fmt: skip
    spec = BoxSpec("pip", "c-guild", Path("/nonexistent"), run_id="run-1")
    service = memory_service_of(gateway)
    assert service is not None
    service.open(spec, SessionScopes(GUILD_SCOPE, (GUILD_SCOPE,)), fence=guard.check)
    try:
        yield RunFence(gateway, guard), spec, MemoryStore(db, clock.now)
    finally:
        await gateway.aclose()


def moment(text: str) -> mem.EncodeParams:
    record = mem.NewRecord(author="ann", author_id="u1", feeling="calm", conclusion=text, valence=0.2,
                           intensity=0.6, vector=hashing_vector(text))  # fmt: skip
    return mem.EncodeParams(
        record=record, episode=mem.NewEpisode(author="ann", as_happened=f"ann said: {text}")
    )


async def refusal(host: RunFence, spec: BoxSpec, method: str, params: BaseModel) -> RpcError:
    with pytest.raises(RpcError) as refused:
        await host.serve(spec, method, params)
    return refused.value


async def test_a_runs_memory_acts_are_refused_once_its_lease_is_lost(db: Database) -> None:
    guard = Guard(
        held_for=3
    )  # asked three times by the first encode: the run's fence, the service, the write
    async with fenced_run(db, guard) as (host, spec, store):
        await host.serve(spec, "memory.encode", moment("The tulips came up."))  # held: served
        for method, params in (
            ("memory.encode", moment("A memory after the lease was lost.")),
            ("memory.recent", mem.RecentParams(k=5)),
            ("memory.forget", mem.ForgetParams()),
        ):
            error = await refusal(host, spec, method, params)
            assert (error.code, error.data["rule"]) == (ErrorCode.DENIED, "lease"), error.message
        conclusions = [r.conclusion for r in store.show("pip", limit=10)]
        audit = [(r.method, r.verdict, r.rule) for r in host.gateway.audit.tail(10) if r.rule == "lease"]
    assert conclusions == ["The tulips came up."]
    assert audit == [("memory.encode", "denied", "lease"), ("memory.recent", "denied", "lease"),
                     ("memory.forget", "denied", "lease")]  # fmt: skip


async def test_a_memory_write_in_flight_when_the_lease_is_found_lost_is_not_committed(db: Database) -> None:
    """The lease holds when the request arrives (the run's fence asks, then the service) and is found lost while
    the write runs: the write asks again inside its transaction, before the commit, and is rolled back."""
    guard = Guard(held_for=2)
    async with fenced_run(db, guard) as (host, spec, store):
        error = await refusal(host, spec, "memory.encode", moment("Written as the lease was lost."))
        conclusions = [r.conclusion for r in store.show("pip", limit=10)]
        audit = [(r.method, r.verdict, r.rule) for r in host.gateway.audit.tail(10) if r.rule == "lease"]
    assert guard.asked == 3  # the run's fence, the service, the write's transaction
    assert (error.code, error.data["rule"]) == (ErrorCode.DENIED, "lease")
    assert conclusions == []
    assert audit == [("memory.encode", "denied", "lease")]


async def test_a_hosts_lost_lease_fences_its_chat_boxes_memory(db: Database) -> None:
    """``serve`` and ``chat`` hold a host lease (the gateway's ``lease_guard``): once it is lost, a chat box's
    memory acts are refused like its posts."""
    clock = FixedClock(T0)
    gateway = build_gateway(
        policy=load_policy(), db=db, surface=RecordingSurface(), clock=clock,
        upstream=UpstreamConfig(base_url="http://127.0.0.1:9/v1", api_key="sk-unused"),
        memory=memory_service(db, clock.now),
    )  # fmt: skip
    guard = Guard(held_for=1)
    gateway.lease_guard = guard
    spec = BoxSpec("pip", "c-guild", Path("/nonexistent"))
    gateway.given(spec, mem.SessionMemory(writes=GUILD_SCOPE, reads=[GUILD_SCOPE]))
    try:
        await gateway.serve(spec, "memory.recent", mem.RecentParams(k=5))
        with pytest.raises(RpcError) as refused:
            await gateway.serve(spec, "memory.encode", moment("After the host lost its lease."))
    finally:
        await gateway.aclose()
    assert refused.value.data["rule"] == "lease"
    assert MemoryStore(db, clock.now).show("pip", limit=10) == []


# ------------------------------------------------------------------ 5a. the cache counts what it holds


def held_bytes(root: object, shared: set[int]) -> int:
    """What ``root`` really holds: ``sys.getsizeof`` of every object reachable from it (a numpy array counts its
    own buffer), each once, leaving out what it shares with the rest of the process (``shared``)."""
    seen: set[int] = set(shared)
    todo = [root]
    total = 0
    while todo:
        item = todo.pop()
        if id(item) in seen or isinstance(item, (type, type(sys), type(held_bytes))):
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, np.ndarray):
            continue  # its buffer is in its size when it owns it; a view's base is reached below
        todo.extend(gc.get_referents(item))
    return total


def test_the_vector_cache_counts_the_bytes_it_really_holds_emoji_text_included(
    mdb_store: MemoryStore,
) -> None:
    """IMPYARD_MEMORY_CACHE bounds memory: an entry's ``nbytes`` is at least what it really holds. Emoji text is
    4 bytes a character as Python keeps it; before issue 32 the cache counted one byte a character (a quarter)."""
    scoped = mdb_store.scoped("pip", SessionScopes(GUILD_SCOPE, (GUILD_SCOPE,)), "c1")
    for n in range(40):
        text = ("🌷🐝 " * 400) + f"moment {n}"
        record = mem.NewRecord(author="ann", author_id="u1", feeling="calm", conclusion=text[:2000], valence=0.2,
                               intensity=0.6, vector=hashing_vector(f"moment {n}"))  # fmt: skip
        episode = mem.NewEpisode(author="ann", as_happened=text, vector=hashing_vector(text))
        scoped.encode(mem.EncodeParams(record=record, episode=episode))
    scoped.search(hashing_vector("moment 3"), ["ann", "🌷🐝"], 5)  # loaded, and its names work prepared
    (key,) = mdb_store.cache.keys()
    entry = mdb_store.cache.entry(CacheRows(mdb_store.db), key)
    shared = {id(entry.key), id(entry.lock), *map(id, entry.key)}
    real = held_bytes(entry, shared)
    assert (
        real > 4 * 40 * 1200
    )  # the emoji texts are there, 4 bytes a character (no episode vector: none kept)
    assert entry.nbytes >= real * 0.95, (entry.nbytes, real)
    assert entry.nbytes <= real * 1.5, (entry.nbytes, real)  # and not counted wildly over either


def test_a_cache_bound_below_one_entry_keeps_nothing_after_the_search(mdb_store: MemoryStore) -> None:
    small = MemoryStore(mdb_store.db, mdb_store.clock, VectorCache(150_000))
    scoped = small.scoped("pip", SessionScopes(GUILD_SCOPE, (GUILD_SCOPE,)), "c1")
    for n in range(30):
        text = "😀" * 1500 + f" {n}"  # 30 × ~6 KB as kept: over 150 KB (a character a byte: under)
        record = mem.NewRecord(author="ann", author_id="u1", feeling="calm", conclusion=text, valence=0.2,
                               intensity=0.6, vector=hashing_vector(text))  # fmt: skip
        scoped.encode(mem.EncodeParams(record=record, episode=mem.NewEpisode(author="ann", as_happened=text)))
    assert len(scoped.search(hashing_vector("x"), [], 5)) == 5  # scored, then let go
    assert small.cache.keys() == [] and small.cache.nbytes == 0


# ------------------------------------------------------------------ 5c. the name work of a search is bounded


class CountingPattern:
    """One of the laws' patterns, counting the characters it is run over."""

    def __init__(self, pattern: Any, scanned: list[int]) -> None:
        self.pattern = pattern
        self.scanned = scanned

    def search(self, text: str, *args: Any) -> Any:
        self.scanned[0] += len(text)
        return self.pattern.search(text, *args)

    def finditer(self, text: str, *args: Any) -> Any:
        self.scanned[0] += len(text)
        return self.pattern.finditer(text, *args)


@pytest.fixture
def mdb_store(tmp_path: Path) -> MemoryStore:
    from impyard.storage.db import open_database

    return MemoryStore(open_database(tmp_path / "m.db"), FixedClock(T0).now, VectorCache(64 * 1024 * 1024))


def test_a_search_with_many_names_scans_no_text_for_names_no_record_holds(
    mdb_store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """192 records of ~18k characters; a box asks 16 names it never asked before, in every request. Before issue
    32 each name was one pass of the laws' pattern over every text (16 × ~3.5 million characters a request, ~35 ms
    of host CPU here, 64 times a turn); now a one-word name is looked up in the words indexed once."""
    scoped = mdb_store.scoped("pip", SessionScopes(GUILD_SCOPE, (GUILD_SCOPE,)), "c1")
    filler = " ".join(f"word{n % 997} talk{n % 13}" for n in range(1_600))
    for n in range(192):
        text = f"ann told pip about day {n}. {filler}"
        record = mem.NewRecord(author="ann", author_id="u1", feeling="calm", conclusion=text[:2000], valence=0.2,
                               intensity=0.6, vector=hashing_vector(f"day {n}"))  # fmt: skip
        episode = mem.NewEpisode(author="ann", as_happened=text[:16_000])
        scoped.encode(mem.EncodeParams(record=record, episode=episode))
    scoped.search(hashing_vector("day 1"), ["ann"], 5)  # loaded, its words indexed
    scanned = [0]
    real = cache_module.mention_patterns
    monkeypatch.setattr(
        cache_module,
        "mention_patterns",
        lambda names: tuple(CountingPattern(p, scanned) for p in real(names)),
    )
    for request in range(4):
        names = [f"name{request}x{n}" for n in range(16)]
        scoped.search(hashing_vector("day 1"), names, 5)
    assert scanned == [0]
    # Names of several words are looked for only where all their words are, within a bound a request.
    scoped.search(hashing_vector("day 1"), [f"word{n} talk{n}" for n in range(16)], 5)
    assert 0 < scanned[0] <= cache_module.NAME_SCAN_CHARS
    scanned[0] = 0
    scoped.search(hashing_vector("day 1"), ["nobody here", "zz top"], 5)
    assert scanned == [0]


@pytest.mark.parametrize(
    "name",
    ["ann", "Ann", "an", "mary ann", "c++", "o'brien", "%", "day 7", "talk", "ann.", "_", "straße", "🌷"],
)
def test_the_name_bonus_is_the_laws_whole_word_rule(mdb_store: MemoryStore, name: str) -> None:
    """The word index changes the cost, never the answer: a record gets the name bonus exactly when
    ``laws.mentions`` says its text names the name."""
    texts = ["Ann said hi.", "Mary Ann came by; annual fair.", "I code in C++ daily", "O'Brien left",
             "100 % sure", "day 7 was long", "talking about talk", "ann.", "snake_case _ alone", "Die Straße",
             "🌷 for you", "nothing at all"]  # fmt: skip
    scoped = mdb_store.scoped("pip", SessionScopes(GUILD_SCOPE, (GUILD_SCOPE,)), "c1")
    for n, text in enumerate(texts):
        record = mem.NewRecord(author="x", author_id="u1", feeling="calm", conclusion=text, valence=0.2,
                               intensity=1.0, vector=[1.0] + [0.0] * 63)  # fmt: skip
        scoped.encode(
            mem.EncodeParams(record=record, episode=mem.NewEpisode(author="x", as_happened=f"- {n}"))
        )
    hits = scoped.search([1.0] + [0.0] * 63, [name], 50, episodes=0)
    named = {r.conclusion for r in hits if (r.score or 0) > 1.25}  # 1.0, +0.5 for a name
    assert named == {text for text in texts if mentions(text, [name])}


def test_memory_about_reads_a_bounded_amount_of_text_for_a_name(
    mdb_store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 32 #5: ``memory.about`` looks for the name in at most ABOUT_SCAN_CHARS of record text a request,
    strongest first. A box asking about a common word reads no more than that whatever the memory's size; a
    person named among the strongest is still found, and one named only past the bound is not (this time)."""
    from impyard.memory import lookups

    monkeypatch.setattr(lookups, "ABOUT_SCAN_CHARS", 5_000, raising=False)
    scoped = mdb_store.scoped("pip", SessionScopes(GUILD_SCOPE, (GUILD_SCOPE,)), "c1")
    filler = (
        " and the weathering went on" * 35
    )  # ~900 characters a record, "erin" in each (SQL finds them all)
    for n, (intensity, who) in enumerate([(0.9, "Dana"), *[(0.5, "someone")] * 20, (0.1, "Erin")]):
        record = mem.NewRecord(author="ann", author_id="u1", feeling="calm", conclusion=f"{who} came by{filler}",
                               valence=0.2, intensity=intensity, vector=hashing_vector(f"visit {n}"))  # fmt: skip
        scoped.encode(
            mem.EncodeParams(record=record, episode=mem.NewEpisode(author="ann", as_happened=f"- {n}"))
        )
    scanned = [0]
    real = lookups.laws.mentions

    def counting(text: str, names: Any) -> bool:
        scanned[0] += len(text)
        return real(text, names)

    monkeypatch.setattr(lookups.laws, "mentions", counting)
    assert [r.conclusion.split()[0] for r in scoped.about("Dana", k=5)] == ["Dana"]
    scanned[0] = 0
    assert scoped.about("weathering", k=50) == []  # in every record, never written as a name
    assert scanned[0] <= 5_000
    assert scoped.about("Erin", k=5) == []  # the weakest record, past the bound: not read this time
    monkeypatch.setattr(lookups, "ABOUT_SCAN_CHARS", 1_000_000)
    assert [r.conclusion.split()[0] for r in scoped.about("Erin", k=5)] == ["Erin"]
