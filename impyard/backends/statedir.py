"""The imp's state dir (``/state``): its owner, its one-time ownership repair, and its quota (issue 11 #2, #11).

The state dir is the one place a box writes (each box its own since issue 22), so
everything under it is planted by a possibly hostile box. The
host never walks it by path: a box could swap a directory for a symlink to a host
directory between two steps of the walk (``renameat2(RENAME_EXCHANGE)``) and make
the host change files outside. Instead:

* the state dir itself is opened without following links and changed through its
  descriptor;
* its contents are left alone, except for a one-time repair when the dir was last
  written by someone other than the box user (a process box run by a root host, or
  an older impyard): that repair and the quota's measurement walk descriptor-relative
  with ``os.fwalk``, which never follows a link and checks each directory it opens
  is the one it listed, and they change or count entries through the directory's
  descriptor only;
* both run in a worker thread, never on the event loop, and treat an entry that
  vanishes under them as gone, not as an error.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("impyard.box")

# Set in the imp's host-owned dir (the state dir's parent, never mounted in a box) when a box ran with
# the host's own uid and may have left files the box user cannot write: the next Docker box repairs.
FOREIGN_WRITER_MARK = ".state-written-by-host-uid"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class StateQuota:
    """How much one box's state dir may hold: bytes on disk and entries (files, dirs, links)."""

    max_bytes: int = 256 * 1024**2
    max_entries: int = 100_000


@dataclass(frozen=True)
class StateUsage:
    bytes: int
    entries: int
    complete: bool  # False: the count stopped early, past the quota

    def over(self, quota: StateQuota) -> str | None:
        """Why this usage is over ``quota``, or None."""
        if self.bytes > quota.max_bytes:
            return f"{_size(self.bytes)}{'+' if not self.complete else ''} on disk, over its quota of {_size(quota.max_bytes)}"
        if self.entries > quota.max_entries:
            return f"{self.entries}{'+' if not self.complete else ''} files, over its quota of {quota.max_entries}"
        return None


def mark_foreign_writer(state_dir: Path) -> None:
    """Note that a box ran with the host's uid on this state dir (called by the process backend as root)."""
    try:
        (state_dir.parent / FOREIGN_WRITER_MARK).touch()
    except OSError as exc:
        log.warning("could not mark %s as written by a process box: %s", state_dir, exc)


def prepare_state_dir(state_dir: Path, uid: int, gid: int) -> None:
    """Make ``state_dir`` exist, belong to ``uid:gid`` and be private; repair its contents once if needed.

    Blocking: call it from a worker thread. Only a root host changes owners.
    """
    state_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        state_dir.mkdir(mode=0o700)
    except FileExistsError:
        pass
    fd = os.open(state_dir, _DIR_FLAGS)  # a symlink in its place is refused (ELOOP), never followed
    try:
        mark = state_dir.parent / FOREIGN_WRITER_MARK
        if os.getuid() == 0:
            foreign = os.fstat(fd).st_uid != uid or mark.exists()
            if foreign:
                os.fchown(fd, uid, gid)
                repaired = _repair_owner(fd, uid, gid)
                log.info("state dir %s: ownership repaired once (%d entries changed)", state_dir, repaired)
            mark.unlink(missing_ok=True)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def _repair_owner(top_fd: int, uid: int, gid: int) -> int:
    """Give every entry under the directory ``top_fd`` to ``uid:gid``, never following a link."""
    changed = 0
    for _root, dirs, files, dir_fd in os.fwalk(".", dir_fd=top_fd, follow_symlinks=False):
        for name in dirs + files:
            try:
                if os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_uid != uid:
                    os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
                    changed += 1
            except OSError:  # gone or swapped under us: nothing of ours to change
                continue
    return changed


def measure_state_dir(state_dir: Path, quota: StateQuota) -> StateUsage:
    """Bytes on disk and entries under ``state_dir``, counted without following links; stops past the quota.

    Blocking: call it from a worker thread. Bytes are allocated blocks, so sparse files count what they use.
    """
    total = entries = 0
    try:
        top_fd = os.open(state_dir, _DIR_FLAGS)
    except FileNotFoundError:
        return StateUsage(0, 0, True)
    try:
        for _root, dirs, files, dir_fd in os.fwalk(".", dir_fd=top_fd, follow_symlinks=False):
            for name in dirs + files:
                try:
                    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                except OSError:
                    continue
                entries += 1
                total += info.st_blocks * 512 if not stat.S_ISDIR(info.st_mode) else 0
                if total > quota.max_bytes or entries > quota.max_entries:
                    return StateUsage(total, entries, False)
    finally:
        os.close(top_fd)
    return StateUsage(total, entries, True)


def parse_size(text: str) -> int:
    """``"256m"`` → bytes (k, m, g, t; powers of 1024)."""
    text = text.strip().lower()
    units = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
    if text and text[-1] in units and text[:-1].isdigit():
        return int(text[:-1]) * units[text[-1]]
    if text.isdigit():
        return int(text)
    raise ValueError(f"not a size: {text!r} (use e.g. 256m or 2g)")


def _size(count: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"
