"""J. Dispositions, the box's half (mechanisms 90-100): carried lines, learning, classification, selection.

The host keeps the rules and applies the arithmetic (helper tests in test_store_dispositions.py); here the
box's ``Learner`` and ``ModelSelector`` run against the real host store (the Kit) and the scripted model.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from box.common.laws import Temperament
from box.memory.calls import MemoryModel
from box.memory.conversation import Conversation, SavedConversation
from box.memory.dispositions import Learned, Learner, ModelSelector, carried_lines, refusal
from box.memory.focus import moment_entry
from box.memory.prompts import Prompts
from box.memory.store_client import StoreClient, StoreUnavailable
from box.protocol import memory as mem
from box.protocol.models import MemorySettings
from tests import sqlfile
from tests.memory.engine_kit import IMP, NOW, FakeClient, Kit, facts, vector

pytestmark = pytest.mark.anyio

PROMPTS = Prompts.load()
HURT_RULE = "when someone mocks my drawings → I stay quiet and keep my distance"
KIND_RULE = "when someone shares good news → I celebrate with them warmly"


def model_of(kit: Kit) -> MemoryModel:
    return MemoryModel(FakeClient(kit.model), MemorySettings(enabled=True, embedder="hashing"), "test-model")


def learner(kit: Kit, store: StoreClient | None = None, temperament: Temperament | None = None) -> Learner:
    return Learner(model_of(kit), store or kit.store(), PROMPTS, IMP, temperament or Temperament())


def selector(kit: Kit, store: StoreClient | None = None) -> ModelSelector:
    return ModelSelector(model_of(kit), store or kit.store(), PROMPTS, IMP)


async def rules(kit: Kit) -> list[mem.DispositionView]:
    return await kit.store().dispositions(k=200)


async def learn(kit: Kit, rule: str, valences: list[float], **kwargs: Any) -> Learned:
    kit.model.script("learning", {"learned": rule})
    return await learner(kit, **kwargs).learn(
        context="CONTEXT OF THE CONVERSATION", carried=[], valences=valences, person="Ann"
    )


def record(
    conclusion: str,
    *,
    felt: float,
    minutes_ago: int,
    kind: str = "lived",
    construct_kind: str | None = None,
    statement: str | None = None,
) -> mem.RecordView:
    at = NOW - timedelta(minutes=minutes_ago)
    return mem.RecordView(
        id=f"r-{conclusion[:10]}-{minutes_ago}", kind=kind, construct_kind=construct_kind, author="Ann",  # type: ignore[arg-type]
        feeling="a feeling", conclusion=conclusion, valence=0.2, intensity=felt, felt=felt, happened_at=at,
        last_felt=at, statement=statement,
    )  # fmt: skip


# ------------------------------------------------------------------ mechanism 92: carried lines


def test_m92_carried_lines_are_the_three_felt_most_strongly_of_the_twelve_most_recently_felt() -> None:
    window = [record(f"recent thing {n}", felt=0.1 + n / 100, minutes_ago=n) for n in range(12)]
    older = record("the strongest but thirteenth", felt=0.99, minutes_ago=100)
    lines = carried_lines([older, *window])
    # mechanism 92: the 13th most recently felt is outside the window however strong it is;
    # inside, the strongest felt now come first (0.21, 0.20, 0.19)
    assert lines == ["recent thing 11", "recent thing 10", "recent thing 9"]


def test_m92_a_construct_carries_its_statement_and_empty_or_repeated_texts_are_skipped() -> None:
    records = [
        record("", felt=0.95, minutes_ago=1),  # empty: skipped
        record(
            "a conclusion",
            felt=0.9,
            minutes_ago=2,
            kind="construct",
            construct_kind="belief",
            statement="people mean well",
        ),  # fmt: skip
        record("I miss the sea.", felt=0.8, minutes_ago=3),
        record("I  miss the\nsea.", felt=0.7, minutes_ago=4),  # the same text again (one line): skipped
        record("Bread smells good.", felt=0.6, minutes_ago=5),
        record("Too weak to be carried.", felt=0.5, minutes_ago=6),
    ]
    assert carried_lines(records) == ["I believe: people mean well", "I miss the sea.", "Bread smells good."]


def test_m92_a_carried_line_is_at_most_160_characters() -> None:
    long = "word " * 100
    [line] = carried_lines([record(long, felt=0.5, minutes_ago=1)])
    assert len(line) == 160
    assert line.startswith("word word") and line.endswith("…")


def test_m92_equal_strength_keeps_the_more_recently_felt_first() -> None:
    records = [record(f"thing {n}", felt=0.5, minutes_ago=n) for n in (5, 1, 3, 2)]
    assert carried_lines(records) == ["thing 1", "thing 2", "thing 3"]


# ------------------------------------------------------------------ mechanism 90: a rule's shape


@pytest.mark.parametrize(
    ("rule", "refused"),
    [
        ("when someone is sad → I listen before I speak", None),
        ("wenn jemand traurig ist → höre ich zuerst zu", None),  # the conversation's language (56)
        ("when someone is sad → Listen before speaking", None),  # the act starts a clause of its own
        ("when Ann is sad → I listen", "it names someone (Ann)"),
        ("when ann is sad → I listen", "it names someone (Ann)"),  # in any case (issue 32)
        # Issue 32 departs from mechanism 90's "no capitalised word": names are the people the imp knows (the
        # host refuses all of them; the box knows the person) — a capital is no name (German nouns, weekdays).
        ("when someone mentions Biscuit → I ask about the dog", None),
        ("wenn jemand meine Arbeit verspottet → halte ich Abstand", None),
        ("when someone is sad on a Monday → I call first", None),
        ("when someone is sad I listen", "not a rule of the form 'when <situation> → <act>'"),
        ("→ I listen", "not a rule of the form 'when <situation> → <act>'"),
        ("when a " + "very " * 13 + "sad person writes → I listen", None),  # exactly 20 words
        ("when a " + "very " * 14 + "sad person writes → I listen", "longer than 20 words"),
    ],
)
def test_m90_a_rule_names_no_one_and_has_at_most_twenty_words(rule: str, refused: str | None) -> None:
    assert refusal(rule, "Ann") == refused


# ------------------------------------------------------------------ mechanisms 90, 91, 93: learning


async def test_m90_m91_one_learning_call_at_0_2_reads_the_context_and_the_carried_lines(kit: Kit) -> None:
    kit.model.script("learning", {"learned": HURT_RULE})
    context = "SENSES: a direct message.\nSTATE: I felt small.\nFOCUS: Ann said: your drawing is silly"
    learned = await learner(kit).learn(
        context=context, carried=["I doubt my drawings now.", "I believe: art is private"],
        valences=[0.2, -0.8], person="Ann",
    )  # fmt: skip
    [call] = kit.model.of("learning")
    assert call.body["temperature"] == 0.2
    assert context in call.user  # mechanism 91: the departure context in full
    assert "- I doubt my drawings now.\n- I believe: art is private" in call.user  # mechanism 92
    assert learned == Learned(HURT_RULE, -0.8, "added", None)
    [kept] = await rules(kit)
    assert (kept.rule, kept.weight, kept.count) == (HURT_RULE, -0.8, 1)


async def test_m93_the_weight_is_the_strongest_moment_of_a_hurtful_exchange(kit: Kit) -> None:
    learned = await learn(kit, HURT_RULE, [0.3, -0.8, 0.6])
    assert learned.weight == -0.8
    assert [r.weight for r in await rules(kit)] == [-0.8]


@pytest.mark.parametrize(
    ("valences", "weight"), [([0.0, 0.0], 0.1), ([0.02, -0.03], -0.1), ([0.4, 0.5], 0.5)]
)
async def test_m93_a_learned_weight_is_at_least_0_1_from_zero(
    kit: Kit, valences: list[float], weight: float
) -> None:
    await learn(kit, KIND_RULE, valences)
    assert [r.weight for r in await rules(kit)] == [weight]


async def test_m93_fewer_than_two_moments_make_no_call_and_learn_nothing(kit: Kit) -> None:
    learned = await learn(kit, HURT_RULE, [-0.9])
    assert learned.rule is None and "fewer than two moments" in learned.reason
    assert kit.model.of("learning") == []
    assert await rules(kit) == []


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ({"learned": None}, "taught nothing"),
        ("not json", "no answer"),
        ({"learned": "when Ann teases me → I laugh along"}, "names someone (Ann)"),
        ({"learned": "when someone teases me I laugh"}, "not a rule of the form"),
    ],
)
async def test_m90_nothing_is_kept_without_a_rule_that_names_no_one(
    kit: Kit, answer: Any, reason: str
) -> None:
    kit.model.script("learning", answer, answer)
    learned = await learner(kit).learn(context="c", carried=[], valences=[0.5, 0.4], person="Ann")
    assert learned.rule is None and reason in learned.reason
    assert kit.model.of("classification") == []
    assert await rules(kit) == []


async def test_m90_control_characters_and_arrow_spellings_are_cleaned(kit: Kit) -> None:
    learned = await learn(kit, "when someone\x00 is\tsad  ->  I\u200b listen", [0.5, 0.4])
    assert learned.rule == "when someone is sad → I listen"
    assert [r.rule for r in await rules(kit)] == ["when someone is sad → I listen"]


# ------------------------------------------------------------------ mechanisms 94-97: classification


async def test_m94_no_classification_call_when_no_rule_is_held(kit: Kit) -> None:
    await learn(kit, KIND_RULE, [0.5, 0.4])
    assert len(kit.model.of("learning")) == 1
    assert kit.model.of("classification") == []


async def test_m94_classification_at_0_1_sees_every_held_rule_dormant_included(kit: Kit) -> None:
    store = kit.store()
    faint = await store.learn("when it rains → I stay inside", 0.1)
    await store.learn("when it rains → I go for a walk", 0.5, contradicts=faint.id)  # faint falls to 0
    assert [(r.rule, r.weight) for r in await rules(kit)][-1] == ("when it rains → I stay inside", 0.0)
    await learn(kit, KIND_RULE, [0.5, 0.4])
    [call] = kit.model.of("classification")
    assert call.body["temperature"] == 0.1
    assert f"THE NEW RULE\n{KIND_RULE}" in call.user
    # the 100 strongest by |w|, numbered; the dormant rule (98) is offered here too
    assert "[1] when it rains → I go for a walk\n[2] when it rains → I stay inside" in call.user


def spelled(n: int) -> str:
    """A number in letters, one a digit (0 → "a", 12 → "bc"): a rule holds no digit (issue 32)."""
    return "".join("abcdefghij"[int(d)] for d in str(n))


async def test_m94_classification_offers_the_hundred_strongest(kit: Kit) -> None:
    with sqlfile.transaction(kit.db) as conn:  # more than one turn's 64 requests could add
        conn.executemany(
            "INSERT INTO memory_dispositions (id, imp, rule, weight, count, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, 1, ?, ?)",
            [(f"d{n}", IMP, f"when the bell rings {spelled(n)} times → I count along", 0.1 + n / 200,
              NOW.isoformat(), NOW.isoformat()) for n in range(101)],
        )  # fmt: skip
    await learn(kit, KIND_RULE, [0.5, 0.4])
    [call] = kit.model.of("classification")
    assert "[100] when the bell rings b times" in call.user and "[101]" not in call.user
    assert "when the bell rings a times" not in call.user  # the weakest is the 101st


async def test_m95_the_same_rule_is_counted_and_keeps_its_text_and_weight_without_a_bigger_pull(
    kit: Kit,
) -> None:
    held = await kit.store().learn(KIND_RULE, 0.5)
    kit.model.script("classification", {"same": 1, "contradicts": -1})
    learned = await learn(kit, "when someone tells me good news → I share their joy", [0.4, 0.3])
    assert (learned.action, learned.weakened) == ("counted", None)
    [kept] = await rules(kit)
    assert (kept.id, kept.rule, kept.weight, kept.count) == (held.id, KIND_RULE, 0.5, 2)  # never summed


async def test_m95_m96_a_hurt_pulls_twice_so_it_replaces_a_stronger_looking_rule(kit: Kit) -> None:
    held = await kit.store().learn(KIND_RULE, 0.5)
    kit.model.script("classification", {"same": 1, "contradicts": -1})
    learned = await learn(kit, HURT_RULE, [0.1, -0.3])  # pull 0.6 > 0.5
    assert learned.action == "replaced"
    [kept] = await rules(kit)
    assert (kept.id, kept.rule, kept.weight, kept.count) == (held.id, HURT_RULE, -0.3, 2)


async def test_m96_the_avoidance_weight_is_the_temperament_s(kit: Kit) -> None:
    await kit.store().learn(KIND_RULE, 0.5)
    kit.model.script("classification", {"same": 1, "contradicts": -1})
    learned = await learn(kit, HURT_RULE, [0.1, -0.3], temperament=Temperament(avoidance_weight=1.0))
    assert learned.action == "counted"  # pull 0.3 × 1 < 0.5: the old text stays
    [kept] = await rules(kit)
    assert (kept.rule, kept.weight, kept.count) == (KIND_RULE, 0.5, 2)


async def test_m97_a_contradicted_rule_weakens_toward_zero_without_crossing_it(kit: Kit) -> None:
    held = await kit.store().learn(KIND_RULE, 0.3)
    kit.model.script("classification", {"same": -1, "contradicts": 1})
    learned = await learn(kit, "when someone shares good news → I change the subject", [0.2, -0.8])
    assert (learned.action, learned.weakened, learned.weight) == ("added", held.id, -0.8)
    by_rule = {r.rule: r.weight for r in await rules(kit)}
    assert by_rule == {"when someone shares good news → I change the subject": -0.8, KIND_RULE: 0.0}


@pytest.mark.parametrize("answer", [{"same": 7, "contradicts": 0}, {"same": True, "contradicts": "1"}, "?"])
async def test_m94_an_index_out_of_range_or_unreadable_adds_the_rule(kit: Kit, answer: Any) -> None:
    await kit.store().learn(KIND_RULE, 0.3)
    kit.model.script("classification", answer, answer)
    learned = await learn(kit, HURT_RULE, [0.2, -0.8])
    assert (learned.action, learned.weakened) == ("added", None)
    assert sorted((r.rule, r.weight, r.count) for r in await rules(kit)) == sorted(
        [(KIND_RULE, 0.3, 1), (HURT_RULE, -0.8, 1)]
    )


async def test_m95_a_store_that_does_not_answer_goes_to_the_caller(kit: Kit) -> None:
    peer = kit.peer()
    peer.down.add("memory.dispositions.learn")
    kit.model.script("learning", {"learned": KIND_RULE})
    with pytest.raises(StoreUnavailable):
        await learner(kit, StoreClient(peer)).learn(
            context="c", carried=[], valences=[0.5, 0.4], person="Ann"
        )
    assert await rules(kit) == []


# ------------------------------------------------------------------ mechanisms 98-99: selection


@dataclass
class Turn:
    """A stand-in for ``ChatTurn``: what selection reads of it."""

    conversation: Conversation | None
    words: str


def conversation(*exchanges: str) -> Conversation:
    at = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
    focus = [
        moment_entry(
            record_id=None,
            author="Ann",
            author_id="u1",
            feeling="",
            conclusion="",
            valence=0.0,
            intensity=0.0,
            at=at + timedelta(minutes=n),
            text=text,
            message_id=f"m{n}",
        )  # fmt: skip
        for n, text in enumerate(exchanges)
    ]
    return Conversation(SavedConversation(person="Ann", person_id="u1", focus=focus))


async def test_m98_m99_no_active_rule_no_selection_call(kit: Kit) -> None:
    assert await selector(kit).select(Turn(conversation(), "hello")) == []
    await kit.store().learn(KIND_RULE, 0.5)
    with sqlfile.transaction(kit.db) as conn:  # the rule weakened to dormant (98), as contradictions do
        conn.execute("UPDATE memory_dispositions SET weight = 0.05")
    assert await selector(kit).select(Turn(conversation(), "great news!")) == []
    assert kit.model.of("selection") == []
    assert [r.weight for r in await rules(kit)] == [0.05]  # kept in the store


async def test_m98_m99_selection_sees_active_rules_carried_lines_last_two_exchanges_and_words(
    kit: Kit,
) -> None:
    store = kit.store()
    faint = await store.learn("when it rains → I stay inside", 0.1)
    await store.learn("when it rains → I go for a walk", 0.3, contradicts=faint.id)  # faint: 0.0, dormant
    await store.learn(HURT_RULE, -0.8)
    await kit.seed("Ann laughed at my drawing.", valence=-0.7, intensity=0.9)
    await store.construct(
        mem.ConstructParams(
            construct_kind="belief",
            statement="my drawings are worth making",
            conclusion="I keep drawing.",
            valence=0.4,
            intensity=0.5,
            vector=vector("my drawings are worth making I keep drawing."),
        )  # fmt: skip
    )
    kit.model.script("selection", {"matched": [1]})
    turn = Turn(
        conversation("Ann said: hi / pip replied: hello", "Ann said: look / pip replied: nice",
                     "Ann said: and this? / pip replied: it is a cat"),
        "what do you think of my new drawing?",
    )  # fmt: skip
    picked = await selector(kit, store).select(turn)
    assert picked == [HURT_RULE]
    [call] = kit.model.of("selection")
    assert call.body["temperature"] == 0.2
    # the active rules, strongest |w| first; the dormant one (98) is never offered
    assert f"THE RULES\n[1] {HURT_RULE}\n[2] when it rains → I go for a walk\n\n" in call.user
    assert "I stay inside" not in call.user
    # the carried lines (92): the strongest felt of the 12 most recently felt records, constructs as statements
    assert (
        "WHAT YOU CARRY NOW\n- Ann laughed at my drawing.\n- I believe: my drawings are worth making\n"
        in call.user
    )
    # the situation: the last 2 exchanges, then the words
    assert call.user.endswith(
        "THE SITUATION\n- Ann said: look / pip replied: nice\n- Ann said: and this? / pip replied: it is a cat\n"
        "- Now Ann says: what do you think of my new drawing?"
    )
    assert "Ann said: hi" not in call.user
    [recent] = [p for m, p in store.peer.requests if m == "memory.recent"]  # type: ignore[attr-defined]
    assert isinstance(recent, mem.RecentParams)
    assert (recent.k, sorted(recent.kinds), recent.episodes) == (12, ["construct", "lived"], 0)
    [asked] = [p for m, p in store.peer.requests if m == "memory.dispositions"]  # type: ignore[attr-defined]
    assert isinstance(asked, mem.DispositionsParams)
    assert (asked.k, asked.active_only) == (100, True)


async def test_m99_at_most_three_kept_in_the_model_s_order_valid_indices_only(kit: Kit) -> None:
    store = kit.store()
    texts = [f"when the clock strikes {n} → I hum tune {n}" for n in ("one", "two", "three", "four", "five")]
    for n, text in enumerate(texts):
        await store.learn(text, 0.9 - n / 10)  # shown in this order: [1] strongest
    kit.model.script("selection", {"matched": [5, 99, 0, -1, 5, True, 2, 1, 4]})
    picked = await selector(kit, store).select(Turn(None, "tick tock"))
    assert picked == [texts[4], texts[1], texts[0]]


@pytest.mark.parametrize("answer", ["not json", {"matched": "1"}, {"matched": []}])
async def test_m99_an_unreadable_or_empty_answer_selects_nothing(kit: Kit, answer: Any) -> None:
    await kit.store().learn(KIND_RULE, 0.5)
    kit.model.script("selection", answer, answer)
    assert await selector(kit).select(Turn(None, "great news!")) == []
    assert kit.model.of("selection")


async def test_m99_selection_reads_a_real_turn_of_the_engine(kit: Kit) -> None:
    async with kit.box() as box:
        for words in ("hello there", "I drew a cat", "do you like it?"):
            await box.say(words)
    engine = kit.engine()
    turn = await engine.begin(facts("be honest", now=kit.clock.now(), message_id="m-now"))
    await kit.store().learn(KIND_RULE, 0.5)
    kit.model.calls.clear()
    kit.model.script("selection", {"matched": [1]})
    assert await selector(kit).select(turn) == [KIND_RULE]  # type: ignore[arg-type]
    [call] = kit.model.of("selection")
    situation = call.user.split("THE SITUATION\n", 1)[1]
    assert situation.splitlines()[0].startswith("- Ann said: I drew a cat")
    assert situation.splitlines()[1].startswith("- Ann said: do you like it?")
    assert situation.splitlines()[-1] == "- Now Ann says: be honest"
    assert "hello there" not in situation


@dataclass
class DormantTooPeer:
    """A host that answers ``memory.dispositions`` with a dormant rule among the active ones."""

    inner: Any

    async def request(self, method: str, params: Any, *, timeout: float | None = None) -> Any:
        if method == "memory.dispositions":
            at = NOW
            return mem.DispositionsResult(rules=[
                mem.DispositionView(id="a", rule=KIND_RULE, weight=0.5, updated_at=at),
                mem.DispositionView(id="d", rule="when it rains → I stay inside", weight=-0.05, updated_at=at),
            ])  # fmt: skip
        return await self.inner.request(method, params, timeout=timeout)


async def test_m98_a_dormant_rule_is_never_offered_whatever_the_host_sends(kit: Kit) -> None:
    kit.model.script("selection", {"matched": [1, 2]})
    picked = await selector(kit, StoreClient(DormantTooPeer(kit.peer()))).select(Turn(None, "news!"))
    assert picked == [KIND_RULE]
    [call] = kit.model.of("selection")
    assert "I stay inside" not in call.user
