"""One supervisor per IMPYARD_HOME and role: an advisory lock file that names its holder.

``impyard chat`` and ``impyard serve`` hold ``supervisor.lock``; ``impyard
supervise`` holds its own ``supervise.lock``, so the task loop and a chat can
run side by side while two task loops on one home never can.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from impyard.errors import ImpyardError

LOCK_FILENAME = "supervisor.lock"
SUPERVISE_LOCK_FILENAME = "supervise.lock"  # the task loop's own lock (impyard supervise)


class AlreadyRunning(ImpyardError):
    """Another impyard process holds this IMPYARD_HOME."""

    def __init__(self, path: Path, holder: str, role: str = "") -> None:
        what = f"impyard {role}" if role else "impyard process"
        super().__init__(
            f"another {what} (pid {holder or 'unknown'}) is already running on {path.parent}; "
            "stop it first, or set IMPYARD_HOME to another directory"
        )
        self.holder = holder
        self.role = role


class HomeNotWritable(ImpyardError):
    """IMPYARD_HOME cannot be written (a full disk, a read-only mount, a file where the directory should be)."""

    def __init__(self, path: Path, exc: OSError) -> None:
        super().__init__(
            f"impyard can't write its home {path.parent}: {exc.strerror or exc} — free space, fix the "
            "permissions or the mount, or set IMPYARD_HOME to a writable directory, and try again"
        )


class InstanceLock:
    """``with InstanceLock(home, 'chat'):`` — released on every exit path, and by the kernel if we die."""

    def __init__(self, home: Path, role: str, filename: str = LOCK_FILENAME) -> None:
        self.path = home / filename
        self.role = role
        self._fd: int | None = None

    def __enter__(self) -> InstanceLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # issue 19 #1: one line, never a traceback
            raise HomeNotWritable(self.path, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").split()
            os.close(fd)
            raise AlreadyRunning(
                self.path, holder[0] if holder else "", holder[1] if len(holder) > 1 else ""
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {self.role}\n".encode(), 0)
        except OSError as exc:  # a full disk: the lock is held, but its holder cannot be written
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            raise HomeNotWritable(self.path, exc) from None
        self._fd = fd
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
