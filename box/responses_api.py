"""The reply call on ``/responses`` behind ``use_responses_api``: the tool loop's items and reading the answer
(SPEC-001 ENV-22, ENV-23, ENV-24).

The request body is ``box.common.request_bodies.responses_body`` (the host's doctor sends it too). The tool
loop is stateless: on a function call the reasoning and function_call output items are passed back as input
*reduced to their input fields* (response-only fields such as ``status`` are refused upstream), followed by
one ``function_call_output`` per call, matched by ``call_id``. A refusal part is a failed attempt (ENV-24),
like malformed output (ENV-18).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from box.chat_api import parse_envelope
from box.common.envelope import Envelope
from box.model import ModelCallFailed, http_failure
from box.protocol.models import ModelRequestResult
from box.tools import ToolCall

# ENV-23: the fields each passed-back item may carry as *input*; anything else is response-only.
INPUT_FIELDS: dict[str, tuple[str, ...]] = {
    "reasoning": ("type", "id", "summary", "encrypted_content"),
    "function_call": ("type", "id", "call_id", "name", "arguments"),
}


def input_items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat-shaped conversation messages as Responses input items (text and image parts renamed)."""
    items = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            content = [_input_part(part) for part in content]
        items.append({"role": message["role"], "content": content})
    return items


def _input_part(part: dict[str, Any]) -> dict[str, Any]:
    if part.get("type") == "image_url":
        return {"type": "input_image", "image_url": part["image_url"]["url"]}
    return {"type": "input_text", "text": part.get("text", "")}


def reduce_item(item: dict[str, Any]) -> dict[str, Any]:
    """ENV-23: an output item as it may be sent back as input."""
    return {key: item[key] for key in INPUT_FIELDS[item["type"]] if key in item}


@dataclass
class ResponsesReply:
    envelope: Envelope | None = None
    calls: list[ToolCall] = field(default_factory=list)
    passback: list[dict[str, Any]] = field(default_factory=list)  # reduced reasoning + function_call items


def parse_responses(result: ModelRequestResult, *, tools_attached: bool) -> ResponsesReply:
    if result.status != 200:
        raise http_failure(result)
    output = result.body.get("output") if isinstance(result.body, dict) else None
    if not isinstance(output, list):
        raise ModelCallFailed("model response has no output")
    items = [item for item in output if isinstance(item, dict)]
    calls = [item for item in items if item.get("type") == "function_call"]
    if calls:
        if not tools_attached:
            raise ModelCallFailed("model called a tool although none was offered")
        try:
            parsed = [ToolCall(str(c["call_id"]), str(c["name"]), str(c["arguments"])) for c in calls]
        except KeyError as exc:
            raise ModelCallFailed("model response has a malformed function call") from exc
        passback = [reduce_item(item) for item in items if item.get("type") in INPUT_FIELDS]
        return ResponsesReply(calls=parsed, passback=passback)
    texts: list[str] = []
    for item in items:
        if item.get("type") != "message":
            continue
        for part in item.get("content") or []:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "refusal":
                raise ModelCallFailed(f"model refused: {str(part.get('refusal'))[:200]}")  # ENV-24
            if part.get("type") == "output_text":
                texts.append(str(part.get("text", "")))
    if not texts:
        raise ModelCallFailed("model response has no output text")
    return ResponsesReply(envelope=parse_envelope("".join(texts)))


def function_call_output(call: ToolCall, result: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call.call_id, "output": result}
