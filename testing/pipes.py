"""In-memory byte streams, so two protocol peers can talk inside one test."""

from __future__ import annotations

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream


class MemoryByteSend(ByteSendStream):
    def __init__(self, stream: MemoryObjectSendStream[bytes]) -> None:
        self._stream = stream

    async def send(self, item: bytes) -> None:
        await self._stream.send(item)

    def close(self) -> None:
        """At once, as a dead process's end of a pipe closes: the reader gets EOF."""
        self._stream.close()

    async def aclose(self) -> None:
        self.close()


class MemoryByteReceive(ByteReceiveStream):
    def __init__(self, stream: MemoryObjectReceiveStream[bytes]) -> None:
        self._stream = stream

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return await self._stream.receive()

    def close(self) -> None:
        """At once, as a dead process's end of a pipe closes: the writer gets a broken pipe."""
        self._stream.close()

    async def aclose(self) -> None:
        self.close()


def byte_pipe() -> tuple[MemoryByteSend, MemoryByteReceive]:
    send, receive = anyio.create_memory_object_stream[bytes](100)
    return MemoryByteSend(send), MemoryByteReceive(receive)
