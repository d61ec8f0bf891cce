"""K. Arrival and departure (mechanisms 28, 101-103; design §7), in the box's engine.

The host's half of a departure — noticing that presence went stale and queueing the ``depart`` task exactly
once — is tested in tests/test_departures*.py; here the box runs what the task asks.
"""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from box.memory.conversation import SavedConversation
from tests.memory.engine_kit import IMP, Kit, appraisal, arrival, envelope, facts, memory_block

pytestmark = pytest.mark.anyio


async def saved(kit: Kit, person_id: str = "u1") -> SavedConversation:
    got = await kit.store().conversation_get(person_id)
    assert got.state is not None
    return SavedConversation.model_validate(got.state)


# ------------------------------------------------------------------ arrival (101, 102)


async def test_m101_a_first_message_is_an_arrival_with_recall_by_person(kit: Kit) -> None:
    await kit.seed("Ann and I planted tulips in the rain.", intensity=0.9, ago=timedelta(days=20))
    await kit.seed("Bob fixed my bicycle.", author="Bob", author_id="u2", intensity=0.95)
    engine = kit.engine()
    turn = await engine.begin(facts("hello"))
    [call] = kit.model.of("arrival")
    assert call.body["temperature"] == 0.4  # a reply call (46) with the arrival schema
    assert set(call.body["response_format"]["json_schema"]["schema"]["properties"]) == {
        "feeling", "conclusion", "valence", "intensity", "search",
    }  # fmt: skip  # issue 33: no greeting is asked for (in chat it would never be sent)
    assert "greeting" not in call.system
    assert "Ann has just entered and has not spoken" in call.user
    assert "Ann and I planted tulips in the rain." in call.user  # mechanism 28: by person, no similarity
    assert "Bob fixed my bicycle." not in call.user  # stronger, but not with or about Ann
    block = turn.block()
    assert block is not None
    assert "Ann entered the conversation." in block and "glad recognition" in block  # in the focus


async def test_m101_the_arrival_may_search_once_and_only_plainly(kit: Kit) -> None:
    await kit.seed("The lighthouse keeper waved at me.", author="Cy", author_id="u3", intensity=0.9)
    kit.model.script("arrival", arrival(search="lighthouse"), arrival(search="again please"))
    await kit.engine().begin(facts("hello"))
    first, second = kit.model.of("arrival")
    assert "RECALLED FROM MEMORY" not in first.user
    assert (
        'you searched for "lighthouse"' in second.user and "The lighthouse keeper waved at me." in second.user
    )
    assert kit.model.of("filter") == []  # plain: no filter (29; the turn's own candidates are all strong)


async def test_m101_only_the_first_message_of_a_conversation_is_an_arrival(kit: Kit) -> None:
    async with kit.box() as box:
        await box.say("hello")
        await box.say("how are you?")
    assert len(kit.model.of("arrival")) == 1


async def test_m101_an_arrival_is_one_visible_message(kit: Kit) -> None:
    await kit.seed("Ann and I planted tulips.", intensity=0.1, ago=timedelta(days=60))  # known: no probe 25
    kit.model.script("reply", envelope("Hi Ann!"))
    async with kit.box() as box:
        result = await box.say("hello")
    assert result.outcome == "sent"
    assert [getattr(p, "content", None) for p in kit.host.sent] == ["Hi Ann!"]  # no greeting is asked or sent


async def test_m101_absent_for_31_minutes_the_person_arrives_again(kit: Kit) -> None:
    async with kit.box() as box:
        await box.say("hello")
        kit.clock.advance(timedelta(minutes=31))
        await box.say("I'm back")
    assert len(kit.model.of("arrival")) == 2
    state = await saved(kit)
    assert [e.text for e in state.focus if e.kind == "moment"][0] == "Ann entered the conversation."
    assert len([e for e in state.focus if e.arrival]) == 1  # the new conversation's own arrival only


async def test_m102_the_arrival_feeling_is_kept_in_the_focus_and_never_stored(kit: Kit) -> None:
    kit.model.script("appraisal", appraisal(feeling="plain contentment", conclusion="We said hello."))
    async with kit.box() as box:
        await box.say("hello")
    records = await kit.records()
    assert [r.feeling for r in records] == ["plain contentment"]  # the turn's moment only
    state = await saved(kit)
    [entry] = [e for e in state.focus if e.arrival]
    assert entry.record_id is None and entry.feeling == "glad recognition" and entry.kind == "moment"
    assert state.living == records[0].id  # subtle point 8: the arrival opened no living record


async def test_m60_the_arrival_feeling_is_bent_by_the_temperament(kit: Kit) -> None:
    kit.model.script("arrival", arrival(valence=0.4, intensity=0.25))
    turn = await kit.engine(valence_bias=1.0, intensity_amplification=2.0).begin(facts("hello"))
    [entry] = [e for e in turn.conversation.focus.entries if e.arrival]  # type: ignore[attr-defined]
    assert entry.valence == pytest.approx(math.tanh(math.atanh(0.4) + 1.0))
    assert entry.intensity == pytest.approx(0.5)


async def test_m101_an_unreadable_arrival_leaves_no_feeling_and_the_turn_answers(kit: Kit) -> None:
    kit.model.script("arrival", "{not json", "{still not")
    kit.model.script("reply", envelope("Hi!"))
    async with kit.box() as box:
        result = await box.say("hello")
    assert result.outcome == "sent"
    assert not [e for e in (await saved(kit)).focus if e.arrival]


async def test_m101_the_arrival_runs_beside_recall_before_the_first_reply_call(kit: Kit) -> None:
    async with kit.box() as box:
        await box.say("hello")
    purposes = [c.purpose for c in kit.model.calls]
    assert purposes.index("arrival") < purposes.index("reply")
    assert "Ann entered the conversation." in memory_block(kit.model.of("reply")[0])


# ------------------------------------------------------------------ departure (103)


async def talk(kit: Kit, *valences: float) -> None:
    """A conversation with Ann, one message per valence (the appraisal's feeling of each moment)."""
    for n, valence in enumerate(valences):
        kit.model.script(
            "appraisal",
            appraisal(feeling=f"feeling {n}", conclusion=f"Moment {n} with Ann.", valence=valence),
        )
    async with kit.box() as box:
        for n in range(len(valences)):
            await box.say(f"message {n}")


async def test_m103_a_departure_makes_no_reply_and_no_record(kit: Kit) -> None:
    await talk(kit, 0.3, 0.2)
    before = {r.id for r in await kit.records() if r.kind == "lived"}
    replies = len(kit.model.of("reply"))
    kit.clock.advance(timedelta(minutes=31))
    summary = await kit.engine().depart(person_id="u1", now=kit.clock.now())
    assert "Ann left" in summary
    assert len(kit.model.of("reply")) == replies and len(kit.host.sent) == 2  # the talk's two, no more
    assert {r.id for r in await kit.records() if r.kind == "lived"} == before  # no lived record
    assert len(kit.model.of("introspection")) == 1  # one quiet reflection (the default thought acts "none")
    state = await saved(kit)
    assert state.departed_at == kit.clock.now()  # presence left


async def test_m103_the_departure_context_is_rendered_before_the_quiet_reflection(kit: Kit) -> None:
    await talk(kit, 0.3, 0.5)
    kit.model.script("learning", {"learned": "when someone shares a small joy → I ask about it"})
    await kit.engine().depart(person_id="u1", now=kit.clock.now())
    [learning] = kit.model.of("learning")
    assert learning.body["temperature"] == 0.2
    assert "Ann has just left." in learning.user  # the senses of the departure (91)
    assert "message 1" in learning.user  # the focus as it happened
    purposes = [c.purpose for c in kit.model.calls if c.purpose in ("introspection", "learning")]
    assert purposes == ["introspection", "learning"]
    # the carried lines are taken after the reflection: its thought can be among them (subtle point 14)
    assert "I keep thinking about what Ann told me." in learning.user


async def test_m93_a_hurtful_exchange_teaches_a_rule_weighted_minus_08(kit: Kit) -> None:
    await talk(kit, 0.3, -0.8, 0.2)
    kit.model.script("learning", {"learned": "when someone mocks my work → I keep my distance"})
    summary = await kit.engine().depart(person_id="u1", now=kit.clock.now())
    assert "learned" in summary
    rules = await kit.db.run(lambda: kit.service.store.rules(IMP))
    assert [(r.rule, r.weight) for r in rules] == [("when someone mocks my work → I keep my distance", -0.8)]


async def test_m103_a_departure_runs_once(kit: Kit) -> None:
    await talk(kit, 0.3, 0.5)
    engine = kit.engine()
    await engine.depart(person_id="u1", now=kit.clock.now())
    calls = len(kit.model.calls)
    again = await engine.depart(person_id="u1", now=kit.clock.now())
    assert "already left" in again and len(kit.model.calls) == calls


async def test_m103_after_a_departure_the_next_message_is_an_arrival(kit: Kit) -> None:
    await talk(kit, 0.3)
    await kit.engine().depart(person_id="u1", now=kit.clock.now())
    async with kit.box() as box:
        await box.say("I'm back already")
    assert len(kit.model.of("arrival")) == 2


async def test_m103_no_conversation_nothing_to_reflect_on(kit: Kit) -> None:
    summary = await kit.engine().depart(person_id="nobody", now=kit.clock.now())
    assert "nothing to reflect on" in summary and kit.model.calls == []


async def test_m91_learning_reads_the_whole_departure_context_and_the_carried_lines(kit: Kit) -> None:
    from box.protocol import memory as mem
    from tests.memory.engine_kit import vector

    await kit.store().construct(
        mem.ConstructParams(construct_kind="goal", statement="I want to visit the tulip fields", intensity=0.7,
                            vector=vector("I want to visit the tulip fields"))
    )  # fmt: skip
    kit.model.script("summary", {"summary": "Ann and I talked about her garden."})
    await talk(kit, 0.3, 0.5, 0.4)
    await kit.engine().depart(person_id="u1", now=kit.clock.now())
    [learning] = kit.model.of("learning")
    context = learning.user
    for part in (
        "Ann has just left.",  # the senses
        "OTHER CONVERSATIONS",  # presence (here: none)
        "YOUR STATE",  # the state, with feelings in words
        "I want: I want to visit the tulip fields",  # the slot
        "Ann and I talked about her garden.",  # the summary
        "message 2",  # the focus, as it happened
    ):
        assert part in context, part
    carried = context.split("WHAT YOU CARRY NOW", 1)[1] if "WHAT YOU CARRY NOW" in context else context
    assert "Moment 0 with Ann." in carried  # a carried line: the living record's conclusion, felt now (92)


async def test_m100_a_rule_learned_on_departure_later_reaches_only_the_reply(kit: Kit) -> None:
    from tests.memory.engine_kit import envelope, thought

    rule = "when someone mocks my work → I keep my distance"
    await talk(kit, 0.3, -0.8, 0.2)
    kit.model.script("learning", {"learned": rule})
    await kit.engine().depart(person_id="u1", now=kit.clock.now())
    before = len(kit.model.of("reply"))
    kit.clock.advance(timedelta(hours=1))
    kit.model.script("selection", {"matched": [1]})
    kit.model.script("reply", envelope("Hm.", action="introspect", action_text="why"), envelope("Fine."))
    kit.model.script("introspection", thought("I feel wary."))
    async with kit.box() as box:
        await box.say("your drawings are silly")
    [selection] = kit.model.of("selection")
    assert selection.body["temperature"] == 0.2 and rule in selection.user
    learned = "WHAT YOU HAVE LEARNED (fits this situation):\n- " + rule
    blocks = [memory_block(c) for c in kit.model.of("reply")[before:]]
    assert len(blocks) == 2 and all(learned in b for b in blocks)  # the draft and the reply after reflecting
    for purpose in ("appraisal", "introspection", "arrival", "filter", "summary"):
        assert all(rule not in c.text for c in kit.model.of(purpose)), purpose
