"""``impyard console``: the operator's web console on loopback (issue 34; docs/console.md)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import click

from impyard.cli.database import open_or_fail
from impyard.cli.errors import CliError
from impyard.cli.health import metrics_options
from impyard.cli.shared_imps import bring_up_to_date
from impyard.clock import SystemClock
from impyard.console.auth import TOKEN_ENV, TokenError, new_token, token_from_env
from impyard.console.context import ConsoleContext
from impyard.console.server import DEFAULT_HOST, DEFAULT_PORT, ConsoleStartError, running_console
from impyard.metrics.http import HealthPortError, Phase, ReadyCheck, serve_health
from impyard.stop_signals import stop_signals
from impyard.storage.readiness import database_check
from impyard.threads import in_thread

log = logging.getLogger("impyard.console")


@asynccontextmanager
async def console_beside(host: str, port: int) -> AsyncIterator[ConsoleContext]:
    """The console in this process (``impyard console``, and ``impyard serve --console`` beside the Discord host) on
    its own connection to this home's database, listening until the block ends; its address is printed first."""
    try:
        token = token_from_env() or new_token()
    except TokenError as exc:
        raise CliError(str(exc)) from exc
    db = open_or_fail()
    try:
        context = ConsoleContext(db=db, clock=SystemClock())
        try:
            async with running_console(context, host=host, port=port, token=token) as address:
                click.echo(f"impyard console: {address.login_url}")
                yield context
        except ConsoleStartError as exc:
            raise CliError(str(exc)) from exc
    finally:
        db.close()


async def _serve_until_stopped(host: str, port: int, metrics_host: str, metrics_port: int | None) -> None:
    """Until SIGINT/SIGTERM, received from before anything starts (``impyard.stop_signals``): one that arrives
    while the console starts stops the start, and what started is closed."""
    phase = Phase("starting: the console is not listening yet")
    checks: list[ReadyCheck] = [phase.check]
    async with stop_signals(log, "serving the console") as signals:
        await in_thread(bring_up_to_date)  # issue 36: the Imps page shows the imps as the database has them
        async with AsyncExitStack() as health:
            if metrics_port is not None:
                await health.enter_async_context(serve_health(metrics_host, metrics_port, checks))
            async with console_beside(host, port) as context:
                checks.append(database_check(context.db))
                phase.ready()
                click.echo("  (open it in a browser; Ctrl-C stops the console)", err=True)
                stopped = anyio.Event()
                signals.serving(lambda name: stopped.set())
                await stopped.wait()
                phase.stopping()


@click.command("console")
@click.option(
    "--host", default=DEFAULT_HOST, show_default=True, help="Address to listen on (loopback by default)."
)
@click.option(
    "--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
    help="Port to listen on (0: any free port; the printed address names it).",
)  # fmt: skip
@metrics_options
def console_command(host: str, port: int, metrics_port: int | None, metrics_host: str) -> None:
    """Serve the operator's web console for this home's database: imps, turns now, approvals, budget, audit,
    memory and hosts, in a browser.

    \b
    It prints one address with a login token (a new one each start, or
    IMPYARD_CONSOLE_TOKEN): without it no page shows anything. Run it beside
    `impyard chat`, `serve` or `supervise` on the same home or database.
    Every change it makes goes through the same rules as the CLI.
    Ctrl-C (SIGINT) or SIGTERM stops it, at any moment, its start included.
    Example:
      impyard console
      impyard console --port 9000
    """
    try:
        anyio.run(_serve_until_stopped, host, port, metrics_host, metrics_port)
    except HealthPortError as exc:
        raise CliError(str(exc)) from exc
    except KeyboardInterrupt:
        pass


__all__ = ["TOKEN_ENV", "console_command"]
