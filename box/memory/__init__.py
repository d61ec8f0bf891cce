"""The seam the memory engine plugs into (issue 23); without an engine the responder runs with no memory.

The turn machine talks to memory in three places, all async (the engine waits on the host's store
and the gateway, never on the CPU for long):

* ContextBuilding calls ``begin`` with the turn's facts and gets a ``MemoryTurn``: the static memory
  rules for the system text (``rules``) and the ``### Memory`` block of the prompt's ``## Context``
  (``block()``), recomposed before every reply call (mechanism 36).
* ToolExecution hands every draft reply to ``MemoryTurn.next_hop``; True means "call again": the
  engine searched or probed and the block changed (mechanisms 46-53).
* PostSend hands the committed turn to ``MemoryTurn.commit`` only after delivery is confirmed
  (mechanisms 57-66); a failed turn never reaches it.

The ``search`` tool asks ``MemoryEngine.search``; channel events (ENV-13) go to ``record_event``.
``NoMemory`` keeps the memory-off turn byte-identical to the responder without an engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from box.common.envelope import Envelope
from box.protocol.memory import PresenceEntry
from box.protocol.models import Framing, Message


@dataclass(frozen=True)
class TurnFacts:
    """What ContextBuilding knows when it asks memory for the turn."""

    message: Message
    framing: Framing
    now: datetime
    presence: list[PresenceEntry] = field(default_factory=list)  # mechanism 10, from mailbox.deliver
    task: bool = False  # a scheduled prompt: nobody spoke
    # Issue 33: the ids of the messages the reply's chat history carries; the memory block does not repeat
    # the exchanges they hold.
    history_ids: frozenset[str] = frozenset()


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
    author_id: str | None = None
    now: datetime | None = None


class MemoryTurn(Protocol):
    """One turn's memory, from ContextBuilding to PostSend."""

    @property
    def rules(self) -> str | None:
        """Static memory rules for the system text (mechanisms 7, 8, 13, 56), or None."""
        ...

    def block(self) -> str | None:
        """The ``### Memory`` block for the next reply call, or None."""
        ...

    async def next_hop(self, draft: Envelope) -> bool:
        """After a draft: True when the reply must be generated again (the block was recomposed)."""
        ...

    async def commit(self, turn: CommittedTurn) -> None: ...


class MemoryEngine(Protocol):
    async def begin(self, facts: TurnFacts) -> MemoryTurn: ...

    async def search(self, query: str, limit: int) -> list[str]:
        """Remembered snippets for the ``search`` tool, best first."""
        ...

    async def record_event(self, channel_id: str, text: str) -> None: ...


class NoTurn:
    """A turn without memory: no rules, no block, no hops, nothing kept."""

    rules: str | None = None

    def block(self) -> str | None:
        return None

    async def next_hop(self, draft: Envelope) -> bool:
        return False

    async def commit(self, turn: CommittedTurn) -> None:
        return None


NO_TURN = NoTurn()


class NoMemory:
    """The responder without a memory engine: recalls nothing, finds nothing, keeps nothing."""

    async def begin(self, facts: TurnFacts) -> MemoryTurn:
        return NO_TURN

    async def search(self, query: str, limit: int) -> list[str]:
        return []

    async def record_event(self, channel_id: str, text: str) -> None:
        return None
