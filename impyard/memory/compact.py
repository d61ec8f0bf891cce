"""The store shrinks on disk after forgetting (issue 15): ``VACUUM`` when it pays.

Deleting rows leaves their pages on SQLite's free list; the file keeps its size. After a night's forgetting
the host compacts the database when more than a quarter of its pages are free (``pays``, the pure rule),
outside any transaction, then truncates the write-ahead log so the file on disk shrinks too. A busy database
(another process in a long transaction) is left for the next night: compaction is never worth a failure.

On PostgreSQL there is nothing to do: its autovacuum reuses the space of deleted rows, and a full ``VACUUM``
of a database several hosts share is the operator's to schedule, not a night's.
"""

from __future__ import annotations

import logging
import sqlite3

from impyard.storage.db import Database

log = logging.getLogger("impyard.memory")

FREE_SHARE = 0.25  # more than this share of free pages and a VACUUM pays for itself


def pays(free_pages: int, pages: int, share: float = FREE_SHARE) -> bool:
    """Whether compacting a file of ``pages`` pages, ``free_pages`` of them free, is worth it."""
    return pages > 0 and free_pages > share * pages


def compact(db: Database) -> bool:
    """VACUUM the host database when it pays (blocking; on a database worker thread); whether it did."""
    if db.dialect != "sqlite":
        return False
    # VACUUM runs outside any transaction: on the driver's connection (autocommit), not in ``db.write``.
    conn = db.engine.raw_connection()
    try:
        free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
        pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
        if not pays(free, pages):
            return False
        try:
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.OperationalError as exc:  # busy or locked: the next night tries again
            log.warning("the database was not compacted (%s); the next night tries again", exc)
            return False
    finally:
        conn.close()
    log.info("compacted the database: %d of %d pages were free", free, pages)
    return True
