"""Leaving ``impyard chat`` is a departure (mechanism 103), and a long chat departs whoever else has left.

The chat runs in this process (``impyard.terminal.chat.run_chat``) over a pipe, as a script would run it, against
the fake OpenAI; its boxes are the real box program with a stand-in memory engine
(``tests/boxes/departing_box.py``) that keeps the conversation in the host's store and, on a departure, says
what it saw. ``/quit`` and the end of input queue the departure and run it before the chat ends; Ctrl-C is
not a departure.
"""

from __future__ import annotations

import getpass
import io
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from impyard.channels.store import ChannelInfo, ChannelStore
from impyard.clock import SystemClock
from impyard.imps.store import ImpStore
from impyard.storage.db import Database, open_database
from impyard.supervisor import SupervisorSettings
from impyard.tasks import Task, TaskStore
from impyard.terminal.chat import run_chat
from testing.fake_openai import FakeOpenAI
from tests.test_departures import ANN, DM_CHANNEL, departing_box, talk

pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(env=True, answer="Hello from Pip!")]

USER = getpass.getuser()
TERMINAL = f"terminal:{USER}"  # the terminal's channel and the operator's id there
LOOP = SupervisorSettings(tick_s=0.05, shutdown_grace_s=2.0)


def add_pip(memory: bool = True) -> None:
    ImpStore().add("pip", box={"backend": "process"}, memory={"enabled": memory, "embedder": "hashing"})


class Pipe:
    """The chat's stdin: lines written by the test, when it chooses; ``close`` is the end of input (Ctrl-D)."""

    def __init__(self) -> None:
        read, self._write = os.pipe()
        self.reader = os.fdopen(read, "r")

    def send(self, text: str) -> None:
        os.write(self._write, text.encode())

    def close(self) -> None:
        os.close(self._write)


async def chat(pipe: Pipe, out: io.StringIO) -> None:
    await run_chat("pip", stdin=pipe.reader, out=out, backends={"pip": departing_box()}, departures=LOOP)


def depart_tasks() -> list[Task]:
    db = open_database()
    try:
        return [task for task in TaskStore(db, SystemClock()).latest() if task.kind == "depart"]
    finally:
        db.close()


def seen(task: Task) -> dict[str, Any]:
    assert task.box_summary is not None and task.box_summary.startswith("departed "), task.box_summary
    report: dict[str, Any] = json.loads(task.box_summary.removeprefix("departed "))
    return report


def assert_departed_from_the_terminal(task: Task) -> None:
    assert (task.state, task.person, task.channel_id, task.origin, task.ceiling_s) == (
        "done", TERMINAL, TERMINAL, "event", 300.0,
    )  # fmt: skip
    report = seen(task)
    assert (report["channel_kind"], report["writes"], report["reads"]) == (
        "terminal",
        "terminal",
        ["terminal"],
    )
    assert report["conversation"]["person_id"] == TERMINAL  # the turn's conversation, found in its scope


@pytest.mark.parametrize("leave", ["/quit\n", "/exit\n", None])  # None: the end of input, as Ctrl-D
async def test_m103_leaving_the_chat_thinks_the_conversation_over_before_it_ends(
    fake: FakeOpenAI, impyard_home: Path, leave: str | None
) -> None:
    add_pip()
    pipe, out = Pipe(), io.StringIO()
    pipe.send("hello pip\n" + (leave or ""))
    pipe.close()
    with anyio.fail_after(90):
        await chat(pipe, out)
    shown = out.getvalue()
    assert "pip> Hello from Pip!" in shown
    thinking = shown.index("pip is thinking over the conversation…")
    assert thinking < shown.index("(impyard) bye")
    assert "could not think" not in shown and "later" not in shown
    [task] = depart_tasks()  # finished before the chat ended
    assert_departed_from_the_terminal(task)


async def test_a_memory_off_imp_just_leaves(fake: FakeOpenAI, impyard_home: Path) -> None:
    add_pip(memory=False)
    pipe, out = Pipe(), io.StringIO()
    pipe.send("hello pip\n/quit\n")
    pipe.close()
    with anyio.fail_after(90):
        await chat(pipe, out)
    assert "pip> Hello from Pip!" in out.getvalue() and "thinking" not in out.getvalue()
    assert depart_tasks() == []


async def test_quitting_before_saying_anything_departs_nothing(fake: FakeOpenAI, impyard_home: Path) -> None:
    add_pip()
    pipe, out = Pipe(), io.StringIO()
    pipe.send("/quit\n")
    pipe.close()
    with anyio.fail_after(60):
        await chat(pipe, out)
    assert "thinking" not in out.getvalue() and depart_tasks() == []


async def test_m103_a_long_chat_departs_someone_who_left_elsewhere_30_minutes_ago(
    fake: FakeOpenAI, impyard_home: Path
) -> None:
    """The chat's departures loop: Ann left pip's DM 31 minutes ago; while the operator chats, she departs."""
    add_pip()
    db: Database = open_database()
    try:
        ChannelStore(db, SystemClock()).upsert(ChannelInfo(DM_CHANNEL, kind="dm", name="Ann"))
        talk(db, "pip", DM_CHANNEL, ANN, datetime.now(UTC) - timedelta(minutes=31))
    finally:
        db.close()
    pipe, out = Pipe(), io.StringIO()
    async with anyio.create_task_group() as tg:
        tg.start_soon(chat, pipe, out)
        pipe.send("hello pip\n")
        with anyio.fail_after(60):
            while not [t for t in depart_tasks() if t.state == "done"]:
                await anyio.sleep(0.1)
        pipe.send("/quit\n")
        pipe.close()
    ann, operator = sorted(depart_tasks(), key=lambda task: task.channel_id != DM_CHANNEL)
    report = seen(ann)
    assert (ann.person, report["channel_kind"], report["writes"]) == (ANN, "dm", f"dm:{ANN}")
    assert report["conversation"]["person_id"] == ANN
    assert_departed_from_the_terminal(operator)
