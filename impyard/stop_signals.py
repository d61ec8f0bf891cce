"""SIGINT and SIGTERM for the long-running commands (``impyard serve``, ``supervise``, ``console``; docs/hosts.md).

They are received from the first moment of the command's async life to its last: a signal never meets Python's
default action, which for SIGTERM kills the process where it stands (exit status -15: no grace for running work,
boxes and leases left behind, the health server never closed) and for SIGINT raises ``KeyboardInterrupt`` wherever
the event loop happens to be.

* Before the command is up, the first signal stops its start: what is starting is cancelled, and what started is
  undone on the way out (boxes closed, leases released, the health server closed), as every exit path of the
  start-up does. One warning line says that the signal came during start-up; the command then exits with the status
  of a stop after start-up (0). Blocking start-up work on a worker thread (``in_thread``, the database's ``run``) is
  waited for, never left running behind the stop: it ends by its own bounds (a query, a connect timeout), then the
  stop goes on.
* Once the command is up (``StopSignals.serving``), the first signal is its own stop (``first``: running work gets
  its grace), and a later one its ``again`` (stop now, where the command has one).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
from anyio.abc import TaskStatus

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

Handler = Callable[[str], None]  # told the signal's name (SIGTERM)


class StopSignals:
    """The stop requests of one long-running command, counted (``stop_signals`` makes one and receives them)."""

    def __init__(self, log: logging.Logger, starting: str) -> None:
        self.log = log
        self.starting = starting  # what the start-up is for, in words: "serving", "supervising"
        self.received = 0
        self.stopped_starting = False  # a signal stopped the start (the command never came up)
        self._life = (
            anyio.CancelScope()
        )  # the command's block: cancelled by a signal before it is up, or stop_now
        self._first: Handler | None = None
        self._again: Handler | None = None

    @property
    def up(self) -> bool:
        return self._first is not None

    def serving(self, first: Handler, again: Handler | None = None) -> bool:
        """The command is up: from now on the first signal calls ``first``, a later one ``again`` (None: it is
        noted, nothing more). False when a signal already stopped the start: the block is being cancelled."""
        if self.stopped_starting:
            return False
        self._first, self._again = first, again
        return True

    def stop_now(self) -> None:
        """Cancel the command's whole block (its exits still close what it opened, shielded where they wait)."""
        self._life.cancel()

    def request(self, name: str) -> None:
        """One SIGINT or SIGTERM (``name``)."""
        self.received += 1
        if self._first is None:
            if self.received == 1:
                self.stopped_starting = True
                self.log.warning(
                    "%s during start-up: stopping before %s; what started is closed", name, self.starting
                )
                self._life.cancel()
            else:
                self.log.warning("%s: already stopping", name)
        elif self.received == 1:
            self._first(name)
        elif self._again is not None:
            self._again(name)
        else:
            self.log.warning("%s: already stopping", name)

    async def receive(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Each SIGINT or SIGTERM is a request; started once the receiver is in place."""
        with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
            task_status.started()
            async for signum in signals:
                self.request(signal.Signals(signum).name)


@asynccontextmanager
async def stop_signals(log: logging.Logger, starting: str) -> AsyncIterator[StopSignals]:
    """SIGINT and SIGTERM received for the block, which runs the command from its start-up on: enter it before
    anything starts (the health server, a lock, a lease). A signal before ``serving`` cancels the block (and the
    block ends normally: the command exits as a stopped one); the receiver stays in place until the block's exits
    have run, so a signal while it closes is counted, never the default action."""
    stops = StopSignals(log, starting)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(stops.receive, name="stop signals")
            try:
                with stops._life:
                    yield stops
            finally:
                tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise sole_error(group) from None  # what the block raised, as it raised it (a DiscordSetupError)
    if stops.stopped_starting:
        log.info("stopped during start-up")


def sole_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception inside nested task-group wrappers (so a caller sees the DiscordSetupError, LeaseHeld or
    BoxError that was raised), else the group. Every long-running command's one unwrapping."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error
