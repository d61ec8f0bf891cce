"""Mechanism 121: a memory call's busy backoff, the same for the box's memory engine and the host's own calls.

HTTP 429 and 5xx — and the gateway's own "rate limited" / "upstream unreachable" refusals, which mean the
same — are asked again after 2, 5, 10, 20, 40 and 60 s (longer when the upstream said when to come back),
but a wait that would end past the deadline is not started: the call fails instead. Any other answer ends
the asking at once. A failure is never raised: ``Asked`` carries the last answer (if any) and why it is not
a success. The box's ``MemoryModel`` asks this way for every memory call; ``impyard memory`` embeds a text
this way through the host's own gateway.

The asking (``ModelCaller``), the sleeping and the deadline are passed in: nothing here reads a clock or
waits on its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from box.common.attempts import RATE_LIMITED_STATUS, RETRYABLE_RPC_CODES, retry_after_of
from box.common.structured import refuses_json_schema
from box.protocol import RpcError
from box.protocol.models import ModelRequestResult

BUSY_BACKOFF_S: tuple[float, ...] = (2.0, 5.0, 10.0, 20.0, 40.0, 60.0)  # mechanism 121


class ModelCaller(Protocol):
    """One ``model.request`` to the host's gateway (the box's ``box.model.ModelClient``, or the host's own)."""

    async def call(self, path: str, body: dict[str, Any], purpose: str) -> ModelRequestResult: ...


@dataclass(frozen=True)
class Asked:
    """The outcome of one gateway request, after busy retries: the last answer, and why it is no success."""

    result: ModelRequestResult | None
    error: str | None


async def ask_while_busy(
    client: ModelCaller,
    path: str,
    body: dict[str, Any],
    purpose: str,
    *,
    sleep: Callable[[float], Awaitable[None]],
    deadline: Callable[[], float | None],
) -> Asked:
    """One gateway request with the busy backoff (121); never raises for the model's failure.

    ``deadline()``: the seconds left, or None for no limit."""
    waits = iter(BUSY_BACKOFF_S)
    while True:
        left = deadline()
        if left is not None and left <= 0:
            return Asked(None, "the turn's deadline has passed")
        result: ModelRequestResult | None
        try:
            result = await client.call(path, body, purpose)
        except RpcError as exc:
            if exc.code not in RETRYABLE_RPC_CODES:
                return Asked(None, f"refused by the gateway: {exc.message[:200]}")
            result, retry_after, why = None, _rpc_retry_after(exc), f"gateway: {exc.message[:200]}"
        else:
            if result.status == 200:
                return Asked(result, None)
            retry_after, why = retry_after_of(result), f"HTTP {result.status}"
            if result.status != RATE_LIMITED_STATUS and result.status < 500:
                return Asked(result, why)  # mechanism 121: only "busy" is retried
            if refuses_json_schema(result.status, result.body, body):
                return Asked(result, f"{why}: the server takes no json_schema")  # issue 38: not busy, ever
        wait = next(waits, None)
        if wait is None:
            return Asked(result, f"{why}; still busy after {len(BUSY_BACKOFF_S)} retries")
        if retry_after is not None:
            wait = max(wait, retry_after)  # the host said when to come back
        left = deadline()
        if left is not None and wait >= left:
            return Asked(result, f"{why}; the next retry would pass the turn's deadline")
        await sleep(wait)


def _rpc_retry_after(error: RpcError) -> float | None:
    value = error.data.get("retry_after") if isinstance(error.data, dict) else None
    return float(value) if isinstance(value, int | float) else None
