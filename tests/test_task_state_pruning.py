"""Finished tasks' state dirs are pruned after the retention, and nothing else is ever touched.

The rule is a table (``should_remove``); the rest runs through the supervisor: real process boxes, the real
gateway, the fake OpenAI and a FixedClock that the test moves. A dir's own age is its mtime, set by the test.
"""

from __future__ import annotations

import logging
import os
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner

from impyard.cli import cli
from impyard.paths import box_dir_name
from impyard.supervisor import Supervisor, SupervisorSettings, pruning
from impyard.supervisor.pruning import TaskDir, should_remove
from impyard.supervisor.settings import (
    TASK_STATE_RETENTION_ENV,
    SettingsError,
    task_state_retention_from_env,
)
from impyard.tasks import Task
from testing.fake_openai import FakeOpenAI, envelope
from testing.inprocess import InProcessBackend
from tests.test_supervisor import KEY, T0, TRUSTED, UNTRUSTED, Yard, hanging_box, wait_until, yard

pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(key=KEY)]

RETENTION = timedelta(days=7)
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
FAST = SupervisorSettings(tick_s=0.05, shutdown_grace_s=0.2, prune_every_s=0.05)
TASK_ID = "t-0123456789"
DIR = box_dir_name(TASK_ID)


# --- the rule -------------------------------------------------------------------------------------------


def task_row(state: str, *, finished: timedelta | None = None, updated: timedelta | None = None,
             imp: str = "pip") -> Task:  # fmt: skip
    """A task row of ``state`` that finished ``finished`` before NOW (last changed ``updated`` before NOW)."""
    finished_at = NOW - finished if finished is not None else None
    updated_at = NOW - (updated if updated is not None else (finished or timedelta(0)))
    return Task(
        id=TASK_ID, imp=imp, kind="prompt", prompt="p", person=None, origin="manual", channel_id="task:pip",
        ceiling_s=600.0, wake_on_resolve=False, briefing=False, state=state,  # type: ignore[arg-type]
        attempts=1, deferrals=0, not_before=NOW - timedelta(days=60), cancel_requested=False, run_id="r-1",
        outcome=None, box_outcome=None, box_summary=None, schedule_id=None, scheduled_for=None,
        parent_task=None, parent_gate=None, created_at=NOW - timedelta(days=60), updated_at=updated_at,
        started_at=NOW - timedelta(days=60), finished_at=finished_at,
    )  # fmt: skip


def entry(name: str = DIR, *, idle: timedelta = timedelta(days=30), is_dir: bool = True) -> TaskDir:
    return TaskDir("pip", name, is_dir, NOW - idle)


OLD, RECENT, DAY = timedelta(days=8), timedelta(days=6), timedelta(days=1)


@pytest.mark.parametrize(
    ("entry", "task", "live", "removed"),
    [
        (entry(), task_row("done", finished=OLD), False, True),
        (entry(), task_row("failed", finished=OLD), False, True),
        (entry(), task_row("cancelled", finished=OLD), False, True),
        (entry(), task_row("done", finished=RECENT), False, False),  # finished within the retention
        (entry(), task_row("done", finished=RETENTION), False, False),  # exactly the retention: kept
        (entry(), task_row("done", finished=RETENTION + timedelta(seconds=1)), False, True),
        (entry(idle=RECENT), task_row("done", finished=OLD), False, False),  # its dir changed since
        (entry(), task_row("running", updated=timedelta(days=300)), False, False),  # untouched for months
        (entry(), task_row("queued", updated=timedelta(days=300)), False, False),  # untouched for months
        (entry(), task_row("needs_review", finished=timedelta(days=300)), False, False),  # awaits approval
        (entry(), task_row("failed", finished=OLD, updated=DAY), False, False),  # a review settled yesterday
        (entry(), task_row("done", finished=OLD), True, False),  # its run is still held by this process
        (entry(), task_row("done", finished=OLD, imp="bob"), False, False),  # another imp's task: not ours
        (entry(), None, False, True),  # no task row (a deleted task), old
        (entry(idle=RECENT), None, False, False),  # no task row, recent
        (entry("notes"), None, False, False),  # a name of another shape
        (entry("t-0123456789-0123456789ab"), None, False, False),  # the shape, but not a task id's own hash
        (entry(is_dir=False), None, False, False),  # a link (or a file) in a task dir's name
        (entry(is_dir=False), task_row("done", finished=OLD), False, False),
    ],
    ids=[
        "done-old", "failed-old", "cancelled-old", "done-recent", "done-at-retention", "done-just-past",
        "dir-changed-recently", "running", "queued", "awaiting-approval", "review-settled-recently", "live-run",
        "other-imp", "no-row-old", "no-row-recent", "foreign-name", "wrong-hash", "link", "link-done-old",
    ],
)  # fmt: skip
def test_which_task_dirs_go(entry: TaskDir, task: Task | None, live: bool, removed: bool) -> None:
    assert should_remove(entry, task, live=live, now=NOW, retention=RETENTION) is removed


# --- the setting ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "retention"),
    [("", timedelta(days=7)), ("36h", timedelta(hours=36)), ("30d", timedelta(days=30)), ("off", None),
     ("Never", None), ("3600", timedelta(hours=1))],
)  # fmt: skip
def test_the_operator_sets_the_retention(value: str, retention: timedelta | None) -> None:
    assert task_state_retention_from_env({TASK_STATE_RETENTION_ENV: value}) == retention


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("soon", "IMPYARD_TASK_STATE_RETENTION 'soon' is not a duration: write e.g."),
        ("-1d", "is not a duration"),
        ("0", "must be from 1h to 3650d (got 0s); write off to keep every task's state"),
        ("10m", "must be from 1h to 3650d (got 10m)"),
        ("4000d", "must be from 1h to 3650d (got 4000d)"),
    ],
)
def test_a_bad_retention_is_one_clear_error(value: str, says: str) -> None:
    with pytest.raises(SettingsError) as caught:
        task_state_retention_from_env({TASK_STATE_RETENTION_ENV: value})
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_the_settings_read_the_retention_and_check_an_explicit_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TASK_STATE_RETENTION_ENV, "2d")
    assert SupervisorSettings().task_state_retention == timedelta(days=2)
    monkeypatch.setenv(TASK_STATE_RETENTION_ENV, "off")
    assert SupervisorSettings().prunes is False
    monkeypatch.delenv(TASK_STATE_RETENTION_ENV)
    assert SupervisorSettings().task_state_retention == timedelta(days=7) and SupervisorSettings().prunes
    assert not SupervisorSettings(kinds=frozenset({"depart"})).prunes  # chat's and serve's departures loop
    assert not SupervisorSettings(kinds=frozenset({"sleep"}), imps=frozenset({"pip"})).prunes
    with pytest.raises(SettingsError, match="from 1h to 3650d"):
        SupervisorSettings(task_state_retention=timedelta(minutes=5))
    with pytest.raises(ValueError, match="prune_batch must be at least 1"):
        SupervisorSettings(prune_batch=0)


def test_supervise_refuses_a_bad_retention_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv(TASK_STATE_RETENTION_ENV, "a week")
    result = CliRunner().invoke(cli, ["supervise", "--once", "--backend", "process"])
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines() == [
        "Error: IMPYARD_TASK_STATE_RETENTION 'a week' is not a duration: write e.g. 90s, 10m, 1h30m, 24h or "
        "2d, or off to keep every task's state"
    ]


# --- through the supervisor -----------------------------------------------------------------------------


def age(path: Path, when: datetime) -> None:
    """Set ``path``'s own mtime (a link's own, never its target's)."""
    stamp = when.timestamp()
    os.utime(path, (stamp, stamp), follow_symlinks=False)


def tasks_dir(y: Yard, imp: str = "pip") -> Path:
    return y.imps.task_state_dir(imp, TASK_ID).parent


def old_dir(y: Yard, task_id: str, when: datetime, imp: str = "pip") -> Path:
    path = y.imps.task_state_dir(imp, task_id)
    path.mkdir(parents=True)
    (path / "memory-calls.jsonl").write_text("{}\n")
    age(path, when)
    return path


async def test_a_finished_tasks_state_goes_after_the_retention_and_not_before(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(TASK_STATE_RETENTION_ENV, raising=False)
    fake.script(envelope(answer="Daily summary: all quiet."), purpose="reply")
    async with yard(fake, InProcessBackend(), SupervisorSettings(tick_s=0.05)) as y:
        task = y.add(channel_id=TRUSTED)
        await y.supervisor.run(once=True)
        assert y.task(task.id).state == "done" and y.task(task.id).finished_at == T0
        state = y.imps.task_state_dir("pip", task.id)
        assert state.is_dir()  # its box's own /state
        age(state, T0)
        y.clock.advance(days=7)  # exactly the retention: kept
        await y.supervisor.run(once=True)
        assert state.is_dir()
        y.clock.advance(minutes=10)
        with caplog.at_level(logging.INFO, logger="impyard.supervisor"):
            await y.supervisor.run(once=True)
        assert not state.exists() and state.parent.is_dir()
        assert "pruned 1 task state dir(s) past the retention of 7d" in caplog.text
        assert y.task(task.id).state == "done"  # the task's row and its audit stay: only its scratch went


async def test_running_and_awaiting_approval_are_kept_at_any_age(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TASK_STATE_RETENTION_ENV, raising=False)
    fake.script(envelope(answer="Weekly digest."), purpose="reply")
    async with yard(fake, InProcessBackend(), SupervisorSettings(tick_s=0.05)) as y:
        gated, done = y.add(channel_id=UNTRUSTED), y.add(channel_id=TRUSTED)
        await y.supervisor.run(once=True)
        assert (y.task(gated.id).state, y.task(done.id).state) == ("needs_review", "done")
        hanging = y.add(channel_id=TRUSTED)
        # No gate pump: nobody expires the pending gate, so the task awaits its approval the whole month.
        loop = Supervisor(db=y.db, gateway=y.gateway, imps=y.imps, backend_for=lambda imp: hanging_box(),
                          clock=y.clock, settings=FAST, pump=None)  # fmt: skip
        dirs = {t.id: y.imps.task_state_dir("pip", t.id) for t in (gated, done, hanging)}
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: loop.run(stop=stop))

            async def running() -> bool:
                return y.task(hanging.id).state == "running" and dirs[hanging.id].is_dir()

            await wait_until(running)
            for path in dirs.values():
                age(path, T0 - timedelta(days=1))
            y.clock.advance(days=30)

            async def pruned() -> bool:
                return not dirs[done.id].exists()

            await wait_until(pruned)
            assert dirs[gated.id].is_dir() and dirs[hanging.id].is_dir()
            assert dirs[hanging.id].stat().st_mtime < T0.timestamp()  # kept for its state, not its age
            assert y.task(gated.id).state == "needs_review" and y.task(hanging.id).state == "running"
            stop.set()


async def test_links_foreign_names_and_other_dirs_are_never_touched(
    fake: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TASK_STATE_RETENTION_ENV, raising=False)
    outside = tmp_path / "outside"
    (outside / "bob-tasks" / "tasks" / box_dir_name("t-bob0000001")).mkdir(parents=True)
    (outside / "precious.txt").write_text("the host's own file")
    long_ago = T0 - timedelta(days=90)
    async with yard(fake, InProcessBackend(), SupervisorSettings(tick_s=0.05)) as y:
        root = tasks_dir(y)
        root.mkdir(parents=True)
        gone = old_dir(y, "t-gone000001", long_ago)  # no task row: a deleted task's dir
        (gone / "escape").symlink_to(outside)  # a link the box planted in its own dir
        (gone / "file-link").symlink_to(outside / "precious.txt")
        age(gone, long_ago)
        linked = root / box_dir_name("t-link000001")  # a task dir's name, but a link out
        linked.symlink_to(outside)
        fresh = old_dir(y, "t-fresh00001", T0 - timedelta(days=1))
        foreign = root / "notes"
        foreign.mkdir()
        age(foreign, long_ago)
        wrong_hash = root / "t-0123456789-0123456789ab"
        wrong_hash.mkdir()
        age(wrong_hash, long_ago)
        a_file = root / box_dir_name("t-file000001")
        a_file.write_text("not a dir")
        channel = y.imps.session_state_dir("pip", TRUSTED)
        channel.mkdir(parents=True)
        age(channel, long_ago)
        # Another imp whose state dir is a link out of the state root: never walked into.
        (y.imps.box_state_dir("bob").parent).mkdir(parents=True)
        y.imps.box_state_dir("bob").symlink_to(outside / "bob-tasks")
        for path in (*root.iterdir(), *(outside / "bob-tasks" / "tasks").iterdir()):
            age(path, long_ago)
        age(fresh, T0 - timedelta(days=1))  # no task row, but made yesterday
        await y.supervisor.run(once=True)
        assert not gone.exists()
        assert (outside / "precious.txt").read_text() == "the host's own file"  # nothing behind a link went
        assert (outside / "bob-tasks" / "tasks" / box_dir_name("t-bob0000001")).is_dir()
        assert linked.is_symlink() and (linked / "precious.txt").is_file()
        assert fresh.is_dir() and foreign.is_dir() and wrong_hash.is_dir() and a_file.is_file()
        assert channel.is_dir()


async def test_a_backlog_is_pruned_a_batch_a_pass_and_one_failure_stops_nothing(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(TASK_STATE_RETENTION_ENV, raising=False)
    stuck = box_dir_name("t-stuck00001")
    real_rmtree = shutil.rmtree

    def rmtree(path: str, *args: Any, **kwargs: Any) -> None:
        if path == stuck:
            raise PermissionError(13, "Permission denied", path)
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(pruning.shutil, "rmtree", rmtree)
    async with yard(fake, InProcessBackend(), SupervisorSettings(tick_s=0.05, prune_batch=2)) as y:
        long_ago = T0 - timedelta(days=30)
        backlog = [old_dir(y, f"t-backlog{n:03d}", long_ago + timedelta(minutes=n)) for n in range(5)]
        old_dir(y, "t-stuck00001", long_ago - timedelta(days=1))  # the oldest: first in every pass
        left = []
        with caplog.at_level(logging.INFO, logger="impyard.supervisor"):
            for _ in range(4):
                await y.supervisor.run(once=True)  # one tick, one pass (at once again while a backlog lasts)
                left.append(sum(path.exists() for path in backlog))
        assert left == [
            4,
            2,
            0,
            0,
        ]  # two a pass; the stuck one is tried once, then never blocks a batch again
        assert (tasks_dir(y) / stuck).is_dir()
        assert "could not remove" in caplog.text and "Permission denied" in caplog.text
        assert caplog.text.count("Permission denied") == 1
        assert "pruned 1 task state dir(s) past the retention of 7d; 1 could not be removed" in caplog.text


async def test_only_the_supervisor_of_every_kind_prunes_and_off_keeps_all(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TASK_STATE_RETENTION_ENV, "off")
    async with yard(fake, InProcessBackend(), SupervisorSettings(tick_s=0.05)) as y:
        kept = old_dir(y, "t-kept000001", T0 - timedelta(days=400))
        await y.supervisor.run(once=True)
        assert kept.is_dir()
        monkeypatch.delenv(TASK_STATE_RETENTION_ENV)
        departures = y.fresh_supervisor(InProcessBackend(), SupervisorSettings(kinds=frozenset({"depart"})))
        await departures.run(once=True)
        assert kept.is_dir()
        await y.fresh_supervisor(InProcessBackend(), SupervisorSettings()).run(once=True)
        assert not kept.exists()


async def test_the_state_root_is_where_pruning_looks(
    fake: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TASK_STATE_RETENTION_ENV, raising=False)
    (tmp_path / "disk").mkdir()
    (tmp_path / "boxes").symlink_to(tmp_path / "disk")  # a link above the state dirs is the operator's own
    monkeypatch.setenv("IMPYARD_STATE_ROOT", str(tmp_path / "boxes"))
    async with yard(fake, InProcessBackend(), SupervisorSettings(tick_s=0.05)) as y:
        gone = old_dir(y, "t-gone000001", T0 - timedelta(days=30))
        assert gone.is_relative_to(tmp_path / "boxes")
        home_side = y.imps.state_dir("pip") / "tasks" / box_dir_name("t-home000001")  # not under the root
        home_side.mkdir(parents=True)
        age(home_side, T0 - timedelta(days=30))
        await y.supervisor.run(once=True)
        assert not gone.exists() and home_side.is_dir()
