"""``impyard task``, ``impyard schedule`` and ``impyard supervise`` through the CLI (CliRunner and real processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from impyard.cli import cli
from impyard.clock import FixedClock, SystemClock
from impyard.imps.store import ImpStore
from impyard.paths import box_dir_name
from impyard.storage.db import open_database
from impyard.storage.instance import SUPERVISE_LOCK_FILENAME
from impyard.tasks import TaskRequest, TaskStore
from testing.fake_openai import FakeOpenAI, envelope
from tests import sqlfile

KEY = "sk-impyard-cli-tasks-SECRET-19fe"


pytestmark = pytest.mark.fake_model(key=KEY, env=True)


def run(*args: str) -> Result:
    return CliRunner(env={"COLUMNS": "200"}).invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def pip(impyard_home: Path) -> str:
    ImpStore().add("pip", box={"backend": "process"})
    return "pip"


def rows(table: str) -> int:
    db = open_database()
    try:
        return int(sqlfile.query(db, f"SELECT COUNT(*) FROM {table}")[0][0])
    finally:
        db.close()


def one_line_error(result: Result, *needles: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, result.output
    for needle in needles:
        assert needle in lines[0], result.output


# --- impyard task ---------------------------------------------------------------------------------------


def pip_home_state(task_id: str) -> Path:
    """Where a task of pip's has its own /state (issue 22), pruned after the retention."""
    return Path(os.environ["IMPYARD_HOME"]) / "imps" / "pip" / "state" / "tasks" / box_dir_name(task_id)


def test_task_add_ls_show_cancel(pip: str) -> None:
    added = run(
        "task",
        "add",
        "pip",
        "Summarise the week",
        "--channel",
        "123456789012345678",
        "--ceiling",
        "15m",
        "--json",
    )
    assert added.exit_code == 0, added.output
    task = json.loads(added.output)
    assert (task["state"], task["channel_id"], task["ceiling_s"], task["origin"]) == (
        "queued",
        "123456789012345678",
        900,
        "manual",
    )
    listing = run("task", "ls")
    assert task["id"] in listing.output and "queued" in listing.output and "due now" in listing.output
    shown = run("task", "show", task["id"])
    assert f"task {task['id']}: queued" in shown.output and "Summarise the week" in shown.output
    assert "audit trail: none yet" in shown.output
    state_dir = pip_home_state(task["id"])
    assert (
        f"state      {state_dir} (not there: pruned, or never made)   removed 7d after it finished"
        in shown.output
    )
    assert json.loads(run("task", "show", task["id"], "--json").output)["state_dir"] == str(state_dir)
    cancelled = run("task", "cancel", task["id"])
    assert cancelled.exit_code == 0 and f"cancelled {task['id']}" in cancelled.output
    one_line_error(run("task", "cancel", task["id"]), "already cancelled")
    assert json.loads(run("task", "ls", "--state", "cancelled", "--json").output)[0]["id"] == task["id"]
    assert json.loads(run("task", "ls", "--state", "queued", "--json").output) == []


def test_task_without_a_channel_posts_to_the_imps_task_log(pip: str) -> None:
    result = run("task", "add", "pip", "hello")
    assert result.exit_code == 0 and "channel task:pip, ceiling 10m" in result.output


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["nobody", "x"], ["no imp named 'nobody'", "imps here: pip"]),
        (["pip", "x", "--ceiling", "0"], ["ceiling of 0s is out of range", "10s to 6h"]),
        (["pip", "x", "--ceiling", "100d"], ["out of range"]),
        (["pip", "x", "--ceiling", "soonish"], ["is not a duration"]),
        (["pip", "p" * 8001], ["8001 characters", "at most 8000"]),
        (["pip"], ["needs its prompt text"]),
        (["pip", "x", "--channel", "two words"], ["not a channel id"]),
        (["pip", "x", "--kind", "Bad Kind"], ["task kind"]),
    ],
)
def test_task_add_refuses_bad_input_and_writes_nothing(pip: str, args: list[str], needles: list[str]) -> None:
    one_line_error(run("task", "add", *args), *needles)
    assert rows("tasks") == 0


def test_task_ls_shows_running_tasks_with_elapsed_time(pip: str) -> None:
    db = open_database()
    clock = FixedClock(SystemClock().now() - timedelta(minutes=2))
    store = TaskStore(db, clock)
    task = store.add(TaskRequest("pip", "long job"))
    store.claim(task.id, "run-1", "process")
    db.close()
    listing = run("task", "ls", "--imp", "pip")
    assert "running 2m" in listing.output
    [item] = json.loads(run("task", "ls", "--json").output)
    assert item["state"] == "running" and 119 < item["elapsed_s"] < 180
    asked = run("task", "cancel", task.id)
    assert "cancel requested" in asked.output
    assert "(cancelling)" in run("task", "ls").output


def test_task_show_and_cancel_of_an_unknown_task(pip: str) -> None:
    one_line_error(run("task", "show", "t-nope"), "no task 't-nope'", "impyard task ls")
    one_line_error(run("task", "cancel", "t-nope"), "no task 't-nope'")


# --- impyard schedule -------------------------------------------------------------------------------------


def test_schedule_add_ls_pause_resume_rm(pip: str) -> None:
    added = run("schedule", "add", "pip", "--cron", "0 9 * * 1-5", "--tz", "Europe/Oslo", "Post the summary",
                "--channel", "123456789012345678", "--json")  # fmt: skip
    assert added.exit_code == 0, added.output
    schedule = json.loads(added.output)
    assert (schedule["cron"], schedule["tz"], schedule["missed"], schedule["paused"]) == (
        "0 9 * * 1-5",
        "Europe/Oslo",
        "once",
        False,
    )
    listing = run("schedule", "ls")
    assert schedule["id"] in listing.output and "cron 0 9 * * 1-5 (Europe/Oslo)" in listing.output
    assert "Europe/Oslo (0" in listing.output  # next run in its own zone, with UTC beside it
    paused = run("schedule", "pause", schedule["id"])
    assert f"paused {schedule['id']}" in paused.output and "paused" in run("schedule", "ls").output
    resumed = run("schedule", "resume", schedule["id"])
    assert f"resumed {schedule['id']}" in resumed.output and "next run" in resumed.output
    every = run("schedule", "add", "pip", "--every", "24h", "--missed", "skip", "Check the changelog")
    assert every.exit_code == 0 and "every 1d" in every.output
    assert len(json.loads(run("schedule", "ls", "--json").output)) == 2
    assert run("schedule", "rm", schedule["id"]).exit_code == 0
    assert len(json.loads(run("schedule", "ls", "--json").output)) == 1
    one_line_error(run("schedule", "rm", schedule["id"]), f"no schedule '{schedule['id']}'")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["pip", "--cron", "0 9 * *", "x"], ["cron expression '0 9 * *' does not parse", "5 fields"]),
        (["pip", "--cron", "99 9 * * *", "x"], ["does not parse"]),
        (
            ["pip", "--cron", "0 9 * * *", "--tz", "Mars/Olympus", "x"],
            ["unknown timezone 'Mars/Olympus'", "Europe/Oslo"],
        ),
        (["pip", "--every", "24h", "--tz", "UTC", "x"], ["--tz applies to --cron schedules only"]),
        (["pip", "x"], ["exactly one of --every"]),
        (["pip", "--every", "5s", "x"], ["out of range"]),
        (["pip", "--every", "1h", "--ceiling", "0s", "x"], ["out of range"]),
        (["pip", "--every", "1h", "q" * 8001], ["at most 8000"]),
        (["ghost", "--every", "1h", "x"], ["no imp named 'ghost'"]),
    ],
)
def test_schedule_add_refuses_bad_input_and_writes_nothing(
    pip: str, args: list[str], needles: list[str]
) -> None:
    one_line_error(run("schedule", "add", *args), *needles)
    assert rows("schedules") == 0 and rows("tasks") == 0


# --- impyard supervise ------------------------------------------------------------------------------------


def test_supervise_once_runs_what_is_due_and_prints_posts_to_the_terminal(pip: str, fake: FakeOpenAI) -> None:
    fake.script(envelope(answer="Week 19: two releases, no incidents."), purpose="reply")
    task_id = json.loads(run("task", "add", "pip", "Summarise the week", "--json").output)["id"]
    result = CliRunner(env={"COLUMNS": "200"}).invoke(cli, ["supervise", "--once"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "[task:pip]" in result.output and "Week 19: two releases, no incidents." in result.output
    shown = run("task", "show", task_id)
    assert f"task {task_id}: done" in shown.output and "(attested by the host)" in shown.output
    assert (
        "model.request reply -> allowed" in shown.output and "discord.send other -> allowed" in shown.output
    )
    data = json.loads(run("task", "show", task_id, "--json").output)
    assert [r["method"] for r in data["audit"]] == ["model.request", "discord.send", "history.commit"]
    assert all(r["run_id"] == data["run_id"] for r in data["audit"]) and data["runs"][0]["result"] == "done"
    assert KEY not in json.dumps(data)


def test_supervise_needs_a_model_key(pip: str) -> None:
    one_line_error(run("supervise", "--once"), "no model key is configured", "OPENAI_API_KEY")


def test_a_second_supervise_refuses_with_the_holders_pid(
    pip: str, fake: FakeOpenAI, impyard_home: Path
) -> None:
    first = subprocess.Popen(
        [sys.executable, "-c", "from impyard.cli import main; main()", "supervise"],
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        lock = impyard_home / SUPERVISE_LOCK_FILENAME
        deadline = time.monotonic() + 30
        while not (lock.exists() and lock.read_text().startswith(str(first.pid))):
            assert first.poll() is None, first.stderr.read() if first.stderr else ""
            assert time.monotonic() < deadline, "the first supervisor never took its lock"
            time.sleep(0.05)
        second = run("supervise", "--once")
        one_line_error(second, f"another impyard supervise (pid {first.pid}) is already running")
        assert (
            run("task", "add", "pip", "still works while it runs").exit_code == 0
        )  # the CLI is not locked out
    finally:
        first.send_signal(signal.SIGTERM)  # a clean stop: running tasks finish or are requeued
        try:
            code = first.wait(timeout=30)
        finally:
            if first.poll() is None:
                first.kill()
    assert code == 0
