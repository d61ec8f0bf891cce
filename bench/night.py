"""Scenario 8, a night (issue 15, mechanisms 107-113): consolidation and forgetting over a large memory.

Per size in ``Plan.night_sizes`` (10,000 / 100,000 records, one episode each, seeded through the store's own
insert path with ages spread over half a year and intensities from 0.05 to 1, as ``bench.memory.seed`` does),
plus 20 records lived since the imp woke (3 hours ago): a ``sleep`` task for that scope, queued as the memory
clock queues one, is run by a sleep-only supervisor in a real process box (``python -m box``) against the
fixed-latency fake model (its plan folds records 2 and 3 into record 1). Measured: the task's wall time, the
box's peak RSS (``VmHWM`` of its process, sampled while it runs), the records before and after, the database
file before and after the night and its compaction. The baseline is the same night over an imp that
remembers only the 20 records of the day: the ratio is what a large memory adds to a night.
"""

from __future__ import annotations

import time
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from sqlalchemy.engine import Connection

from bench.harness import PERSONA, TURN_MODEL_LATENCY_S, Context, TimingSurface, fake_model, result
from bench.memory import near, seed, unit_rows
from bench.report import Row
from bench.stats import ratio
from impyard.clock import iso
from impyard.imps.config import ImpExists
from impyard.imps.store import ImpStore
from impyard.memory.act import memory_service_of
from impyard.memory.scopes import TERMINAL
from impyard.memory.store import MemoryStore
from impyard.runtime import open_runtime
from impyard.storage.db import Database, open_database
from impyard.supervisor import Supervisor, SupervisorSettings
from impyard.tasks import TaskRequest, TaskStore
from impyard.threads import in_thread

DAY_RECORDS = 20  # lived since waking: what the night's plan folds
WOKE_HOURS = 3
RSS_SAMPLE_S = 0.02
DIMS = 64  # the hashing embedder's vectors: the night embeds nothing; the size only sets the store's bytes


def _rss_hwm_kib(pid: int) -> int | None:
    with suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return None


def _db_bytes(db: Database) -> int:
    def measure(conn: Connection) -> int:
        pages = int(conn.exec_driver_sql("PRAGMA page_count").scalar_one())
        return pages * int(conn.exec_driver_sql("PRAGMA page_size").scalar_one())

    return db.read(measure)


async def _night(ctx: Context, imp: str, remembered: int) -> dict[str, Any]:
    backend = ctx.backends["process"]
    with suppress(ImpExists):
        ImpStore().add(imp, PERSONA, memory={"enabled": True, "embedder": "hashing"})
    now = datetime.now(UTC)
    await in_thread(_seed, imp, remembered, now)  # before the host starts: its pump never waits
    surface = TimingSurface()
    async with open_runtime([imp], surface, backends={imp: backend}, surfaces=("discord",)) as runtime:
        memory = memory_service_of(runtime.gateway)
        assert memory is not None, "the host keeps no memory store"
        before = await runtime.db.run(memory.store.count, imp)
        size_before = await runtime.db.run(_db_bytes, runtime.db)
        tasks = TaskStore(runtime.db, runtime.gateway.clock)
        since = now - timedelta(hours=WOKE_HOURS)
        task = await runtime.db.run(
            tasks.add,
            TaskRequest(
                imp, None, kind="sleep", scope=TERMINAL, args={"since": iso(since), "consolidate": True}
            ),
        )
        supervisor = Supervisor(
            db=runtime.db, gateway=runtime.gateway, imps=ImpStore(), backend_for=lambda _: backend,
            settings=SupervisorSettings(kinds=frozenset({"sleep"})),
        )  # fmt: skip
        peak = 0
        done = anyio.Event()

        async def sample() -> None:
            nonlocal peak
            while not done.is_set():
                run = await runtime.db.run(tasks.get, task.id)
                facts = await runtime.db.run(tasks.run, run.run_id) if run.run_id else None
                if facts is not None and facts.box_pid:
                    peak = max(peak, _rss_hwm_kib(facts.box_pid) or 0)
                await anyio.sleep(RSS_SAMPLE_S)

        began = time.perf_counter()
        async with anyio.create_task_group() as tg:
            tg.start_soon(sample)
            await supervisor.run(once=True)
            done.set()
        wall_ms = (time.perf_counter() - began) * 1000
        finished = await runtime.db.run(tasks.get, task.id)
        after = await runtime.db.run(memory.store.count, imp)
        size_after = await runtime.db.run(_db_bytes, runtime.db)  # the supervisor compacts after a night
        await runtime.db.run(memory.store.forget_imp, imp)  # leave the bench home as it was
    return {
        "state": finished.state, "summary": (finished.box_summary or "")[:300], "wall_ms": round(wall_ms, 1),
        "box_peak_rss_mib": round(peak / 1024, 1) if peak else None, "records_before": before,
        "records_after": after, "db_mib_before": round(size_before / 2**20, 1),
        "db_mib_after": round(size_after / 2**20, 1),
    }  # fmt: skip


def _seed(imp: str, remembered: int, now: datetime) -> None:
    """``remembered`` records over half a year, then the day's 20, through the store's own insert path."""
    db = open_database()
    try:
        store = MemoryStore(db, lambda: now)
        rng = np.random.default_rng(11)
        if remembered:
            rows = unit_rows(rng, remembered, DIMS)
            seed(store, imp, TERMINAL, rows, near(rng, rows, 0.8), now - timedelta(days=1))
        day = unit_rows(rng, DAY_RECORDS, DIMS)
        seed(store, imp, TERMINAL, day, near(rng, day, 0.8), now, seed_value=1)  # re-dated to the day below
        _redate_day(db, imp, now)
    finally:
        db.close()


def _redate_day(db: Database, imp: str, now: datetime) -> None:
    """The day's records (the newest seeded ones) lived within the last hours: what the night folds."""
    with db.begin() as conn:
        rows = conn.exec_driver_sql(
            "SELECT id FROM memory_records WHERE imp = ? AND conclusion LIKE '%thing %' ORDER BY created_at DESC,"
            " rowid DESC LIMIT ?",
            (imp, DAY_RECORDS),
        ).fetchall()
        for n, row in enumerate(rows):
            at = iso(now - timedelta(minutes=5 * (n + 1)))
            conn.exec_driver_sql(
                "UPDATE memory_records SET happened_at = ?, last_felt = ?, intensity = 0.7 WHERE id = ?",
                (at, at, row[0]),
            )
            conn.exec_driver_sql(
                "UPDATE memory_episodes SET happened_at = ? WHERE record_id = ?", (at, row[0])
            )


async def run(ctx: Context) -> dict[str, Any]:
    sizes = ctx.plan.night_sizes
    ctx.progress.phase(f"a night: {' / '.join(f'{s:,}' for s in sizes)} records", len(sizes) + 1)
    with fake_model(TURN_MODEL_LATENCY_S):
        base = await _night(ctx, "night-base", 0)
        ctx.progress.advance()
        figures: dict[str, Any] = {}
        for size in sizes:
            figures[str(size)] = await _night(ctx, f"night-{size}", size)
            ctx.progress.advance()
    head = figures[str(max(sizes))]
    met = all(f["state"] == "done" for f in [base, *figures.values()])
    stats = {"samples": 1, "p50_ms": head["wall_ms"], "p95_ms": head["wall_ms"], "p99_ms": head["wall_ms"]}
    baseline = {"samples": 1, "p50_ms": base["wall_ms"], "p95_ms": base["wall_ms"], "p99_ms": base["wall_ms"]}
    return result(
        stats, baseline=baseline, ratio=ratio(head["wall_ms"], base["wall_ms"]), targets={"state": "done"},
        met=met, checks={"every_night_done": met}, sizes=figures, base=base,
    )  # fmt: skip


def rows(s: dict[str, Any]) -> list[Row]:
    out = []
    for size, f in s["sizes"].items():
        stats = {"samples": 1, "p50_ms": f["wall_ms"], "p95_ms": f["wall_ms"], "p99_ms": f["wall_ms"]}
        out.append(
            Row(
                f"a night over {int(size):,} records (process)",
                stats,
                s["base"]["wall_ms"],
                ratio(f["wall_ms"], s["base"]["wall_ms"]),
                f"{f['state']}: {f['summary']}; records {f['records_before']:,} → {f['records_after']:,}; "
                f"box peak RSS {f['box_peak_rss_mib']} MiB; database {f['db_mib_before']} → {f['db_mib_after']} MiB "
                "(compacted when it pays)",
                f["state"] == "done",
            )
        )
    return out
