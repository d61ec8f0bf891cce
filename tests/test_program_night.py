"""The box's ``reflect`` and ``sleep`` tasks (mechanisms 104-114): what the box program does with them.

A stand-in engine shows what the program hands the memory engine (the task's time, the parsed ``args``), what
it answers when memory is off or the arguments are bad, and that nothing is posted; one test runs the real
engine in a real box over the host's real store (the memory Kit).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from box.memory.night import NightFailed
from box.program import BadTaskArgs, night_args
from box.protocol.models import (
    BoxInitParams,
    ImpSpec,
    MemorySettings,
    SessionInfo,
    TaskArg,
    TaskRunParams,
    TaskRunResult,
    TaskSpec,
)
from tests import scripted
from tests.memory.engine_kit import Kit

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 5, 11, 9, 0, tzinfo=UTC)
NOW = T0 + timedelta(hours=2, minutes=10)


@dataclass
class Day:
    """A memory engine that records what it was asked to do (no turn, no post)."""

    asked: list[tuple[Any, ...]] = field(default_factory=list)
    fails: Exception | None = None

    async def begin(self, facts: Any) -> Any:
        raise AssertionError("no turn in the imp's day")

    async def search(self, query: str, limit: int) -> list[str]:
        return []

    async def record_event(self, channel_id: str, text: str) -> None:
        return None

    async def reflect_idle(self, *, now: datetime) -> str:
        self.asked.append(("reflect", now))
        if self.fails is not None:
            raise self.fails
        return "a quiet reflection: 1 thought"

    async def night(self, *, now: datetime, since: datetime, consolidate: bool) -> str:
        self.asked.append(("sleep", now, since, consolidate))
        if self.fails is not None:
            raise self.fails
        return "folded 2 records into 1; forgot 1 record"


@dataclass
class OnlyDeparts:
    """An engine of an older box: it can see people leave, nothing more."""

    async def begin(self, facts: Any) -> Any:
        raise AssertionError("no turn")

    async def search(self, query: str, limit: int) -> list[str]:
        return []

    async def record_event(self, channel_id: str, text: str) -> None:
        return None


def init_params(memory_on: bool = True) -> BoxInitParams:
    return BoxInitParams(
        protocol=1, imp=ImpSpec(name="pip", memory=MemorySettings(enabled=memory_on, embedder="hashing")),
        session=SessionInfo(id="task:t-1", channel_id="t:pip", channel_kind="task"), now=T0,
    )  # fmt: skip


def task(kind: str, **args: TaskArg) -> TaskRunParams:
    return TaskRunParams(task=TaskSpec(id="t-1", kind=kind, args=args), now=NOW)


async def run(tmp_path: Path, engine: Any, *tasks: TaskRunParams, host: Any = None) -> list[TaskRunResult]:
    host = host or scripted.ScriptedHost()
    async with scripted.in_process_box(host, tmp_path / "state", memory=engine) as box:
        await box.init(init_params())
        return [await box.run_task(t) for t in tasks]


def outcomes(results: list[TaskRunResult]) -> list[tuple[str, str]]:
    return [(r.outcome, r.summary) for r in results]


# ------------------------------------------------------------------ what the program hands the engine


async def test_m105_a_reflect_task_is_one_idle_reflection_at_the_tasks_time(tmp_path: Path) -> None:
    engine, host = Day(), scripted.ScriptedHost()
    results = await run(tmp_path, engine, task("reflect"), host=host)
    assert outcomes(results) == [("done", "a quiet reflection: 1 thought")]
    assert engine.asked == [("reflect", NOW)]
    assert host.calls == []  # a reflection posts nothing anywhere
    journal = [json.loads(line) for line in (tmp_path / "state" / "journal.jsonl").read_text().splitlines()]
    assert [(j["task_id"], j["kind"], j["outcome"]) for j in journal] == [("t-1", "reflect", "done")]


async def test_m107_m114_a_sleep_task_hands_its_args_to_the_night(tmp_path: Path) -> None:
    engine = Day()
    results = await run(
        tmp_path, engine,
        task("sleep", since="2026-05-11T09:00:00+00:00", consolidate=True),
        task("sleep", since="2026-05-11T09:00:00Z"),  # consolidation is the default
        task("sleep", since="2026-05-11T11:00:00+02:00", consolidate=False),
        task("sleep", consolidate=False),  # only forgetting: no waking time needed
        task("sleep", since="2026-05-11T09:00:00"),  # no zone: UTC
    )  # fmt: skip
    assert outcomes(results) == [("done", "folded 2 records into 1; forgot 1 record")] * 5
    assert engine.asked == [
        ("sleep", NOW, T0, True),
        ("sleep", NOW, T0, True),
        ("sleep", NOW, T0, False),
        ("sleep", NOW, NOW, False),
        ("sleep", NOW, T0, True),
    ]


@pytest.mark.parametrize(
    ("args", "why"),
    [
        pytest.param({}, "a sleep task that folds names args.since (when the imp woke)", id="no since"),
        pytest.param(
            {"since": None}, "a sleep task that folds names args.since (when the imp woke)", id="null"
        ),
        pytest.param(
            {"since": 1778490000}, "args.since must be an ISO 8601 time, not 1778490000", id="a number"
        ),
        pytest.param({"since": "yesterday"}, "args.since is not an ISO 8601 time: 'yesterday'", id="words"),
        pytest.param(
            {"since": "2026-05-11T09:00:00Z", "consolidate": "yes"},
            "args.consolidate must be true or false, not 'yes'",
            id="consolidate not a boolean",
        ),
        pytest.param(
            {"since": "2026-05-11T09:00:00Z", "consolidate": 1},
            "args.consolidate must be true or false, not 1",
            id="consolidate a number",
        ),
    ],
)
def test_bad_sleep_args_say_what_is_wrong(args: dict[str, TaskArg], why: str) -> None:
    with pytest.raises(BadTaskArgs) as raised:
        night_args(args, NOW)
    assert str(raised.value) == why


async def test_a_sleep_task_with_bad_args_fails_and_runs_nothing(tmp_path: Path) -> None:
    engine = Day()
    results = await run(tmp_path, engine, task("sleep", since="soon"))
    assert outcomes(results) == [("failed", "bad sleep task: args.since is not an ISO 8601 time: 'soon'")]
    assert engine.asked == []


async def test_an_engine_failure_fails_the_task_and_says_why(tmp_path: Path) -> None:
    engine = Day(fails=NightFailed("the memory store did not answer (forgetting: down)"))
    results = await run(tmp_path, engine, task("sleep", since="2026-05-11T09:00:00Z"), task("reflect"))
    assert outcomes(results) == [
        ("failed", "night failed: NightFailed: the memory store did not answer (forgetting: down)"),
        ("failed", "reflection failed: NightFailed: the memory store did not answer (forgetting: down)"),
    ]


async def test_an_engine_that_cannot_reflect_or_sleep_fails_the_task(tmp_path: Path) -> None:
    results = await run(tmp_path, OnlyDeparts(), task("reflect"), task("sleep", consolidate=False))
    assert outcomes(results) == [
        ("failed", "this box's memory engine cannot reflect"),
        ("failed", "this box's memory engine cannot sleep"),
    ]


async def test_with_memory_off_there_is_nothing_to_reflect_on_or_forget(tmp_path: Path) -> None:
    host = scripted.ScriptedHost()
    async with scripted.in_process_box(host, tmp_path / "state") as box:
        await box.init(init_params(memory_on=False))
        results = [await box.run_task(task("reflect")), await box.run_task(task("sleep", since="bad"))]
    assert outcomes(results) == [
        ("done", "memory is off: nothing to reflect on"),
        ("done", "memory is off: nothing to fold or forget"),
    ]
    assert host.calls == []  # no model call, no memory request, no post


# ------------------------------------------------------------------ the real engine in a real box


async def test_m107_a_sleep_task_folds_and_forgets_in_a_real_box(kit: Kit) -> None:
    now = kit.clock.now()
    anchor = await kit.seed("Ann's exam worries her.", ago=timedelta(minutes=50), intensity=0.6)
    await kit.seed("Ann fears the exam.", ago=timedelta(minutes=40), intensity=0.5)
    await kit.seed("A passing remark.", ago=timedelta(days=10), intensity=0.3)
    kit.model.script("sleep", {"groups": [{"anchor": 1, "absorbed": [2], "summary_fact": "exam"}]})
    kit.host.nights = True  # the supervisor opens a sleep task's box so
    async with kit.box(channel_id="t:pip", channel_kind="task") as box:
        sleep = TaskRunParams(
            task=TaskSpec(id="t-9", kind="sleep", args={"since": (now - timedelta(hours=1)).isoformat()}),
            now=now,
        )
        reflect = TaskRunParams(task=TaskSpec(id="t-10", kind="reflect"), now=now)
        results = [await box.peer.request("task.run", p, timeout=30) for p in (sleep, reflect)]
    assert [(r.outcome, r.summary) for r in results] == [  # type: ignore[attr-defined]
        ("done", "folded 1 record into 1; forgot 1 record"),
        ("done", "a quiet reflection: 1 thought"),
    ]
    kept = await kit.records()
    assert [r.id for r in kept if r.kind == "lived"] == [anchor]
    assert [m for m, _ in kit.host.calls if not m.startswith(("memory.", "model."))] == []  # nothing posted
    assert kit.host.sent == []
