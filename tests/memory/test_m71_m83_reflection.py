"""H. Reflection and constructs (mechanisms 71-83; 51, 60, 88, 89's introspection half; subtle points 11, 12).

``Reflector.reflect`` driven directly over the host's real memory store (the Kit), with the scripted
fake model answering the introspection calls. Expectations are written out, never read from the module.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest

from box.common.laws import DEFAULTS, NEUTRAL, Params, Temperament
from box.memory.calls import MemoryModel
from box.memory.embedder import HashingEmbedder
from box.memory.focus import Focus, moment_entry
from box.memory.prompts import Prompts
from box.memory.reflection import Reflected, Reflector, Seed
from box.memory.store_client import StoreClient, StoreUnavailable
from box.protocol.memory import ConstructKind, ConstructParams, RecordView
from box.protocol.models import MemorySettings, ModelRequestResult
from tests.memory.engine_kit import IMP, DirectPeer, FakeClient, Kit, thought

pytestmark = pytest.mark.anyio

NO_INVENTION = "You may not invent events your memory does not hold."


def reflector(
    kit: Kit,
    *,
    peer: DirectPeer | None = None,
    params: Params = DEFAULTS,
    temperament: Temperament = NEUTRAL,
    logs: list[str] | None = None,
) -> Reflector:
    model = MemoryModel(
        FakeClient(kit.model),
        MemorySettings(enabled=True, embedder="hashing"),
        "test-model",
        clock=kit.clock.now,
    )
    sink = logs if logs is not None else []

    async def host_log(level: str, message: str) -> None:
        sink.append(message)

    return Reflector(
        model=model, store=StoreClient(peer or kit.peer()), embedder=HashingEmbedder(), prompts=Prompts.load(),
        imp=IMP, timezone="UTC", params=params, temperament=temperament, host_log=host_log,
    )  # fmt: skip


async def reflect(kit: Kit, **kwargs: Any) -> Reflected:
    options = {k: kwargs.pop(k) for k in ("peer", "params", "temperament", "logs") if k in kwargs}
    return await reflector(kit, **options).reflect(now=kit.clock.now(), **kwargs)


def users(kit: Kit) -> list[str]:
    return [call.user for call in kit.model.of("introspection")]


async def constructs(kit: Kit, kind: str | None = None) -> list[RecordView]:
    return [
        r for r in await kit.records() if r.kind == "construct" and (kind is None or r.construct_kind == kind)
    ]


async def form(
    kit: Kit, kind: ConstructKind, statement: str, *, ago: timedelta = timedelta(0), intensity: float = 0.5,
    valence: float = 0.4, conclusion: str = "", slot: bool = True,
) -> str:  # fmt: skip
    """A construct formed ``ago`` before the clock's now, as an earlier reflection would have."""
    now = kit.clock.now()
    kit.clock.set(now - ago)
    try:
        vector = await HashingEmbedder().embed(f"{statement} {conclusion}".strip())
        result = await kit.store().construct(
            ConstructParams(
                construct_kind=kind,
                statement=statement,
                conclusion=conclusion,
                valence=valence,
                intensity=intensity,
                vector=vector,
                slot=slot,
            )  # fmt: skip
        )
        return result.record_id
    finally:
        kit.clock.set(now)


def focus_of(kit: Kit, *moments: tuple[str, str, float]) -> Focus:
    """A conversation's focus: (record id, feeling, valence) per moment, oldest first, 30 s apart."""
    start = kit.clock.now() - timedelta(seconds=30 * len(moments))
    return Focus(
        moment_entry(
            record_id=rid,
            author="Ann",
            author_id="u1",
            feeling=feeling,
            conclusion=f"{feeling} conclusion",
            valence=valence,
            intensity=0.5,
            at=start + timedelta(seconds=30 * n),
            text=f"Ann said: {feeling}",
            message_id=f"fm{n}",
        )  # fmt: skip
        for n, (rid, feeling, valence) in enumerate(moments)
    )


# ------------------------------------------------------------------ 71: the introspection call


async def test_m71_one_call_at_temperature_05_with_the_fields_and_the_acts(kit: Kit) -> None:
    await kit.seed("Ann showed me her garden.")
    await reflect(kit)
    [call] = kit.model.of("introspection")
    assert call.body["temperature"] == 0.5  # mechanism 71
    schema = call.body["response_format"]["json_schema"]["schema"]
    assert set(schema["required"]) == {
        "thought", "feeling", "conclusion", "valence", "intensity", "reinforces", "act", "text",
    }  # fmt: skip
    assert schema["properties"]["act"]["enum"] == [
        "none", "keep_thinking", "search_more", "belief", "decision", "goal", "dream",
    ]  # fmt: skip
    assert NO_INVENTION in call.system


async def test_m71_the_answer_becomes_the_step(kit: Kit) -> None:
    kit.model.script(
        "introspection",
        thought("I wonder why the garden stays with me.", feeling="gentle wonder", conclusion="Gardens calm me.",
                valence=0.6, intensity=0.7),
    )  # fmt: skip
    reflected = await reflect(kit)
    [step] = reflected.steps
    assert (step.thought, step.act, step.text, step.recurred, step.formed) == (
        "I wonder why the garden stays with me.", "none", None, False, None,
    )  # fmt: skip
    [kept] = await constructs(kit)
    assert (kept.id, kept.statement, kept.feeling, kept.conclusion, kept.valence, kept.intensity) == (
        step.record_id, "I wonder why the garden stays with me.", "gentle wonder", "Gardens calm me.", 0.6, 0.7,
    )  # fmt: skip


async def test_m56_values_are_asked_in_the_language_of_the_state(kit: Kit) -> None:
    await reflect(kit)
    [call] = kit.model.of("introspection")
    assert "in the language your memories are written in" in call.system
    assert "field names stay in English" in call.system


async def test_m71_a_model_failure_ends_the_chain_quietly(kit: Kit) -> None:
    kit.model.script("introspection", ModelRequestResult(status=400, body={"error": "bad"}))
    logs: list[str] = []
    reflected = await reflect(kit, logs=logs)
    assert reflected.steps == [] and await constructs(kit) == []
    assert any("reflection ended after 0 step" in line for line in logs)


async def test_m71_a_failure_mid_chain_keeps_the_steps_taken(kit: Kit) -> None:
    kit.model.script("introspection", thought("First.", act="keep_thinking"), "not json at all", "still not")
    reflected = await reflect(kit)
    assert [s.thought for s in reflected.steps] == ["First."]
    assert len(kit.model.of("introspection")) == 3  # the second step was asked twice (mechanism 120)


async def test_m88_a_store_that_does_not_answer_is_raised(kit: Kit) -> None:
    peer = kit.peer()
    peer.down.add("memory.slot")
    with pytest.raises(StoreUnavailable):
        await reflect(kit, peer=peer)
    assert kit.model.of("introspection") == []


# ------------------------------------------------------------------ 72: the entries


async def test_m72_recent_records_newest_first_at_raw_intensity_retold(kit: Kit) -> None:
    await kit.seed("We walked by the river.", intensity=0.9, ago=timedelta(days=10),
                   told="Ann and Pip walked by the river.")  # fmt: skip
    await kit.seed("Ann laughed at my joke.", intensity=0.3, ago=timedelta(hours=1))
    await reflect(kit)
    [user] = users(kit)
    river, joke = user.index("We walked by the river."), user.index("Ann laughed at my joke.")
    assert joke < river  # newest first
    # Mechanism 72 / subtle point 20: raw intensity 0.9 is "overwhelming" although felt now at about 0.29.
    assert "[2] pleasant, overwhelming: a feeling. We walked by the river." in user
    assert "[1] pleasant, faint: a feeling. Ann laughed at my joke." in user
    assert "Ann and Pip walked by the river." in user  # the event retold (61)
    assert "Ann said: We walked by the river." not in user


async def test_m72_at_most_8_and_constructs_are_dropped_after_taking_8(kit: Kit) -> None:
    for n in range(10):
        await kit.seed(f"Lived moment number {n}.", ago=timedelta(minutes=60 - n))
    await form(kit, "belief", "Rivers are calm.", slot=False)
    await form(kit, "thought", "I like the river.", slot=False)
    await reflect(kit)
    [user] = users(kit)
    # Subtle point 11: the 8 most recently felt are 2 constructs and moments 9..4; the constructs are dropped.
    shown = [n for n in range(10) if f"Lived moment number {n}." in user]
    assert shown == [4, 5, 6, 7, 8, 9]
    assert "[6] " in user and "[7] " not in user
    assert "Rivers are calm." not in user and "I like the river." not in user


async def test_m72_the_focus_tail_comes_first_and_is_filled_from_the_store(kit: Kit) -> None:
    a = await kit.seed("Record A.", ago=timedelta(hours=3))
    b = await kit.seed("Record B.", ago=timedelta(hours=2))
    c = await kit.seed("Record C.", ago=timedelta(hours=1))
    focus = focus_of(kit, (a, "first look at A", 0.4), (b, "B felt now", 0.4), (a, "second look at A", 0.4))
    await reflect(kit, focus=focus)
    [user] = users(kit)
    # One per record id, newest first, each under the focus entry's own feeling (41); then C from the store.
    assert user.index("[1] pleasant, clearly there: second look at A.") < user.index(
        "[2] pleasant, clearly there: B felt now."
    )
    assert "[3] pleasant, strong: a feeling. Record C." in user
    assert "first look at A" not in user
    assert "Record A." not in user and "Record B." not in user and c  # shown from the focus, not the store


async def test_m72_introspection_never_sees_dispositions_summary_or_felt_strength(kit: Kit) -> None:
    await kit.store().learn("when someone is quiet → ask gently", 0.8)
    await kit.seed("Ann told me about her exam.", intensity=0.9, ago=timedelta(days=20))
    peer = kit.peer()
    kit.model.script("introspection", thought(act="keep_thinking"), thought(act="search_more", text="exam"))
    await reflect(kit, peer=peer)
    methods = {method for method, _ in peer.requests}
    assert (
        "memory.dispositions" not in methods and "memory.conversation.get" not in methods
    )  # no rule, summary
    for call in kit.model.of("introspection"):
        assert "ask gently" not in call.text
        assert "faint" not in call.user.split("RECALLED")[0]  # felt now ≈ 0.27 would be "faint"


# ------------------------------------------------------------------ 73: the gap note


@pytest.mark.parametrize(
    ("ago", "note"),
    [
        (timedelta(hours=5, minutes=59), None),
        (timedelta(hours=6), None),
        (timedelta(hours=7), "Nothing has happened for 7 hours."),
        (timedelta(days=3, hours=2), "Nothing has happened for 3 days."),
        (timedelta(days=21), "Nothing has happened for 3 weeks."),
    ],
)
async def test_m73_a_gap_of_more_than_6_hours_is_said(kit: Kit, ago: timedelta, note: str | None) -> None:
    await kit.seed("The last thing that happened.", ago=ago)
    await reflect(kit)
    [user] = users(kit)
    if note is None:
        assert "Nothing has happened" not in user
    else:
        assert note in user


async def test_m73_the_first_slot_construct_decides_when_the_slot_holds_one(kit: Kit) -> None:
    await form(kit, "belief", "Quiet days are good.", ago=timedelta(hours=8))
    await kit.seed("Ann just said hello.")
    await reflect(kit)
    assert "Nothing has happened for 8 hours." in users(kit)[0]  # subtle point 11: entries[0] is the slot's


async def test_m73_a_fresh_slot_construct_hides_an_old_entry(kit: Kit) -> None:
    await kit.seed("Ann said goodbye.", ago=timedelta(days=2))
    await form(kit, "thought", "I wonder where Ann went.")
    await reflect(kit)
    assert "Nothing has happened" not in users(kit)[0]


async def test_m73_an_empty_memory_says_so_and_has_no_gap(kit: Kit) -> None:
    await reflect(kit)
    [user] = users(kit)
    assert "Your memory holds nothing yet" in user and "Nothing has happened" not in user


# ------------------------------------------------------------------ 74, 75: thoughts are constructs


async def test_m74_every_step_is_kept_as_a_thought_in_the_slot(kit: Kit) -> None:
    kit.model.script(
        "introspection",
        thought("Ann's garden was full of bees.", act="keep_thinking"),
        thought("Bees make honey for winter.", act="none"),
    )
    reflected = await reflect(kit)
    kept = await constructs(kit, "thought")
    assert sorted(r.statement or "" for r in kept) == [
        "Ann's garden was full of bees.",
        "Bees make honey for winter.",
    ]
    assert [e.record.statement for e in reflected.slot] == [
        "Ann's garden was full of bees.", "Bees make honey for winter.",
    ]  # fmt: skip
    assert {s.record_id for s in reflected.steps} == {r.id for r in kept}


async def test_m88_the_slot_is_loaded_at_the_next_reflection(kit: Kit) -> None:
    kit.model.script("introspection", thought("Bees make honey for winter."))
    await reflect(kit)
    kit.clock.advance(timedelta(hours=1))
    await reflect(kit)
    second = users(kit)[1]
    assert "YOUR OWN THOUGHTS" in second and "[1] I thought: Bees make honey for winter." in second


async def test_m75_a_recurring_thought_is_not_written_and_is_refelt(kit: Kit) -> None:
    old = await form(kit, "thought", "I miss the long walks with Ann.", conclusion="Walks matter.",
                     intensity=0.3, valence=0.3, ago=timedelta(days=1))  # fmt: skip
    walk = await kit.seed("We walked by the lake.", intensity=0.2, ago=timedelta(days=2))
    before = await kit.record(walk)
    kit.model.script(
        "introspection",
        thought(
            "i MISS the long walks with ann",
            conclusion="walks matter",
            valence=0.3,
            intensity=0.9,
            reinforces=2,
            act="keep_thinking",
        ),  # fmt: skip
        thought("Something else entirely."),
    )
    reflected = await reflect(kit)
    first = reflected.steps[0]
    assert first.recurred and first.record_id == old
    [kept] = [r for r in await constructs(kit, "thought") if "walks" in (r.statement or "").lower()]
    assert kept.statement == "I miss the long walks with Ann."  # not written again
    # Settle (0.3 felt after 1 day ≈ 0.2405), then close 0.6 of the gap toward 0.9 (subtle point 12).
    assert kept.intensity == pytest.approx(0.6362, abs=1e-3)
    assert kept.last_felt == kit.clock.now()
    after = await kit.record(walk)  # its reinforce target is not restored (subtle point 12)
    assert (after.intensity, after.last_felt) == (before.intensity, before.last_felt)
    # Subtle point 11: the earlier thought's text is what the next step continues from.
    assert "Your previous reflection just said:\nthought: I miss the long walks with Ann." in users(kit)[1]


# ------------------------------------------------------------------ 76, 77: re-feeling what the thought names


@pytest.mark.parametrize(
    ("entry_valence", "thought_valence", "restored"),
    [
        (0.5, 0.4, True),
        (0.5, -0.4, False),
        (-0.5, -0.4, True),
        (-0.5, 0.4, False),
        (0.5, 0.0, True),  # zero counts as positive (subtle point 8)
        (-0.5, 0.0, False),
    ],
)
async def test_m76_a_thought_refeels_the_entry_it_names_when_the_signs_agree(
    kit: Kit, entry_valence: float, thought_valence: float, restored: bool
) -> None:
    rid = await kit.seed("We planted tulips.", valence=entry_valence, intensity=0.3, ago=timedelta(days=2))
    before = await kit.record(rid)
    kit.model.script("introspection", thought("The tulips again.", valence=thought_valence, intensity=0.9,
                                              reinforces=1))  # fmt: skip
    await reflect(kit)
    after = await kit.record(rid)
    if restored:
        tau = 3.0 if entry_valence >= 0 else 4.5
        felt = 0.3 * (0.3 + 0.7 * math.exp(-2 / tau))
        assert after.intensity == pytest.approx(felt + 0.6 * (0.9 - felt), abs=1e-6)
        assert after.last_felt == kit.clock.now()
    else:
        assert (after.intensity, after.last_felt) == (before.intensity, before.last_felt)


async def test_m76_an_index_that_names_nothing_refeels_nothing(kit: Kit) -> None:
    rid = await kit.seed("We planted tulips.", intensity=0.3, ago=timedelta(days=2))
    before = await kit.record(rid)
    kit.model.script(
        "introspection", thought("Tulips.", reinforces=5), thought("Tulips again.", reinforces=0)
    )
    kit.model.defaults["introspection"] = thought("Enough.")
    await reflect(kit)
    assert (await kit.record(rid)).intensity == before.intensity


@pytest.mark.parametrize(
    ("valence", "reinforces", "conclusion"),
    [
        (-0.6, 1, ""),  # circling a pain adds no conclusion
        (-0.6, None, "It still hurts."),
        (0.6, 1, "It still hurts."),
        (0.0, 1, "It still hurts."),
    ],
)
async def test_m77_a_negative_thought_that_deepens_an_entry_keeps_no_conclusion(
    kit: Kit, valence: float, reinforces: int | None, conclusion: str
) -> None:
    await kit.seed("Ann left without a word.", valence=-0.7)
    kit.model.script("introspection", thought("Ann left.", conclusion="It still hurts.", valence=valence,
                                              reinforces=reinforces))  # fmt: skip
    await reflect(kit)
    [kept] = await constructs(kit)
    assert kept.conclusion == conclusion


async def test_m77_the_conclusion_is_cleared_before_the_thought_is_embedded(kit: Kit) -> None:
    old = await form(kit, "thought", "Ann left without a word.", valence=-0.6)
    await kit.seed("Ann left.", valence=-0.7)
    kit.model.script(
        "introspection",
        thought(
            "Ann left without a word.",
            conclusion="Nobody ever stays with me for very long, it seems to me.",
            valence=-0.6,
            reinforces=2,
        ),  # fmt: skip
    )
    reflected = await reflect(kit)
    # With the conclusion embedded the vectors would be far apart; cleared first, the thought recurs (75).
    assert reflected.steps[0].recurred and reflected.steps[0].record_id == old


# ------------------------------------------------------------------ 78, 79, 80: the chain


@pytest.mark.parametrize(("max_steps", "calls"), [(3, 4), (1, 2), (0, 1)])
async def test_m78_the_chain_continues_only_while_depth_is_below_the_maximum(
    kit: Kit, max_steps: int, calls: int
) -> None:
    kit.model.defaults["introspection"] = thought("Round and round.", act="keep_thinking")
    reflected = await reflect(kit, params=Params(reflection_max_steps=max_steps))
    assert len(kit.model.of("introspection")) == calls and len(reflected.steps) == calls


async def test_m78_search_continues_the_chain_too(kit: Kit) -> None:
    await kit.seed("Ann gave me a book about birds.")
    kit.model.defaults["introspection"] = thought("Birds.", act="search_more", text="birds")
    peer = kit.peer()
    await reflect(kit, peer=peer)
    assert len(kit.model.of("introspection")) == 4  # mechanism 78: at most 4 calls
    # The last step's search would have no next step to show it to: it is not run.
    assert [m for m, _ in peer.requests].count("memory.search") == 3


async def test_m79_keep_thinking_carries_no_direction(kit: Kit) -> None:
    kit.model.script(
        "introspection",
        thought("Maybe I should think about the sea.", act="keep_thinking", text="THE SEA AND ITS SECRETS"),
        thought("Done."),
    )
    reflected = await reflect(kit)
    second = users(kit)[1]
    assert "You chose to keep thinking." in second
    assert "THE SEA AND ITS SECRETS" not in second and "You searched" not in second
    assert reflected.steps[0].act == "keep_thinking" and reflected.steps[0].text is None


async def test_m80_search_more_runs_a_plain_search_and_shows_what_came_back(kit: Kit) -> None:
    rid = await kit.seed("Ann gave me a book about birds.")
    focus = focus_of(kit, (rid, "a warm gift", 0.5))
    peer = kit.peer()
    kit.model.script(
        "introspection",
        thought("What was that book?", act="search_more", text="book about birds"),
        thought("Yes, the bird book.", act="keep_thinking"),
        thought("Done."),
    )
    await reflect(kit, focus=focus, peer=peer)
    second, third = users(kit)[1], users(kit)[2]
    assert 'You searched your memory for: "book about birds"' in second
    recalled = second.split("RECALLED FROM MEMORY", 1)[1]
    assert "Ann gave me a book about birds." in recalled  # the focus is not excluded (29)
    [search] = [p for m, p in peer.requests if m == "memory.search"]
    assert (search.k, search.names) == (10, [])  # type: ignore[attr-defined]
    assert kit.model.of("filter") == []  # unfiltered
    assert "RECALLED FROM MEMORY" not in third  # shown to the next step only


async def test_m80_the_query_is_shown_up_to_80_characters(kit: Kit) -> None:
    query = "birds " * 30
    kit.model.script("introspection", thought("Birds.", act="search_more", text=query), thought("Done."))
    await reflect(kit)
    shown = users(kit)[1].split('You searched your memory for: "', 1)[1].split('"', 1)[0]
    assert len(shown) == 80 and shown.endswith("…") and shown.startswith("birds birds")


async def test_m80_a_search_that_finds_nothing_says_so(kit: Kit) -> None:
    # A query without a word has no vector (the embedder's rule): nothing can come back.
    kit.model.script("introspection", thought("Birds?", act="search_more", text="?!"), thought("Done."))
    await reflect(kit)
    assert "RECALLED FROM MEMORY: nothing came back; you have no memory of this." in users(kit)[1]


async def test_m80_search_more_without_text_ends_the_chain(kit: Kit) -> None:
    kit.model.defaults["introspection"] = thought("Hm.", act="search_more", text=None)
    reflected = await reflect(kit)
    assert [s.act for s in reflected.steps] == ["none"] and len(users(kit)) == 1


# ------------------------------------------------------------------ 81, 82, 83: constructs


@pytest.mark.parametrize("kind", ["belief", "decision", "goal", "dream"])
async def test_m81_an_act_with_text_forms_that_construct_and_ends_the_chain(kit: Kit, kind: str) -> None:
    kit.model.defaults["introspection"] = thought("Again.", act="keep_thinking")
    kit.model.script("introspection", thought("I see it now.", feeling="clarity", conclusion="It is clear.",
                                              valence=0.5, intensity=0.7, act=kind, text="Kindness matters."))  # fmt: skip
    reflected = await reflect(kit)
    assert len(users(kit)) == 1  # the chain ends (81)
    [step] = reflected.steps
    [made] = await constructs(kit, kind)
    assert (made.id, made.statement, made.feeling, made.conclusion, made.valence, made.intensity) == (
        step.formed, "Kindness matters.", "clarity", "It is clear.", 0.5, 0.7,
    )  # fmt: skip
    assert made.id in [e.record.id for e in reflected.slot]
    assert (step.act, step.text) == (kind, "Kindness matters.")


@pytest.mark.parametrize("kind", ["belief", "decision", "goal", "dream"])
async def test_m81_an_act_without_text_is_nothing(kit: Kit, kind: str) -> None:
    kit.model.script("introspection", thought("I see it now.", act=kind, text="   "))
    reflected = await reflect(kit)
    [step] = reflected.steps
    assert (step.act, step.formed) == ("none", None)
    assert [r.construct_kind for r in await constructs(kit)] == ["thought"]


async def test_m82_the_same_belief_again_is_reinforced_not_written(kit: Kit) -> None:
    answer = thought("I see it.", act="belief", text="Kindness matters.", intensity=0.6)
    kit.model.script("introspection", answer)
    first = await reflect(kit)
    kit.clock.advance(timedelta(days=2))
    kit.model.script("introspection", answer)
    second = await reflect(kit)
    [belief] = await constructs(kit, "belief")
    assert first.steps[0].formed == second.steps[0].formed == belief.id
    assert belief.intensity == pytest.approx(0.7)  # +0.1, no fading first
    assert belief.last_felt == kit.clock.now()


@pytest.mark.parametrize(
    ("kind", "shown"),
    [
        ("thought", "I thought: Birds are free."),
        ("belief", "I believe: Birds are free."),
        ("decision", "I decided: Birds are free."),
        ("goal", "I want: Birds are free."),
        ("dream", "I dream: Birds are free."),
    ],
)
async def test_m83_held_constructs_are_shown_as_statements(kit: Kit, kind: ConstructKind, shown: str) -> None:
    await form(kit, kind, "Birds are free.", conclusion="Something else.")
    await reflect(kit)
    assert f"[1] {shown} (pleasant, clearly there; in mind since just now)" in users(kit)[0]


# ------------------------------------------------------------------ 89: the slot first, indexed


async def test_m89_the_slot_comes_first_indexed_and_reinforces_can_name_it(kit: Kit) -> None:
    belief = await form(kit, "belief", "Ann is a good friend.", intensity=0.3, ago=timedelta(days=2))
    await kit.seed("Ann brought me soup.", intensity=0.5, ago=timedelta(hours=1))
    kit.model.script("introspection", thought("Ann cares.", valence=0.5, intensity=0.9, reinforces=1))
    await reflect(kit)
    [user] = users(kit)
    assert user.index("[1] I believe: Ann is a good friend.") < user.index(
        "[2] pleasant, clearly there: a feeling. Ann brought me soup."
    )
    # Subtle point 11: index 1 is the held belief: it is re-felt toward 0.9.
    kept = await kit.record(belief)
    felt = 0.3 * (0.3 + 0.7 * math.exp(-2 / 3))
    assert kept.intensity == pytest.approx(felt + 0.6 * (0.9 - felt), abs=1e-6)


# ------------------------------------------------------------------ 60: the temperament bends every step


async def test_m60_every_step_is_bent_by_the_temperament(kit: Kit) -> None:
    kit.model.script(
        "introspection", thought("A thought.", valence=0.3, intensity=0.4, act="belief", text="Yes.")
    )
    await reflect(kit, temperament=Temperament(valence_bias=0.5, intensity_amplification=2.0))
    for kept in await constructs(kit):
        assert kept.valence == pytest.approx(math.tanh(math.atanh(0.3) + 0.5))  # ≈ 0.669
        assert kept.intensity == pytest.approx(0.4**0.5)  # ≈ 0.632


# ------------------------------------------------------------------ 50, 51: a mid-turn reflection


async def test_m51_the_exchange_is_the_previous_thought_and_the_angle_the_direction(kit: Kit) -> None:
    seed = Seed(
        exchange="Ann said: my cat died today / I was about to reply: that is sad",
        thought="Ann is grieving.",
        angle="what does Ann need from me?",
    )
    await reflect(kit, seed=seed)
    [call] = kit.model.of("introspection")
    assert (
        "Your previous reflection just said:\n"
        "thought: Ann said: my cat died today / I was about to reply: that is sad\n"
        "conclusion: Ann is grieving."
    ) in call.user
    assert 'You stopped to think about this: "what does Ann need from me?"' in call.user
    assert "paus" not in call.text.lower()


async def test_m51_the_continuation_is_cut_to_300_characters(kit: Kit) -> None:
    exchange = "Ann said: " + "word " * 200
    await reflect(kit, seed=Seed(exchange=exchange, thought="x", angle=None))
    [user] = users(kit)
    line = user.split("thought: ", 1)[1].split("\n", 1)[0]
    assert len(line) == 300 and line.endswith("…")
    assert "You stopped to think" not in user


async def test_m51_without_a_seed_the_first_step_has_no_previous(kit: Kit) -> None:
    await kit.seed("Ann showed me her garden.")
    await reflect(kit)
    assert "previous reflection" not in users(kit)[0]


async def test_m72_the_scene_says_where_the_imp_is(kit: Kit) -> None:
    from box.memory.contexts import Scene

    scene = Scene(
        imp=IMP, person="Ann", person_id="u1", now=kit.clock.now(), timezone="UTC", channel_kind="dm"
    )
    await reflect(kit, scene=scene)
    assert "WHERE YOU ARE: a direct message with Ann." in users(kit)[0]


def test_m71_the_system_text_names_every_field_of_the_answer() -> None:
    text = Prompts.load().render("introspection.system", imp="pip", intensity_scale="")
    answer_line = " ".join(text[text.index("Answer with one JSON object") :].split())
    assert answer_line == (
        "Answer with one JSON object with exactly these fields: thought, feeling, conclusion, valence, "
        "intensity, reinforces, act, text."
    )
