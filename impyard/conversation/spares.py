"""Spare boxes (issue 37, docs/conversation.md "Spare boxes"): boxes started ahead, per imp and backend, that a
conversation's first message claims instead of waiting for a box to start.

A spare is started and locked down exactly as a session's box is (``backend.open``), with a ``/state`` of its own
(``impyard.backends.handover``), and waits before ``box.init``: it holds no channel, no scopes, no state of any
conversation. Until a session claims it its host is a ``SpareHost``, which refuses every request (a model call, a
memory read, a post: each needs a channel and scopes it has not been given). The claim is the ``box.init`` that
gives it its channel and scopes, once; the box then serves that one session until it closes, and is never handed
to another channel or imp.

The pool keeps ``[box] spares`` spares of each imp that has had a conversation in the last ``[box] spares_idle_s``
(none for an imp with none), at most ``IMPYARD_SPARES_MAX`` on the host, and none while the host's available
memory is under ``SPARE_MEMORY_FLOOR_BYTES``. Each imp's keeper refills after a claim and replaces a spare that
died unclaimed (never a lost turn: no turn was on it), and drains the imp's spares once it has had no session for
the idle period (counted from its last session's end: a task that took one of its spares keeps it no longer).
Every spare is a task of the session manager's task group: a shutdown closes them with every other box.

A task run of the same host (``impyard serve``, ``impyard chat``: their supervisor shares this pool) claims a ready
spare of its imp as a session does, when the spare's backend starts the box the task's would (``same_lockdown``):
both serve on it through ``serving``, which hands the /state in, binds the spare's host, sends ``box.init`` once,
and on every path lets the pool close the box and hand the /state back before it returns.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import anyio
from anyio.abc import TaskGroup
from pydantic import BaseModel

from box.protocol import HOST_METHODS, ErrorCode, RpcError
from box.protocol.memory import SessionMemory
from box.protocol.models import BoxInitParams, EmptyFromHost, TurnStageParams
from impyard.backends import BoxBackend, BoxDied, BoxHost, BoxSpec, BoxTimeout, RunningBox
from impyard.backends.handover import hand_back, hand_in, sweep
from impyard.backends.mounts import running_mounts
from impyard.threads import in_thread

log = logging.getLogger("impyard.sessions")

SPARES_MAX_ENV = "IMPYARD_SPARES_MAX"
HOST_SPARES_MAX = 8  # spares on one host at most, whatever the imps' settings say
SPARE_MEMORY_FLOOR_BYTES = (
    1024**3
)  # no spare is started, and those there are drained, below this much free memory
# A claimed spare's replacement starts once the claimant's first turn is done, and at the latest this long after
# the claim: a box start (the engine, Python loading the box) would otherwise take the CPU that the first reply
# it was kept for needs — a new conversation's first reply is what spares are for.
REFILL_AFTER_S = 1.0
DIED_IN_A_ROW_LIMIT = 3  # spares of an imp that die unclaimed in a row: then none until its next conversation
READY_TIMEOUT_S = 60.0  # a spare's program has this long to load and answer ``box.ready``
SPARE_CHANNEL = ""  # an unclaimed spare's channel: none
UNBOUND_REASON = "this box is a spare and serves no channel yet"


@dataclass(frozen=True)
class SpareSettings:
    """An imp's spares: how many to keep (``[box] spares``) while it has had a conversation within ``idle_s``."""

    count: int = 0
    idle_s: float = 3600.0


def available_memory() -> int | None:
    """``MemAvailable`` of this host in bytes (None where the kernel does not say: no floor applies)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:  # noqa: PTH123
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def host_spares_max(environ: dict[str, str] | None = None) -> int:
    """``IMPYARD_SPARES_MAX`` (a whole number, 0 turns spares off), else ``HOST_SPARES_MAX``; a bad value is
    said once in the log and the default applies."""
    raw = (os.environ if environ is None else environ).get(SPARES_MAX_ENV, "").strip()
    if not raw:
        return HOST_SPARES_MAX
    if raw.isdigit() and int(raw) <= 1000:
        return int(raw)
    log.warning("%s=%r is not a whole number from 0 to 1000; using %d", SPARES_MAX_ENV, raw, HOST_SPARES_MAX)
    return HOST_SPARES_MAX


def same_lockdown(started_by: BoxBackend, backend: BoxBackend) -> bool:
    """Whether a box ``started_by`` started is the box ``backend`` would start: the same backend, or one whose
    ``lockdown`` is equal (a Docker box's image, limits, runtime, home and state root; a process box's command and
    state root), whatever label names the role that started it (issue 37: the supervisor's task backend and the
    session manager's are two objects that start the same box). A backend without ``lockdown`` matches only
    itself."""
    if started_by is backend:
        return True
    mine, theirs = getattr(started_by, "lockdown", None), getattr(backend, "lockdown", None)
    return mine is not None and mine == theirs


class SpareFailed(Exception):
    """The claimed spare failed before its work began — it died, its ``box.init`` timed out or was refused, or its
    /state could not be handed in. Nothing ran on it, and its /state is back where it was: the caller starts a
    box as it would have without a spare."""


class SpareHost:
    """A spare's host: until its claim it refuses every request and forgets its stages; from its claim on, the
    claiming session's host, or task run's fence (the gateway behind it), hears everything, as a cold box's would."""

    def __init__(self, imp: str) -> None:
        self.imp = imp
        self.bound: BoxHost | None = None

    def bind(self, host: BoxHost) -> None:
        if self.bound is not None:
            raise RuntimeError("a spare box is claimed once")
        self.bound = host

    async def serve(self, spec: BoxSpec, method: str, params: BaseModel) -> BaseModel | None:
        if self.bound is not None:
            return await self.bound.serve(spec, method, params)
        if HOST_METHODS[method].is_notification:  # its log lines: nothing of anyone's is in them yet
            log.debug("spare box of %s: %s before its claim (ignored)", self.imp, method)
            return None
        log.warning("spare box of %s asked for %s before its claim: refused", self.imp, method)
        raise RpcError(ErrorCode.DENIED, f"denied: {UNBOUND_REASON}", {"rule": "spare", "reason": "unbound"})

    async def turn_stage(self, spec: BoxSpec, params: TurnStageParams, *, woken: bool = False) -> None:
        if self.bound is not None:
            await self.bound.turn_stage(spec, params, woken=woken)

    async def refused(self, spec: BoxSpec, method: str, code: int, reason: str) -> None:
        if self.bound is not None:
            await self.bound.refused(spec, method, code, reason)
        else:
            log.warning("spare box of %s sent a refused %s before its claim", self.imp, method[:64])

    async def closed(self, spec: BoxSpec) -> None:
        if self.bound is not None:
            await self.bound.closed(spec)

    def given(self, spec: BoxSpec, memory: SessionMemory | None) -> None:
        if self.bound is not None:
            self.bound.given(spec, memory)


@dataclass(eq=False)
class Spare:
    """One spare box: started by the pool's task, claimed at most once by a session or a task run, closed by the
    pool's task once it lets go (``release``) — or once drained, or dead, unclaimed."""

    imp: str
    backend: BoxBackend
    spec: BoxSpec
    host: SpareHost
    box: RunningBox | None = None  # set once it runs
    claimed: bool = False
    draining: bool = False
    wake: anyio.Event = field(default_factory=anyio.Event)  # claimed, drained, or dead
    released: anyio.Event = field(default_factory=anyio.Event)  # its session is done with it
    closed: anyio.Event = field(default_factory=anyio.Event)  # its box is gone and its /state handed back
    # Its claimant's first work is done (or REFILL_AFTER_S passed): from then its replacement may start.
    settled: anyio.Event = field(default_factory=anyio.Event)

    @property
    def ready(self) -> bool:
        box = self.box
        return box is not None and not self.claimed and not self.draining and not box.exited.is_set()

    def settle(self) -> None:
        """Its claimant's first turn is done: its replacement may start now (``SparePool.claim``)."""
        self.settled.set()

    def release(self) -> None:
        self.settled.set()
        self.released.set()
        self.wake.set()


@asynccontextmanager
async def serving(
    spare: Spare,
    *,
    state_dir: Path,
    channel_id: str,
    host: BoxHost,
    init: Callable[[BoxSpec], Awaitable[BoxInitParams]],
    init_timeout: float,
) -> AsyncIterator[RunningBox]:
    """Serve one session or one task run on the spare its caller claimed (issue 37), as on a box started for it.

    ``state_dir`` (the channel's /state, or the task's) is handed into the spare's own dir — its previous box must
    have closed — the spare's host is bound to ``host`` (from here on its requests are ``channel_id``'s, judged as
    any of its boxes'), and ``box.init`` (what ``init`` answers for the box's spec) gives it its channel and
    scopes, once. Then the body uses the box. On every path the spare is released, and before this returns the
    pool has closed it and handed its /state back to ``state_dir``; a body that fails or is cancelled (a ceiling,
    a lost lease, a shutdown) has the box killed first, as a started box's backend would. ``SpareFailed``, on
    entry: nothing ran on it."""
    box = spare.box
    assert box is not None and spare.claimed  # a spare is claimed only once it runs
    try:
        try:
            spec = replace(spare.spec, channel_id=channel_id)
            params = await _handed_in_beside(init(spec), state_dir, spare)
            # Only now is it the channel's: whatever it asked before this was refused as an unbound spare's.
            box.spec = spec
            spare.host.bind(host)
            await box.init(params, timeout=init_timeout)
        except (BoxDied, BoxTimeout, RpcError, OSError) as exc:
            raise SpareFailed(str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__) from exc
        yield box
    except BaseException:
        await box.kill()  # failed, or cancelled: no polite close (shielded)
        raise
    finally:
        spare.release()
        with anyio.CancelScope(shield=True):
            await spare.closed.wait()  # closed, its /state handed back, before the next box of it


async def _handed_in_beside(init: Awaitable[BoxInitParams], state_dir: Path, spare: Spare) -> BoxInitParams:
    """``state_dir``'s files handed into the spare's /state (a thread) while ``init`` is read (the database, the
    persona's files): the claim waits for the slower of the two, not for both in turn. Either one's error is
    raised as it would have been alone, the hand-in's first."""
    read: list[BoxInitParams] = []
    failed: list[Exception] = []
    async with anyio.create_task_group() as tg:

        async def reading() -> None:
            try:
                read.append(await init)
            except Exception as exc:  # noqa: BLE001 - raised below, once the hand-in is done
                failed.append(exc)

        tg.start_soon(reading)
        try:
            await in_thread(hand_in, state_dir, spare.spec.state_dir)
        except OSError as exc:  # raised below, once the reading is done: never wrapped in a group
            failed.insert(0, exc)
    if failed:
        raise failed[0]
    return read[0]


class SparePool:
    """The spares of one session manager, in its task group (``start``); its host's supervisor claims from it too."""

    def __init__(
        self,
        *,
        settings_for: Callable[[str], SpareSettings],
        backend_for: Callable[[str], BoxBackend],
        spare_dir_for: Callable[[str], Path],
        live_sessions: Callable[[str], int],
        sleep: Callable[[float], Awaitable[None]],
        host_max: int | None = None,
        free_memory: Callable[[], int | None] = available_memory,
        monotonic: Callable[[], float] = anyio.current_time,
    ) -> None:
        """``live_sessions``: the imp's sessions now (never its tasks: the idle period counts from its last session's
        end); ``sleep`` and ``monotonic``: the idle period's clock."""
        self.settings_for = settings_for
        self.backend_for = backend_for
        self.spare_dir_for = spare_dir_for
        self.live_sessions = live_sessions
        self.sleep = sleep
        self.host_max = host_spares_max() if host_max is None else host_max
        self.free_memory = free_memory
        self.monotonic = monotonic
        self.spares: set[Spare] = set()
        self.started = 0  # spares ever started (the benchmark's and the tests' count)
        self.claimed = 0
        self._tg: TaskGroup | None = None
        self._keepers: dict[str, anyio.Event] = {}  # imp -> the event that wakes its keeper
        self._died: dict[str, int] = {}  # imp -> spares that died unclaimed in a row
        # imp -> why its latest spare ended before a claim (``impyard box check`` says it)
        self.failures: dict[str, str] = {}
        self._idle_since: dict[str, float] = {}  # imp -> since when it has had no session (``monotonic``)
        self._swept: set[str] = set()
        self._changed = anyio.Event()

    def start(self, tg: TaskGroup) -> None:
        self._tg = tg

    # ------------------------------------------------------------ what the session manager asks

    def wanted(self, imp: str) -> None:
        """``imp`` has a conversation: keep its spares (its keeper starts, or hears of it)."""
        if self._tg is None or self.settings_for(imp).count <= 0 or self.host_max <= 0:
            return
        self._died.pop(imp, None)  # a conversation gives a failing imp's spares another try
        self._idle_since.pop(imp, None)  # and its idle period starts again once it has none
        if imp in self._keepers:
            self._keepers[imp].set()
        else:
            self._keepers[imp] = anyio.Event()
            self._tg.start_soon(self._keep, imp, name=f"spares of {imp}")

    def resume(self, imp: str, quiet_s: float) -> bool:
        """At a host's start: ``imp``'s last conversation ended ``quiet_s`` ago (on this host before a restart, or
        on another of the database): its spares are kept as if this host had seen it, for what is left of the idle
        period — so the first message after a restart or a takeover finds one. False: none are kept (the period
        is over, or the imp keeps none)."""
        settings = self.settings_for(imp)
        if (
            self._tg is None
            or settings.count <= 0
            or self.host_max <= 0
            or not 0 <= quiet_s < settings.idle_s
        ):
            return False
        self.wanted(imp)
        if not self.live_sessions(imp):
            self._idle_since[imp] = self.monotonic() - quiet_s  # the keeper's idle period runs from then
        return True

    def poke(self, imp: str) -> None:
        """Something changed for ``imp`` (a session ended, a spare ended): its keeper looks again."""
        event = self._keepers.get(imp)
        if event is not None:
            event.set()
        self._changed.set()
        self._changed = anyio.Event()

    async def changed(self) -> None:
        """Until the next change of any spare (one ready, claimed, ended): for a watcher (the benchmark)."""
        await self._changed.wait()

    def claim(self, imp: str, backend: BoxBackend) -> Spare | None:
        """A ready spare of ``imp`` whose box is the one ``backend`` would start (``same_lockdown``), now the
        caller's — a session's or a task run's, never anyone else's; None: none. The caller serves on it
        (``serving``) or lets it go (``Spare.release``)."""
        for spare in sorted(self.spares, key=lambda s: s.spec.run_id):
            if spare.imp == imp and spare.ready and same_lockdown(spare.backend, backend):
                spare.claimed = True
                spare.wake.set()
                self.claimed += 1
                if self._tg is not None:  # refilled in the background, once its first turn is done
                    self._tg.start_soon(self._refill_after, spare, name=f"refill of {imp}'s spares")
                return spare
        return None

    async def _refill_after(self, spare: Spare) -> None:
        with anyio.move_on_after(REFILL_AFTER_S):
            await spare.settled.wait()
        spare.settled.set()
        self.poke(spare.imp)

    def _unsettled(self, imp: str) -> int:
        """Spares of ``imp`` started and not yet given up for a replacement: unclaimed, or claimed and their
        claimant's first turn still running (``REFILL_AFTER_S``)."""
        return sum(1 for s in self.spares if s.imp == imp and not (s.claimed and s.settled.is_set()))

    def waiting(self, imp: str | None = None) -> int:
        """Spares started or starting, not claimed (``impyard hosts``' spares)."""
        return sum(1 for s in self.spares if not s.claimed and (imp is None or s.imp == imp))

    def states(self) -> list[tuple[str, str]]:
        """``impyard_boxes``: each unclaimed spare, ``spare`` once it runs, ``starting`` before."""
        return [(s.imp, "spare" if s.box is not None else "starting") for s in self.spares if not s.claimed]

    def drain(self, imp: str | None = None) -> None:
        """Close the unclaimed spares (of ``imp``, or all): idle, short of memory, shutting down."""
        for spare in list(self.spares):
            if not spare.claimed and (imp is None or spare.imp == imp):
                spare.draining = True
                spare.wake.set()

    def stop(self) -> None:
        """Shutting down: no spare is started or claimed any more, and those waiting close."""
        self._tg = None
        for event in self._keepers.values():
            event.set()
        self.drain()

    # ------------------------------------------------------------ the keeper of one imp's spares

    def _short_of_memory(self) -> bool:
        free = self.free_memory()
        return free is not None and free < SPARE_MEMORY_FLOOR_BYTES

    def _fill(self, imp: str) -> None:
        tg = self._tg
        if tg is None or self._died.get(imp, 0) >= DIED_IN_A_ROW_LIMIT:
            return
        if self._short_of_memory():
            if self.waiting():
                log.info("the host is short of memory: closing its spare boxes")
            self.drain()
            return
        want = self.settings_for(imp).count
        backend = self.backend_for(imp)
        while self._unsettled(imp) < want and self.waiting() < self.host_max:
            run_id = uuid.uuid4().hex
            spec = BoxSpec(imp, SPARE_CHANNEL, self.spare_dir_for(imp) / run_id, run_id=run_id)
            spare = Spare(imp, backend, spec, SpareHost(imp))
            self.spares.add(spare)
            self.started += 1
            tg.start_soon(self._run_spare, spare, name=f"spare box of {imp}")

    async def _keep(self, imp: str) -> None:
        """Keep ``imp``'s spares until it has had no session for the idle period (or the host stops). The period
        counts from the moment it had none: a claim by a task, or a spare's end, never starts it again."""
        try:
            if imp not in self._swept:  # what a host that died left behind: handed back, or removed
                self._swept.add(imp)
                try:
                    mounts = await in_thread(running_mounts)
                    await in_thread(sweep, self.spare_dir_for(imp), mounts)
                except OSError as exc:
                    log.warning("could not sweep the spare box dirs of %s: %s", imp, exc)
            while self._tg is not None:
                changed = self._keepers[imp] = anyio.Event()
                self._fill(imp)
                idle_s = self.settings_for(imp).idle_s
                idle_since: float | None = None
                if self.live_sessions(imp):
                    self._idle_since.pop(imp, None)
                else:
                    idle_since = self._idle_since.setdefault(imp, self.monotonic())
                fired = False
                async with anyio.create_task_group() as tg:

                    async def idle_timer(left_s: float) -> None:
                        nonlocal fired
                        await self.sleep(left_s)
                        fired = True
                        tg.cancel_scope.cancel()

                    if idle_since is not None:
                        tg.start_soon(idle_timer, max(0.0, idle_s - (self.monotonic() - idle_since)))
                    await changed.wait()
                    tg.cancel_scope.cancel()
                if fired:
                    log.info("no conversation of %s for %g s: closing its spare boxes", imp, idle_s)
                    return
        finally:
            self._keepers.pop(imp, None)
            self._idle_since.pop(imp, None)
            self.drain(imp)

    @staticmethod
    async def _until_ready(spare: Spare, box: RunningBox) -> bool:
        """Whether the box answered ``box.ready`` (up, and loaded for its turns: what a claim would otherwise wait
        for) before the spare was drained. Its errors are raised as they came, never in a group."""
        failed: list[Exception] = []
        async with anyio.create_task_group() as tg:

            async def drained() -> None:
                await spare.wake.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(drained)
            try:
                await box.request("box.ready", EmptyFromHost(), timeout=READY_TIMEOUT_S)
            except RpcError:
                pass  # a box that refuses it (an older image) answered all the same: it is up
            except Exception as exc:  # noqa: BLE001 - raised below, outside the group
                failed.append(exc)
            tg.cancel_scope.cancel()
            if not failed:
                return True
        if failed:
            raise failed[0]
        return False

    async def _run_spare(self, spare: Spare) -> None:
        """One spare's whole life: started, waiting, claimed and served (by its session) or drained, closed."""
        died = False
        try:
            async with spare.backend.open(spare.spec, spare.host) as box:
                if not await self._until_ready(spare, box):
                    await (
                        box.kill()
                    )  # drained while it loaded (a stop, short of memory): nothing to close politely
                    return
                spare.box = box
                self.poke(spare.imp)  # the census and a claim waiting for it see it now
                async with anyio.create_task_group() as tg:

                    async def death() -> None:
                        await box.exited.wait()
                        spare.wake.set()

                    tg.start_soon(death)
                    await spare.wake.wait()
                    if spare.claimed:
                        await (
                            spare.released.wait()
                        )  # the session's box now: it closes when the session is done
                    else:
                        died = not spare.draining
                        if died:
                            self.failures[spare.imp] = f"it exited before its claim (exit {box.returncode})"
                    tg.cancel_scope.cancel()
                if not spare.claimed:
                    await box.kill()  # it holds nothing of anyone's: no polite close to wait for
        except Exception as exc:  # noqa: BLE001 - a spare that cannot start costs nothing but its own start
            died = not spare.claimed
            reason = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            if died:
                self.failures[spare.imp] = reason
            log.warning("a spare box of %s ended: %s", spare.imp, reason)
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await in_thread(hand_back, spare.spec.state_dir)
                except OSError as exc:
                    log.warning("could not hand back the /state of a spare box of %s: %s", spare.imp, exc)
                self.spares.discard(spare)
                spare.closed.set()
            if died:
                self._died[spare.imp] = self._died.get(spare.imp, 0) + 1
                log.info("a spare box of %s died unclaimed; replacing it", spare.imp)
            elif spare.claimed:
                self._died.pop(spare.imp, None)
            self.poke(spare.imp)
