"""Issue 19 #3: a pasted burst is one paid model call, and a reply the send limit will refuse is never paid for.

The paste is driven in a pseudo-terminal (a plain terminal, ``TERM=dumb``: no bracketed paste, so a paste
arrives as lines, each ended by Enter) against the fake OpenAI, whose requests are counted. The precheck is
tested as a table (``impyard.gateway.rate_precheck``), at the gateway (its audit row, nothing sent upstream), and in
the whole chat: a script of 25 messages gets 20 replies and 5 one-line refusals, and the model is asked 20
times, not 25.
"""

from __future__ import annotations

import io
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pexpect
import pytest
from prompt_toolkit.key_binding import KeyPress
from prompt_toolkit.keys import Keys

from box.protocol import ErrorCode
from box.protocol.models import DiscordSendParams, ModelRequestParams
from impyard.gateway.rate_precheck import SendOutlook, precheck
from impyard.terminal.commands import paste_message
from impyard.terminal.console import typed_lines
from testing.fake_openai import FakeOpenAI, envelope
from tests.test_chat_app import (
    ENTER,
    IMPYARD,
    add_imp,
    environment,
    quit_chat,
    said,
    spawn,
)
from tests.test_gateway import CHAT_BODY, Harness, make_harness

# ------------------------------------------------------------------ the paste: one message (pure)

LIMIT = 30


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (["hello"], ("hello", 1)),
        (["one", "two", "three"], ("one\ntwo\nthree", 3)),
        (["one", "", "two"], ("one\n\ntwo", 3)),  # a blank line inside a paste is kept
        (["one", "/history", "two"], ("one", 1)),  # a command ends the message; it is done in its place
        (["one", "//not a command", "two"], ("one\n/not a command\ntwo", 3)),  # // sends a /
        (["//x", "y"], ("/x\ny", 2)),
        (["a" * 20, "b" * 9], ("a" * 20 + "\n" + "b" * 9, 2)),  # exactly LIMIT characters
        (["a" * 20, "b" * 10], ("a" * 20, 1)),  # one more: the next message starts there
        (["a" * 40, "b"], ("a" * 40, 1)),  # a line longer than the limit stays whole, as typed
    ],
)
def test_lines_typed_at_once_are_one_message(lines: list[str], expected: tuple[str, int]) -> None:
    assert paste_message(lines, LIMIT) == expected


# ------------------------------------------------------------------ the paste, in a terminal


def dumb_terminal(fake: FakeOpenAI, home: Path) -> pexpect.spawn:
    """``impyard chat`` in a pseudo-terminal that brackets no paste: the plain console, reading a terminal."""
    env = {**environment(fake, home), "TERM": "dumb"}
    child = pexpect.spawn(
        IMPYARD, ["chat", "--backend", "process"], env=env, encoding="utf-8", timeout=60, dimensions=(40, 200)
    )
    child.logfile_read = io.StringIO()
    child.expect_exact("you> ")
    return child


def test_a_pasted_burst_is_one_turn_and_one_model_call(fake: FakeOpenAI, impyard_home: Path) -> None:
    fake.script(envelope(answer="Read all of it."))
    add_imp()
    lines = [f"line {n:02d} of the paste" for n in range(30)]
    child = dumb_terminal(fake, impyard_home)
    child.send("".join(line + ENTER for line in lines))  # 30 lines at once, each ended by Enter
    child.expect_exact("pip> Read all of it.")
    child.send("/history 5" + ENTER)
    child.expect_exact("line 29 of the paste")
    shown = quit_chat(child)
    assert said(fake) == ["\n".join(lines)]  # one model call, with every line of the paste
    assert shown.count("pip> Read all of it.") == 1
    assert "rate limited" not in shown and "could not answer" not in shown


def test_a_paste_the_terminal_did_not_bracket_is_one_model_call_at_the_prompt_too(
    fake: FakeOpenAI, impyard_home: Path
) -> None:
    """TERM=xterm: prompt_toolkit's prompt, but the paste comes as keys with Enters (no bracketing)."""
    fake.script(envelope(answer="Read all of it."))
    add_imp()
    lines = [f"line {n:02d} of the paste" for n in range(30)]
    child = spawn(fake, impyard_home)  # TERM=xterm
    child.send("".join(line + ENTER for line in lines))
    child.expect_exact("Read all of it.")
    quit_chat(child)
    assert said(fake) == ["\n".join(lines)]  # one model call, with every line of the paste


def _keys(text: str) -> list[KeyPress]:
    """Keys as prompt_toolkit parses them: a character is its own key, \r is Enter, \x7f Backspace."""
    named = {"\r": Keys.ControlM, "\n": Keys.ControlJ, "\x7f": Keys.ControlH, "\x1b": Keys.Escape}
    return [KeyPress(named.get(ch, ch), ch) for ch in text]


@pytest.mark.parametrize(
    ("typed", "lines", "left"),
    [
        ("", [], ""),
        ("two\rthree\r", ["two", "three"], ""),
        ("two\rthr", ["two"], "thr"),  # a half line stays for the prompt
        ("two\r\rfour\r", ["two", "", "four"], ""),  # a blank line inside a paste is kept
        ("two\rx\x7fy\r", ["two"], "x\x7fy\r"),  # an edit key: the prompt sees the rest as typed
        ("\x1b\rmore\r", [], "\x1b\rmore\r"),  # Alt-Enter is a new line in the message, not a send
        ("a\nb\r", ["a", "b"], ""),
    ],
)
def test_keys_read_ahead_give_their_whole_lines(typed: str, lines: list[str], left: str) -> None:
    taken, rest = typed_lines(_keys(typed))
    assert (taken, "".join(press.data for press in rest)) == (lines, left)


def test_a_paste_that_ends_in_a_command_does_it_after_the_message(
    fake: FakeOpenAI, impyard_home: Path
) -> None:
    fake.script(envelope(answer="Both lines."))
    add_imp()
    child = dumb_terminal(fake, impyard_home)
    child.send("first" + ENTER + "second" + ENTER + "/quit" + ENTER)
    child.expect_exact("pip> Both lines.")
    child.expect_exact("bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert said(fake) == ["first\nsecond"]


# ------------------------------------------------------------------ the precheck (pure)

FULL = SendOutlook("send-own-channel", 20, 41.5)
ROOM = SendOutlook("send-own-channel", 20, None)


@pytest.mark.parametrize(
    ("purpose", "outlook", "refused"),
    [
        ("reply", FULL, True),  # the reply would be refused: the model is not asked
        ("reply", ROOM, False),
        ("reply", None, False),  # no rule allows such a send: refused at the send, for that reason
        ("summary", FULL, False),  # memory's calls post nothing in the channel
        ("embedding", FULL, False),
        ("appraisal", FULL, False),
    ],
)
def test_which_model_calls_a_full_send_limit_refuses(
    purpose: str, outlook: SendOutlook | None, refused: bool
) -> None:
    assert (precheck(purpose, outlook) is not None) is refused


def test_the_refusal_says_which_limit_and_when_to_try_again() -> None:
    found = precheck("reply", FULL)
    assert found is not None and found.rule == "send-own-channel"
    assert found.error.code == ErrorCode.DENIED  # not -32012: the box would retry it for a minute (ENV-12)
    assert found.error.message == (
        "denied by policy rule send-own-channel: the reply would be over this channel's send limit "
        "(at most 20 per minute), so the model was not asked; try again in 41.5 s"
    )
    assert found.error.data == {
        "rule": "send-own-channel", "reason": found.reason, "retry_after": 41.5, "kind": "send_limited",
    }  # fmt: skip


# ------------------------------------------------------------------ the precheck, at the gateway


@pytest.fixture
async def h(tmp_path: Path, fake: FakeOpenAI) -> AsyncIterator[Harness]:
    harness = make_harness(tmp_path, fake, api_key=fake.api_key)
    yield harness
    await harness.gateway.aclose()
    harness.db.close()


def reply_call(purpose: str = "reply") -> ModelRequestParams:
    return ModelRequestParams(path="/chat/completions", body=CHAT_BODY, purpose=purpose)


@pytest.mark.anyio
async def test_a_reply_the_send_limit_will_refuse_is_not_paid_for(h: Harness) -> None:
    h.fake.script(envelope(answer="hello"))
    for _ in range(20):  # send-own-channel: 20 a minute, all spent
        await h.call("discord.send", DiscordSendParams(channel_id="c1", content="hi"))
    h.clock.advance(seconds=15)
    spent = h.spent()
    error_ = await h.refused("model.request", reply_call(), ErrorCode.DENIED)
    assert error_.data["rule"] == "send-own-channel" and error_.data["retry_after"] == 45.0
    assert h.fake.requests_for("/chat/completions") == []  # the upstream was never asked
    assert h.spent() == spent  # nothing reserved, nothing charged
    row = h.audit()[-1]
    assert (row["method"], row["verdict"], row["rule"]) == (
        "model.request",
        "rate_limited",
        "send-own-channel",
    )
    assert "the model was not asked" in row["reason"]
    # A memory call posts nothing in the channel: it goes ahead; so does the reply once the window frees.
    await h.call("model.request", reply_call("summary"))
    h.clock.advance(seconds=46)
    await h.call("model.request", reply_call())
    assert len(h.fake.requests_for("/chat/completions")) == 2


@pytest.mark.anyio
async def test_the_dry_run_explains_the_same_refusal(h: Harness) -> None:
    for _ in range(20):
        await h.call("discord.send", DiscordSendParams(channel_id="c1", content="hi"))
    decision = await h.gateway.dry_run(h.spec, "model.request", reply_call())
    assert (decision.verdict, decision.rule) == ("rate_limited", "send-own-channel")
    assert decision.error is not None and decision.error.code == ErrorCode.DENIED


@pytest.mark.anyio
async def test_another_channels_sends_leave_this_channels_replies_alone(h: Harness) -> None:
    h.fake.script(envelope(answer="hello"))
    other = h.spec.__class__("pip", "c2", h.spec.state_dir, run_id="run-2")
    h.channel("c2", kind="dm")
    for _ in range(20):
        await h.call("discord.send", DiscordSendParams(channel_id="c2", content="hi"), other)
    await h.call("model.request", reply_call())  # c1's limit is untouched (the meter is per channel)
    assert len(h.fake.requests_for("/chat/completions")) == 1


# ------------------------------------------------------------------ the precheck, in the whole chat


def test_a_burst_past_the_send_limit_pays_for_no_reply_it_cannot_send(
    fake: FakeOpenAI, impyard_home: Path
) -> None:
    """A script (a pipe: one message a line, each answered before the next) of 25 messages: 20 replies, then
    the send limit is spent, and the last 5 fail at once with their own line, without a model call."""
    fake.script(envelope(answer="Ok."))
    add_imp()
    script = "".join(f"message {n}\n" for n in range(25)) + "/quit\n"
    result = subprocess.run(
        [IMPYARD, "chat", "--backend", "process"], input=script, capture_output=True, text=True,
        env=environment(fake, impyard_home), timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert said(fake) == [f"message {n}" for n in range(20)]  # the model was asked 20 times, not 25
    assert result.stdout.count("pip> Ok.") == 20
    refusals = [line for line in result.stdout.splitlines() if "could not answer" in line]
    assert len(refusals) == 5, result.stdout
    assert all("so the model was not asked" in line for line in refusals)
    assert "the reply was not delivered" not in result.stdout  # no paid answer thrown away
    assert "blocked by policy" not in result.stdout  # the session's notice is not a second line (issue 19 #5)
