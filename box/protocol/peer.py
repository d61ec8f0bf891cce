"""A bidirectional JSON-RPC 2.0 peer over anyio byte streams (NDJSON framing).

Both sides of the box protocol use it: requests flow both ways, several may be
in flight at once (matched by id), notifications are handled in arrival order.
What the peer *serves* and what it *calls* are method tables from
``box.protocol.models``; the models' own strictness (``FromHost`` lenient,
``FromBox`` strict) decides how unknown fields are treated.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping
from contextlib import nullcontext
from typing import Any

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream, TaskGroup
from anyio.lowlevel import checkpoint_if_cancelled
from pydantic import BaseModel, ValidationError

from box.protocol.codec import (
    DEFAULT_MAX_LINE_BYTES,
    FrameInvalid,
    FrameTooLarge,
    LineTooLong,
    NdjsonDecoder,
    decode_frame,
    encode_frame,
    encode_model_frame,
)
from box.protocol.errors import ErrorCode, PeerClosed, ProtocolViolation, RpcError
from box.protocol.models import MethodSpec

Handler = Callable[[str, BaseModel], Awaitable[BaseModel | None]]
ViolationHook = Callable[[str], None]
RefusalHook = Callable[[str, int, str], Awaitable[None]]  # (method, error code, reason)

_READ_CHUNK_BYTES = 65_536
# After EOF, handlers in flight get this long to finish (their own requests now fail fast).
EOF_DRAIN_S = 2.0
_STREAM_ENDED = (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError)


def validation_summary(error: ValidationError, limit: int = 5) -> list[dict[str, str]]:
    """A short, bounded description of what was wrong, safe to send to the other side."""
    return [
        {"loc": ".".join(str(part) for part in item["loc"])[:200], "msg": item["msg"][:200]}
        for item in error.errors()[:limit]
    ]


class _Waiter:
    __slots__ = ("event", "result_model", "result", "error")

    def __init__(self, result_model: type[BaseModel]) -> None:
        self.event = anyio.Event()
        self.result_model = result_model
        self.result: BaseModel | None = None
        self.error: BaseException | None = None

    def settle(self, *, result: BaseModel | None = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.event.set()


class Peer:
    """One end of the protocol. ``run()`` reads until EOF; ``request``/``notify`` write."""

    def __init__(
        self,
        receive: ByteReceiveStream,
        send: ByteSendStream,
        *,
        serves: Mapping[str, MethodSpec],
        calls: Mapping[str, MethodSpec],
        handler: Handler,
        on_violation: ViolationHook | None = None,
        stop_after: frozenset[str] = frozenset(),
        on_refusal: RefusalHook | None = None,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        max_in_flight: int | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self._receive = receive
        self._send_stream = send
        self._serves = serves
        self._calls = calls
        self._handler = handler
        self._on_violation = on_violation
        self._stop_after = stop_after
        self._on_refusal = on_refusal
        self._max_line_bytes = max_line_bytes
        self._max_in_flight = max_in_flight  # requests from the other side being served at once
        self._log = logger or logging.getLogger("impyard.protocol")
        self._ids = itertools.count(1)
        self._pending: dict[int, _Waiter] = {}
        self._write_lock = anyio.Lock()
        self._tg: TaskGroup | None = None
        self._closed = False
        self._in_flight = 0
        self._drained = anyio.Event()
        self.violations = 0

    # ------------------------------------------------------------------ reading

    async def run(self) -> None:
        """Serve until the stream ends (or ``stop()``); then fail every pending request."""
        decoder = NdjsonDecoder(self._max_line_bytes)
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                while True:
                    try:
                        chunk = await self._receive.receive(_READ_CHUNK_BYTES)
                    except _STREAM_ENDED:
                        break
                    for line in decoder.feed(chunk):
                        try:
                            await self._on_line(line)
                        except _STREAM_ENDED:
                            raise
                        except Exception as exc:  # noqa: BLE001 - the other side's bytes never end this side
                            self._log.debug("handling a line failed", exc_info=True)
                            self._violation(f"a line could not be handled ({type(exc).__name__})")
                if decoder.pending_bytes:
                    self._log.warning("stream ended inside a line (%d bytes dropped)", decoder.pending_bytes)
                # Nothing more can arrive: requests we sent fail now, handlers get a short grace to answer.
                self._close_pending(PeerClosed("the other side closed the stream"))
                if self._in_flight:
                    with anyio.move_on_after(EOF_DRAIN_S):
                        await self._drained.wait()
                tg.cancel_scope.cancel()
        finally:
            self._close_pending(PeerClosed("the other side closed the stream"))

    def stop(self) -> None:
        """Stop reading and cancel the handlers in flight; pending requests fail."""
        if self._tg is not None:
            self._tg.cancel_scope.cancel()
        self._close_pending(PeerClosed("the peer was stopped"))

    @property
    def max_line_bytes(self) -> int:
        """The longest line either side may send on this pipe."""
        return self._max_line_bytes

    @property
    def closed(self) -> bool:
        return self._closed

    def _close_pending(self, error: BaseException) -> None:
        self._closed = True
        for waiter in self._pending.values():
            if not waiter.event.is_set():
                waiter.settle(error=error)

    def _violation(self, reason: str) -> None:
        self.violations += 1
        self._log.warning("protocol violation: %s", reason)
        if self._on_violation is not None:
            self._on_violation(reason)

    async def _on_line(self, line: bytes | LineTooLong) -> None:
        if isinstance(line, LineTooLong):
            self._violation(f"line of {line.size} bytes exceeds the {self._max_line_bytes}-byte limit")
            await self._reply_error(
                None, ErrorCode.INVALID_REQUEST, "line too long; dropped", {"bytes": line.size}
            )
            return
        try:
            frame = decode_frame(line)
        except FrameInvalid as exc:
            self._violation(f"line is {exc}")
            await self._reply_error(None, ErrorCode.PARSE_ERROR, f"parse error: the line is {exc}")
            return
        if not isinstance(frame, dict) or frame.get("jsonrpc") != "2.0":
            self._violation("not a JSON-RPC 2.0 object")
            await self._reply_error(
                None, ErrorCode.INVALID_REQUEST, "invalid request: not a JSON-RPC 2.0 object"
            )
            return
        frame_id = frame.get("id")
        if frame_id is not None and (isinstance(frame_id, bool) or not isinstance(frame_id, int | str)):
            self._violation("id is neither a number nor a string")
            await self._reply_error(None, ErrorCode.INVALID_REQUEST, "invalid request: bad id")
            return
        if "method" in frame:
            await self._on_call(frame, frame_id)
        elif "result" in frame or "error" in frame:
            self._on_response(frame, frame_id)
        else:
            self._violation("neither a call nor a response")
            await self._reply_error(
                frame_id, ErrorCode.INVALID_REQUEST, "invalid request: no method, result or error"
            )

    async def _on_call(self, frame: dict[str, Any], frame_id: int | str | None) -> None:
        method = frame["method"]
        is_request = frame_id is not None
        spec = self._serves.get(method) if isinstance(method, str) else None
        if spec is None or spec.is_notification == is_request:
            self._log.debug("unknown method %r refused", method if isinstance(method, str) else type(method))
            if is_request:
                await self._reply_error(
                    frame_id, ErrorCode.METHOD_NOT_FOUND, f"method not found: {str(method)[:80]}"
                )
            await self._refused(str(method)[:80], ErrorCode.METHOD_NOT_FOUND, "unknown method")
            return
        raw_params = frame.get("params", {})
        try:
            if not isinstance(raw_params, dict):
                raise TypeError("params must be an object")
            params = spec.params.model_validate(raw_params)
        except (TypeError, ValidationError) as exc:
            data = (
                validation_summary(exc)
                if isinstance(exc, ValidationError)
                else [{"loc": "", "msg": str(exc)}]
            )
            self._log.debug("invalid params for %s: %s", method, data)
            if is_request:
                await self._reply_error(
                    frame_id, ErrorCode.INVALID_PARAMS, f"invalid params for {method}", data
                )
            await self._refused(
                method, ErrorCode.INVALID_PARAMS, "; ".join(f"{d['loc']}: {d['msg']}" for d in data)
            )
            return
        if frame_id is None:  # a notification (same test as is_request, spelled so it narrows the id)
            await self._notify_handler(method, params)
            return
        assert self._tg is not None
        if self._max_in_flight is not None and self._in_flight >= self._max_in_flight:
            # A side that floods requests without reading answers would hold the host's memory (issue 11 #6).
            self._violation(f"more than {self._max_in_flight} requests in flight")
            await self._reply_error(
                frame_id, ErrorCode.BUSY, f"too many requests in flight (at most {self._max_in_flight})"
            )
            return
        self._in_flight += 1  # counted before it starts, so an EOF right after still waits for it
        self._tg.start_soon(self._serve, frame_id, spec, params, name=f"serve {method}#{frame_id}")

    async def _refused(self, method: str, code: int, reason: str) -> None:
        """Tell the owner a call was refused before any handler saw it (the host audits it)."""
        if self._on_refusal is not None:
            try:
                await self._on_refusal(method, code, reason[:500])
            except Exception:
                self._log.exception("recording a refused call failed")

    async def _notify_handler(self, method: str, params: BaseModel) -> None:
        try:
            await self._handler(method, params)
        except Exception:
            self._log.exception("notification handler for %s failed", method)

    async def _serve(self, frame_id: int | str, spec: MethodSpec, params: BaseModel) -> None:
        try:
            await self._serve_one(frame_id, spec, params)
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._drained.set()
                self._drained = anyio.Event()

    async def _serve_one(self, frame_id: int | str, spec: MethodSpec, params: BaseModel) -> None:
        try:
            result = await self._handler(spec.name, params)
            if result is None:
                raise RuntimeError(f"handler for {spec.name} returned no result")
            await self._send_line(
                encode_model_frame({"jsonrpc": "2.0", "id": frame_id}, "result", result, self._max_line_bytes)
            )
            if spec.name in self._stop_after:
                self.stop()
        except RpcError as exc:
            await self._reply_error(frame_id, exc.code, exc.message, exc.data)
        except FrameTooLarge as exc:
            await self._reply_error(frame_id, ErrorCode.INTERNAL_ERROR, f"result too large: {exc}")
        except _STREAM_ENDED:
            return
        except Exception:
            self._log.exception("handler for %s failed", spec.name)
            await self._reply_error(frame_id, ErrorCode.INTERNAL_ERROR, "internal error")

    def _on_response(self, frame: dict[str, Any], frame_id: int | str | None) -> None:
        waiter = self._pending.get(frame_id) if isinstance(frame_id, int) else None
        if waiter is None or waiter.event.is_set():
            self._violation(f"response to unknown id {str(frame_id)[:40]}")
            return
        if "error" in frame:
            error = frame["error"]
            if not isinstance(error, dict) or not isinstance(error.get("code"), int):
                waiter.settle(error=ProtocolViolation("malformed error object"))
                self._violation("malformed error object")
                return
            waiter.settle(
                error=RpcError(error["code"], str(error.get("message", ""))[:1000], error.get("data"))
            )
            return
        try:
            waiter.settle(result=waiter.result_model.model_validate(frame["result"]))
        except ValidationError as exc:
            waiter.settle(error=ProtocolViolation(f"invalid result: {validation_summary(exc)}"))
            self._violation("invalid result")

    # ------------------------------------------------------------------ writing

    async def _send(self, frame: dict[str, Any]) -> None:
        await self._send_line(encode_frame(frame, self._max_line_bytes))

    async def _send_line(self, line: bytes) -> None:
        """One whole line at a time. A free lock is taken without a turn of the event loop (``Lock.acquire``
        yields once even when nobody holds it: a loop iteration for every frame, issue 18); a cancelled
        task still sends nothing."""
        lock = self._write_lock
        await checkpoint_if_cancelled()
        try:
            lock.acquire_nowait()
        except anyio.WouldBlock:
            await lock.acquire()
        try:
            await self._send_stream.send(line)
        finally:
            lock.release()

    async def _reply_error(
        self, frame_id: int | str | None, code: int, message: str, data: Any = None
    ) -> None:
        try:
            await self._send(
                {"jsonrpc": "2.0", "id": frame_id, "error": RpcError(code, message, data).to_wire()}
            )
        except _STREAM_ENDED:
            pass

    async def request(self, method: str, params: BaseModel, *, timeout: float | None = None) -> BaseModel:
        """Send a request and wait for its result (raises RpcError, PeerClosed or TimeoutError)."""
        spec = self._calls.get(method)
        if spec is None or spec.result is None:
            raise ValueError(f"{method} is not a request this peer may send")
        if self._closed:
            raise PeerClosed("the peer is closed")
        frame_id = next(self._ids)
        waiter = _Waiter(spec.result)
        self._pending[frame_id] = waiter
        try:
            try:
                head = {"jsonrpc": "2.0", "id": frame_id, "method": method}
                await self._send_line(encode_model_frame(head, "params", params, self._max_line_bytes))
            except _STREAM_ENDED as exc:
                raise PeerClosed("the other side closed the stream") from exc
            with anyio.fail_after(timeout) if timeout is not None else nullcontext():
                await waiter.event.wait()
        finally:
            self._pending.pop(frame_id, None)
        if waiter.error is not None:
            raise waiter.error
        assert waiter.result is not None
        return waiter.result

    async def notify(self, method: str, params: BaseModel) -> None:
        spec = self._calls.get(method)
        if spec is None or not spec.is_notification:
            raise ValueError(f"{method} is not a notification this peer may send")
        if self._closed:
            raise PeerClosed("the peer is closed")
        try:
            head = {"jsonrpc": "2.0", "method": method}
            await self._send_line(encode_model_frame(head, "params", params, self._max_line_bytes))
        except _STREAM_ENDED as exc:
            raise PeerClosed("the other side closed the stream") from exc
