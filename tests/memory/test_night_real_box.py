"""A night with the real box (issue 15, mechanisms 107-114): ``impyard memory night pip --consolidate`` starts
``python -m box`` in a process box for each scope, which asks the fake OpenAI for the consolidation plan through
the host's gateway and folds and forgets through the host's real store. Nothing here is a stand-in but the model.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from impyard.cli import cli
from impyard.clock import FixedClock
from impyard.imps.store import ImpStore
from impyard.memory.scopes import SessionScopes
from impyard.memory.store import MemoryStore
from impyard.storage.db import open_database
from testing.fake_openai import FakeOpenAI
from tests import sqlfile
from tests.memory.conftest import moment

SCOPE = "terminal"


pytestmark = pytest.mark.fake_model(env=True)


def remember(text: str, intensity: float, at: datetime) -> str:
    db = open_database()
    try:
        scoped = MemoryStore(db, FixedClock(at).now).scoped("pip", SessionScopes(SCOPE, (SCOPE,)), "c1")
        record_id, _ = scoped.encode(moment(text, intensity=intensity, valence=0.2))
        return record_id
    finally:
        db.close()


def records() -> dict[str, tuple[float, int]]:
    db = open_database()
    try:
        rows = sqlfile.query(
            db,
            "SELECT r.conclusion, r.intensity, (SELECT COUNT(*) FROM memory_episodes e WHERE e.record_id = r.id)"
            " AS n FROM memory_records r WHERE r.imp = 'pip'",
        )
        return {str(r["conclusion"]): (round(float(r["intensity"]), 4), int(r["n"])) for r in rows}
    finally:
        db.close()


def test_a_night_in_a_real_box_folds_and_forgets(fake: FakeOpenAI) -> None:
    ImpStore().add("pip", box={"backend": "process"}, memory={"enabled": True, "embedder": "hashing"})
    now = datetime.now(UTC)
    remember("a faint old chat", 0.3, now - timedelta(days=30))  # below 0.6 at a month: forgotten (112)
    remember("we planted tulips", 0.6, now - timedelta(hours=3))  # numbered 1 (oldest first): the anchor
    remember("the tulips need water", 0.3, now - timedelta(hours=2))  # 2: absorbed
    remember("a bright day at the sea", 0.9, now - timedelta(hours=1))  # 3: stays as it is
    fake.script(
        {"groups": [{"anchor": 1, "absorbed": [2], "summary_fact": "SUMMARY TEXT NEVER USED"}]},
        purpose="sleep",
    )
    result = CliRunner().invoke(cli, ["memory", "night", "pip", "--consolidate", "--json"])
    assert result.exit_code == 0, result.output
    [scope] = json.loads(result.output)["scopes"]
    assert (scope["scope"], scope["state"]) == (SCOPE, "done"), scope
    assert "folded" in scope["summary"] and "forgot 1" in scope["summary"], scope["summary"]
    [plan] = [r for r in fake.requests if r.purpose == "sleep"]
    assert plan.body["temperature"] == 0.3 and "we planted tulips" in json.dumps(plan.body)
    assert records() == {
        "we planted tulips": (round(1 - 0.4 * 0.7, 4), 2),  # 1 − Π(1 − I), both episodes under it (109, 110)
        "a bright day at the sea": (0.9, 1),
    }
    db = open_database()
    try:
        texts = json.dumps(
            [dict(r) for r in sqlfile.query(db, "SELECT conclusion, feeling FROM memory_records")]
        )
    finally:
        db.close()
    assert "SUMMARY TEXT NEVER USED" not in texts  # mechanism 111
