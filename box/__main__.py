"""``python -m box``: speak the box protocol on stdin/stdout; log to stderr only."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import anyio

from box.no_plugins import refuse_pydantic_plugins
from box.program import serve
from box.stdio import FdReceiveStream, FdSendStream

DEFAULT_STATE_DIR = "/state"


async def _serve_stdio(protocol_out: int, state_dir: Path) -> None:
    receive = FdReceiveStream(0)
    try:
        await serve(receive, FdSendStream(protocol_out), state_dir)
    finally:
        await receive.aclose()


def main() -> int:
    refuse_pydantic_plugins()  # before the first model is built: the protocol's are built on first use (issue 37)
    # Keep fd 1 for the protocol alone: anything else that writes to stdout lands on stderr.
    protocol_out = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    logging.basicConfig(
        level=os.environ.get("IMPYARD_BOX_LOG_LEVEL", "INFO").upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    state_dir = Path(os.environ.get("IMPYARD_STATE_DIR", DEFAULT_STATE_DIR))
    try:
        anyio.run(_serve_stdio, protocol_out, state_dir)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
