"""No two running boxes share a writable file (issue 22; docs/box.md, docs/security.md).

Each box has exactly one read-write mount, its own ``/state``. Before a backend starts a box it claims that
mount here, and a box whose mount is the same directory as a running box's, or lies inside it, or holds it,
is refused (``BoxStartError``) — never started. gVisor sandboxes do not share file locks or SQLite's WAL
index, so a file two boxes write at once can lose writes; what an imp's boxes share goes through the host.

A claim is a small file in the home's ``run/mounts/`` (host-owned, never mounted in a box) naming the mount,
held under an exclusive ``flock`` for the box's life: every impyard process of the home sees every running
box, whichever backend started it, and a process that dies lets go of its claims with its locks (the host
runs on the host's kernel, where ``flock`` is shared; only sandboxes do not share it). Taking a claim is one
critical section under the directory's own lock, so two boxes started at once cannot both get in.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from impyard import paths
from impyard.backends.base import BoxSpec, BoxStartError
from impyard.threads import in_thread

log = logging.getLogger("impyard.box")

CLAIMS_DIR = Path("run") / "mounts"  # under IMPYARD_HOME
CLAIM_SUFFIX = ".claim"
_GUARD = ".guard"  # the directory's own lock: one claim is taken at a time
MAX_CLAIM_BYTES = 8_192


def overlaps(a: Path, b: Path) -> bool:
    """Whether two (resolved) directories share files: the same, or one inside the other."""
    return a == b or a in b.parents or b in a.parents


@dataclass(frozen=True)
class Claimed:
    """A running box's claim as another process reads it."""

    path: Path
    imp: str
    channel_id: str
    run_id: str
    pid: int

    def describe(self) -> str:
        return (
            f"box {self.imp}/{self.channel_id} (run {self.run_id[:12]}, host pid {self.pid}) on {self.path}"
        )


class MountClaim:
    """One box's claim on its writable mount: taken before it starts, let go once it is gone."""

    def __init__(self, file: Path, fd: int) -> None:
        self.file = file
        self._fd: int | None = fd

    @classmethod
    def take(cls, spec: BoxSpec, claims_dir: Path | None = None, *, mount: Path | None = None) -> MountClaim:
        """Claim ``mount`` (default ``spec.state_dir``); ``BoxStartError`` naming the running box whose mount
        overlaps it.

        Blocking (a few small files): call it from a worker thread."""
        directory = claims_dir or paths.home() / CLAIMS_DIR
        mount = (mount or spec.state_dir).resolve()
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            guard = os.open(directory / _GUARD, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise BoxStartError(
                f"cannot claim the box's /state in {directory} ({exc.strerror or exc}): check that the home is writable"
            ) from exc
        try:
            fcntl.flock(guard, fcntl.LOCK_EX)
            for other in _running_claims(directory):
                if overlaps(mount, other.path):
                    raise BoxStartError(
                        f"refusing to start box {spec.imp}/{spec.channel_id}: its /state {mount} overlaps the "
                        f"writable mount of the running {other.describe()}; no two boxes may share a writable "
                        "file (issue 22): wait for that box to end, or stop it"
                    )
            return cls._write(directory, spec, mount)
        finally:
            os.close(guard)  # closing lets go of the guard's lock

    @classmethod
    def _write(cls, directory: Path, spec: BoxSpec, mount: Path) -> MountClaim:
        file = directory / f"{uuid.uuid4().hex}{CLAIM_SUFFIX}"
        fd = os.open(file, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held for the box's life; the kernel lets go if this process dies
            record = {"path": str(mount), "imp": spec.imp, "channel_id": spec.channel_id, "run_id": spec.run_id,
                      "pid": os.getpid()}  # fmt: skip
            os.write(fd, json.dumps(record).encode()[:MAX_CLAIM_BYTES])
        except BaseException:
            os.close(fd)
            file.unlink(missing_ok=True)
            raise
        return cls(file, fd)

    def release(self) -> None:
        """Let go (idempotent): the file goes first, then its lock."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            self.file.unlink(missing_ok=True)
        os.close(fd)


def _running_claims(directory: Path) -> list[Claimed]:
    """The claims of running boxes; a claim nobody holds (its process died) is removed on the way."""
    found = []
    for file in directory.glob(f"*{CLAIM_SUFFIX}"):
        try:
            fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # released meanwhile
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                claimed = _read(fd)
                if claimed is not None:
                    found.append(claimed)
                continue
            log.info("removing the claim %s of a box whose host is gone", file.name)
            file.unlink(missing_ok=True)
        finally:
            os.close(fd)
    return found


def _read(fd: int) -> Claimed | None:
    try:
        record = json.loads(os.pread(fd, MAX_CLAIM_BYTES, 0))
        return Claimed(Path(record["path"]), str(record["imp"]), str(record["channel_id"]), str(record["run_id"]),
                       int(record["pid"]))  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        return None  # being written (the guard makes that rare) or not ours: it names no mount


@asynccontextmanager
async def claimed_mount(
    spec: BoxSpec, claims_dir: Path | None = None, *, mount: Path | None = None
) -> AsyncIterator[MountClaim]:
    """Hold ``spec``'s writable mount (``mount``, default its state dir) for the block (a backend's ``open``,
    around the box's whole life)."""
    claim = await in_thread(MountClaim.take, spec, claims_dir, mount=mount)
    try:
        yield claim
    finally:
        claim.release()


def running_mounts(claims_dir: Path | None = None) -> set[Path]:
    """The writable mounts of every running box of the home, whichever process started it (issue 37: a spare dir
    no running box holds is a leftover). Blocking: call it from a worker thread."""
    directory = claims_dir or paths.home() / CLAIMS_DIR
    try:
        guard = os.open(directory / _GUARD, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return set()  # no claims dir: no box has run in this home
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)
        return {claimed.path for claimed in _running_claims(directory)}
    finally:
        os.close(guard)
