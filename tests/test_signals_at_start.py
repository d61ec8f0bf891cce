"""A SIGTERM at any moment of a long-running command's life stops it cleanly (impyard.stop_signals, docs/hosts.md).

A SIGTERM that arrives while ``impyard serve``, ``supervise`` or ``console`` starts (a Kubernetes pod is sent one at
any moment) stops the start: what started is closed — the bots, the boxes, the leases and the host's record, the
health server, the console — and the command exits 0, as a stop after start-up does, with one line saying the signal
came during start-up. Before, the receiver was installed once the host was up, and such a signal killed the process
with the default action (exit status -15), leaving its record, its leases and its boxes behind.

Real parts: the commands as processes of their own on a home of their own, the loopback fake Discord and fake
OpenAI, SQLite and PostgreSQL. Each signal is sent at a moment the test observes, in a window widened by a real
knob: the fake Discord holding the bot's login, Discord's wait for the server list
(``IMPYARD_DISCORD_GUILD_READY_TIMEOUT``), a table of the database locked by another connection.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from click.testing import CliRunner
from sqlalchemy import text as sql

from impyard import paths
from impyard.backends import BoxError
from impyard.backends.docker import LABEL_BOX, LABEL_HOME, DockerBackend
from impyard.cli import cli
from impyard.storage.db import open_database
from impyard.supervisor.orphans import looks_like_box_process
from testing.fake_discord import FakeDiscord
from testing.fake_openai import FakeOpenAI, envelope, slow
from tests.test_discord_shards import (
    ALICE,
    EVEN_A,
    IMPYARD,
    make_fake,
    prepare_home,
    serve_args,
    serve_env,
    wait_for_line,
)

pytestmark = pytest.mark.slow  # real processes, each start and stop its own seconds

T = TypeVar("T")

WAIT_S = 60.0  # for what the test waits on: generous, never a timing assertion
HELD_S = 2 * WAIT_S  # a start held this long would outlast the wait: only a stopped start exits in time
DURING_START = "SIGTERM during start-up: stopping before"


def until(what: Callable[[], T], log: Path | None = None, timeout: float = WAIT_S) -> T:
    """``what()`` once it is truthy (polled)."""
    deadline = time.monotonic() + timeout
    while not (found := what()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached: {what}\n{log.read_text() if log else ''}")
        time.sleep(0.05)
    return found


@contextmanager
def running(args: Sequence[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``args`` as a process of its own, its output in ``log``; killed after, if the test left it running."""
    with log.open("w") as out:
        child = subprocess.Popen(list(args), env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield child
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def terminated(child: subprocess.Popen[bytes], log: Path) -> str:
    """SIGTERM now; the exit status must be 0 (never -15, the default action's); the log."""
    child.send_signal(signal.SIGTERM)
    try:
        status = child.wait(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running {WAIT_S:g} s after SIGTERM:\n{log.read_text()}") from None
    text = log.read_text()
    assert status == 0, f"exit status {status}:\n{text}"
    return text


def cluster(env: dict[str, str]) -> dict[str, Any]:
    """``impyard hosts --json`` on that home's database."""
    keys = ("IMPYARD_HOME", "IMPYARD_DATABASE_URL")
    result = CliRunner().invoke(cli, ["hosts", "--json"], env={key: env[key] for key in keys})
    assert result.exit_code == 0, result.output
    found: dict[str, Any] = json.loads(result.output)
    return found


def nothing_held(env: dict[str, str], pid: int) -> None:
    """Process ``pid`` left no host record (a stopped host forgets its own) and holds no lease."""
    found = cluster(env)
    assert [host for host in found["hosts"] if host["pid"] == pid] == [], found
    assert [lease for lease in found["leases"] if lease["pid"] == pid and lease["state"] == "held"] == [], (
        found
    )


def box_processes(home: Path) -> list[int]:
    """Process-backend boxes of this home still alive (their environment names its state)."""
    return [
        int(proc.name)
        for proc in Path("/proc").iterdir()
        if proc.name.isdigit() and looks_like_box_process(int(proc.name), home)
    ]


# ------------------------------------------------------------------ impyard serve


def test_serve_stopped_while_its_bot_logs_in_releases_its_lease_and_exits_0(tmp_path: Path) -> None:
    """The host took its lock, its shard's lease and its record, then its bot logs in (the fake Discord holds the
    login): SIGTERM now stops the start — the login is cut, the lease and the record released — and exits 0."""
    home = tmp_path / "home"
    with make_fake() as fake, FakeOpenAI() as model:
        prepare_home(home)
        env = serve_env(home, model, fake)
        fake.delay_next("GET", "/users/@me", HELD_S)  # the login: after the leases, before anything else
        log = tmp_path / "serve.log"
        with running(serve_args("0/1"), env, log) as child:
            until(lambda: cluster(env)["hosts"], log)  # its record: the leases are held, the login under way
            text = terminated(child, log)
    assert f"{DURING_START} serving; what started is closed" in text
    assert "stopped during start-up" in text
    assert "serving pip on Discord" not in text
    assert "Traceback" not in text
    nothing_held(env, child.pid)


def containers_of(home: Path) -> list[str]:
    """This home's Docker boxes still there (listed sparse: a container the engine removes meanwhile is not looked
    into, so the listing never trips over it); none where no engine runs."""
    if not shutil.which("docker"):
        return []
    try:
        client = DockerBackend(home_id=paths.home_id(home)).client()
    except BoxError:
        return []  # no engine here: no container either
    labels = [f"{LABEL_BOX}=1", f"{LABEL_HOME}={paths.home_id(home)}"]
    return [str(c.id) for c in client.containers.list(all=True, sparse=True, filters={"label": labels})]


def boxes_of(home: Path) -> list[str]:
    """This home's boxes still there: process-backend pids, and Docker containers."""
    return [f"pid {pid}" for pid in box_processes(home)] + [
        f"container {c[:12]}" for c in containers_of(home)
    ]


def remove_boxes(home: Path) -> None:
    for pid in box_processes(home):
        os.kill(pid, signal.SIGKILL)
    containers = containers_of(home)
    if containers:
        backend = DockerBackend(home_id=paths.home_id(home))
        for container in containers:
            backend.kill_by_name(container)
    until(lambda: not boxes_of(home))


def kill_mid_turn(
    home: Path, model: FakeOpenAI, fake: FakeDiscord, env: dict[str, str], backend: str, log: Path
) -> None:
    """A host of ``home`` killed (SIGKILL) while its box waits for the model: its message is left unanswered for
    the next host of the home to answer at start. The box it left behind is removed too."""
    with running(serve_args(None, backend), env, log) as child:
        wait_for_line(log, "serving pip on Discord")
        fake.post_message(EVEN_A, ALICE, "hello pip")
        until(lambda: model.requests, log)  # mid-turn: the model holds the box's request
        child.kill()
        child.wait(timeout=WAIT_S)
    remove_boxes(home)


@pytest.mark.parametrize("backend", ["process", "docker"])
def test_serve_stopped_while_its_bot_connects_closes_the_box_it_started(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """``serve --console --metrics-port 0``, stopped while its bot waits for Discord's server list (widened by
    ``IMPYARD_DISCORD_GUILD_READY_TIMEOUT``): by then the health server and the console listen, the runtime is
    open and a box answers the message the last run left unanswered (the model holds it). SIGTERM stops the start:
    that box is closed (a process, or a Docker container), the console and the health server too, nothing stays
    held, and it exits 0."""
    if backend == "docker":
        request.getfixturevalue("box_image")  # skips where no Docker engine runs
    home = tmp_path / "home"
    with make_fake() as fake, FakeOpenAI() as model:
        model.script(slow(envelope(answer="late"), HELD_S))  # every turn: the model holds it
        prepare_home(home)
        env = serve_env(home, model, fake)
        kill_mid_turn(home, model, fake, env, backend, tmp_path / "killed.log")
        slow_guilds = {**env, "IMPYARD_DISCORD_GUILD_READY_TIMEOUT": "60"}
        args = [*serve_args(None, backend), "--console", "--console-port", "0", "--metrics-port", "0"]
        log = tmp_path / "serve.log"
        identified = len(fake.identifies)
        with running(args, slow_guilds, log) as child:
            wait_for_line(log, "answering 1 message(s) left unanswered by the last run")
            until(lambda: boxes_of(home), log)  # the left message's turn has its box, started by this start
            until(lambda: len(fake.identifies) > identified, log)  # and the bot is waiting for its servers
            assert "serving pip on Discord" not in log.read_text()
            text = terminated(child, log)
    try:
        assert f"{DURING_START} serving; what started is closed" in text
        assert "impyard console: http://" in text and "metrics and health on http://" in text
        assert "serving pip on Discord" not in text
        assert "Traceback" not in text
        assert boxes_of(home) == [], text
        nothing_held(env, child.pid)
        db = open_database(url=f"sqlite:///{home / 'impyard.db'}")
        try:  # the cut-off turn's message is still to answer: the next start answers it
            wakes = db.read(lambda c: c.execute(sql("SELECT outcome FROM wakes")).scalars().all())
        finally:
            db.close()
        assert wakes == [None]
    finally:
        remove_boxes(home)


def test_a_second_sigterm_while_serve_stops_cuts_the_turn_off_and_exits_0(tmp_path: Path) -> None:
    """Once serving, the first SIGTERM gives the running turn its grace; a second one while it waits stops at once:
    the turn is cut off, its box closed, and ``serve`` exits 0 (the receiver stays in place until the end: before,
    it was gone after the first signal, and the second killed the process, its box left running)."""
    home = tmp_path / "home"
    with make_fake() as fake, FakeOpenAI() as model:
        model.script(slow(envelope(answer="late"), HELD_S))  # the model holds the turn past its grace
        prepare_home(home)
        env = serve_env(home, model, fake)
        log = tmp_path / "serve.log"
        with running(serve_args(None), env, log) as child:
            wait_for_line(log, "serving pip on Discord")
            fake.post_message(EVEN_A, ALICE, "hello pip")
            until(lambda: model.requests, log)  # the turn is under way, in its box
            child.send_signal(signal.SIGTERM)
            wait_for_line(log, "stopping: running turns get their grace")
            text = terminated(child, log)
    assert "SIGTERM again: stopping now (running turns are cut off, their boxes closed)" in text
    assert "Traceback" not in text
    assert box_processes(home) == []
    nothing_held(env, child.pid)


# ------------------------------------------------------------------ supervise and console


def libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def waiting_on_a_lock(url: str) -> bool:
    """Another connection of the database waits for a lock (a fresh connection each time: the statistics of
    ``pg_stat_activity`` hold still within a transaction)."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        ).fetchone()
    return bool(row and row[0])


def postgres_home(tmp_path: Path, url: str) -> tuple[Path, dict[str, str]]:
    """A home on ``url`` with pip, and the environment its commands run in (a model nobody answers)."""
    home = tmp_path / "home"
    prepare_home(home, url)
    env = {
        **os.environ, "IMPYARD_HOME": str(home), "IMPYARD_DATABASE_URL": url, "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
    }  # fmt: skip
    return home, env


def sigterm_while_locked(
    url: str, table: str, child: subprocess.Popen[bytes], said: Callable[[], bool], log: Path
) -> int:
    """Another connection holds ``table`` locked until the start waits on it in a database thread; SIGTERM then,
    and ``said`` (the stop's line) seen while the start still waits (the event loop is free); the lock let go,
    the exit status."""
    with psycopg.connect(libpq(url)) as lock:
        lock.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        until(lambda: waiting_on_a_lock(url) or child.poll() is not None, log)
        assert child.poll() is None, log.read_text()
        child.send_signal(signal.SIGTERM)
        until(lambda: said() or child.poll() is not None, log)
        assert child.poll() is None, (
            f"exit status {child.returncode} while the start waits:\n{log.read_text()}"
        )
        lock.rollback()  # the waiting statement ends: the stop goes on
    try:
        return child.wait(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running after SIGTERM:\n{log.read_text()}") from None


@pytest.mark.parametrize(
    ("command", "started"),
    [
        (["supervise", "--metrics-port", "0"], "supervising"),
        (["console", "--port", "0"], "serving the console"),
    ],
)
def test_a_start_waiting_for_the_database_is_stopped_by_sigterm_and_exits_0(
    tmp_path: Path, migrated_postgres_url: str, command: list[str], started: str
) -> None:
    """``impyard supervise`` (its health server already listening) and ``impyard console`` start by bringing
    the home's imps up to date with the database; another connection holds the imps' table locked, so that read
    waits, in a database thread. SIGTERM then stops the start at once (the line is logged while the read still
    waits: the event loop is free); once the read ends, what started is closed and the command exits 0, never
    having come up."""
    url = migrated_postgres_url
    _, env = postgres_home(tmp_path, url)
    log = tmp_path / f"{command[0]}.log"
    line = f"SIGTERM during start-up: stopping before {started}; what started is closed"
    with running([IMPYARD, *command], env, log) as child:
        status = sigterm_while_locked(url, "imp_settings", child, lambda: line in log.read_text(), log)
    text = log.read_text()
    assert status == 0, f"exit status {status}:\n{text}"
    assert "stopped during start-up" in text or command[0] == "console"  # its INFO lines are not shown
    assert "supervising" not in text.replace("before supervising", "")
    assert "open it in a browser" not in text
    assert "Traceback" not in text
    nothing_held(env, child.pid)


def test_a_chat_stopped_while_it_takes_its_lease_never_comes_up_and_exits_0(
    tmp_path: Path, migrated_postgres_url: str
) -> None:
    """``impyard chat`` takes its terminal channel's lease first; another connection holds the leases' table locked,
    so that waits in a database thread. SIGTERM then stops the start (before, the request was counted and the chat
    came all the way up before it stopped): it never says ``Chatting with``, holds nothing after, and exits 0."""
    url = migrated_postgres_url
    home, env = postgres_home(tmp_path, url)
    chat_log = home / "logs" / "chat.log"
    out = tmp_path / "chat.out"
    line = "stop requested during start-up: stopping before the chat starts; what started is closed"
    with running([IMPYARD, "chat", "pip", "--backend", "process"], env, out) as child:
        status = sigterm_while_locked(
            url, "leases", child, lambda: chat_log.is_file() and line in chat_log.read_text(), out
        )
    shown = out.read_text()
    assert status == 0, f"exit status {status}:\n{shown}"
    assert "Chatting with" not in shown
    assert "(impyard) stopping before the chat started" in shown
    assert "Traceback" not in shown + chat_log.read_text()
    nothing_held(env, child.pid)
