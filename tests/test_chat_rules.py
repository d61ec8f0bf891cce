"""The terminal chat's pure rules (issue 17): what a typed line asks for, and what a turn's stage and outcome say."""

from __future__ import annotations

import pytest

from box.protocol.models import DeliverResult
from impyard.terminal.commands import Command, history_count, message_text, mode_answer, parse
from impyard.terminal.stopping import Stopping
from impyard.terminal.turn_words import MAX_REASON_CHARS, outcome_line, reason, route_line, stage_line


@pytest.mark.parametrize(
    ("line", "command"),
    [
        ("hello", None),
        ("  /help ", Command("/help", (), "/help")),
        ("/?", Command("/help", (), "/?")),
        ("/EXIT", Command("/quit", (), "/EXIT")),
        ("/history 5", Command("/history", ("5",), "/history")),
        ("/mode mention", Command("/mode", ("mention",), "/mode")),
        ("/frobnicate now", Command("unknown", ("now",), "/frobnicate")),
        ("//usr/bin is a folder", None),  # a message that starts with /
        ("a /help in the middle", None),
    ],
)
def test_parse(line: str, command: Command | None) -> None:
    assert parse(line) == command


@pytest.mark.parametrize(
    ("line", "sent"),
    [("hello", "hello"), ("//usr/bin is a folder", "/usr/bin is a folder"), ("line\n//two", "line\n//two")],
)
def test_message_text(line: str, sent: str) -> None:
    assert message_text(line) == sent


@pytest.mark.parametrize(
    ("args", "count"),
    [((), 20), (("5",), 5), (("1000",), 1000), (("0",), None), (("x",), None), (("1", "2"), None)],
)
def test_history_count(args: tuple[str, ...], count: int | None) -> None:
    assert history_count(args) == count


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((), "every message here wakes pip"),
        (("all",), "every message here wakes pip"),
        (("mention",), "the terminal cannot use mention mode"),  # never accepted silently
        (("loud",), "the modes are all and mention"),
    ],
)
def test_mode_in_the_terminal(args: tuple[str, ...], said: str) -> None:
    assert said in mode_answer("pip", args)


@pytest.mark.parametrize(
    ("stage", "queued", "line"),
    [
        (None, 0, None),
        ("context", 0, "pip is reading…"),
        ("tools", 0, "pip is thinking…"),
        ("render", 2, "pip is writing… (2 queued)"),
        ("post", 0, "pip is remembering…"),
        ("someday", 0, "pip is someday…"),  # a stage added later still shows
    ],
)
def test_stage_line(stage: str | None, queued: int, line: str | None) -> None:
    assert stage_line("pip", stage, queued) == line


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (None, "unknown failure"),
        (
            "budget exhausted: budget imp:pip/day has $0.0000 of $0.0000 left; it resets in 60 s (-32011)",
            "budget exhausted: budget imp:pip/day has $0.0000 of $0.0000 left; it resets in 60 s "
            "(see: impyard budget show)",
        ),
        (
            "denied by policy rule model-text: model 'x' is not allowed for purpose 'reply' (-32010)",
            "denied by policy rule model-text: model 'x' is not allowed for purpose 'reply' "
            "(see: impyard policy check)",
        ),
        (
            "no usable answer after 3 attempts: model returned HTTP 500: boom; model returned HTTP 500: boom; "
            "model returned HTTP 500: boom",
            "no usable answer after 3 attempts: model returned HTTP 500: boom",  # the server said it once
        ),
        ("box died\nTraceback:\n  line 3", "box died Traceback: line 3"),  # one line
    ],
)
def test_reason(error: str | None, said: str) -> None:
    assert reason(error) == said


def test_a_long_reason_is_cut_at_a_word() -> None:
    said = reason("word " * 200)
    assert len(said) <= MAX_REASON_CHARS + 2 and said.endswith("word …")


@pytest.mark.parametrize(
    ("result", "line"),
    [
        (None, None),  # the host stopped first: answered after a restart
        (DeliverResult(outcome="sent"), None),  # the reply said it
        (DeliverResult(outcome="silent"), "(pip chose not to reply)"),
        (DeliverResult(outcome="pending"), "(pip's reply waits for approval: impyard approvals ls)"),
        (DeliverResult(outcome="failed", error="boom"), "(impyard) pip could not answer: boom"),
    ],
)
def test_outcome_line(result: DeliverResult | None, line: str | None) -> None:
    assert outcome_line("pip", result) == line


@pytest.mark.parametrize(
    ("outcome", "line"),
    [
        ("started", None),
        ("queued", "(queued: pip reads it when the current turn ends)"),
        ("busy", "(impyard) pip is too busy; that message will go unanswered"),
        ("refused", "(impyard) not sent: the chat is stopping"),
        ("ignored", "(impyard) not sent: the message has no printable text"),
    ],
)
def test_route_line(outcome: str, line: str | None) -> None:
    assert route_line("pip", outcome) == line  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("leaving", "requests", "heard"),
    [
        (False, 1, ["gently"]),
        (False, 2, ["gently", "now"]),
        (False, 4, ["gently", "now"]),  # later requests change nothing
        (True, 1, ["now"]),  # the chat already waits for the turn to end after /quit: Ctrl-C stops now
    ],
)
def test_the_first_stop_request_is_gentle_and_the_second_stops_now(
    leaving: bool, requests: int, heard: list[str]
) -> None:
    stopping = Stopping()
    said: list[str] = []
    stopping.gently = lambda by_signal: said.append("gently")
    stopping.now = lambda by_signal: said.append("now")
    if leaving:
        stopping.already_stopping()
    for _ in range(requests):
        stopping.request(by_signal=True)
    assert said == heard
