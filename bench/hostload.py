"""``python -m bench.hostload NAME PREFIX SESSIONS MESSAGES``: one host process of the ``hosts`` scenario.

A host as docs/hosts.md runs one: its own IMPYARD_HOME (a throwaway one, with the bench policy), the database
``IMPYARD_DATABASE_URL`` names (unset: the home's SQLite file), the fake model at ``OPENAI_BASE_URL``. It opens the
full host assembly for the warm imp on the process backend, warms SESSIONS channels ``PREFIX0`` … (each channel's
first message starts its box), says ready (``bench.children``), and on go sends MESSAGES messages in each channel,
one after another, all channels at once. Its answer: every turn's latency (message in → reply), when its load
began and ended (``time.monotonic``, one clock for every process of the machine), the messages lost or answered
twice, its CPU time, and the database engine it ran on. It answers only for the channels whose names start with
PREFIX: another host's unanswered messages are not its own (``owns_channel``).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import anyio

from bench.children import ready_then_wait, say
from bench.env import isolated_home
from bench.harness import Host, TimingSurface, add_imps, dm, imp_for
from impyard.backends.process import ProcessBackend
from impyard.channels.store import ChannelInfo
from impyard.runtime import open_runtime
from impyard.threads import in_thread

BACKEND = "process"


async def serve(prefix: str, sessions: int, messages: int) -> dict[str, Any]:
    imp = imp_for(BACKEND)
    channels = [f"{prefix}{index}" for index in range(sessions)]

    def mine(info: ChannelInfo | None) -> bool:
        return info is not None and info.channel_id.startswith(prefix)

    latencies: list[float] = []
    surface = TimingSurface()
    async with open_runtime(
        [imp], surface, backends={imp: ProcessBackend(warn=False)}, surfaces=("discord",),
        owns_channel=mine,
    ) as runtime:  # fmt: skip
        running = Host(runtime, surface, imp)
        async with anyio.create_task_group() as tg:  # every channel's first message: its box starts
            for channel in channels:
                tg.start_soon(running.turn, dm(channel, 0))
        await in_thread(ready_then_wait)

        async def conversation(channel: str) -> None:
            for n in range(1, messages + 1):
                try:
                    latencies.append(await running.turn(dm(channel, n)))
                except (TimeoutError, RuntimeError):
                    pass  # counted below: a message without exactly one reply is lost or duplicated

        began, cpu_began = time.monotonic(), time.process_time()
        async with anyio.create_task_group() as tg:
            for channel in channels:
                tg.start_soon(conversation, channel)
        ended, cpu_s = time.monotonic(), time.process_time() - cpu_began
        dialect = runtime.db.dialect
    replied = surface.replied_at
    expected = [f"{channel}-m{n}" for channel in channels for n in range(1, messages + 1)]
    return {
        "latencies_ms": [round(value, 3) for value in latencies], "began": began, "ended": ended,
        "turns": len(expected), "lost": sum(1 for message_id in expected if not replied.get(message_id)),
        "duplicated": sum(max(0, len(replied.get(message_id, [])) - 1) for message_id in expected),
        "cpu_s": round(cpu_s, 3), "dialect": dialect,
    }  # fmt: skip


def main() -> None:
    _name, prefix, sessions, messages = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    model = {name: os.environ.get(name, "") for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY")}
    with isolated_home():  # a home of its own, as every host has
        os.environ.update(model)  # the one fake model every host of the run shares
        add_imps([BACKEND])
        say(anyio.run(serve, prefix, sessions, messages))


if __name__ == "__main__":
    main()
