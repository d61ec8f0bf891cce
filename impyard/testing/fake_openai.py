"""A loopback fake of the OpenAI HTTP API, for tests and the benchmark (docs/contributing.md).

The real ``openai`` SDK (or any HTTP client) talks to it over 127.0.0.1. It
answers from scripted rules matched by endpoint, by the host's purpose header
and by the structured-output schema name, and records every request it gets::

    with FakeOpenAI() as fake:
        fake.script(envelope(answer="hi"), purpose="reply", times=1)
        fake.script(error(429, "slow down", retry_after=2), path="/embeddings")
        client = openai.OpenAI(base_url=fake.base_url, api_key=fake.api_key, max_retries=0)
        ...
        assert fake.requests_for("/chat/completions")[0].body["model"] == "gpt-x"

It is a standard-library ``HTTPServer`` on its own thread, one thread per
connection, HTTP/1.1 keep-alive with Content-Length, so it works the same from
sync and async tests. ``stop()`` closes open keep-alive connections, interrupts
pending delays and joins every thread it started.

Endpoints (all POST, under ``/v1``): ``/chat/completions``, ``/responses``,
``/embeddings``, ``/images/generations``, ``/images/edits`` (multipart). Paths
given to :meth:`FakeOpenAI.script` and :meth:`FakeOpenAI.requests_for` may be
written with or without the ``/v1`` prefix. Streaming (``stream: true``) is
refused with a 400: nothing in impyard streams.
"""

from __future__ import annotations

import base64
import email.message
import hashlib
import http.server
import json
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
    "DEFAULT_API_KEY",
    "DEFAULT_ENVELOPE",
    "ENDPOINTS",
    "PURPOSE_HEADER",
    "TINY_PNG",
    "TINY_PNG_B64",
    "Delayed",
    "FakeOpenAI",
    "FakeResponse",
    "FormFile",
    "RecordedRequest",
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
    """

    def __init__(
        self,
        *,
        api_key: str | None = DEFAULT_API_KEY,
        default_answer: Any = DEFAULT_ENVELOPE,
        latency_s: float = 0.0,
        host: str = "127.0.0.1",
    ) -> None:
        self.api_key = api_key
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
        if delay > 0 and self._stopping.wait(delay):
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

    def _render_embeddings(
        self, request: RecordedRequest, answer: Any, usage: dict[str, int] | None
    ) -> dict[str, Any]:
        body = request.body
        texts = _embedding_inputs(body.get("input"))
        dimensions = body.get("dimensions") or DEFAULT_EMBEDDING_DIMENSIONS
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
    if hasattr(answer, "model_dump_json"):  # a pydantic model, e.g. box.envelope.Envelope
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
