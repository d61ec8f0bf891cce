"""Scenario hosts (issue 21, "Beyond one machine"): the same load on one host with SQLite, on one host with one
PostgreSQL database, and on two host processes sharing that PostgreSQL database, each serving half the channels
from its own IMPYARD_HOME (docs/hosts.md). Turns/s and p50/p99 side by side, each against one host on SQLite from
the same run.

Every host is a real process (``python -m bench.hostload``): the full host assembly on the process backend, the
fake model at 20 ms a call, SESSIONS warm channel sessions in all, each sending MESSAGES messages one after
another, all at once. The PostgreSQL server is a private cluster of Debian's binaries (``bench.pgcluster``); where
none can run, its rows say why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.children import Child, child_env, run_together, split
from bench.harness import TURN_MODEL_LATENCY_S, Context, Plan, fake_model, result
from bench.pgcluster import PostgresServer, private_server, server_version, throwaway_database
from bench.report import Row
from bench.stats import ratio, summary
from impyard.storage.db import open_database
from impyard.threads import in_thread

TARGETS = {"lost": 0, "duplicated": 0}
BASE = "sqlite"
VARIANTS = {  # name: (engine, host processes)
    "sqlite": ("sqlite", 1),
    "postgresql": ("postgresql", 1),
    "two_hosts": ("postgresql", 2),
}
LABELS = {
    "sqlite": "one host, SQLite",
    "postgresql": "one host, one PostgreSQL",
    "two_hosts": "two host processes, one PostgreSQL",
}


@dataclass(frozen=True)
class Load:
    sessions: int  # warm channel sessions in all, split among the hosts
    messages: int  # per session, after the message that started its box

    @classmethod
    def of(cls, plan: Plan) -> Load:
        return cls(sessions=plan.hosts_sessions, messages=plan.hosts_messages)


def merge(answers: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The hosts' answers as one load: every turn's latency, turns answered per second from the first host's start
    to the last host's end, what was lost or answered twice, the hosts' CPU per turn."""
    latencies = [value for answer in answers for value in answer["latencies_ms"]]
    wall_s = max(answer["ended"] for answer in answers) - min(answer["began"] for answer in answers)
    turns = sum(answer["turns"] for answer in answers)
    return {
        **summary(latencies), "hosts": len(answers), "turns": turns, "wall_s": round(wall_s, 3),
        "turns_per_s": round(len(latencies) / wall_s, 1) if wall_s > 0 else None,
        "per_host_turns": [len(answer["latencies_ms"]) for answer in answers],
        "lost": sum(answer["lost"] for answer in answers),
        "duplicated": sum(answer["duplicated"] for answer in answers),
        "host_cpu_ms_per_turn": round(sum(answer["cpu_s"] for answer in answers) * 1000 / turns, 2) if turns else None,
        "dialects": sorted({answer["dialect"] for answer in answers}),
    }  # fmt: skip


def against(variant: dict[str, Any], base: dict[str, Any]) -> dict[str, float | None]:
    """A variant's throughput, p50 and p99 as multiples of the base's (more turns/s is better, less ms is)."""
    return {
        "turns_per_s": ratio(variant["turns_per_s"], base["turns_per_s"]),
        "p50": ratio(variant["p50_ms"], base["p50_ms"]),
        "p99": ratio(variant["p99_ms"], base["p99_ms"]),
    }


async def _measure(ctx: Context, name: str, load: Load, url: str | None) -> dict[str, Any]:
    engine, hosts = VARIANTS[name]
    ctx.progress.phase(f"hosts, {LABELS[name]}: {load.sessions} sessions × {load.messages} messages", 1)
    env = child_env(IMPYARD_DATABASE_URL=url)  # the one database every host of the variant shares
    children = [
        Child(f"host {index} of {LABELS[name]}", "bench.hostload",
              [str(index), f"hosts-{name}-h{index}-", str(count), str(load.messages)], env)
        for index, count in enumerate(split(load.sessions, hosts))
    ]  # fmt: skip
    answers = await in_thread(run_together, children)
    merged = merge(answers)
    if merged["dialects"] != [engine]:
        raise RuntimeError(f"{LABELS[name]} ran on {merged['dialects']}, not {engine}")
    ctx.progress.advance()
    return merged


async def _on_postgres(ctx: Context, server: PostgresServer, name: str, load: Load) -> dict[str, Any]:
    with throwaway_database(server, f"impyard_bench_{name}") as database:
        url = server.url_of(database)
        open_database(url=url).close()  # migrated before any host opens it
        return await _measure(ctx, name, load, url)


async def run(ctx: Context) -> dict[str, Any]:
    load = Load.of(ctx.plan)
    variants: dict[str, Any] = {}
    postgres: str | None = None
    with fake_model(TURN_MODEL_LATENCY_S):
        variants[BASE] = await _measure(ctx, BASE, load, None)
        with private_server(crash_safe=True) as server:
            if isinstance(server, str):
                skipped = f"skipped: {server}"
                variants.update({name: {"skipped": skipped} for name in VARIANTS if name != BASE})
            else:
                postgres = server_version(server)
                for name in VARIANTS:
                    if name != BASE:
                        variants[name] = await _on_postgres(ctx, server, name, load)
    base = variants[BASE]
    measured = {name: v for name, v in variants.items() if "skipped" not in v}
    for v in measured.values():
        v["vs_sqlite"] = against(v, base)
    head = variants["two_hosts"] if "two_hosts" in measured else base
    met = all(v["lost"] == v["duplicated"] == 0 for v in measured.values())
    return result(
        head, baseline=base, ratio=ratio(head["turns_per_s"], base["turns_per_s"]), targets=TARGETS, met=met,
        headline="two host processes on one PostgreSQL against one host on SQLite: turns/s", backend="process",
        sessions=load.sessions, messages=load.messages, model_latency_ms=TURN_MODEL_LATENCY_S * 1000,
        postgres=postgres, variants=variants,
    )  # fmt: skip


def times(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def rows(s: dict[str, Any]) -> list[Row]:
    out = []
    load = f"{s['sessions']} sessions × {s['messages']} messages"
    for name, v in s["variants"].items():
        figure = f"hosts: {LABELS[name]}, {load}, {s['backend']}"
        if "skipped" in v:
            out.append(Row(figure, {}, None, None, v["skipped"], None))
            continue
        vs = v["vs_sqlite"]
        target = (
            f"{v['turns_per_s']} turns/s ({times(vs['turns_per_s'])} SQLite); p99 {v['p99_ms']:,.0f} ms "
            f"({times(vs['p99'])}); lost {v['lost']}, dup {v['duplicated']}"
        )
        out.append(
            Row(figure, v, s["baseline"]["p50_ms"], vs["p50"], target, v["lost"] == v["duplicated"] == 0)
        )
    return out
