"""A misbehaving box program for host-side tests. Its behaviour is the first argument."""

from __future__ import annotations

import json
import sys
import time


def reply(frame_id: object, result: object) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": frame_id, "result": result}) + "\n")
    sys.stdout.flush()


def main(mode: str) -> None:
    for line in sys.stdin:
        frame = json.loads(line)
        if frame.get("method") == "box.init":
            reply(frame["id"], {"protocol": 1, "box": "bad"})
            continue
        if frame.get("method") == "box.shutdown" and mode == "bad-request":
            reply(frame["id"], {})
            return
        if mode == "garbage":
            sys.stdout.write("<html>surprise</html>\n")
            sys.stdout.flush()
        elif mode == "exit":
            sys.exit(3)
        elif mode == "silent":
            pass
        elif mode == "flood":
            sys.stdout.write("x" * (2 * 1024 * 1024) + "\n")
            sys.stdout.flush()
        elif mode == "extra-field":
            reply(frame["id"], {"outcome": "sent", "message_ids": [], "error": None, "sneaky": True})
        elif mode == "bad-request":
            bad = {
                "jsonrpc": "2.0",
                "id": "b1",
                "method": "model.request",
                "params": {"path": "/v9", "body": {}, "purpose": "reply"},
            }
            sys.stdout.write(json.dumps(bad) + "\n")
            sys.stdout.flush()
            json.loads(sys.stdin.readline())  # the host's error answer
            reply(frame["id"], {"outcome": "failed", "message_ids": [], "error": "refused"})
        elif mode == "wrong-type":
            reply(frame["id"], {"outcome": "exploded"})
        time.sleep(0.01)
    time.sleep(60)


if __name__ == "__main__":
    main(sys.argv[1])
