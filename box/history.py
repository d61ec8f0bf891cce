"""The box's own conversation history, kept under its state dir (SPEC-001 ENV-05, ENV-07, ENV-11).

One file for the imp (``history.json``), shared by the imp's boxes in every channel: each
record carries its channel. Writes are read-modify-write under an exclusive ``flock`` (the
imp's boxes for other channels write the same file) and land atomically (temp file + rename).

How it combines with the host's ``recent`` (see ``combine``): the host's ``recent`` is
authoritative for what was said in the channel — everyone's messages, and the imp's own
posts as they were delivered. The box's records carry what the host does not: its own
exchanges as it committed them after delivery (PostSend), short-path archives and channel
events (a reaction clear). For the prompt the two are merged by message id (the host's
copy wins), ordered by time, only for the current channel (nothing from another channel
or a DM leaks into a prompt), and cut to ``history_limit`` (ENV-07).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from box.protocol.models import HistoryEntry

log = logging.getLogger("box.history")

HISTORY_FILE = "history.json"
LOCK_FILE = "history.lock"
MAX_RECORD_CHARS = 4_000  # a record is context, not an archive of everything
FORMAT_VERSION = 1

Role = Literal["user", "assistant", "event"]


@dataclass(frozen=True)
class Record:
    """One entry of the box's history: a message someone wrote, the imp's delivered reply, or an event."""

    channel_id: str
    id: str  # the Discord message id (for a reply: its first delivered id)
    role: Role
    author: str  # display name
    content: str
    at: datetime

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "at": self.at.isoformat()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        return cls(
            channel_id=str(data["channel_id"]),
            id=str(data["id"]),
            role=data["role"] if data["role"] in ("user", "assistant", "event") else "event",
            author=str(data["author"]),
            content=str(data["content"]),
            at=datetime.fromisoformat(data["at"]),
        )


# ------------------------------------------------------------------ rules (pure)


def shrink_by_one(records: Sequence[Record], per_channel: int) -> list[Record]:
    """ENV-11: drop the oldest record of a channel holding more than ``per_channel``; else the oldest overall."""
    if not records:
        return []
    counts = Counter(record.channel_id for record in records)
    for index, record in enumerate(records):
        if counts[record.channel_id] > per_channel:
            return [*records[:index], *records[index + 1 :]]
    return list(records[1:])


def trim(records: Sequence[Record], limit: int, per_channel: int) -> list[Record]:
    """ENV-07: shrink (ENV-11's way) until at most ``limit`` records are left."""
    kept = list(records)
    while len(kept) > limit:
        kept = shrink_by_one(kept, per_channel)
    return kept


@dataclass(frozen=True)
class PromptEntry:
    """One line of conversation for the prompt, from either source."""

    id: str
    role: Role
    author: str
    content: str
    at: datetime


def combine(
    recent: Sequence[HistoryEntry], own: Sequence[Record], channel_id: str, current_id: str, limit: int
) -> list[PromptEntry]:
    """The conversation before the current message: host ``recent`` ∪ own records of this channel (ENV-07)."""
    entries: dict[str, PromptEntry] = {}
    for record in own:
        if record.channel_id == channel_id and record.id != current_id:
            entries[record.id] = PromptEntry(record.id, record.role, record.author, record.content, record.at)
    for entry in recent:  # the host's copy wins: it is what the channel actually shows
        if entry.id != current_id:
            role: Role = "assistant" if entry.from_imp else "user"
            entries[entry.id] = PromptEntry(
                entry.id, role, entry.author.name, entry.content, entry.created_at
            )
    ordered = sorted(entries.values(), key=lambda item: item.at)
    return ordered[-limit:] if limit > 0 else []


# ------------------------------------------------------------------ the store (file I/O: call it off the loop)


class HistoryStore:
    """The history file and the turn counters next to it. Blocking I/O: run it in a worker thread."""

    def __init__(self, state_dir: Path, *, limit: int, per_channel: int) -> None:
        self.state_dir = state_dir
        self.limit = limit
        self.per_channel = per_channel
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        return self.state_dir / HISTORY_FILE

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            with (self.state_dir / LOCK_FILE).open("a") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)  # the imp's boxes in other channels share this file
                try:
                    yield
                finally:
                    fcntl.flock(handle, fcntl.LOCK_UN)

    def _read(self) -> tuple[list[Record], dict[str, dict[str, int]]]:
        try:
            return self._read_strictly()
        except FileNotFoundError:
            return [], {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("history file %s is unreadable (%s); starting a fresh one", self.path, exc)
            return [], {}

    def _read_strictly(self) -> tuple[list[Record], dict[str, dict[str, int]]]:
        data = json.loads(self.path.read_text(encoding="utf-8"))
        records = [Record.from_json(item) for item in data.get("records", [])]
        counters = {
            str(k): {str(o): int(n) for o, n in v.items()} for k, v in data.get("counters", {}).items()
        }
        return records, counters

    def _write(
        self,
        records: Sequence[Record],
        counters: dict[str, dict[str, int]],
        *,
        owner: os.stat_result | None = None,
    ) -> None:
        text = json.dumps(
            {"version": FORMAT_VERSION, "records": [r.to_json() for r in records], "counters": counters},
            ensure_ascii=False,
        )
        fd, tmp = tempfile.mkstemp(prefix=".history.", dir=self.state_dir)
        try:
            if owner is not None and (owner.st_uid, owner.st_gid) != (os.getuid(), os.getgid()):
                os.fchown(fd, owner.st_uid, owner.st_gid)  # written by a root host, still the box's file
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def load(self) -> list[Record]:
        """Every record, trimmed to the limit before the model call (ENV-07)."""
        with self._locked():
            records, counters = self._read()
            trimmed = trim(records, self.limit, self.per_channel)
            if len(trimmed) != len(records):
                self._write(trimmed, counters)
            return trimmed

    def counters(self) -> dict[str, dict[str, int]]:
        with self._locked():
            return self._read()[1]

    def commit(self, records: Sequence[Record], *, count: tuple[str, str] | None = None) -> list[Record]:
        """Append ``records``, trim after appending (ENV-07), bump the (channel, outcome) counter; persist."""
        with self._locked():
            existing, counters = self._read()
            known = {(r.channel_id, r.id, r.role) for r in existing}
            fresh = [
                Record(r.channel_id, r.id, r.role, r.author, r.content[:MAX_RECORD_CHARS], r.at)
                for r in records
                if (r.channel_id, r.id, r.role) not in known
            ]
            kept = trim([*existing, *fresh], self.limit, self.per_channel)
            if count is not None:
                channel, outcome = count
                per = counters.setdefault(channel, {})
                per[outcome] = per.get(outcome, 0) + 1
            self._write(kept, counters)
            return kept

    def forget_channel(self, channel_id: str) -> int:
        """Drop every record of one channel; returns how many went. The host calls it when the channel's
        history is cleared (``impyard history clear``, the chat's ``/clear``), so the next prompt starts
        without it. A file that cannot be read is left alone (the error is raised), never rewritten empty."""
        if not self.path.exists():
            return 0
        with self._locked():
            owner = os.stat(self.path)
            records, counters = self._read_strictly()
            kept = [record for record in records if record.channel_id != channel_id]
            if len(kept) != len(records):
                self._write(kept, counters, owner=owner)
            return len(records) - len(kept)


def forget_channel(state_dir: Path, channel_id: str) -> int:
    """The host's side of clearing a channel: drop its records from the imp's history file in ``state_dir``."""
    return HistoryStore(state_dir, limit=0, per_channel=0).forget_channel(channel_id)  # nothing is trimmed
