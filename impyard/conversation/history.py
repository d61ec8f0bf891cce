"""Channel history and the record of which messages woke which imp, and what became of them.

Every non-bot message is persisted *before* it is routed, woken or not
(docs/conversation.md). Each wake gets a row with its outcome once the turn ends, so
after a crash or restart a woken message that never got an outcome is
answered if still fresh, or recorded as missed — never silently forgotten.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

from pydantic import TypeAdapter
from sqlalchemy import bindparam, delete, exists, func, select, union, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from box.protocol.models import Author, HistoryEntry, Message, ReplyRef
from impyard.backends.conduct import printable
from impyard.clock import Clock, iso, parse_iso
from impyard.errors import ImpyardError
from impyard.storage.db import Database, Store
from impyard.storage.portable import bytewise
from impyard.storage.prepared import Prepared
from impyard.storage.tables import history, wakes

DEFAULT_RETENTION = 1_000  # messages kept per channel
DEFAULT_RECENT = 50  # messages sent to the box with each delivery
WAKE_PRUNE_EVERY = 64  # wakes kept in one channel between two prunes of its wakes (issue 32 #2)
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


# The statements, built once (SQLAlchemy's compiled cache then hits on every call), per dialect where they differ.
_h, _w = history, wakes
_newer = history.alias("newer")
# Retention: every row of the channel at or below the (retention+1)-th newest seq goes (none while fewer are kept).
_TRIM = Prepared(
    delete(_h).where(
        _h.c.channel_id == bindparam("channel_id"),
        _h.c.seq
        <= select(_newer.c.seq)
        .where(_newer.c.channel_id == bindparam("channel_id"))
        .order_by(_newer.c.seq.desc())
        .limit(1)
        .offset(bindparam("retention"))
        .scalar_subquery(),
    )
)
_FINISH = Prepared(
    update(_w)
    .where(
        _w.c.imp == bindparam("w_imp"),
        _w.c.channel_id == bindparam("w_channel"),
        _w.c.message_id == bindparam("w_message"),
        _w.c.outcome.is_(None),  # the first outcome wins
    )
    .values(outcome=bindparam("w_outcome"), error=bindparam("w_error"), finished_at=bindparam("w_at"))
)
# Issue 32 #2: a wake goes with its message. The imp's finished wakes in the channel whose message the history no
# longer keeps (trimmed to its retention, forgotten, cleared) are deleted with every ``WAKE_PRUNE_EVERY``-th wake
# kept there: ``wakes`` is bounded as the history is (a channel keeps at most its retention, plus fewer than that
# many, plus the wakes whose turn has not ended: a turn finishes against its wake). The statement reads every
# wake of the imp in the channel (about half a millisecond at 1,000): once every 64 wakes, not every wake.
_PRUNE_WAKES = Prepared(
    delete(_w).where(
        _w.c.imp == bindparam("imp"),
        _w.c.channel_id == bindparam("channel_id"),
        _w.c.message_id != bindparam("message_id"),
        _w.c.outcome.is_not(None),
        ~exists().where(_h.c.channel_id == _w.c.channel_id, _h.c.message_id == _w.c.message_id),
    )
)
_FORGET = delete(_h).where(
    _h.c.channel_id == bindparam("channel_id"), _h.c.message_id == bindparam("message_id")
)
_CLEAR = delete(_h).where(_h.c.channel_id == bindparam("channel_id"))
_RECENT = Prepared(  # 50 rows a turn: plain tuples
    select(_h.c.message_id, _h.c.author_id, _h.c.author_name, _h.c.author_bot, _h.c.from_imp, _h.c.content,
           _h.c.created_at)
    .where(_h.c.channel_id == bindparam("channel_id"))
    .order_by(_h.c.seq.desc())
    .limit(bindparam("limit")),
    named=False,
)  # fmt: skip
_MESSAGE_COLUMNS = (
    _h.c.message_id, _h.c.author_id, _h.c.author_name, _h.c.author_bot, _h.c.content, _h.c.created_at,
    _h.c.reply_to_id,
)  # fmt: skip
_GET = select(*_MESSAGE_COLUMNS).where(
    _h.c.channel_id == bindparam("channel_id"), _h.c.message_id == bindparam("message_id")
)
_WAKE = (_w.c.imp == bindparam("imp"), _w.c.channel_id == bindparam("channel_id"),
         _w.c.message_id == bindparam("message_id"))  # fmt: skip
_OUTCOME = select(_w.c.outcome).where(*_WAKE)
_WOKE = select(_w.c.imp).where(*_WAKE)
_COUNT = select(func.count()).select_from(_h).where(_h.c.channel_id == bindparam("channel_id"))
_last = func.max(_h.c.seq)
_AUTHOR_NAMES = (
    select(_h.c.author_name)
    .where(_h.c.author_id == bindparam("key"))
    .group_by(_h.c.author_name)
    .order_by(_last.desc())
    .limit(bindparam("limit"))
)
_AUTHOR_IDS = (
    select(_h.c.author_id)
    .where(_h.c.author_name == bindparam("key"))
    .group_by(_h.c.author_id)
    .order_by(_last.desc())
    .limit(bindparam("limit"))
)
_CHANNELS_OF = (
    select(_h.c.channel_id)
    .where(
        (_h.c.from_imp == bindparam("imp"))
        | exists().where(_w.c.imp == bindparam("imp"), _w.c.channel_id == _h.c.channel_id)
    )
    .group_by(_h.c.channel_id)
    .order_by(_last.desc())
)
_IMPS_IN = union(
    select(_w.c.imp.label("imp")).where(_w.c.channel_id == bindparam("channel_id")),
    select(_h.c.from_imp).where(_h.c.channel_id == bindparam("channel_id"), _h.c.from_imp.is_not(None)),
)
_SHOWN = (
    select(_h.c.channel_id, _h.c.message_id, _h.c.author_id, _h.c.author_name, _h.c.author_bot, _h.c.from_imp,
           _h.c.content, _h.c.created_at, _h.c.reply_to_id, _h.c.attachments, _w.c.woken_at, _w.c.outcome,
           _w.c.error)
    .select_from(
        _h.outerjoin(
            _w,
            (_w.c.imp == bindparam("imp")) & (_w.c.channel_id == _h.c.channel_id)
            & (_w.c.message_id == _h.c.message_id),
        )
    )
    .where(_h.c.channel_id.in_(bindparam("channel_ids", expanding=True)))
    .order_by(_h.c.seq.desc())
    .limit(bindparam("limit"))
)  # fmt: skip
# Issue 36: the newest message kept of each channel (by the order kept, whoever wrote it), the latest first.
_newest = select(_h.c.channel_id, func.max(_h.c.seq).label("seq")).group_by(_h.c.channel_id).subquery()
_LAST_KEPT = (
    select(_h.c.channel_id, _h.c.message_id)
    .join(_newest, _h.c.seq == _newest.c.seq)
    .order_by(_h.c.seq.desc())
)
# Issue 37: each imp's newest finished turn since a moment, through the finished_at index (a range of the wakes
# finished since then, whatever their imp).
_CONVERSED_SINCE = (
    select(_w.c.imp, func.max(_w.c.finished_at))
    .where(_w.c.finished_at >= bindparam("since"))
    .group_by(_w.c.imp)
)
_REPLIED = (
    select(_h.c.seq)
    .where(
        _h.c.channel_id == bindparam("channel_id"),
        _h.c.from_imp == bindparam("imp"),
        _h.c.reply_to_id == bindparam("message_id"),
    )
    .limit(1)
)


@cache
def _dialect(name: str) -> _Statements:
    return _Statements(name)


class _Statements:
    """What differs by dialect: INSERT ... ON CONFLICT, and text ordered byte by byte (PostgreSQL's collation is
    not SQLite's: ISO times are ordered as SQLite orders them with COLLATE "C")."""

    def __init__(self, dialect: str) -> None:
        insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        self.record = Prepared(
            insert(_h).on_conflict_do_nothing(index_elements=[_h.c.channel_id, _h.c.message_id])
        )
        self.record_wake = (
            Prepared(  # RETURNING: the row inserted, or none (issue 36: the claim; rowcount is not portable)
                insert(_w)
                .on_conflict_do_nothing(index_elements=[_w.c.imp, _w.c.channel_id, _w.c.message_id])
                .returning(_w.c.imp)
            )
        )
        woken_at = bytewise(_w.c.woken_at)
        unfinished = (
            select(_w.c.imp, _w.c.channel_id, _w.c.woken_at, *_MESSAGE_COLUMNS)
            .select_from(
                _w.outerjoin(_h, (_h.c.channel_id == _w.c.channel_id) & (_h.c.message_id == _w.c.message_id))
            )
            .where(_w.c.outcome.is_(None))
        )
        self.unfinished = unfinished.order_by(woken_at)
        self.unfinished_of = unfinished.where(_w.c.imp == bindparam("imp")).order_by(woken_at)


class History(Store):
    def __init__(self, db: Database, clock: Clock, *, retention: int = DEFAULT_RETENTION) -> None:
        if retention < 1:
            raise ValueError("history retention must keep at least one message per channel")
        self.db = db
        self.clock = clock
        self.retention = retention
        self._wakes_since_prune: dict[tuple[str, str], int] = {}  # per (imp, channel), in this process

    # ------------------------------------------------------------ writing

    def record(
        self,
        channel_id: str,
        message: Message,
        *,
        from_imp: str | None = None,
        conn: Connection | None = None,
    ) -> None:
        """Persist one message (idempotent by id) and trim the channel to its retention. ``conn``: inside the
        caller's write transaction (a job composing several stores in one, issue 18), else in its own."""
        row = _row(channel_id, message, from_imp)
        if conn is None:
            self.db.write(lambda conn: self._keep(conn, row))
        else:
            self._keep(conn, row)

    def _keep(self, conn: Connection, row: dict[str, Any]) -> None:
        _dialect(conn.dialect.name).record.run(conn, row)
        _TRIM.run(conn, {"channel_id": row["channel_id"], "retention": self.retention})

    def record_wake(
        self, imp: str, channel_id: str, message_id: str, *, conn: Connection | None = None
    ) -> bool:
        """That message woke ``imp``; ``conn`` as for ``record``. Every ``WAKE_PRUNE_EVERY``-th wake there, the
        imp's finished wakes in the channel whose message the history no longer keeps go with it (``_PRUNE_WAKES``).

        The wake row is the message's claim (issue 36): its key (imp, channel, message) is unique, so of every host
        of the database that is handed the same message for the same imp, one inserts it and answers; the others
        find it kept already. True when this call claimed it, False when it was claimed before (kept once)."""
        row = {
            "imp": imp,
            "channel_id": channel_id,
            "message_id": message_id,
            "woken_at": iso(self.clock.now()),
        }

        kept = self._wakes_since_prune.get((imp, channel_id), 0) + 1
        prune = kept >= WAKE_PRUNE_EVERY
        self._wakes_since_prune[(imp, channel_id)] = 0 if prune else kept

        def keep(conn: Connection) -> bool:
            claimed = _dialect(conn.dialect.name).record_wake.run(conn, row).first() is not None
            if prune:
                _PRUNE_WAKES.run(conn, {"imp": imp, "channel_id": channel_id, "message_id": message_id})
            return claimed

        return self.db.write(keep) if conn is None else keep(conn)

    def finish(
        self,
        imp: str,
        channel_id: str,
        message_ids: Sequence[str],
        outcome: Outcome,
        error: str | None = None,
    ) -> None:
        """Record a turn's outcome for every message it answered (first outcome wins)."""
        if not message_ids:
            return
        now = iso(self.clock.now())
        rows = [
            {"w_imp": imp, "w_channel": channel_id, "w_message": message_id, "w_outcome": outcome,
             "w_error": error, "w_at": now}
            for message_id in message_ids
        ]  # fmt: skip
        self.db.write(lambda conn: _FINISH.many(conn, rows))

    def forget(self, channel_id: str, message_id: str) -> int:
        """Remove one message, deleted on its surface (issue 23): its text leaves the host's history.

        Returns how many rows went (0 or 1). Its wake row (ids and outcome, no text) stays: recovery skips a
        woken message whose text is gone, as it does for one trimmed away.
        """
        params = {"channel_id": channel_id, "message_id": message_id}
        return self.db.write(lambda conn: conn.execute(_FORGET, params).rowcount)

    # ------------------------------------------------------------ reading

    def recent(
        self,
        channel_id: str,
        limit: int = DEFAULT_RECENT,
        *,
        imp: str | None = None,
        conn: Connection | None = None,
    ) -> list[HistoryEntry]:
        """The channel's last ``limit`` messages, oldest first; ``conn``: inside the caller's transaction."""
        params = {"channel_id": channel_id, "limit": limit}
        if conn is None:
            rows = self.db.read(lambda conn: _RECENT.run(conn, params).all())
        else:
            rows = _RECENT.run(conn, params).all()
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
        params = {"channel_id": channel_id, "message_id": message_id}
        row = self.db.read(lambda conn: conn.execute(_GET, params).first())
        return _message(row) if row else None

    def outcome(self, imp: str, channel_id: str, message_id: str) -> Outcome | None:
        params = {"imp": imp, "channel_id": channel_id, "message_id": message_id}
        row = self.db.read(lambda conn: conn.execute(_OUTCOME, params).first())
        return row[0] if row else None

    def woke(self, imp: str, channel_id: str, message_id: str) -> bool:
        """Whether that message woke ``imp`` (it has a wake row, finished or not)."""
        params = {"imp": imp, "channel_id": channel_id, "message_id": message_id}
        return self.db.read(lambda conn: conn.execute(_WOKE, params).first()) is not None

    def count(self, channel_id: str) -> int:
        return int(self.db.read(lambda conn: conn.execute(_COUNT, {"channel_id": channel_id}).scalar_one()))

    def author_names(self, author_id: str, limit: int = 20) -> list[str]:
        """The names a person (by id) has written under, most recent first (``impyard memory forget``)."""
        return self._strings(_AUTHOR_NAMES, {"key": author_id, "limit": limit})

    def author_ids(self, author_name: str, limit: int = 20) -> list[str]:
        """The ids of the people who wrote under exactly this name, most recent first."""
        return self._strings(_AUTHOR_IDS, {"key": author_name, "limit": limit})

    def _strings(self, statement: Any, params: dict[str, Any]) -> list[str]:
        return [
            str(value) for value in self.db.read(lambda conn: conn.execute(statement, params).scalars().all())
        ]

    # ------------------------------------------------------------ the operator's view (impyard history)

    def channels_of(self, imp: str) -> list[str]:
        """The channels holding history of ``imp``: where a message woke it or it wrote, the latest first."""
        return self._strings(_CHANNELS_OF, {"imp": imp})

    def imps_in(self, channel_id: str) -> list[str]:
        """The imps a message of this channel woke or that wrote in it, by name."""
        return sorted(self._strings(_IMPS_IN, {"channel_id": channel_id}))  # by code point, on either engine

    def shown(self, imp: str, channel_ids: Sequence[str], limit: int) -> list[ShownMessage]:
        """The latest ``limit`` messages of these channels, oldest first, each with its wake of ``imp``."""
        if not channel_ids:
            return []
        params = {"imp": imp, "channel_ids": list(channel_ids), "limit": limit}
        rows = self.db.read(lambda conn: conn.execute(_SHOWN, params).all())
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
        return self.db.write(lambda conn: conn.execute(_CLEAR, {"channel_id": channel_id}).rowcount)

    # ------------------------------------------------------------ recovery

    def last_kept(self) -> list[tuple[str, str]]:
        """(channel, message id) of the newest message kept in each channel, the most recently active first: where
        a host that starts reads the surface's history from (issue 36, ``impyard.discord.replay``)."""
        rows = self.db.read(lambda conn: conn.execute(_LAST_KEPT).all())
        return [(str(row[0]), str(row[1])) for row in rows]

    def conversed_since(self, since: datetime) -> dict[str, datetime]:
        """Each imp whose turn of a conversation ended at or after ``since``, with the newest such end, on any host
        of the database: whose spares a starting host keeps for what is left of their idle period (issue 37)."""
        rows = self.db.read(lambda conn: conn.execute(_CONVERSED_SINCE, {"since": iso(since)}).all())
        return {str(row[0]): parse_iso(str(row[1])) for row in rows if row[1] is not None}

    def replied(self, imp: str, channel_id: str, message_id: str) -> bool:
        """Whether ``imp``'s reply to that message is in the channel's history."""
        params = {"channel_id": channel_id, "imp": imp, "message_id": message_id}
        return self.db.read(lambda conn: conn.execute(_REPLIED, params).first()) is not None

    def unfinished(self, imp: str | None = None) -> list[PendingWake]:
        """Woken messages that never got an outcome (the supervisor stopped or crashed)."""
        stmts = _dialect(self.db.dialect)
        if imp is None:
            rows = self.db.read(lambda conn: conn.execute(stmts.unfinished).all())
        else:
            rows = self.db.read(lambda conn: conn.execute(stmts.unfinished_of, {"imp": imp}).all())
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


def _row(channel_id: str, message: Message, from_imp: str | None) -> dict[str, Any]:
    return {
        "channel_id": channel_id,
        "message_id": message.id,
        "author_id": message.author.id,
        "author_name": message.author.name,
        "author_bot": int(message.author.bot),
        "from_imp": from_imp,
        "content": message.content,
        "created_at": iso(message.created_at),
        "reply_to_id": message.reply_to.id if message.reply_to else None,
        "attachments": json.dumps(
            [item.model_dump(mode="json", exclude={"data_b64"}) for item in message.attachments]
        ),
    }


def _message(row: Sequence[Any]) -> Message:
    return Message(
        id=str(row[0]),
        author=Author(id=str(row[1]), name=str(row[2]), bot=bool(row[3])),
        content=str(row[4]),
        created_at=parse_iso(str(row[5])),
        reply_to=ReplyRef(id=str(row[6])) if row[6] else None,
    )


# --- shown to people: `impyard history show` and the terminal's /history ---------------------------------

MAX_LINE_CHARS = 4000  # one line of a message as shown; the whole text is in --json
INDENT = " " * 19  # under "YYYY-MM-DD HH:MM  "

# What became of a message that woke the imp, in words; a sent turn shows as the reply that follows it.
OUTCOME_WORDS = {
    "silent": "{imp} chose not to reply",
    "pending": "{imp}'s reply waits for approval (impyard approvals ls)",
    "failed": "the turn failed",
    "missed": "missed: not answered before a restart",
    "busy": "not answered: the channel was too busy",
    None: "no outcome yet: its turn is running, or the host stopped mid-turn",
}


def transcript(imp: str, messages: list[ShownMessage]) -> list[str]:
    """The messages as lines for people: a heading per channel, then time, author and text, and for a
    message that woke the imp without a reply, what became of it. Box and user text is made printable."""
    lines: list[str] = []
    channel = None
    for message in messages:
        if message.channel_id != channel:
            channel = message.channel_id
            lines.append(f"── {printable(channel, 200)}")
        when = message.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M")
        author = printable(message.author_name, 100) + (
            " (bot)" if message.author_bot and not message.from_imp else ""
        )
        text_lines = message.content.split("\n") or [""]
        if message.attachments:
            text_lines[-1] += f" [{message.attachments} attachment{'s' if message.attachments > 1 else ''}]"
        lines.append(f"{when}  {author}: {printable(text_lines[0], MAX_LINE_CHARS)}")
        lines.extend(f"{INDENT}{printable(line, MAX_LINE_CHARS)}" for line in text_lines[1:])
        if message.woke and message.outcome != "sent":
            words = OUTCOME_WORDS.get(message.outcome, message.outcome or "").format(imp=imp)
            error = f": {printable(message.error, MAX_LINE_CHARS)}" if message.error else ""
            lines.append(f"{INDENT}↳ {words}{error}")
    return lines
