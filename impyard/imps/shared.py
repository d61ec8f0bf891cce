"""Every imp's settings in the shared store: one truth for every host of a database (issue 36; docs/hosts.md
"Where an imp's settings live").

The database keeps each imp's files — ``imp.toml``, its persona, its news file — with a revision that grows by one
at every change. Each home's ``imps/<name>/`` is a working copy of them: ``sync_home`` brings it up to date and
sends the home's own changes up, so that every host serving from one database runs every imp with the same
settings, and an operator may still edit ``imp.toml`` by hand or with ``impyard imp set``:

* the database has a newer revision and the home's copy is as it was fetched: the copy is updated;
* the home's copy was changed since it was fetched and the database has not moved: the change is published as
  the next revision;
* both changed: refused with one line naming both and the way out (``impyard imp apply -f``), nothing written;
* the home has an imp the database does not know (an older home, files put there by hand): it is published;
  an imp removed elsewhere is removed here (its boxes' state is kept, as ``impyard imp rm`` keeps it).

``imps/<name>/.revision`` records which revision the copy came from and its digest. ``embedding-lengths.json`` stays
per home (what this host's gateway saw), as do the boxes' state directories.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection

from impyard.clock import Clock, SystemClock, iso
from impyard.imps.config import CONFIG_FILE, ImpConfigError, ImpError
from impyard.imps.store import EMBEDDING_LENGTHS_FILE, ImpStore
from impyard.imps.validate import parse_config
from impyard.storage.db import Database
from impyard.storage.liveness import this_process
from impyard.storage.tables import imp_settings

log = logging.getLogger("impyard.imps")
MARK = ".revision"
MAX_FILES = 16
MAX_FILE_BYTES = 1024 * 1024
PER_HOME = frozenset({EMBEDDING_LENGTHS_FILE})  # what this home's gateway learned: not a setting


class ImpConflict(ImpError):
    """The home's copy and the database both changed an imp: one line naming both and the way out."""


class ImpMoved(ImpConflict):
    """The database's revision of an imp moved while a change was being made from an older one (another home
    published, or started, at the same moment): nothing was written."""


@dataclass(frozen=True)
class Published:
    name: str
    revision: int
    files: dict[str, str]
    digest: str
    updated_at: str
    updated_by: str


@dataclass
class SyncReport:
    """What ``sync_home`` did, per imp name."""

    published: list[str] = field(default_factory=list)  # the home's change went up
    updated: list[str] = field(default_factory=list)  # the database's came down
    removed: list[str] = field(default_factory=list)  # removed elsewhere, so here too
    revisions: dict[str, int] = field(default_factory=dict)  # every imp's revision after the sync

    def lines(self, *, published: bool = True) -> list[str]:
        said = [
            f"imp {n}: this home's change published as revision {self.revisions.get(n)}"
            for n in (self.published if published else [])
        ]
        said += [
            f"imp {n}: updated to revision {self.revisions.get(n)} from the database" for n in self.updated
        ]
        said += [f"imp {n}: removed here, as it was removed from the database" for n in self.removed]
        return said


def digest(files: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def settings_files(directory: Path) -> dict[str, str]:
    """The imp's settings as files: every text file at the top of its directory but the hidden ones and what
    belongs to this home only. Bounded: an imp's settings are a few small files."""
    files: dict[str, str] = {}
    if not directory.is_dir():
        return files
    for path in sorted(directory.iterdir()):
        if not path.is_file() or path.is_symlink() or path.name.startswith(".") or path.name in PER_HOME:
            continue
        if len(files) >= MAX_FILES:
            raise ImpError(
                f"{directory} holds more than {MAX_FILES} files: an imp's settings are imp.toml, its persona and its news"
            )
        data = path.read_bytes()
        if len(data) > MAX_FILE_BYTES:
            raise ImpError(f"{path} is {len(data)} bytes; a settings file may be at most {MAX_FILE_BYTES}")
        try:
            files[path.name] = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ImpError(
                f"{path} is not UTF-8 text: save it as UTF-8 (an imp's settings are text)"
            ) from None
    return files


def who() -> str:
    """Who changes a setting: this process and the account that runs it."""
    me = this_process()
    try:
        account = getpass.getuser()
    except (KeyError, OSError):
        account = "?"
    return f"{me.host}/{me.pid} ({account})"


def _published(row: Any) -> Published:
    return Published(
        row.name, int(row.revision), json.loads(row.files), row.digest, row.updated_at, row.updated_by
    )


class SharedImps:
    """The ``imp_settings`` table: read, and changed only from the revision a change was made from."""

    def __init__(self, db: Database, clock: Clock | None = None) -> None:
        self.db = db
        self.clock = clock or SystemClock()

    def all(self) -> dict[str, Published]:
        return self.db.read(
            lambda conn: {row.name: _published(row) for row in conn.execute(select(imp_settings))}
        )

    def get(self, name: str) -> Published | None:
        def read(conn: Connection) -> Published | None:
            row = conn.execute(select(imp_settings).where(imp_settings.c.name == name)).first()
            return _published(row) if row is not None else None

        return self.db.read(read)

    def revisions(self) -> dict[str, int]:
        """Every imp's revision: what a running host polls (one small read)."""
        statement = select(imp_settings.c.name, imp_settings.c.revision)
        return self.db.read(lambda conn: {row.name: int(row.revision) for row in conn.execute(statement)})

    def publish(self, name: str, files: dict[str, str], *, base: int | None) -> Published:
        """``files`` as ``name``'s next revision, if the database is still at ``base`` (None: it has no such imp)."""
        if CONFIG_FILE not in files:
            raise ImpError(f"{name} has no {CONFIG_FILE} to publish")
        parse_config(
            files[CONFIG_FILE], f"imps/{name}/{CONFIG_FILE}", expected_name=name
        )  # never a broken one
        values = {"files": json.dumps(files, ensure_ascii=False), "digest": digest(files),
                  "updated_at": iso(self.clock.now()), "updated_by": who()}  # fmt: skip

        def write(conn: Connection) -> Published:
            current = conn.execute(select(imp_settings).where(imp_settings.c.name == name)).first()
            now_at = int(current.revision) if current is not None else None
            if now_at != base:
                raise _moved(name, base, current)
            if current is None:
                conn.execute(insert(imp_settings).values(name=name, revision=1, **values))
            else:
                conn.execute(
                    update(imp_settings)
                    .where(imp_settings.c.name == name)
                    .values(revision=now_at + 1, **values)  # type: ignore[operator]
                )
            row = conn.execute(select(imp_settings).where(imp_settings.c.name == name)).one()
            return _published(row)

        return self.db.write(write)

    def remove(self, name: str, *, base: int | None) -> bool:
        """Remove ``name`` if the database is still at ``base`` (None: remove whatever revision it has)."""

        def write(conn: Connection) -> bool:
            current = conn.execute(select(imp_settings).where(imp_settings.c.name == name)).first()
            if current is None:
                return False
            if base is not None and int(current.revision) != base:
                raise _moved(name, base, current)
            conn.execute(delete(imp_settings).where(imp_settings.c.name == name))
            return True

        return self.db.write(write)


def _moved(name: str, base: int | None, current: Any) -> ImpMoved:
    if current is None:
        return ImpMoved(f"imp {name} was removed from the database meanwhile: nothing was written")
    there = f"revision {current.revision} by {current.updated_by} at {current.updated_at}"
    if base is None:
        return ImpMoved(f"imp {name} already exists in the database ({there}): nothing was written")
    return ImpMoved(
        f"imp {name} changed in the database meanwhile ({there}; this change was made from revision {base}): "
        "nothing was written, try again"
    )


# ------------------------------------------------------------------ the home's working copy


@dataclass(frozen=True)
class Mark:
    revision: int
    digest: str


def read_mark(directory: Path) -> Mark | None:
    try:
        data = json.loads((directory / MARK).read_text(encoding="utf-8"))
        return Mark(int(data["revision"]), str(data["digest"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_mark(directory: Path, published: Published) -> None:
    _write(directory / MARK, json.dumps({"revision": published.revision, "digest": published.digest}) + "\n")


def _write(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.syncing")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def materialize(store: ImpStore, published: Published) -> None:
    """Write the database's revision into the home: its files (imp.toml last), the mark; settings files the
    revision no longer has are removed. The boxes' state and this home's own files stay."""
    directory = store.path(published.name)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    for stale in set(settings_files(directory)) - set(published.files):
        (directory / stale).unlink(missing_ok=True)
    for name, text in sorted(published.files.items(), key=lambda item: item[0] == CONFIG_FILE):
        if "/" in name or name.startswith("."):
            continue  # publish never writes such a name; a row written by hand is not followed out of the directory
        _write(directory / name, text)
    write_mark(directory, published)


def conflict_line(name: str, store: ImpStore, published: Published | None, why: str) -> str:
    there = (
        f"revision {published.revision} by {published.updated_by} at {published.updated_at}"
        if published
        else "none"
    )
    return (
        f"imp {name}: {why} (the database has {there}). Keep this home's: impyard imp apply -f "
        f"{store.config_path(name)}; take the database's: move {store.path(name)}/{CONFIG_FILE} away and run the "
        "command again"
    )


def sync_home(
    store: ImpStore, shared: SharedImps, *, on_conflict: Callable[[str], None] | None = None
) -> SyncReport:
    """Bring the home's imps and the database's into one (see the module's docstring). A conflict raises
    ``ImpConflict`` — or, with ``on_conflict``, is reported there and that imp left as it is (a running host)."""
    report = SyncReport()
    rows = shared.all()
    local = (
        {p.name for p in store.root.iterdir() if p.is_dir() and not p.name.startswith(".")}
        if store.root.is_dir()
        else set()
    )
    for name in sorted(local | set(rows)):
        try:
            try:
                _sync_one(store, shared, name, rows.get(name), report)
            except ImpMoved:  # another home published it at the same moment: judge again against its row
                _sync_one(store, shared, name, shared.get(name), report)
        except ImpConflict as exc:
            if on_conflict is None:
                raise
            on_conflict(str(exc))
    return report


def _sync_one(
    store: ImpStore, shared: SharedImps, name: str, row: Published | None, report: SyncReport
) -> None:
    directory = store.root / name
    has_config = (directory / CONFIG_FILE).is_file()
    mark = read_mark(directory) if directory.is_dir() else None
    files = settings_files(directory) if has_config else {}
    here = digest(files) if has_config else None
    if row is None:
        if not has_config:
            if mark is not None:
                (directory / MARK).unlink(missing_ok=True)
            return
        if mark is None:  # never published: an older home's imp, or files put here by hand
            try:
                published = shared.publish(name, files, base=None)
            except ImpConfigError as exc:
                log.warning(
                    "imp %s: not published, its imp.toml does not load: %s", name, str(exc).splitlines()[0]
                )
                return
            write_mark(directory, published)
            report.published.append(name)
            report.revisions[name] = published.revision
            return
        if here == mark.digest:  # removed elsewhere, unchanged here: removed here too (its state kept)
            with contextlib.suppress(ImpError):
                store.remove(name)
            (directory / MARK).unlink(missing_ok=True)
            report.removed.append(name)
            return
        raise ImpConflict(
            conflict_line(name, store, None, "it was changed here but removed from the database")
        )
    report.revisions[name] = row.revision
    if not has_config:
        materialize(store, row)
        report.updated.append(name)
        return
    if mark is None:
        if here == row.digest:
            write_mark(directory, row)
            return
        raise ImpConflict(conflict_line(name, store, row, "this home's files differ from the database's"))
    if mark.revision == row.revision:
        if here == mark.digest:
            return
        try:
            published = shared.publish(name, files, base=row.revision)
        except ImpConfigError as exc:
            log.warning(
                "imp %s: the change here is not published, its imp.toml does not load: %s",
                name,
                str(exc).splitlines()[0],
            )
            return
        write_mark(directory, published)
        report.published.append(name)
        report.revisions[name] = published.revision
        return
    if here == mark.digest and mark.revision < row.revision:
        materialize(store, row)
        report.updated.append(name)
        return
    why = (
        f"it was changed here since revision {mark.revision} and in the database since"
        if mark.revision < row.revision
        else f"this home's copy is of revision {mark.revision}, newer than the database's (a restored database?)"
    )
    raise ImpConflict(conflict_line(name, store, row, why))


def sync_with_database(store: ImpStore | None = None, db: Database | None = None) -> SyncReport:
    """``sync_home`` for this home and its database (opened for the call when ``db`` is None): what every host
    start and every ``impyard imp`` command does first, so that it reads what the database says."""
    from impyard.storage.db import open_database

    store = store or ImpStore()
    if db is not None:
        return sync_home(store, SharedImps(db))
    opened = open_database()
    try:
        return sync_home(store, SharedImps(opened))
    finally:
        opened.close()
