"""A. The present (mechanisms 1-13): what the reply and the appraisal read about the here and now.

Through the real box program with memory on, against the host's real memory store, on a fixed clock.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest

from box.memory import contexts
from box.memory.prompts import Prompts
from box.memory.words import INTENSITY_SCALE
from box.protocol.memory import PresenceEntry
from box.protocol.models import Attachment
from impyard.memory.scopes import SessionScopes
from testing.fake_openai import TINY_PNG_B64
from tests.memory.engine_kit import NOW, Kit, appraisal, envelope, memory_block, verdict

pytestmark = pytest.mark.anyio


def scene(**fields: object) -> contexts.Scene:
    values: dict[str, object] = {
        "imp": "pip", "person": "Ann", "person_id": "u1", "now": NOW, "timezone": "UTC", "channel_kind": "dm",
    }  # fmt: skip
    values.update(fields)
    return contexts.Scene(**values)  # type: ignore[arg-type]


async def test_m01_hearing_carries_the_trigger() -> None:
    prompts = Prompts.load()
    lines = {
        kind: contexts.senses(prompts, None, scene(hearing=kind)) for kind in ("words", "entered", "left")
    }
    assert "Hearing: Ann's words" in lines["words"]
    assert "Hearing: Ann has just entered and has not spoken." in lines["entered"]
    assert "Hearing: Ann has just left." in lines["left"]
    for kind, text in lines.items():  # exactly one of the three, matching the trigger
        others = {"words": "Ann's words", "entered": "just entered", "left": "just left"}
        assert [k for k, marker in others.items() if marker in text] == [kind]


async def test_m01_a_message_is_heard_as_the_persons_words(kit: Kit) -> None:
    async with kit.box() as box:
        await box.say("hello there")
    block = memory_block(kit.model.of("reply")[0])
    assert "- Hearing: Ann's words: the last message of the conversation." in block


async def test_m02_absent_senses_are_named_in_reply_and_appraisal(kit: Kit) -> None:
    async with kit.box() as box:
        await box.say("hello there")
    reply, appraised = memory_block(kit.model.of("reply")[0]), kit.model.of("appraisal")[0].user
    for text in (reply, appraised):
        # worded as what reaches the imp and an instruction, not as a fact to repeat (issue 32, finding 10)
        assert "- Nothing else reaches you: no touch, smell or taste. Never invent a body or a scene" in text
        assert "- Sight: only the words; no picture came with them." in text
        assert "Where you are: a direct message with Ann." in text


async def test_m02_sight_is_the_attached_images_and_the_place_is_the_channel(tmp_path: Path) -> None:
    kit = Kit(tmp_path, SessionScopes("guild:g1", ("guild:g1",)))
    photo = Attachment(filename="owl.png", content_type="image/png", size=70, data_b64=TINY_PNG_B64)
    try:
        async with kit.box(channel_kind="guild", channel_name="birds") as box:
            await box.say("look at this", attachments=[photo])
    finally:
        kit.close()
    block = memory_block(kit.model.of("reply")[0])
    assert "Sight: the images attached to the message (1 image), and nothing else." in block
    assert "no picture came with them" not in block
    assert "Where you are: #birds, a text channel of a chat server." in block


async def test_m03_counts_of_state_recalled_and_store(kit: Kit) -> None:
    async with kit.box() as box:
        await box.say("hello there")
    first = memory_block(kit.model.of("reply")[0])
    assert "Attention: no feeling with you now; nothing came to mind; no memory kept yet." in first
    await kit.seed("Ann told me about her owl Hoot.", intensity=0.9)
    await kit.seed("Bob fixed my radio.", author="Bob", author_id="u2", intensity=0.9)
    async with kit.box() as box:
        await box.say("my owl Hoot is sick")
    later = memory_block(kit.model.of("reply")[-1])
    found = re.search(r"Attention: (\d+) feelings? with you now; (\d+) memor(?:y|ies) came to mind; "
                      r"a handful of memories in all\.", later)  # fmt: skip
    assert found is not None, later  # the two seeded and the first turn's moment: 3, as a magnitude in words
    state, recalled = map(int, found.groups())
    assert state == 3 and recalled >= 1  # all three are recent; the owl came to mind


async def test_m04_the_memory_line_says_more_can_be_reached_with_search(kit: Kit) -> None:
    async with kit.box() as box:
        await box.say("hello there")
    block = memory_block(kit.model.of("reply")[0])
    assert 'You remember\n  more than this; reach for the rest with the action "search".' in block


async def test_m05_each_search_is_reported_with_its_query_and_result(kit: Kit) -> None:
    await kit.ongoing()  # a turn of an ongoing conversation: no arrival (101) to evoke the owl first
    await kit.seed("Ann's owl Hoot can fly at night.", intensity=0.9)
    long_query = "owl Hoot flying at night " + "and more " * 20
    kit.model.script(
        "reply", envelope("let me think", action="search", action_text=long_query), envelope("yes")
    )
    kit.model.script("filter", verdict(keep=[1]))  # the search's filter keeps the owl
    async with kit.box() as box:
        await box.say("tell me about birds")
    block = memory_block(kit.model.of("reply")[1])
    shown = long_query[:79] + "…"
    assert f'  - "{shown}": 1 memory found.' in block  # the query cut to 80 characters
    kit.model.script("reply", envelope("hm", action="search", action_text="submarines"), envelope("no"))
    async with kit.box() as box:
        await box.say("anything else?")
    block = memory_block(kit.model.of("reply")[-1])
    assert '  - "submarines": nothing from before this conversation; you have no older memory of it.' in block


async def test_m06_only_own_later_thoughts_came_up(kit: Kit) -> None:
    from box.protocol import memory as mem
    from tests.memory.engine_kit import vector

    await kit.store().encode(
        mem.EncodeParams(
            record=mem.NewRecord(
                kind="construct",
                construct_kind="belief",
                author="Self",
                feeling="conviction",
                conclusion="holidays by the sea are the best",
                valence=0.5,
                intensity=0.3,
                vector=vector("holidays by the sea are the best"),
            ),  # fmt: skip
            episode=mem.NewEpisode(author="Self", as_happened="I came to believe it."),
        )
    )
    await kit.seed("Bob's boat sank near the coast.", author="Bob", author_id="u2", intensity=0.3)

    def choose(
        call: object,
    ) -> dict[str, object]:  # keep only the construct; the first look asks for a moment
        user = str(getattr(call, "user", ""))
        lines = [line for line in user.splitlines() if line.startswith("[")]
        keep = [n for n, line in enumerate(lines, start=1) if "holidays" in line]
        return verdict(keep=keep, asks_for_memory=True)

    kit.model.defaults["filter"] = choose
    async with kit.box() as box:
        await box.say("remember our holidays by the sea?")
    blocks = [memory_block(c) for c in kit.model.of("reply")]
    assert any(
        "no such moment in your memory; only your own later thoughts about the theme came up." in b
        for b in blocks
    )


async def test_m07_the_memory_rule_is_in_the_system_text(kit: Kit) -> None:
    async with kit.box() as box:
        await box.say("hello there")
    system = kit.model.of("reply")[0].system
    prefix = system.split("## Context")[0]
    assert (
        "Your memory holds what happened to you and nothing else. What is not in it did not happen to you"
        in prefix
    )


async def test_m08_the_persons_words_are_their_own_account_in_reply_and_appraisal(kit: Kit) -> None:
    async with kit.box() as box:
        await box.say("you promised me a pony")
    # Worded so the imp does not adopt Ann's feelings and weighs what she says of its past, without treating
    # her as a liar (issue 32, finding 10).
    assert (
        "They are Ann's own account: take them in good faith. Ann's feelings are Ann's, not\n  yours; what Ann "
        "says about you or your past, weigh against what you carry." in memory_block(kit.model.of("reply")[0])
    )
    appraisal_user = kit.model.of("appraisal")[0].user
    heard = appraisal_user.index("Ann said: you promised me a pony")
    assert "These are Ann's own words: Ann's feelings are Ann's, not yours." in appraisal_user[heard:]


async def test_m09_time_in_view_clock_line_and_ages_in_words(kit: Kit) -> None:
    await kit.seed("Ann baked bread with me.", ago=timedelta(days=3), intensity=0.9)
    async with kit.box() as box:
        await box.say("the bread was good")
    block = memory_block(kit.model.of("reply")[0])
    assert "- Now: Wednesday, 2 December 2026, 10:00 (UTC, UTC+00:00); unix time 1796205600" in block
    assert "(ABOUT 'Ann'; 3 days ago)" in block


async def test_m10_parallel_conversations_in_view(kit: Kit) -> None:
    bob = PresenceEntry(
        person="Bob", channel="#general", joined_at=NOW - timedelta(minutes=20), last_input_at=NOW - timedelta(minutes=2),
        turns=4,
    )  # fmt: skip
    stale = PresenceEntry(
        person="Cy",
        channel="#old",
        joined_at=NOW - timedelta(hours=3),
        last_input_at=NOW - timedelta(seconds=1801),
    )
    async with kit.box() as box:
        await box.say("hello", presence=[bob, stale])
        await box.say("hello again")
    first, second = (memory_block(c) for c in kit.model.of("reply"))  # one reply call a turn (issue 33)
    assert "OTHER CONVERSATIONS YOU ARE IN (not who you are answering now):" in first
    assert "- Bob in #general: joined 20 min ago, last spoke 2 min ago, 4 turns so far." in first
    assert "Cy" not in first  # more than 1800 s since its last input
    assert "OTHER CONVERSATIONS YOU ARE IN: no other parallel conversations." in second


async def test_m12_feelings_in_words_and_no_number_for_a_feeling_in_any_context(kit: Kit) -> None:
    await kit.seed("Ann lost her cat.", valence=-0.83, intensity=0.77, ago=timedelta(days=2))
    await kit.seed("Ann won a prize.", valence=0.71, intensity=0.33, ago=timedelta(hours=5))
    kit.model.script("reply", envelope("oh", action="search", action_text="cat prize"), envelope("I see"))
    kit.model.defaults["filter"] = verdict(keep=[1, 2])
    async with kit.box() as box:
        for n in range(4):  # enough turns for a summary call too
            await box.say(f"tell me about the cat and the prize {'again ' * n}")
    purposes = {c.purpose for c in kit.model.calls}
    assert {"reply", "appraisal", "filter", "summary"} <= purposes
    decimal = re.compile(r"\d\.\d")
    for call in kit.model.calls:
        if call.path != "/chat/completions":
            continue
        if call.purpose == "reply":
            prefix, context = call.system, call.context  # issue 33: the context opens the current message
            context = re.sub(r"^Running as: .*$", "", context, flags=re.M)  # seed 003: the model's version
            read = [prefix.replace(INTENSITY_SCALE, ""), context, call.user.replace(call.context, "")]
        else:
            read = [call.system.replace(INTENSITY_SCALE, ""), call.user]
        for text in read:
            assert not decimal.search(text), f"a number in the {call.purpose} context: {decimal.search(text)}"
    block = memory_block(kit.model.of("reply")[1])
    assert "deeply painful, hurting" in block  # valence -0.83 in words
    assert "pleasant, faint" in block or "deeply good, warm, faint" in block  # the prize, in words


async def test_m13_the_intensity_scale_is_in_reply_and_appraisal_system_texts(kit: Kit) -> None:
    kit.model.defaults["appraisal"] = appraisal()
    async with kit.box() as box:
        await box.say("hello")
    assert INTENSITY_SCALE in kit.model.of("reply")[0].system.split("## Context")[0]
    assert INTENSITY_SCALE in kit.model.of("appraisal")[0].system
