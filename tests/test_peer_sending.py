"""How the peer puts lines on its stream (issue 18): a free pipe costs no turn of the event loop, a cancelled
task sends nothing, and lines from tasks sending at once never interleave."""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio
import pytest
from anyio.abc import ByteSendStream
from pydantic import BaseModel

from box.protocol import BOX_METHODS, HOST_METHODS, Peer
from box.protocol.models import LogParams, TurnStageParams
from testing.pipes import byte_pipe

pytestmark = pytest.mark.anyio


@dataclass
class Stream(ByteSendStream):
    """Takes each line as the box's stdout does when the pipe has room: at once, no await that yields. With
    ``stall``, it takes half a line, waits for ``go``, then the rest (a full pipe)."""

    written: bytearray = field(default_factory=bytearray)
    stall: bool = False
    go: anyio.Event = field(default_factory=anyio.Event)

    async def send(self, item: bytes) -> None:
        if not self.stall:
            self.written += item
            return
        half = len(item) // 2
        self.written += item[:half]
        await self.go.wait()
        self.written += item[half:]

    async def aclose(self) -> None:
        pass


async def _handler(method: str, params: BaseModel) -> BaseModel | None:
    return None


def box_peer(stream: Stream) -> Peer:
    _, receive = byte_pipe()
    return Peer(receive, stream, serves=BOX_METHODS, calls=HOST_METHODS, handler=_handler)


STAGE = TurnStageParams(message_id="m1", stage="context")
STAGE_LINE = b'{"jsonrpc":"2.0","method":"turn.stage","params":{"message_id":"m1","stage":"context"}}\n'


async def test_a_line_on_a_free_pipe_takes_no_turn_of_the_event_loop() -> None:
    stream = Stream()
    peer = box_peer(stream)
    others: list[str] = []

    async def other() -> None:
        others.append("ran")

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)  # runs at the first turn of the loop
        await peer.notify("turn.stage", STAGE)
        await peer.notify("turn.stage", STAGE)
        assert others == []  # the notifications went out without yielding
        assert bytes(stream.written) == STAGE_LINE * 2
    assert others == ["ran"]


async def test_a_cancelled_task_sends_nothing() -> None:
    stream = Stream()
    peer = box_peer(stream)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await peer.notify("turn.stage", STAGE)
    assert scope.cancelled_caught and stream.written == b""


async def test_lines_sent_at_once_never_interleave() -> None:
    stream = Stream(stall=True)
    peer = box_peer(stream)
    log = LogParams(level="info", message="x" * 200)
    async with anyio.create_task_group() as tg:
        tg.start_soon(peer.notify, "log", log)
        tg.start_soon(peer.notify, "turn.stage", STAGE)
        tg.start_soon(peer.notify, "log", log)
        await anyio.wait_all_tasks_blocked()
        stream.go.set()
    lines = bytes(stream.written).splitlines(keepends=True)
    log_line = (
        b'{"jsonrpc":"2.0","method":"log","params":{"level":"info","message":"'
        + b"x" * 200
        + b'","fields":{}}}\n'
    )
    assert sorted(lines) == sorted([log_line, STAGE_LINE, log_line])
