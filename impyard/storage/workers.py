"""The database's worker threads (issue 18): where blocking database work runs, off the event loop.

One pool for the process, shared by every ``Database`` (each keeps its own connection per thread). A call goes to
an idle thread through a queue and its result comes back with one wakeup of the loop: about half what a
general-purpose thread hop costs, paid about a dozen times a turn. A thread is added only while every one is busy,
so a long transaction never holds up the next call. ``Database.run`` is the way in (docs/storage.md); work that is
not the database's goes through ``impyard.threads`` instead.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio

MAX_WORKERS = 16  # database worker threads at most: a new one only while every one is busy

T = TypeVar("T")


class _Job:
    """One call on a worker thread, and its way back to the event loop."""

    __slots__ = ("loop", "done", "context", "fn", "result", "error", "finished", "after")

    def __init__(self, loop: asyncio.AbstractEventLoop, fn: Callable[[], Any]) -> None:
        self.loop = loop
        self.done: asyncio.Future[None] = loop.create_future()
        self.context = contextvars.copy_context()
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None
        self.finished = False
        self.after: asyncio.Future[None] | None = None  # set when the caller was cancelled while it ran

    def __call__(self) -> None:  # on the worker thread
        try:
            self.result = self.context.run(self.fn)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, raised there
            self.error = exc
        try:
            self.loop.call_soon_threadsafe(self._settle)
        except RuntimeError:
            pass  # the loop is closed: nobody is waiting any more

    def _settle(self) -> None:  # on the event loop
        self.finished = True
        for future in (self.done, self.after):
            if future is not None and not future.done():
                future.set_result(None)


class _Workers:
    """The worker threads and their queue of jobs."""

    def __init__(self, limit: int = MAX_WORKERS) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._idle = (
            0  # workers done with a job and waiting for the next (a plain count: a Semaphore is Python)
        )
        self._lock = threading.Lock()
        self._limit = limit
        self.started = 0

    def submit(self, job: _Job) -> None:
        self._jobs.put(job)
        with self._lock:
            if self._idle:
                self._idle -= 1
                return  # an idle worker takes it
            if self.started < self._limit:
                self.started += 1
                threading.Thread(target=self._work, name=f"impyard-db-{self.started}", daemon=True).start()

    def _work(self) -> None:
        # A database's engine connection is kept on this thread between transactions (``Database._connect``).
        _THREAD.is_worker = True
        while True:
            self._jobs.get()()
            with self._lock:
                self._idle += 1


_WORKERS = _Workers()
_THREAD = threading.local()


def on_a_worker() -> bool:
    """Whether this thread is one of the database's workers."""
    return bool(getattr(_THREAD, "is_worker", False))


async def call(fn: Callable[[], T]) -> T:
    """``fn()`` on a worker thread, its result (or its exception) back on the event loop.

    A caller cancelled meanwhile still waits for the work to end (its transaction is committed or rolled back,
    never left running behind it), then is cancelled."""
    job = _Job(asyncio.get_running_loop(), fn)
    _WORKERS.submit(job)
    try:
        await job.done
    except BaseException:
        if not job.finished:
            job.after = job.loop.create_future()
            with anyio.CancelScope(shield=True):
                await job.after
        raise
    if job.error is not None:
        raise job.error
    result: T = job.result
    return result


def start(fn: Callable[[], object]) -> None:
    """``fn()`` on a worker thread, awaited by no one (a WAL checkpoint): it must catch its own failures."""
    _WORKERS.submit(_Job(asyncio.get_running_loop(), fn))
