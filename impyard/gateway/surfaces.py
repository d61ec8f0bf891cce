"""Where acts land: the Surface interface the gateway executes sends through (docs/security.md).

The Discord adapter (``impyard.discord.surface``) implements the same protocol; here are a
recording surface for tests and a terminal surface that prints.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TextIO

import anyio

from impyard.errors import ImpyardError


@dataclass(frozen=True)
class OutgoingFile:
    filename: str
    data: bytes


class SurfaceError(ImpyardError):
    """The surface could not deliver (the platform refused or is unreachable)."""


SURFACE_DISCORD = "discord"
SURFACE_TERMINAL = "terminal"
SURFACE_LOG = "log"  # host-side channels such as a task's log (task:<imp>): any host prints or logs them


def surface_of(channel_id: str, recorded: str | None = None) -> str:
    """The surface a channel lives on: a host-side id says it (``terminal:``, ``task:``); else the surface its
    messages arrived through; else a Discord snowflake is Discord's.

    A host executes an act only where its own surface reaches the channel (issue 12): a supervisor with
    no Discord connection never "delivers" a Discord post by printing it.
    """
    if channel_id.startswith("terminal:"):
        return SURFACE_TERMINAL
    if channel_id.startswith("task:"):
        return SURFACE_LOG
    if recorded:
        return recorded
    if channel_id.isdigit():
        return SURFACE_DISCORD
    return SURFACE_LOG


class Surface(Protocol):
    async def send(
        self,
        channel_id: str,
        content: str,
        reply_to: str | None,
        files: Sequence[OutgoingFile],
        kind: str,
        *,
        imp: str = "",
    ) -> list[str]:
        """Post as ``imp`` (each imp is its own bot) and return the message ids (several when chunked)."""
        ...


@dataclass(frozen=True)
class SentMessage:
    channel_id: str
    content: str
    reply_to: str | None
    files: tuple[OutgoingFile, ...]
    kind: str
    message_ids: tuple[str, ...]
    imp: str = ""


@dataclass
class RecordingSurface:
    """Records every send; ``fail_with`` makes the next sends fail (for failure paths)."""

    sent: list[SentMessage] = field(default_factory=list)
    fail_with: str | None = None
    delay_s: float = 0.0  # widen race windows in concurrency tests

    async def send(
        self,
        channel_id: str,
        content: str,
        reply_to: str | None,
        files: Sequence[OutgoingFile],
        kind: str,
        *,
        imp: str = "",
    ) -> list[str]:
        if self.delay_s:
            await anyio.sleep(self.delay_s)
        if self.fail_with is not None:
            raise SurfaceError(self.fail_with)
        ids = (f"rec-{len(self.sent) + 1}",)
        self.sent.append(SentMessage(channel_id, content, reply_to, tuple(files), kind, ids, imp))
        return list(ids)


class TerminalSurface:
    """Prints sends to a stream (the operator's terminal)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self._count = 0

    async def send(
        self,
        channel_id: str,
        content: str,
        reply_to: str | None,
        files: Sequence[OutgoingFile],
        kind: str,
        *,
        imp: str = "",
    ) -> list[str]:
        self._count += 1
        header = (
            f"[{channel_id}]"
            + (f" (reply to {reply_to})" if reply_to else "")
            + (f" <{kind}>" if kind != "reply" else "")
        )
        lines = [header, content]
        lines += [f"  [file {item.filename}, {len(item.data)} bytes]" for item in files]
        self.stream.write("\n".join(lines) + "\n")
        self.stream.flush()
        return [f"term-{self._count}"]
