"""``impyard serve``: the imps on Discord (and, with ``--supervise``, their scheduled work) in one process."""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack

import anyio
import click

from impyard.backends import BoxError
from impyard.cli.console import console_beside
from impyard.cli.errors import CliError
from impyard.cli.health import metrics_options
from impyard.console.server import DEFAULT_HOST as CONSOLE_HOST
from impyard.console.server import DEFAULT_PORT as CONSOLE_PORT
from impyard.discord.shards import SHARD_FORMAT, Shard, ShardError
from impyard.gateway.broker import UpstreamConfig
from impyard.gateway.policy import PolicyError
from impyard.imps.store import ImpError
from impyard.metrics.http import HealthPortError
from impyard.stop_signals import stop_signals
from impyard.storage.db import DatabaseError
from impyard.storage.instance import AlreadyRunning
from impyard.storage.leases import LeaseHeld, LeaseLost
from impyard.storage.shard_layout import LayoutHeld

NO_KEY = (
    "no model key is configured: export OPENAI_API_KEY=sk-... (and, for any OpenAI-compatible server, "
    "OPENAI_BASE_URL=http://host:port/v1), then run impyard serve again"
)


def parse_shard(ctx: click.Context, param: click.Parameter, value: str | None) -> Shard | None:
    """``--shard I/N`` → a Shard; a value Discord would refuse is a usage error naming the format."""
    if value is None:
        return None
    try:
        return Shard.parse(value)
    except ShardError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


HOST_LOGGERS = (
    "impyard.serve",
    "impyard.metrics",
    "impyard.discord",
    "impyard.posts",
    "impyard.supervisor",
    "impyard.tasks",
    "impyard.runtime",  # issue 36: a new revision of an imp's settings applied, or needing a restart
    "impyard.imps",
)


def configure_logs(as_json: bool) -> None:
    """What serve reports is the point of its output: INFO for the host's own loggers; JSON lines on request."""
    from impyard.discord.serve import JsonLogFormatter

    for name in HOST_LOGGERS:
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)
    if as_json:
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonLogFormatter())


@click.command("serve")
@click.argument("imps", nargs=-1)
@click.option(
    "--supervise", is_flag=True, help="Also run queued and scheduled tasks (what `impyard supervise` does)."
)
@click.option(
    "--backend", type=click.Choice(["auto", "docker", "process"]), default=None,
    help="Override the imps' [box] backend (process has no lockdown).",
)  # fmt: skip
@click.option(
    "--shard", "shard", metavar="I/N", callback=parse_shard,
    help=f"Serve one Discord shard: {SHARD_FORMAT}. Each host of N serves its own (DMs arrive on shard 0).",
)  # fmt: skip
@click.option("--log-json", is_flag=True, help="Log one JSON object per line (ts, level, logger, message).")
@metrics_options
@click.option(
    "--console", "with_console", is_flag=True,
    help="Also serve the operator's web console in this process (what `impyard console` does; docs/console.md).",
)  # fmt: skip
@click.option(
    "--console-host", default=CONSOLE_HOST, show_default=True, help="The console's address (with --console)."
)
@click.option(
    "--console-port", type=click.IntRange(0, 65535), default=CONSOLE_PORT, show_default=True,
    help="The console's port (with --console; 0: any free port).",
)  # fmt: skip
def serve_command(
    imps: tuple[str, ...],
    supervise: bool,
    backend: str | None,
    shard: Shard | None,
    log_json: bool,
    metrics_port: int | None,
    metrics_host: str,
    with_console: bool,
    console_host: str,
    console_port: int,
) -> None:
    """Run the imps' Discord bots: chat in channels and DMs, slash commands, approval cards.

    \b
    With no IMP, every imp whose Discord token is set is served (one bot each).
    One host per IMPYARD_HOME; SIGINT or SIGTERM stops it cleanly (running turns
    finish, every box is closed; a second one cuts them off), at any moment: one
    during start-up stops the start and closes what started. Exit status 0.
    The walkthrough is docs/discord.md.
    Several hosts split the servers as Discord shards, each with its own home:
    --shard 0/2 on one, --shard 1/2 on the other. A shard has one host at a
    time: a second host of the same shard on the same database is refused,
    naming the holder's host and pid (impyard hosts lists them). Every host
    of a database splits Discord the same way: one with another N, or one
    without --shard beside sharded hosts (or the reverse), is refused until
    every host of the layout in force stopped (docs/hosts.md).
    --metrics-port serves /metrics, /healthz and /readyz (docs/metrics.md).
    Example:
      export OPENAI_API_KEY=sk-...
      export IMPYARD_DISCORD_TOKEN_PIP=...
      impyard serve pip --supervise --metrics-port 9464
    """
    from impyard.discord.client import DiscordSetupError
    from impyard.discord.serve import serve

    if not UpstreamConfig.from_env().api_key:
        raise CliError(NO_KEY)
    configure_logs(log_json)

    async def run() -> None:
        # The signals are received before anything starts, the console included (impyard.stop_signals).
        async with (
            stop_signals(logging.getLogger("impyard.serve"), "serving") as signals,
            AsyncExitStack() as stack,
        ):
            if with_console:
                await stack.enter_async_context(console_beside(console_host, console_port))
            await serve(
                list(imps) or None,
                backend=backend,
                supervise=supervise,
                shard=shard,
                metrics_host=metrics_host,
                metrics_port=metrics_port,
                signals=signals,
            )

    try:
        anyio.run(run)
    except (
        DiscordSetupError, ImpError, PolicyError, DatabaseError, AlreadyRunning, BoxError, LeaseHeld, LeaseLost,
        HealthPortError, LayoutHeld,
    ) as exc:  # fmt: skip
        raise CliError(str(exc).splitlines()[0]) from exc
    except KeyboardInterrupt:
        pass
