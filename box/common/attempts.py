"""How many attempts a reply call gets, how long each may take and how long to wait between them (ENV-12).

The box runs them (``box.attempts``: three failed attempts in a row raise ``ModelExhausted``; between
attempts the box sleeps ``retry_backoff_s`` × 2^(attempt-1), or longer when the host said when to come back);
the host derives from them the time one attempt may take (issue 19 #6, ``attempt_timeout_s``, sent as
``ResponderSettings.attempt_timeout_s``), so a hung upstream costs one attempt, not the whole turn, and all
three attempts fit inside the turn ceiling.
"""

from __future__ import annotations

from box.protocol import ErrorCode
from box.protocol.models import ModelRequestResult

MAX_ATTEMPTS = 3  # ENV-12
MAX_WAIT_S = 30.0  # never sit in a turn longer than this for one retry
RATE_LIMITED_STATUS = 429  # ENV-15: the reply's next attempt goes to retry_model; a memory call waits (121)
CEILING_SHARE = 0.9  # of the turn ceiling, what the attempts may use (the rest: context, sending the reply)
MIN_ATTEMPT_TIMEOUT_S = 0.5
# Gateway refusals that may pass with time; a policy denial or an exhausted budget will not.
RETRYABLE_RPC_CODES = frozenset({ErrorCode.RATE_LIMITED, ErrorCode.UPSTREAM_UNREACHABLE})


def backoff_s(attempt: int, base_s: float, retry_after: float | None = None) -> float:
    """ENV-12: base × 2^(attempt-1), at least what the host asked for, at most MAX_WAIT_S."""
    delay = base_s * (2 ** (attempt - 1))
    if retry_after is not None:
        delay = max(delay, retry_after)
    return min(delay, MAX_WAIT_S)


def attempt_timeout_s(
    ceiling_s: float, *, attempts: int = MAX_ATTEMPTS, base_backoff_s: float = 1.0
) -> float:
    """Issue 19 #6 (ENV-12): the time one attempt may take so ``attempts`` attempts and the backoffs between
    them fit in ``CEILING_SHARE`` of the turn ceiling (at least ``MIN_ATTEMPT_TIMEOUT_S``)."""
    waits = sum(backoff_s(n, base_backoff_s) for n in range(1, attempts))
    return max(MIN_ATTEMPT_TIMEOUT_S, (ceiling_s * CEILING_SHARE - waits) / attempts)


def retry_after_of(result: ModelRequestResult) -> float | None:
    """The upstream's ``retry-after`` header in seconds, if it sent one."""
    value = result.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
