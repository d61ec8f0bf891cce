"""``impyard supervise``: scheduled and proactive work as governed one-shot boxes (issue 8; docs/tasks.md).

Modules, one concept each: ``loop`` (the ``Supervisor``: reclaim, then tick — gates, follow-ups,
schedules, departures, the memory clock, cancels, dispatch — and one task's box run), ``settings`` (``SupervisorSettings``),
``backends`` (which backend runs an imp's task boxes), ``budget`` (the pure rule that defers a task
of an imp over budget), ``fence`` (the gateway as a task run's box sees it: every act refused once the run's
lease is lost), ``orphans`` (boxes a dead supervisor left: ``/proc`` and Docker labels), ``pruning``
(finished tasks' state dirs past the retention: the pure rule ``should_remove`` and the link-safe removal), and
``assembly`` (``open_supervisor``: the instance lock, then its own host or ``serve``'s).

May import: everything below it: the foundations, ``storage``, ``backends``, ``imps``, ``channels``,
``gateway``, ``tasks``, ``memory``, ``conversation`` and the assembly (``impyard.host``).
"""

from impyard.supervisor.assembly import TERMINAL_SURFACE_NOTICE, open_supervisor
from impyard.supervisor.backends import BackendChooser, BackendFor
from impyard.supervisor.budget import budget_wait
from impyard.supervisor.loop import Supervisor
from impyard.supervisor.orphans import looks_like_box_process, remove_orphan_box
from impyard.supervisor.settings import (
    DEFAULT_CONCURRENCY,
    DEPARTURE_SCAN_S,
    DEPARTURES_ONLY,
    INIT_TIMEOUT_S,
    MAX_ATTEMPTS,
    MAX_CONCURRENCY,
    MAX_MEMORY_TICK_S,
    MEMORY_TICK_S,
    MIN_MEMORY_TICK_S,
    READY_BATCH,
    SHUTDOWN_GRACE_S,
    STALE_RUN_MARGIN_S,
    TICK_S,
    SupervisorSettings,
)

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEPARTURES_ONLY",
    "DEPARTURE_SCAN_S",
    "INIT_TIMEOUT_S",
    "MAX_ATTEMPTS",
    "MAX_CONCURRENCY",
    "MAX_MEMORY_TICK_S",
    "MEMORY_TICK_S",
    "MIN_MEMORY_TICK_S",
    "READY_BATCH",
    "SHUTDOWN_GRACE_S",
    "STALE_RUN_MARGIN_S",
    "TERMINAL_SURFACE_NOTICE",
    "TICK_S",
    "BackendChooser",
    "BackendFor",
    "Supervisor",
    "SupervisorSettings",
    "budget_wait",
    "looks_like_box_process",
    "open_supervisor",
    "remove_orphan_box",
]
