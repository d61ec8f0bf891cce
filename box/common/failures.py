"""What kind of failure ended a turn, said to the host as a short tag on ``DeliverResult.error`` (issue 19 #5).

The protocol keeps its field: a failed turn's ``error`` (and a failed task's ``summary``) starts with
``[kind] `` and goes on with the detail for logs, e.g. ``[rate_limited] no usable answer after 3 attempts:
model returned HTTP 429``. The box writes the tag (``tagged``; which kind a caught exception is, is
``box.failures.classify``); the host reads it (``split_tag``, ``impyard.failure_words``) to tell the person, in
one line, which failure it was; an untagged or unknown tag reads as ``unknown``.
"""

from __future__ import annotations

import re
from typing import Final, Literal, get_args

from pydantic import ValidationError

FailureKind = Literal[
    "rate_limited",  # HTTP 429 from the model, or the gateway's rate limit on model calls
    "upstream",  # the model API answered with an error (HTTP 5xx and the like)
    "model_refused",  # issue 16: the model API refused the request as sent (HTTP 400 unsupported_parameter …)
    "timeout",  # the model API did not answer in time (a hung model)
    "unreachable",  # the model API could not be reached (network, no key configured)
    "denied",  # a policy rule denied the request
    "budget",  # a budget window is exhausted
    "send_limited",  # the reply was refused by a send rate limit
    "store",  # a disk or database write failed (full, read-only)
    "bad_answer",  # the model answered, but never with something usable
    "host",  # the host's gateway failed on the request
    "unknown",
]
KINDS: Final[frozenset[str]] = frozenset(get_args(FailureKind))

TAG = re.compile(r"^\[([a-z_]{1,20})\] ?")  # the prefix on DeliverResult.error / TaskRunResult.summary


def tagged(kind: FailureKind, detail: str) -> str:
    """``[kind] detail``: what the box puts in a failed turn's ``error``."""
    return f"[{kind}] {detail}"


def split_tag(error: str | None) -> tuple[FailureKind, str]:
    """The tag and the detail of an ``error`` / ``summary``; an untagged text or a tag not known is ``unknown``
    (the text is a box's: only a known kind is believed, and the detail is never shown as the host's words)."""
    text = error or ""
    match = TAG.match(text)
    if match is None:
        return "unknown", text
    kind = match.group(1)
    detail = text[match.end() :]
    return (kind, detail) if kind in KINDS else ("unknown", detail)  # type: ignore[return-value]


_WHITESPACE = re.compile(r"\s+")


def clip(text: str, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters, cut between words with "…" (issue 38: a person never
    reads a message cut mid-word, nor a multi-line dump)."""
    flat = _WHITESPACE.sub(" ", text).strip()
    if len(flat) <= limit:
        return flat
    cut = flat[: max(1, limit - 1)]
    head, space, _ = cut.rpartition(" ")
    return (head if space and len(head) >= limit // 2 else cut).rstrip(" ,;:") + "…"


def invalid_fields(error: ValidationError, limit: int = 3) -> str:
    """Issue 38: which fields of a model's answer were wrong, in one short line (``channel: Input should be …``),
    never the validation error's multi-line dump."""
    parts = []
    for item in error.errors()[:limit]:
        where = ".".join(str(part) for part in item["loc"]) or "the object"
        parts.append(f"{clip(where, 60)}: {clip(item['msg'], 80)}")
    more = error.error_count() - limit
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
