"""A running conversation host for some imps: the host (``impyard.host``), the conversation and the sessions.

``impyard chat`` and ``impyard serve`` open one of these; closing it closes every box on every path
(docs/conversation.md: graceful shutdown, no box left). The conversation host is the session manager's plan and
its events; each session's box talks to the gateway, except for its own ``turn.stage``, which the
session manager hands to that session's observer (the typing indicator).
"""

from __future__ import annotations

import logging
import os
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
from impyard.imps.config import ImpError
from impyard.imps.shared import SharedImps, sync_home
from impyard.imps.store import ImpConfig
from impyard.storage.db import STORAGE_ERRORS, Database
from impyard.storage.leases import ImpBoxes
from impyard.threads import in_thread

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

    def imp_revisions(self) -> dict[str, int]:
        """The revision of each served imp's settings this host runs (``HostCard.imp_revisions``, issue 36)."""
        return {imp: rev for imp in self.backends if (rev := self.host.imp_revisions.get(imp)) is not None}


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


IMP_SYNC_ENV = "IMPYARD_IMP_SYNC_S"
IMP_SYNC_S = 10.0
# What a host reads once, at its start: a new revision that changes these is applied at the next restart.
RESTART_SECTIONS = ("discord", "owners", "box")
RESTART_MODEL_KEYS = ("history_limit", "history_per_channel")


def imp_sync_s_from_env() -> float:
    """How often a running host asks the database for its imps' revisions (``IMPYARD_IMP_SYNC_S``, 1-3600 s)."""
    raw = os.environ.get(IMP_SYNC_ENV, "").strip()
    if not raw:
        return IMP_SYNC_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 1 <= value <= 3600:
        raise ImpError(f"{IMP_SYNC_ENV} must be a number of seconds from 1 to 3600, not {raw[:40]!r}")
    return value


def needs_restart(old: ImpConfig, new: ImpConfig) -> list[str]:
    """The settings ``new`` changes that a running host read at its start (named as ``imp set`` names them)."""
    changed = [section for section in RESTART_SECTIONS if getattr(old, section) != getattr(new, section)]
    changed += [
        f"model.{key}" for key in RESTART_MODEL_KEYS if getattr(old.model, key) != getattr(new.model, key)
    ]
    return changed


async def follow_imp_settings(host: Host, conversations: Conversations | None, period_s: float) -> None:
    """Issue 36: a running host picks up a new revision of its imps' settings. Every ``period_s`` it reads the
    revisions (one small query); when one moved, it brings the home up to date and its imps' next boxes use the new
    settings (a box already warm finishes its session with the ones it started with). What it read only at its
    start (the Discord bot, owners, the box backend, the history bounds) is logged as needing a restart.
    ``conversations`` None: a host with no conversations (``supervise``): each task run reads the home's files."""
    shared = SharedImps(host.db)

    def conflict(line: str) -> None:
        log.warning("%s", line)

    known = await host.db.run(shared.revisions)
    while True:
        await anyio.sleep(period_s)
        try:
            now = await host.db.run(shared.revisions)
        except STORAGE_ERRORS as exc:
            log.debug("imp settings: the database did not answer: %s", exc)
            continue
        if now == known:
            continue
        known = now
        try:
            report = await host.db.run(sync_home, host.imps, shared, on_conflict=conflict)
        except (ImpError, OSError, *STORAGE_ERRORS) as exc:
            log.warning(
                "imp settings: this home could not be brought up to date: %s", str(exc).splitlines()[0]
            )
            continue
        if conversations is None:
            host.imp_revisions.update(report.revisions)
            continue
        for name, old in list(conversations.configs.items()):
            if name not in report.updated:
                continue
            try:
                new = await in_thread(host.imps.get, name)
            except ImpError as exc:
                log.warning(
                    "imp %s: revision %s not applied: %s", name, now.get(name), str(exc).splitlines()[0]
                )
                continue
            conversations.configs[name] = new
            host.configs[name] = new
            host.imp_revisions[name] = now[name]
            log.info("imp %s: revision %s applied: its next boxes use it", name, now.get(name))
            if late := needs_restart(old, new):
                log.warning(
                    "imp %s: revision %s changes %s, read at this host's start: restart it to apply them",
                    name, now.get(name), ", ".join(late),
                )  # fmt: skip


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
    async with open_host(
        surface, reaches=surfaces, clock=clock, imp_user_ids=imp_user_ids, on_gate=on_gate
    ) as host:
        # After the host brought the home's imps up to date with the database (issue 36).
        configs = {name: host.imps.get(name) for name in imp_names}  # an unknown or broken imp stops here
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
            kept = await conversations.keep_recent_spares(host.clock.now())  # issue 37
            if kept:
                log.info("keeping spare boxes for %s: a conversation within the idle period", ", ".join(kept))
            async with anyio.create_task_group() as tg:
                if pump_period_s is not None:
                    tg.start_soon(host.pump.run, pump_period_s, name="gate pump")
                tg.start_soon(
                    follow_imp_settings, host, conversations, imp_sync_s_from_env(), name="imp settings"
                )
                yield runtime
                tg.cancel_scope.cancel()
