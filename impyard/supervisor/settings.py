"""The supervisor's settings: concurrency, tick, attempts, ceilings, the kinds (and imps) it runs, the memory
clock's cadence, and their bounds."""

from __future__ import annotations

from dataclasses import dataclass

from impyard.tasks import KIND_PATTERN

DEFAULT_CONCURRENCY = 3
MAX_CONCURRENCY = 64
TICK_S = 0.5  # dispatch latency: a due task starts within one tick when a slot is free
INIT_TIMEOUT_S = 60.0
SHUTDOWN_GRACE_S = 10.0
MAX_ATTEMPTS = 3  # a task interrupted this often by a dying supervisor is failed, not retried
READY_BATCH = 100
DEPARTURE_SCAN_S = 30.0  # how often the departures due are looked for (mechanism 103; a 1800 s window)
STALE_RUN_MARGIN_S = 60.0  # past its ceiling by this much, a running task has no live supervisor left
DEPARTURES_ONLY = frozenset({"depart"})  # the kinds of the supervisor `impyard chat` and `serve` run alone
MEMORY_TICK_S = 30.0  # how often the memory clock ticks every memory imp (mechanisms 104-107)
MIN_MEMORY_TICK_S = 1.0
MAX_MEMORY_TICK_S = 600.0  # the clock's timers are 600 s: a slower tick would blur them
BLOCKED_RECHECK_S = 5.0  # issue 19 #6: a task held for a broken imp.toml looks at the file again this often


@dataclass(frozen=True)
class SupervisorSettings:
    concurrency: int = DEFAULT_CONCURRENCY
    tick_s: float = TICK_S
    max_attempts: int = MAX_ATTEMPTS
    max_ceiling_s: float | None = None  # caps every task's own ceiling (an operator limit; tests use it)
    init_timeout_s: float = INIT_TIMEOUT_S
    shutdown_grace_s: float = SHUTDOWN_GRACE_S
    # Only these task kinds (None: every kind). A kinds-limited supervisor takes no lock: it runs beside
    # `impyard supervise`, fires no schedules, queues no follow-ups, and reclaims only its own kinds' tasks
    # that ran past their ceiling (no live supervisor can still be running them).
    kinds: frozenset[str] | None = None
    departure_scan_s: float = DEPARTURE_SCAN_S
    # Only these imps' tasks (None: every imp's); `impyard memory night IMP` runs one imp's sleep alone.
    imps: frozenset[str] | None = None
    # The memory clock (impyard.memory.wakefulness) ticks every memory imp this often; only the supervisor
    # of every kind runs it (kinds None), never the departures loop of `chat` and `serve`.
    memory_tick_s: float = MEMORY_TICK_S
    # A task whose imp.toml is broken is held (issue 19 #6) and looked at again this often.
    blocked_recheck_s: float = BLOCKED_RECHECK_S

    def __post_init__(self) -> None:
        if not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"concurrency must be from 1 to {MAX_CONCURRENCY} (got {self.concurrency})")
        if not 0 < self.tick_s <= 1.0:
            raise ValueError("tick_s must be more than 0 and at most 1 s (the dispatch latency bound)")
        if self.kinds is not None and (
            not self.kinds or not all(KIND_PATTERN.match(kind) for kind in self.kinds)
        ):
            raise ValueError(
                "kinds must name at least one task kind (lowercase letters, digits, underscores)"
            )
        if self.departure_scan_s <= 0:
            raise ValueError("departure_scan_s must be more than 0")
        if self.imps is not None and not self.imps:
            raise ValueError("imps must name at least one imp (None: every imp)")
        if self.blocked_recheck_s <= 0:
            raise ValueError("blocked_recheck_s must be more than 0")
        if not MIN_MEMORY_TICK_S <= self.memory_tick_s <= MAX_MEMORY_TICK_S:
            raise ValueError(
                f"memory_tick_s must be from {MIN_MEMORY_TICK_S:g} to {MAX_MEMORY_TICK_S:g} s (got {self.memory_tick_s:g})"
            )

    def runs(self, kind: str) -> bool:
        """Whether this supervisor runs tasks of ``kind``."""
        return self.kinds is None or kind in self.kinds

    def serves(self, imp: str) -> bool:
        """Whether this supervisor runs tasks of ``imp``."""
        return self.imps is None or imp in self.imps
