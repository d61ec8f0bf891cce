"""Whole turns and conversations with memory on (issue 23, seed 002, "How such an engine is tested").

The real box program in this process, the host's real memory store, a fixed clock, the hashing embedder
and a scripted fake model: the store failing at each point of a turn, two boxes continuing one conversation,
the critical path of a plain turn, bad input (a failed embedding, a message of 100,000 characters).
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from box.protocol import memory as mem
from box.protocol.models import ModelRequestResult
from tests.memory.engine_kit import Kit, appraisal, envelope, memory_block, verdict

pytestmark = pytest.mark.anyio


async def saved(kit: Kit, person: str = "u1") -> dict:  # type: ignore[type-arg]
    got = await kit.peer().request("memory.conversation.get", mem.ConversationGetParams(person=person))
    assert isinstance(got, mem.ConversationState) and got.state is not None
    return got.state


# ------------------------------------------------------------------ the store unavailable


async def test_store_unavailable_at_the_start_the_turn_answers_without_memory(kit: Kit) -> None:
    kit.host.down.add("*")
    async with kit.box() as box:
        result = await box.say("hello")
    assert result.outcome == "sent"
    [reply] = kit.model.of("reply")
    assert "### Memory" not in reply.context and "## Your memory" not in reply.system  # the memory-off prompt
    assert any(
        "memory store unavailable; this turn answers without memory" in line for line in kit.host.log_lines()
    )
    assert kit.model.of("appraisal") == []  # nothing to keep without a store


async def test_store_unavailable_mid_turn_the_draft_stands_and_the_moment_is_not_kept(kit: Kit) -> None:
    await kit.seed("Ann and I planted tulips.", intensity=0.1, ago=timedelta(days=60))
    kit.model.script(
        "reply", envelope("my first draft", action="search", action_text="tulips"), envelope("never")
    )

    def store_goes_down(call: object) -> dict[str, object]:  # the first recall has run; the store fails now
        kit.host.down.update({"memory.search", "memory.encode"})
        return verdict()

    kit.model.defaults["filter"] = store_goes_down
    async with kit.box() as box:
        result = await box.say("tulips")
    assert result.outcome == "sent" and [getattr(p, "content", "") for p in kit.host.sent] == [
        "my first draft"
    ]
    lines = kit.host.log_lines()
    assert any("memory store unavailable mid-turn; the draft stands" in line for line in lines)
    assert any("memory store unavailable; this moment was not kept" in line for line in lines)
    assert len(await kit.records()) == 1  # only the seeded one


async def test_a_failed_embedding_recalls_nothing_and_never_fails_the_reply(kit: Kit) -> None:
    await kit.seed("Ann's owl Hoot is sick.", intensity=0.9, ago=timedelta(days=1))
    kit.model.script("embedding", ModelRequestResult(status=400, body={"error": {"message": "bad input"}}))
    async with kit.box(embedder="gateway", dimensions=64) as box:
        result = await box.say("how is Hoot?")
    assert result.outcome == "sent"
    assert "nothing came to mind" in memory_block(kit.model.of("reply")[0])
    assert any("could not be embedded" in line for line in kit.host.log_lines())


# ------------------------------------------------------------------ one conversation, two boxes


async def test_two_boxes_continue_one_conversation(kit: Kit) -> None:
    kit.model.defaults["appraisal"] = appraisal(valence=0.4)
    async with kit.box() as box:
        await box.say("my name is Ann")
        await box.say("I keep bees")
    async with kit.box() as fresh:  # the warm box idled out; a fresh box takes the next message
        await fresh.say("the bees swarmed today")
    last = memory_block(kit.model.of("reply")[-1])
    # the same focus: its two exchanges are in the fresh box's chat history, so not repeated (issue 33)
    assert "In the chat above, not repeated here: 2 exchanges of this conversation." in last
    [record] = await kit.records()
    assert len(record.episodes) == 3  # the fresh box joined the same living record (64)
    state = await saved(kit)
    assert state["turns"] == 3 and state["living"] == record.id
    texts = [entry["text"] for entry in state["focus"] if entry["kind"] == "moment"]
    assert any("Ann said: my name is Ann" in t for t in texts) and any(
        "Ann said: I keep bees" in t for t in texts
    )


async def test_a_conversation_ends_after_the_presence_window(kit: Kit) -> None:
    kit.model.defaults["appraisal"] = appraisal(valence=0.4)
    async with kit.box() as box:
        await box.say("I keep bees")
        kit.clock.advance(seconds=1801)
        await box.say("hello again")
    assert (
        "Ann said: I keep bees" not in memory_block(kit.model.of("reply")[-1]).split("This conversation")[-1]
    )
    assert len(await kit.records()) == 2  # a new conversation opens a new record (the living one was reset)
    assert (await saved(kit))["turns"] == 1


# ------------------------------------------------------------------ cost and bad input


async def test_a_plain_turn_makes_three_sequential_model_calls_before_the_reply_is_sent(kit: Kit) -> None:
    await kit.ongoing()  # a turn of an ongoing conversation: no arrival (101)
    await kit.seed("Ann and I planted tulips.", intensity=0.3, ago=timedelta(days=3))
    for n in range(3):
        await kit.seed(f"Ann told me fact number {n}.", intensity=0.2, ago=timedelta(days=9 + n))
    async with kit.box(embedder="gateway", dimensions=64) as box:
        for n in range(4):
            await box.say(f"tulips in spring {n}")
    turns: list[list[str]] = []
    for method, params in kit.host.calls:
        if method == "turn.stage" and getattr(params, "stage", "") == "context":
            turns.append([])
        elif method == "discord.send":
            turns[-1].append("send")
        elif method == "model.request":
            turns[-1].append(getattr(params, "purpose", ""))
    last_turn = turns[-1]
    before_send = last_turn[: last_turn.index("send")]
    assert [p for p in before_send if p != "summary"] == ["embedding", "filter", "reply"]
    assert (
        "summary" in before_send
    )  # turn 4: due, run beside recall (see test_m44_the_summary_runs_beside...)
    after_send = last_turn[last_turn.index("send") + 1 :]
    assert set(after_send) <= {"appraisal", "embedding"}  # the moment is kept after delivery


async def test_a_message_of_100000_characters_is_answered_and_kept_within_bounds(kit: Kit) -> None:
    long = ("owls " * 20_000)[:100_000]
    async with kit.box() as box:
        result = await box.say(long)
        again = await box.say("and?")
    assert (result.outcome, again.outcome) == ("sent", "sent")
    kept = await kit.records()
    assert kept and all(len(ep.as_happened) <= mem.MAX_EPISODE_CHARS for r in kept for ep in r.episodes)
    assert len(json.dumps(await saved(kit)).encode()) <= mem.MAX_CONVERSATION_STATE_BYTES


async def test_a_long_conversation_stays_within_the_saved_state_bound(kit: Kit) -> None:
    kit.model.defaults["appraisal"] = appraisal(valence=0.4)
    async with kit.box() as box:
        for n in range(70):
            result = await box.say(f"chapter {n}: " + "lorem ipsum " * 500)
            assert result.outcome == "sent"
    state = await saved(kit)
    assert len(json.dumps(state).encode()) <= mem.MAX_CONVERSATION_STATE_BYTES
    assert 0 < len(state["focus"]) < 70 and state["focus"][-1]["text"].startswith("Ann said: chapter 69")
    assert not any("not kept" in line for line in kit.host.log_lines())


async def test_memory_is_off_without_scopes_or_when_disabled(kit: Kit) -> None:
    kit.scopes = None  # type: ignore[assignment]
    async with kit.box() as box:  # init.memory is None: the host gave no scopes
        await box.say("hello")
    async with kit.box(enabled=False) as box:
        await box.say("hello")
    for reply in kit.model.of("reply"):
        assert "### Memory" not in reply.context and "## Your memory" not in reply.system
    assert kit.host.memory_requests() == [] and kit.model.of("appraisal") == []


async def test_m115_a_given_record_is_among_the_recent_and_tagged_from_your_past(kit: Kit) -> None:
    from tests.memory.engine_kit import IMP, vector

    event = "I grew up in a lighthouse."
    await kit.db.run(
        lambda: kit.service.store.remember(IMP, "dm:u1", event, 0.6, 0.8, age_hours=720, vector=vector(event))
    )
    async with kit.box() as box:
        await box.say("hello")
    state = memory_block(kit.model.of("reply")[0]).split("\nYOUR STATE")[1].split("\nFOCUS")[0]
    assert "I grew up in a lighthouse. (from your past; 1 month ago)" in state


async def test_the_real_box_process_remembers_across_two_boxes(kit: Kit) -> None:
    """``python -m box`` as a process (the process backend): the engine, its prompts and the store round trip."""
    from box.protocol.models import Author, DeliverParams, Framing, Message
    from impyard.backends import BoxSpec
    from impyard.backends.process import ProcessBackend
    from tests.memory.engine_kit import init_params

    kit.model.defaults["appraisal"] = appraisal(feeling="delight", conclusion="Ann keeps bees.", valence=0.5)
    for n, words in enumerate(("I keep bees", "the bees swarmed")):
        spec = BoxSpec("pip", "c1", kit.tmp_path / f"process-{n}")
        async with ProcessBackend(warn=False).open(spec, kit.host) as running:
            await running.init(init_params(), timeout=30)
            now = kit.clock.now()
            message = Message(id=f"p{n}", author=Author(id="u1", name="Ann"), content=words, created_at=now)
            result = await running.deliver(
                DeliverParams(message=message, framing=Framing(mode="respond", reason="dm"), now=now),
                timeout=30,
            )
            assert result.outcome == "sent"
        kit.clock.advance(seconds=30)
    [record] = await kit.records()
    assert record.conclusion == "Ann keeps bees." and len(record.episodes) == 2
    # the first box's exchange is in the second box's chat history: the block does not repeat it (issue 33)
    assert "In the chat above, not repeated here: 1 exchange of this conversation." in memory_block(
        kit.model.of("reply")[-1]
    )
    assert (kit.tmp_path / "process-0" / "memory-calls.jsonl").exists()  # the call log under /state (119)
