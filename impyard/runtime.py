"""Assemble a running host for some imps: database, policy, gateway, channels, history, sessions.

``impyard chat`` and (later) ``impyard serve`` open one of these; closing it
closes every box on every path (design.md §6: graceful shutdown, no box left).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from impyard.backends import BoxBackend
from impyard.backends.choose import choose_backend
from impyard.backends.docker import DockerBackend
from impyard.channels import ChannelStore
from impyard.clock import Clock, SystemClock
from impyard.conversation import Conversations, HistorySurface
from impyard.db import Database, open_database
from impyard.gates import Gate
from impyard.gateway import GateCallback, Gateway
from impyard.history import History, retention_from_env
from impyard.imps import ImpConfig, ImpStore
from impyard.policy import load_policy
from impyard.sessions import SessionManager
from impyard.surfaces import Surface

log = logging.getLogger("impyard.runtime")

GATE_PUMP_S = 2.0  # how soon an approval given on the CLI is sent by the host that owns the surface


@dataclass
class Runtime:
    db: Database
    gateway: Gateway
    conversations: Conversations
    sessions: SessionManager
    channels: ChannelStore
    history: History
    backends: dict[str, BoxBackend]


def backends_for(configs: Sequence[ImpConfig], override: str | None = None) -> dict[str, BoxBackend]:
    """One backend per imp, from its [box] settings (or an override); orphans of this home removed once."""
    chosen: dict[str, BoxBackend] = {}
    for config in configs:
        name = override or config.box.backend
        chosen[config.name] = choose_backend(name, limits=config.box.docker_limits())  # type: ignore[arg-type]
    docker = next((backend for backend in chosen.values() if isinstance(backend, DockerBackend)), None)
    if docker is not None:
        removed = docker.remove_orphans()
        if removed:
            log.warning("removed %d box(es) left behind by an earlier run", removed)
    return chosen


async def pump_gates(gateway: Gateway, channels: ChannelStore, surface_name: str, period_s: float = GATE_PUMP_S) -> None:
    """Expire overdue gates; send approved ones whose channel lives on this host's surface (exactly once)."""

    def reachable(gate: Gate) -> bool:
        info = channels.info(str(gate.payload.get("channel_id", "")))
        return (info.surface if info else "discord") == surface_name

    while True:
        try:
            await gateway.expire_due()
            for gate in await gateway.execute_approved(reachable):
                log.info("approved gate %s executed: %s", gate.id, gate.state)
        except Exception:  # noqa: BLE001 - the pump must outlive one bad gate; the gate records its failure
            log.exception("executing approved gates failed")
        await anyio.sleep(period_s)


@asynccontextmanager
async def open_runtime(
    imp_names: Sequence[str],
    surface: Surface,
    *,
    backend: str | None = None,
    clock: Clock | None = None,
    backends: dict[str, BoxBackend] | None = None,
    surface_name: str = "terminal",
    on_gate: GateCallback | None = None,
    imp_user_ids: Mapping[str, str] | None = None,
) -> AsyncIterator[Runtime]:
    """``on_gate`` hears of every gate opened (approval cards); ``imp_user_ids``: each imp's user id on the surface."""
    clock = clock or SystemClock()
    retention_from_env()  # a bad setting stops here, before anything opens
    store = ImpStore()
    configs = {name: store.get(name) for name in imp_names}
    policy = load_policy()  # a broken policy stops here, before anything starts
    db = open_database()
    try:
        history = History(db, clock, retention=retention_from_env())
        channels = ChannelStore(db, clock)
        conversations = Conversations(
            imps=store, configs=configs, history=history, channels=channels, surface=surface, clock=clock,
            imp_user_ids=imp_user_ids,
        )
        # Each imp's own posts join the history, so its box sees its side of the conversation.
        recorded = HistorySurface(
            surface, history, conversations.imp_user_id, clock, default_imp=next(iter(configs)) if len(configs) == 1 else ""
        )
        gateway = Gateway(
            policy=policy,
            db=db,
            surface=recorded,
            clock=clock,
            channels=channels,
            owners={name: cfg.owners for name, cfg in configs.items()},
            staff_channels={name: [cfg.discord.staff_channel] for name, cfg in configs.items() if cfg.discord.staff_channel},
            on_stage=conversations.on_stage,
            on_gate=on_gate,
        )
        chosen = backends or backends_for(list(configs.values()), backend)
        try:
            async with SessionManager(
                backend_for=chosen.__getitem__,
                host=gateway,
                events=conversations,
                init_for=conversations.init_for,
                state_dir_for=conversations.state_dir_for,
                settings_for=conversations.settings_for,
                now=clock.now,
            ) as sessions:
                conversations.sessions = sessions
                runtime = Runtime(db, gateway, conversations, sessions, channels, history, chosen)
                resumed = await conversations.recover()
                if resumed:
                    log.info("answering %d message(s) left unanswered by the last run", resumed)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(pump_gates, gateway, channels, surface_name, GATE_PUMP_S, name="gate pump")
                    yield runtime
                    tg.cancel_scope.cancel()
        finally:
            await gateway.aclose()
    finally:
        db.close()
