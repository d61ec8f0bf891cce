"""The terminal chat as a person uses it (issue 17), driven in a pseudo-terminal against the fake OpenAI.

Line editing and recall, multi-line input, long pastes, the commands, what a turn's outcome and stage look
like, and where the logs go. prompt_toolkit runs as in a real terminal; the pty answers no cursor position
requests, so ``PROMPT_TOOLKIT_NO_CPR=1`` tells it not to ask (the chat also logs, never prints, a terminal
that does not answer).
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest
from click.testing import CliRunner

from box.context import split_context
from impyard.cli import cli
from testing.fake_openai import FakeOpenAI, RecordedRequest, envelope, slow

IMPYARD = str(Path(sys.executable).parent / "impyard")
REPO = Path(__file__).resolve().parent.parent
ENTER = "\r"  # what a terminal sends for the Enter key
LEFT, UP = "\x1b[D", "\x1b[A"
PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"  # bracketed paste, as a terminal wraps a paste
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def add_imp(name: str = "pip") -> None:
    """An imp without memory: every model call is the reply, and the prompt is only the conversation."""
    for args in (["imp", "add", name], ["imp", "set", name, "memory.enabled=false"]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output


def environment(fake: FakeOpenAI, home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "IMPYARD_HOME": str(home),
        "OPENAI_API_KEY": fake.api_key,
        "OPENAI_BASE_URL": fake.base_url,
        "PROMPT_TOOLKIT_NO_CPR": "1",
        "TERM": "xterm",
    }


def spawn(fake: FakeOpenAI, home: Path, *args: str) -> pexpect.spawn:
    child = pexpect.spawn(
        IMPYARD, [*args] or ["chat", "--backend", "process"], env=environment(fake, home),
        encoding="utf-8", timeout=60, dimensions=(40, 200),
    )  # fmt: skip
    child.logfile_read = io.StringIO()  # the whole screen, for ``quit_chat``
    child.expect("you> ")
    return child


def quit_chat(child: pexpect.spawn) -> str:
    """/quit; everything the chat showed (escape sequences removed)."""
    child.send("/quit" + ENTER)
    child.expect("bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    return ANSI.sub("", child.logfile_read.getvalue())


def said(fake: FakeOpenAI) -> list[str]:
    """What each reply call sent as the person's newest message (the box prefixes the author's name)."""
    calls = [r for r in fake.requests_for("/chat/completions") if r.purpose == "reply"]
    return [split_context(str(call.body["messages"][-1]["content"]))[1].split(": ", 1)[1] for call in calls]


def said_in(call: RecordedRequest) -> str:
    """The person's newest message in one reply call."""
    return split_context(str(call.body["messages"][-1]["content"]))[1].split(": ", 1)[
        1
    ]  # after the turn's context


def prompt_text(fake: FakeOpenAI, index: int) -> str:
    """Everything a reply call sent the model, as text."""
    calls = [r for r in fake.requests_for("/chat/completions") if r.purpose == "reply"]
    return "\n".join(str(m["content"]) for m in calls[index].body["messages"])


def test_arrow_keys_edit_the_line_and_up_recalls_the_last_message(
    fake: FakeOpenAI, impyard_home: Path
) -> None:
    fake.script(envelope(answer="Noted."))
    add_imp()
    child = spawn(fake, impyard_home)
    child.send("hello wrld" + LEFT * 3 + "o" + ENTER)  # ← ← ← then o: "wrld" becomes "world"
    child.expect("pip> Noted.")
    child.send(UP + ENTER)  # the last message again
    child.expect("pip> Noted.")
    quit_chat(child)
    assert said(fake) == ["hello world", "hello world"]


def test_a_long_multi_line_paste_reaches_the_model_whole(fake: FakeOpenAI, impyard_home: Path) -> None:
    fake.script(envelope(answer="That is long."))
    add_imp()
    paste = "\n".join(f"line {n:05d} " + "x" * 89 for n in range(200))  # 20,000 characters, 200 lines
    assert len(paste) >= 20_000
    child = spawn(fake, impyard_home)
    child.send(PASTE_START + paste + PASTE_END + ENTER)  # the paste's newlines do not send it
    child.expect("pip> That is long.", timeout=120)
    child.send("first" + "\x1b" + ENTER + "second" + ENTER)  # Alt-Enter (Esc, Enter): a new line
    child.expect("pip> That is long.")
    quit_chat(child)
    assert said(fake) == [paste, "first\nsecond"]


def test_a_long_line_from_a_pipe_reaches_the_model_whole(fake: FakeOpenAI, impyard_home: Path) -> None:
    """No terminal: one message a line, no line cut at the terminal's 4,096."""
    fake.script(envelope(answer="Got it."))
    add_imp()
    line = "y" * 20_000
    result = subprocess.run(
        [IMPYARD, "chat", "--backend", "process"], input=f"{line}\n/quit\n", capture_output=True, text=True,
        env=environment(fake, impyard_home), timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert said(fake) == [line]
    assert "pip> Got it." in result.stdout and "you> /quit" in result.stdout  # a transcript


def test_a_scripts_next_line_after_an_answer_is_not_called_queued(
    fake: FakeOpenAI, impyard_home: Path
) -> None:
    """A pipe's next line waits for the answer before it; the warm box then waits for work, and the line starts
    its turn there: nothing is queued (issue 38: it used to say so of every line after the first)."""
    fake.script(envelope(answer="Got it."))
    add_imp()
    result = subprocess.run(
        [IMPYARD, "chat", "--backend", "process"], input="one\ntwo\nthree\n/quit\n", capture_output=True,
        text=True, env=environment(fake, impyard_home), timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert said(fake) == ["one", "two", "three"]
    assert result.stdout.count("pip> Got it.") == 3 and "queued" not in result.stdout, result.stdout


def test_help_lists_the_commands(fake: FakeOpenAI, impyard_home: Path) -> None:
    add_imp()
    child = spawn(fake, impyard_home)
    child.send("/help" + ENTER)
    child.expect("Alt-Enter")
    shown = ANSI.sub("", child.before or "")
    for command in ("/help", "/history", "/clear", "/mode", "/quit"):
        assert command in shown
    child.send("/nonsense" + ENTER)
    child.expect("unknown command /nonsense")
    quit_chat(child)
    assert fake.requests == []  # commands never reach the model


def test_history_shows_this_conversation_and_clear_forgets_it_after_asking(
    fake: FakeOpenAI, impyard_home: Path
) -> None:
    fake.script(envelope(answer="Purple is a fine colour."))
    add_imp()
    child = spawn(fake, impyard_home)
    child.send("my favourite colour is purple" + ENTER)
    child.expect("pip> Purple is a fine colour.")
    child.send("/history" + ENTER)
    child.expect("pip: Purple is a fine colour.")
    assert "my favourite colour is purple" in (child.before or "")
    child.send("/clear" + ENTER)
    child.expect(r"Forget the 2 messages of this conversation .*what pip remembers is kept")
    child.send("n" + ENTER)
    child.expect("kept the history")
    child.send("/clear" + ENTER)
    child.expect(r"\[y/N\]")
    child.send("y" + ENTER)
    child.expect("forgot 2 messages")
    child.expect("What pip remembers is separate")
    child.send("/history" + ENTER)
    child.expect("no history in this conversation yet")
    child.send("what is my favourite colour?" + ENTER)
    child.expect("pip> Purple is a fine colour.")
    quit_chat(child)
    assert "purple" in prompt_text(fake, 0)
    assert "purple" not in prompt_text(fake, 1)  # the next reply starts without what was forgotten


def test_a_silent_turn_says_so(fake: FakeOpenAI, impyard_home: Path) -> None:
    fake.script(envelope(answer="", answer_needed=False))
    add_imp()
    child = spawn(fake, impyard_home)
    child.send("just thinking out loud" + ENTER)
    child.expect_exact("(pip chose not to reply)")
    quit_chat(child)


def test_a_failed_turn_says_why_in_one_line(fake: FakeOpenAI, impyard_home: Path) -> None:
    fake.script(envelope(answer="never sent"))
    add_imp()
    assert CliRunner().invoke(cli, ["budget", "set", "pip", "--daily", "0"]).exit_code == 0
    child = spawn(fake, impyard_home)
    child.send("hello" + ENTER)
    child.expect(r"\(impyard\) pip could not answer: ([^\r\n]*)\r\n")
    reason = child.match.group(1)
    assert reason.startswith("budget exhausted: budget imp:pip/day has $0.0000 of $0.0000 left")
    assert reason.endswith("(see: impyard budget show)") and "(-32" not in reason  # no protocol code
    rest = quit_chat(child)
    assert "couldn't answer that just now" not in rest  # the generic notice is not said twice


def test_a_message_sent_during_a_turn_is_queued_and_the_stage_shows(
    fake: FakeOpenAI, impyard_home: Path
) -> None:
    fake.script(slow(envelope(answer="First answer."), 3.0), times=1)
    fake.script(envelope(answer="Second answer."))
    add_imp()
    child = spawn(fake, impyard_home)
    child.send("one" + ENTER)
    child.expect("pip is thinking…")
    child.send("two" + ENTER)
    child.expect_exact("(queued: pip reads it when the current turn ends)")
    child.expect("pip> First answer.")
    child.expect("pip> Second answer.")
    quit_chat(child)
    assert said(fake) == ["one", "two"]


def test_a_message_sent_while_the_imp_remembers_is_not_called_queued(
    fake: FakeOpenAI, impyard_home: Path
) -> None:
    """Issue 38: after the reply is shown, the turn goes on while the imp remembers the exchange (PostSend: the
    appraisal). A message sent then is not "queued" behind an answer the person already has: nothing is said
    of it, and the next turn answers it once the remembering is done."""
    fake.script(lambda call: envelope(answer=f"Answer to {said_in(call)}."), purpose="reply")
    appraisal = fake.script(slow(envelope(answer="unused"), 4.0), purpose="appraisal", times=1)
    assert CliRunner().invoke(cli, ["imp", "add", "pip"]).exit_code == 0  # memory on
    child = spawn(fake, impyard_home)
    child.send("one" + ENTER)
    child.expect("pip> Answer to one.")
    child.expect("pip is remembering…")
    child.send("two" + ENTER)
    child.expect("pip> Answer to two.")
    assert appraisal.used == 1  # "two" was sent while the first turn still remembered
    between = ANSI.sub("", child.before or "")
    assert "queued" not in between, between
    shown = quit_chat(child)
    assert "(queued" not in shown
    assert said(fake)[-1] == "two" and "one" in said(fake)


def test_logs_go_to_the_file_named_at_the_start_not_to_the_screen(
    fake: FakeOpenAI, impyard_home: Path
) -> None:
    fake.script(envelope(answer="Hi."))
    add_imp()
    child = spawn(fake, impyard_home, "-vv", "chat", "--backend", "process")  # debug: lots to log
    log_file = impyard_home / "logs" / "chat.log"
    assert f"Log: {log_file}" in ANSI.sub("", child.before or "")
    child.send("hello" + ENTER)
    child.expect("pip> Hi.")
    shown = quit_chat(child)
    logged = log_file.read_text()
    assert "HTTP Request: POST" in logged and "PROCESS BACKEND" in logged  # what -vv logs …
    assert "HTTP Request" not in shown and "DEBUG" not in shown and "WARNING" not in shown  # … is not shown


def test_with_several_imps_chat_asks_which(fake: FakeOpenAI, impyard_home: Path) -> None:
    fake.script(envelope(answer="I am Bob."))
    add_imp("pip")
    add_imp("bob")
    child = pexpect.spawn(
        IMPYARD, ["chat", "--backend", "process"], env=environment(fake, impyard_home), encoding="utf-8",
        timeout=60,
    )  # fmt: skip
    child.logfile_read = io.StringIO()
    child.expect(r"Chat with which imp\? \((bob, pip|pip, bob)\)")
    child.send("bob" + ENTER)
    child.expect("Chatting with bob")
    child.expect("you> ")
    child.send("who are you?" + ENTER)
    child.expect("bob> I am Bob.")
    quit_chat(child)


def test_run_sh_passes_the_imp_name_through(fake: FakeOpenAI, impyard_home: Path, tmp_path: Path) -> None:
    """``./run.sh IMP`` chats with IMP (here an unknown one: the chat's own one-line error names it)."""
    if not (REPO / ".venv" / "bin" / "impyard").exists():
        pytest.skip("run.sh uses the repository's .venv, which is not set up here")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text("#!/bin/sh\nexit 1\n")  # no Docker engine: no image build
    (bin_dir / "docker").chmod(0o755)
    env = {**environment(fake, impyard_home), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    result = subprocess.run(
        [str(REPO / "run.sh"), "nobody"], env=env, input="", capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 1
    assert "no imp named 'nobody'" in result.stderr
