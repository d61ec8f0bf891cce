"""Reflection: a chain of introspection steps (mechanisms 50, 51, 60, 71-83, 88, 89; subtle points 11, 12).

``Reflector.reflect`` loads the slot (88) and the recent entries (72) once, then asks the introspection
call (temperature 0.5, 71) step by step while the chain continues, at most ``reflection_max_steps`` + 1
calls (78). Each step:

1. the answer is bent by the temperament (60);
2. a negative thought that names an entry it deepens has its conclusion cleared, before it is embedded (77);
3. the thought is kept as a Thought construct and activated in the slot (74); the host says whether it is
   an earlier thought recurring (75: not written, the old one re-felt, and then the entry it names is not
   restored, and the earlier text becomes the next step's "previous");
4. else an entry of the same sign that it names is restored toward the thought's intensity (76);
5. the act: keep_thinking continues with only "You chose to keep thinking." as the direction (79);
   search_more runs a plain search and the next step sees what it found (80); belief, decision, goal or
   dream with text forms that construct in the slot and ends the chain (81; the host dedups, 82); anything
   else ends it.

A model failure ends the chain quietly; a store that does not answer raises ``StoreUnavailable``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, get_args

from box.common.laws import DEFAULTS, NEUTRAL, Params, Temperament, same_sign
from box.memory import introspection as view_of
from box.memory.calls import TEMPERATURE_INTROSPECTION, MemoryModel
from box.memory.contexts import Scene
from box.memory.focus import Focus, cut
from box.memory.introspection import Direction, IntrospectionView, Previous, Shown
from box.memory.moment import Felt
from box.memory.prompts import Prompts
from box.memory.recall import Embedder, plain_search
from box.memory.store_client import StoreClient
from box.protocol.memory import (
    MAX_CONCLUSION_CHARS,
    MAX_FEELING_CHARS,
    MAX_STATEMENT_CHARS,
    ConstructKind,
    ConstructParams,
    ConstructResult,
    RecordView,
    Restore,
    SlotEntry,
)
from box.protocol.models import MemoryPurpose

log = logging.getLogger("box.memory.reflection")

HostLog = Callable[[str, str], Awaitable[None]]  # (level, message), as the engine's

PURPOSE: MemoryPurpose = "introspection"
ENTRY_EPISODES = 5  # seed 002: introspection loads 5 episodes per entry
Act = Literal["none", "keep_thinking", "search_more", "belief", "decision", "goal", "dream"]
ACTS: tuple[str, ...] = get_args(Act)  # mechanism 71
FORMING: dict[str, ConstructKind] = {  # mechanism 81: the acts that form a construct of their kind
    "belief": "belief",
    "decision": "decision",
    "goal": "goal",
    "dream": "dream",
}
CONTINUING: frozenset[str] = frozenset({"keep_thinking", "search_more"})  # mechanism 78

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "thought": {"type": "string", "maxLength": 600},  # issue 33: one or two sentences
        "feeling": {"type": "string", "maxLength": 100},
        "conclusion": {"type": "string", "maxLength": 400},
        "valence": {"type": "number"},
        "intensity": {"type": "number"},
        "reinforces": {"type": ["integer", "null"]},
        "act": {"type": "string", "enum": list(ACTS)},
        "text": {"type": ["string", "null"], "maxLength": 400},
    },
    "required": ["thought", "feeling", "conclusion", "valence", "intensity", "reinforces", "act", "text"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class Seed:
    """A mid-turn reflection's start (mechanisms 50, 51)."""

    exchange: str  # "Ann said: … / I was about to reply: …"
    thought: str  # the draft's conclusion
    angle: str | None  # the introspect action's text: the direction of the first step


@dataclass(frozen=True)
class Step:
    """One introspection step as it was taken."""

    thought: str
    act: str  # none | keep_thinking | search_more | belief | decision | goal | dream (as carried out)
    text: str | None  # the act's text as used (None after keep_thinking: it is dropped, 79)
    record_id: str | None  # the Thought construct (new or recurring)
    recurred: bool
    formed: str | None  # the construct the act formed (81), if any


@dataclass
class Reflected:
    steps: list[Step] = field(default_factory=list)
    slot: list[SlotEntry] = field(default_factory=list)  # the slot after the reflection


@dataclass(frozen=True)
class Answer:
    """One introspection answer, read (mechanism 71)."""

    thought: str
    felt: Felt
    reinforces: int | None  # 1-based, as the model gave it
    act: str
    text: str | None


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def read_answer(answer: dict[str, Any] | None) -> Answer | None:
    """Mechanism 71: the answer, or None when it carries no thought or no readable feeling.

    An unknown act is "none"; an index that is not a whole number is no index; blank text is no text.
    """
    if answer is None:
        return None
    thought, feeling, conclusion = answer.get("thought"), answer.get("feeling"), answer.get("conclusion")
    valence, intensity = answer.get("valence"), answer.get("intensity")
    if not isinstance(thought, str) or not thought.strip():
        return None
    if not _number(valence) or not _number(intensity):
        return None
    reinforces = answer.get("reinforces")
    act = answer.get("act")
    text = answer.get("text")
    return Answer(
        thought=thought.strip(),
        felt=Felt(
            feeling.strip() if isinstance(feeling, str) else "",
            conclusion.strip() if isinstance(conclusion, str) else "",
            float(valence),  # type: ignore[arg-type]
            float(intensity),  # type: ignore[arg-type]
        ),
        reinforces=reinforces if isinstance(reinforces, int) and not isinstance(reinforces, bool) else None,
        act=act if isinstance(act, str) and act in ACTS else "none",
        text=text.strip() if isinstance(text, str) and text.strip() else None,
    )


def target(shown: list[Shown], reinforces: int | None) -> Shown | None:
    """Subtle point 11: ``reinforces`` (1-based) names an item of the slot-plus-entries list, or nothing."""
    if reinforces is None or not 1 <= reinforces <= len(shown):
        return None
    return shown[reinforces - 1]


def circled(felt: Felt, named: Shown | None) -> Felt:
    """Mechanism 77: a negative thought that deepens a named entry adds no conclusion."""
    if named is not None and felt.valence < 0:
        return Felt(felt.feeling, "", felt.valence, felt.intensity)
    return felt


def refeels(felt: Felt, named: Shown | None, recurred: bool) -> Restore | None:
    """Mechanisms 75, 76: the named entry is restored toward the thought's intensity when the signs agree
    (zero counts as positive) — unless the thought is an earlier one recurring."""
    if named is None or recurred or not same_sign(named.valence, felt.valence):
        return None
    return Restore(record_id=named.record_id, toward=felt.intensity)


class Reflector:
    """One imp's reflection over its store: mid-turn (50), when idle (105-106) or on departure (103)."""

    def __init__(
        self,
        *,
        model: MemoryModel,
        store: StoreClient,
        embedder: Embedder,
        prompts: Prompts,
        imp: str,
        timezone: str,
        params: Params = DEFAULTS,
        temperament: Temperament = NEUTRAL,
        host_log: HostLog | None = None,
    ) -> None:
        self.model = model
        self.store = store
        self.embedder = embedder
        self.prompts = prompts
        self.imp = imp
        self.timezone = timezone
        self.params = params
        self.temperament = temperament
        self._host_log = host_log

    async def _log(self, level: str, message: str) -> None:
        log.log(logging.getLevelName(level.upper()), message)
        if self._host_log is not None:
            await self._host_log(level, message[:1000])

    async def reflect(
        self,
        *,
        now: datetime,
        focus: Focus | None = None,
        seed: Seed | None = None,
        scene: Scene | None = None,
    ) -> Reflected:
        slot = await self.store.slot()  # mechanism 88: loaded at every reflection
        recent = await self.store.recent(
            k=self.params.introspection_entries, kinds=("lived", "construct"), episodes=ENTRY_EPISODES
        )  # subtle point 11: constructs are taken, then dropped
        entries = view_of.recent_entries(focus, recent.records, self.params.introspection_entries)
        reflected = Reflected(slot=list(slot))
        previous, direction = _start(seed)
        recalled: list[RecordView] | None = None
        routed = self.model.model_for(PURPOSE)  # mechanism 54
        system = view_of.system(self.prompts, routed, self.imp)
        for depth in range(self.params.reflection_max_steps + 1):  # mechanism 78: at most 4 calls
            step_view = IntrospectionView(
                now=now, timezone=self.timezone, slot=reflected.slot, entries=entries, scene=scene,
                previous=previous, direction=direction, recalled=recalled,
            )  # fmt: skip
            user = view_of.user(self.prompts, routed, step_view)
            raw = await self.model.chat_json(
                PURPOSE, system, user, temperature=TEMPERATURE_INTROSPECTION, schema=SCHEMA
            )
            answer = read_answer(raw)
            if answer is None:  # a model failure ends the chain quietly
                await self._log("info", f"reflection ended after {depth} step(s): no readable introspection")
                break
            step, previous = await self._step(answer, view_of.shown(reflected.slot, entries), reflected)
            reflected.steps.append(step)
            if step.act not in CONTINUING or depth >= self.params.reflection_max_steps:
                break
            if step.act == "keep_thinking":
                direction, recalled = Direction("keep_thinking"), None  # mechanism 79
            else:
                assert step.text is not None
                direction = Direction("search", step.text)  # mechanism 80
                recalled = await plain_search(self.store, self.embedder, step.text, self.params)  # 80 (29)
        return reflected

    async def _step(self, answer: Answer, shown: list[Shown], reflected: Reflected) -> tuple[Step, Previous]:
        """Mechanisms 60, 74-77, 81: keep the thought, re-feel what it names, carry out its act."""
        named = target(shown, answer.reinforces)
        felt = circled(answer.felt.bent(self.temperament), named)  # 60, then 77 before the embedding
        thought = await self._construct("thought", answer.thought, felt)  # mechanism 74
        reflected.slot = list(thought.slot)
        recurred = not thought.created
        restore = refeels(felt, named, recurred)  # mechanisms 75, 76
        if restore is not None:
            await self.store.restore([restore])
        # Subtle point 11: when the thought recurs, the earlier thought's text is what the next step continues.
        previous = Previous(
            (thought.previous or answer.thought) if recurred else answer.thought, felt.conclusion
        )
        act, text, formed = answer.act, answer.text, None
        if act in FORMING:
            if text is None:
                act = "none"  # mechanism 81: an act without text is nothing
            else:
                made = await self._construct(FORMING[act], text, felt)  # mechanisms 81, 82
                reflected.slot = list(made.slot)
                formed = made.record_id
        elif act == "search_more" and text is None:
            act = "none"  # nothing to search for
        elif act == "keep_thinking":
            text = None  # mechanism 79: the model's text is dropped
        elif act == "none":
            text = None
        step = Step(
            thought=answer.thought, act=act, text=text, record_id=thought.record_id, recurred=recurred,
            formed=formed,
        )  # fmt: skip
        return step, previous

    async def _construct(self, kind: ConstructKind, statement: str, felt: Felt) -> ConstructResult:
        """Form (or recur, or reinforce) a construct in the slot; its vector is statement + conclusion (63)."""
        text = cut(statement, MAX_STATEMENT_CHARS)
        vector = await self.embedder.embed(f"{text} {felt.conclusion}".strip())
        return await self.store.construct(
            ConstructParams(
                construct_kind=kind,
                statement=text,
                feeling=cut(felt.feeling, MAX_FEELING_CHARS),
                conclusion=cut(felt.conclusion, MAX_CONCLUSION_CHARS),
                valence=felt.valence,
                intensity=felt.intensity,
                vector=vector,
                slot=True,
            )
        )


def _start(seed: Seed | None) -> tuple[Previous | None, Direction | None]:
    """Mechanism 51: a mid-turn chain starts from the exchange as the previous thought, the angle as the
    direction; an idle chain starts from nothing."""
    if seed is None:
        return None, None
    direction = Direction("angle", seed.angle) if seed.angle and seed.angle.strip() else None
    return Previous(seed.exchange, seed.thought), direction
