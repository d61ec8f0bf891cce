"""Benchmark processes started together (issue 21: hosts and ledger workers as real processes).

Each child prepares (opens its database, starts its boxes), says ``ready`` on stdout, waits for ``go`` on its stdin,
runs its load and answers with one JSON line. The parent starts them all, waits until every one is ready, lets them
go at once and collects the answers; a child that dies, hangs or answers nonsense is one line naming it, with the
tail of what it wrote on stderr. Only lines that start with ``MARK`` are the protocol: anything else a library
prints on stdout is passed over.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from bench.env import ROOT

MARK = "@bench "
READY_TIMEOUT_S = 180.0  # boxes starting on a busy 2-core machine
ANSWER_TIMEOUT_S = 300.0


class ChildFailed(RuntimeError):
    """A child process that died, hung, or answered what is not its protocol."""


@dataclass(frozen=True)
class Child:
    """One process to start: its name (for errors), its ``python -m`` module and arguments, and its environment."""

    name: str
    module: str
    args: Sequence[str]
    env: Mapping[str, str]


# ------------------------------------------------------------------ the child's side


def say(message: Mapping[str, Any]) -> None:
    """One protocol line on stdout."""
    sys.stdout.write(MARK + json.dumps(message) + "\n")
    sys.stdout.flush()


def ready_then_wait() -> None:
    """Say ready, then block until the parent says go (or closes stdin: then stop)."""
    say({"ready": True})
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("the benchmark stopped before the load began")


# ------------------------------------------------------------------ the parent's side


def parse(line: str) -> dict[str, Any] | None:
    """A protocol line's message; None for any other line. Raises ValueError for a marked line that is not a JSON
    object."""
    if not line.startswith(MARK):
        return None
    message = json.loads(line[len(MARK) :])
    if not isinstance(message, dict):
        raise ValueError(f"not a JSON object: {line[:200]!r}")
    return message


def _pump(stream: IO[str], into: queue.Queue[str | None]) -> None:
    for line in stream:
        into.put(line)
    into.put(None)  # end of stream: the child exited


@dataclass
class _Running:
    child: Child
    process: subprocess.Popen[str]
    lines: queue.Queue[str | None]
    stderr: IO[str]

    def next_message(self, timeout_s: float, waiting_for: str) -> dict[str, Any]:
        while True:
            try:
                line = self.lines.get(timeout=timeout_s)
            except queue.Empty:
                raise self.failed(f"no {waiting_for} within {timeout_s:.0f} s") from None
            if line is None:
                self.process.wait(10)
                raise self.failed(f"exited with status {self.process.returncode} before its {waiting_for}")
            try:
                message = parse(line)
            except ValueError as exc:
                raise self.failed(f"answered what is not the protocol ({exc})") from None
            if message is not None:
                return message

    def failed(self, why: str) -> ChildFailed:
        self.stderr.seek(0)
        tail = self.stderr.read()[-1500:].strip()
        return ChildFailed(f"{self.child.name} {why}" + (f"; its stderr ends: {tail}" if tail else ""))


def run_together(
    children: Sequence[Child],
    ready_timeout_s: float = READY_TIMEOUT_S,
    answer_timeout_s: float = ANSWER_TIMEOUT_S,
) -> list[dict[str, Any]]:
    """Blocking: start every child, wait until all are ready, say go to all, and return their answers in order.
    Every child is gone when this returns or raises."""
    running: list[_Running] = []
    try:
        for child in children:
            stderr = tempfile.TemporaryFile("w+", prefix="impyard-bench-child-")
            process = subprocess.Popen(
                [sys.executable, "-m", child.module, *child.args], cwd=ROOT, env=dict(child.env),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
            )  # fmt: skip
            lines: queue.Queue[str | None] = queue.Queue()
            assert process.stdout is not None
            threading.Thread(target=_pump, args=(process.stdout, lines), daemon=True).start()
            running.append(_Running(child, process, lines, stderr))
        for one in running:
            if one.next_message(ready_timeout_s, "ready").get("ready") is not True:
                raise one.failed("said something else before ready")
        for one in running:  # all at once: the load begins in every child within a pipe write of each other
            assert one.process.stdin is not None
            one.process.stdin.write("go\n")
            one.process.stdin.flush()
        return [one.next_message(answer_timeout_s, "answer") for one in running]
    finally:
        for one in running:
            if one.process.stdin is not None:
                one.process.stdin.close()
            try:
                one.process.wait(30)
            except subprocess.TimeoutExpired:
                one.process.kill()
                one.process.wait()
            one.stderr.close()


def split(total: int, parts: int) -> list[int]:
    """How many of ``total`` (sessions, workers) each of ``parts`` processes takes: all of them, as evenly as they go."""
    if parts < 1 or total < parts:
        raise ValueError(f"cannot split {total} among {parts} processes")
    return [total // parts + (1 if index < total % parts else 0) for index in range(parts)]


def child_env(**settings: str | None) -> dict[str, str]:
    """This process's environment with ``settings`` applied (None removes a name)."""
    env = dict(os.environ)
    for name, value in settings.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env
