"""D. The conversation summary (mechanisms 44-45; subtle point 15)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from box.context import split_context
from box.memory.calls import MemoryModel
from box.memory.conversation import Conversation, SavedConversation
from box.memory.focus import FocusEntry, FocusEpisode
from box.memory.prompts import Prompts
from box.memory.summary import Summariser
from box.protocol.models import MemorySettings
from impyard.memory.scopes import SessionScopes
from tests.memory.engine_kit import NOW, Call, FakeClient, Kit, memory_block

pytestmark = pytest.mark.anyio


async def test_m44_summary_cadence_none_yet_then_every_third_turn_needs_three_events(kit: Kit) -> None:
    await kit.ongoing()  # a turn of an ongoing conversation: no arrival (101)
    turns_called: list[int] = []
    turn = 0

    def summarise(call: Call) -> dict[str, Any] | str:
        turns_called.append(turn)
        return "not json at all" if turn == 9 else {"summary": f"Summary written at turn {turn}."}

    kit.model.defaults["summary"] = summarise
    async with kit.box() as box:
        for turn in range(1, 11):
            await box.say(f"message number {turn}")
    # turns 1-3: fewer than 3 events of Ann in the focus; 4: none exists yet; then every 3rd turn
    # (turn 9's unreadable answer is asked once more, mechanism 120)
    assert turns_called == [4, 6, 9, 9]

    def blocks(turn: int) -> list[str]:
        return [memory_block(c) for c in kit.model.of("reply")
                if split_context(c.body["messages"][-1]["content"])[1] == f"Ann: message number {turn}"]  # fmt: skip

    assert all("in your own summary" not in b for n in (1, 2, 3) for b in blocks(n))
    assert "in your own summary: Summary written at turn 4." in blocks(4)[0]  # refreshed before the reply
    assert (
        "in your own summary: Summary written at turn 6." in blocks(10)[0]
    )  # turn 9 failed: the old text stayed


async def test_m44_the_summary_runs_beside_recall_not_before_it(kit: Kit) -> None:
    await kit.ongoing()  # a turn of an ongoing conversation: no arrival (101)
    await kit.seed("Ann's owl Hoot is sick.", intensity=0.3, ago=timedelta(days=2))  # a filter call each turn
    filtered = anyio.Event()
    state = {"turn": 0}

    async def summarise(call: Call) -> dict[str, Any]:
        with anyio.fail_after(5):  # deadlocks if the filter waited for the summary
            await filtered.wait()
        return {"summary": "I talked with Ann."}

    def choose(call: Call) -> dict[str, Any]:
        if state["turn"] == 4:
            filtered.set()
        return {"keep": [], "asks_for_memory": False, "asks_for_own": None}

    kit.model.defaults["summary"] = summarise
    kit.model.defaults["filter"] = choose
    async with kit.box() as box:
        for n in range(1, 5):
            state["turn"] = n
            await box.say(f"owls and more owls {n}")
    [summary] = kit.model.of("summary")
    last = memory_block(kit.model.of("reply")[-1])
    assert "in your own summary: I talked with Ann." in last  # it finished, while the filter ran


async def test_m45_the_summary_reads_only_this_persons_last_40_entries_retold(tmp_path: Path) -> None:
    from tests.memory.engine_kit import FakeModel

    model = FakeModel()
    memory_model = MemoryModel(FakeClient(model), MemorySettings(enabled=True), "gpt-test")
    entries = [
        FocusEntry(
            kind="moment",
            record_id=f"r{n}",
            author="Ann",
            author_id="u1",
            at=NOW,
            text=f"Ann said: point {n}",
        )
        for n in range(45)
    ]
    entries.insert(30, FocusEntry(kind="evoked", record_id="b", author="Bob", author_id="u2", at=NOW,
                                  conclusion="Bob's secret", episodes=[FocusEpisode(at=NOW, text="Bob told Pip a secret.")]))  # fmt: skip
    entries.append(FocusEntry(kind="evoked", record_id="a", author="Ann", author_id="u1", at=NOW,
                              conclusion="Ann's garden", episodes=[FocusEpisode(at=NOW, text="Ann showed Pip her garden.")]))  # fmt: skip
    conversation = Conversation(
        SavedConversation(person="Ann", person_id="u1", turns=6, summary="Old.", focus=entries)
    )
    summariser = Summariser(memory_model, Prompts.load(), "pip", "UTC", lambda: NOW)
    assert await summariser.refresh(conversation)
    [call] = model.of("summary")
    assert "Bob" not in call.user  # only this person's entries
    assert (
        "point 5\n" not in call.user and "point 6\n" in call.user and "point 44" in call.user
    )  # the last 40
    assert "Ann showed Pip her garden." in call.user  # evoked ones retold
    assert "YOUR SUMMARY SO FAR\nOld." in call.user
    assert call.body["temperature"] == 0.4
    for rule in ('in the first person ("I")', "in the language the conversation is held in",
                 "Leave feelings and emotions out", "At most five sentences"):  # fmt: skip
        assert rule in call.system


async def test_m45_in_a_group_channel_each_person_has_a_conversation(tmp_path: Path) -> None:
    kit = Kit(tmp_path, SessionScopes("guild:g1", ("guild:g1",)))
    try:
        async with kit.box(channel_kind="guild", channel_name="general") as box:
            await box.say("I am Ann", mode="judge")
            await box.say("I am Bob", author="Bob", author_id="u2", mode="judge")
            await box.say("Ann again", mode="judge")
        blocks = [memory_block(c) for c in kit.model.of("reply")]
    finally:
        kit.close()
    last = blocks[-1]
    # Ann's conversation, not Bob's: its one exchange is in the chat above, not repeated (issue 33); Bob's
    # exchange is in that chat too, but it is no exchange of Ann's conversation
    assert "In the chat above, not repeated here: 1 exchange of this conversation." in last
    assert "Bob said: I am Bob" not in last
