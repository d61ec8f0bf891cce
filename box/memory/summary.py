"""The conversation summary (mechanisms 44-45; subtle point 15).

The turn is counted before the reply; the summary is due while none exists and then every 3rd turn,
and only when the focus holds at least 3 events of this person (evoked records they authored count).
The call reads the last 40 of them. It runs beside recall and the filter, off the reply's critical
path; when it fails the old text stays.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from box.common.laws import DEFAULTS, Params
from box.memory import contexts
from box.memory.calls import TEMPERATURE_SUMMARY, MemoryModel
from box.memory.conversation import Conversation
from box.memory.prompts import Prompts
from box.protocol.models import MemoryPurpose

PURPOSE: MemoryPurpose = "summary"
MIN_EVENTS = 3  # subtle point 15
MAX_SUMMARY_CHARS = 4_000

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"summary": {"type": "string", "maxLength": 1_500}},  # issue 33: at most 5 sentences (45)
    "required": ["summary"],
    "additionalProperties": False,
}


def due(conversation: Conversation, params: Params = DEFAULTS) -> bool:
    """Mechanism 44: due while no summary exists, then when the (already counted) turn is a multiple of 3."""
    saved = conversation.saved
    return not saved.summary or saved.turns % params.summary_every_turns == 0


class Summariser:
    def __init__(
        self,
        model: MemoryModel,
        prompts: Prompts,
        imp: str,
        timezone: str,
        clock: Callable[[], datetime],
        params: Params = DEFAULTS,
    ) -> None:
        self.model = model
        self.prompts = prompts
        self.imp = imp
        self.timezone = timezone
        self.clock = clock
        self.params = params

    async def refresh(self, conversation: Conversation) -> bool:
        """Refresh the conversation's summary when it is due; True when a new text was written."""
        if not due(conversation, self.params):
            return False
        events = conversation.focus.by_person(conversation.person, conversation.person_id)
        if len(events) < MIN_EVENTS:
            return False  # the old text stays
        routed = self.model.model_for(PURPOSE)
        system = contexts.summary_system(self.prompts, routed, self.imp, conversation.person)
        user = contexts.summary_user(
            self.prompts, routed, conversation.person, conversation.saved.summary,
            events[-self.params.summary_thread_cap :], self.clock(), self.timezone,
        )  # fmt: skip
        answer = await self.model.chat_json(
            PURPOSE, system, user, temperature=TEMPERATURE_SUMMARY, schema=SCHEMA
        )
        text = answer.get("summary") if answer is not None else None
        if not isinstance(text, str) or not text.strip():
            return False  # mechanism 44: on failure the old text is kept
        conversation.saved.summary = text.strip()[:MAX_SUMMARY_CHARS]
        return True
