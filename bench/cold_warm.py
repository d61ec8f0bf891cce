"""Scenario 2, cold vs warm: a fresh box per message ([sessions] mode = "cold") against the warm session,
message in → reply, with the cold start split into spawn, box.init and the first turn. Under Docker each
cold box is also set against its runtime's own floor from the same run: a bare ``docker run`` of the box
image (Python starts and exits), one taken after each cold sample (issue 22); and against the physical floor
of issue 18: a one-line Python program under the box's whole lockdown, started the same way a box is
(``backend.open``), from asking for it to its first line reaching the host.

Issue 37's rows: a conversation's first reply when a spare box is there (an imp with ``[box] spares = 1``, each
sample a new channel, the refill awaited between samples) against the warm reply of the same run, and what a
spare costs while it waits: the box's own resident memory and the host's (its RSS with the spare, less after
the spare is drained)."""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel

from bench.harness import (
    REPLY_TIMEOUT_S,
    SPARE_MODE,
    TURN_MODEL_LATENCY_S,
    Context,
    TimedBackend,
    TimingSurface,
    bare_run_argv,
    dm,
    docker_of,
    fake_model,
    host,
    label,
    primary,
    result,
    start_split,
)
from bench.report import Row
from bench.stats import ratio, since_ms, summary
from impyard.backends import BoxSpec, QuietHost, RunningBox
from impyard.backends.docker import DockerBackend
from impyard.backends.plan import box_name
from impyard.conversation.spares import Spare, SparePool
from impyard.paths import home

TARGETS = {"cold_first_reply_p50_ms": 1500.0}  # README.md "Performance": cold start to first reply, Docker
FLOOR_TARGETS = {"runsc": 1.2}  # issue 22: a cold runsc box ≤ 1.2× runsc's own bare `docker run`
SPARE_TARGET = 1.5  # issue 37: a conversation's first reply with a spare there ≤ 1.5× a warm reply
LOCKED_FLOOR_TARGET = 1.2  # issue 18: a cold Docker box ≤ 1.2× a locked-down one-liner started the same way
# The one-line program: its only line is a protocol notification, so the host's peer takes it as the box's first.
ONE_LINER = (
    """print('{"jsonrpc":"2.0","method":"log","params":{"level":"info","message":"up"}}', flush=True)"""
)


class _FirstLine(QuietHost):
    """A host that notes when the box's first line has reached it."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived = anyio.Event()

    async def serve(self, spec: BoxSpec, method: str, params: BaseModel) -> BaseModel | None:
        self.arrived.set()
        return None


async def _locked_one_liner(docker: DockerBackend, n: int) -> float:
    """Asked → the first line of a one-line Python program in a box with the whole lockdown, via ``open``."""
    spec = BoxSpec("floor", f"floor-{n}", home() / "floor-state")
    first = _FirstLine()
    started = time.perf_counter()
    async with docker.open(spec, first, command=["python3", "-c", ONE_LINER]) as running:
        with anyio.fail_after(REPLY_TIMEOUT_S):
            await first.arrived.wait()
        took = since_ms(started)
        with anyio.fail_after(REPLY_TIMEOUT_S):
            await running.exited.wait()
    return took


def _replies(surface: TimingSurface, ids: list[str]) -> list[float]:
    return [surface.replied_at[message_id][0] for message_id in ids]


async def _bare_run(argv: list[str]) -> float:
    started = time.perf_counter()
    await anyio.run_process(argv)  # raises when the run fails: a floor that did not run is no floor
    return since_ms(started)


async def _cold(ctx: Context, name: str, samples: int) -> dict[str, Any]:
    timed = TimedBackend(ctx.backends[name])
    docker = docker_of(ctx.backends[name])
    floor_argv = bare_run_argv(docker) if docker is not None else None
    channel = f"cold-{name}"
    latencies, teardowns, floors, locked, ids = [], [], [], [], []
    async with host(timed, "cold") as cold:
        for n in range(samples):
            inbound = dm(channel, n)
            latencies.append(await cold.turn(inbound))
            ids.append(inbound.message.id)
            started = time.perf_counter()
            await cold.session_gone(channel)  # each sample starts from no box at all
            teardowns.append(since_ms(started))
            if (
                floor_argv is not None and docker is not None
            ):  # interleaved: whatever the machine does hits all alike
                floors.append(await _bare_run(floor_argv))
                locked.append(await _locked_one_liner(docker, n))
            ctx.progress.advance()
        boxes = cold.runtime.sessions.boxes_started
        split = start_split(timed.starts, _replies(cold.surface, ids))
    return {
        **summary(latencies),
        "boxes_started": boxes,
        "split_median_ms": split,
        "teardown": summary(teardowns),
        "floor": summary(floors) if floors else None,
        "locked_floor": summary(locked) if locked else None,
        "floor_command": floor_argv,
    }


async def _warm(ctx: Context, name: str, samples: int) -> dict[str, Any]:
    timed = TimedBackend(ctx.backends[name])
    channel = f"warmcmp-{name}"
    latencies = []
    async with host(timed) as warm:
        first = await warm.turn(dm(channel, 0))  # a warm session's own cold start
        split = start_split(timed.starts, _replies(warm.surface, [f"{channel}-m0"]))
        for n in range(1, samples + 1):
            latencies.append(await warm.turn(dm(channel, n)))
            ctx.progress.advance()
    return {**summary(latencies), "first_reply_ms": round(first, 1), "first_reply_split_ms": split}


def _rss_kib(pid: int | str = "self") -> int | None:
    """A process's resident memory (``VmRSS``), in KiB; None where it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


_UNITS = {"b": 1 / 1024, "kib": 1, "kb": 1, "mib": 1024, "mb": 1024, "gib": 1024**2, "gb": 1024**2}


async def _box_rss_kib(box: RunningBox) -> int | None:
    """A waiting spare's own memory: its process's RSS (process backend), its container's usage (Docker)."""
    if box.host_pid is not None:
        return _rss_kib(box.host_pid)
    try:
        done = await anyio.run_process(
            ["docker", "stats", "--no-stream", "--format", "{{.MemUsage}}", box_name(box.spec)]
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    used = done.stdout.decode().split("/")[0].strip().lower()
    number = used.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = used[len(number) :]
    try:
        return round(float(number) * _UNITS[unit])
    except (ValueError, KeyError):
        return None


def _ready(spares: SparePool) -> list[Spare]:
    return [spare for spare in spares.spares if spare.ready]


async def _until_ready(spares: SparePool) -> Spare:
    with anyio.fail_after(REPLY_TIMEOUT_S):
        while not _ready(spares):
            await spares.changed()
    return _ready(spares)[0]


async def _spare(ctx: Context, name: str, samples: int) -> dict[str, Any]:
    """Each sample a new conversation whose first message finds a spare there (the refill awaited between)."""
    latencies, box_rss, claimed_runs = [], [], []
    async with host(ctx.backends[name], SPARE_MODE) as spare_host:
        pool = spare_host.runtime.sessions.spares
        await spare_host.turn(dm(f"spare-{name}-first", 0))  # the imp's first conversation: the pool starts
        for n in range(samples):
            spare = await _until_ready(pool)
            assert spare.box is not None
            box_rss.append(await _box_rss_kib(spare.box))
            claimed = pool.claimed
            latencies.append(await spare_host.turn(dm(f"spare-{name}-{n}", 0)))
            if pool.claimed != claimed + 1:
                raise RuntimeError("a first message found a spare there but did not claim it")
            claimed_runs.append(spare.spec.run_id)
            ctx.progress.advance()
        await _until_ready(pool)
        with_spare = _rss_kib()
        pool.drain()
        with anyio.fail_after(REPLY_TIMEOUT_S):
            while any(not s.claimed for s in pool.spares):
                await pool.changed()
        without = _rss_kib()
        starts = pool.started
    known = [kib for kib in box_rss if kib is not None]
    return {
        **summary(latencies),
        "spares_started": starts,
        "claimed_distinct": len(set(claimed_runs)),
        "box_rss_mib": round(statistics.median(known) / 1024, 1) if known else None,
        "host_rss_mib": None
        if with_spare is None or without is None
        else round((with_spare - without) / 1024, 2),
    }


def _met(name: str, cold: dict[str, Any], ratio_floor: float | None) -> bool | None:
    if name in FLOOR_TARGETS:
        return ratio_floor is not None and ratio_floor <= FLOOR_TARGETS[name]
    if name == "docker":
        return bool(cold["p50_ms"] <= TARGETS["cold_first_reply_p50_ms"])
    return None


async def run(ctx: Context) -> dict[str, Any]:
    names = sorted(ctx.backends, key=lambda name: name != "docker")
    variants: dict[str, Any] = {}
    with fake_model(TURN_MODEL_LATENCY_S):
        for name in names:
            cold_n, warm_n = ctx.plan.cold_samples[name], ctx.plan.warm_in_cold_scenario
            ctx.progress.phase(
                f"cold vs warm, {label(name)}: {cold_n} cold boxes, {warm_n} warm turns", cold_n + warm_n
            )
            cold = await _cold(ctx, name, cold_n)
            warm = await _warm(ctx, name, warm_n)
            ctx.progress.phase(f"first reply with a spare box, {label(name)}: {cold_n} conversations", cold_n)
            spare = await _spare(ctx, name, cold_n)
            ratio_spare = ratio(spare["p50_ms"], warm["p50_ms"])
            floor, locked = cold["floor"], cold["locked_floor"]
            ratio_floor = ratio(cold["p50_ms"], floor["p50_ms"]) if floor else None
            ratio_locked = ratio(cold["p50_ms"], locked["p50_ms"]) if locked else None
            variants[name] = {
                "cold": cold,
                "warm": warm,
                "ratio_p50": ratio(cold["p50_ms"], warm["p50_ms"]),
                "ratio_floor_p50": ratio_floor,
                "ratio_locked_floor_p50": ratio_locked,
                "locked_floor_met": None if ratio_locked is None else ratio_locked <= LOCKED_FLOOR_TARGET,
                "met": _met(name, cold, ratio_floor),
                "spare": spare,
                "ratio_spare_p50": ratio_spare,
                "spare_met": ratio_spare is not None and ratio_spare <= SPARE_TARGET,
            }
    head = primary(names)
    cold, warm = variants[head]["cold"], variants[head]["warm"]
    met = bool(variants[head]["met"]) and all(variants[n]["met"] is not False for n in names)
    notes = (
        [] if head == "docker" else ["Docker was not measured: the target is for Docker, so it is not met"]
    )
    targets = {
        **TARGETS,
        **{f"cold_{name}_vs_floor_ratio_p50": limit for name, limit in FLOOR_TARGETS.items()},
    }
    return result(
        cold, baseline=warm, ratio=variants[head]["ratio_p50"], targets=targets, met=met, headline=head,
        model_latency_ms=TURN_MODEL_LATENCY_S * 1000, variants=variants, notes=notes,
    )  # fmt: skip


def rows(s: dict[str, Any]) -> list[Row]:
    out = []
    for name, v in s["variants"].items():
        if name == "docker":
            target, met = "p50 ≤1500 (Docker)", v["met"]
        elif name in FLOOR_TARGETS:
            target, met = "(its target is against its floor, below)", None
        else:
            target, met = "(the target is for Docker)", None
        out.append(
            Row(
                f"cold box → first reply, {label(name)}",
                v["cold"],
                v["warm"]["p50_ms"],
                v["ratio_p50"],
                target,
                met,
            )
        )
        floor = v["cold"].get("floor")
        if floor:
            limit = FLOOR_TARGETS.get(name)
            out.append(
                Row(
                    f"cold box vs a bare `docker run` (its floor), {label(name)}",
                    v["cold"],
                    floor["p50_ms"],
                    v["ratio_floor_p50"],
                    f"ratio ≤{limit} → {v['ratio_floor_p50']:.2f}" if limit else "(no target)",
                    v["met"] if limit else None,
                )
            )
        locked = v["cold"].get("locked_floor")
        if locked:
            out.append(
                Row(
                    f"cold box vs a locked-down one-liner started the same way (issue 18's floor), {label(name)}",
                    v["cold"], locked["p50_ms"], v["ratio_locked_floor_p50"],
                    f"ratio ≤{LOCKED_FLOOR_TARGET} → {v['ratio_locked_floor_p50']:.2f}", v["locked_floor_met"],
                )
            )  # fmt: skip
        spare = v.get("spare")
        if spare:
            out.append(
                Row(
                    f"first reply with a spare box there (issue 37), {label(name)}",
                    spare, v["warm"]["p50_ms"], v["ratio_spare_p50"],
                    f"≤{SPARE_TARGET}× a warm reply → {v['ratio_spare_p50']:.2f}", v["spare_met"],
                )
            )  # fmt: skip
            out.append(
                Row(
                    f"no spare (cold box) vs a spare, first reply, {label(name)}",
                    v["cold"], spare["p50_ms"], ratio(v["cold"]["p50_ms"], spare["p50_ms"]), "(no target)", None,
                )
            )  # fmt: skip
            out.append(
                Row(
                    f"one waiting spare costs: box RSS {spare['box_rss_mib']} MiB, host RSS "
                    f"{spare['host_rss_mib']} MiB, {label(name)}",
                    {}, None, None, "(reported)", None,
                )
            )  # fmt: skip
    return out
