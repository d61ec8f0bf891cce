"""Issue 32, finding 11: tests that can fail. Each test here kills a mutation that survived the memory suites.

* the hop allowance of the moment probe (mechanism 49): ``engine.py`` ``+ self.moment_probe`` dropped (and,
  found in the broader pass, ``+ self.unknown_probe``);
* a departure counts only the person's word-carrying moments, never the arrival (93): ``not e.arrival``
  dropped, a one-message conversation learned a rule;
* a construct never enters the focus (31, 35): ``focus.py`` ``record.kind != "lived"`` dropped;
* a candidate felt at exactly 0.5 passes the filter (19): ``recall.py`` ``>=`` made ``>``;
* an episode must *beat* its record to become the hit (16): the vector cache's ``>`` made ``>=``;
* the survivors of a broader pass over ``engine.py``, ``focus.py`` and ``recall.py`` are killed in
  tests/memory/test_edges_more.py.

The vector cache's ``>`` alone is an equivalent mutant: the merged list already sorts a record before its
episodes at equal scores, so an episode that only ties never comes first for its row (checked over 20,000
random tie-heavy cases). The two guards stand for each other: the test below kills the mutant that removes
both (the ``>=`` and the order swapped), and pins the rule whichever guard keeps it.

Each through a public surface: the real box program with a scripted model against the host's real memory
service, or the memory service itself for the host's vector cache.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from box.protocol import memory as mem
from tests.memory.engine_kit import IMP, Kit, appraisal, envelope, memory_block, vector, verdict

pytestmark = pytest.mark.anyio


def sent(kit: Kit) -> list[str]:
    return [str(getattr(p, "content", "")) for p in kit.host.sent]


def axis(i: int, dims: int = 64) -> list[float]:
    """A unit vector along axis ``i``: cosines between axes are exactly 0 or 1, scores exact in float32."""
    return [1.0 if j == i else 0.0 for j in range(dims)]


# ------------------------------------------------------------------ mechanism 49: the probe's own hop


async def test_m26_m49_the_moment_probe_keeps_the_self_chosen_hop(kit: Kit) -> None:
    """The moment probe (26) takes no hop: after it the imp may still search once (49). Issue 33: the probe
    runs before the first reply call, so its search is in the first call and no draft is thrown away."""
    await kit.seed("Ann and I planted tulips.", intensity=0.1, ago=timedelta(days=60))  # known, not recalled
    await kit.ongoing()  # no arrival
    kit.model.defaults["filter"] = verdict(keep=[], asks_for_memory=True)
    kit.model.script(
        "reply",
        envelope("one", action="search", action_text="tulips"),  # the one self-chosen hop
        envelope("two"),
        envelope("never"),
    )
    async with kit.box() as box:
        await box.say("do you remember what we planted?")
    replies = kit.model.of("reply")
    assert len(replies) == 2 and sent(kit) == ["two"]
    assert '"do you remember what we planted?"' in memory_block(replies[0])  # probe 26, before the first call
    searches = memory_block(replies[-1]).split("Searches you made just now:", 1)[1]
    assert '"do you remember what we planted?"' in searches and '"tulips"' in searches


async def test_m25_m49_the_unknown_person_probe_keeps_the_self_chosen_hop(kit: Kit) -> None:
    """The unknown-person probe (25) takes no hop: the imp may still search once (49). Issue 33: it runs
    before the first reply call."""
    await kit.ongoing()  # no arrival; nobody has told the imp of Ann
    kit.model.script(
        "reply",
        envelope("one", action="search", action_text="tulips"),  # the one self-chosen hop
        envelope("two"),
        envelope("never"),
    )
    async with kit.box() as box:
        await box.say("hi there")
    replies = kit.model.of("reply")
    assert len(replies) == 2 and sent(kit) == ["two"]
    assert "who is this person" in memory_block(replies[0])
    searches = memory_block(replies[-1]).split("Searches you made just now:", 1)[1]
    assert "who is this person" in searches and '"tulips"' in searches


# ------------------------------------------------------------------ mechanism 93: the arrival is no moment


async def test_m93_a_one_message_conversation_learns_nothing(kit: Kit) -> None:
    """The arrival's feeling (101) is in the focus, but it carries no words: one message is one moment,
    fewer than the two learning needs, so no learning call is made and no rule is kept."""
    kit.model.script("appraisal", appraisal(feeling="hurt", conclusion="Ann mocked me.", valence=-0.8))
    kit.model.defaults["learning"] = {"learned": "when someone mocks my work → I keep my distance"}
    async with kit.box() as box:
        await box.say("your drawings are silly")
    assert kit.model.of("arrival")  # the message opened the conversation: its arrival is in the focus
    summary = await kit.engine().depart(person_id="u1", now=kit.clock.now())
    assert "nothing learned (fewer than two moments with words" in summary
    assert kit.model.of("learning") == []
    assert await kit.db.run(lambda: kit.service.store.rules(IMP)) == []


# ------------------------------------------------------------------ mechanisms 31, 35: constructs


async def test_m31_m35_a_construct_that_comes_back_at_an_arrival_is_a_thought_never_in_the_focus(
    kit: Kit,
) -> None:
    statement = "Ann paints the sea beautifully"
    await kit.store().construct(
        mem.ConstructParams(construct_kind="belief", statement=statement, intensity=0.9, slot=False,
                            vector=vector(statement))
    )  # fmt: skip
    async with kit.box() as box:
        await box.say("hello again")  # an arrival: recall by person (28) brings the belief back
        await box.say("what do you think of my pictures?")
    for call in kit.model.of("reply"):
        block = memory_block(call)
        thoughts, focus = block.split("YOUR OWN THOUGHTS", 1)[1].split("FOCUS (what you attend to", 1)
        assert f"I believe: {statement}" in thoughts  # in mind as the imp's own thought (35)
        assert statement not in focus  # never an evoked event of this conversation (31: lived records only)


# ------------------------------------------------------------------ mechanism 19: the floor passes


async def test_m19_a_candidate_felt_at_exactly_one_half_comes_to_mind_without_the_filter(kit: Kit) -> None:
    await kit.ongoing()
    await kit.seed("Ann's owl Hoot hoots at night.", intensity=0.5)  # felt now: 0.5 × (0.3 + 0.7) = 0.5
    [record] = await kit.records()
    assert record.felt == 0.5
    async with kit.box() as box:
        await box.say("my owl Hoot")
    assert kit.model.of("filter") == []  # nothing below the floor: no filter call (subtle point 2)
    assert "1 memory came to mind" in memory_block(kit.model.of("reply")[0])
    remembered = kit.model.of("appraisal")[0].user.split("WHAT YOU REMEMBER ABOUT THIS", 1)[1]
    assert "Ann's owl Hoot hoots at night." in remembered.split("WHAT JUST HAPPENED", 1)[0]


# ------------------------------------------------------------------ mechanism 16: the host's cache


async def test_m16_an_episode_that_only_ties_its_record_is_not_the_hit(kit: Kit) -> None:
    """Through the memory service: an old episode scoring exactly its record's score does not replace it,
    so the record is shown with its newest episodes; one point better and it is the hit, shown first."""
    store = kit.store()
    first = await store.encode(
        mem.EncodeParams(
            record=mem.NewRecord(author="Ann", author_id="u1", feeling="calm", conclusion="A walk by the lake.",
                                 valence=0.5, intensity=0.8, vector=axis(1)),
            episode=mem.NewEpisode(author="Ann", author_id="u1", message_id="old", as_happened="the lake, first",
                                   vector=axis(1)),
        )
    )  # fmt: skip
    for n in range(3):
        kit.clock.advance(timedelta(minutes=1))
        await store.encode(
            mem.EncodeParams(join=first.record_id, episode=mem.NewEpisode(
                author="Ann", author_id="u1", message_id=f"new{n}", as_happened=f"later talk {n}", vector=axis(2),
            ))
        )  # fmt: skip
    [tied] = (await store.search(axis(1), k=1, episodes=3)).records
    assert tied.hit_episode is None  # a tie: the record keeps its own score (16)
    # Shown first all the same: a record lists its episodes that match the words best, the newest filling the
    # rest (issue 32, finding 8; docs/memory.md, "Where recall departs from the seed").
    assert [e.message_id for e in tied.episodes] == ["old", "new2", "new1"]
    kit.clock.advance(timedelta(minutes=1))
    await store.encode(
        mem.EncodeParams(join=first.record_id, episode=mem.NewEpisode(
            author="Ann", author_id="u1", message_id="best", as_happened="the lake, again",
            vector=[0.6 if j == 1 else 0.8 if j == 3 else 0.0 for j in range(64)],
        ))
    )  # fmt: skip
    [beaten] = (
        await store.search([0.6 if j == 1 else 0.8 if j == 3 else 0.0 for j in range(64)], k=1)
    ).records
    assert beaten.hit_episode is not None and beaten.episodes[0].message_id == "best"
