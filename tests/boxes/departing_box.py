"""The real box program with a stand-in memory engine, for the host's departure tests (mechanism 103).

Everything but the engine is real: the protocol over stdin/stdout, ``box.program.BoxProgram`` (its task
dispatch, ``depart`` included), the responder and its model calls through the host's gateway. The stand-in
engine keeps a conversation the way the real one does, through the host's store: a committed turn saves it
(``memory.conversation.put``). A departure reads it back through the same store, so the scopes the host
opened for the task's box decide what it finds, and answers what it saw as JSON after ``departed ``.

Usage: ``departing_box.py [MODE]``; MODE ``report`` (the default) or ``fail`` (the departure raises).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the box package, as the process backend does

import anyio  # noqa: E402

from box.common.envelope import Envelope  # noqa: E402
from box.memory import NO_TURN, CommittedTurn, MemoryTurn, TurnFacts  # noqa: E402
from box.memory.store_client import StoreClient, StoreUnavailable  # noqa: E402
from box.program import BoxProgram  # noqa: E402
from box.protocol import BOX_METHODS, HOST_METHODS, Peer  # noqa: E402
from box.stdio import FdReceiveStream, FdSendStream  # noqa: E402


class Keeps:
    """A turn that keeps only the conversation (its person and their last input), as the real engine does."""

    rules: str | None = None

    def __init__(self, engine: StandIn, facts: TurnFacts) -> None:
        self.engine = engine
        self.facts = facts

    def block(self) -> str | None:
        return None

    async def next_hop(self, draft: Envelope) -> bool:
        return False

    async def commit(self, turn: CommittedTurn) -> None:
        author = self.facts.message.author
        state = {
            "version": 1,
            "person": author.name,
            "person_id": author.id,
            "last_input_at": self.facts.now.isoformat(),
        }
        await self.engine.store().conversation_put(author.id, state)


class StandIn:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.program: BoxProgram | None = None

    def store(self) -> StoreClient:
        assert self.program is not None and self.program.peer is not None
        return StoreClient(self.program.peer)

    async def begin(self, facts: TurnFacts) -> MemoryTurn:
        assert self.program is not None and self.program.init is not None
        if facts.task or self.program.init.memory is None:
            return NO_TURN
        return Keeps(self, facts)

    async def search(self, query: str, limit: int) -> list[str]:
        return []

    async def record_event(self, channel_id: str, text: str) -> None:
        return None

    async def depart(self, *, person_id: str, now: datetime) -> str:
        if self.mode == "fail":
            raise RuntimeError("the stand-in cannot think today")
        assert self.program is not None and self.program.init is not None
        init = self.program.init
        try:
            got = await self.store().conversation_get(person_id)
            found = got.state
        except StoreUnavailable as exc:
            found = {"refused": str(exc)[:200]}
        seen = {
            "person": person_id,
            "now": now.isoformat(),
            "channel_id": init.session.channel_id,
            "channel_kind": init.session.channel_kind,
            "channel_name": init.session.channel_name,
            "writes": init.memory.writes if init.memory else None,
            "reads": init.memory.reads if init.memory else None,
            "conversation": found,
        }
        return "departed " + json.dumps(seen, sort_keys=True)


async def serve(mode: str, state_dir: Path, protocol_out: int) -> None:
    engine = StandIn(mode)
    program = BoxProgram(state_dir, memory=engine)
    engine.program = program
    peer = Peer(
        FdReceiveStream(0), FdSendStream(protocol_out), serves=BOX_METHODS, calls=HOST_METHODS,
        handler=program.handle, stop_after=frozenset({"box.shutdown"}),
    )  # fmt: skip
    program.attach(peer)
    await peer.run()


def main() -> None:
    protocol_out = os.dup(1)  # fd 1 for the protocol alone, as ``python -m box`` keeps it
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    mode = sys.argv[1] if len(sys.argv) > 1 else "report"
    anyio.run(serve, mode, Path(os.environ["IMPYARD_STATE_DIR"]), protocol_out)


if __name__ == "__main__":
    main()
