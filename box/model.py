"""The box's thin model client: every call is a ``model.request`` to the host's gateway.

The box holds no key and has no network; the request bodies are exactly what
the OpenAI API takes, so the upstream can check them (design.md §3).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from box.envelope import Envelope
from box.protocol import Peer
from box.protocol.models import ModelRequestParams, ModelRequestResult


class ModelCallFailed(Exception):
    """The call produced no usable answer (HTTP error, refusal, malformed output)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class ModelClient:
    peer: Peer

    async def call(self, path: str, body: dict[str, Any], purpose: str) -> ModelRequestResult:
        result = await self.peer.request(
            "model.request", ModelRequestParams(path=path, body=body, purpose=purpose)  # type: ignore[arg-type]
        )
        assert isinstance(result, ModelRequestResult)
        return result


def parse_chat_envelope(result: ModelRequestResult) -> Envelope:
    """Read the envelope out of a chat/completions result; anything off is a failed attempt (ENV-18)."""
    if result.status != 200:
        raise ModelCallFailed(f"model returned HTTP {result.status}", status=result.status)
    try:
        message = result.body["choices"][0]["message"]
    except (KeyError, IndexError, TypeError) as exc:
        raise ModelCallFailed("model response has no message") from exc
    if message.get("refusal"):
        raise ModelCallFailed(f"model refused: {str(message['refusal'])[:200]}")
    content = message.get("content")
    if not isinstance(content, str):
        raise ModelCallFailed("model response has no content")
    try:
        return Envelope.model_validate(json.loads(content))
    except (ValueError, ValidationError) as exc:
        raise ModelCallFailed(f"model output is not a valid envelope: {str(exc)[:200]}") from exc
