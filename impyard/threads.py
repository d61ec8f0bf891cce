"""Blocking work that is not the database, off the event loop (docs/storage.md, "Where a store function runs").

The database has its own threads and its own two ways in (``await db.run(fn, ...)``, ``await db.quick(fn, ...)``,
impyard.storage.db). Everything else that blocks — the Docker SDK, a scan of /proc or of a directory tree,
removing files, reading an imp's config, opening a database before there is one — goes through ``in_thread``,
typed like the database's: ``await in_thread(backend.kill_by_name, name)``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import ParamSpec, TypeVar

import anyio

P = ParamSpec("P")
T = TypeVar("T")


async def in_thread(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` on one of anyio's worker threads; its result. A caller cancelled meanwhile waits
    for ``fn`` to return, then is cancelled (nothing runs on behind its back)."""
    return await anyio.to_thread.run_sync(partial(fn, *args, **kwargs))


async def in_thread_abandoned_on_cancel(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``in_thread`` for a read that may take long and changes nothing (a measure of a directory tree): a caller
    cancelled meanwhile returns at once and the thread's result is dropped."""
    return await anyio.to_thread.run_sync(partial(fn, *args, **kwargs), abandon_on_cancel=True)
