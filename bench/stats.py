"""The one percentile helper and the one timing helper every scenario uses."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), ``q`` in [0, 100]."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(values_ms: Sequence[float]) -> dict[str, Any]:
    """samples, p50/p95/p99 and mean in milliseconds (None where there are no samples)."""
    if not values_ms:
        return {"samples": 0, "p50_ms": None, "p95_ms": None, "p99_ms": None, "mean_ms": None}
    return {
        "samples": len(values_ms),
        "p50_ms": round(percentile(values_ms, 50), 3),
        "p95_ms": round(percentile(values_ms, 95), 3),
        "p99_ms": round(percentile(values_ms, 99), 3),
        "mean_ms": round(sum(values_ms) / len(values_ms), 3),
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)


def since_ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000


@contextmanager
def timed(into: list[float]) -> Iterator[None]:
    """Append the block's wall time in milliseconds to ``into``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        into.append(since_ms(start))
