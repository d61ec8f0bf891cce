"""The seam the memory engine plugs into (its own issues); without it the responder runs with no memory.

ContextBuilding asks ``recall`` for the memory block of the prompt's ``## Context`` (ENV-10);
the ``search`` tool asks ``search``; PostSend hands the committed turn to ``commit`` only
after delivery is confirmed; channel events (ENV-13) go to ``record_event``. Every method is
synchronous — an engine may score vectors with numpy — so the responder always calls them in
a worker thread (ENV-17), never on the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from box.envelope import Envelope


@dataclass(frozen=True)
class CommittedTurn:
    """What PostSend hands the memory engine: what was said, and what was delivered (if anything)."""

    channel_id: str
    message_id: str
    author: str
    said: str
    outcome: str  # sent | pending | silent
    delivered: str | None  # the reply text as delivered; None when nothing was (pending never claims it)
    envelope: Envelope


class MemoryEngine(Protocol):
    def recall(self, channel_id: str, text: str) -> str | None:
        """The memory block for the prompt, or None."""
        ...

    def search(self, query: str, limit: int) -> list[str]:
        """Remembered snippets for the ``search`` tool, best first."""
        ...

    def commit(self, turn: CommittedTurn) -> None: ...

    def record_event(self, channel_id: str, text: str) -> None: ...


class NoMemory:
    """The responder without a memory engine: recalls nothing, finds nothing, keeps nothing."""

    def recall(self, channel_id: str, text: str) -> str | None:
        return None

    def search(self, query: str, limit: int) -> list[str]:
        return []

    def commit(self, turn: CommittedTurn) -> None:
        return None

    def record_event(self, channel_id: str, text: str) -> None:
        return None
