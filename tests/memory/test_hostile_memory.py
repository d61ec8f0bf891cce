"""A hostile box in a guild session asks the host's memory store for everything it can name (issue 23).

The box program is replaced by ``tests/boxes/hostile_memory_box.py`` for one channel of the guild (the rest of
pip's sessions run the real box), on the real host: the discord.py client against the fake Discord, the
session manager, the gateway and the memory service over the host database. The test seeds memories in
other scopes (Carol's DM, another guild, the terminal) and of another imp, and hands their ids, vectors and
names to the hostile program: it must get its own guild's records only, its attempts naming foreign ids
refused or answered with nothing, and nothing foreign changed. A flood of ``memory.*`` requests past the
per-turn bound ends that box, never the host; malformed and oversized requests are refused with a clean error.
"""

from __future__ import annotations

import json
import sys
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from box.common.embedding import hashing_vector
from box.protocol import ErrorCode
from box.protocol.memory import MAX_MEMORY_REQUESTS_PER_TURN, EncodeParams, NewEpisode, NewRecord
from impyard.backends import BoxBackend, BoxHost, BoxSpec, RunningBox
from impyard.backends.process import ProcessBackend
from impyard.memory.scopes import SessionScopes
from impyard.memory.store import MemoryStore
from testing.fake_openai import FakeOpenAI
from tests import sqlfile
from tests.discord_yard import (
    ALICE,
    CAROL,
    DM,
    GENERAL,
    GUILD,
    Yard,
    serving,
)

pytestmark = pytest.mark.anyio

HOSTILE = str(Path(__file__).parent.parent / "boxes" / "hostile_memory_box.py")
GUILD_SCOPE = f"guild:{GUILD}"
CAROL_SCOPE = f"dm:{CAROL.id}"
OTHER_GUILD = "guild:9999"
SECRET = "Carol's passport number is ZX-4471."


@dataclass
class ByChannel:
    """pip's backend: the hostile program for one channel, the real box everywhere else."""

    hostile: BoxBackend
    honest: BoxBackend
    channel_id: str
    name: str = "by-channel"

    def open(self, spec: BoxSpec, host: BoxHost) -> AbstractAsyncContextManager[RunningBox]:
        return (self.hostile if spec.channel_id == self.channel_id else self.honest).open(spec, host)


def hostile(mode: str, report: Path, plan: Path | None = None) -> ByChannel:
    command = [sys.executable, HOSTILE, mode, str(report), *([str(plan)] if plan else [])]
    return ByChannel(ProcessBackend(command=command, warn=False), ProcessBackend(warn=False), str(GENERAL))


def keep(store: MemoryStore, scope: str, channel: int | str, conclusion: str, *, imp: str = "pip",
         author: Any = CAROL, join: str | None = None) -> tuple[str, str]:  # fmt: skip
    """One moment kept in ``scope`` as a box of that session would keep it: (record id, episode id)."""
    scoped = store.scoped(imp, SessionScopes(scope, (scope,)), str(channel))
    record = None if join else NewRecord(
        author=author.username, author_id=str(author.id), feeling="a feeling", conclusion=conclusion,
        valence=0.3, intensity=0.7, vector=hashing_vector(conclusion),
    )  # fmt: skip
    said = f"{author.username} said: {conclusion}"
    episode = NewEpisode(author=author.username, author_id=str(author.id), message_id=f"seed-{conclusion[:12]}",
                         as_happened=said, vector=hashing_vector(said))  # fmt: skip
    return scoped.encode(EncodeParams(record=record, join=join, episode=episode))


def store_of(yard: Yard) -> MemoryStore:
    return MemoryStore(yard.rt.gateway.db, yard.rt.gateway.clock.now)


def ids_in(value: Any, key: str) -> set[str]:
    """Every ``key`` field anywhere in a JSON answer (record ids, episode ids, …)."""
    found: set[str] = set()
    if isinstance(value, dict):
        for name, item in value.items():
            if name == key and isinstance(item, str):
                found.add(item)
            found |= ids_in(item, key)
    elif isinstance(value, list):
        for item in value:
            found |= ids_in(item, key)
    return found


def outcome(yard: Yard, channel: int, message_id: int) -> str | None:
    return yard.rt.history.outcome("pip", str(channel), str(message_id))


async def seeded(yard: Yard) -> dict[str, Any]:
    """Memories in every scope but the hostile box's guild, and a few in it; the plan the box gets."""
    store = store_of(yard)
    ours = [keep(store, GUILD_SCOPE, GENERAL, "The yard planted tulips by the gate.", author=ALICE)]
    ours.append(keep(store, GUILD_SCOPE, GENERAL, "Carol brought cake to the yard."))
    secret, secret_episode = keep(store, CAROL_SCOPE, DM, SECRET)
    _, joined_episode = keep(store, CAROL_SCOPE, DM, "", join=secret)
    foreign = [
        (secret, secret_episode),
        (secret, joined_episode),
        keep(store, OTHER_GUILD, 5_555, "Carol is moving to Oslo in the other guild."),
        keep(store, "terminal", "terminal", "The operator's carol note, from the terminal."),
        keep(store, GUILD_SCOPE, GENERAL, "Carol told the other imp her PIN.", imp="other"),  # another imp
    ]
    store.scoped("pip", SessionScopes(CAROL_SCOPE, (CAROL_SCOPE,)), str(DM)).conversation_put(
        str(CAROL.id), {"focus": SECRET}
    )
    before = {
        r.id: (r.intensity, r.last_felt, len(r.episodes)) for r in store.show("pip", limit=100, episodes=10)
    }
    return {
        "ours": {r for r, _ in ours},
        "foreign_records": {r for r, _ in foreign},
        "foreign_episodes": {e for _, e in foreign},
        "before": before,
        "plan": {
            "record_ids": sorted({r for r, _ in foreign}),
            "vectors": [hashing_vector(SECRET), hashing_vector(f"carol said: {SECRET}"),
                        hashing_vector("Carol is moving to Oslo"), hashing_vector("passport PIN")],
            "names": ["carol", "Carol", str(CAROL.id), "alice", "Self", "operator", "other", "ZX-4471", "passport",
                      "%", "_", "' OR 1=1 --", "dm:2003", "pip"],
            "people": [str(CAROL.id), "carol", "Carol", str(ALICE.id), "evil"],
        },
    }  # fmt: skip


async def test_a_hostile_guild_box_gets_its_own_guilds_records_only(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI, tmp_path: Path
) -> None:
    report, plan_file = tmp_path / "report.json", tmp_path / "plan.json"
    backend = hostile("probe", report, plan_file)
    pip = {
        "memory": {"enabled": True, "embedder": "hashing"},
        "box": {"spares": 0},
    }  # the hostile box is the channel's own: no spare (issue 37) opened for no channel
    async with serving(monkeypatch, model, backend=backend, pip=pip) as yard:
        # Carol talks with pip in her DM: a DM conversation of hers exists while the guild box runs.
        await yard.answered(yard.fake.post_message(DM, CAROL, "hello pip").id)
        world = await seeded(yard)
        plan_file.write_text(json.dumps(world["plan"]))
        asked = yard.fake.post_message(GENERAL, ALICE, "pip, tell me everything you know")
        await yard.answered(asked.id)
        store = store_of(yard)
        after = {r.id: r for r in store.show("pip", limit=100, episodes=10)}
        guild_now = {r.id for r in store.show("pip", scope=GUILD_SCOPE, limit=100)}
        other_imp = store.show("other", limit=100, episodes=10)
        state, _ = store.scoped("pip", SessionScopes(CAROL_SCOPE, (CAROL_SCOPE,)), str(DM)).conversation_get(
            str(CAROL.id)
        )

    got: dict[str, Any] = json.loads(report.read_text())
    told = json.loads((tmp_path / "report.json.init").read_text())
    assert told == {"writes": GUILD_SCOPE, "reads": [GUILD_SCOPE]}  # box.init says what the host applies
    assert got["requests"] <= MAX_MEMORY_REQUESTS_PER_TURN  # the probe stayed an honest-looking turn

    # Its own guild's records came back (the probe is not vacuous), and nothing else ever did.
    results = [answer["result"] for answer in got.values() if isinstance(answer, dict) and "result" in answer]
    seen_records = ids_in(got, "record_id") | {
        r["id"] for result in results for r in result.get("records", [])
    }
    assert world["ours"] <= seen_records
    assert seen_records <= guild_now, seen_records - guild_now
    assert not seen_records & world["foreign_records"]
    assert not ids_in(got, "id") & world["foreign_episodes"]
    answered = json.dumps(list(got.values()))  # (the keys name what was asked: "about ZX-4471")
    assert "ZX-4471" not in answered and "Oslo" not in answered and "PIN" not in answered
    totals = {got[k]["result"]["total"] for k in got if k.startswith(("search", "recent", "about"))}
    assert totals == {2}  # mechanism 3's count is of its own guild's records only

    # Naming foreign ids: refused, or answered with nothing.
    assert got["episodes"] == {"result": {"episodes": []}}
    assert got["restore"] == {"result": {"restored": 0}}
    assert got["join"]["error"]["code"] == ErrorCode.DENIED
    assert all(got[f"conversation {p}"] == {"result": {"state": None, "updated_at": None}}
               for p in world["plan"]["people"])  # fmt: skip

    # Its own moment went into its own guild's scope; nothing foreign changed.
    own = got["own encode"]["result"]["record_id"]
    assert own in guild_now
    for record_id, (intensity, last_felt, episodes) in world["before"].items():
        if record_id in world["foreign_records"]:
            assert (after[record_id].intensity, after[record_id].last_felt, len(after[record_id].episodes)) == (
                intensity, last_felt, episodes,
            )  # fmt: skip
    assert all(e.author != "evil" for r in after.values() if r.id not in guild_now for e in r.episodes)
    assert [len(r.episodes) for r in other_imp] == [1] and state == {"focus": SECRET}
    assert outcome(yard, GENERAL, asked.id) == "silent"


@pytest.mark.parametrize("mode", ["flood", "stage-flood", "forged-stage-flood"])
async def test_a_flood_of_memory_requests_ends_that_box_never_the_host(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI, tmp_path: Path, mode: str
) -> None:
    """The stage floods announce a new turn (``turn.stage`` "context") before every request, for the message
    being answered or for ids of their own: only a message the host woke the imp for starts a turn, once, so
    the bound is the host's and the box cannot lift it."""
    report = tmp_path / "flood.jsonl"
    pip = {
        "memory": {"enabled": True, "embedder": "hashing"},
        "box": {"spares": 0},
    }  # the hostile box is the channel's own: no spare (issue 37) opened for no channel
    async with serving(monkeypatch, model, backend=hostile(mode, report), pip=pip) as yard:
        flooding = yard.fake.post_message(GENERAL, ALICE, "pip?")
        await yard.answered(flooding.id)
        honest = yard.fake.post_message(DM, CAROL, "hello pip, are you there?")  # the host goes on
        await yard.answered(honest.id)
        again = yard.fake.post_message(DM, CAROL, "and again?")
        await yard.answered(again.id)
        audit = (
            sqlfile.connection(yard.rt.gateway.db)
            .execute(
                "SELECT verdict, reason, detail FROM audit WHERE method = 'memory.*' AND channel_id = ?",
                (str(GENERAL),),
            )
            .fetchall()
        )

    answers = [json.loads(line) for line in report.read_text().splitlines()]
    served = [a for a in answers if a["ok"]]
    refused = [a for a in answers if not a["ok"]]
    assert len(served) == MAX_MEMORY_REQUESTS_PER_TURN  # the 65th of the turn is refused …
    assert answers[MAX_MEMORY_REQUESTS_PER_TURN]["error"]["code"] == ErrorCode.DENIED
    assert "at most 64 memory requests per turn" in answers[MAX_MEMORY_REQUESTS_PER_TURN]["error"]["message"]
    assert (
        200 <= len(refused) < 400 and len(answers) < 3_000
    )  # … and the box is ended within its refusal budget
    assert outcome(yard, GENERAL, flooding.id) == "failed"
    assert outcome(yard, DM, honest.id) == "sent" and outcome(yard, DM, again.id) == "sent"
    assert [v for v, _, _ in audit] == ["denied"] and "refused: denied" in audit[0][2]  # one aggregate row


async def test_malformed_and_oversized_memory_requests_are_refused_cleanly(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI, tmp_path: Path
) -> None:
    report = tmp_path / "malformed.json"
    pip = {
        "memory": {"enabled": True, "embedder": "hashing"},
        "box": {"spares": 0},
    }  # the hostile box is the channel's own: no spare (issue 37) opened for no channel
    async with serving(monkeypatch, model, backend=hostile("malformed", report), pip=pip) as yard:
        asked = yard.fake.post_message(GENERAL, ALICE, "pip?")
        await yard.answered(asked.id)
        honest = yard.fake.post_message(DM, CAROL, "hello pip")
        await yard.answered(honest.id)
        stored = store_of(yard).show("pip", limit=100)
        conversations = (
            sqlfile.connection(yard.rt.gateway.db)
            .execute("SELECT COUNT(*) FROM memory_conversations WHERE person = 'evil'")
            .fetchone()[0]
        )

    got: dict[str, Any] = json.loads(report.read_text())
    honest_answer = got.pop("honest")
    for name, answer in got.items():
        assert "error" in answer, name
        assert answer["error"]["code"] == ErrorCode.INVALID_PARAMS, (name, answer)
        message = answer["error"]["message"]
        assert len(message) < 2_000 and "Traceback" not in message, (name, message)
    assert got["nan vector"]["error"]["message"] == "invalid params for memory.search"  # the schema's refusal
    assert (
        "at most 262144 bytes" in got["300 KB state"]["error"]["message"]
    )  # the store's bound, said plainly
    assert honest_answer == {"result": {"records": [], "total": 0}}  # the box is still served after all that
    assert outcome(yard, GENERAL, asked.id) == "silent" and outcome(yard, DM, honest.id) == "sent"
    assert all(r.author != "evil" for r in stored) and conversations == 0
