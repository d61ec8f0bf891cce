"""Scenario 4, fan-out: 1, 10, 50 channel sessions at once, each sending its messages one after another.
Throughput, latency, the supervisor's RSS per session (boxes are other processes), lost or duplicated."""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import anyio

from bench.costs import CpuMeter, SessionProcesses, session_processes
from bench.env import children_rss_kib, machine_cpu, rss_kib
from bench.harness import (
    TURN_MODEL_LATENCY_S,
    Context,
    Host,
    dm,
    docker_of,
    fake_model,
    host,
    label,
    primary,
    result,
)
from bench.report import Row
from bench.stats import ratio, summary
from impyard.conversation.sessions import SessionKey
from impyard.threads import in_thread

TARGETS = {"lost": 0, "duplicated": 0, "rss_per_session_mib": 2.0}
# issue 18, at 50 sessions: ≥ 3× the throughput measured before it (63 turns/s Docker, 85 process), p99 ≤ 600 ms;
# every process a session adds together ≤ the box program's own RSS + 2 MiB.
TODAY_TURNS_PER_S = {"docker": 63.0, "process": 85.0}
SATURATION_TARGETS = {"throughput_vs_today": 3.0, "p99_ms": 600.0, "memory_over_box_mib": 2.0}


def _processes(ctx: Context, name: str, running: Host, channels: list[str]) -> list[SessionProcesses]:
    """Blocking: the processes each channel's session added."""
    docker = docker_of(ctx.backends[name])
    found = []
    for channel in channels:
        session = running.runtime.sessions.sessions.get(SessionKey(running.imp, channel))
        if session is not None and session.box is not None:
            found.append(session_processes(session.box, docker))
    return found


def _memory(processes: list[SessionProcesses], supervisor_kib_per_session: float) -> dict[str, Any]:
    """Per session, in MiB: the box program's own RSS, and every process the session added (RSS and PSS),
    with the supervisor's own growth per session added to both totals."""
    seen = [p.memory_kib() for p in processes]
    if not seen:
        return {}

    def mean(key: str) -> float:
        return sum(s[key] for s in seen) / len(seen) / 1024

    box, extra = mean("box_rss_kib"), supervisor_kib_per_session / 1024
    all_rss = mean("all_rss_kib") + extra
    return {
        "box_rss_mib": round(box, 2), "box_pss_mib": round(mean("box_pss_kib"), 2),
        "all_rss_mib": round(all_rss, 2), "all_pss_mib": round(mean("all_pss_kib") + extra, 2),
        "shim_rss_mib": round(mean("shim_rss_kib"), 2), "client_rss_mib": round(mean("client_rss_kib"), 2),
        "supervisor_mib": round(extra, 3), "processes_per_session": round(sum(s["processes"] for s in seen) / len(seen), 1),
        "over_box_rss_mib": round(all_rss - box, 2), "sessions_seen": len(seen),
    }  # fmt: skip


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
        processes = await in_thread(_processes, ctx, name, running, channels)
        meters = [CpuMeter(p, engine=[]) for p in processes] + [CpuMeter(SessionProcesses(box=[]))]
        for meter in meters:
            meter.start()
        began, cpu_began, machine_began = time.perf_counter(), time.process_time(), machine_cpu()
        async with anyio.create_task_group() as tg:  # then all channels talk at once
            for channel in channels:
                tg.start_soon(conversation, channel)
        wall_s, cpu_s, machine = time.perf_counter() - began, time.process_time() - cpu_began, machine_cpu()
        for meter in meters:
            meter.stop()
        gc.collect()
        rss_after, children_after, threads_after = rss_kib(), children_rss_kib(), threading.active_count()
        memory = _memory(processes, (rss_after - rss_before) / sessions)
        live, ended = len(running.runtime.sessions.sessions), summary(running.ended_ms)
    surface = running.surface
    expected = [f"{channel}-m{n}" for channel in channels for n in range(messages + 1)]
    return {
        **summary(latencies), "sessions": sessions, "live_sessions": live, "messages": len(expected),
        "throughput_per_s": round(sessions * messages / wall_s, 1), "box_start": summary(starts),
        "turn_ended": ended,  # message in → outcome recorded: the reply plus the turn's tail
        "supervisor_cpu_ms_per_turn": round(cpu_s * 1000 / (sessions * messages), 2),
        **{key: round(sum(m.totals[part] for m in meters) * 1000 / (sessions * messages), 3)
           for key, part in (("box_cpu_ms_per_turn", "box"), ("relay_cpu_ms_per_turn", "relay"),
                             ("engine_cpu_ms_per_turn", "engine"))},
        "memory_per_session": memory,
        "machine_cpu_busy_pct": round(100 * (machine[0] - machine_began[0]) / max(1, machine[1] - machine_began[1]), 1),
        "lost": sum(1 for message_id in expected if not surface.replied_at.get(message_id)),
        "duplicated": sum(max(0, len(surface.replied_at.get(message_id, [])) - 1) for message_id in expected),
        "rss_before_mib": round(rss_before / 1024, 1), "rss_after_mib": round(rss_after / 1024, 1),
        "rss_per_session_mib": round((rss_after - rss_before) / 1024 / sessions, 3),
        "children_rss_per_session_mib": round((children_after - children_before) / 1024 / sessions, 1),
        "threads_before": threads_before, "threads_after": threads_after,
    }  # fmt: skip


async def run(ctx: Context) -> dict[str, Any]:
    names = ctx.core_backends()
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
                    f"fan-out {n} sessions, {label(name)}",
                    v,
                    one["p50_ms"],
                    ratio(v["p50_ms"], one["p50_ms"]),
                    target,
                    ok,
                )
            )
        out += _saturation_rows(name, levels)
    return out


def _saturation_rows(name: str, levels: dict[str, Any]) -> list[Row]:
    """Issue 18 at the widest level: throughput and p99 against today's, CPU per turn by whom, memory per session."""
    widest = levels[max(levels, key=int)]
    one = levels[min(levels, key=int)]
    today = TODAY_TURNS_PER_S.get(name)
    got = widest["throughput_per_s"]
    out = [
        Row(
            f"saturation at {widest['sessions']} sessions, {label(name)}: turns/s (baseline: 1 session)",
            {"samples": widest["samples"], "p50_ms": widest["p50_ms"], "p95_ms": widest["p95_ms"], "p99_ms": widest["p99_ms"]},
            one["p50_ms"], ratio(got, today) if today else None,
            f"{got:.0f} turns/s ≥{SATURATION_TARGETS['throughput_vs_today']:g}× {today:g} → {got / today:.2f}×; "
            f"p99 ≤{SATURATION_TARGETS['p99_ms']:g} → {widest['p99_ms']:,.0f}" if today else f"{got:.0f} turns/s",
            bool(today) and got >= SATURATION_TARGETS["throughput_vs_today"] * (today or 0)
            and widest["p99_ms"] <= SATURATION_TARGETS["p99_ms"],
        )
    ]  # fmt: skip
    if "box_cpu_ms_per_turn" in widest:
        relays = "" if name == "process" else (
            f", stdio relays {widest['relay_cpu_ms_per_turn']:.2f}, engine {widest['engine_cpu_ms_per_turn']:.2f}"
        )  # fmt: skip
        out.append(
            Row(
                f"CPU per turn at {widest['sessions']} sessions, {label(name)}: supervisor (ms)",
                {"samples": widest["samples"], "p50_ms": widest["supervisor_cpu_ms_per_turn"]},
                one.get("supervisor_cpu_ms_per_turn"),
                ratio(widest["supervisor_cpu_ms_per_turn"], one.get("supervisor_cpu_ms_per_turn")),
                f"box {widest['box_cpu_ms_per_turn']:.2f}{relays}; machine busy {widest['machine_cpu_busy_pct']:.0f}%",
                None,
            )
        )
    memory = widest.get("memory_per_session") or {}
    if memory:
        limit = SATURATION_TARGETS["memory_over_box_mib"]
        out.append(
            Row(
                f"memory per session, {label(name)}: every process it adds, RSS MiB (baseline: the box's own RSS)",
                {"samples": memory["sessions_seen"], "p50_ms": memory["all_rss_mib"]},
                memory["box_rss_mib"], ratio(memory["all_rss_mib"], memory["box_rss_mib"]),
                f"≤ box + {limit:g} → box + {memory['over_box_rss_mib']:.1f} (PSS {memory['all_pss_mib']:.1f}; "
                f"{memory['processes_per_session']:g} processes: shim {memory['shim_rss_mib']:.1f}, client "
                f"{memory['client_rss_mib']:.1f}, supervisor {memory['supervisor_mib']:.2f})",
                memory["over_box_rss_mib"] <= limit,
            )
        )  # fmt: skip
    return out
