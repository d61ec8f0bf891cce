"""The responder's own lines, kept by the host (issue 22; SPEC-001 ENV-05, ENV-07, ENV-11, ENV-13).

Until issue 22 each imp's boxes kept these in one file on the imp-wide ``/state`` (``history.json``,
guarded by an ``flock`` that gVisor sandboxes do not share), and any of the imp's boxes could read every
channel's lines, DMs included. Now they live in the host's database, per imp and channel, and a box
reaches them only through ``history.load`` and ``history.commit`` (``box.protocol.history``), answered by
the gateway for the box's own channel alone.

The rules stay SPEC-001's, applied here with the imp's own settings (``[model] history_limit`` and
``history_per_channel``; never a number a box sends): the imp's lines are trimmed to the limit before
the model call (on ``load``) and after appending (on ``commit``) — ENV-07 — the busiest channel losing its
oldest line first (ENV-11, ``box.history.trim``, the same function the box used on its file).

``import_legacy`` brings an existing home's imp-wide ``state/history.json`` (and its counters) into the
table once, then renames the file ``history.json.imported``: nothing is lost, nothing is imported twice.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from box.history import Record, aware, trim
from box.protocol.history import MAX_LINE_CHARS, MAX_LOAD_CHARS, HistoryLine, HistoryLineView
from box.protocol.models import ResponderSettings
from impyard.clock import Clock, iso, parse_iso
from impyard.db import Database, Store

log = logging.getLogger("impyard.history")

LEGACY_FILE = "history.json"  # the imp-wide file of an impyard before issue 22, in the imp's state dir
IMPORTED_SUFFIX = ".imported"  # what it is renamed to once its lines are in the table
UNREADABLE_SUFFIX = ".unreadable"  # ... or when it cannot be read: kept, never read again
MAX_LEGACY_BYTES = 64 * 1024**2  # the old file was trimmed to ≤ 500 lines of ≤ 4,000 characters
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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
        conn = self.db.connection()
        (count,) = conn.execute("SELECT COUNT(*) FROM responder_lines WHERE imp = ?", (imp,)).fetchone()
        if count > self.bounds_for(imp).limit:
            with self.db.transaction() as tx:
                self._trim(tx, imp)
        rows = conn.execute(
            "SELECT message_id, role, author, content, at FROM responder_lines WHERE imp = ? AND channel_id = ?"
            " ORDER BY seq DESC",
            (imp, channel_id),
        ).fetchall()
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
        also: Callable[[sqlite3.Connection, int], None] | None = None,
    ) -> int:
        """Append ``lines`` to the channel (a line already kept — same id and role — is skipped), trim the imp's
        lines (ENV-07: after appending; ENV-11: the busiest channel first), count ``outcome``. One transaction,
        which ``also`` joins (the gateway's audit row, given how many lines were new). Returns that number."""
        with self.db.transaction() as conn:
            stored = self._insert(conn, imp, [(channel_id, line) for line in lines])
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
        with self.db.transaction() as conn:
            return conn.execute("DELETE FROM responder_lines WHERE channel_id = ?", (channel_id,)).rowcount

    def forget_imp(self, imp: str) -> int:
        """Drop all of an imp's lines, counters and import marks (``impyard imp rm --purge``); returns the lines."""
        with self.db.transaction() as conn:
            gone = conn.execute("DELETE FROM responder_lines WHERE imp = ?", (imp,)).rowcount
            conn.execute("DELETE FROM responder_counters WHERE imp = ?", (imp,))
            conn.execute("DELETE FROM responder_imports WHERE imp = ?", (imp,))
        return gone

    def lines(self, imp: str, channel_id: str | None = None) -> list[Record]:
        """The imp's lines (of one channel), oldest first, as they are kept: no trimming, no budget."""
        sql = "SELECT channel_id, message_id, role, author, content, at FROM responder_lines WHERE imp = ?"
        args: tuple[str, ...] = (imp,)
        if channel_id is not None:
            sql, args = sql + " AND channel_id = ?", (imp, channel_id)
        rows = self.db.query(sql + " ORDER BY seq", args)
        return [Record(row[0], row[1], row[2], row[3], row[4], parse_iso(row[5])) for row in rows]

    def counters(self, imp: str) -> dict[str, dict[str, int]]:
        """Turns counted per channel and outcome (``sent``, ``silent``, ``pending``, ``failed``, ``archived``)."""
        counted: dict[str, dict[str, int]] = {}
        for row in self.db.query(
            "SELECT channel_id, outcome, count FROM responder_counters WHERE imp = ? ORDER BY channel_id, outcome",
            (imp,),
        ):
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
        with self.db.transaction() as conn:
            done = conn.execute(
                "SELECT 1 FROM responder_imports WHERE imp = ? AND source = ?", (imp, LEGACY_FILE)
            ).fetchone()
            if done is None:
                stored = self._insert(conn, imp, records)
                for channel_id, per in counters.items():
                    for outcome, count in per.items():
                        self._count(conn, imp, channel_id, outcome, count)
                conn.execute(
                    "INSERT INTO responder_imports (imp, source, lines, skipped, imported_at) VALUES (?,?,?,?,?)",
                    (imp, LEGACY_FILE, stored, skipped, iso(self.clock.now())),
                )
        if done is not None:
            stored = 0
        _rename(dir_fd, LEGACY_FILE + IMPORTED_SUFFIX)
        if done is None:
            log.info("imported %d history lines of %s from %s (%d skipped)", stored, imp, path, skipped)
        return LegacyImport(imp, path, lines=stored, skipped=skipped)

    def _set_aside(self, imp: str, path: Path, dir_fd: int, why: str) -> LegacyImport:
        log.warning("%s's old history file %s %s: kept as %s%s, not imported", imp, path, why, path.name,
                    UNREADABLE_SUFFIX)  # fmt: skip
        _rename(dir_fd, LEGACY_FILE + UNREADABLE_SUFFIX)
        return LegacyImport(imp, path, error=why)

    # ------------------------------------------------------------ inside a transaction

    @staticmethod
    def _insert(conn: sqlite3.Connection, imp: str, lines: Sequence[tuple[str, HistoryLine]]) -> int:
        stored = 0
        for channel_id, line in lines:
            stored += conn.execute(
                "INSERT OR IGNORE INTO responder_lines (imp, channel_id, message_id, role, author, content, at)"
                " VALUES (?,?,?,?,?,?,?)",
                (
                    imp,
                    channel_id,
                    line.id,
                    line.role,
                    line.author,
                    line.content[:MAX_LINE_CHARS],
                    iso(aware(line.at)),
                ),
            ).rowcount
        return stored

    def _trim(self, conn: sqlite3.Connection, imp: str) -> None:
        """ENV-07 with ENV-11's shrink, over the imp's lines in the order they were kept."""
        bounds = self.bounds_for(imp)
        rows = conn.execute(
            "SELECT seq, channel_id FROM responder_lines WHERE imp = ? ORDER BY seq", (imp,)
        ).fetchall()
        if len(rows) <= bounds.limit:
            return
        # The pure rule needs only each line's channel and its place: a stand-in record per row, named by seq.
        records = [Record(str(channel), str(seq), "event", "", "", _EPOCH) for seq, channel in rows]
        kept = {record.id for record in trim(records, bounds.limit, bounds.per_channel)}
        gone = [(int(seq),) for seq, _ in rows if str(seq) not in kept]
        conn.executemany("DELETE FROM responder_lines WHERE seq = ?", gone)

    @staticmethod
    def _count(conn: sqlite3.Connection, imp: str, channel_id: str, outcome: str, count: int) -> None:
        conn.execute(
            "INSERT INTO responder_counters (imp, channel_id, outcome, count) VALUES (?,?,?,?)"
            " ON CONFLICT (imp, channel_id, outcome) DO UPDATE SET count = count + excluded.count",
            (imp, channel_id, outcome, count),
        )


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
        except (OSError, sqlite3.Error) as exc:  # the file stays where it is: the next start tries again
            log.warning("could not import %s's old history from %s: %s", imp, state_dir, exc)
            continue
        if result is not None:
            found.append(result)
    return found
