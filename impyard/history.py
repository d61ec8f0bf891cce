"""Channel history and the record of which messages woke which imp, and what became of them.

Every non-bot message is persisted *before* it is routed, woken or not
(docs/conversation.md). Each wake gets a row with its outcome once the turn ends, so
after a crash or restart a woken message that never got an outcome is
answered if still fresh, or recorded as missed — never silently forgotten.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from pydantic import TypeAdapter

from box.protocol.models import Author, HistoryEntry, Message, ReplyRef
from impyard.clock import Clock, iso, parse_iso
from impyard.db import Database, Store
from impyard.errors import ImpyardError

DEFAULT_RETENTION = 1_000  # messages kept per channel
DEFAULT_RECENT = 50  # messages sent to the box with each delivery
RECOVERY_FRESH = timedelta(minutes=5)
_ENTRIES = TypeAdapter(list[HistoryEntry])

Outcome = str  # sent | silent | pending | failed | missed | busy


class RetentionError(ImpyardError, ValueError):
    """IMPYARD_HISTORY_RETENTION is not a whole number of messages >= 1."""


def retention_from_env(environ: dict[str, str] | None = None) -> int:
    """``IMPYARD_HISTORY_RETENTION``: messages kept per channel (default 1000)."""
    raw = (environ if environ is not None else dict(os.environ)).get("IMPYARD_HISTORY_RETENTION", "").strip()
    if not raw:
        return DEFAULT_RETENTION
    if not raw.isdigit() or int(raw) < 1:
        raise RetentionError(
            f"IMPYARD_HISTORY_RETENTION must be a whole number of messages >= 1 (got {raw!r})"
        )
    return int(raw)


@dataclass(frozen=True)
class PendingWake:
    imp: str
    channel_id: str
    message: Message
    woken_at: datetime


@dataclass(frozen=True)
class ShownMessage:
    """A message of the host's history as the operator reads it (``impyard history show``), with what became
    of it when it woke the imp asked about: ``outcome`` None when it did not wake it, or its turn never ended."""

    channel_id: str
    message_id: str
    author_id: str
    author_name: str
    author_bot: bool
    from_imp: str | None
    content: str
    created_at: datetime
    reply_to_id: str | None
    attachments: int
    woke: bool
    outcome: Outcome | None
    error: str | None


class History(Store):
    def __init__(self, db: Database, clock: Clock, *, retention: int = DEFAULT_RETENTION) -> None:
        if retention < 1:
            raise ValueError("history retention must keep at least one message per channel")
        self.db = db
        self.clock = clock
        self.retention = retention

    # ------------------------------------------------------------ writing

    def record(self, channel_id: str, message: Message, *, from_imp: str | None = None) -> None:
        """Persist one message (idempotent by id) and trim the channel to its retention."""
        row = (
            channel_id,
            message.id,
            message.author.id,
            message.author.name,
            int(message.author.bot),
            from_imp,
            message.content,
            iso(message.created_at),
            message.reply_to.id if message.reply_to else None,
            json.dumps([item.model_dump(mode="json", exclude={"data_b64"}) for item in message.attachments]),
        )
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO history (channel_id, message_id, author_id, author_name, author_bot,"
                " from_imp, content, created_at, reply_to_id, attachments) VALUES (?,?,?,?,?,?,?,?,?,?)",
                row,
            )
            conn.execute(
                "DELETE FROM history WHERE channel_id = ? AND seq <= ("
                " SELECT seq FROM history WHERE channel_id = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)",
                (channel_id, channel_id, self.retention),
            )

    def record_wake(self, imp: str, channel_id: str, message_id: str) -> None:
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO wakes (imp, channel_id, message_id, woken_at) VALUES (?,?,?,?)",
                (imp, channel_id, message_id, iso(self.clock.now())),
            )

    def finish(
        self,
        imp: str,
        channel_id: str,
        message_ids: Sequence[str],
        outcome: Outcome,
        error: str | None = None,
    ) -> None:
        """Record a turn's outcome for every message it answered (first outcome wins)."""
        now = iso(self.clock.now())
        with self.db.transaction() as conn:
            conn.executemany(
                "UPDATE wakes SET outcome = ?, error = ?, finished_at = ?"
                " WHERE imp = ? AND channel_id = ? AND message_id = ? AND outcome IS NULL",
                [(outcome, error, now, imp, channel_id, message_id) for message_id in message_ids],
            )

    def forget(self, channel_id: str, message_id: str) -> int:
        """Remove one message, deleted on its surface (issue 23): its text leaves the host's history.

        Returns how many rows went (0 or 1). Its wake row (ids and outcome, no text) stays: recovery skips a
        woken message whose text is gone, as it does for one trimmed away.
        """
        with self.db.transaction() as conn:
            return conn.execute(
                "DELETE FROM history WHERE channel_id = ? AND message_id = ?", (channel_id, message_id)
            ).rowcount

    # ------------------------------------------------------------ reading

    def recent(
        self, channel_id: str, limit: int = DEFAULT_RECENT, *, imp: str | None = None
    ) -> list[HistoryEntry]:
        conn = self.db.connection()
        rows = conn.execute(
            "SELECT message_id, author_id, author_name, author_bot, from_imp, content, created_at FROM history"
            " WHERE channel_id = ? ORDER BY seq DESC LIMIT ?",
            (channel_id, limit),
        ).fetchall()
        return _ENTRIES.validate_python(  # one validation of the whole window, not one model at a time
            [
                {
                    "id": row[0],
                    "author": {"id": row[1], "name": row[2], "bot": bool(row[3])},
                    "content": row[5],
                    "created_at": parse_iso(row[6]),
                    "from_imp": imp is not None and row[4] == imp,
                }
                for row in reversed(rows)
            ]
        )

    def get(self, channel_id: str, message_id: str) -> Message | None:
        conn = self.db.connection()
        row = conn.execute(
            "SELECT message_id, author_id, author_name, author_bot, content, created_at, reply_to_id FROM history"
            " WHERE channel_id = ? AND message_id = ?",
            (channel_id, message_id),
        ).fetchone()
        return _message(row) if row else None

    def outcome(self, imp: str, channel_id: str, message_id: str) -> Outcome | None:
        conn = self.db.connection()
        row = conn.execute(
            "SELECT outcome FROM wakes WHERE imp = ? AND channel_id = ? AND message_id = ?",
            (imp, channel_id, message_id),
        ).fetchone()
        return row[0] if row else None

    def count(self, channel_id: str) -> int:
        return (
            self.db.connection()
            .execute("SELECT COUNT(*) FROM history WHERE channel_id = ?", (channel_id,))
            .fetchone()[0]
        )

    def author_names(self, author_id: str, limit: int = 20) -> list[str]:
        """The names a person (by id) has written under, most recent first (``impyard memory forget``)."""
        rows = (
            self.db.connection()
            .execute(
                "SELECT author_name, MAX(seq) AS last FROM history WHERE author_id = ?"
                " GROUP BY author_name ORDER BY last DESC LIMIT ?",
                (author_id, limit),
            )
            .fetchall()
        )
        return [str(row[0]) for row in rows]

    def author_ids(self, author_name: str, limit: int = 20) -> list[str]:
        """The ids of the people who wrote under exactly this name, most recent first."""
        rows = (
            self.db.connection()
            .execute(
                "SELECT author_id, MAX(seq) AS last FROM history WHERE author_name = ?"
                " GROUP BY author_id ORDER BY last DESC LIMIT ?",
                (author_name, limit),
            )
            .fetchall()
        )
        return [str(row[0]) for row in rows]

    # ------------------------------------------------------------ the operator's view (impyard history)

    def channels_of(self, imp: str) -> list[str]:
        """The channels holding history of ``imp``: where a message woke it or it wrote, the latest first."""
        rows = (
            self.db.connection()
            .execute(
                "SELECT h.channel_id, MAX(h.seq) AS last FROM history h WHERE h.from_imp = ?"
                " OR EXISTS (SELECT 1 FROM wakes w WHERE w.imp = ? AND w.channel_id = h.channel_id)"
                " GROUP BY h.channel_id ORDER BY last DESC",
                (imp, imp),
            )
            .fetchall()
        )
        return [str(row[0]) for row in rows]

    def imps_in(self, channel_id: str) -> list[str]:
        """The imps a message of this channel woke or that wrote in it, by name."""
        rows = (
            self.db.connection()
            .execute(
                "SELECT imp FROM wakes WHERE channel_id = ? UNION"
                " SELECT from_imp FROM history WHERE channel_id = ? AND from_imp IS NOT NULL ORDER BY 1",
                (channel_id, channel_id),
            )
            .fetchall()
        )
        return [str(row[0]) for row in rows]

    def shown(self, imp: str, channel_ids: Sequence[str], limit: int) -> list[ShownMessage]:
        """The latest ``limit`` messages of these channels, oldest first, each with its wake of ``imp``."""
        if not channel_ids:
            return []
        marks = ",".join("?" * len(channel_ids))
        rows = (
            self.db.connection()
            .execute(
                "SELECT h.channel_id, h.message_id, h.author_id, h.author_name, h.author_bot, h.from_imp, h.content,"
                " h.created_at, h.reply_to_id, h.attachments, w.woken_at, w.outcome, w.error FROM history h"
                " LEFT JOIN wakes w ON w.imp = ? AND w.channel_id = h.channel_id AND w.message_id = h.message_id"
                f" WHERE h.channel_id IN ({marks}) ORDER BY h.seq DESC LIMIT ?",
                (imp, *channel_ids, limit),
            )
            .fetchall()
        )
        return [
            ShownMessage(
                channel_id=str(row[0]),
                message_id=str(row[1]),
                author_id=str(row[2]),
                author_name=str(row[3]),
                author_bot=bool(row[4]),
                from_imp=row[5],
                content=str(row[6]),
                created_at=parse_iso(str(row[7])),
                reply_to_id=row[8],
                attachments=len(json.loads(row[9] or "[]")),
                woke=row[10] is not None,
                outcome=row[11],
                error=row[12],
            )  # fmt: skip
            for row in reversed(rows)
        ]

    def clear(self, channel_id: str) -> int:
        """Forget every message of one channel (``impyard history clear``); returns how many went.

        The wake rows (ids and outcomes, no text) stay: a turn still running finishes against them, and
        recovery skips a woken message whose text is gone, as it does for one trimmed away.
        """
        with self.db.transaction() as conn:
            return conn.execute("DELETE FROM history WHERE channel_id = ?", (channel_id,)).rowcount

    # ------------------------------------------------------------ recovery

    def replied(self, imp: str, channel_id: str, message_id: str) -> bool:
        """Whether ``imp``'s reply to that message is in the channel's history."""
        row = (
            self.db.connection()
            .execute(
                "SELECT 1 FROM history WHERE channel_id = ? AND from_imp = ? AND reply_to_id = ? LIMIT 1",
                (channel_id, imp, message_id),
            )
            .fetchone()
        )
        return row is not None

    def unfinished(self, imp: str | None = None) -> list[PendingWake]:
        """Woken messages that never got an outcome (the supervisor stopped or crashed)."""
        query = (
            "SELECT w.imp, w.channel_id, w.woken_at, h.message_id, h.author_id, h.author_name, h.author_bot,"
            " h.content, h.created_at, h.reply_to_id FROM wakes w LEFT JOIN history h"
            " ON h.channel_id = w.channel_id AND h.message_id = w.message_id WHERE w.outcome IS NULL"
        )
        args: tuple[str, ...] = ()
        if imp is not None:
            query += " AND w.imp = ?"
            args = (imp,)
        conn = self.db.connection()
        rows = conn.execute(query + " ORDER BY w.woken_at", args).fetchall()
        pending = []
        for row in rows:
            if row[3] is None:  # the message itself was trimmed away: nothing left to answer
                continue
            pending.append(PendingWake(row[0], row[1], _message(row[3:]), parse_iso(row[2])))
        return pending

    def triage(
        self, imp: str | None = None, fresh: timedelta = RECOVERY_FRESH, skip_channels: Collection[str] = ()
    ) -> list[PendingWake]:
        """Mark stale unfinished wakes ``missed``; return the fresh ones, to be answered now. Wakes in
        ``skip_channels`` (another host's surface) are left as they are, for that host's own recovery.

        A wake the imp had already answered — its reply to that message is in the history — whose outcome write
        was lost (a full disk, a crash between the two) is marked ``sent`` and never answered again (issue 19 #2).
        """
        now = self.clock.now()
        fresh_ones: list[PendingWake] = []
        stale: list[PendingWake] = []
        for wake in self.unfinished(imp):
            if wake.channel_id in skip_channels:
                continue
            if self.replied(wake.imp, wake.channel_id, wake.message.id):
                self.finish(
                    wake.imp, wake.channel_id, [wake.message.id], "sent",
                    "answered before a restart; its outcome was not recorded then",
                )  # fmt: skip
                continue
            (fresh_ones if now - wake.message.created_at <= fresh else stale).append(wake)
        for wake in stale:
            self.finish(
                wake.imp, wake.channel_id, [wake.message.id], "missed", "not answered before a restart"
            )
        return fresh_ones


def _message(row: Sequence[object] | sqlite3.Row) -> Message:
    return Message(
        id=str(row[0]),
        author=Author(id=str(row[1]), name=str(row[2]), bot=bool(row[3])),
        content=str(row[4]),
        created_at=parse_iso(str(row[5])),
        reply_to=ReplyRef(id=str(row[6])) if row[6] else None,
    )
