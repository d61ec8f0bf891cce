"""The machine the benchmark ran on, and the throwaway IMPYARD_HOME it runs in."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio

from impyard.conversation import history_act as gateway

ROOT = Path(__file__).resolve().parent.parent

# Lifts the per-channel send rate (20/min by default) and the budgets so hundreds of turns fit in one run;
# the rate meter and the ledger still run on every request.
BENCH_POLICY = """\
[[rules]]
name = "send-own-channel"
method = "discord.send"
action = "allow"
channels = ["own"]
max_content_chars = 8000
max_files = 4
max_file_bytes = 8388608
rate_per_minute = 1000000

[budgets.all]
daily_usd = 100000.0
monthly_usd = 1000000.0

[budgets.per_imp]
daily_usd = 100000.0
monthly_usd = 1000000.0
"""


@contextmanager
def isolated_home() -> Iterator[Path]:
    """A fresh IMPYARD_HOME with the bench policy; never the user's state, no real model key."""
    saved = {
        name: os.environ.get(name)
        for name in ("IMPYARD_HOME", "IMPYARD_POLICY_DIR", "OPENAI_API_KEY", "OPENAI_BASE_URL")
    }
    home = Path(tempfile.mkdtemp(prefix="impyard-bench-"))
    history_rate = gateway.HISTORY_REQUESTS_PER_MINUTE
    try:
        os.environ["IMPYARD_HOME"] = str(home)
        for name in ("IMPYARD_POLICY_DIR", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
            os.environ.pop(name, None)
        (home / "policies").mkdir()
        (home / "policies" / "bench.toml").write_text(BENCH_POLICY)
        # A box's history requests are capped per minute in code, not policy: hundreds of turns a minute here.
        gateway.HISTORY_REQUESTS_PER_MINUTE = 1_000_000
        yield home
    finally:
        gateway.HISTORY_REQUESTS_PER_MINUTE = history_rate
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(home, ignore_errors=True)


def _command(*argv: str) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, cwd=ROOT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    return None


def environment() -> dict[str, Any]:
    """Host, cores, memory, Python, Docker engine and the commit measured."""
    commit = _command("git", "rev-parse", "--short", "HEAD")
    dirty = _command("git", "status", "--porcelain")
    return {
        "host": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "python": platform.python_version(),
        "docker": _command("docker", "version", "--format", "{{.Server.Version}}"),
        "commit": f"{commit}{'+dirty' if dirty else ''}" if commit else None,
    }


def machine_cpu() -> tuple[int, int]:
    """(busy, total) CPU jiffies of the whole machine since boot, from /proc/stat."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


async def settle(max_wait_s: float = 20.0, idle_above_pct: float = 75.0, window_s: float = 0.5) -> float:
    """Wait (bounded) until the machine's CPUs are mostly idle again, e.g. Docker removing the last scenario's
    containers; returns the seconds waited."""
    started = time.perf_counter()
    while time.perf_counter() - started < max_wait_s:
        before = machine_cpu()
        await anyio.sleep(window_s)
        after = machine_cpu()
        if 100 - 100 * (after[0] - before[0]) / max(1, after[1] - before[1]) >= idle_above_pct:
            break
    return round(time.perf_counter() - started, 1)


def rss_kib(pid: int | str = "self") -> int:
    """A process's resident set (VmRSS) in KiB; 0 for one that is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)


def children_rss_kib() -> int:
    """The summed RSS of this process's direct children (process-backend boxes, ``docker run`` clients)."""
    pids: set[str] = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            pids.update((task / "children").read_text().split())
        except OSError:
            continue
    return sum(rss_kib(pid) for pid in pids)
