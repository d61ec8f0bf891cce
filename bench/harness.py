"""What the scenarios share: the plan, the fake model, imps, backends, a timing surface, and the baseline box."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import anyio
from pydantic import BaseModel

from bench.env import ROOT
from bench.stats import percentile
from box.protocol.history import HistoryCommitParams, HistoryCommitResult, HistoryLineView, HistoryLoadResult
from box.protocol.models import (
    Author,
    BoxInitParams,
    DeliverParams,
    DiscordSendParams,
    DiscordSendResult,
    Framing,
    HistoryEntry,
    Message,
    ModelRequestParams,
    ModelRequestResult,
    SessionInfo,
)
from impyard.backends import BoxBackend, BoxHost, BoxSpec, QuietHost, RunningBox
from impyard.backends.docker import DockerBackend, box_user
from impyard.conversation.pipeline import Inbound
from impyard.conversation.sessions import SessionKey
from impyard.gateway.broker import ModelBroker, UpstreamConfig, encode_body
from impyard.gateway.surfaces import Post, RecordingSurface
from impyard.imps.store import ImpStore
from impyard.runtime import Runtime, open_runtime
from testing.inprocess import InProcessBackend

MODES = ("warm", "cold")  # [sessions] mode; cold = a fresh box per message
PERSONA = "You are Pip, a friendly imp who answers briefly."
TURN_MODEL_LATENCY_S = 0.020  # the scripted model's fixed answer time in the turn scenarios
REPLY_TIMEOUT_S = 60.0
HISTORY_SENT = 50  # what the host sends as `recent` (impyard.conversation.history.DEFAULT_RECENT)


@dataclass(frozen=True)
class Plan:
    """Sample counts: the full run aims at a few minutes on 2 cores; --quick at seconds."""

    warm_samples: int = 300
    cold_samples: dict[str, int] = field(default_factory=lambda: {"docker": 20, "runsc": 20, "process": 20})
    warm_in_cold_scenario: int = 40
    burst_messages: int = 20
    burst_reps: int = 5
    fanout_levels: dict[str, tuple[int, ...]] = field(
        default_factory=lambda: {"process": (1, 10, 50), "docker": (1, 10, 50)}
    )
    fanout_messages: int = 15
    gateway_samples: int = 500
    judge_samples: int = 20_000
    ledger_reservations: int = 100
    memory_sizes: tuple[int, ...] = (1_000, 10_000, 100_000)  # records (one episode each) in the recall store
    memory_searches: int = 200  # timed memory.search round trips per size
    memory_turns: int = 40  # warm turns each, memory on and memory off
    memory_turn_records: int = 1_000  # what the memory-on imp remembers of the person before the first turn
    night_sizes: tuple[int, ...] = (10_000, 100_000)  # records an imp remembers when it sleeps (issue 15)
    memory_days: int = 30  # simulated days of the held-out month of facts (issue 32)
    hosts_sessions: int = 20  # warm channel sessions, split among the hosts (issue 21)
    hosts_messages: int = 15  # messages each
    ledger_workers: int = 8  # reserving at once for one imp
    ledger_fit: int = 500  # reservations the imp's day has room for
    settle_s: float = 20.0  # how long a scenario waits for a quiet machine before it starts

    @classmethod
    def quick(cls) -> Plan:
        return cls(
            warm_samples=5,
            cold_samples={"docker": 2, "runsc": 2, "process": 2},
            warm_in_cold_scenario=3,
            burst_reps=1,
            fanout_levels={"process": (1, 3), "docker": (1, 2)},
            fanout_messages=2,
            gateway_samples=10,
            judge_samples=200,
            ledger_reservations=100,
            memory_sizes=(200, 2_000),
            memory_searches=20,
            memory_turns=5,
            memory_turn_records=100,
            night_sizes=(300, 3_000),
            memory_days=3,
            hosts_sessions=4,
            hosts_messages=3,
            ledger_workers=4,
            ledger_fit=40,
            settle_s=1.0,
        )


class Progress(Protocol):
    def phase(self, description: str, total: int) -> None: ...

    def advance(self, steps: int = 1) -> None: ...


@dataclass
class Context:
    plan: Plan
    progress: Progress
    backends: dict[str, BoxBackend]  # name -> backend; docker (runc) and runsc only where they can run

    def core_backends(self) -> list[str]:
        """The backends every scenario measures; the runtime variants (runsc) only have cold start and warm
        turn (issue 22)."""
        return [name for name in self.backends if name not in RUNTIME_VARIANTS]


# Docker under another OCI runtime than runc: a backend of its own in the benchmark (issue 22).
RUNTIME_VARIANTS = ("runsc",)
LABELS = {"docker": "docker (runc)", "runsc": "docker (runsc)"}


def label(name: str) -> str:
    """A backend as the table names it: Docker's two runtimes apart."""
    return LABELS.get(name, name)


@dataclass
class NamedBackend:
    """A backend under another name: each benchmark backend gets its own imps and state dirs (``imp_for``),
    so Docker under runsc is not Docker under runc."""

    inner: BoxBackend
    name: str

    def open(self, spec: BoxSpec, host: BoxHost) -> AbstractAsyncContextManager[RunningBox]:
        return self.inner.open(spec, host)


def docker_of(backend: BoxBackend) -> DockerBackend | None:
    """The Docker backend behind a (named) benchmark backend, or None."""
    inner = backend.inner if isinstance(backend, NamedBackend) else backend
    return inner if isinstance(inner, DockerBackend) else None


def bare_run_argv(docker: DockerBackend) -> list[str]:
    """A bare ``docker run`` of the box image under the backend's runtime: no box program, no lockdown
    beyond what every box has (no network, read-only root, non-root); Python starts and exits. The floor a
    cold box is measured against (issue 22)."""
    return [
        "docker", "run", "--rm", "--runtime", docker.runtime, "--network", "none", "--read-only",
        "--user", box_user(), "--entrypoint", "python3", docker.image, "-c", "pass",
    ]  # fmt: skip


# ------------------------------------------------------------------ the scripted model


@dataclass(frozen=True)
class Upstream:
    base_url: str
    api_key: str

    def config(self) -> UpstreamConfig:
        return UpstreamConfig(base_url=self.base_url, api_key=self.api_key)


@contextmanager
def fake_model(latency_s: float, *, talk: bool = False) -> Iterator[Upstream]:
    """The fake OpenAI in its own process; the host's gateway finds it through OPENAI_BASE_URL/OPENAI_API_KEY.
    ``talk``: replies of ordinary length instead of "ok" (``bench.fake_model.TALK_REPLY``)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.fake_model", repr(latency_s), *(["talk"] if talk else [])],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        base_url, api_key = proc.stdout.readline().split()
        os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"] = base_url, api_key
        yield Upstream(base_url, api_key)
    finally:
        os.environ.pop("OPENAI_BASE_URL", None)
        os.environ.pop("OPENAI_API_KEY", None)
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------ imps, messages, surfaces


def imp_for(backend: str, mode: str = "warm") -> str:
    """One imp per backend and mode, each with its own state dir: a Docker box (uid 10001) cannot use files
    that a process-backend box, running as the host's user, left in a shared one."""
    return f"{mode}-{backend}"


SPARE_MODE = "spare"  # issue 37: a warm imp that keeps one spare box; every other bench imp keeps none


def add_imps(backends: Sequence[str]) -> None:
    store = ImpStore()
    for backend in backends:
        for mode in MODES:  # no spares: a cold box is started for each conversation, as the cold rows measure
            store.add(imp_for(backend, mode), PERSONA, sessions={"mode": mode}, box={"spares": 0})
        store.add(imp_for(backend, SPARE_MODE), PERSONA, sessions={"mode": "warm"}, box={"spares": 1})


def message(channel_id: str, n: int) -> Message:
    return Message(
        id=f"{channel_id}-m{n}", author=Author(id="u1", name="ann"),
        content=f"hello pip, this is message {n}: how is your day going?", created_at=datetime.now(UTC),
    )  # fmt: skip


def dm(channel_id: str, n: int) -> Inbound:
    """A direct message: always wakes, always framed respond, the channel trusted."""
    return Inbound(
        surface="discord",
        channel_id=channel_id,
        channel_kind="dm",
        message=message(channel_id, n),
        channel_name=channel_id,
    )


@dataclass
class TimingSurface(RecordingSurface):
    """Records when each reply lands, keyed by the message it answers."""

    replied_at: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    _landed: dict[str, anyio.Event] = field(default_factory=dict)

    async def send(self, post: Post) -> list[str]:
        ids = await super().send(replace(post, imp=""))
        if post.reply_to is not None:
            self.replied_at[post.reply_to].append(time.perf_counter())
            self._landed.setdefault(post.reply_to, anyio.Event()).set()
        return ids

    async def reply_to(self, message_id: str, timeout_s: float = REPLY_TIMEOUT_S) -> float:
        """When the first reply to ``message_id`` landed (perf_counter seconds); TimeoutError if none came."""
        with anyio.fail_after(timeout_s):
            await self._landed.setdefault(message_id, anyio.Event()).wait()
        return self.replied_at[message_id][0]


# ------------------------------------------------------------------ the host under test


@dataclass
class Host:
    """The full host assembly of ``impyard chat`` (history, wake, framing, sessions, gateway) for one imp."""

    runtime: Runtime
    surface: TimingSurface
    imp: str
    routing_ms: list[float] = field(default_factory=list)  # receive(): clean, persist, wake, frame, hand over
    ended_ms: list[float] = field(default_factory=list)  # message in → the turn's outcome recorded

    async def receive(self, inbound: Inbound) -> str:
        return await self.runtime.conversations.receive(self.imp, inbound)

    async def turn(self, inbound: Inbound) -> float:
        """Message in → reply on the surface, in ms; returns once the turn has fully ended."""
        message_id = inbound.message.id
        start = time.perf_counter()
        routed = await self.receive(inbound)
        self.routing_ms.append((time.perf_counter() - start) * 1000)
        if routed not in ("started", "queued"):
            raise RuntimeError(f"message {message_id} was not delivered: {routed}")
        with anyio.fail_after(REPLY_TIMEOUT_S):
            await self.runtime.conversations.wait_finished(message_id)
        self.ended_ms.append((time.perf_counter() - start) * 1000)
        if not self.surface.replied_at.get(message_id):
            outcome = await self.runtime.db.run(
                self.runtime.history.outcome, self.imp, inbound.channel_id, message_id
            )
            raise RuntimeError(f"message {message_id} got no reply: the turn ended {outcome}")
        return (self.surface.replied_at[message_id][0] - start) * 1000

    async def session_gone(self, channel_id: str) -> None:
        """Until the channel's session has ended: its box is closed."""
        session = self.runtime.sessions.sessions.get(SessionKey(self.imp, channel_id))
        if session is not None:
            with anyio.fail_after(REPLY_TIMEOUT_S):
                await session.done.wait()


@asynccontextmanager
async def host(backend: BoxBackend, mode: str = "warm") -> AsyncIterator[Host]:
    imp = imp_for(backend.name, mode)
    surface = TimingSurface()
    async with open_runtime([imp], surface, backends={imp: backend}, surfaces=("discord",)) as runtime:
        yield Host(runtime, surface, imp)


@dataclass
class TimedBackend:
    """Wraps a backend to note, per box, when it was asked for, spawned, and answered ``box.init``."""

    inner: BoxBackend
    starts: list[dict[str, float]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.inner.name

    @asynccontextmanager
    async def open(self, spec: BoxSpec, host: BoxHost) -> AsyncIterator[RunningBox]:
        asked = time.perf_counter()
        async with self.inner.open(spec, host) as box:
            spawned = time.perf_counter()
            init = box.init

            async def timed_init(params: BoxInitParams, *, timeout: float = 30.0) -> Any:
                result = await init(params, timeout=timeout)
                self.starts.append({"asked": asked, "spawned": spawned, "initialised": time.perf_counter()})
                return result

            box.init = timed_init  # type: ignore[method-assign]
            yield box


# ------------------------------------------------------------------ the baseline: the same box code, in-process


@dataclass
class InProcessBox:
    """The box program on the in-process backend (``testing.inprocess``: the same program, in this process, on
    in-memory streams), with a minimal host: no session manager, no subprocess, no policy, ledger or audit.
    ``model.request`` goes straight to the fake model through the same broker; ``discord.send`` lands on the
    surface directly."""

    box: RunningBox
    surface: TimingSurface
    channel_id: str
    imp_name: str
    history: list[HistoryEntry] = field(default_factory=list)

    async def turn(self, n: int) -> float:
        msg = message(self.channel_id, n)
        self.history.append(
            HistoryEntry(id=msg.id, author=msg.author, content=msg.content, created_at=msg.created_at)
        )
        framing = Framing(mode="respond", reason="dm")
        params = DeliverParams(
            message=msg, framing=framing, recent=self.history[-HISTORY_SENT:], now=datetime.now(UTC)
        )
        start = time.perf_counter()
        await self.box.deliver(params, timeout=REPLY_TIMEOUT_S)
        landed = await self.surface.reply_to(msg.id, timeout_s=1)
        reply = self.surface.sent[-1]
        self.history.append(
            HistoryEntry(
                id=reply.message_ids[0], author=Author(id=f"imp:{self.imp_name}", name=self.imp_name, bot=True),
                content=reply.content, created_at=datetime.now(UTC), from_imp=True,
            )
        )  # fmt: skip
        return (landed - start) * 1000


@dataclass
class MinimalHost(QuietHost):
    """The baseline's host side: the model through the broker, sends onto the surface, the box's own lines in
    memory (the host keeps them, issue 22); stages and logs dropped."""

    broker: ModelBroker
    surface: TimingSurface
    kept: list[HistoryLineView] = field(default_factory=list)

    async def serve(self, spec: BoxSpec, method: str, params: BaseModel) -> BaseModel | None:
        if method == "model.request":
            assert isinstance(params, ModelRequestParams)
            response = await self.broker.call(params.path, encode_body(params.body), params.purpose)
            return ModelRequestResult(status=response.status, body=response.body, headers=response.headers)
        if method == "discord.send":
            assert isinstance(params, DiscordSendParams)
            ids = await self.surface.send(
                Post(params.channel_id, params.content, params.reply_to, (), params.kind)
            )
            return DiscordSendResult(status="delivered", message_ids=ids)
        if method == "history.load":
            return HistoryLoadResult(lines=self.kept[-20:])
        if method == "history.commit":
            assert isinstance(params, HistoryCommitParams)
            known = {(line.id, line.role) for line in self.kept}
            fresh = [
                HistoryLineView(**line.model_dump())
                for line in params.lines
                if (line.id, line.role) not in known
            ]
            self.kept.extend(fresh)
            del self.kept[:-20]
            return HistoryCommitResult(stored=len(fresh))
        return None  # turn.stage, log


@asynccontextmanager
async def in_process_box(
    upstream: Upstream, imp: str, channel_id: str, state_dir: Path
) -> AsyncIterator[InProcessBox]:
    """``imp``'s settings and persona, exactly as ``box.init`` carries them to a real box; its own state dir."""
    surface = TimingSurface()
    broker = ModelBroker(upstream.config())
    store = ImpStore()
    init = BoxInitParams(
        protocol=1, imp=store.imp_spec(store.get(imp)),
        session=SessionInfo(id=f"{imp}:{channel_id}", channel_id=channel_id, channel_kind="dm", channel_name=channel_id),
        now=datetime.now(UTC),
    )  # fmt: skip
    spec = BoxSpec(imp, channel_id, state_dir)
    try:
        async with InProcessBackend().open(spec, MinimalHost(broker, surface)) as box:
            await box.init(init, timeout=REPLY_TIMEOUT_S)
            yield InProcessBox(box, surface, channel_id, imp)
    finally:
        await broker.aclose()


def start_split(starts: Sequence[dict[str, float]], replies: Sequence[float]) -> dict[str, float | None]:
    """Median cold-start split (ms): asked → spawned → ``box.init`` answered → first reply landed."""

    def med(values: list[float]) -> float | None:
        return round(percentile(values, 50), 1) if values else None

    pairs = list(zip(starts, replies, strict=False))
    return {
        "spawn_ms": med([(s["spawned"] - s["asked"]) * 1000 for s, _ in pairs]),
        "init_ms": med([(s["initialised"] - s["spawned"]) * 1000 for s, _ in pairs]),
        "first_turn_ms": med([(r - s["initialised"]) * 1000 for s, r in pairs]),
    }


# ------------------------------------------------------------------ results

SCENARIO_KEYS = ("status", "samples", "p50_ms", "p95_ms", "p99_ms", "baseline", "ratio", "targets", "met")


def result(
    stats: dict[str, Any],
    *,
    baseline: dict[str, Any] | None,
    ratio: float | None,
    targets: dict[str, Any],
    met: bool,
    status: str = "ok",
    **detail: Any,
) -> dict[str, Any]:
    """One scenario's JSON: the headline figure's percentiles, its baseline, the ratio, the targets, met."""
    return {
        "status": status, **{key: stats.get(key) for key in ("samples", "p50_ms", "p95_ms", "p99_ms")},
        "baseline": baseline, "ratio": ratio, "targets": targets, "met": met, **detail,
    }  # fmt: skip


def primary(measured: Sequence[str]) -> str:
    """The variant a headline reports: Docker (real use) where it ran, else the process backend."""
    return "docker" if "docker" in measured else measured[0]
