"""Scenario 3, burst: 20 messages at once in one fresh channel → boxes started (must be 1), time to the last
reply; baseline: one message in a fresh channel (box start included in both)."""

from __future__ import annotations

import time
from typing import Any

import anyio

from bench.harness import (
    REPLY_TIMEOUT_S,
    TURN_MODEL_LATENCY_S,
    Context,
    Host,
    dm,
    fake_model,
    host,
    label,
    primary,
    result,
)
from bench.report import Row
from bench.stats import ratio, summary

TARGETS = {"boxes_started": 1, "lost": 0, "duplicated": 0}


async def _one_burst(running: Host, channel: str, size: int) -> dict[str, Any]:
    runtime, surface = running.runtime, running.surface
    boxes_before = runtime.sessions.boxes_started
    ids = []
    start = time.perf_counter()
    for n in range(size):
        inbound = dm(channel, n)
        ids.append(inbound.message.id)
        await running.receive(inbound)
    lost = 0
    for message_id in ids:
        with anyio.move_on_after(REPLY_TIMEOUT_S) as waited:
            await runtime.conversations.wait_finished(message_id)
        lost += waited.cancelled_caught
    replies = [when for message_id in ids for when in surface.replied_at.get(message_id, [])]
    return {
        "ms": (max(replies) - start) * 1000 if replies else float("nan"),
        "boxes_started": runtime.sessions.boxes_started - boxes_before,
        "turns": len(replies),  # one reply per turn: messages that came during a turn are answered together
        "lost": lost,
        "duplicated": sum(max(0, len(surface.replied_at.get(message_id, [])) - 1) for message_id in ids),
    }


async def run(ctx: Context) -> dict[str, Any]:
    names = ctx.core_backends()
    size, reps = ctx.plan.burst_messages, ctx.plan.burst_reps
    variants: dict[str, Any] = {}
    with fake_model(TURN_MODEL_LATENCY_S):
        for name in names:
            ctx.progress.phase(f"burst, {name}: {reps} × (1 message, then {size} at once)", reps)
            single, bursts = [], []
            async with host(ctx.backends[name]) as running:
                for rep in range(reps):
                    single.append(await running.turn(dm(f"single-{name}-{rep}", 0)))
                    bursts.append(await _one_burst(running, f"burst-{name}-{rep}", size))
                    ctx.progress.advance()
            stats = summary([b["ms"] for b in bursts])
            variants[name] = {
                **stats, "single": summary(single), "ratio_p50": ratio(stats["p50_ms"], summary(single)["p50_ms"]),
                **{key: [b[key] for b in bursts] for key in ("boxes_started", "turns", "lost", "duplicated")},
                "met": all(b["boxes_started"] == 1 and b["lost"] == b["duplicated"] == 0 for b in bursts),
            }  # fmt: skip
    head = primary(names)
    met = all(v["met"] for v in variants.values())
    return result(
        variants[head], baseline=variants[head]["single"], ratio=variants[head]["ratio_p50"], targets=TARGETS,
        met=met, headline=head, messages=size, variants=variants,
    )  # fmt: skip


def rows(s: dict[str, Any]) -> list[Row]:
    out = []
    for name, v in s["variants"].items():
        target = f"boxes 1 → {max(v['boxes_started'])}; lost {sum(v['lost'])}, dup {sum(v['duplicated'])}"
        out.append(
            Row(
                f"burst of {s['messages']} → last reply, {label(name)}",
                v,
                v["single"]["p50_ms"],
                v["ratio_p50"],
                target,
                v["met"],
            )
        )
    return out
