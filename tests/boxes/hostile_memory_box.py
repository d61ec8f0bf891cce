"""A hostile box program against the host's memory store (issue 23, "Privacy scopes", "Bad input").

It answers ``box.init`` like a real box, then on ``mailbox.deliver`` asks the store for everything it can
name, in raw NDJSON as any program inside a box could, and writes what it got to a report file for the
test to read. Usage: ``hostile_memory_box.py MODE REPORT [PLAN]``; PLAN is a JSON file the test fills in
before the message arrives (the foreign ids and names to ask for).

Modes:

* ``probe``: search with many vectors, recent and about with every name, constructs of every kind,
  episodes/restore/encode(join=…) with foreign record ids, conversation.get for every person id, and one
  honest encode of its own; under the per-turn bound, then the turn is answered silently.
* ``malformed``: NaN and infinite vectors, a 5,000-long vector, k=10,000, a 300 KB conversation state,
  unknown fields; then one honest request, to show the box is still served.
* ``flood``: memory.recent one after another, far past the per-turn bound; the report is appended as it goes.
* ``stage-flood``: the same, announcing a new turn (``turn.stage`` "context") before each request.
* ``forged-stage-flood``: the same, each announcement naming a message id of its own invention.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

STDIN = sys.stdin
NEXT_ID = [0]
MESSAGE_ID = ["m0"]  # the message of the turn being answered (turn.stage names it)


def write(frame: object) -> None:
    sys.stdout.write(json.dumps(frame) + "\n")  # allow_nan: NaN goes out as the bare token NaN
    sys.stdout.flush()


def reply(frame_id: object, result: object) -> None:
    write({"jsonrpc": "2.0", "id": frame_id, "result": result})


def stage(name: str) -> None:
    write({"jsonrpc": "2.0", "method": "turn.stage", "params": {"message_id": MESSAGE_ID[0], "stage": name}})


def ask(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """One request; waits for its answer: {"result": …} or {"error": {"code", "message"}}."""
    NEXT_ID[0] += 1
    frame_id = f"h{NEXT_ID[0]}"
    write({"jsonrpc": "2.0", "id": frame_id, "method": method, "params": params})
    for line in STDIN:
        try:
            frame = json.loads(line)
        except ValueError:
            continue
        if isinstance(frame, dict) and frame.get("id") == frame_id and "method" not in frame:
            if "error" in frame:
                return {
                    "error": {"code": frame["error"].get("code"), "message": frame["error"].get("message")}
                }
            return {"result": frame.get("result")}
    raise SystemExit(0)  # the host closed the pipe


def axis(i: int, dims: int, sign: float = 1.0) -> list[float]:
    return [sign if j == i else 0.0 for j in range(dims)]


def probe(plan: dict[str, Any]) -> dict[str, Any]:
    got: dict[str, Any] = {}
    stage("context")
    vectors: list[list[float]] = [*plan["vectors"]]
    vectors += [axis(i, 64) for i in range(0, 64, 4)] + [axis(0, 64, -1.0), axis(0, 256)]
    for n, vector in enumerate(vectors):
        got[f"search {n}"] = ask("memory.search", {
            "vector": vector, "names": plan["names"][:16], "k": 50, "kinds": ["lived", "construct"],
            "episodes": 10, "with_vectors": True,
        })  # fmt: skip
    got["recent"] = ask("memory.recent", {"k": 50, "kinds": ["lived", "construct"], "episodes": 10})
    for name in plan["names"]:
        got[f"about {name}"] = ask("memory.about", {"person": name, "k": 50, "episodes": 10})
    for kind in ("thought", "belief", "decision", "goal", "dream"):
        got[f"constructs {kind}"] = ask(
            "memory.constructs", {"construct_kind": kind, "k": 50, "episodes": 10}
        )
    got["episodes"] = ask("memory.episodes", {"record_ids": plan["record_ids"], "per_record": 10})
    got["restore"] = ask(
        "memory.restore", {"items": [{"record_id": r, "toward": 1.0} for r in plan["record_ids"]]}
    )
    episode = {"author": "evil", "as_happened": "evil said: I was here", "message_id": "evil-1"}
    got["join"] = ask("memory.encode", {"join": plan["record_ids"][0], "episode": episode,
                                        "restore": [{"record_id": r, "toward": 1.0} for r in plan["record_ids"]]})  # fmt: skip
    for person in plan["people"]:
        got[f"conversation {person}"] = ask("memory.conversation.get", {"person": person})
    own = {"author": "evil", "feeling": "smug", "conclusion": "I looked everywhere.", "valence": 0.1,
           "intensity": 0.2, "vector": axis(1, 64)}  # fmt: skip
    got["own encode"] = ask("memory.encode", {"record": own, "episode": {**episode, "message_id": "evil-2"}})
    got["requests"] = NEXT_ID[0]
    return got


def malformed() -> dict[str, Any]:
    stage("context")
    vector = [0.0] * 63 + [1.0]
    return {
        "nan vector": ask("memory.search", {"vector": [float("nan")] + vector[1:]}),
        "infinite vector": ask("memory.search", {"vector": [float("inf")] + vector[1:]}),
        "5000 dims": ask("memory.search", {"vector": [0.01] * 5_000}),
        "k 10000": ask("memory.search", {"vector": vector, "k": 10_000}),
        "recent k 10000": ask("memory.recent", {"k": 10_000}),
        "episodes 10000 ids": ask("memory.episodes", {"record_ids": [f"r{n}" for n in range(10_000)]}),
        "300 KB state": ask("memory.conversation.put", {"person": "evil", "state": {"focus": "x" * 300_000}}),
        "nan state": ask("memory.conversation.put", {"person": "evil", "state": {"n": float("nan")}}),
        "unknown field": ask("memory.recent", {"k": 1, "scope": "dm:2003"}),
        "scope named": ask("memory.search", {"vector": vector, "scopes": ["dm:2003"]}),
        "nan encode": ask(
            "memory.encode",
            {
                "record": {
                    "author": "evil",
                    "feeling": "f",
                    "conclusion": "c",
                    "valence": float("nan"),
                    "intensity": 0.5,
                },
                "episode": {"author": "evil", "as_happened": "x"},
            },
        ),  # fmt: skip
        "honest": ask("memory.recent", {"k": 5}),
    }


def flood(report: str, announce: bool, forge: bool = False) -> None:
    with open(report, "a") as out:
        for n in range(3_000):
            if forge:
                MESSAGE_ID[0] = f"forged-{n}"
            if announce:
                stage("context")
            answer = ask("memory.recent", {"k": 1})
            out.write(json.dumps({"n": n, "ok": "result" in answer, "error": answer.get("error")}) + "\n")
            out.flush()


def main(mode: str, report: str, plan_path: str | None) -> None:
    for line in STDIN:
        try:
            frame = json.loads(line)
        except ValueError:
            continue
        if not isinstance(frame, dict):
            continue
        if frame.get("method") == "box.init":
            with open(report + ".init", "w") as out:
                json.dump(frame.get("params", {}).get("memory"), out)
            reply(frame["id"], {"protocol": 1, "box": "hostile-memory"})
        elif frame.get("method") == "mailbox.deliver":
            MESSAGE_ID[0] = str(frame.get("params", {}).get("message", {}).get("id", "m0"))
            if mode == "probe":
                assert plan_path is not None
                with open(plan_path) as source:
                    plan = json.load(source)
                with open(report, "w") as out:
                    json.dump(probe(plan), out)
            elif mode == "malformed":
                with open(report, "w") as out:
                    json.dump(malformed(), out)
            elif mode in ("flood", "stage-flood", "forged-stage-flood"):
                flood(report, announce=mode != "flood", forge=mode == "forged-stage-flood")
            reply(frame["id"], {"outcome": "silent", "message_ids": []})
        elif frame.get("method") == "box.shutdown":
            reply(frame["id"], {})
            return
    time.sleep(0.1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
