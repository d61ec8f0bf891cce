"""Issue 19 #4: leftovers after a crash — boxes swept at start, interrupted model calls settled at what they can cost.

Real parts: the process backend's box records, a planted Docker container (where an engine runs), the real
gateway and ledger over SQLite, the loopback fake OpenAI. Nothing here waits on the wall clock to decide.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from impyard.backends import BoxSpec
from impyard.backends.docker import DockerBackend, run_argv
from impyard.backends.process import ProcessBackend
from impyard.supervisor.orphans import leftovers
from impyard.testing.fake_openai import FakeOpenAI
from tests.test_supervisor import KEY, TRUSTED, alive, yard

pytestmark = pytest.mark.anyio


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(api_key=KEY) as server:
        yield server


# --- issue 19 #4a: the pure rule ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("boxes", "live", "swept"),
    [
        ([], set(), []),
        ([("a", "r1")], set(), ["a"]),  # its task finished, failed or was requeued: a leftover
        ([("a", "r1")], {"r1"}, []),  # a task running now owns it
        ([("a", "r1"), ("b", "r2"), ("c", "")], {"r2"}, ["a", "c"]),  # no run label at all: a leftover too
    ],
)
def test_every_box_no_running_task_owns_is_a_leftover(
    boxes: list[tuple[str, str]], live: set[str], swept: list[str]
) -> None:
    assert leftovers(boxes, live) == swept


# --- issue 19 #4a: planted leftovers ---------------------------------------------------------------------


def plant_process_box(state_dir: Path) -> subprocess.Popen[bytes]:
    """A process that is a box of the imp by every sign the host checks (its state dir, "box" in argv)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.environ.get("PATH", ""), "IMPYARD_STATE_DIR": str(state_dir)}
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", "box"], env=env, start_new_session=True
    )


@pytest.mark.parametrize("left_as", ["interrupted", "failed"])
async def test_a_process_box_whose_task_is_not_running_is_swept_at_start(
    fake: FakeOpenAI, left_as: str
) -> None:
    async with yard(fake, ProcessBackend(warn=False)) as y:
        task = y.add(channel_id=TRUSTED)
        claimed = y.supervisor.tasks.claim(task.id, "run-left-behind", "process")
        assert claimed is not None
        planted = plant_process_box(y.imps.state_dir("pip"))
        try:
            y.supervisor.tasks.record_pid("run-left-behind", planted.pid)
            if left_as == "interrupted":  # requeued, its box never killed (the supervisor died mid-stop)
                y.supervisor.tasks.interrupt(
                    task.id, "run-left-behind", "interrupted: the supervisor stopped"
                )
            else:  # the task ended, its box outlived it
                y.db.execute("UPDATE tasks SET state = 'failed' WHERE id = ?", (task.id,))
            assert y.task(task.id).state != "running"
            await y.supervisor.reclaim()
            await anyio.to_thread.run_sync(lambda: planted.wait(timeout=10))
            assert planted.returncode is not None and not alive(planted.pid)
        finally:
            if planted.poll() is None:
                planted.kill()
                planted.wait()


async def test_a_process_that_is_not_a_box_is_never_shot(fake: FakeOpenAI, tmp_path: Path) -> None:
    async with yard(fake, ProcessBackend(warn=False)) as y:
        task = y.add(channel_id=TRUSTED)
        y.supervisor.tasks.claim(task.id, "run-recycled", "process")
        stranger = plant_process_box(tmp_path / "someone-else")  # the pid was recycled by another program
        try:
            y.supervisor.tasks.record_pid("run-recycled", stranger.pid)
            y.db.execute("UPDATE tasks SET state = 'done' WHERE id = ?", (task.id,))
            await y.supervisor.reclaim()
            assert stranger.poll() is None
        finally:
            stranger.kill()
            stranger.wait()


async def test_a_labelled_task_box_of_a_finished_task_is_swept_at_start(
    fake: FakeOpenAI, box_image: str, docker_backend: DockerBackend, test_home_id: str
) -> None:
    backend = DockerBackend(box_image, home_id=test_home_id, role="task")
    async with yard(fake, backend) as y:
        task = y.add(channel_id=TRUSTED)
        y.db.execute("UPDATE tasks SET state = 'done' WHERE id = ?", (task.id,))  # long over
        user = "10001:10001" if os.getuid() == 0 else f"{os.getuid()}:{os.getgid()}"
        spec = BoxSpec("pip", TRUSTED, y.imps.state_dir("pip"), run_id="planted" + os.urandom(6).hex())
        backend.prepare_state_dir(spec.state_dir, user)
        argv = run_argv(spec, box_image, limits=backend.limits, home_id=test_home_id, role="task", user=user,
                        command=["python3", "-c", "import time; time.sleep(300)"])  # fmt: skip
        argv[argv.index("-i")] = "-d"
        await anyio.run_process(argv)
        assert [c.name for c in backend.labelled(run=spec.run_id)]
        assert await y.supervisor.reclaim() == []  # no task was running: only the sweep finds it
        assert backend.labelled(run=spec.run_id) == []
