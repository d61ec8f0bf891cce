"""The responder's own lines, kept by the host (issue 22; SPEC-001 ENV-05, ENV-07, ENV-11, ENV-13).

Until issue 22 each imp's boxes kept these in one file on the imp-wide ``/state`` (``history.json``,
guarded by an ``flock`` that gVisor sandboxes do not share), and any of the imp's boxes could read every
channel's lines, DMs included. Now they live in the host's database, per imp and channel, and a box
reaches them only through ``history.load`` and ``history.commit`` (``box.protocol.history``), answered by
the gateway for the box's own channel alone.

The rules stay SPEC-001's, applied here with the imp's own settings (``[model] history_limit`` and
``history_per_channel``; never a number a box sends): the imp's lines are trimmed to the limit before
the model call (on ``load``) and after appending (on ``commit``) — ENV-07 — the busiest channel losing its
oldest line first (ENV-11, ``box.common.history.trim``, the same function the box used on its file).

``import_legacy`` brings an existing home's imp-wide ``state/history.json`` (and its counters) into the
table once, then renames the file ``history.json.imported``: nothing is lost, nothing is imported twice.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from sqlalchemy import Integer, bindparam, cast, delete, func, insert, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from box.common.history import Record, aware, trim
from box.protocol.history import MAX_LINE_CHARS, MAX_LOAD_CHARS, HistoryLine, HistoryLineView
from box.protocol.models import ResponderSettings
from impyard.clock import Clock, iso, parse_iso
from impyard.storage.db import Database, Store
from impyard.storage.portable import upsert
from impyard.storage.prepared import Prepared
from impyard.storage.tables import responder_counters, responder_imports, responder_lines

log = logging.getLogger("impyard.history")

LEGACY_FILE = "history.json"  # the imp-wide file of an impyard before issue 22, in the imp's state dir
IMPORTED_SUFFIX = ".imported"  # what it is renamed to once its lines are in the table
UNREADABLE_SUFFIX = ".unreadable"  # ... or when it cannot be read: kept, never read again
MAX_LEGACY_BYTES = 64 * 1024**2  # the old file was trimmed to ≤ 500 lines of ≤ 4,000 characters
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# pg_advisory_xact_lock(HISTORY_LOCK_CLASS, hashtext(imp)): the writers of one imp's lines queue on it (``_lock``)
# instead of failing to serialize (b"hist"; two keys, apart from the migrator's one-key lock and the memory's class).
HISTORY_LOCK_CLASS = 0x68697374

# The statements, built once (SQLAlchemy's compiled cache then hits on every call).
_l, _n, _i = responder_lines.c, responder_counters.c, responder_imports.c
_LOCK_IMP = select(
    func.pg_advisory_xact_lock(cast(bindparam("lock_class"), Integer), func.hashtext(bindparam("imp")))
)
_COUNT_IMP = Prepared(select(func.count()).select_from(responder_lines).where(_l.imp == bindparam("imp")))
_LOAD = Prepared(
    select(_l.message_id, _l.role, _l.author, _l.content, _l.at)
    .where(_l.imp == bindparam("imp"), _l.channel_id == bindparam("channel_id"))
    .order_by(_l.seq.desc()),
    named=False,  # a turn's whole load: plain tuples
)
_ALL_LINES = responder_lines.alias("all_lines")  # the imp's lines in every channel, beside the channel's own
_LOAD_COUNTED = (
    Prepared(  # issue 36: the channel's lines and how many the imp keeps in all, in one round trip
        select(
            _l.message_id,
            _l.role,
            _l.author,
            _l.content,
            _l.at,
            select(func.count())
            .select_from(_ALL_LINES)
            .where(_ALL_LINES.c.imp == bindparam("imp"))
            .scalar_subquery(),
        )
        .where(_l.imp == bindparam("imp"), _l.channel_id == bindparam("channel_id"))
        .order_by(_l.seq.desc()),
        named=False,
    )
)
_PLACES = Prepared(
    select(_l.seq, _l.channel_id).where(_l.imp == bindparam("imp")).order_by(_l.seq), named=False
)
_DROP_SEQ = Prepared(
    delete(responder_lines).where(_l.seq == bindparam("seq"))
)  # run once per line (executemany)
_FORGET_CHANNEL = delete(responder_lines).where(_l.channel_id == bindparam("channel_id"))
_FORGET_IMP = (
    delete(responder_lines).where(_l.imp == bindparam("imp")),
    delete(responder_counters).where(_n.imp == bindparam("imp")),
    delete(responder_imports).where(_i.imp == bindparam("imp")),
)
_LINE_COLUMNS = (_l.channel_id, _l.message_id, _l.role, _l.author, _l.content, _l.at)
_LINES = select(*_LINE_COLUMNS).where(_l.imp == bindparam("imp")).order_by(_l.seq)
_LINES_OF = (
    select(*_LINE_COLUMNS)
    .where(_l.imp == bindparam("imp"), _l.channel_id == bindparam("channel_id"))
    .order_by(_l.seq)
)
_COUNTERS = select(_n.channel_id, _n.outcome, _n["count"]).where(_n.imp == bindparam("imp"))
_IMPORTED = select(_i.imp).where(_i.imp == bindparam("imp"), _i.source == bindparam("source"))
_MARK_IMPORTED = insert(responder_imports)


@cache
def _inserts(dialect: str) -> tuple[Prepared, Prepared]:
    """A line kept once (INSERT ... ON CONFLICT DO NOTHING), and a counter added to: built once per dialect."""
    insert_ = upsert(dialect)
    line = (
        insert_(responder_lines)
        .on_conflict_do_nothing(index_elements=[_l.imp, _l.channel_id, _l.message_id, _l.role])
        .returning(_l.seq)  # the row when it was new (rowcount is not portable beside an implicit RETURNING)
    )
    counter = insert_(responder_counters)
    counted = counter.on_conflict_do_update(
        index_elements=[_n.imp, _n.channel_id, _n.outcome],
        set_={"count": _n["count"] + counter.excluded["count"]},
    )
    return Prepared(line), Prepared(counted)


@dataclass(frozen=True)
class HistoryBounds:
    """An imp's ``[model] history_limit`` (ENV-07) and ``history_per_channel`` (ENV-11)."""

    limit: int = ResponderSettings.model_fields["history_limit"].default
    per_channel: int = ResponderSettings.model_fields["history_per_channel"].default


@dataclass(frozen=True)
class LegacyImport:
    """What ``import_legacy`` did with one imp's old file."""

    imp: str
    path: Path
    lines: int = 0  # lines that went into the table
    skipped: int = 0  # entries of the file that were not lines (malformed), left in the renamed file
    error: str | None = None  # the file could not be read: renamed ``.unreadable``, nothing imported


class ResponderHistory(Store):
    """The ``responder_lines`` and ``responder_counters`` tables. Blocking: call it through ``db.run``."""

    def __init__(
        self,
        db: Database,
        clock: Clock,
        bounds: Mapping[str, HistoryBounds] | None = None,
        *,
        default: HistoryBounds = HistoryBounds(),
    ) -> None:
        """``bounds``: each imp's limits (its imp.toml); an imp not named gets ``default`` (the box's defaults)."""
        self.db = db
        self.clock = clock
        self.bounds = dict(bounds or {})
        self.default = default

    def bounds_for(self, imp: str) -> HistoryBounds:
        return self.bounds.get(imp, self.default)

    # ------------------------------------------------------------ the box's two requests

    def load(self, imp: str, channel_id: str) -> list[Record]:
        """The channel's lines, oldest first, after trimming the imp's to its limit (ENV-07: before the call).

        At most ``MAX_LOAD_CHARS`` of text: the newest lines that fit (the prompt is cut to the limit anyway)."""
        params = {"imp": imp, "channel_id": channel_id}
        limit = self.bounds_for(imp).limit

        def read(conn: Connection) -> tuple[int, Sequence[Any]]:
            rows = _LOAD_COUNTED.run(conn, params).all()  # each row ends with the imp's count
            count = int(rows[0][5]) if rows else _COUNT_IMP.run(conn, params).scalar_one()
            return count, ([] if count > limit else rows)

        def trimmed(
            conn: Connection,
        ) -> Sequence[Any]:  # the limit fell (its imp.toml changed): trimmed first
            _lock(conn, imp)
            self._trim(conn, imp)
            return _LOAD.run(conn, params).all()

        count, rows = self.db.read(read)
        if count > limit:
            rows = self.db.write(trimmed, locking=True)
        lines: list[Record] = []
        budget = MAX_LOAD_CHARS
        for row in rows:
            budget -= len(row[2]) + len(row[3]) + 64
            if budget < 0:
                break
            lines.append(Record(channel_id, row[0], row[1], row[2], row[3], parse_iso(row[4])))
        lines.reverse()
        return lines

    def commit(
        self,
        imp: str,
        channel_id: str,
        lines: Sequence[HistoryLine],
        outcome: str | None = None,
        *,
        also: Callable[[Connection, int], None] | None = None,
    ) -> int:
        """Append ``lines`` to the channel (a line already kept — same id and role — is skipped), trim the imp's
        lines (ENV-07: after appending; ENV-11: the busiest channel first), count ``outcome``. One transaction,
        which ``also`` joins (the gateway's audit row, given how many lines were new: database work only, since
        on PostgreSQL the transaction may run again). Returns that number.

        On PostgreSQL the commits of one imp queue on its lock (``_lock``) at READ COMMITTED: every commit trims
        over all the imp's lines, so at SERIALIZABLE the commits of its busy channels kept failing to serialize
        and running again (a host's CPU spent twice, and a turn's commit could fail for good)."""
        kept = [(channel_id, line) for line in lines]
        return self.db.write(
            lambda conn: self.commit_in(conn, imp, kept, channel_id, outcome, also), locking=True
        )

    def commit_in(
        self,
        conn: Connection,
        imp: str,
        lines: Sequence[tuple[str, HistoryLine]],
        channel_id: str,
        outcome: str | None = None,
        also: Callable[[Connection, int], None] | None = None,
    ) -> int:
        """``commit`` inside the caller's write transaction (on PostgreSQL one of ``db.write(locking=True)``, since
        this takes the imp's lock first)."""
        _lock(conn, imp)
        stored = self._insert(conn, imp, lines)
        self._trim(conn, imp)
        if outcome is not None:
            self._count(conn, imp, channel_id, outcome, 1)
        if also is not None:
            also(conn, stored)
        return stored

    # ------------------------------------------------------------ the operator's side

    def forget_channel(self, channel_id: str) -> int:
        """Drop every imp's lines of one channel (``impyard history clear``, the chat's ``/clear``); returns how
        many went. The counters (numbers, no text) stay."""
        return self.db.write(lambda conn: conn.execute(_FORGET_CHANNEL, {"channel_id": channel_id}).rowcount)

    def forget_imp(self, imp: str) -> int:
        """Drop all of an imp's lines, counters and import marks (``impyard imp rm --purge``); returns the lines."""

        def txn(conn: Connection) -> int:
            gone = conn.execute(_FORGET_IMP[0], {"imp": imp}).rowcount
            for statement in _FORGET_IMP[1:]:
                conn.execute(statement, {"imp": imp})
            return gone

        return self.db.write(txn)

    def lines(self, imp: str, channel_id: str | None = None) -> list[Record]:
        """The imp's lines (of one channel), oldest first, as they are kept: no trimming, no budget."""
        params = {"imp": imp, "channel_id": channel_id}
        statement = _LINES if channel_id is None else _LINES_OF
        rows = self.db.read(lambda conn: conn.execute(statement, params).all())
        return [Record(row[0], row[1], row[2], row[3], row[4], parse_iso(row[5])) for row in rows]

    def counters(self, imp: str) -> dict[str, dict[str, int]]:
        """Turns counted per channel and outcome (``sent``, ``silent``, ``pending``, ``failed``, ``archived``)."""
        rows = self.db.read(lambda conn: conn.execute(_COUNTERS, {"imp": imp}).all())
        counted: dict[str, dict[str, int]] = {}
        for row in sorted(
            rows, key=lambda row: (str(row[0]), str(row[1]))
        ):  # by code point, on either engine
            counted.setdefault(str(row[0]), {})[str(row[1])] = int(row[2])
        return counted

    # ------------------------------------------------------------ the upgrade (once per imp)

    def import_legacy(self, imp: str, state_dir: Path) -> LegacyImport | None:
        """Bring the imp-wide ``history.json`` of an impyard before issue 22 into the table, once.

        ``state_dir`` is the imp's old ``/state`` (``ImpStore.state_dir``). The file was written by boxes, so it
        is read as hostile: never through a link, at most ``MAX_LEGACY_BYTES``, each entry checked like a line
        a box commits (a malformed one is skipped, never half-imported). Its lines keep their order, channel
        and text; its counters are added. Then the file is renamed ``history.json.imported`` (one that cannot
        be read: ``.unreadable``) and a row in ``responder_imports`` says it was done: a second call, by this
        process or another, imports nothing. None when there is no file."""
        try:
            dir_fd = os.open(state_dir, _DIR_FLAGS)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            log.warning("cannot look for %s's old history in %s: %s", imp, state_dir, exc)
            return None
        try:
            return self._import_from(imp, state_dir, dir_fd)
        finally:
            os.close(dir_fd)

    def _import_from(self, imp: str, state_dir: Path, dir_fd: int) -> LegacyImport | None:
        path = state_dir / LEGACY_FILE
        try:
            fd = os.open(LEGACY_FILE, _FILE_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:  # a link in its place (ELOOP), or unreadable: kept as it is, never followed
            return self._set_aside(imp, path, dir_fd, f"cannot be opened safely ({exc.strerror or exc})")
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return self._set_aside(imp, path, dir_fd, "is not a regular file")
            if info.st_size > MAX_LEGACY_BYTES:
                return self._set_aside(imp, path, dir_fd, f"is larger than {MAX_LEGACY_BYTES} bytes")
            with os.fdopen(os.dup(fd), "rb") as handle:
                data = handle.read(MAX_LEGACY_BYTES + 1)
        finally:
            os.close(fd)
        try:
            records, counters, skipped = parse_legacy(data)
        except ValueError as exc:
            return self._set_aside(imp, path, dir_fd, str(exc))
        now = iso(self.clock.now())

        def txn(conn: Connection) -> int | None:  # None: imported before (by this process or another)
            _lock(conn, imp)
            if conn.execute(_IMPORTED, {"imp": imp, "source": LEGACY_FILE}).first() is not None:
                return None
            stored = self._insert(conn, imp, records)
            for channel_id, per in counters.items():
                for outcome, count in per.items():
                    self._count(conn, imp, channel_id, outcome, count)
            conn.execute(_MARK_IMPORTED, {"imp": imp, "source": LEGACY_FILE, "lines": stored, "skipped": skipped,
                                          "imported_at": now})  # fmt: skip
            return stored

        imported = self.db.write(txn, locking=True)
        done, stored = imported is None, imported or 0
        _rename(dir_fd, LEGACY_FILE + IMPORTED_SUFFIX)
        if not done:
            log.info("imported %d history lines of %s from %s (%d skipped)", stored, imp, path, skipped)
        return LegacyImport(imp, path, lines=stored, skipped=skipped)

    def _set_aside(self, imp: str, path: Path, dir_fd: int, why: str) -> LegacyImport:
        log.warning("%s's old history file %s %s: kept as %s%s, not imported", imp, path, why, path.name,
                    UNREADABLE_SUFFIX)  # fmt: skip
        _rename(dir_fd, LEGACY_FILE + UNREADABLE_SUFFIX)
        return LegacyImport(imp, path, error=why)

    # ------------------------------------------------------------ inside a transaction

    @staticmethod
    def _insert(conn: Connection, imp: str, lines: Sequence[tuple[str, HistoryLine]]) -> int:
        """The lines not kept yet; how many were new."""
        insert_line = _inserts(conn.dialect.name)[0]
        stored = 0
        for channel_id, line in lines:
            row = {"imp": imp, "channel_id": channel_id, "message_id": line.id, "role": line.role,
                   "author": line.author, "content": line.content[:MAX_LINE_CHARS], "at": iso(aware(line.at))}  # fmt: skip
            stored += insert_line.run(conn, row).first() is not None
        return stored

    def _trim(self, conn: Connection, imp: str) -> None:
        """ENV-07 with ENV-11's shrink, over the imp's lines in the order they were kept (their ``seq``)."""
        bounds = self.bounds_for(imp)
        rows = _PLACES.run(conn, {"imp": imp}).all()
        if len(rows) <= bounds.limit:
            return
        # The pure rule needs only each line's channel and its place: a stand-in record per row, named by seq.
        records = [Record(str(channel), str(seq), "event", "", "", _EPOCH) for seq, channel in rows]
        kept = {record.id for record in trim(records, bounds.limit, bounds.per_channel)}
        gone = [int(seq) for seq, _ in rows if str(seq) not in kept]
        _DROP_SEQ.many(conn, [{"seq": seq} for seq in gone])

    @staticmethod
    def _count(conn: Connection, imp: str, channel_id: str, outcome: str, count: int) -> None:
        row = {"imp": imp, "channel_id": channel_id, "outcome": outcome, "count": count}
        _inserts(conn.dialect.name)[1].run(conn, row)


def _lock(conn: Connection, imp: str) -> None:
    """Before anything of the imp's lines is read to decide a write: wait for the imp's other writers (PostgreSQL's
    advisory lock, held to the transaction's end; another imp whose name hashes alike only queues too). Each
    writer then reads at READ COMMITTED what the one before it left. SQLite's ``BEGIN IMMEDIATE`` is the lock."""
    if conn.dialect.name == "postgresql":
        conn.execute(_LOCK_IMP, {"lock_class": HISTORY_LOCK_CLASS, "imp": imp}).all()


def line_views(records: Sequence[Record]) -> list[HistoryLineView]:
    """Lines as ``history.load`` hands them to a box (the channel is the box's own, so it is not named)."""
    return [
        HistoryLineView(
            id=record.id, role=record.role, author=record.author, content=record.content, at=record.at
        )
        for record in records
    ]


def parse_legacy(data: bytes) -> tuple[list[tuple[str, HistoryLine]], dict[str, dict[str, int]], int]:
    """The old ``history.json``: ``{"version": 1, "records": [...], "counters": {channel: {outcome: n}}}``.

    Returns the (channel, line) pairs in file order, the counters, and how many records were skipped
    (malformed, or past a line's bounds). Raises ``ValueError`` when the file is not that object at all."""
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"is not JSON ({exc})"[:300]) from None
    if not isinstance(document, dict) or not isinstance(document.get("records", []), list):
        raise ValueError("is not a history file (no list of records)")
    lines: list[tuple[str, HistoryLine]] = []
    skipped = 0
    for item in document.get("records", []):
        line = _legacy_line(item)
        if line is None:
            skipped += 1
        else:
            lines.append(line)
    counters: dict[str, dict[str, int]] = {}
    raw = document.get("counters", {})
    for channel, per in raw.items() if isinstance(raw, dict) else ():
        if not isinstance(per, dict) or not 0 < len(str(channel)) <= 128:
            continue
        for outcome, count in per.items():
            if (
                isinstance(count, int)
                and not isinstance(count, bool)
                and count > 0
                and len(str(outcome)) <= 40
            ):
                counters.setdefault(str(channel), {})[str(outcome)] = count
    return lines, counters, skipped


def _legacy_line(item: Any) -> tuple[str, HistoryLine] | None:
    if not isinstance(item, dict):
        return None
    channel = item.get("channel_id")
    if not isinstance(channel, str) or not 0 < len(channel) <= 128:
        return None
    try:
        record = Record.from_json(item)
        line = HistoryLine(
            id=record.id, role=record.role, author=record.author[:256], content=record.content[:MAX_LINE_CHARS],
            at=record.at,
        )  # fmt: skip
    except (KeyError, TypeError, ValueError):
        return None
    return channel, line


def _rename(dir_fd: int, target: str) -> None:
    """Move the old file aside under ``target`` (``target.2``, ``.3`` … when one is there already: an older
    impyard that ran again wrote a second file; neither is lost)."""
    name, n = target, 1
    while True:
        try:
            os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            break
        n += 1
        name = f"{target}.{n}"
    try:
        os.rename(LEGACY_FILE, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except FileNotFoundError:
        pass  # another impyard process of this home moved it first
    except OSError as exc:  # the import row still stands: the file is never imported twice
        log.warning("could not rename the old history file to %s: %s", name, exc)


def import_legacy_homes(history: ResponderHistory, imps: Sequence[tuple[str, Path]]) -> list[LegacyImport]:
    """``import_legacy`` for each (imp, its old state dir); what was found, imported or set aside."""
    found = []
    for imp, state_dir in imps:
        try:
            result = history.import_legacy(imp, state_dir)
        except (OSError, SQLAlchemyError) as exc:  # the file stays where it is: the next start tries again
            log.warning("could not import %s's old history from %s: %s", imp, state_dir, exc)
            continue
        if result is not None:
            found.append(result)
    return found
