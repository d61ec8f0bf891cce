"""``impyard discord``: the imps' bots — slash-command sync (explicit, never on start) and the invite link."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import click

from impyard.cli.errors import CliError
from impyard.imps.store import ImpConfig, ImpError, ImpStore

if TYPE_CHECKING:
    import discord

# What an imp's bot needs in a server (docs/discord.md): read and answer, in threads too, with files.
BOT_PERMISSION_NAMES = (
    "view_channel", "send_messages", "send_messages_in_threads", "read_message_history", "attach_files",
    "use_application_commands",
)  # fmt: skip
SCOPES = ("bot", "applications.commands")


def bot_permissions() -> discord.Permissions:
    import discord

    return discord.Permissions(**dict.fromkeys(BOT_PERMISSION_NAMES, True))


def _imps(store: ImpStore, name: str | None) -> list[ImpConfig]:
    from impyard.discord.serve import pick_imps

    return pick_imps(store, [name] if name else None)


async def sync_commands(configs: list[ImpConfig], guild_id: int | None) -> list[tuple[str, list[str]]]:
    """Log each bot in (REST only) and put its command tree: to one guild, or globally."""
    import discord

    from impyard.discord.client import DiscordSettings, ImpClient

    settings = DiscordSettings.from_env()
    settings.apply()
    store = ImpStore()
    done = []
    for config in configs:
        client = ImpClient(config, settings)
        try:
            await client.login_checked(store.discord_token(config), config.token_source())
            if guild_id is not None:
                guild = discord.Object(guild_id)
                client.tree.copy_global_to(guild=guild)
                synced = await client.tree.sync(guild=guild)
            else:
                synced = await client.tree.sync()
        except discord.HTTPException as exc:
            raise CliError(f"Discord refused the commands of {config.name}: {exc}") from None
        finally:
            await client.close()
        done.append((config.name, [command.name for command in synced]))
    return done


@click.group("discord")
def discord_group() -> None:
    """The imps' Discord bots: command sync and invite links (the walkthrough: docs/discord.md).

    \b
    Example:
      impyard discord invite pip
      impyard discord sync pip
    """


@discord_group.command("sync")
@click.argument("imp", required=False)
@click.option(
    "--guild", "guild", metavar="ID", help="Sync to one server (instant) instead of globally (up to an hour)."
)
def sync_command(imp: str | None, guild: str | None) -> None:
    """Register the slash commands (/channel, /approvals, /forget-me) of one imp's bot, or of every bot with a token.

    \b
    Run it once after creating the bot and after upgrading impyard; `impyard serve`
    never syncs by itself.
    Example:
      impyard discord sync pip --guild 123456789012345678
    """
    from impyard.discord.client import DiscordSetupError

    if guild is not None and not (guild.isdigit() and len(guild) <= 20):
        raise CliError(
            f"--guild takes a server id (digits; Developer Mode → right-click the server → Copy Server ID), not {guild!r}"
        )
    try:
        configs = _imps(ImpStore(), imp)
        results = anyio.run(sync_commands, configs, int(guild) if guild else None)
    except (DiscordSetupError, ImpError) as exc:
        raise CliError(str(exc).splitlines()[0]) from exc
    where = f"server {guild}" if guild else "every server (global commands can take up to an hour to appear)"
    for name, commands in results:
        click.echo(f"{name}: synced {', '.join('/' + c for c in commands)} to {where}")


@discord_group.command("invite")
@click.argument("imp", required=False)
def invite_command(imp: str | None) -> None:
    """Print the link that adds an imp's bot to a server, with the scopes and permissions it needs.

    \b
    Uses [discord] application_id from imp.toml, else logs the bot in to ask Discord.
    Example:
      impyard discord invite pip
    """
    import discord

    from impyard.discord.client import DiscordSettings, DiscordSetupError, ImpClient

    store = ImpStore()
    try:
        configs = [store.get(imp)] if imp else store.all_configs()
    except ImpError as exc:
        raise CliError(str(exc).splitlines()[0]) from exc
    if not configs:
        raise CliError("there are no imps yet: impyard imp add pip")

    async def application_id(config: ImpConfig) -> int:
        if config.discord.application_id:
            return int(config.discord.application_id)
        settings = DiscordSettings.from_env()
        settings.apply()
        client = ImpClient(config, settings)
        try:
            await client.login_checked(store.discord_token(config), config.token_source())
            assert client.application_id is not None
            return client.application_id
        finally:
            await client.close()

    for config in configs:
        try:
            app_id = anyio.run(application_id, config)
        except DiscordSetupError as exc:
            raise CliError(f"{exc} (or set [discord] application_id in imp.toml)".splitlines()[0]) from exc
        url = discord.utils.oauth_url(app_id, permissions=bot_permissions(), scopes=SCOPES)
        click.echo(f"{config.name}: {url}")
