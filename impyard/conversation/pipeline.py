"""The conversation pipeline every surface plugs into (docs/conversation.md, seed 004).

inbound message → drop bots → bound and clean it → persist to history (woken or not) → wake rule →
framing → the channel's session. This is the one place bots are filtered: every surface's messages come
through ``route``. The conversation host is also the session manager's plan (what an imp's boxes are made
of) and its events: outcomes go to the history, notices to the surface, and each session gets its own
typing indicator (``impyard.conversation.typing_indicator``) as its observer. Messages are content, never commands:
framing travels as structured fields.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal

import anyio
from sqlalchemy.engine import Connection

from box.common.history import lookback
from box.protocol.memory import PresenceEntry
from box.protocol.models import BoxInitParams, DeliverResult, HistoryEntry, ImpSpec, Message, SessionInfo
from impyard import __version__ as impyard_version
from impyard.backends import BoxBackend
from impyard.backends.handover import SPARE_DIRS
from impyard.channels.store import ChannelInfo, ChannelStore
from impyard.clock import Clock
from impyard.conversation.framing import RecentAuthor, decide_framing
from impyard.conversation.history import DEFAULT_RECENT, RECOVERY_FRESH, History, PendingWake

# What surfaces import from here (a message as it is handed in lives in ``impyard.conversation.inbound``).
from impyard.conversation.inbound import (
    MAX_ATTACHMENT_BYTES,
    MAX_ATTACHMENT_DATA_B64,
    MAX_ATTACHMENTS,
    MAX_INBOUND_CHARS,
    Inbound,
    bound_attachments,
    bounded,
    clean_content,
)
from impyard.conversation.sessions import Delivery, SessionKey, SessionManager, SessionSettings, TurnHandle
from impyard.conversation.spares import SpareSettings
from impyard.conversation.typing_indicator import TypingIndicator
from impyard.conversation.wake import WakeDecision, WakeFacts, decide_wake
from impyard.failure_words import missed_line
from impyard.gateway.policy import Policy
from impyard.gateway.reach import with_reach
from impyard.gateway.surfaces import Post, Surface, surface_of
from impyard.imps.store import ImpConfig, ImpStore
from impyard.memory.scopes import SessionScopes, presence, scopes_of
from impyard.storage import faults as storage_faults
from impyard.storage.db import STORAGE_ERRORS, Database
from impyard.threads import in_thread

__all__ = [
    "MAX_ATTACHMENTS",
    "MAX_ATTACHMENT_BYTES",
    "MAX_ATTACHMENT_DATA_B64",
    "MAX_INBOUND_CHARS",
    "RECENTLY_FINISHED",
    "ReplayOutcome",
    "Conversations",
    "Inbound",
    "RouteOutcome",
    "Routed",
    "bound_attachments",
    "clean_content",
]

log = logging.getLogger("impyard.conversation")
RECENTLY_FINISHED = 1_000  # finished message ids remembered for a ``wait_finished`` that asks after the fact

RouteOutcome = Literal["ignored", "ambient", "started", "queued", "busy", "refused", "unsaved", "duplicate"]
# Issue 36: what became of a message read back after no host served its channel: routed, or (stale) told missed.
ReplayOutcome = RouteOutcome | Literal["missed"]
# Seed 003: a side-effect consumer of finished turns (the Discord presence). Called once per turn after its
# outcome is recorded; it must return at once (hand work to its own task) and never raise.
TurnConsumer = Callable[[SessionKey, DeliverResult], Awaitable[None]]


@dataclass(frozen=True)
class _Kept:
    """What routing's storage did: ``failed`` set when keeping the message (no ``decision`` yet) or its
    wake failed; ``recent`` (the channel's window) only for a message that woke the imp and was kept so;
    ``duplicate`` when its wake was claimed before (by another host of the database, or an event delivered twice)."""

    decision: WakeDecision | None = None
    recent: list[HistoryEntry] | None = None
    failed: BaseException | None = None
    duplicate: bool = False


def _woken(decision: WakeDecision, recent: list[HistoryEntry] | None) -> _Kept:
    """A woken message's outcome: its window, or ``duplicate`` when its wake was claimed before (None)."""
    return _Kept(decision, duplicate=True) if recent is None else _Kept(decision, recent=recent)


def _kept_then_woken(
    db: Database,
    kept: Callable[[Connection], ChannelInfo],
    decide: Callable[[ChannelInfo], WakeDecision],
    woken: Callable[[Connection], list[HistoryEntry] | None],
) -> _Kept:
    """Blocking: ``Pipeline._keep``'s two transactions, one after the other, in one worker's trip (PostgreSQL,
    where each quick call is a trip of its own): the same outcomes as its two quick calls."""
    try:
        channel = db.write(kept)
    except STORAGE_ERRORS as exc:
        return _Kept(failed=exc)
    decision = decide(channel)
    if not decision.wake:
        return _Kept(decision)
    try:
        recent = db.write(woken)
    except STORAGE_ERRORS as exc:  # kept in the history, explicitly not answered
        return _Kept(decision, failed=exc)
    return _woken(decision, recent)


@dataclass(frozen=True)
class Routed:
    """What became of one inbound message; ``turn`` (when a session took it) awaits its turn's outcome."""

    outcome: RouteOutcome
    turn: TurnHandle | None = None

    async def finished(self) -> DeliverResult | None:
        """The outcome of the turn that answered it; None at once for a message no turn will answer."""
        return await self.turn.finished() if self.turn is not None else None


class Conversations:
    """Routes inbound messages of every imp; the session manager's plan and events."""

    def __init__(
        self,
        *,
        imps: ImpStore,
        configs: Mapping[str, ImpConfig],
        history: History,
        channels: ChannelStore,
        surface: Surface,
        clock: Clock,
        imp_user_ids: Mapping[str, str] | None = None,
        backends: Mapping[str, BoxBackend] | None = None,
        policy: Callable[[], Policy] | None = None,
    ) -> None:
        """``backends``: each imp's box backend (the session manager's plan, with init/state dir/settings);
        ``policy``: the gateway's current policy, read when a box opens (issue 38: what its envelope asks)."""
        self.backends = dict(backends or {})
        self.policy = policy
        self.imps = imps
        self.configs = dict(configs)
        self.history = history
        self.channels = channels
        self.surface = surface
        self.clock = clock
        self.imp_user_ids = dict(imp_user_ids or {})
        self.sessions: SessionManager | None = None
        # ``wait_finished`` only: a waiter's event while it waits, and a bounded memory of finished ids.
        self._waiters: dict[str, anyio.Event] = {}
        self._recently_finished: deque[str] = deque(maxlen=RECENTLY_FINISHED)
        self.after_turn: list[TurnConsumer] = []  # seed 003: post-turn side-effect consumers (presence)
        self.duplicates = 0  # issue 36: messages whose wake another host (or an earlier delivery) had claimed

    def imp_user_id(self, imp: str) -> str:
        return self.imp_user_ids.get(imp, f"imp:{imp}")

    # ------------------------------------------------------------ inbound

    async def route(self, imp: str, inbound: Inbound) -> Routed:
        """Take one inbound message: its outcome, and when a session took it, the handle of its turn."""
        routed, _ = await self._route(imp, inbound)
        return routed

    async def replay(self, imp: str, inbounds: Sequence[Inbound]) -> list[ReplayOutcome]:
        """Issue 36: messages a surface missed while no host served their channel (read back from the surface's
        own history, oldest first), taken as if they arrived now, exactly as ``recover`` treats a restart's
        wakes: one still fresh (``RECOVERY_FRESH``) is routed as any message; a stale one is kept, and if it
        wakes the imp its wake is claimed and marked ``missed``, and its person told once per channel. A message
        claimed before (another host, or a live delivery) is ``duplicate``, as in ``route``."""
        outcomes: list[ReplayOutcome] = []
        missed: list[PendingWake] = []
        for inbound in inbounds:
            stale = self.clock.now() - inbound.message.created_at > RECOVERY_FRESH
            routed, kept = await self._route(imp, inbound, stale=stale)
            if stale and routed.outcome == "ambient" and kept is not None:
                if (
                    kept.recent is not None
                ):  # its wake claimed just now, too late to answer: marked so, then told
                    message = inbound.message
                    await self.history.db.run(
                        self.history.finish, imp, inbound.channel_id, [message.id], "missed",
                        "sent while no host served its channel",
                    )  # fmt: skip
                    missed.append(PendingWake(imp, inbound.channel_id, message, self.clock.now()))
                    outcomes.append("missed")
                    continue
            outcomes.append(routed.outcome)
        await self._mention_missed(missed)
        return outcomes

    async def _route(self, imp: str, inbound: Inbound, *, stale: bool = False) -> tuple[Routed, _Kept | None]:
        """``route``; with ``stale`` a message that wakes the imp is kept and claimed, never handed to a session
        (``replay`` marks it missed): it comes back ``ambient`` with what was kept."""
        if inbound.from_a_bot:
            return Routed("ignored"), None  # bots (other imps included) and the imp itself never wake an imp
        message = inbound.message
        content = clean_content(message.content, inbound.max_chars)
        attachments = bound_attachments(message.attachments)
        if not content and not attachments:
            return Routed("ignored"), None
        message = message.model_copy(update={"content": content, "attachments": attachments})
        # Issue 18: routing's storage is two short transactions, each quick (on the event loop on SQLite).
        kept = await self._keep(imp, inbound, message)
        if kept.failed is not None:
            # Issue 19 #1: persisted before routing, or refused in so many words — never half-kept, never a crash.
            what = "keep message" if kept.decision is None else f"wake {imp} for"
            log.warning(
                "could not %s %s in %s: %s (%s)", what, message.id, inbound.channel_id,
                storage_faults.describe(kept.failed, self.history.db.url.where()), type(kept.failed).__name__,
            )  # fmt: skip
            return Routed("unsaved"), kept
        if (
            kept.duplicate
        ):  # issue 36: claimed already: another host (or an earlier delivery) queues and answers it
            self.duplicates += 1  # counted here; the surface logs the outcome once (no text)
            return Routed("duplicate"), kept
        if kept.recent is None or stale:
            return Routed("ambient"), kept
        assert kept.decision is not None
        routed = await self._to_session(
            imp, inbound.channel_id, inbound.channel_kind, message, addressed=kept.decision.addressed,
            recent=kept.recent,
        )  # fmt: skip
        return routed, kept

    def _recent_rows(self, imp: str) -> int:
        """How many of the channel's messages a wake reads: the framing's window, or the box's (issue 33) if larger."""
        if imp not in self.configs:
            return DEFAULT_RECENT
        limit = self.configs[imp].model.history_limit
        return max(DEFAULT_RECENT, limit + lookback(limit))

    async def _keep(self, imp: str, inbound: Inbound, message: Message) -> _Kept:
        """The channel seen, the message kept (woken or not), the wake rule, and for a wake its row and the
        channel's recent history. Two transactions, each one quick call (issue 18: each store joins the
        transaction instead of opening its own): a wake that cannot be written leaves the message kept,
        explicitly not answered."""
        db = self.history.db

        def kept(conn: Connection) -> ChannelInfo:
            channel = self.channels.seen(
                inbound.channel_id,
                surface=inbound.surface,
                kind=inbound.channel_kind,
                name=inbound.channel_name,
                guild_id=inbound.guild_id,
                audience=inbound.audience,  # issue 32 #4: memory scopes follow who can read the channel
                conn=conn,
            )
            self.history.record(inbound.channel_id, message, conn=conn)  # before routing, woken or not
            return channel

        def woken(conn: Connection) -> list[HistoryEntry] | None:
            """The channel's window, or None when the wake (the message's claim, issue 36) was taken before."""
            if not self.history.record_wake(imp, inbound.channel_id, message.id, conn=conn):
                return None
            return self.history.recent(inbound.channel_id, self._recent_rows(imp), imp=imp, conn=conn)

        def decide(channel: ChannelInfo) -> WakeDecision:
            return decide_wake(
                WakeFacts(
                    is_dm=inbound.channel_kind in ("dm", "terminal"),
                    mode=channel.mode,  # type: ignore[arg-type]  # a ChannelMode, as the store keeps it
                    mentions_imp=inbound.mentions_imp,
                    mentions_imp_role=inbound.mentions_imp_role,
                    replies_to_imp=inbound.replies_to_imp,
                    mentions_everyone=inbound.mentions_everyone,
                )
            )

        if db.dialect != "sqlite":  # issue 36: every quick call is a worker's trip there; both in one trip
            return await db.run(_kept_then_woken, db, kept, decide, woken)
        try:
            channel = await db.quick(db.write, kept)
        except STORAGE_ERRORS as exc:
            return _Kept(failed=exc)
        decision = decide(channel)
        if not decision.wake:
            return _Kept(decision)
        try:
            recent = await db.quick(db.write, woken)
        except STORAGE_ERRORS as exc:  # kept in the history, explicitly not answered
            return _Kept(decision, failed=exc)
        return _woken(decision, recent)

    async def receive(self, imp: str, inbound: Inbound) -> RouteOutcome:
        """``route`` for a surface that does not wait for the turn (Discord): only the outcome."""
        return (await self.route(imp, inbound)).outcome

    async def _to_session(
        self,
        imp: str,
        channel_id: str,
        kind: str,
        message: Message,
        *,
        addressed: bool,
        recent: list[HistoryEntry] | None = None,
    ) -> Routed:
        """``recent``: the channel's window as routing read it (None: read it here, after a restart)."""
        assert self.sessions is not None, "attach a SessionManager first"
        if recent is None:
            recent = await self.history.db.run(
                self.history.recent, channel_id, self._recent_rows(imp), imp=imp
            )
        framing = decide_framing(
            channel_kind=kind,
            addressed=addressed,
            recent=[
                RecentAuthor(e.author.id, e.author.name, e.author.bot or e.from_imp, e.created_at)
                for e in recent
            ],
            imp_id=self.imp_user_id(imp),
            now=self.clock.now(),
        )
        key = SessionKey(imp, channel_id)
        # Framing looks at the whole window; the box gets only what its prompt can use (ENV-07), and before that up to
        # lookback(limit) older messages with their ids and times only: the box places its window's start by them, so
        # the window moves in steps and the prompt cache hits (issue 33, box.common.history.window_start).
        limit = self.configs[imp].model.history_limit if imp in self.configs else len(recent)
        recent = box_window(recent, limit)
        # Earlier messages are context: a long terminal paste is whole once, then bounded like any other.
        recent = [
            entry.model_copy(update={"content": bounded(entry.content, MAX_INBOUND_CHARS)})
            if len(entry.content) > MAX_INBOUND_CHARS
            else entry
            for entry in recent
        ]
        handle = self.sessions.deliver(Delivery(key, message, framing, recent))
        if handle.outcome == "busy":
            await self.history.db.run(
                self.history.finish, imp, channel_id, [message.id], "busy", "the channel's queue was full"
            )
        return Routed(handle.outcome, handle if handle.accepted else None)

    async def keep_recent_spares(self, now: datetime) -> list[str]:
        """Issue 37: at a host's start, the imps whose last conversation (on this host before a restart, or on
        another host of the database) ended within their ``[box] spares_idle_s`` keep their spares for the rest of
        that period, so the first message after a restart or a takeover finds one. The imps that do."""
        idle_s = {
            imp: kept.idle_s for imp in self.configs if (kept := self.settings_for(imp).spares).count > 0
        }
        if not idle_s or self.sessions is None:
            return []
        since = now - timedelta(seconds=max(idle_s.values()))
        ended = await self.history.db.run(self.history.conversed_since, since)
        pool = self.sessions.spares
        return [
            imp
            for imp in sorted(idle_s)
            if imp in ended and pool.resume(imp, max(0.0, (now - ended[imp]).total_seconds()))
        ]

    async def recover(
        self, reaches: Collection[str] | None = None, owns: Callable[[ChannelInfo | None], bool] | None = None
    ) -> int:
        """After a restart: answer woken messages that are still fresh; the stale ones are marked missed and
        mentioned to their person once (issue 19 #5), where this host's surface ``reaches`` (None: any) and, for a
        host serving one Discord shard, in the channels ``owns`` says are its shard's (issue 21)."""
        before = await self.history.db.run(self.history.unfinished)
        # Issue 19 #5: a channel this host cannot post to is left to the host that can (`serve` for Discord, a
        # terminal chat for its own): it answers or mentions them when it starts, instead of them being marked
        # missed here and never told. Issue 21: so is another shard's channel, to the host serving that shard.
        elsewhere = {w.channel_id for w in before if not await self._reaches(w.channel_id, reaches, owns)}
        fresh = await self.history.db.run(
            self.history.triage, skip_channels=elsewhere
        )  # the stale ones marked missed
        answered = {(wake.imp, wake.channel_id, wake.message.id) for wake in fresh}
        missed = [
            w
            for w in before
            if w.channel_id not in elsewhere
            and (w.imp, w.channel_id, w.message.id) not in answered
            and await self.history.db.run(self.history.outcome, w.imp, w.channel_id, w.message.id) == "missed"
        ]  # not those answered before the restart whose outcome was lost (issue 19 #2): triage marked them sent
        await self._mention_missed(missed)
        resumed = 0
        for wake in fresh:
            if wake.imp not in self.configs:
                continue
            info = await self.channels.db.run(self.channels.info, wake.channel_id)
            kind = info.kind if info else "guild"
            log.info("answering %s in %s after a restart", wake.message.id, wake.channel_id)
            await self._to_session(
                wake.imp, wake.channel_id, kind, wake.message, addressed=kind in ("dm", "terminal")
            )
            resumed += 1
        return resumed

    async def _reaches(
        self,
        channel_id: str,
        reaches: Collection[str] | None,
        owns: Callable[[ChannelInfo | None], bool] | None = None,
    ) -> bool:
        if reaches is None and owns is None:
            return True
        info = await self.channels.db.run(self.channels.info, channel_id)
        if reaches is not None and surface_of(channel_id, info.surface if info else None) not in reaches:
            return False
        return owns is None or owns(info)

    async def _mention_missed(self, missed: Sequence[PendingWake]) -> None:
        """One notice per person and channel for messages marked missed just now (they were marked before
        this, so a crash here mentions them at most once, never twice)."""
        grouped: dict[tuple[str, str, str], list[PendingWake]] = {}
        for wake in missed:
            if wake.imp in self.configs:
                grouped.setdefault((wake.imp, wake.channel_id, wake.message.author.id), []).append(wake)
        for (imp, channel_id, _), wakes in grouped.items():
            info = await self.channels.db.run(self.channels.info, channel_id)
            shared = info is not None and info.kind not in ("dm", "terminal")
            name = wakes[0].message.author.name if shared else None
            await self.notice(
                SessionKey(imp, channel_id), missed_line([w.message.created_at for w in wakes], name)
            )

    # ------------------------------------------------------------ the box's world

    def backend_for(self, imp: str) -> BoxBackend:
        return self.backends[imp]

    async def init_for(self, key: SessionKey, now: datetime) -> BoxInitParams:
        """What a new box of this session is told; the channel and the persona are read off the event loop, side
        by side: the channel and its scopes in one quick database call, the persona's files in a thread (issue 37:
        this is on the path of a claimed spare's first reply, and of a cold box's)."""
        config = self.configs[key.imp]
        db = self.channels.db
        with_memory = config.memory.enabled  # what the imp's spec says (``ImpConfig.imp_spec``)

        def channel_reads() -> tuple[ChannelInfo | None, SessionScopes | None]:
            scopes = scopes_of(db, key.imp, key.channel_id) if with_memory else None
            return self.channels.info(key.channel_id), scopes

        specs: list[ImpSpec] = []
        async with anyio.create_task_group() as tg:

            async def read_spec() -> None:
                specs.append(await in_thread(self.imps.imp_spec, config))

            tg.start_soon(read_spec)
            info, scopes = await db.quick(channel_reads)  # two indexed reads: on the loop where SQLite allows
        imp = with_reach(specs[0], self.policy() if self.policy else None, key.channel_id)  # issue 38
        kind = info.kind if info and info.kind in ("dm", "guild", "terminal", "task") else "guild"
        return BoxInitParams(
            protocol=1,
            imp=imp,
            session=SessionInfo(
                id=f"{key.imp}:{key.channel_id}", channel_id=key.channel_id, channel_kind=kind,  # type: ignore[arg-type]
                channel_name=info.name if info else "", turn_ceiling_s=config.turn_ceiling_s,  # issue 38
            ),
            now=now,
            memory=scopes.session_memory() if scopes is not None else None,  # the gateway applies the same
            impyard_version=impyard_version,  # seed 003: version metadata in the prompt package
        )  # fmt: skip

    async def presence_for(self, key: SessionKey, message: Message, now: datetime) -> list[PresenceEntry]:
        """Mechanism 10, for a memory imp: other live conversations in scopes this session reads (docs/memory.md)."""
        config = self.configs.get(key.imp)
        if config is None or not config.memory.enabled:
            return []
        db = self.channels.db

        def present() -> list[PresenceEntry]:
            """One trip a turn (issue 18): the session's scopes, then who else is talking in them."""
            scopes = scopes_of(db, key.imp, key.channel_id)
            if scopes is None:
                return []
            return presence(
                db, key.imp, channel_id=key.channel_id, person_id=message.author.id, scopes=scopes, now=now
            )

        return await db.run(present)

    def state_dir_for(self, key: SessionKey) -> Path:
        return self.imps.session_state_dir(key.imp, key.channel_id)

    def spare_dir_for(self, imp: str) -> Path:
        return self.imps.box_state_dir(imp) / SPARE_DIRS  # issue 37: each spare's /state its own, under it

    def settings_for(self, imp: str) -> SessionSettings:
        config = self.configs[imp]
        sessions = config.sessions
        return SessionSettings(
            mode=sessions.mode,
            idle_s=sessions.idle_s,
            turn_ceiling_s=config.turn_ceiling_s,  # issue 38: the server's own, unless written
            session_ceiling_s=sessions.session_ceiling_s,
            queue_limit=sessions.queue_limit,
            failure_notice=sessions.failure_notice or None,
            spares=SpareSettings(count=config.box.spares, idle_s=config.box.spares_idle_s),
        )

    # ------------------------------------------------------------ SessionEvents

    async def turn_finished(self, key: SessionKey, batch: Sequence[Delivery], result: DeliverResult) -> None:
        """Record the outcome, then wake whoever waits for these messages' turn — on every path (issue 19 #2):
        an outcome that cannot be written (a full disk) is raised for the session to log, but a waiter (the
        terminal, the Discord yard) is never left waiting out its timeout for a turn that has ended."""
        ids = [delivery.message.id for delivery in batch]
        try:
            await self.history.db.quick(
                self.history.finish, key.imp, key.channel_id, ids, result.outcome, result.error
            )
        finally:
            for message_id in ids:
                self._recently_finished.append(
                    message_id
                )  # bounded: a host nobody waits on keeps the last few
                waiter = self._waiters.pop(message_id, None)
                if waiter is not None:
                    waiter.set()
        for consumer in self.after_turn:  # seed 003: side effects after the outcome is committed
            try:
                await consumer(key, result)
            except Exception:  # noqa: BLE001 - a side effect never fails a turn that has ended
                log.exception("a post-turn consumer failed for %s in %s", key.imp, key.channel_id)

    async def wait_finished(self, message_id: str) -> None:
        """Until the turn that answers this message has ended, for a caller that knows only its id (the Discord
        test yard, the benchmark) and may ask before the message arrived or after its turn ended. A caller that
        routed the message itself awaits ``Routed.finished`` instead (the terminal)."""
        if message_id in self._recently_finished:
            return
        waiter = self._waiters.setdefault(message_id, anyio.Event())
        try:
            await waiter.wait()
        finally:
            self._waiters.pop(message_id, None)

    async def notice(self, key: SessionKey, text: str) -> None:
        """A host-authored notice (a box died, too busy): posted directly, never a box act."""
        try:
            await self.surface.send(Post(key.channel_id, text, kind="notice", imp=key.imp))
        except Exception as exc:  # noqa: BLE001 - a notice that cannot be posted is logged, not fatal
            log.warning("could not post a notice to %s: %s", key.channel_id, exc)

    def observer_for(self, key: SessionKey) -> TypingIndicator:
        """Each session's own typing indicator, driven by its box's ``turn.stage`` (typing shows from ``render``)."""
        return TypingIndicator(self.surface, key.channel_id, key.imp)


def box_window(recent: Sequence[HistoryEntry], limit: int) -> list[HistoryEntry]:
    """What of the channel's ``recent`` a delivery carries: the last ``limit`` messages (ENV-07), and before them up to
    ``lookback(limit)`` older ones with their text left out (issue 33: the box only counts them, to place its history
    window's start; they are never shown to the model)."""
    if limit <= 0:
        return []
    shown = list(recent[-limit:])
    before = list(recent[-(limit + lookback(limit)) : -limit]) if len(recent) > limit else []
    return [entry.model_copy(update={"content": ""}) for entry in before] + shown
