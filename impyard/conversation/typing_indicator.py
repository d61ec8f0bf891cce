"""The typing indicator (docs/conversation.md): a thin wrapper around a turn, driven by the box's ``turn.stage``.

Each session has one ``TypingIndicator`` as its observer (``impyard.conversation.sessions.TurnObserver``): the session
manager hands it the stages of that session's box and tells it when each turn ends, on every path. It shows
from ``render`` on, so a turn that ends silent shows nothing. A surface that shows where a turn is (the
terminal's status line: ``ShowsStage``) hears every stage, and None when the turn ends.
"""

from __future__ import annotations

import logging
from typing import Protocol

from box.protocol.models import TurnStageParams

log = logging.getLogger("impyard.conversation")

TYPING_FROM_STAGE = frozenset({"render", "send"})  # nothing shows for a turn that ends silent


class Typing(Protocol):
    async def typing(self, channel_id: str, active: bool, *, imp: str = "") -> None: ...  # as that imp's bot


class ShowsStage(Protocol):
    """A surface that shows where a turn is: each stage as the box announces it, None when the turn ended."""

    async def turn_stage(self, channel_id: str, stage: str | None, *, imp: str = "") -> None: ...


async def set_typing(surface: object, channel_id: str, active: bool, imp: str) -> None:
    """Call the surface's optional ``typing`` (the ``Typing`` protocol) as ``imp``."""
    typing = getattr(surface, "typing", None)
    if typing is not None:
        await typing(channel_id, active, imp=imp)


class TypingIndicator:
    """One session's indicator: on at the first stage that leads to a post, off when the turn ends."""

    def __init__(self, surface: object, channel_id: str, imp: str) -> None:
        self.surface = surface
        self.channel_id = channel_id
        self.imp = imp
        self.active = False

    async def stage(self, params: TurnStageParams) -> None:
        await self._show_stage(params.stage)
        if params.stage in TYPING_FROM_STAGE and not self.active:
            self.active = True
            await self._set(True)

    async def turn_ended(self) -> None:
        await self._show_stage(None)
        if self.active:
            self.active = False
            await self._set(False)

    async def _show_stage(self, stage: str | None) -> None:
        show = getattr(self.surface, "turn_stage", None)  # optional: the ``ShowsStage`` protocol
        if show is None:
            return
        try:
            await show(self.channel_id, stage, imp=self.imp)
        except Exception as exc:  # noqa: BLE001 - cosmetic, like typing
            log.debug("showing the stage failed in %s: %s", self.channel_id, exc)

    async def _set(self, active: bool) -> None:
        try:
            await set_typing(self.surface, self.channel_id, active, self.imp)
        except Exception as exc:  # noqa: BLE001 - cosmetic: a surface that cannot show it changes nothing
            log.debug("typing indicator failed in %s: %s", self.channel_id, exc)
