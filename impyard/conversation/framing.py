"""Respond-vs-judge framing (seed 004 §2-3, docs/conversation.md): a pure function of recent history.

DM, or at most one distinct human author besides the imp in the recent window
→ ``respond``; more → ``judge`` (reply only when addressed or useful; silence
is a clean outcome). A mention in a group is ``judge`` with reason ``mention``.
The result travels as the structured ``framing`` field, never as message text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from box.protocol.models import Framing, Participant

DEFAULT_WINDOW = timedelta(minutes=30)
DEFAULT_WINDOW_MESSAGES = 50


@dataclass(frozen=True)
class RecentAuthor:
    """One message of recent history, reduced to who wrote it and when."""

    author_id: str
    author_name: str
    is_bot: bool
    created_at: datetime


def participants(
    recent: Sequence[RecentAuthor],
    *,
    imp_id: str,
    now: datetime,
    window: timedelta = DEFAULT_WINDOW,
    max_messages: int = DEFAULT_WINDOW_MESSAGES,
) -> list[Participant]:
    """Distinct humans besides the imp among the last ``max_messages`` messages younger than ``window``."""
    seen: dict[str, Participant] = {}
    for entry in list(recent)[-max_messages:]:
        if entry.is_bot or entry.author_id == imp_id or now - entry.created_at > window:
            continue
        seen.setdefault(entry.author_id, Participant(id=entry.author_id, name=entry.author_name))
    return list(seen.values())


def decide_framing(
    *,
    channel_kind: str,
    addressed: bool,
    recent: Sequence[RecentAuthor],
    imp_id: str,
    now: datetime,
    window: timedelta = DEFAULT_WINDOW,
    max_messages: int = DEFAULT_WINDOW_MESSAGES,
) -> Framing:
    """``recent`` includes the message being framed; its author counts as a participant."""
    people = participants(recent, imp_id=imp_id, now=now, window=window, max_messages=max_messages)
    if channel_kind in ("dm", "terminal"):
        return Framing(mode="respond", reason="dm", participants=people)
    if channel_kind == "task":
        return Framing(mode="respond", reason="task", participants=people)
    if len(people) <= 1:
        return Framing(mode="respond", reason="one_to_one", participants=people)
    return Framing(mode="judge", reason="mention" if addressed else "group", participants=people)
