"""Scenario 4, fan-out: 1, 10, 50 channel sessions at once, each sending its messages one after another.
Throughput, latency, the supervisor's RSS per session (boxes are other processes), lost or duplicated."""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import anyio

from bench.env import children_rss_kib, machine_cpu, rss_kib
from bench.harness import (
    TURN_MODEL_LATENCY_S,
    Context,
    dm,
    fake_model,
    host,
    primary,
    result,
)
from bench.report import Row
from bench.stats import ratio, summary

TARGETS = {"lost": 0, "duplicated": 0, "rss_per_session_mib": 2.0}


async def _level(ctx: Context, name: str, sessions: int, messages: int) -> dict[str, Any]:
    channels = [f"fan{sessions}-{name}-{i}" for i in range(sessions)]
    starts: list[float] = []
    latencies: list[float] = []

    async def one(channel: str, n: int, into: list[float]) -> None:
        try:
            into.append(await running.turn(dm(channel, n)))
        except (TimeoutError, RuntimeError):
            pass  # counted below: a message without exactly one reply is lost or duplicated
        ctx.progress.advance()

    async def conversation(channel: str) -> None:
        for n in range(1, messages + 1):
            await one(channel, n, latencies)

    async with host(ctx.backends[name]) as running:
        await running.turn(dm(f"fan{sessions}-{name}-warmup", 0))  # one-time costs out of the RSS base
        gc.collect()
        rss_before, children_before, threads_before = rss_kib(), children_rss_kib(), threading.active_count()
        async with anyio.create_task_group() as tg:  # every channel's first message: its box starts
            for channel in channels:
                tg.start_soon(one, channel, 0, starts)
        running.ended_ms.clear()
        began, cpu_began, machine_began = time.perf_counter(), time.process_time(), machine_cpu()
        async with anyio.create_task_group() as tg:  # then all channels talk at once
            for channel in channels:
                tg.start_soon(conversation, channel)
        wall_s, cpu_s, machine = time.perf_counter() - began, time.process_time() - cpu_began, machine_cpu()
        gc.collect()
        rss_after, children_after, threads_after = rss_kib(), children_rss_kib(), threading.active_count()
        live, ended = len(running.runtime.sessions.sessions), summary(running.ended_ms)
    surface = running.surface
    expected = [f"{channel}-m{n}" for channel in channels for n in range(messages + 1)]
    return {
        **summary(latencies), "sessions": sessions, "live_sessions": live, "messages": len(expected),
        "throughput_per_s": round(sessions * messages / wall_s, 1), "box_start": summary(starts),
        "turn_ended": ended,  # message in → outcome recorded: the reply plus the turn's tail
        "supervisor_cpu_ms_per_turn": round(cpu_s * 1000 / (sessions * messages), 2),
        "machine_cpu_busy_pct": round(100 * (machine[0] - machine_began[0]) / max(1, machine[1] - machine_began[1]), 1),
        "lost": sum(1 for message_id in expected if not surface.replied_at.get(message_id)),
        "duplicated": sum(max(0, len(surface.replied_at.get(message_id, [])) - 1) for message_id in expected),
        "rss_before_mib": round(rss_before / 1024, 1), "rss_after_mib": round(rss_after / 1024, 1),
        "rss_per_session_mib": round((rss_after - rss_before) / 1024 / sessions, 3),
        "children_rss_per_session_mib": round((children_after - children_before) / 1024 / sessions, 1),
        "threads_before": threads_before, "threads_after": threads_after,
    }  # fmt: skip


async def run(ctx: Context) -> dict[str, Any]:
    names = list(ctx.backends)
    messages = ctx.plan.fanout_messages
    variants: dict[str, Any] = {}
    with fake_model(TURN_MODEL_LATENCY_S):
        for name in names:
            levels = ctx.plan.fanout_levels[name]
            variants[name] = {}
            for sessions in levels:
                phase = f"fan-out, {name}: {sessions} sessions × {messages + 1} messages"
                ctx.progress.phase(phase, sessions * (messages + 1))
                variants[name][str(sessions)] = await _level(ctx, name, sessions, messages)
    widest = {name: max(ctx.plan.fanout_levels[name]) for name in names}
    head = primary([name for name in names if widest[name] == max(widest.values())])
    top, one = variants[head][str(widest[head])], variants[head][str(min(ctx.plan.fanout_levels[head]))]
    clean = all(level["lost"] == level["duplicated"] == 0 for v in variants.values() for level in v.values())
    lean = all(
        variants[n][str(widest[n])]["rss_per_session_mib"] < TARGETS["rss_per_session_mib"] for n in names
    )
    return result(
        top, baseline=one, ratio=ratio(top["p50_ms"], one["p50_ms"]), targets=TARGETS, met=clean and lean,
        headline=f"{head}, {widest[head]} sessions",
        notes=["RSS is the supervisor's own; boxes (process backend) and `docker run` clients are its children, "
               "reported apart as children_rss_per_session_mib"],
        model_latency_ms=TURN_MODEL_LATENCY_S * 1000, variants=variants,
    )  # fmt: skip


def rows(s: dict[str, Any]) -> list[Row]:
    out = []
    for name, levels in s["variants"].items():
        one = levels[min(levels, key=int)]
        for n, v in levels.items():
            ok = (
                v["lost"] == v["duplicated"] == 0
                and v["rss_per_session_mib"] < TARGETS["rss_per_session_mib"]
            )
            target = (
                f"lost {v['lost']}, dup {v['duplicated']}; RSS <2 MiB/session → {v['rss_per_session_mib']:.2f}; "
                f"{v['throughput_per_s']:.0f} turns/s"
            )
            out.append(
                Row(
                    f"fan-out {n} sessions, {name}",
                    v,
                    one["p50_ms"],
                    ratio(v["p50_ms"], one["p50_ms"]),
                    target,
                    ok,
                )
            )
    return out
