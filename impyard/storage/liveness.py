"""Which process holds something, and whether a recorded holder still lives (issue 19 #4).

A ledger reservation names the process that made it. When that process is
gone — ``kill -9``, a power cut, a reboot — nothing will ever settle the
reservation, so the next host settles it at once instead of leaving it "in
flight" for an hour. The identity is ``host/boot/pid/start``: the machine's
name, its boot id, the process id and the process's start time in clock ticks
since boot, so a recycled pid or a rebooted machine never passes for the
holder. Where ``/proc`` is absent the boot and start parts are empty and only
the pid is checked.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from functools import cache
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class Holder:
    host: str
    boot: str
    pid: int
    start: str

    def __str__(self) -> str:
        return f"{self.host}/{self.boot}/{self.pid}/{self.start}"

    @classmethod
    def parse(cls, text: str | None) -> Holder | None:
        """A recorded holder, or None for a row written before holders were recorded (or garbled)."""
        parts = (text or "").rsplit("/", 3)
        if len(parts) != 4 or not parts[2].isdigit():
            return None
        return cls(parts[0], parts[1], int(parts[2]), parts[3])


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> str:
    """Field 22 of ``/proc/PID/stat`` (the start time); the command name before it may hold spaces and ')'."""
    stat = _read(PROC / str(pid) / "stat")
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else ""


def _boot_id() -> str:
    return _read(PROC / "sys" / "kernel" / "random" / "boot_id")[:8]


@cache
def this_process() -> Holder:
    pid = os.getpid()
    return Holder(socket.gethostname(), _boot_id(), pid, _start_ticks(pid))


def here(holder: Holder) -> bool:
    """Whether ``holder`` is (or was) a process of this machine since its last boot, so that its pids are this
    machine's pids now: a box pid it recorded may be looked up here. False for another machine's, or for one of
    this machine before a reboot (every pid of that boot is gone, and may be some other process's now)."""
    me = this_process()
    return holder.host == me.host and (not holder.boot or not me.boot or holder.boot == me.boot)


def alive(holder: Holder) -> bool | None:
    """True or False where this machine can tell; None for a holder on another machine (its lease decides)."""
    me = this_process()
    if holder.host != me.host:
        return None
    if holder.boot and me.boot and holder.boot != me.boot:
        return False  # this machine rebooted since: every process of that boot is gone
    if holder.pid == me.pid:
        return holder.start == me.start
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process with that pid: compare start times below
    if holder.start and me.start:
        return _start_ticks(holder.pid) == holder.start
    return True
