"""``impyard memory night IMP [--consolidate]`` (mechanism 114): the imp sleeps now, whatever its clock.

Through the CLI over a real IMPYARD_HOME: one ``sleep`` task per scope with records, run at once by a
one-shot supervisor limited to this imp's sleep tasks, each in a stand-in box (``tests/boxes/night_box.py``)
that forgets through the host's real store in its one scope. Expected values are written out.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from impyard.backends.process import ProcessBackend
from impyard.cli import cli, memory_night
from impyard.clock import FixedClock, iso, parse_iso
from impyard.imps.store import ImpStore
from impyard.memory import wakefulness
from impyard.memory.scopes import SessionScopes
from impyard.memory.store import MemoryStore
from impyard.memory.wakefulness import Wakefulness, load, save
from impyard.storage.db import open_database
from impyard.supervisor import Supervisor, open_supervisor
from impyard.tasks import TaskRequest, TaskStore
from tests import sqlfile
from tests.memory.conftest import moment

NIGHT_BOX = Path(__file__).parent / "boxes" / "night_box.py"
GUILD_SCOPE, DM_SCOPE = "guild:200000000000000001", "dm:100000000000000001"
LONG_AGO = datetime.now(UTC) - timedelta(days=30)


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch) -> ImpStore:
    """pip (memory on), quiet (memory off) and bee; every supervisor the verb opens runs the stand-in box."""
    imps = ImpStore()
    imps.add("pip", box={"backend": "process"}, memory={"enabled": True, "embedder": "hashing"})
    imps.add("bee", box={"backend": "process"}, memory={"enabled": True, "embedder": "hashing"})
    imps.add("quiet", box={"backend": "process"}, memory={"enabled": False})
    backend = ProcessBackend(command=[sys.executable, str(NIGHT_BOX)], warn=False)

    @asynccontextmanager
    async def stand_in(**kwargs: Any) -> AsyncIterator[Supervisor]:
        async with open_supervisor(**{**kwargs, "backend_for": lambda imp: backend}) as supervisor:
            yield supervisor

    monkeypatch.setattr(memory_night, "open_supervisor", stand_in)
    return imps


def remember(imp: str, scope: str, text: str, intensity: float, at: datetime) -> None:
    db = open_database()
    try:
        scoped = MemoryStore(db, FixedClock(at).now).scoped(imp, SessionScopes(scope, (scope,)), "c1")
        scoped.encode(moment(text, intensity=intensity, valence=0.1))
    finally:
        db.close()


def conclusions(imp: str) -> list[tuple[str, str]]:
    db = open_database()
    try:
        rows = sqlfile.query(
            db, "SELECT scope, conclusion FROM memory_records WHERE imp = ? ORDER BY 1, 2", (imp,)
        )
        return [(r["scope"], r["conclusion"]) for r in rows]
    finally:
        db.close()


def night(*args: str) -> Result:
    return CliRunner().invoke(cli, ["memory", "night", *args])


def slept(summary: str) -> dict[str, Any]:
    word, _, text = summary.partition(" ")
    assert word == "slept", summary
    found: dict[str, Any] = json.loads(text)
    return found


def test_m114_night_forgets_in_every_scope_now_whatever_the_clock(home: ImpStore) -> None:
    now = datetime.now(UTC)
    remember("pip", GUILD_SCOPE, "a faint chat", 0.3, LONG_AGO)  # below 0.6 at 30 days: forgotten
    remember("pip", GUILD_SCOPE, "the old picnic", 0.9, LONG_AGO)
    remember("pip", DM_SCOPE, "a faint DM", 0.3, LONG_AGO)
    remember("pip", DM_SCOPE, "today's DM", 0.5, now)  # under a day old: kept whatever its strength
    remember("bee", GUILD_SCOPE, "bee's faint chat", 0.3, LONG_AGO)  # another imp's: untouched
    result = night("pip", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert (report["imp"], report["consolidate"]) == ("pip", False)
    since = parse_iso(report["since"])  # the clock never saw pip wake: the last 24 hours
    assert (
        timedelta(hours=23, minutes=59) < now - since + timedelta(minutes=1) <= timedelta(hours=24, minutes=1)
    )
    scopes = report["scopes"]
    assert [(s["scope"], s["state"]) for s in scopes] == [
        (DM_SCOPE, "done"),
        (GUILD_SCOPE, "done"),
    ]  # newest first
    for entry in scopes:
        seen = slept(entry["summary"])
        assert (seen["kind"], seen["args"], seen["writes"], seen["reads"], seen["channel_kind"], seen["forgot"]) == (
            "sleep", {"since": report["since"], "consolidate": False}, entry["scope"], [entry["scope"]], "task", 1,
        )  # fmt: skip
    assert conclusions("pip") == [(DM_SCOPE, "today's DM"), (GUILD_SCOPE, "the old picnic")]
    assert conclusions("bee") == [(GUILD_SCOPE, "bee's faint chat")]


def test_m114_consolidate_folds_since_the_imp_woke_and_prints_each_scope(
    home: ImpStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # folding asks the model (not the stand-in)
    woke = datetime.now(UTC) - timedelta(hours=3)
    db = open_database()
    try:
        awake = Wakefulness(awake=True, woke_at=woke, last_activity_at=woke, consolidated=False)
        db.write(lambda conn: save(conn, "pip", awake, woke))
        tasks = TaskStore(db, FixedClock(datetime.now(UTC)), home)
        other = tasks.add(TaskRequest("bee", None, kind="sleep", scope=GUILD_SCOPE))  # bee's: left alone
        prompt = tasks.add(TaskRequest("pip", "Summarise the week"))  # not a sleep: left alone
    finally:
        db.close()
    remember("pip", GUILD_SCOPE, "tea with Ann", 0.7, woke + timedelta(minutes=5))
    remember("pip", GUILD_SCOPE, "yesterday's tea", 0.7, woke - timedelta(hours=20))
    result = night("pip", "--consolidate")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"pip slept, folding what happened since {iso(woke)[:19].replace('T', ' ')} UTC:"
    assert len(lines) == 2 and lines[1].startswith(f"  {GUILD_SCOPE}: slept ")
    seen = slept(lines[1].removeprefix(f"  {GUILD_SCOPE}: "))
    assert seen["args"] == {"since": iso(woke), "consolidate": True}
    assert seen["night"] == ["tea with Ann"]  # the records since waking, in that scope
    db = open_database()
    try:
        state = db.read(lambda conn: load(conn, "pip"))
        tasks = TaskStore(db, FixedClock(datetime.now(UTC)), home)
        assert (tasks.get(other.id).state, tasks.get(prompt.id).state) == ("queued", "queued")
    finally:
        db.close()
    assert (state.awake, state.woke_at, state.consolidated) == (
        True,
        woke,
        False,
    )  # the clock's own day stands
    assert state.last_sleep_at is not None and state.last_sleep_at == state.last_consolidation_at


def test_m114_scopes_beyond_the_cap_are_forgotten_in_by_the_host(
    home: ImpStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wakefulness, "MAX_NIGHT_SCOPES", 1)
    remember("pip", GUILD_SCOPE, "a faint chat", 0.3, LONG_AGO)
    remember("pip", DM_SCOPE, "a faint DM", 0.3, LONG_AGO - timedelta(days=1))  # the older scope: the host's
    result = night("pip", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert [s["scope"] for s in report["scopes"]] == [GUILD_SCOPE]
    assert report["host_forgot"] == {"records": 1, "episodes": 1}
    assert conclusions("pip") == []


def test_m114_an_imp_with_no_memories_has_nothing_to_sleep_on(home: ImpStore) -> None:
    result = night("pip")
    assert (result.exit_code, result.output) == (0, "pip has no memories yet: nothing to sleep on.\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nobody"], "Error: no imp named 'nobody'"),
        (
            ["quiet"],
            "Error: quiet has memory off: nothing to sleep on (set [memory] enabled = true in its imp.toml)",
        ),
        (
            ["pip", "--consolidate"],
            "Error: no model key is configured, and folding asks the model for a plan",
        ),
    ],
)
def test_m114_refusals_are_one_line(home: ImpStore, args: list[str], message: str) -> None:
    result = night(*args)
    assert result.exit_code == 1
    assert result.output.startswith(message) and result.output.count("\n") == 1, result.output
