"""``/metrics``, ``/healthz`` and ``/readyz`` over HTTP (docs/metrics.md): a small aiohttp server a long-running
process opens before anything else, so that ``/healthz`` answers while it starts and ``/readyz`` says when it is
ready.

For another part (``impyard console --metrics-port``, ``serve``, ``supervise``)::

    from impyard.metrics.http import ReadyCheck, serve_health

    checks = [ReadyCheck("database", database_ready(db))]      # more may be appended while it runs
    async with serve_health("127.0.0.1", port, checks) as bound_port:
        ...                                                   # port 0: an ephemeral port, bound_port says which

* ``/metrics``: the process's registry (``impyard.metrics.registry``) in Prometheus' text format.
* ``/healthz``: 200 ``ok`` while the process runs (the event loop answers).
* ``/readyz``: 200 ``ready`` when every check passes; else 503, one line per failing check: ``name: reason``.

``checks`` is read at each request: a caller appends a part's checks as that part comes up (the lease once it is
held, the Discord connection once it is opened). A check is an async callable that returns None when it passes and
one line saying why when it does not; it gets ``CHECK_TIMEOUT_S`` (a check that takes longer fails, saying so), and
what it raises fails it with the error's type and first line. Loopback by default: a port on every interface is
the caller's choice (``--metrics-host 0.0.0.0``), never a default. A port already in use is ``HealthPortError``,
one line.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
from aiohttp import web

from impyard.errors import ImpyardError
from impyard.metrics.registry import exposition

log = logging.getLogger("impyard.metrics")

DEFAULT_HOST = "127.0.0.1"  # loopback: what the process knows is not for the network unless asked
CHECK_TIMEOUT_S = 5.0  # a readiness check that takes longer fails: a probe must answer fast
MAX_REASON_CHARS = 300
CONTENT_TYPE_LATEST = "text/plain; version=0.0.4; charset=utf-8"


class HealthPortError(ImpyardError):
    """The metrics port could not be opened (in use, not allowed): one line with the fix."""


@dataclass(frozen=True)
class ReadyCheck:
    """One readiness rule: its name (``database``, ``lease``, ``discord:pip``) and an async callable that answers
    None when it holds, or one line saying why not."""

    name: str
    check: Callable[[], Awaitable[str | None]]


class Phase:
    """The process's own readiness rule (``phase.check``): ``starting`` until it says ``ready()``, ``stopping``
    once it says ``stopping()``; the checks of its parts come beside it."""

    def __init__(self, starting: str = "starting") -> None:
        self.reason: str | None = starting

    def ready(self) -> None:
        self.reason = None

    def stopping(self, why: str = "stopping") -> None:
        self.reason = why

    @property
    def check(self) -> ReadyCheck:
        async def answer() -> str | None:
            return self.reason

        return ReadyCheck("process", answer)


def one_line(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else "failed"
    return first[:MAX_REASON_CHARS]


async def failing(checks: Sequence[ReadyCheck]) -> list[str]:
    """``name: reason`` of every check that fails now, in their order; each within ``CHECK_TIMEOUT_S``."""
    failed: list[str] = []
    for check in list(checks):
        try:
            with anyio.fail_after(CHECK_TIMEOUT_S):
                reason = await check.check()
        except TimeoutError:
            reason = f"no answer within {CHECK_TIMEOUT_S:g} s"
        except Exception as exc:  # noqa: BLE001 - a broken check is a failing check, never a broken probe
            reason = f"{type(exc).__name__}: {exc}"
        if reason is not None:
            failed.append(f"{check.name}: {one_line(reason)}")
    return failed


def health_app(checks: Sequence[ReadyCheck]) -> web.Application:
    """The three endpoints over ``checks`` (read at each request)."""

    async def metrics(request: web.Request) -> web.Response:
        # On the loop, not a thread: the gauges read the live parts (sessions, leases) the loop changes; a scrape
        # is a few milliseconds of formatting.
        body = exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        failed = await failing(checks)
        if failed:
            return web.Response(status=503, text="".join(f"{line}\n" for line in failed))
        return web.Response(text="ready\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


def _port_error(host: str, port: int, exc: OSError) -> HealthPortError:
    if exc.errno == errno.EADDRINUSE:
        return HealthPortError(
            f"the metrics port {host}:{port} is in use: give another with --metrics-port (0 picks a free one)"
        )
    if exc.errno == errno.EACCES:
        return HealthPortError(f"the metrics port {host}:{port} is not allowed here: use a port above 1023")
    return HealthPortError(f"could not open the metrics port {host}:{port}: {exc.strerror or exc}")


@asynccontextmanager
async def serve_health(host: str | None, port: int, checks: Sequence[ReadyCheck] = ()) -> AsyncIterator[int]:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``host:port`` for the block (``host`` None: loopback);
    yields the port bound (``port`` 0: an ephemeral one). Closed when the block ends, on every path."""
    host = host or DEFAULT_HOST
    runner = web.AppRunner(health_app(checks), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, reuse_address=False)
        try:
            await site.start()
        except OSError as exc:
            raise _port_error(host, port, exc) from None
        bound = port
        server = site._server  # aiohttp keeps the listening sockets there; the port bound is read off them
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            bound = int(sockets[0].getsockname()[1])
        log.info("metrics and health on http://%s:%d/metrics (/healthz, /readyz)", _shown(host), bound)
        yield bound
    finally:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()


def _shown(host: str) -> str:
    return f"[{host}]" if ":" in host else host
