"""The imp's responder: what the box does with a delivered message, a prompt task or a channel event.

Trivial prefilters stay outside the turn machine (seed 003): a short-path rule archives the
message without a model call (ENV-05). Everything else runs through ``TurnMachine``, inside
the turn's image-generation scope (seed 003: a runtime wrapper, not a stage). The
responder lives as long as the box session, so the retry-model state (ENV-15) carries from
one turn to the next.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import anyio

from box.attempts import ModelChooser
from box.common.failures import tagged
from box.common.history import Record
from box.common.model_profiles import timing_for
from box.context import message_body
from box.failures import classify
from box.history import HostHistory
from box.images import image_scope
from box.machine import TurnContext, TurnDeps, TurnInput, TurnMachine
from box.memory import MemoryEngine, NoMemory
from box.model import ModelClient
from box.protocol import Peer, RpcError
from box.protocol.models import (
    Author,
    BoxInitParams,
    DeliverParams,
    DeliverResult,
    Framing,
    MailboxEventParams,
    Message,
    TaskRunParams,
    TaskRunResult,
)
from box.short_path import short_path_matches
from box.tool_loop import ReplyCaller
from box.tools import ToolRegistry, builtin_tools

log = logging.getLogger("box.responder")

TASK_AUTHOR = Author(id="task", name="task")


@dataclass(frozen=True)
class TurnReport:
    """The answer for the host and what the box's journal keeps about the turn."""

    result: DeliverResult
    journal: dict[str, str | bool]
    answer: str | None = None  # the envelope's answer (a prompt task's summary)


def error_text(error: BaseException | None) -> str:
    return (str(error) or type(error).__name__)[:1000] if error is not None else "unknown failure"


def model_client(peer: Peer, init: BoxInitParams) -> ModelClient:
    """The box's model client: a local server's calls end with the box, and each may take as long as a reply
    attempt (issue 38, ``ServerTiming``)."""
    settings = init.imp.responder
    local = timing_for(settings.server).local
    return ModelClient(
        peer, end_with_box=local, default_timeout_s=settings.attempt_timeout_s if local else None
    )


class Responder:
    def __init__(
        self,
        peer: Peer,
        init: BoxInitParams,
        *,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        memory: MemoryEngine | None = None,
        tools: ToolRegistry | None = None,
        client: ModelClient | None = None,
    ) -> None:
        settings = init.imp.responder
        self.init = init
        self.memory = memory or NoMemory()
        self.history = HostHistory(peer, init.session.channel_id)  # kept by the host (issue 22)
        self.chooser = ModelChooser(settings)  # ENV-15: kept for the whole session
        self.client = client or model_client(peer, init)
        registry = tools or builtin_tools(peer, self.memory)
        caller = ReplyCaller(self.client, settings, self.chooser, registry, sleep)
        self.machine = TurnMachine(TurnDeps(peer, init, self.history, self.memory, caller))

    # ------------------------------------------------------------ mailbox.deliver

    async def deliver(self, params: DeliverParams) -> TurnReport:
        message = params.message
        session = self.init.session
        if short_path_matches(
            self.init.imp.responder.short_path,
            channel_name=session.channel_name, channel_id=session.channel_id,
            author_name=message.author.name, author_id=message.author.id,
        ):  # fmt: skip
            await self._archive(message)  # ENV-05: no model call
            return TurnReport(DeliverResult(outcome="silent"), {"short_path": True})
        turn = TurnInput(
            message, params.framing, list(params.recent), params.now, presence=list(params.presence)
        )
        async with image_scope(self.client) as images:  # seed 003: wraps the machine, outside its stages
            ctx = await self.machine.run(TurnContext(turn, images=images))
        return TurnReport(self._result(ctx), self._journal(ctx))

    async def _archive(self, message: Message) -> None:
        record = Record(
            self.init.session.channel_id,
            message.id,
            "user",
            message.author.name,
            message_body(message),
            message.created_at,
        )
        try:  # ENV-05: appended, trimmed (ENV-07) and persisted, by the host
            await self.history.commit([record], count="archived")
        except RpcError as exc:  # the message itself is in the host's history: only the box's line is lost
            log.warning("the short-path archive of %s was refused: %s", message.id, exc.message)

    @staticmethod
    def _result(ctx: TurnContext) -> DeliverResult:
        if ctx.outcome == "failed" or ctx.outcome is None:
            # issue 19 #5: the kind leads the error, so the host says which failure it was
            return DeliverResult(outcome="failed", error=tagged(classify(ctx.error), error_text(ctx.error)))
        ids = ctx.delivery.message_ids if ctx.outcome == "sent" and ctx.delivery is not None else []
        return DeliverResult(outcome=ctx.outcome, message_ids=ids[:100])

    @staticmethod
    def _journal(ctx: TurnContext) -> dict[str, str | bool]:
        entry: dict[str, str | bool] = {"stages": ",".join(stage.value for stage in ctx.stages)}
        if ctx.envelope is not None and ctx.envelope.hack:
            entry["hack"] = True  # the message tried to subvert the imp: recorded here, alerted to staff
        if ctx.error is not None:
            entry["error"] = f"{type(ctx.error).__name__}: {error_text(ctx.error)}"
        if ctx.notes:
            entry["notes"] = "; ".join(ctx.notes)[:1000]
        if ctx.images.made:  # what the turn's image scope made (seed 003)
            entry["pictures"] = "; ".join(item.marker() for item in ctx.images.made)[:1000]
        return entry

    # ------------------------------------------------------------ task.run kind "prompt"

    async def run_prompt_task(self, params: TaskRunParams) -> TurnReport:
        """A scheduled prompt, through the same machine; it posts as an act of its own (kind "other")."""
        prompt = (params.task.prompt or "").strip()
        if not prompt:
            return TurnReport(DeliverResult(outcome="failed", error="the task has no prompt"), {})
        message = Message(id=params.task.id, author=TASK_AUTHOR, content=prompt, created_at=params.now)
        framing = Framing(mode="judge", reason="task")  # the model decides whether the result is posted
        async with image_scope(self.client) as images:
            ctx = await self.machine.run(
                TurnContext(TurnInput(message, framing, [], params.now, task=True), images=images)
            )
        return TurnReport(
            self._result(ctx), self._journal(ctx), ctx.envelope.answer if ctx.envelope else None
        )

    @staticmethod
    def task_result(report: TurnReport) -> TaskRunResult:
        result = report.result
        answer = (report.answer or "")[:20_000]
        if result.outcome == "failed":
            return TaskRunResult(outcome="failed", summary=(result.error or "")[:20_000])
        return TaskRunResult(outcome="pending" if result.outcome == "pending" else "done", summary=answer)

    # ------------------------------------------------------------ mailbox.event

    async def record_event(self, params: MailboxEventParams) -> bool:
        """ENV-13: a reaction clear is recorded in the channel's history (and handed to memory)."""
        if params.kind != "reaction_clear":
            log.info("ignoring a channel event of unknown kind %r", params.kind)
            return False
        at = params.at or datetime.now(UTC)
        emoji = ", ".join(params.reactions) if params.reactions else "all reactions"
        text = f"the reactions on message {params.message_id} were cleared ({emoji})"
        record = Record(
            params.channel_id, f"reaction_clear:{params.message_id}:{at.isoformat()}", "event", "", text, at
        )
        self.history.hold(record)  # a notification never waits on the host: sent with the next commit
        await self.memory.record_event(params.channel_id, text)
        return True
