"""A running conversation host for some imps: the host (``impyard.host``), the conversation and the sessions.

``impyard chat`` and ``impyard serve`` open one of these; closing it closes every box on every path
(docs/conversation.md: graceful shutdown, no box left). The conversation host is the session manager's plan and
its events; each session's box talks to the gateway, except for its own ``turn.stage``, which the
session manager hands to that session's observer (the typing indicator).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from impyard.backends import BoxBackend
from impyard.backends.choose import choose_backend
from impyard.backends.docker import DockerBackend
from impyard.backends.stateroot import state_root
from impyard.channels.store import ChannelInfo, ChannelStore
from impyard.clock import Clock
from impyard.conversation.activity import ActivityPublisher
from impyard.conversation.history import History
from impyard.conversation.pipeline import Conversations
from impyard.conversation.sessions import SessionManager
from impyard.gateway.core import GateCallback, Gateway
from impyard.gateway.gate_pump import GATE_PUMP_S
from impyard.gateway.surfaces import SURFACE_TERMINAL, Surface
from impyard.host import Host, open_host
from impyard.imps.store import ImpConfig, ImpStore
from impyard.storage.db import Database
from impyard.storage.leases import ImpBoxes

log = logging.getLogger("impyard.runtime")


@dataclass
class Runtime:
    host: Host
    db: Database
    gateway: Gateway
    conversations: Conversations
    sessions: SessionManager
    channels: ChannelStore
    history: History
    backends: dict[str, BoxBackend]
    activity: ActivityPublisher

    def boxes(self) -> list[ImpBoxes]:
        """Per imp this host serves: its warm boxes (one per channel session), their backend and runtime: what
        the host's ``host:`` record says (``HostCard.boxes``; the console's Imps page shows it)."""
        warm = Counter(key.imp for key in list(self.sessions.sessions))
        return [imp_boxes(imp, warm[imp], backend) for imp, backend in self.backends.items()]


def imp_boxes(imp: str, warm: int, backend: BoxBackend) -> ImpBoxes:
    """``backend``'s runtime as far as it is known without asking the engine (its first box resolves it)."""
    if isinstance(backend, DockerBackend):
        return ImpBoxes(imp, warm, backend.name, backend.resolved_runtime, backend.runtime_choice.describe())
    return ImpBoxes(imp, warm, backend.name)


def backends_for(configs: Sequence[ImpConfig], override: str | None = None) -> dict[str, BoxBackend]:
    """One backend per imp, from its [box] settings (or an override); orphans of this home removed once.

    A bad ``IMPYARD_STATE_ROOT`` is refused here, before anything starts (``BoxStartError``)."""
    state_root()
    chosen: dict[str, BoxBackend] = {}
    for config in configs:
        name = override or config.box.backend
        chosen[config.name] = choose_backend(
            name,  # type: ignore[arg-type]
            limits=config.box.docker_limits(),
            runtime=config.box.runtime,
        )
    docker = next((backend for backend in chosen.values() if isinstance(backend, DockerBackend)), None)
    if docker is not None:
        removed = docker.remove_orphans()
        if removed:
            log.warning("removed %d box(es) left behind by an earlier run", removed)
    return chosen


@asynccontextmanager
async def open_runtime(
    imp_names: Sequence[str],
    surface: Surface,
    *,
    backend: str | None = None,
    clock: Clock | None = None,
    backends: dict[str, BoxBackend] | None = None,
    surfaces: Collection[str] = (SURFACE_TERMINAL,),
    on_gate: GateCallback | None = None,
    imp_user_ids: Mapping[str, str] | None = None,
    pump_period_s: float | None = GATE_PUMP_S,
    owns_channel: Callable[[ChannelInfo | None], bool] | None = None,
) -> AsyncIterator[Runtime]:
    """The host (``impyard.host``) plus conversation and sessions for ``imp_names``; the gate pump runs inside.

    ``surfaces``: where ``surface`` posts; ``on_gate`` hears of every gate opened (approval cards);
    ``imp_user_ids``: each imp's user id on the surface; ``pump_period_s``: how often the gate pump runs
    (None: never by itself — the caller drives ``runtime.host.pump.run_once()``, as tests do);
    ``owns_channel``: for a host serving one Discord shard, which channels' unanswered messages are its own to
    answer after a restart (issue 21; None: every channel this host's surfaces reach).
    """
    store = ImpStore()
    configs = {name: store.get(name) for name in imp_names}  # an unknown or broken imp stops here
    async with open_host(
        surface, reaches=surfaces, clock=clock, imp_user_ids=imp_user_ids, on_gate=on_gate
    ) as host:
        chosen = backends or backends_for(list(configs.values()), backend)
        conversations = Conversations(
            imps=host.imps, configs=configs, history=host.history, channels=host.channels, surface=surface,
            clock=host.clock, imp_user_ids=imp_user_ids, backends=chosen, policy=lambda: host.gateway.policy,
        )  # fmt: skip
        # What this host is doing now, for the console's Now page (issue 34): published from its own task, and
        # withdrawn only after every session closed (a turn ending in the shutdown's grace still shows).
        async with (
            ActivityPublisher(host.db, host.clock) as activity,
            SessionManager(
                plan=conversations, host=host.gateway, events=conversations, now=host.clock.now
            ) as sessions,
        ):
            activity.follow(sessions.activity)
            conversations.sessions = sessions
            runtime = Runtime(
                host,
                host.db,
                host.gateway,
                conversations,
                sessions,
                host.channels,
                host.history,
                chosen,
                activity,
            )
            resumed = await conversations.recover(
                reaches=host.surfaces, owns=owns_channel
            )  # missed ones mentioned once
            if resumed:
                log.info("answering %d message(s) left unanswered by the last run", resumed)
            async with anyio.create_task_group() as tg:
                if pump_period_s is not None:
                    tg.start_soon(host.pump.run, pump_period_s, name="gate pump")
                yield runtime
                tg.cancel_scope.cancel()
