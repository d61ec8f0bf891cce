"""Arrival: someone enters a conversation (mechanisms 28, 101, 102; design §7).

A person's first message in a channel — ever, after 1800 s of absence, or after they departed — is their
arrival. Before the ordinary turn for their words, the imp recalls by person (28: the strongest records with
or about them, by raw intensity, no similarity, no filter) and makes one reply call with the arrival schema
(101): the feeling of their coming and at most one plain search (29), after which it is asked once more
with what was found. The seed's optional greeting is not asked for (issue 33): in chat the person's own
words get the reply, so a greeting would never be sent — an answer thrown away. The feeling, bent by the
temperament (60), enters this conversation's focus as a moment and is never stored (102). What came to
mind joins the turn's associations like any recall.

It runs beside the turn's own recall, off the reply's critical path where it can be: the ordinary
turn waits for it only before its first reply call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from box.common.laws import Temperament
from box.memory import contexts as ctx
from box.memory.calls import TEMPERATURE_REPLY, MemoryModel
from box.memory.contexts import Scene
from box.memory.focus import FocusEntry, cut, moment_entry
from box.memory.moment import read_appraisal
from box.memory.prompts import Prompts
from box.memory.recall import Recall
from box.memory.words import INTENSITY_SCALE, age_words
from box.protocol.memory import RecordView, SlotEntry

MAX_ARRIVAL_CALLS = 2  # mechanism 101: the reply call, and once more after its one plain search
SEARCH_QUERY_CHARS = 80  # mechanism 5

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "feeling": {"type": "string", "maxLength": 100},  # issue 33: "a few words"
        "conclusion": {"type": "string", "maxLength": 400},  # one sentence
        "valence": {"type": "number"},
        "intensity": {"type": "number"},
        "search": {"type": ["string", "null"], "maxLength": 200},  # a few words
    },
    "required": ["feeling", "conclusion", "valence", "intensity", "search"],
    "additionalProperties": False,
}


def arrival_text(person: str) -> str:
    """The arrival as the focus shows it among this conversation's moments."""
    return f"{person} entered the conversation."


@dataclass
class Arrived:
    """What an arrival left: the focus entry (None when no feeling could be formed) and what came to mind."""

    entry: FocusEntry | None = None
    records: list[RecordView] = field(default_factory=list)
    searched: str | None = None
    calls: int = 0


class Arrival:
    def __init__(
        self,
        *,
        model: MemoryModel,
        recall: Recall,
        prompts: Prompts,
        imp: str,
        temperament: Temperament,
    ) -> None:
        self.model = model
        self.recall = recall
        self.prompts = prompts
        self.imp = imp
        self.temperament = temperament

    async def arrive(self, scene: Scene, slot: Sequence[SlotEntry] = ()) -> Arrived:
        """Mechanisms 28 and 101: recall by person, the arrival call, at most one plain search."""
        scene = replace(scene, hearing="entered")
        arrived = Arrived(records=await self.recall.about_person(scene.person))  # mechanism 28
        found: list[RecordView] | None = None
        answer: dict[str, Any] | None = None
        while arrived.calls < MAX_ARRIVAL_CALLS:
            arrived.calls += 1
            latest = await self._ask(scene, arrived.records, slot, arrived.searched, found)
            if latest is None:
                break
            answer = latest
            query = latest.get("search")
            if arrived.searched is not None or not isinstance(query, str) or not query.strip():
                break
            arrived.searched = query.strip()
            found = await self.recall.plain(arrived.searched)  # mechanism 29: plain, once
            known = {r.id for r in arrived.records}
            arrived.records += [r for r in found if r.id not in known]
        felt = read_appraisal(answer)
        if felt is not None:
            felt = felt.bent(self.temperament)  # mechanism 60
            entry = moment_entry(
                record_id=None, author=scene.person, author_id=scene.person_id, feeling=felt.feeling,
                conclusion=felt.conclusion, valence=felt.valence, intensity=felt.intensity, at=scene.now,
                text=arrival_text(scene.person), message_id=None,
            )  # fmt: skip
            arrived.entry = entry.model_copy(update={"arrival": True})  # mechanism 102: the focus only
        return arrived

    async def _ask(
        self,
        scene: Scene,
        about: Sequence[RecordView],
        slot: Sequence[SlotEntry],
        searched: str | None,
        found: Sequence[RecordView] | None,
    ) -> dict[str, Any] | None:
        prompts, model = self.prompts, self.model.model_for("arrival")
        system = prompts.render("arrival.system", model, imp=self.imp, intensity_scale=INTENSITY_SCALE)
        memories = "\n".join(ctx.memory_line(prompts, model, r, scene) for r in about)
        thoughts = ""
        if slot:
            lines = "\n".join(
                f"- {ctx.construct_statement(e.record)} ({_age(e.record.happened_at, scene)})" for e in slot
            )
            thoughts = prompts.render("arrival.thoughts", model, lines=lines)
        recalled = ""
        if searched is not None:
            query = cut(searched.replace("\n", " "), SEARCH_QUERY_CHARS)
            if found:
                lines = "\n".join(ctx.memory_line(prompts, model, r, scene) for r in found)
                recalled = prompts.render("arrival.recalled", model, query=query, lines=lines)
            else:
                recalled = prompts.render("arrival.recalled_none", model, query=query)
        user = prompts.render(
            "arrival.user", model, senses=ctx.senses(prompts, model, scene), person=scene.person,
            memories=memories or prompts.render("arrival.nothing_about", model, person=scene.person),
            thoughts=thoughts, recalled=recalled,
        )  # fmt: skip
        return await self.model.chat_json(
            "arrival", system, user, temperature=TEMPERATURE_REPLY, schema=SCHEMA
        )


def _age(when: datetime, scene: Scene) -> str:
    return age_words(when, scene.now, scene.timezone)
