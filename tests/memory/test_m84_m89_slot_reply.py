"""I. The accessibility slot as the turn sees it (mechanisms 84-89, the box's half; scopes).

The slot's rules themselves (84-87) are applied by the host and tested in tests/memory/test_store_slot.py;
here: the reply shows what the slot holds (89), every turn loads it (88), recall refreshes it (86), the
appraisal never sees it (89, 57), and a construct never shows outside its scope.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from box.common.embedding import hashing_vector
from box.protocol import memory as mem
from impyard.memory.scopes import SessionScopes
from tests.memory.engine_kit import Kit, envelope, facts, memory_block, thought, verdict

pytestmark = pytest.mark.anyio

GUILD = SessionScopes("guild:g1", ("guild:g1",))
OTHER_GUILD = SessionScopes("guild:g2", ("guild:g2",))


async def form(kit: Kit, kind: str, statement: str, *, intensity: float = 0.6, channel: str = "c1") -> str:
    """A construct formed as a reflection forms one (helper B's ``Reflector`` sends the same request)."""
    vector = hashing_vector(statement)
    result = await kit.store(channel).construct(
        mem.ConstructParams(
            construct_kind=kind,  # type: ignore[arg-type]
            statement=statement,
            feeling="resolve",
            conclusion="",
            valence=0.4,
            intensity=intensity,
            vector=vector,
        )  # fmt: skip
    )
    return result.record_id


async def test_m89_the_reply_shows_what_the_slot_holds_under_your_own_thoughts_with_age(kit: Kit) -> None:
    await form(kit, "belief", "Ann keeps her promises")
    kit.clock.advance(timedelta(days=2))
    turn = await kit.engine().begin(facts("good morning", now=kit.clock.now()))
    block = turn.block()
    assert block is not None
    thoughts = block.split("YOUR OWN THOUGHTS", 1)[1].split("\n\n", 1)[0]
    assert "- I believe: Ann keeps her promises (2 days ago)" in thoughts


async def test_m89_the_appraisal_never_sees_the_slot(kit: Kit) -> None:
    await form(kit, "decision", "I will teach Ann to sail")
    async with kit.box() as box:
        await box.say("good morning")
    assert "I will teach Ann to sail" in memory_block(kit.model.of("reply")[0])
    [appraisal] = kit.model.of("appraisal")
    assert "teach Ann to sail" not in appraisal.text and "YOUR OWN THOUGHTS" not in appraisal.text


async def test_m88_the_slot_is_loaded_at_every_turn(kit: Kit) -> None:
    await kit.seed("Ann and I planted tulips.", intensity=0.1, ago=timedelta(days=60))  # known: no probe 25
    async with kit.box() as box:
        await box.say("good morning")
        await form(kit, "goal", "I want to see the sea with Ann")
        await box.say("and good evening")
    replies = kit.model.of("reply")
    first, second = memory_block(replies[0]), memory_block(replies[-1])
    assert len(replies) == 2
    assert "I want: I want to see the sea with Ann" not in first
    assert "I want: I want to see the sea with Ann" in second


async def test_m86_a_held_construct_recalled_again_is_activated_anew(kit: Kit) -> None:
    held = await form(kit, "belief", "tulips need patience", intensity=0.9)
    kit.clock.advance(timedelta(days=6))
    kit.model.script("filter", verdict(keep=[1]))  # faded below 0.5: the filter lets it come to mind
    async with kit.box() as box:
        await box.say("tulips need patience, do they not")  # recalls the belief: it comes to mind (35)
    kit.clock.advance(timedelta(days=2))  # 8 days after forming, 2 after the recall
    slot = await kit.store().slot()
    assert [e.record.id for e in slot] == [held]  # without the refresh it would have left after 7 days


async def test_a_decision_shows_in_a_later_conversation_of_its_scope_and_never_in_another(
    tmp_path: Path,
) -> None:
    kit = Kit(tmp_path, scopes=GUILD)
    try:
        kit.model.script(
            "introspection",
            thought("Ann seems lonely here.", act="decision", text="I will greet Ann first from now on"),
        )
        kit.model.script(
            "reply",
            envelope("Let me think", action="introspect", action_text="what Ann needs"),
            envelope("Hi"),
        )
        async with kit.box(channel_id="c1", channel_kind="guild", channel_name="general") as box:
            await box.say("nobody ever says hi to me")
        later = kit.model.of("reply")[-1]
        assert "I decided: I will greet Ann first from now on" in memory_block(later)

        async with kit.box(channel_id="c2", channel_kind="guild", channel_name="random") as box:
            await box.say("hello there", author="Bob", author_id="u2")  # the same guild, a later conversation
        assert "I decided: I will greet Ann first from now on" in memory_block(kit.model.of("reply")[-1])

        kit.scopes = kit.host.scopes = OTHER_GUILD
        async with kit.box(channel_id="c9", channel_kind="guild", channel_name="elsewhere") as box:
            await box.say("hello there", author="Bob", author_id="u2")  # another guild: never
        assert "greet Ann first" not in kit.model.of("reply")[-1].text
        assert "greet Ann first" not in kit.model.of("arrival")[-1].text
    finally:
        kit.close()
