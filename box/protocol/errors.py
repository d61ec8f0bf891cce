"""Error codes and exceptions of the box protocol (docs/protocol.md)."""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class ErrorCode(IntEnum):
    PARSE_ERROR = -32700  # the line is not JSON
    INVALID_REQUEST = -32600  # JSON, but not a JSON-RPC 2.0 frame (or a line over the limit)
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602  # wrong types, missing or (box -> host) unknown fields
    INTERNAL_ERROR = -32603
    NOT_INITIALISED = -32002  # any method before box.init
    BUSY = -32003  # a turn is already running in this box
    DENIED = -32010  # denied by policy; data: rule, reason
    BUDGET_EXHAUSTED = -32011  # data: ledger, retry_after
    RATE_LIMITED = -32012  # data: retry_after
    UPSTREAM_UNREACHABLE = -32013


class RpcError(Exception):
    """A JSON-RPC error object, raised by a handler or received from the peer."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{message} ({code})")
        self.code = int(code)
        self.message = message
        self.data = data

    def to_wire(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class PeerClosed(Exception):
    """The other side went away (EOF or the process exited) before answering."""


class ProtocolViolation(Exception):
    """The other side sent something the protocol does not allow."""
