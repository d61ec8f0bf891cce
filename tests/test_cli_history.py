"""``impyard history show`` and ``impyard history clear``: the host's history, read and forgotten through the CLI
(issue 17), with what became of each turn that got no reply."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner, Result

from box.protocol.history import HistoryLine
from box.protocol.models import Author, Message
from impyard.cli import cli
from impyard.clock import FixedClock
from impyard.conversation.history import History
from impyard.conversation.responder_history import ResponderHistory
from impyard.imps.store import ImpStore
from impyard.storage.db import open_database

START = datetime(2025, 3, 4, 9, 30, tzinfo=UTC)
TERMINAL = "terminal:alice"
GUILD = "123456789012345678"


@pytest.fixture
def history() -> Iterator[History]:
    ImpStore().add("pip")
    ImpStore().add("bob")
    db = open_database()
    yield History(db, FixedClock(START))
    db.close()


def say(history: History, channel: str, n: int, text: str, *, imp: str | None = None) -> str:
    author = Author(id=f"imp:{imp}", name=imp, bot=True) if imp else Author(id=TERMINAL, name="alice")
    message_id = f"{channel[-3:]}-{n}"
    message = Message(id=message_id, author=author, content=text, created_at=START + timedelta(minutes=n))
    history.record(channel, message, from_imp=imp)
    return message_id


def woke(history: History, channel: str, message_id: str, outcome: str | None, error: str | None = None,
         imp: str = "pip") -> None:  # fmt: skip
    history.record_wake(imp, channel, message_id)
    if outcome is not None:
        history.finish(imp, channel, [message_id], outcome, error)


def run(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input)


def conversation(history: History) -> None:
    woke(history, TERMINAL, say(history, TERMINAL, 1, "hello pip"), "sent")
    say(history, TERMINAL, 2, "hi alice!", imp="pip")
    woke(history, TERMINAL, say(history, TERMINAL, 3, "what is the news?"), "failed",
         "budget exhausted: pip spent its daily 2.00 USD")  # fmt: skip
    woke(history, TERMINAL, say(history, TERMINAL, 4, "ok, never mind"), "silent")
    woke(history, TERMINAL, say(history, TERMINAL, 5, "still there?"), None)
    woke(history, GUILD, say(history, GUILD, 6, "pip, a question\nover two lines"), "pending")


def test_show_is_the_conversation_with_why_a_turn_got_no_reply(history: History) -> None:
    conversation(history)
    result = run("history", "show", "pip", TERMINAL)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"── {TERMINAL}",
        "2025-03-04 09:31  alice: hello pip",
        "2025-03-04 09:32  pip: hi alice!",
        "2025-03-04 09:33  alice: what is the news?",
        "                   ↳ the turn failed: budget exhausted: pip spent its daily 2.00 USD",
        "2025-03-04 09:34  alice: ok, never mind",
        "                   ↳ pip chose not to reply",
        "2025-03-04 09:35  alice: still there?",
        "                   ↳ no outcome yet: its turn is running, or the host stopped mid-turn",
    ]


def test_show_without_a_channel_covers_every_channel_of_the_imp_and_n_takes_the_latest(
    history: History,
) -> None:
    conversation(history)
    say(history, "999", 7, "a channel pip never saw")
    lines = run("history", "show", "pip").output.splitlines()
    assert f"── {GUILD}" in lines and f"── {TERMINAL}" in lines
    assert "a channel pip never saw" not in "\n".join(lines)
    assert lines[-3:] == [
        "2025-03-04 09:36  alice: pip, a question",
        "                   over two lines",
        "                   ↳ pip's reply waits for approval (impyard approvals ls)",
    ]
    latest = run("history", "show", "pip", "-n", "2").output.splitlines()
    assert [line[:16] for line in latest if line[:4] == "2025"] == ["2025-03-04 09:35", "2025-03-04 09:36"]


def test_show_json_has_every_field_in_full(history: History) -> None:
    conversation(history)
    shown = json.loads(run("history", "show", "pip", TERMINAL, "--json").output)
    assert [m["content"] for m in shown][:2] == ["hello pip", "hi alice!"]
    failed = shown[2]
    assert (
        failed["woke"] is True
        and failed["outcome"] == "failed"
        and failed["error"].startswith("budget exhausted")
    )
    assert shown[1]["from_imp"] == "pip" and shown[1]["woke"] is False and shown[1]["outcome"] is None
    assert failed["author"] == {"id": TERMINAL, "name": "alice", "bot": False}
    assert failed["created_at"].startswith("2025-03-04T09:33")


def test_show_makes_box_and_user_text_printable(history: History) -> None:
    say(history, TERMINAL, 1, "\x1b[2Jcleared your screen\u202e", imp="pip")
    output = run("history", "show", "pip").output
    assert "\x1b" not in output and "\u202e" not in output and "\\x1b[2Jcleared your screen\\u202e" in output


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["history", "show", "nobody"], 1, "no imp named 'nobody'"),
        (["history", "show", "Bad Name"], 1, "invalid imp name"),
        (["history", "show", "pip"], 0, "no history for pip yet"),
        (["history", "show", "pip", "42"], 0, "no history for pip in channel 42"),
        (["history", "show", "pip", "-n", "0"], 2, "-n"),
        (["history", "clear", "nobody", TERMINAL, "--yes"], 1, "no imp named 'nobody'"),
    ],
)
def test_bad_input_is_one_line(history: History, args: list[str], code: int, text: str) -> None:
    result = run(*args)
    assert result.exit_code == code and text in result.output, result.output


def test_clear_asks_then_forgets_only_that_channel(history: History) -> None:
    conversation(history)
    kept = run("history", "clear", "pip", TERMINAL, input="n\n")
    assert kept.exit_code == 1 and "Forget the 5 messages of channel terminal:alice?" in kept.output
    assert history.count(TERMINAL) == 5
    cleared = run("history", "clear", "pip", TERMINAL, input="y\n")
    assert cleared.exit_code == 0 and "Forgot 5 messages of channel terminal:alice." in cleared.output
    assert history.count(TERMINAL) == 0 and history.count(GUILD) == 1
    assert history.outcome("pip", TERMINAL, "ice-3") == "failed"  # wake rows (no text) stay for running turns
    assert "over two lines" in run("history", "show", "pip").output


def test_clear_refuses_a_channel_the_imp_has_no_history_in(history: History) -> None:
    say(history, "999", 1, "not pip's")
    conversation(history)
    result = run("history", "clear", "pip", "999", "--yes")
    assert result.exit_code == 1 and "pip has no history in channel '999'" in result.output
    assert GUILD in result.output and history.count("999") == 1


def test_clearing_a_shared_channel_says_who_else_forgets_it(history: History) -> None:
    conversation(history)
    woke(history, TERMINAL, say(history, TERMINAL, 8, "bob?"), "sent", imp="bob")
    result = run("history", "clear", "pip", TERMINAL, input="n\n")
    assert "It is shared: bob will forget it too." in result.output and history.count(TERMINAL) == 6


def test_clear_also_drops_the_channel_from_the_imps_own_lines(history: History) -> None:
    """The box merges its own copy of its exchanges into every prompt: cleared, that copy goes too — the host's
    (issue 22), and an older home's history file not imported yet, which is imported first so its lines of the
    channel cannot come back at the next start."""
    conversation(history)
    own = ResponderHistory(history.db, FixedClock(START))
    own.commit(
        "pip", TERMINAL, [HistoryLine(id="t-new", role="user", author="alice", content="new", at=START)]
    )
    at = START.isoformat()
    records = [
        {"channel_id": channel, "id": f"{channel[-3:]}-{n}", "role": "user", "author": "alice",
         "content": f"said in {channel}", "at": at}
        for n, channel in enumerate([TERMINAL, GUILD, TERMINAL])
    ]  # fmt: skip
    state = ImpStore().state_dir("pip")
    state.mkdir(parents=True)
    (state / "history.json").write_text(
        json.dumps({"version": 1, "records": records, "counters": {"x": {"sent": 2}}})
    )
    assert run("history", "clear", "pip", TERMINAL, "--yes").exit_code == 0
    assert [r.channel_id for r in own.lines("pip")] == [GUILD] and own.counters("pip") == {"x": {"sent": 2}}
    assert not (state / "history.json").exists() and (state / "history.json.imported").exists()


def test_clear_sets_an_unreadable_old_history_file_aside_untouched(history: History) -> None:
    conversation(history)
    state = ImpStore().state_dir("pip")
    state.mkdir(parents=True)
    (state / "history.json").write_text("{not json")
    result = run("history", "clear", "pip", TERMINAL, "--yes")
    assert result.exit_code == 0 and history.count(TERMINAL) == 0
    assert (state / "history.json.unreadable").read_text() == "{not json"  # kept as it was, never read again
