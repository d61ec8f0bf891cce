"""A conversation: one person's talk with the imp in one channel (issue 23, "Conversation and focus").

In a group channel the imp keeps one conversation per person who speaks. Its focus (mechanisms
40-43), its living record (64), its summary (44-45) and its turn count are saved in the host's store
through ``memory.conversation.get|put`` after every committed turn, so a warm box that idles out and a
fresh box that starts for the next message continue the same conversation. The saved JSON stays
under the protocol's bound: the oldest focus entries give way first.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime

from pydantic import BaseModel, Field, ValidationError

from box.memory.focus import Focus, FocusEntry
from box.memory.store_client import StoreClient
from box.protocol.memory import MAX_CONVERSATION_STATE_BYTES

log = logging.getLogger("box.memory")

STATE_VERSION = 1
STATE_BUDGET_BYTES = MAX_CONVERSATION_STATE_BYTES - 4_096  # room for the request's own framing


class SavedConversation(BaseModel):
    """The JSON kept in ``memory_conversations.state``."""

    version: int = STATE_VERSION
    person: str
    person_id: str
    focus: list[FocusEntry] = Field(default_factory=list)
    living: str | None = None  # mechanism 64: the record this conversation is living
    living_valence: float | None = None  # its valence, which never changes (117)
    summary: str | None = None  # mechanisms 44-45
    turns: int = 0  # counted before the reply (subtle point 15)
    stranger: bool = False  # probe 25 found nothing on an earlier turn: later turns know it before the reply
    started_at: datetime | None = None
    last_input_at: datetime | None = None
    departed_at: datetime | None = None  # mechanism 103: the person left; their next message is an arrival


class Conversation:
    """One conversation, loaded at the start of a turn and saved after it."""

    def __init__(self, saved: SavedConversation, *, arrival: bool = False) -> None:
        self.saved = saved
        self.focus = Focus(saved.focus)
        self.arrival = arrival  # a new conversation: the person's first message is their arrival (101)

    @property
    def person(self) -> str:
        return self.saved.person

    @property
    def person_id(self) -> str:
        return self.saved.person_id

    @classmethod
    async def load(
        cls, store: StoreClient, person: str, person_id: str, now: datetime, stale_after_s: float
    ) -> Conversation:
        """This channel's conversation with the person; a new one after ``stale_after_s`` of their absence.

        Absence past the presence window (mechanism 10, 1800 s), or a departure (103), ends a conversation: the
        next message is an arrival (101), so its focus, living record (64, subtle point 8) and summary start
        afresh and ``arrival`` is True — as it is for the person's very first message in this channel.
        """
        saved = await cls.saved_state(store, person_id)
        if saved is not None:
            last = saved.last_input_at
            fresh = last is None or (now - last).total_seconds() <= stale_after_s
            if fresh and saved.departed_at is None:
                saved.person = person  # the display name may have changed; the id keys the conversation
                return cls(saved)
        return cls(SavedConversation(person=person, person_id=person_id), arrival=True)

    @staticmethod
    async def saved_state(store: StoreClient, person_id: str) -> SavedConversation | None:
        """The conversation as last saved, whatever its age (None: none, or unreadable)."""
        got = await store.conversation_get(person_id)
        if got.state is None:
            return None
        try:
            saved = SavedConversation.model_validate(got.state)
        except ValidationError as exc:  # an older or damaged state: start again rather than fail the turn
            log.warning("conversation with %s could not be read; starting afresh: %s", person_id, exc)
            return None
        return saved if saved.version == STATE_VERSION else None

    def snapshot(self) -> dict[str, object]:
        """The state to save, cut to the protocol's bound by dropping the oldest focus entries."""
        self.saved.focus = list(self.focus.entries)
        state = self.saved.model_dump(mode="json")
        while len(json.dumps(state).encode()) > STATE_BUDGET_BYTES and state["focus"]:
            del state["focus"][0]
        return state

    async def save(self, store: StoreClient) -> None:
        await store.conversation_put(self.person_id, self.snapshot())
