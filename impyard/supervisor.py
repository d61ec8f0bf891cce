"""``impyard supervise``: scheduled and proactive work as governed one-shot boxes (issue 8; design.md §1, §5).

Every tick (at most ``tick_s``, default 0.5 s, and at once when a slot frees):

1. the gateway executes gates approved elsewhere (the CLI) and expires overdue ones;
2. a decided gate of a wake-on-resolve task queues its follow-up, exactly once;
   needs-review tasks whose gates are all decided become done or failed;
3. due schedules queue their tasks;
4. running tasks the operator cancelled are stopped (their boxes killed);
5. ready tasks fill the free slots (the concurrency cap, default 3): an imp
   over budget has its task deferred to the next budget window (never
   stranded), then the task is claimed and run in a fresh one-shot box with
   the same lockdown and the same gateway as a chat session.

A task box runs ``task.run`` inside its ceiling; the host attests the result
(``impyard.tasks.attest``). At start, tasks a dead supervisor left ``running``
are reclaimed: their boxes removed (Docker by the run label, process boxes by
pid), then requeued or ended by ``reclaim_decision``. Task kinds are opaque
here: the box decides what a kind means.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import anyio
from anyio.abc import TaskGroup

from box.protocol import RpcError
from box.protocol.models import BoxInitParams, SessionInfo, TaskRunParams, TaskSpec
from impyard.backends import BoxBackend, BoxError, BoxSpec, RunningBox
from impyard.backends.choose import choose_backend
from impyard.backends.docker import DockerBackend, DockerLimits
from impyard.backends.process import ProcessBackend
from impyard.clock import Clock, iso
from impyard.db import Database
from impyard.gate_pump import GatePump
from impyard.gateway import Gateway
from impyard.host import Host, open_host
from impyard.imps import ImpConfig, ImpError, ImpStore
from impyard.instance import SUPERVISE_LOCK_FILENAME, InstanceLock
from impyard.ledger import ALL_IMPS, BudgetRow, seconds_to_next_day, seconds_to_next_month
from impyard.paths import home
from impyard.schedules import ScheduleStore
from impyard.sessions import describe_error
from impyard.surfaces import SURFACE_LOG, Surface, TerminalSurface
from impyard.tasks import (
    RunEnd,
    Task,
    TaskStore,
    attest,
    compose_prompt,
    reclaim_decision,
    render_briefing,
)

log = logging.getLogger("impyard.supervisor")

DEFAULT_CONCURRENCY = 3
MAX_CONCURRENCY = 64
TICK_S = 0.5  # dispatch latency: a due task starts within one tick when a slot is free
INIT_TIMEOUT_S = 60.0
SHUTDOWN_GRACE_S = 10.0
MAX_ATTEMPTS = 3  # a task interrupted this often by a dying supervisor is failed, not retried
READY_BATCH = 100
TERMINAL_SURFACE_NOTICE = (
    "no chat surface is connected: task log posts are printed on this terminal, and posts into Discord "
    "channels are refused here (run tasks that post to Discord under `impyard serve --supervise`)"
)


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


BackendFor = Callable[[str], BoxBackend]


class BackendChooser:
    """Each imp's backend from its ``[box]`` settings (or an override); boxes labelled as task boxes."""

    def __init__(self, imps: ImpStore, override: str | None = None) -> None:
        self.imps = imps
        self.override = override
        self._chosen: dict[tuple[str, DockerLimits], BoxBackend] = {}

    def __call__(self, imp: str) -> BoxBackend:
        config = self.imps.get(imp)
        key = (self.override or config.box.backend, config.box.docker_limits())
        if key not in self._chosen:
            self._chosen[key] = choose_backend(key[0], limits=key[1], role="task")  # type: ignore[arg-type]
        return self._chosen[key]


# ------------------------------------------------------------------ rules (pure)


def budget_wait(rows: Sequence[BudgetRow], imp: str, now: datetime) -> tuple[int, str] | None:
    """Seconds until ``imp`` may spend again (the longest exhausted window), and which window; None if it may now.

    Only settled spending counts here: reservations in flight may settle lower. A task that starts and
    then meets the hard stop inside its box is deferred after its run instead (``attest``).
    """
    waits: list[tuple[int, str]] = []
    for row in rows:
        if row.scope not in (imp, ALL_IMPS):
            continue
        name = "all imps" if row.scope == ALL_IMPS else f"imp {imp}"
        if row.monthly_limit is not None and row.monthly_spent - row.reserved >= row.monthly_limit:
            waits.append((seconds_to_next_month(now), f"{name}: monthly budget"))
        if row.daily_limit is not None and row.daily_spent - row.reserved >= row.daily_limit:
            waits.append((seconds_to_next_day(now), f"{name}: daily budget"))
    return max(waits) if waits else None


def looks_like_box_process(pid: int, state_dir: Path) -> bool:
    """A process backend box of this imp: its environment names the imp's state dir (Linux /proc)."""
    proc = Path(f"/proc/{pid}")
    try:
        environ = (proc / "environ").read_bytes().split(b"\0")
        cmdline = (proc / "cmdline").read_bytes()
    except OSError:
        return False
    named = {f"IMPYARD_STATE_DIR={path}".encode() for path in (state_dir, state_dir.resolve())}
    return not named.isdisjoint(environ) and b"box" in cmdline


# ------------------------------------------------------------------ the loop


@dataclass(eq=False)
class _Running:
    task: Task
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    box: RunningBox | None = None


class Supervisor:
    """Runs tasks; ``run()`` is the loop of ``impyard supervise`` (and, later, ``impyard serve --supervise``)."""

    def __init__(
        self,
        *,
        db: Database,
        gateway: Gateway,
        imps: ImpStore,
        backend_for: BackendFor,
        clock: Clock | None = None,
        settings: SupervisorSettings | None = None,
        pump: GatePump | None = None,
    ) -> None:
        """``pump``: the host's gate pump, run on every tick; None where the host runs its own (``serve``)."""
        self.db = db
        self.pump = pump
        self.gateway = gateway
        self.imps = imps
        self.backend_for = backend_for
        self.clock = clock or gateway.clock
        self.settings = settings or SupervisorSettings()
        self.tasks = TaskStore(db, self.clock, imps)
        self.schedules = ScheduleStore(db, self.clock, self.tasks, imps)
        self.running: dict[str, _Running] = {}
        self.started = 0  # boxes started by this supervisor
        self.peak_running = 0
        self._wake = anyio.Event()

    # ------------------------------------------------------------ reclaim (at start)

    async def reclaim(self) -> list[Task]:
        """Tasks left ``running`` by a supervisor that died: remove their boxes, then requeue or end them."""
        reclaimed = []
        for task in await self.db.run(self.tasks.running):
            if task.id in self.running:
                continue  # ours (reclaim is only called before the loop starts; this is a guard)
            run = await self.db.run(self.tasks.run, task.run_id) if task.run_id else None
            await self._remove_orphan_box(task, run.box_pid if run else None)
            facts = await self.db.run(self.tasks.run_facts, task.run_id) if task.run_id else None
            action, reason = reclaim_decision(
                attempts=task.attempts,
                max_attempts=self.settings.max_attempts,
                acted=bool(facts and facts.acted),
                cancel_requested=task.cancel_requested,
            )
            done = await self.db.run(self.tasks.reclaim, task.id, task.run_id, action, reason)
            if done is not None:
                reclaimed.append(done)
        if reclaimed:
            log.warning("reclaimed %d task(s) left running by a supervisor that stopped", len(reclaimed))
        return reclaimed

    async def _remove_orphan_box(self, task: Task, box_pid: int | None) -> None:
        state_dir = self.imps.state_dir(task.imp)
        if box_pid is not None and looks_like_box_process(box_pid, state_dir):
            try:
                os.kill(box_pid, signal.SIGKILL)
                log.warning("killed orphaned box process %d of task %s", box_pid, task.id)
            except ProcessLookupError:
                pass
        if not task.run_id:
            return
        try:
            backend = await anyio.to_thread.run_sync(self.backend_for, task.imp)
        except (ImpError, BoxError) as exc:
            log.info("task %s: no backend to look for its box in (%s)", task.id, exc)
            return
        if isinstance(backend, DockerBackend):
            try:
                containers = await anyio.to_thread.run_sync(lambda: backend.labelled(run=task.run_id or ""))
                for container in containers:
                    if container.name is None:
                        continue
                    await anyio.to_thread.run_sync(backend.kill_by_name, container.name)
                    log.warning("removed orphaned box %s of task %s", container.name, task.id)
            except Exception as exc:  # noqa: BLE001 - reclaim goes on; the box is reported
                log.error("could not remove the box of task %s (run %s): %s", task.id, task.run_id, exc)

    # ------------------------------------------------------------ one tick

    async def tick(self, tg: TaskGroup) -> None:
        """Gates, follow-ups, schedules, cancels, then dispatch; one failing step never stops the others."""
        for step in (self._gates, self._follow_ups, self._schedules, self._cancels):
            try:
                await step()
            except Exception:
                log.exception("supervise: %s failed; going on", step.__name__.strip("_"))
        try:
            await self._dispatch(tg)
        except Exception:
            log.exception("supervise: dispatch failed; going on")

    async def _gates(self) -> None:
        if self.pump is not None:
            await self.pump.run_once()

    async def _follow_ups(self) -> None:
        for task, gate in await self.db.run(self.tasks.decided_gates_to_follow):
            await self.db.run(self.tasks.add_continuation, task, gate)
        await self.db.run(self.tasks.settle_reviews)

    async def _schedules(self) -> None:
        await self.db.run(self.schedules.fire_due)

    async def _cancels(self) -> None:
        for task_id in await self.db.run(self.tasks.cancel_requested, list(self.running)):
            handle = self.running.get(task_id)
            if handle is not None and not handle.scope.cancel_called:
                log.info("task %s: cancel requested; killing its box", task_id)
                handle.scope.cancel()

    async def _dispatch(self, tg: TaskGroup) -> None:
        free = self.settings.concurrency - len(self.running)
        if free <= 0:
            return
        for task in await self.db.run(self.tasks.ready, READY_BATCH):
            if free <= 0:
                break
            if task.id in self.running:
                continue
            try:
                config = await anyio.to_thread.run_sync(self.imps.get, task.imp)
            except ImpError as exc:
                await self.db.run(self.tasks.fail, task.id, f"cannot run: {str(exc).splitlines()[0][:300]}")
                continue
            rows = await self.gateway.ledger.aio.summary()
            wait = budget_wait(rows, task.imp, self.clock.now())
            if wait is not None:
                seconds, window = wait
                until = self.clock.now() + timedelta(seconds=seconds)
                await self.db.run(
                    self.tasks.defer,
                    task.id,
                    until,
                    f"deferred to {iso(until)}: {window} is spent (the next window starts then)",
                )
                continue
            try:
                backend = await anyio.to_thread.run_sync(self.backend_for, task.imp)
            except (BoxError, ImpError) as exc:
                await self.db.run(self.tasks.fail, task.id, f"cannot start a box: {str(exc)[:300]}")
                continue
            claimed = await self.db.run(self.tasks.claim, task.id, uuid.uuid4().hex, backend.name)
            if claimed is None:
                continue
            handle = _Running(claimed)
            self.running[claimed.id] = handle
            self.peak_running = max(self.peak_running, len(self.running))
            free -= 1
            tg.start_soon(self._run_task, handle, backend, config, name=f"task {claimed.id}")

    # ------------------------------------------------------------ one task

    async def _init_params(self, task: Task, config: ImpConfig) -> BoxInitParams:
        info = await self.db.run(self.gateway.channels.info, task.channel_id)
        spec = await anyio.to_thread.run_sync(self.imps.imp_spec, config)
        return BoxInitParams(
            protocol=1,
            imp=spec,
            session=SessionInfo(
                id=f"task:{task.id}", channel_id=task.channel_id, channel_kind="task",
                channel_name=(info.name if info else "")[:256],
            ),
            now=self.clock.now(),
        )  # fmt: skip

    async def _task_params(self, task: Task) -> TaskRunParams:
        briefing = None
        if task.briefing:
            entries = await self.db.run(lambda: self.tasks.journal(task.imp, exclude=task.id))
            briefing = render_briefing(entries)
        return TaskRunParams(
            task=TaskSpec(
                id=task.id, kind=task.kind, prompt=compose_prompt(task.prompt, briefing), person=task.person
            ),
            now=self.clock.now(),
        )

    async def _run_task(self, handle: _Running, backend: BoxBackend, config: ImpConfig) -> None:
        task = handle.task
        assert task.run_id is not None
        ceiling = task.ceiling_s
        if self.settings.max_ceiling_s is not None:
            ceiling = min(ceiling, self.settings.max_ceiling_s)
        spec = BoxSpec(
            imp=task.imp,
            channel_id=task.channel_id,
            state_dir=self.imps.state_dir(task.imp),
            run_id=task.run_id,
        )
        box_outcome: str | None = None
        box_summary = ""
        died: str | None = None
        returncode: int | None = None
        ceiling_hit = False
        try:
            with handle.scope:
                with anyio.move_on_after(ceiling) as ceiling_scope:
                    try:
                        init = await self._init_params(task, config)
                        params = await self._task_params(task)
                        async with backend.open(spec, self.gateway) as box:
                            handle.box = box
                            self.started += 1
                            if isinstance(backend, ProcessBackend):
                                await self.db.run(self.tasks.record_pid, task.run_id, box.process.pid)
                            await box.init(init, timeout=min(ceiling, self.settings.init_timeout_s))
                            result = await box.run_task(params)
                            box_outcome, box_summary = result.outcome, result.summary
                    except BoxError as exc:
                        died = str(exc)
                    except RpcError as exc:
                        died = f"the box refused the task: {exc.message}"
                    except Exception as exc:  # noqa: BLE001 - a task's failure never stops the supervisor
                        died = describe_error(exc)
                        log.error("task %s: unexpected error: %s", task.id, died)
                        log.debug("task %s: the unexpected error", task.id, exc_info=exc)
                ceiling_hit = ceiling_scope.cancelled_caught
            if handle.box is not None:
                returncode = handle.box.returncode
            end = RunEnd(
                box_outcome=box_outcome, box_summary=box_summary, ceiling_s=ceiling, ceiling_hit=ceiling_hit,
                died=died, cancelled=handle.scope.cancelled_caught,
            )  # fmt: skip
            with anyio.CancelScope(shield=True):
                await self._finish(task, end, returncode)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self.db.run(
                    self.tasks.interrupt,
                    task.id,
                    task.run_id,
                    "interrupted: the supervisor stopped; it runs again",
                )
            raise
        finally:
            self.running.pop(task.id, None)
            self._wake.set()

    async def _finish(self, task: Task, end: RunEnd, returncode: int | None) -> None:
        assert task.run_id is not None
        facts = await self.db.run(self.tasks.run_facts, task.run_id)
        attestation = attest(end, facts)
        not_before = None
        if attestation.deferred:
            rows = await self.gateway.ledger.aio.summary()
            now = self.clock.now()
            wait = budget_wait(rows, task.imp, now)
            not_before = now + timedelta(seconds=wait[0] if wait else seconds_to_next_day(now))
        await self.db.run(
            lambda: self.tasks.finish(
                task.id, task.run_id or "", attestation, end, returncode=returncode, not_before=not_before
            )
        )

    # ------------------------------------------------------------ the loop

    async def run(self, *, once: bool = False, stop: anyio.Event | None = None) -> None:
        """Reclaim, then tick until ``stop`` (or, with ``once``, until nothing is running or ready)."""
        stop = stop or anyio.Event()
        await self.reclaim()
        log.info(
            "supervising: concurrency %d, tick %.2f s%s", self.settings.concurrency, self.settings.tick_s,
            " (once: until nothing is due)" if once else "",
        )  # fmt: skip
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._wake_on_stop, stop)
            while not stop.is_set():
                self._wake = anyio.Event()
                await self.tick(tg)
                if once and not self.running and not await self.db.run(self.tasks.has_ready):
                    break
                with anyio.move_on_after(self.settings.tick_s):
                    await self._wake.wait()
            if self.running:
                log.info(
                    "stopping: %d task(s) running get %.0f s to finish",
                    len(self.running),
                    self.settings.shutdown_grace_s,
                )
                with anyio.move_on_after(self.settings.shutdown_grace_s):
                    while self.running:
                        self._wake = anyio.Event()
                        await self._wake.wait()
            tg.cancel_scope.cancel()  # what is still running is killed and requeued
        log.info("supervisor stopped")

    async def _wake_on_stop(self, stop: anyio.Event) -> None:
        await stop.wait()
        self._wake.set()


# ------------------------------------------------------------------ assembling it from IMPYARD_HOME


@asynccontextmanager
async def open_supervisor(
    *,
    surface: Surface | None = None,
    clock: Clock | None = None,
    backend: str | None = None,
    backend_for: BackendFor | None = None,
    settings: SupervisorSettings | None = None,
    lock: bool = True,
    host: Host | None = None,
) -> AsyncIterator[Supervisor]:
    """The supervisor of this IMPYARD_HOME: its lock first (a second one refuses with the holder's pid), then
    its host. Standalone, it opens a host of its own that reaches only the task log (``surface``, else the
    terminal) and pumps its gates; given the ``host`` of ``impyard serve``, it shares that host's gateway and
    leaves the gates to that host's pump."""
    instance = InstanceLock(home(), "supervise", SUPERVISE_LOCK_FILENAME)
    if lock:
        instance.__enter__()
    try:
        async with AsyncExitStack() as stack:
            own_pump = host is None
            if host is None:
                if surface is None:
                    log.warning(TERMINAL_SURFACE_NOTICE)
                    surface = TerminalSurface(sys.stdout)
                host = await stack.enter_async_context(
                    open_host(surface, reaches=(SURFACE_LOG,), clock=clock)
                )
            yield Supervisor(
                db=host.db, gateway=host.gateway, imps=host.imps,
                backend_for=backend_for or BackendChooser(host.imps, backend), clock=clock or host.clock,
                settings=settings, pump=host.pump if own_pump else None,
            )  # fmt: skip
    finally:
        if lock:
            instance.__exit__(None, None, None)
