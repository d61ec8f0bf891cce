"""A scripted host for driving real boxes without the gateway: canned model answers, recorded sends; and pip's
box on the in-process backend."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel

from box.protocol import ErrorCode, RpcError
from box.protocol.history import HistoryCommitParams, HistoryCommitResult, HistoryLoadResult
from box.protocol.models import (
    Attachment,
    Author,
    BoxInitParams,
    DeliverParams,
    DiscordSendResult,
    Framing,
    HistoryEntry,
    HttpFetchResult,
    ImpSpec,
    Message,
    ModelRequestResult,
    ResponderSettings,
    SessionInfo,
    TurnStageParams,
)
from impyard.backends import BoxHost, BoxSpec, QuietHost, RunningBox
from impyard.clock import SystemClock
from impyard.conversation.responder_history import HistoryBounds, ResponderHistory, line_views
from impyard.storage.db import open_database
from testing.fake_openai import envelope as full_envelope
from testing.inprocess import InProcessBackend

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
_DATABASES = Path(tempfile.mkdtemp(prefix="impyard-scripted-host-"))
atexit.register(shutil.rmtree, _DATABASES, ignore_errors=True)


def envelope(answer: str | None = "hello", answer_needed: bool = True, **fields: Any) -> dict[str, Any]:
    """The reply envelope of ``testing.fake_openai``, answering "hello" unless told; ``fields`` are set as given
    (an unknown one too: a box must cope with what a model sends)."""
    value = full_envelope(answer=answer, answer_needed=answer_needed)
    value.update(fields)
    return value


def chat_result(content: dict[str, Any] | str, status: int = 200) -> ModelRequestResult:
    text = content if isinstance(content, str) else json.dumps(content)
    return ModelRequestResult(
        status=status, body={"choices": [{"message": {"role": "assistant", "content": text}}]}
    )


@dataclass
class ScriptedHost(QuietHost):
    """Answers model.request from a list (the last one repeats); delivers every send."""

    answers: list[ModelRequestResult | RpcError] = field(default_factory=lambda: [chat_result(envelope())])
    send_status: str = "delivered"
    calls: list[tuple[str, BaseModel]] = field(default_factory=list)
    stages: list[str] = field(default_factory=list)
    sent: list[BaseModel] = field(default_factory=list)
    hold: anyio.Event | None = None  # when set, model.request waits for it: a turn in flight
    model_calls: int = 0
    fetches: list[HttpFetchResult | RpcError] = field(
        default_factory=list
    )  # http.fetch answers (last repeats)
    send_errors: list[RpcError] = field(default_factory=list)  # discord.send refusals, one per send, in order
    logs: list[BaseModel] = field(default_factory=list)
    history_bounds: HistoryBounds = field(default_factory=HistoryBounds)  # what the host trims to (ENV-07)
    _history: ResponderHistory | None = None

    @property
    def history(self) -> ResponderHistory:
        """The host's store of the boxes' own lines (issue 22), in a database of this host's own."""
        if self._history is None:
            db = open_database(Path(tempfile.mkdtemp(dir=_DATABASES)) / "impyard.db")
            self._history = ResponderHistory(db, SystemClock(), default=self.history_bounds)
        return self._history

    @property
    def model_requests(self) -> list[Any]:
        """The model.request params the box sent, in order (``.path``, ``.body``, ``.purpose``)."""
        return [params for method, params in self.calls if method == "model.request"]

    async def turn_stage(self, spec: BoxSpec, params: TurnStageParams, *, woken: bool = False) -> None:
        await self.serve(spec, "turn.stage", params)  # recorded in order with the requests

    async def serve(self, spec: BoxSpec, method: str, params: BaseModel) -> BaseModel | None:
        self.calls.append((method, params))
        if method == "turn.stage":
            self.stages.append(params.stage)  # type: ignore[attr-defined]
            return None
        if method == "log":
            self.logs.append(params)
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
            if self.send_errors:
                raise self.send_errors.pop(0)
            self.sent.append(params)
            if self.send_status == "pending":
                return DiscordSendResult(status="pending", gate_id="g1")
            return DiscordSendResult(status="delivered", message_ids=[f"out-{len(self.sent)}"])
        if method == "history.load":
            lines = await anyio.to_thread.run_sync(self.history.load, spec.imp, spec.channel_id)
            return HistoryLoadResult(lines=line_views(lines))
        if method == "history.commit":
            assert isinstance(params, HistoryCommitParams)
            stored = await anyio.to_thread.run_sync(
                self.history.commit, spec.imp, spec.channel_id, params.lines, params.outcome
            )
            return HistoryCommitResult(stored=stored)
        if method == "http.fetch" and self.fetches:
            fetched = self.fetches.pop(0) if len(self.fetches) > 1 else self.fetches[0]
            if isinstance(fetched, RpcError):
                raise fetched
            return fetched
        raise RpcError(ErrorCode.DENIED, "denied", {"rule": "test", "reason": "not scripted"})


def tool_calls_result(*calls: tuple[str, dict[str, Any], str]) -> ModelRequestResult:
    """A chat/completions answer that calls tools: (name, arguments, call_id) each."""
    tool_calls = [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        for name, arguments, call_id in calls
    ]
    message = {"role": "assistant", "content": None, "tool_calls": tool_calls}
    return ModelRequestResult(
        status=200, body={"choices": [{"message": message, "finish_reason": "tool_calls"}]}
    )


def init_params(
    imp: str = "pip",
    channel_id: str = "c1",
    kind: str = "dm",
    *,
    persona: str = "You are Pip.",
    channel_name: str = "",
    **responder: Any,
) -> BoxInitParams:
    """``responder`` keys are ResponderSettings fields (model, tools, staff_channel, ...)."""
    return BoxInitParams(
        protocol=1,
        imp=ImpSpec(name=imp, persona=persona, responder=ResponderSettings(**responder)),
        session=SessionInfo(id="s1", channel_id=channel_id, channel_kind=kind, channel_name=channel_name),  # type: ignore[arg-type]
        now=NOW,
    )


def deliver_params(
    content: str = "hi",
    message_id: str = "m1",
    mode: str = "respond",
    *,
    reason: str | None = None,
    author: str = "ann",
    author_id: str = "u1",
    attachments: Sequence[Attachment] = (),
    recent: Sequence[HistoryEntry] = (),
    now: datetime = NOW,
) -> DeliverParams:
    return DeliverParams(
        message=Message(
            id=message_id,
            author=Author(id=author_id, name=author),
            content=content,
            created_at=now,
            attachments=list(attachments),
        ),  # fmt: skip
        framing=Framing(mode=mode, reason=reason or ("dm" if mode == "respond" else "group")),  # type: ignore[arg-type]
        recent=list(recent),
        now=now,
    )


@asynccontextmanager
async def in_process_box(
    host: BoxHost, state_dir: Path, *, channel_id: str = "c1", **seams: Any
) -> AsyncIterator[RunningBox]:
    """pip's box of ``channel_id`` on the in-process backend (``testing.inprocess``), served by ``host``;
    ``seams`` go to the box program (``sleep``, ``memory``, ``tools``)."""
    async with InProcessBackend(**seams).open(BoxSpec("pip", channel_id, state_dir), host) as box:
        yield box
