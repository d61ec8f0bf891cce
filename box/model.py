"""The box's thin model client: every call is a ``model.request`` to the host's gateway.

The box holds no key and has no network; the request bodies are exactly what
the OpenAI API takes, so the upstream can check them (docs/protocol.md). Nothing is
ever cached: every call goes to the host (ENV-16).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from box.protocol import Peer
from box.protocol.models import ModelRequestParams, ModelRequestResult


class ModelCallFailed(Exception):
    """The call produced no usable answer (HTTP error, refusal, malformed output): a failed attempt."""

    def __init__(self, message: str, *, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


@dataclass
class ModelClient:
    peer: Peer

    async def call(self, path: str, body: dict[str, Any], purpose: str) -> ModelRequestResult:
        # ENV-16: straight to the host every time; there is no response cache, on disk or in memory.
        result = await self.peer.request(
            "model.request",
            ModelRequestParams(path=path, body=body, purpose=purpose),  # type: ignore[arg-type]
        )
        assert isinstance(result, ModelRequestResult)
        return result


def retry_after_of(result: ModelRequestResult) -> float | None:
    """The upstream's ``retry-after`` header in seconds, if it sent one."""
    value = result.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def http_failure(result: ModelRequestResult) -> ModelCallFailed:
    detail = ""
    if isinstance(result.body, dict) and isinstance(result.body.get("error"), dict):
        detail = f": {str(result.body['error'].get('message', ''))[:200]}"
    return ModelCallFailed(
        f"model returned HTTP {result.status}{detail}",
        status=result.status,
        retry_after=retry_after_of(result),
    )
