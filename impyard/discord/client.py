"""One discord.py client per imp (each imp is its own bot application), and how it finds Discord.

The token is read on the host (``ImpStore.discord_token``) and handed to discord.py only; it is never
logged, never put in an error message, never sent to a box. ``IMPYARD_DISCORD_API_BASE`` points the
client at another Discord (the loopback fake in tests): REST through ``discord.http.Route.BASE``, and
the gateway URL asked from that API (``GET /gateway/bot``) after login, because a plain
``discord.Client`` would otherwise connect to Discord's own gateway.

Intents (docs/discord.md, step 1): guilds, guild and DM messages, and message reactions (ENV-13) are ordinary;
``message_content`` is privileged. ``mention`` mode works without it (Discord still sends the text of
messages that mention the bot, and of DMs); ``all`` mode needs it. When the application has not
switched it on in the Developer Portal, the imp connects without it and the operator is told what that
costs and how to fix it.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import discord
import yarl
from discord import app_commands

from impyard.discord.inbound import forget_deleted
from impyard.discord.shards import Shard, shard_of
from impyard.errors import ImpyardError
from impyard.imps.store import ImpConfig

if TYPE_CHECKING:
    from impyard.discord.approval_cards import ApprovalCards
    from impyard.discord.commands import CommandHost

log = logging.getLogger("impyard.discord")

API_BASE_ENV = "IMPYARD_DISCORD_API_BASE"
GUILD_READY_TIMEOUT_ENV = "IMPYARD_DISCORD_GUILD_READY_TIMEOUT"
DEFAULT_GUILD_READY_TIMEOUT_S = 2.0  # discord.py's own default: the wait for the GUILD_CREATE stream to end
MAX_RATELIMIT_WAIT_S = 60.0  # a longer 429 is raised to our retry loop instead of sleeping inside discord.py
PORTAL = "https://discord.com/developers/applications"

MESSAGE_CONTENT_WHY = (
    "message_content (privileged) lets the imp read every message in `all`-mode channels; without it, "
    "Discord sends only the text of messages that mention the bot, replies to it and DMs, so only "
    "`mention` mode works"
)


class DiscordSetupError(ImpyardError):
    """The Discord side cannot start (a missing or rejected token, refused intents); the message says the fix."""


@dataclass(frozen=True)
class DiscordSettings:
    """Operator settings of the Discord surface (environment)."""

    api_base: str | None = (
        None  # IMPYARD_DISCORD_API_BASE, e.g. http://127.0.0.1:8080/api/v10 (default: Discord)
    )
    guild_ready_timeout_s: float = DEFAULT_GUILD_READY_TIMEOUT_S

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> DiscordSettings:
        env = os.environ if environ is None else environ
        base = env.get(API_BASE_ENV, "").strip().rstrip("/") or None
        if base is not None and not base.startswith(("http://", "https://")):
            raise DiscordSetupError(
                f"{API_BASE_ENV} must be an http(s) URL such as https://discord.com/api/v10 (got {base!r})"
            )
        raw = env.get(GUILD_READY_TIMEOUT_ENV, "").strip()
        timeout = DEFAULT_GUILD_READY_TIMEOUT_S
        if raw:
            try:
                timeout = float(raw)
            except ValueError:
                timeout = -1.0
            if not 0 <= timeout <= 60:
                raise DiscordSetupError(
                    f"{GUILD_READY_TIMEOUT_ENV} must be seconds from 0 to 60 (got {raw!r})"
                )
        return cls(api_base=base, guild_ready_timeout_s=timeout)

    def apply(self) -> None:
        """Point discord.py's REST at the configured API (a process-wide class attribute, read per request)."""
        if self.api_base is not None:
            discord.http.Route.BASE = self.api_base


def wanted_intents(*, message_content: bool = True) -> discord.Intents:
    intents = discord.Intents.none()
    intents.guilds = True  # channels, threads, roles: what a message's channel and the bot's own role are
    intents.guild_messages = True
    intents.dm_messages = True
    intents.guild_reactions = True  # ENV-13: reaction clears reach the box
    intents.dm_reactions = True
    intents.message_content = message_content
    return intents


def describe_intents(intents: discord.Intents) -> str:
    return ", ".join(name for name, on in intents if on)


class ImpClient(discord.Client):
    """The bot of one imp: its command tree, its approval buttons, its inbound queue."""

    def __init__(
        self, config: ImpConfig, settings: DiscordSettings, *, shard: Shard | None = None, **options: Any
    ) -> None:
        discord.VoiceClient.warn_nacl = discord.VoiceClient.warn_dave = (
            False  # imps have no voice: no warning about it
        )
        if config.discord.application_id:  # else discord.py learns it at login
            options["application_id"] = int(config.discord.application_id)
        if shard is not None:  # IDENTIFY carries [id, count]; unsharded, it carries no shard at all
            options.update(shard_id=shard.id, shard_count=shard.count)
        super().__init__(
            intents=wanted_intents(),
            guild_ready_timeout=settings.guild_ready_timeout_s,
            max_ratelimit_timeout=MAX_RATELIMIT_WAIT_S,
            allowed_mentions=discord.AllowedMentions(
                everyone=False, roles=False, users=True, replied_user=True
            ),
            **options,
        )
        self.imp = config.name
        self.config = config
        self.settings = settings
        self.shard = shard
        from impyard.discord.commands import build_tree  # the tree's callbacks need this class

        self.tree: app_commands.CommandTree[ImpClient] = build_tree(self)
        self.host: CommandHost | None = None  # set by `impyard serve`: what commands and buttons act on
        self.cards: ApprovalCards | None = None
        self.bridge: Bridge | None = None  # set by `impyard serve`: where gateway events go
        self.off_shard: Counter[str] = (
            Counter()
        )  # issue 36: events of another shard's servers, dropped, by kind

    async def close(self) -> None:
        """Close the connection, first cancelling the READY discord.py may still be holding back (its guild-ready
        timeout): announced after the close, it would find the client's loop gone and fail in its own task."""
        ready = self._connection._ready_task
        if ready is not None:
            ready.cancel()
        await super().close()

    async def login_checked(self, token: str | None, source: str) -> None:
        """Log in (REST only) with a clear error for a missing or rejected token; then settle the intents."""
        if not token:
            raise DiscordSetupError(
                f"imp {self.imp} has no Discord token ({source} is not set): create a bot at {PORTAL}, copy its token, "
                f"then set it (see docs/discord.md, step 2)"
            )
        try:
            await self.login(token)
        except discord.LoginFailure:
            await self.close()
            raise DiscordSetupError(
                f"Discord rejected the token of imp {self.imp} (from {source}): reset it at {PORTAL} → your app → Bot → "
                "Reset Token, and set the new one"
            ) from None
        except (discord.HTTPException, OSError) as exc:
            await self.close()
            raise DiscordSetupError(f"could not reach Discord to log in imp {self.imp}: {exc}") from None
        flags = self.application_flags
        if not (flags.gateway_message_content or flags.gateway_message_content_limited):
            # Asking for it anyway would get the connection closed (4014): connect without it, say what it costs.
            self._connection._intents.message_content = (
                False  # discord.py has no public setter after __init__
            )
            log.warning(
                "imp %s: the Message Content intent is off for its bot application: %s. Turn it on at %s → your app → "
                "Bot → Privileged Gateway Intents → Message Content Intent, then restart impyard serve",
                self.imp, MESSAGE_CONTENT_WHY, PORTAL,
            )  # fmt: skip
        user = self.user
        log.info(
            "imp %s: logged in as %s (id %s)%s; intents: %s",
            self.imp, user, user.id if user else "?", self.shard_words, describe_intents(self.intents),
        )  # fmt: skip

    @property
    def shard_words(self) -> str:
        """`` on shard 1/2`` for a sharded bot, else nothing: for log lines."""
        return f" on shard {self.shard}" if self.shard is not None else ""

    async def point_gateway(self) -> None:
        """With a custom API base, connect to the gateway that API names (a plain Client would use Discord's)."""
        if self.settings.api_base is None:
            return
        try:
            _shards, url, _limits = await self.http.get_bot_gateway()
        except discord.GatewayNotFound as exc:
            raise DiscordSetupError(
                f"{API_BASE_ENV}={self.settings.api_base} does not answer GET /gateway/bot: {exc}"
            ) from None
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(url)

    async def setup_hook(self) -> None:
        from impyard.discord.approval_cards import GateButton
        from impyard.discord.commands import ForgetMeButton

        self.add_dynamic_items(GateButton, ForgetMeButton)  # buttons posted before a restart still work

    @property
    def message_content(self) -> bool:
        return self.intents.message_content

    # ------------------------------------------------------------ gateway events → the host

    def on_its_shard(self, guild_id: int | None, event: str) -> bool:
        """Issue 36, defence in depth: whether an event of this server (None: none, a DM) is this shard's to act on.
        Discord sends a shard only its own servers' events; one that came anyway (a misrouting gateway, a proxy that
        broadcasts) is dropped, counted in ``off_shard`` by kind, and logged: the first of each kind as a warning,
        the others at debug (ids only, never text). Unsharded, everything is this host's."""
        if self.shard is None or self.shard.covers(guild_id):
            return True
        self.off_shard[event] += 1
        where = f"server {guild_id}" if guild_id is not None else "a direct message"
        if self.off_shard[event] == 1:
            log.warning(
                "imp %s on shard %s: Discord sent a %s event of %s, which is shard %s's: dropped (and every "
                "other such event, counted); check that each host runs with its own --shard",
                self.imp, self.shard, event, where, shard_of(guild_id, self.shard.count) if guild_id else 0,
            )  # fmt: skip
        else:
            log.debug("imp %s on shard %s: dropped a %s event of %s", self.imp, self.shard, event, where)
        return False

    async def on_ready(self) -> None:
        if self.bridge is not None:
            self.bridge.ready(self)

    async def on_message(self, message: discord.Message) -> None:
        if self.bridge is not None and self.on_its_shard(guild_id_of(message), "message"):
            self.bridge.message(self, message)

    async def on_guild_channel_update(
        self, before: discord.abc.GuildChannel, after: discord.abc.GuildChannel
    ) -> None:
        """Issue 32 #4: a channel's overwrites changed (CHANNEL_UPDATE): its audience, and its threads'."""
        if self.bridge is not None and self.on_its_shard(after.guild.id, "channel update"):
            self.bridge.audiences(self, [after, *getattr(after, "threads", ())])

    async def on_guild_role_update(self, before: discord.Role, after: discord.Role) -> None:
        """@everyone's permissions changed: every channel of the server may be read by more or fewer now."""
        if (
            self.bridge is not None
            and after.is_default()
            and self.on_its_shard(after.guild.id, "role update")
        ):
            self.bridge.audiences(self, [*after.guild.channels, *after.guild.threads])

    async def on_reaction_clear(self, message: discord.Message, reactions: list[discord.Reaction]) -> None:
        if self.bridge is not None and self.on_its_shard(guild_id_of(message), "reaction clear"):
            self.bridge.reactions_cleared(  # ENV-13: a cached message, so the emoji that were there are known
                self, message.channel.id, message.id, [str(r.emoji) for r in reactions]
            )

    async def on_raw_reaction_clear(self, payload: discord.RawReactionClearEvent) -> None:
        if self.bridge is None or any(m.id == payload.message_id for m in self.cached_messages):
            return  # a cached message is reported by on_reaction_clear, with its emoji
        if self.on_its_shard(payload.guild_id, "reaction clear"):
            self.bridge.reactions_cleared(self, payload.channel_id, payload.message_id, [])

    async def on_raw_message_delete(self, payload: discord.RawMessageDeleteEvent) -> None:
        """A message deleted on Discord leaves the host's history and the imp's memory (issue 23)."""
        if self.host is not None and self.on_its_shard(payload.guild_id, "message delete"):
            await forget_deleted(self.host, payload.channel_id, [payload.message_id])

    async def on_raw_bulk_message_delete(self, payload: discord.RawBulkMessageDeleteEvent) -> None:
        if self.host is not None and self.on_its_shard(payload.guild_id, "message delete"):
            await forget_deleted(self.host, payload.channel_id, sorted(payload.message_ids))


class Bridge(Protocol):
    """The host side of a client's events; each call only queues (discord.py runs handlers as loose tasks)."""

    def ready(self, client: ImpClient) -> None: ...

    def message(self, client: ImpClient, message: discord.Message) -> None: ...

    def audiences(self, client: ImpClient, channels: list[Any]) -> None:
        """Issue 32 #4: who can read these channels now (at ready, CHANNEL_UPDATE, an @everyone role change)."""
        ...

    def reactions_cleared(
        self, client: ImpClient, channel_id: int, message_id: int, emoji: list[str]
    ) -> None: ...


def guild_id_of(message: discord.Message) -> int | None:
    """The server a message was sent in (None: a DM), also for a server discord.py has not cached (its channel is
    then a PartialMessageable that knows the server's id only)."""
    if message.guild is not None:
        return message.guild.id
    guild_id = getattr(message.channel, "guild_id", None)
    return guild_id if isinstance(guild_id, int) else None


def token_of(store: Any, config: ImpConfig) -> tuple[str | None, str]:
    """The imp's token (host-side, from token_env or token_file) and where it comes from, in words."""
    return store.discord_token(config), config.token_source()
