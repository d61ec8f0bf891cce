"""What a person reads when a turn or a task fails, and when a message was missed (issue 19 #5).

Pure rules: the kind of failure (the box's ``[kind]`` tag on ``DeliverResult.error``, see ``box.common.failures``)
maps to one line, the same in the terminal, on Discord and in ``impyard task show``. The box's detail is
never shown as the host's words: only a known kind is believed; anything else reads as the fallback.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final

from box.common.failures import FailureKind, split_tag

# issue 19 #5: one line per kind of failure; the budget's says when its window resets.
WORDS: Final[dict[FailureKind, str]] = {
    "rate_limited": "The model is rate-limiting us — try again in a minute.",
    "upstream": "The model service is having trouble — try again in a few minutes.",
    "model_refused": "The model refused the request as I sent it — my model settings need a change.",
    "timeout": "The model didn't answer in time — try again in a moment.",
    "unreachable": "I can't reach the model right now — try again later.",
    "denied": "That was blocked by policy, so I didn't answer.",
    "budget": "I'm over today's budget (resets at 00:00 UTC).",
    "send_limited": "I've sent too many messages here just now — try again in a minute.",
    "store": "impyard can't write its storage right now (disk full, read-only, or its database not answering) — try again later.",
    "bad_answer": "The model's answer came back unusable — try again.",
    "host": "Something went wrong on impyard's side — try again.",
}
MONTHLY_BUDGET_WORDS: Final = "I'm over this month's budget (resets on the 1st at 00:00 UTC)."
FALLBACK_WORDS: Final = "Sorry — I couldn't answer that just now."
FAILURE_WORDS: Final[frozenset[str]] = frozenset(
    {*WORDS.values(), MONTHLY_BUDGET_WORDS, FALLBACK_WORDS}
)  # every line failure_line can say: a surface that explains failures its own way may skip them


# Issue 16: the refusal's cause as box.model writes it ("model returned HTTP 400 (unsupported_parameter:
# reasoning_effort)"); only identifier characters are believed, so a box cannot put words in the notice.
_REFUSAL_CAUSE = re.compile(
    r"model returned HTTP (\d{3}) \(([a-z0-9_]{1,64}(?:: [A-Za-z0-9_.\[\]-]{1,64})?)\)"
)
REFUSED_WORDS: Final = "The model refused the request as I sent it"  # every model_refused line starts so


def failure_line(kind: FailureKind, detail: str = "", fallback: str | None = FALLBACK_WORDS) -> str | None:
    """The one line for a failure of ``kind``; ``fallback`` (the imp's ``failure_notice``) for ``unknown``."""
    if kind == "budget" and "/month" in detail:
        return MONTHLY_BUDGET_WORDS  # the ledger names the window: imp:pip/month, all/month
    if kind == "model_refused" and (cause := _REFUSAL_CAUSE.search(detail)):
        return f"{REFUSED_WORDS} (HTTP {cause.group(1)}, {cause.group(2)}) — my model settings need a change."
    return WORDS.get(kind, fallback)


def words_for(error: str | None, fallback: str | None = FALLBACK_WORDS) -> str | None:
    """The line for a failed turn's ``error`` as the box tagged it."""
    kind, detail = split_tag(error)
    return failure_line(kind, detail, fallback)


def detail_of(error: str | None) -> str:
    """The error without its tag: the detail, for logs and the operator."""
    return split_tag(error)[1]


def task_failure(summary: str) -> str:
    """A failed task's box summary as ``impyard task show`` says it: the words, then the detail."""
    kind, detail = split_tag(summary)
    words = failure_line(kind, detail, fallback=None)
    detail = detail.strip() or "no reason given"
    return f"{words} ({detail})" if words else detail


def missed_line(created_at: Sequence[datetime], name: str | None = None) -> str:
    """The one mention of messages not answered across a restart: ``I missed your message from 14:02 UTC
    while I was restarting …`` (issue 19 #5); several say the first and the last time; ``name`` (a shared
    channel) says whose they were."""
    times = sorted(moment.astimezone(UTC) for moment in created_at)
    if not times:
        raise ValueError("missed_line needs at least one message time")
    first, last = (f"{moment:%H:%M}" for moment in (times[0], times[-1]))
    whose = f"{name}, " if name else ""
    if len(times) == 1:
        return f"{whose}I missed your message from {first} UTC while I was restarting — please send it again."
    span = first if first == last else f"{first}–{last}"
    return (
        f"{whose}I missed your {len(times)} messages from {span} UTC while I was restarting — "
        "please send them again."
    )
