"""The box's stdin (issue 18): on asyncio a pipe is read by asyncio's own transport, which keeps the descriptor
registered instead of registering it for every read; everything written arrives, in order; the buffer stays
bounded when the peer does not read; the descriptor is never closed; anything but a pipe is read the portable
way."""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from anyio.lowlevel import checkpoint

from box.stdio import FdReceiveStream

pytestmark = pytest.mark.anyio

F_GETPIPE_SZ = 1032  # Linux
TRANSPORT_READ_BYTES = 256 * 1024  # what asyncio's pipe transport reads at most at once
UNREAD_BYTES = 2 * 65_536  # past this much unread, the transport stops reading


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    """A pipe; the test closes its write end, the fixture the read end (which the stream never closes)."""
    read_fd, write_fd = os.pipe()
    yield read_fd, write_fd
    os.close(read_fd)


def _write_and_close(fd: int, data: bytes) -> None:
    os.set_blocking(fd, True)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.close(fd)


async def _drain(stream: FdReceiveStream) -> bytes:
    got = bytearray()
    while True:
        try:
            got += await stream.receive()
        except anyio.EndOfStream:
            return bytes(got)


async def test_a_pipe_is_read_through_the_transport_and_every_byte_arrives(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    stream = FdReceiveStream(read_fd)
    os.write(write_fd, b'{"a":1}\n{"b"')
    first = await stream.receive()
    assert isinstance(stream._transport, asyncio.ReadTransport)
    async with anyio.create_task_group() as tg:  # more than the pipe holds: written while it is read
        tg.start_soon(anyio.to_thread.run_sync, _write_and_close, write_fd, b":2}\n" + b"x" * 200_000)
        rest = await _drain(stream)
    assert first + rest == b'{"a":1}\n{"b":2}\n' + b"x" * 200_000
    with pytest.raises(anyio.EndOfStream):
        await stream.receive()
    await stream.aclose()
    os.fstat(read_fd)  # still the box's: neither EOF nor aclose closed it


async def test_the_buffer_stays_bounded_when_nobody_reads(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    os.set_blocking(write_fd, False)
    stream = FdReceiveStream(read_fd)
    os.write(write_fd, b"x")
    assert await stream.receive() == b"x"  # connected; from now on nobody reads
    chunk = b"y" * 65_536
    written = 0
    while written < 8 * 1024 * 1024:
        try:
            written += os.write(write_fd, chunk)
            continue
        except BlockingIOError:
            for _ in range(20):  # turns of the loop: an unpaused transport empties the pipe meanwhile
                await checkpoint()
        try:
            written += os.write(write_fd, chunk)
        except BlockingIOError:
            break  # the pipe stays full: the transport stopped reading
    pipe_size = fcntl.fcntl(write_fd, F_GETPIPE_SZ)
    assert written <= UNREAD_BYTES + TRANSPORT_READ_BYTES + pipe_size + len(chunk)
    os.close(write_fd)
    assert len(await _drain(stream)) == written  # nothing lost while it waited


async def test_a_regular_file_is_read_the_portable_way(tmp_path: Path) -> None:
    path = tmp_path / "frames"
    path.write_bytes(b'{"a":1}\n' * 10_000)
    fd = os.open(path, os.O_RDONLY)
    try:
        stream = FdReceiveStream(fd)
        assert await _drain(stream) == b'{"a":1}\n' * 10_000
        assert stream._transport is None
        os.fstat(fd)
    finally:
        os.close(fd)


async def test_closing_the_stream_stops_reading_and_leaves_the_descriptor(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    stream = FdReceiveStream(read_fd)
    os.write(write_fd, b"a")
    assert await stream.receive() == b"a"
    await stream.aclose()
    os.write(write_fd, b"b")
    for _ in range(20):  # turns of the loop: a transport still reading would take the byte meanwhile
        await checkpoint()
    assert os.read(read_fd, 10) == b"b"
    os.close(write_fd)
