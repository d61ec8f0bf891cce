"""The model broker: the one place the real model key is used (docs/architecture.md, docs/protocol.md, docs/security.md).

It sends an already-judged, already-reserved request to the upstream
(``OPENAI_BASE_URL``, default OpenAI) with ``OPENAI_API_KEY``, bounded in
request size, response size and time, and returns the upstream's status, JSON
body and a few selected headers. HTTP errors (400, 429, 5xx) are results, not
exceptions: the box's responder applies its own retry rules. Only a failure
to get an answer at all raises ``UpstreamUnreachable``.

Every warm turn makes a model call, so the host's CPU per call counts (issue 18): the broker talks to httpcore's
connection pool directly (the layer under httpx: HTTP/1.1 by h11, pooled keep-alive connections, TLS by the
ssl module) with a request worked out once per path, through a thin anyio stream (``_Stream``) that leaves the
per-read time limits to the call's own. That is about a third less CPU per call than through httpx's client.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import select
import socket
import ssl
from collections.abc import AsyncIterable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import anyio
import anyio.abc
import anyio.streams.tls

try:  # the HTTP client the openai SDK ships with (httpx, published as httpx2 in newer releases)
    import httpx2 as httpx
except ImportError:  # pragma: no cover - depends on the installed openai
    import httpx  # type: ignore[no-redef]
try:  # its connection layer, shipped with it (httpcore, published as httpcore2 alongside httpx2)
    import httpcore2 as httpcore
except ImportError:  # pragma: no cover - depends on the installed openai
    import httpcore  # type: ignore[no-redef, import-not-found, unused-ignore]

from impyard.errors import ImpyardError
from impyard.gateway.audit import redact, redact_url, url_secrets
from impyard.gateway.policy_models import UpstreamSettings

OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"
PURPOSE_HEADER = "X-Impyard-Purpose"  # lets an upstream (and the test fake) see why the box asked
SELECTED_HEADERS = ("retry-after", "retry-after-ms", "x-request-id")
CONNECT_TIMEOUT_S = 10.0
# The pool's limits: httpx's defaults, as the broker had them through httpx's client.
MAX_CONNECTIONS = 100
MAX_KEEPALIVE_CONNECTIONS = 20
KEEPALIVE_EXPIRY_S = 5.0
# The user agent httpx's client sent ("python-httpx2/2.16.2"): upstreams see the same client as before.
USER_AGENT = f"python-{httpx.__name__}/{httpx.__version__}"
NO_KEY_MESSAGE = (
    "the host has no model key: set OPENAI_API_KEY in the environment of the impyard host process "
    "(and OPENAI_BASE_URL for an OpenAI-compatible server), then restart it"
)


class UpstreamUnreachable(ImpyardError):
    """No answer from the upstream. ``sent`` is True when the request may have reached it (cost possible)."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class UpstreamTimeout(UpstreamUnreachable):
    """Issue 38: the server took the request but did not answer within the call's time limit: slow, not
    unreachable. The request was ended, its connection closed (a local server stops working on it)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"the model server did not answer within {timeout_s:g} s", sent=True)
        self.timeout_s = timeout_s


@dataclass(frozen=True)
class UpstreamConfig:
    """Where the model API is and the key for it. The key never leaves the host process, and neither do
    the credentials a base URL may carry (``http://user:password@proxy/v1?key=…``, issue 11 #9): messages
    show ``display_url``, requests go to ``endpoint`` with the userinfo as an auth header. Each form is worked
    out once per config (``cached_property``): a model call reads them all (issue 18)."""

    base_url: str = field(default=OPENAI_DEFAULT_BASE_URL, repr=False)
    api_key: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> UpstreamConfig:
        env = os.environ if environ is None else environ
        return cls(
            base_url=(env.get("OPENAI_BASE_URL") or OPENAI_DEFAULT_BASE_URL).rstrip("/"),
            api_key=env.get("OPENAI_API_KEY") or None,
        )

    def __repr__(self) -> str:
        return f"UpstreamConfig(base_url={self.display_url!r}, api_key={'set' if self.api_key else None})"

    @cached_property
    def display_url(self) -> str:
        """The base URL as it may be shown: userinfo and query values replaced by [redacted]."""
        return redact_url(self.base_url)

    @cached_property
    def secrets(self) -> list[str]:
        """Everything of this config that must never be shown: the key, the URL's userinfo and query."""
        return [*([self.api_key] if self.api_key else []), *url_secrets(self.base_url)]

    @cached_property
    def endpoint(self) -> str:
        """The base URL without userinfo, query or fragment: what request paths are appended to."""
        parts = urlsplit(self.base_url)
        host = parts.netloc.rpartition("@")[2]
        return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))

    @cached_property
    def query(self) -> str:
        return urlsplit(self.base_url).query

    @cached_property
    def credentials(self) -> tuple[str, str] | None:
        """The base URL's userinfo, sent as HTTP Basic auth (as the HTTP client did with it in the URL)."""
        parts = urlsplit(self.base_url)
        if parts.username is None and parts.password is None:
            return None
        return unquote(parts.username or ""), unquote(parts.password or "")


@dataclass(frozen=True)
class UpstreamResponse:
    status: int
    body: Any
    headers: dict[str, str]


def encode_body(body: Mapping[str, Any]) -> bytes:
    """The exact bytes sent upstream (and measured against the body-size limits)."""
    try:
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:  # a lone surrogate from the box: escape it rather than send broken UTF-8
        return json.dumps(body, separators=(",", ":"), ensure_ascii=True).encode()


class ResponseTooLarge(Exception):
    pass


log = logging.getLogger("impyard.broker")

PURPOSE_HEADER_BYTES = PURPOSE_HEADER.encode("ascii")
# httpcore's errors other than failing to connect: the request may have reached the upstream. (Their names are
# httpx's names for them, which the messages below have always shown.)
HTTP_ERRORS: tuple[type[Exception], ...] = (
    httpcore.TimeoutException,
    httpcore.NetworkError,
    httpcore.ProtocolError,
    httpcore.UnsupportedProtocol,
    httpcore.ProxyError,
)


def selected_headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The response headers the box gets (``SELECTED_HEADERS``), as httpx's ``response.headers[name]`` gave
    them: names in any case, repeated values joined by ", ", text in ASCII, else UTF-8, else ISO-8859-1 (chosen
    for the whole header block, as httpx does)."""
    pairs = list(raw)
    found: dict[str, list[bytes]] = {}
    for name, value in pairs:
        key = name.lower().decode("latin-1")
        if key in SELECTED_HEADERS:
            found.setdefault(key, []).append(value)
    if not found:
        return {}
    encoding = "ascii"
    if not all(value.isascii() for values in found.values() for value in values):
        encoding = _header_encoding(pairs)
    return {
        name: ", ".join(value.decode(encoding) for value in found[name])
        for name in SELECTED_HEADERS
        if name in found
    }


def _header_encoding(pairs: list[tuple[bytes, bytes]]) -> str:
    for encoding in ("ascii", "utf-8"):
        try:
            for name, value in pairs:
                name.decode(encoding)
                value.decode(encoding)
        except UnicodeDecodeError:
            continue
        return encoding
    return "iso-8859-1"


@dataclass(frozen=True)
class _Target:
    """One upstream path under one config, worked out once: the URL as httpcore wants it, the headers every
    call to it sends (all but Content-Length and the purpose), and the URL as a log line may show it."""

    url: httpcore.URL
    headers: tuple[tuple[bytes, bytes], ...]
    shown: str

    @classmethod
    def of(cls, config: UpstreamConfig, path: str) -> _Target:
        assert config.api_key is not None
        # httpx's URL parser, as httpx's client used it: the same normalised host, port and target.
        url = httpx.URL(config.endpoint + path + (f"?{config.query}" if config.query else ""))
        credentials = config.credentials
        if credentials is not None:  # as httpx's BasicAuth did: it replaced the bearer header (issue 11 #9)
            token = base64.b64encode(f"{credentials[0]}:{credentials[1]}".encode()).decode()
            authorization = f"Basic {token}"
        else:
            authorization = f"Bearer {config.api_key}"
        headers = (
            (b"Host", url.netloc),
            (b"Accept", b"application/json"),
            # Not gzip/deflate, as httpx asked for: an answer as sent is bounded as read, with no decoder between.
            (b"Accept-Encoding", b"identity"),
            (b"Connection", b"keep-alive"),
            (b"User-Agent", USER_AGENT.encode("ascii")),
            (b"Authorization", authorization.encode("ascii")),
            (b"Content-Type", b"application/json"),
        )
        return cls(
            url=httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path),
            headers=headers,
            shown=redact_url(str(url)),
        )


class ModelBroker:
    def __init__(
        self,
        config: UpstreamConfig,
        settings: UpstreamSettings | None = None,
        *,
        network_backend: httpcore.AsyncNetworkBackend | None = None,
    ) -> None:
        self.config = config
        self.settings = settings or UpstreamSettings()
        self._network_backend = network_backend
        self._pool: httpcore.AsyncConnectionPool | None = None
        self._targets: dict[str, _Target] = {}
        self._targets_config = config

    @property
    def configured(self) -> bool:
        return bool(self.config.api_key)

    def _http(self) -> httpcore.AsyncConnectionPool:
        if self._pool is None:
            self._pool = httpcore.AsyncConnectionPool(
                # TLS verified as httpx's client verified it: the system's CA store, not SSL_CERT_FILE/DIR.
                ssl_context=httpx.create_ssl_context(trust_env=False),
                max_connections=MAX_CONNECTIONS,
                max_keepalive_connections=MAX_KEEPALIVE_CONNECTIONS,
                keepalive_expiry=KEEPALIVE_EXPIRY_S,
                # No proxy, no netrc, no cookies, no redirects: the host talks to the configured base URL only.
                network_backend=self._network_backend or _Backend(),
            )
        return self._pool

    def _target(self, path: str) -> _Target:
        if self._targets_config is not self.config:  # a new config: nothing worked out for the old one holds
            self._targets, self._targets_config = {}, self.config
        target = self._targets.get(path)
        if target is None:
            target = self._targets[path] = _Target.of(self.config, path)
        return target

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
            self._pool = None

    async def call(
        self, path: str, body: bytes, purpose: str, *, timeout_s: float | None = None
    ) -> UpstreamResponse:
        """``timeout_s``: the call's own limit (issue 38: the box's attempt timeout); else ``[upstream] timeout_s``."""
        if not self.config.api_key:
            raise UpstreamUnreachable(NO_KEY_MESSAGE, sent=False)
        if len(body) > self.settings.max_request_bytes:
            raise ValueError(f"request body of {len(body)} bytes is over {self.settings.max_request_bytes}")
        target = self._target(path)
        timeout_s = timeout_s if timeout_s is not None else self.settings.timeout_s
        request = httpcore.Request(
            b"POST",
            target.url,
            headers=[
                *target.headers,
                (b"Content-Length", b"%d" % len(body)),
                (PURPOSE_HEADER_BYTES, purpose.encode("ascii")),
            ],
            content=body,
            # The time bounds httpx's client had: connect 10 s, and the call's own for the pool, each write and
            # each read; the whole call is bounded by that too, so ``_Stream`` leaves reads and writes to it.
            extensions={
                "timeout": {
                    "connect": CONNECT_TIMEOUT_S,
                    "read": timeout_s,
                    "write": timeout_s,
                    "pool": timeout_s,
                }
            },
        )
        try:
            with anyio.fail_after(timeout_s):  # a whole-call bound; httpcore's are per read
                response = await self._http().handle_async_request(request)
                if log.isEnabledFor(logging.INFO):
                    _log_request_line(target, response)
                try:
                    raw = await self._read_bounded(response.stream)
                finally:
                    await response.aclose()
        except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
            raise UpstreamUnreachable(
                f"cannot connect to the model API at {self.config.display_url}: {type(exc).__name__}",
                sent=False,
            ) from exc
        except (TimeoutError, httpcore.ReadTimeout, httpcore.WriteTimeout, httpcore.PoolTimeout) as exc:
            raise UpstreamTimeout(timeout_s) from exc  # issue 38: connected, so slow, not unreachable
        except ResponseTooLarge as exc:
            raise UpstreamUnreachable(str(exc), sent=True) from exc
        except HTTP_ERRORS as exc:
            raise UpstreamUnreachable(
                f"the model API connection failed: {type(exc).__name__}", sent=True
            ) from exc
        return UpstreamResponse(response.status, self._decode(raw), selected_headers(response.headers))

    async def _read_bounded(self, stream: Iterable[bytes] | AsyncIterable[bytes]) -> bytes:
        assert isinstance(stream, AsyncIterable)
        limit = self.settings.max_response_bytes
        chunks: list[bytes] = []
        total = 0
        async for chunk in stream:
            total += len(chunk)
            if total > limit:  # refused as it passes the limit: the rest is never read
                raise ResponseTooLarge(f"the model API's answer is over the {limit}-byte limit")
            chunks.append(chunk)
        return b"".join(chunks)

    def _decode(self, raw: bytes) -> Any:
        text = raw.decode("utf-8", errors="replace")
        if (
            self.config.api_key and self.config.api_key in text
        ):  # never hand the key to the box, even if echoed
            text = text.replace(self.config.api_key, "[redacted]")
        text = redact(text, self.config.secrets)  # nor the base URL's credentials (issue 11 #9)
        try:
            return json.loads(text) if text.strip() else None
        except ValueError:
            return {
                "error": {
                    "message": "the model API answered with something that is not JSON",
                    "text": text[:1000],
                }
            }


def _log_request_line(target: _Target, response: httpcore.Response) -> None:
    """The line httpx's client logged once an answer's head was in, with the URL as it may be shown."""
    extensions = response.extensions
    log.info(
        'HTTP Request: POST %s "%s %d %s"',
        target.shown,
        extensions.get("http_version", b"HTTP/1.1").decode("ascii", "replace"),
        response.status,
        extensions.get("reason_phrase", b"").decode("ascii", "replace"),
    )


# ------------------------------------------------------------------ the network layer under httpcore's pool


class _Stream(httpcore.AsyncNetworkStream):
    """A connection as httpcore's pool reads and writes it: httpcore's own anyio stream, less two costs of each
    call (issue 18). No time limit of its own on a read or a write: the broker's whole-call limit, the same
    length and started before, bounds each of them (connecting and the TLS handshake keep theirs). And the raw
    socket looked up once: the pool asks before each reuse whether an idle connection is readable, which anyio
    answers by building its whole attribute table, ``getpeername`` included."""

    def __init__(self, stream: anyio.abc.ByteStream, sock: socket.socket) -> None:
        self._stream = stream
        self._socket = sock

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            return await self._stream.receive(max_bytes)
        except anyio.EndOfStream:
            return b""
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise httpcore.ReadError(exc) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            await self._stream.send(buffer)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream) as exc:
            raise httpcore.WriteError(exc) from exc

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        try:
            try:
                with anyio.fail_after(timeout):
                    tls = await anyio.streams.tls.TLSStream.wrap(
                        self._stream,
                        ssl_context=ssl_context,
                        hostname=server_hostname,
                        standard_compatible=False,
                        server_side=False,
                    )
            except Exception:
                await self.aclose()
                raise
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(exc) from exc
        except (anyio.BrokenResourceError, anyio.EndOfStream, ssl.SSLError) as exc:
            raise httpcore.ConnectError(exc) from exc
        return _Stream(tls, self._socket)

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":  # an idle connection with data waiting is one the upstream is closing
            return _readable(self._socket)
        if info == "ssl_object":
            return self._stream.extra(anyio.streams.tls.TLSAttribute.ssl_object, None)
        if info == "client_addr":
            return self._stream.extra(anyio.abc.SocketAttribute.local_address, None)
        if info == "server_addr":
            return self._stream.extra(anyio.abc.SocketAttribute.remote_address, None)
        if info == "socket":
            return self._socket
        return None


def _readable(sock: socket.socket) -> bool:
    fileno = sock.fileno()
    if fileno < 0:  # closed: as good as readable (the next read is the end)
        return True
    poller = select.poll()
    poller.register(fileno, select.POLLIN)
    return bool(poller.poll(0))


class _Backend(httpcore.AsyncNetworkBackend):
    """httpcore's anyio backend, connecting the same way (``anyio.connect_tcp`` within the connect limit),
    handing out ``_Stream``s."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            with anyio.fail_after(timeout):
                stream = await anyio.connect_tcp(host, port, local_host=local_address)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(exc) from exc
        except (OSError, anyio.BrokenResourceError) as exc:
            raise httpcore.ConnectError(exc) from exc
        sock = stream.extra(anyio.abc.SocketAttribute.raw_socket)
        for option in socket_options or ():
            sock.setsockopt(*option)
        return _Stream(stream, sock)

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)
