"""A running ``impyard serve`` host against the loopback fake Discord and the fake OpenAI, for the Discord tests.

Real parts: the discord.py client, the box program (in this process, ``testing.inprocess``, unless a test
passes another backend), the gateway, SQLite under the test's IMPYARD_HOME. The guild: ALICE owns it, BOB is an administrator,
CAROL, DAVE and ERIN are members with no rights, OLIVE is pip's configured owner (no server rights).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import pytest

from impyard.backends import BoxBackend
from impyard.conversation.sessions import Delivery
from impyard.discord.client import DiscordSettings
from impyard.discord.serve import DiscordHost, open_discord_host
from impyard.imps.store import ImpStore
from testing.fake_discord import (
    FakeBot,
    FakeChannel,
    FakeDiscord,
    FakeGuild,
    FakeUser,
    member,
)
from testing.fake_openai import FakeOpenAI, envelope
from testing.inprocess import InProcessBackend

T = TypeVar("T")

GUILD = 1_000
GENERAL = 1_001
OWNERS = 1_002
THREAD = 1_003
QUIET = 1_004  # a channel tests put in mention mode
DM = 1_100
ALICE = FakeUser(2_001, "alice")
BOB = FakeUser(2_002, "bob")
CAROL = FakeUser(2_003, "carol")
DAVE = FakeUser(2_004, "dave")
ERIN = FakeUser(2_005, "erin")
OLIVE = FakeUser(2_009, "olive")
PIX = FakeBot("pix-token-0123456789", FakeUser(3_001, "pix", bot=True), application_id=3_001)
WAIT_S = 20.0


def make_fake(**kwargs: Any) -> FakeDiscord:
    guild = FakeGuild(
        GUILD,
        "the yard",
        owner_id=ALICE.id,
        channels=[
            FakeChannel(GENERAL, "general"),
            FakeChannel(OWNERS, "owners"),
            FakeChannel(QUIET, "quiet"),
            FakeChannel.thread(THREAD, "a thread", parent_id=GENERAL, owner_id=ALICE.id),
        ],
        members=[
            member(ALICE),
            member(BOB, administrator=True),
            member(CAROL),
            member(DAVE),
            member(ERIN),
            member(OLIVE),
        ],
    )
    kwargs.setdefault("token", "pip-token-0123456789")
    return FakeDiscord(guilds=[guild], dms=[FakeChannel.dm(DM, CAROL)], **kwargs)


def add_pip(**settings: Any) -> None:
    settings.setdefault("owners", [f"discord:{OLIVE.id}"])
    settings.setdefault("discord", {"owner_channel": str(OWNERS)})
    ImpStore().add("pip", "You are Pip.", **settings)


@dataclass
class Yard:
    fake: FakeDiscord
    openai: FakeOpenAI
    host: DiscordHost

    @property
    def rt(self) -> Any:
        return self.host.runtime

    def spy(self) -> list[Delivery]:
        """What the session manager is handed (framing among it)."""
        seen: list[Delivery] = []
        original = self.rt.sessions.deliver

        def deliver(delivery: Delivery) -> str:
            seen.append(delivery)
            return original(delivery)

        self.rt.sessions.deliver = deliver
        return seen

    async def answered(self, message_id: int) -> None:
        """Until the turn that answers this message has ended."""
        with anyio.fail_after(WAIT_S):
            await self.rt.conversations.wait_finished(str(message_id))

    async def stored(self, channel_id: int, message_id: int) -> None:
        """Until the inbound worker has put the message in the history (woken or not)."""
        await until(lambda: self.rt.history.get(str(channel_id), str(message_id)))

    async def posted(self, channel_id: int, count: int = 1) -> list[Any]:
        return await self.fake.wait_for(
            lambda: len(self.fake.messages(channel_id)) >= count and self.fake.messages(channel_id), WAIT_S
        )


async def until(predicate: Callable[[], T], timeout: float = WAIT_S) -> T:
    with anyio.fail_after(timeout):
        while not (value := predicate()):
            await anyio.sleep(0.02)
    return value


def settings_for(fake: FakeDiscord) -> DiscordSettings:
    return DiscordSettings(api_base=fake.api_base, guild_ready_timeout_s=0.05)


@asynccontextmanager
async def serving(
    monkeypatch: pytest.MonkeyPatch,
    model: FakeOpenAI,
    *,
    answer: str | None = "hello there",
    trusted: Sequence[int] = (GENERAL, THREAD),
    backend: BoxBackend | None = None,
    fake_kwargs: dict[str, Any] | None = None,
    pip: dict[str, Any] | None = None,
    **options: Any,
) -> AsyncIterator[Yard]:
    """pip on the fake Discord, served in-process; ``answer`` is scripted as its reply (None: script your own)."""
    if answer is not None:
        model.script(envelope(answer=answer, answer_needed=True))
    add_pip(**(pip or {}))
    async with make_fake(**(fake_kwargs or {})) as fake:
        monkeypatch.setenv("IMPYARD_DISCORD_TOKEN_PIP", fake.token)
        with fake.patch_discord():  # puts Route.BASE and the gateway back afterwards
            async with open_discord_host(
                ["pip"], settings=settings_for(fake), backends={"pip": backend or InProcessBackend()},
                ready_timeout_s=10, **options,
            ) as host:  # fmt: skip
                for channel in trusted:
                    host.runtime.channels.set_trusted(str(channel), True)
                yield Yard(fake, model, host)
