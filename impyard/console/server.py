"""Serving the console: an aiohttp site on one address, in the caller's event loop (``impyard console``, and
``impyard serve --console`` beside the Discord host)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
from aiohttp import web

from impyard.console.app import build_app
from impyard.console.auth import Keys, is_loopback
from impyard.console.context import ConsoleContext
from impyard.errors import ImpyardError

log = logging.getLogger("impyard.console")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8787


class ConsoleStartError(ImpyardError):
    """The console could not listen where it was asked to (one line for the operator)."""


@dataclass(frozen=True)
class ConsoleAddress:
    host: str
    port: int
    token: str

    @property
    def base(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def login_url(self) -> str:
        """The one line an operator opens: the address with the token (the Jupyter way)."""
        return f"{self.base}/?token={self.token}"


@asynccontextmanager
async def running_console(
    context: ConsoleContext, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, token: str
) -> AsyncIterator[ConsoleAddress]:
    """The console listening on ``host:port`` (port 0: a free one) until the block ends."""
    loopback = is_loopback(host)
    if not loopback:
        log.warning(
            "console: listening on %s, reachable from other machines over plain HTTP: the token travels "
            "unencrypted; put it behind a TLS proxy or keep it on loopback",
            host,
        )
    runner = web.AppRunner(build_app(context, Keys(token), loopback_only=loopback), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            raise ConsoleStartError(
                f"the console cannot listen on {host}:{port}: {exc.strerror or exc}"
            ) from exc
        bound = next((address[1] for address in runner.addresses if isinstance(address, tuple)), port)
        yield ConsoleAddress(host=host, port=int(bound), token=token)
    finally:
        with anyio.CancelScope(shield=True):  # closed on every path, a cancelled start's included
            await runner.cleanup()
