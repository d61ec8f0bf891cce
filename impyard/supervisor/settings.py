"""The supervisor's settings: concurrency, tick, attempts, ceilings, and their bounds."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_CONCURRENCY = 3
MAX_CONCURRENCY = 64
TICK_S = 0.5  # dispatch latency: a due task starts within one tick when a slot is free
INIT_TIMEOUT_S = 60.0
SHUTDOWN_GRACE_S = 10.0
MAX_ATTEMPTS = 3  # a task interrupted this often by a dying supervisor is failed, not retried
READY_BATCH = 100


@dataclass(frozen=True)
class SupervisorSettings:
    concurrency: int = DEFAULT_CONCURRENCY
    tick_s: float = TICK_S
    max_attempts: int = MAX_ATTEMPTS
    max_ceiling_s: float | None = None  # caps every task's own ceiling (an operator limit; tests use it)
    init_timeout_s: float = INIT_TIMEOUT_S
    shutdown_grace_s: float = SHUTDOWN_GRACE_S

    def __post_init__(self) -> None:
        if not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"concurrency must be from 1 to {MAX_CONCURRENCY} (got {self.concurrency})")
        if not 0 < self.tick_s <= 1.0:
            raise ValueError("tick_s must be more than 0 and at most 1 s (the dispatch latency bound)")
