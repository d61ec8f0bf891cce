"""A line of the responder's own conversation history, and its trimming rules (ENV-07, ENV-11).

The box reads and writes its channel's lines through the host (``box.history``); the host keeps them
(``impyard.conversation.responder_history``) and trims them after each commit with these same rules and the imp's own
limits, so both sides agree on which lines a channel keeps.
"""

from __future__ import annotations

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
