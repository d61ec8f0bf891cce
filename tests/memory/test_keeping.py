"""Issue 32, finding 7: what someone tells the imp about themselves is kept; the small talk around it may fade.

Through the whole host (the real box program in this process, the gateway with the loopback fake OpenAI, the host's
store under a temporary IMPYARD_HOME) on a movable clock: Ann makes small talk, tells pip her sister's name once
in the middle of it, makes more small talk; pip sleeps every night (``impyard memory night --consolidate``'s own
code path, ``run_night``, on the same clock). Every moment is pleasant, so on the seed's rules the fact joins the
record the small talk opened (mechanism 64) and is forgotten with it (112) within two days. The appraisal calls
the fact lasting: it opens a record of its own that no night forgets, while the small talk still fades.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from box.protocol.models import Author, Message
from impyard.cli.memory_night import run_night
from impyard.clock import FixedClock
from impyard.conversation.pipeline import Inbound
from impyard.gateway.surfaces import RecordingSurface
from impyard.imps.store import ImpStore
from impyard.runtime import Runtime, open_runtime
from impyard.storage.db import open_database
from testing.fake_openai import FakeOpenAI, RecordedRequest, envelope
from testing.inprocess import InProcessBackend
from tests import sqlfile

pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(env=True)]

CHANNEL = "4242"
SISTER = "Maja"
FACT = f"my little sister is called {SISTER}, she just started school"
SMALL_TALK = ("nice weather today, isn't it", "I had toast for breakfast", "the bus was a bit late")


def just_happened(request: RecordedRequest) -> str:
    """The appraisal's "WHAT JUST HAPPENED" part: the exchange being appraised, not the earlier events."""
    text = json.dumps(request.body)
    return text.split("WHAT JUST HAPPENED", 1)[-1]


def appraise(request: RecordedRequest) -> dict[str, Any]:
    """Small talk: pleasant and faint, not lasting. The sister: pleasant, mild (0.3), lasting."""
    if SISTER in just_happened(request):
        return {"feeling": "warmth", "conclusion": f"Ann's little sister is {SISTER}.", "valence": 0.4,
                "intensity": 0.3, "lasting": True}  # fmt: skip
    return {"feeling": "easy", "conclusion": "Ann chatted with me.", "valence": 0.2, "intensity": 0.2,
            "lasting": False}  # fmt: skip


@pytest.fixture
def fake(fake_model: FakeOpenAI) -> FakeOpenAI:
    fake_model.script(appraise, purpose="appraisal")
    fake_model.script({"keep": [1, 2, 3], "asks_for_memory": True, "asks_for_own": None}, purpose="filter")
    fake_model.script({"summary": "Ann and I talked."}, purpose="summary")
    fake_model.script({"feeling": "glad", "conclusion": "Ann is here.", "valence": 0.2,
                      "intensity": 0.2, "search": None}, purpose="arrival")  # fmt: skip
    fake_model.script({"groups": []}, purpose="sleep")
    fake_model.script(envelope(answer="I see!", answer_needed=True), purpose="reply")
    return fake_model


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock()


@pytest.fixture
async def runtime(fake: FakeOpenAI, clock: FixedClock, impyard_home: Path) -> AsyncIterator[Runtime]:
    ImpStore().add("pip", "You are Pip.", memory={"enabled": True, "embedder": "hashing"})
    async with open_runtime(
        ["pip"], RecordingSurface(), clock=clock, backends={"pip": InProcessBackend()},
        surfaces=("discord", "terminal"), pump_period_s=None,
    ) as rt:  # fmt: skip
        yield rt


async def say(rt: Runtime, clock: FixedClock, n: int, text: str, *, minutes: int = 2) -> None:
    """One message from Ann, ``minutes`` after the last, answered and delivered."""
    clock.advance(minutes=minutes)
    message = Message(id=f"m{n}", author=Author(id="ann", name="Ann"), content=text, created_at=clock.now())
    inbound = Inbound(
        surface="discord", channel_id=CHANNEL, channel_kind="dm", message=message, channel_name="Ann"
    )
    assert await rt.conversations.receive("pip", inbound) in ("started", "queued")
    with anyio.fail_after(60):
        await rt.conversations.wait_finished(f"m{n}")
    assert rt.history.outcome("pip", CHANNEL, f"m{n}") == "sent"


def episodes() -> list[str]:
    db = open_database()
    try:
        return [
            str(r["as_happened"])
            for r in sqlfile.query(db, "SELECT as_happened FROM memory_episodes WHERE imp = 'pip'")
        ]
    finally:
        db.close()


async def test_a_pleasant_fact_told_amid_small_talk_outlives_the_nights_that_forget_the_small_talk(
    runtime: Runtime, clock: FixedClock, fake: FakeOpenAI
) -> None:
    rt = runtime
    await say(rt, clock, 1, SMALL_TALK[0])  # opens the conversation's living record: pleasant, 0.2
    await say(rt, clock, 2, FACT)  # pleasant too: on the seed's rules it joins that record
    await say(rt, clock, 3, SMALL_TALK[1])
    forgot: int = 0
    night_boxes = InProcessBackend()
    for _night in range(4):  # four nights, one a day
        clock.advance(hours=24)
        report = await run_night("pip", consolidate=True, clock=clock, backend_for=lambda imp: night_boxes)
        assert [task.state for _scope, task in report.tasks] == ["done"] * len(report.tasks), report
        forgot += sum(
            int((task.box_summary or "").split("forgot ")[1].split()[0]) for _s, task in report.tasks
        )
    kept = episodes()
    # The small talk faded and was forgotten (0.2 stored, under 0.2 + at two days: mechanism 112) …
    assert forgot >= 1 and not [e for e in kept if "weather" in e or "toast" in e], kept
    # … while what Ann told about her sister is still there, word for word.
    assert [e for e in kept if SISTER in e], kept

    clock.advance(hours=24)
    first = len(fake.requests)
    await say(rt, clock, 4, "who started school recently in my family?")
    replies = [r for r in fake.requests[first:] if r.purpose == "reply"]
    assert replies and SISTER in json.dumps(replies[0].body), (
        "the fact did not reach the question's reply call"
    )
