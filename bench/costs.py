"""What a session costs the machine (issue 18): the CPU of the supervisor, of the box, and of whatever relays the
box's stdio (the container's shim, a `docker run` client, the engine), and the memory of every process a
session adds (the box, its shim and init, any client process), read from /proc and the box's cgroup."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.env import rss_kib
from impyard.backends import RunningBox
from impyard.backends.docker import DockerBackend, container_name
from impyard.backends.engine import AttachedBox
from impyard.storage.db import Database

PROC = Path("/proc")
CGROUP = Path("/sys/fs/cgroup")
CLK_TCK = os.sysconf("SC_CLK_TCK")
ENGINE_COMMANDS = ("dockerd", "containerd")  # shared by every box: their CPU per turn is reported apart


def _stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command (which may hold spaces): field 3 (state) is index 0."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return []
    return text[text.rindex(")") + 2 :].split()


def cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of one process (0 for one that is gone); clock-tick resolution."""
    fields = _stat_fields(pid) if pid else []
    return (int(fields[11]) + int(fields[12])) / CLK_TCK if fields else 0.0


def parent_of(pid: int) -> int:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else 0


def children_of(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in (PROC / str(pid) / "task").iterdir():
            try:
                found += [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                continue
    except OSError:
        pass
    return found


def descendants(pid: int) -> list[int]:
    out, pending = [], children_of(pid)
    while pending:
        child = pending.pop()
        out.append(child)
        pending += children_of(child)
    return out


def pss_kib(pid: int) -> int:
    """Proportional set size: shared pages divided among the processes that map them (0 for one that is gone)."""
    try:
        for line in (PROC / str(pid) / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def engine_pids() -> list[int]:
    """dockerd and containerd."""
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() in ENGINE_COMMANDS:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def cgroup_cpu_ns(pid: int) -> Path | None:
    """The file that counts the CPU of ``pid``'s cgroup (a container: all its processes), v1 or v2."""
    try:
        lines = (PROC / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            for name in (controllers, "cpuacct", "cpu,cpuacct"):
                candidate = CGROUP / name / path.lstrip("/") / "cpuacct.usage"
                if candidate.exists():
                    return candidate
        if controllers == "":
            candidate = CGROUP / path.lstrip("/") / "cpu.stat"
            if candidate.exists():
                return candidate
    return None


def read_cgroup_cpu_s(counter: Path | None) -> float:
    if counter is None:
        return 0.0
    try:
        text = counter.read_text()
    except OSError:
        return 0.0
    if counter.name == "cpu.stat":
        usage = next((int(line.split()[1]) for line in text.splitlines() if line.startswith("usage_usec")), 0)
        return usage / 1e6
    return int(text.strip() or 0) / 1e9


@dataclass
class SessionProcesses:
    """The processes one session added to the machine."""

    box: list[int]  # the box's own processes (the container's: its init and the box program)
    shim: int | None = None  # the container's runtime shim (containerd-shim), one per container
    client: int | None = None  # a `docker run -i` client process relaying the box's stdio, if any
    box_counter: Path | None = None  # the container's cgroup CPU counter
    program: int | None = None  # the box program's own process (the largest of ``box``)

    def box_cpu_s(self) -> float:
        if self.box_counter is not None:
            return read_cgroup_cpu_s(self.box_counter)
        return sum(cpu_s(pid) for pid in self.box)

    def relay_cpu_s(self) -> float:
        return cpu_s(self.shim) + cpu_s(self.client)

    def memory_kib(self) -> dict[str, int]:
        added = [*self.box, *(pid for pid in (self.shim, self.client) if pid)]
        return {
            "box_rss_kib": rss_kib(self.program) if self.program else 0,
            "box_pss_kib": pss_kib(self.program) if self.program else 0,
            "all_rss_kib": sum(rss_kib(pid) for pid in added),
            "all_pss_kib": sum(pss_kib(pid) for pid in added),
            "shim_rss_kib": rss_kib(self.shim) if self.shim else 0,
            "client_rss_kib": rss_kib(self.client) if self.client else 0,
            "processes": len(added),
        }


def session_processes(box: RunningBox, docker: DockerBackend | None) -> SessionProcesses:
    """Blocking (it may ask the engine): run it in a worker thread."""
    process = box.process
    if docker is None:  # the process backend: the box is the supervisor's child
        pid = process.pid
        return SessionProcesses(box=[pid, *descendants(pid)], program=pid)
    client = None if isinstance(process, AttachedBox) else process.pid  # `docker run -i`: its client relays
    attrs: dict[str, Any] = docker.client().containers.get(container_name(box.spec)).attrs
    init = int(attrs["State"]["Pid"] or 0)
    shim = parent_of(init) if init else None
    inside = [init, *descendants(init)] if init else []
    program = max(inside, key=rss_kib) if inside else None
    return SessionProcesses(
        box=inside,
        shim=shim,
        client=client,
        box_counter=cgroup_cpu_ns(init) if init else None,
        program=program,
    )


@dataclass
class CpuMeter:
    """CPU seconds of the box, its relays and the engine, summed over windows (``start``/``stop``)."""

    processes: SessionProcesses
    engine: list[int] = field(default_factory=engine_pids)
    totals: dict[str, float] = field(default_factory=lambda: {"box": 0.0, "relay": 0.0, "engine": 0.0})
    _at: dict[str, float] = field(default_factory=dict)

    def _read(self) -> dict[str, float]:
        return {
            "box": self.processes.box_cpu_s(),
            "relay": self.processes.relay_cpu_s(),
            "engine": sum(cpu_s(pid) for pid in self.engine),
        }

    def start(self) -> None:
        self._at = self._read()

    def stop(self) -> None:
        now = self._read()
        for key, value in now.items():
            self.totals[key] += value - self._at.get(key, value)

    def per_turn_ms(self, turns: int) -> dict[str, float]:
        return {
            f"{key}_cpu_ms_per_turn": round(value * 1000 / max(1, turns), 3)
            for key, value in self.totals.items()
        }


@dataclass
class TripCounter:
    """Trips to the database's worker threads (``Database.run`` calls: a job handed to a worker thread and its
    answer woken back onto the event loop) and quick calls (``Database.quick``: bounded work, on the event loop on
    SQLite), counted while ``installed`` (issue 18). A quick call that met another writer's lock and ran on a
    worker counts as both."""

    trips: int = 0
    quick: int = 0

    @contextmanager
    def installed(self) -> Iterator[TripCounter]:
        run: Callable[..., Any] = Database.run
        quick: Callable[..., Any] = Database.quick

        async def counted_run(db: Database, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            self.trips += 1
            return await run(db, fn, *args, **kwargs)

        async def counted_quick(db: Database, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            self.quick += 1
            return await quick(db, fn, *args, **kwargs)

        Database.run = counted_run  # type: ignore[method-assign, assignment]
        Database.quick = counted_quick  # type: ignore[method-assign, assignment]
        try:
            yield self
        finally:
            Database.run = run  # type: ignore[method-assign]
            Database.quick = quick  # type: ignore[method-assign]
