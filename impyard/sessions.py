"""Warm box sessions keyed by (imp, channel) (seed 004 §4, design.md §6 and §12).

A live box gets each message through its mailbox; no live box → one is
started. Turns are serialised per session; messages that arrive during a turn
are collected and delivered together as the next turn. The idle window counts
only *between* turns; a turn ceiling and a session ceiling bound the rest. A
message never falls between a closing session and the next one: a session
leaves the map in the same synchronous step that decides it is idle, so the
next ``deliver`` starts a fresh one.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, Protocol

import anyio
from anyio.abc import TaskGroup
from pydantic import BaseModel

from box.protocol import RpcError
from box.protocol.models import BoxInitParams, DeliverParams, DeliverResult, Framing, HistoryEntry, Message
from impyard.backends import BoxBackend, BoxDied, BoxError, BoxHost, BoxSpec, BoxTimeout, RunningBox

log = logging.getLogger("impyard.sessions")

INIT_TIMEOUT_S = 60.0
SHUTDOWN_GRACE_S = 10.0
DIED_NOTICE = "(I ran into a problem and had to restart. Please say that again.)"
BUSY_NOTICE = "(I'm too busy to keep up with this channel right now — some messages will go unanswered.)"
CEILING_NOTICE = "(That took too long, so I stopped. Please try again.)"


@dataclass(frozen=True)
class SessionKey:
    imp: str
    channel_id: str


@dataclass(frozen=True)
class SessionSettings:
    mode: Literal["warm", "cold"] = "warm"
    idle_s: float = 60.0
    turn_ceiling_s: float = 120.0
    session_ceiling_s: float = 1800.0
    queue_limit: int = 50
    failure_notice: str | None = "Sorry — I couldn't answer that just now."


@dataclass(frozen=True)
class Delivery:
    """One woken message, framed, with the channel history it was woken with."""

    key: SessionKey
    message: Message
    framing: Framing
    recent: Sequence[HistoryEntry] = ()


class SessionEvents(Protocol):
    """What the session manager reports; the conversation store and the surface implement it."""

    async def turn_finished(
        self, key: SessionKey, batch: Sequence[Delivery], result: DeliverResult
    ) -> None: ...

    async def notice(self, key: SessionKey, text: str) -> None: ...

    async def turn_ended(self, key: SessionKey) -> None:
        """Every exit path of a turn: the typing indicator stops here."""
        ...


class SessionPlan(Protocol):
    """What the session manager needs to know of an imp's sessions: one object (the conversation host), not four
    callbacks. Everything here may be called at every box start; ``init_for`` does its reading off the loop."""

    def backend_for(self, imp: str) -> BoxBackend: ...

    async def init_for(self, key: SessionKey, now: datetime) -> BoxInitParams: ...

    def state_dir_for(self, imp: str) -> Path: ...

    def settings_for(self, imp: str) -> SessionSettings: ...


def describe_error(exc: BaseException) -> str:
    """One bounded line for an unexpected error: its type and the first line of its message."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]  # what happened, not the task group that carried it
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:1000] if text else type(exc).__name__


def merge_batch(batch: Sequence[Delivery], now: datetime) -> DeliverParams:
    """Messages collected during a turn become one turn: the newest message, the rest in ``recent``."""
    newest = batch[-1]
    framing = newest.framing
    if framing.reason == "group" and any(d.framing.reason == "mention" for d in batch):
        framing = framing.model_copy(update={"reason": "mention"})  # being addressed is not forgotten
    recent = list(newest.recent)
    known = {entry.id for entry in recent}
    for delivery in batch[:-1]:
        if delivery.message.id not in known:
            recent.append(
                HistoryEntry(
                    id=delivery.message.id,
                    author=delivery.message.author,
                    content=delivery.message.content,
                    created_at=delivery.message.created_at,
                )
            )
    recent.sort(key=lambda entry: entry.created_at)
    return DeliverParams(message=newest.message, framing=framing, recent=recent, now=now)


@dataclass(eq=False)
class ChannelSession:
    key: SessionKey
    settings: SessionSettings
    queue: deque[Delivery] = field(default_factory=deque)
    has_work: anyio.Event = field(default_factory=anyio.Event)
    closing: bool = False
    box: RunningBox | None = None
    boxes_started: int = 0
    busy_notified: bool = False
    done: anyio.Event = field(default_factory=anyio.Event)
    in_turn: list[Delivery] = field(default_factory=list)  # taken, outcome not yet recorded

    def push(self, delivery: Delivery) -> None:
        self.queue.append(delivery)
        self.has_work.set()

    def take(self) -> list[Delivery]:
        batch = [self.queue.popleft()] if self.settings.mode == "cold" else list(self.queue)
        if self.settings.mode != "cold":
            self.queue.clear()
        if not self.queue:
            self.has_work = anyio.Event()
            self.busy_notified = False
        return batch


DeliverOutcome = Literal["queued", "started", "busy", "refused"]


class SessionManager:
    """Owns every session's worker in one task group; ``async with`` closes every box on every path."""

    def __init__(
        self,
        *,
        plan: SessionPlan,
        host: BoxHost,
        events: SessionEvents,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        monotonic: Callable[[], float] = anyio.current_time,
    ) -> None:
        """``plan``: what each imp's sessions are made of; ``host``: serves the boxes; ``events``: hears the outcomes."""
        self.plan = plan
        self.host = host
        self.events = events
        self.now = now
        self.sleep = sleep
        self.monotonic = monotonic
        self.sessions: dict[SessionKey, ChannelSession] = {}
        self.boxes_started = 0
        self._live: set[ChannelSession] = set()
        self._tg: TaskGroup | None = None
        self._accepting = False

    async def __aenter__(self) -> SessionManager:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._accepting = True
        return self

    async def __aexit__(self, *exc_info: object) -> bool | None:
        with anyio.CancelScope(shield=True):
            await self.shutdown()
        assert self._tg is not None
        return await self._tg.__aexit__(*exc_info)  # type: ignore[arg-type]

    # ------------------------------------------------------------ the mailbox

    def deliver(self, delivery: Delivery) -> DeliverOutcome:
        """Hand a woken message to its session. Synchronous on purpose: no await, no race."""
        if not self._accepting or self._tg is None:
            return "refused"
        session = self.sessions.get(delivery.key)
        if session is not None and len(session.queue) >= session.settings.queue_limit:
            if not session.busy_notified:
                session.busy_notified = True
                self._tg.start_soon(self._notice, delivery.key, BUSY_NOTICE)
            return "busy"
        if session is not None:
            session.push(delivery)
            return "queued"
        session = ChannelSession(delivery.key, self.plan.settings_for(delivery.key.imp))
        session.push(delivery)
        self.sessions[delivery.key] = session
        self._live.add(session)
        self._tg.start_soon(self._run_session, session, name=f"session {delivery.key}")
        return "started"

    async def notify(self, key: SessionKey, method: str, params: BaseModel) -> bool:
        """A notification for the live box of ``key`` (ENV-13 ``mailbox.event``); False when none is live.

        Events are not queued and start no box: they only matter to a conversation in progress.
        """
        session = self.sessions.get(key)
        box = session.box if session is not None and not session.closing else None
        if box is None:
            return False
        try:
            await box.notify(method, params)
        except BoxError as exc:
            log.info("session %s: %s not delivered: %s", key, method, exc)
            return False
        return True

    def _retire(self, session: ChannelSession) -> None:
        """Leave the map; from here on, new messages start a new session."""
        session.closing = True
        if self.sessions.get(session.key) is session:
            del self.sessions[session.key]

    # ------------------------------------------------------------ one session

    async def _run_session(self, session: ChannelSession) -> None:
        try:
            while session.queue and not session.closing:
                try:
                    await self._box_lifetime(session)
                except Exception as exc:  # noqa: BLE001 - one session's failure never reaches the manager (issue 11 #1)
                    # The box could not start, or broke in a way nobody foresaw: fail what is waiting, visibly,
                    # and stop trying. Every other session goes on.
                    if isinstance(exc, BoxError):
                        log.error("session %s: %s", session.key, exc)
                    else:
                        log.error(
                            "session %s ended by an unexpected error: %s", session.key, describe_error(exc)
                        )
                        log.debug("session %s: the unexpected error", session.key, exc_info=exc)
                    self._retire(session)
                    batch = [*session.in_turn, *session.queue]  # a turn cut short is failed too, never lost
                    session.in_turn = []
                    session.queue.clear()
                    if batch:
                        await self._finish(
                            session, batch, DeliverResult(outcome="failed", error=describe_error(exc))
                        )
                        await self._notice(session.key, DIED_NOTICE)
                    return
            self._retire(session)
        finally:
            self._retire(session)
            self._live.discard(session)
            session.done.set()

    async def _box_lifetime(self, session: ChannelSession) -> None:
        key = session.key
        spec = BoxSpec(imp=key.imp, channel_id=key.channel_id, state_dir=self.plan.state_dir_for(key.imp))
        async with self.plan.backend_for(key.imp).open(spec, self.host) as box:
            session.box = box
            session.boxes_started += 1
            self.boxes_started += 1
            await box.init(await self.plan.init_for(key, self.now()), timeout=INIT_TIMEOUT_S)
            started = self.monotonic()
            try:
                await self._serve_turns(session, box, started)
            finally:
                session.box = None

    async def _serve_turns(self, session: ChannelSession, box: RunningBox, started: float) -> None:
        settings = session.settings
        while not session.closing:
            if not session.queue:
                await self._wait_for_work(session, settings.idle_s)
                if not session.queue:
                    self._retire(session)  # idle: the same step that decides it leaves the map
                    return
            batch = session.in_turn = session.take()
            healthy = await self._turn(session, box, batch)
            if not healthy or settings.mode == "cold":
                return  # a fresh box for whatever comes next
            if self.monotonic() - started >= settings.session_ceiling_s:
                log.info("session %s reached its ceiling; closing after this turn", session.key)
                return

    async def _wait_for_work(self, session: ChannelSession, idle_s: float) -> None:
        async with anyio.create_task_group() as tg:

            async def idle_timer() -> None:
                await self.sleep(idle_s)
                tg.cancel_scope.cancel()

            tg.start_soon(idle_timer)
            await session.has_work.wait()
            tg.cancel_scope.cancel()

    async def _turn(self, session: ChannelSession, box: RunningBox, batch: list[Delivery]) -> bool:
        """Run one turn; returns False when the box can no longer be trusted to serve the next."""
        key = session.key
        params = merge_batch(batch, self.now())
        healthy = True
        notice: str | None = None
        try:
            result = await box.deliver(params, timeout=session.settings.turn_ceiling_s)
        except BoxTimeout as exc:
            log.warning("session %s: turn ceiling: %s", key, exc)
            await box.kill()
            result, healthy, notice = DeliverResult(outcome="failed", error=str(exc)), False, CEILING_NOTICE
        except BoxDied as exc:
            log.error("session %s: box died mid-turn: %s", key, exc)
            result, healthy, notice = (
                DeliverResult(outcome="failed", error=str(exc)[:1000]),
                False,
                DIED_NOTICE,
            )
        except RpcError as exc:
            result = DeliverResult(outcome="failed", error=f"the box refused the turn: {exc.message}"[:1000])
        except Exception as exc:  # noqa: BLE001 - whatever the box caused, this turn fails and is recorded
            log.error("session %s: the turn failed unexpectedly: %s", key, describe_error(exc))
            log.debug("session %s: the unexpected error", key, exc_info=exc)
            await box.kill()
            result, healthy, notice = (
                DeliverResult(outcome="failed", error=describe_error(exc)),
                False,
                DIED_NOTICE,
            )
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await self.events.turn_ended(key)
                except Exception:  # noqa: BLE001 - the typing indicator is cosmetic; the outcome is not
                    log.exception("ending the turn's indicators in %s failed", key)
        if notice is None and result.outcome == "failed" and params.framing.mode == "respond":
            notice = session.settings.failure_notice
        session.in_turn = []
        await self._finish(session, batch, result)
        if notice:
            await self._notice(key, notice)
        return healthy

    async def _notice(self, key: SessionKey, text: str) -> None:
        try:
            await self.events.notice(key, text)
        except Exception:  # noqa: BLE001 - a notice that cannot be shown never ends the session's cleanup
            log.exception("posting a notice in %s failed", key)

    async def _finish(
        self, session: ChannelSession, batch: Sequence[Delivery], result: DeliverResult
    ) -> None:
        try:
            await self.events.turn_finished(session.key, batch, result)
        except Exception:
            log.exception("recording the outcome of a turn in %s failed", session.key)

    # ------------------------------------------------------------ shutdown

    async def shutdown(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Stop accepting; running turns get ``grace_s`` to finish; then every box is killed."""
        self._accepting = False
        for session in list(self._live):
            session.closing = True
            session.has_work.set()
        self.sessions.clear()
        with anyio.move_on_after(grace_s):
            for session in list(self._live):
                await session.done.wait()
        if self._tg is not None:
            self._tg.cancel_scope.cancel()  # what is left is killed by its backend's exit path
