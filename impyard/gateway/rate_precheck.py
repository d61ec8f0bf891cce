"""A reply is not paid for when its send will be refused (issue 19 #3).

A turn's reply model call (purpose ``reply``) is answered by a post in the turn's own channel. When that
channel's send rate limit (``send-own-channel``: 20 a minute) is already spent, the post would be refused
after the model was paid, so the gateway refuses the model call first, with words of its own, and the
upstream is never asked.

Pure: the gateway finds the send's rule and what its rate meter says now (without counting); this module
decides which calls are checked and what the refusal says. The refusal is a denial (-32010), not a rate
limit (-32012), on purpose: the box retries a rate limit (ENV-12) and would sit in the turn for a minute
waiting out a window it cannot shorten; the audit row still says ``rate_limited`` with the send's rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from box.protocol import ErrorCode, RpcError
from box.protocol.models import DiscordSendParams

PRECHECKED_PURPOSES = frozenset({"reply"})  # the model calls whose answer is posted in the turn's channel
FAILURE_KIND = "send_limited"  # issue 19 #5: the kind a person is told (impyard.failure_words)


@dataclass(frozen=True)
class SendOutlook:
    """What the send rule of a reply in the turn's own channel says now, before anything is counted."""

    rule: str  # the matching send rule ("" when no rule allows such a send)
    per_minute: int | None  # its rate limit (None: none)
    retry_after_s: float | None  # None: a send now is within the limit


@dataclass(frozen=True)
class Precheck:
    """A model call refused before it was paid for: the audit row's rule and reason, and the box's error."""

    rule: str
    reason: str
    error: RpcError


def reply_probe(channel_id: str) -> DiscordSendParams:
    """The smallest reply the turn could post in its own channel: what the send rule is asked about."""
    return DiscordSendParams(channel_id=channel_id, content=".", kind="reply")


def precheck(purpose: str, outlook: SendOutlook | None) -> Precheck | None:
    """None: the model call goes ahead. Otherwise the turn's reply would be refused by ``outlook.rule``'s
    rate limit, so the model is not called (issue 19 #3)."""
    if purpose not in PRECHECKED_PURPOSES or outlook is None or outlook.retry_after_s is None:
        return None
    retry_after = round(max(outlook.retry_after_s, 0.001), 3)
    limit = f"at most {outlook.per_minute} per minute" if outlook.per_minute else "its rate limit"
    reason = (
        f"the reply would be over this channel's send limit ({limit}), "
        f"so the model was not asked; try again in {retry_after:g} s"
    )
    error = RpcError(
        ErrorCode.DENIED,
        f"denied by policy rule {outlook.rule}: {reason}",
        {"rule": outlook.rule, "reason": reason, "retry_after": retry_after, "kind": FAILURE_KIND},
    )
    return Precheck(outlook.rule, reason, error)
