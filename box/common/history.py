"""A line of the responder's own conversation history, and its trimming rules (ENV-07, ENV-11).

The box reads and writes its channel's lines through the host (``box.history``); the host keeps them
(``impyard.conversation.responder_history``) and trims them after each commit with these same rules and the imp's own
limits, so both sides agree on which lines a channel keeps.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Literal

Role = Literal["user", "assistant", "event"]


@dataclass(frozen=True)
class Record:
    """One entry of the box's history: a message someone wrote, the imp's delivered reply, or an event."""

    channel_id: str
    id: str  # the Discord message id (for a reply: its first delivered id)
    role: Role
    author: str  # display name
    content: str
    at: datetime

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "at": self.at.isoformat()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        return cls(
            channel_id=str(data["channel_id"]),
            id=str(data["id"]),
            role=data["role"] if data["role"] in ("user", "assistant", "event") else "event",
            author=str(data["author"]),
            content=str(data["content"]),
            at=datetime.fromisoformat(data["at"]),
        )


def shrink_by_one(records: Sequence[Record], per_channel: int) -> list[Record]:
    """ENV-11: drop the oldest record of a channel holding more than ``per_channel``; else the oldest overall."""
    if not records:
        return []
    counts = Counter(record.channel_id for record in records)
    for index, record in enumerate(records):
        if counts[record.channel_id] > per_channel:
            return [*records[:index], *records[index + 1 :]]
    return list(records[1:])


def trim(records: Sequence[Record], limit: int, per_channel: int) -> list[Record]:
    """ENV-07: shrink (ENV-11's way) until at most ``limit`` records are left."""
    kept = list(records)
    while len(kept) > limit:
        kept = shrink_by_one(kept, per_channel)
    return kept


def aware(at: datetime) -> datetime:
    """A time with its zone (a time without one is UTC), so lines from both sources sort together."""
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


# ------------------------------------------------------------------ the prompt's window (ENV-07, issue 33)

# The window moves in steps, so consecutive turns share their history and the provider's prompt cache hits (ENV-20's
# purpose). Cut points are chosen by content-defined chunking over the lines' ids: after a cut point, at least
# ``STEP_LEAST`` of the limit goes by, then the first line whose id hashes to 0 modulo ``STEP_SPREAD`` of the limit is
# the next cut point, and at ``STEP_MOST`` of the limit at the latest (so a step never leaves less than 0.4 of the
# limit). The chain starts at the oldest line the box sees; a chain started elsewhere falls in step with it within a
# few cut points, so the older lines the host sends before the window (``lookback``) let a fresh box pick the start
# a warm one picked, from the lines alone. Simulated over 300 turns of two lines (limit 20): the start moves on 24% of
# the turns (exact counting from the channel's first line, which no box can see, would move it on 20%), and the
# window holds 16 lines on average, at least 10 on 95% of the turns.
STEP_LEAST = 0.3
STEP_SPREAD = 0.2
STEP_MOST = 0.6
LOOKBACK_FACTOR = (
    4  # the host sends up to this many times ``history_limit`` older messages, ids and times only
)
MAX_LOOKBACK = 200  # ... and never more than this many


def lookback(limit: int) -> int:
    """How many messages before the window the host sends the box (ids and times only) to place its start."""
    return min(LOOKBACK_FACTOR * max(limit, 0), MAX_LOOKBACK)


def _cut_candidate(key: str, spread: int) -> bool:
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % spread == 0


def window_start(keys: Sequence[str], limit: int) -> int:
    """Where the prompt's history window starts among ``keys`` (the lines' ids, oldest first): at most ``limit`` lines
    from there to the end (ENV-07), and the same start turn after turn until the window would hold more.

    Deterministic from the ids alone: a box re-created after an idle timeout picks the start the warm one did."""
    count = len(keys)
    if limit <= 0:
        return count
    if count <= limit:
        return 0
    least = max(1, round(STEP_LEAST * limit))
    most = max(least, round(STEP_MOST * limit))  # never more than ``limit``: the window is never empty
    spread = max(1, round(STEP_SPREAD * limit))
    start = 0
    while count - start > limit:
        cut = start + least
        while cut < start + most and not _cut_candidate(keys[cut], spread):
            cut += 1
        start = cut
    return start
