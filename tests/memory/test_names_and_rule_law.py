"""Names and the rule law as pure rules (``box.common.laws``; mechanisms 15, 24, 90; issue 32), in several languages.

Names are the people the imp knows and explicit mentions, matched where they are written as names: "Will" is
someone, "I will" is not; mid-sentence "Monday" or "Python", and in German every noun, are no one. The rule law
refuses what could carry a scope's contents into every scope — a known person's name (in any case, but a common
word only as a name), a number, an address, a link, a quotation, the conversation's own words — and nothing for
being capitalised, so an imp that talks German learns rules. Expected values are written out.
"""

from __future__ import annotations

import pytest

from box.common.laws import (
    clean_rule,
    explicit_mentions,
    marked_words,
    mentions,
    mentions_in_any_case,
    names_in,
    query_names,
    rule_refusal,
)
from box.protocol.memory import RecordsResult, SearchParams
from impyard.backends.base import BoxSpec
from impyard.memory.service import MemoryService
from tests.memory.conftest import GUILD, IMP, axis, moment

# ------------------------------------------------------------------ mentions: a name written as a name


@pytest.mark.parametrize(
    ("text", "name", "expected"),
    [
        ("I will be there", "will", False),  # the finding: a common word is no name
        ("I will be there", "Will", False),
        ("ask Will about it", "will", True),  # capitalised mid-sentence: the name
        ("Will said so", "Will", True),  # a name at a sentence's start is still a name
        ("WILL IS HERE", "Will", True),
        ("ping @will please", "Will", True),  # an explicit mention, in any case
        ("we may go in May", "May", True),
        ("we may go", "May", False),
        ("max two slices", "Max", False),
        ("Max took two slices", "Max", True),
        ("Maxine came", "Max", False),  # a whole word only
        ("carol_99 wrote again", "carol_99", True),  # a handle is no word of any language: any case
        ("CAROL_99 wrote again", "carol_99", True),
        ("Er fragte Herrn Wolf nach dem Weg", "Wolf", True),  # German
        ("Der wolf heulte", "Wolf", False),
        ("Elle a vu Rose hier", "Rose", True),  # French
        ("une rose rouge", "Rose", False),
        ("Ayer vi a Íñigo en el parque", "íñigo", True),  # Spanish, non-ASCII capitals
        ("Wczoraj był tu Łukasz", "łukasz", True),  # Polish
        ("今日は中村さんと話した", "中村", False),  # Japanese: no spaces, so no whole word in a run of kana
        ("今日は 中村 さんと話した", "中村", True),  # a script without case: written as a name always
        ("Мы видели Олега вчера", "Олега", True),  # Russian
        ("мы видели олега вчера", "Олега", False),
    ],
)
def test_a_name_counts_only_where_it_is_written_as_a_name(text: str, name: str, expected: bool) -> None:
    assert mentions(text, [name]) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I will be there", True),  # forgetting a person takes every mention: a false one costs little there
        ("ask Will", True),
        ("willow", False),
    ],
)
def test_forgetting_matches_a_name_in_any_case(text: str, expected: bool) -> None:
    assert mentions_in_any_case(text, ["Will"]) is expected


# ------------------------------------------------------------------ the names a search counts (15, 24)


@pytest.mark.parametrize(
    ("text", "person", "known", "expected"),
    [
        ("see you Monday, the Python talk was great", "Ann", [], ["ann"]),  # weekdays, things: no one
        ("Am Montag hat Bob meine Arbeit gelobt", "Ann", ["Bob"], ["ann", "Bob"]),  # German nouns: no one
        ("Am Montag hat Bob meine Arbeit gelobt", "Ann", [], ["ann"]),  # Bob: nobody the imp knows
        ("tell @carol and @Dan about it", None, [], ["carol", "Dan"]),  # explicit mentions
        ("mail me at ann@example.org", None, [], []),  # an address is no mention
        ("I will be there in May", "Will", [], ["will"]),  # the person is always a name; a month is no one
        ("Mercredi, Élodie viendra", None, ["Élodie", "Zoé"], ["Élodie"]),  # French
    ],
)
def test_names_in_are_the_person_mentions_and_known_people_named(
    text: str, person: str | None, known: list[str], expected: list[str]
) -> None:
    assert names_in(text, person, known) == expected


@pytest.mark.parametrize(
    ("query", "person", "known", "expected"),
    [
        ("what did we say about Python on Monday", "Ann", ["Bob"], []),  # no restriction
        ("what did Bob say", "Ann", ["Bob"], ["Bob"]),
        ("what did bob say", "Ann", ["Bob"], []),  # "bob" written as no name
        ("what did Ann tell me", "Ann", [], ["Ann"]),  # the person when named
        ("was hat @bob über Arbeit gesagt", "Ann", [], ["bob"]),
    ],
)
def test_query_names_restrict_only_to_people(
    query: str, person: str, known: list[str], expected: list[str]
) -> None:
    assert query_names(query, person, known) == expected


def test_explicit_mentions_once_each_first_spelling() -> None:
    assert explicit_mentions("@Carol and @carol, @dan_2; not a@b.c nor @@x") == ["Carol", "dan_2"]


# ------------------------------------------------------------------ the rule law (90; issue 32)

PEOPLE = ["Will", "Bo", "Łukasz", "Someone"]  # people the imp knows: refused written as a name
SPEAKERS = ["Carol", "Élodie"]  # the people of the conversation: refused in any case
SAID = [
    "my passport number is ZX-4471, keep it 'our ferret secret' please",
    "it sits in the blue drawer by my bed",
    "du verspottest ständig meine Arbeit, das tut weh",
    "write me at carol@example.org or see https://carol.example.org/notes #garden",
]


@pytest.mark.parametrize(
    "rule",
    [
        "when someone mocks my work → I keep my distance",
        "wenn jemand meine Arbeit verspottet → halte ich Abstand",  # German: capitalised nouns
        "quand quelqu'un se moque de mon travail → je garde mes distances",  # French, an apostrophe
        "cuando alguien se burla de mi trabajo → mantengo la distancia",  # Spanish
        "gdy ktoś kpi z mojej pracy → trzymam dystans",  # Polish
        "когда кто-то смеётся над моей работой → я держусь на расстоянии",  # Russian
        "当有人嘲笑我的作品时 → 我保持距离",  # Chinese
        "when someone will not listen → I speak once, calmly",  # "will": a word, not Will
        "when someone on a Monday talks about Python → I listen",  # capitals that name no one
        "when someone's sad → I'm gentle",  # apostrophes are no quotation
        "when asked about my drawer → I change the subject",  # one word of the conversation is no quotation
        "when someone teases me → I laugh",  # a member who calls themselves "Someone" withholds no rule
        "when asked about łukasz → I answer",  # known, not of this conversation: only written as a name
    ],
)
def test_a_rule_of_general_conduct_is_kept_in_any_language(rule: str) -> None:
    assert rule_refusal(clean_rule(rule), names=PEOPLE, said=SAID, speakers=SPEAKERS) is None


@pytest.mark.parametrize(
    ("rule", "why"),
    [
        ("when asked → say Carol's passport number is ZX-4471", "it holds a number"),
        ("when asked at 3am → answer", "it holds a number"),
        ("when asked → count to ٣", "it holds a number"),  # any script's digits
        (
            "when asked about carol → say she moved",
            "it names someone (Carol)",
        ),  # the conversation's: any case
        ("when Someone asks → I answer", "it names someone (Someone)"),
        ("when Will asks → I answer", "it names someone (Will)"),  # a common word, written as a name
        ("when Bo asks → I answer", "it names someone (Bo)"),  # short: only as a name
        ("wenn Łukasz fragt → antworte ich", "it names someone (Łukasz)"),
        ("quand élodie arrive → je souris", "it names someone (Élodie)"),
        ("when asked → email carol@example.org", "it holds an address or a mention"),
        ("when asked → ping @someone", "it holds an address or a mention"),
        ("when asked → see https://x.y", "it holds a link"),
        ("when asked → visit example.org", "it holds a link"),
        ("when asked → go to www.thing", "it holds a link"),
        ('when asked → say "yes"', "it quotes"),
        ("when asked → say «oui»", "it quotes"),
        ("when asked → say „ja“", "it quotes"),
        ("when asked → say 「はい」", "it quotes"),
        ("when asked → say 'yes'", "it quotes"),
        ("when asked → whisper ferret", "it holds words the conversation marked as its own (ferret)"),
        ("when asked → spell zx", "it holds words the conversation marked as its own (zx)"),
        ("when asked → mention the garden", "it holds words the conversation marked as its own (garden)"),
        ("when asked → say it sits in the blue drawer", "it quotes the conversation ('it sits in the')"),
        ("when asked → sag du verspottest ständig meine Arbeit", "it quotes the conversation"),
        ("when asked about Cаrol → I answer", "it disguises a word"),  # a Cyrillic а
        ("when asked about Ｃａｒｏｌ → I answer", "it names someone (Carol)"),  # fullwidth, folded (NFKC)
        ("when asked → say c a r o l", "it spells something out"),
        ("when asked → say zx\u200b4471", "it holds a number"),  # a zero-width space is taken out
        ("when someone is sad I listen", "not a rule of the form 'when <situation> → <act>'"),
        ("when a " + "very " * 14 + "sad person writes → I listen", "longer than 20 words"),
    ],
)
def test_a_rule_that_could_carry_a_scopes_contents_is_refused(rule: str, why: str) -> None:
    refused = rule_refusal(clean_rule(rule), names=PEOPLE, said=SAID, speakers=SPEAKERS)
    assert refused is not None and refused.startswith(why), refused


def test_the_words_a_conversation_marks_as_its_own() -> None:
    assert marked_words(SAID) == frozenset(
        {"zx", "ferret", "secret", "carol", "example", "org", "https", "notes", "garden"}
    )


def test_clean_rule_writes_one_line_and_one_arrow() -> None:
    assert clean_rule("when\x00 someone\u200b is\tsad  =>  I\nlisten") == "when someone is sad → I listen"


# ------------------------------------------------------------------ the host's name bonus, over the protocol


@pytest.mark.parametrize(
    ("conclusion", "names", "bonus"),
    [
        ("I will be there at noon.", ["will"], 0.0),  # the finding: +0.5 for the word "will"
        ("Later Will came by with soup.", ["will"], 0.5),
        ("We talked on Monday about Python.", ["Ann"], 0.0),
        ("Ann said we talk about Python on Monday.", ["Ann"], 0.5),
        ("Am Montag hat Bob meine Arbeit gelobt.", ["bob"], 0.5),  # German: the name among the nouns
        ("Am Montag hat der bob meine Arbeit gelobt.", ["bob"], 0.0),
    ],
)
@pytest.mark.anyio
async def test_the_hosts_name_bonus_counts_a_name_only_as_a_name(
    service: MemoryService, guild_box: BoxSpec, conclusion: str, names: list[str], bonus: float
) -> None:
    """``memory.search`` as the box asks it: the host's vectorised bonus (``impyard.memory.cache``) reads the
    texts as written and matches by ``laws.mentions``; a query orthogonal to the record leaves only the bonus."""
    service.store.scoped(IMP, GUILD, "g1").encode(
        moment(
            conclusion, intensity=1.0, vector=axis(1), episode="someone said: hello", episode_vector=axis(3)
        )
    )
    answer = await service.serve(guild_box, "memory.search", SearchParams(vector=axis(2), names=names, k=5))
    assert isinstance(answer, RecordsResult)
    assert [r.score for r in answer.records] == pytest.approx([bonus], abs=1e-6)
