"""Scenario ``memory_evidence`` (issue 32, finding 8): does what a person said reach the model when they ask?

A conversation is typed through the real pipeline — the session manager of ``impyard chat`` (``Conversations.route``
on the terminal channel, as ``impyard.terminal.chat.Chat.send`` does), the real box on the process backend, the host's
gateway and memory store — one message per line said, one chat per session at its own date (the host's clock is
moved; every age and every fading follows it), each chat ended by the person leaving (``/quit``: the departure
task runs, mechanism 103). The model is the loopback fake OpenAI, scripted so every call is deterministic (the
appraisal forms a feeling from the words; the filter keeps the first candidates it has room for); the embedder
is REAL: all-MiniLM-L6-v2 (``bench.real_embedder``) behind the fake's ``/embeddings``, and the imp asks for its
384 dimensions.

Then each question is asked in a chat of its own (a new terminal channel: a new conversation, nothing in view but
what memory brings), after the last session; its turn's moment is not kept (the appraisal is unreadable on
purpose), so no question changes what the next one finds. Scored per question: did the text of its evidence (what
was said, as typed) reach any of that turn's model calls (the fake's recorded requests: reply, filter, appraisal…)?
Beside it, from the same run: plain cosine@10 — the same embedder over the same remembered texts (the person's
words of every episode the store kept), the 10 nearest to the question — and the same over the episodes' stored
"X said: … / Y replied: …" texts.

The sets: ``held_out`` (12 personal facts told once among 140 turns of small talk over 16 days, asked back on day
17 in other words), ``near_miss`` (10 facts, each followed on later days by three lines on the same topic that do
not answer its question: recency against meaning), ``near_miss_long`` (the same facts in the first 10 of 40
days, the near misses spread over the 30 after, among 8 lines of small talk a day: ~400 lines), and LoCoMo (snap-research/locomo, ``data/locomo10.zip``;
not shipped: ``--locomo PATH`` or ``IMPYARD_LOCOMO=PATH``), conversations by index, scored per category.

Standalone, to compare two checkouts in one run (the code is whatever ``PYTHONPATH`` points at)::

    PYTHONPATH=. python -m bench.memory_recall --sets held_out,near_miss --locomo ~/locomo10.zip --convs 0
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import uuid
import zipfile
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from bench.env import isolated_home
from bench.real_embedder import DIMS, EmbedderMissing, RealEmbedder, available
from bench.report import Row
from box.protocol.models import Author, Message
from impyard.clock import FixedClock
from impyard.conversation.inbound import MAX_TERMINAL_CHARS, Inbound
from impyard.gateway.surfaces import RecordingSurface
from impyard.imps.store import ImpStore
from impyard.memory.act import memory_service_of
from impyard.memory.departures import depart_now, wait_finished
from impyard.runtime import open_runtime
from impyard.supervisor import DEPARTURES_ONLY, SupervisorSettings, open_supervisor
from testing.fake_openai import FakeOpenAI, RecordedRequest, envelope

IMP = "mnemo"
PERSON = "jo"
PERSON_ID = f"terminal:{PERSON}"
CHANNEL = f"terminal:{PERSON}"
PERSONA = "You are Mnemo, a warm companion who remembers what people tell you."
TURN_GAP = timedelta(seconds=40)
TURN_TIMEOUT_S = 120.0
TOP_K = 10
EVIDENCE_KEY_CHARS = 60  # the start of a line said, as it must appear in a model call
LOCOMO_ENV = "IMPYARD_LOCOMO"
LOCOMO_CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
TARGET_SHARE = 0.95  # issue 32: ≥ 0.95 × plain cosine@10


# ------------------------------------------------------------------ the sets


@dataclass
class Question:
    text: str
    evidence: list[str]  # the lines said (as typed) that answer it
    category: str = "fact"


@dataclass
class Conversation:
    name: str
    sessions: list[tuple[datetime, list[str]]]  # each chat: when it starts, the lines typed
    questions: list[Question]
    asked_at: datetime


def _small_talk(rng: np.random.Generator) -> str:
    subjects = ["The weather", "My commute", "Lunch", "The new café downstairs", "Work", "The series I watch",
                "My morning run", "The traffic", "The neighbours' dog", "The bus", "My inbox", "Dinner",
                "The podcast I follow", "The laundry", "The garden", "Grocery shopping"]  # fmt: skip
    verbs = ["was", "has been", "felt", "seemed", "turned out"]
    states = ["pretty ordinary today", "a bit annoying", "fine, nothing special", "surprisingly nice",
              "slower than usual", "busy again", "quiet for once", "a little chaotic", "okay I guess",
              "better than yesterday"]  # fmt: skip
    tails = ["", " Anyway.", " How about you?", " Not much else to say.", " I'm a bit tired.",
             " We'll see tomorrow.", " Such is life.", " Can't complain."]  # fmt: skip
    return f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(states)}.{rng.choice(tails)}".strip()


HELD_OUT_FACTS = [
    ("My sister Mara moved to Lisbon last spring and teaches piano there.",
     "Which city did my sister end up living in?"),
    ("I'm allergic to peanuts, even a trace makes my throat swell.",
     "Is there any food I have to stay away from?"),
    ("My daughter Ines turns seven on the 14th of March.",
     "When is my little girl's birthday?"),
    ("I drive an old green Volvo that I bought from my uncle.",
     "What car do I have?"),
    ("My father was a lighthouse keeper in Brittany for thirty years.",
     "What did my dad do for work?"),
    ("I play the cello in a small amateur orchestra on Tuesday nights.",
     "Which instrument do I play?"),
    ("My cat is called Pimento and he only eats wet food.",
     "What's the name of my pet?"),
    ("I work as a night nurse at the children's hospital.",
     "What's my job?"),
    ("My best friend Ravi lives in Toronto and we video call on Sundays.",
     "Where does my closest friend live?"),
    ("I broke my left wrist skiing when I was nineteen.",
     "Have I ever had a serious injury?"),
    ("My favourite book is One Hundred Years of Solitude, I reread it every winter.",
     "Which novel do I keep coming back to?"),
    ("I'm saving up to open a small bakery with my husband Tomas.",
     "What business am I hoping to start?"),
]  # fmt: skip


def held_out(start: datetime) -> Conversation:
    """12 facts told once among 140 turns of small talk over 16 days (≈ 9 a day), asked on day 17."""
    rng = np.random.default_rng(32)
    total, days = 140, 16
    fact_turns = sorted(rng.choice(np.arange(3, total - 3), size=len(HELD_OUT_FACTS), replace=False).tolist())
    lines: list[str] = []
    facts = iter(HELD_OUT_FACTS)
    for turn in range(total):
        lines.append(next(facts)[0] if turn in fact_turns else _small_talk(rng))
    per_day = -(-total // days)
    sessions = [
        (start + timedelta(days=d, hours=18), lines[d * per_day : (d + 1) * per_day]) for d in range(days)
    ]
    questions = [Question(q, [fact]) for fact, q in HELD_OUT_FACTS]
    return Conversation(
        "held_out", [s for s in sessions if s[1]], questions, start + timedelta(days=days, hours=10)
    )


NEAR_MISS = [
    ("My brother Tomas flies cargo planes for a living.",
     ["I watched a documentary about airports last night.", "Planes flying over the house woke me up again.",
      "My neighbour bought a drone and flies it in the park."],
     "What does my brother do for work?"),
    ("My dentist appointment is on Thursday the 9th at 3 pm.",
     ["I should floss more, honestly.", "The dentist's waiting room music is the worst.",
      "I finally bought a new electric toothbrush."],
     "When am I seeing the dentist?"),
    ("We named our new puppy Biscuit, she's a beagle.",
     ["Dogs in the park were going crazy today.", "I read that beagles howl a lot.",
      "My friend's puppy chewed her shoes."],
     "What is our puppy called?"),
    ("I grew up in a small village near Porto.",
     ["Porto wine is overrated, if you ask me.", "Villages are so quiet at night.",
      "I want to visit the north of Portugal someday."],
     "Where did I spend my childhood?"),
    ("My husband is vegetarian, so we never cook meat at home.",
     ["I tried a new lentil soup recipe.", "Meat prices have gone up a lot.",
      "The vegetarian place in town closed down."],
     "Does my husband eat meat?"),
    ("I'm learning Japanese because we're moving to Osaka next year.",
     ["Languages are hard after thirty.", "I watched a Japanese film with subtitles.",
      "Osaka is supposed to have great street food."],
     "Why am I studying a new language?"),
    ("My mother's name is Helena and she is eighty-one.",
     ["Old people in my street sit outside all day.", "My friend's mum just retired.",
      "Birthdays make me think about getting older."],
     "How old is my mum?"),
    ("I run the Berlin marathon every September.",
     ["My knees hurt after today's run.", "Berlin is grey in winter.", "I bought new running shoes."],
     "Which race do I do every year?"),
    ("My blood type is O negative, I donate every few months.",
     ["Hospitals smell so strange.", "I hate needles, really.", "The blood bank called for volunteers."],
     "What is my blood type?"),
    ("Our wedding anniversary is the 2nd of June.",
     ["Weddings are so expensive these days.", "June is always too hot here.",
      "My friends just got engaged."],
     "When is our anniversary?"),
]  # fmt: skip


def near_miss(start: datetime) -> Conversation:
    """10 facts over 10 days; each fact's three near misses come on the days after it (more recent, same
    topic, no answer): recency and topic against what was actually said."""
    rng = np.random.default_rng(9)
    days: dict[int, list[str]] = defaultdict(list)
    for n, (fact, misses, _) in enumerate(NEAR_MISS):
        days[n].append(fact)
        for m, miss in enumerate(misses):
            days[n + 1 + m].append(miss)
    sessions = []
    for day in sorted(days):
        lines = [*days[day], *(_small_talk(rng) for _ in range(4))]
        rng.shuffle(lines)
        sessions.append((start + timedelta(days=day, hours=19), lines))
    questions = [Question(q, [fact]) for fact, _, q in NEAR_MISS]
    return Conversation("near_miss", sessions, questions, start + timedelta(days=max(days) + 2, hours=9))


def near_miss_long(start: datetime) -> Conversation:
    """The near-miss facts told in the first 10 days of 40, each near miss on a later day (days 10-39), among
    8 lines of small talk a day, asked on day 41: ~400 lines, the facts weeks older than everything near them."""
    rng = np.random.default_rng(41)
    days: dict[int, list[str]] = defaultdict(list)
    for n, (fact, misses, _) in enumerate(NEAR_MISS):
        days[n].append(fact)
        for m, miss in enumerate(misses):
            days[10 + 3 * n + m].append(miss)
    sessions = []
    for day in range(40):
        lines = [*days[day], *(_small_talk(rng) for _ in range(8))]
        rng.shuffle(lines)
        sessions.append((start + timedelta(days=day, hours=19), lines))
    questions = [Question(q, [fact]) for fact, _, q in NEAR_MISS]
    return Conversation("near_miss_long", sessions, questions, start + timedelta(days=41, hours=9))


def _locomo_when(text: str) -> datetime:
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


def locomo_conversations(path: Path) -> list[dict[str, Any]]:
    """The ten LoCoMo conversations in their published order (locomo10.json, or the zip of the repository)."""
    if path.suffix == ".zip":
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.endswith(".json")]
            names.sort(key=lambda n: int(re.sub(r"\D", "", n.rsplit("/", 1)[-1]) or 0))
            return [json.loads(archive.read(n)) for n in names]
    data = json.loads(path.read_text())
    return data if isinstance(data, list) else [data]


def locomo(sample: dict[str, Any], index: int) -> Conversation:
    """One dialog turn a message ("Speaker: text", a shared photo as its caption), one chat per session."""
    conv = sample.get("conversation", sample)
    said: dict[str, str] = {}
    sessions = []
    n = 1
    while f"session_{n}" in conv or f"session_{n}_date_time" in conv:
        turns = conv.get(f"session_{n}") or []
        if turns:
            lines = []
            for turn in turns:
                text = f"{turn['speaker']}: {turn.get('text', '')}".strip()
                if turn.get("blip_caption"):
                    text += f" [shares a photo: {turn['blip_caption']}]"
                said[turn["dia_id"]] = text
                lines.append(text)
            sessions.append((_locomo_when(conv[f"session_{n}_date_time"]), lines))
        n += 1
    questions = []
    for qa in sample.get("qa", []):
        evidence = [said[e.strip()] for e in qa.get("evidence", []) if e.strip() in said]
        if evidence:
            category = LOCOMO_CATEGORIES.get(int(qa.get("category", 0)), str(qa.get("category")))
            questions.append(Question(str(qa["question"]), evidence, category))
    last = max(when for when, _ in sessions)
    return Conversation(f"locomo_{index}", sessions, questions, last + timedelta(days=1))


# ------------------------------------------------------------------ the scripted model


def _stable(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def _said_in(request: RecordedRequest) -> str:
    """The exchange the appraisal is asked about (its user text ends with it)."""
    messages = request.body.get("messages") or []
    return str(messages[-1].get("content", "")) if messages else ""


class Script:
    """Deterministic answers for every memory call; ``asking`` turns the appraisal off (a question is not kept)."""

    def __init__(self) -> None:
        self.asking = False

    def appraisal(self, request: RecordedRequest) -> Any:
        if self.asking:
            return "not an appraisal"  # unreadable: the reply's moment is None too, so nothing is kept (59)
        text = _said_in(request)
        words = text.rsplit(f"{PERSON} said: ", 1)[-1].split("\n", 1)[0].strip()
        h = _stable(words)
        valence = [0.5, 0.4, 0.3, -0.3][h % 4]  # mostly pleasant; a change of sign opens a record (64)
        intensity = 0.3 + 0.1 * (h % 5)
        # "lasting" false throughout: the ranking is measured on the seed's records (a lived moment joins the
        # conversation's record of its sign); which lines a real model would keep apart is not scripted here.
        return {"feeling": "interest" if valence > 0 else "unease",
                "conclusion": f"{PERSON.capitalize()} told me: {words[:200]}",
                "valence": valence, "intensity": intensity, "lasting": False}  # fmt: skip

    @staticmethod
    def filter(request: RecordedRequest) -> dict[str, Any]:
        system = str((request.body.get("messages") or [{}])[0].get("content", ""))
        room = re.search(r"at most (\d+)", system)
        keep = int(room.group(1)) if room else 4
        return {"keep": list(range(1, keep + 1)), "asks_for_memory": False, "asks_for_own": None}

    def install(self, fake: FakeOpenAI) -> None:
        fake.script(envelope(answer="I hear you.", answer_needed=True), purpose="reply")
        fake.script(self.appraisal, purpose="appraisal")
        fake.script(self.filter, purpose="filter")
        fake.script({"summary": f"{PERSON} and I talked about their days."}, purpose="summary")
        fake.script({"greeting": None, "feeling": "calm", "conclusion": f"{PERSON} is here.", "valence": 0.2,
                     "intensity": 0.2, "search": None}, purpose="arrival")  # fmt: skip
        fake.script({"matched": []}, purpose="selection")
        fake.script("no thought", purpose="introspection")  # unreadable: a departure thinks nothing over
        fake.script({"learned": None}, purpose="learning")


# ------------------------------------------------------------------ one conversation through the pipeline


@dataclass
class Asked:
    question: Question
    reached: bool
    plain: bool  # the evidence among the 10 nearest words (plain cosine)
    plain_template: bool  # … among the 10 nearest stored "X said: … / Y replied: …" texts
    calls: int
    shown: int = 0  # remembered lines whose text reached the question's calls (any of them)
    plain_at_shown: bool = (
        False  # the evidence among as many nearest words as the pipeline showed, on average
    )


@dataclass
class Outcome:
    name: str
    turns: int
    asked: list[Asked] = field(default_factory=list)
    records: int = 0
    episodes: int = 0
    ingest_s: float = 0.0
    ask_s: float = 0.0
    shown_k: int = TOP_K


def _normal(text: str) -> str:
    return " ".join(text.split())


def _texts(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)


def _key(line: str) -> str:
    return _normal(line)[:EVIDENCE_KEY_CHARS]


def _inbound(channel_id: str, text: str, now: datetime) -> Inbound:
    message = Message(id=f"t-{uuid.uuid4().hex[:16]}", author=Author(id=PERSON_ID, name=PERSON), content=text,
                      created_at=now)  # fmt: skip
    return Inbound(surface="terminal", channel_id=channel_id, channel_kind="terminal", message=message,
                   channel_name="terminal", max_chars=MAX_TERMINAL_CHARS)  # fmt: skip


def _said_of(as_happened: str) -> str:
    """The person's words of a stored "X said: … / Y replied: …" text."""
    head = f"{PERSON} said: "
    text = as_happened[len(head) :] if as_happened.startswith(head) else as_happened
    return text.split(f"\n{IMP} replied: ", 1)[0]


async def _say(runtime: Any, channel_id: str, text: str, now: datetime) -> None:
    routed = await runtime.conversations.route(IMP, _inbound(channel_id, text, now))
    if routed.turn is None:
        raise RuntimeError(f"the message was not taken: {routed.outcome}")
    with anyio.fail_after(TURN_TIMEOUT_S):
        await routed.finished()


async def _depart(runtime: Any, departures: Any) -> None:
    """``/quit``: the departure task (mechanism 103), run by the chat's departures-only supervisor."""
    db = runtime.db
    task_id = await db.run(depart_now, db, departures.tasks, IMP, CHANNEL, PERSON_ID, memory=True)
    if task_id is None:
        return
    departures.wake()
    task = await db.run(departures.tasks.get, task_id)
    await wait_finished(db, departures.tasks, task_id, task.ceiling_s + 15)


# "gateway": the imp asks the fake OpenAI, which answers with the real embedder's vectors; "local" (issue 33): the
# imp's own [memory] embedder = "local", the same model computed by the host (no /embeddings request leaves it).
EMBEDDERS = ("gateway", "local")
EMBEDDER = {"name": "gateway"}


def add_imp() -> None:
    memory: dict[str, Any] = {"enabled": True, "embedder": "local"}
    if EMBEDDER["name"] == "gateway":
        memory = {
            "enabled": True,
            "embedder": "gateway",
            "embedding_model": "text-embedding-3-small",
            "dimensions": DIMS,
        }
    ImpStore().add(IMP, PERSONA, memory=memory, sessions={"idle_s": 5})


async def run_conversation(
    conv: Conversation, embedder: RealEmbedder, backend: Any, say: Any = print
) -> Outcome:
    """Ingest ``conv`` chat by chat, then ask every question in a chat of its own; score against plain cosine."""
    outcome = Outcome(conv.name, sum(len(lines) for _, lines in conv.sessions))
    script = Script()
    with FakeOpenAI() as fake:
        embedder.script(fake)
        script.install(fake)
        os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"] = fake.base_url, fake.api_key or "x"
        try:
            add_imp()
            clock = FixedClock(conv.sessions[0][0])
            began = time.perf_counter()
            async with (
                open_runtime([IMP], RecordingSurface(), clock=clock, backends={IMP: backend}) as runtime,
                open_supervisor(host=runtime.host, settings=SupervisorSettings(kinds=DEPARTURES_ONLY),
                                backend_for=lambda imp: backend) as departures,
            ):  # fmt: skip
                async with anyio.create_task_group() as tg:
                    tg.start_soon(partial(departures.run, stop=anyio.Event()))
                    for n, (when, lines) in enumerate(conv.sessions):
                        clock.set(when)
                        for line in lines:
                            await _say(runtime, CHANNEL, line, clock.now())
                            clock.advance(TURN_GAP)
                        await _depart(runtime, departures)
                        say(f"  {conv.name}: chat {n + 1}/{len(conv.sessions)} typed")
                    outcome.ingest_s = time.perf_counter() - began
                    store = memory_service_of(runtime.gateway).store  # type: ignore[union-attr]
                    episodes = await runtime.db.run(_episodes, store.db)
                    outcome.records = await runtime.db.run(store.count, IMP)
                    outcome.episodes = len(episodes)
                    plain = _plain(embedder, episodes, conv.questions)
                    keys = list(dict.fromkeys(_key(_said_of(e)) for e in episodes))
                    script.asking = True
                    began = time.perf_counter()
                    for n, question in enumerate(conv.questions):
                        clock.set(conv.asked_at + timedelta(minutes=n))
                        first = len(fake.requests)
                        await _say(runtime, f"terminal:ask-{n}", question.text, clock.now())
                        calls = [r for r in fake.requests[first:] if r.purpose != "embedding"]
                        seen = _normal(" ".join(t for r in calls for t in _texts(r.body)))
                        reached = any(_key(line) in seen for line in question.evidence)
                        shown = sum(key in seen for key in keys)
                        outcome.asked.append(
                            Asked(question, reached, *plain[n], calls=len(calls), shown=shown)
                        )
                    outcome.ask_s = time.perf_counter() - began
                    outcome.shown_k = max(
                        1, round(sum(a.shown for a in outcome.asked) / max(1, len(outcome.asked)))
                    )
                    wider = _plain(embedder, episodes, conv.questions, outcome.shown_k)
                    for a, (found, _) in zip(outcome.asked, wider, strict=True):
                        a.plain_at_shown = found
                    tg.cancel_scope.cancel()
        finally:
            os.environ.pop("OPENAI_BASE_URL", None)
            os.environ.pop("OPENAI_API_KEY", None)
            with suppress(Exception):
                ImpStore().remove(IMP, purge=True)
    return outcome


def _episodes(db: Any) -> list[str]:
    """Every kept episode's as-it-happened text; each must carry a vector of the real embedder's length (the
    imp asks the fake for ``dimensions``: a wrong setting would leave recall comparing nothing)."""
    from sqlalchemy import text

    dims = db.read(
        lambda conn: {r[0] for r in conn.execute(text("SELECT DISTINCT dims FROM memory_episodes"))}
    )
    if dims != {DIMS}:
        raise RuntimeError(
            f"episode vectors of {sorted(dims, key=str)} dimensions, not {DIMS}: check [memory]"
        )
    return db.read(
        lambda conn: [
            str(r[0])
            for r in conn.execute(text("SELECT as_happened FROM memory_episodes WHERE imp = :i"), {"i": IMP})
        ]  # fmt: skip
    )


def _plain(
    embedder: RealEmbedder, episodes: list[str], questions: Sequence[Question], k: int = TOP_K
) -> list[tuple[bool, bool]]:
    """Plain cosine@10 over the same remembered texts: the person's words of each kept episode, and the stored
    template texts; per question, whether an evidence line is among the 10 nearest."""
    said = [_said_of(e) for e in episodes]
    words = embedder.embed(said)
    templates = embedder.embed(episodes)
    asked = embedder.embed([q.text for q in questions])
    found = []
    for q, vector in zip(questions, asked, strict=True):
        keys = {_key(line) for line in q.evidence}
        near = np.argsort(-(words @ vector), kind="stable")[:k]
        near_t = np.argsort(-(templates @ vector), kind="stable")[:k]
        found.append((any(_key(said[i]) in keys for i in near), any(_key(said[i]) in keys for i in near_t)))
    return found


# ------------------------------------------------------------------ figures


def _share(values: Sequence[bool]) -> float | None:
    return round(sum(values) / len(values), 3) if values else None


def figures(outcome: Outcome) -> dict[str, Any]:
    asked = outcome.asked
    by: dict[str, list[Asked]] = defaultdict(list)
    for a in asked:
        by[a.question.category].append(a)
    reached, plain = _share([a.reached for a in asked]), _share([a.plain for a in asked])
    return {
        "turns": outcome.turns, "questions": len(asked), "records": outcome.records, "episodes": outcome.episodes,
        "reached": reached, "reached_count": sum(a.reached for a in asked),
        "plain_cosine_at_10": plain, "plain_template_cosine_at_10": _share([a.plain_template for a in asked]),
        "ratio": round(reached / plain, 3) if reached is not None and plain else None,
        # for scale: how many remembered lines a question's calls showed, and plain cosine at that many
        "shown_mean": round(sum(a.shown for a in asked) / len(asked), 1) if asked else None,
        "plain_cosine_at_shown": _share([a.plain_at_shown for a in asked]), "shown_k": outcome.shown_k,
        "met": bool(reached is not None and plain is not None and reached >= TARGET_SHARE * plain),
        "categories": {
            name: {"questions": len(items), "reached": _share([a.reached for a in items]),
                   "plain_cosine_at_10": _share([a.plain for a in items])}
            for name, items in sorted(by.items())
        },
        "missed": [a.question.text for a in asked if not a.reached][:40],
        "missed_where_plain_found": [a.question.text for a in asked if a.plain and not a.reached][:40],
        "ingest_s": round(outcome.ingest_s, 1), "ask_s": round(outcome.ask_s, 1),
    }  # fmt: skip


def sets(names: Sequence[str], locomo_path: Path | None, convs: Sequence[int]) -> list[Conversation]:
    start = datetime(2026, 3, 2, tzinfo=UTC)
    chosen: list[Conversation] = []
    if "held_out" in names:
        chosen.append(held_out(start))
    if "near_miss" in names:
        chosen.append(near_miss(start))
    if "near_miss_long" in names:
        chosen.append(near_miss_long(start))
    if "locomo" in names and locomo_path is not None:
        samples = locomo_conversations(locomo_path)
        chosen += [locomo(samples[i], i) for i in convs if i < len(samples)]
    return chosen


def _existing(path: Path | None) -> Path | None:
    return path if path is not None and path.exists() else None


def locomo_path() -> Path | None:
    raw = os.environ.get(LOCOMO_ENV)
    return Path(raw).expanduser() if raw else None


async def evaluate(
    names: Sequence[str], path: Path | None, convs: Sequence[int], backend: Any, say: Any = print
) -> dict[str, Any]:
    if not available():
        raise EmbedderMissing("the real embedder is not installed: see bench/real_embedder.py")
    embedder = RealEmbedder()
    results: dict[str, Any] = {}
    path = _existing(path)
    if "locomo" in names and path is None:
        say(f"LoCoMo skipped: no data (give --locomo PATH or {LOCOMO_ENV}=PATH to data/locomo10.zip)")
        results["locomo"] = {"skipped": f"no LoCoMo data ({LOCOMO_ENV} unset or missing)"}
    for conv in sets(names, path, convs):
        say(f"{conv.name}: {sum(len(s) for _, s in conv.sessions)} lines in {len(conv.sessions)} chats, "
            f"{len(conv.questions)} questions")  # fmt: skip
        with isolated_home():  # a home of its own: the host's database keeps every imp's memory
            outcome = await run_conversation(conv, embedder, backend, say)
        results[conv.name] = figures(outcome)
        say(f"  {conv.name}: reached {results[conv.name]['reached']} vs plain cosine@10 "
            f"{results[conv.name]['plain_cosine_at_10']}")  # fmt: skip
    return results


# ------------------------------------------------------------------ the scenario of `python -m bench`


async def run(ctx: Any) -> dict[str, Any]:
    from bench.harness import result

    if not available():
        return result({}, baseline=None, ratio=None, targets={}, met=False,
                      status="skipped: the real embedder is not installed (bench/real_embedder.py)")  # fmt: skip
    quick = ctx.plan.warm_samples < 50  # --quick: the near-miss set alone (≈ 30 s), LoCoMo only if given
    names = ["near_miss", "locomo"] if quick else ["held_out", "near_miss", "near_miss_long", "locomo"]
    path = locomo_path()
    convs = [0] if quick else [0, 1, 2, 3, 4]
    found = await evaluate(names, path, convs, ctx.backends["process"], say=lambda line: None)
    scored = [v for v in found.values() if "reached" in v]
    met = bool(scored) and all(v["met"] for v in scored)
    return result(
        {}, baseline=None, ratio=None, targets={"reached_vs_plain": TARGET_SHARE}, met=met, sets=found
    )


def rows(data: dict[str, Any]) -> list[Row]:
    out = []
    for name, got in data.get("sets", {}).items():
        if "reached" not in got:
            out.append(Row(f"memory evidence {name}", {}, None, None, got.get("skipped", "–"), None))
            continue
        target = (f"≥ {TARGET_SHARE} × cosine@10 {got['plain_cosine_at_10']:.2f} → reached "
                  f"{got['reached']:.2f}")  # fmt: skip
        out.append(Row(f"memory evidence {name}", {"samples": got["questions"]}, None, got["ratio"], target,
                       got["met"]))  # fmt: skip
    return out


def main() -> None:
    import argparse

    from impyard.backends.process import ProcessBackend

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--sets", default="held_out,near_miss,near_miss_long,locomo")
    parser.add_argument("--locomo", type=Path, default=locomo_path())
    parser.add_argument("--convs", default="0", help="LoCoMo conversations, e.g. 0,1,2")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--embedder", choices=EMBEDDERS, default="gateway",
                        help="gateway: the fake OpenAI answers with the real vectors; local: the host's own (issue 33)")  # fmt: skip
    args = parser.parse_args()
    EMBEDDER["name"] = args.embedder
    names = [n.strip() for n in args.sets.split(",") if n.strip()]
    convs = [int(c) for c in args.convs.split(",") if c.strip()]
    began = time.perf_counter()
    with isolated_home():
        found = anyio.run(evaluate, names, args.locomo, convs, ProcessBackend(warn=False))
    found["duration_s"] = round(time.perf_counter() - began, 1)
    text = json.dumps(found, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
