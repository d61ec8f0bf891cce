"""The per-message turn machine (seed 003), run inside the box for one delivered message.

    ContextBuilding → ToolExecution → DecisionMaking (turns that are not direct) → ResponseRendering
    → ResponseSending → PostSend                                   any error → Failed (terminal)

One ``TurnContext`` per message carries the runtime facts, the prompt package (with the version
metadata: the imp's model and impyard's release), the envelope, the rendered payloads, the
delivery and the failure. Each stage is a method taking that context and returning the next
stage, so a stage can be driven on its own in a test. Every transition is announced to the host
as ``turn.stage`` (the host drives the typing indicator from it). Stages that have nothing to do
are skipped: a silent turn goes from its decision straight to PostSend.

A direct turn (ENV-04: a DM, or a message that addresses the imp) is a forced response and skips
DecisionMaking; every other turn — judge framing, and a one-to-one server channel's message that
addresses nobody — is decided there on the envelope (ENV-02: ``answer_needed = false`` stays
silent). Pictures are made through the turn's image-generation scope (``ctx.images``), which the
responder opens around the machine (seed 003: a runtime wrapper, not a stage).

PostSend commits history (to the host, issue 22), counters and memory only after delivery is confirmed; the imp's side
of the talk is stored with the image markers of the pictures it sent (so a picture-only reply is
never an empty message). A ``pending`` delivery (waiting for approval) commits what the person
said, never a claim that the reply was seen. A turn that fails commits nothing.

Memory (issue 23) joins at three points: ContextBuilding asks it for the turn (its rules go
into the system text, its block into the turn's ``## Context``, which opens the current message
after the history: issue 33, ``box.context``); ToolExecution hands it every draft and calls again
while it asks for another hop, the block recomposed each time (mechanisms 36, 46-53) — only the
current message's context changes, so the hops share the system text and the history; PostSend
hands it the delivered turn. With ``NoMemory`` the turn is the same as
without an engine.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any

import box
from box import decision
from box.common.envelope import Envelope, EnvelopeAsks
from box.common.history import Record
from box.context import PromptPackage, VersionInfo, build_package, context_suffix, message_body
from box.history import HostHistory, combine
from box.images import ImageFailed, NoPictures, PictureMaker, history_markers, image_request, wants_picture
from box.memory import NO_TURN, CommittedTurn, MemoryEngine, MemoryTurn, TurnFacts
from box.protocol import Peer, PeerClosed, RpcError
from box.protocol.memory import PresenceEntry
from box.protocol.models import (
    BoxInitParams,
    DiscordSendResult,
    Framing,
    HistoryEntry,
    LogParams,
    Message,
    Outcome,
    ReportValue,
    TurnStageParams,
)
from box.render import Payload, fit_files, hack_alert, reply_target, staff_note, unwrap_links
from box.tool_loop import ReplyCaller

log = logging.getLogger("box.machine")

PICTURE_FAILED_NOTE = "(I couldn't make the picture this time.)"


class Stage(Enum):
    CONTEXT = "context"  # ContextBuilding
    TOOLS = "tools"  # ToolExecution
    DECISION = "decision"  # DecisionMaking, judge framing only
    RENDER = "render"  # ResponseRendering
    SEND = "send"  # ResponseSending
    POST = "post"  # PostSend
    FAILED = "failed"  # terminal: ctx.error holds the exception
    DONE = "done"  # terminal after PostSend; not announced


class SendFailed(Exception):
    """The host did not deliver the reply (refused, or the surface failed)."""


@dataclass(frozen=True)
class TurnInput:
    """What the machine starts from: routing, framing and session were decided before (seed 003)."""

    message: Message
    framing: Framing
    recent: list[HistoryEntry]
    now: datetime
    task: bool = False  # a prompt task posts as an act of its own (kind "other"), not as a reply
    presence: list[PresenceEntry] = field(
        default_factory=list
    )  # the imp's other conversations (mechanism 10)


@dataclass
class TurnContext:
    """Mutable and message-scoped: everything one turn learns, in the order it learns it."""

    turn: TurnInput
    images: PictureMaker = field(default_factory=NoPictures)  # the image-generation scope, opened outside
    package: PromptPackage | None = None
    memory: MemoryTurn = NO_TURN  # this turn's memory (issue 23)
    envelope: Envelope | None = None
    answers: bool = False  # the reply goes out (decided in ToolExecution or DecisionMaking)
    reply: Payload | None = None
    acts: list[Payload] = field(default_factory=list)  # staff notes and hack alerts, each its own post
    delivery: DiscordSendResult | None = None
    outcome: Outcome | None = None
    error: BaseException | None = None
    stages: list[Stage] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what went missing on the way (for the log)

    @property
    def message(self) -> Message:
        return self.turn.message


@dataclass
class TurnDeps:
    peer: Peer
    init: BoxInitParams
    history: HostHistory  # the channel's own lines, kept by the host (issue 22)
    memory: MemoryEngine
    caller: ReplyCaller


class TurnMachine:
    def __init__(self, deps: TurnDeps) -> None:
        self.deps = deps
        self.settings = deps.init.imp.responder
        self.session = deps.init.session
        self.asks = EnvelopeAsks.of(self.settings)  # issue 38: the fields this imp's envelope carries
        self._handlers = {
            Stage.CONTEXT: self.context_building,
            Stage.TOOLS: self.tool_execution,
            Stage.DECISION: self.decision_making,
            Stage.RENDER: self.response_rendering,
            Stage.SEND: self.response_sending,
            Stage.POST: self.post_send,
        }

    async def run(self, ctx: TurnContext) -> TurnContext:
        stage = Stage.CONTEXT
        while stage is not Stage.DONE:
            await self._enter(ctx, stage)
            try:
                stage = await self._handlers[stage](ctx)
            except Exception as exc:  # cancellation is not an Exception: it passes through
                ctx.error, ctx.outcome = exc, "failed"
                log.warning("turn for %s failed in %s: %r", ctx.message.id, stage.value, exc)
                await self._enter(ctx, Stage.FAILED)
                await self.host_log(
                    "warning", f"turn failed in {stage.value}: {exc}"[:1000], message_id=ctx.message.id
                )
                break
        return ctx

    # ------------------------------------------------------------ the stages

    async def context_building(self, ctx: TurnContext) -> Stage:
        turn = ctx.turn
        own = await self.deps.history.load()  # one request a turn; ENV-07: the host trims before the call
        entries = combine(
            turn.recent, own, self.session.channel_id, turn.message.id, self.settings.history_limit
        )
        facts = TurnFacts(
            turn.message, turn.framing, turn.now, list(turn.presence), turn.task,
            history_ids=frozenset(entry.id for entry in entries),  # issue 33: the block does not repeat them
        )  # fmt: skip
        ctx.memory = await self.deps.memory.begin(facts)
        ctx.package = build_package(
            self.deps.init.imp, self.session, turn.message, turn.framing, turn.now, entries,
            news=self.settings.news, memory=ctx.memory.block(), rules=ctx.memory.rules, version=self.version,
        )  # fmt: skip
        return Stage.TOOLS

    @property
    def version(self) -> VersionInfo:
        """Seed 003 version metadata: the imp's model, and the host's impyard release (else this box's)."""
        return VersionInfo(self.settings.model, self.deps.init.impyard_version or box.__version__)

    async def tool_execution(self, ctx: TurnContext) -> Stage:
        assert ctx.package is not None
        ctx.envelope = await self._answer(ctx)  # mechanism 53: a first failure fails the turn
        while await ctx.memory.next_hop(ctx.envelope):  # mechanisms 25-27, 49: search, probe, call again
            ctx.package.suffix = context_suffix(
                ctx.turn.now, self.session, ctx.turn.framing, news=self.settings.news, memory=ctx.memory.block(),
                addressed=ctx.message.mentions_imp, version=ctx.package.version,
            )  # fmt: skip  # mechanism 36: recomposed before every reply call
            try:
                ctx.envelope = await self._answer(ctx)
            except Exception as exc:  # mechanism 53: a later hop that fails leaves the last good reply
                ctx.notes.append(f"a later reply call failed; the previous draft stands: {exc}")
                await self.host_log(
                    "warning", f"a later reply call failed; the previous draft stands: {exc}"[:1000]
                )
                break
        if ctx.turn.framing.mode == "judge" or not decision.is_direct(ctx.turn.framing, ctx.message):
            return Stage.DECISION  # decided only after the tools have settled (ENV-02)
        ctx.answers = decision.has_answer(ctx.envelope)  # ENV-04: a direct turn is a forced response
        return self._after_decision(ctx)

    async def _answer(self, ctx: TurnContext) -> Envelope:
        """One reply call; a field this imp is not asked reads as null / false (issue 38), whatever came."""
        assert ctx.package is not None
        envelope, ignored = self.asks.settle(await self.deps.caller.answer(ctx.package))
        if ignored:
            said = ", ".join(f"{name}={value!r}"[:200] for name, value in ignored.items())
            ctx.notes.append(f"envelope fields not asked, ignored: {said}")
            # ENV-03: a staff note is never dropped silently, even one this imp has nowhere to post
            level = "warning" if "staff" in ignored else "info"
            await self.host_log(level, f"envelope fields not asked, ignored: {said}"[:1000])
        return envelope

    async def decision_making(self, ctx: TurnContext) -> Stage:
        assert ctx.envelope is not None
        ctx.answers = decision.answers(ctx.envelope, ctx.turn.framing, ctx.message)
        return self._after_decision(ctx)

    def _after_decision(self, ctx: TurnContext) -> Stage:
        assert ctx.envelope is not None
        return Stage.RENDER if ctx.answers or ctx.envelope.staff or ctx.envelope.hack else Stage.POST

    async def response_rendering(self, ctx: TurnContext) -> Stage:
        envelope = ctx.envelope
        assert envelope is not None and ctx.package is not None
        if ctx.answers:
            ctx.reply = await self._render_reply(ctx, envelope, ctx.package)
        await self._render_acts(ctx, envelope)
        return Stage.SEND if ctx.reply is not None or ctx.acts else Stage.POST

    async def response_sending(self, ctx: TurnContext) -> Stage:
        if ctx.reply is not None:
            try:
                result = await self.deps.peer.request("discord.send", ctx.reply.params())
            except RpcError as exc:
                raise SendFailed(f"the reply was not delivered: {exc.message}") from exc
            assert isinstance(result, DiscordSendResult)
            ctx.delivery = result
        for act in ctx.acts:  # acts of their own: one that fails is reported, the reply stands
            try:
                await self.deps.peer.request("discord.send", act.params())
            except RpcError as exc:
                ctx.notes.append(f"a {act.kind} post to {act.channel_id} was refused: {exc.message}")
                await self.host_log(
                    "error", f"staff post not delivered: {exc.message}; it said: {act.content}"[:1000]
                )
        return Stage.POST

    async def post_send(self, ctx: TurnContext) -> Stage:
        delivered = ctx.delivery is not None and ctx.delivery.status == "delivered"
        if ctx.delivery is None:
            ctx.outcome = "silent"
        else:
            ctx.outcome = "sent" if delivered else "pending"
        message = ctx.message
        if ctx.turn.task:  # a scheduled prompt is context for what was posted, not something a person said
            said = Record(
                self.session.channel_id,
                message.id,
                "event",
                "",
                f"scheduled task: {message.content}",
                message.created_at,
            )
        else:
            said = Record(
                self.session.channel_id,
                message.id,
                "user",
                message.author.name,
                message_body(message),
                message.created_at,
            )
        records = [said]
        spoken: str | None = None  # the imp's side of the talk: the reply's text and its image markers
        if delivered:  # only a confirmed delivery becomes the imp's side of the talk
            assert ctx.reply is not None and ctx.delivery is not None
            reply_id = ctx.delivery.message_ids[0] if ctx.delivery.message_ids else f"{message.id}:reply"
            # seed 003: image history markers, so a picture-only reply is never an empty message
            spoken = "\n".join(part for part in (ctx.reply.content, history_markers(ctx.images.made)) if part)
            records.append(
                Record(
                    ctx.reply.channel_id, reply_id, "assistant", self.deps.init.imp.name, spoken, ctx.turn.now
                )
            )
        assert ctx.envelope is not None
        committed = CommittedTurn(
            channel_id=self.session.channel_id,
            message_id=message.id,
            author=message.author.name,
            said=message.content,
            outcome=ctx.outcome,
            delivered=spoken,
            envelope=ctx.envelope,
            author_id=message.author.id,
            now=ctx.turn.now,
        )
        try:
            # ENV-07: the host trims again after appending
            await self.deps.history.commit(records, count=ctx.outcome)
            await ctx.memory.commit(committed)  # mechanisms 57-66, after delivery is confirmed
        except Exception as exc:  # the reply is out: a bookkeeping failure must not turn it into "failed"
            ctx.notes.append(f"post-send bookkeeping failed: {exc}")
            log.exception("post-send bookkeeping for %s failed", message.id)
            await self.host_log("error", f"post-send bookkeeping failed: {exc}"[:1000], message_id=message.id)
        return Stage.DONE

    # ------------------------------------------------------------ rendering helpers

    async def _render_reply(
        self, ctx: TurnContext, envelope: Envelope, package: PromptPackage
    ) -> Payload | None:
        target = reply_target(
            envelope.channel, self.session.channel_id, self.session.channel_name, self.settings.post_channels
        )  # ENV-09, widened (issue 38): a channel the imp cannot address is the conversation's own
        if target.unknown is not None:
            ctx.notes.append(f"channel {target.unknown!r} is not one this imp can post to: replied here")
            await self.host_log(
                "info",
                f"the envelope named channel {target.unknown!r}, which this imp cannot post to; "
                "the reply went to the conversation's own channel",
                message_id=ctx.message.id,
            )
        as_reply = target.own and not ctx.turn.task
        text = unwrap_links((envelope.answer or "").strip())  # ENV-08
        payload = Payload(
            channel_id=target.channel_id,
            content=text,
            kind="reply" if as_reply else "other",  # another channel is judged as an act of its own
            reply_to=ctx.message.id if as_reply else None,
        )
        if wants_picture(envelope, package.image_urls):
            request = image_request(self.settings, envelope, package.image_urls, ctx.message.content)
            try:
                payload.files = await ctx.images.make(request)  # through the turn's image scope (seed 003)
            except ImageFailed as exc:
                ctx.notes.append(f"no picture: {exc}")
                await self.host_log("warning", f"picture not made: {exc}"[:1000], message_id=ctx.message.id)
                payload.content = f"{payload.content}\n{PICTURE_FAILED_NOTE}".strip()
            dropped = fit_files(payload, self.deps.peer.max_line_bytes)
            if dropped:
                ctx.notes.append(f"pictures too large to carry: {', '.join(dropped)}")
                await self.host_log("warning", f"pictures dropped, too large for one line: {dropped}")
        if not payload.content and not payload.files:
            return None
        return payload

    async def _render_acts(self, ctx: TurnContext, envelope: Envelope) -> None:
        imp, staff = self.deps.init.imp.name, self.settings.staff_channel
        where = self._channel_label()
        author = ctx.message.author.name
        if envelope.staff:  # ENV-03: never silently dropped
            if staff:
                ctx.acts.append(staff_note(imp, where, author, envelope.staff, staff))
            else:
                await self.host_log(
                    "warning", f"staff note (no staff channel configured): {envelope.staff}"[:1000]
                )
        if envelope.hack:  # recorded in the journal; alerted to the staff channel when there is one
            await self.host_log(
                "warning", "the message tried to subvert the imp", message_id=ctx.message.id, author=author
            )
            if staff:
                ctx.acts.append(hack_alert(imp, where, author, ctx.message.content, staff))

    def _channel_label(self) -> str:
        if self.session.channel_kind == "dm":
            return "a direct message"
        return (
            f"#{self.session.channel_name}"
            if self.session.channel_name
            else f"channel {self.session.channel_id}"
        )

    # ------------------------------------------------------------ talking to the host

    async def _enter(self, ctx: TurnContext, stage: Stage) -> None:
        ctx.stages.append(stage)
        try:
            params = TurnStageParams(message_id=ctx.message.id, stage=stage.value)  # type: ignore[arg-type]
            await self.deps.peer.notify("turn.stage", params)
        except PeerClosed:
            pass

    async def host_log(self, level: str, message: str, **fields: Any) -> None:
        values: dict[str, ReportValue] = {
            k: v for k, v in fields.items() if isinstance(v, str | int | float | bool)
        }
        try:
            await self.deps.peer.notify("log", LogParams(level=level, message=message[:4000], fields=values))  # type: ignore[arg-type]
        except PeerClosed:
            pass
