"""How ``impyard chat`` stops (issue 38): the first Ctrl-C stops gently, the second stops now.

The first stop request (Ctrl-C on the prompt's empty line, or SIGINT / SIGTERM) cancels the chat's own work;
the boxes then close, and a running turn gets the session manager's grace to end (its reply is still shown).
The second cuts that grace: running turns are abandoned and their boxes killed at once. Later requests change
nothing. The signals are received from before the chat starts until after its boxes are closed (one before the
chat is up stops its start: what started is closed, and the chat exits 0), so a Ctrl-C never lands as a
``KeyboardInterrupt`` inside the event loop (which unwound the loop's tasks out of order and left
``RuntimeError: Attempted to exit a cancel scope…`` in chat.log).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable

import anyio
from anyio.abc import TaskStatus

log = logging.getLogger("impyard.chat")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _nothing(by_signal: bool) -> None:
    pass


class Stopping:
    """The chat's stop requests, counted. ``gently`` and ``now`` are what the running chat does for the first and
    the second (set once it runs; before that, ``run_chat``'s own: a request stops the start). Each
    is told whether a signal asked (the terminal echoed ``^C`` where the next line would start)."""

    def __init__(self) -> None:
        self.requests = 0
        self.gently: Callable[[bool], None] = _nothing
        self.now: Callable[[bool], None] = _nothing

    def request(self, *, by_signal: bool = False) -> None:
        self.requests += 1
        if self.requests == 1:
            self.gently(by_signal)
        elif self.requests == 2:
            self.now(by_signal)
        else:
            log.info("stop request %d: already stopping now", self.requests)

    def already_stopping(self) -> None:
        """The chat stops by itself (the person left and it waits for the running turn): that counts as the first
        request, so the next one stops now."""
        self.requests = max(self.requests, 1)

    def forget_handlers(self) -> None:
        """The chat is closed: a late request has nothing left to stop."""
        self.gently = self.now = _nothing

    async def receive_signals(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Each SIGINT or SIGTERM is a request; started once the handlers are in place."""
        with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
            task_status.started()
            async for signum in signals:
                log.info("received %s", signal.Signals(signum).name)
                self.request(by_signal=True)
