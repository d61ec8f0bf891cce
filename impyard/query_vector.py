"""The vector of an operator's text, made as the imp's boxes make theirs (mechanism 30): ``impyard memory search`` and
``remember``, and the console's Memory search, so what they search by compares with what the imp keeps.

With ``[memory] embedder = "gateway"`` (the default) the text goes through a gateway of this host like any box's
call — judged by the policy (purpose ``embedding``), metered against the imp's budget and audited, on the session
channel ``operator:cli`` — with ``"local"`` the host computes it at no cost, and with ``"hashing"`` the local
64-dimension embedder makes it, with no call at all. An assembly module: it builds a gateway (``impyard.host``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import anyio

from box.common.busy import ask_while_busy
from box.common.embedding import (
    EMBEDDINGS_PATH,
    clip_for_embedding,
    embedding_body,
    hashing_vector,
    vector_of,
)
from box.protocol.models import ModelRequestParams, ModelRequestResult
from impyard.backends.base import BoxSpec
from impyard.clock import Clock, SystemClock
from impyard.errors import ImpyardError
from impyard.gateway.broker import UpstreamConfig
from impyard.gateway.core import Gateway
from impyard.gateway.policy import PolicyError, load_policy
from impyard.gateway.surfaces import NoSurface
from impyard.host import build_gateway
from impyard.imps.config import ImpConfig
from impyard.imps.store import ImpStore
from impyard.storage.db import Database

OPERATOR_CHANNEL = "operator:cli"  # the session channel the operator's embedding calls are audited on
EMBED_DEADLINE_S = 30.0  # a busy model API is retried (mechanism 121) for at most this long
NO_KEY = (
    'no model key is configured, and {imp}\'s [memory] embedder is "gateway": export OPENAI_API_KEY=sk-... '
    '(and OPENAI_BASE_URL for another server), or set [memory] embedder = "hashing" in its imp.toml'
)


class NoVector(ImpyardError):
    """The text has no vector: no words, no model key, a broken policy, a refused or failed call (one line)."""


@dataclass
class _ThroughGateway:
    """``box.common.busy.ModelCaller`` for the host itself: a ``model.request`` served by a gateway, as a box's would be."""

    gateway: Gateway
    spec: BoxSpec

    async def call(self, path: str, body: dict[str, Any], purpose: str) -> ModelRequestResult:
        params = ModelRequestParams.model_validate({"path": path, "body": body, "purpose": purpose})
        result = await self.gateway.serve(self.spec, "model.request", params)
        assert isinstance(result, ModelRequestResult)
        return result


def _local(config: ImpConfig, text: str) -> list[float] | None:
    """The vector when no call is needed (``hashing``); None when the gateway must make it. Checks the key."""
    if config.memory.embedder == "hashing":
        vector = hashing_vector(clip_for_embedding(text))
        if vector is None:
            raise NoVector("the text has no words to search or remember by; give some words")
        return vector
    if config.memory.embedder != "local" and not UpstreamConfig.from_env().api_key:  # local needs no key
        raise NoVector(NO_KEY.format(imp=config.name))
    return None


def _policy() -> Any:
    try:
        return load_policy()
    except PolicyError as exc:
        raise NoVector(f"the policy is broken: {exc.problems[0]}") from exc


def embed(config: ImpConfig, db: Database, text: str) -> list[float]:
    """The vector of ``text`` by the imp's configured embedder (blocking: runs its own event loop for a call)."""
    vector = _local(config, text)
    if vector is not None:
        return vector
    return anyio.run(_through_gateway, config, db, text, _policy(), SystemClock())


async def embed_async(config: ImpConfig, db: Database, text: str, clock: Clock) -> list[float]:
    """``embed`` on a running event loop (the console's)."""
    vector = _local(config, text)
    if vector is not None:
        return vector
    return await _through_gateway(config, db, text, _policy(), clock)


async def _through_gateway(
    config: ImpConfig, db: Database, text: str, policy: Any, clock: Clock
) -> list[float]:
    gateway = build_gateway(
        policy=policy, db=db, surface=NoSurface("impyard memory posts nothing"), clock=clock, owners={config.name: config.owners},
        surfaces=(), settle_abandoned=False,  # a running host's calls in flight are not this command's to settle
    )  # fmt: skip
    spec = BoxSpec(
        config.name,
        OPERATOR_CHANNEL,
        ImpStore().path(config.name) / "state",
        run_id=f"cli-{uuid.uuid4().hex}",
    )
    started = anyio.current_time()

    def left() -> float:
        return EMBED_DEADLINE_S - (anyio.current_time() - started)

    # The box's own embedding call, made by the host (mechanisms 30, 63, 121): the same clip, body, busy
    # backoff and answer check as a box's GatewayEmbedder, so the vector compares with the imp's own.
    clipped = clip_for_embedding(text)
    vector: list[float] | None = None
    why: str | None = "the text has no words"  # blank text is not sent: the API refuses empty input
    try:
        if clipped.strip():
            memory = ImpStore().box_memory(
                config
            )  # the model and length its boxes ask for (local: the host's)
            dimensions = memory.dimensions
            body = embedding_body(memory.embedding_model, clipped, dimensions)
            asked = await ask_while_busy(
                _ThroughGateway(gateway, spec),
                EMBEDDINGS_PATH,
                body,
                "embedding",
                sleep=anyio.sleep,
                deadline=left,
            )
            vector, why = vector_of(asked, dimensions)
    finally:
        await gateway.aclose()
    if vector is None:
        raise NoVector(f"the text could not be embedded ({why}); nothing was changed")
    return vector
