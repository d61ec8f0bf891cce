"""``impyard chat`` driven in a pseudo-terminal, against the fake OpenAI, on both backends."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pexpect
import pytest
from click.testing import CliRunner

from impyard import paths
from impyard.backends.docker import DockerBackend
from impyard.backends.plan import LABEL_CHANNEL
from impyard.cli import cli
from testing.fake_openai import FakeOpenAI, envelope, slow
from tests.conftest import RUNTIMES, use_runtime

IMPYARD = str(Path(sys.executable).parent / "impyard")


pytestmark = pytest.mark.fake_model(answer="Hello from Pip!")


def spawn_chat(fake: FakeOpenAI, home: Path, *args: str, answers_cpr: bool = False) -> pexpect.spawn:
    """``answers_cpr``: False, the pty (which answers no cursor position request) tells prompt_toolkit so;
    True, the chat has to cope with a terminal that does not answer (it logs it, never shows it)."""
    env = {
        **os.environ,
        "IMPYARD_HOME": str(home),
        "OPENAI_API_KEY": fake.api_key,
        "OPENAI_BASE_URL": fake.base_url,
    }
    if not answers_cpr:
        env["PROMPT_TOOLKIT_NO_CPR"] = "1"
    return pexpect.spawn(
        IMPYARD, ["chat", *args], env=env, encoding="utf-8", timeout=60, dimensions=(40, 200)
    )


def chat_once(fake: FakeOpenAI, home: Path, message: str, reply: str = "") -> None:
    """One turn through ``impyard chat`` (process backend) and ``/quit``: on a fresh home the chat makes pip.
    ``reply``: what pip's answer must start with."""
    child = spawn_chat(fake, home, "--backend", "process")
    child.logfile_read = io.StringIO()
    try:
        child.expect("you> ")
        child.sendline(message)
        child.expect(f"pip> {reply}")
        child.expect("you> ")
        child.sendline("/quit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)


def converse(child: pexpect.spawn) -> None:
    child.expect("you> ")
    child.sendline("hello pip")
    child.expect("pip> Hello from Pip!")
    child.expect("you> ")
    child.sendline("/mode mention")  # the terminal is a direct conversation: it says so instead of accepting
    child.expect("the terminal cannot use mention mode")
    child.sendline("/mode")
    child.expect("every message here wakes pip")


@pytest.mark.parametrize("backend", ["process", *RUNTIMES])
def test_chat_end_to_end(
    backend: str, fake: FakeOpenAI, impyard_home: Path, request: pytest.FixtureRequest
) -> None:
    if backend in RUNTIMES:  # the Docker backend under this runtime (IMPYARD_BOX_RUNTIME)
        use_runtime(request, backend)
        backend = "docker"
    child = spawn_chat(fake, impyard_home, "--backend", backend, answers_cpr=True)  # it never does
    child.logfile_read = screen = io.StringIO()
    converse(child)
    log_file = impyard_home / "logs" / "chat.log"
    deadline = time.monotonic() + 30
    while "cursor position" not in log_file.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)  # prompt_toolkit gives up waiting for the answer after 2 s
    child.expect("you> ")
    child.sendline("/quit")
    child.expect("bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert "does not answer cursor position requests" in log_file.read_text()  # logged …
    assert "cursor position" not in screen.getvalue()  # … never shown in the conversation
    replies = [r for r in fake.requests_for("/chat/completions") if r.purpose == "reply"]
    request_seen = replies[0]  # the memory's own calls (embedding, appraisal, …) go beside it
    assert request_seen.body["messages"][-1]["content"].endswith("hello pip")
    assert (
        request_seen.headers["authorization"] == f"Bearer {fake.api_key}"
    )  # the host's key, sent by the host
    if backend == "docker":
        assert DockerBackend(home_id=paths.home_id(impyard_home)).labelled() == []


@pytest.mark.parametrize("backend", ["process", *RUNTIMES])
def test_ctrl_c_gives_the_running_turn_its_deadline(
    backend: str, impyard_home: Path, request: pytest.FixtureRequest
) -> None:
    """Ctrl-C goes to the terminal's whole process group; the box is not in it (issue 11, "also close")."""
    if backend in RUNTIMES:  # the Docker backend under this runtime (IMPYARD_BOX_RUNTIME)
        use_runtime(request, backend)
        backend = "docker"
    with FakeOpenAI() as server:
        server.script(slow(envelope(answer="Finished anyway.", answer_needed=True), 3.0))
        child = spawn_chat(server, impyard_home, "--backend", backend)
        child.expect("you> ")
        child.sendline("hello pip")
        server.wait_for_requests(1, path="/chat/completions", timeout_s=60)  # the turn is in flight
        child.sendintr()  # ^C through the pseudo-terminal: SIGINT to the foreground process group
        child.expect("stopping")
        child.expect("pip> Finished anyway.")
        child.expect("bye")
        child.expect(pexpect.EOF)
        child.close()
    assert "died" not in (child.before or "")
    assert child.exitstatus == 0


def process_boxes_of(home: Path) -> list[int]:
    """The pids of process-backend boxes still running with a state dir under ``home``."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            variables = environ.read_bytes().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        if any(v.startswith(b"IMPYARD_STATE_DIR=" + str(home).encode()) for v in variables):
            found.append(int(environ.parent.name))
    return found


@pytest.mark.parametrize("console", ["terminal", "pipe"])
def test_ctrl_c_twice_mid_turn_stops_now_and_cleanly(console: str, impyard_home: Path) -> None:
    """Issue 38: the second Ctrl-C of a turn stops now (the turn is cut off, its box killed) and leaves no
    ``RuntimeError: Attempted to exit a cancel scope…`` in chat.log. On a terminal the first Ctrl-C is a key of
    the prompt and the second, while the chat closes, a SIGINT; from a pipe both are signals."""
    with FakeOpenAI() as server:
        server.script(slow(envelope(answer="Finished anyway.", answer_needed=True), 8.0))  # within the grace
        if console == "terminal":
            child = spawn_chat(server, impyard_home, "--backend", "process")
            child.logfile_read = screen = io.StringIO()
            child.expect("you> ")
            child.sendline("hello pip")
            server.wait_for_requests(1, path="/chat/completions", timeout_s=60)  # the turn is in flight
            child.sendintr()  # a key: the prompt is open
            child.expect(r"stopping: pip's turn gets a moment to end \(Ctrl-C again stops now\)")
            assert process_boxes_of(impyard_home)  # the turn's box is still there, in its grace
            child.sendintr()  # the prompt is closed: SIGINT to the foreground process group
            child.expect("stopping now: pip's turn is cut off")
            child.expect("bye")
            child.expect(pexpect.EOF)
            child.close()
            status, shown = child.exitstatus, screen.getvalue()
        else:
            env = {
                **os.environ, "IMPYARD_HOME": str(impyard_home), "OPENAI_API_KEY": server.api_key or "",
                "OPENAI_BASE_URL": server.base_url,
            }  # fmt: skip
            process = subprocess.Popen(
                [IMPYARD, "chat", "--backend", "process"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, env=env, text=True,
            )  # fmt: skip
            assert process.stdin is not None
            process.stdin.write("hello pip\n")
            process.stdin.flush()
            server.wait_for_requests(1, path="/chat/completions", timeout_s=60)
            process.send_signal(signal.SIGINT)
            time.sleep(0.5)
            assert process_boxes_of(impyard_home)
            process.send_signal(signal.SIGINT)
            shown, errors = process.communicate(timeout=60)
            status = process.returncode
            assert "Traceback" not in errors, errors
            assert "stopping now: pip's turn is cut off" in shown
        assert status == 0, shown
        assert "Finished anyway." not in shown  # cut off: the grace would have let it end
        logged = (impyard_home / "logs" / "chat.log").read_text()
        assert "Traceback" not in logged and "RuntimeError" not in logged, logged[-3000:]
        assert process_boxes_of(impyard_home) == []


@pytest.mark.parametrize("runtime", ["default", *RUNTIMES])
def test_sigterm_shuts_down_and_leaves_no_box(
    fake: FakeOpenAI, impyard_home: Path, runtime: str, request: pytest.FixtureRequest
) -> None:
    """Also: the chat's box runs under runsc by default where the engine can run it, and under the runtime
    asked for (IMPYARD_BOX_RUNTIME) otherwise (issue 22)."""
    if runtime == "default":
        request.getfixturevalue("box_image")
        runtime = "runsc" if request.getfixturevalue("runtime_problems")("runsc") is None else "runc"
    else:
        use_runtime(request, runtime)
    child = spawn_chat(fake, impyard_home, "--backend", "docker")
    child.expect("you> ")
    child.sendline("hello pip")
    child.expect("pip> Hello from Pip!")
    backend = DockerBackend(home_id=paths.home_id(impyard_home))
    boxes = [box for box in backend.labelled() if box.labels.get(LABEL_CHANNEL)]  # not the spare (issue 37)
    assert len(boxes) == 1  # the warm box is still there between turns
    assert boxes[0].attrs["HostConfig"]["Runtime"] == runtime
    child.kill(signal.SIGTERM)
    child.expect("stopping")
    child.expect(pexpect.EOF)
    child.close()
    assert backend.labelled() == []


def test_a_second_chat_on_the_same_home_is_refused_with_the_holders_pid(
    fake: FakeOpenAI, impyard_home: Path
) -> None:
    child = spawn_chat(fake, impyard_home, "--backend", "process")
    child.expect("you> ")
    try:
        result = CliRunner().invoke(cli, ["chat", "pip", "--backend", "process"], env={
            "OPENAI_API_KEY": fake.api_key, "OPENAI_BASE_URL": fake.base_url,
        })  # fmt: skip
        assert result.exit_code == 1
        assert f"pid {child.pid}" in result.output
    finally:
        child.sendline("/quit")
        child.expect(pexpect.EOF)


def test_chat_without_a_model_key_says_how_to_set_one(impyard_home: Path) -> None:
    result = CliRunner().invoke(cli, ["chat"])
    assert result.exit_code == 1
    assert "OPENAI_API_KEY" in result.output and "OPENAI_BASE_URL" in result.output
    assert not (impyard_home / "imps").exists()  # nothing was created on the way to the error


def test_chat_with_an_unknown_imp_is_a_one_line_error(fake: FakeOpenAI, impyard_home: Path) -> None:
    result = CliRunner().invoke(cli, ["chat", "nobody"], env={"OPENAI_API_KEY": "sk-x"})
    assert result.exit_code == 1 and "nobody" in result.output and "Traceback" not in result.output
