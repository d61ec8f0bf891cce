"""The process backend: ``python -m box`` as a plain child process. No lockdown at all.

For development and tests where Docker is absent. It warns loudly, and it still
keeps the box away from the host's secrets: the child gets a minimal
environment, never the host's (no model key, no Discord token).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio

import box
from impyard.backends.base import BoxHost, BoxSpec, RunningBox, kill_process, supervise_process
from impyard.backends.mounts import claimed_mount
from impyard.backends.statedir import mark_foreign_writer
from impyard.backends.stateroot import StateRoot, state_root

log = logging.getLogger("impyard.box")

NO_LOCKDOWN_WARNING = (
    "PROCESS BACKEND: boxes run as plain processes with NO lockdown (network, files and the host are reachable). "
    "Use it for development only; install Docker and run `impyard box build` for real use."
)

_PASSED_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "IMPYARD_BOX_LOG_LEVEL")


BOX_SOURCE_ROOT = str(Path(box.__file__).resolve().parent.parent)
# ``python -I`` ignores the working directory, PYTHONPATH, PYTHON* variables and the user's site-packages
# (under HOME, which is the state dir): nothing a box writes under /state can change which program the
# next box runs. The box package is put on the path explicitly, ahead of everything else.
_BOOTSTRAP = "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); runpy.run_module('box', run_name='__main__', alter_sys=True)"
BOX_WORKDIR = "/"  # a fixed working directory the box cannot write (never the state dir)


def box_command() -> list[str]:
    """``python -m box``, isolated from everything under the state dir."""
    return [sys.executable, "-I", "-c", _BOOTSTRAP, BOX_SOURCE_ROOT]


def box_environment(state_dir: Path) -> dict[str, str]:
    """The whole environment of a process box: no secrets, only what Python needs."""
    env = {name: os.environ[name] for name in _PASSED_ENV if name in os.environ}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["IMPYARD_STATE_DIR"] = str(state_dir)
    env["HOME"] = str(state_dir)
    return env


class ProcessBackend:
    name = "process"

    def __init__(
        self, *, command: list[str] | None = None, warn: bool = True, state_root: StateRoot | None = None
    ) -> None:
        """``state_root``: under which every box's state dir must lie (None: ``IMPYARD_STATE_ROOT``, read at
        each start, else IMPYARD_HOME/imps)."""
        self.command = command or box_command()
        self._warned = not warn
        self.state_root = state_root

    @property
    def lockdown(self) -> tuple[object, ...]:
        """What its boxes are (their command and state root): two backends with the same lockdown start the same
        box (issue 37, ``impyard.conversation.spares.same_lockdown``)."""
        return ("process", tuple(self.command), self.state_root)

    @asynccontextmanager
    async def open(self, spec: BoxSpec, host: BoxHost) -> AsyncIterator[RunningBox]:
        if not self._warned:
            log.warning(NO_LOCKDOWN_WARNING)
            self._warned = True
        state_dir = (self.state_root or state_root()).volume(spec.state_dir).path  # issue 21: under the root
        async with claimed_mount(spec, mount=state_dir):  # issue 22: never beside a box whose /state overlaps
            state_dir.mkdir(parents=True, exist_ok=True)
            if os.getuid() == 0:
                mark_foreign_writer(
                    state_dir
                )  # root-owned files may follow: the next Docker box repairs once
            # Its own session: a Ctrl-C meant for the host never reaches the box (the host's shutdown
            # gives running turns their deadline, then closes the box).
            process = await anyio.open_process(
                self.command, env=box_environment(state_dir), cwd=BOX_WORKDIR, start_new_session=True
            )

            async def terminate() -> None:
                kill_process(process)

            async with supervise_process(spec, process, host, terminate) as running:
                yield running
