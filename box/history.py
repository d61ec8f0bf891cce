"""The responder's own conversation history (SPEC-001 ENV-05, ENV-07, ENV-11, ENV-13): its rules, and the
box's side of the host that keeps it (issue 22).

The lines are kept by the host, per imp and channel, in its database (``impyard.conversation.responder_history``); no
file under ``/state`` holds them and no two boxes share one. A box reaches its own channel's lines only
through the protocol (``box.protocol.history``): one ``history.load`` when a turn builds its context, one
``history.commit`` when it has ended. A line (``Record``) and its trimming rules (``trim``, ``shrink_by_one``)
are ``box.common.history``: pure, run by both sides; the host applies them to the imp's lines with the imp's
own limits.

How it combines with the host's ``recent`` (see ``combine``): the host's ``recent`` is
authoritative for what was said in the channel — everyone's messages, and the imp's own
posts as they were delivered. The box's records carry what the host does not: its own
exchanges as it committed them after delivery (PostSend), short-path archives and channel
events (a reaction clear). For the prompt the two are merged by message id (the host's
copy wins), ordered by time, only for the current channel (nothing from another channel
or a DM leaks into a prompt), and cut to at most ``history_limit`` (ENV-07).

The cut moves in steps (issue 33, ``box.common.history.window_start``): the window keeps its first line turn after
turn until it would hold more than the limit, then drops a block of older lines at once, so consecutive reply
requests share their system message and history byte for byte and the provider's prompt cache hits (ENV-20's
purpose; ENV-07 asks only that the history stay within its limit). The start is chosen from the lines' ids alone —
the host sends, before ``recent``'s last ``history_limit`` messages, up to ``lookback(history_limit)`` older ones with
their ids and times only — so a box re-created after an idle timeout picks the start the warm box picked.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import itemgetter

from box.common.history import Record, Role, aware, window_start
from box.protocol import ErrorCode, Peer, RpcError
from box.protocol.history import (
    MAX_COMMIT_LINES,
    MAX_LINE_CHARS,
    CountedOutcome,
    HistoryCommitParams,
    HistoryCommitResult,
    HistoryLine,
    HistoryLoadParams,
    HistoryLoadResult,
)
from box.protocol.models import HistoryEntry

log = logging.getLogger("box.history")

MAX_RECORD_CHARS = MAX_LINE_CHARS  # a record is context, not an archive of everything
MAX_HELD_LINES = MAX_COMMIT_LINES - 2  # events held for the next commit, beside the turn's own two lines

_AT = itemgetter(4)  # a candidate's time (combine)


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
    """The conversation before the current message: host ``recent`` ∪ own records of this channel, at most ``limit``
    of them (ENV-07), starting where ``window_start`` says (issue 33: the window moves in steps).

    The candidates are plain tuples (id, role, author, content, at) until the cut: only the entries the prompt
    shows are made (issue 18). The lines before the window are only counted (the host sends the oldest of them
    without their text)."""
    entries: dict[str, tuple[str, Role, str, str, datetime]] = {}
    for record in own:
        if record.channel_id == channel_id and record.id != current_id:
            entries[record.id] = (record.id, record.role, record.author, record.content, record.at)
    for entry in recent:  # the host's copy wins: it is what the channel actually shows
        if entry.id != current_id:
            kept = entries.get(entry.id)
            if not entry.content.strip() and kept is not None and kept[3].strip():
                continue  # a picture-only post has no text on the host; ours has its image markers (seed 003)
            role: Role = "assistant" if entry.from_imp else "user"
            entries[entry.id] = (entry.id, role, entry.author.name, entry.content, entry.created_at)
    ordered = sorted(entries.values(), key=_AT)
    start = window_start([row[0] for row in ordered], limit)
    return [PromptEntry(*row) for row in ordered[start:]]


# ------------------------------------------------------------------ the host keeps them (issue 22)


class HostHistory:
    """The box's own channel's lines, asked of the host: one read per turn, one write per turn.

    A channel event (ENV-13's reaction clear) arrives as a notification, whose handler must never wait on the
    host (the box reads the host's answers on the same loop): its line is held here (``hold``), shown to the
    next turn's prompt, and sent with that turn's commit — or at the box's shutdown (``flush``).

    A host that keeps no lines (an older one: ``history.*`` is an unknown method there) leaves the
    responder with the host's ``recent`` alone; it is asked once, not every turn. Any other refusal of a
    load is logged and the turn goes on without the lines, as it went on without an unreadable file.
    """

    def __init__(self, peer: Peer, channel_id: str) -> None:
        self.peer = peer
        self.channel_id = channel_id
        self.kept_by_host = True
        self.held: list[Record] = []  # lines not yet sent (channel events), oldest first

    def hold(self, record: Record) -> None:
        """Keep a line for the next commit (never waits: safe in a notification's handler)."""
        if record.channel_id != self.channel_id:
            log.info("a line for channel %s is not this box's to keep; dropped", record.channel_id)
            return
        self.held.append(record)
        del self.held[:-MAX_HELD_LINES]

    async def load(self) -> list[Record]:
        """The channel's lines, oldest first, trimmed by the host before the model call (ENV-07), and the lines
        held for the next commit."""
        if not self.kept_by_host:
            return list(self.held)
        try:
            result = await self.peer.request("history.load", HistoryLoadParams())
        except RpcError as exc:
            self._refused("load", exc)
            return list(self.held)
        assert isinstance(result, HistoryLoadResult)
        kept = [
            Record(self.channel_id, line.id, line.role, line.author, line.content, aware(line.at))
            for line in result.lines
        ]
        known = {(record.id, record.role) for record in kept}
        return [*kept, *(record for record in self.held if (record.id, record.role) not in known)]

    async def commit(self, records: Sequence[Record], *, count: CountedOutcome | None = None) -> int:
        """Append the held lines and ``records`` of this channel and count ``count``, in one request; the host
        trims after appending (ENV-07).

        A record of another channel (a reply sent elsewhere, ENV-09) is not sent: a box writes only its own
        channel's lines, and the host already keeps the post in that channel's history. Raises ``RpcError``
        when the host refuses (the caller decides what a lost line costs; held lines wait for the next try)."""
        ours = [record for record in records if record.channel_id == self.channel_id]
        lines = [
            HistoryLine(
                id=record.id,
                role=record.role,
                author=record.author[:256],
                content=record.content[:MAX_LINE_CHARS],
                at=aware(record.at),
            )  # fmt: skip
            for record in [*self.held, *ours]
        ][-MAX_COMMIT_LINES:]
        if not self.kept_by_host or (not lines and count is None):
            self.held.clear()
            return 0
        try:
            result = await self.peer.request(
                "history.commit", HistoryCommitParams(lines=lines, outcome=count)
            )
        except RpcError as exc:
            if exc.code == ErrorCode.METHOD_NOT_FOUND:
                self._refused("commit", exc)
                self.held.clear()
                return 0
            raise
        assert isinstance(result, HistoryCommitResult)
        self.held.clear()
        return result.stored

    async def flush(self) -> None:
        """Send the held lines now (the box is shutting down); a refusal is logged, the lines lost."""
        if not self.held:
            return
        try:
            await self.commit([])
        except RpcError as exc:
            log.warning("%d held history lines were not kept: %s", len(self.held), exc.message)

    def _refused(self, what: str, exc: RpcError) -> None:
        if exc.code == ErrorCode.METHOD_NOT_FOUND:
            self.kept_by_host = False
            log.info(
                "the host keeps no history lines (%s); the prompt uses its recent messages only", exc.message
            )
            return
        log.warning(
            "history %s refused by the host (%s); this turn goes on without the lines", what, exc.message
        )
