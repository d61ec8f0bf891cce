"""Two real boxes of one imp in two channels of one guild, writing at the same moment, lose nothing (issue 23).

The real host (discord.py against the fake Discord, the session manager, the gateway, the memory service over
the host database) and two real boxes — the process backend, and the Docker backend under each runtime (runc,
and gVisor's runsc, whose sandboxes share no file lock: issue 22) where an engine runs — one per channel. In each round both channels get a message at the same instant, and the appraisals of the two
turns are held until both boxes have asked, so their ``memory.encode`` requests reach the host together. Every
message forms a moment: afterwards the store holds every episode, each in the guild's scope, and each box's
recall finds what was said in the other channel.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import anyio
import pytest

from box.context import memory_block_of
from impyard.backends import BoxBackend
from impyard.backends.process import ProcessBackend
from impyard.memory.store import MemoryStore
from testing.fake_openai import FakeOpenAI, RecordedRequest, envelope
from tests.conftest import RUNTIMES, docker_backend_for
from tests.discord_yard import (
    ALICE,
    BOB,
    GENERAL,
    GUILD,
    QUIET,
    Yard,
    serving,
)

pytestmark = pytest.mark.anyio

ROUNDS = 5
WORDS = {GENERAL: "apple", QUIET: "kiwi"}  # what is talked about in each channel, one numbered word a message
TOKEN = re.compile(r"\b(?:apple|kiwi)\d+\b")


# What each moment comes to mean: words and feelings apart enough that no two are one rumination (18).
MEANINGS = {
    "apple1": ("curious", "apple1 orchards need bees in spring"),
    "apple2": ("worried", "storms bruised the apple2 crop badly"),
    "apple3": ("nostalgic", "grandmother baked apple3 pies every week"),
    "apple4": ("amused", "cider from apple4 tastes sharp"),
    "apple5": ("uneasy", "apple5 seeds hold a trace of cyanide"),
    "kiwi1": ("delighted", "kiwi1 vines climb a trellis quickly"),
    "kiwi2": ("surprised", "fuzzy kiwi2 skins are edible"),
    "kiwi3": ("tender", "flightless birds called kiwi3 nest in burrows"),
    "kiwi4": ("hopeful", "kiwi4 ripens faster beside bananas"),
    "kiwi5": ("proud", "growers ship kiwi5 from New Zealand"),
}


class Appraiser:
    """The appraisal call: holds each until two are waiting (the two boxes' moments go in together), then
    answers with what the message's word came to mean, valence alternating so each moment opens a record."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(2, timeout=20)
        self.held = True

    def __call__(self, request: RecordedRequest) -> dict[str, Any]:
        token = TOKEN.findall(json.dumps(request.body))[-1]  # the exchange being appraised comes last
        if self.held:
            try:
                self.barrier.wait()
            except threading.BrokenBarrierError:
                pass
        feeling, conclusion = MEANINGS.get(token, ("calm", f"we spoke of {token}"))
        number = int(re.sub(r"\D", "", token))
        return {"feeling": feeling, "conclusion": conclusion, "valence": 0.4 if number % 2 else -0.4,
                "intensity": 0.4}  # fmt: skip


def script(model: FakeOpenAI, appraiser: Appraiser) -> None:
    model.script(envelope(answer="Noted.", answer_needed=True), purpose="reply")
    model.script(appraiser, purpose="appraisal")
    model.script(
        {"keep": list(range(1, 21)), "asks_for_memory": False, "asks_for_own": None}, purpose="filter"
    )
    model.script({"summary": "We talked about fruit."}, purpose="summary")


def memory_block(request: RecordedRequest) -> str:
    """The ``### Memory`` block of a reply call: the end of the turn's context (the history is not in it)."""
    block = memory_block_of(
        request.body["messages"]
    )  # issue 33: it ends the context opening the current message
    assert block, "no memory block in this call"
    return block


async def ask(yard: Yard, model: FakeOpenAI, channel: int, who: Any, text: str) -> str:
    """One message; the memory block of the reply call that answered it."""
    before = len(model.requests)
    posted = yard.fake.post_message(channel, who, text)
    await yard.answered(posted.id)
    replies = [r for r in model.requests[before:] if r.purpose == "reply"]
    assert replies, "no reply call"
    return memory_block(replies[0])


@pytest.mark.parametrize("kind", ["process", *RUNTIMES])
async def test_two_real_boxes_in_one_guild_writing_at_once_lose_nothing(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI, request: pytest.FixtureRequest, kind: str
) -> None:
    backend: BoxBackend = (
        ProcessBackend(warn=False) if kind == "process" else docker_backend_for(request, kind)
    )
    appraiser = Appraiser()
    script(model, appraiser)
    pip = {"memory": {"enabled": True, "embedder": "hashing"}}
    people = {GENERAL: ALICE, QUIET: BOB}
    posted: dict[int, list[int]] = {GENERAL: [], QUIET: []}
    async with serving(
        monkeypatch, model, answer=None, backend=backend, pip=pip, trusted=(GENERAL, QUIET)
    ) as yard:
        for n in range(1, ROUNDS + 1):
            for channel, who in people.items():  # the same instant in both channels
                message = yard.fake.post_message(channel, who, f"today I thought about {WORDS[channel]}{n}")
                posted[channel].append(message.id)
            async with anyio.create_task_group() as tg:
                for channel in people:
                    tg.start_soon(yard.answered, posted[channel][-1])
        boxes = yard.rt.sessions.boxes_started
        appraiser.held = False  # from here on one turn at a time
        store = MemoryStore(yard.rt.gateway.db, yard.rt.gateway.clock.now)
        records = store.show("pip", limit=500, episodes=10)
        in_guild = store.show("pip", scope=f"guild:{GUILD}", limit=500, episodes=10)
        # Recall across the two channels: the first thing said in the other one (not among the recent five).
        in_general = await ask(yard, model, GENERAL, ALICE, "do you remember kiwi1?")
        in_quiet = await ask(yard, model, QUIET, BOB, "do you remember apple1?")

    assert boxes == 2  # two warm boxes, one per channel, the whole time
    episodes = {e.message_id: (r.id, e.channel_id) for r in records for e in r.episodes}
    for channel, ids in posted.items():
        for message_id in ids:
            assert episodes.get(str(message_id), (None, None))[1] == str(channel), (channel, message_id)
    assert (
        len(records) == 2 * ROUNDS == len(in_guild)
    )  # alternating valence: one record per moment, none lost
    assert {r.conclusion for r in records} == {conclusion for _, conclusion in MEANINGS.values()}
    assert MEANINGS["kiwi1"][1] in in_general and MEANINGS["apple1"][1] in in_quiet
