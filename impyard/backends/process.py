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

log = logging.getLogger("impyard.box")

NO_LOCKDOWN_WARNING = (
    "PROCESS BACKEND: boxes run as plain processes with NO lockdown (network, files and the host are reachable). "
    "Use it for development only; install Docker and run `impyard box build` for real use."
)

_PASSED_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "IMPYARD_BOX_LOG_LEVEL")


def box_environment(state_dir: Path) -> dict[str, str]:
    """The whole environment of a process box: no secrets, only what Python needs."""
    env = {name: os.environ[name] for name in _PASSED_ENV if name in os.environ}
    env["PYTHONPATH"] = str(Path(box.__file__).resolve().parent.parent)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["IMPYARD_STATE_DIR"] = str(state_dir)
    env["HOME"] = str(state_dir)
    return env


class ProcessBackend:
    name = "process"

    def __init__(self, *, command: list[str] | None = None, warn: bool = True) -> None:
        self.command = command or [sys.executable, "-m", "box"]
        self._warned = not warn

    @asynccontextmanager
    async def open(self, spec: BoxSpec, host: BoxHost) -> AsyncIterator[RunningBox]:
        if not self._warned:
            log.warning(NO_LOCKDOWN_WARNING)
            self._warned = True
        spec.state_dir.mkdir(parents=True, exist_ok=True)
        process = await anyio.open_process(self.command, env=box_environment(spec.state_dir), cwd=spec.state_dir)

        async def terminate() -> None:
            kill_process(process)

        async with supervise_process(spec, process, host, terminate) as running:
            yield running
