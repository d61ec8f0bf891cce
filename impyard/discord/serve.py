"""``impyard serve``: every configured imp's Discord bot, the session manager and the gateway in one process.

Start, in order, so that nothing runs when something is wrong: the instance lock (one host per
``IMPYARD_HOME``), the leases (``impyard.storage.leases``: the shard's, one holder at a time across hosts, and the
host's own record for ``impyard hosts``, taken with the database's one shard layout,
``impyard.storage.shard_layout``; a lost lease stops the host, exit 1), the imps and their tokens
(read on the host; a missing or rejected token stops here with the fix), login (REST only), the runtime (policy, database, gateway, sessions, the gate
pump), then each bot's gateway connection. Inbound messages queue per imp and are routed in arrival
order by one worker per imp, owned by this host's task group. With ``--supervise`` the task loop of
``impyard supervise`` runs here too, posting through the same bots (its ``task:<imp>`` log goes to
the log); without it, a task loop for departures alone (mechanism 103: a person who left a memory
imp's conversation is thought over once) runs beside whatever ``impyard supervise`` runs. Shutdown
(SIGINT/SIGTERM, or a bot's connection failing for good): running turns get their grace, every box
is closed, the bots disconnect; a second signal cuts the grace. The signals are received from before anything
starts (``impyard.stop_signals``): one during start-up stops the start, and what started is closed. An imp with ``[discord] presence = true`` shows what it is doing as its
bot's status after each answered turn (``impyard.discord.presence``, a worker in this host's task group).

With ``shard`` (``impyard serve --shard I/N``) every bot connects as that Discord shard and so gets the events
of its shard's servers only, and DMs only on shard 0 (``impyard.discord.shards``); each host of a sharded
set runs with its own home, so what a restart left unanswered is its own shard's. An event of another shard's
server that Discord sends anyway is dropped and counted (``ImpClient.on_its_shard``, issue 36), and a message two
hosts are handed is answered by the one that claims its wake (``Conversations.route``: the other's is
``duplicate``). Slash commands are synced by ``impyard discord sync``, never here, so sharded hosts never race
to sync them.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, nullcontext
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import anyio
import discord
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from box.protocol.models import MailboxEventParams
from impyard.backends import BoxBackend
from impyard.clock import Clock
from impyard.conversation.sessions import SessionKey
from impyard.discord.approval_cards import ApprovalCards
from impyard.discord.client import DiscordSettings, DiscordSetupError, ImpClient
from impyard.discord.commands import CommandHost
from impyard.discord.inbound import SeenAudience, audiences, bot_role_ids, skip_reason, to_inbound
from impyard.discord.presence import PresenceService
from impyard.discord.replay import (
    PER_CHANNEL_ENV,
    TOTAL_ENV,
    Mark,
    ReplayBounds,
    ReplayBoundsError,
    ReplayTally,
    marks,
    read_gap,
)
from impyard.discord.shards import Shard
from impyard.discord.surface import DiscordSurface
from impyard.failure_words import failure_line
from impyard.gateway.audit import REDACTED
from impyard.gateway.surfaces import SURFACE_DISCORD, SURFACE_LOG
from impyard.imps.shared import sync_with_database
from impyard.imps.store import ImpConfig, ImpStore
from impyard.metrics.http import Phase, ReadyCheck, serve_health
from impyard.paths import home
from impyard.runtime import Runtime, open_runtime
from impyard.stop_signals import StopSignals, sole_error, stop_signals
from impyard.storage.instance import InstanceLock
from impyard.storage.leases import HostCard, hold_host
from impyard.storage.readiness import database_check, lease_check
from impyard.storage.shard_layout import Layout
from impyard.supervisor import DEPARTURES_ONLY, SupervisorSettings, open_supervisor
from impyard.threads import in_thread

log = logging.getLogger("impyard.serve")

READY_TIMEOUT_S = 60.0  # login is done by then: this is the gateway handshake and the guild list
SUPERVISOR_STOP_S = 30.0  # the task loop's own grace (10 s by default) and then some
INBOUND_QUEUE = 1_000  # per imp; a message beyond it is dropped with a warning (Discord keeps it)
SHARD_CLOSES = {  # the gateway's close codes about sharding, in words with the fix
    4010: "Discord refused shard {shard} of imp {imp} as invalid: give --shard I/N with I below N",
    4011: (
        "Discord requires sharding for imp {imp}: its bot is in more servers than one connection may hold "
        "(2,500); run several hosts, each with impyard serve --shard I/N (docs/discord.md)"
    ),
}


@dataclass(frozen=True)
class ReactionsCleared:
    channel_id: int
    message_id: int
    emoji: list[str]


@dataclass(frozen=True)
class AudiencesSeen:
    """Who can read some server channels now (issue 32 #4): at ready, on CHANNEL_UPDATE, on an @everyone change."""

    channels: tuple[SeenAudience, ...]


@dataclass(frozen=True)
class Replayed:
    """Messages of one channel sent while no host served it, read back at start (issue 36), oldest first."""

    messages: tuple[discord.Message, ...]
    tally: ReplayTally


@dataclass(frozen=True)
class ReplayDone:
    """After the last ``Replayed`` of a start: the worker has routed them all."""

    done: anyio.Event


HostEvent = (  # what a bot (or the start's replay) hands its imp's inbound worker
    discord.Message | ReactionsCleared | AudiencesSeen | Replayed | ReplayDone
)


# ------------------------------------------------------------------ which imps


def pick_imps(store: ImpStore, names: Sequence[str] | None) -> list[ImpConfig]:
    """The named imps; else every imp whose token is set (the others are skipped, with a note)."""
    if names:
        return [store.get(name) for name in dict.fromkeys(names)]
    configs = store.all_configs()
    if not configs:
        raise DiscordSetupError(
            "there are no imps yet: `impyard imp add pip`, give it a bot token (docs/discord.md)"
        )
    chosen = []
    for config in configs:
        status = store.token_status(config)
        if status.is_set:
            chosen.append(config)
        else:
            log.info("imp %s has no Discord token (%s); not serving it", config.name, status.source)
    if not chosen:
        sources = ", ".join(f"{c.name}: {store.token_status(c).source}" for c in configs)
        raise DiscordSetupError(
            f"no imp has a Discord token ({sources}): set one (docs/discord.md, step 2), then run impyard serve"
        )
    return chosen


async def login_all(
    store: ImpStore, configs: Sequence[ImpConfig], settings: DiscordSettings, shard: Shard | None = None
) -> dict[str, ImpClient]:
    """Log every imp's bot in (REST only); on any failure, close the ones already in and raise."""
    clients: dict[str, ImpClient] = {}
    try:
        for config in configs:
            client = ImpClient(config, settings, shard=shard)
            clients[config.name] = client
            await client.login_checked(store.discord_token(config), config.token_source())
    except BaseException:
        with anyio.CancelScope(shield=True):
            for client in clients.values():
                await client.close()
        raise
    return clients


# ------------------------------------------------------------------ logs


class RedactTokens(logging.Filter):
    """A second line of defence: no log line carries a bot token, whatever logged it."""

    def __init__(self, secrets: Sequence[str]) -> None:
        super().__init__()
        self.secrets = [secret for secret in secrets if len(secret) >= 8]

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if any(secret in text for secret in self.secrets):
            for secret in self.secrets:
                text = text.replace(secret, REDACTED)
            record.msg, record.args = text, ()
        return True


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message (and the exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


@asynccontextmanager
async def redacted_logs(secrets: Sequence[str]) -> AsyncIterator[None]:
    handlers = list(logging.getLogger().handlers)
    guard = RedactTokens(secrets)
    for handler in handlers:
        handler.addFilter(guard)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(guard)


# ------------------------------------------------------------------ the host


@dataclass(eq=False)
class DiscordHost:
    runtime: Runtime
    clients: dict[str, ImpClient]
    surface: DiscordSurface
    cards: ApprovalCards
    presence: PresenceService | None = None  # [discord] presence = true for at least one imp (seed 003)
    stop: anyio.Event = field(default_factory=anyio.Event)
    failure: str | None = None
    _queues: dict[str, MemoryObjectSendStream[HostEvent]] = field(default_factory=dict)
    _ready: dict[str, anyio.Event] = field(default_factory=dict)
    _closing: bool = False
    _hurried: bool = False  # a second signal: no grace left for turns and tasks
    # The wait for the task loop's own grace, while it runs (cancelled by a second signal).
    _supervisor_grace: anyio.CancelScope | None = None

    # ------------------------------------------------------------ the Bridge (called by the clients)

    def ready(self, client: ImpClient) -> None:
        nothing = (
            "none yet: invite the bot (docs/discord.md, step 3)"
            if client.shard is None
            else "none on this shard"
        )
        # Issue 36: a server of another shard (a gateway that ignores sharding) is dropped and counted.
        ours = [g for g in client.guilds if client.on_its_shard(g.id, "server")]
        guilds = ", ".join(f"{g.name} ({g.id})" for g in ours) or nothing
        log.info(
            "imp %s is on Discord as %s%s; servers: %s", client.imp, client.user, client.shard_words, guilds
        )
        self._ready[client.imp].set()
        # Issue 32 #4: the audiences of the channels the host knows, as Discord sent them in GUILD_CREATE: a channel
        # known before the host read audiences takes its memories to its own scope now, not at its next message.
        self.audiences(client, [c for g in ours for c in (*g.channels, *g.threads)])

    def message(self, client: ImpClient, message: discord.Message) -> None:
        self._queue(client, message)

    def audiences(self, client: ImpClient, channels: list[Any]) -> None:
        seen = audiences(channels)
        if seen:
            self._queue(client, AudiencesSeen(tuple(seen)))

    def reactions_cleared(
        self, client: ImpClient, channel_id: int, message_id: int, emoji: list[str]
    ) -> None:
        self._queue(client, ReactionsCleared(channel_id, message_id, emoji))

    def _queue(self, client: ImpClient, item: HostEvent) -> None:
        queue = self._queues.get(client.imp)
        if queue is None:
            return
        try:
            queue.send_nowait(item)
        except anyio.WouldBlock:
            log.warning(
                "imp %s: %d events waiting; dropped one (Discord keeps the message)",
                client.imp,
                INBOUND_QUEUE,
            )
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # shutting down

    # ------------------------------------------------------------ workers

    async def route_inbound(self, client: ImpClient, queue: MemoryObjectReceiveStream[HostEvent]) -> None:
        """One imp's events, in arrival order: a message through the pipeline; a reaction clear to its live box."""
        async with queue:
            async for item in queue:
                try:
                    if isinstance(item, ReactionsCleared):
                        await self._forward_reactions_cleared(client, item)
                    elif isinstance(item, AudiencesSeen):
                        await self._record_audiences(item)
                    elif isinstance(item, Replayed):
                        await self._replayed(client, item)
                    elif isinstance(item, ReplayDone):
                        item.done.set()
                    else:
                        await self._receive(client, item)
                except Exception:  # noqa: BLE001 - one bad message never stops the imp's inbound
                    log.exception("imp %s: routing an inbound event failed", client.imp)

    async def _receive(self, client: ImpClient, message: discord.Message) -> None:
        assert client.user is not None
        skipped = skip_reason(message)
        if skipped is not None:
            log.debug("imp %s: message %s skipped (%s)", client.imp, message.id, skipped)
            return
        started = time.perf_counter()
        inbound = await to_inbound(
            message,
            bot_user_id=client.user.id,
            bot_role_ids=bot_role_ids(message),
            imp_user_ids={c.user.id for c in self.clients.values() if c.user is not None},
        )
        outcome = await self.runtime.conversations.receive(client.imp, inbound)
        if outcome == "unsaved" and (
            inbound.channel_kind == "dm" or inbound.mentions_imp or inbound.replies_to_imp
        ):  # issue 19 #1: the person asked and the host could not keep it: say so, in one line
            await self.runtime.conversations.notice(
                SessionKey(client.imp, inbound.channel_id), failure_line("store") or ""
            )
        log.info(
            "inbound imp=%s channel=%s message=%s kind=%s outcome=%s attachments=%d ms=%.1f",
            client.imp, inbound.channel_id, message.id, inbound.channel_kind, outcome,
            len(inbound.message.attachments), (time.perf_counter() - started) * 1000,
        )  # fmt: skip

    async def _replayed(self, client: ImpClient, event: Replayed) -> None:
        """Issue 36: messages read back at start, through the pipeline as if they arrived now (``replay``)."""
        assert client.user is not None
        imp_ids = {c.user.id for c in self.clients.values() if c.user is not None}
        inbounds = [
            await to_inbound(
                message, bot_user_id=client.user.id, bot_role_ids=bot_role_ids(message), imp_user_ids=imp_ids
            )
            for message in event.messages
        ]
        outcomes = await self.runtime.conversations.replay(client.imp, inbounds)
        event.tally.outcomes.update(outcomes)
        for inbound, outcome in zip(inbounds, outcomes, strict=True):
            log.info(
                "replayed imp=%s channel=%s message=%s kind=%s outcome=%s",
                client.imp, inbound.channel_id, inbound.message.id, inbound.channel_kind, outcome,
            )  # fmt: skip

    async def replay(self, client: ImpClient, found: Sequence[Mark], bounds: ReplayBounds) -> None:
        """Issue 36, in the background once the bot is connected: each channel's messages after the newest one the
        host kept (``found``, noted before it connected, the most recently active channel first), bounded per
        channel and in all, handed to the imp's inbound worker; then one line of counts."""
        queue = self._queues.get(client.imp)
        if queue is None:
            return
        if bounds.off:
            log.info("replay imp=%s: off (%s or %s is 0)", client.imp, PER_CHANNEL_ENV, TOTAL_ENV)
            return
        tally = ReplayTally()
        budget = bounds.total
        try:
            for mark in found:
                if budget <= 0:
                    tally.unread += 1
                    continue
                channel = await self._replay_channel(client, mark, tally)
                if channel is None:
                    continue
                try:
                    gap = await read_gap(channel, mark.after, min(bounds.per_channel, budget))
                except (discord.NotFound, discord.Forbidden):
                    tally.unreadable += 1
                    continue
                except (discord.HTTPException, OSError) as exc:
                    log.warning(
                        "imp %s: could not read channel %s back: %s", client.imp, mark.channel_id, exc
                    )
                    tally.unreadable += 1
                    continue
                tally.channels += 1
                tally.ignored += gap.ignored
                tally.beyond += gap.beyond
                tally.over += 1 if gap.beyond else 0
                budget -= len(gap.messages)
                if gap.messages:
                    await queue.send(Replayed(tuple(gap.messages), tally))
            done = anyio.Event()
            await queue.send(ReplayDone(done))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return  # shutting down
        await done.wait()
        log.info("%s", tally.line(client.imp, bounds))

    async def _replay_channel(
        self, client: ImpClient, mark: Mark, tally: ReplayTally
    ) -> discord.abc.Messageable | None:
        """The channel to read back: from the bot's cache, else fetched; None for a server the bot is not in (another
        imp's channel) or a channel Discord no longer gives it (counted)."""
        if mark.guild_id is not None:
            guild = client.get_guild(mark.guild_id)
            if guild is None:
                return None
            cached = guild.get_channel_or_thread(mark.channel_id)
            if isinstance(cached, discord.abc.Messageable):
                return cached
        try:
            fetched = await client.fetch_channel(mark.channel_id)
        except (discord.HTTPException, discord.InvalidData, OSError):
            tally.unreadable += 1
            return None
        if not isinstance(fetched, discord.abc.Messageable):
            tally.unreadable += 1
            return None
        return fetched

    async def _record_audiences(self, event: AudiencesSeen) -> None:
        """A known server channel whose audience Discord now tells otherwise is recorded so (issue 32 #4; the first
        time one is found private, its memories move to its own scope). Channels the host never saw are left out:
        they get a row when their first message comes."""
        channels = self.runtime.channels
        wanted = {seen.channel_id for seen in event.channels}
        known_now = {
            info.channel_id: info for info in await channels.db.run(channels.all) if info.channel_id in wanted
        }
        for seen in event.channels:
            known = known_now.get(seen.channel_id)
            if known is None or known.kind != "guild" or known.audience == seen.audience:
                continue
            await channels.db.run(channels.seen,
                seen.channel_id, surface=SURFACE_DISCORD, kind="guild", name=seen.name, guild_id=seen.guild_id,
                audience=seen.audience,
            )  # fmt: skip
            log.info("channel %s (#%s): audience %s", seen.channel_id, seen.name, seen.audience)

    async def _forward_reactions_cleared(self, client: ImpClient, event: ReactionsCleared) -> None:
        params = MailboxEventParams(
            kind="reaction_clear", channel_id=str(event.channel_id), message_id=str(event.message_id),
            reactions=[e[:100] for e in event.emoji[:100]], at=self.runtime.gateway.clock.now(),
        )  # fmt: skip
        delivered = await self.runtime.sessions.notify(
            SessionKey(client.imp, str(event.channel_id)), "mailbox.event", params
        )
        log.info(
            "reaction clear imp=%s channel=%s message=%s delivered=%s",
            client.imp,
            event.channel_id,
            event.message_id,
            delivered,
        )

    async def keep_connected(self, client: ImpClient) -> None:
        """The bot's gateway connection (discord.py reconnects and resumes by itself); a fatal end stops the host."""
        try:
            await client.connect(reconnect=True)
        except discord.PrivilegedIntentsRequired:
            self._fail(
                f"Discord refused the intents of imp {client.imp}: turn on Message Content Intent at "
                "https://discord.com/developers/applications → your app → Bot → Privileged Gateway Intents"
            )
        except (discord.ConnectionClosed, discord.GatewayNotFound, discord.HTTPException, OSError) as exc:
            code = exc.code if isinstance(exc, discord.ConnectionClosed) else None
            why = SHARD_CLOSES.get(code or 0, "").format(imp=client.imp, shard=client.shard)
            self._fail(why or f"imp {client.imp}: the Discord gateway connection failed: {exc}")
        else:
            if not self._closing:
                self._fail(f"imp {client.imp}: the Discord gateway connection ended")

    def _fail(self, why: str) -> None:
        log.error("%s; stopping", why)
        self.failure = self.failure or why
        for event in self._ready.values():
            event.set()
        self.stop.set()

    async def wait_ready(self, timeout_s: float) -> None:
        try:
            with anyio.fail_after(timeout_s):
                for event in self._ready.values():
                    await event.wait()
        except TimeoutError:
            self._fail(f"the Discord gateway did not get ready within {timeout_s:g} s")
        if self.failure is not None:
            raise DiscordSetupError(self.failure)

    def off_shard(self) -> dict[str, int]:
        """Issue 36: the events of another shard's servers every bot of this host dropped, by kind (all imps)."""
        total: dict[str, int] = {}
        for client in self.clients.values():
            for kind, count in client.off_shard.items():
                total[kind] = total.get(kind, 0) + count
        return total

    def hurry(self) -> None:
        """Stop now (a second SIGINT/SIGTERM): the graces of the stop, under way or to come, end at once; running
        turns and tasks are cut off (a task is requeued), their boxes closed."""
        self._hurried = True
        self.runtime.sessions.hurry()
        if self._supervisor_grace is not None:
            self._supervisor_grace.cancel()

    async def close(self) -> None:
        """Graceful: running turns finish (their grace), boxes close, typing stops, the bots disconnect."""
        self._closing = True
        await self.runtime.sessions.shutdown()
        await self.surface.aclose()
        for client in self.clients.values():
            await client.close()


def discord_check(client: ImpClient) -> ReadyCheck:
    """/readyz: the bot's gateway connection is up (ready, its socket open; a reconnect in progress is not)."""

    async def check() -> str | None:
        if client.is_closed():
            return "the bot's connection is closed"
        ws = getattr(client, "ws", None)
        if not client.is_ready() or ws is None or not ws.open:
            return "the bot is not connected to the Discord gateway (connecting or reconnecting)"
        return None

    return ReadyCheck(f"discord {client.imp}", check)


def shard_scope(shard: Shard | None) -> str:
    """What a sharded host serves, for its status line (nothing when unsharded: it serves everything)."""
    if shard is None:
        return ""
    dms = ", and direct messages" if shard.gets_direct_messages else "; direct messages go to shard 0"
    return f" as shard {shard} (the servers of shard {shard.id}{dms})"


@asynccontextmanager
async def open_discord_host(
    imp_names: Sequence[str] | None = None, **options: Any
) -> AsyncIterator[DiscordHost]:
    """Everything ``impyard serve`` runs, connected and ready; closed (gracefully) when the block ends.

    Options: ``backend``, ``clock``, ``backends`` (imp → BoxBackend, for tests), ``settings``
    (DiscordSettings), ``supervise``, ``supervisor_settings``, ``lock``, ``ready_timeout_s``, ``shard``, ``ready``
    (a list of ``/readyz`` checks the host appends its own to as its parts come up: its leases, its database,
    each bot's connection), ``replay`` (ReplayBounds: what is read back of the messages sent while no host served,
    issue 36; by default from the environment).
    """
    try:
        async with _open_discord_host(imp_names, **options) as host:
            yield host
    except BaseExceptionGroup as group:
        raise sole_error(group) from None


@asynccontextmanager
async def _open_discord_host(
    imp_names: Sequence[str] | None = None,
    *,
    backend: str | None = None,
    clock: Clock | None = None,
    backends: Mapping[str, BoxBackend] | None = None,
    settings: DiscordSettings | None = None,
    supervise: bool = False,
    supervisor_settings: SupervisorSettings | None = None,
    lock: bool = True,
    ready_timeout_s: float = READY_TIMEOUT_S,
    shard: Shard | None = None,
    ready: list[ReadyCheck] | None = None,
    replay: ReplayBounds | None = None,
) -> AsyncIterator[DiscordHost]:
    ready = ready if ready is not None else []
    settings = settings or DiscordSettings.from_env()
    try:
        bounds = replay if replay is not None else ReplayBounds.from_env()
    except ReplayBoundsError as exc:
        raise DiscordSetupError(str(exc)) from None
    settings.apply()
    store = ImpStore()
    await in_thread(sync_with_database, store)  # issue 36: the imps as the database has them, before picking
    configs = pick_imps(store, imp_names)
    card = HostCard("serve", str(home()), str(shard) if shard is not None else None)
    async with AsyncExitStack() as held:
        held.enter_context(InstanceLock(home(), "serve") if lock else nullcontext())
        # Issue 21: one holder per shard (LeaseHeld names it, before any login), and this host's own record; issue 36:
        # one shard layout per database, taken with the first of them (LayoutHeld names what holds another one).
        keeper = await held.enter_async_context(
            hold_host(
                card,
                [f"shard:{shard}"] if shard is not None else [],
                layout=Layout(shard.count if shard is not None else None),
            )
        )
        ready.append(lease_check(keeper))  # its shard's lease, and its own record
        tokens = [token for config in configs if (token := store.discord_token(config))]
        async with redacted_logs(tokens):
            clients = await login_all(store, configs, settings, shard)
            try:
                await next(iter(clients.values())).point_gateway()
                surface = DiscordSurface(clients)
                cards = ApprovalCards(clients, {c.name: c for c in configs})
                user_ids = {
                    imp: str(client.user.id) for imp, client in clients.items() if client.user is not None
                }
                async with open_runtime(
                    list(clients), surface, backend=backend, clock=clock, backends=dict(backends) if backends else None,
                    surfaces=(SURFACE_DISCORD, SURFACE_LOG), on_gate=cards.gate_opened, imp_user_ids=user_ids,
                    owns_channel=shard.owns_channel if shard is not None else None,  # another shard's: not ours
                ) as runtime:  # fmt: skip
                    ready.append(database_check(runtime.db))
                    cards.bind(runtime.gateway)
                    runtime.host.pump.follow(cards.refresh_decided)  # cards show decisions taken elsewhere
                    host = DiscordHost(runtime, clients, surface, cards)
                    runtime.gateway.lease_guard = keeper  # a host that lost its shard acts no more
                    card.warm_boxes = lambda: len(runtime.sessions.sessions)
                    card.boxes = runtime.boxes  # per imp, with their runtime (the console's Imps page)
                    card.imp_revisions = runtime.imp_revisions  # issue 36: which settings it runs
                    card.spare_boxes = runtime.sessions.spares.waiting  # issue 37
                    keeper.on_lost = host._fail  # a lost lease stops this host: its boxes close, it exits 1
                    if keeper.lost is not None:
                        host._fail(keeper.lost)
                    showing = [c.name for c in configs if c.discord.presence]  # off by default
                    if showing:
                        host.presence = PresenceService(clients, runtime.channels, showing)
                        runtime.conversations.after_turn.append(host.presence.turn_finished)
                    command_host = CommandHost(
                        channels=runtime.channels, gateway=runtime.gateway, configs={c.name: c for c in configs},
                        memory=runtime.host.memory, history=runtime.history, cards=cards,
                    )  # fmt: skip
                    # Issue 36: where each imp's channels were left, noted before the bots connect (a message that
                    # arrives live from now on is kept past it, and must not hide the gap before it).
                    known = await runtime.db.run(runtime.channels.all)
                    found = {
                        imp: await runtime.db.run(marks, runtime.history, known, imp, shard)
                        for imp in clients
                    }
                    async with AsyncExitStack() as stack, anyio.create_task_group() as tg:
                        tg.start_soon(cards.run, name="approval cards")
                        if host.presence is not None:
                            tg.start_soon(host.presence.run, name="presence")
                        for imp, client in clients.items():
                            send, receive = anyio.create_memory_object_stream[HostEvent](INBOUND_QUEUE)
                            host._queues[imp] = send
                            host._ready[imp] = anyio.Event()
                            client.host, client.cards, client.bridge = command_host, cards, host
                            tg.start_soon(host.route_inbound, client, receive, name=f"inbound {imp}")
                            tg.start_soon(host.keep_connected, client, name=f"discord {imp}")
                        ready.extend(discord_check(client) for client in clients.values())
                        await host.wait_ready(ready_timeout_s)
                        for (
                            imp,
                            client,
                        ) in clients.items():  # in the background: readiness does not wait for it
                            tg.start_soon(host.replay, client, found[imp], bounds, name=f"replay {imp}")
                        supervisor_stop = anyio.Event()
                        supervisor_done = anyio.Event()
                        # Without --supervise, departures alone (no lock: `impyard supervise` may run beside).
                        task_settings = supervisor_settings if supervise else replace(
                            supervisor_settings or SupervisorSettings(), kinds=DEPARTURES_ONLY
                        )  # fmt: skip
                        supervisor = await stack.enter_async_context(  # one host: the same gateway and pump
                            open_supervisor(
                                host=runtime.host,
                                backend=backend,
                                settings=task_settings,
                                spares=runtime.sessions.spares,  # issue 37: its tasks take the imps' spares too
                            )
                        )

                        async def run_supervisor() -> None:
                            try:
                                await supervisor.run(stop=supervisor_stop)
                            finally:
                                supervisor_done.set()

                        tg.start_soon(run_supervisor, name="supervisor" if supervise else "departures")
                        log.info(
                            "serving %s on Discord%s%s",
                            ", ".join(clients),
                            shard_scope(shard),
                            " with the task supervisor" if supervise else "",
                        )
                        try:
                            yield host
                        finally:
                            try:
                                with anyio.CancelScope(shield=True):
                                    supervisor_stop.set()  # it gives its running tasks their own grace
                                    grace = 0 if host._hurried else SUPERVISOR_STOP_S
                                    with anyio.move_on_after(grace) as host._supervisor_grace:
                                        await supervisor_done.wait()
                                    host._supervisor_grace = None
                                    await host.close()
                            finally:
                                tg.cancel_scope.cancel()
            finally:
                with anyio.CancelScope(shield=True):
                    for client in clients.values():
                        await client.close()


async def serve(
    imp_names: Sequence[str] | None = None,
    *,
    stop: anyio.Event | None = None,
    handle_signals: bool = True,
    signals: StopSignals | None = None,
    metrics_host: str | None = None,
    metrics_port: int | None = None,
    on_metrics_port: Callable[[int], None] | None = None,
    **options: Any,
) -> None:
    """Run until SIGINT/SIGTERM (or ``stop``); raises DiscordSetupError when a bot cannot start or stay up.

    The signals are received from before anything starts (``impyard.stop_signals``; ``signals``: the caller's, who
    received them before starting what it runs beside, ``serve --console``; ``handle_signals`` False: none, for
    tests): one during start-up stops the start, and what started is closed (the bots, every box, the leases, the
    health server); once serving, the first lets running turns finish and the second cuts them off.

    ``metrics_port`` (``--metrics-port``; 0: a free one, told to ``on_metrics_port``): ``/metrics``, ``/healthz``
    and ``/readyz`` on ``metrics_host`` (loopback by default), open before the host starts (so ``/healthz`` answers
    while it starts, and ``/readyz`` says it is not ready until every bot is connected) and closed after it stopped.
    """
    async with AsyncExitStack() as received:
        if signals is None and handle_signals:
            signals = await received.enter_async_context(stop_signals(log, "serving"))
        phase = Phase("starting: the bots are logging in and connecting")
        checks: list[ReadyCheck] = [phase.check]
        async with AsyncExitStack() as health:
            if metrics_port is not None:
                bound = await health.enter_async_context(serve_health(metrics_host, metrics_port, checks))
                if on_metrics_port is not None:
                    on_metrics_port(bound)
            await _serve(imp_names, stop, signals, phase, checks, options)


async def _serve(
    imp_names: Sequence[str] | None,
    stop: anyio.Event | None,
    signals: StopSignals | None,
    phase: Phase,
    checks: list[ReadyCheck],
    options: dict[str, Any],
) -> None:
    async with open_discord_host(imp_names, ready=checks, **options) as host:
        phase.ready()
        if signals is not None:

            def first(name: str) -> None:
                log.warning("%s received", name)
                host.stop.set()

            def again(name: str) -> None:
                log.warning("%s again: stopping now (running turns are cut off, their boxes closed)", name)
                host.stop.set()
                host.hurry()

            signals.serving(first, again)
        try:
            async with anyio.create_task_group() as tg:
                if stop is not None:

                    async def relay() -> None:
                        await stop.wait()
                        host.stop.set()

                    tg.start_soon(relay)
                await host.stop.wait()
                phase.stopping()
                log.info("stopping: running turns get their grace, then every box is closed")
                tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            raise sole_error(group) from None
    if host.failure is not None:
        raise DiscordSetupError(host.failure)
    log.info("stopped")
