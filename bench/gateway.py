"""Scenario 5, the gateway: judge + ledger reserve/settle + audit per request (Gateway.serve with a model.request
against the fake model at 0 latency) against the broker's bare upstream call; a pure-judge microbenchmark; and
the ledger under 100 concurrent reservations (overspend must be 0)."""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.harness import Context, fake_model, result
from bench.report import Row
from bench.stats import percentile, ratio, summary, timed
from box.common.envelope import response_format
from box.protocol.models import DiscordSendParams, ModelRequestParams
from impyard.backends import BoxSpec
from impyard.channels.store import ChannelStore
from impyard.clock import SystemClock
from impyard.gateway.audit import AuditRecord
from impyard.gateway.broker import ModelBroker, encode_body
from impyard.gateway.judge import judge, model_request_facts
from impyard.gateway.ledger import ALL_IMPS, BudgetExhausted, Ledger
from impyard.gateway.policy import load_policy
from impyard.gateway.policy_models import BudgetLimit, Budgets
from impyard.gateway.surfaces import Post, RecordingSurface
from impyard.host import build_gateway
from impyard.paths import home
from impyard.storage.db import open_database

CHANNEL = "gateway-bench"
IMP = "pip"
RACE_LIMIT_USD = 0.01  # 10,000 micro-USD: room for 33 reservations of 300
RACE_ESTIMATE_MICROS = 300
TARGETS = {"ledger_overspend_micros": 0}


def _chat_request() -> ModelRequestParams:
    body = {
        "model": "gpt-4.1-mini",
        "messages": [
            {"role": "system", "content": "You are Pip, a friendly imp who answers briefly."},
            {"role": "user", "content": "ann: hello pip, how is your day going?"},
        ],
        "max_completion_tokens": 1024,
        "response_format": response_format(),
    }
    return ModelRequestParams(path="/chat/completions", body=body, purpose="reply")


def _micro_us(values_ns: list[int]) -> dict[str, Any]:
    us = [value / 1000 for value in values_ns]
    return {"samples": len(us), **{f"p{q}_us": round(percentile(us, q), 2) for q in (50, 95, 99)}}


def _judge_micro(policy: Any, request: ModelRequestParams, samples: int) -> dict[str, Any]:
    raw = encode_body(request.body)
    facts = model_request_facts(IMP, CHANNEL, request, len(raw))
    judge_ns, facts_ns = [], []
    for _ in range(samples):
        start = time.perf_counter_ns()
        judge(facts, policy)
        judge_ns.append(time.perf_counter_ns() - start)
        start = time.perf_counter_ns()
        model_request_facts(IMP, CHANNEL, request, len(encode_body(request.body)))
        facts_ns.append(time.perf_counter_ns() - start)
    return {"judge": _micro_us(judge_ns), "encode_and_facts": _micro_us(facts_ns)}


def _ledger_race(policy: Any, reservations: int) -> dict[str, Any]:
    """``reservations`` threads reserve at once against a budget that fits only some of them."""
    db = open_database(home() / "ledger-race.db")
    tight = dataclasses.replace(
        policy, budgets=Budgets(all=BudgetLimit(daily_usd=1.0), per_imp=BudgetLimit(daily_usd=RACE_LIMIT_USD))
    )
    ledger = Ledger(db, tight, SystemClock())
    barrier = threading.Barrier(reservations)
    latencies: list[float] = []

    def reserve() -> bool:
        barrier.wait()
        try:
            with timed(latencies):
                ledger.reserve(IMP, RACE_ESTIMATE_MICROS, method="model.request", purpose="reply")
        except BudgetExhausted:
            return False
        return True

    try:
        with ThreadPoolExecutor(reservations) as pool:
            granted = sum(pool.map(lambda _: reserve(), range(reservations)))
        limit = round(RACE_LIMIT_USD * 1_000_000)
        spent = next(row.daily_spent for row in ledger.summary() if row.scope == IMP)
        total = next(row.daily_spent for row in ledger.summary() if row.scope == ALL_IMPS)
    finally:
        db.close()
    return {
        "reservations": reservations, "granted": granted, "refused": reservations - granted,
        "limit_micros": limit, "reserved_micros": spent, "fleet_reserved_micros": total,
        "overspend_micros": max(0, spent - limit), "reserve_under_contention": summary(latencies),
    }  # fmt: skip


async def run(ctx: Context) -> dict[str, Any]:
    samples = ctx.plan.gateway_samples
    policy = load_policy()
    request = _chat_request()
    send = DiscordSendParams(
        channel_id=CHANNEL, content="hello there, nice to meet you", reply_to="m1", kind="reply"
    )
    served: list[float] = []
    upstream_only: list[float] = []
    send_gateway: list[float] = []
    send_surface: list[float] = []
    ledger_ms: list[float] = []
    audit_ms: list[float] = []
    db = open_database(home() / "gateway-bench.db")
    try:
        ChannelStore(db, SystemClock()).seen(CHANNEL, surface="discord", kind="dm")
        with fake_model(0.0) as upstream:
            surface = RecordingSurface()
            gateway = build_gateway(policy=policy, db=db, surface=surface, upstream=upstream.config())
            broker = ModelBroker(upstream.config(), policy.upstream)
            spec = BoxSpec(imp=IMP, channel_id=CHANNEL, state_dir=home() / "gateway-state")
            raw = encode_body(request.body)
            try:
                for _ in range(3):  # connections, first-use imports
                    await gateway.serve(spec, "model.request", request)
                    await broker.call(request.path, raw, request.purpose)
                ctx.progress.phase(f"gateway: {samples} requests each way", samples)
                for _ in range(samples):  # interleaved with their baselines
                    with timed(served):
                        await gateway.serve(spec, "model.request", request)
                    with timed(upstream_only):
                        await broker.call(request.path, encode_body(request.body), request.purpose)
                    with timed(send_gateway):
                        await gateway.serve(spec, "discord.send", send)
                    with timed(send_surface):
                        await surface.send(Post(send.channel_id, send.content, send.reply_to, (), send.kind))
                    with timed(ledger_ms):
                        gateway.ledger.settle(gateway.ledger.reserve(IMP, 1000, method="model.request"), 900)
                    with timed(audit_ms):
                        gateway.audit.write(AuditRecord(imp=IMP, method="model.request", verdict="allowed"))
                    ctx.progress.advance()
            finally:
                await broker.aclose()
                await gateway.aclose()
    finally:
        db.close()
    ctx.progress.phase(
        f"gateway: judge × {ctx.plan.judge_samples}, ledger race × {ctx.plan.ledger_reservations}", 2
    )
    micro = _judge_micro(policy, request, ctx.plan.judge_samples)
    ctx.progress.advance()
    race = _ledger_race(policy, ctx.plan.ledger_reservations)
    ctx.progress.advance()
    head, base = summary(served), summary(upstream_only)
    return result(
        head, baseline=base, ratio=ratio(head["p50_ms"], base["p50_ms"]), targets=TARGETS,
        met=race["overspend_micros"] == TARGETS["ledger_overspend_micros"],
        headline="Gateway.serve(model.request) vs the broker's bare call, fake model at 0 ms",
        **{f"overhead_{p}_ms": round(head[f"{p}_ms"] - base[f"{p}_ms"], 3) for p in ("p50", "p95", "p99")},
        discord_send={"gateway": summary(send_gateway), "surface_only": summary(send_surface)},
        ledger_reserve_settle=summary(ledger_ms), audit_write=summary(audit_ms), **micro, ledger_race=race,
    )  # fmt: skip


def rows(s: dict[str, Any]) -> list[Row]:
    race, send, judged = s["ledger_race"], s["discord_send"], s["judge"]
    return [
        Row(
            "gateway model.request (model at 0 ms)", s, s["baseline"]["p50_ms"], s["ratio"],
            f"overspend 0 → {race['overspend_micros']} ({race['granted']} of {race['reservations']} racing granted)", s["met"],
        ),
        Row("gateway discord.send", send["gateway"], send["surface_only"]["p50_ms"], None, "(no target)", None),
        Row(f"judge alone: p50 {judged['p50_us']} µs, p99 {judged['p99_us']} µs", {}, None, None, "(no target)", None),
    ]  # fmt: skip
