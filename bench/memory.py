"""Scenario 6, memory: recall at 1,000 / 10,000 / 100,000 records (hashing embedder, fixed seed) and the turn's
memory overhead (ContextBuilding + PostSend) against a memory-less turn.

The memory engine is not built yet (box/memory.py holds only its seam), so both report that, never numbers.
When it lands: seed the store with the hashing embedder, time ``recall`` per size here, and run the warm turn
scenario with ``[memory] enabled = true`` against the memory-less turn.
"""

from __future__ import annotations

from typing import Any

from bench.harness import Context, result
from bench.report import Row

NOT_BUILT = "not built yet"
RECALL_TARGETS = {"recall_p50_ms_at_100000": 50.0}


async def recall(ctx: Context) -> dict[str, Any]:
    sizes = {str(size): {"status": NOT_BUILT} for size in ctx.plan.memory_sizes}
    return result(
        {"samples": 0},
        baseline=None,
        ratio=None,
        targets=RECALL_TARGETS,
        met=False,
        status=NOT_BUILT,
        sizes=sizes,
    )


async def turn_overhead(ctx: Context) -> dict[str, Any]:
    return result(
        {"samples": 0}, baseline=None, ratio=None, targets={"note": "no design.md §11 target; reported against a memory-less turn"},
        met=False, status=NOT_BUILT,
    )  # fmt: skip


def rows(s: dict[str, Any]) -> list[Row]:
    return [Row(s.get("figure", "memory"), s, None, None, s["status"], None)]
