"""The imp's Discord status after a successful turn (seed 003: a post-success side-effect consumer).

End to end with the real discord.py client against the loopback fake Discord (which records every op 3
PRESENCE_UPDATE a bot sends), the real box and gateway, and the fake OpenAI; the spacing and idle rules of
the worker on their own with a fake clock.
"""

from __future__ import annotations

import re
from typing import Any

import anyio
import pytest

from box.context import turn_context
from box.protocol.models import DeliverResult
from impyard.conversation.sessions import SessionKey
from impyard.discord.presence import PresenceService, status_text
from testing.fake_discord import PresenceUpdate
from testing.fake_openai import FakeOpenAI, envelope
from tests.discord_yard import (
    ALICE,
    BOB,
    CAROL,
    DM,
    GENERAL,
    OWNERS,
    WAIT_S,
    Yard,
    serving,
)

pytestmark = pytest.mark.anyio

PRESENCE_ON = {"discord": {"owner_channel": str(OWNERS), "presence": True}}


async def statuses(yard: Yard, count: int) -> list[str | None]:
    """The custom statuses pip's bot has set so far (None: cleared), once there are ``count`` of them."""

    def shown() -> list[PresenceUpdate]:
        return [p for p in yard.fake.presence_updates if p.bot_user_id == yard.fake.bot_user.id]

    updates: list[PresenceUpdate] = await yard.fake.wait_for(
        lambda: shown() if len(shown()) >= count else [], WAIT_S
    )
    return [update.custom_status for update in updates]


async def test_seed_003_an_answered_turn_shows_where_the_imp_is_talking(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    monkeypatch.setattr(
        "impyard.conversation.pipeline.impyard_version", "9.8.7"
    )  # the host's release, as it says it
    async with serving(monkeypatch, model, pip=PRESENCE_ON) as yard:
        assert yard.host.presence is not None
        yard.host.presence.min_interval_s = 0.0  # spacing is tested on its own below
        asked = yard.fake.post_message(GENERAL, ALICE, "hi pip")
        await yard.answered(asked.id)
        assert await statuses(yard, 1) == ["talking in #general"]
        private = yard.fake.post_message(DM, CAROL, "psst")
        await yard.answered(private.id)
        assert await statuses(yard, 2) == ["talking in #general", "talking in a direct message"]  # never who
        [first, second] = yard.fake.presence_updates
    assert first.activities == [{"type": 4, "state": "talking in #general", "name": "Custom Status"}]
    assert first.status == "online" and second.bot_user_id == yard.fake.bot_user.id
    # Seed 003 version metadata, as the host sends it: the model read impyard's release in its context.
    context = turn_context(model.requests_for("/chat/completions")[0].body["messages"])
    assert re.search(r"\nRunning as: model \S+ on impyard 9\.8\.7\n", context)


async def test_seed_003_the_status_clears_once_the_imp_is_idle(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    async with serving(monkeypatch, model, pip=PRESENCE_ON) as yard:
        assert yard.host.presence is not None
        yard.host.presence.idle_s = 0.3
        asked = yard.fake.post_message(GENERAL, ALICE, "hi pip")
        await yard.answered(asked.id)
        assert await statuses(yard, 2) == ["talking in #general", None]


async def test_seed_003_presence_is_off_by_default(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    async with serving(monkeypatch, model) as yard:
        assert yard.host.presence is None
        asked = yard.fake.post_message(GENERAL, ALICE, "hi pip")
        await yard.posted(GENERAL)
        await yard.answered(asked.id)
        await anyio.sleep(0.2)
        assert yard.fake.presence_updates == []


async def test_seed_003_a_silent_turn_changes_no_status(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    model.script(envelope(answer="I could chime in", answer_needed=False))
    async with serving(monkeypatch, model, answer=None, pip=PRESENCE_ON) as yard:
        yard.fake.post_message(GENERAL, BOB, "lunch?")  # two people: judge framing, the model stays silent
        asked = yard.fake.post_message(GENERAL, ALICE, "sure, noon")
        await yard.answered(asked.id)
        assert yard.rt.history.outcome("pip", str(GENERAL), str(asked.id)) == "silent"
        await anyio.sleep(0.2)
        assert yard.fake.presence_updates == []


# ------------------------------------------------------------------ the worker's rules, with a fake clock


@pytest.mark.parametrize(
    ("kind", "name", "text"),
    [
        ("guild", "general", "talking in #general"),
        ("guild", "", "talking in a server channel"),
        ("dm", "carol", "talking in a direct message"),  # a DM never names the person
        ("terminal", "console", None),  # not on Discord: nothing to show
        (None, None, None),
    ],
)
def test_seed_003_status_text(kind: str | None, name: str | None, text: str | None) -> None:
    assert status_text(kind, name) == text


class _Client:
    def __init__(self) -> None:
        self.shown: list[tuple[float, str | None]] = []
        self.clock = 0.0

    async def change_presence(self, *, activity: Any = None) -> None:
        self.shown.append((self.clock, activity.name if activity is not None else None))


class _Info:
    def __init__(self, name: str) -> None:
        self.kind, self.name, self.audience = "guild", name, None


class _Db:
    async def run(self, fn: Any, *args: Any) -> Any:  # the shape of Database.run
        return fn(*args)


class _Channels:
    db = _Db()

    @staticmethod
    def info(channel_id: str) -> _Info:
        return _Info(channel_id)


async def test_seed_003_updates_are_spaced_the_latest_wins_and_the_status_clears_when_idle() -> None:
    client = _Client()
    service = PresenceService(
        {"pip": client}, _Channels(), ["pip"], min_interval_s=15.0, idle_s=60.0, clock=lambda: client.clock,  # type: ignore[dict-item, arg-type]
    )  # fmt: skip
    sent = DeliverResult(outcome="sent")

    async def at(t: float, *channels: str) -> None:
        client.clock = t
        for channel in channels:
            await service.turn_finished(SessionKey("pip", channel), sent)
        await service._apply("pip")

    await at(0.0, "general")
    await at(5.0, "random", "owls")  # within 15 s of the last update: held back …
    await at(15.0)  # … and then only the latest is shown
    await at(16.0, "owls")  # the same status again: no update
    await at(74.0)  # not idle yet: 59 s since the last answered turn
    await at(76.0)  # idle for 60 s: cleared
    await service.turn_finished(SessionKey("pip", "general"), DeliverResult(outcome="pending"))
    await at(100.0)  # a pending (or silent, or failed) turn is not something the imp did
    assert client.shown == [(0.0, "talking in #general"), (15.0, "talking in #owls"), (76.0, None)]
