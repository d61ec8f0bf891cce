"""Private channels keep their memories to themselves, through the real host (issue 32 #4; docs/memory.md).

``impyard serve`` over the fake Discord: the real discord.py client, the real box (process backend) with memory
on and the gateway embedder, the real gateway, session manager and host memory store. The guild has a public
#general and a staff-only #staff (@everyone denied VIEW_CHANNEL; Bob, Carol and the bot allowed), as Discord sends
it in CHANNEL_CREATE. What is said in #staff is kept in ``channel:<staff>``: no model request of a #general
session or of Carol's DM — reply, filter, appraisal, summary, embedding — carries it, though Carol is staff, and
presence never names #staff there. #staff reads the guild's public memory; the DM of someone who spoke in
#general reads it too. And an old home: a channel the host knew before it read audiences, found private, takes
its memories to its own scope once; a warm box of a channel made private keeps its next memories there.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from impyard.cli import cli
from impyard.memory.scopes import SessionScopes
from testing.fake_discord import FakeChannel, Overwrite, hidden_from_everyone
from testing.fake_openai import FakeOpenAI, RecordedRequest
from tests.discord_yard import (
    ALICE,
    BOB,
    CAROL,
    DM,
    GENERAL,
    GUILD,
    Yard,
    serving,
    until,
)
from tests.memory.conftest import moment
from tests.memory.test_privacy import GARDEN, MEMORY_PURPOSES, as_text, memory_block, say, script, store_of

pytestmark = pytest.mark.anyio

STAFF = 1_050
SECRET = "ZX-4471"  # what the staff say; appraise() puts it in the conclusion (tests.memory.test_privacy)
GUILD_SCOPE = f"guild:{GUILD}"
STAFF_SCOPE = f"channel:{STAFF}"


def staff_only(yard: Yard) -> tuple[Overwrite, ...]:
    return hidden_from_everyone(GUILD, BOB, CAROL, yard.fake.bot_user)


def leaks(requests: list[RecordedRequest]) -> list[str | None]:
    return [r.purpose for r in requests if SECRET.lower() in as_text(r).lower()]


def replies(requests: list[RecordedRequest]) -> list[str]:
    return [memory_block(r) for r in requests if r.purpose == "reply"]


async def test_what_staff_say_never_reaches_general_nor_a_dm(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    script(model)
    async with serving(monkeypatch, model, answer=None, trusted=(GENERAL, STAFF),
                       pip={"memory": {"enabled": True}}) as yard:  # fmt: skip
        store = store_of(yard)
        yard.fake.add_channel(FakeChannel(STAFF, "staff", overwrites=staff_only(yard)), GUILD)
        await say(yard, GENERAL, CAROL, f"I spent the morning in the {GARDEN} again")
        await until(lambda: store.count("pip", [GUILD_SCOPE]) >= 1)
        model.clear()
        await say(yard, STAFF, CAROL, f"between us staff: the passport number is {SECRET}")
        staff_requests = model.requests
        await until(lambda: any(SECRET in r.conclusion for r in store.show("pip", scope=STAFF_SCOPE)))

        model.clear()  # from here on, only #general's sessions and Carol's DM call the model
        await say(yard, GENERAL, ALICE, "pip, what is the passport number the staff talked about?")
        await say(yard, GENERAL, BOB, "pip, the staff told you a passport number, didn't they?")
        for n in range(4):  # her fourth moment in #general makes the summary due (mechanism 44)
            await say(yard, GENERAL, CAROL, f"pip, do you remember the passport number? ({n})")
        general_requests = model.requests
        model.clear()
        await say(yard, DM, CAROL, "pip, what was that passport number from the staff room?")
        dm_requests = model.requests
        guild_records = store.show("pip", scope=GUILD_SCOPE, limit=500, episodes=10)

    shown_staff = CliRunner().invoke(cli, ["memory", "show", "pip", "--scope", STAFF_SCOPE, "--json"])
    shown_guild = CliRunner().invoke(cli, ["memory", "show", "pip", "--scope", GUILD_SCOPE, "--json"])

    # #staff kept it in its own scope, and read the guild's public memory while it was told.
    assert shown_staff.exit_code == 0, shown_staff.output
    assert SECRET in shown_staff.output
    assert {r["scope"] for r in json.loads(shown_staff.output)} == {STAFF_SCOPE}
    assert replies(staff_requests) and GARDEN in replies(staff_requests)[0]

    # Every memory purpose ran in #general, and none of them — nor Carol's DM, though she is staff — carried it.
    assert set(MEMORY_PURPOSES) <= {r.purpose for r in general_requests}
    assert leaks(general_requests) == [] and leaks(dm_requests) == []
    assert all(SECRET not in r.conclusion and all(SECRET not in e.as_happened for e in r.episodes)
               for r in guild_records)  # fmt: skip
    assert shown_guild.exit_code == 0 and SECRET not in shown_guild.output and GARDEN in shown_guild.output

    # The public way still works: Carol spoke in #general, so her DM reads the guild's memory.
    assert replies(dm_requests) and GARDEN in replies(dm_requests)[0]
    # Presence (mechanism 10): #staff's conversation is never listed outside it.
    assert replies(general_requests) and not any("#staff" in block for block in replies(general_requests))
    assert not any("#staff" in block for block in replies(dm_requests))


async def test_an_old_channel_found_private_takes_its_memories_along(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    """The upgrade: #staff was known (and wrote the guild's scope) before the host read audiences; when Discord
    says it is private (here CHANNEL_UPDATE; at ready, GUILD_CREATE) its memories move to ``channel:<staff>``,
    once. The box that was warm there keeps its next memory in the new scope too."""
    script(model)
    async with serving(monkeypatch, model, answer=None, trusted=(GENERAL, STAFF),
                       pip={"memory": {"enabled": True}}) as yard:  # fmt: skip
        store = store_of(yard)
        await say(yard, GENERAL, ALICE, f"the {GARDEN} is lovely today")
        yard.fake.add_channel(FakeChannel(STAFF, "staff"), GUILD)  # public for now
        await say(yard, STAFF, CAROL, f"the passport number is {SECRET}")
        await until(lambda: any(SECRET in r.conclusion for r in store.show("pip", scope=GUILD_SCOPE)))
        # As a home from before revision 0005 has it: channels recorded, none with an audience.
        db = yard.rt.gateway.db
        db.write(lambda conn: conn.execute(text("UPDATE channels SET audience = NULL")))

        yard.fake.update_channel(STAFF, overwrites=staff_only(yard))  # CHANNEL_UPDATE: staff only from now on
        # Moved as Discord said so, before anyone speaks there again.
        await until(lambda: any(SECRET in r.conclusion for r in store.show("pip", scope=STAFF_SCOPE)))
        await say(yard, STAFF, BOB, "the rota for next week is done")  # the same warm box as before
        await until(lambda: any(r.author == "bob" for r in store.show("pip", scope=STAFF_SCOPE)))
        staff_after = store.show("pip", scope=STAFF_SCOPE, limit=50)
        guild_after = store.show("pip", scope=GUILD_SCOPE, limit=50)
        model.clear()
        await say(yard, GENERAL, ALICE, "pip, what is the passport number?")
        general_requests = model.requests

    # Moved when #staff was first found private; the warm box's next memory (Bob's) is kept there as well.
    assert sorted(r.author for r in staff_after) == ["bob", "carol"]
    assert any(SECRET in r.conclusion for r in staff_after)
    assert not any(SECRET in r.conclusion for r in guild_after)
    assert [r.author for r in guild_after] == ["alice"]  # #general's stayed where it was
    assert leaks(general_requests) == []
    shown = CliRunner().invoke(cli, ["memory", "show", "pip", "--scope", STAFF_SCOPE, "--json"])
    assert shown.exit_code == 0 and SECRET in shown.output


async def test_the_first_message_of_a_channel_found_private_moves_its_memories(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    """The same move, when the first word of the channel's audience comes with a message."""
    script(model)
    async with serving(monkeypatch, model, answer=None, trusted=(GENERAL, STAFF),
                       pip={"memory": {"enabled": True}}) as yard:  # fmt: skip
        store = store_of(yard)
        yard.fake.add_channel(FakeChannel(STAFF, "staff", overwrites=staff_only(yard)), GUILD)
        await say(yard, STAFF, BOB, "good morning")
        # What a home from before revision 0005 holds: #staff's moment in the guild's scope, no audience recorded.
        public = SessionScopes(GUILD_SCOPE, (GUILD_SCOPE,))
        store.scoped("pip", public, str(STAFF)).encode(
            moment(f"the old staff plan: {SECRET}", message_id="old-1")
        )
        db = yard.rt.gateway.db
        db.write(lambda conn: conn.execute(text("UPDATE channels SET audience = NULL")))
        assert any(SECRET in r.conclusion for r in store.show("pip", scope=GUILD_SCOPE))
        await say(yard, STAFF, CAROL, "anything new?")
        guild_after = store.show("pip", scope=GUILD_SCOPE, limit=50)
        staff_after = store.show("pip", scope=STAFF_SCOPE, limit=50)
    assert not any(SECRET in r.conclusion for r in guild_after)
    assert any(r.conclusion == f"the old staff plan: {SECRET}" for r in staff_after)


async def test_at_ready_the_known_channels_audiences_are_read(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    """On READY (``DiscordHost.ready``, what discord.py calls once GUILD_CREATE has filled its cache) the host reads
    the audiences of the channels it knows: an old home's private channel moves its memories at once."""
    script(model)
    async with serving(monkeypatch, model, answer=None, trusted=(GENERAL, STAFF),
                       pip={"memory": {"enabled": True}}) as yard:  # fmt: skip
        store = store_of(yard)
        yard.fake.add_channel(FakeChannel(STAFF, "staff", overwrites=staff_only(yard)), GUILD)
        await say(yard, STAFF, BOB, "good morning")
        public = SessionScopes(GUILD_SCOPE, (GUILD_SCOPE,))
        store.scoped("pip", public, str(STAFF)).encode(
            moment(f"the old staff plan: {SECRET}", message_id="old-1")
        )
        yard.rt.gateway.db.write(lambda conn: conn.execute(text("UPDATE channels SET audience = NULL")))
        yard.host.ready(yard.host.clients["pip"])
        await until(lambda: any(SECRET in r.conclusion for r in store.show("pip", scope=STAFF_SCOPE)))
        general = yard.rt.channels.info(str(GENERAL))
    assert not any(SECRET in r.conclusion for r in store.show("pip", scope=GUILD_SCOPE))
    assert general is not None and general.audience == "guild"  # a known public channel: recorded too
