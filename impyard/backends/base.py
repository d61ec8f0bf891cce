"""What every box backend shares: the spec of a box, the host's handler, and the running box.

A backend only knows how to start and kill the ``python -m box`` process; the
running box (``RunningBox``) speaks the protocol to it the same way for every
backend, treats every byte it writes as hostile, and reaps it on every path.
"""

from __future__ import annotations

import logging
import os
import signal
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import anyio
from anyio.abc import Process
from pydantic import BaseModel

from box.protocol import (
    BOX_METHODS,
    DEFAULT_MAX_LINE_BYTES,
    HOST_METHODS,
    ErrorCode,
    Peer,
    PeerClosed,
    ProtocolViolation,
    RpcError,
)
from box.protocol.codec import LineTooLong, NdjsonDecoder
from box.protocol.memory import SessionMemory
from box.protocol.models import (
    BoxInitParams,
    BoxInitResult,
    DeliverParams,
    DeliverResult,
    EmptyFromHost,
    LogParams,
    TaskRunParams,
    TaskRunResult,
    TurnStageParams,
)
from impyard.backends.conduct import (
    LOG_LIMITS,
    REFUSAL_LIMITS,
    Admission,
    HeldBack,
    NoiseMeter,
    folded_refusals,
    printable,
)
from impyard.backends.statedir import StateQuota, StateUsage, measure_state_dir
from impyard.errors import ImpyardError
from impyard.threads import in_thread_abandoned_on_cancel

log = logging.getLogger("impyard.box")

STDERR_LINE_BYTES = 16_384
STDERR_TAIL_LINES = 40
SHUTDOWN_GRACE_S = 5.0
EXIT_WAIT_S = 5.0
DEATH_REPORT_WAIT_S = 1.0
STATE_CHECK_S = 2.0  # how often a running box's state dir is measured against its quota
# Host requests (model calls, sends, fetches) one box may have in flight at once; the box's own turn
# machine has one at a time, so this is generous. Past it the box is killed: each request in flight
# holds up to a 1 MiB line of host memory (issue 11 #6).
MAX_REQUESTS_IN_FLIGHT = 8
# The box's notification of where its turn is (docs/protocol.md): it goes to BoxHost.turn_stage, not serve.
STAGE_METHOD = "turn.stage"
# Refusals that count against a box's conduct: its requests were invalid or denied.
_REFUSAL_CODES = frozenset(
    {ErrorCode.INVALID_PARAMS, ErrorCode.METHOD_NOT_FOUND, ErrorCode.INVALID_REQUEST, ErrorCode.DENIED}
)


class BoxError(ImpyardError):
    """Something went wrong with a box; the message says what and what to do."""


class BoxStartError(BoxError):
    """The box could not be started with its lockdown (fail closed)."""


class BoxDied(BoxError):
    """The box exited or broke the protocol while a request was pending."""


class BoxTimeout(BoxError):
    """The box did not answer in time."""


@dataclass(frozen=True)
class BoxSpec:
    """Which box: the imp, the channel of its session, and the state dir mounted as ``/state`` — its own, shared
    with no other running box (issue 22: the backends refuse a start whose mount overlaps a running box's).
    A backend turns ``state_dir`` into a name under the state root (``impyard.backends.stateroot``, issue 21)
    and mounts that name, nothing else of the host's."""

    imp: str
    channel_id: str
    state_dir: Path
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)


class BoxHost(Protocol):
    """The host side of a box (the gateway, in real use; a session's or a task run's wrapper of it): every method
    a backend's running box or a session calls on it."""

    async def serve(self, spec: BoxSpec, method: str, params: BaseModel) -> BaseModel | None:
        """A box's request (or its ``log`` line): the answer, or an ``RpcError`` refusal."""
        ...

    async def turn_stage(self, spec: BoxSpec, params: TurnStageParams, *, woken: bool = False) -> None:
        """The box's ``turn.stage`` notification. ``woken``: it names the message the host handed this box for
        the turn now running (a session knows; a running box alone does not)."""
        ...

    async def refused(self, spec: BoxSpec, method: str, code: int, reason: str) -> None:
        """A request the protocol refused before any host saw it (recorded, within the box's refusal budget)."""
        ...

    async def closed(self, spec: BoxSpec) -> None:
        """The box ended: the host forgets what it kept for it."""
        ...

    def given(self, spec: BoxSpec, memory: SessionMemory | None) -> None:
        """What ``box.init`` gives the box (its memory, or none), told before it is sent (issue 32 #1)."""
        ...


class QuietHost:
    """A ``BoxHost`` that hears a box's stages, refusals and end and keeps nothing of them; a subclass serves the
    requests (``RefuseAllHost``, probes and test hosts)."""

    async def serve(self, spec: BoxSpec, method: str, params: BaseModel) -> BaseModel | None:
        raise NotImplementedError

    async def turn_stage(self, spec: BoxSpec, params: TurnStageParams, *, woken: bool = False) -> None:
        pass

    async def refused(self, spec: BoxSpec, method: str, code: int, reason: str) -> None:
        pass

    async def closed(self, spec: BoxSpec) -> None:
        pass

    def given(self, spec: BoxSpec, memory: SessionMemory | None) -> None:
        pass


class RefuseAllHost(QuietHost):
    """A host that answers every request with a denial; for boxes that must not act (``box check``)."""

    async def serve(self, spec: BoxSpec, method: str, params: BaseModel) -> BaseModel | None:
        if HOST_METHODS[method].is_notification:
            return None
        raise RpcError(
            ErrorCode.DENIED, "denied: this box may not act", {"rule": "refuse-all", "reason": "probe"}
        )


class RunningBox:
    """A started box process with its protocol peer. Created by a backend's ``open``."""

    def __init__(
        self,
        spec: BoxSpec,
        process: Process,
        host: BoxHost,
        terminate: Callable[[], Awaitable[None]],
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    ) -> None:
        self.spec = spec
        self.process = process
        self._terminate = terminate
        self._host = host
        self.exited = anyio.Event()
        self.returncode: int | None = None
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self.violation: str | None = None
        self.unresponsive = False
        self._kill_requested = anyio.Event()
        self._logs = NoiseMeter(LOG_LIMITS, anyio.current_time, "log line")
        # Refused by the protocol: recorded here, within the budget, the rest folded. Refused by the host's
        # handler: the gateway records each one itself, so those only count against the box (never folded).
        self._refusals = NoiseMeter(REFUSAL_LIMITS, anyio.current_time, "refusal")
        self._denials = NoiseMeter(REFUSAL_LIMITS, anyio.current_time, "refusal")
        self._box_log = logging.getLogger(f"impyard.box.{spec.imp}")
        assert process.stdin is not None and process.stdout is not None
        self.peer = Peer(
            process.stdout,
            process.stdin,
            serves=HOST_METHODS,
            calls=BOX_METHODS,
            handler=self._serve,
            on_violation=self._on_violation,
            on_refusal=self._refused,
            max_line_bytes=max_line_bytes,
            max_in_flight=MAX_REQUESTS_IN_FLIGHT,
            logger=self._box_log,
        )

    # ------------------------------------------------------------ host side

    async def _serve(self, method: str, params: BaseModel) -> BaseModel | None:
        if method == "log":
            assert isinstance(params, LogParams)
            admission = self._logs.admit(f"{params.level}:{params.message}")
            self._note_held_back(admission.summary, "log")
            if admission.kill:
                self._on_violation(f"flooded the host's log ({self._logs.suppressed} lines held back)")
            if not admission.show:
                return None
        if method == STAGE_METHOD:
            assert isinstance(params, TurnStageParams)  # validated by the protocol before it reaches a host
            await self._host.turn_stage(self.spec, params)
            return None
        try:
            return await self._host.serve(self.spec, method, params)
        except RpcError as exc:
            if exc.code in _REFUSAL_CODES:  # the gateway audited it: it only counts against the box
                if self._denials.admit(f"{method}:{exc.code}").kill:
                    self._on_violation(
                        f"kept sending refused requests ({self._denials.suppressed} over its budget)"
                    )
            raise

    async def _refused(self, method: str, code: int, reason: str) -> None:
        # A request refused by the schema never reaches the host's handler; the host still records it,
        # one row each within the box's refusal budget, the rest folded: one "(folded)" row before the next
        # refusal recorded, or at the box's end.
        admission = self._refusals.admit(f"{method}:{code}")
        self._count_refusal(admission)
        if admission.show:
            if admission.held is not None:
                await self._record_folded(admission.held)
            await self._record_refusal(method, code, reason)

    def _count_refusal(self, admission: Admission) -> None:
        self._note_held_back(admission.summary, "refusal")
        if admission.kill:
            self._on_violation(f"kept sending refused requests ({self._refusals.suppressed} over its budget)")

    async def _record_folded(self, held: HeldBack) -> None:
        reason = folded_refusals(held, self._refusals.budget())
        if reason is not None:
            await self._record_refusal("(folded)", ErrorCode.INVALID_REQUEST, reason)

    async def _record_refusal(self, method: str, code: int, reason: str) -> None:
        try:
            await self._host.refused(self.spec, method, code, reason)
        except Exception:  # noqa: BLE001 - recording a refusal never fails the box's pipe
            log.exception(
                "recording a refused request of box %s/%s failed", self.spec.imp, self.spec.channel_id
            )

    def _note_held_back(self, summary: str | None, what: str) -> None:
        if summary:
            self._box_log.warning("box %s/%s: %s %s", self.spec.imp, self.spec.channel_id, what, summary)

    async def flush_conduct(self) -> None:
        """At the box's end: say what was held back, audit the refusals that were folded, and tell the host
        the box is gone (it forgets the box's per-run state: memory scopes, tallies)."""
        self._note_held_back(self._logs.flush(), "log")
        held = self._refusals.take_held()
        if held:
            self._note_held_back(self._refusals.words(held), "refusal")
            await self._record_folded(held)
        try:
            await self._host.closed(self.spec)
        except Exception:  # noqa: BLE001 - the host's bookkeeping never fails the box's end
            log.exception("closing box %s/%s on the host failed", self.spec.imp, self.spec.channel_id)

    def _on_violation(self, reason: str) -> None:
        # A box that breaks framing is misbehaving: it is killed, never the supervisor.
        if self.violation is None:
            self.violation = reason
            log.error(
                "box %s/%s broke the protocol (%s); killing it", self.spec.imp, self.spec.channel_id, reason
            )
        self._kill_requested.set()

    # ------------------------------------------------------------ calls into the box

    async def request(self, method: str, params: BaseModel, *, timeout: float | None = None) -> BaseModel:
        try:
            return await self.peer.request(method, params, timeout=timeout)
        except TimeoutError as exc:
            self.unresponsive = True  # closing it will not wait for a polite shutdown
            raise BoxTimeout(f"the box did not answer {method} within {timeout:.1f} s") from exc
        except (PeerClosed, ProtocolViolation) as exc:
            with anyio.move_on_after(DEATH_REPORT_WAIT_S):  # so the report can say how it ended
                await self.exited.wait()
            raise BoxDied(self.describe_death(f"{method} got no answer: {exc}")) from exc

    async def init(self, params: BoxInitParams, *, timeout: float = 30.0) -> BoxInitResult:
        result = await self.request("box.init", params, timeout=timeout)
        assert isinstance(result, BoxInitResult)
        return result

    async def deliver(self, params: DeliverParams, *, timeout: float | None = None) -> DeliverResult:
        result = await self.request("mailbox.deliver", params, timeout=timeout)
        assert isinstance(result, DeliverResult)
        return result

    async def run_task(self, params: TaskRunParams, *, timeout: float | None = None) -> TaskRunResult:
        result = await self.request("task.run", params, timeout=timeout)
        assert isinstance(result, TaskRunResult)
        return result

    async def notify(self, method: str, params: BaseModel) -> None:
        """A notification into the box (``mailbox.event``): no answer; BoxDied when it cannot be written."""
        try:
            await self.peer.notify(method, params)
        except (PeerClosed, ProtocolViolation) as exc:
            raise BoxDied(self.describe_death(f"{method} could not be delivered: {exc}")) from exc

    @property
    def host_pid(self) -> int | None:
        """The box's process on the supervisor's own host (the process backend), or None: a box an engine
        runs (a container, a Pod) has none the supervisor may signal; it is stopped through its backend."""
        try:
            return self.process.pid
        except NotImplementedError:
            return None

    def describe_death(self, what: str) -> str:
        parts = [what]
        if self.violation:
            parts.append(f"protocol violation: {self.violation}")
        if self.returncode is not None:
            parts.append(f"exit code {self.returncode}")
        if self.stderr_tail:
            parts.append(f"last log line: {self.stderr_tail[-1][:300]}")
        return "; ".join(parts)

    # ------------------------------------------------------------ lifecycle

    async def close(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Ask the box to shut down, then make sure it is gone."""
        if not self.exited.is_set() and not self.peer.closed and not self.unresponsive:
            with anyio.move_on_after(grace_s):
                try:
                    await self.peer.request("box.shutdown", EmptyFromHost())
                except Exception as exc:  # noqa: BLE001 - any failure here just means: kill it
                    log.debug("box.shutdown failed: %s", exc)
        with anyio.move_on_after(EXIT_WAIT_S):
            if self.process.stdin is not None:
                await self.process.stdin.aclose()
            await self.exited.wait()
        await self.kill()

    async def kill(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._terminate()
            with anyio.move_on_after(EXIT_WAIT_S):
                self.returncode = await self.process.wait()
                self.exited.set()

    async def _pump_peer(self) -> None:
        await self.peer.run()
        # stdout closed: the box is gone or going; make sure it is.
        self._kill_requested.set()

    async def _pump_stderr(self) -> None:
        assert self.process.stderr is not None
        decoder = NdjsonDecoder(STDERR_LINE_BYTES)
        box_log = logging.getLogger(f"impyard.box.{self.spec.imp}.stderr")
        try:
            async for chunk in self.process.stderr:
                for line in decoder.feed(chunk):
                    text = (
                        "(over-long log line dropped)"
                        if isinstance(line, LineTooLong)
                        else line.decode(errors="replace")
                    )
                    text = printable(text, STDERR_LINE_BYTES)
                    self.stderr_tail.append(text)
                    box_log.debug("%s", text)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass

    async def _watch_exit(self) -> None:
        self.returncode = await self.process.wait()
        self.exited.set()
        self._kill_requested.set()

    async def _watch_state(self, quota: StateQuota, state_dir: Path) -> None:
        """Measure the state dir while the box lives; past its quota the box is killed (issue 11 #11)."""
        while not self.exited.is_set():
            usage = await _measured(state_dir, quota)
            over = usage.over(quota)
            if over:
                self._on_violation(f"its state dir holds {over}")
                return
            await anyio.sleep(STATE_CHECK_S)

    async def _watch_kill(self) -> None:
        await self._kill_requested.wait()
        if not self.exited.is_set():
            await self.kill()
        self.peer.stop()


# A measurement younger than one check period is reused (each box has its own state dir since issue 22, so
# this only spares a box's own dir a second walk within one period).
_last_measured: dict[tuple[Path, StateQuota], tuple[float, StateUsage]] = {}


async def _measured(state_dir: Path, quota: StateQuota) -> StateUsage:
    key = (state_dir, quota)
    cached = _last_measured.get(key)
    fresh = cached is not None and anyio.current_time() - cached[0] < STATE_CHECK_S
    if cached is not None and fresh and cached[1].over(quota) is None:  # a verdict to kill is never reused
        return cached[1]
    usage = await in_thread_abandoned_on_cancel(measure_state_dir, state_dir, quota)
    _last_measured[key] = (anyio.current_time(), usage)
    return usage


@asynccontextmanager
async def _unwrapped() -> AsyncIterator[None]:
    """The one error of a box's task group raised as itself (``BoxDied``), not as an ExceptionGroup around it."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves: list[BaseException] = []
        pending: list[BaseException] = [group]
        while pending:
            item = pending.pop()
            if isinstance(item, BaseExceptionGroup):
                pending.extend(item.exceptions)
            else:
                leaves.append(item)
        if len(leaves) == 1:
            raise leaves[0] from leaves[0].__cause__
        raise


def kill_process(process: Process) -> None:
    """SIGKILL without ``Popen.send_signal``, whose poll() would reap the child behind asyncio's back."""
    if process.returncode is None:
        try:
            os.kill(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class BoxBackend(Protocol):
    """Starts boxes. ``open`` yields a running box and reaps it when the block ends, on every path.

    What a backend may assume of the host (issue 21, docs/kubernetes.md): its state root, and nothing else —
    no engine process beside the supervisor, no host path but names under the root. A running box is its
    stdio streams and its exit code; ``RunningBox.host_pid`` is None for every box an engine runs."""

    @property
    def name(self) -> str: ...  # read-only: a class attribute or a property (a wrapper's) both satisfy it

    def open(self, spec: BoxSpec, host: BoxHost) -> AbstractAsyncContextManager[RunningBox]: ...


@asynccontextmanager
async def supervise_process(
    spec: BoxSpec,
    process: Process,
    host: BoxHost,
    terminate: Callable[[], Awaitable[None]],
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    *,
    state_quota: StateQuota | None = None,
    state_dir: Path | None = None,
) -> AsyncIterator[RunningBox]:
    """Run the peer, the stderr pump and the exit watcher for a started box; reap it on every path.
    ``state_quota``: watch the box's state dir (``state_dir``, default the spec's) against it."""
    running = RunningBox(spec, process, host, terminate, max_line_bytes)
    try:
        async with _unwrapped(), anyio.create_task_group() as tg:
            tg.start_soon(running._pump_peer, name="box peer")
            tg.start_soon(running._pump_stderr, name="box stderr")
            tg.start_soon(running._watch_exit, name="box exit")
            tg.start_soon(running._watch_kill, name="box kill")
            if state_quota is not None:
                tg.start_soon(
                    running._watch_state, state_quota, state_dir or spec.state_dir, name="box state quota"
                )
            try:
                yield running
            except BaseException:
                # Cancelled or failed: no polite shutdown, the helpers may already be cancelled.
                await running.kill()
                raise
            else:
                with anyio.CancelScope(shield=True):
                    await running.close()
            finally:
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await terminate()
            await process.aclose()
            await running.flush_conduct()
