"""Scenario 2, cold vs warm: a fresh box per message ([sessions] mode = "cold") against the warm session,
message in → reply, with the cold start split into spawn, box.init and the first turn. Under Docker each
cold box is also set against its runtime's own floor from the same run: a bare ``docker run`` of the box
image (Python starts and exits), one taken after each cold sample (issue 22); and against the physical floor
of issue 18: a one-line Python program under the box's whole lockdown, started the same way a box is
(``backend.open``), from asking for it to its first line reaching the host."""

from __future__ import annotations

import time
from typing import Any

import anyio
from pydantic import BaseModel

from bench.harness import (
    REPLY_TIMEOUT_S,
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
from impyard.backends import BoxSpec, QuietHost
from impyard.backends.docker import DockerBackend
from impyard.paths import home

TARGETS = {"cold_first_reply_p50_ms": 1500.0}  # README.md "Performance": cold start to first reply, Docker
FLOOR_TARGETS = {"runsc": 1.2}  # issue 22: a cold runsc box ≤ 1.2× runsc's own bare `docker run`
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
    return out
