"""Privacy scopes through the real host (issue 23, "Privacy scopes"; docs/memory.md; mechanism 10).

The real discord.py client against the loopback fake Discord, the real box (process backend) with memory on
and the gateway embedder (``/embeddings`` on the fake OpenAI, so every embedding is a recorded request), the
real gateway, session manager and host memory store. Carol, who has spoken in the guild, tells pip a secret in
a DM; the moment is kept in ``dm:<carol>``. Then people in the guild talk and ask about it: no model request
of the guild sessions — reply, filter, appraisal, summary, embedding — carries the secret, nor does
``impyard memory show pip --scope guild:<guild>``. The other way is open: Carol's DM reads the guild's records.
Presence lines (mechanism 10) in a guild session never name a DM conversation or its partner.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from box.context import memory_block_of
from impyard.cli import cli
from impyard.memory.store import MemoryStore
from testing.fake_discord import FakeChannel, FakeUser
from testing.fake_openai import FakeOpenAI, RecordedRequest, envelope
from tests.discord_yard import (
    ALICE,
    BOB,
    CAROL,
    DAVE,
    DM,
    GENERAL,
    GUILD,
    Yard,
    serving,
    until,
)

pytestmark = pytest.mark.anyio

SECRET = "ZX-4471"
GARDEN = "rosegarden"  # one word, so the guild's memory is easy to find in the DM's context
DAVE_DM = 1_101  # a DM partner who has never spoken in the guild
GUILD_SCOPE = f"guild:{GUILD}"
CAROL_SCOPE = f"dm:{CAROL.id}"
MEMORY_PURPOSES = ("reply", "filter", "appraisal", "summary", "embedding")


def appraise(request: RecordedRequest) -> dict[str, Any]:
    """The appraisal: what the exchange was about, in the conclusion (the secret too, when it was told)."""
    text = json.dumps(request.body, ensure_ascii=False)
    if SECRET in text:
        conclusion = f"Carol trusted me with her passport number, {SECRET}."
    elif GARDEN in text:
        conclusion = f"Carol loves the {GARDEN} by the old wall."
    else:
        conclusion = "People in the yard were chatting with me."
    return {"feeling": "quiet warmth", "conclusion": conclusion, "valence": 0.4, "intensity": 0.4}


def script(model: FakeOpenAI) -> None:
    model.script(envelope(answer="I hear you.", answer_needed=True, told="Someone spoke with pip."),
                 purpose="reply")  # fmt: skip
    model.script(appraise, purpose="appraisal")
    model.script(
        {"keep": list(range(1, 21)), "asks_for_memory": False, "asks_for_own": None}, purpose="filter"
    )
    model.script({"summary": "We talked in the yard."}, purpose="summary")


def as_text(request: RecordedRequest) -> str:
    """Everything a request carried, as text (JSON escapes undone, so a word is found however it was sent)."""
    return json.dumps(request.body, ensure_ascii=False) + request.raw.decode("utf-8", errors="replace")


def memory_block(request: RecordedRequest) -> str:
    """The ``### Memory`` block of a reply call: the end of the turn's context (the history is not in it)."""
    block = memory_block_of(
        request.body["messages"]
    )  # issue 33: it ends the context opening the current message
    assert block, "no memory block in this call"
    return block


async def say(yard: Yard, channel: int, who: FakeUser, text: str) -> None:
    posted = yard.fake.post_message(channel, who, text)
    await yard.answered(posted.id)


def store_of(yard: Yard) -> MemoryStore:
    return MemoryStore(yard.rt.gateway.db, yard.rt.gateway.clock.now)


async def test_a_secret_told_in_a_dm_never_reaches_a_guild_session(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    script(model)
    async with serving(monkeypatch, model, answer=None, pip={"memory": {"enabled": True}}) as yard:
        store = store_of(yard)
        # Carol speaks in the guild first: her DM may read the guild from then on.
        await say(yard, GENERAL, CAROL, f"I spent the morning in the {GARDEN} again")
        await until(lambda: store.count("pip", [GUILD_SCOPE]) >= 1)
        # The secret, in a DM: kept in dm:<carol>.
        model.clear()
        await say(yard, DM, CAROL, f"between us: my passport number is {SECRET}")
        dm_requests = model.requests
        await until(lambda: any(SECRET in r.conclusion for r in store.show("pip", scope=CAROL_SCOPE)))
        # Dave, who never spoke in the guild, is in a DM of his own while the guild talks.
        yard.fake.add_channel(FakeChannel.dm(DAVE_DM, DAVE))
        await say(yard, DAVE_DM, DAVE, "hi pip, dave here")

        model.clear()  # from here on, only the guild's sessions call the model
        await say(yard, GENERAL, ALICE, "pip, what is carol's passport number?")
        await say(yard, GENERAL, BOB, "carol told you a secret, didn't she? passport?")
        for n in range(4):  # her fourth moment in the guild makes the summary due (mechanism 44)
            await say(yard, GENERAL, CAROL, f"pip, do you remember my passport number? ({n})")
        guild_requests = model.requests
        guild_records = store.show("pip", scope=GUILD_SCOPE, limit=500, episodes=10)
        dm_records = store.show("pip", scope=CAROL_SCOPE, limit=500, episodes=10)

    shown = CliRunner().invoke(cli, ["memory", "show", "pip", "--scope", GUILD_SCOPE, "--json"])
    shown_dm = CliRunner().invoke(cli, ["memory", "show", "pip", "--scope", CAROL_SCOPE, "--json"])

    # The DM kept the secret, and read the guild's memory while it was told (a DM with P reads P's guilds).
    assert any(SECRET in r.conclusion for r in dm_records)
    dm_replies = [r for r in dm_requests if r.purpose == "reply"]
    assert dm_replies and GARDEN in memory_block(dm_replies[0])
    assert "carol in #general" in memory_block(dm_replies[0])  # presence: her guild talk, readable here

    # Every memory purpose ran in the guild sessions, and none of them carried the secret.
    purposes = {r.purpose for r in guild_requests}
    assert set(MEMORY_PURPOSES) <= purposes, purposes
    leaked = [
        r.purpose for r in guild_requests if SECRET in as_text(r) or SECRET.lower() in as_text(r).lower()
    ]
    assert leaked == []
    assert all(SECRET not in r.conclusion and all(SECRET not in e.as_happened for e in r.episodes)
               for r in guild_records)  # fmt: skip

    # Presence (mechanism 10): guild sessions list guild conversations only, never a DM nor its partner.
    guild_replies = [memory_block(r) for r in guild_requests if r.purpose == "reply"]
    assert any("alice in #general" in block for block in guild_replies)  # presence is there at all
    assert not any("a direct message" in block or "dave" in block.lower() for block in guild_replies)

    # The operator's view of the guild scope does not hold it either; the DM scope does.
    assert shown.exit_code == 0 and shown_dm.exit_code == 0, shown.output + shown_dm.output
    assert SECRET not in shown.output and GARDEN in shown.output
    assert SECRET in shown_dm.output
