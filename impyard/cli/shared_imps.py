"""The CLI's side of the imps' shared settings (issue 36; impyard.imps.shared): every ``impyard imp`` command reads
what the database says, and what it changes goes there as the next revision."""

from __future__ import annotations

import logging

import click

from impyard.cli.database import open_or_fail
from impyard.cli.errors import CliError
from impyard.imps.config import ImpError
from impyard.imps.shared import MARK, SharedImps, SyncReport, read_mark, sync_home
from impyard.imps.store import ImpStore
from impyard.storage import urls

log = logging.getLogger("impyard.imps")


def database_exists() -> bool:
    """Whether this home has a database to share settings through: a PostgreSQL server named, or a SQLite file
    already made (a command that reads or refuses never creates one)."""
    try:
        url = urls.from_env()
    except urls.DatabaseUrlError as exc:
        raise CliError(str(exc)) from exc
    return url.dialect != "sqlite" or (url.path is not None and url.path.exists())


def bring_up_to_date(store: ImpStore | None = None) -> SyncReport:
    """This home's imps as the database has them, this home's own changes sent up; what changed is said on
    stderr. A conflict is a one-line error (nothing written)."""
    store = store or ImpStore()
    if not database_exists():
        return SyncReport()  # a home with no database yet shares nothing: its first host publishes its imps
    db = open_or_fail()
    try:
        report = sync_home(store, SharedImps(db))
    except ImpError as exc:
        raise CliError(str(exc).splitlines()[0]) from exc
    finally:
        db.close()
    for name in report.published:
        log.info("imp %s: this home's change published as revision %s", name, report.revisions.get(name))
    for line in report.lines(published=False):
        click.echo(line, err=True)  # what changed here under the operator's eyes
    return report


def published_revision(store: ImpStore, name: str) -> int | None:
    """Send this home's change of ``name`` up (after ``imp add``, ``set``, ``edit``, ``apply``): its new revision
    (None: the home has no database yet; its first host publishes it)."""
    report = bring_up_to_date(store)
    return report.revisions.get(name)


def saved_line(file: object, revision: int | None) -> str:
    """What ``imp set``/``edit`` say once a change is saved."""
    if revision is None:
        return f"Saved {file}. The first host started on this home shares it with every host of its database."
    return (
        f"Saved {file} as revision {revision}: every host serving from this database picks it up for the imp's "
        "next boxes (within IMPYARD_IMP_SYNC_S, 10 s)."
    )


def remove_shared(store: ImpStore, name: str) -> None:
    """Remove ``name`` from the database (from the revision this home has: a change made elsewhere meanwhile
    refuses it), then the home's mark, before its files go."""
    directory = store.path(name)
    if not database_exists():
        return
    mark = read_mark(directory)
    db = open_or_fail()
    try:
        SharedImps(db).remove(name, base=mark.revision if mark is not None else None)
    except ImpError as exc:
        raise CliError(str(exc).splitlines()[0]) from exc
    finally:
        db.close()
    (directory / MARK).unlink(missing_ok=True)
