"""A loopback fake of the OpenAI HTTP API, for tests and the benchmark (docs/contributing.md).

The real ``openai`` SDK (or any HTTP client) talks to it over 127.0.0.1. It
answers from scripted rules matched by endpoint, by the host's purpose header
and by the structured-output schema name, and records every request it gets::

    with FakeOpenAI() as fake:
        fake.script(envelope(answer="hi"), purpose="reply", times=1)
        fake.script(error(429, "slow down", retry_after=2), path="/embeddings")
        client = openai.OpenAI(base_url=fake.base_url, api_key=fake.api_key, max_retries=0)
        ...
        assert fake.requests_for("/chat/completions")[0].body["model"] == "gpt-5.1"

It is a standard-library ``HTTPServer`` on its own thread, one thread per
connection, HTTP/1.1 keep-alive with Content-Length, so it works the same from
sync and async tests. ``stop()`` closes open keep-alive connections, interrupts
pending delays and joins every thread it started.

Endpoints (all POST, under ``/v1``): ``/chat/completions``, ``/responses``,
``/embeddings``, ``/images/generations``, ``/images/edits`` (multipart). Paths
given to :meth:`FakeOpenAI.script` and :meth:`FakeOpenAI.requests_for` may be
written with or without the ``/v1`` prefix. Streaming (``stream: true``) is
refused with a 400: nothing in impyard streams.

It refuses what the real API refuses, with the real status and error body
(``{"error": {"message", "type", "param", "code"}}``), before any rule is used:
a model it does not serve (404 ``model_not_found``); a body parameter the
endpoint does not take; ``reasoning_effort`` / ``reasoning`` / encrypted
reasoning for a model that does not reason, an effort value the model does not
take; ``temperature`` / ``top_p`` where the model allows none or only the
default; ``max_tokens`` for a reasoning model; function tools with an effort
other than ``none`` on /chat/completions for the models that refuse them
(SPEC-001 ENV-21); a strict ``json_schema`` (format or function parameters)
outside Structured Outputs' subset (every object ``additionalProperties:
false``, every property required, supported keywords only); chat messages out of
shape (a tool call left unanswered); Responses input items out of shape
(response-only fields such as a reasoning item's ``status`` — SPEC-001 ENV-23 —
or a function call without its output). Each refusal is kept on the request
(``request.rejection``, :attr:`FakeOpenAI.rejections`) and logged.

The models it serves are ``OPENAI_MODELS`` (gpt-5.2, gpt-5.1, gpt-5 and its
-mini/-nano, o1, o3, o3-mini, o4-mini, gpt-4.1 and gpt-4o families, the
embedding and image models); dated snapshots (``gpt-4.1-mini-2025-04-14``)
resolve to their family. A test serves another name with
``FakeOpenAI(models={...})`` or :meth:`FakeOpenAI.add_model`::

    fake.add_model("gpt-x", like="gpt-4.1-mini")  # a made-up name, taken like gpt-4.1-mini
    fake.add_model("llama3.2", LOCAL_SERVER_MODEL)  # a local server: only the name is checked
    fake.add_model("qwen", LLAMA_CPP_PYTHON_MODEL)  # llama-cpp-python's server: json_schema refused, HTTP 500

A delayed answer (``slow``, ``latency_s``) watches its connection while it waits: a client that hangs up is
recorded (``request.hung_up``, :attr:`FakeOpenAI.hung_up`), as a local server stops on a closed request.
    fake.add_model("my-reasoner", ModelSpec(efforts=("low", "high"), default_effort="low", max_tokens=False))
"""

from __future__ import annotations

import base64
import dataclasses
import email.message
import hashlib
import http.server
import json
import logging
import select
import selectors
import socket
import socketserver
import struct
import sys
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CHAT_PARAMETERS",
    "DEFAULT_API_KEY",
    "DEFAULT_ENVELOPE",
    "EMBEDDINGS_PARAMETERS",
    "ENDPOINTS",
    "LLAMA_CPP_PYTHON_MODEL",
    "LOCAL_SERVER_MODEL",
    "OPENAI_MODELS",
    "PURPOSE_HEADER",
    "TINY_PNG",
    "TINY_PNG_B64",
    "Delayed",
    "FakeOpenAI",
    "FakeResponse",
    "FormFile",
    "ModelSpec",
    "RecordedRequest",
    "RESPONSES_PARAMETERS",
    "Refusal",
    "Rule",
    "ToolCall",
    "embedding_vector",
    "envelope",
    "error",
    "function_call",
    "refusal",
    "slow",
    "tool_call",
]

# The header the host's gateway adds to every upstream call (docs/protocol.md, model.request `purpose`).
PURPOSE_HEADER = "X-Impyard-Purpose"
DEFAULT_API_KEY = "sk-test-fake"
API_PREFIX = "/v1"
ENDPOINTS = ("/chat/completions", "/responses", "/embeddings", "/images/generations", "/images/edits")
TEXT_ENDPOINTS = ("/chat/completions", "/responses")
DEFAULT_EMBEDDING_DIMENSIONS = 64
MAX_BODY_BYTES = 64 * 1024 * 1024
# Keep-alive connections idle longer than this are closed server-side (a safety net; stop() closes them anyway).
IDLE_CONNECTION_TIMEOUT_S = 120.0
THREAD_JOIN_TIMEOUT_S = 5.0
HANG_UP_POLL_S = 0.02  # how often a delayed answer looks whether its client is still there (issue 38)

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- answers


def envelope(**fields: Any) -> dict[str, Any]:
    """A complete reply envelope (docs/conversation.md): answer "ok", answer_needed true, the rest null/false."""
    base: dict[str, Any] = {
        "answer": "ok",
        "answer_needed": True,
        "channel": None,
        "staff": None,
        "picture": None,
        "picture_count": None,
        "picture_edit": False,
        "hack": False,
        "moment": None,
        "told": None,
        "action": {"type": "none", "text": None},
    }
    unknown = set(fields) - set(base)
    if unknown:
        raise TypeError(f"envelope() got unknown fields: {sorted(unknown)}")
    base.update(fields)
    return base


DEFAULT_ENVELOPE: dict[str, Any] = envelope()


@dataclass(frozen=True)
class FakeResponse:
    """A raw HTTP answer, sent as-is on any endpoint (error injection, odd bodies).

    ``body``: a dict/list is sent as JSON, ``str``/``bytes`` verbatim, ``None`` as an empty body.
    """

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


@dataclass(frozen=True)
class Delayed:
    """An answer sent only after ``delay_s`` seconds (see :func:`slow`)."""

    answer: Any
    delay_s: float


@dataclass(frozen=True)
class Refusal:
    """The model refuses: chat gets ``message.refusal`` with null content; responses a refusal part."""

    text: str


@dataclass(frozen=True)
class ToolCall:
    """A function/tool call; renders as chat ``tool_calls`` or a responses ``function_call`` item.

    ``call_id=None`` gets a fresh id each time it is rendered.
    """

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    call_id: str | None = None

    @property
    def arguments_json(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


_OPENAI_ERROR_KINDS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "unknown_url"),
    405: ("invalid_request_error", "method_not_allowed"),
    409: ("invalid_request_error", "conflict"),
    422: ("invalid_request_error", None),
    429: ("requests", "rate_limit_exceeded"),
}


def _error_body(
    status: int, message: str, *, type: str | None = None, code: str | None = None
) -> dict[str, Any]:
    default_type, default_code = _OPENAI_ERROR_KINDS.get(status, ("server_error", "server_error"))
    return {
        "error": {
            "message": message,
            "type": type or default_type,
            "param": None,
            "code": code if code is not None else default_code,
        }
    }


def error(
    status: int,
    message: str = "",
    *,
    retry_after: float | None = None,
    type: str | None = None,
    code: str | None = None,
) -> FakeResponse:
    """An OpenAI-shaped error response: ``{"error": {"message", "type", "param", "code"}}``.

    ``retry_after`` sets the ``retry-after`` header (seconds; meant for 429 and 503).
    """
    headers: dict[str, str] = {}
    if retry_after is not None:
        headers["retry-after"] = f"{retry_after:g}"
    return FakeResponse(
        status=status,
        body=_error_body(status, message or f"fake error {status}", type=type, code=code),
        headers=headers,
    )


def slow(answer: Any, delay_s: float) -> Delayed:
    """``answer``, sent after ``delay_s`` seconds."""
    return Delayed(answer, delay_s)


def refusal(text: str) -> Refusal:
    return Refusal(text)


def tool_call(
    name: str, arguments: dict[str, Any] | str | None = None, call_id: str | None = None
) -> ToolCall:
    """A tool call answer for either API. A list of them answers with parallel calls."""
    return ToolCall(name, {} if arguments is None else arguments, call_id)


def function_call(
    name: str, arguments: dict[str, Any] | str | None = None, *, call_id: str | None = None
) -> ToolCall:
    """Same as :func:`tool_call` (the responses API calls it a function call)."""
    return tool_call(name, arguments, call_id)


# --------------------------------------------------------------------------- deterministic payloads


def embedding_vector(text: str, dimensions: int = DEFAULT_EMBEDDING_DIMENSIONS) -> list[float]:
    """The unit vector the fake returns for ``text``: a hash of it, exact in float32 (so base64 round-trips)."""
    raw = hashlib.shake_256(text.encode("utf-8")).digest(2 * dimensions)
    values = [(v / 32767.5) - 1.0 for v in struct.unpack(f"<{dimensions}H", raw)]
    norm = sum(v * v for v in values) ** 0.5 or 1.0
    return list(struct.unpack(f"<{dimensions}f", struct.pack(f"<{dimensions}f", *(v / norm for v in values))))


def _tiny_png() -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 6, 0, 0, 0)  # 1x1 RGBA
    pixels = zlib.compress(b"\x00\xff\x80\x00\xff")  # filter byte + one orange pixel
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


TINY_PNG = _tiny_png()
TINY_PNG_B64 = base64.b64encode(TINY_PNG).decode("ascii")


# --------------------------------------------------------------------------- recording


@dataclass(frozen=True)
class FormFile:
    """A file part of a multipart request (``/images/edits``)."""

    filename: str | None
    content_type: str | None
    data: bytes = field(repr=False)

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass
class RecordedRequest:
    """One request as the fake received it.

    ``path`` is the URL path as sent (``/v1/chat/completions``); ``endpoint`` drops the ``/v1``.
    ``body`` is the parsed JSON, or for multipart a dict of field -> str | FormFile (a list when
    a name repeats), or the raw text when it was neither. ``status`` is the status the fake answered.
    ``rejection`` is the error object (``{"message", "type", "param", "code"}``) when the fake refused
    the request as the real API would (an unknown model, a parameter the model does not take, a
    schema strict mode refuses); scripted errors are not rejections.
    """

    path: str
    headers: dict[str, str]
    body: Any
    purpose: str | None
    received_at: float
    method: str = "POST"
    query: str = ""
    raw: bytes = field(default=b"", repr=False)
    status: int | None = None
    rejection: dict[str, Any] | None = None
    hung_up: bool = False  # issue 38: the client closed the connection while the answer was delayed

    @property
    def endpoint(self) -> str:
        return _endpoint(self.path)

    @property
    def schema_name(self) -> str | None:
        return _schema_name(self.endpoint, self.body)


def _endpoint(path: str) -> str:
    path = path.split("?", 1)[0].rstrip("/") or "/"
    if path == API_PREFIX or path.startswith(API_PREFIX + "/"):
        path = path[len(API_PREFIX) :] or "/"
    return path if path.startswith("/") else "/" + path


def _schema_name(endpoint: str, body: Any) -> str | None:
    if not isinstance(body, dict):
        return None
    if endpoint == "/chat/completions":
        fmt = body.get("response_format")
        if isinstance(fmt, dict) and isinstance(fmt.get("json_schema"), dict):
            name = fmt["json_schema"].get("name")
            return name if isinstance(name, str) else None
    elif endpoint == "/responses":
        text = body.get("text")
        if isinstance(text, dict) and isinstance(text.get("format"), dict):
            name = text["format"].get("name")
            return name if isinstance(name, str) else None
    return None


# --------------------------------------------------------------------------- rules


@dataclass
class Rule:
    """A scripted answer. ``None`` criteria match anything; ``times=None`` never runs out.

    With ``path=None`` the rule answers the text endpoints (/chat/completions, /responses)
    only, unless its answer is a :class:`FakeResponse`, which answers on every endpoint.
    """

    answer: Any
    path: str | None = None
    purpose: str | None = None
    schema_name: str | None = None
    times: int | None = None
    usage: dict[str, int] | None = None
    used: int = 0

    @property
    def remaining(self) -> int | None:
        return None if self.times is None else max(0, self.times - self.used)

    def matches(self, request: RecordedRequest) -> bool:
        if self.times is not None and self.used >= self.times:
            return False
        endpoint = request.endpoint
        if self.path is not None:
            if _endpoint(self.path) != endpoint:
                return False
        elif endpoint not in TEXT_ENDPOINTS and not _is_raw_response(self.answer):
            return False
        if self.purpose is not None and request.purpose != self.purpose:
            return False
        return self.schema_name is None or request.schema_name == self.schema_name


def _is_raw_response(answer: Any) -> bool:
    while isinstance(answer, Delayed):
        answer = answer.answer
    return isinstance(answer, FakeResponse)


# --------------------------------------------------------------------------- usage


def _text_of(content: Any) -> str:
    """The text in a message content: a string, or a list of parts with ``text``."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            _text_of(part.get("text") or part.get("content")) for part in content if isinstance(part, dict)
        )
    return ""


def _input_chars(endpoint: str, body: dict[str, Any]) -> int:
    if endpoint == "/chat/completions":
        messages = body.get("messages")
        return (
            sum(len(_text_of(m.get("content"))) for m in messages if isinstance(m, dict))
            if isinstance(messages, list)
            else 0
        )
    chars = len(_text_of(body.get("instructions")))
    items = body.get("input")
    if isinstance(items, str):
        return chars + len(items)
    if isinstance(items, list):
        chars += sum(len(_text_of(i.get("content") or i.get("output"))) for i in items if isinstance(i, dict))
    return chars


def _tokens(chars: int) -> int:
    return max(1, chars // 4)


def _usage_numbers(default_in: int, default_out: int, override: dict[str, int] | None) -> dict[str, int]:
    o = override or {}
    prompt = o.get("prompt_tokens", o.get("input_tokens", default_in))
    completion = o.get("completion_tokens", o.get("output_tokens", default_out))
    return {
        "input": prompt,
        "output": completion,
        "cached": o.get("cached_tokens", 0),
        "reasoning": o.get("reasoning_tokens", 0),
        "total": o.get("total_tokens", prompt + completion),
    }


# --------------------------------------------------------------------------- what the real API takes
#
# The fake refuses what api.openai.com refuses, with the same status and error body
# ({"error": {"message", "type", "param", "code"}}), so a request builder that would get a 400 in
# production gets it in the tests too. Each rule below names where it comes from:
#
# [ref]     the API reference as the openai SDK ships it (openai/types/chat/completion_create_params.py,
#           openai/types/responses/response_create_params.py, response_input_item_param.py,
#           shared/reasoning_effort.py), https://platform.openai.com/docs/api-reference
# [so]      the Structured Outputs guide, "Supported schemas"
#           (https://platform.openai.com/docs/guides/structured-outputs#supported-schemas)
# [reason]  the reasoning guide and the ReasoningEffort reference text ("gpt-5.1 defaults to none ...
#           The supported reasoning values for gpt-5.1 are none, low, medium, and high. Tool calls are
#           supported for all reasoning values in gpt-5.1. All models before gpt-5.1 default to medium
#           reasoning effort, and do not support none."), https://platform.openai.com/docs/guides/reasoning
# [live]    an error body the real API sent, quoted in a public bug report (named where used)
# SPEC-001  the seed (ENV-21, ENV-22, ENV-23): errors impyard met live
#
# Messages are the real ones where a [live] source quotes them; elsewhere they are written in the same
# style and say so ("paraphrased").


@dataclass(frozen=True)
class ModelSpec:
    """What one model takes. The fake's own table (``OPENAI_MODELS``), written from the API reference;
    tests add more with :meth:`FakeOpenAI.add_model` (a local server, a new snapshot, a made-up name).

    ``kind``: ``"text"`` (/chat/completions and /responses), ``"embedding"`` or ``"image"``.
    ``efforts``: the reasoning efforts it takes; empty = not a reasoning model, and then
    ``reasoning_effort`` / ``reasoning.effort`` / ``include: ["reasoning.encrypted_content"]`` are
    refused. ``default_effort``: the effort it uses when none is sent.
    ``temperature``: ``"any"`` (0-2), ``"default_only"`` (only 1), ``"effort_none"`` (only while the
    effective effort is ``none``) or ``"never"``; ``top_p`` follows the same rule.
    ``max_tokens``: chat's older ``max_tokens`` is taken (reasoning models take only
    ``max_completion_tokens``). ``vision``, ``tools``, ``structured_outputs``: image inputs, function
    tools and ``json_schema`` formats are taken. ``chat_tools_need_effort_none``: function tools on
    /chat/completions only while the effective effort is ``none`` (SPEC-001 ENV-21). ``dimensions``: an
    embedding model that takes ``dimensions``. ``lenient``: a local OpenAI-compatible server (Ollama,
    llama.cpp's server, vLLM, LM Studio): the model must exist, nothing else is checked (such servers
    ignore parameters they do not know and follow a ``json_schema`` without OpenAI's strict subset).
    """

    kind: str = "text"
    efforts: tuple[str, ...] = ()
    default_effort: str | None = None
    temperature: str = "any"
    max_tokens: bool = True
    vision: bool = True
    tools: bool = True
    structured_outputs: bool = True
    chat_tools_need_effort_none: bool = False
    dimensions: bool = False
    lenient: bool = False
    native_dimensions: int | None = (
        None  # issue 33: an embedding model that answers this length, whatever asked
    )

    def __post_init__(self) -> None:
        if self.kind not in ("text", "embedding", "image"):
            raise ValueError(f"kind must be text, embedding or image, not {self.kind!r}")
        if self.temperature not in ("any", "default_only", "effort_none", "never"):
            raise ValueError(
                f"temperature must be any, default_only, effort_none or never, not {self.temperature!r}"
            )
        object.__setattr__(self, "efforts", tuple(self.efforts))
        if self.efforts and self.default_effort not in self.efforts:
            raise ValueError("a reasoning model needs a default_effort among its efforts")
        if not self.efforts and self.default_effort is not None:
            raise ValueError("default_effort needs efforts")

    @property
    def reasoning(self) -> bool:
        return bool(self.efforts)

    def replace(self, **changes: Any) -> ModelSpec:
        return dataclasses.replace(self, **changes)


# Not a reasoning model: temperature 0-2, max_tokens and max_completion_tokens, reasoning refused.
_PLAIN = ModelSpec()
# [reason] gpt-5.1: none|low|medium|high, default none; tools with every effort on chat/completions.
# "temperature, top_p and logprobs are only supported when reasoning effort is none" (GPT-5.1/5.2
# guide); max_tokens refused ([live] fish2018/YPrompt#26: "Unsupported parameter: 'max_tokens' is
# not supported with this model. Use 'max_completion_tokens' instead." for gpt-5.1).
_GPT_5_1 = ModelSpec(
    efforts=("none", "low", "medium", "high"),
    default_effort="none",
    temperature="effort_none",
    max_tokens=False,
)
# gpt-5.2 adds xhigh; on chat/completions function tools only with effort none ([live]
# livekit/agents#5088 "applies to gpt 5.2 and 5.4", pipecat-ai/pipecat#4043; SPEC-001 ENV-21).
_GPT_5_2 = _GPT_5_1.replace(
    efforts=("none", "low", "medium", "high", "xhigh"), chat_tools_need_effort_none=True
)
# [reason] gpt-5, -mini, -nano: minimal|low|medium|high, default medium, no none; temperature only the
# default 1 ([live] diffbot/code-gpt-docs#445 "Only the default (1) value is supported.").
_GPT_5 = ModelSpec(
    efforts=("minimal", "low", "medium", "high"),
    default_effort="medium",
    temperature="default_only",
    max_tokens=False,
)
# [reason] o-series: low|medium|high, default medium; no temperature; max_completion_tokens only
# ([live] teilomillet/gollm#33 for o1 and o3-mini). o3-mini takes no images.
_O_SERIES = ModelSpec(
    efforts=("low", "medium", "high"), default_effort="medium", temperature="never", max_tokens=False
)

OPENAI_MODELS: dict[str, ModelSpec] = {
    "gpt-5.2": _GPT_5_2,
    "gpt-5.1": _GPT_5_1,
    "gpt-5": _GPT_5,
    "gpt-5-mini": _GPT_5,
    "gpt-5-nano": _GPT_5,
    "o1": _O_SERIES,
    "o3": _O_SERIES,
    "o3-mini": _O_SERIES.replace(vision=False),
    "o4-mini": _O_SERIES,
    "gpt-4.1": _PLAIN,
    "gpt-4.1-mini": _PLAIN,
    "gpt-4.1-nano": _PLAIN,
    "gpt-4o": _PLAIN,
    "gpt-4o-mini": _PLAIN,
    # [ref] embeddings: `dimensions` "Only supported in text-embedding-3 and later models."
    "text-embedding-3-small": ModelSpec("embedding", dimensions=True),
    "text-embedding-3-large": ModelSpec("embedding", dimensions=True),
    "text-embedding-ada-002": ModelSpec("embedding"),
    "gpt-image-1": ModelSpec("image"),
    "gpt-image-1-mini": ModelSpec("image"),
    "gpt-image-1.5": ModelSpec("image"),
    "dall-e-2": ModelSpec("image"),
    "dall-e-3": ModelSpec("image"),
}
"""The models the fake serves unless a test adds more (a copy is taken per server)."""

# A local OpenAI-compatible server's model (Ollama, llama.cpp's server, vLLM, LM Studio): not a
# reasoning model, takes max_tokens and temperature, ignores what it does not know, and follows any
# json_schema (no strict subset). Register it: ``fake.add_model("llama3.2", LOCAL_SERVER_MODEL)``.
LOCAL_SERVER_MODEL = ModelSpec(lenient=True)
# Issue 38: llama-cpp-python's own server (``python -m llama_cpp.server``): lenient like the others, but its
# request model takes ``response_format.type`` "text" or "json_object" only, and its error handler wraps the
# validation error in an HTTP 500 (see ``_check_llama_cpp_python``). ``structured_outputs=False`` on a lenient
# model says so. Register it: ``fake.add_model("qwen", LLAMA_CPP_PYTHON_MODEL)``.
LLAMA_CPP_PYTHON_MODEL = ModelSpec(lenient=True, structured_outputs=False)

# ---- issue 33: an embedding model that ignores `dimensions` ------------------------------------------------
# A local server's embedding model (Ollama's all-minilm, llama.cpp's server, LM Studio): it takes the body, as
# such servers do, and answers with its model's own length (here 384), whatever `dimensions` asked.
# Register it: ``fake.add_model("all-minilm", LOCAL_SERVER_EMBEDDING_MODEL)``.
LOCAL_SERVER_EMBEDDING_MODEL = ModelSpec("embedding", lenient=True, native_dimensions=384)

# [ref] the body parameters each endpoint takes (CompletionCreateParams, ResponseCreateParams,
# EmbeddingCreateParams); anything else is refused.
CHAT_PARAMETERS = frozenset(
    {
        "messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias",
        "logprobs", "max_completion_tokens", "max_tokens", "metadata", "modalities", "moderation", "n",
        "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key", "prompt_cache_options",
        "prompt_cache_retention", "reasoning_effort", "response_format", "safety_identifier", "seed",
        "service_tier", "stop", "store", "stream", "stream_options", "temperature", "tool_choice", "tools",
        "top_logprobs", "top_p", "user", "verbosity", "web_search_options",
    }
)  # fmt: skip
RESPONSES_PARAMETERS = frozenset(
    {
        "access_programs", "background", "background_options", "context_management", "conversation",
        "image", "include", "input", "instructions", "max_output_tokens", "max_tool_calls", "metadata",
        "model", "moderation", "parallel_tool_calls", "previous_response_id", "prompt", "prompt_cache_key",
        "prompt_cache_options", "prompt_cache_retention", "reasoning", "safety_identifier", "service_tier",
        "store", "stream", "stream_options", "temperature", "text", "tool_choice", "tools", "top_logprobs",
        "top_p", "truncation", "user",
    }
)  # fmt: skip
EMBEDDINGS_PARAMETERS = frozenset({"input", "model", "dimensions", "encoding_format", "user"})

_CHAT_ROLES = ("system", "assistant", "user", "function", "tool", "developer")
# [ref] ChatCompletionContentPartParam and friends, by role.
_CHAT_PART_TYPES = {
    "user": ("text", "image_url", "input_audio", "file"),
    "system": ("text",),
    "developer": ("text",),
    "assistant": ("text", "refusal"),
    "tool": ("text",),
    "function": ("text",),
}
_RESPONSES_ROLES = ("user", "assistant", "system", "developer")
# [ref] ResponseInputItemParam: the keys each input item may carry. SPEC-001 ENV-23: `status` on a
# passed-back reasoning item is refused as an unknown parameter ([live] "Unknown parameter:
# 'input[1].status'." in BerriAI/litellm#13420 and 1jehuang/jcode#1028, code unknown_parameter), while
# a function_call item may carry it (openai/openai-support-agent-demo#12 sends status: 'completed').
_INPUT_ITEM_KEYS: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {
    "message": (frozenset({"type", "role", "content", "status", "id", "phase"}), ("role", "content")),
    "function_call": (
        frozenset({"type", "id", "call_id", "name", "arguments", "status", "namespace", "caller"}),
        ("call_id", "name", "arguments"),
    ),
    "function_call_output": (
        frozenset({"type", "id", "call_id", "output", "status", "caller", "name", "namespace"}),
        ("call_id", "output"),
    ),
    "reasoning": (frozenset({"type", "id", "summary", "content", "encrypted_content"}), ("id", "summary")),
    "item_reference": (frozenset({"type", "id"}), ("id",)),
}
# Other item types the API takes; the fake checks nothing inside them.
_OTHER_INPUT_ITEMS = frozenset(
    {
        "computer_call", "computer_call_output", "web_search_call", "file_search_call", "image_generation_call",
        "code_interpreter_call", "local_shell_call", "local_shell_call_output", "shell_call", "shell_call_output",
        "apply_patch_call", "apply_patch_call_output", "mcp_list_tools", "mcp_approval_request",
        "mcp_approval_response", "mcp_call", "custom_tool_call", "custom_tool_call_output", "compaction",
        "tool_search_call", "additional_tools",
    }
)  # fmt: skip
_RESPONSES_INPUT_PARTS = ("input_text", "input_image", "input_file")
_RESPONSES_OUTPUT_PARTS = ("output_text", "refusal")
# [live] the list the API answers for a chat-shaped part in Responses input.
_RESPONSES_PART_LIST = (
    "input_text", "input_image", "output_text", "refusal", "input_file", "computer_screenshot", "summary_text"
)  # fmt: skip

# [so] Structured Outputs' subset of JSON Schema.
_SCHEMA_TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
_SCHEMA_COMMON = frozenset(
    {"type", "description", "title", "default", "examples", "enum", "const", "anyOf", "$ref", "$defs",
     "definitions", "$schema", "$comment", "$id"}
)  # fmt: skip
_SCHEMA_BY_TYPE = {
    "string": frozenset({"pattern", "format"}),  # [so] no minLength / maxLength: see _STRICT_REFUSED_BOUNDS
    "number": frozenset({"multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum"}),
    "integer": frozenset({"multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum"}),
    "object": frozenset({"properties", "required", "additionalProperties", "patternProperties"}),
    "array": frozenset({"items", "minItems", "maxItems"}),
    "boolean": frozenset(),
    "null": frozenset(),
}
_SCHEMA_ALL_TYPED = frozenset().union(*_SCHEMA_BY_TYPE.values())
# [so] issue 38: the guide's "Supported properties" list strings' pattern and format only; minLength and
# maxLength are refused with a 400 "In context=('properties', 'x'), 'maxLength' is not permitted." ([live]
# jina-ai/node-DeepResearch#79, vercel/ai's OpenAI provider notes). A box sending them to OpenAI is caught.
_STRICT_REFUSED_BOUNDS = frozenset({"minLength", "maxLength"})
_STRING_FORMATS = ("date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid")
# [so] "A schema may have up to 5000 object properties total, with up to 10 levels of nesting." ...
# "total string length of all property names, definition names, enum values, and const values cannot
# exceed 120,000 characters" ... "up to 1000 enum values across all enum properties".
MAX_SCHEMA_PROPERTIES = 5000
MAX_SCHEMA_NESTING = 10
MAX_SCHEMA_STRING_CHARS = 120_000
MAX_SCHEMA_ENUM_VALUES = 1000
# [ref] response format and function names: "Must be a-z, A-Z, 0-9, or contain underscores and
# dashes, with a maximum length of 64."
_NAME_ALPHABET = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_NAME_PATTERN = "^[a-zA-Z0-9_-]+$"
MIN_OUTPUT_TOKENS = 16  # [ref] max_output_tokens: [live] "Expected a value >= 16"


class _Refused(Exception):
    """A request the real API would refuse: becomes an OpenAI error body."""

    def __init__(
        self, message: str, *, param: str | None = None, code: str | None = None, status: int = 400
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status

    def response(self) -> FakeResponse:
        body = {
            "error": {
                "message": self.message,
                "type": "invalid_request_error",
                "param": self.param,
                "code": self.code,
            }
        }
        return FakeResponse(status=self.status, body=body)


def _listing(values: Sequence[str]) -> str:
    """The API's way of listing values: 'a', 'b', and 'c'."""
    quoted = [f"'{v}'" for v in values]
    if len(quoted) <= 2:
        return " and ".join(quoted)
    return ", ".join(quoted[:-1]) + ", and " + quoted[-1]


def _unsupported_parameter(param: str) -> _Refused:
    # [live] BoundaryML/baml#2708 (reasoning.effort on gpt-4.1), griptape-ai/ComfyUI-Griptape#312.
    return _Refused(
        f"Unsupported parameter: '{param}' is not supported with this model.",
        param=param,
        code="unsupported_parameter",
    )


def _check_name(value: Any, param: str) -> None:
    """A response-format or function name: [ref] a-z, A-Z, 0-9, _ and -, at most 64 characters."""
    if not isinstance(value, str) or not value:
        raise _Refused(
            f"Invalid '{param}': empty string. Expected a string with minimum length 1, but got an empty string instead.",
            param=param,
            code="empty_string",
        )
    if len(value) > 64:
        raise _Refused(
            f"Invalid '{param}': string too long. Expected a string with maximum length 64, "
            f"but got a string with length {len(value)} instead.",
            param=param,
            code="string_above_max_length",
        )
    if not set(value) <= _NAME_ALPHABET:
        raise _Refused(
            f"Invalid '{param}': string does not match pattern. Expected a string that matches the pattern "
            f"'{_NAME_PATTERN}'.",
            param=param,
            code="invalid_value",
        )


# ----------------------------------------------------------------- strict JSON schemas [so]


def _strict_schema_problem(schema: Any) -> str | None:
    """Why Structured Outputs would refuse ``schema`` with ``strict: true``, or None.

    The answer reads like the API's: "In context=('properties', 'x'), 'additionalProperties' is
    required to be supplied and to be false." ([live] moeru-ai/xsai#202, dottxt-ai/outlines#844),
    "... 'required' is required to be supplied and to be an array including every key in properties.
    Missing 'roles'." ([live] vercel/ai#6484), "... 'oneOf' is not permitted." ([live] community.openai.com
    thread 932422), "6 levels of nesting exceeds limit of 5." ([live] tidyverse/ellmer#671, the limit
    since raised to 10), "... object schema missing properties." ([live] spring-projects/spring-ai#4776).
    """
    if not isinstance(schema, dict) or schema.get("type") != "object" or "anyOf" in schema:
        # [so] "the root level object of a schema must be an object, and not use anyOf"
        got = schema.get("type") if isinstance(schema, dict) else None
        return f"schema must be a JSON Schema of 'type: \"object\"', got 'type: \"{got}\"'."
    state = {"properties": 0, "enum_values": 0, "chars": 0, "depth": 0}
    problem = _schema_node(schema, (), schema, state, depth=0)
    if problem is not None:
        return problem
    if state["depth"] > MAX_SCHEMA_NESTING:
        return f"{state['depth']} levels of nesting exceeds limit of {MAX_SCHEMA_NESTING}."
    if state["properties"] > MAX_SCHEMA_PROPERTIES:  # paraphrased
        return f"{state['properties']} object properties exceeds limit of {MAX_SCHEMA_PROPERTIES}."
    if state["enum_values"] > MAX_SCHEMA_ENUM_VALUES:  # paraphrased
        return f"{state['enum_values']} enum values exceeds limit of {MAX_SCHEMA_ENUM_VALUES}."
    if state["chars"] > MAX_SCHEMA_STRING_CHARS:  # paraphrased
        return f"total string length {state['chars']} exceeds limit of {MAX_SCHEMA_STRING_CHARS}."
    return None


def _context(path: tuple[str, ...], problem: str) -> str:
    return f"In context={path!r}, {problem}"


def _schema_node(
    node: Any, path: tuple[str, ...], root: dict[str, Any], state: dict[str, int], depth: int
) -> str | None:
    if not isinstance(node, dict):
        return _context(path, "schema must be a JSON object.")  # paraphrased
    declared = node.get("type")
    types = declared if isinstance(declared, list) else [declared] if declared is not None else []
    for kind in types:
        if kind not in _SCHEMA_TYPES:
            return _context(path, f"'{kind}' is not a valid type.")  # paraphrased
    if not types and not {"anyOf", "$ref", "enum", "const"} & set(node):
        return _context(path, "schema must have a 'type' key.")
    allowed = _SCHEMA_COMMON | (
        frozenset().union(*(_SCHEMA_BY_TYPE[t] for t in types)) if types else _SCHEMA_ALL_TYPED
    )
    for keyword in node:
        if keyword not in allowed:
            return _context(path, f"'{keyword}' is not permitted.")
    if "$ref" in node:
        extra = sorted(set(node) - {"$ref", "description", "title"})
        if (
            extra
        ):  # the SDK's to_strict_json_schema: "we can't use `$ref`s if there are also other properties"
            return _context(path, f"'$ref' cannot be combined with {extra!r}.")  # paraphrased
        if _resolve_ref(node["$ref"], root) is None:
            return _context(
                path, f"reference to {node['$ref']!r} which was not found in the schema."
            )  # paraphrased
    if "format" in node and node["format"] not in _STRING_FORMATS:
        return _context(
            path, f"'format' {node['format']!r} is not supported; use one of {_listing(_STRING_FORMATS)}."
        )
    for key in ("enum", "const"):
        if key in node:
            values = node[key] if key == "enum" else [node[key]]
            if key == "enum" and (not isinstance(values, list) or not values):
                return _context(path, "'enum' must be a non-empty array.")  # paraphrased
            state["enum_values"] += len(values) if key == "enum" else 0
            state["chars"] += sum(len(v) for v in values if isinstance(v, str))
    for key in ("$defs", "definitions"):
        definitions = node.get(key)
        if definitions is None:
            continue
        if not isinstance(definitions, dict):
            return _context(path, f"'{key}' must be an object.")  # paraphrased
        for name, sub in definitions.items():
            state["chars"] += len(name)
            problem = _schema_node(sub, (*path, key, name), root, state, depth)
            if problem is not None:
                return problem
    if "anyOf" in node:
        options = node["anyOf"]
        if not isinstance(options, list) or not options:
            return _context(path, "'anyOf' must be a non-empty array.")  # paraphrased
        for index, sub in enumerate(options):
            problem = _schema_node(sub, (*path, "anyOf", str(index)), root, state, depth)
            if problem is not None:
                return problem
    if "object" in types or "properties" in node:
        problem = _object_node(node, path, root, state, depth)
        if problem is not None:
            return problem
    if "array" in types or "items" in node:
        if "items" not in node:
            return _context(path, "array schema missing items.")
        problem = _schema_node(node["items"], (*path, "items"), root, state, depth)
        if problem is not None:
            return problem
    return None


def _object_node(
    node: dict[str, Any], path: tuple[str, ...], root: dict[str, Any], state: dict[str, int], depth: int
) -> str | None:
    depth += 1
    state["depth"] = max(state["depth"], depth)
    if node.get("additionalProperties") is not False:
        return _context(path, "'additionalProperties' is required to be supplied and to be false.")
    properties = node.get("properties")
    if properties is None:
        return _context(path, "object schema missing properties.")
    if not isinstance(properties, dict):
        return _context(path, "'properties' must be an object.")  # paraphrased
    required = node.get("required")
    missing = [key for key in properties if not isinstance(required, list) or key not in required]
    if missing:
        return _context(
            path,
            "'required' is required to be supplied and to be an array including every key in properties. "
            f"Missing '{missing[0]}'.",
        )
    assert isinstance(required, list)
    extra = [key for key in required if key not in properties]
    if extra:
        return _context(path, f"Extra required key '{extra[0]}' supplied.")
    state["properties"] += len(properties)
    for name, sub in properties.items():
        state["chars"] += len(name)
        problem = _schema_node(sub, (*path, "properties", name), root, state, depth)
        if problem is not None:
            return problem
    return None


def _resolve_ref(ref: Any, root: dict[str, Any]) -> Any:
    """[so] "#" (root recursion) or a JSON pointer into the schema (#/$defs/name)."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    node: Any = root
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _check_json_schema_format(fmt: dict[str, Any], *, param: str, name_param: str, schema_param: str) -> None:
    """A ``json_schema`` format (chat's ``response_format.json_schema`` or Responses' ``text.format``)."""
    if "name" not in fmt:
        raise _Refused(
            f"Missing required parameter: '{name_param}'.",
            param=name_param,
            code="missing_required_parameter",
        )
    _check_name(fmt["name"], name_param)
    if "schema" not in fmt or not isinstance(fmt["schema"], dict):
        raise _Refused(
            f"Missing required parameter: '{schema_param}'.",
            param=schema_param,
            code="missing_required_parameter",
        )
    if fmt.get("strict") is True:
        problem = _strict_schema_problem(fmt["schema"])
        if problem is not None:
            raise _Refused(
                f"Invalid schema for response_format '{fmt['name']}': {problem}",
                param=param,
                code="invalid_json_schema",
            )


def _check_function(function: dict[str, Any], *, param: str) -> None:
    """A function tool: its name, and with ``strict: true`` its parameters as a strict schema."""
    if "name" not in function:
        raise _Refused(
            f"Missing required parameter: '{param}.name'.",
            param=f"{param}.name",
            code="missing_required_parameter",
        )
    _check_name(function["name"], f"{param}.name")
    if function.get("strict") is True and "parameters" in function:
        problem = _strict_schema_problem(function["parameters"])
        if problem is not None:
            # [live] openai/openai-agents-python#1023, anomalyco/opencode#13737
            raise _Refused(
                f"Invalid schema for function '{function['name']}': {problem}",
                param=f"{param}.parameters",
                code="invalid_function_parameters",
            )


# ----------------------------------------------------------------- sampling and reasoning parameters


def _check_effort(spec: ModelSpec, model: str, effort: Any, param: str) -> str | None:
    """The effective effort (None for a non-reasoning model), refusing what the model does not take."""
    if effort is None:
        return spec.default_effort
    if not spec.reasoning:
        raise _unsupported_parameter(param)
    if effort not in spec.efforts:
        # [live] openai/openai-agents-python#2089: "Unsupported value: 'minimal' is not supported with
        # the 'gpt-5.1' model. Supported values are: 'none', 'low', 'medium', and 'high'."
        raise _Refused(
            f"Unsupported value: '{effort}' is not supported with the '{model}' model. "
            f"Supported values are: {_listing(spec.efforts)}.",
            param=param,
            code="unsupported_value",
        )
    return str(effort)


def _check_sampling(spec: ModelSpec, body: dict[str, Any], effort: str | None) -> None:
    """temperature and top_p, by the model's rule; [ref] temperature 0-2, top_p 0-1."""
    for name, ceiling in (("temperature", 2), ("top_p", 1)):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _Refused(
                f"Invalid type for '{name}': expected a decimal, but got a {type(value).__name__} instead.",
                param=name,
                code="invalid_type",
            )
        rule = spec.temperature
        if rule == "never" or (rule == "effort_none" and effort != "none"):
            raise _unsupported_parameter(name)
        if rule == "default_only" and value != 1:
            # [live] diffbot/code-gpt-docs#445
            raise _Refused(
                f"Unsupported value: '{name}' does not support {value:g} with this model. "
                "Only the default (1) value is supported.",
                param=name,
                code="unsupported_value",
            )
        if value > ceiling:
            raise _Refused(
                f"Invalid '{name}': decimal above maximum value. Expected a value <= {ceiling}, but got {value:g} instead.",
                param=name,
                code="decimal_above_max_value",
            )
        if value < 0:
            raise _Refused(
                f"Invalid '{name}': decimal below minimum value. Expected a value >= 0, but got {value:g} instead.",
                param=name,
                code="decimal_below_min_value",
            )


def _function_tools(tools: Any) -> list[Any]:
    return (
        [t for t in tools if isinstance(t, dict) and t.get("type") == "function"]
        if isinstance(tools, list)
        else []
    )


# ----------------------------------------------------------------- /chat/completions


def _check_chat(body: dict[str, Any], model: str, spec: ModelSpec) -> None:
    unknown = [key for key in body if key not in CHAT_PARAMETERS]
    if unknown:
        # [live] davidmigloz/langchain_dart#712, namankhurpia/Easy-open-ai#38 (param and code null)
        plural = "s" if len(unknown) > 1 else ""
        raise _Refused(f"Unrecognized request argument{plural} supplied: {', '.join(unknown)}")
    _check_messages(body.get("messages"), spec)
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise _Refused("Invalid type for 'tools': expected an array.", param="tools", code="invalid_type")
        if tools and not spec.tools:
            raise _unsupported_parameter("tools")
        for index, tool in enumerate(tools):
            param = f"tools[{index}]"
            if not isinstance(tool, dict):
                raise _Refused(
                    f"Invalid type for '{param}': expected an object.", param=param, code="invalid_type"
                )
            if tool.get("type") == "function":
                function = tool.get("function")
                if not isinstance(function, dict):
                    raise _Refused(
                        f"Missing required parameter: '{param}.function'.",
                        param=f"{param}.function",
                        code="missing_required_parameter",
                    )
                _check_function(function, param=f"{param}.function")
    _check_response_format(body.get("response_format"), body, spec)
    effort = _check_effort(spec, model, body.get("reasoning_effort"), "reasoning_effort")
    if body.get("max_tokens") is not None and not spec.max_tokens:
        raise _Refused(
            "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
            param="max_tokens",
            code="unsupported_parameter",
        )
    _check_sampling(spec, body, effort)
    if spec.chat_tools_need_effort_none and _function_tools(tools) and effort != "none":
        # SPEC-001 ENV-21; [live] pipecat-ai/pipecat#4043 (param reasoning_effort, code null)
        raise _Refused(
            f"Function tools with reasoning_effort are not supported for {model} in /v1/chat/completions. "
            "Please use /v1/responses instead.",
            param="reasoning_effort",
        )


def _check_messages(messages: Any, spec: ModelSpec) -> None:
    if messages is None:
        raise _Refused(
            "Missing required parameter: 'messages'.", param="messages", code="missing_required_parameter"
        )
    if not isinstance(messages, list):
        raise _Refused(
            "Invalid type for 'messages': expected an array.", param="messages", code="invalid_type"
        )
    if not messages:
        raise _Refused(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
            param="messages",
            code="empty_array",
        )
    pending: list[str] = []  # tool_call ids still to be answered
    for index, message in enumerate(messages):
        at = f"messages.[{index}]"
        if not isinstance(message, dict):
            raise _Refused(f"Invalid type for '{at}': expected an object.", param=at, code="invalid_type")
        role = message.get("role")
        if role not in _CHAT_ROLES:
            raise _Refused(
                f"Invalid value: '{role}'. Supported values are: {_listing(_CHAT_ROLES)}.",
                param=f"{at}.role",
                code="invalid_value",
            )
        if pending and role != "tool":
            # [live] router-for-me/CLIProxyAPI#2798
            raise _Refused(
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(pending)}",
                param=f"{at}.role",
            )
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                raise _Refused(
                    "Missing parameter 'tool_call_id': messages with role 'tool' must have a 'tool_call_id'.",
                    param=f"{at}.tool_call_id",
                )
            if call_id not in pending:
                # [live] itmisx/deepx-code#94
                raise _Refused(
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message "
                    "with 'tool_calls'.",
                    param=f"{at}.role",
                )
            pending.remove(call_id)
        content = message.get("content")
        calls = message.get("tool_calls") if role == "assistant" else None
        if content is None:
            if role != "assistant" or not (calls or message.get("function_call")):
                raise _Refused(
                    "Invalid value for 'content': expected a string, got null.", param=f"{at}.content"
                )
        elif isinstance(content, list):
            for part_index, part in enumerate(content):
                _check_chat_part(part, role, f"{at}.content.[{part_index}]", spec)
        elif not isinstance(content, str):
            raise _Refused(
                f"Invalid type for '{at}.content': expected one of a string or array of objects, but got an "
                f"{type(content).__name__} instead.",
                param=f"{at}.content",
                code="invalid_type",
            )
        if calls:
            if not isinstance(calls, list):
                raise _Refused(
                    f"Invalid type for '{at}.tool_calls': expected an array.", param=f"{at}.tool_calls"
                )
            for call_index, call in enumerate(calls):
                if not isinstance(call, dict) or not isinstance(call.get("id"), str):
                    raise _Refused(
                        f"Missing required parameter: '{at}.tool_calls.[{call_index}].id'.",
                        param=f"{at}.tool_calls.[{call_index}].id",
                        code="missing_required_parameter",
                    )
                pending.append(call["id"])
    if pending:
        raise _Refused(
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
            f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(pending)}",
            param="messages",
        )


def _known_type(obj: Any, allowed: Any, at: str) -> Any:
    """``obj``'s ``type``, refused as the real API refuses a value it does not know."""
    kind = obj.get("type") if isinstance(obj, dict) else None
    if kind not in allowed:
        raise _Refused(
            f"Invalid value: '{kind}'. Supported values are: {_listing(allowed)}.",
            param=f"{at}.type",
            code="invalid_value",
        )
    return kind


def _check_chat_part(part: Any, role: str, at: str, spec: ModelSpec) -> None:
    kind = _known_type(part, _CHAT_PART_TYPES[role], at)
    if kind == "image_url" and not spec.vision:
        raise _Refused(
            "Invalid content type. image_url is only supported by certain models.", param=f"{at}.type"
        )


def _format_kind(fmt: Any, kinds: tuple[str, ...], spec: ModelSpec, *, param: str) -> str:
    """A structured-output format's type, refused as the real API does: an unknown type, or json_schema on a
    model without Structured Outputs (chat ``response_format`` and Responses ``text.format`` alike)."""
    kind = _known_type(fmt, kinds, param)
    if kind == "json_schema" and not spec.structured_outputs:
        raise _Refused(
            f"Invalid parameter: '{param}' of type 'json_schema' is not supported with this model.",
            param=param,
        )
    return str(kind)


def _check_response_format(fmt: Any, body: dict[str, Any], spec: ModelSpec) -> None:
    if fmt is None:
        return
    kind = _format_kind(fmt, ("text", "json_object", "json_schema"), spec, param="response_format")
    assert isinstance(fmt, dict)
    if kind == "json_schema":
        inner = fmt.get("json_schema")
        if not isinstance(inner, dict):
            raise _Refused(
                "Missing required parameter: 'response_format.json_schema'.",
                param="response_format.json_schema",
                code="missing_required_parameter",
            )
        _check_json_schema_format(
            inner,
            param="response_format",
            name_param="response_format.json_schema.name",
            schema_param="response_format.json_schema.schema",
        )
    elif kind == "json_object" and "json" not in json.dumps(body.get("messages")).lower():
        raise _Refused(
            "'messages' must contain the word 'json' in some form, to use 'response_format' of type 'json_object'.",
            param="messages",
        )


# ----------------------------------------------------------------- /responses


def _check_responses(body: dict[str, Any], model: str, spec: ModelSpec) -> None:
    for key in body:
        if key not in RESPONSES_PARAMETERS:
            raise _Refused(f"Unknown parameter: '{key}'.", param=key, code="unknown_parameter")
    _check_input(body.get("input"), spec, stored=body.get("store") is not False)
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise _Refused("Invalid type for 'tools': expected an array.", param="tools", code="invalid_type")
        if tools and not spec.tools:
            raise _unsupported_parameter("tools")
        for index, tool in enumerate(tools):
            if isinstance(tool, dict) and tool.get("type") == "function":
                # the flat shape (SPEC-001 ENV-22); a chat-shaped tool has no top-level name
                _check_function(tool, param=f"tools[{index}]")
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is not None:
        kind = _format_kind(fmt, ("text", "json_schema", "json_object"), spec, param="text.format")
        assert isinstance(fmt, dict)
        if kind == "json_schema":
            # [live] mavam/pi-web-providers#14: param text.format.schema, code invalid_json_schema
            _check_json_schema_format(
                fmt,
                param="text.format.schema",
                name_param="text.format.name",
                schema_param="text.format.schema",
            )
    reasoning = body.get("reasoning")
    effort: Any = None
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise _Refused(
                "Invalid type for 'reasoning': expected an object.", param="reasoning", code="invalid_type"
            )
        effort = reasoning.get("effort")
        if reasoning.get("summary") is not None and not spec.reasoning:
            raise _unsupported_parameter("reasoning.summary")
    effective = _check_effort(spec, model, effort, "reasoning.effort")
    include = body.get("include")
    if isinstance(include, list) and "reasoning.encrypted_content" in include and not spec.reasoning:
        # [live] pydantic/pydantic-ai#2865 (gpt-4o), ShishirPatil/gorilla#1150 (gpt-4.1-mini): param include
        raise _Refused("Encrypted content is not supported with this model.", param="include")
    limit = body.get("max_output_tokens")
    if isinstance(limit, int) and not isinstance(limit, bool) and limit < MIN_OUTPUT_TOKENS:
        raise _Refused(
            f"Invalid 'max_output_tokens': integer below minimum value. Expected a value >= {MIN_OUTPUT_TOKENS}, "
            f"but got {limit} instead.",
            param="max_output_tokens",
            code="integer_below_min_value",
        )
    _check_sampling(spec, body, effective)


def _check_input(items: Any, spec: ModelSpec, *, stored: bool) -> None:
    if items is None or isinstance(items, str):
        return
    if not isinstance(items, list):
        raise _Refused(
            "Invalid type for 'input': expected one of a string or array.", param="input", code="invalid_type"
        )
    calls: list[str] = []
    answered: set[str] = set()
    for index, item in enumerate(items):
        at = f"input[{index}]"
        if not isinstance(item, dict):
            raise _Refused(f"Invalid type for '{at}': expected an object.", param=at, code="invalid_type")
        kind = item.get("type", "message" if "role" in item else None)
        if kind in _OTHER_INPUT_ITEMS:
            continue
        if kind not in _INPUT_ITEM_KEYS:
            supported = (*_INPUT_ITEM_KEYS, *sorted(_OTHER_INPUT_ITEMS))
            raise _Refused(
                f"Invalid value: '{kind}'. Supported values are: {_listing(supported)}.",
                param=f"{at}.type",
                code="invalid_value",
            )
        allowed, required = _INPUT_ITEM_KEYS[kind]
        for key in item:
            if key not in allowed:
                # SPEC-001 ENV-23: response-only fields such as a reasoning item's status
                raise _Refused(
                    f"Unknown parameter: '{at}.{key}'.", param=f"{at}.{key}", code="unknown_parameter"
                )
        for key in required:
            if key not in item:
                raise _Refused(
                    f"Missing required parameter: '{at}.{key}'.",
                    param=f"{at}.{key}",
                    code="missing_required_parameter",
                )
        if not stored and (
            kind == "item_reference" or (kind == "reasoning" and not item.get("encrypted_content"))
        ):
            # [live] can1357/oh-my-pi#41 (404): with store false only encrypted_content carries a reasoning
            # item from one call to the next (SPEC-001 ENV-23).
            raise _Refused(
                f"Item with id '{item['id']}' not found. Items are not persisted when `store` is set to false. "
                "Try again with `store` set to true, or remove this item from your input.",
                param="input",
                status=404,
            )
        if kind == "message":
            _check_input_message(item, at, spec)
        elif kind == "function_call":
            calls.append(str(item["call_id"]))
        elif kind == "function_call_output":
            if item["call_id"] not in calls:
                # [live] continuedev/continue#10092 (param input, code null)
                raise _Refused(
                    f"No tool call found for function call output with call_id {item['call_id']}.",
                    param="input",
                )
            answered.add(item["call_id"])
    for call_id in calls:
        if call_id not in answered:
            # [live] openai/openai-support-agent-demo#12
            raise _Refused(f"No tool output found for function call {call_id}.", param="input")


def _check_input_message(item: dict[str, Any], at: str, spec: ModelSpec) -> None:
    role = item.get("role")
    if role not in _RESPONSES_ROLES:
        raise _Refused(
            f"Invalid value: '{role}'. Supported values are: {_listing(_RESPONSES_ROLES)}.",
            param=f"{at}.role",
            code="invalid_value",
        )
    content = item.get("content")
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _Refused(
            f"Invalid type for '{at}.content': expected one of a string or array of objects.",
            param=f"{at}.content",
            code="invalid_type",
        )
    allowed = _RESPONSES_OUTPUT_PARTS if role == "assistant" else _RESPONSES_INPUT_PARTS
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in allowed:
            # [live] for an assistant: "Invalid value: 'input_text'. Supported values are: 'output_text'
            # and 'refusal'."; a chat-shaped part gets the long list.
            listed = allowed if kind in _RESPONSES_PART_LIST else _RESPONSES_PART_LIST
            raise _Refused(
                f"Invalid value: '{kind}'. Supported values are: {_listing(listed)}.",
                param=f"{at}.content[{index}].type"
                if kind in _RESPONSES_PART_LIST
                else f"{at}.content[{index}]",
                code="invalid_value",
            )
        if kind == "input_image" and not spec.vision:
            raise _Refused(
                "Invalid content type. input_image is only supported by certain models.",
                param=f"{at}.content[{index}]",
            )


# ----------------------------------------------------------------- the other endpoints


def _check_embeddings(body: dict[str, Any], spec: ModelSpec) -> None:
    unknown = [key for key in body if key not in EMBEDDINGS_PARAMETERS]
    if unknown:
        plural = "s" if len(unknown) > 1 else ""
        raise _Refused(f"Unrecognized request argument{plural} supplied: {', '.join(unknown)}")
    value = body.get("input")
    if value is None:
        raise _Refused(
            "Missing required parameter: 'input'.", param="input", code="missing_required_parameter"
        )
    if value == "" or value == []:
        raise _Refused(
            "'$.input' is invalid. Please check the API reference: https://platform.openai.com/docs/api-reference."
        )
    if body.get("dimensions") is not None and not spec.dimensions:
        raise _Refused("This model does not support specifying dimensions.")


_ENDPOINT_KINDS = {
    "/chat/completions": "text",
    "/responses": "text",
    "/embeddings": "embedding",
    "/images/generations": "image",
    "/images/edits": "image",
}


def _check_request(endpoint: str, body: Any, models: dict[str, ModelSpec]) -> None:
    """Raise :class:`_Refused` for what the real API would refuse (the request's JSON/form is parsed)."""
    if not isinstance(body, dict):
        return
    model = body.get("model")
    if model is None and _ENDPOINT_KINDS[endpoint] == "image":
        return  # [ref] images: model is optional ("Defaults to dall-e-2")
    if model is None or model == "":
        raise _Refused("you must provide a model parameter")
    if not isinstance(model, str):
        raise _Refused("Invalid type for 'model': expected a string.", param="model", code="invalid_type")
    spec = _lookup_model(models, model)
    if spec is None:
        # [live] rd-1-2022/ai-openai-helloworld#9: 404, param null, code model_not_found
        raise _Refused(
            f"The model `{model}` does not exist or you do not have access to it.",
            code="model_not_found",
            status=404,
        )
    wanted = _ENDPOINT_KINDS[endpoint]
    if spec.kind != wanted:
        if endpoint == "/chat/completions":
            raise _Refused(
                "This is not a chat model and thus not supported in the v1/chat/completions endpoint. "
                "Did you mean to use v1/completions?",
                param="model",
                status=404,
            )
        raise _Refused(
            f"The model `{model}` is not supported on {API_PREFIX}{endpoint}.", param="model"
        )  # paraphrased
    if spec.lenient:
        if not spec.structured_outputs:
            _check_llama_cpp_python(body)
        return
    if endpoint == "/chat/completions":
        _check_chat(body, model, spec)
    elif endpoint == "/responses":
        _check_responses(body, model, spec)
    elif endpoint == "/embeddings":
        _check_embeddings(body, spec)


# ----------------------------------------------------------------- issue 38: llama-cpp-python's server

# [live] llama.cpp issue #23463 (llama-cpp-python 0.3.23, ``python -m llama_cpp.server``): json_schema is refused
# with HTTP 500, not 422: the route's error handler (llama_cpp/server/errors.py, RouteErrorHandler) turns every
# exception, the request's validation error included, into ``{"error": {"message": str(exc), "type":
# "internal_server_error", "param": null, "code": null}}``. The message is FastAPI's validation error, written
# here in its shape (paraphrased): several lines, the offending input and a link.
LLAMA_CPP_PYTHON_FORMAT_TYPES = ("text", "json_object")


def _check_llama_cpp_python(body: dict[str, Any]) -> None:
    fmt = body.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind in LLAMA_CPP_PYTHON_FORMAT_TYPES:
        return
    error = {
        "type": "literal_error",
        "loc": ("body", "response_format", "type"),
        "msg": "Input should be 'text' or 'json_object'",
        "input": kind,
        "ctx": {"expected": "'text' or 'json_object'"},
    }
    message = (
        f"1 validation error:\n  {error!r}\n    For further information visit "
        "https://errors.pydantic.dev/2.11/v/literal_error"
    )
    raise _LlamaCppPythonError(message)


class _LlamaCppPythonError(Exception):
    """llama-cpp-python's HTTP 500 for a request its model refuses (``_check_llama_cpp_python``)."""

    def response(self) -> FakeResponse:
        error = {"message": str(self), "type": "internal_server_error", "param": None, "code": None}
        return FakeResponse(status=500, body={"error": error})


def _lookup_model(models: dict[str, ModelSpec], name: str) -> ModelSpec | None:
    """A name, or a dated snapshot of one (``gpt-4.1-mini-2025-04-14``)."""
    if name in models:
        return models[name]
    base, _, date = name.rpartition("-")
    base, _, month = base.rpartition("-")
    base, _, year = base.rpartition("-")
    if base and len(year) == 4 and len(month) == 2 and len(date) == 2 and (year + month + date).isdigit():
        return models.get(base)
    return None


# --------------------------------------------------------------------------- the server


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeOpenAI/1"
    timeout = IDLE_CONNECTION_TIMEOUT_S
    server: _Server

    def setup(self) -> None:
        super().setup()
        # Headers and body go out as two writes; without NODELAY Nagle + delayed ACK adds ~40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _dispatch(self) -> None:
        self.server.fake._handle(self)

    do_POST = do_GET = do_PUT = do_PATCH = do_DELETE = _dispatch


class _Server(http.server.HTTPServer):
    request_queue_size = 128  # a burst of parallel connects must not overflow the backlog
    fake: FakeOpenAI

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves a FQDN, which can be slow; loopback needs none.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self._serve_connection,
            args=(request, client_address),
            name="fake-openai-conn",
            daemon=True,
        )
        with self.fake._lock:
            self.fake._connections.add(request)
            self.fake._threads.add(thread)
        thread.start()

    def _serve_connection(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            with self.fake._lock:
                self.fake._threads.discard(threading.current_thread())

    def shutdown_request(self, request: Any) -> None:
        with self.fake._lock:  # serialised with stop()'s sweep, so it never touches a closed socket
            self.fake._connections.discard(request)
            super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):  # the client went away, or stop() closed the connection
            return
        self.fake._note_error(exc)


class FakeOpenAI:
    """The fake server. Use as ``with FakeOpenAI() as fake:`` (or ``async with``), or start()/stop().

    Settable at any time: ``api_key`` (``None`` accepts any bearer token), ``default_answer``
    (used for text endpoints when no rule matches; ``None`` makes that a 500), ``latency_s``
    (added before every response, for the benchmark).

    It serves the models in ``OPENAI_MODELS`` and refuses what the real API refuses for each (see
    :class:`ModelSpec`); ``models`` adds or replaces entries for this server, as
    :meth:`add_model` does later.
    """

    def __init__(
        self,
        *,
        api_key: str | None = DEFAULT_API_KEY,
        default_answer: Any = DEFAULT_ENVELOPE,
        latency_s: float = 0.0,
        host: str = "127.0.0.1",
        models: dict[str, ModelSpec] | None = None,
    ) -> None:
        self.api_key = api_key
        self._models: dict[str, ModelSpec] = {**OPENAI_MODELS, **(models or {})}
        self.default_answer = default_answer
        self.latency_s = latency_s
        self._host = host
        self._lock = threading.Lock()
        self._recorded = threading.Condition(self._lock)
        self._requests: list[RecordedRequest] = []
        self._rules: list[Rule] = []
        self._errors: list[BaseException] = []
        self._connections: set[Any] = set()
        self._threads: set[threading.Thread] = set()
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._serve_thread: threading.Thread | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._seq = 0

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> FakeOpenAI:
        if self._server is not None:
            raise RuntimeError("FakeOpenAI is already running")
        self._stopping.clear()
        server = _Server((self._host, 0), _Handler)
        server.fake = self
        self._server = server
        self._wake_r, self._wake_w = socket.socketpair()
        self._serve_thread = threading.Thread(target=self._serve, name="fake-openai", daemon=True)
        self._serve_thread.start()
        return self

    def _serve(self) -> None:
        assert self._server is not None and self._wake_r is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self._server, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while not self._stopping.is_set():
                ready = selector.select()
                if any(key.fileobj is self._wake_r for key, _ in ready):
                    return
                self._server.handle_request()

    def stop(self) -> None:
        """Stop serving, close open connections, interrupt delays and join every thread. Idempotent."""
        server = self._server
        if server is None:
            return
        self._stopping.set()
        assert self._wake_w is not None and self._wake_r is not None and self._serve_thread is not None
        self._wake_w.send(b"x")
        self._serve_thread.join(THREAD_JOIN_TIMEOUT_S)
        with self._lock:
            for connection in self._connections:
                try:
                    connection.shutdown(socket.SHUT_RDWR)  # wakes a handler blocked on keep-alive
                except OSError:
                    pass
            threads = list(self._threads)
        for thread in threads:
            thread.join(THREAD_JOIN_TIMEOUT_S)
        server.server_close()
        self._wake_r.close()
        self._wake_w.close()
        self._server = self._serve_thread = self._wake_r = self._wake_w = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def __aenter__(self) -> FakeOpenAI:
        return self.start()  # binding and starting a thread takes well under a millisecond

    async def __aexit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("FakeOpenAI is not running")
        return self._server.server_port

    @property
    def url(self) -> str:
        """The server root, e.g. ``http://127.0.0.1:PORT``."""
        return f"http://{self._host}:{self.port}"

    @property
    def base_url(self) -> str:
        """What the SDK takes as ``base_url``: ``http://127.0.0.1:PORT/v1``."""
        return self.url + API_PREFIX

    def client(self, **kwargs: Any) -> Any:
        """An ``openai.OpenAI`` pointed here (no retries unless asked)."""
        import openai

        kwargs.setdefault("api_key", self.api_key or DEFAULT_API_KEY)
        kwargs.setdefault("max_retries", 0)
        return openai.OpenAI(base_url=self.base_url, **kwargs)

    def async_client(self, **kwargs: Any) -> Any:
        """An ``openai.AsyncOpenAI`` pointed here (no retries unless asked)."""
        import openai

        kwargs.setdefault("api_key", self.api_key or DEFAULT_API_KEY)
        kwargs.setdefault("max_retries", 0)
        return openai.AsyncOpenAI(base_url=self.base_url, **kwargs)

    # ----------------------------------------------------------------- models

    @property
    def models(self) -> dict[str, ModelSpec]:
        """The models this server serves (a copy): name -> what it takes."""
        with self._lock:
            return dict(self._models)

    def add_model(
        self, name: str, spec: ModelSpec | None = None, *, like: str | None = None, **changes: Any
    ) -> ModelSpec:
        """Serve ``name`` from now on, and return what it takes.

        ``spec`` gives it outright (``LOCAL_SERVER_MODEL`` for a local server's model); ``like`` copies
        a served model (``like="gpt-4.1-mini"``); with neither it is a plain, non-reasoning chat model.
        ``changes`` then override single fields (``add_model("gpt-x", like="gpt-5.1", vision=False)``).
        """
        if spec is not None and like is not None:
            raise TypeError("give spec or like, not both")
        with self._lock:
            if like is not None:
                if like not in self._models:
                    raise KeyError(f"no model {like!r} to copy")
                spec = self._models[like]
            base = spec if spec is not None else ModelSpec()
            added = base.replace(**changes) if changes else base
            self._models[name] = added
        return added

    def remove_model(self, name: str) -> None:
        """Stop serving ``name`` (requests for it get the real API's 404 ``model_not_found``)."""
        with self._lock:
            self._models.pop(name, None)

    # ----------------------------------------------------------------- scripting

    def script(
        self,
        answer: Any,
        *,
        path: str | None = None,
        purpose: str | None = None,
        schema_name: str | None = None,
        times: int | None = None,
        usage: dict[str, int] | None = None,
    ) -> Rule:
        """Add a rule; the first matching rule with uses left answers. Returns it (see ``rule.used``).

        ``answer``: a dict or pydantic model (sent as JSON content), a str (content text),
        :func:`refusal`, :func:`tool_call` (or a list of them), :class:`FakeResponse` /
        :func:`error`, :func:`slow` around any of these, or a callable taking the
        :class:`RecordedRequest` and returning any of these. On ``/embeddings`` a list of floats
        is the vector for every input; on the image endpoints ``bytes`` are the image.
        ``usage``: prompt_tokens (or input_tokens), completion_tokens (or output_tokens),
        cached_tokens, reasoning_tokens, total_tokens.
        """
        if times is not None and times < 1:
            raise ValueError("times must be at least 1 (or None for unlimited)")
        rule = Rule(answer, path=path, purpose=purpose, schema_name=schema_name, times=times, usage=usage)
        with self._lock:
            self._rules.append(rule)
        return rule

    @property
    def rules(self) -> list[Rule]:
        with self._lock:
            return list(self._rules)

    def clear_rules(self) -> None:
        with self._lock:
            self._rules.clear()

    # ----------------------------------------------------------------- recording

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of every request received, oldest first."""
        with self._lock:
            return list(self._requests)

    def requests_for(self, path: str) -> list[RecordedRequest]:
        """Requests to one endpoint (``/chat/completions`` or ``/v1/chat/completions``)."""
        endpoint = _endpoint(path)
        return [r for r in self.requests if r.endpoint == endpoint]

    def clear(self) -> None:
        """Forget recorded requests and errors (rules stay; see :meth:`clear_rules`)."""
        with self._lock:
            self._requests.clear()
            self._errors.clear()

    def wait_for_requests(
        self, count: int, *, path: str | None = None, timeout_s: float = 5.0
    ) -> list[RecordedRequest]:
        """Block until ``count`` requests (to ``path``, if given) have arrived; TimeoutError otherwise."""
        endpoint = None if path is None else _endpoint(path)

        def matching() -> list[RecordedRequest]:
            return [r for r in self._requests if endpoint is None or r.endpoint == endpoint]

        with self._recorded:
            if not self._recorded.wait_for(lambda: len(matching()) >= count, timeout_s):
                raise TimeoutError(f"expected {count} requests, got {len(matching())} within {timeout_s} s")
            return matching()

    @property
    def rejections(self) -> list[RecordedRequest]:
        """The requests the fake refused as the real API would (each with its ``rejection``)."""
        return [r for r in self.requests if r.rejection is not None]

    @property
    def errors(self) -> list[BaseException]:
        """Exceptions raised while answering (a callable answer that raised, an unrenderable answer)."""
        with self._lock:
            return list(self._errors)

    def _note_error(self, exc: BaseException | None) -> None:
        if exc is not None:
            with self._lock:
                self._errors.append(exc)

    def _next_id(self) -> int:
        with self._lock:
            self._seq += 1
            return self._seq

    # ----------------------------------------------------------------- issue 38: slow answers and hang-ups

    @property
    def hung_up(self) -> list[RecordedRequest]:
        """The requests whose client closed the connection while their (delayed) answer was pending: what a
        local server sees when a call is given up, and stops working on (``slow``, ``latency_s``)."""
        return [r for r in self.requests if r.hung_up]

    def _wait_watching(self, handler: _Handler, request: RecordedRequest, delay_s: float) -> bool:
        """Wait ``delay_s`` before answering, watching the connection: True when the answer is not to be sent
        (the fake is stopping, or the client hung up, which is recorded on ``request.hung_up``)."""
        deadline = time.monotonic() + delay_s
        sock = handler.connection
        while (left := deadline - time.monotonic()) > 0:
            if self._stopping.wait(min(left, HANG_UP_POLL_S)):
                return True
            try:
                readable, _, _ = select.select([sock], [], [], 0)
                if readable and sock.recv(1, socket.MSG_PEEK) == b"":
                    request.hung_up = True
                    log.info("fake OpenAI: the client hung up on %s before its answer", request.path)
                    return True
            except OSError:
                request.hung_up = True
                return True
        return False

    # ----------------------------------------------------------------- handling

    def _handle(self, handler: _Handler) -> None:
        received_at = time.time()
        path, _, query = handler.path.partition("?")
        headers = {name.lower(): value for name, value in handler.headers.items()}
        try:
            raw = _read_body(handler, headers)
        except ValueError as exc:
            handler.close_connection = True
            self._send(handler, error(400, str(exc)))
            return
        body, parse_problem = _parse_body(raw, headers.get("content-type", ""))
        request = RecordedRequest(
            path=path,
            headers=headers,
            body=body,
            purpose=headers.get(PURPOSE_HEADER.lower()),
            received_at=received_at,
            method=handler.command,
            query=query,
            raw=raw,
        )
        with self._recorded:
            self._requests.append(request)
            self._recorded.notify_all()

        response = self._respond(request, parse_problem)
        request.status = response.status
        delay = self.latency_s + response.delay_s
        if delay > 0 and self._wait_watching(handler, request, delay):
            handler.close_connection = True
            return
        self._send(handler, response)

    def _respond(self, request: RecordedRequest, parse_problem: str | None) -> FakeResponse:
        auth = request.headers.get("authorization", "")
        if not auth.startswith("Bearer ") or (self.api_key is not None and auth != f"Bearer {self.api_key}"):
            return error(401, "Incorrect API key provided.")
        endpoint = request.endpoint
        if endpoint not in ENDPOINTS:
            return error(404, f"Invalid URL ({request.method} {request.path})")
        if request.method != "POST":
            return error(405, f"Method {request.method} not allowed on {request.path}")
        if parse_problem is not None:
            return error(400, parse_problem)
        if endpoint != "/images/edits" and not isinstance(request.body, dict):
            return error(400, "The request body must be a JSON object.")
        if isinstance(request.body, dict) and request.body.get("stream") in (True, "true"):
            return error(400, "The fake OpenAI server does not stream.", code="stream_unsupported")
        try:
            with self._lock:
                models = dict(self._models)
            _check_request(endpoint, request.body, models)
        except _LlamaCppPythonError as refused:
            response = refused.response()
            request.rejection = response.body["error"]
            return response
        except _Refused as refused:
            response = refused.response()
            request.rejection = response.body["error"]
            log.warning(
                "fake OpenAI refused %s %s (model %r) as the real API would: %d %s",
                request.method,
                request.path,
                request.body.get("model") if isinstance(request.body, dict) else None,
                response.status,
                json.dumps(request.rejection),
            )
            return response

        answer, usage = self._pick(request)
        delay = 0.0
        try:
            for _ in range(16):  # resolve callables and delays, bounded against a callable returning itself
                if isinstance(answer, Delayed):
                    delay += answer.delay_s
                    answer = answer.answer
                elif callable(answer) and not isinstance(answer, type):
                    answer = answer(request)
                else:
                    break
            if isinstance(answer, FakeResponse):
                response = answer
            else:
                response = FakeResponse(200, _RENDERERS[endpoint](self, request, answer, usage))
        except Exception as exc:
            self._note_error(exc)
            return error(500, f"fake OpenAI could not answer: {type(exc).__name__}: {exc}")
        if delay:
            response = FakeResponse(
                response.status, response.body, response.headers, response.delay_s + delay
            )
        return response

    def _pick(self, request: RecordedRequest) -> tuple[Any, dict[str, int] | None]:
        with self._lock:
            for rule in self._rules:
                if rule.matches(request):
                    rule.used += 1
                    return rule.answer, rule.usage
        return self.default_answer, None

    def _send(self, handler: _Handler, response: FakeResponse) -> None:
        body = response.body
        if body is None:
            payload, content_type = b"", None
        elif isinstance(body, bytes):
            payload, content_type = body, "application/octet-stream"
        elif isinstance(body, str):
            payload, content_type = body.encode("utf-8"), "text/plain; charset=utf-8"
        else:
            payload, content_type = json.dumps(body).encode("utf-8"), "application/json"
        headers = {name.lower(): value for name, value in response.headers.items()}
        try:
            handler.send_response(response.status)
            if content_type and "content-type" not in headers:
                handler.send_header("Content-Type", content_type)
            handler.send_header("Content-Length", str(len(payload)))
            if "x-request-id" not in headers:
                handler.send_header("x-request-id", f"req_fake{self._next_id():06d}")
            for name, value in headers.items():
                if name not in ("content-length", "connection"):
                    handler.send_header(name, value)
            if handler.close_connection:
                handler.send_header("Connection", "close")
            handler.end_headers()
            handler.wfile.write(payload)
        except OSError:
            handler.close_connection = True

    # ----------------------------------------------------------------- renderers

    def _render_chat(
        self, request: RecordedRequest, answer: Any, usage: dict[str, int] | None
    ) -> dict[str, Any]:
        body = request.body
        message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
        finish_reason = "stop"
        calls = _tool_calls(answer)
        if calls is not None:
            message["tool_calls"] = [
                {
                    "id": self._call_id(c),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments_json},
                }
                for c in calls
            ]
            finish_reason = "tool_calls"
            produced = "".join(c.name + c.arguments_json for c in calls)
        elif isinstance(answer, Refusal):
            message["refusal"] = produced = answer.text
        else:
            message["content"] = produced = _content_text(answer)
        n = _usage_numbers(_tokens(_input_chars("/chat/completions", body)), _tokens(len(produced)), usage)
        return {
            "id": f"chatcmpl-fake{self._next_id():06d}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or "gpt-fake",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
            "usage": {
                "prompt_tokens": n["input"],
                "completion_tokens": n["output"],
                "total_tokens": n["total"],
                "prompt_tokens_details": {"cached_tokens": n["cached"], "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": n["reasoning"], "audio_tokens": 0},
            },
            "system_fingerprint": "fp_fake",
        }

    def _render_responses(
        self, request: RecordedRequest, answer: Any, usage: dict[str, int] | None
    ) -> dict[str, Any]:
        body = request.body
        output: list[dict[str, Any]] = []
        reasoning = self._reasoning_item(body)
        if reasoning is not None:
            output.append(reasoning)
        calls = _tool_calls(answer)
        if calls is not None:
            for c in calls:
                call_id = self._call_id(c)
                output.append(
                    {
                        "type": "function_call",
                        "id": f"fc_fake{self._next_id():06d}",
                        "call_id": call_id,
                        "name": c.name,
                        "arguments": c.arguments_json,
                        "status": "completed",
                    }
                )
            produced = "".join(c.name + c.arguments_json for c in calls)
        else:
            if isinstance(answer, Refusal):
                part: dict[str, Any] = {"type": "refusal", "refusal": answer.text}
                produced = answer.text
            else:
                produced = _content_text(answer)
                part = {"type": "output_text", "text": produced, "annotations": [], "logprobs": []}
            output.append(
                {
                    "type": "message",
                    "id": f"msg_fake{self._next_id():06d}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [part],
                }
            )
        n = _usage_numbers(_tokens(_input_chars("/responses", body)), _tokens(len(produced)), usage)
        result: dict[str, Any] = {
            "id": f"resp_fake{self._next_id():06d}",
            "object": "response",
            "created_at": int(time.time()),
            "model": body.get("model") or "gpt-fake",
            "status": "completed",
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools", []),
            "usage": {
                "input_tokens": n["input"],
                "input_tokens_details": {"cached_tokens": n["cached"]},
                "output_tokens": n["output"],
                "output_tokens_details": {"reasoning_tokens": n["reasoning"]},
                "total_tokens": n["total"],
            },
        }
        if isinstance(body.get("text"), dict):
            result["text"] = body["text"]
        return result

    def _reasoning_item(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """What a reasoning model puts before its answer while it reasons (effort other than none).

        Like the real one it carries response-only fields (``status``) that the API refuses when the
        item is passed back as input (SPEC-001 ENV-23), and ``encrypted_content`` only when asked for
        with ``include: ["reasoning.encrypted_content"]``.
        """
        with self._lock:
            spec = _lookup_model(self._models, str(body.get("model")))
        if spec is None or not spec.reasoning or spec.lenient:
            return None
        reasoning = body.get("reasoning")
        effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
        if (effort or spec.default_effort) == "none":
            return None
        item: dict[str, Any] = {"type": "reasoning", "id": f"rs_fake{self._next_id():06d}", "summary": []}
        include = body.get("include")
        if isinstance(include, list) and "reasoning.encrypted_content" in include:
            item["encrypted_content"] = base64.b64encode(f"fake reasoning {item['id']}".encode()).decode(
                "ascii"
            )
        item["status"] = "completed"
        return item

    def _render_embeddings(
        self, request: RecordedRequest, answer: Any, usage: dict[str, int] | None
    ) -> dict[str, Any]:
        body = request.body
        texts = _embedding_inputs(body.get("input"))
        dimensions = body.get("dimensions") or DEFAULT_EMBEDDING_DIMENSIONS
        with self._lock:
            spec = _lookup_model(self._models, str(body.get("model")))
        if spec is not None and spec.native_dimensions is not None:  # issue 33: `dimensions` ignored
            dimensions = spec.native_dimensions
        if not isinstance(dimensions, int) or dimensions < 1:
            raise ValueError(f"bad dimensions {dimensions!r}")
        fixed = [float(v) for v in answer] if isinstance(answer, list | tuple) and answer else None
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for index, text in enumerate(texts):
            vector = fixed if fixed is not None else embedding_vector(text, dimensions)
            encoded: Any = (
                base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
                if as_base64
                else vector
            )
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        n = _usage_numbers(sum(_tokens(len(t)) for t in texts), 0, usage)
        return {
            "object": "list",
            "data": data,
            "model": body.get("model") or "text-embedding-fake",
            "usage": {"prompt_tokens": n["input"], "total_tokens": n["input"]},
        }

    def _render_images(
        self, request: RecordedRequest, answer: Any, usage: dict[str, int] | None
    ) -> dict[str, Any]:
        body = request.body if isinstance(request.body, dict) else {}
        count = int(body.get("n") or 1)
        image_b64 = base64.b64encode(answer).decode("ascii") if isinstance(answer, bytes) else TINY_PNG_B64
        raw_prompt = body.get("prompt")
        prompt = raw_prompt if isinstance(raw_prompt, str) else ""
        images_in = sum(len(v) if isinstance(v, list) else 1 for v in body.values() if _is_file(v))
        text_in = _tokens(len(prompt))
        n = _usage_numbers(text_in + 65 * images_in, 16 * count, usage)
        result: dict[str, Any] = {
            "created": int(time.time()),
            "data": [{"b64_json": image_b64} for _ in range(count)],
            "usage": {
                "input_tokens": n["input"],
                "input_tokens_details": {
                    "text_tokens": min(text_in, n["input"]),
                    "image_tokens": 65 * images_in,
                },
                "output_tokens": n["output"],
                "total_tokens": n["total"],
            },
            "output_format": body.get("output_format", "png"),
        }
        if isinstance(body.get("size"), str):
            result["size"] = body["size"]
        return result

    def _call_id(self, call: ToolCall) -> str:
        return call.call_id or f"call_fake{self._next_id():06d}"


_RENDERERS: dict[str, Callable[[FakeOpenAI, RecordedRequest, Any, dict[str, int] | None], dict[str, Any]]] = {
    "/chat/completions": FakeOpenAI._render_chat,
    "/responses": FakeOpenAI._render_responses,
    "/embeddings": FakeOpenAI._render_embeddings,
    "/images/generations": FakeOpenAI._render_images,
    "/images/edits": FakeOpenAI._render_images,
}


def _tool_calls(answer: Any) -> list[ToolCall] | None:
    if isinstance(answer, ToolCall):
        return [answer]
    if isinstance(answer, Sequence) and not isinstance(answer, str | bytes) and answer:
        if all(isinstance(a, ToolCall) for a in answer):
            return list(answer)
    return None


def _content_text(answer: Any) -> str:
    if isinstance(answer, str):
        return answer
    if isinstance(answer, dict | list):
        return json.dumps(answer)
    if hasattr(answer, "model_dump_json"):  # a pydantic model, e.g. box.common.envelope.Envelope
        return answer.model_dump_json()
    raise TypeError(f"cannot render a {type(answer).__name__} as model output")


def _embedding_inputs(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return [" ".join(map(str, value))]  # one pre-tokenised input
    if isinstance(value, list) and value:
        return [v if isinstance(v, str) else " ".join(map(str, v)) for v in value]
    raise ValueError("input must be a non-empty string or list")


def _is_file(value: Any) -> bool:
    return isinstance(value, FormFile) or (
        isinstance(value, list) and any(isinstance(v, FormFile) for v in value)
    )


# --------------------------------------------------------------------------- HTTP bodies


def _read_body(handler: _Handler, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks: list[bytes] = []
        total = 0
        while True:
            size = int(handler.rfile.readline(1024).split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            total += size
            if total > MAX_BODY_BYTES:
                raise ValueError("request body too large")
            chunks.append(handler.rfile.read(size))
            handler.rfile.readline(1024)
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError as exc:
        raise ValueError("bad Content-Length") from exc
    if length < 0 or length > MAX_BODY_BYTES:
        raise ValueError("bad Content-Length")
    return handler.rfile.read(length) if length else b""


def _parse_body(raw: bytes, content_type: str) -> tuple[Any, str | None]:
    """(body, problem): parsed JSON, a multipart form dict, the raw text, or None when empty."""
    if not raw:
        return None, None
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == "multipart/form-data":
        try:
            return _parse_multipart(raw, content_type), None
        except ValueError as exc:
            return raw.decode("utf-8", "replace"), f"bad multipart body: {exc}"
    try:
        return json.loads(raw), None
    except ValueError as exc:
        return raw.decode("utf-8", "replace"), f"We could not parse the JSON body of your request: {exc}"


def _header_params(value: str) -> email.message.Message:
    message = email.message.Message()
    message["content-type"] = value
    return message


def _parse_multipart(raw: bytes, content_type: str) -> dict[str, Any]:
    boundary = _header_params(content_type).get_param("boundary")
    if not isinstance(boundary, str) or not boundary:
        raise ValueError("no boundary")
    form: dict[str, Any] = {}
    parts = raw.split(b"--" + boundary.encode("latin-1"))
    if len(parts) < 3:
        raise ValueError("no parts")
    for part in parts[1:]:
        if part.startswith(b"--"):
            break
        part = part.removeprefix(b"\r\n").removesuffix(b"\r\n")
        head, sep, data = part.partition(b"\r\n\r\n")
        if not sep:
            raise ValueError("part without headers")
        part_headers = {}
        for line in head.decode("utf-8", "replace").split("\r\n"):
            header, _, header_value = line.partition(":")
            part_headers[header.strip().lower()] = header_value.strip()
        disposition = _header_params(part_headers.get("content-disposition", ""))
        name = disposition.get_param("name", header="content-type")
        filename = disposition.get_param("filename", header="content-type")
        if not isinstance(name, str):
            raise ValueError("part without a name")
        value: Any
        if filename is not None:
            value = FormFile(str(filename), part_headers.get("content-type"), data)
        else:
            value = data.decode("utf-8", "replace")
        if name in form:
            existing = form[name]
            form[name] = [*existing, value] if isinstance(existing, list) else [existing, value]
        else:
            form[name] = value
    return form


# ----------------------------------------------------------------- a small model on a local server (issue 38)

# What a 0.5B instruct model on llama.cpp's server (grammar-constrained JSON) wrote into the envelope, field by
# field (issue 38: `channel` in 48 of 48 envelopes, copied from the prompt's "Channel:" line; `staff` 48;
# `picture` 40; `hack` 17; `action = search` 22).
SMALL_MODEL_FILLS: dict[str, Any] = {
    "answer": "Hello! How can I help you today?",
    "answer_needed": True,
    "channel": "a terminal session",
    "staff": "x",
    "picture": "cat",
    "picture_count": 2,
    "picture_edit": True,
    "hack": True,
    "told": "ann greeted the imp.",
    "feeling": "curious",
    "conclusion": "ann wants to talk.",
    "valence": 0.3,
    "intensity": 0.4,
    "type": "search",
    "text": "ann",
}
SMALL_MODEL_PHRASE = "1"  # what it repeats in an array nothing bounds (moment.refeels)


class SmallModel:
    """A scripted answer (``fake.script(SmallModel(), purpose="reply")``) that writes what a small model on a
    grammar-constrained server writes: every field of the schema it was sent, nullable ones filled
    (``SMALL_MODEL_FILLS``), and each array repeated as far as the grammar lets it. An array with
    ``maxItems`` stops there; one without runs on until the output cap and the answer is cut off mid-JSON —
    what llama.cpp returned in 8 of 28 reply calls. ``holds_to_schema=False``: a server that does not constrain
    decoding at all (the schema only in the prompt) — every envelope field comes back, asked or not.
    """

    def __init__(self, *, holds_to_schema: bool = True, cap_chars: int = 4096) -> None:
        self.holds_to_schema = holds_to_schema
        self.cap_chars = cap_chars  # ~1,024 tokens
        self.cut_off = 0  # answers cut off at the cap

    def __call__(self, request: RecordedRequest) -> Any:
        schema = _sent_schema(request.body)
        if not self.holds_to_schema or schema is None:
            answer = envelope(**{k: v for k, v in SMALL_MODEL_FILLS.items() if k in _ENVELOPE_KEYS})
            answer["moment"] = {"feeling": "curious", "conclusion": "ok.", "valence": 0.3, "intensity": 0.4,
                                "refeels": ["1"]}  # fmt: skip
            answer["action"] = {"type": "search", "text": "ann"}
            return answer
        value, runaway = self._fill(schema, "")
        if runaway:
            self.cut_off += 1
            return json.dumps(value)[: self.cap_chars]  # cut at the output cap: not JSON
        return value

    def _fill(self, node: Any, name: str) -> tuple[Any, bool]:
        if not isinstance(node, dict):
            return None, False
        if "anyOf" in node:  # a nullable value as llama.cpp takes it: the small model picks the value
            options = [o for o in node["anyOf"] if isinstance(o, dict) and o.get("type") != "null"]
            return self._fill(options[0], name) if options else (None, False)
        declared = node.get("type")
        kinds = declared if isinstance(declared, list) else [declared]
        kind = next((k for k in kinds if k != "null"), "null")
        if "enum" in node:
            wanted = SMALL_MODEL_FILLS.get(name)
            return (wanted if wanted in node["enum"] else node["enum"][0]), False
        if kind == "object":
            out: dict[str, Any] = {}
            runaway = False
            for key, sub in (node.get("properties") or {}).items():
                out[key], ran = self._fill(sub, key)
                runaway = runaway or ran
            return out, runaway
        if kind == "array":
            item, _ = self._fill(node.get("items") or {"type": "string"}, "")
            bound = node.get("maxItems")
            if bound is None:  # nothing stops the repetition but the output cap
                return [item if item is not None else SMALL_MODEL_PHRASE] * self.cap_chars, True
            return [item if item is not None else SMALL_MODEL_PHRASE] * int(bound), False
        if kind == "string":
            text = str(SMALL_MODEL_FILLS.get(name, SMALL_MODEL_PHRASE))
            bound = node.get("maxLength")
            return (text[: int(bound)] if bound is not None else text), False
        if kind in ("number", "integer", "boolean"):
            return SMALL_MODEL_FILLS.get(name, 0 if kind != "boolean" else True), False
        return None, False


_ENVELOPE_KEYS = frozenset(envelope())


def _sent_schema(body: Any) -> dict[str, Any] | None:
    """The JSON schema a chat/completions or Responses body asks for, or None."""
    if not isinstance(body, dict):
        return None
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and isinstance(fmt.get("json_schema"), dict):
        schema = fmt["json_schema"].get("schema")
        return schema if isinstance(schema, dict) else None
    text = body.get("text")
    if isinstance(text, dict) and isinstance(text.get("format"), dict):
        schema = text["format"].get("schema")
        return schema if isinstance(schema, dict) else None
    return None
