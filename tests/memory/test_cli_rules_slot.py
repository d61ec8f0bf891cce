"""``impyard memory rules`` and ``impyard memory slot`` through the CLI (issue 14, operator verbs)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from box.protocol.memory import ConstructParams, LearnParams
from impyard.clock import SystemClock, iso
from impyard.memory.scopes import SessionScopes
from impyard.memory.store import MemoryStore
from impyard.storage.db import open_database
from tests import sqlfile
from tests.memory.test_cli_memory import hashing_imp, ok, refused, run

GUILD = "guild:1000"
DM = "dm:2003"


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    db = open_database()
    yield MemoryStore(db, SystemClock().now)
    db.close()


# ------------------------------------------------------------------ rules


def test_rules_says_plainly_that_nothing_is_learned_yet_and_when_it_will_be() -> None:
    hashing_imp()
    result = run("memory", "rules", "pip")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == (
        "pip has learned nothing yet: a rule is learned when someone leaves a conversation with it (half an "
        "hour without a word from them, or /quit in impyard chat), from how that conversation felt."
    )
    assert ok("memory", "rules", "pip") == []


def test_rules_lists_what_was_learned_strongest_first_with_count_and_state(store: MemoryStore) -> None:
    hashing_imp()
    scoped = store.scoped("pip", SessionScopes(GUILD, (GUILD,)), "1001")
    kind = scoped.learn(LearnParams(rule="when someone is sad → listen before advising", weight=-0.6))
    scoped.learn(LearnParams(rule="when someone is sad → listen first", weight=-0.4, same=kind.id))
    boast = scoped.learn(LearnParams(rule="when praised → boast", weight=0.3))
    scoped.learn(LearnParams(rule="when praised → say thank you", weight=0.3, contradicts=boast.id))
    store.scoped("bo", SessionScopes(GUILD, (GUILD,)), "1001").learn(
        LearnParams(rule="when x → y", weight=0.9)
    )
    listed = ok("memory", "rules", "pip")
    assert [(r["rule"], r["weight"], r["count"], r["state"]) for r in listed] == [
        ("when someone is sad → listen before advising", -0.6, 2, "active"),
        ("when praised → say thank you", 0.3, 1, "active"),
        ("when praised → boast", 0.0, 1, "dormant"),
    ]
    table = run("memory", "rules", "pip")
    assert table.exit_code == 0, table.output
    for text in ("listen before advising", "-0.60", "dormant", "active", "now"):
        assert text in table.output
    assert "when x → y" not in table.output


def test_rules_of_an_unknown_imp_is_one_line() -> None:
    assert "nobody" in refused("memory", "rules", "nobody")


# ------------------------------------------------------------------ slot


def test_slot_shows_what_the_imp_holds_in_mind_per_scope(store: MemoryStore) -> None:
    hashing_imp()
    guild = store.scoped("pip", SessionScopes(GUILD, (GUILD,)), "1001")
    dm = store.scoped("pip", SessionScopes(DM, (DM,)), "1100")
    guild.construct(
        ConstructParams(construct_kind="belief", statement="the guild likes bread", intensity=0.7)
    )
    dm.construct(ConstructParams(construct_kind="decision", statement="keep Carol's secret", intensity=0.9))
    dm.construct(ConstructParams(construct_kind="thought", statement="not held", slot=False))
    everything = ok("memory", "slot", "pip")
    assert [(e["scope"], e["record"]["construct_kind"], e["record"]["statement"]) for e in everything] == [
        (DM, "decision", "keep Carol's secret"),
        (GUILD, "belief", "the guild likes bread"),
    ]
    assert everything[0]["record"]["intensity"] == 0.9 and "activated_at" in everything[0]
    only_dm = ok("memory", "slot", "pip", "--scope", DM)
    assert [e["record"]["statement"] for e in only_dm] == ["keep Carol's secret"]
    table = run("memory", "slot", "pip", "--scope", GUILD)
    assert table.exit_code == 0, table.output
    for text in (GUILD, "belief", "the guild likes bread", "0.70", "now"):
        assert text in table.output
    assert "Carol" not in table.output


def test_slot_leaves_out_what_was_not_brought_to_mind_for_a_week(store: MemoryStore) -> None:
    hashing_imp()
    guild = store.scoped("pip", SessionScopes(GUILD, (GUILD,)), "1001")
    old, *_ = guild.construct(ConstructParams(construct_kind="thought", statement="an old thought"))
    sqlfile.execute(
        store.db,
        "UPDATE memory_slots SET activated_at = ? WHERE record_id = ?",
        (iso(SystemClock().now() - timedelta(days=8)), old),
    )
    result = run("memory", "slot", "pip")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "pip holds nothing in mind: its thoughts come when it reflects."
    assert (
        sqlfile.query(store.db, "SELECT COUNT(*) FROM memory_slots")[0][0] == 1
    )  # the operator's look changes nothing


def test_slot_empty_in_a_scope_says_so() -> None:
    hashing_imp()
    result = run("memory", "slot", "pip", "--scope", GUILD)
    assert result.exit_code == 0, result.output
    assert (
        result.output.strip() == f"pip holds nothing in mind in {GUILD}: its thoughts come when it reflects."
    )


@pytest.mark.parametrize("scope", ["guild", "dm:", "everything", "guild:1; DROP TABLE memory_slots"])
def test_slot_refuses_a_scope_that_is_not_one(scope: str) -> None:
    hashing_imp()
    assert "is not a memory scope" in refused("memory", "slot", "pip", "--scope", scope)


def test_slot_of_an_unknown_imp_is_one_line() -> None:
    assert "nobody" in refused("memory", "slot", "nobody")
