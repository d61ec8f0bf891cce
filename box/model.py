"""The box's thin model client: every call is a ``model.request`` to the host's gateway.

The box holds no key and has no network; the request bodies are exactly what
the OpenAI API takes, so the upstream can check them (docs/protocol.md). Nothing is
ever cached: every call goes to the host (ENV-16).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from box.common.attempts import retry_after_of
from box.common.failures import clip
from box.common.structured import JsonSchemaRefused, refuses_json_schema
from box.protocol import Peer
from box.protocol.models import ModelRequestParams, ModelRequestResult

# Issue 16: statuses that say the request itself is wrong (an unsupported parameter or value, a schema the
# model does not take, a model the server does not serve): the same request is refused the same way, so
# it is not retried as if the upstream were having trouble.
REFUSED_STATUSES = frozenset({400, 404, 413, 422})
MAX_DETAIL_CHARS = 200  # of the upstream's error message, cut between words (issue 38)
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
        schema_refused: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.refused = refused
        self.cause = cause
        self.schema_refused = (
            schema_refused  # issue 38: the server takes no json_schema (box.common.structured)
        )


@dataclass
class ModelClient:
    peer: Peer
    end_with_box: bool = False  # issue 38: a local server's calls end with the box (ModelRequestParams)
    default_timeout_s: float | None = None  # issue 38: a call's limit where its caller names none
    # Issue 38: the server refused json_schema once; the reply's and the memory's calls share what was learnt.
    structured: JsonSchemaRefused = field(default_factory=JsonSchemaRefused)

    async def call(
        self, path: str, body: dict[str, Any], purpose: str, *, timeout_s: float | None = None
    ) -> ModelRequestResult:
        """``timeout_s``: when the caller gives the call up; the host ends the upstream request then (issue 38)."""
        # ENV-16: straight to the host every time; there is no response cache, on disk or in memory.
        params = ModelRequestParams(
            path=path,  # type: ignore[arg-type]
            body=body,
            purpose=purpose,
            timeout_s=timeout_s if timeout_s is not None else self.default_timeout_s,
            end_with_box=self.end_with_box,
        )
        result = await self.peer.request("model.request", params)
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


def http_failure(result: ModelRequestResult, request: dict[str, Any] | None = None) -> ModelCallFailed:
    """``request``: the body sent, when known (a refusal of ``json_schema`` is told only for a call that asked
    for it, issue 38)."""
    detail = ""
    if isinstance(result.body, dict) and isinstance(result.body.get("error"), dict):
        detail = f": {clip(str(result.body['error'].get('message', '')), MAX_DETAIL_CHARS)}"
    if refuses_json_schema(result.status, result.body, request):
        # Issue 38: not transient, whatever its status (llama-cpp-python says it with a 500).
        return ModelCallFailed(
            f"model returned HTTP {result.status} (json_schema_unsupported){detail}",
            status=result.status,
            refused=True,
            cause="json_schema_unsupported",
            schema_refused=True,
        )
    refused = result.status in REFUSED_STATUSES
    cause = refusal_cause(result.body) if refused else None
    return ModelCallFailed(
        f"model returned HTTP {result.status}{f' ({cause})' if cause else ''}{detail}",
        status=result.status,
        retry_after=retry_after_of(result),
        refused=refused,
        cause=cause,
    )
