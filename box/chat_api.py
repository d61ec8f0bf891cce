"""The reply call on ``/chat/completions``: reading the answer (SPEC-001 ENV-18, ENV-19).

The request body is ``box.common.request_bodies.chat_body`` (the host's doctor sends it too). Whatever comes
back that is not a valid envelope or a tool call — an HTTP error, a refusal, malformed JSON — is a failed
attempt (ENV-18): there is no repair path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from box.common.envelope import Envelope
from box.common.failures import clip, invalid_fields
from box.model import ModelCallFailed, http_failure
from box.protocol.models import ModelRequestResult
from box.tools import ToolCall


def parse_envelope(content: Any) -> Envelope:
    """The envelope out of the model's JSON text; anything off is a failed attempt (ENV-18)."""
    if not isinstance(content, str):
        raise ModelCallFailed("model response has no content")
    try:
        return Envelope.model_validate(json.loads(content))
    except ValidationError as exc:
        raise ModelCallFailed(f"model output is not a valid envelope: {invalid_fields(exc)}") from exc
    except ValueError as exc:
        raise ModelCallFailed(
            f"model output is not a valid envelope: not JSON ({clip(str(exc), 100)})"
        ) from exc


@dataclass
class ChatReply:
    envelope: Envelope | None = None
    calls: list[ToolCall] = field(default_factory=list)
    echo: dict[str, Any] | None = None  # the assistant message to pass back before the tool results


def parse_chat(result: ModelRequestResult, *, tools_attached: bool) -> ChatReply:
    if result.status != 200:
        raise http_failure(result)
    try:
        message = result.body["choices"][0]["message"]
    except (KeyError, IndexError, TypeError) as exc:
        raise ModelCallFailed("model response has no message") from exc
    if not isinstance(message, dict):
        raise ModelCallFailed("model response has no message")
    if message.get("refusal"):
        raise ModelCallFailed(f"model refused: {str(message['refusal'])[:200]}")  # ENV-18
    raw_calls = message.get("tool_calls")
    if raw_calls:
        if not tools_attached:
            raise ModelCallFailed("model called a tool although none was offered")
        calls = [_tool_call(item) for item in raw_calls]
        echo = {
            "role": "assistant",
            "content": message.get("content"),
            "tool_calls": [
                {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in calls
            ],
        }
        return ChatReply(calls=calls, echo=echo)
    return ChatReply(envelope=parse_envelope(message.get("content")))


def _tool_call(item: Any) -> ToolCall:
    try:
        function = item["function"]
        return ToolCall(
            call_id=str(item["id"]), name=str(function["name"]), arguments=str(function["arguments"])
        )
    except (KeyError, TypeError) as exc:
        raise ModelCallFailed("model response has a malformed tool call") from exc


def tool_result_message(call: ToolCall, result: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call.call_id, "content": result}
