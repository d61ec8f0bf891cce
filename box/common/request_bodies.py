"""The reply call's request bodies on ``/chat/completions`` and ``/responses`` (SPEC-001 ENV-19, -21, -22, -23).

The box sends them (``box.tool_loop``; reading the answers is ``box.chat_api`` and ``box.responses_api``);
``impyard doctor`` sends the same bodies to check that the configured model takes them. Every call carries
the strict ``envelope`` response format (ENV-19), tool-followup calls included: the fields this imp is asked
and the bounds its server takes (issue 38, ``sent_schema``).

Each body carries only what the chosen model takes (issue 16, ``box.common.model_profiles``): no reasoning
effort for a model that does not reason, the nearest effort it takes otherwise (``none`` is gpt-5's
``minimal``); ``temperature`` only where the model takes it with that effort; the output cap under the key it
takes; the envelope schema with or without ``strict`` as the server takes it; and images as a text note for
a model that cannot see them.

* **chat/completions**: the schema in ``response_format``; ``reasoning_effort`` only when function tools are
  attached (ENV-21), a tool-less call never carries one.
* **Responses API** (``use_responses_api``): the schema in ``text.format``; tools in the flat Responses shape;
  ``reasoning`` carries the configured effort (tools and reasoning together are fine here, ENV-22). The tool
  loop is stateless: ``store: false`` and ``include: ["reasoning.encrypted_content"]`` (ENV-23), the latter
  only for a reasoning model (one that does not reason has no reasoning to keep).

``prompt_text`` and ``shared_prefix_share`` measure what a prompt cache can serve of a request (issue 33: the reply
is laid out stable-first, ``box.context``); the tests and the benchmark use them on captured bodies.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

from box.common.envelope import ENVELOPE_NAME, EnvelopeAsks, envelope_schema
from box.common.model_profiles import ModelProfile, profile_for
from box.common.schema_bounds import fit_schema
from box.common.structured import with_schema_in_prompt
from box.protocol.models import ResponderSettings

CHAT_PATH = "/chat/completions"
RESPONSES_PATH = "/responses"
INCLUDE = ["reasoning.encrypted_content"]  # ENV-23
# In place of an image part, for a model that cannot see (issue 16): the model learns one was there.
UNSEEN_IMAGE_NOTE = "[an image was attached here; this model cannot see images]"


class FunctionTool(Protocol):
    """A function tool as each API lists it (``box.tools.Tool``)."""

    def chat_shape(self) -> dict[str, Any]: ...

    def responses_shape(self) -> dict[str, Any]: ...


def chat_body(
    settings: ResponderSettings,
    model: str,
    messages: list[dict[str, Any]],
    tools: Sequence[FunctionTool],
    *,
    json_object: bool = False,
) -> dict[str, Any]:
    """``json_object``: the server refused ``json_schema`` earlier in this box (issue 38, box.common.structured)."""
    profile = profile_for(model, settings.server)  # issue 16: only what this model takes
    if json_object:
        profile = replace(profile, structured="json_object")
    if profile.structured == "json_object":  # issue 38: the schema in the prompt, the answer checked as ever
        messages = with_schema_in_prompt(messages, sent_schema(settings, profile))
    body: dict[str, Any] = {
        "model": model,
        "messages": messages if profile.vision else chat_without_images(messages),
        profile.output_cap_key: settings.max_tokens,
        "response_format": profile.response_format(ENVELOPE_NAME, sent_schema(settings, profile)),  # ENV-19
    }
    # ENV-21: an effort only when tools are attached (and the model reasons at all).
    effort = profile.effort_for(settings.reasoning_effort) if tools else None
    if settings.temperature is not None and profile.takes_temperature(effort):
        body["temperature"] = settings.temperature
    if tools:
        body["tools"] = [fit_tool(tool.chat_shape(), profile) for tool in tools]
        if effort is not None:
            body["reasoning_effort"] = effort
    return body


def sent_schema(settings: ResponderSettings, profile: ModelProfile) -> dict[str, Any]:
    """The envelope schema this imp sends (issue 38): the fields it is asked (``EnvelopeAsks``), with the
    bound keywords its server takes (``box.common.schema_bounds``). The same bytes on every call."""
    return fit_schema(envelope_schema(EnvelopeAsks.of(settings)), profile.schema_dialect)


def fit_tool(shape: dict[str, Any], profile: ModelProfile) -> dict[str, Any]:
    """A function tool (either API's shape) with the bounds of its parameters as the server takes them."""
    function = shape.get("function")
    if isinstance(function, dict) and isinstance(function.get("parameters"), dict):  # chat/completions
        return {
            **shape,
            "function": {
                **function,
                "parameters": fit_schema(function["parameters"], profile.schema_dialect),
            },
        }
    if isinstance(shape.get("parameters"), dict):  # the Responses API: flat
        return {**shape, "parameters": fit_schema(shape["parameters"], profile.schema_dialect)}
    return shape


def chat_without_images(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
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


def responses_body(
    settings: ResponderSettings,
    model: str,
    instructions: str,
    items: list[dict[str, Any]],
    tools: Sequence[FunctionTool],
) -> dict[str, Any]:
    profile = profile_for(model, settings.server)  # issue 16: only what this model takes
    effort = profile.effort_for(settings.reasoning_effort)
    body: dict[str, Any] = {
        "model": model,
        "instructions": instructions,
        "input": items if profile.vision else input_without_images(items),
        "max_output_tokens": settings.max_tokens,
        "text": profile.text_format(ENVELOPE_NAME, sent_schema(settings, profile)),
        "store": False,  # ENV-23: nothing retained server-side
    }
    if effort is not None:
        body["reasoning"] = {"effort": effort}  # ENV-22: allowed with tools on this API
        body["include"] = list(INCLUDE)  # ENV-23: a model that does not reason has no reasoning to keep
    if settings.temperature is not None and profile.takes_temperature(effort):
        body["temperature"] = settings.temperature
    if tools:
        body["tools"] = [fit_tool(tool.responses_shape(), profile) for tool in tools]
    return body


def input_without_images(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items with each ``input_image`` part replaced by ``UNSEEN_IMAGE_NOTE`` (a model without vision)."""
    out = []
    for item in items:
        content = item.get("content")
        if isinstance(content, list):
            content = [
                {"type": "input_text", "text": UNSEEN_IMAGE_NOTE}
                if isinstance(part, dict) and part.get("type") == "input_image"
                else part
                for part in content
            ]
            item = {**item, "content": content}
        out.append(item)
    return out


# ------------------------------------------------------------------ the prompt cache (issue 33)


def prompt_text(body: dict[str, Any]) -> str:
    """A request body's prompt as one canonical string, in the order the model reads it: the system text (a chat
    body's first message, or a Responses body's ``instructions``), then the messages or input items. Two requests
    whose prompt texts share a prefix share that prefix upstream too (the provider's prompt cache keys on it)."""
    if isinstance(body.get("messages"), list):
        parts: list[Any] = list(body["messages"])
    else:
        parts = [{"role": "system", "content": body.get("instructions") or ""}, *(body.get("input") or [])]
    return json.dumps(parts, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def shared_prefix_share(previous: str, current: str) -> float:
    """The share of ``current`` (0.0-1.0, by UTF-8 bytes) that is byte-identical, from its start, to ``previous``:
    what of a request a prompt cache warmed by the previous one can serve (issue 33). 0.0 for an empty ``current``."""
    now, before = current.encode("utf-8", "surrogatepass"), previous.encode("utf-8", "surrogatepass")
    if not now:
        return 0.0
    limit = min(len(now), len(before))
    low, high = 0, limit  # the longest common prefix, by halving (bytes compare in C)
    while low < high:
        middle = (low + high + 1) // 2
        if now[:middle] == before[:middle]:
            low = middle
        else:
            high = middle - 1
    return low / len(now)
