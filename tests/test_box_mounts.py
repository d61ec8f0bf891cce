"""No two running boxes share a writable file (issue 22, docs/box.md): each box gets its own /state, and a
backend refuses to start a box whose writable mount overlaps a running box's — with each backend (the process
backend, Docker under each runtime), across backends, and across host processes."""

from __future__ import annotations

import os
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from impyard.backends import BoxHost, BoxSpec, BoxStartError, RunningBox
from impyard.backends.mounts import CLAIMS_DIR, overlaps
from impyard.backends.process import ProcessBackend
from impyard.conversation.sessions import SessionKey, SessionSettings
from impyard.imps.store import ImpStore
from impyard.paths import box_dir_name
from tests.scripted import ScriptedHost, init_params
from tests.test_sessions import Plan, Recorder, delivery

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("a", "b", "shared"),
    [
        ("/h/imps/pip/state/channels/c1", "/h/imps/pip/state/channels/c1", True),  # the same directory
        ("/h/imps/pip/state/channels/c1", "/h/imps/pip/state/channels/c1/sub", True),  # one inside the other
        ("/h/imps/pip/state", "/h/imps/pip/state/channels/c1", True),  # an old imp-wide mount holds it
        ("/h/imps/pip/state/channels/c1", "/h/imps/pip/state/channels/c2", False),  # siblings
        ("/h/imps/pip/state/channels/c1", "/h/imps/pip/state/channels/c10", False),  # a prefix, not a parent
        ("/h/imps/pip/state/channels/c1", "/h/imps/pip/state/tasks/t1", False),
    ],
)
def test_which_mounts_overlap(a: str, b: str, shared: bool) -> None:
    assert overlaps(Path(a), Path(b)) is shared and overlaps(Path(b), Path(a)) is shared


def test_each_box_of_an_imp_gets_its_own_state_dir() -> None:
    """Per imp and channel for chat sessions, per task for tasks; none inside another."""
    store = ImpStore()
    dirs = [
        store.session_state_dir("pip", "discord:1"),
        store.session_state_dir("pip", "discord-1"),  # cleans to the same text: still its own dir
        store.session_state_dir("pip", "terminal:alice"),
        store.session_state_dir("pix", "discord:1"),  # the same channel, another imp
        store.task_state_dir("pip", "t-1"),
        store.task_state_dir("pip", "discord:1"),  # a task named like a channel
    ]
    assert len(set(dirs)) == len(dirs)
    assert not [(a, b) for a in dirs for b in dirs if a is not b and overlaps(a, b)]
    assert all(path.is_relative_to(store.state_dir(path.parts[-4])) for path in dirs)  # box-writable area
    assert box_dir_name("discord:1") != box_dir_name("discord-1")


async def test_the_backend_refuses_a_box_whose_state_overlaps_a_running_boxs(
    tmp_path: Path, backend: Any
) -> None:
    state = tmp_path / "state"
    first = BoxSpec("pip", "c1", state / "c1")
    async with backend.open(first, ScriptedHost()) as running:
        await running.init(init_params(), timeout=60)
        for path in (state / "c1", state / "c1" / "sub", state):
            with pytest.raises(BoxStartError, match="overlaps the writable mount of the running box pip/c1"):
                async with backend.open(BoxSpec("pip", "c2", path), ScriptedHost()):
                    pytest.fail("a box started on a writable mount another box holds")
            with pytest.raises(BoxStartError, match="overlaps"):  # whichever backend asks
                async with ProcessBackend(warn=False).open(BoxSpec("pip", "c2", path), ScriptedHost()):
                    pytest.fail("a box started on a writable mount another box holds")
        assert not (state / "c1" / "sub").exists()  # refused before anything touched its state dir
        async with backend.open(BoxSpec("pip", "c2", state / "c2"), ScriptedHost()) as beside:
            await beside.init(init_params(channel_id="c2"), timeout=60)  # its own dir: it starts
    async with backend.open(
        BoxSpec("pip", "c1", state / "c1", run_id=f"again-{uuid.uuid4().hex[:6]}"), ScriptedHost()
    ) as later:
        await later.init(init_params(), timeout=60)  # the first box is gone: its mount is free again
    assert list((tmp_path / "home" / CLAIMS_DIR).glob("*.claim")) == []  # every claim let go


HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from impyard.backends.base import BoxSpec
    from impyard.backends.mounts import MountClaim
    claim = MountClaim.take(BoxSpec("pip", "c1", Path(sys.argv[1]), run_id="other-host"))
    print("held", flush=True)
    time.sleep(600)
    """
)


async def test_a_running_box_of_another_host_process_is_seen_and_a_dead_ones_claim_is_not(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state" / "c1"
    holder = await anyio.open_process([sys.executable, "-c", HOLDER, str(state)], env=dict(os.environ))
    try:
        assert holder.stdout is not None
        with anyio.fail_after(30):
            assert (await holder.stdout.receive()).strip() == b"held"
        with pytest.raises(BoxStartError, match=f"host pid {holder.pid}"):
            async with ProcessBackend(warn=False).open(BoxSpec("pip", "c1", state), ScriptedHost()):
                pytest.fail("a box started beside another host process's box on the same /state")
    finally:
        holder.kill()
        await holder.wait()
        await holder.aclose()
    # The other host died without letting go: the kernel dropped its lock, so its claim no longer counts.
    async with ProcessBackend(warn=False).open(BoxSpec("pip", "c1", state), ScriptedHost()) as running:
        await running.init(init_params(), timeout=60)
    assert list((tmp_path / "home" / CLAIMS_DIR).glob("*.claim")) == []


class SlowToClose:
    """A backend whose box still holds its /state for a while after its session let go of it (a slow
    shutdown, a container being removed)."""

    name = "process"

    def __init__(self) -> None:
        self.inner = ProcessBackend(warn=False)
        self.closing = anyio.Event()

    @asynccontextmanager
    async def open(self, spec: BoxSpec, host: BoxHost) -> AsyncIterator[RunningBox]:
        async with self.inner.open(spec, host) as running:
            yield running
            self.closing.set()
            await anyio.sleep(0.5)


async def test_a_session_waits_for_the_previous_box_of_its_channel_to_let_go(tmp_path: Path) -> None:
    """The next message of a channel whose box is still closing starts a new session: its box must wait for
    the old one's /state, not be refused (the session manager keys sessions by imp and channel)."""
    from impyard.conversation.sessions import SessionManager

    backend = SlowToClose()
    plan = Plan(backend, tmp_path, SessionSettings(idle_s=0.05))  # type: ignore[arg-type]
    host, recorder = ScriptedHost(), Recorder()
    async with SessionManager(plan=plan, host=host, events=recorder) as sessions:
        sessions.deliver(delivery(1))
        await recorder.until(lambda: len(recorder.answered()) == 1)
        with anyio.fail_after(20):
            await backend.closing.wait()  # idle: the first box is on its way out, its /state still held
        sessions.deliver(delivery(2))
        await recorder.until(lambda: len(recorder.answered()) == 2)
        assert sessions.boxes_started == 2
    assert [result.outcome for _, result in recorder.outcomes] == ["sent", "sent"]
    assert plan.state_dir_for(SessionKey("pip", "c1")) == tmp_path / "pip" / "state" / "c1"
