"""Where acts land: the Surface interface the gateway executes sends through (docs/security.md).

The Discord adapter (``impyard.discord.surface``) implements the same protocol; here are a
recording surface for tests and a terminal surface that prints.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields
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


@dataclass(frozen=True)
class Post:
    """One post as the host makes it: into which channel, its text, the message it answers, its files, its kind
    (``reply``, ``other``, ``notice``, ``staff``…) and the imp whose bot posts it ("" where the host has one)."""

    channel_id: str
    content: str
    reply_to: str | None = None
    files: tuple[OutgoingFile, ...] = ()
    kind: str = "reply"
    imp: str = ""


class Surface(Protocol):
    async def send(self, post: Post) -> list[str]:
        """Post as ``post.imp`` (each imp is its own bot) and return the message ids (several when chunked)."""
        ...


@dataclass(frozen=True)
class SentMessage(Post):
    """A post a ``RecordingSurface`` took, with the message ids it answered."""

    message_ids: tuple[str, ...] = ()


@dataclass
class RecordingSurface:
    """Records every send; ``fail_with`` makes the next sends fail (for failure paths)."""

    sent: list[SentMessage] = field(default_factory=list)
    fail_with: str | None = None
    delay_s: float = 0.0  # widen race windows in concurrency tests

    async def send(self, post: Post) -> list[str]:
        if self.delay_s:
            await anyio.sleep(self.delay_s)
        if self.fail_with is not None:
            raise SurfaceError(self.fail_with)
        ids = (f"rec-{len(self.sent) + 1}",)
        self.sent.append(
            SentMessage(**{item.name: getattr(post, item.name) for item in fields(post)}, message_ids=ids)
        )
        return list(ids)


class TerminalSurface:
    """Prints sends to a stream (the operator's terminal)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self._count = 0

    async def send(self, post: Post) -> list[str]:
        self._count += 1
        header = (
            f"[{post.channel_id}]"
            + (f" (reply to {post.reply_to})" if post.reply_to else "")
            + (f" <{post.kind}>" if post.kind != "reply" else "")
        )
        lines = [header, post.content]
        lines += [f"  [file {item.filename}, {len(item.data)} bytes]" for item in post.files]
        self.stream.write("\n".join(lines) + "\n")
        self.stream.flush()
        return [f"term-{self._count}"]


class NoSurface:
    """A gateway that posts nothing (``impyard doctor``, ``policy check``, ``memory`` queries): a send fails with
    ``reason``; the acts these run never get that far."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    async def send(self, post: Post) -> list[str]:
        raise SurfaceError(self.reason)
