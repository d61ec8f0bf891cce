"""The focus: what the imp attends to in one conversation (mechanisms 22, 31, 34, 40-43).

It holds this conversation's moments as they happened, each under the feeling the appraisal gave it
(41), and the memories evoked in it, retold (31, 34, 40). A moment that joined a stored record is its
own entry sharing that record's id (subtle point 10), so ``ids()`` is a set: the exclusion list for
recall and searches (22). At most ``cap`` entries are kept; the oldest go first (43).

Issue 33: what is *in view* is this conversation's moments and the ``EVOKED_IN_VIEW`` memories evoked most
recently (``in_view``): the reply's block shows those, and only those are left out of recall (22). A memory
evoked longer ago stays in the focus (the summary, the cap) but may come to mind again, and is then evoked anew,
the newest — the seed kept every evoked memory in view for the rest of the conversation, so the block grew
with every turn that recalled something.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from box.protocol.memory import RecordView

FOCUS_CAP = 100  # mechanism 43
MOMENT_TEXT_CHARS = 4_000  # a moment's as-it-happened text, as the focus keeps it (the store keeps more)
EVOKED_EPISODES = 3  # recall loads 3 episodes per candidate (seed 002)
EPISODE_TEXT_CHARS = 1_000
CONCLUSION_CHARS = 1_000
EVOKED_IN_VIEW = 6  # issue 33: the memories evoked most recently that stay in view


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class FocusEpisode(BaseModel):
    """One retold event under an evoked record (mechanism 40: dated sub-lines)."""

    at: datetime
    text: str  # told when there is one (61), else as it happened
    message_id: str | None = None


class FocusEntry(BaseModel):
    kind: Literal["moment", "evoked"]
    record_id: str | None  # None: a moment that was not kept (no feeling could be formed)
    author: str
    author_id: str | None = None
    origin: Literal["lived", "given", "kept"] = "lived"
    feeling: str = ""
    conclusion: str = ""
    valence: float = 0.0
    intensity: float = 0.0
    at: datetime  # when it happened
    text: str = ""  # a moment: "X said: … / <imp> replied: …" (62)
    message_id: str | None = None  # a moment: the message it answers
    episodes: list[FocusEpisode] = Field(default_factory=list)  # evoked: retold, newest first
    arrival: bool = False  # a moment: the person's arrival feeling (mechanisms 101-102; never stored)


def moment_entry(
    *,
    record_id: str | None,
    author: str,
    author_id: str | None,
    feeling: str,
    conclusion: str,
    valence: float,
    intensity: float,
    at: datetime,
    text: str,
    message_id: str | None,
) -> FocusEntry:
    """Mechanism 41: an exchange of this conversation under its own appraisal feeling."""
    return FocusEntry(
        kind="moment", record_id=record_id, author=author, author_id=author_id,
        feeling=cut(feeling, 300), conclusion=cut(conclusion, CONCLUSION_CHARS), valence=valence,
        intensity=intensity, at=at, text=cut(text, MOMENT_TEXT_CHARS), message_id=message_id,
    )  # fmt: skip


def evoked_entry(record: RecordView) -> FocusEntry:
    """Mechanisms 31, 34, 40: a recalled lived record, retold, with its events as dated sub-lines."""
    episodes = [
        FocusEpisode(
            at=ep.happened_at,
            text=cut(ep.told or ep.as_happened, EPISODE_TEXT_CHARS),
            message_id=ep.message_id,
        )
        for ep in record.episodes[:EVOKED_EPISODES]
    ]
    return FocusEntry(
        kind="evoked", record_id=record.id, author=record.author, author_id=record.author_id,
        origin=record.origin, feeling=cut(record.feeling, 300),
        conclusion=cut(record.conclusion, CONCLUSION_CHARS), valence=record.valence,
        intensity=record.intensity, at=record.happened_at, episodes=episodes,
    )  # fmt: skip


class Focus:
    def __init__(self, entries: Iterable[FocusEntry] = (), cap: int = FOCUS_CAP) -> None:
        self.cap = cap
        self.entries: list[FocusEntry] = []
        for entry in entries:
            self.add(entry)

    def add(self, entry: FocusEntry) -> None:
        self.entries.append(entry)
        if len(self.entries) > self.cap:  # mechanism 43: the oldest are dropped
            del self.entries[: len(self.entries) - self.cap]

    def evoke(self, record: RecordView) -> bool:
        """Mechanism 31: a recalled lived record stays in view; a record in view is not added twice. One evoked
        earlier that has left the view (issue 33) is evoked anew: it moves to the newest."""
        if record.kind != "lived" or record.id in self.in_view():
            return False
        self.entries = [e for e in self.entries if not (e.kind == "evoked" and e.record_id == record.id)]
        self.add(evoked_entry(record))
        return True

    def ids(self) -> set[str]:
        """Subtle point 10: the record ids the focus holds (its moments' and every evoked memory's)."""
        return {entry.record_id for entry in self.entries if entry.record_id is not None}

    def evoked_in_view(self) -> list[FocusEntry]:
        """The ``EVOKED_IN_VIEW`` memories evoked most recently, oldest first (issue 33)."""
        return [entry for entry in self.entries if entry.kind == "evoked"][-EVOKED_IN_VIEW:]

    def in_view(self) -> set[str]:
        """The record ids in view, the exclusion list of recall and searches (22): this conversation's moments'
        and the memories evoked most recently (issue 33; the seed: every id the focus holds, subtle point 10)."""
        moments = {e.record_id for e in self.entries if e.kind == "moment" and e.record_id is not None}
        return moments | {e.record_id for e in self.evoked_in_view() if e.record_id is not None}

    def message_ids(self) -> set[str]:
        """The messages of this conversation (their events are not retold as "from before", 39)."""
        return {entry.message_id for entry in self.entries if entry.message_id}

    def moments(self) -> list[FocusEntry]:
        return [entry for entry in self.entries if entry.kind == "moment"]

    def by_person(self, person: str, person_id: str | None) -> list[FocusEntry]:
        """Entries authored by the person: their moments and the evoked records they authored (44)."""
        return [
            entry for entry in self.entries if authored_by(entry.author, entry.author_id, person, person_id)
        ]


def authored_by(author: str, author_id: str | None, person: str, person_id: str | None) -> bool:
    """The author check compares exact strings (subtle point 4); an id decides when both sides have one."""
    if author_id is not None and person_id is not None:
        return author_id == person_id
    return author == person
