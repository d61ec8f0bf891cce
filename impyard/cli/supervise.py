"""``impyard supervise``: run scheduled and queued tasks in governed one-shot boxes (issue 8)."""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack

import anyio
import click

from impyard.backends import BoxError
from impyard.backends.stateroot import state_root
from impyard.cli.errors import CliError
from impyard.cli.health import metrics_options
from impyard.gateway.broker import UpstreamConfig
from impyard.gateway.policy import PolicyError
from impyard.imps.store import ImpError
from impyard.metrics.http import HealthPortError, Phase, ReadyCheck, serve_health
from impyard.stop_signals import stop_signals
from impyard.storage.db import DatabaseError
from impyard.storage.instance import AlreadyRunning
from impyard.storage.readiness import database_check
from impyard.supervisor import (
    DEFAULT_CONCURRENCY,
    MAX_CONCURRENCY,
    MAX_MEMORY_TICK_S,
    MEMORY_TICK_S,
    MIN_MEMORY_TICK_S,
    SupervisorSettings,
    open_supervisor,
)
from impyard.supervisor.settings import SettingsError, task_state_retention_from_env

NO_KEY = (
    "no model key is configured: export OPENAI_API_KEY=sk-... (and, for any OpenAI-compatible server, "
    "OPENAI_BASE_URL=http://host:port/v1), then run impyard supervise again"
)
TRANSITION_LOGGERS = (
    "impyard.metrics",
    "impyard.supervisor",
    "impyard.tasks",
    "impyard.tasks.schedules",
    "impyard.memory.wakefulness",
    "impyard.runtime",  # issue 36: a new revision of an imp's settings reached this home
)


async def supervise(
    concurrency: int,
    once: bool,
    backend: str | None,
    memory_tick_s: float = MEMORY_TICK_S,
    *,
    metrics_host: str | None = None,
    metrics_port: int | None = None,
) -> None:
    """The loop, stopped cleanly by SIGINT or SIGTERM (a second signal stops at once).

    The signals are received before anything starts (``impyard.stop_signals``): one that arrives while the health
    server opens, the lock is taken or the host opens stops the start, and what started is closed. ``metrics_port``:
    ``/metrics``, ``/healthz`` and ``/readyz`` from before the lock is taken to after the loop stopped; ready
    while the loop runs and its database answers (a standalone supervisor holds no lease for its life: each
    task run holds its own, and a run that loses it is stopped alone).
    """
    log = logging.getLogger("impyard.supervisor")
    stop = anyio.Event()
    phase = Phase("starting: taking the lock and opening the host")
    checks: list[ReadyCheck] = [phase.check]
    async with stop_signals(log, "supervising") as signals, AsyncExitStack() as health:
        if metrics_port is not None:
            await health.enter_async_context(serve_health(metrics_host, metrics_port, checks))
        async with open_supervisor(
            backend=backend, settings=SupervisorSettings(concurrency=concurrency, memory_tick_s=memory_tick_s)
        ) as supervisor:
            checks.append(database_check(supervisor.db))
            phase.ready()

            def first(name: str) -> None:
                log.warning("%s: finishing running tasks (again to stop now; they are requeued)", name)
                stop.set()

            signals.serving(first, again=lambda name: signals.stop_now())
            try:
                await supervisor.run(once=once, stop=stop)
            finally:
                phase.stopping()


@click.command("supervise")
@click.option(
    "--concurrency", type=click.IntRange(1, MAX_CONCURRENCY), default=DEFAULT_CONCURRENCY, show_default=True,
    help="Most task boxes running at once.",
)  # fmt: skip
@click.option(
    "--once", is_flag=True, help="Run what is due (and what it queues), then exit: for cron and tests."
)
@click.option(
    "--backend", type=click.Choice(["auto", "docker", "process"]), default=None,
    help="Override the imps' [box] backend (process has no lockdown).",
)  # fmt: skip
@click.option(
    "--memory-tick", "memory_tick", type=click.FloatRange(MIN_MEMORY_TICK_S, MAX_MEMORY_TICK_S),
    default=MEMORY_TICK_S, show_default=True, metavar="SECONDS",
    help="How often the memory clock looks at every memory imp (its reflections and its sleep).",
)  # fmt: skip
@metrics_options
def supervise_command(
    concurrency: int,
    once: bool,
    backend: str | None,
    memory_tick: float,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Run queued and scheduled tasks, each in a fresh governed box.

    \b
    One supervisor per IMPYARD_HOME (a second one refuses, naming the first's
    pid). Tasks left running by a supervisor that stopped are reclaimed (at
    start, and every 10 s) once their run's lease expired or its holder died;
    a task a live host runs is left to it.
    Every task transition is logged. It has no Discord connection: its tasks
    post to their imp's task log (printed here); a task that posts into a
    Discord channel is refused, so run those under `impyard serve --supervise`.
    It also keeps the day of every imp with memory on: a reflection after
    10 minutes of silence, sleep after 2 hours, and 10 minutes into sleep
    the night's folding and forgetting (docs/memory.md).
    --metrics-port serves /metrics, /healthz and /readyz (docs/metrics.md).
    SIGINT or SIGTERM stops it: running tasks finish (a second one stops at
    once, requeuing them); one during start-up stops the start. Exit status 0.
    See docs/tasks.md. Example:
      export OPENAI_API_KEY=sk-...
      impyard schedule add pip --cron "0 9 * * *" --tz Europe/Oslo "Note what you did today"
      impyard supervise --metrics-port 9465
    """
    if not UpstreamConfig.from_env().api_key:
        raise CliError(NO_KEY)
    try:
        state_root()  # a bad IMPYARD_STATE_ROOT or IMPYARD_TASK_STATE_RETENTION is refused before anything starts
        task_state_retention_from_env()
    except (BoxError, SettingsError) as exc:
        raise CliError(str(exc)) from exc
    for name in TRANSITION_LOGGERS:
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)  # transitions are the point of this command's output
    try:
        anyio.run(
            lambda: supervise(
                concurrency, once, backend, memory_tick, metrics_host=metrics_host, metrics_port=metrics_port
            )
        )
    except (AlreadyRunning, ImpError, PolicyError, DatabaseError, BoxError, HealthPortError) as exc:
        raise CliError(str(exc).splitlines()[0]) from exc
    except KeyboardInterrupt:
        pass
