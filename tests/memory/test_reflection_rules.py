"""The pure rules of reflection and its context (mechanisms 71-73, 76, 77, 89; subtle point 11), by table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from box.memory.focus import Focus, FocusEntry, FocusEpisode, moment_entry
from box.memory.introspection import Entry, Shown, duration_words, gap, recent_entries, shown
from box.memory.moment import Felt
from box.memory.reflection import circled, read_answer, refeels, target
from box.protocol.memory import RecordView, SlotEntry

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


def record(rid: str, *, kind: str = "lived", at: datetime = NOW, valence: float = 0.5) -> RecordView:
    return RecordView(
        id=rid, kind=kind, construct_kind="belief" if kind == "construct" else None,  # type: ignore[arg-type]
        author="Ann", feeling="f", conclusion=f"conclusion {rid}", valence=valence, intensity=0.5, felt=0.5,
        happened_at=at, last_felt=at, statement=f"statement {rid}" if kind == "construct" else None,
    )  # fmt: skip


def held(rid: str, last_felt: datetime) -> SlotEntry:
    return SlotEntry(record=record(rid, kind="construct", at=last_felt), activated_at=last_felt)


def entry(rid: str, last_felt: datetime, valence: float = 0.5) -> Entry:
    return Entry(rid, "lived", "f", "c", valence, 0.5, last_felt, last_felt)


# ------------------------------------------------------------------ 71: reading the answer


def answer(**changes: Any) -> dict[str, Any]:
    base = {"thought": " A thought. ", "feeling": "calm", "conclusion": "So it is.", "valence": 0.2,
            "intensity": 0.4, "reinforces": 2, "act": "belief", "text": " Yes. "}  # fmt: skip
    return {**base, **changes}


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, ("A thought.", 2, "belief", "Yes.")),
        ({"act": "sing"}, ("A thought.", 2, "none", "Yes.")),  # an unknown act is none
        ({"reinforces": True}, ("A thought.", None, "belief", "Yes.")),  # a boolean is no index
        ({"reinforces": 1.5}, ("A thought.", None, "belief", "Yes.")),
        ({"text": "  "}, ("A thought.", 2, "belief", None)),  # blank text is no text (81)
        ({"text": None, "reinforces": None}, ("A thought.", None, "belief", None)),
    ],
)
def test_m71_an_answer_is_read(changes: dict[str, Any], expected: tuple[Any, ...]) -> None:
    read = read_answer(answer(**changes))
    assert read is not None
    assert (read.thought, read.reinforces, read.act, read.text) == expected


@pytest.mark.parametrize(
    "changes",
    [{"thought": ""}, {"thought": None}, {"valence": "warm"}, {"intensity": None}, {"valence": float("nan")}],
)
def test_m71_an_answer_without_a_thought_or_a_feeling_is_no_step(changes: dict[str, Any]) -> None:
    assert read_answer(answer(**changes)) is None


def test_m71_no_answer_is_no_step() -> None:
    assert read_answer(None) is None


# ------------------------------------------------------------------ 72, 89: what is shown, in which order


def test_m72_the_focus_tail_newest_first_one_per_record_then_the_store() -> None:
    focus = Focus(
        [
            moment_entry(record_id="a", author="Ann", author_id="u1", feeling="old a", conclusion="", valence=0.1,
                         intensity=0.2, at=NOW - timedelta(minutes=3), text="t", message_id="m1"),
            moment_entry(record_id=None, author="Ann", author_id="u1", feeling="", conclusion="", valence=0,
                         intensity=0, at=NOW - timedelta(minutes=2), text="unkept", message_id="m2"),
            FocusEntry(kind="evoked", record_id="e", author="Bob", feeling="evoked", at=NOW - timedelta(days=9),
                       episodes=[FocusEpisode(at=NOW - timedelta(days=9), text="Bob and Pip sang.")]),
            moment_entry(record_id="a", author="Ann", author_id="u1", feeling="new a", conclusion="", valence=0.1,
                         intensity=0.2, at=NOW - timedelta(minutes=1), text="t2", message_id="m3"),
        ]
    )  # fmt: skip
    recent = [record("x", kind="construct"), record("a"), record("s1"), record("s2")]
    chosen = recent_entries(focus, recent, limit=8)
    assert [(e.record_id, e.feeling) for e in chosen] == [
        ("a", "new a"), ("e", "evoked"), ("s1", "f"), ("s2", "f"),
    ]  # fmt: skip
    assert [ev.text for ev in chosen[1].events] == ["Bob and Pip sang."]


@pytest.mark.parametrize(
    ("kinds", "limit", "expected"),
    [
        (["lived"] * 10, 8, 8),
        (["construct", "construct"] + ["lived"] * 8, 8, 6),  # subtle point 11: dropped after taking 8
        (["lived"] * 3, 8, 3),
        (["lived"] * 5, 2, 2),
    ],
)
def test_m72_at_most_the_limit_constructs_dropped_after_taking_it(
    kinds: list[str], limit: int, expected: int
) -> None:
    recent = [record(f"r{n}", kind=k) for n, k in enumerate(kinds)]
    assert len(recent_entries(None, recent, limit)) == expected


def test_m89_the_slot_is_indexed_first() -> None:
    items = shown([held("h1", NOW), held("h2", NOW)], [entry("e1", NOW, -0.3)])
    assert items == [Shown("h1", 0.5, True), Shown("h2", 0.5, True), Shown("e1", -0.3, False)]


@pytest.mark.parametrize(("reinforces", "expected"), [(None, None), (0, None), (1, "h1"), (3, "e1"), (4, None),
                                                      (-1, None)])  # fmt: skip
def test_m89_reinforces_names_the_nth_shown_item(reinforces: int | None, expected: str | None) -> None:
    items = shown([held("h1", NOW), held("h2", NOW)], [entry("e1", NOW)])
    found = target(items, reinforces)
    assert (found.record_id if found is not None else None) == expected


# ------------------------------------------------------------------ 73: the gap note


@pytest.mark.parametrize(
    ("slot_ago", "entry_ago", "expected"),
    [
        (None, None, None),
        (None, timedelta(hours=6), None),
        (None, timedelta(hours=6, seconds=1), timedelta(hours=6, seconds=1)),
        (timedelta(hours=1), timedelta(days=3), None),  # the first slot construct decides (subtle point 11)
        (timedelta(hours=9), timedelta(minutes=1), timedelta(hours=9)),
    ],
)
def test_m73_the_gap_is_measured_from_the_first_shown_item(
    slot_ago: timedelta | None, entry_ago: timedelta | None, expected: timedelta | None
) -> None:
    slot = [held("h", NOW - slot_ago)] if slot_ago is not None else []
    entries = [entry("e", NOW - entry_ago)] if entry_ago is not None else []
    assert gap(slot, entries, NOW) == expected


@pytest.mark.parametrize(
    ("elapsed", "words"),
    [
        (timedelta(hours=6, minutes=30), "6 hours"),
        (timedelta(hours=1), "1 hour"),
        (timedelta(hours=47), "47 hours"),
        (timedelta(days=2), "2 days"),
        (timedelta(days=13), "13 days"),
        (timedelta(days=14), "2 weeks"),
        (timedelta(days=7 * 8 + 3), "8 weeks"),
        (timedelta(days=60), "2 months"),
        (timedelta(days=364), "12 months"),
        (timedelta(days=365), "1 year"),
        (timedelta(days=800), "2 years"),
    ],
)
def test_m73_a_gap_in_words(elapsed: timedelta, words: str) -> None:
    assert duration_words(elapsed) == words


# ------------------------------------------------------------------ 76, 77


@pytest.mark.parametrize(
    ("valence", "named", "conclusion"),
    [(-0.5, True, ""), (-0.01, True, ""), (-0.5, False, "c"), (0.0, True, "c"), (0.5, True, "c")],
)
def test_m77_a_negative_thought_naming_an_entry_loses_its_conclusion(
    valence: float, named: bool, conclusion: str
) -> None:
    felt = Felt("f", "c", valence, 0.5)
    assert circled(felt, Shown("r", 0.5, False) if named else None).conclusion == conclusion


@pytest.mark.parametrize(
    ("entry_valence", "thought_valence", "recurred", "restores"),
    [
        (0.5, 0.5, False, True),
        (0.0, 0.5, False, True),
        (0.5, 0.0, False, True),
        (-0.5, -0.1, False, True),
        (-0.5, 0.0, False, False),
        (0.5, -0.1, False, False),
        (0.5, 0.5, True, False),  # a recurring thought does not restore its target (subtle point 12)
    ],
)
def test_m76_the_named_entry_is_restored_when_the_signs_agree(
    entry_valence: float, thought_valence: float, recurred: bool, restores: bool
) -> None:
    felt = Felt("f", "c", thought_valence, 0.8)
    found = refeels(felt, Shown("r", entry_valence, False), recurred)
    assert (found is not None) == restores
    if found is not None:
        assert (found.record_id, found.toward) == ("r", 0.8)
    assert refeels(felt, None, recurred) is None
