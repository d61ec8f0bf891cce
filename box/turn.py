"""One honest turn for a delivered message (until the turn machine of seed 003 lands).

One ``model.request`` to ``/chat/completions`` with the strict envelope, then,
if the envelope asks for it, one ``discord.send`` to the message's channel.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from box.envelope import response_format
from box.model import ModelCallFailed, ModelClient, parse_chat_envelope
from box.protocol import Peer, PeerClosed, RpcError
from box.protocol.models import (
    BoxInitParams,
    DeliverParams,
    DeliverResult,
    DiscordSendParams,
    DiscordSendResult,
    Stage,
    TaskRunParams,
    TaskRunResult,
    TurnStageParams,
)

log = logging.getLogger("box.turn")

_JUDGE_NOTE = (
    "Several people are talking here. Reply only when you are addressed or have something genuinely useful "
    "to add; otherwise set answer_needed to false. Staying silent is fine."
)


def system_prompt(init: BoxInitParams, now: datetime, judge: bool) -> str:
    persona = init.imp.persona.strip() or f"You are {init.imp.name}, a helpful companion in a chat."
    context = f"## Context\nDate: {now:%Y-%m-%d}\nTime: {now:%H:%M} UTC\nChannel: {init.session.channel_name or init.session.channel_id}"
    parts = [persona, context]
    if judge:
        parts.append(_JUDGE_NOTE)
    return "\n\n".join(parts)


def chat_body(init: BoxInitParams, messages: list[dict[str, Any]]) -> dict[str, Any]:
    settings = init.imp.responder
    body: dict[str, Any] = {
        "model": settings.model,
        "messages": messages,
        "max_completion_tokens": settings.max_tokens,
        "response_format": response_format(),
    }
    if settings.temperature is not None:
        body["temperature"] = settings.temperature
    return body


@dataclass
class SimpleTurn:
    peer: Peer
    init: BoxInitParams

    async def _stage(self, message_id: str, stage: Stage) -> None:
        try:
            await self.peer.notify("turn.stage", TurnStageParams(message_id=message_id, stage=stage))
        except PeerClosed:
            pass

    async def deliver(self, params: DeliverParams) -> DeliverResult:
        message = params.message
        await self._stage(message.id, "context")
        history = params.recent[-self.init.imp.responder.history_limit :] if self.init.imp.responder.history_limit else []
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system_prompt(self.init, params.now, params.framing.mode == "judge")}
        ]
        for entry in history:
            if entry.id == message.id:
                continue
            if entry.from_imp:
                messages.append({"role": "assistant", "content": entry.content})
            else:
                messages.append({"role": "user", "content": f"{entry.author.name}: {entry.content}"})
        messages.append({"role": "user", "content": f"{message.author.name}: {message.content}"})
        try:
            await self._stage(message.id, "decision" if params.framing.mode == "judge" else "render")
            result = await ModelClient(self.peer).call("/chat/completions", chat_body(self.init, messages), "reply")
            envelope = parse_chat_envelope(result)
        except (ModelCallFailed, RpcError) as exc:
            await self._stage(message.id, "failed")
            log.warning("turn for %s failed: %s", message.id, exc)
            return DeliverResult(outcome="failed", error=str(exc)[:1000])
        if not (envelope.answer_needed and envelope.answer):
            await self._stage(message.id, "post")
            return DeliverResult(outcome="silent")
        if params.framing.mode == "judge":
            await self._stage(message.id, "render")
        await self._stage(message.id, "send")
        send = DiscordSendParams(
            channel_id=self.init.session.channel_id, content=envelope.answer, reply_to=message.id, kind="reply"
        )
        try:
            sent = await self.peer.request("discord.send", send)
        except RpcError as exc:
            await self._stage(message.id, "failed")
            return DeliverResult(outcome="failed", error=f"send refused: {exc.message}"[:1000])
        assert isinstance(sent, DiscordSendResult)
        await self._stage(message.id, "post")
        if sent.status == "pending":
            return DeliverResult(outcome="pending")
        return DeliverResult(outcome="sent", message_ids=sent.message_ids)

    async def run_prompt_task(self, params: TaskRunParams) -> TaskRunResult:
        prompt = params.task.prompt or ""
        if not prompt.strip():
            return TaskRunResult(outcome="failed", summary="the task has no prompt")
        messages = [
            {"role": "system", "content": system_prompt(self.init, params.now, judge=False)},
            {"role": "user", "content": prompt},
        ]
        try:
            result = await ModelClient(self.peer).call("/chat/completions", chat_body(self.init, messages), "reply")
            envelope = parse_chat_envelope(result)
        except (ModelCallFailed, RpcError) as exc:
            return TaskRunResult(outcome="failed", summary=str(exc)[:1000])
        if not (envelope.answer_needed and envelope.answer):
            return TaskRunResult(outcome="done", summary=(envelope.answer or "")[:20_000])
        send = DiscordSendParams(channel_id=self.init.session.channel_id, content=envelope.answer, kind="other")
        try:
            sent = await self.peer.request("discord.send", send)
        except RpcError as exc:
            return TaskRunResult(outcome="failed", summary=f"send refused: {exc.message}"[:1000])
        assert isinstance(sent, DiscordSendResult)
        outcome = "pending" if sent.status == "pending" else "done"
        return TaskRunResult(outcome=outcome, summary=envelope.answer[:20_000])
