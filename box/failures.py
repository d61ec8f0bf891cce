"""Which kind of failure ended a turn, read off the exception the turn machine caught (issue 19 #5).

``classify`` is a pure rule on that exception: its class, its protocol error code, and for ``ModelExhausted``
the last attempt's cause, found by the words ``box.model``, ``box.attempts`` and the gateway write. The kinds,
the ``[kind]`` tag the box puts on a failed turn's ``error`` and the reading of it on the host are
``box.common.failures``.
"""

from __future__ import annotations

import re
import sys
from typing import Final

from box.attempts import ModelExhausted, ModelRefused
from box.common.failures import FailureKind
from box.machine import SendFailed
from box.model import ModelCallFailed
from box.protocol import ErrorCode, RpcError

# The last attempt's cause inside ModelExhausted's message: the words box.model and the gateway write.
_ATTEMPT_CAUSES: Final[tuple[tuple[re.Pattern[str], FailureKind], ...]] = (
    (re.compile(r"model returned HTTP 429"), "rate_limited"),
    (re.compile(r"rate limited by rule"), "rate_limited"),
    (re.compile(r"model returned HTTP \d{3}"), "upstream"),
    (re.compile(r"did not answer within|timed out|timeout", re.IGNORECASE), "timeout"),
    (re.compile(r"model API unreachable|no model key"), "unreachable"),
)
_DISK_WORDS = ("disk is full", "disk full", "read-only", "readonly", "no space left", "disk i/o error")


def last_attempt_kind(text: str) -> FailureKind:
    """The kind of the last failed attempt named in ``text`` (the causes are joined oldest first)."""
    found: tuple[int, FailureKind] | None = None
    for pattern, kind in _ATTEMPT_CAUSES:
        for match in pattern.finditer(text):
            if found is None or match.start() > found[0]:
                found = (match.start(), kind)
    return found[1] if found is not None else "bad_answer"  # an answer came, but none was usable (ENV-18)


def _rpc_kind(code: int, *, sending: bool = False) -> FailureKind:
    if code == ErrorCode.DENIED:
        return "denied"
    if code == ErrorCode.BUDGET_EXHAUSTED:
        return "budget"
    if code == ErrorCode.RATE_LIMITED:
        return "send_limited" if sending else "rate_limited"
    if code == ErrorCode.UPSTREAM_UNREACHABLE:
        return "unreachable"
    if code == ErrorCode.INTERNAL_ERROR:
        return "host"
    return "unknown"


def classify(error: BaseException | None) -> FailureKind:
    """The kind of failure ``error`` is (issue 19 #5); ``unknown`` when nothing tells."""
    if error is None:
        return "unknown"
    if isinstance(error, SendFailed):
        cause = error.__cause__
        if isinstance(cause, RpcError) and _told_kind(cause) == "store":
            return "store"
        return _rpc_kind(cause.code, sending=True) if isinstance(cause, RpcError) else "unknown"
    if isinstance(error, RpcError):
        if _told_kind(error) == "store":
            return "store"  # issue 19 #1: the host's own database could not be written
        data = error.data if isinstance(error.data, dict) else {}
        if error.code == ErrorCode.DENIED and data.get("kind") == "send_limited":
            return "send_limited"  # issue 19 #3: refused before the model was paid, the reply would be over a send limit
        kind = _rpc_kind(error.code)
        return last_attempt_kind(error.message) if kind == "unreachable" else kind
    if isinstance(error, ModelRefused):
        return "model_refused"  # issue 16: a setting the model does not take; retrying would not help
    if isinstance(error, ModelExhausted):
        return last_attempt_kind(str(error))
    if isinstance(error, ModelCallFailed):
        if error.refused:
            return "model_refused"
        if error.status == 429:
            return "rate_limited"
        return "upstream" if error.status is not None else last_attempt_kind(str(error))
    if isinstance(error, TimeoutError):
        return "timeout"
    if isinstance(error, OSError) or _sqlite_error(error):
        text = str(error).lower()
        if isinstance(error, OSError) and error.errno is not None:
            return "store"  # a failed write or read of the box's state (ENOSPC, EROFS, EIO, ...)
        return "store" if any(words in text for words in _DISK_WORDS) else "unknown"
    return "unknown"


def _sqlite_error(error: BaseException) -> bool:
    # An sqlite3.Error exists only where sqlite3 was loaded: the box, which has no database, never loads it (issue 37).
    sqlite3 = sys.modules.get("sqlite3")
    return sqlite3 is not None and isinstance(error, sqlite3.Error)


def _told_kind(error: RpcError) -> object:
    """The kind the host put in an internal error's data (only ``store`` is read from it)."""
    if error.code != ErrorCode.INTERNAL_ERROR or not isinstance(error.data, dict):
        return None
    return error.data.get("kind")
