"""Scenario 1, warm turn overhead: message in → reply on the surface through the whole host, against the
same box code run in-process with a minimal host (the baseline). Overhead = warm − baseline, per percentile."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

from bench.harness import (
    TURN_MODEL_LATENCY_S,
    Context,
    dm,
    fake_model,
    host,
    imp_for,
    in_process_box,
    primary,
    result,
)
from bench.report import Row
from bench.stats import percentile, ratio, summary
from impyard.paths import home

WARMUP_TURNS = 3  # per path, not counted: the first starts the box, the rest pay one-time imports
TARGETS = {"overhead_p50_ms": 15.0, "overhead_p99_ms": 60.0, "ratio_p50": 1.2}


def _gateway_split(rows: list[Any]) -> dict[str, float]:
    """Median time the gateway spent per method (its own audit latency, the model's time included)."""
    by_method: dict[str, list[float]] = {}
    for method, latency in rows:
        by_method.setdefault(method, []).append(latency)
    return {method: round(percentile(values, 50), 3) for method, values in by_method.items()}


async def run(ctx: Context) -> dict[str, Any]:
    samples = ctx.plan.warm_samples
    names = list(ctx.backends)
    base: list[float] = []
    warm: dict[str, list[float]] = {name: [] for name in names}
    first: dict[str, float] = {}
    with fake_model(TURN_MODEL_LATENCY_S) as upstream:
        async with AsyncExitStack() as stack:
            baseline_box = await stack.enter_async_context(
                in_process_box(upstream, imp_for(names[0]), "warm-baseline", home() / "baseline-state")
            )
            hosts = {name: await stack.enter_async_context(host(ctx.backends[name])) for name in names}
            ctx.progress.phase("warm turn: start boxes, warm up", WARMUP_TURNS * (len(names) + 1))
            for n in range(WARMUP_TURNS):
                await baseline_box.turn(n)
                ctx.progress.advance()
                for name, running in hosts.items():
                    ms = await running.turn(dm(f"warm-{name}", n))
                    first.setdefault(name, ms)
                    ctx.progress.advance()
            ctx.progress.phase(f"warm turn: {samples} turns each, in-process / {' / '.join(names)}", samples)
            # Interleaved, so whatever the machine does meanwhile hits every path alike.
            for n in range(WARMUP_TURNS, WARMUP_TURNS + samples):
                base.append(await baseline_box.turn(n))
                for name, running in hosts.items():
                    warm[name].append(await running.turn(dm(f"warm-{name}", n)))
                ctx.progress.advance()
            routing = {name: round(percentile(running.routing_ms, 50), 3) for name, running in hosts.items()}
            ended = {name: summary(running.ended_ms[WARMUP_TURNS:]) for name, running in hosts.items()}
            audit = "SELECT method, latency_ms FROM audit WHERE channel_id = ?"
            splits = {
                name: _gateway_split(h.runtime.db.query(audit, (f"warm-{name}",)))
                for name, h in hosts.items()
            }
    baseline = summary(base)
    variants: dict[str, Any] = {}
    for name in names:
        stats = summary(warm[name])
        got = {
            f"overhead_{p}_ms": round(stats[f"{p}_ms"] - baseline[f"{p}_ms"], 3)
            for p in ("p50", "p95", "p99")
        }
        got["ratio_p50"] = ratio(stats["p50_ms"], baseline["p50_ms"])
        checks = {key: got[key] <= limit for key, limit in TARGETS.items()}
        variants[name] = {
            **stats, **got, "ratio_p99": ratio(stats["p99_ms"], baseline["p99_ms"]), "first_reply_ms": round(first[name], 1),
            "gateway_median_ms": splits[name], "routing_median_ms": routing[name], "turn_ended": ended[name], "checks": checks, "met": all(checks.values()),
        }  # fmt: skip
    head = primary(names)
    return result(
        variants[head], baseline=baseline, ratio=variants[head]["ratio_p50"], targets=TARGETS,
        met=all(v["met"] for v in variants.values()), headline=head,
        model_latency_ms=TURN_MODEL_LATENCY_S * 1000, variants=variants,
        **{key: variants[head][key] for key in ("overhead_p50_ms", "overhead_p95_ms", "overhead_p99_ms")},
    )  # fmt: skip


def rows(s: dict[str, Any]) -> list[Row]:
    return [
        Row(
            f"warm turn, {name}",
            v,
            s["baseline"]["p50_ms"],
            v["ratio_p50"],
            f"overhead p50 ≤15 → {v['overhead_p50_ms']:.1f}, p99 ≤60 → {v['overhead_p99_ms']:.1f}; ratio ≤1.2",
            v["met"],
        )  # fmt: skip
        for name, v in s["variants"].items()
    ]
