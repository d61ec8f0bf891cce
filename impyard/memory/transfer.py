"""Moving one imp between homes or databases (issue 36, ``impyard imp export`` / ``impyard imp import``).

An export is one file of JSON lines: a header (the format, the imp, when, which impyard, the imp's own files —
imp.toml, its persona, its news), then one line per row of everything the host keeps of that imp: what it
remembers in every scope (records with their vectors, episodes, saved conversations, generations), what it holds in
mind (its slots), what it has learned (its rules), its day (wakefulness), the lines it said in each channel
(its responder history) and its schedules. Not moved: the channels' history (shared by every imp there), pending
departures, the ledger and the audit (the source's accounts).

An import reads the whole file before it writes anything, checks every line (known tables and columns, plain
values, the imp's own rows only, bounded sizes), then writes every row in one transaction: all of it or nothing.
It goes only into a database where that imp (or the ``--as`` name) keeps nothing and has no files; rows keep their
ids, so an import into the database it came from under another name is refused (``impyard memory copy`` is that).
Either engine reads and writes it: a SQLite home's imp moves to PostgreSQL as it is.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from sqlalchemy import Table, insert, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from impyard import __version__
from impyard.clock import iso
from impyard.errors import ImpyardError
from impyard.imps.config import ImpError
from impyard.imps.shared import MAX_FILE_BYTES, MAX_FILES, settings_files
from impyard.memory.copying import keeps_anything
from impyard.storage.db import Database
from impyard.storage.tables import (
    memory_conversations,
    memory_dispositions,
    memory_episodes,
    memory_generations,
    memory_records,
    memory_slots,
    memory_wakefulness,
    responder_lines,
    schedules,
)

FORMAT = "impyard-imp-export"
VERSION = 1
# In insert order (a slot and an episode name their record). Keys the database makes itself are not carried.
TABLES: tuple[tuple[Table, frozenset[str]], ...] = (
    (memory_records, frozenset()),
    (memory_episodes, frozenset()),
    (memory_conversations, frozenset()),
    (memory_generations, frozenset()),
    (memory_slots, frozenset()),
    (memory_dispositions, frozenset()),
    (memory_wakefulness, frozenset()),
    (responder_lines, frozenset({"seq"})),
    (schedules, frozenset()),
)
BY_NAME = {table.name: (table, skip) for table, skip in TABLES}
WHAT = {  # how the summary names each table
    "memory_records": "memories", "memory_episodes": "episodes", "memory_conversations": "saved conversations",
    "memory_generations": "scopes", "memory_slots": "held in mind", "memory_dispositions": "learned rules",
    "memory_wakefulness": "day", "responder_lines": "lines said", "schedules": "schedules",
}  # fmt: skip
MAX_LINE_BYTES = (
    4 * 1024 * 1024
)  # a record with its vector and texts is a few KiB; the header holds the files
READ_BATCH = 500
INSERT_BATCH = 500
_NAME_LINE = re.compile(r"(?m)^name\s*=.*$")


class TransferError(ImpyardError):
    """An export that cannot be written or read, or an import that cannot go where it was asked: one line."""


@dataclass
class Export:
    """A read export: its imp, its files, and its rows by table (validated)."""

    imp: str
    exported_at: str
    impyard: str
    files: dict[str, str]
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return {WHAT[name]: len(self.rows.get(name, [])) for name, _ in ((t.name, s) for t, s in TABLES)}


# ------------------------------------------------------------------ writing


def _plain(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"b64": base64.b64encode(bytes(value)).decode("ascii")}
    return value


def _rows(conn: Connection, table: Table, skip: frozenset[str], imp: str) -> Iterator[dict[str, Any]]:
    columns = [column for column in table.c if column.name not in skip]
    statement = select(*columns).where(table.c.imp == imp).execution_options(yield_per=READ_BATCH)
    for batch in conn.execute(statement).mappings().partitions():
        for row in batch:
            yield {name: _plain(value) for name, value in row.items()}


def imp_files(directory: Path) -> dict[str, str]:
    """The imp's settings as the shared store keeps them (``impyard.imps.shared.settings_files``): never its boxes'
    state, the home's hidden marks (which revision its copy came from) nor what this home's gateway learned."""
    try:
        return settings_files(directory)
    except ImpError as exc:
        raise TransferError(str(exc).splitlines()[0]) from None


def write_export(
    db: Database, imp: str, files: dict[str, str], out: IO[str], now: datetime
) -> dict[str, int]:
    """Write ``imp``'s export to ``out`` (one read snapshot: the rows as of one instant); the count per table."""
    header = {"format": FORMAT, "version": VERSION, "imp": imp, "exported_at": iso(now), "impyard": __version__,
              "files": files}  # fmt: skip

    def dump(conn: Connection) -> dict[str, int]:
        out.write(json.dumps(header, ensure_ascii=False) + "\n")
        counts: dict[str, int] = {}
        for table, skip in TABLES:
            n = 0
            for row in _rows(conn, table, skip, imp):
                out.write(json.dumps({"table": table.name, "row": row}, ensure_ascii=False) + "\n")
                n += 1
            counts[WHAT[table.name]] = n
        return counts

    return db.read(dump)


def open_for(path: Path, mode: str, *, gz: bool | None = None) -> IO[str]:
    """The export file as text; gzip when its name ends in ``.gz`` (or ``gz`` says so: a partial file's name)."""
    if gz if gz is not None else path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")  # type: ignore[return-value]
    return open(path, mode, encoding="utf-8")


# ------------------------------------------------------------------ reading


def _value(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except ValueError:
            raise TransferError(f"{where}: a binary value is not base64") from None
    raise TransferError(f"{where}: a value is {type(value).__name__}, not text, a number or binary")


def read_export(lines: Iterable[str]) -> Export:
    """Every line of an export, checked; ``TransferError`` names the first line that is wrong."""
    export: Export | None = None
    for number, line in enumerate(lines, start=1):
        where = f"line {number}"
        if len(line) > MAX_LINE_BYTES:
            raise TransferError(f"{where} is longer than {MAX_LINE_BYTES} characters: not an impyard export")
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TransferError(
                f"{where} is not JSON ({exc.msg}): not an impyard export, or a damaged one"
            ) from None
        if export is None:
            export = _header(item)
            continue
        if not isinstance(item, dict) or set(item) != {"table", "row"} or not isinstance(item["row"], dict):
            raise TransferError(f'{where}: expected {{"table": …, "row": {{…}}}}')
        table_name = item["table"]
        if table_name not in BY_NAME:
            raise TransferError(f"{where}: {str(table_name)[:60]!r} is not a table an export carries")
        table, skip = BY_NAME[table_name]
        known = {c.name for c in table.c} - skip
        unknown = set(item["row"]) - known
        if unknown:
            raise TransferError(f"{where}: {table_name} has no column {sorted(unknown)[0][:60]!r}")
        row = {name: _value(value, where) for name, value in item["row"].items()}
        if row.get("imp") != export.imp:
            raise TransferError(
                f"{where}: a row of another imp ({str(row.get('imp'))[:40]!r}) in {export.imp}'s export"
            )
        export.rows.setdefault(table_name, []).append(row)
    if export is None:
        raise TransferError("the file is empty: not an impyard export")
    return export


def _header(item: Any) -> Export:
    if not isinstance(item, dict) or item.get("format") != FORMAT:
        raise TransferError("line 1 is not an impyard imp export's header (made by `impyard imp export`)")
    if item.get("version") != VERSION:
        raise TransferError(
            f"the export is version {str(item.get('version'))[:20]}; this impyard reads version {VERSION}: "
            "import it with the impyard that exported it, or a newer one"
        )
    files = item.get("files")
    if not isinstance(item.get("imp"), str) or not isinstance(files, dict):
        raise TransferError("line 1: the header names no imp or no files")
    if len(files) > MAX_FILES or not all(
        isinstance(k, str)
        and isinstance(v, str)
        and "/" not in k
        and k not in ("", ".", "..")
        and len(v) <= MAX_FILE_BYTES
        for k, v in files.items()
    ):
        raise TransferError("line 1: the header's files are not plain text files of the imp's directory")
    return Export(imp=item["imp"], exported_at=str(item.get("exported_at", "")), impyard=str(item.get("impyard", "")),
                  files=dict(files))  # fmt: skip


def renamed_config(text: str, new: str) -> str:
    """imp.toml with its ``name`` line set to ``new`` (every other line, comments included, as it was)."""
    replaced, n = _NAME_LINE.subn(f"name = {json.dumps(new)}", text, count=1)
    if n != 1:
        raise TransferError("the export's imp.toml has no `name = …` line to rename")
    return replaced


def import_rows(db: Database, export: Export, imp: str) -> dict[str, int]:
    """Write every row of ``export`` as ``imp``'s, in one transaction; refused when ``imp`` keeps anything here."""

    def write(conn: Connection) -> dict[str, int]:
        if keeps_anything(conn, imp) or _has(conn, memory_wakefulness, imp) or _has(conn, schedules, imp):
            raise TransferError(
                f"{imp} already keeps memories, a day or schedules in this database: import it under another "
                "name (--as NAME), or remove what it keeps first"
            )
        for table, _skip in TABLES:
            rows = [{**row, "imp": imp} for row in export.rows.get(table.name, [])]
            for start in range(0, len(rows), INSERT_BATCH):
                conn.execute(insert(table), rows[start : start + INSERT_BATCH])
        return export.counts()

    try:
        return db.write(write)
    except IntegrityError as exc:
        raise TransferError(
            "this database already holds rows with the export's ids (it was exported from here?): "
            "`impyard memory copy` copies an imp within one database; nothing was imported"
            f" ({str(exc.orig).splitlines()[0][:120]})"
        ) from None


def _has(conn: Connection, table: Table, imp: str) -> bool:
    return conn.execute(select(table.c.imp).where(table.c.imp == imp).limit(1)).first() is not None
