"""The main job remembers (issue 23): ``impyard chat`` across two runs, and the movable clock (mechanism 122).

``impyard chat`` runs in a pseudo-terminal against the fake OpenAI, as the operator would run it, with the imp
it creates on first use (memory on, the local embedder: every embedding is computed by the host, issue 33 — none
reaches the fake OpenAI, each is audited at zero cost). What was said in the first run comes back in the second
run's reply context, and the operator finds it again by meaning (``impyard memory search``, other words).
"""

from __future__ import annotations

import json
import math
import os
import sys
from datetime import timedelta
from pathlib import Path

import pexpect
import pytest
from click.testing import CliRunner

from box.context import memory_block_of, split_context
from box.protocol.memory import PresenceEntry
from impyard.cli import cli
from impyard.clock import SystemClock
from impyard.gateway.audit import AuditLog
from impyard.memory.store import MemoryStore
from impyard.storage.db import open_database
from testing.fake_openai import FakeOpenAI, RecordedRequest, envelope
from tests import sqlfile
from tests.memory.engine_kit import NOW, Kit, facts, verdict

IMPYARD = str(Path(sys.executable).parent / "impyard")
CAT = "Zorblax"


def appraise(request: RecordedRequest) -> dict[str, object]:
    told = CAT in json.dumps(request.body)
    conclusion = f"The operator's cat is called {CAT}." if told else "The operator asked me something."
    return {"feeling": "delight", "conclusion": conclusion, "valence": 0.6, "intensity": 0.7}


@pytest.fixture
def fake(fake_model: FakeOpenAI) -> FakeOpenAI:
    fake_model.script(envelope(answer="How lovely!", answer_needed=True, told="The operator spoke with pip."),
                      purpose="reply")  # fmt: skip
    fake_model.script(appraise, purpose="appraisal")
    fake_model.script({"keep": [1, 2, 3], "asks_for_memory": True, "asks_for_own": None}, purpose="filter")
    fake_model.script({"summary": "The operator told me about their cat."}, purpose="summary")
    fake_model.script({"feeling": "easy familiarity", "conclusion": "My operator is here.",
                      "valence": 0.3, "intensity": 0.3, "search": None}, purpose="arrival")  # fmt: skip
    return fake_model


def chat(fake: FakeOpenAI, home: Path, said: str) -> None:
    """One ``impyard chat`` run: one thing said, its answer awaited, then /quit."""
    env = {
        **os.environ,
        "IMPYARD_HOME": str(home),
        "OPENAI_API_KEY": fake.api_key,
        "OPENAI_BASE_URL": fake.base_url,
        "PROMPT_TOOLKIT_NO_CPR": "1",  # the pty answers no cursor position request: do not ask
    }
    child = pexpect.spawn(
        IMPYARD, ["chat", "--backend", "process"], env=env, encoding="utf-8", timeout=60, dimensions=(40, 200)
    )
    child.expect("you> ")
    child.sendline(said)
    child.expect("pip> How lovely!")
    child.expect("you> ")
    child.sendline("/quit")
    child.expect("bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def memory_block(request: RecordedRequest) -> str:
    """The ``### Memory`` block of a reply call: the end of the turn's context (the history is not in it)."""
    block = memory_block_of(
        request.body["messages"]
    )  # issue 33: it ends the context opening the current message
    assert block, "no memory block in this call"
    return block


def test_impyard_chat_remembers_across_two_runs(fake: FakeOpenAI, impyard_home: Path) -> None:
    chat(fake, impyard_home, f"my cat is called {CAT}, she is three")
    first = len(fake.requests)
    embedded = [r for r in fake.requests if r.purpose == "embedding"]
    chat(fake, impyard_home, "what is my cat called again?")  # a new process, a new box, the same home

    replies = [r for r in fake.requests[first:] if r.purpose == "reply"]
    asked = split_context(replies[0].body["messages"][-1]["content"])[
        1
    ]  # after the turn's context (issue 33)
    # the terminal person's name is the account's ("operator" for root, issue 38), whoever runs the suite
    assert asked.endswith(": what is my cat called again?") and CAT not in asked  # not in the words asked …
    block = memory_block(replies[0])  # … but in what pip remembers while answering them:
    assert f"delight. The operator's cat is called {CAT}." in block  # the record, from the host's store
    # The first run's /quit was a departure (mechanism 103): the second run is a new conversation, opened by
    # the operator's arrival (101), and the first one's words come back as the events the record rests on.
    assert "The operator spoke with pip." in block.split("From before this conversation", 1)[1]
    now = block.split("This conversation, as it happened:", 1)[1]
    assert "entered the conversation." in now and "easy familiarity" in now
    # Issue 33: the imp embeds on the host — no /embeddings request reached the model API, in either run …
    assert embedded == [] and all(r.endpoint != "/embeddings" for r in fake.requests)
    db = open_database(impyard_home / "impyard.db")
    try:
        kept = MemoryStore(db, lambda: NOW).show("pip", scope="terminal", limit=50)
        audit = AuditLog(db, SystemClock()).tail(500, imp="pip")
        spent = sqlfile.query(db, "SELECT SUM(cost_micros) FROM ledger WHERE purpose = 'embedding'")
        dims = {row[0] for row in sqlfile.query(db, "SELECT dims FROM memory_records WHERE dims > 0")}
    finally:
        db.close()
    assert any(CAT in r.conclusion for r in kept)  # kept in the terminal's scope, in the host's database
    # … each embedding was a judged, audited call at no cost, and every stored vector is the local model's.
    local = [row for row in audit if row.purpose == "embedding"]
    assert local and all(row.verdict == "allowed" and row.cost_micros == 0 for row in local)
    assert all("model=local/all-MiniLM-L6-v2 (computed on the host)" in row.detail for row in local)
    assert [tuple(row) for row in spent] == [(0,)] and dims == {384}
    # Found again by meaning, in other words (no word in common with the record's but "the"):
    found = CliRunner().invoke(
        cli, ["memory", "search", "pip", "the name of my pet kitten", "-k", "1", "--json"]
    )
    assert found.exit_code == 0, found.output
    assert CAT in json.loads(found.output)[0]["conclusion"]


# ------------------------------------------------------------------ mechanism 122: the movable clock


def faded(intensity: float, age_days: float) -> float:
    """Mechanism 67/68 written out: floor 0.3, 3 days slowed 1.5 times for a negative feeling."""
    return intensity * (0.3 + 0.7 * math.exp(-age_days / (3.0 * 1.5)))


@pytest.mark.anyio
async def test_m122_ages_fading_and_presence_follow_the_movable_clock(tmp_path: Path) -> None:
    """The kit's clock stands far from the wall clock and is moved by days: every age in words, the felt
    strength (its words in the reply, its number from the host) and who is present follow it, while the
    stored record (intensity, last felt) stays as it was written."""
    kit = Kit(tmp_path)
    try:
        rex = await kit.seed("Ann's dog Rex ran away.", feeling="grief", valence=-0.7, intensity=0.9,
                             ago=timedelta(hours=1))  # fmt: skip
        kit.model.defaults["filter"] = verdict(keep=[1])
        engine = kit.engine()
        bob = PresenceEntry(person="Bob", channel="#general", joined_at=NOW - timedelta(minutes=10),
                            last_input_at=NOW - timedelta(minutes=2), turns=3)  # fmt: skip
        seen = {}
        for days in (0, 3, 400):
            now = NOW + timedelta(days=days)
            kit.clock.set(now)  # the host's clock (the store fades at its now) …
            cleo = PresenceEntry(person="Cleo", channel="#art", joined_at=now - timedelta(minutes=45),
                                 last_input_at=now - timedelta(minutes=5), turns=2)  # fmt: skip
            turn = await engine.begin(
                facts("tell me about Rex", now=now, presence=[bob, cleo])
            )  # … and the box's
            seen[days] = (turn.block() or "", await kit.record(rex))
    finally:
        kit.close()

    (today, at_0), (later, at_3), (next_year, at_400) = seen[0], seen[3], seen[400]
    assert "Now: Wednesday, 2 December 2026, 10:00" in today
    assert "Now: Saturday, 5 December 2026, 10:00" in later
    assert "Now: Thursday, 6 January 2028, 10:00" in next_year
    # Ages in words, from when it happened (09:00 on 2 December 2026).
    assert "ran away. (ABOUT 'Ann'; 1 h ago (today at 09:00))" in today
    assert "ran away. (ABOUT 'Ann'; 3 days ago)" in later
    assert "ran away. (ABOUT 'Ann'; 1 year ago)" in next_year
    # Fading at read (67, 68): the host's felt strength at its now, in words in the reply.
    assert at_0.felt == pytest.approx(faded(0.9, 1 / 24))  # 0.894
    assert at_3.felt == pytest.approx(faded(0.9, 3 + 1 / 24))  # 0.590
    assert at_400.felt == pytest.approx(0.27)  # the floor: 0.9 × 0.3
    assert "deeply painful, hurting, overwhelming: grief" in today  # ≥ 0.85
    assert "deeply painful, hurting, clearly there: grief" in later  # 0.4 – 0.6
    assert "deeply painful, hurting, faint: grief" in next_year  # 0.2 – 0.4
    # Presence (10): Bob was live at the first now only; Cleo's ages are counted from each now.
    assert "Bob in #general: joined 10 min ago, last spoke 2 min ago, 3 turns so far." in today
    assert "Bob" not in later and "Bob" not in next_year
    for block in (today, later, next_year):
        assert "Cleo in #art: joined 45 min ago, last spoke 5 min ago, 2 turns so far." in block
    # The stored record is untouched: reading never writes (69: only re-feeling does).
    assert {(r.intensity, r.last_felt, r.happened_at) for r in (at_0, at_3, at_400)} == {
        (0.9, NOW - timedelta(hours=1), NOW - timedelta(hours=1))
    }
