"""Issue 33: a memory turn at close to a plain turn's price — the calls on the way to the reply, and their size.

Through the real host (the runtime, the gateway and its default policy, the memory service), the real box in
this process (``InProcessBackend``) and the real ``openai`` SDK against the loopback fake OpenAI, which refuses
what the real service refuses (a ``reasoning_effort`` gpt-4.1-mini does not take, a strict schema it would not
compile). Each path's calls are read off the fake in the order they arrived:

* a normal turn (a known person, no search): at most the words' embedding (the gateway embedder only) and
  the association filter before the one reply call — and no filter when no weak memory from outside this
  conversation came up;
* a stranger's first message: the arrival beside recall, then one reply call whose senses already hold the
  unknown-person probe's null (mechanism 25), never a draft thrown away;
* a memory question: recall's filter reads the question, the moment probe (26) searches before the reply,
  one reply call;
* the memory block never repeats what the reply's chat history holds, and the appraisal's request does not
  grow with the conversation;
* every memory call carries an output cap and the least reasoning effort its model takes.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from box.common.embedding import hashing_vector
from box.common.memory_models import memory_model
from box.common.model_profiles import profile_for
from box.common.schema_bounds import fit_schema
from box.context import memory_block_of, split_context
from box.memory.association_filter import SCHEMA as FILTER_SCHEMA
from box.memory.calls import MAX_OUTPUT_CAP, OUTPUT_CAPS, REASONING_HEADROOM, output_cap
from box.memory.contexts import ReplyView, Scene, focus_block
from box.memory.focus import EVOKED_IN_VIEW, Focus
from box.memory.moment import SCHEMA as APPRAISAL_SCHEMA
from box.memory.prompts import Prompts
from box.memory.state import State
from box.protocol.memory import RecordView
from box.protocol.models import MemoryPurpose
from impyard.clock import FixedClock
from impyard.gateway.surfaces import RecordingSurface
from impyard.imps.store import ImpStore
from impyard.memory.store import MemoryStore
from impyard.runtime import Runtime, open_runtime
from impyard.storage.db import open_database
from testing.fake_openai import FakeOpenAI, RecordedRequest, embedding_vector, envelope
from testing.inprocess import InProcessBackend
from tests.memory.engine_kit import NOW, Kit, verdict
from tests.memory.test_keeping import say as say_as_ann

pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(env=True)]

CHANNEL = "4242"
DIMENSIONS = 256  # [memory] dimensions, the default
SAILING = "Ann and I went sailing on the lake last summer."  # about Ann, from before: she is known (25)
RAIN = "I watched the rain run down the window for an hour."  # weak, from before: the filter's to decide
ECLIPSE = "I watched the eclipse with a friend, the sky went dark at noon."
MEMORY_PURPOSES = {"arrival", "appraisal", "filter", "summary", "selection", "introspection"}


def appraise(request: RecordedRequest) -> dict[str, Any]:
    happened = json.dumps(request.body).split("WHAT JUST HAPPENED", 1)[-1]
    conclusion = "Ann greeted me warmly." if "hello" in happened else "Ann told me something."
    return {"feeling": "calm", "conclusion": conclusion, "valence": 0.3, "intensity": 0.3, "lasting": False}


def choose(request: RecordedRequest) -> dict[str, Any]:
    """A faithful filter: keeps the memories that share a word (4 letters or more) with the words, and reads
    "remember" as a question about the past (21)."""
    user = str(request.body["messages"][-1]["content"])
    memories, _, words = user.partition("THE WORDS")
    wanted = {w for w in re.findall(r"\w{4,}", words.lower()) if w != "keep"}
    shown = [line.lower() for line in memories.splitlines() if line.startswith("[")]
    keep = [n for n, line in enumerate(shown, start=1) if wanted & set(re.findall(r"\w{4,}", line))]
    return verdict(keep=keep, asks_for_memory="remember" in words.lower())


@pytest.fixture
def fake(fake_model: FakeOpenAI) -> FakeOpenAI:
    fake_model.script(appraise, purpose="appraisal")
    fake_model.script(choose, purpose="filter")
    fake_model.script({"summary": "Ann and I talked."}, purpose="summary")
    fake_model.script({"feeling": "glad", "conclusion": "Ann is here.", "valence": 0.2, "intensity": 0.2,
                       "search": None}, purpose="arrival")  # fmt: skip
    fake_model.script(
        envelope(answer="I see!", answer_needed=True, told="Ann spoke with Pip."), purpose="reply"
    )
    return fake_model


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock()


@pytest.fixture(params=["hashing", "gateway"])
def embedder(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def vector_of(text: str, embedder: str) -> list[float]:
    found = hashing_vector(text) if embedder == "hashing" else embedding_vector(text, DIMENSIONS)
    assert found is not None
    return found


def remember(clock: FixedClock, embedder: str, *events: str) -> None:
    """Memories from the imp's past in Ann's DM scope (mechanism 115), a month old: felt weakly now."""
    db = open_database()
    try:
        store = MemoryStore(db, clock.now)
        for event in events:
            store.remember("pip", "dm:ann", event, 0.4, 0.5, age_hours=720, vector=vector_of(event, embedder))
    finally:
        db.close()


@pytest.fixture
async def runtime(
    fake: FakeOpenAI, clock: FixedClock, impyard_home: Path, embedder: str
) -> AsyncIterator[Runtime]:
    ImpStore().add("pip", "You are Pip.", memory={"enabled": True, "embedder": embedder})
    async with open_runtime(
        ["pip"], RecordingSurface(), clock=clock, backends={"pip": InProcessBackend()},
        surfaces=("discord", "terminal"), pump_period_s=None,
    ) as rt:  # fmt: skip
        yield rt


async def say(rt: Runtime, fake: FakeOpenAI, clock: FixedClock, n: int, text: str) -> list[RecordedRequest]:
    """One message from Ann; returns the model requests its turn made, in the order the fake got them."""
    first = len(fake.requests)
    await say_as_ann(rt, clock, n, text, minutes=1)
    made = list(fake.requests[first:])
    assert not [r for r in made if r.rejection is not None], [r.rejection for r in made if r.rejection]
    return made


def before_reply(made: list[RecordedRequest]) -> list[str]:
    """The purposes of the calls made before the turn's first reply call, in order."""
    purposes = [str(r.purpose) for r in made]
    return purposes[: purposes.index("reply")]


def reply_memory(request: RecordedRequest) -> str:
    """The reply call's ``### Memory`` block, where the layout puts it: the end of the turn's context."""
    block = memory_block_of(request.body["messages"])
    assert block, "no memory block in this call"
    return block


def user_text(request: RecordedRequest) -> str:
    """What the people said in the call (the turn's own context left out: it opens the current message)."""
    return "\n".join(
        split_context(str(m["content"]))[1] for m in request.body["messages"] if m["role"] == "user"
    )


# ------------------------------------------------------------------ the paths and their calls


async def test_a_normal_turn_makes_at_most_one_call_before_the_reply_besides_the_words_embedding(
    runtime: Runtime, fake: FakeOpenAI, clock: FixedClock, embedder: str
) -> None:
    remember(clock, embedder, SAILING, RAIN)
    await say(runtime, fake, clock, 1, "hello")  # the arrival: the sailing memory comes to mind (28)
    made = await say(runtime, fake, clock, 2, "the rain on the window today")
    # A known person (the sailing memory), no search: the words' embedding (the gateway embedder only), then
    # the filter over the weak rain memory, then one reply call. The seed's draft-and-discard is gone.
    expected = ["embedding", "filter"] if embedder == "gateway" else ["filter"]
    assert before_reply(made) == expected
    assert [r.purpose for r in made].count("reply") == 1
    [filtered] = [r for r in made if r.purpose == "filter"]
    assert "rain run down the window" in user_text(filtered)
    # the conversation's own record (its living one, "Ann greeted me warmly.") is not shown: 22 before 20
    assert "Ann greeted me warmly." not in user_text(filtered)


async def test_with_no_weak_memory_from_outside_the_conversation_there_is_no_filter_call(
    runtime: Runtime, fake: FakeOpenAI, clock: FixedClock, embedder: str
) -> None:
    remember(clock, embedder, SAILING)  # evoked at the arrival: in the focus from then on (31)
    await say(runtime, fake, clock, 1, "hello")
    made = await say(runtime, fake, clock, 2, "what a day it has been")
    assert before_reply(made) == (["embedding"] if embedder == "gateway" else [])  # subtle point 2, issue 33
    assert "filter" not in [r.purpose for r in made]


async def test_a_strangers_first_message_is_one_reply_call_with_the_probes_null(
    runtime: Runtime, fake: FakeOpenAI, clock: FixedClock, embedder: str
) -> None:
    made = await say(runtime, fake, clock, 1, "hi, I'm new here")
    purposes = [r.purpose for r in made]
    assert purposes.count("reply") == 1 and purposes.count("arrival") == 1  # the seed: a draft, then again
    assert sorted(before_reply(made)) == sorted(
        ["arrival", *(["embedding"] if embedder == "gateway" else [])]
    )
    [reply] = [r for r in made if r.purpose == "reply"]
    assert '"Ann — who is this person, what do we have in common": nothing from before' in reply_memory(reply)
    [arrival] = [r for r in made if r.purpose == "arrival"]
    schema = arrival.body["response_format"]["json_schema"]["schema"]
    assert "greeting" not in schema["properties"]  # an answer that would never be sent is not asked for


async def test_a_memory_question_searches_before_its_one_reply_call(
    runtime: Runtime, fake: FakeOpenAI, clock: FixedClock, embedder: str
) -> None:
    remember(clock, embedder, SAILING, ECLIPSE)
    await say(runtime, fake, clock, 1, "hello")
    question = "do you remember the eclipse?"
    made = await say(runtime, fake, clock, 2, question)
    # recall's filter reads the question (21), the moment probe's search goes through the filter too (26, 23);
    # the words are short, so the probe reuses their embedding
    expected = ["embedding", "filter", "filter"] if embedder == "gateway" else ["filter", "filter"]
    assert before_reply(made) == expected
    [reply] = [r for r in made if r.purpose == "reply"]
    searches = reply_memory(reply).split("Searches you made just now:", 1)[1]
    assert f'"{question}": 1 memory found.' in searches
    assert "the sky went dark at noon" in reply_memory(reply)


# ------------------------------------------------------------------ what goes out once


@pytest.mark.parametrize("embedder", ["hashing"], indirect=True)
async def test_the_memory_block_does_not_repeat_the_chat_history(
    runtime: Runtime, fake: FakeOpenAI, clock: FixedClock, embedder: str
) -> None:
    await say(runtime, fake, clock, 1, "my bicycle is blue")
    await say(runtime, fake, clock, 2, "my kettle whistles")
    made = await say(runtime, fake, clock, 3, "and my cat sleeps all day")
    [reply] = [r for r in made if r.purpose == "reply"]
    history = json.dumps(reply.body["messages"][1:])
    block = reply_memory(reply)
    for said in ("my bicycle is blue", "my kettle whistles"):
        assert said in history  # the chat history carries the exchange …
        assert said not in block  # … so the memory block does not repeat it
    assert "In the chat above, not repeated here: 2 exchanges of this conversation." in block
    assert "Ann entered the conversation." in block  # the arrival is no message: the focus shows it


@pytest.mark.parametrize("embedder", ["hashing"], indirect=True)
async def test_the_appraisal_does_not_grow_with_the_conversation(
    runtime: Runtime, fake: FakeOpenAI, clock: FixedClock, embedder: str
) -> None:
    sizes: dict[int, int] = {}
    appraised: dict[int, RecordedRequest] = {}
    for n in range(1, 41):
        made = await say(runtime, fake, clock, n, f"thing number {n} about my day, quite ordinary")
        [appraisal] = [r for r in made if r.purpose == "appraisal"]
        sizes[n], appraised[n] = len(json.dumps(appraisal.body["messages"])), appraisal
    # the seed sent the whole focus: turn 40's appraisal would be about four times turn 10's
    assert sizes[40] <= sizes[10] * 1.15, sizes
    late = user_text(appraised[40])
    assert "thing number 40 about" in late and "thing number 39 about" in late
    assert "thing number 20 about" not in late  # older moments are in the summary, not repeated
    assert "in your own summary" in late and "Ann and I talked." in late
    assert late.rstrip().splitlines()[-1].startswith("- Now: ")  # the clock last (the cache's prefix stays)


# ------------------------------------------------------------------ every call: a cap and the least effort


@pytest.mark.parametrize("embedder", ["hashing"], indirect=True)
async def test_every_memory_call_sends_an_output_cap_and_the_least_effort(
    runtime: Runtime, fake: FakeOpenAI, clock: FixedClock, embedder: str
) -> None:
    remember(clock, embedder, SAILING, RAIN)
    made = await say(runtime, fake, clock, 1, "hello")
    made += await say(runtime, fake, clock, 2, "the rain on the window today")
    memory_calls = [r for r in made if r.purpose in MEMORY_PURPOSES]
    assert {r.purpose for r in memory_calls} >= {"arrival", "appraisal", "filter"}
    for request in memory_calls:
        body = request.body
        assert body["max_completion_tokens"] == OUTPUT_CAPS[str(request.purpose)], request.purpose
        sent = json.dumps(body["response_format"])
        assert "maxLength" not in sent  # OpenAI's strict mode takes no string lengths: left out there
        if request.purpose == "filter":
            assert '"maxItems": 10' in sent  # a list's bound is sent
        if body["model"] == "gpt-5.1":  # the arrival stays on the imp's model: it reasons, at "none"
            assert body["reasoning_effort"] == "none"
        else:  # the per-turn judgements go to gpt-4.1-mini on OpenAI (issue 33): it does not reason
            assert body["model"] == "gpt-4.1-mini" and "reasoning_effort" not in body
            assert request.purpose in ("appraisal", "filter", "summary")


@pytest.mark.parametrize(
    ("model", "effort", "temperature"),
    [
        ("gpt-5.1", "none", True),
        ("gpt-5-mini", "minimal", False),
        ("gpt-4.1", None, True),
        ("o3", "low", False),
    ],
)
async def test_a_routed_model_gets_its_least_effort_and_a_cap_with_room_for_its_thinking(
    kit: Kit, model: str, effort: str | None, temperature: bool
) -> None:
    """Through the real box program (the kit's host): each memory purpose routed to ``model``."""
    await kit.seed("Ann's owl Hoot is sick.", intensity=0.3)
    routed = {p: model for p in ("arrival", "appraisal", "filter", "summary")}
    async with kit.box(models=routed) as box:
        await box.say("my owl Hoot")
    calls = [c for c in kit.model.calls if c.purpose in MEMORY_PURPOSES]
    assert {c.purpose for c in calls} >= {"arrival", "appraisal", "filter"}
    for call in calls:
        assert call.body["model"] == model
        assert call.body.get("reasoning_effort") == effort, call.purpose
        assert ("temperature" in call.body) is temperature  # gpt-5 and the o-series take only their own
        headroom = REASONING_HEADROOM[effort] if effort is not None else 0
        assert call.body["max_completion_tokens"] == min(MAX_OUTPUT_CAP, OUTPUT_CAPS[call.purpose] + headroom)
        assert call.body["max_completion_tokens"] <= 4_096  # what the default policy's model-text allows


# ------------------------------------------------------------------ what stays in view (31, 22; issue 33)


def _lived(n: int) -> RecordView:
    return RecordView(
        id=f"r{n}", author="Ann", author_id="ann", feeling="warmth", conclusion=f"memory {n}", valence=0.3,
        intensity=0.5, felt=0.3, happened_at=NOW - timedelta(days=n + 1), last_felt=NOW,
    )  # fmt: skip


def test_a_memory_evoked_long_ago_leaves_the_view_and_may_come_to_mind_again() -> None:
    """The block shows the memories evoked most recently; one evoked longer ago is no longer excluded from
    recall (22) and, recalled again, is evoked anew — the seed kept every one in view, growing the block."""
    focus = Focus()
    memories = [_lived(n) for n in range(EVOKED_IN_VIEW + 2)]
    for memory in memories:
        assert focus.evoke(memory)
    newest = {m.id for m in memories[-EVOKED_IN_VIEW:]}
    assert focus.in_view() == newest and focus.ids() == {m.id for m in memories}  # still held (cap, summary)
    assert not focus.evoke(memories[-1])  # in view: not evoked twice
    assert focus.evoke(memories[0])  # left the view: evoked anew, the newest
    assert [e.record_id for e in focus.evoked_in_view()][-1] == "r0"
    assert [e.record_id for e in focus.entries].count("r0") == 1
    view = ReplyView(scene=Scene("pip", "Ann", "ann", NOW, "UTC", "dm"), state=State(), focus=focus)
    block = focus_block(Prompts.load(), None, view)
    assert block.count("memory ") == EVOKED_IN_VIEW and "memory 1." not in block


# ------------------------------------------------------------------ which model each purpose goes to (55)


@pytest.mark.parametrize(
    ("purpose", "routed", "imp_model", "server", "expected"),
    [
        ("filter", {}, "gpt-5.1", "openai", "gpt-4.1-mini"),  # a per-turn judgement: the cheaper default
        ("appraisal", {}, "gpt-4.1", "openai", "gpt-4.1-mini"),
        ("summary", {}, "o3", "openai", "gpt-4.1-mini"),
        ("selection", {}, "gpt-5.1", "openai", "gpt-4.1-mini"),
        ("classification", {}, "gpt-5.1", "openai", "gpt-4.1-mini"),
        ("introspection", {}, "gpt-5.1", "openai", "gpt-5.1"),  # its thinking stays on its own model
        ("learning", {}, "gpt-5.1", "openai", "gpt-5.1"),
        ("sleep", {}, "gpt-5.1", "openai", "gpt-5.1"),
        ("arrival", {}, "gpt-5.1", "openai", "gpt-5.1"),  # its own voice
        ("arrival", {"reply": "gpt-4o"}, "gpt-5.1", "openai", "gpt-4o"),  # where the reply goes (101)
        ("filter", {"filter": "gpt-4.1-nano"}, "gpt-5.1", "openai", "gpt-4.1-nano"),  # [memory.models] wins
        ("filter", {}, "gpt-4.1-nano", "openai", "gpt-4.1-nano"),  # already small: as cheap or cheaper
        ("filter", {}, "gpt-5-mini", "openai", "gpt-5-mini"),
        ("filter", {}, "llama3.1:8b", "ollama", "llama3.1:8b"),  # another server serves its own models
        ("appraisal", {}, "qwen", "vllm", "qwen"),
    ],
)
def test_each_purpose_goes_to_its_model(
    purpose: MemoryPurpose, routed: dict[MemoryPurpose, str], imp_model: str, server: str, expected: str
) -> None:
    assert memory_model(purpose, routed, imp_model, server) == expected


def test_no_memory_call_asks_for_more_output_than_the_default_policy_allows() -> None:
    """A cap over rule model-text's ``max_tokens`` would be refused by the gateway: a memory call lost."""
    policy = tomllib.loads((Path(__file__).parents[2] / "policies" / "default.toml").read_text())
    [text] = [rule for rule in policy["rules"] if rule["name"] == "model-text"]
    for purpose in OUTPUT_CAPS:
        for effort in (None, *REASONING_HEADROOM):
            assert output_cap(purpose, effort) <= text["max_tokens"], (purpose, effort)
    assert output_cap("sleep", "low") == text["max_tokens"]  # clamped, not refused


def test_string_lengths_go_to_servers_that_take_them_and_stay_in_the_schemas() -> None:
    assert APPRAISAL_SCHEMA["properties"]["conclusion"]["maxLength"] == 400  # the bound stays in the schema
    openai = profile_for("gpt-4.1-mini").schema_dialect
    llama = profile_for("qwen", "llama.cpp").schema_dialect
    assert "maxLength" not in json.dumps(fit_schema(APPRAISAL_SCHEMA, openai))  # strict mode refuses it
    assert '"maxLength": 400' in json.dumps(fit_schema(APPRAISAL_SCHEMA, llama))  # a grammar takes it
    assert fit_schema(FILTER_SCHEMA, openai)["properties"]["keep"]["maxItems"] == 10
