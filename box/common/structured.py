"""A server that refuses ``json_schema``: ``json_object`` with the schema in the prompt instead (issue 38).

Some OpenAI-compatible servers take ``response_format {"type": "json_object"}`` but not ``json_schema``:
llama-cpp-python's own server (``python -m llama_cpp.server``) validates ``response_format.type`` against
``"text" | "json_object"`` and, since its error handler wraps every exception, answers HTTP 500 with the
validation error as the message (llama.cpp issue #23463); older llama.cpp servers said ``response_format type
must be one of "text" or "json_object", but got: json_schema`` (500, llama.cpp #9522). That is no transient
fault: the same request is refused the same way, so it is never retried as one.

* ``refuses_json_schema``: such an answer — HTTP 400, 422 or 500 whose error message names ``json_schema``
  (or ``response_format`` with ``json_object``) — to a request that asked for ``json_schema``.
* ``with_schema_in_prompt``: the messages with the schema said in the system prompt, for a ``json_object``
  call (which also needs the word "JSON" in the prompt on OpenAI-shaped servers).
* ``JsonSchemaRefused``: what the box remembers, for the rest of the box, once a server refused it: every
  later call goes as ``json_object`` at once (the reply's, and the memory's).

The answer is checked as every answer is (the envelope model, the memory's tolerant parser): the schema in
the prompt asks, the box's own validation decides.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

JSON_SCHEMA_REFUSAL_STATUSES: Final = frozenset({400, 422, 500})
MAX_MESSAGE_CHARS = 4000  # of the upstream's error message, read for the words below


def refuses_json_schema(status: int, body: Any, request: dict[str, Any] | None = None) -> bool:
    """Whether an answer says the server does not take ``response_format`` ``json_schema`` (issue 38).

    ``request``: the body that was sent, when known; a request that asked for no ``json_schema`` cannot have
    been refused for it."""
    if status not in JSON_SCHEMA_REFUSAL_STATUSES:
        return False
    if request is not None and not _asked_json_schema(request):
        return False
    text = _error_text(body).lower()
    if "json_schema" in text:
        return True
    return "response_format" in text and "json_object" in text


def _asked_json_schema(request: dict[str, Any]) -> bool:
    fmt = request.get("response_format")
    return isinstance(fmt, dict) and fmt.get("type") == "json_schema"


def _error_text(body: Any) -> str:
    """The error's message (and code/param) out of an error body, or the body's text."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        parts = [str(error.get(key) or "") for key in ("message", "code", "param")]
        return " ".join(parts)[:MAX_MESSAGE_CHARS]
    if isinstance(error, str):
        return error[:MAX_MESSAGE_CHARS]
    if isinstance(body, str):
        return body[:MAX_MESSAGE_CHARS]
    return ""


def schema_note(schema: dict[str, Any]) -> str:
    """The prompt's words that ask for the schema a ``json_schema`` format would have enforced."""
    return (
        "Answer with one JSON object only, no text before or after it, that follows this JSON schema "
        "(every property present; null where it does not apply):\n"
        + json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    )


def with_schema_in_prompt(messages: list[dict[str, Any]], schema: dict[str, Any]) -> list[dict[str, Any]]:
    """``messages`` with ``schema_note`` added to the first system message (a new one first where there is
    none: some chat templates refuse a system message anywhere but first)."""
    note = schema_note(schema)
    out = list(messages)
    for index, message in enumerate(out):
        if message.get("role") in ("system", "developer"):
            content = message.get("content")
            if isinstance(content, str):
                out[index] = {**message, "content": f"{content}\n\n{note}"}
                return out
            if isinstance(content, list):
                out[index] = {**message, "content": [*content, {"type": "text", "text": note}]}
                return out
    return [{"role": "system", "content": note}, *out]


@dataclass
class JsonSchemaRefused:
    """Issue 38: once the server refused ``json_schema``, every later call of this box asks ``json_object``."""

    refused: bool = False

    def note(self, status: int, body: Any, request: dict[str, Any] | None = None) -> bool:
        """Remember a refusal of ``json_schema``; True when this answer was one."""
        if refuses_json_schema(status, body, request):
            self.refused = True
            return True
        return False
