"""The host's memory store: the laws as the store writes them, episodes, given records, forgetting (issue 23)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from box.protocol import memory as mem
from impyard.clock import FixedClock, iso
from impyard.memory.cache import Generation, VectorCache
from impyard.memory.errors import MemoryDenied, MemoryForgotten, MemoryInvalid
from impyard.memory.forgetting import Forgotten, mentions_are_forgettable
from impyard.memory.records import StoredRecord
from impyard.memory.scoped import ScopedMemory
from impyard.memory.store import MemoryStore
from impyard.storage.db import Database, open_database
from tests.memory.conftest import DM, GUILD, IMP, T0, axis, embed, moment, one, rows, write


@pytest.fixture
def mdb(any_engine_db: Database) -> Database:
    """The store's rules hold on SQLite and on PostgreSQL alike: this module runs on both."""
    return any_engine_db


@pytest.fixture
def guild(store: MemoryStore) -> ScopedMemory:
    return store.scoped(IMP, GUILD, "g1")


@pytest.fixture
def dm(store: MemoryStore) -> ScopedMemory:
    return store.scoped(IMP, DM, "d1")


def stored(store: MemoryStore, record_id: str) -> dict[str, object]:
    [row] = rows(
        store.db,
        "SELECT intensity, valence, happened_at, last_felt, scope, origin, author FROM memory_records WHERE id = :id",
        id=record_id,
    )
    return row


# ------------------------------------------------------------------ B. recall scoring


def test_m14_a_faded_record_ranks_below_an_equally_similar_fresh_one(
    guild: ScopedMemory, clock: FixedClock
) -> None:
    old, _ = guild.encode(moment("we baked bread together", intensity=0.8, vector=axis(1)))
    clock.advance(days=3)
    fresh, _ = guild.encode(moment("we baked bread again", intensity=0.8, vector=axis(1)))
    found = guild.search(axis(1), k=2)
    assert [r.id for r in found] == [fresh, old]
    # Issue 32: cosine × (0.75 + 0.25 × felt) — fading orders equal meanings, it no longer outweighs meaning.
    assert found[0].score == pytest.approx(0.95, abs=1e-6)  # 0.75 + 0.25 × 0.8
    assert found[1].score == pytest.approx(0.861503, abs=1e-6)  # 0.75 + 0.25 × 0.8 × (0.3 + 0.7·e^−1)
    assert found[1].felt == pytest.approx(0.446012, abs=1e-6)
    assert found[1].intensity == 0.8  # fading is at read time: the stored intensity is untouched


def test_m15_a_record_naming_someone_as_a_whole_word_scores_half_more(guild: ScopedMemory) -> None:
    named, _ = guild.encode(moment("I walked with Alice by the river", intensity=0.6, vector=axis(2)))
    partial, _ = guild.encode(moment("I walked with Alicia by the river", intensity=0.6, vector=axis(2)))
    scores = {r.id: r.score for r in guild.search(axis(2), names=["alice"], k=5)}
    assert scores[named] == pytest.approx(1.4, abs=1e-6)  # 0.75 + 0.25 × 0.6, +0.5 (issue 32's weight)
    assert scores[partial] == pytest.approx(0.9, abs=1e-6)


def test_m15_names_with_regex_and_sql_characters_are_taken_literally(guild: ScopedMemory) -> None:
    odd = "O'Brien (50%_off)*"
    named, _ = guild.encode(moment(f"I argued with {odd} today", intensity=0.4, vector=axis(3)))
    other, _ = guild.encode(moment("I argued with OXBrien (50X_off) today", intensity=0.4, vector=axis(3)))
    scores = {r.id: r.score for r in guild.search(axis(3), names=[odd, "a.b", "%", "_"], k=5)}
    assert scores[named] == pytest.approx(1.35, abs=1e-6)  # 0.75 + 0.25 × 0.4, +0.5
    assert scores[other] == pytest.approx(0.85, abs=1e-6)
    assert [r.id for r in guild.about(odd)] == [named]
    assert guild.about("%") == [] and guild.about("_") == []


def test_m16_an_episode_that_beats_its_record_becomes_the_hit_and_is_listed_first(
    guild: ScopedMemory, clock: FixedClock
) -> None:
    record, first = guild.encode(moment("the storm", intensity=0.5, vector=axis(1), episode_vector=axis(2)))
    later = []
    for _ in range(3):
        clock.advance(minutes=1)
        later.append(guild.encode(moment("", join=record, episode_vector=axis(3)))[1])
    (hit,) = guild.search(axis(2), k=1)
    assert hit.id == record
    assert hit.hit_episode == first
    assert hit.score == pytest.approx(0.874939, abs=1e-6)  # 1 × (0.75 + 0.25 × 0.5 × fade(3 min)): issue 32
    # Issue 32: 3 episodes, the best-matching first (the hit), then the equally (un)matching ones newest first.
    assert [e.id for e in hit.episodes] == [first, later[2], later[1]]
    (plain,) = guild.search(axis(3), k=1)  # three match equally: the hit, then newest first
    assert plain.hit_episode == later[0]
    assert [e.id for e in plain.episodes] == [later[0], later[2], later[1]]


def test_m16_an_episode_naming_someone_gets_the_bonus(guild: ScopedMemory) -> None:
    record, episode = guild.encode(
        moment(
            "a quiet day", intensity=0.5, vector=axis(1), episode="Carol said: hello", episode_vector=axis(2)
        )
    )
    (hit,) = guild.search(axis(4), names=["carol"], k=1)
    assert hit.hit_episode == episode
    assert hit.score == pytest.approx(0.5, abs=1e-6)  # cosine 0, +0.5 for naming Carol


def test_m17_at_most_ten_candidates_each_with_at_most_three_newest_episodes(
    guild: ScopedMemory, clock: FixedClock
) -> None:
    ids = [
        guild.encode(moment(f"the rain number {i}", intensity=0.5 + i / 100, vector=axis(1)))[0]
        for i in range(12)
    ]
    for _ in range(4):
        clock.advance(seconds=30)
        guild.encode(moment("", join=ids[11]))
    found = guild.search(axis(1))
    assert len(found) == 10
    assert found[0].id == ids[11]
    assert len(found[0].episodes) == 3
    assert all(len(r.episodes) == 1 for r in found[1:])
    assert [r.id for r in found] == ids[::-1][:10]


def test_m30_vectors_of_another_length_are_never_scored(guild: ScopedMemory) -> None:
    short, _ = guild.encode(moment("short", vector=axis(1, dims=32), episode_vector=axis(1, dims=64)))
    long, _ = guild.encode(
        moment(
            "long", intensity=0.5, vector=axis(2), episode="Alice said: x", episode_vector=axis(1, dims=32)
        )
    )
    found = guild.search(axis(1), names=["alice"], k=10)
    assert [(r.id, r.hit_episode) for r in found] == [(long, None)]
    assert found[0].score == pytest.approx(0.0, abs=1e-6)  # the 32-dim episode naming Alice was not scored
    assert [r.id for r in guild.search(axis(1, dims=32), k=10)] == [short]


def test_search_kinds_filter_constructs(guild: ScopedMemory) -> None:
    lived, _ = guild.encode(moment("lived", vector=axis(1)))
    belief, _ = guild.encode(
        moment("people are kind", vector=axis(1), kind="construct", construct_kind="belief")
    )
    assert [r.id for r in guild.search(axis(1), kinds=["lived"])] == [lived]
    assert [r.id for r in guild.search(axis(1), kinds=["construct"])] == [belief]
    assert [r.id for r in guild.constructs("belief")] == [belief]
    assert guild.constructs("dream") == []


# ------------------------------------------------------------------ G. strength over time, as written


def test_m69_m70_restore_writes_the_faded_strength_then_closes_six_tenths_of_the_gap(
    guild: ScopedMemory, store: MemoryStore, clock: FixedClock
) -> None:
    record, _ = guild.encode(moment("a loss", valence=0.5, intensity=0.8))
    clock.advance(days=3)
    assert guild.restore([mem.Restore(record_id=record, toward=0.9)]) == 1
    row = stored(store, record)
    assert row["intensity"] == pytest.approx(0.718405, abs=1e-6)  # 0.446012 + 0.6 × (0.9 − 0.446012)
    assert row["last_felt"] == iso(T0 + timedelta(days=3))
    assert row["valence"] == 0.5 and row["happened_at"] == iso(T0)


def test_m70_a_restore_toward_less_keeps_the_strength_and_still_sets_last_felt(
    guild: ScopedMemory, store: MemoryStore, clock: FixedClock
) -> None:
    record, _ = guild.encode(moment("a loss", valence=0.5, intensity=0.8))
    clock.advance(days=3)
    guild.restore([mem.Restore(record_id=record, toward=0.2)])
    row = stored(store, record)
    assert row["intensity"] == pytest.approx(0.446012, abs=1e-6)  # the faded value, written (mechanism 69)
    assert row["last_felt"] == iso(T0 + timedelta(days=3))
    clock.advance(days=1)
    guild.restore([mem.Restore(record_id=record, toward=0.1)])
    assert stored(store, record)["intensity"] == pytest.approx(0.357511, abs=1e-6)  # 0.446012 × fade(1 d)
    numb, _ = guild.encode(moment("nothing felt", intensity=0.0))
    clock.advance(days=2)
    guild.restore([mem.Restore(record_id=numb, toward=0.0)])  # the strength cannot move at all
    assert stored(store, numb)["intensity"] == 0.0
    assert stored(store, numb)["last_felt"] == iso(T0 + timedelta(days=6))


def test_m67_m68_felt_strength_on_the_hosts_clock(guild: ScopedMemory, clock: FixedClock) -> None:
    guild.encode(moment("good", valence=0.5, intensity=0.8))
    guild.encode(moment("bad", valence=-0.5, intensity=0.8))
    clock.advance(days=3)
    felt = {r.conclusion: r.felt for r in guild.recent(k=5)}
    assert felt == {"good": pytest.approx(0.446012, abs=1e-6), "bad": pytest.approx(0.527514, abs=1e-6)}
    clock.advance(days=1000)
    assert {r.conclusion: r.felt for r in guild.recent(k=5)} == {
        "good": pytest.approx(0.24),
        "bad": pytest.approx(0.24),
    }


def test_m65_m66_encode_joins_and_restores_in_one_transaction(
    guild: ScopedMemory, store: MemoryStore, clock: FixedClock
) -> None:
    living, _ = guild.encode(moment("talk", valence=0.5, intensity=0.8))
    echo, _ = guild.encode(moment("an old joy", valence=0.4, intensity=0.8))
    clock.advance(days=3)
    record, episode = guild.encode(
        moment(
            "",
            join=living,
            restore=[mem.Restore(record_id=living, toward=0.9), mem.Restore(record_id=echo, toward=0.9)],
        )
    )
    assert record == living
    assert stored(store, living)["intensity"] == pytest.approx(0.718405, abs=1e-6)
    assert stored(store, echo)["intensity"] == pytest.approx(0.718405, abs=1e-6)
    assert [e.id for e in guild.episodes([living], per_record=5)][0] == episode
    assert len(guild.episodes([echo], per_record=5)) == 1  # the echo gets no new episode


def test_a_moment_restoring_a_record_of_another_scope_moves_each_scope_once(
    guild: ScopedMemory, dm: ScopedMemory, store: MemoryStore, clock: FixedClock
) -> None:
    """The DM's write locks the guild's scope too (it re-feels a record there): both move on, once each."""
    guild_record, _ = guild.encode(moment("in the guild", intensity=0.5))
    clock.advance(days=1)
    dm.encode(
        moment("in the dm", restore=[mem.Restore(record_id=guild_record, toward=0.9)] * 2)  # named twice
    )
    assert store.generation(IMP, "guild:G1") == Generation(version=2, deletes=0)
    assert store.generation(IMP, "dm:p1") == Generation(version=1, deletes=0)
    assert stored(store, guild_record)["last_felt"] == "2026-01-16T12:00:00.000000+00:00"


def test_a_scope_only_read_stays_at_the_generation_of_one_never_written(
    store: MemoryStore, guild: ScopedMemory
) -> None:
    """Reading the slot locks the scope's row (made at 0 on PostgreSQL): it stands where no row stands."""
    assert guild.slot() == []
    assert store.generation(IMP, "guild:G1") == Generation(version=0, deletes=0)
    guild.encode(moment("the first"))
    assert store.generation(IMP, "guild:G1") == Generation(version=1, deletes=0)


def test_a_refused_join_writes_nothing(guild: ScopedMemory, dm: ScopedMemory, store: MemoryStore) -> None:
    secret, _ = dm.encode(moment("a secret"))
    guild_record, _ = guild.encode(moment("in the guild"))
    with pytest.raises(MemoryDenied):
        guild.encode(moment("", join=secret, restore=[mem.Restore(record_id=guild_record, toward=1.0)]))
    with pytest.raises(MemoryDenied):  # readable from the DM, but not its writes scope
        dm.encode(moment("", join=guild_record))
    assert store.count(IMP) == 2
    assert one(store.db, "SELECT COUNT(*) FROM memory_episodes") == 2
    assert stored(store, guild_record)["intensity"] == 0.8


# ------------------------------------------------------------------ M. records and episodes


def test_m116_records_and_episodes_are_separate_and_episodes_load_newest_first(
    guild: ScopedMemory, store: MemoryStore, clock: FixedClock
) -> None:
    record, first = guild.encode(moment("the fair"))
    clock.advance(minutes=5)
    _, second = guild.encode(moment("", join=record))
    tables = set(store.db.read(lambda conn: sa.inspect(conn).get_table_names()))
    assert {"memory_records", "memory_episodes"} <= tables
    assert [e.id for e in guild.episodes([record])] == [second, first]
    assert {e.record_id for e in guild.episodes([record])} == {record}


def test_m117_a_record_has_no_event_and_its_valence_is_never_updated(
    guild: ScopedMemory, store: MemoryStore, clock: FixedClock
) -> None:
    columns = {c["name"] for c in store.db.read(lambda conn: sa.inspect(conn).get_columns("memory_records"))}
    assert "event" not in columns
    record, _ = guild.encode(moment("mixed", valence=-0.3, intensity=0.5))
    clock.advance(days=2)
    guild.encode(moment("", join=record, valence=0.9, restore=[mem.Restore(record_id=record, toward=1.0)]))
    guild.restore([mem.Restore(record_id=record, toward=0.1)])
    assert stored(store, record)["valence"] == -0.3


def test_m115_remember_stores_a_given_record_dated_in_the_past(store: MemoryStore) -> None:
    record = store.remember(IMP, "terminal", "I lost my dog", valence=-0.7, intensity=0.8, age_hours=720)
    row = stored(store, record)
    assert row["author"] == "Self" and row["origin"] == "given"
    assert row["happened_at"] == row["last_felt"] == iso(T0 - timedelta(hours=720))
    terminal = store.scoped(IMP, type(GUILD)("terminal", ("terminal",)), "t1")
    (view,) = terminal.recent()
    assert view.id == record
    assert view.felt == pytest.approx(0.240713, abs=1e-6)  # −0.7/0.8 at 720 h is felt at about 0.24
    assert [e.as_happened for e in view.episodes] == ["I lost my dog"]
    with pytest.raises(MemoryInvalid):
        store.remember(IMP, "terminal", "", valence=0.0, intensity=0.5)
    with pytest.raises(MemoryInvalid):
        store.remember(IMP, "terminal", "x", valence=2.0, intensity=0.5)


def test_about_is_by_author_or_whole_word_mention_strongest_first(guild: ScopedMemory) -> None:
    by, _ = guild.encode(moment("I was tired", author="Dana", author_id="d9", intensity=0.3))
    mention, _ = guild.encode(moment("everyone likes Dana", intensity=0.9))
    guild.encode(moment("Danaë came by", intensity=1.0))
    assert [r.id for r in guild.about("Dana")] == [mention, by]
    assert [r.id for r in guild.about("Dana", exclude=[mention])] == [by]


# ------------------------------------------------------------------ operator API


def test_show_filters_by_person_and_scope(store: MemoryStore, guild: ScopedMemory, dm: ScopedMemory) -> None:
    g, _ = guild.encode(moment("guild thing"))
    d, _ = dm.encode(moment("dm thing", author="Pat", author_id="p1"))
    assert {r.id for r in store.show(IMP)} == {g, d}
    assert [r.id for r in store.show(IMP, scope="guild:G1")] == [g]
    assert [r.id for r in store.show(IMP, person="Pat")] == [d]
    assert [r.id for r in store.show(IMP, person="p1")] == [d]
    assert store.count(IMP) == 2 and store.count(IMP, ["dm:p1"]) == 1 and store.count("other") == 0


def test_operator_search_sees_every_scope(store: MemoryStore, guild: ScopedMemory, dm: ScopedMemory) -> None:
    g, _ = guild.encode(moment("guild", vector=axis(1), intensity=0.5))
    d, _ = dm.encode(moment("dm", vector=axis(1), intensity=0.9))
    assert [r.id for r in store.search(IMP, axis(1))] == [d, g]
    assert [r.id for r in store.search(IMP, axis(1), scopes=["guild:G1"])] == [g]


def test_forget_person_removes_everything_by_or_about_them(
    store: MemoryStore, guild: ScopedMemory, dm: ScopedMemory
) -> None:
    name = "Robert'); DROP TABLE memory_records;-- %_"
    by, _ = dm.encode(moment("told me things", author=name, author_id="p1"))
    about, _ = guild.encode(moment(f"I worry about {name} a lot", author="Eve", author_id="e1"))
    kept, _ = guild.encode(moment("lunch with Eve", author="Eve", author_id="e1"))
    _, their_episode = guild.encode(moment("", join=kept, author=name, author_id="p1"))
    dm.conversation_put("p1", {"summary": "secret"})
    forgotten = store.forget_person(IMP, ["p1"], [name])
    assert (forgotten.records, forgotten.episodes, forgotten.conversations) == (2, 3, 1)
    assert (forgotten.by_id, forgotten.by_name) == (
        3,
        2,
    )  # hers: a record, its episode, one in kept; about: 2
    assert [r.id for r in store.show(IMP)] == [kept]
    assert [e.id for e in guild.episodes([kept], per_record=10)] != [] and their_episode not in {
        e.id for e in guild.episodes([kept], per_record=10)
    }
    assert dm.conversation_get("p1") == (None, None)
    assert by not in {r.id for r in store.show(IMP)} and about not in {r.id for r in store.show(IMP)}


def test_forget_person_takes_the_constructs_of_their_dm_and_those_naming_them(
    store: MemoryStore, guild: ScopedMemory, dm: ScopedMemory
) -> None:
    """Issue 14: the imp's own thoughts formed in a DM with them go with that DM, as its lived records do;
    a construct elsewhere goes only if its statement or conclusion names them. Their slot rows go too."""
    dm.construct(mem.ConstructParams(construct_kind="thought", statement="the rain was loud"))
    guild.construct(mem.ConstructParams(construct_kind="belief", statement="Pat bakes well"))
    kept, *_ = guild.construct(mem.ConstructParams(construct_kind="belief", statement="bread needs time"))
    forgotten = store.forget_person(IMP, ["p1"], ["Pat"])
    assert (forgotten.records, forgotten.by_id, forgotten.by_name) == (2, 1, 1)
    assert [r.id for r in store.show(IMP)] == [kept]
    assert [r["record_id"] for r in rows(store.db, "SELECT record_id FROM memory_slots")] == [kept]


def test_forget_imp_takes_its_rules_slots_and_departures_and_no_other_imps(
    store: MemoryStore, guild: ScopedMemory, clock: FixedClock
) -> None:
    guild.construct(mem.ConstructParams(construct_kind="goal", statement="finish the boat"))
    guild.learn(mem.LearnParams(rule="when x → y", weight=0.5))
    other = store.scoped("bo", GUILD, "g1")
    other.construct(mem.ConstructParams(construct_kind="goal", statement="finish the boat"))
    other.learn(mem.LearnParams(rule="when x → y", weight=0.5))
    for imp in (IMP, "bo"):
        write(
            store.db,
            "INSERT INTO memory_departures (imp, channel_id, person, last_input_at, queued_at)"
            " VALUES (:imp, 'g1', 'p1', :at, :at)",
            imp=imp, at=iso(clock.now()),
        )  # fmt: skip
    gone = store.forget_imp(IMP)
    assert gone == {
        "records": 1, "episodes": 0, "conversations": 0, "slots": 1, "rules": 1, "departures": 1,
    }  # fmt: skip
    for table in ("memory_records", "memory_slots", "memory_dispositions", "memory_departures"):
        assert [r["imp"] for r in rows(store.db, f"SELECT DISTINCT imp FROM {table}")] == ["bo"], table


def test_forget_person_removes_a_record_left_without_episodes(
    store: MemoryStore, guild: ScopedMemory
) -> None:
    record, _ = guild.encode(moment("only their words", author="Zed", author_id="z1"))
    assert store.forget_person(IMP, ["nobody"], ["Zed"]) == Forgotten(
        records=1, episodes=1, by_name=2, mentions_of=("Zed",)
    )
    assert store.count(IMP) == 0 and record


@pytest.mark.parametrize(
    ("name", "forgettable"),
    [
        ("carol", True),
        ("Jo Ann", True),  # one distinctive word is enough: the whole name is what is matched
        ("Émile", True),
        ("Al", False),  # too short: "Al" is in too many other words' company
        ("I", False),
        ("the", False),  # a common word names everyone
        ("Will", False),  # a name that is also a common word: only what they wrote under it goes
        ("I am", False),
        ("x1", False),  # letters, not characters
        ("", False),
    ],
)
def test_mentions_of_short_or_common_names_are_not_forgotten(name: str, forgettable: bool) -> None:
    assert mentions_are_forgettable(name) is forgettable


def test_forget_person_named_with_a_common_word_takes_only_what_they_wrote(
    store: MemoryStore, guild: ScopedMemory
) -> None:
    theirs, _ = guild.encode(moment("the cake was fine", author="the", author_id="p9"))
    under_name, _ = guild.encode(moment("hello there", author="the", author_id="t1"))
    unrelated, _ = guild.encode(moment("the weather is nice", author="Eve", author_id="e1"))
    about_al, _ = guild.encode(moment("Al and the band", author="Eve", author_id="e1"))
    forgotten = store.forget_person(IMP, ["p9"], ["the", "Al"])
    assert forgotten == Forgotten(
        records=2, episodes=2, by_id=2, by_name=2, mentions_of=(), author_only=("the", "Al")
    )
    assert {r.id for r in store.show(IMP)} == {unrelated, about_al} and theirs and under_name


def test_forget_person_takes_sequences_not_one_string(store: MemoryStore) -> None:
    with pytest.raises(TypeError):
        store.forget_person(IMP, "p1", ["carol"])  # "p1" would otherwise be the ids "p" and "1"
    with pytest.raises(TypeError):
        store.forget_person(IMP, ["p1"], "carol")


def test_show_and_search_say_which_scope_each_record_is_in(
    store: MemoryStore, guild: ScopedMemory, dm: ScopedMemory
) -> None:
    in_guild, _ = guild.encode(moment("guild talk", vector=axis(4)))
    in_dm, _ = dm.encode(moment("dm talk", vector=axis(4)))
    shown = {r.id: r for r in store.show(IMP)}
    found = {r.id: r for r in store.search(IMP, axis(4))}
    for views in (shown, found):
        assert all(isinstance(v, StoredRecord) for v in views.values())
        assert {i: v.scope for i, v in views.items()} == {in_guild: "guild:G1", in_dm: "dm:p1"}  # type: ignore[attr-defined]
    assert all(
        type(r) is mem.RecordView for r in guild.search(axis(4)) + guild.recent()
    )  # a box never sees it


def test_forget_message_removes_its_episodes_for_every_imp(
    store: MemoryStore, guild: ScopedMemory, clock: FixedClock
) -> None:
    other = store.scoped("bea", GUILD, "g1")
    alone, _ = guild.encode(moment("only this", message_id="m1"))
    shared, _ = guild.encode(moment("two moments", message_id="m2"))
    guild.encode(moment("", join=shared, message_id="m1"))
    theirs, _ = other.encode(moment("bea too", message_id="m1"))
    assert store.forget_message("g1", "m1") == {"records": 2, "episodes": 3}
    assert [r.id for r in store.show(IMP)] == [shared]
    assert len(guild.episodes([shared])) == 1
    assert store.count("bea") == 0 and alone and theirs
    assert store.forget_message("g1", "m1") == {"records": 0, "episodes": 0}


def test_a_turn_still_running_keeps_nothing_of_a_message_deleted_meanwhile(
    store: MemoryStore, guild: ScopedMemory, clock: FixedClock
) -> None:
    living, _ = guild.encode(moment("we chat", message_id="m0"))
    assert store.forget_message("g1", "m1") == {"records": 0, "episodes": 0}  # deleted before its turn ended
    before = one(store.db, "SELECT COUNT(*) FROM memory_episodes")
    with pytest.raises(MemoryForgotten) as refused:
        guild.encode(moment("their address", message_id="m1"))
    felt_before = stored(store, living)["last_felt"]
    clock.advance(hours=1)
    with pytest.raises(MemoryForgotten):  # nor a join, nor its restores
        guild.encode(
            moment("", join=living, message_id="m1", restore=[mem.Restore(record_id=living, toward=0.9)])
        )
    assert stored(store, living)["last_felt"] == felt_before
    assert refused.value.rule == "memory-forgotten" and isinstance(refused.value, MemoryDenied)
    assert store.count(IMP) == 1 and one(store.db, "SELECT COUNT(*) FROM memory_episodes") == before
    other_channel, _ = store.scoped(IMP, GUILD, "g2").encode(moment("same id elsewhere", message_id="m1"))
    assert other_channel  # the mark is the channel's message, not every message with that id
    clock.advance(days=8)
    store.forget_message("g1", "m-later")  # marks older than a week are dropped on the way
    assert [r["message_id"] for r in rows(store.db, "SELECT message_id FROM memory_forgotten_messages")] == [
        "m-later"
    ]


def test_conversation_state_is_kept_per_channel_and_person_in_the_writes_scope(
    store: MemoryStore, dm: ScopedMemory, clock: FixedClock
) -> None:
    dm.conversation_put("p1", {"focus": [1, 2], "summary": "hi"})
    state, updated = dm.conversation_get("p1")
    assert state == {"focus": [1, 2], "summary": "hi"} and updated == T0
    assert one(store.db, "SELECT scope FROM memory_conversations") == "dm:p1"
    same_channel_guild_scopes = store.scoped(IMP, GUILD, "d1")
    assert same_channel_guild_scopes.conversation_get("p1") == (None, None)
    with pytest.raises(MemoryInvalid):
        dm.conversation_put("p1", {"s": "x" * 262_137})
    dm.conversation_put("p1", {"s": "x" * 262_136})  # exactly 262,144 bytes of JSON
    assert embed("x")


def test_a_channel_keeps_the_200_most_recently_saved_conversations(
    store: MemoryStore, guild: ScopedMemory, clock: FixedClock
) -> None:
    """A hostile box naming made-up people cannot grow a channel's conversation states without bound: past 200
    people the longest untouched goes; a conversation saved again is kept, and other channels are untouched."""
    store.scoped(IMP, GUILD, "g2").conversation_put("elsewhere", {"s": "kept"})
    for n in range(200):
        guild.conversation_put(f"p{n}", {"n": n})
        clock.advance(seconds=1)
    guild.conversation_put("p0", {"n": "again"})  # p0 is now the newest; p1 the longest untouched
    clock.advance(seconds=1)
    guild.conversation_put("p200", {"n": 200})
    assert guild.conversation_get("p1") == (None, None)
    assert guild.conversation_get("p0")[0] == {"n": "again"}
    assert guild.conversation_get("p200")[0] == {"n": 200} and guild.conversation_get("p2")[0] == {"n": 2}
    counted = rows(store.db, "SELECT channel_id, COUNT(*) AS n FROM memory_conversations GROUP BY channel_id")
    assert {r["channel_id"]: r["n"] for r in counted} == {"g1": 200, "g2": 1}


def test_m03_the_total_follows_writes_and_deletes_from_any_process(
    store: MemoryStore, mdb: Database, clock: FixedClock, tmp_path: Path
) -> None:
    """Mechanism 3's total is counted once per scope generation: a write or a delete made through another
    store over the same database file (another host process) moves it, so it is never stale."""
    guild = store.scoped(IMP, GUILD, "g1")
    assert guild.count() == 0
    guild.encode(moment("the kettle sang", message_id="m1"))
    assert guild.count() == 1
    other_db = open_database(url=mdb.url)  # another host on the same database
    try:
        other = MemoryStore(other_db, clock.now, VectorCache(1024 * 1024))
        other.scoped(IMP, GUILD, "g2").encode(moment("the bread rose", message_id="m2"))
        other.scoped(IMP, DM, "d1").encode(moment("a private worry", message_id="m3"))  # writes dm:p1
    finally:
        other_db.close()
    assert guild.count() == 2  # the DM's record is not the guild session's
    assert store.scoped(IMP, DM, "d1").count() == 3
    store.forget_message("g2", "m2")
    assert guild.count() == 1
