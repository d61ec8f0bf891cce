"""Issue 32, finding 10: the imp speaks as someone, never about its machinery unless asked.

The prompts handed the model "your memory holds 151 records", "Sight: black. You see nothing.", "Touch:
nothing. … You have no body." and "What Ann says is Ann's claim, not something you have", with nothing
saying to keep them to itself: the imp could talk about its records or its body, or treat what people say
as mere claims. Now the memory block is the imp's inner sense, to keep to itself unless asked; the size of
its memory is a magnitude in words; the absent senses are an instruction (never invent a body or a scene),
not a fact to repeat; and a person's words are their own account, taken in good faith, whose feelings stay
theirs (what the seed's mechanism 8 needs: the imp does not adopt what others feel as its own).

Through the real box program with memory on, against the host's real memory store and a scripted model.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from tests.memory.engine_kit import Kit, envelope, memory_block, verdict

pytestmark = pytest.mark.anyio

KEEP_TO_YOURSELF = (
    "- All of this is your inner sense, for you alone: keep it to yourself. Unless someone asks how you\n"
    "  work, never talk about how your memory works (what is counted, searched or numbered here, YOUR STATE,\n"
    '  FOCUS) or about senses you lack. Speak as yourself ("I remember you told me"), not as a machine\n'
    "  reading out what it stores."
)
GOOD_FAITH = (
    "- What a person tells you is their own account: take it in good faith, as from anyone you talk with.\n"
    "  Their feelings are theirs, not yours; what they say about you or your past, weigh against what you carry."
)
# The machinery lines the model used to read (written out, as they were), and any count of records.
MACHINERY = (
    "Sight: black",
    "You see nothing",
    "You have no body",
    "Touch: nothing",
    "claim, not something you have",
    "records in all",
    "your state holds",
)
RECORD_COUNT = re.compile(r"\b\d+ records?\b", re.IGNORECASE)


async def test_the_prompts_carry_no_machinery_lines_and_say_to_keep_the_inner_sense_to_oneself(
    kit: Kit,
) -> None:
    for n in range(12):  # a memory of some size: it was "your memory holds 12 records in all"
        await kit.seed(f"Ann told me about her garden, day {n}.", intensity=0.4, ago=timedelta(days=n + 1))
    kit.model.script("filter", verdict(keep=[1], asks_for_memory=True))
    kit.model.script("reply", envelope("Let me think.", action="search", action_text="garden"))
    async with kit.box() as box:
        await box.say("I feel so sad today. Do you remember my garden?")
    replies, appraisals = kit.model.of("reply"), kit.model.of("appraisal")
    assert len(replies) >= 2 and appraisals  # a search was made and reported: its lines are checked too
    for call in replies + appraisals:
        for line in MACHINERY:
            assert line.lower() not in call.text.lower(), (call.purpose, line)
        assert RECORD_COUNT.search(call.text) is None, call.purpose
    for call in replies:
        rules = call.system.split("## Context", 1)[0]
        assert KEEP_TO_YOURSELF in rules and GOOD_FAITH in rules
        block = memory_block(call)
        # the size of the memory, as a person senses it: a magnitude in words (mechanism 3)
        assert "; dozens of memories in all." in block
        # the absent senses as an instruction, not a fact to repeat (mechanism 2)
        assert "- Sight: only the words; no picture came with them." in block
        assert "- Nothing else reaches you: no touch, smell or taste. Never invent a body or a scene" in block
        # Ann's words are hers: taken in good faith, her sadness not adopted as the imp's own (mechanism 8)
        assert (
            "They are Ann's own account: take them in good faith. Ann's feelings are Ann's, not\n"
            "  yours; what Ann says about you or your past, weigh against what you carry." in block
        )
    heard = appraisals[0].user.split("WHAT JUST HAPPENED", 1)[1]
    assert "These are Ann's own words: Ann's feelings are Ann's, not yours." in heard
    assert (
        "What a person tells you is their own account, taken in good faith; their feelings are theirs, not\n"
        "yours: say how it lands with you." in appraisals[0].system
    )


async def test_the_rules_stay_in_the_byte_stable_persona_prefix(kit: Kit) -> None:
    """ENV-20: the keep-to-yourself rule is static text of the prefix, the same in every call."""
    async with kit.box() as box:
        await box.say("hello")
        await box.say("and hello again")
    prefixes = {c.system.split("## Context", 1)[0] for c in kit.model.of("reply")}
    assert len(prefixes) == 1 and KEEP_TO_YOURSELF in prefixes.pop()
