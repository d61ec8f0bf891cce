"""Warm box sessions keyed by (imp, channel) (seed 004 §4, docs/conversation.md, docs/architecture.md).

A live box gets each message through its mailbox; no live box → one is
started. Turns are serialised per session; messages that arrive during a turn
are collected and delivered together as the next turn. The idle window counts
only *between* turns; a turn ceiling and a session ceiling bound the rest. A
message never falls between a closing session and the next one: a session
leaves the map in the same synchronous step that decides it is idle, so the
next ``deliver`` starts a fresh one.

The boundary (issue 12) is straight: the manager asks one plan object what an imp's sessions are made of
(``SessionPlan``), reports outcomes and notices to one ``SessionEvents``, and gives each session an observer
of its own (``TurnObserver``) that hears the session's box say ``turn.stage`` — the pipe is the identity, so
a stage reaches the session whose box sent it and nothing else. ``deliver`` answers with a ``TurnHandle``
that the caller may await for that message's outcome; nobody else keeps it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, Protocol

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from pydantic import BaseModel

from box.common.failures import tagged
from box.protocol import RpcError
from box.protocol.memory import PresenceEntry, SessionMemory
from box.protocol.models import (
    BoxInitParams,
    DeliverParams,
    DeliverResult,
    Framing,
    HistoryEntry,
    Message,
    TurnStageParams,
)
from impyard import metrics
from impyard.backends import BoxBackend, BoxDied, BoxError, BoxHost, BoxSpec, BoxTimeout, RunningBox
from impyard.conversation.spares import (
    Spare,
    SpareFailed,
    SparePool,
    SpareSettings,
    available_memory,
    serving,
)
from impyard.failure_words import FALLBACK_WORDS, words_for
from impyard.gateway.surfaces import surface_of

log = logging.getLogger("impyard.sessions")

INIT_TIMEOUT_S = 60.0
SHUTDOWN_GRACE_S = 10.0
DIED_NOTICE = "(I ran into a problem and had to restart. Please say that again.)"
BUSY_NOTICE = "(I'm too busy to keep up with this channel right now — some messages will go unanswered.)"
CEILING_NOTICE = "(That took too long, so I stopped. Please try again.)"


def ceiling_error(ceiling_s: float) -> str:
    """Issue 38: a turn stopped at its ceiling, said as the time that ran out and the setting that sets it."""
    return tagged(
        "timeout",
        f"the turn took longer than its ceiling of {ceiling_s:g} s and was stopped "
        "(a slow model server may need a longer one: [sessions] turn_ceiling_s in imp.toml)",
    )


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
    queue_limit: int = 50  # the mailbox's buffer: messages waiting behind the one being taken
    failure_notice: str | None = FALLBACK_WORDS  # for a failure of no known kind (issue 19 #5)
    spares: SpareSettings = SpareSettings()  # issue 37: none unless the plan says ([box] spares)


@dataclass(frozen=True)
class Delivery:
    """One woken message, framed, with the channel history it was woken with."""

    key: SessionKey
    message: Message
    framing: Framing
    recent: Sequence[HistoryEntry] = ()


DeliverOutcome = Literal["queued", "started", "busy", "refused"]


class TurnHandle:
    """What ``deliver`` answers for one message: whether its session took it, and the outcome of the turn
    that answers it, to await (the terminal waits on it before its next prompt).

    Only the caller and the message's place in its mailbox hold it, so a handle nobody awaits is gone with
    the turn (issue 12: under ``serve`` nothing is kept per message)."""

    def __init__(self, outcome: DeliverOutcome) -> None:
        self.outcome: DeliverOutcome = outcome
        self._done = anyio.Event()
        self._result: DeliverResult | None = None
        if not self.accepted:
            self._done.set()  # busy or refused: no turn will answer it

    @property
    def accepted(self) -> bool:
        return self.outcome in ("started", "queued")

    @property
    def done(self) -> bool:
        return self._done.is_set()

    async def finished(self) -> DeliverResult | None:
        """The outcome of the turn that answered this message once it is recorded; None when no turn will
        answer it (it was not taken, or the host stopped first: its wake is answered after a restart)."""
        await self._done.wait()
        return self._result

    def _resolve(self, result: DeliverResult | None) -> None:
        if not self._done.is_set():
            self._result = result
            self._done.set()


class TurnObserver(Protocol):
    """Hears one session's turns as they go: its box's ``turn.stage`` notifications, and every turn's end.

    The typing indicator is one. Cosmetic: what an observer raises is logged, never fails a turn."""

    async def stage(self, params: TurnStageParams) -> None: ...

    async def turn_ended(self) -> None:
        """Every exit path of a turn: the typing indicator stops here."""
        ...


class SessionEvents(Protocol):
    """What the session manager reports; the conversation host implements it."""

    async def turn_finished(
        self, key: SessionKey, batch: Sequence[Delivery], result: DeliverResult
    ) -> None: ...

    async def notice(self, key: SessionKey, text: str) -> None: ...

    def observer_for(self, key: SessionKey) -> TurnObserver:
        """A new session's own observer; it lives as long as the session."""
        ...


class SessionPlan(Protocol):
    """What the session manager needs to know of an imp's sessions: one object (the conversation host), not four
    callbacks. Everything here may be called at every box start; ``init_for`` does its reading off the loop."""

    def backend_for(self, imp: str) -> BoxBackend: ...

    async def init_for(self, key: SessionKey, now: datetime) -> BoxInitParams: ...

    def state_dir_for(self, key: SessionKey) -> Path:
        """The /state of this session's box: its own, per imp and channel (issue 22)."""
        ...

    def settings_for(self, imp: str) -> SessionSettings: ...

    async def presence_for(self, key: SessionKey, message: Message, now: datetime) -> list[PresenceEntry]:
        """Mechanism 10: the imp's other live conversations this session may know of (none when memory is off)."""
        ...

    def spare_dir_for(self, imp: str) -> Path:
        """Under which the imp's spare boxes each get a fresh /state of their own (issue 37); asked only of a plan
        whose ``settings_for`` keeps spares."""
        ...


class SessionBoxHost:
    """The host one session's box talks to: the gateway, which judges, executes and audits every request and
    logs the box's ``log`` lines, with the box's ``turn.stage`` shown to the session's own observer and then
    handed to the gateway (``Gateway.turn_stage``, the one place a stage is handled), told whether it names the
    message this session handed its box."""

    def __init__(
        self,
        gateway: BoxHost,
        observer: TurnObserver,
        key: SessionKey,
        delivered: Callable[[], str | None] = lambda: None,
        clock: TurnClock | None = None,
        staged: Callable[[str], None] = lambda stage: None,
    ) -> None:
        """``delivered``: the id of the message the session handed its box for the turn now running (the one its
        ``mailbox.deliver`` names; None between turns): the only message whose "context" starts a turn of the
        memory's per-turn bound (issue 32 #2). ``clock``: times the session's turns by stage (the metrics).
        ``staged``: hears each stage first, in memory (the Now page's, ``impyard.conversation.activity``)."""
        self.gateway = gateway
        self.staged = staged
        self.observer = observer
        self.key = key
        self.delivered = delivered
        self.clock = clock

    def given(self, spec: BoxSpec, memory: SessionMemory | None) -> None:
        """The box is about to be told its ``box.init``: the gateway serves its memory as that says, and refuses
        it all memory where it is None (issue 32 #1)."""
        self.gateway.given(spec, memory)

    async def turn_stage(self, spec: BoxSpec, params: TurnStageParams, *, woken: bool = False) -> None:
        self.staged(params.stage)
        if self.clock is not None:
            self.clock.enter(params.stage)
        try:
            await self.observer.stage(params)
        except Exception as exc:  # noqa: BLE001 - the indicator is cosmetic; the turn goes on
            log.debug("session %s: observing stage %s failed: %s", self.key, params.stage, exc)
        # Only the message this session handed this box starts a turn (issue 32 #2): an old id of the channel,
        # replayed by a new box, is just a stage.
        delivered = self.delivered()
        await self.gateway.turn_stage(
            spec, params, woken=delivered is not None and params.message_id == delivered
        )

    async def serve(self, spec: BoxSpec, method: str, params: BaseModel) -> BaseModel | None:
        return await self.gateway.serve(spec, method, params)

    async def refused(self, spec: BoxSpec, method: str, code: int, reason: str) -> None:
        """A request the protocol refused before any host saw it: the gateway audits it."""
        await self.gateway.refused(spec, method, code, reason)

    async def closed(self, spec: BoxSpec) -> None:
        """The box ended: the gateway forgets what it kept for it (memory scopes, the last turn's tallies)."""
        await self.gateway.closed(spec)


class TurnClock:
    """Where a session's turns spend their time (docs/metrics.md, ``impyard_turn_seconds``): each stage its box
    announces lasts until the next one or the turn's end; the whole turn from its delivery to its end."""

    def __init__(self, monotonic: Callable[[], float]) -> None:
        self.monotonic = monotonic
        self.started: float | None = None  # the turn under way, when one is
        self.stage: str | None = None
        self.since = 0.0

    def start(self) -> None:
        self.started, self.stage = self.monotonic(), None

    def enter(self, stage: str) -> None:
        """The box said ``turn.stage``: the stage before it ends here. Outside a turn, nothing is timed."""
        if self.started is None:
            return
        now = self.monotonic()
        if self.stage is not None:
            metrics.stage_seconds(self.stage, now - self.since)
        self.stage, self.since = stage, now

    def end(self) -> float | None:
        """The turn ended: its last stage ends; returns the whole turn's seconds (None: no turn was timed)."""
        if self.started is None:
            return None
        self.enter("")  # closes the last stage
        seconds, self.started, self.stage = self.monotonic() - self.started, None, None
        return seconds


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


@dataclass(frozen=True)
class SessionActivity:
    """What one live session is doing now, read from memory (``SessionManager.activity``): the console's Now page
    hears it through ``impyard.conversation.activity``. No message text: ids, counts, a stage and times."""

    imp: str
    channel_id: str
    warm: bool  # a box is open for it
    in_turn: int  # messages the turn running now answers (0: no turn runs)
    stage: str | None  # the last ``turn.stage`` its box announced in this turn (None: none yet, or no turn)
    turn_since: datetime | None  # when the turn running now was handed to the box
    stage_since: datetime | None  # when ``stage`` was announced
    waiting: int  # messages queued in its mailbox behind the turn


@dataclass(eq=False)
class Queued:
    """A delivery in a session's mailbox, with the handle that hears its outcome."""

    delivery: Delivery
    handle: TurnHandle


@dataclass(eq=False)
class ChannelSession:
    """One channel's session: its mailbox (an anyio memory object stream, ``queue_limit`` as its buffer), its
    observer, and the box that serves it now.

    The worker waits on the stream; the idle timer never cancels that wait (a cancelled receive can lose an
    item that was handed to it): it closes the sending side instead, which ends the wait cleanly."""

    key: SessionKey
    settings: SessionSettings
    observer: TurnObserver
    closing: bool = False
    box: RunningBox | None = None
    box_state: str | None = None  # the metrics' ``impyard_boxes`` state: starting, idle, busy (None: no box)
    boxes_started: int = 0
    busy_notified: bool = False
    accepted: int = 0  # messages the mailbox ever took: the idle timer's "did anything come?"
    idle: bool = False  # the worker waits for work between turns (no turn runs, none is being recorded)
    done: anyio.Event = field(default_factory=anyio.Event)
    in_turn: list[Queued] = field(default_factory=list)  # taken, outcome not yet recorded
    turn_since: datetime | None = None  # when the turn in ``in_turn`` began (what the Now page shows)
    stage: str | None = None  # its box's last ``turn.stage`` in that turn
    stage_since: datetime | None = None
    # Times its turns for the metrics, on the event loop's own clock (never the manager's: a test drives that one).
    clock: TurnClock = field(default_factory=lambda: TurnClock(anyio.current_time))
    _sending: MemoryObjectSendStream[Queued] = field(init=False, repr=False)
    _mailbox: MemoryObjectReceiveStream[Queued] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._sending, self._mailbox = anyio.create_memory_object_stream[Queued](
            max(1, self.settings.queue_limit)
        )

    def offer(self, item: Queued) -> bool:
        """Into the mailbox; False when its buffer is full (or it no longer takes messages)."""
        try:
            self._sending.send_nowait(item)
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False
        self.accepted += 1
        return True

    @property
    def waiting(self) -> int:
        """Messages in the mailbox, not yet taken."""
        return self._mailbox.statistics().current_buffer_used

    def begin_turn(self, batch: list[Queued], now: datetime) -> None:
        """``batch`` is the turn that runs now: no stage heard of it yet."""
        self.in_turn, self.turn_since, self.stage, self.stage_since = batch, now, None, None

    def staged(self, stage: str, now: datetime) -> None:
        """Its box announced ``stage``: kept while a turn runs (a stage between turns names no turn of ours)."""
        if self.in_turn:
            self.stage, self.stage_since = stage, now

    def activity(self) -> SessionActivity:
        turn = bool(self.in_turn)
        return SessionActivity(
            self.key.imp, self.key.channel_id, self.box is not None, len(self.in_turn),
            self.stage if turn else None, self.turn_since if turn else None,
            self.stage_since if turn else None, self.waiting,
        )  # fmt: skip

    def take(self, first: Queued | None = None) -> list[Queued]:
        """The next turn's batch (after ``first``, when the wait already took it): in cold mode one message,
        warm everything that waits."""
        batch = [] if first is None else [first]
        while not (batch and self.settings.mode == "cold"):
            try:
                batch.append(self._mailbox.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
        if not self.waiting:
            self.busy_notified = False
        return batch

    async def next_message(self) -> Queued | None:
        """Wait for a message; None once the mailbox stopped taking messages and holds none."""
        try:
            return await self._mailbox.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            return None

    def stop_taking(self) -> None:
        """Close the sending side: a wait for the next message ends once the buffer is empty."""
        self._sending.close()

    def close(self) -> list[Queued]:
        """Close the mailbox; returns what was still in it."""
        self._sending.close()
        left = []
        while True:
            try:
                left.append(self._mailbox.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
        self._mailbox.close()
        return left


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
        spares_max: int | None = None,
        free_memory: Callable[[], int | None] = available_memory,
    ) -> None:
        """``plan``: what each imp's sessions are made of; ``host``: serves the boxes' requests (the gateway);
        ``events``: hears the outcomes and gives each session its observer. ``spares_max``: spare boxes on this
        host at most (None: ``IMPYARD_SPARES_MAX``, else 8); ``free_memory``: the host's available bytes."""
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
        self._hurried = False  # ``hurry``: a shutdown gives running turns no grace
        self._grace: anyio.CancelScope | None = None  # the grace of a shutdown under way
        self._census = metrics.counting_boxes(self)
        self.spares = SparePool(
            settings_for=lambda imp: self.plan.settings_for(imp).spares, backend_for=lambda imp: self.plan.backend_for(imp),
            spare_dir_for=lambda imp: self.plan.spare_dir_for(imp), live_sessions=self._live_sessions_of,
            sleep=sleep, host_max=spares_max, free_memory=free_memory, monotonic=monotonic,
        )  # fmt: skip

    async def __aenter__(self) -> SessionManager:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self.spares.start(self._tg)
        self._census.__enter__()
        self._accepting = True
        return self

    async def __aexit__(self, *exc_info: object) -> bool | None:
        try:
            with anyio.CancelScope(shield=True):
                await self.shutdown()
            assert self._tg is not None
            return await self._tg.__aexit__(*exc_info)  # type: ignore[arg-type]
        finally:
            self._census.__exit__(None, None, None)

    def box_states(self) -> list[tuple[str, str]]:
        """``metrics.BoxCensus``: each live session's box, by imp and state (starting, idle, busy)."""
        sessions = [(s.key.imp, s.box_state) for s in list(self._live) if s.box_state is not None]
        return sessions + self.spares.states()

    def _live_sessions_of(self, imp: str) -> int:
        return sum(1 for session in self._live if session.key.imp == imp)

    # ------------------------------------------------------------ the mailbox

    def deliver(self, delivery: Delivery) -> TurnHandle:
        """Hand a woken message to its session. Synchronous on purpose: no await, no race.

        The handle says whether it was taken (``started``, ``queued``) or not (``busy``: the mailbox is full;
        ``refused``: the manager is shutting down), and can be awaited for the outcome of its turn."""
        if not self._accepting or self._tg is None:
            return TurnHandle("refused")
        session = self.sessions.get(delivery.key)
        if session is not None:
            # A warm box waiting for work with nothing in its mailbox takes this message now: its turn starts.
            handle = TurnHandle("started" if session.idle and not session.waiting else "queued")
            if session.offer(Queued(delivery, handle)):
                if handle.outcome == "started":
                    session.idle = False  # one message starts the turn; the next ones wait behind it
                return handle
            if not session.busy_notified:
                session.busy_notified = True
                self._tg.start_soon(self._notice, delivery.key, BUSY_NOTICE)
            return TurnHandle("busy")
        session = ChannelSession(
            delivery.key, self.plan.settings_for(delivery.key.imp), self.events.observer_for(delivery.key)
        )
        handle = TurnHandle("started")
        session.offer(Queued(delivery, handle))  # an empty mailbox always takes its first message
        self.sessions[delivery.key] = session
        self._live.add(session)
        self._tg.start_soon(self._run_session, session, name=f"session {delivery.key}")
        self.spares.wanted(delivery.key.imp)  # the imp is in a conversation: its spares are kept (issue 37)
        return handle

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
        """Leave the map and stop taking messages; from here on, new messages start a new session."""
        session.closing = True
        session.stop_taking()
        if self.sessions.get(session.key) is session:
            del self.sessions[session.key]

    # ------------------------------------------------------------ one session

    async def _run_session(self, session: ChannelSession) -> None:
        try:
            # The previous box of this channel, still closing, holds the same /state (issue 22): wait for it.
            for earlier in [
                other for other in self._live if other.key == session.key and other is not session
            ]:
                await earlier.done.wait()
            while session.waiting and not session.closing:
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
                    batch = [*session.in_turn, *session.close()]  # a turn cut short is failed too, never lost
                    session.in_turn = []
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
            for item in [*session.in_turn, *session.close()]:
                item.handle._resolve(
                    None
                )  # the host stopped first: recorded nowhere, answered after a restart
            session.done.set()
            self.spares.poke(session.key.imp)  # its spares' idle period may start now

    async def _box_lifetime(self, session: ChannelSession) -> None:
        key = session.key
        spec = BoxSpec(imp=key.imp, channel_id=key.channel_id, state_dir=self.plan.state_dir_for(key))
        # The turn's message is the newest of its batch: the one ``mailbox.deliver`` names (``merge_batch``).
        host = SessionBoxHost(
            self.host, session.observer, key,
            lambda: session.in_turn[-1].delivery.message.id if session.in_turn else None, session.clock,
            staged=lambda stage: session.staged(stage, self.now()),
        )  # fmt: skip
        backend = self.plan.backend_for(key.imp)
        spare = self.spares.claim(key.imp, backend)
        if spare is not None and await self._on_spare(session, spare, host, backend.name):
            return
        session.box_state = "starting"
        try:
            async with backend.open(spec, host) as box:
                session.box = box
                session.boxes_started += 1
                self.boxes_started += 1
                init = await self.plan.init_for(key, self.now())
                # before the box hears it: its memory is served as it is told (issue 32 #1)
                host.given(spec, init.memory)
                await box.init(init, timeout=INIT_TIMEOUT_S)
                started = self.monotonic()
                session.box_state = "idle"
                metrics.box_started(backend.name, "cold")  # its first turn is served by a box started for it
                try:
                    await self._serve_turns(session, box, started, backend.name)
                finally:
                    session.box = None
        finally:
            session.box_state = None

    async def _on_spare(
        self, session: ChannelSession, spare: Spare, host: SessionBoxHost, runtime: str
    ) -> bool:
        """Serve ``session`` on the spare it claimed (issue 37, ``spares.serving``): the channel's /state handed in,
        its channel and scopes given (``box.init``, once), then it serves the session as a box started for it
        would. False: the spare failed before its first turn (it died, or would not take its init) — the session
        starts a box as ever, and nothing was lost."""
        key = session.key

        async def init(spec: BoxSpec) -> BoxInitParams:
            params = await self.plan.init_for(key, self.now())
            host.given(spec, params.memory)  # before the box hears it (issue 32 #1)
            return params

        session.box_state = "starting"
        try:
            # The channel's previous box has closed (``_run_session`` waited): its files move, never shared.
            async with serving(
                spare, state_dir=self.plan.state_dir_for(key), channel_id=key.channel_id, host=host, init=init,
                init_timeout=INIT_TIMEOUT_S,
            ) as box:  # fmt: skip
                session.box = box
                session.boxes_started += 1
                self.boxes_started += 1  # the boxes its sessions got, started for them or ahead
                session.box_state = "idle"
                metrics.box_started(runtime, "spare")  # its first turn is served by a box started ahead
                try:
                    await self._serve_turns(session, box, self.monotonic(), runtime, after_first=spare.settle)
                finally:
                    session.box = None
            return True
        except SpareFailed as exc:
            log.warning("session %s: its spare box failed before its first turn (%s); starting one", key, exc)
            return False
        finally:
            session.box_state = None

    async def _serve_turns(
        self,
        session: ChannelSession,
        box: RunningBox,
        started: float,
        runtime: str = "",
        after_first: Callable[[], None] | None = None,
    ) -> None:
        """``after_first``: told once the first turn has ended (a claimed spare's replacement may start then)."""
        settings = session.settings
        turns = 0
        while not session.closing:
            batch = session.take()
            if not batch:
                first = await self._wait_for_work(session, settings.idle_s)
                if first is None or session.closing:
                    if first is not None:
                        first.handle._resolve(None)  # shutting down: answered after a restart
                    return  # idle: the timer retired the session in the same step that decided it
                batch = session.take(first)
            session.begin_turn(batch, self.now())
            if turns:
                metrics.box_started(runtime, "warm")  # a box already running serves this turn
            turns += 1
            healthy = await self._turn(session, box, batch)
            if after_first is not None:
                after_first()
                after_first = None
            if not healthy or settings.mode == "cold":
                return  # a fresh box for whatever comes next
            if self.monotonic() - started >= settings.session_ceiling_s:
                log.info("session %s reached its ceiling; closing after this turn", session.key)
                return

    async def _wait_for_work(self, session: ChannelSession, idle_s: float) -> Queued | None:
        """The next message, or None when the idle window passed without one (or the manager shuts down)."""
        before = session.accepted
        session.idle = True
        try:
            async with anyio.create_task_group() as tg:

                async def idle_timer() -> None:
                    await self.sleep(idle_s)
                    if session.accepted == before:  # nothing came, not even a message handed over just now
                        self._retire(session)  # leaves the map and ends the wait below, in this one step

                tg.start_soon(idle_timer)
                first = await session.next_message()
                tg.cancel_scope.cancel()
        finally:
            session.idle = False
        return first

    async def _turn(self, session: ChannelSession, box: RunningBox, batch: list[Queued]) -> bool:
        """Run one turn; returns False when the box can no longer be trusted to serve the next."""
        key = session.key
        params = merge_batch([item.delivery for item in batch], self.now())
        try:
            params.presence = (await self.plan.presence_for(key, params.message, params.now))[:50]
        except Exception as exc:  # noqa: BLE001 - who else is talking is a nicety; the turn goes on without it
            log.warning("session %s: presence not known this turn: %s", key, describe_error(exc))
        healthy = True
        notice: str | None = None
        session.box_state = "busy"
        session.clock.start()
        try:
            result = await box.deliver(params, timeout=session.settings.turn_ceiling_s)
        except BoxTimeout as exc:
            log.warning("session %s: turn ceiling: %s", key, exc)
            await box.kill()
            error = ceiling_error(session.settings.turn_ceiling_s)  # issue 38: what ran out, and the setting
            result, healthy, notice = DeliverResult(outcome="failed", error=error), False, CEILING_NOTICE
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
            session.box_state = "idle"
            seconds = session.clock.end()
            with anyio.CancelScope(shield=True):
                try:
                    await session.observer.turn_ended()
                except Exception:  # noqa: BLE001 - the typing indicator is cosmetic; the outcome is not
                    log.exception("ending the turn's indicators in %s failed", key)
        if notice is None and result.outcome == "failed" and params.framing.mode == "respond":
            fallback = session.settings.failure_notice
            # issue 19 #5: which failure, in one line; an empty failure_notice still posts nothing
            notice = words_for(result.error, fallback) if fallback else None
        session.in_turn = []
        await self._finish(session, batch, result, seconds)
        if notice:
            await self._notice(key, notice)
        return healthy

    async def _notice(self, key: SessionKey, text: str) -> None:
        try:
            await self.events.notice(key, text)
        except Exception:  # noqa: BLE001 - a notice that cannot be shown never ends the session's cleanup
            log.exception("posting a notice in %s failed", key)

    async def _finish(
        self,
        session: ChannelSession,
        batch: Sequence[Queued],
        result: DeliverResult,
        seconds: float | None = None,
    ) -> None:
        """Record the outcome, then tell whoever awaits the handles (so they find it recorded). ``seconds``: the
        whole turn, when a box ran it (the metrics)."""
        key = session.key
        metrics.turn_finished(key.imp, surface_of(key.channel_id), result.outcome, seconds)
        try:
            await self.events.turn_finished(session.key, [item.delivery for item in batch], result)
        except Exception:
            log.exception("recording the outcome of a turn in %s failed", session.key)
        finally:
            for item in batch:
                item.handle._resolve(result)

    # ------------------------------------------------------------ shutdown

    def activity(self) -> list[SessionActivity]:
        """What every live session is doing now (closing ones included, while their turns end), by key: read
        from memory, so the activity publisher may ask it every second at no cost to a turn."""
        return sorted((session.activity() for session in self._live), key=lambda a: (a.imp, a.channel_id))

    @property
    def turns_running(self) -> int:
        """Turns under way now, in every session (a box answering, or its outcome being recorded)."""
        return sum(1 for session in self._live if session.in_turn)

    def hurry(self) -> None:
        """Stop now (a second Ctrl-C): the grace of a shutdown, under way or to come, ends at once, so running
        turns are abandoned and their boxes killed by their backends' exit paths."""
        self._hurried = True
        if self._grace is not None:
            self._grace.cancel()

    async def shutdown(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Stop accepting; running turns get ``grace_s`` to finish; then every box is killed."""
        self._accepting = False
        self.spares.stop()  # the waiting spares close now; a claimed one with its session
        for session in list(self._live):
            session.closing = True
            session.stop_taking()  # a session waiting for work ends its wait
        self.sessions.clear()
        with anyio.move_on_after(0 if self._hurried else grace_s) as self._grace:
            for session in list(self._live):
                await session.done.wait()
        self._grace = None
        if self._tg is not None:
            self._tg.cancel_scope.cancel()  # what is left is killed by its backend's exit path
