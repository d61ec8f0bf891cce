"""The in-process box backend (``testing/inprocess.py``) that most tests run their boxes on: it must end a box as
the process backend does — a clean exit 0 after ``box.shutdown``, a crash as exit code 1 with its traceback on
stderr, a kill as SIGKILL's -9 with every pending request failing as ``BoxDied`` — or the tests that use it
would show what a real box never does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from impyard.backends import BoxDied, BoxSpec
from testing.inprocess import CRASHED, KILLED, InProcessBackend
from tests.scripted import ScriptedHost, deliver_params, init_params

pytestmark = pytest.mark.anyio


def spec(tmp_path: Path) -> BoxSpec:
    return BoxSpec(imp="pip", channel_id="c1", state_dir=tmp_path / "state")


async def test_a_box_answers_a_turn_and_exits_0_after_shutdown(tmp_path: Path) -> None:
    host = ScriptedHost()
    async with InProcessBackend().open(spec(tmp_path), host) as running:
        await running.init(init_params())
        result = await running.deliver(deliver_params("hi"), timeout=30)
        assert running.host_pid is None  # no process of its own for anyone to signal
    assert result.outcome == "sent" and [sent.content for sent in host.sent] == ["hello"]  # type: ignore[attr-defined]
    assert running.returncode == 0 and running.violation is None


async def test_a_box_program_that_raises_is_a_crash_with_its_traceback_not_the_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*args: Any, **seams: Any) -> None:
        raise RuntimeError("the box program broke")

    monkeypatch.setattr("box.program.serve", broken)
    async with InProcessBackend().open(spec(tmp_path), ScriptedHost()) as running:
        with pytest.raises(BoxDied) as died:
            await running.init(init_params(), timeout=10)
    assert running.returncode == CRASHED
    assert "exit code 1" in str(died.value) and "RuntimeError: the box program broke" in str(died.value)


async def test_a_killed_box_fails_its_pending_request_and_reports_sigkill(tmp_path: Path) -> None:
    host = ScriptedHost(hold=anyio.Event())  # the turn waits on its model call: in flight when killed
    async with InProcessBackend().open(spec(tmp_path), host) as running:
        await running.init(init_params())
        async with anyio.create_task_group() as tg:

            async def kill_in_flight() -> None:
                with anyio.fail_after(10):
                    while host.model_calls == 0:
                        await anyio.sleep(0.01)
                running.process.kill()

            tg.start_soon(kill_in_flight)
            with pytest.raises(BoxDied) as died:
                await running.deliver(deliver_params("hi"), timeout=30)
    assert running.returncode == KILLED and f"exit code {KILLED}" in str(died.value)
    assert host.sent == []


async def test_two_boxes_may_not_share_a_state_dir(tmp_path: Path) -> None:
    """Issue 22, as the other backends: the second box's mount overlaps the first's and is refused."""
    from impyard.backends import BoxStartError

    backend = InProcessBackend()
    async with backend.open(spec(tmp_path), ScriptedHost()):
        with pytest.raises(BoxStartError):
            async with backend.open(BoxSpec("pip", "c2", tmp_path / "state"), ScriptedHost()):
                pass
