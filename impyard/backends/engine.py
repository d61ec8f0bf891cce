"""A thin client of the Docker Engine's API socket for the box's stdio (issue 18): create the container, attach a
hijacked stdio stream, wait for it, start it, remove it — no ``docker run`` client process per box.

The engine is asked exactly what ``docker run -i --rm`` asks it (create → attach → wait → start), so the
container is the same; the attach stream is demultiplexed (``impyard.backends.multiplex``) into stdout and
stderr as the bytes arrive, in asyncio's protocol callbacks: no reader task, no poll per chunk, no relay
process. The lifecycle outside a box's hot path (preflight, orphans, inspect) stays with the docker SDK.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from signal import Signals
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream, Process

from impyard.backends.multiplex import STDERR, STDOUT, MultiplexDecoder, MultiplexError
from impyard.backends.runflags import CreateRequest

log = logging.getLogger("impyard.box")

DEFAULT_SOCKET = "/var/run/docker.sock"
ENGINE_CALL_TIMEOUT_S = 60.0  # create and start under a burst of boxes can take the engine a while
MAX_HEAD_BYTES = 65_536
MAX_BODY_BYTES = 4 * 1024 * 1024
STREAM_BUFFER_BYTES = 1024 * 1024  # past this much unread stdout or stderr, the socket is not read (a pipe)
UNKNOWN_EXIT = 255  # the engine could not say how the box ended

_P = TypeVar("_P", bound=asyncio.BaseProtocol)


class EngineError(Exception):
    """The engine refused a request (``status``: its HTTP status; 0: it could not be reached)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# ------------------------------------------------------------------ HTTP/1.1, as little as the engine needs


def http_request(method: str, path: str, body: Any = None, *, upgrade: bool = False) -> bytes:
    """One request; ``upgrade``: ask to hijack the connection for a raw stream (the engine answers 101)."""
    payload = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
    lines = [f"{method} {path} HTTP/1.1", "Host: docker"]
    if body is not None:
        lines.append("Content-Type: application/json")
    lines.append(f"Content-Length: {len(payload)}")
    lines += ["Connection: Upgrade", "Upgrade: tcp"] if upgrade else ["Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body.strip() else None

    def message(self) -> str:
        """The engine's own words for an error (``{"message": …}``), one line."""
        try:
            value = self.json()
        except ValueError:
            value = None
        text = value.get("message") if isinstance(value, dict) else self.body.decode(errors="replace")
        return " ".join(str(text or f"HTTP {self.status}").split())[:500]


def split_head(data: bytes | bytearray) -> tuple[int, dict[str, str], int] | None:
    """The status, the headers (lower-case names) and where the body starts; None while the head is incomplete."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        if len(data) > MAX_HEAD_BYTES:
            raise EngineError(0, "the engine's response head is too long")
        return None
    status_line, *lines = bytes(data[:end]).decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise EngineError(0, f"not an HTTP response from the engine: {status_line[:80]!r}")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers, end + 4


def dechunk(data: bytes) -> bytes:
    """A chunked body (``Transfer-Encoding: chunked``) as its bytes; what is cut off at EOF is dropped."""
    out, at = bytearray(), 0
    while True:
        line_end = data.find(b"\r\n", at)
        if line_end < 0:
            return bytes(out)
        try:
            size = int(data[at:line_end].split(b";")[0].strip() or b"0", 16)
        except ValueError:
            raise EngineError(0, "the engine's chunked response is malformed") from None
        if size == 0:
            return bytes(out)
        out += data[line_end + 2 : line_end + 2 + size]
        at = line_end + 2 + size + 2


def parse_response(data: bytes) -> Response:
    """A whole response (the connection closed after it: ``Connection: close``)."""
    head = split_head(data)
    if head is None:
        raise EngineError(0, "the engine closed the connection before answering")
    status, headers, start = head
    body = bytes(data[start:])
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = dechunk(body)
    elif headers.get("content-length", "").isdigit():
        body = body[: int(headers["content-length"])]
    return Response(status, headers, body)


class _Exchange(asyncio.Protocol):
    """One request on its own connection; the engine closes it once the response is complete."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.head_seen = asyncio.Event()
        self.done = asyncio.Event()
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data += data
        if len(self.data) > MAX_HEAD_BYTES + MAX_BODY_BYTES:
            self.data.clear()  # never from a sane engine; the response then reads as cut off
            assert self.transport is not None
            self.transport.close()
        elif not self.head_seen.is_set() and b"\r\n\r\n" in self.data:
            self.head_seen.set()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.head_seen.set()
        self.done.set()

    def response(self) -> Response:
        return parse_response(bytes(self.data))


# ------------------------------------------------------------------ the attached stdio


class _Attach(asyncio.Protocol):
    """The hijacked attach connection: the engine's answer, then the multiplexed stream, split as it arrives."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.head = bytearray()
        self.head_seen = asyncio.Event()
        self.status: int | None = None
        self.refusal = b""
        self._decoder = MultiplexDecoder()
        self._chunks: dict[int, deque[bytes]] = {STDOUT: deque(), STDERR: deque()}
        self._sizes = {STDOUT: 0, STDERR: 0}
        self._readable = {STDOUT: asyncio.Event(), STDERR: asyncio.Event()}
        self._paused = False
        self.writable = asyncio.Event()
        self.writable.set()
        self.ended = False
        self.broken: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.status is None:
            self.head += data
            try:
                head = split_head(self.head)
            except EngineError as exc:
                self._break(exc.message)
                return
            if head is None:
                return
            self.status, _headers, start = head
            data, self.head = bytes(self.head[start:]), bytearray()
            self.head_seen.set()
        if self.status not in (101, 200):
            self.refusal = (self.refusal + data)[:MAX_HEAD_BYTES]
            return
        try:
            pieces = self._decoder.feed(data)
        except MultiplexError as exc:
            self._break(str(exc))
            return
        for stream, payload in pieces:
            self._chunks[stream].append(payload)
            self._sizes[stream] += len(payload)
            self._readable[stream].set()
        if not self._paused and max(self._sizes.values()) > STREAM_BUFFER_BYTES:
            assert self.transport is not None
            self.transport.pause_reading()  # the box blocks on its pipe until the host reads on
            self._paused = True

    def _break(self, reason: str) -> None:
        self.broken = reason
        log.error("the engine's attach stream broke: %s", reason)
        if self.transport is not None:
            self.transport.close()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.head_seen.set()
        self.writable.set()
        for event in self._readable.values():
            event.set()
        if self._decoder.inside_frame:
            log.warning("the engine's attach stream ended inside a frame")

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    async def receive(self, stream: int, max_bytes: int) -> bytes:
        chunks = self._chunks[stream]
        while not chunks:
            if self.ended:
                raise anyio.EndOfStream
            await self._readable[stream].wait()
        chunk = chunks.popleft()
        if len(chunk) > max_bytes:
            chunks.appendleft(chunk[max_bytes:])
            chunk = chunk[:max_bytes]
        self._sizes[stream] -= len(chunk)
        if not chunks and not self.ended:
            self._readable[stream].clear()
        if self._paused and max(self._sizes.values()) <= STREAM_BUFFER_BYTES // 2:
            assert self.transport is not None
            self.transport.resume_reading()
            self._paused = False
        return chunk


class _Output(ByteReceiveStream):
    def __init__(self, attach: _Attach, stream: int) -> None:
        self._attach = attach
        self._stream = stream

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return await self._attach.receive(self._stream, max_bytes)

    async def aclose(self) -> None:
        pass  # the connection is the box's: closed with it


class _Input(ByteSendStream):
    """The box's stdin; closing it half-closes the connection, which closes stdin in the box (``StdinOnce``)."""

    def __init__(self, attach: _Attach) -> None:
        self._attach = attach
        self._closed = False

    async def send(self, item: bytes) -> None:
        transport = self._attach.transport
        if self._closed:
            raise anyio.ClosedResourceError
        if transport is None or self._attach.ended or transport.is_closing():
            raise anyio.BrokenResourceError
        transport.write(item)
        if not self._attach.writable.is_set():
            await self._attach.writable.wait()
            if self._attach.ended:
                raise anyio.BrokenResourceError

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        transport = self._attach.transport
        if transport is not None and not transport.is_closing() and transport.can_write_eof():
            try:
                transport.write_eof()
            except (OSError, RuntimeError):
                pass


class AttachedBox(Process):
    """A started container seen as a process: its stdio through the attach stream, its exit code through the
    engine's wait. It has no host process of the supervisor's own: it is stopped through ``remove``."""

    def __init__(self, engine: Engine, container_id: str, attach: _Attach, waiter: _Exchange) -> None:
        self.engine = engine
        self.container_id = container_id
        self._attach = attach
        self._waiter = waiter
        self._stdin = _Input(attach)
        self._stdout = _Output(attach, STDOUT)
        self._stderr = _Output(attach, STDERR)
        self._returncode: int | None = None
        self.removed = False

    async def wait(self) -> int:
        if self._returncode is None:
            await self._waiter.done.wait()
            if self._returncode is None:
                self._returncode = await self._exit_code()
        return self._returncode

    async def _exit_code(self) -> int:
        """The engine's answer to ``wait?condition=removed``; the container is gone once it answers."""
        try:
            answer = self._waiter.response()
            body = answer.json() if answer.status == 200 else None
        except (EngineError, ValueError):
            body = None
        if isinstance(body, dict) and isinstance(body.get("StatusCode"), int):
            self.removed = True
            error = body.get("Error")
            if isinstance(error, dict) and error.get("Message"):
                log.warning("the engine reported on box %s: %s", self.container_id[:12], error["Message"])
            return int(body["StatusCode"])
        log.warning("the engine's wait for box %s ended without an exit code", self.container_id[:12])
        return UNKNOWN_EXIT

    async def remove(self) -> None:
        """Kill the container and remove it, unless the engine already has (``--rm``)."""
        if self.removed:
            return
        await self.engine.remove(self.container_id)
        self.removed = True

    def terminate(self) -> None:
        raise NotImplementedError("a container is stopped with `await AttachedBox.remove()`")

    def kill(self) -> None:
        raise NotImplementedError("a container is stopped with `await AttachedBox.remove()`")

    def send_signal(self, signal: Signals) -> None:
        raise NotImplementedError("a container is signalled through the engine, not the host's kill(2)")

    @property
    def pid(self) -> int:
        raise NotImplementedError("a box attached through the engine has no process of the supervisor's")

    @property
    def returncode(self) -> int | None:
        return self._returncode

    @property
    def stdin(self) -> ByteSendStream:
        return self._stdin

    @property
    def stdout(self) -> ByteReceiveStream:
        return self._stdout

    @property
    def stderr(self) -> ByteReceiveStream:
        return self._stderr

    async def aclose(self) -> None:
        for transport in (self._attach.transport, self._waiter.transport):
            if transport is not None and not transport.is_closing():
                transport.close()


# ------------------------------------------------------------------ the engine


def engine_address(environ: Mapping[str, str] | None = None) -> str:
    """The engine's unix socket, from ``DOCKER_HOST`` as the docker CLI and SDK read it."""
    env = os.environ if environ is None else environ
    host = env.get("DOCKER_HOST", "").strip()
    if not host:
        return DEFAULT_SOCKET
    if host.startswith("unix://"):
        return host[len("unix://") :]
    raise EngineError(
        0, f"DOCKER_HOST={host} is not a unix socket: boxes attach through the engine's local socket only"
    )


class Engine:
    """The engine's API over its unix socket, one connection per request (and one per attach and wait)."""

    def __init__(self, socket_path: str | None = None) -> None:
        self.socket_path = socket_path

    async def _connect(self, factory: Callable[[], _P]) -> tuple[asyncio.Transport, _P]:
        path = self.socket_path or engine_address()
        try:
            transport, protocol = await asyncio.get_running_loop().create_unix_connection(factory, path)
        except OSError as exc:
            raise EngineError(
                0, f"the Docker engine's socket {path} is not reachable ({exc.strerror or exc})"
            ) from exc
        return transport, protocol

    async def call(
        self, method: str, path: str, body: Any = None, *, timeout: float = ENGINE_CALL_TIMEOUT_S
    ) -> Response:
        """One request; an ``EngineError`` for an answer of 400 or more."""
        transport, exchange = await self._connect(_Exchange)
        try:
            transport.write(http_request(method, path, body))
            with anyio.fail_after(timeout):
                await exchange.done.wait()
        except TimeoutError:
            raise EngineError(
                0, f"the Docker engine did not answer {method} {path} within {timeout:g} s"
            ) from None
        finally:
            transport.close()
        answer = exchange.response()
        if answer.status >= 400:
            raise EngineError(answer.status, answer.message())
        return answer

    async def remove(self, container_id: str) -> None:
        """Kill and remove (``docker rm -f``); a container already gone, or going (409), is fine."""
        try:
            await self.call("DELETE", f"/containers/{quote(container_id)}?force=1")
        except EngineError as exc:
            if exc.status not in (404, 409):
                raise

    async def run_attached(
        self, request: CreateRequest, *, timeout: float = ENGINE_CALL_TIMEOUT_S
    ) -> AttachedBox:
        """What ``docker run -i --rm`` asks of the engine: create, attach stdio, register the wait, start.

        The wait is registered before the start, so a box that exits at once still reports its exit code.
        A start that fails, or is cancelled, removes what was created."""
        if not request.interactive:
            raise EngineError(0, "a box is started interactive (-i): its protocol is on stdin and stdout")
        query = f"?{urlencode({'name': request.name})}" if request.name else ""
        with anyio.CancelScope(shield=True):  # once the engine has made it, it is removed on every path below
            made = await self.call("POST", f"/containers/create{query}", request.body, timeout=timeout)
        created = made.json()
        container_id = str(created["Id"])
        transports: list[asyncio.Transport] = []
        try:
            warnings = [w for w in created.get("Warnings") or [] if w]
            if warnings:  # e.g. a limit the kernel cannot apply: the engine created it without
                raise EngineError(0, f"the engine could not apply the whole lockdown: {'; '.join(warnings)}")
            ident = quote(container_id)
            attach_transport, attach = await self._connect(_Attach)
            transports.append(attach_transport)
            attach_transport.write(
                http_request(
                    "POST", f"/containers/{ident}/attach?stream=1&stdin=1&stdout=1&stderr=1", upgrade=True
                )
            )
            wait_transport, waiter = await self._connect(_Exchange)
            transports.append(wait_transport)
            wait_transport.write(http_request("POST", f"/containers/{ident}/wait?condition=removed"))
            with anyio.fail_after(timeout):
                await attach.head_seen.wait()
                await waiter.head_seen.wait()
            if attach.status not in (101, 200):
                raise EngineError(
                    attach.status or 0, f"the engine refused to attach: {attach.refusal[:300]!r}"
                )
            head = split_head(waiter.data)
            if head is None or head[0] != 200:
                raise EngineError(
                    head[0] if head else 0, f"the engine refused to wait: {waiter.response().message()}"
                )
            await self.call("POST", f"/containers/{ident}/start", timeout=timeout)
        except BaseException:
            with anyio.CancelScope(shield=True):
                for transport in transports:
                    transport.close()
                try:
                    await self.remove(container_id)
                except EngineError as exc:
                    log.warning("removing the box %s that did not start failed: %s", container_id[:12], exc)
            raise
        return AttachedBox(self, container_id, attach, waiter)
