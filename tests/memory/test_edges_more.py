"""Issue 32, finding 11, the broader pass: survivors of hand mutations over ``box/memory/engine.py``,
``focus.py`` and ``recall.py``, each killed here through the real box program with a scripted model."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from box.protocol import memory as mem
from tests.memory.engine_kit import Kit, appraisal, envelope, memory_block, vector, verdict

pytestmark = pytest.mark.anyio


def sent(kit: Kit) -> list[str]:
    return [str(getattr(p, "content", "")) for p in kit.host.sent]


async def known(kit: Kit) -> None:
    """A record with Ann outside this conversation, too weak and old to come to mind: no probe 25."""
    await kit.seed("Ann and I planted tulips.", intensity=0.1, ago=timedelta(days=60))


async def belief(kit: Kit, statement: str, intensity: float = 0.3) -> None:
    await kit.store().construct(
        mem.ConstructParams(construct_kind="belief", statement=statement, intensity=intensity, slot=False,
                            vector=vector(statement))
    )  # fmt: skip


def keeping(word: str, *, asks: str | None = None) -> object:
    """A filter that keeps the memories naming ``word``; ``asks``: the words that ask for a moment (26)."""

    def choose(call: object) -> dict[str, object]:
        user = str(getattr(call, "user", ""))
        memories, _, words = user.partition("THE WORDS")  # the memories first, then the words (issue 33)
        shown = [line for line in memories.splitlines() if re.match(r"^\[\d+\]", line)]
        keep = [n for n, line in enumerate(shown, start=1) if word in line.lower()]
        return verdict(keep=keep, asks_for_memory=asks is not None and asks in words)

    return choose


def search_lines(call: object) -> list[str]:
    block = memory_block(call)  # type: ignore[arg-type]
    if "Searches you made just now:" not in block:
        return []
    return [
        line
        for line in block.split("Searches you made just now:", 1)[1].splitlines()
        if line.startswith("  - ")
    ]


# ------------------------------------------------------------------ mechanism 6: only the moment probe


async def test_m06_a_search_of_its_own_that_finds_a_thought_found_it(kit: Kit) -> None:
    """The "only your own later thoughts" line belongs to the moment probe (6, 26); a search the imp chose
    itself that finds a belief found a memory."""
    await kit.ongoing()
    await known(kit)
    await belief(kit, "holidays by the sea are the best")
    kit.model.defaults["filter"] = keeping("holidays")
    kit.model.script(
        "reply", envelope("hm", action="search", action_text="holidays by the sea"), envelope("yes")
    )
    async with kit.box() as box:
        await box.say("tell me something")
    assert search_lines(kit.model.of("reply")[1]) == ['  - "holidays by the sea": 1 memory found.']


async def test_m06_m26_a_moment_in_view_is_never_only_a_later_thought(kit: Kit) -> None:
    """Finding 6 with mechanism 6: asked about a moment of this very conversation while a belief about it
    exists, the probe says the moment is remembered, never "no such moment in your memory"."""
    await belief(kit, "a dog like Rex is the most loyal friend")

    def appraise(call: object) -> dict[str, object]:
        if "Rex" in str(getattr(call, "user", "")).split("WHAT JUST HAPPENED", 1)[-1]:
            return appraisal(feeling="warm interest", conclusion="Ann's dog is called Rex.", valence=0.6)
        return appraisal(feeling="curious", conclusion="Ann asked me something.", valence=0.4)

    kit.model.defaults["appraisal"] = appraise
    kit.model.defaults["filter"] = keeping("rex", asks="remember")
    async with kit.box() as box:
        await box.say("My dog is called Rex.")
        await box.say("Do you remember my dog Rex?")
    [line] = [s for s in search_lines(kit.model.of("reply")[-1]) if "Do you remember my dog Rex?" in s]
    assert "no such moment" not in line
    # the belief names Rex in its statement: a search naming Rex finds it (24; the statement counts as the
    # host's name bonus counts it) …
    assert line.startswith('  - "Do you remember my dog Rex?": 1 memory found.')
    # … and the moment itself is remembered from just now
    assert "you remember this from just now, in this conversation: Ann's dog is called Rex." in line
    # the record in view widened the probe's filter room by one: it crowds out no older memory
    assert "Keep at most 5." in kit.model.of("filter")[-1].user  # issue 33: said in the user text


# ------------------------------------------------------------------ mechanism 25: the carried null


async def test_m25_a_stranger_someone_told_of_since_is_no_stranger(kit: Kit) -> None:
    """The stranger's null is carried to later turns only while still nobody has told the imp of them."""
    async with kit.box() as box:
        await box.say("hi, I'm new here")  # nobody knows Ann: probe 25 and its null
        await kit.seed("Bob told me Ann paints.", author="Bob", author_id="u2", intensity=0.2)
        await box.say("what do you like to do?")
    replies = kit.model.of("reply")
    assert len(replies) == 2  # one call a turn: the probe runs before it (issue 33)
    assert any("who is this person" in s for s in search_lines(replies[0]))
    assert not any("who is this person" in s for s in search_lines(replies[1]))


# ------------------------------------------------------------------ mechanisms 26, 49: the probe's words, an empty search


async def test_m26_the_moment_probe_searches_with_the_words_cut_to_70(kit: Kit) -> None:
    await kit.ongoing()
    await known(kit)
    kit.model.defaults["filter"] = verdict(keep=[], asks_for_memory=True)
    words = "do you remember the long walk we took along the river last autumn, Pip??"
    assert 70 < len(words) < 80  # shown whole if it were not cut (5 cuts at 80)
    async with kit.box() as box:
        await box.say(words)
    assert search_lines(kit.model.of("reply")[-1])[0].startswith(f'  - "{words[:70]}":')


async def test_m49_a_search_without_words_is_no_hop(kit: Kit) -> None:
    await known(kit)
    kit.model.script("reply", envelope("here I am", action="search", action_text="   "), envelope("never"))
    async with kit.box() as box:
        await box.say("hello")
    assert len(kit.model.of("reply")) == 1 and sent(kit) == ["here I am"]


# ------------------------------------------------------------------ subtle point 5: no reload of the recent


async def test_sp5_the_recent_records_episodes_are_not_loaded_again(kit: Kit) -> None:
    """The recent records come with their 5 episodes: only recalled State entries are reloaded."""
    await kit.ongoing()
    await kit.seed("Ann's owl Hoot hoots.", intensity=0.9)
    async with kit.box() as box:
        await box.say("my owl Hoot")  # the owl is recent and comes to mind: in the State either way
    assert [m for m, _ in kit.host.memory_requests() if m == "memory.episodes"] == []


# ------------------------------------------------------------------ mechanisms 28, 35: an arrival's thought


async def test_m28_m35_a_belief_that_only_the_arrival_brings_back_is_a_thought(kit: Kit) -> None:
    statement = "Ann paints the sea beautifully"
    await belief(kit, statement, intensity=0.3)  # too weak to pass recall's floor: only the arrival finds it
    async with kit.box() as box:
        await box.say("hello again")
    [reply] = kit.model.of("reply")
    block = memory_block(reply)
    thoughts, focus = block.split("YOUR OWN THOUGHTS", 1)[1].split("FOCUS (what you attend to", 1)
    assert f"I believe: {statement}" in thoughts and statement not in focus


# ------------------------------------------------------------------ mechanisms 47, 103: what was delivered


async def test_m47_a_reply_waiting_for_approval_is_never_kept_as_seen(kit: Kit) -> None:
    await known(kit)
    kit.host.send_status = "pending"
    kit.model.script("reply", envelope("A reply staff must approve.", told="Ann spoke and Pip answered."))
    async with kit.box() as box:
        result = await box.say("can you post this?")
    assert result.outcome == "pending"
    newest = max(await kit.records(), key=lambda r: r.happened_at)
    [episode] = newest.episodes
    assert episode.as_happened == "Ann said: can you post this?" and episode.told is None


async def test_m103_a_departure_at_the_last_words_own_instant_runs_once(kit: Kit) -> None:
    await known(kit)
    async with kit.box() as box:
        await box.say("goodbye")
    last = kit.clock.now() - timedelta(seconds=30)  # the message's own instant (the kit moves 30 s after it)
    engine = kit.engine()
    first = await engine.depart(person_id="u1", now=last)
    again = await engine.depart(person_id="u1", now=last)
    assert "Ann left" in first and "already left" in again


# ------------------------------------------------------------------ mechanisms 31, 43, 11: the focus


async def focus_of(kit: Kit, person_id: str = "u1") -> list[dict[str, object]]:
    got = await kit.store().conversation_get(person_id)
    assert got.state is not None
    return list(got.state["focus"])


async def test_m43_the_focus_keeps_the_last_100_entries(kit: Kit) -> None:
    await known(kit)
    kit.model.defaults["appraisal"] = lambda call: appraisal(valence=0.4)
    async with kit.box() as box:
        for n in range(100):
            await box.say(f"message {n}")
    entries = await focus_of(kit)
    assert len(entries) == 100  # the arrival and 100 moments: the arrival, the oldest, gave way
    assert entries[0]["text"].startswith("Ann said: message 0\n") and not entries[0].get("arrival")  # type: ignore[union-attr]


async def test_m31_a_memory_that_both_the_arrival_and_recall_bring_is_evoked_once(kit: Kit) -> None:
    rid = await kit.seed("Ann's owl Hoot hoots at night.", intensity=0.9, ago=timedelta(days=2))
    async with kit.box() as box:
        await box.say("my owl Hoot")  # the arrival finds it by person (28), recall by meaning (14)
    evoked = [e for e in await focus_of(kit) if e["kind"] == "evoked"]
    assert [e["record_id"] for e in evoked] == [rid]


async def test_m11_a_record_without_an_author_id_is_still_with_this_same_person(kit: Kit) -> None:
    """Authorship compares ids only when both sides have one; else the exact name decides (subtle point 4)."""
    await kit.ongoing()
    await kit.seed("We baked bread together.", author_id=None, intensity=0.9)
    async with kit.box() as box:
        await box.say("the bread")
    assert "We baked bread together. (with this same person;" in memory_block(kit.model.of("reply")[0])


# ------------------------------------------------------------------ mechanism 24: a name in an event


async def test_m24_a_person_named_only_in_an_event_is_found_by_name(kit: Kit) -> None:
    """Subtle point 4: a record "mentions" a person when its events do, not only its conclusion."""
    await kit.ongoing()
    await known(kit)
    await kit.seed("Someone mended my fence.", said="Ann said: Zed mended my fence.", intensity=0.3,
                   ago=timedelta(days=3))  # fmt: skip
    kit.model.defaults["filter"] = keeping("fence")
    kit.model.script("reply", envelope("hm", action="search", action_text="what did Zed do"), envelope("yes"))
    async with kit.box() as box:
        await box.say("tell me something")
    assert search_lines(kit.model.of("reply")[1]) == ['  - "what did Zed do": 1 memory found.']
