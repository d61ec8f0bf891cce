"""Dispositions in the box: learning a rule on departure, and selecting the rules that fit (mechanisms 90-100).

A disposition is a learned rule, "when <situation> → <act>", naming no one: the imp's character, shared by
every scope. The box asks the model; the host keeps the rules and applies the arithmetic (95-98, in
``impyard.memory.store`` over ``box.common.laws`` section J).

* **Carried lines (92)**: what the imp carries now — at most 3 short lines from its 12 most recently felt
  records. Learning and selection both read them: without them a question that presses on a sore point
  reads as a harmless one.
* **Learning (90-97)**: ``Learner.learn`` — the weight from the person's strongest moment (93; no call
  without two moments), one learning call (90-91), a rule refused by the rule law (``laws.rule_refusal``:
  too long, or holding a name, a number, an address, a link or a quotation; the host applies the same law
  with all it knows, issue 32), a classification call against the rules held (94; none when none are held),
  then ``memory.dispositions.learn``. A rule the host refuses (rule ``memory-rule-law``) is not learned.
* **Selection (99)**: ``ModelSelector.select`` — before recall, one call over the active rules, the carried
  lines and the situation; at most 3 kept. The engine shows them to the reply only (100).

A model call that fails costs a rule, never a turn: selection then selects nothing and learning learns
nothing. A store that does not answer (``StoreUnavailable``) goes to the caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from box.common.laws import (
    DEFAULTS,
    NEUTRAL,
    RULE_MAX_WORDS,
    Params,
    Temperament,
    clean_rule,
    is_active,
    rule_refusal,
    rule_weight,
)
from box.memory.calls import (
    TEMPERATURE_CLASSIFICATION,
    TEMPERATURE_LEARNING,
    TEMPERATURE_SELECTION,
    MemoryModel,
)
from box.memory.contexts import construct_statement
from box.memory.conversation import Conversation
from box.memory.focus import cut
from box.memory.prompts import Prompts
from box.memory.store_client import StoreClient, StoreUnavailable
from box.protocol import ErrorCode, RpcError
from box.protocol.memory import BOTH_KINDS, MAX_RULE_CHARS, DispositionView, RecordView

CARRIED_LINES = 3  # mechanism 92: at most 3 lines
CARRIED_WINDOW = 12  # mechanism 92: from the 12 most recently felt records
CARRIED_CHARS = 160  # mechanism 92: each at most 160 characters
RULE_LAW = "memory-rule-law"  # the rule by which the host refuses a rule that breaks the law (issue 32)
SITUATION_EXCHANGES = 2  # mechanism 99: the last 2 exchanges of the conversation, then the words
SITUATION_TEXT_CHARS = 600  # one exchange as selection reads it
WORDS_CHARS = 2_000  # the words being answered, as selection reads them

LEARNING_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "learned": {"type": ["string", "null"], "maxLength": MAX_RULE_CHARS}
    },  # issue 33: ≤ 20 words
    "required": ["learned"],
    "additionalProperties": False,
}
CLASSIFICATION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"same": {"type": "integer"}, "contradicts": {"type": "integer"}},
    "required": ["same", "contradicts"],
    "additionalProperties": False,
}
SELECTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "matched": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}
    },  # issue 33: ≤ 3 (99)
    "required": ["matched"],
    "additionalProperties": False,
}


# ------------------------------------------------------------------ mechanism 92: carried lines


def _one_line(text: str) -> str:
    return " ".join(text.split())


def carried_lines(records: Sequence[RecordView]) -> list[str]:
    """Mechanism 92: what the imp carries now, at most 3 lines of at most 160 characters.

    From the 12 most recently felt of ``records`` (lived records and constructs): a lived record's
    conclusion, a construct's statement ("I believe: …", 83). The 3 felt most strongly now (``felt``;
    the more recently felt first among equals), strongest first; empty texts are skipped and a text
    already taken is not taken twice.
    """
    window = sorted(records, key=lambda r: r.last_felt, reverse=True)[:CARRIED_WINDOW]
    lines: list[str] = []
    for record in sorted(window, key=lambda r: r.felt, reverse=True):  # stable: recency breaks ties
        if record.kind == "construct":
            body = _one_line(record.statement or record.conclusion)
            text = _one_line(construct_statement(record)) if body else ""
        else:
            text = _one_line(record.conclusion)
        if not text:
            continue
        line = cut(text, CARRIED_CHARS)
        if line in lines:
            continue
        lines.append(line)
        if len(lines) == CARRIED_LINES:
            break
    return lines


def _carried_text(prompts: Prompts, model: str, carried: Sequence[str]) -> str:
    if not carried:
        return prompts.render("carried.none", model)
    return "\n".join(prompts.render("carried.line", model, line=line) for line in carried)


def _numbered(prompts: Prompts, model: str, rules: Sequence[DispositionView]) -> str:
    return "\n".join(
        prompts.render("rule.entry", model, index=n, rule=rule.rule) for n, rule in enumerate(rules, 1)
    )


def _index(value: object, count: int) -> int | None:
    """A 1-based index from the model into a list of ``count``, 0-based; None for -1 or anything invalid."""
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= count:
        return value - 1
    return None


# ------------------------------------------------------------------ mechanism 90: the rule law


def refusal(rule: str, person: str) -> str | None:
    """Mechanism 90 (issue 32): why ``rule`` (``laws.clean_rule``'d) cannot be kept, or None when it can.

    The rule law (``laws.rule_refusal``) with what the box knows — the person who left — and the protocol's
    bound on a rule's characters. The host applies the same law again with all it knows (the people of its
    history and memory, the conversation's words); the box's check only spares it a refused request.
    """
    if len(rule) > MAX_RULE_CHARS:
        return f"longer than {MAX_RULE_CHARS} characters"
    return rule_refusal(rule, speakers=[person] if person.strip() else [])


def _host_refused(exc: StoreUnavailable) -> str | None:
    """The host's reason when it refused the rule by the rule law (DENIED, rule ``memory-rule-law``)."""
    cause = exc.__cause__
    if isinstance(cause, RpcError) and cause.code == ErrorCode.DENIED:
        data = cause.data if isinstance(cause.data, dict) else {}
        if data.get("rule") == RULE_LAW:
            return str(data.get("reason") or cause.message)[:300]
    return None


# ------------------------------------------------------------------ mechanisms 90-97: learning


@dataclass(frozen=True)
class Learned:
    """What one departure taught. ``rule`` is None when nothing was learned, and ``reason`` says why."""

    rule: str | None  # the rule as learned (the host may keep an older text of the same rule, 95)
    weight: float | None
    action: str | None  # added | counted | replaced (from the host)
    weakened: str | None  # the id of the rule it contradicted (97)
    reason: str = ""


def _nothing(reason: str, *, rule: str | None = None, weight: float | None = None) -> Learned:
    return Learned(None, weight, None, None, reason=reason if rule is None else f"{reason}: {rule!r}")


class Learner:
    """Mechanisms 90-97: one departure's rule, kept through the host."""

    def __init__(
        self,
        model: MemoryModel,
        store: StoreClient,
        prompts: Prompts,
        imp: str,
        temperament: Temperament = NEUTRAL,
        params: Params = DEFAULTS,
    ) -> None:
        self.model = model
        self.store = store
        self.prompts = prompts
        self.imp = imp
        self.temperament = temperament
        self.params = params

    async def learn(
        self, *, context: str, carried: Sequence[str], valences: Sequence[float], person: str
    ) -> Learned:
        """Learn from the conversation that ended: ``context`` is the departure context rendered in full
        (91), ``carried`` the carried lines after the quiet reflection (92, subtle point 14), ``valences``
        the person's word-carrying moments (arrival excluded, 93), ``person`` their name."""
        weight = rule_weight(valences)  # mechanism 93
        if weight is None:
            return _nothing("fewer than two moments with words: nothing to learn from")
        rule = await self._ask_rule(context, carried)
        if rule is None:
            return _nothing("the learning call gave no answer", weight=weight)
        if not rule:
            return _nothing("the conversation taught nothing new", weight=weight)
        why = refusal(rule, person)
        if why is not None:
            return _nothing(f"rule refused, {why}", rule=rule, weight=weight)
        same, contradicts = await self._classify(rule)  # mechanism 94
        try:
            result = await self.store.learn(
                rule, weight, same=same, contradicts=contradicts,
                avoidance_weight=self.temperament.avoidance_weight,
            )  # fmt: skip  # mechanisms 95-97, on the host
        except StoreUnavailable as exc:
            why = _host_refused(exc)
            if why is None:
                raise
            return _nothing(f"the host refused the rule ({why})", rule=rule, weight=weight)
        return Learned(rule, weight, result.action, result.weakened)

    async def _ask_rule(self, context: str, carried: Sequence[str]) -> str | None:
        """Mechanisms 90-91: one call (temperature 0.2). None: no answer; "": nothing learned."""
        routed = self.model.model_for("learning")  # mechanism 54
        system = self.prompts.render("learning.system", routed, imp=self.imp, words=RULE_MAX_WORDS)
        user = self.prompts.render(
            "learning.user", routed, context=context, carried=_carried_text(self.prompts, routed, carried)
        )
        answer = await self.model.chat_json(
            "learning", system, user, temperature=TEMPERATURE_LEARNING, schema=LEARNING_SCHEMA
        )
        if answer is None:
            return None
        learned = answer.get("learned")
        return clean_rule(learned) if isinstance(learned, str) else ""

    async def _classify(self, rule: str) -> tuple[str | None, str | None]:
        """Mechanism 94: (same, contradicts) as rule ids, over the 100 strongest held (dormant included).

        No call when no rule is held; an unreadable answer counts as "neither" (the rule is added).
        """
        held = await self.store.dispositions(k=self.params.dispositions_base, active_only=False)
        if not held:
            return None, None
        routed = self.model.model_for("classification")
        system = self.prompts.render("classification.system", routed, imp=self.imp)
        user = self.prompts.render(
            "classification.user", routed, rule=rule, rules=_numbered(self.prompts, routed, held)
        )
        answer = await self.model.chat_json(
            "classification", system, user, temperature=TEMPERATURE_CLASSIFICATION,
            schema=CLASSIFICATION_SCHEMA,
        )  # fmt: skip
        if answer is None:
            return None, None
        same = _index(answer.get("same"), len(held))
        if same is not None:
            return held[same].id, None  # the same rule learned again (95): it contradicts nothing
        contradicts = _index(answer.get("contradicts"), len(held))
        return None, held[contradicts].id if contradicts is not None else None


# ------------------------------------------------------------------ mechanism 99: selection


class SelectionTurn(Protocol):
    """What selection reads of a turn (``box.memory.engine.ChatTurn`` is one)."""

    @property
    def conversation(self) -> Conversation | None: ...

    @property
    def words(self) -> str: ...


def situation(prompts: Prompts, model: str, turn: SelectionTurn) -> str:
    """Mechanism 99: the last 2 exchanges of the conversation, oldest first, then the words now."""
    conversation = turn.conversation
    person = conversation.person if conversation is not None else ""
    moments = conversation.focus.moments()[-SITUATION_EXCHANGES:] if conversation is not None else []
    lines = [
        prompts.render("selection.exchange", model, text=cut(_one_line(m.text), SITUATION_TEXT_CHARS))
        for m in moments
        if m.text.strip()
    ]
    words = cut(turn.words.strip(), WORDS_CHARS)
    lines.append(
        prompts.render("selection.words", model, person=person, words=words)
        if person
        else prompts.render("selection.words_unnamed", model, words=words)
    )
    return "\n".join(lines)


class ModelSelector:
    """``engine.DispositionSelector`` (mechanisms 99-100): which learned rules fit this situation."""

    def __init__(
        self, model: MemoryModel, store: StoreClient, prompts: Prompts, imp: str, params: Params = DEFAULTS
    ) -> None:
        self.model = model
        self.store = store
        self.prompts = prompts
        self.imp = imp
        self.params = params

    async def select(self, turn: SelectionTurn) -> list[str]:
        """The fitting rules' texts, at most 3, in the model's order; no call when no rule is active (98)."""
        held = await self.store.dispositions(k=self.params.dispositions_base, active_only=True)
        rules = [rule for rule in held if is_active(rule.weight)]  # mechanism 98, whatever the host sent
        if not rules:
            return []
        recent = await self.store.recent(k=CARRIED_WINDOW, kinds=BOTH_KINDS, episodes=0)
        carried = carried_lines(recent.records)  # mechanism 92
        routed = self.model.model_for("selection")  # mechanism 54
        system = self.prompts.render(
            "selection.system", routed, imp=self.imp, keep=self.params.dispositions_max
        )
        user = self.prompts.render(
            "selection.user", routed, rules=_numbered(self.prompts, routed, rules),
            carried=_carried_text(self.prompts, routed, carried), situation=situation(self.prompts, routed, turn),
        )  # fmt: skip
        answer = await self.model.chat_json(
            "selection", system, user, temperature=TEMPERATURE_SELECTION, schema=SELECTION_SCHEMA
        )
        matched = answer.get("matched") if answer is not None else None
        if not isinstance(matched, list):
            return []
        chosen: list[int] = []
        for value in matched:
            index = _index(value, len(rules))
            if index is not None and index not in chosen:
                chosen.append(index)
        return [rules[i].rule for i in chosen[: self.params.dispositions_max]]
