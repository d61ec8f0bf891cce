"""Pruning finished tasks' state dirs: each task's box has its own ``/state`` (issue 22), and they would pile up.

A task's dir is ``<state root>/<imp>/state/tasks/<box_dir_name(task id)>`` (``ImpStore.task_state_dir``): its
call log and scratch. The supervisor of every kind removes it once the task is finished (``done``, ``failed``,
``cancelled``; never ``needs_review``, whose posts still await approval) and both its finish and the dir's own
last change lie more than the retention (``SupervisorSettings.task_state_retention``, 7 days) in the past. A dir
whose name is exactly the dir of some task id but that has no task row (a deleted task) goes by its own age
alone; anything else under ``tasks/`` — a link, a file, a name of another shape — is never touched.

The rule (``should_remove``) is pure. The walk never follows a link: every dir from the state root down is
opened with ``O_NOFOLLOW`` relative to its parent's descriptor (a box writes its own dir and may plant links,
as ``impyard.backends.statedir`` says), and ``shutil.rmtree`` with ``dir_fd`` removes a dir's contents without
following links inside it and refuses a dir swapped for a link. It runs off the event loop, and each pass
removes at most a batch, oldest first; an error on one dir is logged and the others go on.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
from collections.abc import Awaitable, Callable, Collection, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from pathlib import Path

from impyard.imps.config import NAME_PATTERN, STATE_DIR
from impyard.imps.store import TASK_DIRS
from impyard.paths import box_dir_name
from impyard.tasks import Task
from impyard.threads import in_thread

log = logging.getLogger("impyard.supervisor")

# box_dir_name's shape: a cleaned key of at most 48 characters, a dash, 12 hex digits of its sha256.
DIR_NAME_SHAPE = re.compile(r"[A-Za-z0-9_.-]{1,48}-[0-9a-f]{12}")
PRUNED_STATES = frozenset({"done", "failed", "cancelled"})  # needs_review still awaits its approvals
LOOKUP_CHUNK = 500  # candidate dirs whose tasks are read at once
MAX_PRUNE_FAILURES = 10_000  # dirs that could not be removed, remembered so as not to retry each pass
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class TaskDir:
    """One entry of an imp's ``state/tasks/`` as ``lstat`` saw it (a link is never followed)."""

    imp: str
    name: str
    is_dir: bool  # a real directory: False for a link (to anything), a file, a socket
    changed_at: datetime  # its own mtime

    @cached_property  # a sha256 per call: looked at several times a pass
    def task_id(self) -> str | None:
        """The id whose ``box_dir_name`` this name is exactly; None for a name of any other shape."""
        if not DIR_NAME_SHAPE.fullmatch(self.name):
            return None
        key = self.name[:-13]
        return key if box_dir_name(key) == self.name else None


def should_remove(
    entry: TaskDir, task: Task | None, *, live: bool, now: datetime, retention: timedelta
) -> bool:
    """Whether ``entry`` goes: ``task`` is its task's row (None: no row), ``live`` whether its run is running."""
    if not entry.is_dir or entry.task_id is None or live:
        return False  # never a link, a foreign name, or a box that may still write
    if now - entry.changed_at <= retention:
        return False  # written (or made) within the retention
    if task is None:
        return True  # a deleted task's dir, by its own age alone
    if task.imp != entry.imp or task.state not in PRUNED_STATES:
        return False
    ended = max(task.finished_at or task.updated_at, task.updated_at)  # a settled review counts from then
    return now - ended > retention


# ------------------------------------------------------------------ the disk (blocking: worker threads only)


@contextmanager
def _task_dirs_fd(root_fd: int, imp: str) -> Iterator[int]:
    """``<imp>/state/tasks`` under the state root's descriptor, each step opened without following a link."""
    with ExitStack() as stack:
        fd = root_fd
        for part in (imp, STATE_DIR, TASK_DIRS):
            fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            stack.callback(os.close, fd)
        yield fd


def scan_task_dirs(root: Path, older_than: datetime) -> list[TaskDir]:
    """Every real dir with a task dir's name under ``root/<imp>/state/tasks/`` last changed before
    ``older_than``, oldest first. An imp dir (or its ``state``, ``tasks``) that is a link is skipped."""
    found: list[TaskDir] = []
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return found
    try:
        imps = sorted(name for name in os.listdir(root_fd) if NAME_PATTERN.match(name))
        for imp in imps:
            try:
                with _task_dirs_fd(root_fd, imp) as tasks_fd:
                    for name in os.listdir(tasks_fd):
                        entry = _lstat_entry(tasks_fd, imp, name)
                        if entry is not None and entry.task_id is not None and entry.changed_at < older_than:
                            found.append(entry)
            except (FileNotFoundError, NotADirectoryError):
                continue  # no task has run for this imp (or it is not an imp's dir)
            except OSError as exc:  # a link in the path (ELOOP), no permission: reported, never followed
                log.warning(
                    "task state: not looking in %s/%s/%s/%s: %s", root, imp, STATE_DIR, TASK_DIRS, exc
                )
    finally:
        os.close(root_fd)
    found.sort(key=lambda entry: (entry.changed_at, entry.imp, entry.name))
    return found


def _lstat_entry(dir_fd: int, imp: str, name: str) -> TaskDir | None:
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None  # gone meanwhile
    return TaskDir(imp, name, stat.S_ISDIR(info.st_mode), datetime.fromtimestamp(info.st_mtime, UTC))


def remove_task_dirs(root: Path, entries: Sequence[TaskDir]) -> tuple[int, list[TaskDir]]:
    """Remove ``entries`` (each re-checked to be a real dir) without following links: how many went, and
    those that could not be removed (each logged; the rest go on)."""
    removed = 0
    failed: list[TaskDir] = []
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        log.error("task state: cannot open the state root %s: %s", root, exc)
        return 0, list(entries)
    try:
        for entry in entries:
            try:
                with _task_dirs_fd(root_fd, entry.imp) as tasks_fd:
                    info = os.stat(entry.name, dir_fd=tasks_fd, follow_symlinks=False)
                    if not stat.S_ISDIR(info.st_mode):
                        raise NotADirectoryError(f"{entry.name} is no longer a directory")
                    # fd-based: never follows a link inside, refuses the dir if it is swapped for one
                    shutil.rmtree(entry.name, dir_fd=tasks_fd)
                removed += 1
            except FileNotFoundError:
                continue  # gone already
            except OSError as exc:
                failed.append(entry)
                log.error(
                    "task state: could not remove %s/%s's task dir %s: %s", root, entry.imp, entry.name, exc
                )
    finally:
        os.close(root_fd)
    return removed, failed


# ------------------------------------------------------------------ one pass


@dataclass(frozen=True)
class PruneReport:
    removed: int
    failed: tuple[TaskDir, ...]  # could not be removed (logged): the caller skips them from then on
    backlog: bool  # the batch was full: more may be due now


Lookup = Callable[[Collection[str]], Awaitable[dict[str, Task]]]


async def prune_task_state(
    root: Path,
    lookup: Lookup,
    live: Collection[str],
    *,
    now: datetime,
    retention: timedelta,
    limit: int,
    skip: Collection[tuple[str, str]] = (),
) -> PruneReport:
    """One pass: look at the task dirs idle past ``retention`` (oldest first), read their tasks through
    ``lookup`` in chunks, and remove at most ``limit`` of those ``should_remove`` lets go. ``live``: the ids of
    tasks whose run this process still holds; ``skip``: ``(imp, name)`` of dirs that failed before (a dir that
    cannot be removed must not take a place in every batch)."""
    candidates = await in_thread(scan_task_dirs, root, now - retention)
    candidates = [entry for entry in candidates if (entry.imp, entry.name) not in skip]
    chosen: list[TaskDir] = []
    for start in range(0, len(candidates), LOOKUP_CHUNK):
        chunk = candidates[start : start + LOOKUP_CHUNK]
        tasks = await lookup([entry.task_id for entry in chunk if entry.task_id is not None])
        for entry in chunk:
            task = tasks.get(entry.task_id or "")
            if should_remove(entry, task, live=entry.task_id in live, now=now, retention=retention):
                chosen.append(entry)
        if len(chosen) >= limit:
            break
    batch = chosen[:limit]
    if not batch:
        return PruneReport(0, (), False)
    removed, failed = await in_thread(remove_task_dirs, root, batch)
    return PruneReport(removed, tuple(failed), backlog=len(chosen) >= limit)
