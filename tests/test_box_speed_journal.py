"""The box's journal (issue 18: one appending write of the line's bytes a turn, no text file object): each
record is appended as one JSON line, nothing before it is lost, the file is made as open("a") makes it, and a
journal that cannot be written costs a warning, never the turn."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import pytest

from box.protocol.models import TaskRunParams, TaskSpec
from tests import scripted
from tests.scripted import NOW, init_params

pytestmark = pytest.mark.anyio


def depart(task_id: str) -> TaskRunParams:
    """A departure with memory off: done at once, and journalled."""
    return TaskRunParams(task=TaskSpec(id=task_id, kind="depart", person="u1"), now=NOW)


async def test_each_record_is_appended_as_one_json_line(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "journal.jsonl").write_bytes(b'{"kept": true}\n')
    async with scripted.in_process_box(scripted.ScriptedHost(), state) as box:
        await box.init(init_params())
        results = [await box.run_task(depart(task_id)) for task_id in ("t-1", "t-ü")]
    assert [r.outcome for r in results] == ["done", "done"]
    text = (state / "journal.jsonl").read_bytes()
    assert text.endswith(b"\n") and text.count(b"\n") == 3
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines[0] == {"kept": True}
    assert [{k: v for k, v in line.items() if k != "logged"} for line in lines[1:]] == [
        {"task_id": "t-1", "kind": "depart", "outcome": "done", "at": "2026-12-02T10:00:00+00:00"},
        {"task_id": "t-ü", "kind": "depart", "outcome": "done", "at": "2026-12-02T10:00:00+00:00"},
    ]
    assert b"t-\\u00fc" in text  # ASCII, as json.dumps writes it


async def test_the_journal_is_made_as_open_a_makes_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    umask = os.umask(0o022)
    try:
        async with scripted.in_process_box(scripted.ScriptedHost(), state) as box:
            await box.init(init_params())
            await box.run_task(depart("t-1"))
    finally:
        os.umask(umask)
    assert stat.S_IMODE((state / "journal.jsonl").stat().st_mode) == 0o644


async def test_a_journal_that_cannot_be_written_costs_a_warning_not_the_turn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "state"
    async with scripted.in_process_box(scripted.ScriptedHost(), state) as box:
        await box.init(init_params())
        (state / "journal.jsonl").mkdir()  # where the journal would go, something it cannot write
        with caplog.at_level(logging.WARNING, logger="box"):
            result = await box.run_task(depart("t-1"))
    assert result.outcome == "done"
    assert any("could not write the journal" in r.getMessage() for r in caplog.records)
