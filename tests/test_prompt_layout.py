"""The reply call laid out stable-first, so the provider's prompt cache hits (issue 33; SPEC-001 ENV-07, ENV-10, ENV-20).

The system text (persona and static rules) first, byte-identical every turn; then the history, a window that moves in
steps (``box.common.history.window_start``); then this turn's ``## Context`` opening the current message; tool rounds
after. Measured through the real host pipeline, the real box and the real openai SDK against the loopback fake OpenAI:
from turn 10 on, a reply request shares at least 70% of itself, from its start, with the previous turn's — except on
the turns where the window steps (ENV-07 makes a window that never moves impossible), which are few.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from box.common.history import lookback, window_start
from box.common.request_bodies import prompt_text, shared_prefix_share
from box.context import (
    CONTEXT_HEADER,
    LAYOUT_NOTE,
    MESSAGE_HEADER,
    PromptPackage,
    memory_block_of,
    split_context,
    turn_context,
    with_context,
)
from box.protocol.models import Author, HistoryEntry, Message
from impyard.clock import FixedClock
from impyard.conversation.pipeline import Inbound, box_window
from impyard.gateway.surfaces import RecordingSurface
from impyard.imps.store import ImpStore
from impyard.runtime import Runtime, open_runtime
from testing.fake_openai import FakeOpenAI, RecordedRequest, envelope
from testing.inprocess import InProcessBackend
from tests.memory.engine_kit import Kit, verdict
from tests.memory.engine_kit import envelope as kit_envelope

pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(env=True)]

CHANNEL = "900"
LIMIT = 20  # the default history_limit (ENV-07)
TURNS = 22
TARGET = 0.70  # issue 33: from turn 10 on, of each reply request, byte-identical from its start to the previous one's
FROM_TURN = 10
NOW_MESSAGE = FixedClock().now()


# ------------------------------------------------------------------ the window's rule (pure)


def ids(n: int, salt: str = "x") -> list[str]:
    return [f"{salt}{i}" for i in range(n)]


@pytest.mark.parametrize(
    ("count", "limit", "start"),
    [(0, 20, 0), (5, 20, 0), (20, 20, 0), (3, 0, 3), (3, -1, 3), (1, 1, 0)],
)
def test_a_window_that_fits_starts_at_the_first_line(count: int, limit: int, start: int) -> None:
    """ENV-07: nothing is cut while everything fits; a limit of 0 shows nothing."""
    assert window_start(ids(count), limit) == start


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 10, 20, 40, 100])
def test_the_window_never_holds_more_than_the_limit_and_never_nothing(limit: int) -> None:
    for count in range(limit + 1, 3 * limit + 40):
        start = window_start(ids(count, f"l{limit}-"), limit)
        assert 0 < count - start <= limit  # ENV-07, and the newest line always shows


def conversation(turns: int, per_turn: int, limit: int, salt: str) -> list[tuple[str, ...]]:
    """Each turn's window as a box sees it: the lines the host sends (limit + lookback), the start it picks."""
    lines: list[str] = []
    windows = []
    for turn in range(turns):
        seen = lines[-(limit + lookback(limit)) :]
        windows.append(tuple(seen[window_start(seen, limit) :]))
        lines += [f"{salt}-{turn}-{k}" for k in range(per_turn)]
    return windows


@pytest.mark.parametrize("salt", ["a", "b", "c", "d"])
def test_the_window_moves_in_steps_so_consecutive_turns_share_their_history(salt: str) -> None:
    """Issue 33: the first history line stays put turn after turn; a step drops a block at once. Measured over 300
    turns of two lines each (a message and its reply): the start moves on at most a third of the turns (a window
    sliding by one exchange moves on every turn), and the window holds at least half the limit on average."""
    windows = conversation(300, 2, LIMIT, salt)[40:]
    moved = sum(1 for before, now in zip(windows, windows[1:], strict=False) if before[0] != now[0])
    assert moved <= len(windows) / 3, moved
    assert sum(map(len, windows)) / len(windows) >= LIMIT / 2
    for before, now in zip(windows, windows[1:], strict=False):
        if before[0] == now[0]:
            assert now[: len(before)] == before  # the same start: the old window is a prefix of the new one


def test_a_fresh_box_picks_the_start_the_warm_one_picked() -> None:
    """The start comes from the lines' ids alone: seen from the channel's whole history or from only what the host
    sends (a box re-created after an idle timeout), the window is the same."""
    lines = ids(400, "fresh-")
    same = 0
    for end in range(LIMIT + lookback(LIMIT), len(lines)):
        whole, sent = lines[:end], lines[end - LIMIT - lookback(LIMIT) : end]
        same += whole[window_start(whole, LIMIT) :] == sent[window_start(sent, LIMIT) :]
    assert same / (len(lines) - LIMIT - lookback(LIMIT)) >= 0.97


def test_the_host_sends_the_window_and_the_ids_before_it_without_their_text() -> None:
    messages = [
        Message(id=f"m{n}", author=Author(id="u", name="ann"), content=f"said {n}", created_at=NOW_MESSAGE)
        for n in range(100)
    ]
    recent = [
        HistoryEntry(id=m.id, author=m.author, content=m.content, created_at=m.created_at) for m in messages
    ]
    sent = box_window(recent, LIMIT)
    assert [e.id for e in sent] == [f"m{n}" for n in range(100 - LIMIT - lookback(LIMIT), 100)]
    assert [e.content for e in sent[-LIMIT:]] == [f"said {n}" for n in range(100 - LIMIT, 100)]
    assert {e.content for e in sent[:-LIMIT]} == {""}  # never shown to the model: only counted
    assert box_window(recent[:5], LIMIT) == recent[:5] and box_window(recent, 0) == []


# ------------------------------------------------------------------ the shared-prefix measure (pure)


@pytest.mark.parametrize(
    ("previous", "current", "share"),
    [
        ("", "", 0.0),
        ("abc", "", 0.0),
        ("", "abcd", 0.0),
        ("abcd", "abcd", 1.0),
        ("abXX", "abcd", 0.5),
        ("abcdef", "abcd", 1.0),
        ("ab", "abcd", 0.5),
        ("é", "éa", 2 / 3),  # by UTF-8 bytes
        ("xbcd", "abcd", 0.0),
    ],
)
def test_shared_prefix_share(previous: str, current: str, share: float) -> None:
    assert shared_prefix_share(previous, current) == pytest.approx(share)


def test_prompt_text_reads_chat_and_responses_bodies_alike() -> None:
    chat = {"model": "m", "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]}
    responses = {"model": "m", "instructions": "S", "input": [{"role": "user", "content": "hi"}]}
    assert prompt_text(chat) == prompt_text(responses)
    assert json.loads(prompt_text(chat))[0] == {"role": "system", "content": "S"}


# ------------------------------------------------------------------ the current message (pure)


def test_the_context_opens_the_current_message_as_text_or_before_the_images() -> None:
    context = f"{CONTEXT_HEADER}\nDate: today"
    text = with_context(context, "ann: hi")
    assert text == f"{context}\n\n{MESSAGE_HEADER}\nann: hi" and split_context(text) == (context, "ann: hi")
    assert split_context("ann: ## Context\nfake") == ("", "ann: ## Context\nfake")  # a history line has none
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}
    parts = with_context(context, [{"type": "text", "text": "ann: look"}, image])
    assert parts == [{"type": "text", "text": f"{context}\n\n{MESSAGE_HEADER}\nann: look"}, image]
    assert with_context(context, [image]) == [
        {"type": "text", "text": f"{context}\n\n{MESSAGE_HEADER}"},
        image,
    ]


def test_the_package_recomposes_only_the_current_message() -> None:
    """A later hop changes ``suffix``; the system text, the history and the tool rounds stay as they were."""
    history = [{"role": "user", "content": "bob: hi"}, {"role": "assistant", "content": "hello bob"}]
    package = PromptPackage(
        prefix="You are Pip.",
        suffix=f"{CONTEXT_HEADER}\nA",
        messages=[*history, {"role": "user", "content": "q"}],
    )
    package.messages.append({"role": "tool", "tool_call_id": "c1", "content": "found"})  # a tool round, after
    first = package.chat_messages()
    package.suffix = f"{CONTEXT_HEADER}\nB"
    second = package.chat_messages()
    assert first[0] == second[0] == {"role": "system", "content": f"You are Pip.\n\n{LAYOUT_NOTE}"}
    assert first[1:3] == second[1:3] == history and first[4] == second[4]
    assert turn_context(first) == f"{CONTEXT_HEADER}\nA" and turn_context(second) == f"{CONTEXT_HEADER}\nB"
    assert package.messages[2] == {"role": "user", "content": "q"}  # the package keeps the message as said


# ------------------------------------------------------------------ through the real host and box


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock()


@pytest.fixture
def fake(fake_model: FakeOpenAI) -> FakeOpenAI:
    fake_model.script(envelope(answer=REPLY, answer_needed=True), purpose="reply")
    fake_model.script(
        {"feeling": "easy", "conclusion": "Ann and I chatted about her day.", "valence": 0.2, "intensity": 0.2,
         "lasting": False},
        purpose="appraisal",
    )  # fmt: skip
    fake_model.script({"keep": [1], "asks_for_memory": False, "asks_for_own": None}, purpose="filter")
    fake_model.script({"summary": "Ann and I talked about her day."}, purpose="summary")
    fake_model.script(
        {"greeting": None, "feeling": "glad", "conclusion": "Ann is here.", "valence": 0.2, "intensity": 0.2,
         "search": None},
        purpose="arrival",
    )  # fmt: skip
    return fake_model


@asynccontextmanager
async def pip_runtime(clock: FixedClock, **settings: Any) -> AsyncIterator[Runtime]:
    """pip (``settings``: its imp.toml tables) on the in-process box, its DM channel trusted."""
    ImpStore().add("pip", "You are Pip, a cheerful owl who likes to talk about gardens.", **settings)
    async with open_runtime(
        ["pip"], RecordingSurface(), clock=clock, backends={"pip": InProcessBackend()},
        surfaces=("discord", "terminal"), pump_period_s=None,
    ) as rt:  # fmt: skip
        rt.channels.set_trusted(CHANNEL, True)
        yield rt


@pytest.fixture(params=["memory off", "memory on"])
def memory(request: pytest.FixtureRequest) -> dict[str, Any]:
    return {"enabled": request.param == "memory on", "embedder": "hashing"}


@pytest.fixture
async def runtime(
    fake: FakeOpenAI, clock: FixedClock, tmp_path: Path, memory: dict[str, Any]
) -> AsyncIterator[Runtime]:
    async with pip_runtime(clock, memory=memory) as rt:
        yield rt


@pytest.fixture
async def responses_runtime(fake: FakeOpenAI, clock: FixedClock, tmp_path: Path) -> AsyncIterator[Runtime]:
    """Memory off, the reply on the Responses API (ENV-22)."""
    async with pip_runtime(clock, memory={"enabled": False}, model={"use_responses_api": True}) as rt:
        yield rt


REPLY = (
    "That sounds lovely! Tomatoes love a wet spring, and the bees will be glad of the blossoms. "
    "What else is growing in your garden this year?"
)
SAYINGS = [
    "I planted tomatoes by the fence this morning and the soil was still wet from the rain.",
    "My neighbour says marigolds keep the slugs away, do you think that is true?",
    "The apple tree finally has blossoms, pink and white, the bees are all over them.",
    "I could not find my trowel anywhere, then it turned up in the compost heap of all places.",
]


async def talk(rt: Runtime, clock: FixedClock, turns: int) -> None:
    for n in range(turns):
        said = f"({n}) {SAYINGS[n % len(SAYINGS)]}"
        message = Message(
            id=f"m{n}", author=Author(id="ann", name="ann"), content=said, created_at=clock.now()
        )
        inbound = Inbound(
            surface="discord", channel_id=CHANNEL, channel_kind="dm", message=message, channel_name="dm"
        )
        assert await rt.conversations.receive("pip", inbound) in ("started", "queued")
        with anyio.fail_after(30):
            await rt.conversations.wait_finished(message.id)
        clock.advance(timedelta(minutes=1))


def last_of_turns(fake: FakeOpenAI) -> list[dict[str, Any]]:
    """One reply request per turn (the last hop's; memory off has one hop a turn)."""
    requests: list[RecordedRequest] = [
        r for r in fake.requests_for("/chat/completions") if r.purpose == "reply" and r.status == 200
    ]
    by_turn: dict[str, dict[str, Any]] = {}
    for request in requests:
        said = split_context(request.body["messages"][-1]["content"])[1]
        by_turn[said] = request.body
    return list(by_turn.values())


def history_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    return list(body["messages"][1:-1])


async def test_the_reply_request_is_laid_out_stable_first_turn_after_turn(
    runtime: Runtime, clock: FixedClock, fake: FakeOpenAI, memory: dict[str, Any]
) -> None:
    await talk(runtime, clock, TURNS)
    bodies = last_of_turns(fake)
    assert len(bodies) == TURNS
    systems = {json.dumps(body["messages"][0]) for body in bodies}
    assert len(systems) == 1  # ENV-20: byte-identical every turn, the memory rules included
    system = json.loads(systems.pop())["content"]
    assert system.endswith(LAYOUT_NOTE) and "\nDate: " not in system and "\n### Memory\n" not in system
    for n, body in enumerate(bodies):
        messages = body["messages"]
        assert [m["role"] for m in messages].count(
            "system"
        ) == 1  # one system message, first (local templates)
        context, said = split_context(messages[-1]["content"])
        assert context.startswith(CONTEXT_HEADER) and said == f"ann: ({n}) {SAYINGS[n % len(SAYINGS)]}"
        assert ("\n### Memory\n" in context) == memory["enabled"]
        assert all(
            not split_context(m["content"])[0] for m in messages[1:-1]
        )  # the context comes after the history
        assert len(history_of(body)) <= LIMIT  # ENV-07
    shares = [
        shared_prefix_share(prompt_text(a), prompt_text(b)) for a, b in zip(bodies, bodies[1:], strict=False)
    ]
    stepped = [
        turn
        for turn, (a, b) in enumerate(zip(bodies, bodies[1:], strict=False), start=1)
        if history_of(b)[: len(history_of(a))] != history_of(a)  # the window stepped: its start moved
    ]
    shown = [round(share, 2) for share in shares]
    for turn, (a, b) in enumerate(zip(bodies, bodies[1:], strict=False), start=1):
        if turn in stepped:
            continue
        # Everything before the previous request's current message — the system text, its whole history — is
        # repeated byte for byte: what a prompt cache warmed by it serves.
        before = prompt_text({"messages": a["messages"][:-1]})[:-1] + ","
        assert prompt_text(b).startswith(before), (turn, shown)
        if turn >= FROM_TURN and not memory["enabled"]:
            assert shares[turn - 1] >= TARGET, (turn, shown, stepped)
    # Before the window is full it never steps; after, it steps on a few turns only (ENV-07 needs some).
    assert all(turn >= LIMIT // 2 for turn in stepped), stepped
    assert len([t for t in stepped if t >= FROM_TURN]) <= (TURNS - FROM_TURN) / 3, stepped


async def test_the_hops_of_one_turn_share_everything_up_to_the_memory_block(kit: Kit) -> None:
    """A memory search re-calls the reply (mechanisms 25-27, 49); only the memory block at the context's end is
    recomposed (mechanism 36), so the second hop repeats the first up to it."""
    for n in range(6):
        await kit.seed(f"Ann told me about her garden, day {n}.", intensity=0.4, ago=timedelta(days=n + 1))
    async with kit.box() as box:
        await box.say("Good morning, the tomatoes are growing well.")
        await box.say("The bees love the apple blossoms.")
        kit.model.script("filter", verdict(keep=[1], asks_for_memory=True))
        kit.model.script("reply", kit_envelope("Let me think.", action="search", action_text="garden"))
        before = len(kit.model.of("reply"))
        await box.say("Do you remember what I told you about my garden?")
    first, second = (call.body["messages"] for call in kit.model.of("reply")[before:][:2])
    assert first[:-1] == second[:-1]  # the system text and the history: byte for byte
    (context_1, said_1), (context_2, said_2) = (
        split_context(first[-1]["content"]),
        split_context(second[-1]["content"]),
    )
    assert said_1 == said_2 and memory_block_of(first) and memory_block_of(second)
    assert context_1.split("\n### Memory\n")[0] == context_2.split("\n### Memory\n")[0]


async def test_the_responses_api_request_is_laid_out_the_same_way(
    responses_runtime: Runtime, clock: FixedClock, fake: FakeOpenAI
) -> None:
    """ENV-22: ``instructions`` is the static system text; the context opens the last input item, after the history."""
    turns = 14
    await talk(responses_runtime, clock, turns)
    bodies = [r.body for r in fake.requests_for("/responses") if r.purpose == "reply" and r.status == 200]
    assert len(bodies) == turns and not fake.requests_for("/chat/completions")
    assert len({body["instructions"] for body in bodies}) == 1 and bodies[0]["instructions"].endswith(
        LAYOUT_NOTE
    )
    for n, body in enumerate(bodies):
        *history, current = body["input"]
        assert split_context(current["content"]) == (
            turn_context(body["input"]),
            f"ann: ({n}) {SAYINGS[n % 4]}",
        )
        assert all(not split_context(item["content"])[0] for item in history) and len(history) <= LIMIT
    for turn, (a, b) in enumerate(zip(bodies, bodies[1:], strict=False), start=1):
        if b["input"][: len(a["input"]) - 1] != a["input"][:-1]:
            continue  # the window stepped
        assert prompt_text(b).startswith(prompt_text({**a, "input": a["input"][:-1]})[:-1] + ","), turn
        if turn >= FROM_TURN:
            assert shared_prefix_share(prompt_text(a), prompt_text(b)) >= TARGET, turn
