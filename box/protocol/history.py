"""The ``history.*`` requests: the responder's own lines, kept by the host (issue 22; docs/protocol.md).

The responder keeps its own account of a channel beside the host's ``recent`` (SPEC-001 ENV-05, ENV-07,
ENV-11, ENV-13): what it committed after a confirmed delivery, short-path archives, channel events. The
host keeps those lines in its database; a box reaches them only through these two requests, one read
when a turn builds its context and one write when it has ended — never one request per line.

**No request names a channel.** The host answers with the lines of the box's own channel (the pipe is the
identity) and stores what the box commits under that channel: a box can neither read another channel's
lines (a DM's, from a guild box) nor write into one. Trimming (ENV-07, ENV-11) is the host's, with the
imp's own ``history_limit`` and ``history_per_channel``, never a number the box sends.

Bounds: a line's text at most ``MAX_LINE_CHARS`` (the box cuts before it sends; the host refuses a longer
one), at most ``MAX_COMMIT_LINES`` lines a commit, and a load answer at most ``MAX_LOAD_CHARS`` of text
(the newest lines that fit).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from box.protocol.base import FromBox, FromHost, Id, Name

MAX_LINE_CHARS = 4_000  # a line is context, not an archive of everything
MAX_COMMIT_LINES = (
    32  # a turn's two lines (what was said, the reply) and the channel events held since the last
)
MAX_LOAD_CHARS = 400_000  # a load answer stays well inside one protocol line (1 MiB)

Role = Literal["user", "assistant", "event"]
# What a commit counts (the old file's counters): a turn's outcome, or "archived" (ENV-05's short path).
CountedOutcome = Literal["sent", "silent", "pending", "failed", "archived"]


class HistoryLine(FromBox):
    """One line the box commits: a message someone wrote, the imp's delivered reply, or a channel event."""

    id: Id  # the message's id (a reply: its first delivered id; an event: an id of its own)
    role: Role
    author: Name  # a display name ("" for an event)
    content: Annotated[str, Field(max_length=MAX_LINE_CHARS)]
    at: datetime


class HistoryLineView(FromHost):
    """One line of the box's channel as the host hands it back."""

    id: str
    role: Role = "event"
    author: str = ""
    content: str = ""
    at: datetime


class HistoryLoadParams(FromBox):
    """``history.load``: the lines of the box's own channel, after the host trimmed the imp's (ENV-07)."""


class HistoryLoadResult(FromHost):
    lines: list[HistoryLineView] = Field(default_factory=list)  # oldest first


class HistoryCommitParams(FromBox):
    """``history.commit``: append ``lines`` to the box's own channel (a line already kept is skipped), trim
    the imp's lines (ENV-07, ENV-11), and count ``outcome`` for the channel."""

    lines: list[HistoryLine] = Field(default_factory=list, max_length=MAX_COMMIT_LINES)
    outcome: CountedOutcome | None = None


class HistoryCommitResult(FromHost):
    stored: int = 0  # lines that were new


HISTORY_METHOD_NAMES = ("history.load", "history.commit")
