"""Non-blocking anyio byte streams over the box's stdin and stdout file descriptors.

On asyncio, stdin (a pipe: the process backend's, or the container's) is read by asyncio's own pipe transport,
which keeps the descriptor registered with the event loop and reads as soon as bytes arrive; waiting for each
read with ``anyio.wait_readable`` registers and unregisters it every time, and tries a read that fails first
(three system calls and a turn of the loop per frame, issue 18). Its buffer is bounded: past
``2 × READ_LIMIT_BYTES`` unread, the transport stops reading until the peer catches up. Anything else (a
regular file, another event loop) is read the portable way.
"""

from __future__ import annotations

import asyncio
import os
import stat

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream

READ_LIMIT_BYTES = 65_536  # asyncio's StreamReader pauses its transport past twice this much unread


def _is_pipe(fd: int) -> bool:
    """What asyncio's pipe transport takes: a pipe, a socket or a character device."""
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode)


class FdReceiveStream(ByteReceiveStream):
    def __init__(self, fd: int) -> None:
        self._fd = fd
        os.set_blocking(fd, False)
        self._pipe = _is_pipe(fd)
        self._reader: asyncio.StreamReader | None = None
        self._transport: asyncio.ReadTransport | None = None

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._reader is None and self._pipe:
            self._reader = await self._connect()
        if self._reader is not None:
            data = await self._reader.read(max_bytes)
            if not data:
                raise anyio.EndOfStream
            return data
        while True:
            try:
                data = os.read(self._fd, max_bytes)
            except BlockingIOError:
                await anyio.wait_readable(self._fd)
                continue
            if not data:
                raise anyio.EndOfStream
            return data

    async def _connect(self) -> asyncio.StreamReader | None:
        """asyncio's transport on the descriptor, once; None (read the portable way) on another event loop."""
        self._pipe = False  # asked once, whatever the answer
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        reader = asyncio.StreamReader(limit=READ_LIMIT_BYTES, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        # closefd=False: the transport closes its file object at EOF, never the box's descriptor.
        pipe = os.fdopen(self._fd, "rb", buffering=0, closefd=False)
        self._transport, _ = await loop.connect_read_pipe(lambda: protocol, pipe)
        return reader

    async def aclose(self) -> None:
        """Stop reading (the descriptor stays open)."""
        if self._transport is not None:
            self._transport.close()


class FdSendStream(ByteSendStream):
    def __init__(self, fd: int) -> None:
        self._fd = fd
        os.set_blocking(fd, False)

    async def send(self, item: bytes) -> None:
        view = memoryview(item)
        while view:
            try:
                written = os.write(self._fd, view)
            except BlockingIOError:
                await anyio.wait_writable(self._fd)
                continue
            except (BrokenPipeError, OSError) as exc:
                raise anyio.BrokenResourceError from exc
            view = view[written:]

    async def aclose(self) -> None:
        pass
