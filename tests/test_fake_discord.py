"""The loopback fake Discord, driven by the real discord.py client (docs/contributing.md)."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from typing import Any

import anyio
import discord
import pytest
from discord import app_commands

from testing.fake_discord import (
    CallbackType,
    FakeAttachment,
    FakeBot,
    FakeChannel,
    FakeDiscord,
    FakeGuild,
    FakeRole,
    FakeUser,
    Intent,
    Perm,
    member,
)

pytestmark = pytest.mark.anyio

GUILD = 1_000
GENERAL = 1_001
OWNERS = 1_002
THREAD = 1_003
DM = 1_100
HELPERS = FakeRole(1_200, "helpers")
ALICE = FakeUser(2_001, "alice")  # the guild owner
BOB = FakeUser(2_002, "bob")  # an administrator
CAROL = FakeUser(2_003, "carol")  # nobody in particular
WAIT_S = 5.0


def make_fake(**kwargs: Any) -> FakeDiscord:
    guild = FakeGuild(
        GUILD,
        "the yard",
        owner_id=ALICE.id,
        channels=[
            FakeChannel(GENERAL, "general"),
            FakeChannel(OWNERS, "owners"),
            FakeChannel.thread(THREAD, "a thread", parent_id=GENERAL, owner_id=ALICE.id),
        ],
        roles=[HELPERS],
        members=[member(ALICE), member(BOB, administrator=True), member(CAROL, roles=[HELPERS.id])],
    )
    return FakeDiscord(guilds=[guild], dms=[FakeChannel.dm(DM, CAROL)], **kwargs)


def make_client(*, message_content: bool = True, members: bool = False) -> discord.Client:
    intents = discord.Intents.default()
    intents.message_content = message_content
    intents.members = members
    return discord.Client(intents=intents)


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with make_fake() as running:
        yield running


def next_message(client: discord.Client, channel_id: int, *, from_user: int | None = None) -> Any:
    """Start waiting (now) for the next on_message in a channel; await the result later."""
    return client.wait_for(
        "message",
        check=lambda m: m.channel.id == channel_id and (from_user is None or m.author.id == from_user),
        timeout=WAIT_S,
    )


def text_channel(client: discord.Client, channel_id: int = GENERAL) -> discord.TextChannel:
    channel = client.get_channel(channel_id)
    assert isinstance(channel, discord.TextChannel)
    return channel


# --- connecting -------------------------------------------------------------------------------------------


async def test_client_connects_and_caches_guilds_channels_and_itself(fake: FakeDiscord) -> None:
    client = make_client()
    async with fake.connected(client):
        assert client.user is not None and client.user.id == fake.bot_user.id
        assert client.application_id == fake.application_id
        guild = client.get_guild(GUILD)
        assert guild is not None and guild.name == "the yard" and guild.owner_id == ALICE.id
        assert text_channel(client).name == "general"
        assert isinstance(client.get_channel(THREAD), discord.Thread)
        assert guild.me is not None and guild.me.id == fake.bot_user.id
        assert guild.get_role(HELPERS.id) is not None and guild.default_role.id == GUILD
        # Without the GUILD_MEMBERS intent Discord sends only the bot's own member.
        assert guild.get_member(ALICE.id) is None

    (identify,) = fake.identifies
    assert identify.accepted and identify.token_valid and identify.bot_user_id == fake.bot_user.id
    assert identify.intents == client.intents.value
    assert identify.intents & Intent.MESSAGE_CONTENT
    connect = fake.gateway_connects[0]
    assert connect.path == "/gateway" and connect.query["encoding"] == "json" and not connect.compressed
    me = fake.calls("GET", "/users/@me")[0]
    assert me.auth_present and me.auth_valid and me.status == 200
    assert "Authorization" not in me.headers and "User-Agent" in me.headers
    assert fake.calls("GET", "/oauth2/applications/@me")[0].status == 200  # login asks for the app
    assert fake.heartbeats >= 1  # discord.py beats once right after HELLO


async def test_members_intent_brings_every_member_and_their_permissions(fake: FakeDiscord) -> None:
    client = make_client(members=True)
    async with fake.connected(client):
        guild = client.get_guild(GUILD)
        assert guild is not None
        bob, carol, alice = guild.get_member(BOB.id), guild.get_member(CAROL.id), guild.get_member(ALICE.id)
        assert bob is not None and carol is not None and alice is not None
        assert bob.guild_permissions.administrator
        assert not carol.guild_permissions.administrator and not carol.guild_permissions.manage_guild
        assert alice.guild_permissions.manage_guild  # the owner holds everything
        assert HELPERS.id in [r.id for r in carol.roles]


async def test_wrong_token_is_a_login_failure(fake: FakeDiscord) -> None:
    client = make_client()
    with pytest.raises(discord.LoginFailure):
        async with fake.connected(client, token="not-the-token"):
            pytest.fail("logged in with a wrong token")
    (call,) = fake.calls("GET", "/users/@me")
    assert call.status == 401 and call.auth_present and not call.auth_valid
    assert not fake.identifies


async def test_privileged_intent_not_enabled_for_the_app_is_refused() -> None:
    async with make_fake(privileged_intents=0) as fake:
        with pytest.raises(discord.PrivilegedIntentsRequired):
            async with fake.connected(make_client(message_content=True)):
                pytest.fail("connected with a disallowed intent")
        assert fake.identifies[0].close_code == 4014


async def test_gateway_can_speak_zlib_stream() -> None:
    async with make_fake(gateway_compression=True) as fake:
        client = make_client()
        async with fake.connected(client):
            arriving = next_message(client, GENERAL)
            fake.post_message(GENERAL, ALICE, "compressed hello")
            assert (await arriving).content == "compressed hello"
        assert fake.gateway_connects[0].compressed
        assert fake.gateway_connects[0].query["compress"] == "zlib-stream"


# --- inbound messages -------------------------------------------------------------------------------------


async def test_injected_message_arrives_with_mentions_resolved(fake: FakeDiscord) -> None:
    client = make_client()
    async with fake.connected(client):
        arriving = next_message(client, GENERAL)
        posted = fake.post_message(
            GENERAL, CAROL, f"hey {fake.bot_user.mention} and {HELPERS.mention}, @everyone look"
        )
        message = await arriving
        assert client.user is not None
        assert message.id == posted.id and message.author.id == CAROL.id
        assert isinstance(message.author, discord.Member) and message.guild is not None
        assert [m.id for m in message.mentions] == [client.user.id]
        assert [r.id for r in message.role_mentions] == [HELPERS.id]
        assert message.mention_everyone

        # @everyone alone: mentioned_in() says yes, message.mentions says no (docs/architecture.md).
        arriving = next_message(client, GENERAL)
        fake.post_message(GENERAL, CAROL, "@everyone standup")
        everyone = await arriving
        assert everyone.mention_everyone and client.user.mentioned_in(everyone) and not everyone.mentions

        # Mentions can be given explicitly, whatever the content says.
        arriving = next_message(client, GENERAL)
        fake.post_message(GENERAL, CAROL, "no pings here", mentions=[fake.bot_user], mention_everyone=False)
        assert [m.id for m in (await arriving).mentions] == [client.user.id]


async def test_reply_chain_attachments_and_fetch(fake: FakeDiscord) -> None:
    client = make_client()
    async with fake.connected(client):
        first = fake.post_message(GENERAL, ALICE, "the question")
        arriving = next_message(client, GENERAL, from_user=BOB.id)
        fake.post_message(
            GENERAL,
            BOB,
            "see picture",
            referenced_message=first.id,
            attachments=[FakeAttachment("cat.png", b"\x89PNG fake", width=2, height=2)],
        )
        reply = await arriving
        assert reply.reference is not None and reply.reference.message_id == first.id
        assert isinstance(reply.reference.resolved, discord.Message)
        assert reply.reference.resolved.content == "the question"
        (picture,) = reply.attachments
        assert picture.filename == "cat.png" and picture.content_type == "image/png" and picture.size == 9
        assert await picture.read() == b"\x89PNG fake"  # served by the fake, as Discord's CDN would

        fetched = await text_channel(client).fetch_message(first.id)
        assert fetched.content == "the question"
        with pytest.raises(discord.NotFound):
            await text_channel(client).fetch_message(first.id + 999)


async def test_without_message_content_intent_only_mentions_and_dms_carry_text(fake: FakeDiscord) -> None:
    client = make_client(message_content=False)
    async with fake.connected(client):
        arriving = next_message(client, GENERAL)
        fake.post_message(GENERAL, CAROL, "ambient chatter")
        assert (await arriving).content == ""

        arriving = next_message(client, GENERAL)
        fake.post_message(GENERAL, CAROL, f"{fake.bot_user.mention} you there?")
        assert (await arriving).content.endswith("you there?")

        arriving = next_message(client, DM)
        fake.post_message(DM, CAROL, "a private word")
        assert (await arriving).content == "a private word"


async def test_dm_has_no_guild_and_the_reply_lands_in_the_dm(fake: FakeDiscord) -> None:
    client = make_client()
    async with fake.connected(client):
        arriving = next_message(client, DM)
        fake.post_message(DM, CAROL, "psst")
        message = await arriving
        assert message.guild is None and isinstance(message.channel, discord.DMChannel)
        await message.channel.send("hello carol")
    (sent,) = fake.messages(DM)
    assert sent.content == "hello carol" and sent.guild_id is None


# --- outbound messages ------------------------------------------------------------------------------------


async def test_send_and_reply_are_recorded_and_echoed(fake: FakeDiscord) -> None:
    client = make_client()
    async with fake.connected(client):
        assert client.user is not None
        arriving = next_message(client, GENERAL)
        question = fake.post_message(GENERAL, ALICE, "ping")
        message = await arriving
        echo = next_message(client, GENERAL, from_user=client.user.id)
        answer = await message.reply("pong")
        assert (await echo).id == answer.id  # Discord sends a bot its own messages too

    (sent,) = fake.messages(GENERAL)
    assert sent.id == answer.id and sent.content == "pong" and sent.author_id == fake.bot_user.id
    assert sent.reference_id == question.id and sent.payload["type"] == 19
    assert [m.id for m in fake.all_messages(GENERAL)] == [question.id, answer.id]
    call = fake.calls("POST", "/channels/*/messages")[0]
    assert int(call.body["message_reference"]["message_id"]) == question.id and call.auth_valid


async def test_send_with_a_file_is_multipart(fake: FakeDiscord) -> None:
    client = make_client()
    async with fake.connected(client):
        sent = await text_channel(client).send(
            "the log", file=discord.File(io.BytesIO(b"line 1\n"), "run.log")
        )
        assert sent.attachments[0].filename == "run.log"
        assert await sent.attachments[0].read() == b"line 1\n"
    (record,) = fake.messages(GENERAL)
    assert record.content == "the log"
    assert [(f.filename, f.data) for f in record.files] == [("run.log", b"line 1\n")]
    call = fake.calls("POST", "/channels/*/messages")[0]
    assert call.body["content"] == "the log" and "payload_json" in [p.name for p in call.parts]


async def test_typing_context_hits_the_typing_endpoint(fake: FakeDiscord) -> None:
    client = make_client()
    async with fake.connected(client):
        async with text_channel(client).typing():
            await fake.wait_for(lambda: fake.typing_calls(GENERAL))
        assert len(fake.typing_calls(GENERAL)) == 1 and not fake.typing_calls(OWNERS)


@pytest.mark.parametrize("global_", [False, True])
async def test_a_429_is_retried_and_the_message_posted_once(fake: FakeDiscord, global_: bool) -> None:
    client = make_client()
    async with fake.connected(client):
        fake.fail_next("POST", "/channels/*/messages", retry_after=0.05, global_=global_)
        await text_channel(client).send("after the wait")
    assert [m.content for m in fake.messages(GENERAL)] == ["after the wait"]
    limited, ok = fake.calls("POST", "/channels/*/messages")
    assert (limited.status, ok.status) == (429, 200)
    assert limited.response["retry_after"] == 0.05 and limited.response["global"] is global_


async def test_discord_limits_and_injected_errors_reach_the_client(fake: FakeDiscord) -> None:
    client = make_client()
    async with fake.connected(client):
        channel = text_channel(client)
        await channel.send("x" * 2000)
        with pytest.raises(discord.HTTPException) as too_long:
            await channel.send("x" * 2001)
        assert too_long.value.status == 400 and too_long.value.code == 50035
        fake.fail_next(
            "POST", "/channels/*/messages", 403, body={"message": "Missing Permissions", "code": 50013}
        )
        with pytest.raises(discord.Forbidden):
            await channel.send("not allowed")
        with pytest.raises(discord.HTTPException) as bad_command:
            await client.http.bulk_upsert_guild_commands(
                fake.application_id, GUILD, [{"name": "Not Valid", "description": "x"}]
            )
        assert bad_command.value.code == 50035
    assert [len(m.content) for m in fake.messages(GENERAL)] == [2000]


async def test_enforced_nonce_makes_a_retried_send_idempotent(fake: FakeDiscord) -> None:
    client = make_client()
    async with fake.connected(client):
        first = await text_channel(client).send("chunk 1", nonce="turn-7-chunk-1")
        again = await text_channel(client).send("chunk 1", nonce="turn-7-chunk-1")
    assert first.id == again.id and len(fake.messages(GENERAL)) == 1


async def test_each_imp_is_its_own_bot_and_sees_the_others_messages() -> None:
    other = FakeBot("other-token", FakeUser(3_001, "other-imp", bot=True), application_id=3_001)
    async with make_fake(other_bots=[other]) as fake:
        ours, theirs = make_client(), make_client()
        async with fake.connected(ours), fake.connected(theirs, token=other.token):
            assert theirs.user is not None and theirs.user.id == other.user.id
            arriving = next_message(ours, GENERAL, from_user=other.user.id)
            await text_channel(theirs).send(f"hello {fake.bot_user.mention}")
            message = await arriving
            assert message.author.bot and [m.id for m in message.mentions] == [fake.bot_user.id]
    assert [m.content for m in fake.messages(GENERAL, bot_user_id=other.user.id)] == [message.content]
    assert not fake.messages(GENERAL, bot_user_id=fake.bot_user.id)
    assert {i.bot_user_id for i in fake.identifies} == {fake.bot_user.id, other.user.id}


# --- interactions -----------------------------------------------------------------------------------------


def channel_commands(seen: asyncio.Queue[tuple[str, discord.Interaction]]) -> app_commands.Group:
    channel = app_commands.Group(name="channel", description="This channel's settings")
    mode = app_commands.Group(name="mode", description="When the imp answers", parent=channel)

    @mode.command(name="all", description="Answer every message")
    async def mode_all(interaction: discord.Interaction) -> None:
        await interaction.response.defer(ephemeral=True, thinking=True)
        await interaction.followup.send("mode is now all", ephemeral=True)
        seen.put_nowait(("mode all", interaction))

    @mode.command(name="mention", description="Answer only when mentioned")
    async def mode_mention(interaction: discord.Interaction) -> None:
        await interaction.response.defer()
        await interaction.edit_original_response(content="mode is now mention")
        seen.put_nowait(("mode mention", interaction))

    @channel.command(name="show", description="Show the settings")
    async def show(interaction: discord.Interaction, verbose: bool = False) -> None:
        await interaction.response.send_message(f"verbose={verbose}", ephemeral=True)
        seen.put_nowait(("show", interaction))

    return channel


async def test_command_tree_syncs_to_a_guild_and_slash_commands_dispatch(fake: FakeDiscord) -> None:
    client = make_client()
    tree = app_commands.CommandTree(client)
    seen: asyncio.Queue[tuple[str, discord.Interaction]] = asyncio.Queue()
    tree.add_command(channel_commands(seen), guild=discord.Object(GUILD))
    async with fake.connected(client):
        synced = await tree.sync(guild=discord.Object(GUILD))
        assert [c.name for c in synced] == ["channel"]
        (registered,) = fake.commands(GUILD)
        assert not fake.commands()  # nothing global
        assert [o["name"] for o in registered["options"]] == ["mode", "show"]

        invoked = fake.invoke_command("channel mode all", user=BOB, channel_id=GENERAL)
        name, interaction = await asyncio.wait_for(seen.get(), WAIT_S)
        assert name == "mode all" and interaction.id == invoked.id
        assert interaction.command is not None and interaction.command.qualified_name == "channel mode all"
        assert interaction.user.id == BOB.id and interaction.permissions.administrator
        deferred, followup = fake.interaction_responses(invoked)
        assert deferred.kind == "callback" and deferred.type == CallbackType.DEFERRED_CHANNEL_MESSAGE
        assert deferred.ephemeral and deferred.status == 200 and deferred.after_s < 3
        assert followup.kind == "followup" and followup.content == "mode is now all" and followup.ephemeral

        invoked = fake.invoke_command("channel mode mention", user=ALICE, channel_id=GENERAL)
        name, interaction = await asyncio.wait_for(seen.get(), WAIT_S)
        assert name == "mode mention" and interaction.permissions.manage_guild  # the owner
        deferred, edited = fake.interaction_responses(invoked)
        assert deferred.type == CallbackType.DEFERRED_CHANNEL_MESSAGE and not deferred.ephemeral
        assert edited.kind == "edit_original" and edited.content == "mode is now mention"
        original = fake.message(fake.interaction(invoked).original_message_id or 0)
        assert original.content == "mode is now mention" and original.flags == 0  # no longer "thinking"
        assert original in fake.all_messages(GENERAL)

        shown = fake.invoke_command(
            "channel show",
            {"verbose": True},
            user=CAROL,
            channel_id=GENERAL,
            member_permissions=Perm.MANAGE_GUILD,
        )
        name, interaction = await asyncio.wait_for(seen.get(), WAIT_S)
        assert name == "show" and interaction.permissions.manage_guild
        assert not interaction.permissions.administrator
        (answer,) = fake.interaction_responses(shown)
        assert answer.type == CallbackType.CHANNEL_MESSAGE and answer.content == "verbose=True"
    assert not fake.messages(GENERAL)  # ephemeral answers are not channel messages


async def test_an_interaction_acknowledged_too_late_is_unknown(fake: FakeDiscord) -> None:
    client = make_client()
    tree = app_commands.CommandTree(client)
    outcome: asyncio.Queue[BaseException | None] = asyncio.Queue()

    @tree.command(name="slow", description="Acknowledges too late")
    async def slow(interaction: discord.Interaction) -> None:
        try:
            await interaction.response.defer()
        except discord.NotFound as exc:
            outcome.put_nowait(exc)
        else:
            outcome.put_nowait(None)

    fake.interaction_ack_deadline_s = 0.0  # every acknowledgement is late
    async with fake.connected(client):
        await tree.sync()
        invoked = fake.invoke_command("slow", user=CAROL, channel_id=GENERAL)
        refused = await asyncio.wait_for(outcome.get(), WAIT_S)
    assert isinstance(refused, discord.NotFound) and refused.code == 10062
    assert fake.interaction_responses(invoked)[0].status == 404
    assert not fake.interaction(invoked).acknowledged


async def test_button_click_reaches_the_view(fake: FakeDiscord) -> None:
    clicked: asyncio.Queue[int] = asyncio.Queue()

    class Approval(discord.ui.View):
        @discord.ui.button(label="Approve", custom_id="gate:approve", style=discord.ButtonStyle.success)
        async def approve(
            self, interaction: discord.Interaction, button: discord.ui.Button[Approval]
        ) -> None:
            await interaction.response.edit_message(content="approved", view=None)
            clicked.put_nowait(interaction.user.id)

    client = make_client()
    async with fake.connected(client):
        card = await text_channel(client, OWNERS).send("approve the reply?", view=Approval(timeout=None))
        (record,) = fake.messages(OWNERS)
        assert record.components[0]["components"][0]["custom_id"] == "gate:approve"
        invoked = fake.click_button(card.id, "gate:approve", user=BOB)
        assert await asyncio.wait_for(clicked.get(), WAIT_S) == BOB.id
    (update,) = fake.interaction_responses(invoked)
    assert update.type == CallbackType.UPDATE_MESSAGE and update.status == 200
    assert fake.message(card.id).content == "approved" and fake.message(card.id).components == []
    with pytest.raises(LookupError):
        fake.click_button(card.id, "no-such-button", user=BOB)


def test_invoking_an_unregistered_command_is_refused() -> None:
    fake = make_fake()
    with pytest.raises(LookupError, match="sync"):
        fake.invoke_command("channel mode all", user=BOB, channel_id=GENERAL)


# --- connection trouble -----------------------------------------------------------------------------------


async def test_dropped_connection_resumes_and_replays_what_was_missed(fake: FakeDiscord) -> None:
    client = make_client()
    async with fake.connected(client):
        resumed = client.wait_for("resumed", timeout=WAIT_S)
        arriving = next_message(client, GENERAL)
        assert fake.drop_connection() == 1
        fake.post_message(GENERAL, ALICE, "said while you were away")  # buffered, replayed on RESUME
        assert (await arriving).content == "said while you were away"
        await resumed
        (resume,) = fake.resumes
        assert resume.accepted
        assert fake.gateway_connects[-1].path == "/gateway/resume"  # discord.py used resume_gateway_url

        arriving = next_message(client, GENERAL)
        fake.post_message(GENERAL, ALICE, "and after")
        assert (await arriving).content == "and after"
        await text_channel(client).send("still posting")

        resumed = client.wait_for("resumed", timeout=WAIT_S)
        fake.request_reconnect()  # op 7: Discord asks the client to reconnect, and it RESUMEs
        await resumed
        assert [r.accepted for r in fake.resumes] == [True, True]
    assert len(fake.identifies) == 1
    assert [m.content for m in fake.messages(GENERAL)] == ["still posting"]


async def test_unresumable_drop_makes_the_client_identify_again(fake: FakeDiscord) -> None:
    client = make_client()

    async def identify_at_once(shard_id: int | None, *, initial: bool = False) -> None:
        """discord.py's default hook sleeps 5 s before every identify but the first."""

    client.before_identify_hook = identify_at_once  # type: ignore[method-assign]
    async with fake.connected(client):
        ready_again = client.wait_for("ready", timeout=WAIT_S)
        fake.drop_connection(resumable=False)
        await ready_again
        assert [r.accepted for r in fake.resumes] == [False]
        assert len(fake.identifies) == 2
        arriving = next_message(client, GENERAL)
        fake.post_message(GENERAL, ALICE, "welcome back")
        assert (await arriving).content == "welcome back"


# --- lifecycle --------------------------------------------------------------------------------------------


async def test_start_and_stop_leave_no_tasks_behind() -> None:
    before = asyncio.all_tasks()
    async with make_fake() as fake:
        async with fake.connected(make_client()):
            pass
    assert asyncio.all_tasks() - before == set()
    assert fake.sessions_connected == 0


def test_thread_mode_serves_a_client_on_another_loop() -> None:
    with make_fake() as fake:

        async def main() -> str:
            client = make_client()
            async with fake.connected(client):
                arriving = next_message(client, GENERAL)
                fake.post_message(GENERAL, ALICE, "from another thread")  # injected across threads
                message = await arriving
                await message.channel.send("heard you")
                return message.content

        assert asyncio.run(main()) == "from another thread"
        assert fake.wait_for_sync(lambda: fake.messages(GENERAL))[0].content == "heard you"


async def test_new_thread_channel_reaches_the_client(fake: FakeDiscord) -> None:
    client = make_client()
    async with fake.connected(client):
        created = client.wait_for("thread_create", timeout=WAIT_S)
        fake.add_channel(FakeChannel.thread(1_004, "new topic", parent_id=GENERAL, owner_id=BOB.id), GUILD)
        thread = await created
        assert thread.id == 1_004 and thread.parent_id == GENERAL
        arriving = next_message(client, 1_004)
        fake.post_message(1_004, BOB, "in the thread")
        message = await arriving
        assert isinstance(message.channel, discord.Thread)
        await message.channel.send("answered in the thread")
    assert [m.content for m in fake.messages(1_004)] == ["answered in the thread"]


# --- shards -----------------------------------------------------------------------------------------------

EVEN_GUILD = 2_000 << 22  # (id >> 22) % 2 == 0: shard 0 of 2
ODD_GUILD = 2_001 << 22  # shard 1 of 2
EVEN_CHAN = 3_001
ODD_CHAN = 3_002


def make_sharded_fake(**kwargs: Any) -> FakeDiscord:
    guilds = [
        FakeGuild(EVEN_GUILD, "even", owner_id=ALICE.id, channels=[FakeChannel(EVEN_CHAN, "general")],
                  members=[member(ALICE), member(BOB)]),
        FakeGuild(ODD_GUILD, "odd", owner_id=BOB.id, channels=[FakeChannel(ODD_CHAN, "general")],
                  members=[member(ALICE), member(BOB)]),
    ]  # fmt: skip
    return FakeDiscord(guilds=guilds, dms=[FakeChannel.dm(DM, CAROL)], **kwargs)


def sharded_client(shard_id: int | None, shard_count: int | None) -> tuple[discord.Client, list[int]]:
    """A client on one shard, and the channels of every message it is sent, in order."""
    client = discord.Client(intents=discord.Intents.default(), shard_id=shard_id, shard_count=shard_count)
    heard: list[int] = []

    async def on_message(message: discord.Message) -> None:
        heard.append(message.channel.id)

    client.event(on_message)
    return client, heard


async def heard_all(done: Any) -> None:
    """Until the clients' handlers (which the fake does not see) have run."""
    with anyio.fail_after(WAIT_S):
        while not done():
            await anyio.sleep(0.01)


async def test_each_shard_gets_only_its_guilds_and_dms_go_to_shard_zero() -> None:
    async with make_sharded_fake() as fake:
        zero, zero_heard = sharded_client(0, 2)
        one, one_heard = sharded_client(1, 2)
        async with fake.connected(zero), fake.connected(one):
            assert [g.id for g in zero.guilds] == [EVEN_GUILD] and [g.id for g in one.guilds] == [ODD_GUILD]
            assert sorted(i.shard for i in fake.identifies if i.shard) == [(0, 2), (1, 2)]
            assert fake.shards_connected == [(0, 2), (1, 2)]
            for channel in (ODD_CHAN, DM, EVEN_CHAN, ODD_CHAN):
                fake.post_message(channel, CAROL if channel == DM else ALICE, "hello")
            await heard_all(lambda: len(zero_heard) == 2 and len(one_heard) == 2)
            interacted = one.wait_for("interaction", timeout=WAIT_S)
            fake.invoke_command("ping", user=ALICE, channel_id=ODD_CHAN, require_registered=False)
            assert (await interacted).guild_id == ODD_GUILD
            in_dm = zero.wait_for("interaction", timeout=WAIT_S)
            fake.invoke_command("ping", user=CAROL, channel_id=DM, require_registered=False)
            assert (await in_dm).channel_id == DM
            await one.change_presence(activity=discord.CustomActivity(name="on shard one"))
            await fake.wait_for(lambda: fake.presence_updates)
            fake.post_message(EVEN_CHAN, ALICE, "last")  # events to one session arrive in order
            await heard_all(lambda: len(zero_heard) == 3)
        assert zero_heard == [DM, EVEN_CHAN, EVEN_CHAN] and one_heard == [ODD_CHAN, ODD_CHAN]
        assert [(p.shard, p.custom_status) for p in fake.presence_updates] == [((1, 2), "on shard one")]


async def test_broadcasting_sends_every_shard_every_guild_and_dm_but_an_interaction_to_one() -> None:
    """Issue 36's misrouting gateway: ``broadcast_to_every_shard`` ignores the shard rule for guilds, messages and
    DMs (the rule's test above is what it departs from); an interaction still reaches one session."""
    async with make_sharded_fake() as fake:
        fake.broadcast_to_every_shard()
        zero, zero_heard = sharded_client(0, 2)
        one, one_heard = sharded_client(1, 2)
        async with fake.connected(zero), fake.connected(one):
            for client in (zero, one):
                assert sorted(g.id for g in client.guilds) == [EVEN_GUILD, ODD_GUILD]
            for channel in (ODD_CHAN, DM, EVEN_CHAN):
                fake.post_message(channel, CAROL if channel == DM else ALICE, "hello")
            await heard_all(lambda: len(zero_heard) == 3 and len(one_heard) == 3)
            interactions: list[int] = []

            async def on_interaction(interaction: discord.Interaction) -> None:
                interactions.append(interaction.id)

            for client in (zero, one):
                client.event(on_interaction)
            fake.invoke_command("ping", user=ALICE, channel_id=ODD_CHAN, require_registered=False)
            await heard_all(lambda: interactions)
            fake.broadcast_to_every_shard(False)
            fake.post_message(ODD_CHAN, ALICE, "by the rule again")
            await heard_all(lambda: len(one_heard) == 4)
        assert zero_heard == one_heard[:3] == [ODD_CHAN, DM, EVEN_CHAN] and one_heard[3] == ODD_CHAN
        assert len(zero_heard) == 3 and len(interactions) == 1


async def test_an_unsharded_client_still_gets_every_guild_and_the_dms() -> None:
    async with make_sharded_fake() as fake:
        client, heard = sharded_client(None, None)
        async with fake.connected(client):
            assert sorted(g.id for g in client.guilds) == [EVEN_GUILD, ODD_GUILD]
            fake.post_message(ODD_CHAN, ALICE, "hello")
            fake.post_message(DM, CAROL, "psst")
            await heard_all(lambda: len(heard) == 2)
        assert heard == [ODD_CHAN, DM] and fake.identifies[0].shard is None


@pytest.mark.parametrize(("shard_id", "shard_count"), [(2, 2), (5, 2), (0, 0), (-1, 2)])
async def test_an_invalid_shard_is_refused_with_4010(shard_id: int, shard_count: int) -> None:
    async with make_sharded_fake() as fake:
        client, _ = sharded_client(shard_id, shard_count)
        with pytest.raises(discord.ConnectionClosed) as closed:
            async with fake.connected(client):
                pytest.fail("connected as an invalid shard")
        assert closed.value.code == 4010
        (identify,) = fake.identifies
        assert identify.close_code == 4010 and not identify.accepted and fake.sessions_connected == 0


@pytest.mark.parametrize("shard", [["0", "2"], [0], [0, 2, 1], [True, 2], "0/2", {"id": 0}])
async def test_a_shard_field_of_another_shape_is_refused_with_4010(shard: Any) -> None:
    import aiohttp

    async with make_sharded_fake() as fake, aiohttp.ClientSession() as http:
        async with http.ws_connect(fake.gateway_url + "?v=10&encoding=json") as ws:
            hello = await ws.receive_json()
            assert hello["op"] == 10
            identify = {"token": fake.token, "intents": 513, "properties": {}, "shard": shard}
            await ws.send_json({"op": 2, "d": identify})
            assert (await ws.receive()).type == aiohttp.WSMsgType.CLOSE
            assert ws.close_code == 4010
    assert [i.close_code for i in fake.identifies] == [4010]


async def test_too_many_guilds_for_one_session_is_refused_with_4011_until_sharded() -> None:
    async with make_sharded_fake(max_guilds_per_shard=1) as fake:
        unsharded, _ = sharded_client(None, None)
        with pytest.raises(discord.ConnectionClosed) as closed:
            async with fake.connected(unsharded):
                pytest.fail("one session held two guilds past the limit")
        assert closed.value.code == 4011
        sharded, _ = sharded_client(1, 2)
        async with fake.connected(sharded):
            assert [g.id for g in sharded.guilds] == [ODD_GUILD]
        assert [i.close_code for i in fake.identifies] == [4011, None]


async def test_gateway_bot_recommends_a_shard_per_thousand_guilds() -> None:
    many = [FakeGuild((n + 1) << 22, f"g{n}") for n in range(1_001)]
    async with FakeDiscord(guilds=many) as fake, make_fake() as small:
        for running, shards in ((fake, 2), (small, 1)):
            client = make_client()
            with running.patch_discord():
                await client.login(running.token)
                try:
                    recommended, url, _limits = await client.http.get_bot_gateway()
                finally:
                    await client.close()
            assert (recommended, url) == (shards, running.gateway_url)
