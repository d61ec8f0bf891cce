"""A scripted host for driving real boxes without the gateway: canned model answers, recorded sends."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
from pydantic import BaseModel

from box.protocol import ErrorCode, RpcError
from box.protocol.models import (
    Author,
    BoxInitParams,
    DeliverParams,
    DiscordSendResult,
    Framing,
    ImpSpec,
    Message,
    ModelRequestResult,
    SessionInfo,
)
from impyard.backends import BoxSpec

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


def envelope(answer: str | None = "hello", answer_needed: bool = True, **fields: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "answer": answer,
        "answer_needed": answer_needed,
        "channel": None,
        "staff": None,
        "picture": None,
        "picture_count": None,
        "picture_edit": False,
        "hack": False,
        "moment": None,
        "told": None,
        "action": {"type": "none", "text": None},
    }
    value.update(fields)
    return value


def chat_result(content: dict[str, Any] | str, status: int = 200) -> ModelRequestResult:
    text = content if isinstance(content, str) else json.dumps(content)
    return ModelRequestResult(status=status, body={"choices": [{"message": {"role": "assistant", "content": text}}]})


@dataclass
class ScriptedHost:
    """Answers model.request from a list (the last one repeats); delivers every send."""

    answers: list[ModelRequestResult | RpcError] = field(default_factory=lambda: [chat_result(envelope())])
    send_status: str = "delivered"
    calls: list[tuple[str, BaseModel]] = field(default_factory=list)
    stages: list[str] = field(default_factory=list)
    sent: list[BaseModel] = field(default_factory=list)
    hold: anyio.Event | None = None  # when set, model.request waits for it: a turn in flight
    model_calls: int = 0

    async def serve(self, spec: BoxSpec, method: str, params: BaseModel) -> BaseModel | None:
        self.calls.append((method, params))
        if method == "turn.stage":
            self.stages.append(params.stage)  # type: ignore[attr-defined]
            return None
        if method == "log":
            return None
        if method == "model.request":
            self.model_calls += 1
            if self.hold is not None:
                await self.hold.wait()
            answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
            if isinstance(answer, RpcError):
                raise answer
            return answer
        if method == "discord.send":
            self.sent.append(params)
            if self.send_status == "pending":
                return DiscordSendResult(status="pending", gate_id="g1")
            return DiscordSendResult(status="delivered", message_ids=[f"out-{len(self.sent)}"])
        raise RpcError(ErrorCode.DENIED, "denied", {"rule": "test", "reason": "not scripted"})


def init_params(imp: str = "pip", channel_id: str = "c1", kind: str = "dm") -> BoxInitParams:
    return BoxInitParams(
        protocol=1,
        imp=ImpSpec(name=imp, persona="You are Pip."),
        session=SessionInfo(id="s1", channel_id=channel_id, channel_kind=kind),  # type: ignore[arg-type]
        now=NOW,
    )


def deliver_params(content: str = "hi", message_id: str = "m1", mode: str = "respond") -> DeliverParams:
    return DeliverParams(
        message=Message(id=message_id, author=Author(id="u1", name="ann"), content=content, created_at=NOW),
        framing=Framing(mode=mode, reason="dm" if mode == "respond" else "group"),  # type: ignore[arg-type]
        now=NOW,
    )
