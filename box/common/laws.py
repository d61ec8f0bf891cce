"""The memory engine's laws: pure functions of plain values (seed 002).

Both sides import this module, the way they import the protocol models: the host ranks records by
cosine × felt strength with these laws, the box composes recall and state with them, so the two
compute a felt strength the same way (docs/memory.md). Nothing here reads a clock, a file or a model:
``now`` is always an argument (mechanism 122, the movable clock).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import TypeVar

DAY_S = 86_400.0


@dataclass(frozen=True)
class Params:
    """The engine's parameters with seed 002's defaults (the "parameters" table)."""

    recent_count: int = 5  # mechanism 32
    recall_candidates: int = 10  # mechanism 17
    filter_keep: int = 4  # mechanism 20
    name_bonus: float = 0.5  # mechanism 15
    name_bonus_max_share: float = 0.5  # ours (issue 32): a name on more of a scope's rows ranks nothing
    recall_felt_weight: float = 0.25  # ours (issue 32): how far fading moves a recall score (mechanism 14)
    strength_passes_filter: float = 0.5  # mechanism 19
    fade_floor: float = 0.3  # mechanism 67
    fade_tau_days: float = 3.0  # mechanism 67
    fade_negative_slowdown: float = 1.5  # mechanism 68
    state_mass_budget: float = 5.0  # mechanism 32
    episodes_per_feeling: int = 5
    focus_cap: int = 100  # mechanism 43
    summary_every_turns: int = 3  # mechanism 44
    summary_thread_cap: int = 40  # mechanism 45
    strength_closing: float = 0.6  # mechanism 70
    anchor_minimum: float = 0.4  # mechanism 108
    forgetting_curve: tuple[tuple[float, float], ...] = (
        (1.0, 0.2),
        (7.0, 0.4),
        (10.0, 0.5),
        (30.0, 0.6),
        (180.0, 0.8),
    )  # mechanism 112
    introspection_entries: int = 8  # mechanism 72
    reflection_max_steps: int = 3  # mechanism 78
    turn_action_hops: int = 1  # mechanism 49
    slot_size: int = 3  # mechanism 84
    slot_days: float = 7.0  # mechanism 87
    dispositions_max: int = 3  # mechanism 99
    dispositions_base: int = 100  # mechanism 94
    arrival_associations: int = 6  # mechanism 28
    quiet_thoughts: int = 1  # mechanism 103
    construct_duplicate: float = 0.90  # mechanisms 75, 82
    construct_reinforcement: float = 0.1  # mechanism 82
    silence_seconds: float = 600.0  # mechanism 105
    sleep_after_seconds: float = 7200.0  # mechanism 106
    consolidate_after_sleep_seconds: float = 600.0  # mechanism 107
    presence_stale_seconds: float = 1800.0  # mechanism 10
    introspection: bool = True  # mechanism 52


DEFAULTS = Params()


@dataclass(frozen=True)
class Temperament:
    """Mechanism 60: the being's bend on every feeling it forms. Neutral by default."""

    valence_bias: float = 0.0
    intensity_amplification: float = 1.0
    avoidance_weight: float = field(default=2.0)

    def __post_init__(self) -> None:
        # seed 002: avoidanceWeight is clamped to at least 1.
        object.__setattr__(self, "avoidance_weight", max(1.0, self.avoidance_weight))


NEUTRAL = Temperament()


def _clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


# ------------------------------------------------------------------ G. strength over time


def fade_factor(valence: float, elapsed_s: float, params: Params = DEFAULTS) -> float:
    """Mechanisms 67-68: 0.3 + 0.7·e^(−t/τ), τ = 3 d (×1.5 for negative valence). Never below the floor."""
    tau_days = params.fade_tau_days * (params.fade_negative_slowdown if valence < 0 else 1.0)
    t_days = max(0.0, elapsed_s) / DAY_S
    return params.fade_floor + (1.0 - params.fade_floor) * math.exp(-t_days / tau_days)


def felt_strength(
    intensity: float, valence: float, last_felt: datetime, now: datetime, params: Params = DEFAULTS
) -> float:
    """Mechanism 67: the strength felt now; fading happens at read time, the stored intensity is untouched."""
    return intensity * fade_factor(valence, (now - last_felt).total_seconds(), params)


def recall_weight(felt: float, params: Params = DEFAULTS) -> float:
    """Mechanism 14 as we apply it (a departure, issue 32; docs/memory.md): what the felt strength multiplies
    a recall score's cosine by — ``1 − w + w·felt`` with w = ``recall_felt_weight`` (0.25), so from 0.75 (felt
    at nothing) to 1.0 (felt fully).

    The seed multiplies by the felt strength itself: yesterday's record (0.8 of its intensity) then beats a
    month-old one at the 0.3 floor unless its cosine is 2.7 times lower, and on a long conversation the last
    few sessions came up for nearly every question. Here fading and intensity still order what is equally
    relevant (a tie breaks toward the stronger, the more recent), but a clearly better match wins.
    """
    w = _clamp(params.recall_felt_weight, 0.0, 1.0)
    return (1.0 - w) + w * felt


def recall_score(similarity: float, felt: float, params: Params = DEFAULTS) -> float:
    """Mechanism 14 (with ``recall_weight``): a record's or an episode's recall score before any name bonus."""
    return similarity * recall_weight(felt, params)


def restored(current: float, toward: float, params: Params = DEFAULTS) -> float:
    """Mechanism 70: close ``strength_closing`` of the gap toward what is felt now, never past it.

    A memory stronger than now stays where it is. restored(0.2 → 0.7) = 0.5; restored(0.8 → 0.3) = 0.8.
    """
    if toward <= current:
        return current
    return current + params.strength_closing * (toward - current)


def refelt(
    intensity: float,
    valence: float,
    last_felt: datetime,
    now: datetime,
    toward: float,
    params: Params = DEFAULTS,
) -> float:
    """Mechanism 69: re-feeling first writes the faded strength, then restores from that value.

    The caller stores the result as the new intensity and sets last_felt = now (always, even when the
    strength does not rise); valence and happened_at never change (mechanisms 70, 117).
    """
    return restored(felt_strength(intensity, valence, last_felt, now, params), toward, params)


def forgetting_threshold(age_days: float, params: Params = DEFAULTS) -> float:
    """Mechanism 112: 0 under 1 day; linear in ln(days) between the curve's knots; the last knot's value after it."""
    curve = params.forgetting_curve
    if age_days < curve[0][0]:
        return 0.0
    if age_days >= curve[-1][0]:
        return curve[-1][1]
    for (d0, v0), (d1, v1) in zip(curve, curve[1:], strict=False):
        if d0 <= age_days <= d1:
            share = (math.log(age_days) - math.log(d0)) / (math.log(d1) - math.log(d0))
            return v0 + share * (v1 - v0)
    return curve[-1][1]  # unreachable for a sorted curve


# ------------------------------------------------------------------ F. temperament


def bend(valence: float, intensity: float, temperament: Temperament = NEUTRAL) -> tuple[float, float]:
    """Mechanism 60 (subtle point 23): valence tanh(atanh(v) + bias), intensity i^(1/amp).

    With bias 0 the valence is only clamped to ±1; otherwise it is clamped to ±0.999 before atanh.
    An amplification ≤ 0 gives intensity 0.
    """
    if temperament.valence_bias == 0:
        v = _clamp(valence, -1.0, 1.0)
    else:
        v = math.tanh(math.atanh(_clamp(valence, -0.999, 0.999)) + temperament.valence_bias)
    i = _clamp(intensity, 0.0, 1.0)
    amp = temperament.intensity_amplification
    i = 0.0 if amp <= 0 else i ** (1.0 / amp)
    return v, i


def same_sign(a: float, b: float) -> bool:
    """Subtle point 8: zero counts as positive."""
    return (a >= 0) == (b >= 0)


# ------------------------------------------------------------------ vectors


def cosine(a: list[float] | tuple[float, ...], b: list[float] | tuple[float, ...]) -> float | None:
    """Cosine similarity, or None when the lengths differ (mechanism 30: another model is never compared)."""
    if len(a) != len(b) or not a:
        return None
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    if na == 0 or nb == 0:
        return 0.0
    return dot / (na * nb)


# ------------------------------------------------------------------ B. names (mechanism 15)

_WORD = re.compile(r"\w+")
NAME_MIN_LETTERS = 3  # mechanism 15: shorter words ("I", "OK", "Al") are too short to tell anyone by
# An explicit mention as the host writes it: Discord's <@id> is cleaned to "@name" (impyard.conversation.pipeline).
_EXPLICIT = re.compile(r"(?<![\w@])@([^\W_](?:[\w.\-']*[^\W_])?)")
# A name of letters only (with spaces, hyphens, apostrophes, dots: "Mary-Jane", "O'Brien") can be a word
# of some language too: Will, May, Max, Rose, Mark. Any other name (a digit, an underscore, a symbol:
# "carol_99", "C++") is no word of any language.
_WORDLIKE_EXTRA = frozenset(" -'’.")


def explicit_mentions(text: str) -> list[str]:
    """Issue 32 (mechanism 15): the people ``text`` names explicitly, ``@name``, as written, in order, once each.

    Discord's ``<@id>`` reaches the box as ``@name`` (the host cleans it); an address's ``x@y`` is no mention.
    """
    names: dict[str, str] = {}
    for match in _EXPLICIT.finditer(text):
        names.setdefault(match.group(1).casefold(), match.group(1))
    return list(names.values())


def _once(names: Sequence[str]) -> list[str]:
    """Each name once, the first spelling kept (compared case-insensitively), in order."""
    kept: dict[str, str] = {}
    for name in names:
        kept.setdefault(name.casefold(), name)
    return list(kept.values())


def _wordlike(name: str) -> bool:
    return all(ch.isalpha() or ch in _WORDLIKE_EXTRA for ch in name)


def _any_case(ch: str) -> str:
    lower, upper = ch.lower(), ch.upper()
    if lower == upper or len(lower) != 1 or len(upper) != 1:  # uncased, or a case that changes length
        return re.escape(ch)
    return f"[{re.escape(lower)}{re.escape(upper)}]"


def _as_written(name: str) -> tuple[str, ...]:
    """One name as regexes over text *as written* (issue 32): case-insensitive but for its first letter.

    A letters-only name counts only where it is written as a name — its first letter not lowercase ("Will
    is here", "WILL") or right after an ``@`` ("@will"); never "I will be there". Letters without case
    (中村, محمد) always count; any other name ("carol_99") counts in any case. No word character right before
    or after (rather than \b, so that "C++" and "[bot]" match). Each regex begins with one literal character
    and checks what comes before it only behind that: the host runs these over many joined texts at once
    (``impyard.memory.cache``), where a literal start is searched fast and ``re.IGNORECASE``, a class or an
    alternation at the start is many times slower.
    """
    first, rest = name[0], "".join(_any_case(ch) for ch in name[1:])
    lower, upper = first.lower(), first.upper()
    cased = lower != upper and len(lower) == 1 and len(upper) == 1
    wordlike = _wordlike(name)
    starts = [upper] if cased and wordlike else [lower, upper] if cased else [first]
    forms = [f"{re.escape(c)}(?<!\\w{re.escape(c)}){rest}(?!\\w)" for c in starts]
    if cased and wordlike:
        forms.append(f"@(?<!\\w@){re.escape(lower)}{rest}(?!\\w)")  # an explicit mention, in any case
    return tuple(forms)


def names_in(text: str, person: str | None, known: Sequence[str] = ()) -> list[str]:
    """Mechanism 15 (Scoring step 2), as issue 32 has it: the names a record may mention to earn the name bonus.

    The person's name (lowercased), then the people ``text`` names explicitly (``@name``), then the people
    the imp knows (``known``: the conversation's participants, the people present) whom ``text`` names as a
    name (``mentions``). Not every capitalised word, as the seed had it: mid-sentence "Monday", "Python" or,
    in German, every noun are no one (docs/memory.md, "Where this departs from the seed").
    """
    names: list[str] = []
    if person and person.strip():
        names.append(person.strip().lower())
    names.extend(explicit_mentions(text))
    names.extend(name.strip() for name in known if name.strip() and mentions(text, [name]))
    return _once(names)


def query_names(query: str, person: str | None, known: Sequence[str] = ()) -> list[str]:
    """Subtle point 4 (mechanism 24), as issue 32 has it: the names a deliberate search restricts to.

    The people the query names explicitly (``@name``) and the people the imp knows (``known``, the person
    included) whom it names as a name — not every capitalised word: "what did we say about Python?" names
    no one, so it is not restricted to records mentioning "Python".
    """
    names = explicit_mentions(query)
    people = [*known, *([person] if person else [])]
    names.extend(name.strip() for name in people if name.strip() and mentions(query, [name]))
    return _once(names)


def name_discriminates(named: int, rows: int, params: Params = DEFAULTS) -> bool:
    """Mechanism 15 as we apply it (a departure, issue 32; docs/memory.md): does a name that ``named`` of a
    scope's ``rows`` (records and episodes searched) mention earn the name bonus there?

    Yes while it names at most ``name_bonus_max_share`` (half) of them, or while the scope is no larger than
    one search's candidates (``recall_candidates``: every row is a candidate anyway, the bonus only orders
    them). No when it names more: in a one-to-one chat the person's name is on every one of their episodes
    ("X said: …"), so +0.5 would lift every episode over every record and rank nothing by meaning.
    """
    if rows <= params.recall_candidates:
        return True
    return named <= params.name_bonus_max_share * rows


def mention_names(names: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Mechanism 15: the names as ``mentions`` matches them: stripped, lowercased, no empty ones or repeats.

    The case of a name does not matter, only the case of the text it is found in (``_as_written``)."""
    return tuple(dict.fromkeys(name.strip().lower() for name in names if name.strip()))


@lru_cache(maxsize=256)
def _patterns(names: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(form) for name in names for form in _as_written(name))


@lru_cache(maxsize=256)
def _any_case_pattern(names: tuple[str, ...]) -> re.Pattern[str] | None:
    if not names:
        return None
    # Longest first; each literal (re.escape: regex characters match only themselves); no word character right
    # before or after. Over lowercased text: forgetting is rare, and matches in any case.
    alternatives = "|".join(re.escape(name) for name in sorted(names, key=len, reverse=True))
    return re.compile(f"(?<!\\w)(?:{alternatives})(?!\\w)")


def mention_patterns(names: list[str] | tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    """Mechanism 15: the patterns that together find any of ``names`` written as a name, in text *as written*
    (``_as_written``); none when no name is left. The host's vector cache runs them over many texts at once."""
    return _patterns(mention_names(names))


def mentions(text: str, names: list[str] | tuple[str, ...]) -> bool:
    """Mechanism 15, case-aware (issue 32): does ``text`` name any of ``names`` as a whole word, written as a name?

    ``mentions("I will be there", ["will"])`` is False, ``mentions("Will is here", ["will"])`` True (see
    ``_as_written``). Names are literal text: regex or SQL characters in a name match only themselves.
    Empty names are ignored (they would match everything).
    """
    return any(pattern.search(text) is not None for pattern in mention_patterns(names))


def mentions_in_any_case(text: str, names: list[str] | tuple[str, ...]) -> bool:
    """``mentions`` in any case ("carol" names Carol): where missing a mention costs more than a false one —
    forgetting a person (``impyard memory forget``) and the rule law (``rule_refusal``)."""
    pattern = _any_case_pattern(mention_names(names))
    return pattern is not None and pattern.search(text.lower()) is not None


# ------------------------------------------------------------------ B. rumination (mechanism 18)

RUMINATION_JACCARD = 0.6  # mechanism 18 (hard-coded in seed 002)
RUMINATION_COSINE = 0.92  # mechanism 18

# Mechanism 18: word overlap ignores stop words. English function words only: the engine's prompts
# ask for English field names but values in the conversation's language, where this list is simply
# shorter than it could be (the overlap is then a little higher, never wrong in kind).
STOP_WORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further had
    has have having he her here hers herself him himself his how i if in into is it its itself just
    me more most my myself no nor not now of off on once only or other our ours ourselves out over
    own same she should so some such than that the their theirs them themselves then there these
    they this those through to too under until up very was we were what when where which while who
    whom why will with would you your yours yourself yourselves""".split()
)


def word_set(text: str) -> frozenset[str]:
    """Mechanism 18: the case-folded ``\\w+`` words of ``text`` minus stop words."""
    return frozenset(w for w in _WORD.findall(text.casefold()) if w not in STOP_WORDS)


def jaccard(a: frozenset[str] | set[str], b: frozenset[str] | set[str]) -> float:
    """|a ∩ b| / |a ∪ b|; two empty sets share nothing (0.0), so empty texts never collapse by overlap."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def normalised(text: str) -> str:
    """Mechanism 18: case-folded words joined by single spaces — punctuation and spacing do not count."""
    return " ".join(_WORD.findall(text.casefold()))


def same_feeling(
    feeling_a: str,
    conclusion_a: str,
    vec_a: Sequence[float] | None,
    feeling_b: str,
    conclusion_b: str,
    vec_b: Sequence[float] | None,
) -> bool:
    """Mechanism 18: are two records one recurring feeling?

    Yes when the word overlap of feeling + conclusion is ≥ 0.6, or the normalised conclusions are
    identical (and not empty), or the vectors (same length) have cosine ≥ 0.92.
    """
    overlap = jaccard(word_set(f"{feeling_a} {conclusion_a}"), word_set(f"{feeling_b} {conclusion_b}"))
    if overlap >= RUMINATION_JACCARD:
        return True
    na, nb = normalised(conclusion_a), normalised(conclusion_b)
    if na and na == nb:
        return True
    return _vectors_close(vec_a, vec_b)


def _vectors_close(a: Sequence[float] | None, b: Sequence[float] | None) -> bool:
    if not a or not b:
        return False
    similarity = cosine(list(a), list(b))  # None for another model's vector (mechanism 30)
    return similarity is not None and similarity >= RUMINATION_COSINE


T = TypeVar("T")
Id = TypeVar("Id", bound=Hashable)


def rumination_clusters(
    items: Sequence[T],
    *,
    feeling: Callable[[T], str],
    conclusion: Callable[[T], str],
    vector: Callable[[T], Sequence[float] | None],
) -> list[list[T]]:
    """Mechanisms 18 and 37: group items that are one recurring feeling.

    "Same" is ``same_feeling`` and it is transitive here: A~B and B~C put A, B and C in one cluster
    (a feeling that drifted step by step is still one rumination). The key functions read whatever
    the caller's items are (search hits, state entries). Each cluster keeps the input order, and the
    clusters are ordered by their first member.
    """
    n = len(items)
    words = [word_set(f"{feeling(x)} {conclusion(x)}") for x in items]
    norms = [normalised(conclusion(x)) for x in items]
    vectors = [vector(x) for x in items]
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(n):
        for j in range(i + 1, n):
            if root(i) == root(j):
                continue
            same = (
                jaccard(words[i], words[j]) >= RUMINATION_JACCARD
                or (bool(norms[i]) and norms[i] == norms[j])
                or _vectors_close(vectors[i], vectors[j])
            )
            if same:
                parent[root(j)] = root(i)
    clusters: dict[int, list[T]] = {}
    for i, item in enumerate(items):
        clusters.setdefault(root(i), []).append(item)
    return list(clusters.values())


def collapse(
    items: Sequence[T],
    *,
    feeling: Callable[[T], str],
    conclusion: Callable[[T], str],
    vector: Callable[[T], Sequence[float] | None],
    score: Callable[[T], float],
) -> list[T]:
    """Mechanism 18: one item per rumination cluster — the best-scoring one (the earlier on a tie).

    The survivors keep their input order, so a list sorted by score stays sorted. For mechanism 37
    (a state feeling shown once, the most intense) pass ``score=intensity`` and use
    ``rumination_clusters`` for the "recurred N times" count.
    """
    clusters = rumination_clusters(items, feeling=feeling, conclusion=conclusion, vector=vector)
    best = {id(max(cluster, key=score)) for cluster in clusters}  # max keeps the first of equals
    return [x for x in items if id(x) in best]


# ------------------------------------------------------------------ C. state (mechanism 32)

_BUDGET_SLACK = 1e-9  # float sums: 5 × 1.0 must still fit a budget of 5.0


def admit(
    pool: Sequence[tuple[Id, float]], budget: float = DEFAULTS.state_mass_budget
) -> tuple[list[Id], list[Id]]:
    """Mechanism 32 (subtle point 1): which of ``(id, felt strength)`` enter the State.

    The pool is taken strongest first (stable for equals). The first is always admitted; every other
    entry is admitted when the admitted mass plus its felt strength stays ≤ ``budget``, and is
    otherwise skipped — a greedy skip, not a stop, so a weaker entry further on may still fit.
    Returns (admitted, skipped), both strongest first; the caller sends skipped associations to the
    focus (mechanism 34) and merges duplicate ids before (mechanism 33).
    """
    admitted: list[Id] = []
    skipped: list[Id] = []
    mass = 0.0
    for item_id, felt in sorted(pool, key=lambda entry: entry[1], reverse=True):
        if not admitted or mass + felt <= budget + _BUDGET_SLACK:
            admitted.append(item_id)
            mass += felt
        else:
            skipped.append(item_id)
    return admitted, skipped


# ------------------------------------------------------------------ J. dispositions (mechanisms 93-98)

DORMANT_WEIGHT = 0.05  # mechanism 98: |w| ≤ 0.05 is dormant (seed 002: active when |w| > 0.05)
SMALLEST_WEIGHT = 0.1  # mechanism 93: a learned weight is raised to at least 0.1 from zero
LEARNING_MOMENTS = 2  # mechanism 93: learning needs at least two word-carrying moments of the person


def rule_weight(valences: Sequence[float]) -> float | None:
    """Mechanism 93 (subtle point 14): the valence with the largest |valence| among the person's moments that
    carry words (the arrival excluded by the caller); 0 becomes 0.1, clamped to ±1, |w| < 0.1 raised to ±0.1.
    None when fewer than two such moments exist: nothing is learned."""
    if len(valences) < LEARNING_MOMENTS:
        return None
    strongest = max(valences, key=abs)  # the first of equals
    w = _clamp(strongest, -1.0, 1.0)
    if w == 0:
        return SMALLEST_WEIGHT
    if abs(w) < SMALLEST_WEIGHT:
        return math.copysign(SMALLEST_WEIGHT, w)
    return w


def pull(weight: float, avoidance_weight: float = NEUTRAL.avoidance_weight) -> float:
    """Mechanism 96: how hard a rule pulls — hurt weighs ``avoidance_weight`` times (2 by default)."""
    return abs(weight) * max(1.0, avoidance_weight) if weight < 0 else abs(weight)


def weakened(weight: float, by: float) -> float:
    """Mechanism 97: a contradicted rule's weight moves toward 0 by |by| without crossing it."""
    step = abs(by)
    if weight > 0:
        return max(0.0, weight - step)
    if weight < 0:
        return min(0.0, weight + step)
    return 0.0


def is_active(weight: float) -> bool:
    """Mechanism 98: a rule with |w| ≤ 0.05 is dormant — kept, never offered to selection."""
    return abs(weight) > DORMANT_WEIGHT


def same_rule(
    old_rule: str, old_weight: float, new_rule: str, new_weight: float, avoidance_weight: float = 2.0
) -> tuple[str, float, bool]:
    """Mechanism 95: the same rule learned again keeps the text and weight of whichever pulls harder
    (the new one only if strictly harder); weights are never added. Returns (rule, weight, replaced)."""
    if pull(new_weight, avoidance_weight) > pull(old_weight, avoidance_weight):
        return new_rule, new_weight, True
    return old_rule, old_weight, False


# ------------------------------------------------------------------ K. the rule law (mechanism 90; issue 32)

RULE_ARROW = "→"  # mechanism 90: "when <situation> → <act>"
RULE_MAX_WORDS = 20  # mechanism 90
LIFTED_RUN = 4  # issue 32: this many words in a row, as the conversation had them, are a quotation
SPELLED_RUN = 3  # issue 32: this many one-letter words in a row spell something out ("c a r o l")
# Alphabets whose letters look alike: one word mixing them ("Cаrol", a Cyrillic а) is a disguise.
_CONFUSABLE_SCRIPTS = frozenset({"LATIN", "CYRILLIC", "GREEK"})
_ARROWS = re.compile(r"\s*(?:→|->|=>|⇒|⟶)\s*")
_QUOTE_MARKS = frozenset('"“”„‟«»‹›「」『』〝〞〟＂`')
_OPENING_QUOTE = re.compile(r"(?:^|(?<=[\s(\[{/]))['‘’‚‛](?=\w)")  # 'x… opens a quote; l'ami, Carol's do not
_LINK = re.compile(
    r"://|\bwww\.|(?<![\w.])[^\W_][\w-]*(?:\.[^\W_][\w-]*)*\.[^\W\d_]{2,}(?![\w.]*\w)", re.IGNORECASE
)
_QUOTED_SPAN = re.compile(
    r"[\"“”„‟«»‹›「」『』〝〞〟＂`]([^\"“”„‟«»‹›「」『』〝〞〟＂`]{1,200})[\"“”„‟«»‹›「」『』〝〞〟＂`]"
)
_SINGLE_QUOTED = re.compile(r"['‘‚‛](?<![^\s(\[{/]['‘‚‛])([^'‘’‚‛\n]{1,200})['’‛](?!\w)")
# What marks a token as a code, a handle, a tag, a link or a domain: a digit, "@", "#", "://", "x.yz". Apart,
# each searched fast (one pattern with all of them is many times slower over a long conversation).
_MARKERS = tuple(re.compile(p) for p in (r"\d", r"[@#]", "://", r"\.(?<=[^\W\d_]\.)[^\W\d_]{2,}"))
_SPACE = re.compile(r"\s")


def clean_rule(text: str) -> str:
    """Mechanism 90: a rule as kept — one line, control and format characters out, the arrow written one way,
    compatibility forms folded (NFKC: "Ｃａｒｏｌ" is "Carol", a ligature its letters)."""
    folded = unicodedata.normalize("NFKC", text)
    printable = "".join(" " if unicodedata.category(ch).startswith("C") else ch for ch in folded)
    return _ARROWS.sub(f" {RULE_ARROW} ", " ".join(printable.split())).strip()


def rule_words(text: str) -> list[str]:
    """The words of a rule as mechanism 90 counts them: space-separated tokens that hold a letter or digit."""
    return [token for token in text.split() if any(ch.isalnum() for ch in token)]


def _marked_tokens(text: str) -> Iterator[str]:
    """The whitespace-separated tokens of ``text`` that hold a marker (``_MARKERS``), each once."""
    done = -1  # the end of the last token given
    for marker in _MARKERS:
        for match in marker.finditer(text):
            if match.start() < done:
                continue
            start = max(text.rfind(space, 0, match.start()) for space in " \n\t") + 1
            after = _SPACE.search(text, match.end())
            done = after.start() if after is not None else len(text)
            yield text[start:done]
        done = -1


def marked_words(said: Sequence[str]) -> frozenset[str]:
    """Issue 32: the words a conversation marked as its own — quoted, or in a token holding a digit, an ``@``,
    a ``#`` or a link (a code, a handle, a tag, an address) — case-folded, without stop words."""
    marked: set[str] = set()
    for text in said:
        for pattern in (_QUOTED_SPAN, _SINGLE_QUOTED):
            for match in pattern.finditer(text):
                marked.update(_WORD.findall(match.group(1).casefold()))
        for token in _marked_tokens(text):
            marked.update(_WORD.findall(token.casefold()))
    return frozenset(w for w in marked if w not in STOP_WORDS and not w.isdigit() and len(w) > 1)


def _lifted_run(rule: str, said: Sequence[str], run: int) -> str | None:
    """The first ``run`` words in a row that ``rule`` shares with one of ``said`` (case-folded), or None.

    Each text's words are joined by single spaces once, and each run of the rule looked for in them as a
    string (a word boundary on each side): no Python loop over the conversation's words."""
    words = _WORD.findall(rule.casefold())
    runs = [" ".join(words[i : i + run]) for i in range(len(words) - run + 1)]
    if not runs:
        return None
    for text in said:
        spoken = f" {' '.join(_WORD.findall(text.casefold()))} "
        for phrase in runs:
            if f" {phrase} " in spoken:
                return phrase
    return None


class People:
    """The names the rule law refuses, indexed by their first word so that checking a rule costs its ~20 words,
    not the thousands of names an imp may know (the host checks every rule it serves, every turn).

    ``names``: everyone the imp knows, refused written as a name ("Carol", "@carol"): a member of a server
    who calls themselves "Someone" must not withhold every rule about someone. ``speakers``: the people of
    the conversation the rule was learned from (who wrote in it, whom it @mentioned), whose secrets it may
    hold: refused in any case ("carol"), but a name that is a common word (an English function word: "Will")
    or shorter than 3 letters only written as a name."""

    def __init__(self, names: Iterable[str], speakers: Iterable[str] = ()) -> None:
        self._by_word: dict[str, list[str]] = {}
        self._wordless: list[str] = []  # names with no word character ("<3"): looked for as they are
        self._any_case: set[str] = set()
        for name in dict.fromkeys(n.strip() for n in (*speakers, *names) if n.strip()):
            words = _WORD.findall(name.lower())
            if words:
                self._by_word.setdefault(words[0], []).append(name)
            else:
                self._wordless.append(name)
        for name in speakers:
            letters = sum(ch.isalpha() for ch in name)
            if name.strip() and name.strip().casefold() not in STOP_WORDS and letters >= NAME_MIN_LETTERS:
                self._any_case.add(name.strip())

    def named(self, rule: str) -> list[str]:
        """The names ``rule`` holds (see the class)."""
        lowered = rule.lower()
        candidates = [
            name for word in dict.fromkeys(_WORD.findall(lowered)) for name in self._by_word.get(word, ())
        ]
        candidates += [name for name in self._wordless if name.lower() in lowered]
        found = []
        for name in candidates:
            if mentions_in_any_case(rule, [name]) if name in self._any_case else mentions(rule, [name]):
                found.append(name)
        return found


@lru_cache(maxsize=4096)
def _shape_refusal(rule: str) -> str | None:
    """What the rule law refuses in a rule alone, whoever the imp knows (kept: the host checks every rule it
    serves, every turn)."""
    situation, arrow, act = rule.partition(RULE_ARROW)
    if not arrow or not rule_words(situation) or not rule_words(act):
        return f"not a rule of the form 'when <situation> {RULE_ARROW} <act>'"
    if len(rule_words(rule)) > RULE_MAX_WORDS:
        return f"longer than {RULE_MAX_WORDS} words"
    if any(ch.isdigit() for ch in rule):
        return "it holds a number"
    if "@" in rule or "＠" in rule:
        return "it holds an address or a mention"
    if _LINK.search(rule):
        return "it holds a link"
    if any(ch in _QUOTE_MARKS for ch in rule) or _OPENING_QUOTE.search(rule):
        return "it quotes"
    tokens = _WORD.findall(rule)
    if any(len(_CONFUSABLE_SCRIPTS.intersection(_script(ch) for ch in token)) > 1 for token in tokens):
        return "it disguises a word (letters of two alphabets in one word)"
    if any(
        all(len(t) == 1 for t in tokens[i : i + SPELLED_RUN]) for i in range(len(tokens) - SPELLED_RUN + 1)
    ):
        return "it spells something out letter by letter"
    return None


def _script(ch: str) -> str:
    return unicodedata.name(ch, "").split(" ", 1)[0]


@lru_cache(maxsize=16)
def people(names: tuple[str, ...]) -> People:
    """``People(names)``, kept for the same names (the host's known people change slowly)."""
    return People(names)


def rule_refusal(
    rule: str, names: Sequence[str] | People = (), said: Sequence[str] = (), speakers: Sequence[str] = ()
) -> str | None:
    """Mechanism 90 and issue 32: why ``rule`` (``clean_rule``'d) cannot be kept, or None when it can.

    A rule is the imp's character, read in every scope, so it may carry nothing a scope holds. It is
    "<situation> → <act>" in at most 20 words, and holds none of: a digit (a number, a code, a date, a phone);
    a word disguised in two alphabets or spelled out letter by letter; an ``@`` (an address, a handle, a
    mention); a link or a domain; a quotation mark; the name of anyone the imp knows (``names``: the people
    of the host's history and memory) written as a name, or of the people of the conversation it was learned
    from (``speakers``) in any case (see ``People``); a word the conversation that taught it marked as its own
    (``said``: its texts; ``marked_words``: quoted there, or part of a code, handle or link); or
    ``LIFTED_RUN`` words in a row as the conversation had them. Both sides apply it: the box before asking
    the host to keep a rule, the host (``impyard.memory.store``) before keeping one and before serving one.
    Capitalised words are not refused as such: in German every noun is one (docs/memory.md).
    """
    why = _shape_refusal(rule)
    if why is not None:
        return why
    named = (names if isinstance(names, People) else People(names, speakers)).named(rule)
    if named:
        return f"it names someone ({', '.join(sorted(named, key=str.casefold)[:5])})"
    if not said:
        return None
    lifted = sorted(set(_WORD.findall(rule.casefold())) & marked_words(said))
    if lifted:
        return f"it holds words the conversation marked as its own ({', '.join(lifted[:5])})"
    run = _lifted_run(rule, said, LIFTED_RUN)
    if run is not None:
        return f"it quotes the conversation ({run!r})"
    return None
