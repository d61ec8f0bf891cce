"""The memory's pure laws (box/common/laws.py): tables with the expected numbers written out."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from box.common.laws import (
    Temperament,
    admit,
    bend,
    collapse,
    fade_factor,
    felt_strength,
    forgetting_threshold,
    jaccard,
    mentions,
    names_in,
    normalised,
    query_names,
    refelt,
    restored,
    rumination_clusters,
    same_feeling,
    word_set,
)

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
DAY = 86_400.0

# ------------------------------------------------------------------ G. strength over time


def test_m67_fade_factor_after_one_day() -> None:
    assert fade_factor(0.5, 1 * DAY) == pytest.approx(0.8015719, abs=1e-6)


def test_m68_negative_fades_slower() -> None:
    assert fade_factor(-0.5, 1 * DAY) == pytest.approx(0.8605162, abs=1e-6)
    assert fade_factor(-0.5, 5 * DAY) > fade_factor(0.5, 5 * DAY)


def test_m67_after_1000_days_the_factor_is_the_floor() -> None:
    assert fade_factor(0.5, 1000 * DAY) == pytest.approx(0.3, abs=1e-9)
    assert fade_factor(-0.5, 1000 * DAY) == pytest.approx(0.3, abs=1e-9)


@pytest.mark.parametrize("days", [0.0, 0.5, 3.0, 30.0, 10_000.0])
def test_m67_felt_strength_never_below_floor(days: float) -> None:
    felt = felt_strength(0.9, 0.4, NOW - timedelta(days=days), NOW)
    assert 0.27 <= felt <= 0.9


def test_m67_fresh_record_is_felt_at_full_intensity() -> None:
    assert felt_strength(0.9, 0.4, NOW, NOW) == pytest.approx(0.9)


def test_m115_given_record_at_720_hours_is_felt_at_about_0_24() -> None:
    # Subtle point 7: lastFelt = happenedAt = now − 720 h; valence −0.7 fades with τ = 4.5 d.
    felt = felt_strength(0.8, -0.7, NOW - timedelta(hours=720), NOW)
    assert felt == pytest.approx(0.2407127, abs=1e-6)


@pytest.mark.parametrize(
    ("days", "threshold"),
    [
        (0.0, 0.0),
        (0.5, 0.0),
        (0.999, 0.0),
        (1.0, 0.2),
        (3.0, 0.3129150),  # ln-time between (1, 0.2) and (7, 0.4)
        (7.0, 0.4),
        (10.0, 0.5),
        (20.0, 0.5630930),  # ln-time between (10, 0.5) and (30, 0.6)
        (30.0, 0.6),
        (180.0, 0.8),
        (5000.0, 0.8),
    ],
)
def test_m112_forgetting_threshold(days: float, threshold: float) -> None:
    assert forgetting_threshold(days) == pytest.approx(threshold, abs=1e-6)


@pytest.mark.parametrize(
    ("current", "toward", "expected"),
    [(0.2, 0.7, 0.5), (0.8, 0.3, 0.8), (0.5, 0.5, 0.5), (0.0, 1.0, 0.6)],
)
def test_m70_restored_closes_six_tenths_never_past(current: float, toward: float, expected: float) -> None:
    assert restored(current, toward) == pytest.approx(expected)


def test_m69_refelt_restores_from_the_faded_value() -> None:
    # 0.8 last felt 3 days ago is felt at 0.8 × (0.3 + 0.7/e) = 0.4460125; then 0.6 of the gap to 0.9.
    assert refelt(0.8, 0.4, NOW - timedelta(days=3), NOW, toward=0.9) == pytest.approx(0.7184050, abs=1e-6)


def test_m69_refelt_writes_the_faded_value_when_now_is_weaker() -> None:
    assert refelt(0.8, 0.4, NOW - timedelta(days=3), NOW, toward=0.3) == pytest.approx(0.4460125, abs=1e-6)


# ------------------------------------------------------------------ F. temperament


@pytest.mark.parametrize(("valence", "intensity"), [(0.37, 0.81), (-0.9, 0.05), (0.0, 1.0)])
def test_m60_defaults_leave_values_unchanged(valence: float, intensity: float) -> None:
    assert bend(valence, intensity) == (valence, intensity)


def test_m60_with_bias_zero_valence_is_only_clamped() -> None:
    assert bend(1.5, 1.2) == (1.0, 1.0)
    assert bend(-1.5, -0.2) == (-1.0, 0.0)


@pytest.mark.parametrize(
    ("valence", "bias", "expected"),
    [
        (0.3, 0.5, 0.6693252),
        (0.3, -0.5, -0.1882096),
        (1.0, 0.5, 0.9996320),  # clamped to 0.999 before atanh
        (-1.0, -0.5, -0.9996320),
    ],
)
def test_m60_bias_shifts_valence_in_logit_space(valence: float, bias: float, expected: float) -> None:
    bent, _ = bend(valence, 0.5, Temperament(valence_bias=bias))
    assert bent == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(("amp", "expected"), [(2.0, 0.8), (0.5, 0.4096), (0.0, 0.0), (-1.0, 0.0)])
def test_m60_amplification_bends_intensity_as_a_power(amp: float, expected: float) -> None:
    _, intensity = bend(0.2, 0.64, Temperament(intensity_amplification=amp))
    assert intensity == pytest.approx(expected)


def test_m96_avoidance_weight_is_at_least_one() -> None:
    assert Temperament(avoidance_weight=0.2).avoidance_weight == 1.0


# ------------------------------------------------------------------ B. names (mechanism 15)


# Issue 32 departs from mechanism 15's "every capitalised mid-sentence word": names are the people the imp knows
# and explicit mentions (the tables: tests/memory/test_names_and_rule_law.py).


def test_m15_names_are_the_person_lowercased_explicit_mentions_and_known_people_named() -> None:
    text = "Yesterday I met Anna and Émile. Then @bob came on Monday! We spoke Python with Łukasz"
    assert names_in(text, "Carla", ["Émile", "Łukasz", "Zoe"]) == ["carla", "bob", "Émile", "Łukasz"]


def test_m15_person_is_not_repeated() -> None:
    assert names_in("so Anna said", "Anna", ["Anna"]) == ["anna"]
    assert names_in("so Anna said", "  ", ["Anna"]) == ["Anna"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I told ANNA about it", True),  # case-insensitive but for the first letter (issue 32)
        ("Annabel is here", False),  # whole word only
        ("Anna's book", True),
        ("anna's book", False),  # written as no name
        ("", False),
    ],
)
def test_m15_mentions_whole_word_written_as_a_name(text: str, expected: bool) -> None:
    assert mentions(text, ["Anna"]) is expected


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("a.b*(c)", "met a.b*(c) today", True),
        ("a.b*(c)", "met aXb*(c) today", False),  # "." is not a wildcard
        ("Ann%", "Anna was here", False),  # SQL LIKE's % is literal
        ("J_n", "Jon was here", False),  # and so is _
        ("C++", "a C++ fan", True),  # a name ending in symbols
        ("[bot]", "the [bot] said", True),
        ("O'Neil", "ask O'NEIL", True),
        ("O'Neil", "ask o'neil", False),  # letters only: a name only written as one (issue 32)
    ],
)
def test_m15_mentions_escapes_regex_and_sql_characters(name: str, text: str, expected: bool) -> None:
    assert mentions(text, [name]) is expected


def test_m15_empty_names_match_nothing() -> None:
    assert mentions("anything at all", ["", "  "]) is False
    assert mentions("anything at all", []) is False


def test_m24_query_names_include_the_person_only_when_named() -> None:
    assert query_names("what about Rex and Carla", "Carla") == ["Carla"]  # Rex: nobody the imp knows
    assert query_names("what about Rex", "Carla", ["Rex"]) == ["Rex"]
    assert query_names("what about @rex and carla", "Carla") == [
        "rex"
    ]  # an explicit mention; "carla": no name


# ------------------------------------------------------------------ B. rumination (mechanism 18)


def test_m18_word_set_ignores_stop_words_and_case() -> None:
    assert word_set("The River and THE stones, of course") == frozenset({"river", "stones", "course"})


def test_m18_jaccard() -> None:
    assert jaccard(frozenset({"a", "b", "c"}), frozenset({"b", "c", "d"})) == pytest.approx(0.5)
    assert jaccard(frozenset(), frozenset()) == 0.0


def test_m18_normalised_ignores_punctuation_spacing_and_case() -> None:
    assert normalised("  I miss   HER...  ") == "i miss her"


def test_m18_same_feeling_at_jaccard_0_6() -> None:
    # {calm, river, stones, water} vs {calm, river, stones, fire}: 3/5 = 0.6 (stop words do not count).
    assert same_feeling("calm", "the river and the stones of water", None, "calm", "river stones fire", None)


def test_m18_not_same_below_jaccard_0_6() -> None:
    # {calm, river, stones, water} vs {calm, river, fire, ash}: 2/6.
    assert not same_feeling("calm", "river stones water", None, "calm", "river fire ash", None)


def test_m18_same_feeling_by_identical_normalised_conclusion() -> None:
    assert same_feeling(
        "grief heavy sad long", "I miss her.", None, "joy light bright quick", "i miss  HER", None
    )


def test_m18_empty_conclusions_are_not_the_same() -> None:
    assert not same_feeling("grief heavy", "", None, "joy light", "", None)


def test_m18_same_feeling_by_cosine_0_92() -> None:
    assert same_feeling("a", "x", [1.0, 0.0], "b", "y", [0.93, 0.36757])
    assert not same_feeling("a", "x", [1.0, 0.0], "b", "y", [0.91, 0.41461])


def test_m30_vectors_of_another_length_never_make_a_rumination() -> None:
    assert not same_feeling("a", "x", [1.0, 0.0], "b", "y", [1.0, 0.0, 0.0])
    assert not same_feeling("a", "x", None, "b", "y", [1.0, 0.0])


@dataclass
class Hit:
    name: str
    feeling: str
    conclusion: str
    vector: list[float] | None
    score: float


KEYS = {
    "feeling": lambda h: h.feeling,
    "conclusion": lambda h: h.conclusion,
    "vector": lambda h: h.vector,
}


def test_m18_collapse_keeps_the_best_score_per_cluster_in_input_order() -> None:
    hits = [
        Hit("p", "warm", "the garden in spring", None, 0.9),
        Hit("q", "cold", "the station at night", [1.0, 0.0], 0.8),
        Hit("r", "cold", "a train leaving", [0.99, 0.141], 0.85),  # cosine 0.99 with q
        Hit("s", "warm", "The garden, in spring!", None, 0.7),  # same conclusion as p
        Hit("t", "odd", "nothing alike", [0.0, 1.0], 0.1),
    ]
    kept = collapse(hits, score=lambda h: h.score, **KEYS)
    assert [h.name for h in kept] == ["p", "r", "t"]


def test_m18_clusters_are_transitive() -> None:
    # a~b by cosine, b~c by conclusion; a and c share nothing directly.
    hits = [
        Hit("a", "one", "alpha", [1.0, 0.0], 0.5),
        Hit("b", "two", "beta", [0.95, 0.3122], 0.6),
        Hit("c", "three", "Beta.", [0.0, 1.0], 0.4),
        Hit("d", "four", "delta", None, 0.3),
    ]
    clusters = rumination_clusters(hits, **KEYS)
    assert [[h.name for h in c] for c in clusters] == [["a", "b", "c"], ["d"]]
    kept = collapse(hits, score=lambda h: h.score, **KEYS)
    assert [h.name for h in kept] == ["b", "d"]


def test_m37_collapse_by_intensity_with_ties_keeps_the_first() -> None:
    hits = [Hit("x", "sad", "lost", None, 0.5), Hit("y", "sad", "lost", None, 0.5)]
    assert [h.name for h in collapse(hits, score=lambda h: h.score, **KEYS)] == ["x"]


# ------------------------------------------------------------------ C. state budget (mechanism 32)


def test_m32_admit_is_a_greedy_skip_not_a_stop() -> None:
    pool = [("a", 3.0), ("b", 2.5), ("c", 1.5), ("d", 0.5)]
    assert admit(pool) == (["a", "c", "d"], ["b"])


def test_m32_the_strongest_is_always_admitted() -> None:
    assert admit([("small", 0.4), ("huge", 6.0)]) == (["huge"], ["small"])


def test_m32_pool_is_taken_strongest_first() -> None:
    assert admit([("c", 1.0), ("a", 4.5), ("b", 0.6)]) == (["a"], ["c", "b"])


def test_m32_exactly_the_budget_fits() -> None:
    pool = [(i, 1.0) for i in range(6)]
    assert admit(pool) == ([0, 1, 2, 3, 4], [5])


def test_m32_budget_is_a_parameter() -> None:
    assert admit([("a", 1.0), ("b", 1.0)], budget=1.5) == (["a"], ["b"])
    assert admit([]) == ([], [])
