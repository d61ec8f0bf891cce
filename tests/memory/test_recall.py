"""B. Recall (mechanisms 14-31): the box composes recall from the host's ranked search.

``Recall`` against the host's real memory store (the real ``MemoryService`` over SQLite, every request
through JSON as on the wire), the hashing embedder, a scripted filter; the probes through the real box.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from box.memory.association_filter import read_verdict
from box.memory.embedder import HashingEmbedder
from box.memory.recall import FilterVerdict, Recall, collapse_rumination
from box.protocol import memory as mem
from box.protocol.memory import RecordView
from tests.memory.engine_kit import Kit, envelope, memory_block, vector, verdict

pytestmark = pytest.mark.anyio


class ScriptedFilter:
    """An association filter that answers from a list and records what it was offered."""

    def __init__(self, *answers: FilterVerdict | None) -> None:
        self.answers = list(answers)
        self.offered: list[tuple[str, list[str], int]] = []

    async def choose(self, words: str, candidates: Sequence[RecordView], room: int) -> FilterVerdict | None:
        self.offered.append((words, [c.conclusion for c in candidates], room))
        return self.answers.pop(0) if self.answers else FilterVerdict(keep=[])


def recall(kit: Kit, *answers: FilterVerdict | None) -> tuple[Recall, ScriptedFilter]:
    chooser = ScriptedFilter(*answers)
    return Recall(kit.store(), HashingEmbedder(), chooser), chooser


def record(conclusion: str, *, felt: float = 0.6, score: float | None = None, feeling: str = "a feeling",
           rid: str | None = None, vec: list[float] | None = None, author: str = "Ann") -> RecordView:  # fmt: skip
    at = datetime(2026, 12, 1, tzinfo=UTC)
    return RecordView(
        id=rid or conclusion[:20], author=author, feeling=feeling, conclusion=conclusion, valence=0.5, intensity=felt,
        felt=felt, happened_at=at, last_felt=at, score=score, vector=vec,
    )  # fmt: skip


# ------------------------------------------------------------------ scoring by the host, as recall sees it


async def test_m14_score_is_meaning_times_felt_strength_a_faded_record_ranks_lower(kit: Kit) -> None:
    old = await kit.seed(
        "Bob loves owls", author="Bob", author_id="u2", intensity=0.8, ago=timedelta(days=10)
    )
    fresh = await kit.seed("Cy loves owls", author="Cy", author_id="u3", intensity=0.8)
    engine, _ = recall(kit)
    found = await engine.plain("loves owls")
    assert [r.id for r in found] == [fresh, old]
    by_id = {r.id: r for r in found}
    assert by_id[old].felt < by_id[fresh].felt
    ratio = by_id[old].score / by_id[fresh].score  # type: ignore[operator]
    weight = {rid: 0.75 + 0.25 * r.felt for rid, r in by_id.items()}  # issue 32: fading weighs a quarter
    assert ratio == pytest.approx(weight[old] / weight[fresh], rel=1e-2)  # same cosine, fading decides


async def test_m15_a_record_naming_a_name_in_the_words_scores_the_bonus(kit: Kit) -> None:
    named = await kit.seed("We walked with Rex.", author="Bob", author_id="u2", intensity=0.4)
    plain = await kit.seed("walking in the park every morning", author="Bob", author_id="u2", intensity=0.4)
    engine, chooser = recall(kit, FilterVerdict(keep=[0, 1]))
    found = await engine.involuntary("I went walking in the park with Rex", "Ann", set(),
                                     vector("I went walking in the park with Rex"), ["Rex"])  # fmt: skip
    scores = {r.id: r.score for r in found.records}
    assert found.records[0].id == named
    assert scores[named] > 0.5 > scores[plain]  # type: ignore[operator]  # +0.5 for the name, mid-sentence
    # Issue 32: a capital is no name by itself — Rex is a name only as someone the imp knows (or "@Rex").
    chooser.answers = [FilterVerdict(keep=[0, 1])]
    unknown = await engine.involuntary("I went walking in the park with Rex", "Ann", set(),
                                       vector("I went walking in the park with Rex"))  # fmt: skip
    assert {r.id: r.score for r in unknown.records}[named] < 0.5 < scores[named]  # type: ignore[operator]


async def test_m16_an_episode_that_beats_its_record_is_the_hit_and_listed_first(kit: Kit) -> None:
    rid = await kit.seed("A quiet afternoon.", intensity=0.8)
    await kit.seed("", said="Ann said: the lighthouse keeper waved at us", join=rid)
    await kit.seed("", said="Ann said: we had tea", join=rid)
    engine, _ = recall(kit)
    [found] = await engine.plain("lighthouse keeper waved")
    assert found.hit_episode is not None
    assert found.episodes[0].id == found.hit_episode
    assert "lighthouse" in found.episodes[0].as_happened


async def test_m17_at_most_10_candidates_each_with_at_most_3_episodes(kit: Kit) -> None:
    for n in range(12):
        rid = await kit.seed(f"owl story number {n} about owls", intensity=0.7)
        for m in range(3):
            await kit.seed("", said=f"Ann said: owls {n} {m}", join=rid)
    engine, _ = recall(kit)
    found = await engine.plain("owls")
    assert len(found) == 10
    assert all(1 <= len(r.episodes) <= 3 for r in found)


# ------------------------------------------------------------------ composition in the box


def test_m18_rumination_collapses_to_the_best_scoring_candidate() -> None:
    same_words = [record("I miss the old house by the lake", score=0.4, rid="a"),
                  record("I miss the old house near the lake", score=0.7, rid="b")]  # fmt: skip
    assert [r.id for r in collapse_rumination(same_words)] == ["b"]  # Jaccard ≥ 0.6
    same_text = [record("Bob left.", score=0.9, rid="c", feeling="grief"),
                 record("bob  LEFT", score=0.3, rid="d", feeling="anger at him")]  # fmt: skip
    assert [r.id for r in collapse_rumination(same_text)] == ["c"]  # the same normalised conclusion
    close = [record("sunrise over hills", score=0.2, rid="e", vec=[1.0, 0.0]),
             record("morning light on a ridge", score=0.5, rid="f", vec=[0.95, 0.2])]  # fmt: skip
    assert [r.id for r in collapse_rumination(close)] == ["f"]  # cosine ≥ 0.92
    apart = [record("sunrise over hills", score=0.2, rid="g", vec=[1.0, 0.0]),
             record("a tax form", score=0.5, rid="h", vec=[0.0, 1.0])]  # fmt: skip
    assert [r.id for r in collapse_rumination(apart)] == ["g", "h"]


async def test_m18_one_recurring_feeling_comes_to_mind_once(kit: Kit) -> None:
    await kit.seed("Ann lost her dog Rex.", intensity=0.9)
    await kit.seed("Ann lost her dog Rex.", intensity=0.7)
    engine, _ = recall(kit)
    found = await engine.involuntary("her dog Rex", "Ann", set(), vector("her dog Rex"))
    assert [r.conclusion for r in found.records] == ["Ann lost her dog Rex."]


async def test_m19_a_candidate_felt_at_half_or_more_passes_without_the_filter(kit: Kit) -> None:
    strong = await kit.seed("Ann's owl Hoot is sick.", intensity=0.9)
    engine, chooser = recall(kit)
    found = await engine.involuntary("owl Hoot sick", "Ann", set(), vector("owl Hoot sick"))
    assert [r.id for r in found.records] == [strong]
    assert chooser.offered == [] and not found.filter_called  # subtle point 2: no call at all
    assert (found.asks_for_memory, found.asks_for_own) == (False, None)


async def test_m20_the_filter_gets_room_max_1_4_minus_passed_and_falls_back_to_3(kit: Kit) -> None:
    for words in ("alpha bravo", "charlie delta", "echo foxtrot", "golf hotel"):
        await kit.seed(f"owl {words}", intensity=0.95)
    for words in ("india juliet", "kilo lima", "mike november", "oscar papa", "quebec romeo"):
        await kit.seed(f"owl {words} weak", intensity=0.4, ago=timedelta(days=1))
    engine, chooser = recall(kit, FilterVerdict(keep=[0, 1, 2, 3]))
    found = await engine.involuntary("owl", "Ann", set(), vector("owl"))
    [(_, offered, room)] = chooser.offered
    assert room == 1 and len(offered) == 5  # max(1, 4 - 4 passed)
    assert len(found.records) == 4 + 4  # the keep list is not cut to the room (subtle point 2)
    engine, chooser = recall(kit, None)  # an unreadable answer
    found = await engine.involuntary("owl", "Ann", set(), vector("owl"))
    weak = [r.conclusion for r in found.records if "weak" in r.conclusion]
    assert weak == chooser.offered[0][1][:3]  # the first 3 of the rest


async def test_m20_the_filter_call_runs_at_temperature_0_2_with_a_strict_schema(kit: Kit) -> None:
    await kit.seed("Ann's owl Hoot is sick.", intensity=0.3, ago=timedelta(days=1))
    kit.model.script("filter", verdict(keep=[1]))
    async with kit.box() as box:
        await box.say("how is Hoot the owl?")
    [call] = kit.model.of("filter")
    assert call.body["temperature"] == 0.2
    schema = call.body["response_format"]["json_schema"]
    assert schema["strict"] is True
    assert set(schema["schema"]["required"]) == {"keep", "asks_for_memory", "asks_for_own"}
    assert "Keep at most 4." in call.user  # issue 33: the system text is the same on every call


def test_m21_the_filter_answer_reads_the_question_type() -> None:
    read = read_verdict({"keep": [2, 9, 1], "asks_for_memory": True, "asks_for_own": "dream"}, 3)
    assert read == FilterVerdict(keep=[1, 0], asks_for_memory=True, asks_for_own="dream")  # 9 is not offered
    assert read_verdict({"keep": [], "asks_for_memory": False, "asks_for_own": None}, 2) == FilterVerdict([])
    assert read_verdict({"keep": [1], "asks_for_memory": "yes", "asks_for_own": None}, 2) is None
    assert read_verdict({"keep": [1], "asks_for_memory": False, "asks_for_own": "lunch"}, 2) is None
    assert read_verdict(None, 2) is None


async def test_m22_records_in_the_focus_never_come_back(kit: Kit) -> None:
    rid = await kit.seed("Ann's owl Hoot is sick.", intensity=0.9)
    engine, _ = recall(kit, FilterVerdict(keep=[0]))
    involuntary = await engine.involuntary("owl Hoot", "Ann", {rid}, vector("owl Hoot"))
    deliberate = await engine.deliberate("owl Hoot", "Ann", {rid})
    assert rid not in [r.id for r in involuntary.records + deliberate.records]
    async with kit.box() as box:
        await box.say("my owl Hoot")  # recalled: it enters the focus (31)
        await box.say("my owl Hoot again")
    first, last = memory_block(kit.model.of("reply")[0]), memory_block(kit.model.of("reply")[-1])
    assert "1 memory came to mind" in first
    assert "nothing came to mind" in last  # the same words, but the record is in this conversation now


async def test_m23_a_deliberate_search_counts_only_what_the_filter_kept(kit: Kit) -> None:
    kept = await kit.seed("Ann sang by the fire.", intensity=0.9)
    await kit.seed("Ann sang badly at the fair.", intensity=0.9)
    engine, chooser = recall(kit)
    chooser.answers = [FilterVerdict(keep=[0])]
    found = await engine.deliberate("sang fire", None, set())
    assert len(chooser.offered) == 1 and chooser.offered[0][2] == 4  # scored, then the filter with room 4
    assert [r.id for r in found.records] == [kept]


async def test_m24_a_query_naming_a_person_finds_only_their_records(kit: Kit) -> None:
    bobs = await kit.seed("We fixed the fence.", author="Bob", author_id="u2", intensity=0.9)
    about = await kit.seed("Ann says Bob is kind.", intensity=0.9)
    await kit.seed("The fence fell in the storm.", author="Cy", author_id="u3", intensity=0.9)
    engine, chooser = recall(kit)
    chooser.answers = [FilterVerdict(keep=[0, 1, 2])]
    found = await engine.deliberate("what did I do with Bob on the fence", "Ann", set(), ["Bob", "Zed"])
    assert {r.id for r in found.records} == {bobs, about}  # by Bob (exact) or mentioning him
    chooser.offered.clear()
    nobody = await engine.deliberate("the fence and Zed", "Ann", set(), ["Bob", "Zed"])
    assert nobody.records == [] and chooser.offered == []  # empty, and no filter call


async def test_m24_the_person_counts_only_when_named_in_the_query(kit: Kit) -> None:
    await kit.seed("The fence fell in the storm.", author="Cy", author_id="u3", intensity=0.9)
    engine, chooser = recall(kit, FilterVerdict(keep=[0]))
    found = await engine.deliberate("the fence in the storm", "Ann", set())
    assert len(found.records) == 1  # Ann is the asker, not named: no restriction


async def test_m25_unknown_person_probe_searches_before_the_first_reply_call(kit: Kit) -> None:
    """Issue 33: the probe's spoken null is in the first reply call's senses; no draft is written and thrown
    away (the seed drafted, probed, and generated the reply again)."""
    async with kit.box() as box:
        await box.say("hi, I'm new here")
    [reply] = kit.model.of("reply")
    assert (
        '"Ann — who is this person, what do we have in common": nothing from before this conversation'
        in memory_block(reply)
    )
    assert [c.purpose for c in kit.model.calls] == ["arrival", "reply", "appraisal"]  # nothing thrown away


async def test_m25_the_probe_null_is_known_on_every_turn_of_a_strangers_conversation(kit: Kit) -> None:
    """Cost: a stranger's whole first conversation would double every reply; the null is in each first call."""
    async with kit.box() as box:
        await box.say("hi, I'm new here")
        kit.clock.advance(seconds=30)
        await box.say("what do you like to do?")
    replies = kit.model.of("reply")
    assert len(replies) == 2  # one reply call a turn
    for reply in replies:
        assert (
            '"Ann — who is this person, what do we have in common": nothing from before this conversation'
            in memory_block(reply)
        )


async def test_m25_no_probe_for_a_known_person_or_a_draft_that_is_not_a_world_act(kit: Kit) -> None:
    await kit.seed("Ann and I planted tulips.", intensity=0.2, ago=timedelta(days=30))  # not recalled now
    async with kit.box() as box:
        await box.say("hello")
    assert len(kit.model.of("reply")) == 1
    assert "who is this person" not in memory_block(kit.model.of("reply")[0])


async def test_m26_asks_for_memory_searches_the_words_and_counts_lived_and_constructs_apart(kit: Kit) -> None:
    await kit.ongoing()  # a turn of an ongoing conversation: no arrival (101)
    await kit.seed("Ann and I watched the eclipse.", intensity=0.3, ago=timedelta(days=2))
    await kit.seed("Ann's tulips bloomed.", intensity=0.3, ago=timedelta(days=2))
    kit.model.script("filter", verdict(keep=[], asks_for_memory=True), verdict(keep=[1]))
    async with kit.box() as box:
        await box.say("do you remember the eclipse we watched together?")
    [reply] = kit.model.of("reply")  # issue 33: the probe searched before the first reply call
    words = "do you remember the eclipse we watched together?"[:70]
    assert f'  - "{words}": 1 memory found.' in memory_block(reply)
    assert (
        "Ann and I watched the eclipse." in memory_block(reply).split("\nYOUR STATE")[1]
    )  # in the state now
    assert len(kit.model.of("filter")) == 2  # recall's, then the probe's search (23)


async def test_m27_asks_for_own_brings_three_recent_constructs_of_that_kind_unfiltered(kit: Kit) -> None:
    for n, text in enumerate(["the sea is calming", "people mean well", "rain is good", "owls are wise"]):
        kit.clock.advance(minutes=1)
        await kit.store().encode(
            mem.EncodeParams(
                record=mem.NewRecord(kind="construct", construct_kind="belief", author="Self", feeling="sure",
                                     conclusion=text, valence=0.2, intensity=0.1 + n / 100, vector=vector(text)),
                episode=mem.NewEpisode(author="Self", as_happened=f"I came to believe {text}"),
            )
        )  # fmt: skip
    await kit.seed("Ann asked about my views once.", intensity=0.2, ago=timedelta(days=3))
    kit.model.script("filter", verdict(keep=[], asks_for_own="belief"))
    async with kit.box() as box:
        await box.say("what do you believe about the world?")
    filters_before = len(kit.model.of("filter"))
    [reply] = kit.model.of("reply")  # issue 33: the probe ran before the first reply call
    second = memory_block(reply)
    thoughts = second.split("YOUR OWN THOUGHTS")[1].split("FOCUS")[0]
    assert "I believe: owls are wise" in thoughts and "I believe: rain is good" in thoughts
    assert "I believe: people mean well" in thoughts and "the sea is calming" not in thoughts  # the 3 newest
    assert filters_before == 1  # no filter for them
    assert (
        "owls are wise" not in second.split("\nYOUR STATE")[1].split("YOUR OWN THOUGHTS")[0]
    )  # never felt (35)


async def test_m28_about_person_brings_the_six_strongest_by_or_about_them(kit: Kit) -> None:
    ids = {}
    for n, strength in enumerate([0.1, 0.9, 0.3, 0.8, 0.5, 0.7, 0.2, 0.6]):
        ids[strength] = await kit.seed(f"moment {n} with Dee", author="Dee", author_id="u4", intensity=strength,
                                       ago=timedelta(days=n))  # fmt: skip
    engine, chooser = recall(kit)
    found = await engine.about_person("Dee")
    assert [r.id for r in found] == [ids[s] for s in (0.9, 0.8, 0.7, 0.6, 0.5, 0.3)]  # raw intensity
    assert chooser.offered == []


async def test_m29_plain_search_is_the_nearest_ten_unfiltered_focus_included(kit: Kit) -> None:
    rid = await kit.seed("Ann's owl Hoot is sick.", intensity=0.2)
    engine, chooser = recall(kit)
    found = await engine.plain("owl Hoot")
    assert [r.id for r in found] == [rid] and chooser.offered == []


async def test_m30_a_vector_of_another_length_is_never_scored(kit: Kit) -> None:
    await kit.store().encode(
        mem.EncodeParams(
            record=mem.NewRecord(author="Ann", feeling="x", conclusion="owls owls owls", valence=0.5, intensity=0.9,
                                 vector=[1.0] * 32),
            episode=mem.NewEpisode(author="Ann", as_happened="Ann said: owls", vector=[1.0] * 32),
        )
    )  # fmt: skip
    same = await kit.seed("owls owls owls", intensity=0.9)
    engine, _ = recall(kit)
    assert [r.id for r in await engine.plain("owls")] == [same]


async def test_m31_what_came_to_mind_stays_in_view_as_evoked(kit: Kit) -> None:
    await kit.ongoing()  # a turn of an ongoing conversation: no arrival (101)
    rid = await kit.seed("Ann's owl Hoot is sick.", valence=-0.5, intensity=0.9, told="Ann told Pip that Hoot was sick.",
                         ago=timedelta(days=2))  # fmt: skip
    for words in ("kilo lima", "mike november", "oscar papa", "quebec romeo", "sierra tango"):
        await kit.seed(f"filler {words}", intensity=0.3, ago=timedelta(hours=1))  # more recently felt
    async with kit.box() as box:
        await box.say("my owl Hoot")
        await box.say("tell me something")
    later = memory_block(kit.model.of("reply")[-1])
    assert "Hoot" not in later.split("\nYOUR STATE")[1].split("\nFOCUS")[0]  # out of the recent five now
    evoked = later.split("Evoked from before (retold):")[1]
    assert "Ann's owl Hoot is sick." in evoked and "Ann told Pip that Hoot was sick." in evoked
    state = await kit.peer().request("memory.conversation.get", mem.ConversationGetParams(person="u1"))
    focus = state.state["focus"]  # type: ignore[attr-defined]
    assert [e["record_id"] for e in focus if e["kind"] == "evoked"] == [rid]


async def test_m31_a_recalled_construct_does_not_enter_the_focus(kit: Kit) -> None:
    await kit.store().encode(
        mem.EncodeParams(
            record=mem.NewRecord(kind="construct", construct_kind="belief", author="Self", feeling="sure",
                                 conclusion="owls are wise", valence=0.2, intensity=0.9, vector=vector("owls are wise")),
            episode=mem.NewEpisode(author="Self", as_happened="I came to believe owls are wise"),
        )
    )  # fmt: skip
    async with kit.box() as box:
        await box.say("are owls wise?")
    assert "I believe: owls are wise" in memory_block(kit.model.of("reply")[0])
    state = await kit.peer().request("memory.conversation.get", mem.ConversationGetParams(person="u1"))
    assert [e for e in state.state["focus"] if e["kind"] == "evoked"] == []  # type: ignore[attr-defined]


async def test_m23_the_search_tool_is_a_deliberate_search_of_this_turn(kit: Kit) -> None:
    await kit.ongoing()  # a turn of an ongoing conversation: no arrival (101)
    import json

    from box.protocol.models import ModelRequestResult

    await kit.seed(
        "Ann sang by the fire.", intensity=0.3, ago=timedelta(days=2), told="Ann sang for Pip by the fire."
    )
    await kit.seed("Ann planted tulips.", intensity=0.1, ago=timedelta(days=40))
    call = {
        "id": "t1",
        "type": "function",
        "function": {"name": "search", "arguments": json.dumps({"query": "fire"})},
    }
    tools = ModelRequestResult(
        status=200,
        body={"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [call]}}]},
    )
    kit.model.script("reply", tools, envelope("you sang!"))
    kit.model.script("filter", verdict(keep=[]), verdict(keep=[1]))
    async with kit.box(responder={"tools": ["search"]}) as box:
        await box.say("what did I do that evening?")
    result = kit.model.of("reply")[1].body["messages"][-1]
    assert result["role"] == "tool" and "Ann sang for Pip by the fire." in result["content"]
    assert "tulips" not in result["content"]  # only what the filter kept (23)
    assert len(kit.model.of("filter")) == 2
