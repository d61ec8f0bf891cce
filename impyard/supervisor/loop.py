"""The supervisor's loop (``impyard supervise``; ``impyard serve --supervise``): reclaim, then tick.

Every tick (at most ``tick_s``, default 0.5 s, and at once when a slot frees):

1. the host's gate pump runs (a standalone supervisor's own; under ``serve`` the host runs it);
2. a decided gate of a wake-on-resolve task queues its follow-up, exactly once;
   needs-review tasks whose gates are all decided become done or failed;
3. due schedules queue their tasks;
4. departures due queue their ``depart`` tasks, exactly once each (mechanism 103,
   ``impyard.memory.departures``; looked for every ``departure_scan_s``, 30 s);
5. the memory clock ticks every memory imp (mechanisms 104-107, ``impyard.memory.wakefulness``; every
   ``memory_tick_s``, 30 s): what is due queues its ``reflect`` and ``sleep`` tasks, exactly once, and the
   scopes no sleep task works in tonight are forgotten in by the host itself;
6. running tasks the operator cancelled are stopped (their boxes killed);
7. every ``reclaim_every_s`` (10 s), tasks other hosts left running are reclaimed once their run's lease may be
   taken over (below);
8. ready tasks fill the free slots (the concurrency cap, default 3): an imp
   over budget has its task deferred to the next budget window (never
   stranded), then the task is claimed and run in a one-shot box with
   the same lockdown and the same gateway as a chat session: a spare box of its imp where the host keeps
   them (issue 37: under ``serve`` and ``chat`` the supervisor claims from the session manager's pool,
   ``spares``; its run takes the spare's run id, so its lease, its audit and its box's labels name one run), else
   one started for it. A spare that fails before the task begins is let go and a box is started instead.

A task box runs ``task.run`` inside its ceiling; the host attests the result
(``impyard.tasks.attest``). Issue 21: each run holds the lease ``task:<task>/<run>`` (``impyard.storage.leases``) from
before its claim to after its end, renewed while its box runs; the run's acts go through the gateway fenced by it
(``impyard.supervisor.fence``), and a run whose lease is lost has its box stopped and its task ended as a reclaim
would end it (unless the host that took the lease did so first). At start, and every ``reclaim_every_s`` after,
tasks left ``running`` are reclaimed only where this host may take their run's lease over
(``lease_rules.reclaims``: it expired, or its holder is a dead process of this machine): their boxes removed
(``impyard.supervisor.orphans``), then requeued or ended by ``reclaim_decision``. A task a live host runs is left
to it, and the log says so once. Beside the ticks, finished tasks' state dirs past the retention
are pruned (``impyard.supervisor.pruning``) in a task of their own, so a pass never holds up a tick: every
``prune_every_s`` (300 s), again soon while a backlog lasts, at most ``prune_batch`` dirs a pass; ``once``
prunes one pass before its ticks. Task kinds are opaque here (the box
decides what a kind means), except that a ``depart`` or ``reflect`` task's box remembers in
the scopes of its channel and knows that channel's real kind, and a ``sleep`` task's box works in
its task's one scope (``Task.scope``). After a sleep the database is compacted when it pays.

A supervisor limited to some kinds (``SupervisorSettings.kinds``: ``impyard chat``
and ``impyard serve`` without ``--supervise`` run one for ``depart``) runs beside
``impyard supervise`` without its lock: it fires no schedules and queues no
follow-ups, runs no memory clock, prunes no state dirs, dispatches only its kinds (and only its imps' tasks, when
``SupervisorSettings.imps`` names some: ``impyard memory night``), and reclaims only
tasks of its kinds that ran past their ceiling (which no live supervisor can still be running), under the same
lease rule.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial

import anyio
from anyio.abc import TaskGroup

from box.protocol import RpcError
from box.protocol.models import BoxInitParams, SessionInfo, TaskRunParams, TaskRunResult, TaskSpec
from impyard import __version__ as impyard_version
from impyard import metrics
from impyard.backends import BoxBackend, BoxError, BoxSpec, RunningBox
from impyard.backends.docker import DockerBackend
from impyard.backends.stateroot import state_root
from impyard.clock import Clock, iso
from impyard.conversation.sessions import describe_error
from impyard.conversation.spares import Spare, SpareFailed, SparePool, serving
from impyard.durations import format_duration
from impyard.gateway.core import Gateway
from impyard.gateway.gate_pump import GatePump
from impyard.gateway.ledger import seconds_to_next_day
from impyard.gateway.reach import with_reach
from impyard.imps.store import ImpConfig, ImpConfigError, ImpError, ImpStore
from impyard.memory.act import memory_service_of
from impyard.memory.compact import compact
from impyard.memory.departures import DEPART_KIND, memory_imps, queue_due
from impyard.memory.scopes import SessionScopes
from impyard.memory.scopes import resolve as resolve_scopes
from impyard.memory.service import Fence
from impyard.memory.wakefulness import REFLECT_KIND, SLEEP_KIND, forget_scopes
from impyard.memory.wakefulness import step as memory_step
from impyard.storage.db import Database
from impyard.storage.lease_rules import reclaims
from impyard.storage.leases import RENEW_ERRORS, Lease, LeaseHeld, LeaseKeeper, LeaseStore, task_lease_name
from impyard.storage.liveness import here
from impyard.supervisor.backends import BackendFor
from impyard.supervisor.budget import budget_wait
from impyard.supervisor.fence import RunFence
from impyard.supervisor.held import blocked_reason
from impyard.supervisor.orphans import (
    SWEEP_WINDOW,
    remove_orphan_box,
    sweep_docker_boxes,
    sweep_process_boxes,
)
from impyard.supervisor.pruning import MAX_PRUNE_FAILURES, prune_task_state
from impyard.supervisor.settings import READY_BATCH, STALE_RUN_MARGIN_S, SupervisorSettings
from impyard.tasks import (
    RunEnd,
    Task,
    TaskError,
    TaskStore,
    attest,
    compose_prompt,
    reclaim_decision,
    render_briefing,
)
from impyard.tasks.schedules import ScheduleStore
from impyard.threads import in_thread

log = logging.getLogger("impyard.supervisor")
_counting = metrics.counting_boxes  # the supervisor's task boxes count in impyard_boxes while it runs


@dataclass(eq=False)
class _Running:
    task: Task
    lease: Lease  # task:<task>/<run>, held from before the claim to after the run's end
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    box: RunningBox | None = None
    lost: str | None = None  # why, once the run's lease was lost: its box is stopped and its acts refused


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
        leases: LeaseStore | None = None,
        spares: SparePool | None = None,
    ) -> None:
        """``pump``: the host's gate pump, run on every tick; None where the host runs its own (``serve``).
        ``leases``: where task runs hold their leases (default: this process, on ``db``, by the wall clock: a
        lease's expiry is compared across hosts, never on a test's fixed clock). ``spares``: the spare boxes of
        the host's session manager its task runs may claim (issue 37; None: every task starts its own box)."""
        self.db = db
        self.spares = spares
        self.pump = pump
        self.gateway = gateway
        self.imps = imps
        self.backend_for = backend_for
        self.clock = clock or gateway.clock
        self.settings = settings or SupervisorSettings()
        self.tasks = TaskStore(db, self.clock, imps)
        self.schedules = ScheduleStore(db, self.clock, self.tasks, imps)
        self.leases = leases or LeaseStore(db)
        self.running: dict[str, _Running] = {}
        self.reclaim_passes = 0  # passes over the tasks left running (at start, then every reclaim_every_s)
        self._reclaim_next: float | None = None  # anyio.current_time() of the next pass
        self._left_alone: set[str] = set()  # tasks a live host runs, already logged as left to it
        self.started = 0  # boxes started by this supervisor
        self.peak_running = 0
        self._wake = anyio.Event()
        self._departures_scanned: datetime | None = None
        self._memory_ticked: datetime | None = None
        self._prune_failed: set[tuple[str, str]] = (
            set()
        )  # (imp, dir) that could not be removed: not tried again

    # ------------------------------------------------------------ reclaim (at start)

    def _reclaims(self, task: Task, now: datetime) -> bool:
        """Whether this supervisor may reclaim ``task``: the supervisor of every kind (it holds the lock) may
        reclaim any; a kinds-limited one only its own kinds' tasks that ran past their ceiling."""
        if self.settings.kinds is None and self.settings.imps is None:
            return True
        if not self.settings.runs(task.kind) or not self.settings.serves(task.imp) or task.started_at is None:
            return False
        return (now - task.started_at).total_seconds() > task.ceiling_s + STALE_RUN_MARGIN_S

    async def reclaim(self) -> list[Task]:
        """At start: the tasks left ``running`` by a supervisor that stopped (``reclaim_pass``), then this home's
        leftover boxes (the supervisor of every kind). Run leases that ended a day ago are forgotten first."""
        await self.leases.db.run(self.leases.forget_stale)
        reclaimed = await self.reclaim_pass()
        if self.settings.kinds is None and self.settings.imps is None:
            await self.sweep()
        return reclaimed

    async def reclaim_pass(self) -> list[Task]:
        """Tasks left ``running`` by a host that stopped: remove their boxes, then requeue or end them. Only a
        task whose run lease this host may take over (``lease_rules.reclaims``: expired, its holder a dead
        process of this machine, or no lease at all) is reclaimed, under that lease, exactly once across hosts;
        a task a live host runs is left to it (logged once)."""
        self._reclaim_next = anyio.current_time() + self.settings.reclaim_every_s
        reclaimed = []
        running = await self.db.run(self.tasks.running)
        self._left_alone &= {task.id for task in running}
        for task in running:
            if task.id in self.running:
                continue  # ours
            if not self._reclaims(task, self.clock.now()):
                continue  # a kinds-limited supervisor's rule: another live supervisor may be running it
            done = await self._reclaim_one(task)
            if done is not None:
                reclaimed.append(done)
        self.reclaim_passes += 1
        if reclaimed:
            log.warning("reclaimed %d task(s) left running by a supervisor that stopped", len(reclaimed))
        return reclaimed

    async def _reclaim_one(self, task: Task) -> Task | None:
        """Take ``task``'s run lease over (a run without one is a run of before run leases), then reclaim it
        while holding it; the lease goes with the run."""
        lease: Lease | None = None
        if task.run_id is not None:
            name = task_lease_name(task.id, task.run_id)
            try:
                lease = await self.leases.db.run(
                    self.leases.acquire, name, self._lease_detail(task), self._run_lease_ttl, takes=reclaims
                )
            except LeaseHeld as exc:
                if task.id not in self._left_alone:
                    self._left_alone.add(task.id)
                    log.info("task %s is running under a live host's lease, left to it: %s", task.id, exc)
                return None
        try:
            try:
                current = await self.db.run(self.tasks.get, task.id)
            except TaskError:
                return None  # deleted meanwhile
            if current.state != "running" or current.run_id != task.run_id:
                return None  # it ended (or was reclaimed) before this host took the lease
            run = await self.db.run(self.tasks.run, task.run_id) if task.run_id else None
            # A box pid is this machine's only where the run's holder was a process of this machine (this boot).
            mine_to_kill = lease is None or lease.taken_from is None or here(lease.taken_from)
            box_pid = run.box_pid if run and mine_to_kill else None
            await remove_orphan_box(current, box_pid, self.imps.box_state_dir(task.imp), self.backend_for)
            facts = await self.db.run(self.tasks.run_facts, task.run_id) if task.run_id else None
            action, reason = reclaim_decision(
                attempts=current.attempts,
                max_attempts=self.settings.max_attempts,
                acted=bool(facts and facts.acted),
                cancel_requested=current.cancel_requested,
            )
            return await self.db.run(self.tasks.reclaim, task.id, task.run_id, action, reason)
        finally:
            if lease is not None:  # kept a day, expired: the run's old holder learns who took it
                await self._let_go(lease, forget=False)

    @property
    def _run_lease_ttl(self) -> timedelta:
        return timedelta(seconds=self.settings.run_lease_ttl_s)

    def _lease_detail(self, task: Task) -> dict[str, str]:
        return {"task": task.id, "imp": task.imp, "kind": task.kind, "home": str(self.imps.home)}

    async def _let_go(self, lease: Lease, *, forget: bool = True) -> None:
        """Release a run's lease and (``forget``) delete its row: a run id is never held again; a row kept is
        forgotten a day after (``LeaseStore.forget_stale``). Shielded: it goes on every path. A row that cannot
        be released expires by itself."""
        with anyio.CancelScope(shield=True):
            try:
                await self.leases.db.run(self.leases.release, lease, forget=forget)
            except RENEW_ERRORS as exc:
                log.warning("could not release lease %s: %s", lease.name, exc)

    async def _reclaim_due(self) -> None:
        """Every ``reclaim_every_s``: a pass over the tasks other hosts left running (``reclaim_pass``)."""
        if self._reclaim_next is not None and anyio.current_time() < self._reclaim_next:
            return
        await self.reclaim_pass()

    async def sweep(self) -> int:
        """Issue 19 #4: remove every task box of this home that no running task owns, whatever its task's
        state (a box that outlived its task's end, a run requeued without its box killed). Only the supervisor
        of every kind sweeps, at start: nothing runs under it yet, and the runs of tasks still ``running``
        (claimed by a kinds-limited supervisor since) keep their boxes. Returns how many were removed."""
        live = {task.run_id for task in await self.db.run(self.tasks.running) if task.run_id}
        since = self.clock.now() - SWEEP_WINDOW
        runs = await self.db.run(self.tasks.box_runs_since, since)
        state_dirs = {imp: self.imps.box_state_dir(imp) for _, imp, _ in runs}
        killed = await in_thread(sweep_process_boxes, runs, live, state_dirs)
        dockers: dict[int, DockerBackend] = {}
        for imp in await in_thread(self.imps.names):
            try:
                backend = await in_thread(self.backend_for, imp)
            except (ImpError, BoxError):
                continue  # no backend to look in: its boxes, if any, are reported by the next start that has one
            if isinstance(backend, DockerBackend):
                dockers.setdefault(id(backend), backend)
        removed = await sweep_docker_boxes(dockers.values(), live)
        if killed or removed:
            log.warning("swept %d leftover box(es) of this home", killed + removed)
        return killed + removed

    # ------------------------------------------------------------ one tick

    async def tick(self, tg: TaskGroup) -> None:
        """Gates, follow-ups, schedules, departures, the memory clock, cancels, then dispatch; one failing step
        never stops the others. A kinds-limited supervisor leaves follow-ups, schedules and the memory clock to
        the supervisor of every kind."""
        steps = (
            [self._gates, self._follow_ups, self._schedules] if self.settings.kinds is None else [self._gates]
        )
        clock = [self._memory_clock] if self.settings.kinds is None else []
        for step in (*steps, self._departures, *clock, self._cancels, self._reclaim_due):
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

    async def _departures(self) -> None:
        """Mechanism 103: queue the departures due, exactly once each (every ``departure_scan_s``)."""
        if not self.settings.runs(DEPART_KIND):
            return
        now = self.clock.now()
        last = self._departures_scanned
        if last is not None and 0 <= (now - last).total_seconds() < self.settings.departure_scan_s:
            return
        self._departures_scanned = now
        imps = await in_thread(memory_imps, self.imps)
        if imps:
            await self.db.run(queue_due, self.db, self.tasks, now, imps)

    async def _memory_clock(self) -> None:
        """Mechanisms 104-107: tick every memory imp (every ``memory_tick_s``); each imp's step is one
        transaction, so what is due is queued exactly once, and one imp's failure never stops the others."""
        service = memory_service_of(self.gateway)
        if service is None:
            return
        now = self.clock.now()
        last = self._memory_ticked
        if last is not None and 0 <= (now - last).total_seconds() < self.settings.memory_tick_s:
            return
        self._memory_ticked = now
        imps = await in_thread(memory_imps, self.imps)
        for imp in sorted(name for name in imps if self.settings.serves(name)):
            try:
                done = await self.db.run(memory_step, self.db, self.tasks, imp, now)
                if done.forget:  # forgetting needs no model: the host does it in the scopes no sleep task has
                    await self.db.run(forget_scopes, service.store.forget_scope, imp, done.forget)
                    await self._compact()
            except Exception:
                log.exception("supervise: the memory clock of %s failed; going on", imp)

    async def _compact(self) -> None:
        try:
            await self.db.run(compact, self.db)
        except Exception:
            log.exception("supervise: compacting the database failed; going on")

    async def _cancels(self) -> None:
        for task_id in await self.db.run(self.tasks.cancel_requested, list(self.running)):
            handle = self.running.get(task_id)
            if handle is not None and not handle.scope.cancel_called:
                log.info("task %s: cancel requested; killing its box", task_id)
                handle.scope.cancel()

    # ------------------------------------------------------------ pruning finished tasks' state

    async def _prune_forever(self) -> None:
        """Prune a pass every ``prune_every_s``, or after a tick's time while a backlog lasts."""
        while True:
            backlog = await self._prune_task_state()
            await anyio.sleep(self.settings.tick_s if backlog else self.settings.prune_every_s)

    async def _prune_task_state(self) -> bool:
        """One pass (``impyard.supervisor.pruning``): remove at most ``prune_batch`` state dirs of tasks finished
        more than the retention ago; whether a backlog is left. A failing pass is logged; the next one comes."""
        retention = self.settings.task_state_retention
        if retention is None:
            return False
        try:
            return await self._prune_pass(retention)
        except Exception:
            log.exception("supervise: pruning task state failed; going on")
            return False

    async def _prune_pass(self, retention: timedelta) -> bool:
        root = state_root(
            home=self.imps.home
        ).path  # a relative IMPYARD_STATE_ROOT raises: nothing is removed
        report = await prune_task_state(
            root,
            lambda ids: self.db.run(self.tasks.by_ids, ids),
            set(self.running),
            now=self.clock.now(),
            retention=retention,
            limit=self.settings.prune_batch,
            skip=self._prune_failed,
        )
        if len(self._prune_failed) < MAX_PRUNE_FAILURES:
            self._prune_failed.update((entry.imp, entry.name) for entry in report.failed)
        backlog = report.backlog and report.removed > 0  # all failed: no spinning on them
        if report.removed or report.failed:
            log.info(
                "pruned %d task state dir(s) past the retention of %s%s%s",
                report.removed,
                format_duration(retention),
                f"; {len(report.failed)} could not be removed (not tried again until restart)"
                if report.failed
                else "",
                "; more soon" if backlog else "",
            )
        return backlog

    async def _dispatch(self, tg: TaskGroup) -> None:
        free = self.settings.concurrency - len(self.running)
        if free <= 0:
            return
        ready = await self.db.run(
            lambda: self.tasks.ready(READY_BATCH, self.settings.kinds, imps=self.settings.imps)
        )
        for task in ready:
            if free <= 0:
                break
            if task.id in self.running:
                continue
            try:
                config = await in_thread(self.imps.get, task.imp)
            except ImpConfigError as exc:  # issue 19 #6: a typo holds the imp's tasks, never fails them
                await self._hold(task, exc)
                continue
            except ImpError as exc:
                await self.db.run(self.tasks.fail, task.id, f"cannot run: {str(exc).splitlines()[0][:300]}")
                continue
            rows = await self.gateway.ledger.db.run(self.gateway.ledger.summary)
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
                backend = await in_thread(self.backend_for, task.imp)
            except ImpConfigError as exc:  # issue 19 #6: broken since it was read a moment ago
                await self._hold(task, exc)
                continue
            except (BoxError, ImpError) as exc:
                await self.db.run(self.tasks.fail, task.id, f"cannot start a box: {str(exc)[:300]}")
                continue
            # Issue 37: a spare of its imp whose box is the one its backend would start, when the host keeps
            # one; the run takes the spare's run id (a box's run label, its audit and its lease name one run).
            spare = self.spares.claim(task.imp, backend) if self.spares is not None else None
            run_id = spare.spec.run_id if spare is not None else uuid.uuid4().hex
            claimed: Task | None = None
            try:
                # Issue 21: the run's lease before the claim, so a running task is never seen without its lease.
                lease = await self.leases.db.run(
                    self.leases.acquire,
                    task_lease_name(task.id, run_id),
                    self._lease_detail(task),
                    self._run_lease_ttl,
                )
                try:
                    claimed = await self.db.run(self.tasks.claim, task.id, run_id, backend.name)
                finally:
                    if claimed is None:  # cancelled or claimed elsewhere meanwhile (or the claim failed)
                        await self._let_go(lease)
            finally:
                if claimed is None and spare is not None:
                    spare.release()  # never init'ed: the pool closes it and starts another
            if claimed is None:
                continue
            handle = _Running(claimed, lease)
            self.running[claimed.id] = handle
            self.peak_running = max(self.peak_running, len(self.running))
            free -= 1
            tg.start_soon(self._run_task, handle, backend, config, spare, name=f"task {claimed.id}")

    async def _hold(self, task: Task, error: ImpConfigError) -> None:
        """Issue 19 #6: block ``task`` while its imp.toml is broken; it is looked at again every
        ``blocked_recheck_s`` and runs once the file is fixed (its tries untouched)."""
        until = self.clock.now() + timedelta(seconds=self.settings.blocked_recheck_s)
        await self.db.run(self.tasks.hold, task.id, until, blocked_reason(error))

    # ------------------------------------------------------------ one task

    async def _init_params(
        self, task: Task, config: ImpConfig, box: BoxSpec, fence: Fence | None = None
    ) -> BoxInitParams:
        """What the task's box is told. A ``depart`` task's box (mechanism 103) and a ``reflect`` task's
        (105) are in their channel as its session was: that channel's real kind, and memory in that channel's
        scopes. A ``sleep`` task's box (107) works in its task's one scope alone: it writes and reads only
        there, so a night never folds two scopes together. Decided here and applied by the gateway to every
        ``memory.*`` request of the box; only a departure may learn a rule. Every other box — a ``prompt``
        task's, any box of an imp whose memory is off — is opened with none, and refused every ``memory.*``
        request (issue 32 #1). ``fence``: the run's lease; once lost, the box's memory acts are refused and a
        write in flight is not committed (issue 32 #5)."""
        info = await self.db.run(self.gateway.channels.info, task.channel_id)
        spec = with_reach(await in_thread(self.imps.imp_spec, config), self.gateway.policy, task.channel_id)
        kind = "task"
        memory = None
        service = memory_service_of(self.gateway)
        if task.kind in (DEPART_KIND, REFLECT_KIND):
            if info is not None and info.kind in ("dm", "guild", "terminal"):
                kind = info.kind
            if service is not None and spec.memory.enabled:
                scopes = await resolve_scopes(self.db, task.imp, task.channel_id)
                learns = 1 if task.kind == DEPART_KIND else 0  # mechanism 90: one rule, on departure only
                memory = service.open(box, scopes, learns=learns, fence=fence)
        elif task.kind == SLEEP_KIND and service is not None and spec.memory.enabled and task.scope:
            scopes = SessionScopes(task.scope, (task.scope,))
            memory = service.open(box, scopes, learns=0, nights=True, fence=fence)
        if service is not None and memory is None:
            service.open(box, None)  # memory off: what box.init says, the gateway holds the box to
        return BoxInitParams(
            protocol=1,
            imp=spec,
            session=SessionInfo(
                id=f"task:{task.id}", channel_id=task.channel_id, channel_kind=kind,  # type: ignore[arg-type]
                channel_name=(info.name if info else "")[:256],
            ),
            now=self.clock.now(),
            memory=memory,
            impyard_version=impyard_version,  # seed 003: the prompt names the host's release
        )  # fmt: skip

    async def _task_params(self, task: Task) -> TaskRunParams:
        briefing = None
        if task.briefing:
            entries = await self.db.run(lambda: self.tasks.journal(task.imp, exclude=task.id))
            briefing = render_briefing(entries)
        return TaskRunParams(
            task=TaskSpec(
                id=task.id,
                kind=task.kind,
                prompt=compose_prompt(task.prompt, briefing),
                person=task.person,
                args=dict(task.args),
            ),
            now=self.clock.now(),
        )

    async def _run_task(
        self, handle: _Running, backend: BoxBackend, config: ImpConfig, spare: Spare | None = None
    ) -> None:
        """One task run under its lease: renewed while the box runs (a lost lease stops the box, and the box's
        acts are refused from then on: ``RunFence``), released and forgotten once the run ended. ``spare``: the
        spare box claimed for it (issue 37), let go on every path."""
        keeper = LeaseKeeper(
            self.leases, [handle.lease], renew_every=timedelta(seconds=self.settings.run_lease_renew_s),
            ttl=self._run_lease_ttl, on_lost=partial(self._lease_lost, handle),
        )  # fmt: skip
        try:
            async with anyio.create_task_group() as keeping:
                keeping.start_soon(keeper.run, name=f"lease of task {handle.task.id}")
                await self._run_box(handle, backend, config, RunFence(self.gateway, keeper), spare)
                keeping.cancel_scope.cancel()
        finally:
            if spare is not None:
                spare.release()  # already, unless the run ended before it reached its box
            await self._let_go(handle.lease)  # after the run's end is written: never running without a lease
            self.running.pop(handle.task.id, None)
            self._wake.set()

    def box_states(self) -> list[tuple[str, str]]:
        """``metrics.BoxCensus``: each running task's box (state ``task``)."""
        return [(handle.task.imp, "task") for handle in list(self.running.values()) if handle.box is not None]

    def _lease_lost(self, handle: _Running, why: str) -> None:
        log.error("task %s: %s; stopping its box", handle.task.id, why)
        handle.lost = why
        handle.scope.cancel()

    async def _end_lost(self, task: Task, why: str) -> None:
        """A run whose lease was lost, its box stopped: its task is ended as a reclaim would end it (requeued
        when it had not acted), unless the host that took the lease over did so first (the move names the run).
        Where the database cannot be reached, the task is left to the host that takes the lease over."""
        assert task.run_id is not None
        try:
            current = await self.db.run(self.tasks.get, task.id)
            facts = await self.db.run(self.tasks.run_facts, task.run_id)
            action, reason = reclaim_decision(
                attempts=current.attempts, max_attempts=self.settings.max_attempts, acted=facts.acted,
                cancel_requested=current.cancel_requested,
            )  # fmt: skip
            await self.db.run(self.tasks.reclaim, task.id, task.run_id, action, f"{reason}; {why}")
        except Exception as exc:  # noqa: BLE001 - the host that takes the lease over reclaims it
            log.error("task %s: could not end its run after its lease was lost: %s", task.id, exc)

    async def _on_spare(
        self,
        handle: _Running,
        spare: Spare,
        runtime: str,
        config: ImpConfig,
        host: RunFence,
        params: TaskRunParams,
        init_timeout: float,
    ) -> TaskRunResult | None:
        """Run the task on the spare claimed for it (issue 37, ``spares.serving``): its /state handed into the
        spare's, the spare's host bound to the run's fence, ``box.init`` once, then ``task.run``; before this
        returns the spare is closed and the /state is back in the task's dir. None: the spare failed before the
        task began (it died, or would not take its init) — nothing ran, and the caller starts a box."""
        task = handle.task
        assert task.run_id == spare.spec.run_id and spare.box is not None
        # A process box: a reclaim after this host died finds it by its pid, as a box started for the run.
        if spare.box.host_pid is not None:
            await self.db.run(self.tasks.record_pid, task.run_id, spare.box.host_pid)
        try:
            async with serving(
                spare, state_dir=self.imps.task_state_dir(task.imp, task.id), channel_id=task.channel_id,
                host=host, init=lambda spec: self._init_params(task, config, spec, host.guard.check),
                init_timeout=init_timeout,
            ) as box:  # fmt: skip
                handle.box = box
                metrics.box_started(runtime, "spare")  # a box started ahead serves this task
                return await box.run_task(params)
        except SpareFailed as exc:
            log.warning(
                "task %s: its spare box failed before the task began (%s); starting one", task.id, exc
            )
            handle.box = None
            return None

    async def _run_box(
        self,
        handle: _Running,
        backend: BoxBackend,
        config: ImpConfig,
        host: RunFence,
        spare: Spare | None = None,
    ) -> None:
        task = handle.task
        assert task.run_id is not None
        ceiling = task.ceiling_s
        if self.settings.max_ceiling_s is not None:
            ceiling = min(ceiling, self.settings.max_ceiling_s)
        spec = BoxSpec(
            imp=task.imp,
            channel_id=task.channel_id,
            state_dir=self.imps.task_state_dir(task.imp, task.id),  # its own /state (issue 22)
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
                        params = await self._task_params(task)
                        init_timeout = min(ceiling, self.settings.init_timeout_s)
                        result = None
                        if spare is not None:
                            result = await self._on_spare(
                                handle, spare, backend.name, config, host, params, init_timeout
                            )
                        if result is None:
                            async with backend.open(spec, host) as box:
                                handle.box = box
                                self.started += 1
                                metrics.box_started(backend.name, "cold")  # a box started for this task
                                # a process box; an engine's box has no pid of ours
                                if box.host_pid is not None:
                                    await self.db.run(self.tasks.record_pid, task.run_id, box.host_pid)
                                init = await self._init_params(
                                    task, config, spec, host.guard.check
                                )  # the box's scopes: once it runs; fenced by its run's lease
                                await box.init(init, timeout=init_timeout)
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
            if handle.lost is not None:
                with anyio.CancelScope(shield=True):
                    await self._end_lost(task, handle.lost)
                return
            end = RunEnd(
                box_outcome=box_outcome, box_summary=box_summary, ceiling_s=ceiling, ceiling_hit=ceiling_hit,
                died=died, cancelled=handle.scope.cancelled_caught,
            )  # fmt: skip
            with anyio.CancelScope(shield=True):
                await self._finish(task, end, returncode)
                if task.kind == SLEEP_KIND:  # the night forgot: the file shrinks when it pays
                    await self._compact()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self.db.run(
                    self.tasks.interrupt,
                    task.id,
                    task.run_id,
                    "interrupted: the supervisor stopped; it runs again",
                )
            raise

    async def _finish(self, task: Task, end: RunEnd, returncode: int | None) -> None:
        assert task.run_id is not None
        facts = await self.db.run(self.tasks.run_facts, task.run_id)
        attestation = attest(end, facts)
        not_before = None
        if attestation.deferred:
            rows = await self.gateway.ledger.db.run(self.gateway.ledger.summary)
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
        if once and self.settings.prunes:
            await self._prune_task_state()  # one bounded pass per `supervise --once` (a cron job)
        log.info(
            "supervising%s: concurrency %d, tick %.2f s%s",
            f" {', '.join(sorted(self.settings.kinds))} tasks only" if self.settings.kinds is not None else "",
            # (the memory clock ticks every settings.memory_tick_s in the supervisor of every kind)
            self.settings.concurrency, self.settings.tick_s, " (once: until nothing is due)" if once else "",
        )  # fmt: skip
        with _counting(self):
            await self._loop(once, stop)

    async def _loop(self, once: bool, stop: anyio.Event) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._wake_on_stop, stop)
            if not once and self.settings.prunes:
                tg.start_soon(self._prune_forever, name="prune task state")
            while not stop.is_set():
                self._wake = anyio.Event()
                await self.tick(tg)
                if (
                    once
                    and not self.running
                    and not await self.db.run(
                        lambda: self.tasks.has_ready(self.settings.kinds, imps=self.settings.imps)
                    )
                ):
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

    def wake(self) -> None:
        """Tick now (a task was just queued and someone waits for it)."""
        self._wake.set()

    async def _wake_on_stop(self, stop: anyio.Event) -> None:
        await stop.wait()
        self._wake.set()
