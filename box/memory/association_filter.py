"""The association filter call (mechanisms 20, 21, 23): which candidates the words really bring back.

One call at temperature 0.2 with a strict schema: the numbers of the memories to keep, whether the
words ask for a moment of the imp's past (``asks_for_memory``) and whether they ask what it dreams,
believes, decided or wants (``asks_for_own``). An answer that cannot be read is ``None``; recall then
keeps the first 3 (mechanism 20). The "keep" list is not cut to the room (subtle point 2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, get_args

from box.memory import contexts
from box.memory.calls import TEMPERATURE_FILTER, MemoryModel
from box.memory.prompts import Prompts
from box.memory.recall import FilterVerdict
from box.protocol.memory import ConstructKind, RecordView
from box.protocol.models import MemoryPurpose

PURPOSE: MemoryPurpose = "filter"
OWN_KINDS: tuple[str, ...] = tuple(k for k in get_args(ConstructKind) if k != "thought")  # mechanism 21

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "keep": {
            "type": "array",
            "items": {"type": "integer"},
            "maxItems": 10,
        },  # issue 33: ≤ the 10 candidates
        "asks_for_memory": {"type": "boolean"},
        "asks_for_own": {"type": ["string", "null"], "enum": [*OWN_KINDS, None]},
    },
    "required": ["keep", "asks_for_memory", "asks_for_own"],
    "additionalProperties": False,
}


def read_verdict(answer: dict[str, Any] | None, count: int) -> FilterVerdict | None:
    """The verdict out of the model's JSON, indices turned 0-based; None when it is not one."""
    if answer is None:
        return None
    keep, asks_memory, asks_own = (
        answer.get("keep"),
        answer.get("asks_for_memory"),
        answer.get("asks_for_own"),
    )
    if not isinstance(keep, list) or not isinstance(asks_memory, bool):
        return None
    if asks_own is not None and asks_own not in OWN_KINDS:
        return None
    indices = [n - 1 for n in keep if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= count]
    return FilterVerdict(keep=indices, asks_for_memory=asks_memory, asks_for_own=asks_own)


class ModelFilter:
    """``AssociationFilter`` over the imp's routed filter model."""

    def __init__(
        self, model: MemoryModel, prompts: Prompts, imp: str, timezone: str, clock: Callable[[], datetime]
    ) -> None:
        self.model = model
        self.prompts = prompts
        self.imp = imp
        self.timezone = timezone
        self.clock = clock  # mechanism 122: the turn's now

    async def choose(self, words: str, candidates: Sequence[RecordView], room: int) -> FilterVerdict | None:
        routed = self.model.model_for(PURPOSE)  # mechanism 54: the block for the routed model
        system = contexts.filter_system(self.prompts, routed, self.imp)
        user = contexts.filter_user(
            self.prompts, routed, words, candidates, self.clock(), self.timezone, room
        )
        answer = await self.model.chat_json(
            PURPOSE, system, user, temperature=TEMPERATURE_FILTER, schema=SCHEMA
        )
        return read_verdict(answer, len(candidates))
