"""The reply call on ``/chat/completions``: request bodies and reading the answer (SPEC-001 ENV-18, -19, -21).

Every call carries the strict ``envelope`` response format (ENV-19), tool-followup calls
included. With function tools attached the call also carries ``reasoning_effort`` from the
settings (ENV-21); a tool-less call never does. Whatever comes back that is not a valid
envelope or a tool call — an HTTP error, a refusal, malformed JSON — is a failed attempt
(ENV-18): there is no repair path.

Each body carries only what the chosen model takes (issue 16, ``box.model_profiles``): no
``reasoning_effort`` for a model that does not reason, the nearest effort it takes otherwise
(``none`` is gpt-5's ``minimal``); ``temperature`` only where the model takes it with that
effort; the output cap under the key it takes; the envelope schema with or without ``strict``
as the server takes it; and images as a text note for a model that cannot see them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from box.envelope import ENVELOPE_NAME, ENVELOPE_SCHEMA, Envelope
from box.model import ModelCallFailed, http_failure
from box.model_profiles import profile_for
from box.protocol.models import ModelRequestResult, ResponderSettings
from box.tools import Tool, ToolCall

PATH = "/chat/completions"
# In place of an image part, for a model that cannot see (issue 16): the model learns one was there.
UNSEEN_IMAGE_NOTE = "[an image was attached here; this model cannot see images]"


def chat_body(
    settings: ResponderSettings, model: str, messages: list[dict[str, Any]], tools: list[Tool]
) -> dict[str, Any]:
    profile = profile_for(model, settings.server)  # issue 16: only what this model takes
    body: dict[str, Any] = {
        "model": model,
        "messages": messages if profile.vision else without_images(messages),
        profile.output_cap_key: settings.max_tokens,
        "response_format": profile.response_format(ENVELOPE_NAME, ENVELOPE_SCHEMA),  # ENV-19, on every call
    }
    # ENV-21: an effort only when tools are attached (and the model reasons at all).
    effort = profile.effort_for(settings.reasoning_effort) if tools else None
    if settings.temperature is not None and profile.takes_temperature(effort):
        body["temperature"] = settings.temperature
    if tools:
        body["tools"] = [tool.chat_shape() for tool in tools]
        if effort is not None:
            body["reasoning_effort"] = effort
    return body


def without_images(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages with each image part replaced by ``UNSEEN_IMAGE_NOTE`` (a model without vision)."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = [
                {"type": "text", "text": UNSEEN_IMAGE_NOTE} if part.get("type") == "image_url" else part
                for part in content
            ]
            message = {**message, "content": content}
        out.append(message)
    return out


def parse_envelope(content: Any) -> Envelope:
    """The envelope out of the model's JSON text; anything off is a failed attempt (ENV-18)."""
    if not isinstance(content, str):
        raise ModelCallFailed("model response has no content")
    try:
        return Envelope.model_validate(json.loads(content))
    except (ValueError, ValidationError) as exc:
        raise ModelCallFailed(f"model output is not a valid envelope: {str(exc)[:200]}") from exc


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
