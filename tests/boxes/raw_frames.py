"""What the hostile box programs share: NDJSON frames written and read by hand, past the box's own peer.

Imported by the programs in this folder (run as scripts, so this folder is first on their path). A program
that speaks raw frames can send what the real box never would: that is what the host is tried against.
"""

from __future__ import annotations

import json
import sys
from typing import Any

STDIN = sys.stdin
NEXT_ID = [0]  # requests sent so far


def write(frame: object) -> None:
    sys.stdout.write(json.dumps(frame) + "\n")
    sys.stdout.flush()


def reply(frame_id: object, result: object) -> None:
    write({"jsonrpc": "2.0", "id": frame_id, "result": result})


def ask(method: str, params: dict[str, Any], prefix: str = "h") -> dict[str, Any]:
    """One request; waits for its answer: {"result": …} or {"error": {"code", "message", "data"}}."""
    NEXT_ID[0] += 1
    frame_id = f"{prefix}{NEXT_ID[0]}"
    write({"jsonrpc": "2.0", "id": frame_id, "method": method, "params": params})
    for line in STDIN:
        try:
            frame = json.loads(line)
        except ValueError:
            continue
        if isinstance(frame, dict) and frame.get("id") == frame_id and "method" not in frame:
            if "error" in frame:
                error = frame["error"]
                return {"error": {k: error.get(k) for k in ("code", "message", "data")}}
            return {"result": frame.get("result")}
    raise SystemExit(0)  # the host closed the pipe
