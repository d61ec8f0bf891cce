"""``impyard memory night IMP [--consolidate]``: the imp sleeps now, whatever its clock (mechanism 114).

One ``sleep`` task per scope of the imp that has records (``impyard.memory.wakefulness.queue_night``), run
at once by a one-shot supervisor limited to this imp's sleep tasks (it takes no lock: ``impyard supervise``
may run beside it), each in a fresh box through the same gateway, budget and audit as every task. Each box
forgets within its scope (mechanisms 112-113) and, with ``--consolidate``, folds that scope's records since
the imp woke first (108-111; 24 hours when the clock never saw it wake). The command prints what came of
each task. Registered on ``impyard memory`` by the last line of ``impyard.cli.memory``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime

import anyio
import click

from impyard.backends import BoxError
from impyard.cli.errors import CliError
from impyard.cli.memory import imp_config, memory_group
from impyard.cli.output import Output, output_options
from impyard.clock import Clock, iso
from impyard.gateway.broker import UpstreamConfig
from impyard.gateway.policy import PolicyError
from impyard.gateway.surfaces import TerminalSurface
from impyard.imps.store import ImpError
from impyard.memory.act import memory_service_of
from impyard.memory.wakefulness import SLEEP_KIND, forget_scopes, queue_night
from impyard.storage.db import DatabaseError
from impyard.supervisor import Supervisor, SupervisorSettings, open_supervisor
from impyard.supervisor.backends import BackendFor
from impyard.tasks import Task

NO_KEY = (
    "no model key is configured, and folding asks the model for a plan: export OPENAI_API_KEY=sk-... (and "
    "OPENAI_BASE_URL for another server), or leave out --consolidate to only forget"
)
OpenSupervisor = Callable[..., AbstractAsyncContextManager[Supervisor]]


@dataclass(frozen=True)
class NightReport:
    imp: str
    consolidate: bool
    since: datetime
    tasks: tuple[tuple[str, Task], ...]  # (scope, the task as it ended)
    host_forgot: tuple[int, int] = (0, 0)  # (records, episodes) forgotten by the host in the scopes beyond

    def to_json(self) -> dict[str, object]:
        return {
            "imp": self.imp,
            "consolidate": self.consolidate,
            "since": iso(self.since),
            "scopes": [
                {
                    "scope": scope,
                    "task": task.id,
                    "state": task.state,
                    "outcome": task.outcome,
                    "summary": task.box_summary,
                }
                for scope, task in self.tasks
            ],  # fmt: skip
            "host_forgot": {"records": self.host_forgot[0], "episodes": self.host_forgot[1]},
        }


def task_line(scope: str, task: Task) -> str:
    """What came of one scope's sleep: the box's own account when it finished, else the host's word."""
    if task.state == "done":
        return f"  {scope}: {task.box_summary or 'done'}"
    if task.state == "queued":
        return (
            f"  {scope}: not run yet: {task.outcome or 'queued'} (impyard supervise runs it; task {task.id})"
        )
    said = f" ({task.box_summary})" if task.box_summary else ""
    return f"  {scope}: {task.state}: {task.outcome or ''}{said} (task {task.id})"


async def run_night(
    imp: str,
    *,
    consolidate: bool,
    backend: str | None = None,
    backend_for: BackendFor | None = None,
    clock: Clock | None = None,
    opener: OpenSupervisor | None = None,
) -> NightReport:
    """Queue the night's sleep tasks of ``imp`` and run them now (until none is ready: an imp over budget has
    them deferred, left for ``impyard supervise``)."""
    settings = SupervisorSettings(kinds=frozenset({SLEEP_KIND}), imps=frozenset({imp}))
    async with (opener or open_supervisor)(
        surface=TerminalSurface(sys.stderr), clock=clock, backend=backend, backend_for=backend_for,
        settings=settings,
    ) as supervisor:  # fmt: skip
        now = supervisor.clock.now()
        queued, beyond, since = await supervisor.db.run(
            lambda: queue_night(supervisor.db, supervisor.tasks, imp, now, consolidate=consolidate)
        )
        host_forgot = (0, 0)
        service = memory_service_of(supervisor.gateway)
        if beyond and service is not None:
            host_forgot = await supervisor.db.run(forget_scopes, service.store.forget_scope, imp, beyond)
        if queued:
            await supervisor.run(once=True)
        tasks = tuple(
            [(scope, await supervisor.db.run(supervisor.tasks.get, task_id)) for scope, task_id in queued]
        )
    return NightReport(imp, consolidate, since, tasks, host_forgot)


@memory_group.command("night")
@click.argument("imp")
@click.option(
    "--consolidate", is_flag=True,
    help="Also fold the records since the imp woke (one model call per scope), before forgetting.",
)  # fmt: skip
@click.option(
    "--backend", type=click.Choice(["auto", "docker", "process"]), default=None,
    help="Override the imp's [box] backend (process has no lockdown).",
)  # fmt: skip
@output_options
def night_command(imp: str, consolidate: bool, backend: str | None, out: Output) -> None:
    """IMP sleeps now, whatever its clock: forgetting, and with --consolidate folding first (mechanism 114).

    \b
    One box per scope the imp has memories in, each working in that scope
    alone: it forgets what has faded below the forgetting curve (never what
    the imp was given or concluded itself) and, with --consolidate, first
    folds the records since the imp woke (24 hours when unknown) into their
    strongest kin, keeping every episode. Runs through the gateway like any
    task (budget, audit); prints what came of each scope. Example:
      impyard memory night pip --consolidate
    """
    config = imp_config(imp)
    if not config.memory.enabled:
        raise CliError(
            f"{config.name} has memory off: nothing to sleep on (set [memory] enabled = true in its imp.toml)"
        )
    if consolidate and not UpstreamConfig.from_env().api_key:
        raise CliError(NO_KEY)
    try:
        report = anyio.run(lambda: run_night(config.name, consolidate=consolidate, backend=backend))
    except (ImpError, PolicyError, DatabaseError, BoxError) as exc:
        raise CliError(str(exc).splitlines()[0]) from exc
    if not report.tasks and report.host_forgot == (0, 0):
        out.show(report.to_json(), f"{config.name} has no memories yet: nothing to sleep on.")
        return
    lines = [
        f"{config.name} slept"
        + (
            f", folding what happened since {iso(report.since)[:19].replace('T', ' ')} UTC"
            if consolidate
            else ""
        )
        + ":"
    ]
    lines += [task_line(scope, task) for scope, task in report.tasks]
    if report.host_forgot != (0, 0):
        lines.append(
            f"  other scopes: forgot {report.host_forgot[0]} records, {report.host_forgot[1]} episodes"
        )
    out.show(report.to_json(), "\n".join(lines))
