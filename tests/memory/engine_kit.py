"""Fixtures for the memory engine's tests (issue 23): a fixed clock, a scripted fake model answering by
purpose and recording every call, the hashing embedder, and the host's real memory store in-process.

The store is the real ``MemoryService`` over a migrated SQLite database; the box reaches it exactly as on
the wire: either through a real protocol ``Peer`` (``Kit.box``: the real box program in this process) or
through ``DirectPeer``, which round-trips every params and result through JSON like the peer does.
"""

from __future__ import annotations

import inspect
import itertools
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from box.common.embedding import hashing_vector
from box.context import memory_block_of, turn_context
from box.memory.engine import ChatMemory
from box.memory.prompts import Prompts
from box.memory.store_client import StoreClient
from box.protocol import HOST_METHODS, ErrorCode, Peer, RpcError
from box.protocol import memory as mem
from box.protocol.models import (
    Attachment,
    Author,
    BoxInitParams,
    DeliverParams,
    DeliverResult,
    Framing,
    ImpSpec,
    MemorySettings,
    Message,
    ModelRequestParams,
    ModelRequestResult,
    ResponderSettings,
    SessionInfo,
)
from impyard.backends import BoxSpec
from impyard.clock import FixedClock
from impyard.memory.scopes import SessionScopes
from impyard.memory.service import STORE_UNAVAILABLE, MemoryService, memory_service
from impyard.storage.db import Database, open_database
from tests import scripted

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
UTTERANCE = timedelta(seconds=30)  # seed 002: the clock moves 30 s per utterance
IMP = "pip"
DM_SCOPES = SessionScopes("dm:u1", ("dm:u1",))


def vector(text: str) -> list[float]:
    found = hashing_vector(text)
    assert found is not None
    return found


# ------------------------------------------------------------------ the scripted fake model


def envelope(
    answer: str | None = "hello",
    *,
    answer_needed: bool = True,
    action: str = "none",
    action_text: str | None = None,
    feeling: str = "calm interest",
    conclusion: str = "We are talking.",
    valence: float = 0.3,
    intensity: float = 0.4,
    refeels: list[str] | None = None,
    told: str | None = "Ann spoke with Pip, and Pip answered.",
    moment: bool = True,
) -> dict[str, Any]:
    """A reply envelope (docs/conversation.md) with the memory engine's fields."""
    felt = {"feeling": feeling, "conclusion": conclusion, "valence": valence, "intensity": intensity,
            "refeels": refeels or []}  # fmt: skip
    return scripted.envelope(
        answer, answer_needed, moment=felt if moment else None, told=told,
        action={"type": action, "text": action_text},
    )  # fmt: skip


def appraisal(
    feeling: str = "quiet warmth",
    conclusion: str = "Ann is kind to me.",
    valence: float = 0.5,
    intensity: float = 0.6,
) -> dict[str, Any]:
    return {"feeling": feeling, "conclusion": conclusion, "valence": valence, "intensity": intensity}


def verdict(
    keep: list[int] | None = None, asks_for_memory: bool = False, asks_for_own: str | None = None
) -> dict[str, Any]:
    return {"keep": keep or [], "asks_for_memory": asks_for_memory, "asks_for_own": asks_for_own}


def arrival(
    feeling: str = "glad recognition",
    conclusion: str = "Ann is here again.",
    valence: float = 0.4,
    intensity: float = 0.3,
    *,
    search: str | None = None,
) -> dict[str, Any]:
    """An arrival answer (mechanism 101; no greeting is asked for since issue 33)."""
    return {
        "feeling": feeling, "conclusion": conclusion, "valence": valence,
        "intensity": intensity, "search": search,
    }  # fmt: skip


def thought(
    thought: str = "I keep thinking about what Ann told me.",
    *,
    feeling: str = "quiet thoughtfulness",
    conclusion: str = "Ann matters to me.",
    valence: float = 0.3,
    intensity: float = 0.4,
    reinforces: int | None = None,
    act: str = "none",
    text: str | None = None,
) -> dict[str, Any]:
    """An introspection answer (mechanism 71): ``reinforces`` is the 1-based index of the entry it deepens."""
    return {
        "thought": thought, "feeling": feeling, "conclusion": conclusion, "valence": valence,
        "intensity": intensity, "reinforces": reinforces, "act": act, "text": text,
    }  # fmt: skip


@dataclass
class Call:
    """One model call the box made, as the gateway saw it."""

    purpose: str
    path: str
    body: dict[str, Any]

    @property
    def system(self) -> str:
        messages = self.body.get("messages") or []
        return str(messages[0]["content"]) if messages and messages[0]["role"] == "system" else ""

    @property
    def context(self) -> str:
        """A reply call's turn ``## Context``: it opens the current message, after the history (issue 33)."""
        return turn_context(self.body.get("messages") or [])

    @property
    def user(self) -> str:
        users = [m["content"] for m in self.body.get("messages") or [] if m["role"] == "user"]
        return "\n".join(u if isinstance(u, str) else json.dumps(u) for u in users)

    @property
    def text(self) -> str:
        """Everything the model read (embeddings: the input)."""
        if self.path == "/embeddings":
            return " ".join(self.body.get("input") or [])
        return json.dumps(self.body.get("messages"), ensure_ascii=False)


Answer = Any  # dict (sent as JSON) | str (as is) | ModelRequestResult | RpcError | a function of the Call


@dataclass
class FakeModel:
    """Answers each purpose from its queue, then from its default; records every call.

    A dict answer is sent as JSON text, a str as it is (unreadable on purpose), a ``ModelRequestResult``
    or an ``RpcError`` as given. Embeddings are the hashing embedder's vectors of the input.
    """

    queues: dict[str, list[Answer]] = field(default_factory=dict)
    defaults: dict[str, Answer] = field(
        default_factory=lambda: {
            "reply": envelope(),
            "filter": verdict(),
            "appraisal": appraisal(),
            "summary": {"summary": "I talked with Ann."},
            "introspection": thought(),
            "arrival": arrival(),
            "selection": {"matched": []},
            "learning": {"learned": None},
            "classification": {"same": -1, "contradicts": -1},
        }
    )
    calls: list[Call] = field(default_factory=list)

    def script(self, purpose: str, *answers: Answer) -> None:
        self.queues.setdefault(purpose, []).extend(answers)

    def of(self, purpose: str) -> list[Call]:
        return [c for c in self.calls if c.purpose == purpose]

    async def answer(self, params: ModelRequestParams) -> ModelRequestResult:
        self.calls.append(Call(params.purpose, params.path, params.body))
        if params.path == "/embeddings" and not self.queues.get("embedding"):
            dims = int(params.body.get("dimensions") or 64)
            data = [{"embedding": hashing_vector(text, dims)} for text in params.body["input"]]
            return ModelRequestResult(status=200, body={"data": data})
        queue = self.queues.get(params.purpose) or []
        answer = queue.pop(0) if queue else self.defaults.get(params.purpose, "{}")
        if callable(answer):  # answers from what the call says; may be async (to hold a call)
            answer = answer(self.calls[-1])
            if inspect.isawaitable(answer):
                answer = await answer
        if isinstance(answer, RpcError):
            raise answer
        if isinstance(answer, ModelRequestResult):
            return answer
        return scripted.chat_result(answer)


class FakeClient:
    """``box.model.ModelClient`` for an engine driven without a box: straight to the fake model."""

    def __init__(self, model: FakeModel) -> None:
        self.model = model

    async def call(self, path: str, body: dict[str, Any], purpose: str) -> ModelRequestResult:
        return await self.model.answer(ModelRequestParams(path=path, body=body, purpose=purpose))  # type: ignore[arg-type]


# ------------------------------------------------------------------ the host side


def _wire(model: BaseModel, kind: type[BaseModel]) -> BaseModel:
    """What the other side parses: the model as JSON text, validated again (as the peer does)."""
    return kind.model_validate(json.loads(model.model_dump_json()))


@dataclass
class DirectPeer:
    """The box's memory requests straight to the host's service, through JSON both ways."""

    service: MemoryService
    spec: BoxSpec
    scopes: SessionScopes
    down: set[str] = field(default_factory=set)  # methods the store fails ("*" for all)
    requests: list[tuple[str, BaseModel]] = field(default_factory=list)

    async def request(self, method: str, params: BaseModel, *, timeout: float | None = None) -> BaseModel:
        spec = HOST_METHODS[method]
        sent = _wire(params, spec.params)
        self.requests.append((method, sent))
        if method in self.down or "*" in self.down:
            raise RpcError(ErrorCode.INTERNAL_ERROR, STORE_UNAVAILABLE)
        result = await self.service.serve(self.spec, method, sent, scopes=self.scopes)
        assert spec.result is not None
        return _wire(result, spec.result)


@dataclass(kw_only=True)
class KitHost(scripted.ScriptedHost):
    """The scripted host (tests/scripted.py) with the fake model answering ``model.request`` by purpose and the
    real memory service answering ``memory.*``; it records calls, stages, logs and delivers sends the same."""

    model: FakeModel
    service: MemoryService
    scopes: SessionScopes
    down: set[str] = field(default_factory=set)
    nights: bool = False  # the boxes stand for sleep tasks' boxes, which may fold and forget (issue 15)

    def memory_requests(self) -> list[tuple[str, BaseModel]]:
        return [(m, p) for m, p in self.calls if m.startswith("memory.")]

    def log_lines(self) -> list[str]:
        return [str(getattr(entry, "message", "")) for entry in self.logs]

    async def serve(self, spec: BoxSpec, method: str, params: BaseModel) -> BaseModel | None:
        if method == "turn.stage":
            self.service.stage(spec, params.stage)  # type: ignore[attr-defined]
        if method == "model.request":
            assert isinstance(params, ModelRequestParams)
            self.calls.append((method, params))
            return await self.model.answer(params)
        if method.startswith("memory."):
            if self.nights and not self.service.is_open(spec):
                self.service.open(spec, self.scopes, nights=True)
            self.calls.append((method, params))
            if method in self.down or "*" in self.down:
                raise RpcError(ErrorCode.INTERNAL_ERROR, STORE_UNAVAILABLE)
            return await self.service.serve(spec, method, params, scopes=self.scopes)
        return await super().serve(spec, method, params)


@dataclass
class KitBox:
    peer: Peer
    kit: Kit
    channel_id: str

    async def say(
        self,
        content: str,
        *,
        author: str = "Ann",
        author_id: str = "u1",
        message_id: str | None = None,
        mode: str = "respond",
        presence: list[mem.PresenceEntry] | None = None,
        attachments: list[Attachment] | None = None,
    ) -> DeliverResult:
        """One message, delivered at the kit's clock; the clock then moves 30 s (one utterance)."""
        now = self.kit.clock.now()
        params = DeliverParams(
            message=Message(
                id=message_id or f"m{next(self.kit.ids)}", author=Author(id=author_id, name=author), content=content,
                created_at=now, attachments=attachments or [],
            ),
            framing=Framing(mode=mode, reason="dm" if mode == "respond" else "group"),  # type: ignore[arg-type]
            now=now, presence=presence or [],
        )  # fmt: skip
        result = await self.peer.request("mailbox.deliver", params, timeout=60)
        assert isinstance(result, DeliverResult)
        self.kit.clock.advance(UTTERANCE)
        return result


class Kit:
    """One imp's world for a test: database, clock, memory service, fake model, host."""

    def __init__(self, tmp_path: Path, scopes: SessionScopes = DM_SCOPES) -> None:
        self.tmp_path = tmp_path
        self.db: Database = open_database(tmp_path / "impyard.db")
        self.clock = FixedClock(NOW)
        self.service = memory_service(self.db, self.clock.now)
        self.model = FakeModel()
        self.scopes = scopes
        self.host = KitHost(model=self.model, service=self.service, scopes=scopes)
        self.ids = itertools.count(1)
        self.boxes = 0

    def close(self) -> None:
        self.db.close()

    # -------------------------------------------------------------- the store, as a box reaches it

    def peer(self, channel_id: str = "c1", *, learns: int = 1_000) -> DirectPeer:
        """The store as one box reaches it. ``learns``: the rules it may learn — a departure's box learns one
        (the supervisor opens it so); the kit's direct engine stands for any number of departures, and a
        chat box (``Kit.box``) for none."""
        spec = BoxSpec(IMP, channel_id, self.tmp_path / "direct")
        self.service.open(spec, self.scopes, learns=learns, nights=True)  # and any number of nights
        return DirectPeer(self.service, spec, self.scopes)

    def store(self, channel_id: str = "c1") -> StoreClient:
        return StoreClient(self.peer(channel_id))

    async def seed(
        self,
        conclusion: str,
        *,
        feeling: str = "a feeling",
        valence: float = 0.5,
        intensity: float = 0.6,
        author: str = "Ann",
        author_id: str | None = "u1",
        said: str | None = None,
        told: str | None = None,
        ago: timedelta = timedelta(0),
        join: str | None = None,
    ) -> str:
        """A lived record kept ``ago`` before the clock's now, with one episode (as a box would keep it)."""
        now = self.clock.now()
        self.clock.set(now - ago)
        try:
            text = said or f"{author} said: {conclusion}"
            episode = mem.NewEpisode(
                author=author, author_id=author_id, message_id=f"seed-{next(self.ids)}", as_happened=text,
                told=told, vector=vector(text),
            )  # fmt: skip
            if join is not None:
                params = mem.EncodeParams(join=join, episode=episode)
            else:
                record = mem.NewRecord(
                    author=author, author_id=author_id, feeling=feeling, conclusion=conclusion, valence=valence,
                    intensity=intensity, vector=vector(conclusion),
                )  # fmt: skip
                params = mem.EncodeParams(record=record, episode=episode)
            result = await self.store().encode(params)
            return result.record_id
        finally:
            self.clock.set(now)

    async def ongoing(self, *, person: str = "Ann", person_id: str = "u1", channel_id: str = "c1") -> None:
        """A conversation with the person already going on in the channel, so their next message is no
        arrival (101): for the tests of a turn's own mechanisms, which the arrival's recall would crowd."""
        now = self.clock.now()
        state = {"person": person, "person_id": person_id, "started_at": now.isoformat(),
                 "last_input_at": now.isoformat()}  # fmt: skip
        await self.store(channel_id).conversation_put(person_id, state)

    async def record(self, record_id: str) -> mem.RecordView:
        shown = await self.db.run(lambda: self.service.store.show(IMP, limit=500, episodes=10))
        [found] = [r for r in shown if r.id == record_id]
        return found

    async def records(self) -> list[mem.RecordView]:
        return await self.db.run(lambda: self.service.store.show(IMP, limit=500, episodes=10))

    # -------------------------------------------------------------- an engine without a box

    def engine(
        self, *, channel_kind: str = "dm", channel_id: str = "c1", channel_name: str = "", logs: list[str] | None = None,
        prompts: Prompts | None = None, **memory: Any,
    ) -> ChatMemory:  # fmt: skip
        init = init_params(
            channel_kind=channel_kind, channel_id=channel_id, channel_name=channel_name, **memory
        )
        sink = logs if logs is not None else []

        async def host_log(level: str, message: str) -> None:
            sink.append(message)

        return ChatMemory(
            init=init, store=self.store(channel_id), client=FakeClient(self.model), host_log=host_log,
            state_dir=self.tmp_path / "engine-state", prompts=prompts,
        )  # fmt: skip

    # -------------------------------------------------------------- a real box in this process

    @asynccontextmanager
    async def box(
        self, *, channel_id: str = "c1", channel_kind: str = "dm", channel_name: str = "",
        responder: dict[str, Any] | None = None, **memory: Any,
    ) -> AsyncIterator[KitBox]:  # fmt: skip
        """``box.program.serve`` in this process, with memory on, talking to the kit's host over a real peer."""

        async def no_sleep(seconds: float) -> None:
            return None

        self.boxes += 1
        state_dir = self.tmp_path / f"box-{self.boxes}"
        state_dir.mkdir(parents=True)
        init = init_params(
            channel_kind=channel_kind, channel_id=channel_id, channel_name=channel_name, responder=responder,
            scopes=self.scopes, **memory,
        )  # fmt: skip
        async with scripted.in_process_box(
            self.host, state_dir, channel_id=channel_id, sleep=no_sleep
        ) as box:
            await box.init(init)
            yield KitBox(box.peer, self, channel_id)


def init_params(
    *,
    channel_kind: str = "dm",
    channel_id: str = "c1",
    channel_name: str = "",
    responder: dict[str, Any] | None = None,
    scopes: SessionScopes | None = DM_SCOPES,
    now: datetime = NOW,
    **memory: Any,
) -> BoxInitParams:
    settings = MemorySettings(**{"enabled": True, "embedder": "hashing", **memory})
    return BoxInitParams(
        protocol=1,
        imp=ImpSpec(
            name=IMP, persona="You are Pip.", responder=ResponderSettings(**{"retry_backoff_s": 0, **(responder or {})}),
            memory=settings,
        ),
        session=SessionInfo(id="s1", channel_id=channel_id, channel_kind=channel_kind, channel_name=channel_name),  # type: ignore[arg-type]
        now=now,
        memory=scopes.session_memory() if scopes is not None else None,
    )  # fmt: skip


def reply_system(call: Call) -> str:
    return call.system


def memory_block(call: Call) -> str:
    """The ``### Memory`` block of a reply call: the end of its turn context (issue 33)."""
    block = memory_block_of(call.body.get("messages") or [])
    assert block, "this reply call carries no memory block"
    return block


Mutator = Callable[[Kit], None]


def facts(
    content: str,
    *,
    author: str = "Ann",
    author_id: str = "u1",
    message_id: str = "m1",
    now: datetime = NOW,
    presence: list[mem.PresenceEntry] | None = None,
    attachments: list[Attachment] | None = None,
) -> Any:
    """The facts ContextBuilding hands ``MemoryEngine.begin`` (for an engine driven without a box)."""
    from box.memory import TurnFacts

    message = Message(
        id=message_id, author=Author(id=author_id, name=author), content=content, created_at=now,
        attachments=attachments or [],
    )  # fmt: skip
    return TurnFacts(message, Framing(mode="respond", reason="dm"), now, presence or [])


def draft(**fields: Any) -> Any:
    """A parsed reply envelope, as ToolExecution hands it to ``next_hop``."""
    from box.common.envelope import Envelope

    return Envelope.model_validate(envelope(**fields))
