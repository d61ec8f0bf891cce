"""Issue 19 #4: leftovers after a crash — boxes swept at start, interrupted model calls settled at what they can cost.

Real parts: the process backend's box records, a planted Docker container (where an engine runs), the real
gateway and ledger over SQLite, the loopback fake OpenAI. Nothing here waits on the wall clock to decide.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from box.protocol import ErrorCode, RpcError
from box.protocol.models import ModelRequestParams
from impyard.backends import BoxSpec
from impyard.backends.docker import DockerBackend, run_argv
from impyard.backends.process import ProcessBackend
from impyard.storage.db import open_database
from impyard.supervisor.orphans import leftovers, looks_like_box_process
from testing.fake_openai import FakeOpenAI, envelope, slow
from tests import sqlfile
from tests.test_gateway import CHAT_BODY, Harness, make_harness
from tests.test_gateway import KEY as GATEWAY_KEY
from tests.test_supervisor import KEY, TRUSTED, alive, yard

pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(key=KEY)]


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
    planted = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", "box"], env=env, start_new_session=True
    )
    # Until the child has exec'd, /proc shows the forked test process, no box: on a busy machine a check could
    # run in between. Wait (without a clock of its own: a deadline only against a hang) for the box's signs.
    deadline = time.monotonic() + 60
    while not looks_like_box_process(planted.pid, state_dir):
        if planted.poll() is not None or time.monotonic() > deadline:
            planted.kill()
            raise AssertionError(f"the planted box {planted.pid} never showed a box's signs")
        time.sleep(0.01)
    return planted


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
                sqlfile.execute(y.db, "UPDATE tasks SET state = 'failed' WHERE id = ?", (task.id,))
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
            sqlfile.execute(y.db, "UPDATE tasks SET state = 'done' WHERE id = ?", (task.id,))
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
        sqlfile.execute(y.db, "UPDATE tasks SET state = 'done' WHERE id = ?", (task.id,))  # long over
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


# --- issue 19 #4b: model calls in flight when their box, or their host, goes away ------------------------

USAGE = {"prompt_tokens": 300, "completion_tokens": 20}


@pytest.fixture
def upstream() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(api_key=GATEWAY_KEY) as server:
        yield server


def _model_params() -> ModelRequestParams:
    return ModelRequestParams(path="/chat/completions", body=CHAT_BODY, purpose="reply")


def _model_rows(h: Harness) -> list[dict[str, Any]]:
    return [row for row in h.audit() if row["method"] == "model.request"]


async def _answered_normally(tmp_path: Path, fake: FakeOpenAI) -> int:
    """What the same call costs when its box waits for the answer: the measured charge to compare against."""
    h = make_harness(tmp_path / "baseline", fake)
    try:
        fake.script(envelope(), purpose="reply", usage=USAGE)
        await h.call("model.request", _model_params())
        return h.spent()
    finally:
        await h.gateway.aclose()
        h.db.close()
        fake.clear()
        fake.clear_rules()  # the next call is answered by its own rule (``clear`` keeps rules: this one would win)


async def test_a_call_whose_box_died_mid_call_is_finished_and_charged_what_it_cost(
    tmp_path: Path, upstream: FakeOpenAI
) -> None:
    measured = await _answered_normally(tmp_path, upstream)
    h = make_harness(tmp_path, upstream)
    upstream.script(slow(envelope(), 0.5), purpose="reply", usage=USAGE)
    async with h.gateway.running():
        with anyio.CancelScope() as box:  # the box's request handler: the box dies while the model answers
            async with anyio.create_task_group() as tg:
                tg.start_soon(h.call, "model.request", _model_params())
                await anyio.to_thread.run_sync(upstream.wait_for_requests, 1)
                box.cancel()
        assert _model_rows(h) == []  # not audited yet: the call is still running for it
        with anyio.fail_after(10):
            while h.gateway.ledger.summary()[0].reserved:
                await anyio.sleep(0.02)
    assert measured > 0 and h.spent() == measured  # the upstream's usage, not the reservation
    [row] = _model_rows(h)
    assert (row["verdict"], row["cost_micros"]) == ("allowed", measured)
    assert "the box ended before the answer came" in row["detail"]
    await h.gateway.aclose()
    h.db.close()


async def test_a_call_cut_by_the_host_stopping_is_charged_its_reservation_and_says_why(
    tmp_path: Path, upstream: FakeOpenAI
) -> None:
    h = make_harness(tmp_path, upstream)
    upstream.script(slow(envelope(), 30.0), purpose="reply", usage=USAGE)
    errors: list[RpcError] = []

    async def box_request() -> None:
        try:
            await h.call("model.request", _model_params())
        except RpcError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        async with h.gateway.running(grace_s=0.2):
            tg.start_soon(box_request)
            await anyio.to_thread.run_sync(upstream.wait_for_requests, 1)
    [reserved] = [row["reserved_micros"] for row in sqlfile.query(h.db, "SELECT reserved_micros FROM ledger")]
    assert h.spent() == reserved > 0  # it reached the model API, which may bill it: fail closed
    [row] = _model_rows(h)
    assert (row["verdict"], row["cost_micros"]) == ("interrupted", reserved)
    assert "the host stopped before the model answered" in row["reason"]
    [error_] = errors
    assert error_.code == ErrorCode.UPSTREAM_UNREACHABLE and "interrupted" in error_.message
    await h.gateway.aclose()
    h.db.close()


RESERVE_AND_HANG = """
import sys, time
from impyard.clock import SystemClock
from impyard.storage.db import open_database
from impyard.gateway.ledger import Ledger
from impyard.gateway.policy import load_policy
db = open_database(sys.argv[1])
Ledger(db, load_policy(), SystemClock()).reserve("pip", 4321, method="model.request", purpose="reply", model="m-1")
print("reserved", flush=True)
time.sleep(300)
"""


def _killed_mid_call(path: Path) -> int:
    host = subprocess.Popen([sys.executable, "-c", RESERVE_AND_HANG, str(path)], stdout=subprocess.PIPE)
    try:
        assert host.stdout is not None and host.stdout.readline() == b"reserved\n"
    finally:
        host.kill()  # SIGKILL: no finally, no settle
        host.wait()
    return host.pid


async def test_a_call_in_flight_when_its_host_was_killed_is_settled_at_the_next_start(
    tmp_path: Path, upstream: FakeOpenAI
) -> None:
    """kill -9 of the host mid-call: the next host settles it at once (not an hour later), with an audit row."""
    path = tmp_path / "impyard.db"
    open_database(path).close()
    pid = _killed_mid_call(path)
    h = make_harness(tmp_path, upstream)  # the next host starts over the same database
    assert h.gateway.ledger.summary()[0].reserved == 0
    assert h.spent() == 4321
    [row] = _model_rows(h)
    assert (row["imp"], row["verdict"], row["purpose"], row["cost_micros"]) == (
        "pip",
        "interrupted",
        "reply",
        4321,
    )
    assert f"(pid {pid})" in row["reason"] and "model=m-1" in row["detail"]
    await h.gateway.aclose()
    h.db.close()
