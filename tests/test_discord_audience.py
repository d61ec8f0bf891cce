"""Who can read a channel (issue 32 #4): the fake Discord's permission overwrites, as the real discord.py client
reads them, and ``audience_of`` on the host.

The fake sends ``permission_overwrites`` as Discord does (GUILD_CREATE, CHANNEL_CREATE, CHANNEL_UPDATE; none on a
thread; private threads only to their members), works permissions out as Discord does, and refuses what Discord
refuses. ``audience_of`` reads the channel as discord.py cached it: ``guild`` when everyone in the server can read
it, ``private`` when fewer can.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import discord
import pytest

from impyard.discord.client import wanted_intents
from impyard.discord.inbound import audience_of, to_inbound
from impyard.discord.presence import status_text
from testing.fake_discord import (
    ChannelType,
    FakeChannel,
    FakeDiscord,
    FakeGuild,
    FakeRole,
    FakeUser,
    Overwrite,
    Perm,
    hidden_from_everyone,
    member,
)

pytestmark = pytest.mark.anyio

GUILD = 1_000
GENERAL, STAFF, NO_NEWBIES, LOCKED, NEWS = 1_001, 1_002, 1_003, 1_004, 1_005
GENERAL_THREAD, STAFF_THREAD, SECRET_THREAD, NEWBIE_THREAD = 1_010, 1_011, 1_012, 1_013
ADDED_LATER = 1_020
DM = 1_100
STAFF_ROLE = FakeRole(1_300, "staff")
NEWBIES = FakeRole(1_301, "newbies")
ALICE = FakeUser(2_001, "alice")  # owner
BOB = FakeUser(2_002, "bob")  # staff
CAROL = FakeUser(2_003, "carol")  # a newbie
DAVE = FakeUser(2_004, "dave")  # an ordinary member
VIEW = int(Perm.VIEW_CHANNEL)


def guild(bot: FakeUser) -> FakeGuild:
    return FakeGuild(
        GUILD, "the yard", owner_id=ALICE.id, roles=[STAFF_ROLE, NEWBIES],
        members=[member(ALICE), member(BOB, roles=[STAFF_ROLE.id]), member(CAROL, roles=[NEWBIES.id]), member(DAVE)],
        channels=[
            FakeChannel(GENERAL, "general"),
            FakeChannel(STAFF, "staff", overwrites=hidden_from_everyone(GUILD, STAFF_ROLE, bot)),
            FakeChannel(NO_NEWBIES, "no-newbies", overwrites=(Overwrite.role(NEWBIES, deny=VIEW),)),
            FakeChannel(LOCKED, "locked", overwrites=hidden_from_everyone(GUILD, STAFF_ROLE)),  # the bot is out
            FakeChannel(NEWS, "news", type=ChannelType.GUILD_ANNOUNCEMENT),
            FakeChannel.thread(GENERAL_THREAD, "chat", parent_id=GENERAL, owner_id=DAVE.id),
            FakeChannel.thread(STAFF_THREAD, "rota", parent_id=STAFF, owner_id=BOB.id),
            FakeChannel.private_thread(SECRET_THREAD, "secret", parent_id=GENERAL, owner_id=DAVE.id, members=[bot]),
            FakeChannel.private_thread(NEWBIE_THREAD, "no bot", parent_id=GENERAL, owner_id=CAROL.id),
        ],
    )  # fmt: skip


@pytest.fixture
async def connected() -> AsyncIterator[tuple[FakeDiscord, discord.Client]]:
    bot = FakeUser(990_000_000_000_000_001, "impbot", bot=True)
    async with FakeDiscord(guilds=[guild(bot)], dms=[FakeChannel.dm(DM, DAVE)]) as fake:
        assert fake.bot_user == bot
        client = discord.Client(intents=wanted_intents())
        async with fake.connected(client):
            yield fake, client


async def arrive(
    fake: FakeDiscord, client: discord.Client, channel: int, who: FakeUser, text: str
) -> discord.Message:
    waiting = client.wait_for("message", check=lambda m: m.channel.id == channel, timeout=5)
    fake.post_message(channel, who, text)
    return await waiting


async def test_audience_follows_the_overwrites_discord_sends(
    connected: tuple[FakeDiscord, discord.Client],
) -> None:
    fake, client = connected
    expected = {
        GENERAL: "guild",
        STAFF: "private",  # @everyone denied VIEW_CHANNEL, the staff role and the bot allowed
        NO_NEWBIES: "private",  # everyone but one role: narrower than the server
        NEWS: "guild",
        GENERAL_THREAD: "guild",  # a public thread of a public channel
        STAFF_THREAD: "private",  # a public thread of a private channel
        SECRET_THREAD: "private",  # a private thread, though its parent is public
    }
    got: dict[int, Any] = {}
    for channel in expected:
        who = BOB if channel in (STAFF, STAFF_THREAD) else DAVE
        message = await arrive(fake, client, channel, who, "hello")
        inbound = await to_inbound(message, bot_user_id=fake.bot_user.id)
        got[channel] = inbound.audience
        assert audience_of(message.channel) == inbound.audience
    assert got == expected
    dm = await to_inbound(await arrive(fake, client, DM, DAVE, "hi"), bot_user_id=fake.bot_user.id)
    assert (dm.channel_kind, dm.audience) == ("dm", None)


async def test_the_audience_changes_with_channel_update(
    connected: tuple[FakeDiscord, discord.Client],
) -> None:
    fake, client = connected
    before = await to_inbound(await arrive(fake, client, GENERAL, DAVE, "open"), bot_user_id=fake.bot_user.id)
    fake.update_channel(GENERAL, overwrites=hidden_from_everyone(GUILD, fake.bot_user, DAVE))
    after = await to_inbound(
        await arrive(fake, client, GENERAL, DAVE, "closed"), bot_user_id=fake.bot_user.id
    )
    fake.update_channel(GENERAL, overwrites=())
    again = await to_inbound(
        await arrive(fake, client, GENERAL, DAVE, "open again"), bot_user_id=fake.bot_user.id
    )
    assert (before.audience, after.audience, again.audience) == ("guild", "private", "guild")
    # CHANNEL_CREATE carries them too.
    fake.add_channel(
        FakeChannel(ADDED_LATER, "mods", overwrites=hidden_from_everyone(GUILD, fake.bot_user)), GUILD
    )
    created = await arrive(fake, client, ADDED_LATER, ALICE, "new")  # the owner sees every channel
    assert audience_of(created.channel) == "private"


async def test_what_a_bot_cannot_see_never_reaches_it(connected: tuple[FakeDiscord, discord.Client]) -> None:
    fake, client = connected
    bot = fake.bot_user
    # Permissions as Discord works them out.
    assert fake.can_view(STAFF, BOB) and fake.can_view(STAFF, bot) and not fake.can_view(STAFF, DAVE)
    assert fake.can_view(STAFF, ALICE)  # the owner
    assert not fake.can_view(NO_NEWBIES, CAROL) and fake.can_view(NO_NEWBIES, DAVE)
    assert fake.can_view(SECRET_THREAD, bot) and not fake.can_view(SECRET_THREAD, BOB)
    assert not fake.can_view(LOCKED, bot) and not fake.can_view(NEWBIE_THREAD, bot)
    # GUILD_CREATE: every channel, but only the threads the bot can see.
    assert client.get_channel(LOCKED) is not None
    assert client.get_channel(SECRET_THREAD) is not None and client.get_channel(NEWBIE_THREAD) is None
    # A message where the bot cannot see is not sent to it; the next one it can see arrives first.
    fake.post_message(LOCKED, BOB, "staff only, without the bot")
    seen = await arrive(fake, client, GENERAL, DAVE, "after")
    assert seen.content == "after"
    # A member cannot post where they cannot see; the bot's REST calls there are refused 403 (Missing Access).
    with pytest.raises(ValueError, match="cannot see"):
        fake.post_message(STAFF, DAVE, "let me in")
    locked = client.get_channel(LOCKED)
    assert isinstance(locked, discord.TextChannel)
    with pytest.raises(discord.Forbidden) as refused:
        await locked.send("hello?")
    assert refused.value.code == 50001


@pytest.mark.parametrize(
    ("channel", "why"),
    [
        (FakeChannel(50, "x", overwrites=(Overwrite(GUILD, type=2, deny=VIEW),)), "type is 0"),
        (FakeChannel(50, "x", overwrites=(Overwrite.role(4_242, deny=VIEW),)), "Unknown Role"),
        (FakeChannel(50, "x", overwrites=(Overwrite.member(4_243, allow=VIEW),)), "Unknown Member"),
        (FakeChannel(50, "x", overwrites=(Overwrite.role(GUILD, deny=VIEW),) * 2), "two overwrites"),
        (FakeChannel(50, "x", overwrites=(Overwrite.role(GUILD, deny=1 << 60),)), "no permission"),
        (
            FakeChannel(
                50,
                "t",
                type=ChannelType.PUBLIC_THREAD,
                parent_id=GENERAL,
                overwrites=(Overwrite.role(GUILD, deny=VIEW),),
            ),
            "no permission_overwrites",
        ),  # fmt: skip
        (FakeChannel.private_thread(50, "t", parent_id=NEWS, owner_id=DAVE.id), "text channels only"),
        (FakeChannel.thread(50, "t", parent_id=GENERAL_THREAD), "parent must be a text channel"),
        (FakeChannel.thread(50, "t", parent_id=9_999), "parent must be a text channel"),
    ],
)
async def test_the_fake_refuses_what_discord_refuses(channel: FakeChannel, why: str) -> None:
    bot = FakeUser(990_000_000_000_000_001, "impbot", bot=True)
    async with FakeDiscord(guilds=[guild(bot)]) as fake:
        with pytest.raises(ValueError, match=why):
            fake.add_channel(channel, GUILD)
    whole = guild(bot)
    with pytest.raises(ValueError, match=why):  # in GUILD_CREATE's channels as well
        FakeDiscord(guilds=[FakeGuild(GUILD, "g", channels=[*whole.channels, channel], roles=whole.roles,
                                      members=whole.members)])  # fmt: skip


@pytest.mark.parametrize(
    ("audience", "text"),
    [
        ("guild", "talking in #general"),
        (None, "talking in #general"),
        ("private", "talking in a private channel"),
    ],
)
def test_the_bots_status_never_names_a_private_channel(audience: str | None, text: str) -> None:
    """The custom status (seed 003) is shown in every server and DM: a private channel's name is not for all."""
    assert status_text("guild", "general", audience) == text
