"""An imp that talks German learns rules (issue 32, finding 9), and the host still refuses a known person's name.

``impyard chat`` runs in this process over a pipe against the fake OpenAI, with the real box program and its
memory engine (``python -m box``, the process backend): three messages in German, then ``/quit``, which runs the
departure (mechanism 103) in a real ``depart`` box — a quiet reflection, then the learning call (90), scripted
here to answer a rule. Before issue 32 the box refused every capitalised word, so a German rule ("Arbeit",
"Abstand") was never learned. A rule naming Carol — someone the host knows from its history, not the person
who left — passes the box (which knows only the person) and is refused by the host's rule law.
"""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest

from impyard.channels.store import ChannelInfo, ChannelStore
from impyard.clock import SystemClock
from impyard.memory.store import MemoryStore
from impyard.storage.db import open_database
from impyard.supervisor import SupervisorSettings
from impyard.terminal.chat import run_chat
from testing.fake_openai import FakeOpenAI, envelope
from testing.inprocess import InProcessBackend
from tests.test_departures import talk
from tests.test_departures_chat import Pipe, add_pip, depart_tasks

pytestmark = pytest.mark.anyio

LOOP = SupervisorSettings(tick_s=0.05, shutdown_grace_s=2.0)
CAROL, CAROL_DM = "100000000000000003", "300000000000000002"
GERMAN = "wenn jemand meine Arbeit verspottet → halte ich Abstand"
NAMING_CAROL = "wenn Carol meine Arbeit verspottet → halte ich Abstand"


def scripted(server: FakeOpenAI, learned: str) -> None:
    server.script(envelope(answer="Das tut mir leid.", answer_needed=True), purpose="reply")
    server.script({"feeling": "gekränkt", "conclusion": "Man verspottet meine Arbeit.", "valence": -0.6,
                   "intensity": 0.6}, purpose="appraisal")  # fmt: skip
    server.script({"keep": [], "asks_for_memory": False, "asks_for_own": None}, purpose="filter")
    server.script({"summary": "Wir sprachen über meine Arbeit."}, purpose="summary")
    server.script({"feeling": "Ruhe", "conclusion": "Jemand ist da.", "valence": 0.1,
                   "intensity": 0.2, "search": None}, purpose="arrival")  # fmt: skip
    server.script({"learned": learned}, purpose="learning")


@pytest.mark.parametrize(("learned", "kept"), [(GERMAN, [GERMAN]), (NAMING_CAROL, [])])
async def test_a_german_imp_learns_a_rule_and_a_known_name_is_refused_by_the_host(
    monkeypatch: pytest.MonkeyPatch, impyard_home: Path, learned: str, kept: list[str]
) -> None:
    add_pip()
    db = open_database()
    try:  # Carol talked with pip in her DM just now: someone the host knows
        ChannelStore(db, SystemClock()).upsert(ChannelInfo(CAROL_DM, kind="dm", name="Carol"))
        talk(db, "pip", CAROL_DM, CAROL, datetime.now(UTC), name="Carol")
    finally:
        db.close()
    with FakeOpenAI() as server:
        monkeypatch.setenv("OPENAI_API_KEY", server.api_key or "sk-impyard-test")
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        scripted(server, learned)
        pipe, out = Pipe(), io.StringIO()
        pipe.send("Hallo Pip.\nDu verspottest ständig meine Arbeit.\nDas tut wirklich weh.\n/quit\n")
        pipe.close()
        with anyio.fail_after(120):
            await run_chat("pip", stdin=pipe.reader, out=out, backends={"pip": InProcessBackend()},
                           departures=LOOP)  # fmt: skip
        learning = [r for r in server.requests if r.purpose == "learning"]
    [task] = [t for t in depart_tasks() if t.channel_id != CAROL_DM]
    db = open_database()
    try:
        rules = [rule.rule for rule in MemoryStore(db, SystemClock().now).rules("pip")]
    finally:
        db.close()
    assert len(learning) == 1, task.box_summary  # the departure asked for a rule
    assert rules == kept, task.box_summary
    if kept:
        assert task.box_summary is not None and f"learned (added, weight -0.60): {GERMAN}" in task.box_summary
    else:  # the box knew only the person who left; the host knew Carol
        assert task.box_summary is not None and "the host refused the rule" in task.box_summary
        assert "memory-rule-law: it names someone (Carol)" in task.box_summary
