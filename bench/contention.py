"""Scenario ledger (issue 21): budget reservations per second under contention, on SQLite and on PostgreSQL, by
threads of one process and by two processes (two hosts on one database), and 0 overspend.

K workers reserve for one imp and settle each reservation at its full estimate, again and again, until the ledger
refuses them: the imp's day fits exactly FIT reservations. Each run gets a fresh database. What the ledger granted
is read back from its rows (the truth): the sum settled must never pass the cap, exactly FIT must have been granted
(none refused while there was room), nothing left in flight, and the running totals must agree with the rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.children import Child, child_env, run_together, split
from bench.harness import Context, Plan, result
from bench.ledgerload import policy
from bench.pgcluster import PostgresServer, private_server, server_version, throwaway_database
from bench.report import Row
from bench.stats import ratio, summary
from impyard.clock import FixedClock
from impyard.gateway.ledger import Ledger, day_key, day_period, month_key, month_period
from impyard.paths import home
from impyard.storage import tables
from impyard.storage.db import open_database
from impyard.threads import in_thread

ESTIMATE_MICROS = 1_000
IMP = "pip"
TARGETS = {"overspend_micros": 0, "granted": "exactly as many as fit", "in_flight": 0}
ENGINES = ("sqlite", "postgresql")
MODES = {"threads": 1, "processes": 2}  # mode: processes the K workers are split among


@dataclass(frozen=True)
class Contention:
    workers: int  # K, in all
    fit: int  # reservations the imp's day has room for

    @classmethod
    def of(cls, plan: Plan) -> Contention:
        return cls(workers=plan.ledger_workers, fit=plan.ledger_fit)

    @property
    def cap_micros(self) -> int:
        return self.fit * ESTIMATE_MICROS + ESTIMATE_MICROS // 2  # FIT fit, one more would not


def verdict(
    cap_micros: int,
    estimate_micros: int,
    granted: int,
    settled_micros: int,
    in_flight: int,
    totals_agree: bool,
) -> dict[str, Any]:
    """What the ledger's rows say of one run: overspend (the sum settled past the cap), whether exactly as many
    reservations were granted as fit, and whether the run is clean (met)."""
    fit = cap_micros // estimate_micros
    overspend = max(0, settled_micros - cap_micros)
    return {
        "cap_micros": cap_micros, "fit": fit, "granted": granted, "settled_micros": settled_micros,
        "overspend_micros": overspend, "in_flight": in_flight, "totals_agree": totals_agree,
        "met": overspend == 0 and granted == fit and settled_micros == granted * estimate_micros
        and in_flight == 0 and totals_agree,
    }  # fmt: skip


def _rows_say(url: str, cap_micros: int, at: datetime) -> dict[str, Any]:
    """Read back, from the ledger's rows and its running totals, what a run left."""
    db = open_database(url=url)
    try:
        ledger = Ledger(db, policy(cap_micros), FixedClock(at))
        with db.begin(read_only=True) as conn:
            states: dict[str, int] = dict(
                conn.execute(
                    sa.select(tables.ledger.c.state, sa.func.count())
                    .where(tables.ledger.c.imp == IMP)
                    .group_by(tables.ledger.c.state)
                ).all()
            )
        settled = ledger.settled_total(IMP)
        totals = ledger.totals()
        expected = {
            (scope, period): (0, settled)
            for scope in (IMP, "*")
            for period in (day_period(day_key(at)), month_period(month_key(at)))
        }
        return verdict(
            cap_micros, ESTIMATE_MICROS, int(states.get("settled", 0)), settled, int(states.get("reserved", 0)),
            totals == expected,
        )  # fmt: skip
    finally:
        db.close()


def merge(answers: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The workers' answers as one run: every pair's latency, pairs granted per second from the first worker's
    start to the last one's end, which windows refused them, and any error."""
    pairs = [value for answer in answers for value in answer["pairs_ms"]]
    wall_s = max(answer["ended"] for answer in answers) - min(answer["began"] for answer in answers)
    return {
        **summary(pairs), "processes": len(answers), "workers": sum(answer["threads"] for answer in answers),
        "wall_s": round(wall_s, 3), "pairs_per_s": round(len(pairs) / wall_s, 1) if wall_s > 0 else None,
        "granted_by_workers": sum(answer["granted"] for answer in answers),
        "refused_by": sorted({window for answer in answers for window in answer["refused_by"]}),
        "errors": [error for answer in answers for error in answer["errors"]],
        "dialects": sorted({answer["dialect"] for answer in answers}),
        "caps_read": sorted({answer["cap_micros"] for answer in answers}),
    }  # fmt: skip


async def _one(ctx: Context, engine: str, mode: str, url: str, load: Contention) -> dict[str, Any]:
    processes = MODES[mode]
    ctx.progress.phase(f"ledger, {engine}: {load.workers} workers in {processes} process(es)", 1)
    open_database(url=url).close()  # migrated before any worker opens it
    at = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0)  # one day for every worker
    env = child_env(IMPYARD_DATABASE_URL=url)
    children = [
        Child(f"ledger worker process {index} ({engine}, {mode})", "bench.ledgerload",
              [IMP, str(threads), str(ESTIMATE_MICROS), str(load.cap_micros), at.isoformat(), str(load.fit + 1)], env)
        for index, threads in enumerate(split(load.workers, processes))
    ]  # fmt: skip
    merged = merge(await in_thread(run_together, children))
    if merged["dialects"] != [engine] or merged["caps_read"] != [load.cap_micros]:
        raise RuntimeError(f"the workers ran on {merged['dialects']} with caps {merged['caps_read']}")
    checked = await in_thread(_rows_say, url, load.cap_micros, at)
    ctx.progress.advance()
    clean = checked["met"] and not merged["errors"] and merged["granted_by_workers"] == checked["granted"]
    return {**merged, **checked, "met": clean and merged["refused_by"] == [f"imp:{IMP}/day"]}


@contextmanager
def _fresh(engine: str, server: PostgresServer | None, mode: str) -> Iterator[str]:
    """A fresh database of ``engine`` for one run: its URL."""
    if engine == "sqlite":
        yield f"sqlite:///{Path(home()) / f'ledger-contention-{mode}.db'}"
        return
    assert server is not None
    with throwaway_database(server, "impyard_bench_ledger") as name:
        yield server.url_of(name)


async def run(ctx: Context) -> dict[str, Any]:
    load = Contention.of(ctx.plan)
    engines: dict[str, Any] = {}
    postgres: str | None = None
    with private_server(crash_safe=True) as server:
        for engine in ENGINES:
            pg = server if isinstance(server, PostgresServer) else None
            if engine == "postgresql":
                if pg is None:
                    engines[engine] = {"skipped": f"skipped: {server}"}
                    continue
                postgres = server_version(pg)
            engines[engine] = {}
            for mode in MODES:
                with _fresh(engine, pg, mode) as url:
                    engines[engine][mode] = await _one(ctx, engine, mode, url, load)
    base = engines["sqlite"]["threads"]
    measured = [v for runs in engines.values() if "skipped" not in runs for v in runs.values()]
    for v in measured:
        v["vs_sqlite_threads"] = ratio(v["pairs_per_s"], base["pairs_per_s"])
    head = engines["postgresql"]["processes"] if "skipped" not in engines["postgresql"] else base
    return result(
        head, baseline=base, ratio=ratio(head["pairs_per_s"], base["pairs_per_s"]), targets=TARGETS,
        met=all(v["met"] for v in measured), headline="reserve+settle pairs/s, two processes on PostgreSQL "
        "against threads of one process on SQLite", workers=load.workers, fit=load.fit,
        estimate_micros=ESTIMATE_MICROS, overspend_micros=sum(v["overspend_micros"] for v in measured),
        postgres=postgres, engines=engines,
    )  # fmt: skip


def rows(s: dict[str, Any]) -> list[Row]:
    out = []
    for engine, runs in s["engines"].items():
        if "skipped" in runs:
            out.append(Row(f"ledger contention, {engine}", {}, None, None, runs["skipped"], None))
            continue
        for mode, v in runs.items():
            where = f"{v['workers']} threads in 1 process" if mode == "threads" else (
                f"{v['workers']} workers in {v['processes']} processes"
            )  # fmt: skip
            target = (
                f"overspend 0 → {v['overspend_micros']}; {v['granted']} of {v['fit']} granted; "
                f"{v['pairs_per_s']} reservations/s"
            )
            out.append(
                Row(f"ledger reserve+settle, {engine}, {where}", v, s["baseline"]["p50_ms"],
                    ratio(v["p50_ms"], s["baseline"]["p50_ms"]), target, v["met"])
            )  # fmt: skip
    return out
