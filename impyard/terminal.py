"""The terminal surface: ``impyard chat <imp>`` — the whole pipeline, with the operator as the person.

Terminal messages wake the imp always (like a DM) and are framed ``respond``;
the terminal channel is trusted, so the imp's replies there are auto-approved,
while every other act is judged by the gateway as usual.
"""

from __future__ import annotations

import getpass
import os
import signal
import sys
import uuid
from collections.abc import Sequence
from typing import TextIO

import anyio

from box.protocol.models import Author, Message
from impyard.backends.process import NO_LOCKDOWN_WARNING
from impyard.clock import Clock, SystemClock
from impyard.inbound import Inbound
from impyard.runtime import Runtime, open_runtime
from impyard.surfaces import OutgoingFile
from impyard.wake import CHANNEL_MODES

HELP = "Type a message and press Enter. /quit leaves, /mode [all|mention] shows or sets this channel's mode."


class ChatSurface:
    """Prints the imp's posts, notices and a typing line for the operator."""

    def __init__(self, imp: str, out: TextIO) -> None:
        self.imp = imp
        self.out = out
        self._count = 0

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

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
        label = {"notice": "(impyard)", "staff": f"{self.imp} [staff]"}.get(kind, self.imp)
        lines = [f"{label}> {content}"]
        lines += [f"  [attached {item.filename}, {len(item.data)} bytes]" for item in files]
        self._write("\r" + "\n".join(lines) + "\n")
        return [f"term-{uuid.uuid4().hex[:12]}"]

    async def typing(self, channel_id: str, active: bool, *, imp: str = "") -> None:
        if active:
            self._write(f"\r({self.imp} is typing…)\n")


class LineReader:
    """Reads lines from a file descriptor without a thread, so a signal can always end the wait."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = b""
        self._eof = False

    async def readline(self) -> str | None:
        while b"\n" not in self._buffer and not self._eof:
            await anyio.wait_readable(self.fd)
            chunk = os.read(self.fd, 65536)  # readable: returns at once, never blocks
            self._eof = not chunk
            self._buffer += chunk
        if b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
        elif self._buffer:
            line, self._buffer = self._buffer, b""
        else:
            return None
        return line.decode("utf-8", errors="replace").rstrip("\r")


async def _chat_loop(
    runtime: Runtime, imp: str, channel_id: str, user: str, stdin: LineReader, out: TextIO, clock: Clock
) -> None:
    turn_ceiling = runtime.conversations.settings_for(imp).turn_ceiling_s
    while True:
        out.write("you> ")
        out.flush()
        line = await stdin.readline()
        if line is None or line.strip() in ("/quit", "/exit"):
            return
        text = line.strip()
        if not text:
            continue
        if text.startswith("/mode"):
            parts = text.split()
            if len(parts) == 1:
                mode = await runtime.channels.aio.mode(channel_id)
                out.write(f"(impyard) this channel's mode is {mode}; the terminal always wakes {imp}\n")
            elif parts[1] in CHANNEL_MODES:
                await runtime.channels.aio.set_mode(channel_id, parts[1])
                out.write(f"(impyard) mode set to {parts[1]}\n")
            else:
                out.write("(impyard) use /mode all or /mode mention\n")
            continue
        if text in ("/help", "/?"):
            out.write(f"(impyard) {HELP}\n")
            continue
        message = Message(
            id=f"t-{uuid.uuid4().hex[:16]}", author=Author(id=f"terminal:{user}", name=user), content=line,
            created_at=clock.now(),
        )  # fmt: skip
        routed = await runtime.conversations.route(
            imp,
            Inbound(
                surface="terminal",
                channel_id=channel_id,
                channel_kind="terminal",
                message=message,
                channel_name="terminal",
            ),
        )
        if routed.outcome == "busy":
            out.write(f"(impyard) {imp} is too busy; that message will go unanswered\n")
        with anyio.move_on_after(turn_ceiling + 15):  # the session's own ceiling ends it first
            await routed.finished()  # the next prompt waits for this turn (at once when none will answer)


async def run_chat(
    imp: str, *, backend: str | None = None, stdin: TextIO | None = None, out: TextIO | None = None
) -> None:
    reader = LineReader((stdin or sys.stdin).fileno())
    out = out or sys.stdout
    clock = SystemClock()
    user = getpass.getuser()
    channel_id = f"terminal:{user}"
    surface = ChatSurface(imp, out)
    async with open_runtime([imp], surface, backend=backend, clock=clock) as runtime:
        chosen = runtime.backends[imp].name
        if chosen == "process":
            out.write(f"\n!!! {NO_LOCKDOWN_WARNING}\n\n")
        out.write(f"Chatting with {imp} ({chosen} backend). {HELP}\n")
        async with anyio.create_task_group() as tg:

            async def stop_on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for _ in signals:
                        out.write("\n(impyard) stopping…\n")
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(stop_on_signal)
            await _chat_loop(runtime, imp, channel_id, user, reader, out, clock)
            tg.cancel_scope.cancel()
    out.write("(impyard) bye\n")
    out.flush()
