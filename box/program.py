"""The box program: serves the host's requests (docs/protocol.md) over one peer.

``box.init`` creates the responder; ``mailbox.deliver`` and ``task.run`` (kind ``prompt``)
run one turn each through it, one at a time; ``mailbox.event`` (a notification) records a
channel event. A ``depart`` task (mechanism 103) hands the person who left to the memory
engine, which thinks the conversation over quietly: no reply, nothing posted. The imp's day
(issue 15) runs as tasks too: ``reflect`` is one quiet reflection when the imp has been idle
(mechanisms 104-106), ``sleep`` one night over the scope the host opened — consolidation of
what happened since ``args["since"]`` when ``args["consolidate"]`` (default true), then
forgetting (107-114). The box's own files — its journal and the memory's call log — live only under
its state dir, which no other box shares (issue 22); the responder's history lines are the host's.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream
from pydantic import BaseModel

import box
from box.protocol import BOX_METHODS, HOST_METHODS, PROTOCOL_VERSION, ErrorCode, Peer, PeerClosed, RpcError
from box.protocol.models import (
    BoxInitParams,
    BoxInitResult,
    DeliverParams,
    DeliverResult,
    Empty,
    LogParams,
    MailboxEventParams,
    TaskArg,
    TaskRunParams,
    TaskRunResult,
)

if TYPE_CHECKING:  # issue 37: a light start; these load with the first turn, not before box.init's answer
    from box.memory import MemoryEngine
    from box.model import ModelClient
    from box.responder import Responder
    from box.tools import ToolRegistry

log = logging.getLogger("box")
P = TypeVar("P", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)

MEMORY_OFF = "memory is off: nothing to reflect on"
MEMORY_OFF_NIGHT = "memory is off: nothing to fold or forget"
JOURNAL = "journal.jsonl"
JOURNAL_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC  # what open("a") asks for
REFLECT_KIND = "reflect"
SLEEP_KIND = "sleep"


@runtime_checkable
class Departing(Protocol):
    """A memory engine that can see a person leave (``box.memory.engine.ChatMemory``, mechanism 103)."""

    async def depart(self, *, person_id: str, now: datetime) -> str:
        """Think the conversation with ``person_id`` over, quietly; a short account of what came of it."""
        ...


@runtime_checkable
class Reflecting(Protocol):
    """A memory engine that can reflect when the imp is idle (mechanisms 105-106)."""

    async def reflect_idle(self, *, now: datetime) -> str: ...


@runtime_checkable
class Sleeping(Protocol):
    """A memory engine that can sleep over its scope: fold (if asked), then forget (mechanisms 107-114)."""

    async def night(self, *, now: datetime, since: datetime, consolidate: bool) -> str: ...


class BadTaskArgs(ValueError):
    """A task's ``args`` that the box cannot run; the task fails and says why."""


def night_args(args: Mapping[str, TaskArg], now: datetime) -> tuple[datetime, bool]:
    """A ``sleep`` task's arguments: ``since`` (ISO 8601, the imp's waking; a time without a zone is UTC) and
    ``consolidate`` (a boolean, default true). ``since`` may be left out only when nothing is folded."""
    consolidate = args.get("consolidate", True)
    if not isinstance(consolidate, bool):
        raise BadTaskArgs(f"args.consolidate must be true or false, not {consolidate!r}"[:300])
    raw = args.get("since")
    if raw is None:
        if consolidate:
            raise BadTaskArgs("a sleep task that folds names args.since (when the imp woke)")
        return now, consolidate
    if not isinstance(raw, str):
        raise BadTaskArgs(f"args.since must be an ISO 8601 time, not {raw!r}"[:300])
    try:
        since = datetime.fromisoformat(raw)
    except ValueError:
        raise BadTaskArgs(f"args.since is not an ISO 8601 time: {raw!r}"[:300]) from None
    return (since if since.tzinfo is not None else since.replace(tzinfo=UTC)), consolidate


class BoxProgram:
    """State of one box session: initialised once, then turns one at a time."""

    def __init__(
        self,
        state_dir: Path,
        *,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        memory: MemoryEngine | None = None,
        tools: ToolRegistry | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.peer: Peer | None = None
        self.init: BoxInitParams | None = None
        self.responder: Responder | None = None
        self._turn_lock = anyio.Lock()
        self._loaded_for_turns = False  # box.ready's loading, once (issue 37)
        # Seams for tests and for the memory engine: the backoff's sleep, the memory, the tools.
        self._sleep = sleep
        self._memory = memory
        self._tools = tools

    def attach(self, peer: Peer) -> None:
        self.peer = peer

    async def handle(self, method: str, params: BaseModel) -> BaseModel | None:
        if method == "box.init":
            assert isinstance(params, BoxInitParams)
            return self._initialise(params)
        if (
            method == "box.ready"
        ):  # issue 37: a spare's pool asks, before its init; answered once it is loaded
            return self._load_for_turns()
        if self.init is None:
            if method == "mailbox.event":  # a notification has no one to tell: note it and move on
                log.warning("a channel event arrived before box.init; ignored")
                return None
            raise RpcError(ErrorCode.NOT_INITIALISED, "not initialised: send box.init first")
        if method == "box.shutdown":
            async with self._turn_lock:  # let a running turn finish; the host bounds the wait
                if self.responder is not None:
                    await self.responder.history.flush()  # channel events no turn has sent yet
                return Empty()
        if method == "mailbox.deliver":
            assert isinstance(params, DeliverParams)
            return await self._one_at_a_time(self._deliver, params)
        if method == "task.run":
            assert isinstance(params, TaskRunParams)
            return await self._one_at_a_time(self._run_task, params)
        if method == "mailbox.event":  # a notification: recorded even while a turn runs
            assert isinstance(params, MailboxEventParams)
            await self._ready().record_event(params)
            return None
        raise RpcError(ErrorCode.METHOD_NOT_FOUND, f"method not found: {method}")

    def _load_for_turns(self) -> Empty:
        """``box.ready`` (issue 37): a spare loads, before its claim, what its first turn would load in front of
        the person (``box.warmup``). In the loop's own thread, once: nothing else is asked of a spare meanwhile
        (its pool claims it only once this is answered), and no schema is built by two threads at once."""
        if not self._loaded_for_turns:
            from box.warmup import load_for_turns

            load_for_turns()
            self._loaded_for_turns = True
        return Empty()

    def _initialise(self, params: BoxInitParams) -> BoxInitResult:
        if self.init is not None:
            raise RpcError(ErrorCode.INVALID_REQUEST, "already initialised")
        self.init = params
        log.info("box %s for imp %s, channel %s", box.__version__, params.imp.name, params.session.channel_id)
        return BoxInitResult(protocol=PROTOCOL_VERSION, box=box.__version__)

    def _ready(self) -> Responder:
        """The responder, made by the first request that needs one (issue 37: a light start). ``box.init`` is
        answered before the turn's modules (the responder, the memory engine and its prompts) are even loaded;
        every request after it is served exactly as if they had been made then. Made in one synchronous step, so
        two requests that both need it cannot make two."""
        if self.responder is None:
            assert self.peer is not None and self.init is not None
            from box.responder import Responder, model_client

            params = self.init
            # one client for the reply and the memory: what it learns is shared
            client = model_client(self.peer, params)
            memory = self._memory or self._memory_engine(self.peer, params, client)
            self.responder = Responder(
                self.peer, params, sleep=self._sleep, memory=memory, tools=self._tools, client=client
            )
        return self.responder

    def _memory_engine(self, peer: Peer, params: BoxInitParams, client: ModelClient) -> MemoryEngine:
        """Issue 23: the engine when the imp has memory on and the host sent the session's scopes."""
        from box.memory import NoMemory

        if not params.imp.memory.enabled or params.memory is None:
            return NoMemory()
        from box.memory.engine import ChatMemory  # only a box with memory loads the engine and its prompts
        from box.memory.store_client import StoreClient

        async def host_log(level: str, message: str) -> None:
            try:
                await peer.notify("log", LogParams(level=level, message=message[:4000]))  # type: ignore[arg-type]
            except PeerClosed:
                pass

        return ChatMemory(
            init=params, store=StoreClient(peer), client=client, state_dir=self.state_dir,
            sleep=self._sleep, host_log=host_log,
        )  # fmt: skip

    async def _one_at_a_time(self, work: Callable[[P], Awaitable[R]], params: P) -> R:
        # The host serialises turns; a second one while busy is refused, not queued.
        if self._turn_lock.locked():
            raise RpcError(ErrorCode.BUSY, "a turn is already running in this box")
        async with self._turn_lock:
            return await work(params)

    async def _deliver(self, params: DeliverParams) -> DeliverResult:
        report = await self._ready().deliver(params)
        self._journal(
            {
                "message_id": params.message.id,
                "outcome": report.result.outcome,
                "at": params.now.isoformat(),
                **report.journal,
            }
        )
        return report.result

    async def _run_task(self, params: TaskRunParams) -> TaskRunResult:
        kind = params.task.kind
        if kind == "probe":
            from box import probe  # only `impyard box check` asks for it

            return TaskRunResult(
                outcome="done", summary="lockdown observations", report=probe.observe(self.state_dir)
            )
        if kind == "prompt":
            responder = self._ready()
            report = await responder.run_prompt_task(params)
            result = responder.task_result(report)
            self._journal(
                {
                    "task_id": params.task.id,
                    "outcome": result.outcome,
                    "at": params.now.isoformat(),
                    **report.journal,
                }
            )
            return result
        if kind == "depart":
            return await self._depart(params)
        if kind in (REFLECT_KIND, SLEEP_KIND):
            return await self._imps_day(params)
        return TaskRunResult(outcome="failed", summary=f"this box does not know task kind {kind!r}")

    async def _depart(self, params: TaskRunParams) -> TaskRunResult:
        """Mechanism 103: the person left this channel's conversation; the engine reflects and learns."""
        from box.memory import NoMemory  # loaded with the responder

        memory = self._ready().memory
        person = params.task.person
        if isinstance(memory, NoMemory):
            result = TaskRunResult(outcome="done", summary=MEMORY_OFF)  # nothing failed: nothing to do
        elif not person:
            result = TaskRunResult(outcome="failed", summary="a depart task names the person who left")
        elif not isinstance(memory, Departing):
            result = TaskRunResult(
                outcome="failed", summary="this box's memory engine cannot see anyone leave"
            )
        else:
            try:
                summary = await memory.depart(person_id=person, now=params.now)
                result = TaskRunResult(outcome="done", summary=summary[:20_000])
            except Exception as exc:  # noqa: BLE001 - the host records why; the box goes on
                log.warning("departure of %s failed: %s", person, exc)
                result = TaskRunResult(
                    outcome="failed", summary=f"departure failed: {type(exc).__name__}: {exc}"[:2_000]
                )
        self._journal(
            {
                "task_id": params.task.id,
                "kind": "depart",
                "outcome": result.outcome,
                "at": params.now.isoformat(),
            }
        )
        return result

    async def _imps_day(self, params: TaskRunParams) -> TaskRunResult:
        """Mechanisms 104-114: a ``reflect`` or ``sleep`` task. Nothing is posted either way."""
        from box.memory import NoMemory  # loaded with the responder

        memory = self._ready().memory
        kind = params.task.kind
        if isinstance(memory, NoMemory):  # nothing failed: nothing to do
            result = TaskRunResult(
                outcome="done", summary=MEMORY_OFF if kind == REFLECT_KIND else MEMORY_OFF_NIGHT
            )
        else:
            result = await self._run_day_task(memory, params)
        self._journal(
            {"task_id": params.task.id, "kind": kind, "outcome": result.outcome, "at": params.now.isoformat()}
        )
        return result

    async def _run_day_task(self, memory: MemoryEngine, params: TaskRunParams) -> TaskRunResult:
        kind, now = params.task.kind, params.now
        what = "reflection" if kind == REFLECT_KIND else "night"
        try:
            if kind == REFLECT_KIND:
                if not isinstance(memory, Reflecting):
                    return TaskRunResult(outcome="failed", summary="this box's memory engine cannot reflect")
                summary = await memory.reflect_idle(now=now)
            else:
                since, consolidate = night_args(params.task.args, now)
                if not isinstance(memory, Sleeping):
                    return TaskRunResult(outcome="failed", summary="this box's memory engine cannot sleep")
                summary = await memory.night(now=now, since=since, consolidate=consolidate)
        except BadTaskArgs as exc:
            return TaskRunResult(outcome="failed", summary=f"bad sleep task: {exc}"[:2_000])
        except Exception as exc:  # noqa: BLE001 - the host records why; the box goes on
            log.warning("%s failed: %s", what, exc)
            return TaskRunResult(
                outcome="failed", summary=f"{what} failed: {type(exc).__name__}: {exc}"[:2_000]
            )
        return TaskRunResult(outcome="done", summary=summary[:20_000])

    def _journal(self, record: dict[str, Any]) -> None:
        """The box's own record of its turns; it lives only under the state dir. One appending write of the
        line's bytes, as ``open("a")`` would make, without a text file object around it (issue 18)."""
        line = (json.dumps({**record, "logged": datetime.now(UTC).isoformat()}) + "\n").encode("utf-8")
        try:
            fd = os.open(self.state_dir / JOURNAL, JOURNAL_FLAGS, 0o666)
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("could not write the journal under %s: %s", self.state_dir, exc)


async def serve(receive: ByteReceiveStream, send: ByteSendStream, state_dir: Path, **seams: Any) -> None:
    program = BoxProgram(state_dir, **seams)
    peer = Peer(
        receive,
        send,
        serves=BOX_METHODS,
        calls=HOST_METHODS,
        handler=program.handle,
        stop_after=frozenset({"box.shutdown"}),
        logger=logging.getLogger("box.protocol"),
    )
    program.attach(peer)
    await peer.run()
