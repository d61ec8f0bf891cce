"""What one introspection step reads (mechanisms 72, 73, 79, 80, 83, 89; subtle points 11, 20).

Pure functions of plain values over the ``introspection.*`` prompt blocks. The step sees, in order: where
the imp is and the clock; the constructs held in the slot, first and indexed (89), each as its statement
(83) with the age since it was last brought to mind; then at most 8 recent lived records, newest first,
indexed after the slot (72): the tail of the conversation's focus, filled from the most recently felt
records, constructs dropped after taking 8 (subtle point 11). Strength is the raw stored intensity, never
the felt strength (subtle point 20); events are retold (61). Dispositions, the conversation summary and
the felt strength are withheld (72). A gap of more than 6 h since the first item was last felt is said
in words (73). A continuing chain adds what the previous step thought (51: cut to 300 chars), what a
search brought back (80) and the direction of this step (79: after keep_thinking only that sentence).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from box.memory.contexts import Scene, construct_statement, place
from box.memory.focus import Focus, FocusEntry, cut
from box.memory.prompts import Prompts
from box.memory.words import (
    INTENSITY_SCALE,
    age_words,
    clock_line,
    strength_words,
    valence_words,
)
from box.protocol.memory import RecordView, SlotEntry

ENTRIES = 8  # mechanism 72: introspectionEntries
GAP_NOTE_AFTER = timedelta(hours=6)  # mechanism 73
CONTINUATION_CHARS = 300  # mechanism 51: the continuation text is cut to 300 chars
QUERY_CHARS = 80  # mechanism 80 (as 5): the search query shown up to 80 chars
EVENT_CHARS = 400
FEELING_CHARS = 200
CONCLUSION_CHARS = 600
STATEMENT_CHARS = 400
ANGLE_CHARS = 300

DirectionKind = Literal["angle", "keep_thinking", "search"]


@dataclass(frozen=True)
class Event:
    """One retold event under an entry (mechanism 61)."""

    at: datetime
    text: str


@dataclass(frozen=True)
class Entry:
    """A recent lived record as introspection shows it (mechanism 72): raw intensity, retold events."""

    record_id: str
    origin: str  # lived | given
    feeling: str
    conclusion: str
    valence: float
    intensity: float  # stored, not felt (subtle point 20)
    happened_at: datetime
    last_felt: datetime
    events: tuple[Event, ...] = ()


@dataclass(frozen=True)
class Shown:
    """One indexed item of the context: what ``reinforces`` = its 1-based position names (subtle point 11)."""

    record_id: str
    valence: float
    construct: bool


@dataclass(frozen=True)
class Previous:
    """What the step before said (mechanisms 51, 75): its thought and its conclusion."""

    thought: str
    conclusion: str = ""


@dataclass(frozen=True)
class Direction:
    """Where this step starts from: the mid-turn angle (50), keep thinking (79) or a search's query (80)."""

    kind: DirectionKind
    text: str = ""


@dataclass(frozen=True)
class IntrospectionView:
    """Everything one introspection step shows."""

    now: datetime
    timezone: str
    slot: Sequence[SlotEntry] = ()
    entries: Sequence[Entry] = ()
    scene: Scene | None = None
    previous: Previous | None = None
    direction: Direction | None = None
    recalled: Sequence[RecordView] | None = None  # None: no search before this step


# ------------------------------------------------------------------ mechanism 72: the entries


def entry_of_focus(entry: FocusEntry) -> Entry:
    """A focus entry under its own feeling (41): a moment's event is its text, an evoked one's retold."""
    if entry.kind == "moment":
        events: tuple[Event, ...] = (Event(entry.at, entry.text),) if entry.text else ()
    else:
        events = tuple(Event(ep.at, ep.text) for ep in entry.episodes)
    return Entry(
        record_id=entry.record_id or "-", origin=entry.origin, feeling=entry.feeling,
        conclusion=entry.conclusion, valence=entry.valence, intensity=entry.intensity,
        happened_at=entry.at, last_felt=entry.at, events=events,
    )  # fmt: skip


def entry_of_record(record: RecordView) -> Entry:
    events = tuple(Event(ep.happened_at, ep.told or ep.as_happened) for ep in record.episodes)  # 61
    return Entry(
        record_id=record.id, origin=record.origin, feeling=record.feeling, conclusion=record.conclusion,
        valence=record.valence, intensity=record.intensity, happened_at=record.happened_at,
        last_felt=record.last_felt, events=events,
    )  # fmt: skip


def recent_entries(focus: Focus | None, recent: Sequence[RecordView], limit: int = ENTRIES) -> list[Entry]:
    """Mechanism 72 (subtle point 11): the focus tail (kept records, newest first, one per record) filled
    from ``recent`` — the ``limit`` most recently felt records, constructs included when taken and then
    dropped, so fewer than ``limit`` may show."""
    chosen: list[Entry] = []
    seen: set[str] = set()
    for entry in reversed(focus.entries if focus is not None else []):
        if len(chosen) >= limit:
            break
        if entry.record_id is None or entry.record_id in seen:
            continue
        seen.add(entry.record_id)
        chosen.append(entry_of_focus(entry))
    for record in recent[:limit]:
        if len(chosen) >= limit:
            break
        if record.kind != "lived" or record.id in seen:  # subtle point 11: constructs dropped after taking 8
            continue
        seen.add(record.id)
        chosen.append(entry_of_record(record))
    return chosen


def shown(slot: Sequence[SlotEntry], entries: Sequence[Entry]) -> list[Shown]:
    """Mechanism 89: the slot first, then the entries; ``reinforces`` = i names the i-th (1-based)."""
    return [Shown(s.record.id, s.record.valence, True) for s in slot] + [
        Shown(e.record_id, e.valence, False) for e in entries
    ]


# ------------------------------------------------------------------ mechanism 73: the gap note


def duration_words(elapsed: timedelta) -> str:
    """A stretch of time in words: hours under two days, then days, weeks, months (30 days) and years."""
    hours = int(elapsed.total_seconds() // 3600)
    days = hours // 24

    def plural(n: int, unit: str) -> str:
        return f"{n} {unit}" if n == 1 else f"{n} {unit}s"

    if hours < 48:
        return plural(max(hours, 1), "hour")
    if days < 14:
        return plural(days, "day")
    if days < 60:
        return plural(days // 7, "week")
    if days < 365:
        return plural(days // 30, "month")
    return plural(days // 365, "year")


def first_felt(slot: Sequence[SlotEntry], entries: Sequence[Entry]) -> datetime | None:
    """Subtle point 11: the first shown item is the first slot construct when the slot holds any."""
    if slot:
        return slot[0].record.last_felt
    if entries:
        return entries[0].last_felt
    return None


def gap(slot: Sequence[SlotEntry], entries: Sequence[Entry], now: datetime) -> timedelta | None:
    """Mechanism 73: how long nothing has happened, when the first item was last felt more than 6 h ago."""
    felt = first_felt(slot, entries)
    if felt is None:
        return None
    elapsed = now - felt
    return elapsed if elapsed > GAP_NOTE_AFTER else None


# ------------------------------------------------------------------ rendering


def system(prompts: Prompts, model: str | None, imp: str) -> str:
    """Mechanisms 56, 71: the call's rules, the act list and the language of the state."""
    return prompts.render("introspection.system", model, imp=imp, intensity_scale=INTENSITY_SCALE)


def _indent(text: str) -> str:
    return text.replace("\n", "\n  ")


def _events(prompts: Prompts, model: str | None, events: Sequence[Event], now: datetime, tz: str) -> str:
    return "".join(
        "\n"
        + prompts.render(
            "introspection.event",
            model,
            age=age_words(ev.at, now, tz),
            text=_indent(cut(ev.text, EVENT_CHARS)),
        )
        for ev in events
    )


def slot_lines(prompts: Prompts, model: str | None, view: IntrospectionView) -> list[str]:
    """Mechanisms 83, 89: each held construct as its statement, indexed first, with its age in the slot."""
    return [
        prompts.render(
            "introspection.held",
            model,
            index=n,
            statement=_indent(cut(construct_statement(held.record), STATEMENT_CHARS)),
            valence=valence_words(held.record.valence),
            strength=strength_words(held.record.intensity),
            age=age_words(held.activated_at, view.now, view.timezone),
        )  # fmt: skip
        for n, held in enumerate(view.slot, start=1)
    ]


def entry_lines(prompts: Prompts, model: str | None, view: IntrospectionView) -> list[str]:
    """Mechanism 72: recent records indexed after the slot, raw intensity in words, retold events."""
    start = len(view.slot) + 1
    lines = []
    for n, entry in enumerate(view.entries, start=start):
        tag = prompts.render("introspection.given", model) + "; " if entry.origin == "given" else ""
        lines.append(
            prompts.render(
                "introspection.entry",
                model,
                index=n,
                valence=valence_words(entry.valence),
                strength=strength_words(entry.intensity),
                feeling=cut(entry.feeling, FEELING_CHARS),
                conclusion=cut(entry.conclusion, CONCLUSION_CHARS),
                tag=tag,
                age=age_words(entry.happened_at, view.now, view.timezone),
                events=_events(prompts, model, entry.events, view.now, view.timezone),
            )  # fmt: skip
        )
    return lines


def recalled_line(prompts: Prompts, model: str | None, record: RecordView, view: IntrospectionView) -> str:
    """Mechanism 80: a search result, unindexed, raw intensity; a construct as its statement (83)."""
    if record.kind == "construct":
        return prompts.render(
            "introspection.recalled_construct", model,
            statement=_indent(cut(construct_statement(record), STATEMENT_CHARS)),
            age=age_words(record.happened_at, view.now, view.timezone),
        )  # fmt: skip
    entry = entry_of_record(record)
    return prompts.render(
        "introspection.recalled_entry", model, valence=valence_words(entry.valence),
        strength=strength_words(entry.intensity), feeling=cut(entry.feeling, FEELING_CHARS),
        conclusion=cut(entry.conclusion, CONCLUSION_CHARS),
        age=age_words(entry.happened_at, view.now, view.timezone),
        events=_events(prompts, model, entry.events, view.now, view.timezone),
    )  # fmt: skip


def direction_text(prompts: Prompts, model: str | None, direction: Direction) -> str:
    """Mechanisms 50, 79, 80: the angle quoted; keep thinking alone; the search's query (≤ 80 chars)."""
    if direction.kind == "keep_thinking":
        return prompts.render("introspection.keep_thinking", model)  # 79: the model's text is dropped
    if direction.kind == "search":
        query = cut(" ".join(direction.text.split()), QUERY_CHARS)
        return prompts.render("introspection.searched", model, query=query)
    return prompts.render(
        "introspection.angle", model, angle=cut(" ".join(direction.text.split()), ANGLE_CHARS)
    )


def user(prompts: Prompts, model: str | None, view: IntrospectionView) -> str:
    """The user text of one introspection step (mechanisms 51, 72, 73, 79, 80, 89)."""
    parts: list[str] = []
    held = slot_lines(prompts, model, view)
    if held:
        parts.append(prompts.render("introspection.slot", model, lines="\n".join(held)))
    lines = entry_lines(prompts, model, view)
    if lines:
        parts.append(prompts.render("introspection.entries", model, lines="\n".join(lines)))
    elif not held:
        parts.append(prompts.render("introspection.empty", model))
    quiet = gap(view.slot, view.entries, view.now)
    if quiet is not None:  # mechanism 73
        parts.append(prompts.render("introspection.gap", model, duration=duration_words(quiet)))
    if view.recalled is not None:  # mechanism 80
        found = [recalled_line(prompts, model, r, view) for r in view.recalled]
        if found:
            parts.append(prompts.render("introspection.recalled", model, lines="\n".join(found)))
        else:
            parts.append(prompts.render("introspection.recalled_none", model))
    if view.previous is not None:  # mechanism 51
        conclusion = (
            "\n"
            + prompts.render(
                "introspection.previous_conclusion",
                model,
                conclusion=_indent(cut(view.previous.conclusion, CONTINUATION_CHARS)),
            )  # fmt: skip
            if view.previous.conclusion.strip()
            else ""
        )
        parts.append(
            prompts.render(
                "introspection.previous",
                model,
                thought=_indent(cut(view.previous.thought, CONTINUATION_CHARS)),
                conclusion=conclusion,
            )  # fmt: skip
        )
    if view.direction is not None:
        parts.append(direction_text(prompts, model, view.direction))
    clock = clock_line(view.now, view.timezone)  # issue 33: where and when last, after what stays the same
    if view.scene is not None:
        parts.append(
            prompts.render("introspection.where", model, place=place(prompts, model, view.scene), clock=clock)
        )
    else:
        parts.append(prompts.render("introspection.when", model, clock=clock))
    parts.append(prompts.render("introspection.ask", model))
    return "\n\n".join(parts)
