"""``python -m box``: speak the box protocol on stdin/stdout; log to stderr only."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import anyio

from box.program import serve
from box.stdio import FdReceiveStream, FdSendStream

DEFAULT_STATE_DIR = "/state"
# The box loads no pydantic plugin: none is its own, and looking for one reads every installed package's metadata
# when the first validator is built (issue 37: nothing read from disk that the box does not need).
NO_PYDANTIC_PLUGINS = {"PYDANTIC_DISABLE_PLUGINS": "__all__"}


async def _serve_stdio(protocol_out: int, state_dir: Path) -> None:
    receive = FdReceiveStream(0)
    try:
        await serve(receive, FdSendStream(protocol_out), state_dir)
    finally:
        await receive.aclose()


def main() -> int:
    os.environ.update(
        NO_PYDANTIC_PLUGINS
    )  # read when the first model is built: after the imports, before any frame
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
