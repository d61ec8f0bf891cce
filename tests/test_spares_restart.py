"""Issue 37: a host that starts keeps spare boxes for the imps whose last conversation ended within their idle
period — before a restart, or on another host of the database — so the first message after a restart or a
takeover finds one; for the rest of that period only, and never for an imp that keeps none.

Through the one assembly every entry point shares (``open_runtime``), with the real box program in this process
and the loopback fake OpenAI; the host's clock is a test's."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from box.protocol.models import Author, Message
from impyard.clock import FixedClock
from impyard.conversation.pipeline import Inbound
from impyard.gateway.surfaces import RecordingSurface
from impyard.imps.store import ImpStore
from impyard.runtime import Runtime, open_runtime
from testing.fake_openai import FakeOpenAI
from testing.inprocess import InProcessBackend

pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(env=True, answer="hello there")]

IDLE_S = 600
KEPT = "keeping spare boxes for"


@asynccontextmanager
async def host(clock: FixedClock, imps: tuple[str, ...] = ("pip",)) -> AsyncIterator[Runtime]:
    backend = InProcessBackend()
    async with open_runtime(
        list(imps), RecordingSurface(), clock=clock, backends=dict.fromkeys(imps, backend),
        surfaces=("discord",), pump_period_s=None,
    ) as rt:  # fmt: skip
        yield rt


async def talk(rt: Runtime, clock: FixedClock, channel: str, n: int, imp: str = "pip") -> None:
    """A direct message to ``imp`` in ``channel``, answered."""
    msg = Message(
        id=f"{channel}-m{n}", author=Author(id="ann", name="ann"), content="hi", created_at=clock.now()
    )
    inbound = Inbound(
        surface="discord", channel_id=channel, channel_kind="dm", message=msg, channel_name=channel
    )
    assert await rt.conversations.receive(imp, inbound) == "started"
    with anyio.fail_after(30):
        await rt.conversations.wait_finished(msg.id)


def kept(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if KEPT in record.getMessage()]


async def talked(caplog: pytest.LogCaptureFixture) -> FixedClock:
    """pip (one spare, ``IDLE_S``) talked in d1 on a first host, which then stopped; the clock of both hosts."""
    caplog.set_level(logging.INFO, logger="impyard")
    ImpStore().add("pip", "You are Pip.", box={"spares": 1, "spares_idle_s": IDLE_S})
    clock = FixedClock()
    async with host(clock) as rt:
        await talk(rt, clock, "d1", 1)
    assert kept(caplog) == []  # the first host: nobody had talked yet
    return clock


async def test_a_restart_within_the_idle_period_keeps_a_spare_that_the_next_first_message_claims(
    fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    clock = await talked(caplog)
    clock.advance(seconds=IDLE_S - 60)  # restarted a minute before the idle period would have ended
    async with host(clock) as rt:
        assert kept(caplog) == ["keeping spare boxes for pip: a conversation within the idle period"]
        pool = rt.sessions.spares
        with anyio.fail_after(30):
            while not any(spare.ready for spare in pool.spares):
                await pool.changed()
        await talk(rt, clock, "d2", 1)  # a conversation this host never saw before: served by the spare
        assert pool.claimed == 1 and rt.sessions.boxes_started == 1


async def test_a_restart_after_the_idle_period_keeps_none(
    fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    clock = await talked(caplog)
    clock.advance(seconds=IDLE_S + 1)
    async with host(clock) as rt:
        assert kept(caplog) == [] and rt.sessions.spares.waiting() == 0
        await talk(rt, clock, "d2", 1)
        assert rt.sessions.spares.claimed == 0  # no spare was there: a box was started for it


async def test_only_the_imps_that_talked_and_keep_spares_get_them_at_a_start(
    fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="impyard")
    store = ImpStore()
    store.add("pip", "You are Pip.", box={"spares": 1, "spares_idle_s": IDLE_S})
    store.add("zed", "You are Zed.", box={"spares": 0})  # talked, keeps none
    store.add("ivy", "You are Ivy.", box={"spares": 1, "spares_idle_s": IDLE_S})  # keeps one, never talked
    clock = FixedClock()
    async with host(clock, ("pip", "zed", "ivy")) as rt:
        await talk(rt, clock, "d1", 1, imp="pip")
        await talk(rt, clock, "d2", 1, imp="zed")
    clock.advance(seconds=5)
    async with host(clock, ("pip", "zed", "ivy")) as rt:
        assert kept(caplog) == ["keeping spare boxes for pip: a conversation within the idle period"]
        assert await rt.conversations.keep_recent_spares(clock.now()) == ["pip"]
