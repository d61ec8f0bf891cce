"""Which model a reply call uses, and how failed attempts are retried (SPEC-001 ENV-12, ENV-15, ENV-22).

Model choice, first match wins (the same on chat/completions and on the Responses API):

1. ``retry_model`` — the previous attempt got HTTP 429 (ENV-15), until an attempt succeeds;
2. ``vision_model`` — the prompt carries images (the message's or the replied-to attachments);
3. ``factual_model`` — the call answers from tool results (after a ``web_fetch`` / ``search`` round);
4. ``model`` — everything else.

An unset model falls through to the next rule. Three failed attempts in a row raise
``ModelExhausted`` (a ``RuntimeError``, ENV-12); between attempts the box sleeps
``retry_backoff_s`` × 2^(attempt-1), or longer when the host said when to come back.

A request the upstream refuses as written (issue 16: HTTP 400 ``unsupported_parameter`` or
``unsupported_value``, a schema it does not take, an unknown model) is a failed attempt too, but the
same request would be refused the same way: it is not retried, and ``ModelRefused`` (a
``ModelExhausted``, so ENV-12's ``RuntimeError``) is raised at once, with the upstream's cause, so the
failure notice and the log say it once, and why.

Each attempt has its own time limit (issue 19 #6), derived by the host from the turn ceiling and the attempt
count (``box.common.attempts.attempt_timeout_s``, sent as ``ResponderSettings.attempt_timeout_s``): a hung
upstream costs one attempt, not the whole turn, so all three attempts fit inside the ceiling. The counts and
the backoff are ``box.common.attempts``: the host runs them too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import anyio

from box.common.attempts import MAX_ATTEMPTS, RATE_LIMITED_STATUS, RETRYABLE_RPC_CODES, backoff_s
from box.common.failures import clip
from box.common.structured import JsonSchemaRefused
from box.model import ModelCallFailed
from box.protocol import RpcError
from box.protocol.models import ResponderSettings

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]


class ModelExhausted(RuntimeError):
    """ENV-12: the model gave no usable answer in ``MAX_ATTEMPTS`` attempts."""


class ModelRefused(ModelExhausted):
    """Issue 16: the upstream refused the request as written; retrying the same request cannot help."""

    def __init__(self, failure: ModelCallFailed, attempt: int) -> None:
        self.status = failure.status
        self.cause = failure.cause
        super().__init__(
            f"the model refused the request on attempt {attempt}, not retried (the same request would be "
            f"refused again): {clip(str(failure), 800)}"
        )


@dataclass
class ModelChooser:
    """The model for the next attempt; remembers a rate limit across calls and turns (ENV-15)."""

    settings: ResponderSettings
    rate_limited: bool = False

    def choose(self, *, images: bool = False, tool_results: bool = False) -> str:
        s = self.settings
        if self.rate_limited and s.retry_model:
            return s.retry_model  # ENV-15
        if images and s.vision_model:
            return s.vision_model
        if tool_results and s.factual_model:
            return s.factual_model
        return s.model

    def failed(self, error: ModelCallFailed) -> None:
        if error.status == RATE_LIMITED_STATUS:
            self.rate_limited = True  # ENV-15: the next attempt uses retry_model

    def succeeded(self) -> None:
        self.rate_limited = False  # ENV-15: back to the configured model


def as_attempt_failure(error: RpcError) -> ModelCallFailed | None:
    """A gateway refusal that counts as a failed attempt, or None when retrying cannot help."""
    if error.code not in RETRYABLE_RPC_CODES:
        return None
    retry_after = error.data.get("retry_after") if isinstance(error.data, dict) else None
    return ModelCallFailed(
        error.message, retry_after=float(retry_after) if isinstance(retry_after, int | float) else None
    )


async def _timed(attempt: Callable[[int], Awaitable[T]], n: int, timeout_s: float | None) -> T:
    """One attempt inside its own time limit; running out is a failed attempt (issue 19 #6)."""
    if timeout_s is None:
        return await attempt(n)
    try:
        with anyio.fail_after(timeout_s):
            return await attempt(n)
    except TimeoutError:
        raise ModelCallFailed(f"the model server did not answer within {timeout_s:g} s") from None


async def with_attempts(
    attempt: Callable[[int], Awaitable[T]],
    *,
    sleep: Sleep,
    base_s: float,
    chooser: ModelChooser,
    max_attempts: int = MAX_ATTEMPTS,
    structured: JsonSchemaRefused | None = None,
) -> T:
    """Run ``attempt(n)`` until it returns; ``ModelCallFailed`` is a failed attempt (ENV-12/18/24).

    ``structured``: where a refusal of ``json_schema`` is remembered (issue 38); the first one is no failed
    attempt: the same call goes again at once as ``json_object`` (``attempt`` reads ``structured``)."""
    failures: list[str] = []
    n = 0
    while n < max_attempts:
        n += 1
        try:
            result = await _timed(attempt, n, chooser.settings.attempt_timeout_s)
        except RpcError as exc:
            failure = as_attempt_failure(exc)
            if failure is None:
                raise  # denied by policy or out of budget: the same request would be refused again
        except ModelCallFailed as exc:
            failure = exc
        else:
            chooser.succeeded()
            return result
        if failure.schema_refused and structured is not None and not structured.refused:
            structured.refused = True  # issue 38: json_object from now on, for the rest of the box
            n -= 1  # a different request, not a retry of this one: no attempt spent, no backoff
            continue
        chooser.failed(failure)
        if failure.refused:
            raise ModelRefused(failure, n) from failure  # issue 16: deterministic, reported once
        failures.append(str(failure))
        if n < max_attempts:
            await sleep(backoff_s(n, base_s, failure.retry_after))  # D1: never hammer the API back-to-back
    raise ModelExhausted(f"no usable answer after {max_attempts} attempts: {clip('; '.join(failures), 800)}")
