"""The responder's pure rules, as tables: history shrink and merge, links, channels, decisions, short path,
model choice and backoff, the Responses item reduction, tool-result sanitising, and the prompt-context helper."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from box.attempts import ModelChooser, ModelExhausted, with_attempts
from box.common.attempts import backoff_s
from box.common.envelope import Envelope
from box.common.history import Record, shrink_by_one, trim
from box.context import build_package, context_suffix, persona_prefix, user_content
from box.decision import answers
from box.history import PromptEntry, combine
from box.model import ModelCallFailed
from box.protocol import ErrorCode, RpcError
from box.protocol.history import HistoryLine
from box.protocol.models import (
    Attachment,
    Author,
    Framing,
    HistoryEntry,
    ImpSpec,
    Message,
    Participant,
    ReplyRef,
    ResponderSettings,
    SessionInfo,
)
from box.render import Payload, fit_files, reply_target, unwrap_links
from box.responses_api import reduce_item
from box.short_path import short_path_matches
from box.tools import sanitize_result
from impyard.clock import SystemClock
from impyard.conversation.responder_history import HistoryBounds, ResponderHistory
from impyard.storage.db import Database
from tests.scripted import NOW, envelope

pytestmark = pytest.mark.anyio


def rec(channel: str, n: int, role: str = "user") -> Record:
    return Record(channel, f"{channel}-{n}", role, "ann", f"{channel} {n}", NOW + timedelta(minutes=n))  # type: ignore[arg-type]


def line(record: Record) -> HistoryLine:
    return HistoryLine(
        id=record.id, role=record.role, author=record.author, content=record.content, at=record.at
    )


def env(**fields: object) -> Envelope:
    return Envelope.model_validate(envelope(**fields))


# ------------------------------------------------------------------ ENV-11 / ENV-07: history


@pytest.mark.parametrize(
    ("channels", "per_channel", "removed"),
    [
        (["a", "b", "b", "b", "b"], 3, "b-1"),  # b is over its cap: its oldest goes, not a's
        (["a", "a", "b", "a", "a"], 3, "a-0"),  # a holds 4 > 3: a's oldest
        (["a", "b", "c"], 3, "a-0"),  # nobody over the cap: the oldest overall
        (["a", "b", "b"], 1, "b-1"),  # a holds 1 (not > 1); b holds 2 > 1
    ],
)
def test_env_11_shrink_by_one_prefers_busy_channels(
    channels: list[str], per_channel: int, removed: str
) -> None:
    records = [rec(channel, n) for n, channel in enumerate(channels)]
    shrunk = shrink_by_one(records, per_channel)
    assert len(shrunk) == len(records) - 1
    assert removed not in [r.id for r in shrunk]


def test_env_07_trim_keeps_at_most_the_limit() -> None:
    records = [rec("a", n) for n in range(10)]
    assert len(trim(records, 4, 3)) == 4
    assert trim(records, 0, 3) == []
    assert trim(records[:2], 4, 3) == records[:2]


def test_env_11_the_hosts_store_shrinks_busy_channels_across_the_imps_boxes(db: Database) -> None:
    """Issue 22: the host keeps the imp's lines; ENV-11's shrink still runs over every channel of the imp."""
    store = ResponderHistory(db, SystemClock(), {"pip": HistoryBounds(limit=5, per_channel=2)})
    store.commit("pip", "quiet", [line(rec("quiet", 0))])
    store.commit("pip", "busy", [line(rec("busy", n)) for n in range(1, 6)])
    kept = store.lines("pip")
    assert len(kept) == 5 and [r.id for r in kept if r.channel_id == "quiet"] == ["quiet-0"]


def test_history_merge_prefers_the_hosts_copy_and_keeps_one_channel() -> None:
    own = [rec("c1", 1), rec("c1", 2, "assistant"), rec("elsewhere", 3)]
    recent = [
        HistoryEntry(id="c1-2", author=Author(id="imp", name="pip", bot=True), content="as delivered",
                     created_at=NOW + timedelta(minutes=2), from_imp=True),
        HistoryEntry(id="h-4", author=Author(id="u2", name="bob"), content="hey", created_at=NOW + timedelta(minutes=4)),
        HistoryEntry(id="now", author=Author(id="u1", name="ann"), content="current", created_at=NOW + timedelta(minutes=5)),
    ]  # fmt: skip
    merged = combine(recent, own, "c1", "now", limit=10)
    assert [(e.id, e.role, e.content) for e in merged] == [
        ("c1-1", "user", "c1 1"), ("c1-2", "assistant", "as delivered"), ("h-4", "user", "hey"),
    ]  # fmt: skip
    assert [e.id for e in combine(recent, own, "c1", "now", limit=2)] == ["c1-2", "h-4"]


def test_history_merge_orders_by_time_keeps_arrival_order_on_ties_and_cuts_to_the_limit() -> None:
    """ENV-07: one sort by time (equal times keep the order lines came in: own lines, then the host's new
    ones; a line the host also has keeps its place), then the newest ``limit``; a limit of 0 shows none."""
    bob, pip = Author(id="u2", name="bob"), Author(id="imp", name="pip", bot=True)
    own = [
        rec("c1", 1),
        Record("c1", "tie-own", "event", "", "cleared", NOW + timedelta(minutes=3)),
        Record("c1", "pic", "assistant", "pip", "[picture: a cat]", NOW),
        Record("c1", "blank", "assistant", "pip", "", NOW),
    ]
    recent = [
        HistoryEntry(id="late", author=bob, content="late", created_at=NOW + timedelta(minutes=9)),
        HistoryEntry(id="tie-host", author=bob, content="same time", created_at=NOW + timedelta(minutes=3)),
        HistoryEntry(id="tie-own", author=bob, content="as shown", created_at=NOW + timedelta(minutes=3)),
        HistoryEntry(id="c1-1", author=Author(id="u1", name="ann"), content="as shown", created_at=NOW + timedelta(minutes=1)),
        HistoryEntry(id="pic", author=pip, content=" ", created_at=NOW, from_imp=True),
        HistoryEntry(id="blank", author=Author(id="imp", name="Pip", bot=True), content="", created_at=NOW, from_imp=True),
    ]  # fmt: skip
    expected = [
        PromptEntry(
            "pic", "assistant", "pip", "[picture: a cat]", NOW
        ),  # the host's copy has no text: ours stands
        PromptEntry("blank", "assistant", "Pip", "", NOW),  # neither has text: the host's copy
        PromptEntry("c1-1", "user", "ann", "as shown", NOW + timedelta(minutes=1)),
        PromptEntry("tie-own", "user", "bob", "as shown", NOW + timedelta(minutes=3)),
        PromptEntry("tie-host", "user", "bob", "same time", NOW + timedelta(minutes=3)),
        PromptEntry("late", "user", "bob", "late", NOW + timedelta(minutes=9)),
    ]
    assert combine(recent, own, "c1", "now", limit=10) == expected
    assert combine(recent, own, "c1", "now", limit=3) == expected[3:]
    assert combine(recent, own, "c1", "late", limit=2) == expected[3:5]  # the current message is not history
    assert combine(recent, own, "c1", "now", limit=0) == []
    assert combine(recent, own, "c1", "now", limit=-1) == []


# ------------------------------------------------------------------ ENV-08 / ENV-09: rendering


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("see [the docs](https://x.example/a)", "see https://x.example/a"),
        ("ask @[Ann](https://discord.com/users/1)", "ask Ann"),
        ("[a](http://a) and [b](http://b)", "http://a and http://b"),
        ("no links [here] (really)", "no links [here] (really)"),
    ],
)
def test_env_08_link_unwrapping(text: str, expected: str) -> None:
    assert unwrap_links(text) == expected


@pytest.mark.parametrize(
    ("channel", "expected"),
    [
        (None, ("c1", True)), ("", ("c1", True)), ("none", ("c1", True)), ("None", ("c1", True)),
        ("null", ("c1", True)), ("c1", ("c1", True)), ("#general", ("c1", True)), ("<#c1>", ("c1", True)),
        ("other-7", ("other-7", False)), ("<#555>", ("555", False)),
        # issue 38, ENV-09 widened: a channel the imp cannot address is the conversation's own
        ("a terminal session", ("c1", True)), ("#random", ("c1", True)), ("<#999>", ("c1", True)),
    ],
)  # fmt: skip
def test_env_09_reply_target(channel: str | None, expected: tuple[str, bool]) -> None:
    target = reply_target(channel, "c1", "general", ["other-7", "555"])  # the host's post_channels
    assert (target.channel_id, target.own) == expected


def test_files_that_do_not_fit_one_line_are_dropped_from_the_end() -> None:
    from box.protocol.models import SendFile

    payload = Payload(
        "c1", "hi", "reply", files=[SendFile(filename=f"{i}.jpeg", data_b64="A" * 400) for i in range(3)]
    )
    assert fit_files(payload, 800) == ["1.jpeg", "2.jpeg"]  # one file: ~580 bytes; two: ~1015
    assert [f.filename for f in payload.files] == ["0.jpeg"]


# ------------------------------------------------------------------ ENV-01 .. ENV-04: the decision


def said(addressed: bool = False) -> Message:
    return Message(
        id="m1", author=Author(id="u1", name="ann"), content="brb", created_at=NOW, mentions_imp=addressed
    )


@pytest.mark.parametrize(
    ("fields", "mode", "reason", "addressed", "expected"),
    [
        ({"answer": "hi", "answer_needed": True}, "judge", "group", False, True),  # ENV-01
        ({"answer": "hi", "answer_needed": False}, "judge", "group", False, False),  # ENV-02
        ({"answer": "hi", "answer_needed": False, "staff": "note"}, "judge", "group", False, True),  # ENV-03
        ({"answer": "hi", "answer_needed": False}, "judge", "dm", False, True),  # ENV-04
        ({"answer": "hi", "answer_needed": False}, "judge", "mention", True, True),  # addressed
        ({"answer": None, "answer_needed": True}, "judge", "dm", False, False),  # nothing to say
        ({"answer": "  ", "answer_needed": True}, "judge", "group", False, False),
        ({"answer": None, "answer_needed": True, "picture": "a cat"}, "judge", "group", False, True),  # a picture
        # ENV-02 / ENV-04 in a one-to-one server channel: direct = addressed (mention, role, reply to the imp)
        ({"answer": "ok, see you", "answer_needed": False}, "respond", "one_to_one", False, False),  # ENV-02
        ({"answer": "ok, see you", "answer_needed": True}, "respond", "one_to_one", False, True),  # ENV-01
        ({"answer": "on it", "answer_needed": False}, "respond", "one_to_one", True, True),  # ENV-04
        ({"answer": "hi", "answer_needed": False, "staff": "note"}, "respond", "one_to_one", False, True),  # ENV-03
        ({"answer": "here", "answer_needed": False}, "respond", "dm", False, True),  # ENV-04: a DM
        ({"answer": None, "answer_needed": True}, "respond", "dm", False, False),
    ],
)  # fmt: skip
def test_env_01_to_04_the_decision_table(
    fields: dict, mode: str, reason: str, addressed: bool, expected: bool
) -> None:
    framing = Framing(mode=mode, reason=reason)  # type: ignore[arg-type]
    assert answers(env(**fields), framing, said(addressed)) is expected


# ------------------------------------------------------------------ ENV-05: short path


@pytest.mark.parametrize(
    ("rules", "channel_name", "author", "expected"),
    [
        ([("^announcements$", ".*")], "announcements", "ann", True),
        ([("^announcements$", ".*")], "general", "ann", False),
        ([(".*", "^feed-bot$")], "general", "feed-bot", True),
        ([(".*", "^feed-bot$")], "general", "ann", False),
        ([("[", ".*")], "announcements", "ann", False),  # a broken pattern matches nothing
        ([], "announcements", "ann", False),
    ],
)
def test_env_05_short_path_rule_table(rules: list, channel_name: str, author: str, expected: bool) -> None:
    assert (
        short_path_matches(
            rules, channel_name=channel_name, channel_id="c1", author_name=author, author_id="u1"
        )
        is expected
    )


# ------------------------------------------------------------------ ENV-12 / ENV-15 / ENV-22: attempts and models


def test_model_choice_order() -> None:
    settings = ResponderSettings(model="m", vision_model="v", factual_model="f", retry_model="r")
    chooser = ModelChooser(settings)
    assert chooser.choose() == "m"
    assert chooser.choose(tool_results=True) == "f"
    assert chooser.choose(images=True, tool_results=True) == "v"
    chooser.failed(ModelCallFailed("429", status=429))
    assert chooser.choose(images=True) == "r"  # ENV-15 first
    chooser.succeeded()
    assert chooser.choose() == "m"
    assert (
        ModelChooser(ResponderSettings(model="m")).choose(images=True, tool_results=True) == "m"
    )  # unset: fall through


def test_env_12_backoff_doubles_and_respects_the_hosts_wait() -> None:
    assert [backoff_s(n, 1.0) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
    assert backoff_s(1, 1.0, retry_after=5.0) == 5.0
    assert backoff_s(1, 1.0, retry_after=500.0) == 30.0


async def test_env_12_attempts_raise_runtime_error_and_stop_on_a_denial() -> None:
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    async def always_bad(n: int) -> None:
        raise ModelCallFailed(f"bad {n}")

    with pytest.raises(RuntimeError) as caught:
        await with_attempts(always_bad, sleep=sleep, base_s=0.5, chooser=ModelChooser(ResponderSettings()))
    assert isinstance(caught.value, ModelExhausted) and "bad 3" in str(caught.value)
    assert sleeps == [0.5, 1.0]

    calls = []

    async def denied(n: int) -> None:
        calls.append(n)
        raise RpcError(ErrorCode.DENIED, "denied by policy rule x: no")

    with pytest.raises(RpcError):
        await with_attempts(denied, sleep=sleep, base_s=0.5, chooser=ModelChooser(ResponderSettings()))
    assert calls == [1]  # a policy denial is not retried


# ------------------------------------------------------------------ ENV-23 / tools


def test_env_23_items_are_reduced_to_their_input_fields() -> None:
    reasoning = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [],
        "encrypted_content": "xyz",
        "status": "completed",
    }
    call = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "search",
        "arguments": "{}",
        "status": "completed",
    }
    assert reduce_item(reasoning) == {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [],
        "encrypted_content": "xyz",
    }
    assert reduce_item(call) == {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "search",
        "arguments": "{}",
    }


def test_tool_results_are_sanitised_and_bounded() -> None:
    assert sanitize_result("a\x00b\x1b[31mc\nd\te") == "ab[31mc\nd\te"
    long = sanitize_result("x" * 10_000, limit=100)
    assert long.startswith("x" * 100) and "9900 more characters cut" in long


# ------------------------------------------------------------------ ENV-10 / ENV-20: the prompt-context helper


SESSION = SessionInfo(id="s1", channel_id="c1", channel_kind="guild", channel_name="general")


def test_env_20_persona_prefix_strips_legacy_placeholders() -> None:
    imp = ImpSpec(name="pip", persona="You are Pip. Today is {date}, {time}.\nNews: {news}\n{memory}\n")
    assert persona_prefix(imp) == "You are Pip. Today is , .\nNews:"
    assert persona_prefix(ImpSpec(name="pip")) == "You are pip, a helpful companion in a chat."


def test_env_10_context_suffix_holds_date_time_news_memory_and_framing() -> None:
    framing = Framing(
        mode="judge",
        reason="mention",
        participants=[Participant(id="u1", name="ann"), Participant(id="u2", name="bob")],
    )
    suffix = context_suffix(
        datetime(2026, 12, 2, 11, 5, tzinfo=UTC),
        SESSION,
        framing,
        news="Fair on Friday.",
        memory="Ann likes owls.",
    )
    assert suffix.splitlines()[:4] == [
        "## Context",
        "Date: 2026-12-02 (Wednesday)",
        "Time: 11:05 UTC",
        "Channel: #general",
    ]
    assert "### News\nFair on Friday." in suffix and "### Memory\nAnn likes owls." in suffix
    assert "People here: ann, bob" in suffix and "addressed directly" in suffix
    bare = context_suffix(NOW, SESSION, Framing(mode="respond", reason="dm"), news=None, memory=None)
    assert "News" not in bare and "Memory" not in bare and "Several people" not in bare


def test_the_prompt_package_is_deterministic_and_carries_images_and_the_reply_chain() -> None:
    image = Attachment(filename="cat.png", content_type="image/png", size=3, data_b64="AAAA")
    doc = Attachment(filename="notes.pdf", content_type="application/pdf", size=1234)
    message = Message(
        id="m9", author=Author(id="u1", name="ann"), content="what is this?", created_at=NOW,
        reply_to=ReplyRef(id="m8", author=Author(id="u2", name="bob"), content="look at my cat"), attachments=[image, doc],
    )  # fmt: skip
    history = [PromptEntry("m7", "user", "bob", "hello", NOW), PromptEntry("r7", "assistant", "pip", "hi bob", NOW),
               PromptEntry("e1", "event", "", "the reactions on message m7 were cleared (👍)", NOW)]  # fmt: skip
    args = (
        ImpSpec(name="pip", persona="You are Pip."),
        SESSION,
        message,
        Framing(mode="respond", reason="mention"),
        NOW,
        history,
    )
    package = build_package(*args, news=None, memory=None)
    assert package == build_package(*args, news=None, memory=None)
    assert package.image_urls == ["data:image/png;base64,AAAA"] and package.has_images
    assert package.chat_messages()[0] == {"role": "system", "content": package.system}
    assert package.messages[:3] == [
        {"role": "user", "content": "bob: hello"}, {"role": "assistant", "content": "hi bob"},
        {"role": "user", "content": "[the reactions on message m7 were cleared (👍)]"},
    ]  # fmt: skip
    text, picture = package.messages[-1]["content"]
    assert (
        text["text"]
        == '(in reply to bob: "look at my cat")\nann: what is this?\n[attachment: notes.pdf, application/pdf, 1234 bytes]'
    )
    assert picture == {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    assert (
        user_content(message.model_copy(update={"attachments": []}))
        == '(in reply to bob: "look at my cat")\nann: what is this?'
    )
