"""``open_supervisor``: the supervisor of this IMPYARD_HOME, on its own host or on the host of ``impyard serve``."""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import anyio

from impyard.clock import Clock
from impyard.conversation.spares import SparePool
from impyard.gateway.surfaces import SURFACE_LOG, Surface, TerminalSurface
from impyard.host import Host, open_host
from impyard.paths import home
from impyard.runtime import follow_imp_settings, imp_sync_s_from_env
from impyard.storage.instance import SUPERVISE_LOCK_FILENAME, InstanceLock
from impyard.supervisor.backends import BackendChooser, BackendFor
from impyard.supervisor.loop import Supervisor
from impyard.supervisor.settings import SupervisorSettings

log = logging.getLogger("impyard.supervisor")

TERMINAL_SURFACE_NOTICE = (
    "no chat surface is connected: task log posts are printed on this terminal, and posts into Discord "
    "channels are refused here (run tasks that post to Discord under `impyard serve --supervise`)"
)


@asynccontextmanager
async def open_supervisor(
    *,
    surface: Surface | None = None,
    clock: Clock | None = None,
    backend: str | None = None,
    backend_for: BackendFor | None = None,
    settings: SupervisorSettings | None = None,
    lock: bool | None = None,
    host: Host | None = None,
    spares: SparePool | None = None,
) -> AsyncIterator[Supervisor]:
    """The supervisor of this IMPYARD_HOME: its lock first (a second one refuses with the holder's pid), then
    its host. Standalone, it opens a host of its own that reaches only the task log (``surface``, else the
    terminal) and pumps its gates; given the ``host`` of ``impyard serve`` or ``impyard chat``, it shares that
    host's gateway and leaves the gates to that host's pump.

    ``lock`` defaults to whether it runs every kind: a supervisor limited to some kinds (``settings.kinds``,
    the departures of ``chat`` and ``serve``) runs beside the one that holds the lock.

    ``spares``: the spare boxes of the session manager of that host (issue 37), which its task runs claim where
    one of their imp waits. A standalone supervisor keeps none: its tasks start their own boxes, and it never
    leaves a box running between them (docs/tasks.md)."""
    if lock is None:
        lock = settings is None or settings.kinds is None
    instance = InstanceLock(home(), "supervise", SUPERVISE_LOCK_FILENAME)
    if lock:
        instance.__enter__()
    try:
        async with AsyncExitStack() as stack:
            own_pump = host is None
            if host is None:
                if surface is None:
                    log.warning(TERMINAL_SURFACE_NOTICE)
                    surface = TerminalSurface(sys.stdout)
                host = await stack.enter_async_context(
                    open_host(surface, reaches=(SURFACE_LOG,), clock=clock)
                )
                # Issue 36: new revisions of the imps' settings reach this home's files for the next task runs.
                follower = await stack.enter_async_context(anyio.create_task_group())
                follower.start_soon(
                    follow_imp_settings, host, None, imp_sync_s_from_env(), name="imp settings"
                )
                stack.callback(follower.cancel_scope.cancel)
            yield Supervisor(
                db=host.db, gateway=host.gateway, imps=host.imps,
                backend_for=backend_for or BackendChooser(host.imps, backend), clock=clock or host.clock,
                settings=settings, pump=host.pump if own_pump else None, spares=spares,
            )  # fmt: skip
    finally:
        if lock:
            instance.__exit__(None, None, None)
