"""One host per process (issue 12): the policy, the database, the stores, one gateway and one gate pump.

Every entry point opens its host here — ``impyard chat`` (the terminal), ``impyard serve`` (Discord,
with or without ``--supervise``) and ``impyard supervise`` — so that each process has exactly one
gateway (one rate meter, one ledger view, one audit writer) and one gate pump, built the same way.
What differs is only the surface a host posts through and the surfaces it reaches:

* ``chat`` reaches ``terminal``;
* ``serve`` reaches ``discord`` and ``log`` (task logs go to its log);
* a standalone ``supervise`` reaches ``log`` only: a post into a Discord channel is refused there
  with a one-line reason, and a Discord gate approved on the CLI waits for a host that has Discord.

The host builds the stores (channels, history, memory, the boxes' own history lines — an older home's
imp-wide history file imported into them once, issue 22 — and the gateway's: audit, ledger, earned trust,
gates) and hands them to the gateway, so adapters ask the same stores the gateway writes. The gateway is a
core with one handler per act, registered here (``build_gateway``): model, send, fetch, history, memory. The
surface is wrapped so that an imp's own posts join the channel history. Opening checks the settings and the
policy before anything starts; closing closes the gateway and the database on every path.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Collection, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio

from impyard.channels.store import ChannelStore
from impyard.clock import Clock, SystemClock
from impyard.conversation.history import History, retention_from_env
from impyard.conversation.history_act import HistoryAct
from impyard.conversation.history_surface import HistorySurface
from impyard.conversation.responder_history import HistoryBounds, ResponderHistory, import_legacy_homes
from impyard.gateway.audit import AuditLog
from impyard.gateway.broker import ModelBroker, UpstreamConfig
from impyard.gateway.core import GateCallback, Gateway, GatewayStores, StageCallback, host_secrets
from impyard.gateway.fetch import HttpFetcher
from impyard.gateway.fetch_act import FetchAct
from impyard.gateway.gate_pump import GatePump
from impyard.gateway.gates import GateStore
from impyard.gateway.ledger import Ledger
from impyard.gateway.model_act import ModelAct
from impyard.gateway.policy import Policy, load_policy
from impyard.gateway.send_act import SendAct
from impyard.gateway.surfaces import Surface
from impyard.gateway.trust import ChannelTrust
from impyard.imps.shared import SharedImps, sync_home
from impyard.imps.store import ImpConfig, ImpStore
from impyard.memory.act import MemoryAct
from impyard.memory.audience import move_to_own_scope
from impyard.memory.service import MemoryService, cache_bytes_from_env, memory_service
from impyard.memory.store import MemoryStore
from impyard.storage.db import Database, open_database

log = logging.getLogger("impyard.host")


@dataclass(eq=False)
class Host:
    """What one process serves boxes with. Adapters use these parts; nothing reaches through the gateway."""

    db: Database
    policy: Policy
    clock: Clock
    imps: ImpStore
    configs: dict[str, ImpConfig]  # every imp of this home whose imp.toml loads
    channels: ChannelStore
    history: History
    gates: GateStore
    ledger: Ledger
    audit: AuditLog
    gateway: Gateway
    memory: MemoryStore  # the store the gateway's memory service serves boxes from (/forget-me, deletes)
    responder_history: ResponderHistory  # the boxes' own lines (issue 22), served by the gateway
    pump: GatePump
    surfaces: frozenset[str]
    imp_user_ids: dict[str, str] = field(default_factory=dict)
    imp_revisions: dict[str, int] = field(
        default_factory=dict
    )  # issue 36: of each imp's settings, as run now

    def imp_user_id(self, imp: str) -> str:
        """The imp's own user id on the surface (its bot's id on Discord), or a stable stand-in."""
        return self.imp_user_ids.get(imp, f"imp:{imp}")


def channel_store(db: Database, clock: Clock) -> ChannelStore:
    """The channel store as every host builds it: a known guild channel found private takes its memories to its
    own scope, in the same transaction (issue 32 #4; the channels know no memory, so the host wires it)."""
    return ChannelStore(db, clock, on_private=move_to_own_scope)


def build_gateway(
    *,
    policy: Policy,
    surface: Surface,
    stores: GatewayStores | None = None,
    db: Database | None = None,
    channels: ChannelTrust | None = None,
    clock: Clock | None = None,
    secrets: Collection[str] | None = None,
    owners: Mapping[str, Collection[str]] | None = None,
    staff_channels: Mapping[str, Collection[str]] | None = None,
    on_stage: StageCallback | None = None,
    upstream: UpstreamConfig | None = None,
    surfaces: Collection[str] | None = None,
    on_gate: GateCallback | None = None,
    responder_history: ResponderHistory | None = None,
    memory: MemoryService | None = None,
    settle_abandoned: bool = True,
) -> Gateway:
    """The gateway's core with its five acts registered, each given what it acts with:

    * the core: ``policy``, its ``stores`` (or ``db`` and ``channels`` to build them over: tests, ``policy
      check``), ``clock``, ``secrets`` (redacted; the model key is added), ``owners`` (who approves an imp's
      gates), ``staff_channels``, ``on_stage`` (hears every ``turn.stage``: a window for tests);
    * ``model.request``: a broker over ``upstream`` (default: the environment's), the one holder of the key;
    * ``discord.send``: ``surface``, ``surfaces`` (where it posts, ``surface_of`` names; None = everywhere),
      ``on_gate`` (a gate was opened: the Discord surface posts an approval card);
    * ``http.fetch``: a fetcher under the policy's ``[http]``;
    * ``history.*``: ``responder_history`` (or one over the database with the default limits, issue 22);
    * ``memory.*``: ``memory`` (None: a box asking for memory is refused, issue 23).

    ``settle_abandoned=False`` writes nothing at start: a gateway that only answers ``dry_run``; else the model
    calls a stopped host left in flight are settled first (issue 19 #4)."""
    clock = clock or SystemClock()
    broker = ModelBroker(upstream or UpstreamConfig.from_env(), policy.upstream)
    hidden = host_secrets(broker.config, secrets)
    if stores is None:
        if db is None:
            raise TypeError("the gateway needs its stores (or a database to build them over)")
        stores = GatewayStores.over(db, policy=policy, clock=clock, secrets=hidden, channels=channels)
    gateway = Gateway(
        policy=policy, stores=stores, secrets=hidden, clock=clock, owners=owners, staff_channels=staff_channels,
        on_stage=on_stage,
        acts=[
            ModelAct(broker),
            SendAct(surface, surfaces=surfaces, on_gate=on_gate),
            FetchAct(HttpFetcher(policy.http)),
            MemoryAct(memory),
            HistoryAct(responder_history or ResponderHistory(stores.db, clock)),
        ],
    )  # fmt: skip
    if settle_abandoned:
        gateway.settle_orphans()
    return gateway


@asynccontextmanager
async def open_host(
    surface: Surface,
    *,
    reaches: Collection[str],
    clock: Clock | None = None,
    configs: Mapping[str, ImpConfig] | None = None,
    imp_user_ids: Mapping[str, str] | None = None,
    on_gate: GateCallback | None = None,
) -> AsyncIterator[Host]:
    """The host of this IMPYARD_HOME. ``configs``: the imps to know (default: every imp whose imp.toml loads)."""
    clock = clock or SystemClock()
    retention = retention_from_env()  # a bad setting stops here, before anything opens
    cache_bytes = cache_bytes_from_env()
    policy = load_policy()  # a broken policy stops here, before anything starts
    imps = ImpStore()
    upstream = UpstreamConfig.from_env()
    db = open_database()
    try:
        # Issue 36: the imps' settings as the database has them (this home's own changes sent up first).
        synced = await db.run(sync_home, imps, SharedImps(db))
        for line in synced.lines():
            log.info("%s", line)
        known = (
            dict(configs)
            if configs is not None
            else {name: item for name, item in imps.scan() if isinstance(item, ImpConfig)}
        )
        history = History(db, clock, retention=retention)
        channels = channel_store(db, clock)
        stores = GatewayStores.over(
            db, policy=policy, clock=clock, secrets=host_secrets(upstream), channels=channels
        )
        memory = memory_service(db, clock.now, cache_bytes=cache_bytes)
        responder_history = ResponderHistory(
            db, clock,
            {name: HistoryBounds(config.model.history_limit, config.model.history_per_channel) for name, config in known.items()},
        )  # fmt: skip
        # Issue 22: an older home's imp-wide history file comes into the host's store once, before any box runs.
        await db.run(import_legacy_homes, responder_history, [(name, imps.state_dir(name)) for name in known])
        user_ids = dict(imp_user_ids or {})
        host_surface = HistorySurface(
            surface, history, lambda imp: user_ids.get(imp, f"imp:{imp}"), clock,
            default_imp=next(iter(known)) if len(known) == 1 else "",
        )  # fmt: skip
        gateway = build_gateway(
            policy=policy,
            stores=stores,
            upstream=upstream,
            surface=host_surface,
            clock=clock,
            owners={name: config.owners for name, config in known.items()},
            staff_channels={
                name: [config.discord.staff_channel]
                for name, config in known.items()
                if config.discord.staff_channel
            },
            on_gate=on_gate,
            surfaces=reaches,
            memory=memory,
            responder_history=responder_history,
        )
        try:
            async with gateway.running():  # issue 19 #4: a model call outlives a box that dies mid-call
                yield Host(
                    db=db, policy=policy, clock=clock, imps=imps, configs=known, channels=channels, history=history,
                    gates=stores.gates, ledger=stores.ledger, audit=stores.audit, gateway=gateway,
                    memory=memory.store, responder_history=responder_history, pump=GatePump(gateway),
                    surfaces=frozenset(reaches), imp_user_ids=user_ids, imp_revisions=dict(synced.revisions),
                )  # fmt: skip
        finally:
            with anyio.CancelScope(shield=True):  # a host stopped while it starts (a signal) closes it too
                await gateway.aclose()
    finally:
        db.close()
