"""The vector cache: vectorised felt strength, the LRU bound, staying in step with other writers (issue 23)."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest

from box.common import laws
from box.protocol.memory import Restore
from impyard.clock import FixedClock
from impyard.memory.cache import VectorCache, felt_now
from impyard.memory.cache_rows import CacheRows
from impyard.memory.scopes import SessionScopes
from impyard.memory.store import MemoryStore
from impyard.storage.db import Database, open_database
from tests.memory.conftest import GUILD, IMP, T0, axis, moment, rows


@pytest.fixture
def mdb(any_engine_db: Database) -> Database:
    """The cache follows the store on SQLite and on PostgreSQL alike: this module runs on both."""
    return any_engine_db


@pytest.mark.parametrize(
    ("intensity", "valence", "age_days", "expected"),
    [
        (0.8, 0.5, 0.0, 0.8),
        (0.8, 0.5, 3.0, 0.446012),
        (0.8, -0.5, 3.0, 0.527514),
        (0.8, 0.0, 3.0, 0.446012),  # zero counts as positive
        (1.0, 0.9, 1000.0, 0.3),
        (0.5, 0.5, -2.0, 0.5),  # a last_felt in the future does not strengthen
    ],
)
def test_m67_m68_felt_now_agrees_with_the_laws(
    intensity: float, valence: float, age_days: float, expected: float
) -> None:
    now = T0 + timedelta(days=10)
    last = now - timedelta(days=age_days)
    vectorised = felt_now(
        np.array([intensity]), np.array([valence]), np.array([last.timestamp()]), now.timestamp()
    )
    assert float(vectorised[0]) == pytest.approx(expected, abs=1e-6)
    assert float(vectorised[0]) == pytest.approx(laws.felt_strength(intensity, valence, last, now), abs=1e-12)


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("I saw ALICE.", "alice"),  # case-insensitive
        ("I saw Alicia", "alice"),  # whole word only
        ("ask a.b* now", "a.b*"),  # regex characters are literal
        ("ask axb now", "a.b"),
        ("Anna was here", "Ann%"),  # and SQL's
        ("Jon was here", "J_n"),
        ("a C++ fan", "C++"),  # a name ending in symbols
        ("the [bot] said", "[bot]"),
        ("ask o'neil", "O'Neil"),
        ("Émile arrived", "ÉMILE"),
        ("anything", " "),  # an empty name names no one
    ],
)
def test_m15_the_cache_matches_names_by_the_laws_own_rule(store: MemoryStore, text: str, name: str) -> None:
    """The host's vectorised name bonus is ``laws.mentions``, the rule the box applies (docs/memory.md)."""
    scoped = store.scoped(IMP, GUILD, "g1")
    scoped.encode(moment(text, vector=axis(1), episode="nothing to see", episode_vector=axis(1)))
    (found,) = scoped.search(axis(2), names=[name], k=1, episodes=0)  # cosine 0: the score is the bonus
    assert found.score == pytest.approx(0.5 if laws.mentions(text, [name]) else 0.0)


def _fill(store: MemoryStore, scope: str, count: int) -> None:
    scoped = store.scoped(IMP, SessionScopes(scope, (scope,)), "c")
    for i in range(count):
        scoped.encode(moment(f"thing {i}", vector=axis(i % 64)))


def test_the_cache_evicts_least_recently_used_and_never_holds_more_than_its_bound(
    store: MemoryStore,
) -> None:
    for scope in ("s1", "s2", "s3"):
        _fill(store, scope, 20)
    rows = CacheRows(store.db)  # the cache's loader: what a search hands it
    probe = VectorCache(1 << 30)
    one = probe.entry(rows, (IMP, "s1", 64)).nbytes
    cache = VectorCache(2 * one + one // 2)  # room for two entries, not three
    for scope in ("s1", "s2", "s3"):
        cache.search(rows, IMP, [scope], axis(0), [], 5, ("lived",), T0.timestamp())
        assert cache.nbytes <= cache.max_bytes
    assert cache.keys() == [(IMP, "s2", 64), (IMP, "s3", 64)]
    assert cache.evictions == 1
    cache.search(rows, IMP, ["s2"], axis(0), [], 5, ("lived",), T0.timestamp())  # s2 is now the newest
    cache.search(rows, IMP, ["s1"], axis(0), [], 5, ("lived",), T0.timestamp())
    assert cache.keys() == [(IMP, "s2", 64), (IMP, "s1", 64)]
    tiny = VectorCache(one // 2)  # an entry larger than the bound is scored, then not kept
    hits = tiny.search(rows, IMP, ["s1"], axis(0), [], 5, ("lived",), T0.timestamp())
    assert len(hits) == 5 and tiny.keys() == [] and tiny.nbytes == 0


def test_the_cache_follows_writes_and_deletes_of_another_process(mdb: Database, clock: FixedClock) -> None:
    db_a, db_b = (open_database(url=mdb.url) for _ in range(2))  # two hosts, one database
    try:
        a = MemoryStore(db_a, clock.now, VectorCache(1 << 26))
        b = MemoryStore(db_b, clock.now, VectorCache(1 << 26))
        writer = b.scoped(IMP, GUILD, "g2")
        first, _ = writer.encode(moment("one", vector=axis(1), intensity=0.5))
        reader = a.scoped(IMP, GUILD, "g1")
        assert [r.id for r in reader.search(axis(1))] == [first]
        assert (a.cache.loads, a.cache.refreshes) == (1, 0)
        second, _ = writer.encode(moment("two", vector=axis(1), intensity=0.9))
        assert [r.id for r in reader.search(axis(1))] == [second, first]
        assert (a.cache.loads, a.cache.refreshes) == (1, 1)  # only the new row was read
        clock.advance(days=3)
        writer.restore([Restore(record_id=first, toward=1.0)])  # a re-felt record moves in the cached arrays
        scores = {r.id: r.score for r in reader.search(axis(1))}
        # felt 0.711503 = 0.278758 + 0.6 × (1 − 0.278758); its score 0.75 + 0.25 × felt (issue 32's weight)
        assert scores[first] == pytest.approx(0.927876, abs=1e-6)
        assert (a.cache.loads, a.cache.refreshes) == (1, 2)
        b.forget_message("g2", "nothing")  # no delete: nothing moves
        b.forget_person(IMP, ["b1"], ["Bob"])
        assert reader.search(axis(1)) == []
        assert a.cache.loads == 2  # a delete elsewhere: the entry is loaded whole again
    finally:
        db_a.close()
        db_b.close()


def test_m14_m16_the_ranking_equals_scoring_every_record_and_episode_one_by_one(
    store: MemoryStore, clock: FixedClock
) -> None:
    """A brute-force reference over random moments: cosine × (0.75 + 0.25 × felt), +0.5 for a name that names at
    most half of the rows ("said", on every episode, names more: no bonus), episodes beating records."""
    rng = np.random.default_rng(16)
    scoped = store.scoped(IMP, GUILD, "g1")
    people = ["Alice", "Bob", "Carol", "Dave"]
    for i in range(150):
        clock.advance(hours=float(rng.uniform(0, 12)))
        who = people[i % 4]
        record, _ = scoped.encode(
            moment(
                f"thought {i} about {people[(i * 7) % 4]}",
                author=who,
                valence=float(rng.uniform(-1, 1)),
                intensity=float(rng.uniform(0, 1)),
                vector=rng.standard_normal(8).tolist(),
                episode=f"{who} said: item {i}",
                episode_vector=rng.standard_normal(8).tolist(),
            )
        )
        for _ in range(int(rng.integers(0, 4))):
            scoped.encode(moment("", join=record, author=who, episode_vector=rng.standard_normal(8).tolist()))
    clock.advance(days=2)
    now = clock.now()
    records = {r["id"]: r for r in rows(store.db, "SELECT * FROM memory_records")}
    episodes = rows(store.db, "SELECT * FROM memory_episodes")

    def vec(row: object) -> list[float]:
        from impyard.memory.vectors import unpack

        return unpack(row["dims"], row["vector"]).tolist()  # type: ignore[index]

    from datetime import datetime

    texts = [r["conclusion"] for r in records.values()] + [e["as_happened"] for e in episodes]

    def bonus_names(names: list[str]) -> list[str]:
        """Issue 32: a name earns the bonus only where it names at most half of the rows (here > 10 rows)."""
        return [n for n in names if sum(laws.mentions(t, [n]) for t in texts) <= len(texts) / 2]

    def weight(felt: float) -> float:
        return 0.75 + 0.25 * felt  # issue 32: fading weighs a quarter of a score

    for names, k in ((["carol"], 10), ([], 10), (["alice", "dave"], 3), ([], 1), (["said"], 10)):
        query = rng.standard_normal(8).tolist()
        expected: dict[str, tuple[float, str | None]] = {}
        named = bonus_names(names)
        for rid, r in records.items():
            felt = laws.felt_strength(
                r["intensity"], r["valence"], datetime.fromisoformat(r["last_felt"]), now
            )
            score = (laws.cosine(query, vec(r)) or 0.0) * weight(felt) + (
                0.5 if laws.mentions(r["conclusion"], named) else 0.0
            )
            expected[rid] = (score, None)
        for e in episodes:
            r = records[e["record_id"]]
            felt = laws.felt_strength(
                r["intensity"], r["valence"], datetime.fromisoformat(r["last_felt"]), now
            )
            score = (laws.cosine(query, vec(e)) or 0.0) * weight(felt) + (
                0.5 if laws.mentions(e["as_happened"], named) else 0.0
            )
            if score > expected[e["record_id"]][0]:
                expected[e["record_id"]] = (score, e["id"])
        best = sorted(expected.items(), key=lambda item: -item[1][0])[:k]
        found = scoped.search(query, names=names, k=k, episodes=0)
        assert [r.id for r in found] == [rid for rid, _ in best]
        assert [r.hit_episode for r in found] == [hit for _, (_, hit) in best]
        # float16 vectors: a score near 1 carries ~1e-4 of rounding
        assert [r.score for r in found] == pytest.approx([score for _, (score, _) in best], abs=3e-4)


def test_m16_an_episode_behind_many_better_episodes_of_other_records_still_counts(store: MemoryStore) -> None:
    scoped = store.scoped(IMP, GUILD, "g1")
    hubs = []
    for _ in range(2):
        hub, _ = scoped.encode(moment("hub", intensity=1.0, vector=axis(5), episode_vector=axis(1)))
        for _ in range(11):
            scoped.encode(moment("", join=hub, episode_vector=axis(1)))
        hubs.append(hub)
    weak = [0.0] * 64
    weak[1], weak[7] = 0.3, 0.953939
    for _ in range(5):
        scoped.encode(moment("weak", intensity=1.0, vector=weak))
    behind = [0.0] * 64
    behind[1], behind[8] = 0.8, 0.6
    hidden, episode = scoped.encode(moment("hidden", intensity=1.0, vector=axis(6), episode_vector=behind))
    found = scoped.search(axis(1), k=3, episodes=0)
    assert {r.id for r in found[:2]} == set(hubs)
    assert (found[2].id, found[2].hit_episode) == (hidden, episode)
    assert [r.score for r in found] == pytest.approx([1.0, 1.0, 0.8], abs=1e-3)


def test_m15_a_name_asked_before_is_matched_in_rows_written_since(store: MemoryStore) -> None:
    scoped = store.scoped(IMP, GUILD, "g1")
    first, _ = scoped.encode(moment("tea with Zoe", intensity=0.5, vector=axis(1)))
    assert [r.score for r in scoped.search(axis(2), names=["Zoe"])] == pytest.approx([0.5], abs=1e-6)
    second, _ = scoped.encode(moment("a walk with Zoe", intensity=0.5, vector=axis(1)))
    third, _ = scoped.encode(
        moment("nobody here", intensity=0.5, vector=axis(1), episode="ZOE said: hi", episode_vector=axis(3))
    )
    fourth, _ = scoped.encode(moment("zoey is someone else", intensity=0.5, vector=axis(1)))
    scores = {r.id: r.score for r in scoped.search(axis(2), names=["zoe "])}
    assert scores == {
        first: pytest.approx(0.5, abs=1e-6),
        second: pytest.approx(0.5, abs=1e-6),
        third: pytest.approx(0.5, abs=1e-6),
        fourth: pytest.approx(0.0, abs=1e-6),
    }
