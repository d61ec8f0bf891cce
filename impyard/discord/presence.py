"""The imp's Discord status after a successful turn (seed 003: DynamicStatusService, a post-success side effect).

With ``[discord] presence = true`` in imp.toml (off by default), a turn whose reply was delivered sets the
imp's bot's custom status to what it is doing — "talking in #general", "talking in a private channel" (a
channel fewer than everyone in the server can read: never its name, which the status shows to all, issue 32 #4),
or "talking in a direct message" (never who with) — and the status clears again after ``idle_s`` without another answered turn. It is a
consumer of finished turns (``Conversations.after_turn``), not a part of routing, prompts or the turn
machine: it never delays a turn and never fails one.

Discord limits gateway sends, so updates are spaced (``min_interval_s`` per bot) and the latest wanted
status wins: five quick turns in five channels make at most one or two updates, ending on the last
channel. The updates are made by one worker task that the Discord host runs in its own task group.
A sharded bot's status goes out on its own shard's connection, so it shows in that shard's servers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import anyio
import discord

from box.protocol.models import DeliverResult
from impyard.channels.store import PRIVATE, ChannelStore
from impyard.conversation.sessions import SessionKey

log = logging.getLogger("impyard.discord.presence")

MIN_INTERVAL_S = 15.0  # at most about four status updates a minute per bot
IDLE_S = 600.0  # the status clears after ten minutes without an answered turn
MAX_STATUS_CHARS = 128  # Discord's limit on a custom status


def status_text(
    channel_kind: str | None, channel_name: str | None, audience: str | None = None
) -> str | None:
    """What the status says after a turn in this channel; None for a channel not on Discord (nothing shown)."""
    if channel_kind == "dm":
        return "talking in a direct message"  # never who: a DM is private
    if channel_kind == "guild" and audience == PRIVATE:
        return "talking in a private channel"  # the status shows everywhere; a private channel's name is not for all
    if channel_kind == "guild":
        name = (channel_name or "").strip()
        return f"talking in #{name}"[:MAX_STATUS_CHARS] if name else "talking in a server channel"
    return None


@dataclass
class _Wanted:
    text: str | None
    since: float


class PresenceService:
    """Sets each enabled imp's custom status from its successful turns; ``run`` is its worker."""

    def __init__(
        self,
        clients: Mapping[str, discord.Client],
        channels: ChannelStore,
        enabled: Collection[str],
        *,
        min_interval_s: float = MIN_INTERVAL_S,
        idle_s: float = IDLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clients = dict(clients)
        self.channels = channels
        self.enabled = frozenset(enabled) & set(self.clients)
        self.min_interval_s = min_interval_s
        self.idle_s = idle_s
        self.clock = clock
        self._wanted: dict[str, _Wanted] = {}
        self._shown: dict[str, str | None] = {}
        self._updated_at: dict[str, float] = {}
        self._changed = anyio.Event()

    async def turn_finished(self, key: SessionKey, result: DeliverResult) -> None:
        """``Conversations.after_turn``: note what the imp is doing now; the worker shows it. Never blocks."""
        if key.imp not in self.enabled or result.outcome != "sent":
            return  # only a delivered reply is something the imp did (a silent, pending or failed turn is not)
        info = await self.channels.db.run(self.channels.info, key.channel_id)
        text = status_text(info.kind, info.name, info.audience) if info else None
        if text is None:
            return
        self._wanted[key.imp] = _Wanted(text, self.clock())
        self._changed.set()

    async def run(self) -> None:
        """The worker: applies the latest wanted status per bot, spaced, and clears it once idle."""
        while True:
            wait = self._next_wait()
            with anyio.move_on_after(wait if wait is not None else float("inf")):
                await self._changed.wait()
            self._changed = anyio.Event()
            for imp in sorted(self.enabled):
                await self._apply(imp)

    def _target(self, imp: str, now: float) -> str | None:
        wanted = self._wanted.get(imp)
        if wanted is None or now - wanted.since >= self.idle_s:
            return None
        return wanted.text

    def _next_wait(self) -> float | None:
        """Seconds until something may change: a spaced update comes due, or a status goes idle."""
        now = self.clock()
        due: list[float] = []
        for imp in self.enabled:
            target = self._target(imp, now)
            if target != self._shown.get(imp):
                due.append(self._updated_at.get(imp, -self.min_interval_s) + self.min_interval_s - now)
            if target is not None:
                due.append(self._wanted[imp].since + self.idle_s - now)
        return max(0.0, min(due)) if due else None

    async def _apply(self, imp: str) -> None:
        now = self.clock()
        target = self._target(imp, now)
        if target == self._shown.get(imp):
            return
        if now - self._updated_at.get(imp, -self.min_interval_s) < self.min_interval_s:
            return  # spaced: the worker comes back when it is due
        activity = discord.CustomActivity(name=target) if target is not None else None
        self._updated_at[imp] = now
        client = self.clients[imp]
        client.activity = activity  # what the bot identifies with after a fresh connect, too
        try:
            await client.change_presence(activity=activity)
        except Exception as exc:  # noqa: BLE001 - a status that cannot be shown is logged, never fatal
            log.warning("could not update the Discord status of imp %s: %s", imp, exc)
            return  # tried again when the next update is due
        self._shown[imp] = target
        count = getattr(
            client, "shard_count", None
        )  # a sharded bot's status shows in its shard's servers only
        shard = f" (shard {client.shard_id}/{count})" if count is not None else ""
        log.info("imp %s status%s: %s", imp, shard, target or "(cleared)")
