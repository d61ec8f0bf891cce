"""The in-process box backend: the real box program (``box.program.serve``) in the host's own process and
event loop, on in-memory streams, behind the same ``RunningBox`` as the process and Docker backends.

For the tests and the benchmark, never for real use: it has no lockdown at all, and no process boundary (no
pid, no environment of its own, no crash of its own, no resource limits). What crosses the streams is still
the real box protocol, spoken by the real peers on both sides, and a box still gets its own state dir under
the state root. Starting one costs no interpreter and no import of ``box.program`` per box: a test that is
not about the process boundary uses it (the process backend's own tests keep ``ProcessBackend``).

``seams`` go to the box program, as a test injects them (``sleep``, ``memory``, ``tools``: see ``BoxProgram``).
"""

from __future__ import annotations

import os
import signal
import traceback
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import Process

from impyard.backends.base import BoxHost, BoxSpec, RunningBox, supervise_process
from impyard.backends.mounts import claimed_mount
from impyard.backends.statedir import mark_foreign_writer
from impyard.backends.stateroot import StateRoot, state_root
from testing.pipes import MemoryByteReceive, MemoryByteSend, byte_pipe

KILLED = -signal.SIGKILL  # the exit code a killed box reports, as a killed child process's would
CRASHED = 1  # the box program raised: what ``python -m box`` exits with on an uncaught exception


class InProcessBox(Process):
    """The box program as a task of the host's event loop, seen as a process: its stdio in-memory streams, its
    exit code the program's end (0 when it returned, ``CRASHED`` when it raised, ``KILLED`` when cancelled)."""

    def __init__(self, state_dir: Path, seams: dict[str, Any]) -> None:
        self.state_dir = state_dir
        self.seams = seams
        self._stdin, self._box_in = byte_pipe()
        self._box_out, self._stdout = byte_pipe()
        self._box_err, self._stderr = byte_pipe()
        self._scope = anyio.CancelScope()
        self._returncode: int | None = None
        self._killed = False
        self._ended = anyio.Event()

    async def run(self) -> None:
        """The box program until it ends; an exception it raises is its crash (a traceback on its stderr),
        never the host's."""
        with self._scope:
            try:
                from box.program import serve  # the program's import is paid once per host, not per box

                await serve(self._box_in, self._box_out, self.state_dir, **self.seams)
                self._returncode = 0
            except Exception:  # noqa: BLE001 - a box's crash is its exit code and stderr, as a process's is
                if not self._killed:  # what a killed program raises on its closed pipes is no crash
                    self._returncode = CRASHED
                    await self._write_stderr(traceback.format_exc())
        if self._killed or self._returncode is None:
            self._returncode = KILLED
        self._close_box_ends()
        self._ended.set()

    def _close_box_ends(self) -> None:
        for stream in (self._box_out, self._box_err, self._box_in):
            stream.close()

    async def _write_stderr(self, text: str) -> None:
        try:
            await self._box_err.send(text.encode(errors="replace"))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass

    async def wait(self) -> int:
        await self._ended.wait()
        assert self._returncode is not None
        return self._returncode

    def terminate(self) -> None:
        self.kill()

    def kill(self) -> None:
        """As SIGKILL: the program is cancelled and its pipes close at once, so nothing it still awaits (a
        shielded cleanup, a request to the host) can keep it alive."""
        if self._returncode is None:
            self._killed = True
        self._scope.cancel()
        self._close_box_ends()

    def send_signal(self, signal: signal.Signals) -> None:
        self.kill()

    @property
    def pid(self) -> int:
        raise NotImplementedError("an in-process box has no process of its own")

    @property
    def returncode(self) -> int | None:
        return self._returncode

    @property
    def stdin(self) -> MemoryByteSend:
        return self._stdin

    @property
    def stdout(self) -> MemoryByteReceive:
        return self._stdout

    @property
    def stderr(self) -> MemoryByteReceive:
        return self._stderr

    async def aclose(self) -> None:
        self.kill()
        for stream in (self._stdin, self._stdout, self._stderr):
            stream.close()


class InProcessBackend:
    """A ``BoxBackend`` whose boxes run in this process (see the module's docstring)."""

    name = "in-process"

    def __init__(self, *, state_root: StateRoot | None = None, **seams: Any) -> None:
        """``state_root``: as the process backend's (None: ``IMPYARD_STATE_ROOT``, else IMPYARD_HOME/imps)."""
        self.state_root = state_root
        self.seams = seams

    @asynccontextmanager
    async def open(self, spec: BoxSpec, host: BoxHost) -> AsyncIterator[RunningBox]:
        state_dir = (self.state_root or state_root()).volume(spec.state_dir).path
        async with claimed_mount(spec, mount=state_dir):
            await anyio.Path(state_dir).mkdir(parents=True, exist_ok=True)
            if os.getuid() == 0:
                mark_foreign_writer(state_dir)  # as the process backend's: a later Docker box repairs once
            box = InProcessBox(state_dir, self.seams)

            async def terminate() -> None:
                box.kill()

            async with anyio.create_task_group() as tg:
                tg.start_soon(box.run, name=f"in-process box {spec.imp}/{spec.channel_id}")
                try:
                    async with supervise_process(spec, box, host, terminate) as running:
                        yield running
                finally:
                    box.kill()
