"""The Discord surface's pure rules and small parts: who may administer, settings, cards, logs, the log fallback."""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import discord
import pytest

from impyard.conversation.sessions import SessionKey, SessionManager
from impyard.discord.approval_cards import CUSTOM_ID, card_text
from impyard.discord.client import DiscordSettings, DiscordSetupError, wanted_intents
from impyard.discord.commands import admin_reason
from impyard.discord.serve import JsonLogFormatter, RedactTokens
from impyard.discord.surface import DiscordSurface, is_discord_channel
from impyard.gateway.gates import Gate
from impyard.gateway.surfaces import OutgoingFile, Post, SurfaceError

OWNERS = ["discord:42"]


@pytest.mark.parametrize(
    ("user_id", "guild_owner_id", "permissions", "expected"),
    [
        (42, None, None, "an owner of the imp"),  # an owner, even in a DM
        (42, 7, discord.Permissions.none(), "an owner of the imp"),
        (7, 7, discord.Permissions.none(), "the server owner"),
        (9, 7, discord.Permissions(administrator=True), "a server administrator"),
        (9, 7, discord.Permissions(manage_guild=True), "a member with Manage Server"),
        (
            9,
            7,
            discord.Permissions(manage_channels=True, manage_messages=True),
            None,
        ),  # other rights are not enough
        (9, 7, discord.Permissions.none(), None),
        (9, None, None, None),  # a stranger in a DM
    ],
)
def test_who_may_administer(
    user_id: int, guild_owner_id: int | None, permissions: discord.Permissions | None, expected: str | None
) -> None:
    assert (
        admin_reason(user_id=user_id, owners=OWNERS, guild_owner_id=guild_owner_id, permissions=permissions)
        == expected
    )


@pytest.mark.parametrize(
    ("environ", "problem"),
    [
        ({"IMPYARD_DISCORD_API_BASE": "discord.com/api"}, "must be an http(s) URL"),
        ({"IMPYARD_DISCORD_GUILD_READY_TIMEOUT": "soon"}, "seconds from 0 to 60"),
        ({"IMPYARD_DISCORD_GUILD_READY_TIMEOUT": "-1"}, "seconds from 0 to 60"),
    ],
)
def test_bad_settings_are_refused(environ: dict[str, str], problem: str) -> None:
    with pytest.raises(DiscordSetupError, match=re.escape(problem)):
        DiscordSettings.from_env(environ)


def test_settings_default_to_discord_itself() -> None:
    assert DiscordSettings.from_env({}) == DiscordSettings(api_base=None, guild_ready_timeout_s=2.0)
    custom = DiscordSettings.from_env(
        {
            "IMPYARD_DISCORD_API_BASE": "http://127.0.0.1:9/api/v10/",
            "IMPYARD_DISCORD_GUILD_READY_TIMEOUT": "0.1",
        }
    )
    assert custom == DiscordSettings(api_base="http://127.0.0.1:9/api/v10", guild_ready_timeout_s=0.1)


def test_intents_are_the_few_the_imp_needs() -> None:
    intents = wanted_intents()
    assert {name for name, on in intents if on} == {
        "guilds", "guild_messages", "dm_messages", "guild_reactions", "dm_reactions", "message_content",
    }  # fmt: skip
    assert not wanted_intents(message_content=False).message_content and not intents.members


@pytest.mark.parametrize(
    ("channel_id", "on_discord"),
    [
        ("1001", True),
        ("123456789012345678", True),
        ("task:pip", False),
        ("terminal:ann", False),
        ("", False),
        ("1" * 21, False),
    ],
)
def test_which_channels_are_discord_channels(channel_id: str, on_discord: bool) -> None:
    assert is_discord_channel(channel_id) is on_discord


@pytest.mark.anyio
async def test_task_log_posts_go_to_the_log_and_unknown_imps_are_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "impyard.posts")
    surface = DiscordSurface({})
    ids = await surface.send(
        Post("task:pip", "done: 3 items", None, (OutgoingFile("a.txt", b"x"),), "reply", "pip")
    )
    assert ids == ["log-1"]
    assert caplog.records[-1].getMessage() == "[task:pip] pip (reply): done: 3 items [files: a.txt]"
    with pytest.raises(SurfaceError, match="imp pix has no Discord bot connected"):
        await surface.send(Post("1001", "hi", imp="pix"))


def gate(state: str = "pending", **fields: object) -> Gate:
    now = datetime(2026, 5, 11, 9, 0, tzinfo=UTC)
    base: dict[str, object] = dict(
        id="g-0123456789ab", imp="pip", run_id="r1", session_channel="1001", origin_guild="1000",
        act="discord.send", target="1001", payload={"channel_id": "1001", "content": "hello @everyone\nsecond line", "files": []},
        payload_sha256="x", reason="the session's channel is not trusted", state=state, created_at=now,
        deadline=now + timedelta(hours=24),
    )  # fmt: skip
    base.update(fields)
    return Gate(**base)  # type: ignore[arg-type]


def test_a_card_shows_what_where_why_and_then_the_outcome() -> None:
    pending = card_text(gate())
    assert pending.startswith("**Approval needed** — gate `g-0123456789ab`")
    assert "**pip** wants to post in <#1001>" in pending and "not trusted" in pending
    assert "> hello @everyone\n> second line" in pending  # quoted; the card is posted with no pings allowed
    decided = card_text(gate("executed", decided_by="user:discord:42"))
    assert decided.startswith("**✅ Approved and posted by <@42>**")
    assert card_text(gate("denied", decided_by="operator:root")).startswith("**❌ Denied by operator:root**")
    assert card_text(gate("failed", error="Discord refused")).startswith(
        "**⚠️ Approved, but posting failed: Discord refused**"
    )
    long = card_text(gate(payload={"channel_id": "1001", "content": "x" * 5000}))
    assert len(long) <= 2000 and "…" in long
    assert CUSTOM_ID.fullmatch("impyard:gate:g-0123456789ab:approve") and not CUSTOM_ID.fullmatch(
        "impyard:gate:g-1:approve;drop"
    )


def test_tokens_never_reach_a_log_line() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "token is %s", ("tok-0123456789abcdef",), None)
    assert RedactTokens(["tok-0123456789abcdef"]).filter(record)
    assert record.getMessage() == "token is [redacted]"
    line = json.loads(JsonLogFormatter().format(record))
    assert line["message"] == "token is [redacted]" and line["level"] == "info" and line["logger"] == "x"


@pytest.mark.anyio
async def test_events_for_a_channel_without_a_live_box_are_dropped(tmp_path: Path) -> None:
    from box.protocol.models import MailboxEventParams

    async with SessionManager(plan=None, host=None, events=None) as sessions:  # type: ignore[arg-type]
        event = MailboxEventParams(kind="reaction_clear", channel_id="1001", message_id="5")
        assert await sessions.notify(SessionKey("pip", "1001"), "mailbox.event", event) is False
