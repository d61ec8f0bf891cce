"""A hostile box program: it answers box.init like a real box, then attacks the host on mailbox.deliver.

Its attack is the first argument (issue 11). It speaks raw NDJSON on stdin/stdout, as any program
inside a box could; the host must survive every attack, and only this box may end.
"""

from __future__ import annotations

import json
import sys
import time


def write(frame: object) -> None:
    sys.stdout.write(json.dumps(frame) + "\n")
    sys.stdout.flush()


def reply(frame_id: object, result: object) -> None:
    write({"jsonrpc": "2.0", "id": frame_id, "result": result})


def model_request(n: int, padding: int = 0) -> dict[str, object]:
    body = {"model": "gpt-4.1-mini", "messages": [{"role": "user", "content": "x" * padding}]}
    return {"jsonrpc": "2.0", "id": f"r{n}", "method": "model.request",
            "params": {"path": "/chat/completions", "body": body, "purpose": "reply"}}  # fmt: skip


def attack(mode: str) -> None:
    if mode == "deep":  # 100,000 levels, 200 KB: far under the line limit (issue 11 #1)
        sys.stdout.write("[" * 100_000 + "]" * 100_000 + "\n")
        sys.stdout.flush()
    elif mode == "deep-params":  # a valid frame whose params nest just too deep for the protocol
        nested: object = "x"
        for _ in range(200):
            nested = [nested]
        write(
            {
                "jsonrpc": "2.0",
                "method": "log",
                "params": {"level": "info", "message": "m", "fields": {"a": nested}},
            }
        )
    elif mode == "request-flood":  # requests that are never read back (issue 11 #6)
        for n in range(200):
            sys.stdout.write(json.dumps(model_request(n, padding=100_000)) + "\n")
        sys.stdout.flush()
    elif mode == "log-flood":  # (issue 11 #8)
        for n in range(20_000):
            write({"jsonrpc": "2.0", "method": "log", "params": {"level": "error", "message": f"flood {n}"}})
    elif mode == "log-repeat":  # the same line, over and over: folded, then killed
        for _ in range(20_000):
            write({"jsonrpc": "2.0", "method": "log", "params": {"level": "error", "message": "same"}})
    elif mode == "log-forge":
        forged = "hello\n2026-12-03 06:00:00 ERROR impyard.gateway.core: budget reset by operator\x1b[2J"
        write({"jsonrpc": "2.0", "method": "log", "params": {"level": "warning", "message": forged}})
    elif mode == "refusal-flood":
        for n in range(5_000):
            write({"jsonrpc": "2.0", "id": f"b{n}", "method": "model.request", "params": {"path": "/v9"}})
    elif mode == "refused-repeat":  # the same invalid request 3 times, then another (issue 38: folding)
        for n in range(3):
            write({"jsonrpc": "2.0", "id": f"v{n}", "method": "model.request", "params": {"path": "/v9"}})
        write({"jsonrpc": "2.0", "id": "u0", "method": "nope.method", "params": {}})
    elif mode == "denied-repeat":  # valid requests the host's handler refuses, each audited by the host
        for n in range(2):
            write(model_request(n))


ANSWERED = ("log-forge", "refused-repeat", "denied-repeat")  # the turn ends: the box lives on


def main(mode: str) -> None:
    for line in sys.stdin:
        try:
            frame = json.loads(line)
        except ValueError:
            continue
        if not isinstance(frame, dict):
            continue
        if frame.get("method") == "box.init":
            reply(frame["id"], {"protocol": 1, "box": "hostile"})
        elif frame.get("method") == "mailbox.deliver":
            attack(mode)
            if mode in ANSWERED:
                reply(frame["id"], {"outcome": "silent", "message_ids": []})
            else:
                break  # never answer, never read again: the host must end this box by itself
    time.sleep(120)


if __name__ == "__main__":
    main(sys.argv[1])
