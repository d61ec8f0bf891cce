"""What the terminal says about a turn (issue 17): where it is while it runs, and what became of it.

Pure rules: each takes plain values and returns the one line a person reads (or None: nothing to say).
"""

from __future__ import annotations

import re

from box.protocol.models import DeliverResult
from impyard.conversation.pipeline import RouteOutcome
from impyard.failure_words import detail_of

MAX_REASON_CHARS = 300  # a failed turn's reason stays one line of a terminal, give or take a wrap

# The box's turn stages (box/machine.py), as the status line says them.
STAGE_WORDS = {
    "context": "reading",
    "tools": "thinking",
    "decision": "deciding whether to reply",
    "render": "writing",
    "send": "writing",
    "post": "remembering",
    "failed": "stopping: the turn failed",
}

# What to run to learn more, after a reason that starts with these words.
REASON_HINTS = (
    ("budget exhausted", "impyard budget show"),
    ("denied by policy rule", "impyard policy check"),
)

_RPC_CODE = re.compile(r"\s*\(-?\d+\)\s*$")  # the box's error code at the end: for logs, not for people
_SPACE = re.compile(r"\s+")


def stage_line(imp: str, stage: str | None, queued: int = 0) -> str | None:
    """The status line while a turn runs: ``pip is thinking…``, with how many messages wait behind it."""
    if stage is None:
        return None
    line = f"{imp} is {STAGE_WORDS.get(stage, stage)}…"
    return f"{line} ({queued} queued)" if queued else line


def reason(error: str | None) -> str:
    """A failed turn's error as one line: no error code, no repeats of the same cause, bounded."""
    text = _RPC_CODE.sub("", _SPACE.sub(" ", detail_of(error)).strip()) or "unknown failure"  # no [kind] tag
    kept: list[str] = []
    for part in text.split("; "):  # "no usable answer after 3 attempts: X; X; X" says X once
        if not any(seen == part or seen.endswith(f": {part}") for seen in kept):
            kept.append(part)
    text = "; ".join(kept)
    if len(text) > MAX_REASON_CHARS:
        text = text[:MAX_REASON_CHARS].rsplit(" ", 1)[0] + " …"
    hint = next((cmd for start, cmd in REASON_HINTS if text.startswith(start)), None)
    return f"{text} (see: {hint})" if hint else text


def outcome_line(imp: str, result: DeliverResult | None) -> str | None:
    """What became of a turn, when its reply does not already say it (a sent reply was printed)."""
    if result is None or result.outcome == "sent":
        return None
    if result.outcome == "silent":
        return f"({imp} chose not to reply)"
    if result.outcome == "pending":
        return f"({imp}'s reply waits for approval: impyard approvals ls)"
    return f"(impyard) {imp} could not answer: {reason(result.error)}"


def route_line(imp: str, outcome: RouteOutcome) -> str | None:
    """What became of a message as it was handed in, when it was not simply started."""
    return {
        "queued": f"(queued: {imp} reads it when the current turn ends)",
        "busy": f"(impyard) {imp} is too busy; that message will go unanswered",
        "refused": "(impyard) not sent: the chat is stopping",
        "unsaved": (
            "(impyard) not sent: impyard can't write its database (disk full, read-only, or not answering) —"
            " send it again once it can (impyard doctor says which)"
        ),
        "ignored": "(impyard) not sent: the message has no printable text",
        "duplicate": f"(impyard) that message was handed in before: {imp} answers it once",
    }.get(outcome)
