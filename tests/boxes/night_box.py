"""A stand-in box for the host's memory clock tests (issue 15): it answers ``reflect`` and ``sleep`` tasks.

The protocol is real (``box.protocol.Peer`` over stdin/stdout, every frame checked by the protocol's models)
and so is the host's store: a ``sleep`` task asks the host ``memory.night`` (the records of its writes scope
since ``args.since``) and ``memory.forget``, as the real engine's night does, so the scopes the host opened
for the box decide what it finds and what is forgotten. No model is called. Each task answers ``done`` with
what it saw as JSON after ``reflected `` or ``slept ``.

Usage: ``night_box.py [MODE]``; MODE ``report`` (the default) or ``fail`` (every task fails).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the box package, as the process backend does

import anyio  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from box.memory.store_client import StoreClient, StoreUnavailable  # noqa: E402
from box.protocol import BOX_METHODS, HOST_METHODS, ErrorCode, Peer, RpcError  # noqa: E402
from box.protocol.base import Empty  # noqa: E402
from box.protocol.models import BoxInitParams, BoxInitResult, TaskRunParams, TaskRunResult  # noqa: E402
from box.stdio import FdReceiveStream, FdSendStream  # noqa: E402


class NightBox:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.peer: Peer | None = None
        self.init: BoxInitParams | None = None

    async def handle(self, method: str, params: BaseModel) -> BaseModel | None:
        if method == "box.init":
            assert isinstance(params, BoxInitParams)
            self.init = params
            return BoxInitResult(protocol=1, box="night-stand-in")
        if method == "box.shutdown":
            return Empty()
        if method == "task.run":
            assert isinstance(params, TaskRunParams)
            return await self.run(params)
        raise RpcError(ErrorCode.METHOD_NOT_FOUND, f"method not found: {method}")

    async def run(self, params: TaskRunParams) -> TaskRunResult:
        assert self.init is not None and self.peer is not None
        if self.mode == "fail":
            return TaskRunResult(outcome="failed", summary="the stand-in cannot sleep today")
        init = self.init
        seen: dict[str, Any] = {
            "kind": params.task.kind,
            "args": params.task.args,
            "now": params.now.isoformat(),
            "channel_id": init.session.channel_id,
            "channel_kind": init.session.channel_kind,
            "writes": init.memory.writes if init.memory else None,
            "reads": init.memory.reads if init.memory else None,
        }
        if params.task.kind == "sleep" and init.memory is not None:
            store = StoreClient(self.peer)
            try:
                since = datetime.fromisoformat(str(params.task.args["since"]))
                night = await store.night(since)
                seen["night"] = sorted(view.conclusion for view in night.records)
                forgot = await store.forget()
                seen["forgot"] = forgot.forgotten
            except StoreUnavailable as exc:
                seen["refused"] = str(exc)[:200]
        word = {"reflect": "reflected", "sleep": "slept"}.get(params.task.kind, params.task.kind)
        return TaskRunResult(outcome="done", summary=f"{word} " + json.dumps(seen, sort_keys=True))


async def serve(mode: str, protocol_out: int) -> None:
    program = NightBox(mode)
    peer = Peer(
        FdReceiveStream(0), FdSendStream(protocol_out), serves=BOX_METHODS, calls=HOST_METHODS,
        handler=program.handle, stop_after=frozenset({"box.shutdown"}),
    )  # fmt: skip
    program.peer = peer
    await peer.run()


def main() -> None:
    protocol_out = os.dup(1)  # fd 1 for the protocol alone, as ``python -m box`` keeps it
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    anyio.run(serve, sys.argv[1] if len(sys.argv) > 1 else "report", protocol_out)


if __name__ == "__main__":
    main()
