"""The supervisor's settings: concurrency, tick, attempts, ceilings, the kinds (and imps) it runs, the memory
clock's cadence, how long a finished task's state dir is kept, its task runs' leases, and their bounds."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from impyard.durations import DurationError, format_duration, parse_duration
from impyard.errors import ImpyardError
from impyard.storage.lease_rules import DEFAULT_TTL, RENEW_EVERY
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
# A finished task's own /state (its call log and scratch) is removed this long after it finished.
TASK_STATE_RETENTION = timedelta(days=7)
MIN_TASK_STATE_RETENTION = timedelta(hours=1)  # a task's state is evidence for a report: never gone at once
MAX_TASK_STATE_RETENTION = timedelta(days=3650)  # longer is "off"
TASK_STATE_RETENTION_ENV = "IMPYARD_TASK_STATE_RETENTION"  # the operator's key: "7d", "36h", or "off"
RETENTION_OFF = ("off", "never")
# How often finished tasks' state dirs are looked for (a tick later again while a backlog lasts).
PRUNE_EVERY_S = 300.0
# State dirs removed at most per pass (about 0.3 s of a worker thread): a backlog drains in bounded steps.
PRUNE_BATCH = 1_000
# Issue 21: how often the tasks other hosts left running are looked at again, to reclaim those whose run lease
# expired or whose holder died (a run's lease is renewed every 10 s and lives 30 s).
RECLAIM_EVERY_S = 10.0


class SettingsError(ImpyardError, ValueError):
    """A supervisor setting the operator wrote that cannot be used; the message names it and says what to write."""


def task_state_retention_from_env(environ: Mapping[str, str] | None = None) -> timedelta | None:
    """``IMPYARD_TASK_STATE_RETENTION``: how long a finished task's state dir is kept (default 7 days); ``off``
    (or ``never``) keeps them all. ``SettingsError`` naming the variable for anything else."""
    raw = (os.environ if environ is None else environ).get(TASK_STATE_RETENTION_ENV, "").strip()
    if not raw:
        return TASK_STATE_RETENTION
    if raw.lower() in RETENTION_OFF:
        return None
    try:
        value = parse_duration(raw, what=TASK_STATE_RETENTION_ENV)
    except DurationError as exc:
        raise SettingsError(f"{exc}, or off to keep every task's state") from None
    problem = retention_problem(value)
    if problem is not None:
        raise SettingsError(f"{TASK_STATE_RETENTION_ENV} {raw[:40]!r}: {problem}")
    return value


def retention_problem(value: timedelta) -> str | None:
    """Why ``value`` cannot be the task state retention, or None."""
    if not MIN_TASK_STATE_RETENTION <= value <= MAX_TASK_STATE_RETENTION:
        return (
            f"the task state retention must be from {format_duration(MIN_TASK_STATE_RETENTION)} to "
            f"{format_duration(MAX_TASK_STATE_RETENTION)} (got {format_duration(value)}); write off to keep "
            "every task's state"
        )
    return None


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
    # A finished task's state dir is removed this long after it finished (None: never); only the supervisor of
    # every kind prunes (impyard.supervisor.pruning). The operator sets it with IMPYARD_TASK_STATE_RETENTION.
    task_state_retention: timedelta | None = field(default_factory=task_state_retention_from_env)
    prune_every_s: float = PRUNE_EVERY_S
    prune_batch: int = PRUNE_BATCH
    # Issue 21: each task run holds the lease task:<task>/<run> from its claim to its end, renewed every
    # run_lease_renew_s, living run_lease_ttl_s without a renewal (tests shorten both); tasks left running by
    # other hosts are looked at every reclaim_every_s and reclaimed once their run's lease may be taken over.
    run_lease_ttl_s: float = DEFAULT_TTL.total_seconds()
    run_lease_renew_s: float = RENEW_EVERY.total_seconds()
    reclaim_every_s: float = RECLAIM_EVERY_S

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
        if self.task_state_retention is not None:
            problem = retention_problem(self.task_state_retention)
            if problem is not None:
                raise SettingsError(problem)
        if self.prune_every_s <= 0:
            raise ValueError("prune_every_s must be more than 0")
        if self.prune_batch < 1:
            raise ValueError("prune_batch must be at least 1")
        if not 0 < self.run_lease_renew_s < self.run_lease_ttl_s:
            raise ValueError(
                "run_lease_renew_s must be more than 0 and less than run_lease_ttl_s (a lease is renewed before it "
                f"expires; got {self.run_lease_renew_s:g} and {self.run_lease_ttl_s:g} s)"
            )
        if self.reclaim_every_s <= 0:
            raise ValueError("reclaim_every_s must be more than 0")

    @property
    def prunes(self) -> bool:
        """Whether this supervisor prunes finished tasks' state dirs: only the supervisor of every kind and
        every imp (one per home, under its lock), and only while a retention is set."""
        return self.kinds is None and self.imps is None and self.task_state_retention is not None

    def runs(self, kind: str) -> bool:
        """Whether this supervisor runs tasks of ``kind``."""
        return self.kinds is None or kind in self.kinds

    def serves(self, imp: str) -> bool:
        """Whether this supervisor runs tasks of ``imp``."""
        return self.imps is None or imp in self.imps
