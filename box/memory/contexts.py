"""What each memory call reads: the reply's memory block, the appraisal, the filter and the summary contexts.

Pure functions of plain values over the prompt templates (``box/memory/prompts/*.txt``). Every feeling is
in words (mechanism 12: strength and valence by fixed bands) and every time is an age in words on the
movable clock (9, 122): no context ever carries a number for a feeling. The reply context uses felt
strength, the filter raw intensity (subtle point 20); ages count from when a thing happened.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from box.common.laws import mentions
from box.memory.focus import Focus, FocusEntry, authored_by, cut
from box.memory.prompts import Prompts
from box.memory.state import State
from box.memory.words import (
    INTENSITY_SCALE,
    age_words,
    clock_line,
    stamp_words,
    strength_words,
    valence_words,
)
from box.protocol.memory import EpisodeView, PresenceEntry, RecordView, SlotEntry
from box.protocol.models import ChannelKind

SEARCH_QUERY_CHARS = 80  # mechanism 5
PRESENCE_STALE_S = 1800  # mechanism 10
FOCUS_TEXT_CHARS = 600  # one focus line in a context (the focus itself keeps more)
EVENT_TEXT_CHARS = 400
# Issue 33: the reply's block shows at most this many of this conversation's moments that its chat history
# does not carry (the newest; the summary holds the rest), and the appraisal this many of the focus's newest
# entries (with the summary for the rest): neither grows with the conversation.
FOCUS_MOMENTS_SHOWN = 3
APPRAISAL_ENTRIES = 4
CONSTRUCT_VERBS = {  # mechanism 83
    "thought": "I thought",
    "belief": "I believe",
    "decision": "I decided",
    "goal": "I want",
    "dream": "I dream",
}

Hearing = Literal["words", "entered", "left"]


def construct_statement(record: RecordView) -> str:
    """Mechanism 83: "I thought: / I believe: / I decided: / I want: / I dream: <statement>"."""
    verb = CONSTRUCT_VERBS.get(record.construct_kind or "thought", "I thought")
    return f"{verb}: {record.statement or record.conclusion}"


def gist(record: RecordView) -> str:
    """What a record says: a lived record's conclusion; a construct's statement (83) before its conclusion,
    so a filter or a search line that shows a belief shows what is believed (a construct formed with no
    conclusion was shown as nothing at all)."""
    if record.kind != "construct":
        return record.conclusion
    conclusion = record.conclusion.strip()
    return construct_statement(record) + (f" {conclusion}" if conclusion else "")


@dataclass(frozen=True)
class Scene:
    """The present every context describes (mechanisms 1, 2, 9)."""

    imp: str
    person: str
    person_id: str | None
    now: datetime
    timezone: str
    channel_kind: ChannelKind
    channel_name: str = ""
    images: int = 0
    hearing: Hearing = "words"


@dataclass(frozen=True)
class SearchNote:
    """One search of this turn as the senses report it (mechanisms 5, 6)."""

    query: str
    found: int
    own_only: bool = False  # a moment probe found no lived moment but the imp's own constructs (6)
    # What the search found in this conversation's focus: remembered from just now, not "nothing found"
    # (issue 32, finding 6).
    in_view: Sequence[RecordView] = ()


@dataclass(frozen=True)
class ReplyView:
    """Everything the reply's memory block shows (mechanisms 1-13, 37-43)."""

    scene: Scene
    state: State
    focus: Focus
    summary: str | None = None
    evoked_now: Sequence[RecordView] = ()  # associations the budget left out this turn (34)
    constructs: Sequence[RecordView] = ()  # constructs that came to mind (35)
    slot: Sequence[SlotEntry] = ()  # what the imp holds in mind (84-89): shown first under YOUR OWN THOUGHTS
    searches: Sequence[SearchNote] = ()
    recalled: int = 0
    total: int = 0
    presence: Sequence[PresenceEntry] = ()
    learned: Sequence[
        str
    ] = ()  # dispositions the selection seam picked (mechanisms 99-100; issue II fills it)
    in_history: frozenset[str] = frozenset()  # the messages the reply's chat history carries (issue 33)


def _indent(text: str) -> str:
    """A multi-line text as one list item: its later lines indented under the first."""
    return text.replace("\n", "\n  ")


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


# ------------------------------------------------------------------ mechanisms 1, 2, 9: the senses


def senses(prompts: Prompts, model: str | None, scene: Scene) -> str:
    person = scene.person
    hearing = prompts.render(f"hearing.{scene.hearing}", model, person=person)  # mechanism 1
    if scene.images:
        sight = prompts.render("sight.images", model, count=_plural(scene.images, "image", "images"))
    else:
        sight = prompts.render("sight.black", model)  # mechanism 2
    return prompts.render(
        "senses", model, hearing=hearing, sight=sight, place=place(prompts, model, scene),
        clock=clock_line(scene.now, scene.timezone),
    )  # fmt: skip


def place(prompts: Prompts, model: str | None, scene: Scene) -> str:
    """Mechanism 2, adapted to chat: the channel the imp is in, its name and kind."""
    if scene.channel_kind == "guild":
        if scene.channel_name:
            return prompts.render("place.guild", model, channel=scene.channel_name)
        return prompts.render("place.guild_unnamed", model)
    return prompts.render(f"place.{scene.channel_kind}", model, person=scene.person)


# ------------------------------------------------------------------ mechanisms 11, 12: records in words


def tag(prompts: Prompts, model: str | None, record: RecordView, scene: Scene) -> str:
    """Mechanism 11: who a record is with, as seen from the person being answered."""
    if record.origin == "given":
        return prompts.render("tag.given", model)
    by_person = authored_by(record.author, record.author_id, scene.person, scene.person_id)
    if mentions(record.conclusion, [scene.person]):
        if by_person:
            return prompts.render("tag.about", model, person=scene.person)
        return prompts.render("tag.about_told", model, person=scene.person, author=record.author)
    if by_person:
        return prompts.render("tag.same", model)
    return prompts.render("tag.with", model, author=record.author)


def _retold(episode: EpisodeView) -> str:
    return _indent(cut(episode.told or episode.as_happened, EVENT_TEXT_CHARS))


def _events(prompts: Prompts, model: str | None, episodes: Sequence[EpisodeView], scene: Scene) -> str:
    """Mechanism 40: one event inline, several as dated sub-lines; always retold (61)."""
    if not episodes:
        return ""
    if len(episodes) == 1:
        return f" {_retold(episodes[0])}"
    lines = [
        prompts.render(
            "memory.event", model, age=age_words(ep.happened_at, scene.now, scene.timezone), text=_retold(ep)
        )
        for ep in episodes
    ]
    return "\n" + "\n".join(lines)


def memory_line(prompts: Prompts, model: str | None, record: RecordView, scene: Scene) -> str:
    """A recalled record, retold, its feeling in words at the strength felt now (mechanisms 12, 40)."""
    return prompts.render(
        "memory.entry", model, valence=valence_words(record.valence), strength=strength_words(record.felt),
        feeling=cut(record.feeling, 200), conclusion=cut(gist(record), 600), tag=tag(prompts, model, record, scene),
        age=age_words(record.happened_at, scene.now, scene.timezone),
        events=_events(prompts, model, record.episodes, scene),
    )  # fmt: skip


def _evoked_line(prompts: Prompts, model: str | None, entry: FocusEntry, scene: Scene) -> str:
    """An evoked focus entry, retold (mechanism 40)."""
    episodes = [
        EpisodeView(
            id=f"f{n}",
            record_id=entry.record_id or "-",
            author=entry.author,
            as_happened=ep.text,
            happened_at=ep.at,
            message_id=ep.message_id,
        )  # fmt: skip
        for n, ep in enumerate(entry.episodes)
    ]
    record = RecordView(
        id=entry.record_id or "-", author=entry.author, author_id=entry.author_id, origin=entry.origin,
        feeling=entry.feeling, conclusion=entry.conclusion, valence=entry.valence, intensity=entry.intensity,
        felt=entry.intensity, happened_at=entry.at, last_felt=entry.at, episodes=episodes,
    )  # fmt: skip
    return memory_line(prompts, model, record, scene)


# ------------------------------------------------------------------ the reply's memory block


def held_words(total: int) -> str:
    """Mechanism 3's total, as a person senses the size of their memory: a magnitude in words, never the
    store's count of records (issue 32, finding 10: "your memory holds 151 records" reached people)."""
    if total <= 0:
        return "no memory kept yet"
    if total == 1:
        return "one memory in all"
    if total < 10:
        return "a handful of memories in all"
    if total < 100:
        return "dozens of memories in all"
    if total < 1_000:
        return "hundreds of memories in all"
    return "thousands of memories in all"


def attention(prompts: Prompts, model: str | None, view: ReplyView) -> str:
    """Mechanisms 3-6: the counts, "reach for the rest", and each search with its spoken null."""
    count = len(view.state.feelings())
    state = (
        prompts.render("attention.state", model, count=_plural(count, "feeling", "feelings"))
        if count
        else prompts.render("attention.state_empty", model)
    )
    recalled = (
        prompts.render("attention.recalled", model, count=_plural(view.recalled, "memory", "memories"))
        if view.recalled
        else prompts.render("attention.recalled_none", model)
    )
    text = prompts.render("attention", model, state=state, recalled=recalled, total=held_words(view.total))
    if view.searches:
        lines = [search_line(prompts, model, note) for note in view.searches]
        text += "\n" + prompts.render("searches", model, lines="\n".join(lines))
    return text


IN_VIEW_SHOWN = 3  # what a search found in this conversation: at most 3 named in its line
IN_VIEW_CHARS = 300


def in_view_line(prompts: Prompts, model: str | None, record: RecordView) -> str:
    """A record a search found in this conversation's focus: its conclusion and the event that matched
    (its first episode, as it happened: the host's search lists a record's episodes that match the words
    first, the hit before them; it is this conversation's, 40), so the imp reads what it remembers from just
    now (issue 32, finding 6)."""
    conclusion = cut(record.conclusion.replace("\n", " "), IN_VIEW_CHARS)
    hit = record.episodes[0] if record.episodes else None
    if hit is None:
        return prompts.render("search.in_view.entry", model, conclusion=conclusion)
    event = cut(hit.as_happened.replace("\n", " / "), IN_VIEW_CHARS)
    return prompts.render("search.in_view.event", model, conclusion=conclusion, event=event)


def search_line(prompts: Prompts, model: str | None, note: SearchNote) -> str:
    """Mechanisms 5-6. What the search found in view is said to be remembered from just now: a search never
    reports "no memory" of what this conversation holds (issue 32, finding 6); its null is about what came
    before this conversation."""
    query = cut(note.query.replace("\n", " "), SEARCH_QUERY_CHARS)  # mechanism 5
    in_view = "; ".join(in_view_line(prompts, model, r) for r in note.in_view[:IN_VIEW_SHOWN])
    if note.own_only:
        return prompts.render("search.own_only", model, query=query)  # mechanism 6
    if note.found:
        also = " " + prompts.render("search.also", model, in_view=in_view) if in_view else ""
        count = _plural(note.found, "memory", "memories")
        return prompts.render("search.found", model, query=query, count=count, also=also)
    if in_view:
        return prompts.render("search.in_view", model, query=query, in_view=in_view)
    return prompts.render("search.none", model, query=query)


def presence(
    prompts: Prompts, model: str | None, entries: Sequence[PresenceEntry], now: datetime, tz: str
) -> str:
    """Mechanism 10: the other live conversations (≤ 1800 s since their last input), or a spoken none."""
    live = [e for e in entries if now - e.last_input_at <= timedelta(seconds=PRESENCE_STALE_S)]
    if not live:
        return prompts.render("presence.none", model)
    lines = [
        prompts.render(
            "presence.entry",
            model,
            person=e.person,
            where=f" in {e.channel}" if e.channel else "",
            joined=age_words(e.joined_at, now, tz),
            last=age_words(e.last_input_at, now, tz),
            turns=_plural(e.turns, "turn", "turns"),
        )  # fmt: skip
        for e in live
    ]
    return prompts.render("presence", model, lines="\n".join(lines))


def state_block(prompts: Prompts, model: str | None, view: ReplyView) -> str:
    """Mechanisms 12, 37, 38: each recurring feeling once, indexed, in words."""
    scene = view.scene
    feelings = view.state.feelings()
    if not feelings:
        return prompts.render("state.empty", model)
    lines = []
    for feeling in feelings:
        record = feeling.record
        recurred = (
            prompts.render("state.recurred", model, count=feeling.recurred) if feeling.recurred > 1 else ""
        )
        lines.append(
            prompts.render(
                "state.entry",
                model,
                index=feeling.index,
                valence=valence_words(record.valence),
                strength=strength_words(record.felt),
                feeling=cut(record.feeling, 200),
                conclusion=cut(record.conclusion, 600),
                tag=tag(prompts, model, record, scene),
                age=age_words(record.happened_at, scene.now, scene.timezone),
                recurred=recurred,
            )  # fmt: skip
        )
    return prompts.render("state", model, lines="\n".join(lines))


def thoughts_block(prompts: Prompts, model: str | None, view: ReplyView) -> str | None:
    """Mechanism 89: every construct the slot holds, with its age, then the constructs that came to mind (35)."""
    held = [entry.record for entry in view.slot]
    shown = {r.id for r in held}
    constructs = held + [c for c in view.constructs if c.id not in shown]
    if not constructs:
        return None
    lines = [
        prompts.render(
            "thought.entry",
            model,
            statement=cut(construct_statement(c), 400),
            age=age_words(c.happened_at, view.scene.now, view.scene.timezone),
        )  # fmt: skip
        for c in constructs
    ]
    return prompts.render("thoughts", model, lines="\n".join(lines))


def before_lines(prompts: Prompts, model: str | None, view: ReplyView) -> list[str]:
    """Mechanism 39: the events under the State's feelings, once each, retold; this conversation's skipped."""
    scene, here = view.scene, view.focus.message_ids()
    seen: set[str] = set()
    lines: list[str] = []
    for record in view.state.entries:
        for ep in record.episodes:
            if ep.id in seen or (ep.message_id and ep.message_id in here):
                continue
            seen.add(ep.id)
            lines.append(f"- {age_words(ep.happened_at, scene.now, scene.timezone)}: {_retold(ep)}")
    return lines


def focus_block(prompts: Prompts, model: str | None, view: ReplyView) -> str:
    """Mechanisms 39-43: from before, the summary, this conversation as it happened, and what was evoked."""
    scene = view.scene
    in_state = view.state.ids()
    parts: list[str] = []
    before = before_lines(prompts, model, view)
    if before:
        parts.append(prompts.render("focus.before", model, lines="\n".join(before)))
    if view.summary:
        parts.append(prompts.render("focus.summary", model, summary=view.summary))
    now_lines: list[str] = []
    moments = view.focus.moments()
    unshown = [e for e in moments if e.message_id and e.message_id in view.in_history]  # issue 33
    beyond = [e for e in moments if not (e.message_id and e.message_id in view.in_history)]
    older = beyond[:-FOCUS_MOMENTS_SHOWN]
    for entry in beyond[-FOCUS_MOMENTS_SHOWN:]:
        age = age_words(entry.at, scene.now, scene.timezone)
        text = _indent(cut(entry.text, FOCUS_TEXT_CHARS))
        if entry.record_id is None and not entry.feeling:
            now_lines.append(prompts.render("focus.moment_unfelt", model, age=age, text=text))
        else:  # mechanism 41: each moment under its own feeling
            now_lines.append(
                prompts.render(
                    "focus.moment",
                    model,
                    age=age,
                    text=text,
                    valence=valence_words(entry.valence),
                    strength=strength_words(entry.intensity),
                    feeling=cut(entry.feeling, 200),
                )  # fmt: skip
            )
    if unshown:
        now_lines.append(
            prompts.render("focus.in_chat", model, count=_plural(len(unshown), "exchange", "exchanges"))
        )
    if older:
        now_lines.append(prompts.render("focus.older", model, count=_plural(len(older), "moment", "moments")))
    if now_lines:
        parts.append(prompts.render("focus.now", model, lines="\n".join(now_lines)))
    evoked = [
        _evoked_line(prompts, model, e, scene)
        for e in view.focus.evoked_in_view()  # issue 33: the memories evoked most recently
        if e.record_id not in in_state  # mechanism 42
    ]
    evoked += [memory_line(prompts, model, r, scene) for r in view.evoked_now if r.id not in in_state]  # 34
    if evoked:
        parts.append(prompts.render("focus.evoked", model, lines="\n".join(evoked)))
    if not parts:
        parts.append(prompts.render("focus.empty", model))
    return prompts.render("focus", model, parts="\n\n".join(parts))


def reply_block(prompts: Prompts, model: str | None, view: ReplyView) -> str:
    """The ``### Memory`` block of the reply's ``## Context`` (mechanisms 1-13, 37-43)."""
    parts = [
        senses(prompts, model, view.scene),
        attention(prompts, model, view),
        presence(prompts, model, view.presence, view.scene.now, view.scene.timezone),
        state_block(prompts, model, view),
    ]
    if view.learned:  # mechanism 100: shown to the reply only, never to the appraisal
        lines = "\n".join(
            prompts.render("learned.entry", model, rule=cut(rule, 300)) for rule in view.learned
        )
        parts.append(prompts.render("learned", model, lines=lines))
    thoughts = thoughts_block(prompts, model, view)
    if thoughts:
        parts.append(thoughts)
    parts.append(focus_block(prompts, model, view))
    return "\n\n".join(parts)


def reply_rules(prompts: Prompts, model: str | None) -> str:
    """The memory rules of the reply's system text (mechanisms 7, 8, 13, 56)."""
    return prompts.render("reply.rules", model, intensity_scale=INTENSITY_SCALE)


# ------------------------------------------------------------------ the filter (20, 21)


def filter_system(prompts: Prompts, model: str | None, imp: str) -> str:
    """The same on every call for one imp (issue 33: the room is said in the user text)."""
    return prompts.render("filter.system", model, imp=imp)


def filter_user(
    prompts: Prompts,
    model: str | None,
    words: str,
    candidates: Sequence[RecordView],
    now: datetime,
    tz: str,
    room: int,
) -> str:
    """The candidates numbered from 1, their strength as raw intensity (subtle point 20), retold."""
    lines = []
    for n, record in enumerate(candidates, start=1):
        events = "".join(
            "\n"
            + prompts.render("filter.event", model, age=age_words(ep.happened_at, now, tz), text=_retold(ep))
            for ep in record.episodes
        )
        lines.append(
            prompts.render(
                "filter.candidate",
                model,
                index=n,
                valence=valence_words(record.valence),
                strength=strength_words(record.intensity),
                feeling=cut(record.feeling, 200),
                conclusion=cut(gist(record), 600),
                age=age_words(record.happened_at, now, tz),
                events=events,
            )  # fmt: skip
        )
    return prompts.render(
        "filter.user", model, words=cut(words, 4_000), candidates="\n".join(lines), room=room
    )


# ------------------------------------------------------------------ the appraisal (57, 58)


def appraisal_system(prompts: Prompts, model: str | None, imp: str) -> str:
    return prompts.render("appraisal.system", model, imp=imp, intensity_scale=INTENSITY_SCALE)


def appraisal_user(
    prompts: Prompts,
    model: str | None,
    scene: Scene,
    focus: Focus,
    remembered: Sequence[RecordView],
    exchange: str,
    summary: str | None = None,
) -> str:
    """Mechanism 57: no state, no thoughts, no rules; the focus as events only. 58: what was recalled.

    Issue 33: only the focus's newest ``APPRAISAL_ENTRIES`` entries, after the conversation's summary (first
    person, no emotions: 45) when older ones are left out — the seed re-sent the whole focus every turn. What
    is sensed now, with the clock, comes last (the static system text and the slower-changing parts first)."""
    events: list[str] = []
    older = len(focus.entries) - APPRAISAL_ENTRIES
    for entry in focus.entries[-APPRAISAL_ENTRIES:]:
        age = age_words(entry.at, scene.now, scene.timezone)
        if entry.kind == "moment":
            events.append(f"- {age}: {_indent(cut(entry.text, FOCUS_TEXT_CHARS))}")
        else:
            events += [
                f"- {age_words(ep.at, scene.now, scene.timezone)}: {cut(ep.text, EVENT_TEXT_CHARS)}"
                for ep in entry.episodes
            ]
    lines = [
        prompts.render(
            "appraisal.remembered",
            model,
            conclusion=cut(r.conclusion, 600),
            age=age_words(r.happened_at, scene.now, scene.timezone),
            events=_events(prompts, model, r.episodes, scene),
        )  # fmt: skip
        for r in remembered
    ]
    before = ""
    if older > 0:
        before = prompts.render(
            "appraisal.before", model, count=_plural(older, "moment", "moments"),
            summary=summary or prompts.render("appraisal.no_summary", model),
        )  # fmt: skip
    return prompts.render(
        "appraisal.user", model, senses=senses(prompts, model, scene), person=scene.person, before=before,
        focus="\n".join(events) or prompts.render("appraisal.nothing_earlier", model),
        remembered="\n".join(lines) or prompts.render("appraisal.nothing_remembered", model),
        exchange=exchange,
    )  # fmt: skip


# ------------------------------------------------------------------ the summary (45)


def summary_system(prompts: Prompts, model: str | None, imp: str, person: str) -> str:
    return prompts.render("summary.system", model, imp=imp, person=person)


def summary_user(
    prompts: Prompts,
    model: str | None,
    person: str,
    previous: str | None,
    entries: Sequence[FocusEntry],
    now: datetime,
    tz: str,
) -> str:
    """Mechanism 45: only this person's entries, moments as they happened, evoked ones retold; no feelings.

    Issue 33: the events first, each at its date and time (``stamp_words``, which do not change from one call to
    the next), then the summary so far, then the clock: the start of one refresh's prompt is the start of the
    next one's, for the prompt cache. The seed gave each event its age in words (mechanism 9)."""
    lines: list[str] = []
    for entry in entries:
        if entry.kind == "moment":
            lines.append(f"- {stamp_words(entry.at, tz)}: {_indent(cut(entry.text, FOCUS_TEXT_CHARS))}")
        else:
            retold = " ".join(cut(ep.text, EVENT_TEXT_CHARS) for ep in entry.episodes) or cut(
                entry.conclusion, 600
            )
            lines.append(f"- {stamp_words(entry.at, tz)} (remembered): {retold}")
    return prompts.render(
        "summary.user", model, person=person, previous=previous or prompts.render("summary.none_yet", model),
        events="\n".join(lines), clock=clock_line(now, tz),
    )  # fmt: skip
