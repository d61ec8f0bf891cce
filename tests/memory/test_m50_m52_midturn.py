"""E. Reflection mid-turn (mechanisms 49-52): the reply's ``introspect`` action."""

from __future__ import annotations

import pytest

from tests.memory.engine_kit import Kit, envelope, memory_block, thought
from tests.memory.test_engine_loop import known, sent

pytestmark = pytest.mark.anyio


async def test_m50_introspect_reflects_then_asks_the_reply_again(kit: Kit) -> None:
    await known(kit)
    kit.model.script(
        "reply",
        envelope(
            "Hmm.", action="introspect", action_text="why this hurts", conclusion="She is upset with me."
        ),
        envelope("I'm sorry, Ann."),
    )
    kit.model.script(
        "introspection",
        thought("Her words sting because I care.", act="keep_thinking", text="a direction I chose"),
        thought("I should own my part.", act="decision", text="I will apologise to Ann"),
    )
    async with kit.box() as box:
        await box.say("you forgot my birthday")
    assert sent(kit) == ["I'm sorry, Ann."]
    assert len(kit.model.of("reply")) == 2 and len(kit.model.of("introspection")) == 2
    first_reply, second_reply = (memory_block(c) for c in kit.model.of("reply"))
    assert "I decided: I will apologise to Ann" not in first_reply
    assert (
        "I decided: I will apologise to Ann" in second_reply
    )  # what the reflection formed, in the slot (89)
    assert "I thought: I should own my part." in second_reply


async def test_m51_the_chain_starts_from_the_exchange_with_the_angle_and_then_keeps_thinking(
    kit: Kit,
) -> None:
    await known(kit)
    kit.model.script(
        "reply",
        envelope(
            "Hmm.", action="introspect", action_text="why this hurts", conclusion="She is upset with me."
        ),
        envelope("I'm sorry, Ann."),
    )
    kit.model.script(
        "introspection",
        thought("Her words sting because I care.", act="keep_thinking", text="a direction I chose"),
        thought("Enough."),
    )
    async with kit.box() as box:
        await box.say("you forgot my birthday")
    first, second = kit.model.of("introspection")
    assert first.body["temperature"] == 0.5
    assert "Ann said: you forgot my birthday" in first.user and "She is upset with me." in first.user
    assert "why this hurts" in first.user  # the angle is the first step's direction
    assert "paused" not in first.text.lower()
    assert "You chose to keep thinking." in second.user  # 79: and nothing more of the model's direction
    assert "a direction I chose" not in second.user and "why this hurts" not in second.user


async def test_m49_introspect_uses_the_one_self_chosen_hop(kit: Kit) -> None:
    await known(kit)
    kit.model.script(
        "reply",
        envelope("one", action="introspect", action_text="first"),
        envelope("two", action="introspect", action_text="second"),
        envelope("never"),
    )
    async with kit.box() as box:
        await box.say("hello")
    assert sent(kit) == ["two"] and len(kit.model.of("reply")) == 2
    assert len(kit.model.of("introspection")) == 1  # the default thought ends the chain (act "none")
