"""C. State and focus (mechanisms 32-43; subtle points 1, 9, 10).

``compose`` and the focus as pure rules; the reply context through the real box against the host's store.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from box.common.laws import Params
from box.memory import contexts
from box.memory.focus import Focus, FocusEntry, moment_entry
from box.memory.prompts import Prompts
from box.memory.state import State, compose
from box.protocol import memory as mem
from box.protocol.memory import EpisodeView, RecordView
from tests.memory.engine_kit import NOW, Kit, appraisal, draft, envelope, facts, memory_block, verdict

pytestmark = pytest.mark.anyio
AT = datetime(2026, 12, 1, tzinfo=UTC)


def record(rid: str, felt: float, *, kind: str = "lived", conclusion: str | None = None, intensity: float | None = None,
           episodes: list[EpisodeView] | None = None, author: str = "Ann") -> RecordView:  # fmt: skip
    return RecordView(
        id=rid, kind=kind, construct_kind="belief" if kind == "construct" else None, author=author,  # type: ignore[arg-type]
        feeling=f"feeling {rid}", conclusion=conclusion or f"conclusion {rid} {rid}x", valence=0.4,
        intensity=intensity if intensity is not None else felt, felt=felt, happened_at=AT, last_felt=AT,
        episodes=episodes or [],
    )  # fmt: skip


def episode(
    eid: str, rid: str, text: str, *, at: datetime = AT, message_id: str | None = None
) -> EpisodeView:
    return EpisodeView(id=eid, record_id=rid, author="Ann", as_happened=f"Ann said: {text}", told=f"Ann told Pip {text}.",
                       happened_at=at, message_id=message_id)  # fmt: skip


def scene() -> contexts.Scene:
    return contexts.Scene(imp="pip", person="Ann", person_id="u1", now=NOW, timezone="UTC", channel_kind="dm")


def view(state: State, focus: Focus | None = None, **fields: object) -> contexts.ReplyView:
    return contexts.ReplyView(scene=scene(), state=state, focus=focus or Focus(), **fields)  # type: ignore[arg-type]


# ------------------------------------------------------------------ the rules


def test_m32_state_is_a_greedy_skip_within_the_budget() -> None:
    recent = [record(f"r{n}", 0.9) for n in range(5)]  # 4.5
    associations = [record("big", 0.8), record("small", 0.4)]
    state = compose(recent, associations)
    ids = [r.id for r in state.entries]
    assert ids == ["r0", "r1", "r2", "r3", "r4", "small"]  # sorted by felt; "big" skipped, "small" still fits
    assert sum(r.felt for r in state.entries) <= 5.0


def test_m32_the_strongest_is_always_admitted() -> None:
    state = compose([record("a", 0.7), record("b", 0.3)], [], Params(state_mass_budget=0.1))
    assert [r.id for r in state.entries] == ["a"]


def test_m33_a_fresh_association_replaces_the_recent_record_with_its_id() -> None:
    state = compose([record("x", 0.2), record("y", 0.5)], [record("x", 0.9)])
    assert [(r.id, r.felt) for r in state.entries] == [("x", 0.9), ("y", 0.5)]  # no duplicate, felt now
    assert state.associated == {"x"}


def test_m34_only_associations_left_out_by_the_budget_go_to_the_focus() -> None:
    recent = [record(f"r{n}", 1.0) for n in range(6)]  # the sixth recent one is skipped too
    state = compose(recent, [record("evoked", 0.6)])
    assert [r.id for r in state.left_out] == ["evoked"]
    rendered = contexts.focus_block(Prompts.load(), None, view(state, evoked_now=state.left_out))
    assert "Evoked from before (retold):" in rendered and "conclusion evoked" in rendered


def test_m35_a_construct_is_never_in_the_state() -> None:
    state = compose(
        [record("c1", 0.9, kind="construct")], [record("c2", 0.9, kind="construct"), record("l", 0.2)]
    )
    assert [r.id for r in state.entries] == ["l"] and state.left_out == []


def test_m37_a_recurring_feeling_shows_once_the_most_intense_with_its_count() -> None:
    same = "I keep losing my keys at home"
    state = compose([record("a", 0.5, conclusion=same, intensity=0.5), record("b", 0.4, conclusion=same, intensity=0.9),
                     record("c", 0.3)], [])  # fmt: skip
    feelings = state.feelings()
    assert [(f.record.id, f.recurred) for f in feelings] == [("b", 2), ("c", 1)]
    rendered = contexts.state_block(Prompts.load(), None, view(state))
    assert rendered.count("I keep losing my keys") == 1 and "This feeling recurred 2 times." in rendered


def test_m38_each_state_feeling_has_an_index() -> None:
    state = compose([record("a", 0.8), record("b", 0.5)], [])
    rendered = contexts.state_block(Prompts.load(), None, view(state))
    assert "\n[1] " in rendered and "\n[2] " in rendered
    assert [f.index for f in state.feelings()] == [1, 2]


def test_m39_events_under_state_feelings_listed_once_retold_this_conversation_skipped() -> None:
    shared = episode("e1", "a", "we sailed", message_id="old-1")
    state = compose(
        [record("a", 0.8, episodes=[shared, episode("e2", "a", "the wind rose", message_id="here-1")]),
         record("b", 0.5, episodes=[shared])], [],
    )  # fmt: skip
    focus = Focus([moment_entry(record_id="a", author="Ann", author_id="u1", feeling="joy", conclusion="",
                                valence=0.5, intensity=0.5, at=AT, text="Ann said: the wind rose", message_id="here-1")])  # fmt: skip
    rendered = contexts.focus_block(Prompts.load(), None, view(state, focus))
    before = rendered.split("From before this conversation")[1].split("This conversation, as it happened")[0]
    assert before.count("Ann told Pip we sailed.") == 1  # once, retold
    assert "the wind rose" not in before  # already in this conversation


def test_m40_focus_as_it_happened_evoked_retold_with_dated_sub_lines() -> None:
    evoked = record("old", 0.3, episodes=[episode("e1", "old", "we met", at=AT - timedelta(days=14)),
                                          episode("e2", "old", "we met again", at=AT - timedelta(days=7))])  # fmt: skip
    focus = Focus([moment_entry(record_id="m", author="Ann", author_id="u1", feeling="glad", conclusion="",
                                valence=0.5, intensity=0.5, at=NOW, text="Ann said: hi\npip replied: hello", message_id="m1")])  # fmt: skip
    focus.evoke(evoked)
    rendered = contexts.focus_block(Prompts.load(), None, view(State(), focus))
    assert "- just now: Ann said: hi\n  pip replied: hello" in rendered  # as it happened
    assert "Ann told Pip we met again." in rendered and "Ann said: we met" not in rendered  # retold
    assert (
        "\n  2 weeks ago: Ann told Pip we met." in rendered
        and "\n  1 week ago: Ann told Pip we met again." in rendered
    )


def test_m42_an_evoked_entry_whose_record_is_in_the_state_is_not_repeated() -> None:
    focus = Focus()
    focus.evoke(record("twice", 0.6, conclusion="the lighthouse at dawn"))
    state = compose([record("twice", 0.6, conclusion="the lighthouse at dawn")], [])
    rendered = contexts.reply_block(Prompts.load(), None, view(state, focus))
    assert rendered.count("the lighthouse at dawn") == 1


def test_m43_the_focus_keeps_the_last_100_entries() -> None:
    focus = Focus()
    for n in range(105):
        focus.add(FocusEntry(kind="moment", record_id=f"r{n}", author="Ann", at=AT, text=f"moment {n}"))
    assert (
        len(focus.entries) == 100
        and focus.entries[0].record_id == "r5"
        and focus.entries[-1].record_id == "r104"
    )


# ------------------------------------------------------------------ in the turn


async def test_m34_left_out_association_shows_as_evoked_in_the_reply(kit: Kit) -> None:
    for words in ("alpha bravo", "charlie delta", "echo foxtrot", "golf hotel", "india juliet"):
        await kit.seed(f"recent {words}", intensity=1.0)
    await kit.seed("Ann's kite flew over the hill.", intensity=0.9, ago=timedelta(days=1))
    async with kit.box() as box:
        await box.say("the kite over the hill")
    block = memory_block(kit.model.of("reply")[0])
    assert "Ann's kite flew" not in block.split("\nYOUR STATE")[1].split("\nFOCUS")[0]
    assert "Ann's kite flew over the hill." in block.split("Evoked from before (retold):")[1]


async def test_m35_a_recalled_construct_is_not_felt(kit: Kit) -> None:
    from tests.memory.engine_kit import vector

    await kit.store().encode(
        mem.EncodeParams(
            record=mem.NewRecord(kind="construct", construct_kind="belief", author="Self", feeling="sure",
                                 conclusion="kites love wind", valence=0.2, intensity=0.9, vector=vector("kites love wind")),
            episode=mem.NewEpisode(author="Self", as_happened="I came to believe it"),
        )
    )  # fmt: skip
    async with kit.box() as box:
        await box.say("kites love wind")
    block = memory_block(kit.model.of("reply")[0])
    assert "kites love wind" not in block.split("\nYOUR STATE")[1].split("YOUR OWN THOUGHTS")[0]
    assert "I believe: kites love wind" in block.split("YOUR OWN THOUGHTS")[1]


async def test_m36_the_state_is_recomposed_before_every_reply_call(kit: Kit) -> None:
    await kit.ongoing()  # a turn of an ongoing conversation: no arrival (101)
    await kit.seed("Ann and I flew a red kite.", intensity=0.3, ago=timedelta(days=3))
    for words in ("alpha bravo", "charlie delta", "echo foxtrot", "golf hotel", "india juliet"):
        await kit.seed(
            f"recent {words}", intensity=0.2, ago=timedelta(hours=1)
        )  # the five most recently felt
    kit.model.script("reply", envelope("wait", action="search", action_text="red kite"), envelope("yes!"))
    kit.model.script("filter", verdict(keep=[]), verdict(keep=[1]))
    async with kit.box() as box:
        await box.say("what about that day?")
    first, second = (memory_block(c) for c in kit.model.of("reply")[:2])
    state_of = lambda block: block.split("\nYOUR STATE")[1].split("\nFOCUS")[0]  # noqa: E731
    assert "red kite" not in state_of(first) and "red kite" in state_of(second)


async def test_m38_refeels_maps_the_index_to_the_record_and_has_no_effect(kit: Kit) -> None:
    rid = await kit.seed("Ann's owl Hoot is sick.", intensity=0.9)
    engine = kit.engine()
    turn = await engine.begin(facts("Hoot the owl"))
    assert "[1] " in (turn.block() or "")
    before = await kit.record(rid)
    assert await turn.next_hop(draft(refeels=["1"])) is False
    assert turn.refeels == [rid]  # type: ignore[attr-defined]
    assert (await kit.record(rid)).intensity == before.intensity


async def test_m41_each_exchange_enters_the_focus_under_its_own_feeling(kit: Kit) -> None:
    await kit.ongoing()  # a turn of an ongoing conversation: no arrival (101)
    kit.model.script(
        "appraisal", appraisal(feeling="joy", valence=0.6), appraisal(feeling="contentment", valence=0.2)
    )
    async with kit.box() as box:
        await box.say("hello")
        await box.say("how are you")
    saved = await kit.peer().request("memory.conversation.get", mem.ConversationGetParams(person="u1"))
    moments = [e for e in saved.state["focus"] if e["kind"] == "moment"]  # type: ignore[attr-defined]
    assert [m["feeling"] for m in moments] == ["joy", "contentment"]
    assert moments[0]["record_id"] == moments[1]["record_id"]  # one stored record (joined), two moments
    assert len(await kit.records()) == 1
