"""Boxes a dead supervisor left behind: found by what the host knows of them, and removed.

A process box is recognised by its environment (Linux ``/proc``: the imp's state dir) before it is
killed, so a recycled pid is never shot; a Docker box by its run label. At start the supervisor of
every kind also sweeps the whole home (issue 19 #4): every task box labelled for it (Docker) or recorded
for it (process runs) whose run is not a task running now is a leftover, whatever its task's state.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Collection, Iterable
from datetime import timedelta
from pathlib import Path

from impyard.backends import BoxError
from impyard.backends.docker import LABEL_RUN, DockerBackend
from impyard.imps.store import ImpError
from impyard.supervisor.backends import BackendFor
from impyard.tasks import MAX_CEILING, Task
from impyard.threads import in_thread

# Process runs this recent are looked at by the sweep: older boxes are long past any ceiling (and pids recycle).
SWEEP_WINDOW = MAX_CEILING + timedelta(hours=1)

log = logging.getLogger("impyard.supervisor")


def looks_like_box_process(pid: int, state_dir: Path) -> bool:
    """A process backend box of this imp: its environment names the imp's state dir, or a box's own /state
    under it (issue 22), in Linux /proc."""
    proc = Path(f"/proc/{pid}")
    try:
        environ = (proc / "environ").read_bytes().split(b"\0")
        cmdline = (proc / "cmdline").read_bytes()
    except OSError:
        return False
    prefix = b"IMPYARD_STATE_DIR="
    named = [Path(os.fsdecode(item[len(prefix) :])) for item in environ if item.startswith(prefix)]
    roots = (state_dir, state_dir.resolve())
    return b"box" in cmdline and any(path.is_relative_to(root) for path in named for root in roots)


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
        backend = await in_thread(backend_for, task.imp)
    except (ImpError, BoxError) as exc:
        log.info("task %s: no backend to look for its box in (%s)", task.id, exc)
        return
    if isinstance(backend, DockerBackend):
        try:
            containers = await in_thread(backend.labelled, run=task.run_id or "")
            for container in containers:
                if container.name is None:
                    continue
                await in_thread(backend.kill_by_name, container.name)
                log.warning("removed orphaned box %s of task %s", container.name, task.id)
        except Exception as exc:  # noqa: BLE001 - reclaim goes on; the box is reported
            log.error("could not remove the box of task %s (run %s): %s", task.id, task.run_id, exc)


def leftovers(boxes: Iterable[tuple[str, str]], live_runs: Collection[str]) -> list[str]:
    """Issue 19 #4: of this home's task boxes ``(name, run)``, those no running task owns: all are swept."""
    return [name for name, run in boxes if run not in live_runs]


def sweep_process_boxes(
    runs: Iterable[tuple[str, str, int]], live_runs: Collection[str], state_dir_of: dict[str, Path]
) -> int:
    """Kill the process boxes of recorded runs ``(run, imp, pid)`` that no running task owns (issue 19 #4);
    a pid is shot only while it still is a box of that imp (``looks_like_box_process``)."""
    killed = 0
    for run_id, imp, pid in runs:
        state_dir = state_dir_of.get(imp)
        if run_id in live_runs or state_dir is None or not looks_like_box_process(pid, state_dir):
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        killed += 1
        log.warning("killed leftover box process %d (run %s of %s)", pid, run_id, imp)
    return killed


async def sweep_docker_boxes(backends: Iterable[DockerBackend], live_runs: Collection[str]) -> int:
    """Remove every task box labelled for this home whose run no running task owns (issue 19 #4)."""
    removed = 0
    for backend in backends:
        try:
            containers = await in_thread(backend.labelled, role=backend.role)
            named = [(c.name, c.labels.get(LABEL_RUN, "")) for c in containers if c.name is not None]
            for name in leftovers(named, live_runs):
                await in_thread(backend.kill_by_name, name)
                removed += 1
                log.warning("removed leftover box %s", name)
        except Exception as exc:  # noqa: BLE001 - the sweep never stops the start; what is left is logged
            log.error("could not sweep the leftover boxes of this home: %s", exc)
    return removed
