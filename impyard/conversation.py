"""The conversation pipeline every surface plugs into (design.md §6, seed 004).

inbound message → bound and clean it → persist to history (woken or not) →
wake rule → framing → session manager. Also the session manager's events:
outcomes go to the history, notices and the typing indicator to the surface.
Messages are content, never commands: framing travels as structured fields.
"""

from __future__ import annotations

import logging
import unicodedata
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal, Protocol

import anyio

from box.protocol.models import (
    Attachment,
    Author,
    BoxInitParams,
    DeliverResult,
    Message,
    SessionInfo,
    TurnStageParams,
)
from impyard.backends import BoxBackend, BoxSpec
from impyard.channels import ChannelStore
from impyard.clock import Clock
from impyard.framing import RecentAuthor, decide_framing
from impyard.history import History
from impyard.imps import ImpConfig, ImpStore
from impyard.sessions import Delivery, SessionKey, SessionManager, SessionSettings
from impyard.surfaces import Surface
from impyard.wake import WakeFacts, decide_wake

log = logging.getLogger("impyard.conversation")
RECENTLY_FINISHED = 1_000  # finished turns remembered for a waiter that asks after the fact

MAX_INBOUND_CHARS = 8_000  # beyond Discord's own 4000 (Nitro); anything longer is cut, visibly
MAX_ATTACHMENTS = 10
MAX_ATTACHMENT_BYTES = 8 * 1024 * 1024  # larger attachments reach the box as metadata only
MAX_ATTACHMENT_DATA_B64 = 700_000  # all attachment data of one message: a delivery must fit the 1 MiB line
TYPING_FROM_STAGE = frozenset({"render", "send"})  # nothing shows for a turn that ends silent


@dataclass(frozen=True)
class Inbound:
    """A message as a surface hands it in, with the facts the wake rule needs."""

    surface: str
    channel_id: str
    channel_kind: Literal["dm", "guild", "terminal"]
    message: Message
    channel_name: str = ""
    guild_id: str | None = None
    author_is_imp: bool = False
    mentions_imp: bool = False
    mentions_imp_role: bool = False
    replies_to_imp: bool = False
    mentions_everyone: bool = False


RouteOutcome = Literal["ignored", "ambient", "started", "queued", "busy", "refused"]


class Typing(Protocol):
    async def typing(self, channel_id: str, active: bool, *, imp: str = "") -> None: ...  # as that imp's bot


def clean_content(text: str) -> str:
    """Printable text only (no NULs or control bytes), bounded, with the cut made visible."""
    kept = "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch)[0] != "C")
    if len(kept) > MAX_INBOUND_CHARS:
        cut = len(kept) - MAX_INBOUND_CHARS
        kept = kept[:MAX_INBOUND_CHARS] + f"\n[… {cut} more characters not shown]"
    return kept.strip()


def bound_attachments(items: Sequence[Attachment]) -> list[Attachment]:
    bounded = []
    budget = MAX_ATTACHMENT_DATA_B64
    for item in list(items)[:MAX_ATTACHMENTS]:
        data = item.data_b64 or ""
        if item.size > MAX_ATTACHMENT_BYTES or len(data) > budget:
            item = item.model_copy(update={"data_b64": None})  # the box learns it exists, not its bytes
        else:
            budget -= len(data)
        bounded.append(item)
    return bounded


class Conversations:
    """Routes inbound messages of every imp; implements the session manager's events."""

    def __init__(
        self,
        *,
        imps: ImpStore,
        configs: Mapping[str, ImpConfig],
        history: History,
        channels: ChannelStore,
        surface: Surface,
        clock: Clock,
        imp_user_ids: Mapping[str, str] | None = None,
        backends: Mapping[str, BoxBackend] | None = None,
    ) -> None:
        """``backends``: each imp's box backend (the session manager's plan, with init/state dir/settings)."""
        self.backends = dict(backends or {})
        self.imps = imps
        self.configs = dict(configs)
        self.history = history
        self.channels = channels
        self.surface = surface
        self.clock = clock
        self.imp_user_ids = dict(imp_user_ids or {})
        self.sessions: SessionManager | None = None
        self._typing: set[SessionKey] = set()
        self._waiters: dict[
            str, anyio.Event
        ] = {}  # message id -> set when its turn ends (only while awaited)
        self._recently_finished: deque[str] = deque(maxlen=RECENTLY_FINISHED)  # for a waiter that comes late

    def imp_user_id(self, imp: str) -> str:
        return self.imp_user_ids.get(imp, f"imp:{imp}")

    # ------------------------------------------------------------ inbound

    async def receive(self, imp: str, inbound: Inbound) -> RouteOutcome:
        message = inbound.message
        if message.author.bot or inbound.author_is_imp:
            return "ignored"  # bots (other imps included) and the imp itself never wake an imp
        content = clean_content(message.content)
        attachments = bound_attachments(message.attachments)
        if not content and not attachments:
            return "ignored"
        message = message.model_copy(update={"content": content, "attachments": attachments})
        channel = await self.history.db.run(
            self.channels.seen,
            inbound.channel_id,
            surface=inbound.surface,
            kind=inbound.channel_kind,
            name=inbound.channel_name,
            guild_id=inbound.guild_id,
        )
        await self.history.db.run(
            self.history.record, inbound.channel_id, message
        )  # before routing, woken or not
        decision = decide_wake(
            WakeFacts(
                is_dm=inbound.channel_kind in ("dm", "terminal"),
                mode=channel.mode,  # type: ignore[arg-type]
                mentions_imp=inbound.mentions_imp,
                mentions_imp_role=inbound.mentions_imp_role,
                replies_to_imp=inbound.replies_to_imp,
                mentions_everyone=inbound.mentions_everyone,
            )
        )
        if not decision.wake:
            return "ambient"
        await self.history.db.run(self.history.record_wake, imp, inbound.channel_id, message.id)
        return await self._route(
            imp, inbound.channel_id, inbound.channel_kind, message, addressed=decision.addressed
        )

    async def _route(
        self, imp: str, channel_id: str, kind: str, message: Message, *, addressed: bool
    ) -> RouteOutcome:
        assert self.sessions is not None, "attach a SessionManager first"
        recent = await self.history.db.run(self.history.recent, channel_id, imp=imp)
        framing = decide_framing(
            channel_kind=kind,
            addressed=addressed,
            recent=[
                RecentAuthor(e.author.id, e.author.name, e.author.bot or e.from_imp, e.created_at)
                for e in recent
            ],
            imp_id=self.imp_user_id(imp),
            now=self.clock.now(),
        )
        key = SessionKey(imp, channel_id)
        # Framing looks at the whole window; the box gets only what its prompt can use (ENV-07).
        limit = self.configs[imp].model.history_limit if imp in self.configs else len(recent)
        recent = recent[-limit:] if limit else []
        outcome = self.sessions.deliver(Delivery(key, message, framing, recent))
        if outcome == "busy":
            await self.history.db.run(
                self.history.finish, imp, channel_id, [message.id], "busy", "the channel's queue was full"
            )
        return outcome

    async def recover(self) -> int:
        """After a restart: answer woken messages that are still fresh; the stale ones were marked missed."""
        resumed = 0
        for wake in await self.history.db.run(self.history.triage):
            if wake.imp not in self.configs:
                continue
            info = self.channels.info(wake.channel_id)
            kind = info.kind if info else "guild"
            log.info("answering %s in %s after a restart", wake.message.id, wake.channel_id)
            await self._route(
                wake.imp, wake.channel_id, kind, wake.message, addressed=kind in ("dm", "terminal")
            )
            resumed += 1
        return resumed

    # ------------------------------------------------------------ the box's world

    def backend_for(self, imp: str) -> BoxBackend:
        return self.backends[imp]

    async def init_for(self, key: SessionKey, now: datetime) -> BoxInitParams:
        """What a new box of this session is told; the channel and the persona are read off the event loop."""
        config = self.configs[key.imp]
        info = await self.channels.aio.info(key.channel_id)
        imp = await anyio.to_thread.run_sync(self.imps.imp_spec, config)
        kind = info.kind if info and info.kind in ("dm", "guild", "terminal", "task") else "guild"
        return BoxInitParams(
            protocol=1,
            imp=imp,
            session=SessionInfo(
                id=f"{key.imp}:{key.channel_id}", channel_id=key.channel_id, channel_kind=kind,  # type: ignore[arg-type]
                channel_name=info.name if info else "",
            ),
            now=now,
        )  # fmt: skip

    def state_dir_for(self, imp: str) -> Path:
        return self.imps.state_dir(imp)

    def settings_for(self, imp: str) -> SessionSettings:
        sessions = self.configs[imp].sessions
        return SessionSettings(
            mode=sessions.mode,
            idle_s=sessions.idle_s,
            turn_ceiling_s=sessions.turn_ceiling_s,
            session_ceiling_s=sessions.session_ceiling_s,
            queue_limit=sessions.queue_limit,
            failure_notice=sessions.failure_notice or None,
        )

    # ------------------------------------------------------------ SessionEvents

    async def turn_finished(self, key: SessionKey, batch: Sequence[Delivery], result: DeliverResult) -> None:
        ids = [delivery.message.id for delivery in batch]
        await self.history.db.run(
            self.history.finish, key.imp, key.channel_id, ids, result.outcome, result.error
        )
        for message_id in ids:
            self._recently_finished.append(
                message_id
            )  # bounded: a host nobody waits on keeps only the last few
            waiter = self._waiters.pop(message_id, None)
            if waiter is not None:
                waiter.set()

    async def wait_finished(self, message_id: str) -> None:
        """Until the turn that answers this message has ended (the terminal waits before its next prompt)."""
        if message_id in self._recently_finished:
            return
        waiter = self._waiters.setdefault(message_id, anyio.Event())
        try:
            await waiter.wait()
        finally:
            self._waiters.pop(message_id, None)

    async def notice(self, key: SessionKey, text: str) -> None:
        """A host-authored notice (a box died, too busy): posted directly, never a box act."""
        try:
            await self.surface.send(key.channel_id, text, None, (), "notice", imp=key.imp)
        except Exception as exc:  # noqa: BLE001 - a notice that cannot be posted is logged, not fatal
            log.warning("could not post a notice to %s: %s", key.channel_id, exc)

    async def on_stage(self, spec: BoxSpec, params: TurnStageParams) -> None:
        """The gateway forwards the box's ``turn.stage``; typing shows from ``render`` on."""
        key = SessionKey(spec.imp, spec.channel_id)
        if params.stage in TYPING_FROM_STAGE and key not in self._typing:
            self._typing.add(key)
            await self._set_typing(key, True)

    async def turn_ended(self, key: SessionKey) -> None:
        if key in self._typing:
            self._typing.discard(key)
            await self._set_typing(key, False)

    async def _set_typing(self, key: SessionKey, active: bool) -> None:
        try:
            await set_typing(self.surface, key.channel_id, active, key.imp)
        except Exception as exc:  # noqa: BLE001
            log.debug("typing indicator failed in %s: %s", key.channel_id, exc)


class HistorySurface:
    """Wraps a surface so an imp's own posts join the channel history (the box sees its side of the talk).

    Every send names its imp (``imp=``), so one wrapper serves a host with several imps;
    ``default_imp`` covers a caller that does not say (a host with one imp).
    """

    def __init__(
        self,
        inner: Surface,
        history: History,
        imp_user_id: Callable[[str], str],
        clock: Clock,
        *,
        default_imp: str = "",
    ) -> None:
        self.inner = inner
        self.history = history
        self.imp_user_id = imp_user_id
        self.clock = clock
        self.default_imp = default_imp

    async def send(
        self,
        channel_id: str,
        content: str,
        reply_to: str | None,
        files: Sequence[object],
        kind: str,
        *,
        imp: str = "",
    ) -> list[str]:
        imp = imp or self.default_imp
        ids = await self.inner.send(channel_id, content, reply_to, files, kind, imp=imp)  # type: ignore[arg-type]
        if kind in ("reply", "other") and ids and imp:
            message = Message(
                id=ids[0], author=Author(id=self.imp_user_id(imp), name=imp, bot=True), content=content,
                created_at=self.clock.now(),
            )  # fmt: skip
            await self.history.db.run(lambda: self.history.record(channel_id, message, from_imp=imp))
        return ids

    async def typing(self, channel_id: str, active: bool, *, imp: str = "") -> None:
        await set_typing(self.inner, channel_id, active, imp or self.default_imp)


async def set_typing(surface: object, channel_id: str, active: bool, imp: str) -> None:
    """Call the surface's optional ``typing`` (the ``Typing`` protocol) as ``imp``."""
    typing = getattr(surface, "typing", None)
    if typing is not None:
        await typing(channel_id, active, imp=imp)
