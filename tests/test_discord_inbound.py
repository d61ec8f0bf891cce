"""The Discord adapter's two edges on real discord.py objects: a message → ``Inbound``, and ``DiscordSurface`` posts.

A plain discord.py client connected to the fake Discord; no runtime, no box.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import discord
import pytest

from impyard.discord.client import wanted_intents
from impyard.discord.inbound import skip_reason, to_inbound
from impyard.discord.surface import DiscordSurface
from impyard.gateway.surfaces import OutgoingFile, Post
from testing.fake_discord import (
    FakeAttachment,
    FakeChannel,
    FakeDiscord,
    FakeGuild,
    FakeRole,
    FakeUser,
    member,
)

pytestmark = pytest.mark.anyio

GUILD, GENERAL, THREAD, DM = 1_000, 1_001, 1_003, 1_100
PIP_ROLE = FakeRole(1_300, "Pip", managed=True)
OTHER_ROLE = FakeRole(1_301, "helpers")
ALICE = FakeUser(2_001, "alice", global_name="Alice A.")
PIX = FakeUser(3_001, "pix", bot=True)
PNG = b"\x89PNG\r\n\x1a\n" + bytes(16)  # enough of a PNG for the magic check


@pytest.fixture
async def connected() -> AsyncIterator[tuple[FakeDiscord, discord.Client]]:
    guild = FakeGuild(
        GUILD, "the yard", owner_id=ALICE.id, roles=[PIP_ROLE, OTHER_ROLE], members=[member(ALICE)],
        channels=[FakeChannel(GENERAL, "general"), FakeChannel.thread(THREAD, "a thread", parent_id=GENERAL)],
    )  # fmt: skip
    async with FakeDiscord(guilds=[guild], dms=[FakeChannel.dm(DM, ALICE)]) as fake:
        client = discord.Client(intents=wanted_intents())
        async with fake.connected(client):
            yield fake, client


async def arrive(
    fake: FakeDiscord, client: discord.Client, channel: int, *args: Any, **kwargs: Any
) -> discord.Message:
    waiting = client.wait_for("message", check=lambda m: m.channel.id == channel, timeout=5)
    fake.post_message(channel, *args, **kwargs)
    return await waiting


async def test_mentions_come_from_the_message_itself(connected: tuple[FakeDiscord, discord.Client]) -> None:
    fake, client = connected
    bot = fake.bot_user
    user = await arrive(fake, client, GENERAL, ALICE, f"hey {bot.mention}")
    role = await arrive(fake, client, GENERAL, ALICE, f"hey {PIP_ROLE.mention}")
    other_role = await arrive(fake, client, GENERAL, ALICE, f"hey {OTHER_ROLE.mention}")
    everyone = await arrive(fake, client, GENERAL, ALICE, "@everyone hey")
    facts = {}
    for name, message in (("user", user), ("role", role), ("other_role", other_role), ("everyone", everyone)):
        inbound = await to_inbound(message, bot_user_id=bot.id, bot_role_ids={PIP_ROLE.id})
        facts[name] = (
            inbound.mentions_imp,
            inbound.mentions_imp_role,
            inbound.mentions_everyone,
            inbound.message.mentions_imp,
        )
    assert facts == {
        "user": (True, False, False, True),
        "role": (False, True, False, True),
        "other_role": (False, False, False, False),
        "everyone": (False, False, True, False),  # mentioned_in() would have said yes (docs/architecture.md)
    }
    assert client.user is not None and client.user.mentioned_in(everyone)


async def test_channel_kinds_names_and_the_author(connected: tuple[FakeDiscord, discord.Client]) -> None:
    fake, client = connected
    in_guild = await to_inbound(
        await arrive(fake, client, GENERAL, ALICE, "hi"), bot_user_id=fake.bot_user.id
    )
    in_thread = await to_inbound(
        await arrive(fake, client, THREAD, ALICE, "hi"), bot_user_id=fake.bot_user.id
    )
    in_dm = await to_inbound(await arrive(fake, client, DM, ALICE, "hi"), bot_user_id=fake.bot_user.id)
    assert (in_guild.channel_id, in_guild.channel_kind, in_guild.channel_name, in_guild.guild_id) == (
        "1001",
        "guild",
        "general",
        "1000",
    )
    assert (in_thread.channel_id, in_thread.channel_kind, in_thread.channel_name) == (
        "1003",
        "guild",
        "a thread",
    )
    assert (in_dm.channel_id, in_dm.channel_kind, in_dm.guild_id) == ("1100", "dm", None)
    author = in_guild.message.author
    assert (author.id, author.name, author.bot, in_guild.surface) == (
        str(ALICE.id),
        "Alice A.",
        False,
        "discord",
    )


async def test_system_messages_are_skipped_and_bots_are_left_to_the_pipeline(
    connected: tuple[FakeDiscord, discord.Client],
) -> None:
    """Only what is not conversation is skipped here; bots are dropped once, by ``Conversations.route``."""
    fake, client = connected
    image = [FakeAttachment("cat.png", PNG)]
    human = await arrive(fake, client, GENERAL, ALICE, "hi", attachments=image)
    other_imp = await arrive(fake, client, GENERAL, PIX, "hi from another imp", attachments=image)
    webhook = await arrive(fake, client, GENERAL, ALICE, "via a webhook", webhook_id=55, attachments=image)
    joined = await arrive(fake, client, GENERAL, ALICE, "", extra={"type": 7})  # "alice joined the server"
    own = await arrive(fake, client, GENERAL, fake.bot_user, "my own post", attachments=image)
    bot_id = fake.bot_user.id
    assert [skip_reason(m) for m in (human, other_imp, webhook, joined, own)] == [
        None,
        None,
        None,
        "system",
        None,
    ]
    other_host_imp = FakeUser(2_002, "bob")  # an imp of this host whose user is not flagged a bot
    as_imp = await arrive(fake, client, GENERAL, other_host_imp, "hi", attachments=image)
    dropped = [
        await to_inbound(m, bot_user_id=bot_id, imp_user_ids={other_host_imp.id})
        for m in (other_imp, webhook, own, as_imp)
    ]
    fetches_for_dropped = len(fake.attachment_fetches)
    kept = await to_inbound(human, bot_user_id=bot_id, imp_user_ids={other_host_imp.id})
    assert [i.from_a_bot for i in dropped] == [True, True, True, True] and not kept.from_a_bot
    assert fetches_for_dropped == 0 and len(fake.attachment_fetches) == 1  # nothing fetched for a dropped one
    assert [i.message.attachments for i in dropped] == [[], [], [], []] and kept.message.attachments[
        0
    ].data_b64


async def test_the_surface_chunks_puts_files_last_and_pings_nobody(
    connected: tuple[FakeDiscord, discord.Client],
) -> None:
    fake, client = connected
    question = fake.post_message(GENERAL, ALICE, "a question")
    surface = DiscordSurface({"pip": client})
    text = "@everyone look. " + "\n\n".join("word " * 300 for _ in range(2))  # two chunks
    files = [OutgoingFile(f"f{n}.txt", f"file {n}".encode()) for n in range(12)]
    ids = await surface.send(Post(str(GENERAL), text, str(question.id), tuple(files), "reply", "pip"))
    posted = fake.messages(GENERAL)
    assert ids == [str(m.id) for m in posted] and len(posted) == 3
    assert [len(m.files) for m in posted] == [0, 10, 2]  # the last chunk carries the files; the rest follow
    assert [m.reference_id for m in posted] == [question.id, None, None]
    assert posted[0].payload["mention_everyone"] is False
    assert fake.calls("POST", f"/channels/{GENERAL}/messages")[0].body["allowed_mentions"]["parse"] == [
        "users"
    ]


async def test_the_typing_indicator_starts_and_stops(connected: tuple[FakeDiscord, discord.Client]) -> None:
    fake, client = connected
    surface = DiscordSurface({"pip": client})
    await surface.typing(str(GENERAL), True, imp="pip")
    await surface.typing(str(GENERAL), True, imp="pip")  # already showing: not sent again
    await surface.typing("task:pip", True, imp="pip")  # not a Discord channel: nothing to show
    assert len(fake.typing_calls(GENERAL)) == 1 and surface._typing
    await surface.typing(str(GENERAL), False, imp="pip")
    assert not surface._typing
    await surface.typing(str(GENERAL), False, imp="pip")  # stopping twice is harmless
