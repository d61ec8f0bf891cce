"""The contexts' rendering rules (mechanisms 11, 12, 40): tags, feeling bands, the prompt texts themselves."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from box.memory import contexts
from box.memory.focus import Focus
from box.memory.prompts import PROMPTS_DIR, Prompts
from box.memory.state import compose
from box.memory.words import INTENSITY_SCALE
from box.protocol.memory import RecordView

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


def scene(person: str = "Ann", person_id: str | None = "u1") -> contexts.Scene:
    return contexts.Scene(
        imp="pip", person=person, person_id=person_id, now=NOW, timezone="UTC", channel_kind="dm"
    )


def record(conclusion: str, *, author: str = "Ann", author_id: str | None = "u1", origin: str = "lived",
           valence: float = 0.3, felt: float = 0.5, intensity: float = 0.5) -> RecordView:  # fmt: skip
    return RecordView(
        id="r1", author=author, author_id=author_id, origin=origin, feeling="warmth", conclusion=conclusion,  # type: ignore[arg-type]
        valence=valence, intensity=intensity, felt=felt, happened_at=NOW - timedelta(days=2), last_felt=NOW,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("rec", "expected"),
    [
        (record("An old family story.", author="Self", author_id=None, origin="given"), "from your past"),
        (record("Ann loves the sea.", author="Ann"), "ABOUT 'Ann'"),
        (record("so Ann was late again.", author="Bob", author_id="u2"), "ABOUT 'Ann' (told by 'Bob')"),
        (
            record("ann was late again.", author="Bob", author_id="u2"),
            "with 'Bob'",
        ),  # no name as written (32)
        (record("We talked about boats.", author="Ann"), "with this same person"),
        (record("We talked about boats.", author="Bob", author_id="u2"), "with 'Bob'"),
        (record("Annabel came by.", author="Bob", author_id="u2"), "with 'Bob'"),  # a whole word only
    ],
)
def test_m11_record_tags(rec: RecordView, expected: str) -> None:
    assert contexts.tag(Prompts.load(), None, rec, scene()) == expected


def test_m11_the_person_is_matched_by_id_before_name() -> None:
    renamed = record("We talked about boats.", author="Annie", author_id="u1")
    assert contexts.tag(Prompts.load(), None, renamed, scene()) == "with this same person"


@pytest.mark.parametrize(
    ("felt", "valence", "words"),
    [
        (0.9, -0.7, "deeply painful, hurting, overwhelming"),
        (0.6, -0.1, "unpleasant, strong"),
        (0.45, 0.0, "neither good nor bad, clearly there"),
        (0.2, 0.3, "pleasant, faint"),
        (0.1, 0.8, "deeply good, warm, barely a trace"),
    ],
)
def test_m12_feelings_are_shown_in_bands_of_words(felt: float, valence: float, words: str) -> None:
    state = compose([record("A day at the fair.", felt=felt, intensity=felt, valence=valence)], [])
    view = contexts.ReplyView(scene=scene(), state=state, focus=Focus())
    rendered = contexts.state_block(Prompts.load(), None, view)
    assert f"[1] {words}: warmth." in rendered
    assert not re.search(r"\d\.\d", rendered)


def test_m12_the_reply_context_uses_felt_strength_the_filter_raw_intensity() -> None:
    faded = record("A day at the fair.", felt=0.25, intensity=0.9)
    state = compose([faded], [])
    reply = contexts.state_block(
        Prompts.load(), None, contexts.ReplyView(scene=scene(), state=state, focus=Focus())
    )
    assert "pleasant, faint" in reply  # subtle point 20: felt now
    offered = contexts.filter_user(Prompts.load(), None, "the fair", [faded], NOW, "UTC", 4)
    assert "pleasant, overwhelming" in offered  # raw intensity


def test_m12_no_prompt_template_holds_a_number_outside_the_intensity_scale() -> None:
    """Every memory prompt text: decimal numbers only in the fixed anchor scale (13), never next to a feeling."""
    for path in sorted(PROMPTS_DIR.glob("*.txt")):
        assert not re.search(r"\d\.\d", path.read_text(encoding="utf-8")), path.name
    assert re.search(r"\d\.\d", INTENSITY_SCALE)  # the scale is filled in from words.py (13)
    rules = contexts.reply_rules(Prompts.load(), None)
    assert re.findall(r"\d\.\d", rules.replace(INTENSITY_SCALE, "")) == []


def test_m56_values_in_the_language_of_the_words_field_names_in_english() -> None:
    prompts = Prompts.load()
    for system in (contexts.reply_rules(prompts, None), contexts.appraisal_system(prompts, None, "pip")):
        assert (
            "Write every value in the language of the words you heard; the field names stay in English."
            in system
        )
    assert "in the language the conversation is held in" in contexts.summary_system(
        prompts, None, "pip", "Ann"
    )
