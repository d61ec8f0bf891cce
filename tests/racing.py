"""Two real processes racing on one database (issue 21, "Exactly once across hosts"): the harness the store
tests share. Each worker is a fresh interpreter (``spawn``) that opens the same database — the SQLite file or the
PostgreSQL URL — and, for each item it is told, meets the other at a barrier, acts, and answers on ``results``."""

from __future__ import annotations

import multiprocessing
import queue
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from impyard.storage.db import Database, open_database

RACE_ROUNDS = 50  # items raced per test: enough that the two processes overlap in some of them
RACE_WAIT_S = 60.0  # how long the test waits for a worker's answer before it is a failure


def reopen_args(db: Database) -> dict[str, Any]:
    """How another process opens the same database (the URL holds the test server's password)."""
    if db.url.path is not None:
        return {"path": str(db.url.path)}
    return {"url": db.url.url.render_as_string(hide_password=False)}


def reopen(where: dict[str, Any]) -> Database:
    """The database ``reopen_args`` described, opened in the worker."""
    path = where.get("path")
    return open_database(None if path is None else Path(path), url=where.get("url"))


@contextmanager
def two_racers(worker: Callable[..., None], db: Database) -> Iterator[tuple[list[Any], Any]]:
    """Two ``worker(where, inbox, results, barrier)`` processes on ``db``; yields (their inboxes, the results).
    Each inbox gets ``None`` at the end; a worker that does not stop is killed."""
    context = multiprocessing.get_context("spawn")  # fresh interpreters: nothing of this process is shared
    barrier, results = context.Barrier(2), context.Queue()
    inboxes = [context.Queue(), context.Queue()]
    workers = [
        context.Process(target=worker, args=(reopen_args(db), inbox, results, barrier)) for inbox in inboxes
    ]
    for process in workers:
        process.start()
    try:
        yield inboxes, results
    finally:
        for inbox in inboxes:
            inbox.put(None)
        for process in workers:
            process.join(timeout=RACE_WAIT_S)
            if process.is_alive():
                process.kill()


def race(inboxes: list[Any], results: Any, item: object) -> list[Any]:
    """Tell both racers of ``item``; their two answers (a racer that died or hung fails the test)."""
    for inbox in inboxes:
        inbox.put(item)
    try:
        return [results.get(timeout=RACE_WAIT_S) for _ in inboxes]
    except queue.Empty:
        pytest.fail("a racing process did not answer (it died or hung)")
