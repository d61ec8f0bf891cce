"""Boxes a dead supervisor left behind: found by what the host knows of them, and removed.

A process box is recognised by its environment (Linux ``/proc``: the imp's state dir) before it is
killed, so a recycled pid is never shot; a Docker box by its run label.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import anyio

from impyard.backends import BoxError
from impyard.backends.docker import DockerBackend
from impyard.imps import ImpError
from impyard.supervisor.backends import BackendFor
from impyard.tasks import Task

log = logging.getLogger("impyard.supervisor")


def looks_like_box_process(pid: int, state_dir: Path) -> bool:
    """A process backend box of this imp: its environment names the imp's state dir (Linux /proc)."""
    proc = Path(f"/proc/{pid}")
    try:
        environ = (proc / "environ").read_bytes().split(b"\0")
        cmdline = (proc / "cmdline").read_bytes()
    except OSError:
        return False
    named = {f"IMPYARD_STATE_DIR={path}".encode() for path in (state_dir, state_dir.resolve())}
    return not named.isdisjoint(environ) and b"box" in cmdline


async def remove_orphan_box(
    task: Task, box_pid: int | None, state_dir: Path, backend_for: BackendFor
) -> None:
    """Kill what is left of ``task``'s last run: its process box (by pid, if it still is one) or its containers."""
    if box_pid is not None and looks_like_box_process(box_pid, state_dir):
        try:
            os.kill(box_pid, signal.SIGKILL)
            log.warning("killed orphaned box process %d of task %s", box_pid, task.id)
        except ProcessLookupError:
            pass
    if not task.run_id:
        return
    try:
        backend = await anyio.to_thread.run_sync(backend_for, task.imp)
    except (ImpError, BoxError) as exc:
        log.info("task %s: no backend to look for its box in (%s)", task.id, exc)
        return
    if isinstance(backend, DockerBackend):
        try:
            containers = await anyio.to_thread.run_sync(lambda: backend.labelled(run=task.run_id or ""))
            for container in containers:
                if container.name is None:
                    continue
                await anyio.to_thread.run_sync(backend.kill_by_name, container.name)
                log.warning("removed orphaned box %s of task %s", container.name, task.id)
        except Exception as exc:  # noqa: BLE001 - reclaim goes on; the box is reported
            log.error("could not remove the box of task %s (run %s): %s", task.id, task.run_id, exc)
