"""Forming and keeping a moment, after delivery is confirmed (mechanisms 47, 57-66).

The appraisal forms the feeling to keep with the mood withheld (57, 58); when its answer cannot be
read the reply's own moment is kept (59). The temperament bends it (60). The event is kept as it
happened — "X said: … / <imp> replied: …", or only what the person said when the imp stayed silent or
the reply waits for approval (47) — with the retelling (61) and the embedding of what the person said
(62; ours: the seed embeds the whole text, see ``searched_text``). A
moment of the same sign as the conversation's living record joins it and restores it (64, 66); a change
of sign opens a new record, whose vector is its conclusion (63), and the strongest same-sign lived
association of the turn comes back as an echo (65). A moment the appraisal calls lasting (something a
friend would still know about someone months on) opens a record of its own, kept (issue 32: a departure
from the seed, see docs/memory.md "Keeping"), and the living record stays the one it was.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from box.common.envelope import Envelope
from box.common.laws import Temperament, bend, same_sign
from box.protocol.memory import (
    MAX_CONCLUSION_CHARS,
    MAX_EPISODE_CHARS,
    MAX_FEELING_CHARS,
    MAX_TOLD_CHARS,
    EncodeParams,
    NewEpisode,
    NewRecord,
    RecordView,
    Restore,
)
from box.protocol.models import MemoryPurpose

PURPOSE: MemoryPurpose = "appraisal"
MAX_AUTHOR_CHARS = 64  # the protocol's PersonName

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "feeling": {"type": "string", "maxLength": 100},  # issue 33: "a few words"
        "conclusion": {"type": "string", "maxLength": 400},  # one sentence
        "valence": {"type": "number"},
        "intensity": {"type": "number"},
        "lasting": {"type": "boolean"},  # issue 32: something lasting about someone (kept, never forgotten)
    },
    "required": ["feeling", "conclusion", "valence", "intensity", "lasting"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class Felt:
    """A moment as felt: what the appraisal (or the reply's fallback) said."""

    feeling: str
    conclusion: str
    valence: float
    intensity: float
    lasting: bool = False  # issue 32: it tells something lasting about someone; kept apart, never forgotten

    def bent(self, temperament: Temperament) -> Felt:
        """Mechanism 60: the temperament's bend (neutral by default: only clamped)."""
        valence, intensity = bend(self.valence, self.intensity, temperament)
        return Felt(self.feeling, self.conclusion, valence, intensity, self.lasting)


def read_appraisal(answer: dict[str, Any] | None) -> Felt | None:
    """The appraisal's answer, or None when it cannot be read (then mechanism 59 falls back)."""
    if answer is None:
        return None
    feeling, conclusion = answer.get("feeling"), answer.get("conclusion")
    valence, intensity = answer.get("valence"), answer.get("intensity")
    if not isinstance(feeling, str) or not feeling.strip() or not isinstance(conclusion, str):
        return None
    if not _number(valence) or not _number(intensity):
        return None
    lasting = answer.get("lasting") is True  # anything but a JSON true is not lasting (issue 32)
    return Felt(feeling.strip(), conclusion.strip(), float(valence), float(intensity), lasting)  # type: ignore[arg-type]


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def reply_moment(envelope: Envelope) -> Felt | None:
    """Mechanism 59: the reply call's own feeling, conclusion, valence and intensity."""
    moment = envelope.moment
    if moment is None or not moment.feeling.strip():
        return None
    return Felt(moment.feeling.strip(), moment.conclusion.strip(), moment.valence, moment.intensity)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def event_text(person: str, said: str, imp: str, replied: str | None) -> str:
    """Mechanism 62: the event as it happened, cut to the protocol's bound with both sides kept visible.

    Only what the person said when nothing was delivered (47; a pending reply is never claimed as seen).
    """
    head = f"{person} said: "
    if replied is None:
        return _cut(head + said, MAX_EPISODE_CHARS)
    middle = f"\n{imp} replied: "
    room = MAX_EPISODE_CHARS - len(head) - len(middle)
    if len(said) + len(replied) > room:  # share the room, each side gets at least half of it if it needs it
        reply_room = max(room // 2, room - len(said))
        replied = _cut(replied, reply_room)
        said = _cut(said, room - len(replied))
    return f"{head}{said}{middle}{replied}"


def searched_text(said: str, as_happened: str) -> str:
    """What an episode's vector embeds (mechanism 62, a departure: issue 32, docs/memory.md): the person's own
    words, cut to the episode's bound; the as-it-happened text only when they said nothing in words (an
    image alone). The seed embeds "X said: … / <imp> replied: …": the speaker's label and the reply dilute
    what was said, and a search for it fell behind a plain vector search of the words themselves."""
    words = said.strip()
    return _cut(words, MAX_EPISODE_CHARS) if words else as_happened


def strongest_echo(felt: Felt, associations: Sequence[RecordView]) -> RecordView | None:
    """Mechanism 65 (subtle point 9): the strongest same-sign lived association, by stored intensity."""
    same = [r for r in associations if r.kind == "lived" and same_sign(r.valence, felt.valence)]
    return max(same, key=lambda r: r.intensity) if same else None


def encoding(
    felt: Felt,
    *,
    person: str,
    person_id: str | None,
    message_id: str | None,
    as_happened: str,
    told: str | None,
    episode_vector: list[float] | None,
    living: str | None,
    living_valence: float | None,
    record_vector: list[float] | None,
    associations: Sequence[RecordView],
) -> EncodeParams:
    """Mechanisms 61-66: the ``memory.encode`` request that keeps this moment."""
    episode = NewEpisode(
        author=_cut(person, MAX_AUTHOR_CHARS), author_id=_id(person_id), message_id=_id(message_id),
        as_happened=as_happened, told=_cut(told, MAX_TOLD_CHARS) if told else None, vector=episode_vector,
    )  # fmt: skip
    if joins(felt, living, living_valence):
        assert living is not None
        return EncodeParams(
            join=living, episode=episode, restore=[Restore(record_id=living, toward=felt.intensity)]
        )  # mechanisms 64, 66: only the living record is restored
    record = NewRecord(
        author=_cut(person, MAX_AUTHOR_CHARS), author_id=_id(person_id), feeling=_cut(felt.feeling, MAX_FEELING_CHARS),
        conclusion=_cut(felt.conclusion, MAX_CONCLUSION_CHARS), valence=felt.valence, intensity=felt.intensity,
        vector=record_vector, lasting=felt.lasting,
    )  # fmt: skip
    echo = strongest_echo(felt, associations)
    restore = [Restore(record_id=echo.id, toward=felt.intensity)] if echo is not None else []  # mechanism 65
    return EncodeParams(record=record, episode=episode, restore=restore)


def joins(felt: Felt, living: str | None, living_valence: float | None) -> bool:
    """Mechanism 64 (subtle point 8): same sign as the living record (zero counts as positive).

    Departure from the seed (issue 32, docs/memory.md "Keeping"): a lasting moment never joins; it opens a
    record of its own that is kept, so it does not share the fate of the small talk around it."""
    if felt.lasting:
        return False
    return living is not None and living_valence is not None and same_sign(felt.valence, living_valence)


def _id(value: str | None) -> str | None:
    return value[:128] if value else None
