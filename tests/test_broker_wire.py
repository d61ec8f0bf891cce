"""The model broker on the wire (issue 18): what an upstream gets, what the broker makes of what it answers, and
every bound and error rule kept when the broker went from httpx's client to httpcore's pool.

The upstreams here are loopback sockets (``RawUpstream``: each connection served by a plain function in a
thread) or the fake OpenAI; TLS ones carry a certificate made for the test by the ``openssl`` command.
"""

from __future__ import annotations

import logging
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import pytest

from impyard.gateway import broker as broker_module
from impyard.gateway.broker import (
    ModelBroker,
    UpstreamConfig,
    UpstreamResponse,
    UpstreamTimeout,
    UpstreamUnreachable,
    encode_body,
    httpcore,
    selected_headers,
)
from impyard.gateway.policy_models import UpstreamSettings
from testing.fake_openai import FakeOpenAI

pytestmark = pytest.mark.anyio

KEY = "sk-impyard-test-wire-8c1d"
USER, PASSWORD, QUERY_KEY = "wire-user-31ab", "wire-pass-77cd", "wire-query-90ef"
CHAT = {"model": "gpt-4.1-mini", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 20}
BODY = encode_body(CHAT)


# ------------------------------------------------------------------ a loopback upstream


Handler = Callable[["Wire"], None]


class Wire:
    """One accepted connection, as a handler sees it: read a request, write raw bytes."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buffer = b""

    def request(self) -> bytes | None:
        """The next request's head and body (Content-Length framed); None when the client closed."""
        while b"\r\n\r\n" not in self.buffer:
            data = self.conn.recv(65536)
            if not data:
                return None
            self.buffer += data
        head, _, rest = self.buffer.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            data = self.conn.recv(65536)
            if not data:
                return None
            rest += data
        self.buffer = rest[length:]
        return head + b"\r\n\r\n" + rest[:length]

    def send(self, data: bytes) -> None:
        self.conn.sendall(data)

    def answer(self, status: str, body: bytes, headers: Sequence[tuple[str, str]] = ()) -> None:
        lines = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", *(f"{n}: {v}" for n, v in headers)]
        self.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)

    def until_closed(self) -> None:
        while self.conn.recv(65536):
            pass


class RawUpstream:
    """A loopback server whose every connection is served by ``handler`` in its own thread (TLS when given a
    server context). ``connections`` counts the connections accepted; ``finished`` those whose handler
    returned without a socket error (the client stayed to the end)."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.port: int = self.listener.getsockname()[1]
        self.connections = 0
        self.finished = 0
        self.closed = threading.Event()  # set when a handler has returned and its socket is closed
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> RawUpstream:
        self._threads.append(threading.Thread(target=self._accept, daemon=True))
        self._threads[0].start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        for thread in list(self._threads):
            thread.join(10)
        self.listener.close()

    def base_url(self, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}/v1"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.connections += 1
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        try:
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            with conn:
                self.handler(Wire(conn))
            self.finished += 1
        except (OSError, ssl.SSLError):
            pass  # the client went away (or refused our certificate)
        finally:
            conn.close()
            self.closed.set()


def ok(wire: Wire) -> None:
    """Answers every request on the connection, keeping it open."""
    while wire.request() is not None:
        wire.answer("200 OK", b'{"ok": true}', [("Content-Type", "application/json")])


def dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def secret_url(port: int, scheme: str = "http") -> str:
    return f"{scheme}://{USER}:{PASSWORD}@127.0.0.1:{port}/v1?key={QUERY_KEY}"


async def call(
    base_url: str, settings: UpstreamSettings | None = None, body: bytes = BODY, **options: Any
) -> UpstreamResponse:
    broker = ModelBroker(UpstreamConfig(base_url=base_url, api_key=KEY), settings, **options)
    try:
        return await broker.call("/chat/completions", body, "reply")
    finally:
        await broker.aclose()


# ------------------------------------------------------------------ what the upstream gets


async def test_the_upstream_gets_the_body_and_these_headers() -> None:
    with FakeOpenAI(api_key=KEY) as fake:
        response = await call(fake.base_url)
        [request] = fake.requests
        port = fake.base_url.split(":")[2].split("/")[0]
    assert response.status == 200 and request.path == "/v1/chat/completions" and request.raw == BODY
    user_agent = request.headers.pop("user-agent")
    assert user_agent.startswith("python-httpx")  # as httpx's client sent it
    assert request.headers == {
        "host": f"127.0.0.1:{port}",
        "accept": "application/json",
        "accept-encoding": "identity",  # an answer is bounded as sent: nothing to decompress
        "connection": "keep-alive",
        "authorization": f"Bearer {KEY}",
        "content-type": "application/json",
        "x-impyard-purpose": "reply",
        "content-length": str(len(BODY)),
    }


async def test_a_body_over_the_request_limit_is_refused_before_anything_is_sent() -> None:
    settings = UpstreamSettings(max_request_bytes=len(BODY))
    with FakeOpenAI(api_key=KEY) as fake:
        assert (await call(fake.base_url, settings)).status == 200  # exactly the limit: sent
        with pytest.raises(ValueError) as caught:
            await call(fake.base_url, settings, body=BODY + b" ")
        assert len(fake.requests) == 1
    assert str(caught.value) == f"request body of {len(BODY) + 1} bytes is over {len(BODY)}"


async def test_proxy_settings_in_the_environment_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = f"http://127.0.0.1:{dead_port()}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, proxy)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with FakeOpenAI(api_key=KEY) as fake:
        response = await call(fake.base_url)
        assert response.status == 200 and len(fake.requests) == 1  # straight to the base URL, as before


async def test_a_new_config_sends_the_next_call_to_its_own_base_url() -> None:
    with FakeOpenAI(api_key=KEY) as first, FakeOpenAI(api_key="sk-impyard-other-4e2a") as second:
        broker = ModelBroker(UpstreamConfig(base_url=first.base_url, api_key=KEY))
        await broker.call("/chat/completions", BODY, "reply")
        broker.config = UpstreamConfig(base_url=second.base_url, api_key="sk-impyard-other-4e2a")
        response = await broker.call("/chat/completions", BODY, "reply")
        await broker.aclose()
        assert (len(first.requests), len(second.requests), response.status) == (1, 1, 200)
        assert second.requests[0].headers["authorization"] == "Bearer sk-impyard-other-4e2a"


async def test_the_connect_limit_is_ten_seconds() -> None:
    class Recording(httpcore.AsyncNetworkBackend):
        def __init__(self) -> None:
            self.inner = httpcore.AnyIOBackend()
            self.timeouts: list[float | None] = []

        async def connect_tcp(
            self,
            host: str,
            port: int,
            timeout: float | None = None,
            local_address: str | None = None,
            socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
        ) -> httpcore.AsyncNetworkStream:
            self.timeouts.append(timeout)
            return await self.inner.connect_tcp(host, port, timeout, local_address, socket_options)

    backend = Recording()
    with RawUpstream(ok) as upstream:
        response = await call(upstream.base_url(), UpstreamSettings(timeout_s=30), network_backend=backend)
    assert response.status == 200 and backend.timeouts == [10.0]


# ------------------------------------------------------------------ what the broker makes of an answer


SELECTED = [
    ([], {}),
    ([(b"Content-Type", b"application/json")], {}),
    ([(b"Retry-After", b"3")], {"retry-after": "3"}),
    (
        [(b"x-request-id", b"a"), (b"Retry-After-Ms", b"250"), (b"X-REQUEST-ID", b"b")],
        {"retry-after-ms": "250", "x-request-id": "a, b"},
    ),
    ([(b"x-request-id", "é".encode())], {"x-request-id": "é"}),  # UTF-8 …
    ([(b"x-request-id", b"\xe9")], {"x-request-id": "é"}),  # … else ISO-8859-1
    ([(b"x-other", b"\xe9"), (b"x-request-id", "é".encode())], {"x-request-id": "Ã©"}),  # for the whole block
]


@pytest.mark.parametrize(("raw", "expected"), SELECTED)
def test_the_selected_headers_are_read_as_httpx_read_them(
    raw: list[tuple[bytes, bytes]], expected: dict[str, str]
) -> None:
    assert selected_headers(raw) == expected


async def test_an_error_status_is_a_result_with_its_body_and_selected_headers() -> None:
    def limited(wire: Wire) -> None:
        wire.request()
        headers = [
            ("Retry-After", "7"),
            ("X-Request-Id", "req-a"),
            ("x-request-id", "req-b"),
            ("Retry-After-Ms", "7000"),
            ("X-Other", "z"),
        ]
        wire.answer("429 Too Many Requests", b'{"error": {"message": "slow down"}}', headers)

    with RawUpstream(limited) as upstream:
        response = await call(upstream.base_url())
    assert response == UpstreamResponse(
        429,
        {"error": {"message": "slow down"}},
        {"retry-after": "7", "retry-after-ms": "7000", "x-request-id": "req-a, req-b"},
    )


async def test_the_request_line_is_logged_with_the_url_as_it_may_be_shown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with RawUpstream(ok) as upstream, caplog.at_level(logging.INFO):
        await call(secret_url(upstream.port))
    lines = [record.getMessage() for record in caplog.records if "HTTP Request" in record.getMessage()]
    assert lines == [
        f"HTTP Request: POST http://127.0.0.1:{upstream.port}/v1/chat/completions?key=[redacted] "
        '"HTTP/1.1 200 OK"'
    ]


# ------------------------------------------------------------------ the response-size bound


def endless(chunked: bool) -> Handler:
    """Answers with far more than any limit (64 MiB), as one body or as chunks; stops when the client goes."""

    def handler(wire: Wire) -> None:
        wire.request()
        framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {64 * 2**20}"
        wire.send(f"HTTP/1.1 200 OK\r\n{framing}\r\n\r\n".encode())
        piece = b"x" * 65536
        for _ in range(1024):
            wire.send(b"10000\r\n" + piece + b"\r\n" if chunked else piece)
        if chunked:
            wire.send(b"0\r\n\r\n")

    return handler


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_an_answer_over_the_limit_is_refused_without_reading_it_all(chunked: bool) -> None:
    with RawUpstream(endless(chunked)) as upstream:
        with pytest.raises(UpstreamUnreachable) as caught:
            await call(upstream.base_url(), UpstreamSettings(max_response_bytes=100_000))
        await anyio.to_thread.run_sync(upstream.closed.wait, 10)
    assert (str(caught.value), caught.value.sent) == (
        "the model API's answer is over the 100000-byte limit",
        True,
    )
    assert upstream.finished == 0  # the broker hung up: the upstream could not send it all


@pytest.mark.parametrize(("size", "refused"), [(100_000, False), (100_001, True)])
async def test_the_limit_counts_the_answers_bytes(size: int, refused: bool) -> None:
    def sized(wire: Wire) -> None:
        wire.request()
        wire.answer("200 OK", b'"' + b"a" * (size - 2) + b'"')

    with RawUpstream(sized) as upstream:
        try:
            response = await call(upstream.base_url(), UpstreamSettings(max_response_bytes=100_000))
        except UpstreamUnreachable as exc:
            assert refused and str(exc) == "the model API's answer is over the 100000-byte limit"
        else:
            assert not refused and response.body == "a" * (size - 2)


# ------------------------------------------------------------------ the time bound and the error rules


def trickle(wire: Wire) -> None:
    """Answers one byte at a time, each quickly, the whole slowly (2.5 s for 50 bytes)."""
    wire.request()
    wire.send(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n")
    for _ in range(50):
        time.sleep(0.05)
        wire.send(b" ")


async def test_the_whole_call_is_bounded_though_every_read_is_quick() -> None:
    with RawUpstream(trickle) as upstream:
        with pytest.raises(UpstreamUnreachable) as caught:
            await call(upstream.base_url(), UpstreamSettings(timeout_s=0.5))
    # Issue 38: a server that took the request and was slow is called slow, not unreachable.
    assert (str(caught.value), caught.value.sent) == ("the model server did not answer within 0.5 s", True)
    assert isinstance(caught.value, UpstreamTimeout)


def closes_unanswered(wire: Wire) -> None:
    wire.request()


def answers_not_http(wire: Wire) -> None:
    wire.request()
    wire.send(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")


def breaks_off(wire: Wire) -> None:
    wire.request()
    wire.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"{" * 10)


def silent(wire: Wire) -> None:
    wire.request()
    wire.until_closed()


FAILURES: list[tuple[Handler | None, str, bool]] = [
    (None, "cannot connect to the model API at {shown}: ConnectError", False),  # nothing listens
    (closes_unanswered, "the model API connection failed: RemoteProtocolError", True),
    (answers_not_http, "the model API connection failed: RemoteProtocolError", True),
    (breaks_off, "the model API connection failed: RemoteProtocolError", True),
    (silent, "the model server did not answer within 0.3 s", True),  # issue 38: slow, not unreachable
]


@pytest.mark.parametrize(
    ("handler", "message", "sent"),
    FAILURES,
    ids=["refused", "closed-unanswered", "not-http", "broken-off", "silent"],
)
async def test_a_failure_says_whether_the_request_may_have_been_sent_and_no_secret(
    handler: Handler | None, message: str, sent: bool
) -> None:
    settings = UpstreamSettings(timeout_s=0.3)
    if handler is None:
        port = dead_port()
        with pytest.raises(UpstreamUnreachable) as caught:
            await call(secret_url(port), settings)
    else:
        with RawUpstream(handler) as upstream:
            port = upstream.port
            with pytest.raises(UpstreamUnreachable) as caught:
                await call(secret_url(port), settings)
    shown = f"http://[redacted]@127.0.0.1:{port}/v1?key=[redacted]"
    assert (str(caught.value), caught.value.sent) == (message.format(shown=shown), sent)
    assert isinstance(caught.value, UpstreamTimeout) == (handler is silent)  # issue 38: only the slow one
    assert [s for s in (KEY, USER, PASSWORD, QUERY_KEY) if s in str(caught.value) + repr(caught.value)] == []


# ------------------------------------------------------------------ pooled connections


async def test_one_connection_serves_call_after_call() -> None:
    with RawUpstream(ok) as upstream:
        broker = ModelBroker(UpstreamConfig(base_url=upstream.base_url(), api_key=KEY))
        statuses = [(await broker.call("/chat/completions", BODY, "reply")).status for _ in range(3)]
        await broker.aclose()
    assert (statuses, upstream.connections) == ([200, 200, 200], 1)


async def test_a_connection_the_upstream_closed_while_idle_is_not_reused() -> None:
    def answers_once(wire: Wire) -> None:  # keep-alive as far as the client knows, then closed
        wire.request()
        wire.answer("200 OK", b"{}")

    with RawUpstream(answers_once) as upstream:
        broker = ModelBroker(UpstreamConfig(base_url=upstream.base_url(), api_key=KEY))
        first = await broker.call("/chat/completions", BODY, "reply")
        await anyio.to_thread.run_sync(upstream.closed.wait, 10)
        second = await broker.call("/chat/completions", BODY, "reply")
        await broker.aclose()
    assert (first.status, second.status, upstream.connections) == (200, 200, 2)


# ------------------------------------------------------------------ TLS


@pytest.fixture
def certificates(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A test CA and a server certificate it signed for 127.0.0.1: (ca.pem, server.pem, server.key)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tmp_path, check=True, capture_output=True)

    openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
        "-subj", "/CN=impyard test CA", "-keyout", "ca.key", "-out", "ca.pem",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-subj", "/CN=127.0.0.1", "-keyout", "server.key", "-out", "server.csr",
    )  # fmt: skip
    (tmp_path / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
    )
    openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "2", "-extfile", "server.ext", "-out", "server.pem",
    )  # fmt: skip
    return tmp_path / "ca.pem", tmp_path / "server.pem", tmp_path / "server.key"


@pytest.fixture
def tls_upstream(certificates: tuple[Path, Path, Path]) -> Iterator[RawUpstream]:
    _ca, cert, key = certificates
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    with RawUpstream(ok, tls=server) as upstream:
        yield upstream


async def test_an_upstream_certificate_is_checked_against_the_systems_cas_only(
    tls_upstream: RawUpstream, certificates: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    ca, _cert, _key = certificates
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))  # as before: the environment does not add a CA
    monkeypatch.setenv("SSL_CERT_DIR", str(ca.parent))
    with pytest.raises(UpstreamUnreachable) as caught:
        await call(tls_upstream.base_url("https"))
    assert (str(caught.value), caught.value.sent) == (
        f"cannot connect to the model API at https://127.0.0.1:{tls_upstream.port}/v1: ConnectError",
        False,
    )
    assert tls_upstream.finished == 0


async def test_a_verified_upstream_answers_over_one_tls_connection(
    tls_upstream: RawUpstream, certificates: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    ca, _cert, _key = certificates
    trusted: list[ssl.SSLContext] = []

    def trusting_the_test_ca(**options: Any) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(ca))
        trusted.append(context)
        return context

    monkeypatch.setattr(broker_module.httpx, "create_ssl_context", trusting_the_test_ca)
    broker = ModelBroker(UpstreamConfig(base_url=tls_upstream.base_url("https"), api_key=KEY))
    answers = [await broker.call("/chat/completions", BODY, "reply") for _ in range(2)]
    await broker.aclose()
    assert [(a.status, a.body) for a in answers] == [(200, {"ok": True})] * 2
    assert (len(trusted), tls_upstream.connections) == (1, 1)
