"""The box's thin model client: every call is a ``model.request`` to the host's gateway.

The box holds no key and has no network; the request bodies are exactly what
the OpenAI API takes, so the upstream can check them (docs/protocol.md). Nothing is
ever cached: every call goes to the host (ENV-16).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from box.common.attempts import retry_after_of
from box.protocol import Peer
from box.protocol.models import ModelRequestParams, ModelRequestResult

# Issue 16: statuses that say the request itself is wrong (an unsupported parameter or value, a schema the
# model does not take, a model the server does not serve): the same request is refused the same way, so
# it is not retried as if the upstream were having trouble.
REFUSED_STATUSES = frozenset({400, 404, 413, 422})
MAX_CAUSE_CHARS = 64  # the upstream's error code and param, as told to the user (box.failures)


class ModelCallFailed(Exception):
    """The call produced no usable answer (HTTP error, refusal, malformed output): a failed attempt.

    ``refused``: the upstream refused the request as written (``REFUSED_STATUSES``); retrying cannot help.
    ``cause``: what it refused, from its error body (``unsupported_parameter: reasoning_effort``), if it said.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        refused: bool = False,
        cause: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.refused = refused
        self.cause = cause


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


def refusal_cause(body: Any) -> str | None:
    """``code: param`` out of an OpenAI-shaped error body (``unsupported_parameter: reasoning_effort``)."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None
    words = [
        str(error[key])[:MAX_CAUSE_CHARS] for key in ("code", "param") if isinstance(error.get(key), str)
    ]
    return ": ".join(words) or None


def http_failure(result: ModelRequestResult) -> ModelCallFailed:
    detail = ""
    if isinstance(result.body, dict) and isinstance(result.body.get("error"), dict):
        detail = f": {str(result.body['error'].get('message', ''))[:200]}"
    refused = result.status in REFUSED_STATUSES
    cause = refusal_cause(result.body) if refused else None
    return ModelCallFailed(
        f"model returned HTTP {result.status}{f' ({cause})' if cause else ''}{detail}",
        status=result.status,
        retry_after=retry_after_of(result),
        refused=refused,
        cause=cause,
    )
