"""What a long-running process's ``/readyz`` asks of its storage (docs/metrics.md): that its database answers a
trivial query, and that it still holds its leases.

Each is a ``ReadyCheck`` (``impyard.metrics.http``) for ``serve_health``: None while it holds, one line otherwise.
"""

from __future__ import annotations

from impyard.metrics.http import ReadyCheck
from impyard.storage import faults as storage_faults
from impyard.storage.db import Database
from impyard.storage.leases import LeaseKeeper
from impyard.threads import in_thread_abandoned_on_cancel


def _answers(db: Database) -> str | None:
    """Blocking: why ``db`` does not answer ``SELECT 1`` now, or None. A SQLite file removed from under the
    process is gone, whatever its open connections still read."""
    if db.closed:
        return f"{db.url.where()} is closed"
    if db.dialect == "sqlite" and not db.path.exists():
        return f"{db.url.where()} is gone (the file was removed)"
    with db.engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")
    return None


def database_check(db: Database, name: str = "database") -> ReadyCheck:
    """The database answers a trivial query (off the event loop; a probe that gives up leaves it behind)."""

    async def check() -> str | None:
        try:
            return await in_thread_abandoned_on_cancel(_answers, db)
        except Exception as exc:  # noqa: BLE001 - any failure of the query is the reason, in words
            return storage_faults.describe(exc, db.url.where())

    return ReadyCheck(name, check)


def lease_check(keeper: LeaseKeeper, name: str = "lease") -> ReadyCheck:
    """The process still holds every lease it holds for its life (its shard's, its own record): none lost,
    none past its local deadline (``LeaseKeeper.check``)."""

    async def check() -> str | None:
        return keeper.check()

    return ReadyCheck(name, check)
