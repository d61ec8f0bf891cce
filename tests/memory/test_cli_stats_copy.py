"""``impyard memory copy|delete|stats`` through the CLI (issue 15, mechanism 118).

The memory a test starts from is written through the store as the imp's boxes write it (``ScopedMemory``);
the verbs are run with click's ``CliRunner``, and the database is read back with plain SQL.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner, Result

from box.common.embedding import hashing_vector
from box.protocol import memory as mem
from impyard.cli import cli
from impyard.clock import SystemClock, iso
from impyard.imps.store import ImpStore
from impyard.memory.scopes import SessionScopes
from impyard.memory.store import MemoryStore
from impyard.storage.db import open_database
from tests import sqlfile

GUILD = SessionScopes("guild:1000", ("guild:1000",))
DM = SessionScopes("dm:2003", ("dm:2003", "guild:1000"))
# Every table that holds an imp's memory, and what identifies a row in it.
TABLES = {
    "memory_records": "id",
    "memory_episodes": "id",
    "memory_conversations": "channel_id, person",
    "memory_slots": "scope, record_id",
    "memory_dispositions": "id",
    "memory_departures": "channel_id, person",
    "memory_wakefulness": "imp",
}
COPIED_ID = re.compile(r"^[0-9a-f]{32}-[0-9a-f]{8}$")


def run(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input)


def ok(*args: str) -> Any:
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def refused(*args: str) -> str:
    result = run(*args)
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


def hashing_imp(name: str) -> None:
    ImpStore().add(name, memory={"enabled": True, "embedder": "hashing"})


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    db = open_database()
    yield MemoryStore(db, SystemClock().now)
    db.close()


def rows_of(store: MemoryStore, imp: str) -> dict[str, list[dict[str, Any]]]:
    """Every memory row of ``imp``, table by table, in a stable order."""
    return {
        table: [
            dict(r)
            for r in sqlfile.query(store.db, f"SELECT * FROM {table} WHERE imp = ? ORDER BY {key}", (imp,))
        ]
        for table, key in TABLES.items()
    }


def a_full_memory(store: MemoryStore, imp: str = "pip") -> dict[str, str]:
    """Records with episodes in two scopes, a construct held in mind, a saved conversation naming records,
    a learned rule, a pending departure and the day's clock."""
    guild = store.scoped(imp, GUILD, "1001")
    dm = store.scoped(imp, DM, "1100")

    def moment(conclusion: str, said: str, join: str | None = None) -> mem.EncodeParams:
        record = None if join else mem.NewRecord(
            author="carol", author_id="2003", feeling="glad", conclusion=conclusion, valence=0.5, intensity=0.6,
            vector=hashing_vector(conclusion),
        )  # fmt: skip
        episode = mem.NewEpisode(
            author="carol", author_id="2003", as_happened=said, vector=hashing_vector(said)
        )
        return mem.EncodeParams(record=record, join=join, episode=episode)

    picnic, _ = guild.encode(moment("We planned a picnic by the lake.", "carol: a picnic?"))
    guild.encode(moment("", "carol: with bread", join=picnic))
    secret, _ = dm.encode(moment("She told me a secret.", "carol: don't tell"))
    goal, *_ = guild.construct(mem.ConstructParams(construct_kind="goal", statement="bake rye bread", slot=True,
                                                   vector=hashing_vector("bake rye bread")))  # fmt: skip
    guild.conversation_put(
        "2003", {"living": picnic, "focus": [{"id": picnic}, {"id": goal}], "summary": "a picnic"}
    )
    dm.learn(mem.LearnParams(rule="when someone shares a secret → keep it", weight=0.6))
    store.remember(imp, "terminal", "I grew up by the sea.", 0.6, 0.7, age_hours=8760)
    now = iso(SystemClock().now())
    sqlfile.execute(
        store.db,
        "INSERT INTO memory_departures (imp, channel_id, person, last_input_at, queued_at) VALUES (?, '1001', "
        "'2003', ?, ?)",
        (imp, now, now),
    )
    sqlfile.execute(
        store.db,
        "INSERT INTO memory_wakefulness (imp, awake, woke_at, last_activity_at, last_channel, last_reflection_at,"
        " updated_at) VALUES (?, 1, ?, ?, '1001', ?, ?)",
        (imp, now, now, now, now),
    )
    return {"picnic": picnic, "secret": secret, "goal": goal}


# ------------------------------------------------------------------ copy (118)


def test_m118_copy_gives_new_everything_src_remembers_and_leaves_src_untouched(store: MemoryStore) -> None:
    hashing_imp("pip")
    hashing_imp("pip2")
    ids = a_full_memory(store)
    before = rows_of(store, "pip")

    counts = ok("memory", "copy", "pip", "pip2")
    assert {k: counts[k] for k in ("records", "episodes", "conversations", "slots", "rules")} == {
        "records": 4, "episodes": 4, "conversations": 1, "slots": 1, "rules": 1,
    }  # fmt: skip
    assert counts["notes"] == []
    assert rows_of(store, "pip") == before  # the source, row for row

    copy = rows_of(store, "pip2")

    # Same records in the same scopes with the same text, vectors and times; only the ids (and imp) differ.
    def same(row: dict[str, Any], *drop: str) -> dict[str, Any]:
        return {k: v for k, v in row.items() if k not in {"id", "imp", "gen", "record_id", *drop}}

    originals = {r["id"]: r for r in before["memory_records"]}
    for row in copy["memory_records"]:
        assert COPIED_ID.match(row["id"]) and row["id"] not in originals
        assert same(row) == same(originals[row["id"].split("-")[0]])
    copied_ids = {r["id"] for r in copy["memory_records"]}
    originals_e = {r["id"]: r for r in before["memory_episodes"]}
    for row in copy["memory_episodes"]:
        assert row["record_id"] in copied_ids and row["record_id"].split("-")[0] == originals_e[
            row["id"].split("-")[0]]["record_id"]  # fmt: skip
        assert same(row) == same(originals_e[row["id"].split("-")[0]])
    suffixes = {row["id"].split("-")[1] for row in [*copy["memory_records"], *copy["memory_episodes"]]}
    assert len(suffixes) == 1  # one suffix per copy
    suffix = suffixes.pop()
    new = {name: f"{old}-{suffix}" for name, old in ids.items()}
    assert [r["record_id"] for r in copy["memory_slots"]] == [new["goal"]]
    state = json.loads(copy["memory_conversations"][0]["state"])
    assert state == {"living": new["picnic"], "focus": [{"id": new["picnic"]}, {"id": new["goal"]}],
                     "summary": "a picnic"}  # fmt: skip
    assert [r["rule"] for r in copy["memory_dispositions"]] == ["when someone shares a secret → keep it"]
    assert copy["memory_dispositions"][0]["id"] != before["memory_dispositions"][0]["id"]
    assert copy["memory_departures"] == [] and copy["memory_wakefulness"] == []  # a new day, asleep

    # The copy recalls as the source does, in its own scopes only.
    found = ok("memory", "search", "pip2", "picnic by the lake", "--scope", "guild:1000")
    assert [r["id"] for r in found][:1] == [new["picnic"]]
    assert ok("memory", "show", "pip2", "--scope", "dm:2003")[0]["id"] == new["secret"]

    # A copy of the copy: one suffix still, not two.
    hashing_imp("pip3")
    ok("memory", "copy", "pip2", "pip3")
    assert all(COPIED_ID.match(r["id"]) for r in rows_of(store, "pip3")["memory_records"])
    # Deleting the copy leaves the source as it was.
    ok("memory", "delete", "pip2", "--yes")
    assert rows_of(store, "pip") == before


def test_m118_copy_refuses_cleanly_and_changes_nothing(store: MemoryStore) -> None:
    hashing_imp("pip")
    hashing_imp("pip2")
    a_full_memory(store)
    before = rows_of(store, "pip")
    assert "no imp" in refused("memory", "copy", "pip", "ghost").lower()
    assert "impyard imp add ghost" in refused("memory", "copy", "pip", "ghost")
    assert "remembers nothing" in refused("memory", "copy", "pip2", "pip")
    assert "same imp" in refused("memory", "copy", "pip", "pip")
    refused("memory", "copy", "ghost", "pip2")
    ok("memory", "copy", "pip", "pip2")
    again = refused("memory", "copy", "pip", "pip2")
    assert "already remembers" in again and "impyard memory delete pip2" in again
    assert rows_of(store, "pip") == before
    assert len(rows_of(store, "pip2")["memory_records"]) == 4  # the first copy only


def test_copy_says_when_the_new_imp_cannot_use_what_it_got(store: MemoryStore) -> None:
    hashing_imp("pip")
    ImpStore().add("pip2", memory={"enabled": False})
    a_full_memory(store)
    notes = ok("memory", "copy", "pip", "pip2")["notes"]
    assert len(notes) == 2 and "memory is off" in notes[0] and "embeds differently" in notes[1]
    text = run("memory", "delete", "pip2", "-y")
    assert text.exit_code == 0
    shown = run("memory", "copy", "pip", "pip2")
    assert shown.exit_code == 0 and shown.output.count("Note: ") == 2


def test_store_refuses_a_copy_into_a_memory_that_is_not_empty(store: MemoryStore) -> None:
    a_full_memory(store, "pip")
    store.remember("bo", "terminal", "I was here first.", 0.1, 0.5)
    with pytest.raises(ValueError, match="already remembers"):
        store.copy_imp("pip", "bo")
    with pytest.raises(ValueError, match="two different"):
        store.copy_imp("pip", "pip")
    assert len(rows_of(store, "bo")["memory_records"]) == 1


# ------------------------------------------------------------------ delete (118)


def test_m118_delete_asks_then_removes_every_row_of_the_imp_and_no_other(store: MemoryStore) -> None:
    hashing_imp("pip")
    hashing_imp("bo")
    a_full_memory(store, "pip")
    a_full_memory(store, "bo")
    before = rows_of(store, "pip")
    others = rows_of(store, "bo")

    declined = run("memory", "delete", "pip", input="n\n")
    assert (
        declined.exit_code == 1
        and "Delete everything pip remembers: 4 memories in 3 scopes, 1 learned rule?" in declined.output
    )
    assert rows_of(store, "pip") == before  # a refusal changes nothing

    agreed = run("memory", "delete", "pip", input="y\n")
    assert agreed.exit_code == 0, agreed.output
    assert (
        "pip remembers nothing now: deleted 4 memories, 4 moments, 1 conversation, 1 held in mind, 1 learned rule."
        in agreed.output
    )
    assert all(rows == [] for rows in rows_of(store, "pip").values()), rows_of(store, "pip")
    assert rows_of(store, "bo") == others
    assert ok("memory", "show", "pip") == [] and ok("memory", "search", "pip", "picnic") == []
    assert ImpStore().get("pip").name == "pip"  # the imp itself stays
    nothing = ok("memory", "delete", "pip", "--yes")
    assert nothing == {"imp": "pip", "deleted": False}


def test_delete_works_for_an_imp_removed_without_purge_and_refuses_an_unknown_one(store: MemoryStore) -> None:
    hashing_imp("pip")
    a_full_memory(store)
    ImpStore().remove("pip")
    gone = ok("memory", "delete", "pip", "-y")
    assert gone["deleted"] is True and gone["records"] == 4 and gone["rules"] == 1
    assert all(rows == [] for rows in rows_of(store, "pip").values())
    assert "pip" in refused("memory", "delete", "pip", "-y")  # neither an imp nor any memory now


# ------------------------------------------------------------------ stats


def test_stats_counts_per_scope_and_shows_the_day(store: MemoryStore) -> None:
    hashing_imp("pip")
    empty = ok("memory", "stats", "pip")
    assert empty["scopes"] == [] and empty["clock"] is None and empty["rules"] == 0
    assert empty["database_bytes"] > 0
    a_full_memory(store)
    stats = ok("memory", "stats", "pip")
    assert stats["scopes"] == [
        {"scope": "dm:2003", "records": 1, "episodes": 1, "constructs": 0, "given": 0, "conversations": 0,
         "slot": 0},
        {"scope": "guild:1000", "records": 2, "episodes": 2, "constructs": 1, "given": 0, "conversations": 1,
         "slot": 1},
        {"scope": "terminal", "records": 1, "episodes": 1, "constructs": 0, "given": 1, "conversations": 0,
         "slot": 0},
    ]  # fmt: skip
    assert stats["totals"] == {"records": 4, "episodes": 4, "constructs": 1, "given": 1, "conversations": 1,
                               "slot": 1}  # fmt: skip
    assert (stats["rules"], stats["active_rules"]) == (1, 1)
    clock = stats["clock"]
    assert (
        clock["state"] == "awake" and clock["woke_at"] is not None and clock["last_reflection_at"] is not None
    )
    assert (
        clock["slept_at"] is None
        and clock["last_sleep_at"] is None
        and clock["last_consolidation_at"] is None
    )

    slept = iso(SystemClock().now() - timedelta(hours=3))
    sqlfile.execute(
        store.db,
        "UPDATE memory_wakefulness SET awake = 0, slept_at = ?, last_sleep_at = ?, last_consolidation_at = ?"
        " WHERE imp = 'pip'",
        (slept, slept, slept),
    )
    asleep = ok("memory", "stats", "pip")["clock"]
    assert asleep["state"] == "asleep" and asleep["last_consolidation_at"] is not None
    text = run("memory", "stats", "pip")
    assert text.exit_code == 0
    # three hours ago on the wall clock, read a moment later: a loaded machine may show the seconds gone by
    assert re.search(r"Day: asleep since 3h(\d{1,2}s)? ago", text.output), text.output
    assert re.search(r"last consolidation: 3h(\d{1,2}s)? ago", text.output), text.output
    assert "Learned rules: 1 (1 active)" in text.output and "guild:1000\t2\t2\t1\t0\t1\t1" in text.output


def test_stats_of_an_unknown_imp_is_one_error_line() -> None:
    assert "ghost" in refused("memory", "stats", "ghost")
