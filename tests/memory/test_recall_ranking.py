"""Issue 32, finding 8: recall ranks by meaning first (docs/memory.md, "Where recall departs from the seed").

On a long conversation recall fell far behind a plain vector search. Each rule below is one cause, tested through
the box protocol (the box's ``Recall`` and engine over the host's real ``MemoryService``, every request through
JSON as on the wire) with vectors chosen so the cosines are known exactly:

* fading breaks ties instead of outweighing meaning (mechanism 14: cosine × (0.75 + 0.25 × felt));
* the name bonus counts only where the name discriminates (mechanism 15: not on more than half of a scope's rows);
* a record surfaces with the episodes that match the words (mechanisms 16, 17), and keeps them in the State
  (subtle point 5);
* an episode's vector is what the person said (mechanism 62; ``test_engine_moment`` checks the embedding calls).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import timedelta

import pytest

from box.memory.recall import FilterVerdict, Recall
from box.protocol import memory as mem
from box.protocol.memory import RecordView
from tests.memory.engine_kit import Kit, facts, verdict

pytestmark = pytest.mark.anyio

DIMS = 64


def axis(i: int) -> list[float]:
    return [1.0 if j == i else 0.0 for j in range(DIMS)]


def toward(i: int, j: int, cosine: float) -> list[float]:
    """A unit vector whose cosine with ``axis(i)`` is ``cosine`` (the rest along ``axis(j)``)."""
    vector = [0.0] * DIMS
    vector[i], vector[j] = cosine, math.sqrt(1.0 - cosine * cosine)
    return vector


class Fixed:
    """An embedder whose every query lands on one vector."""

    def __init__(self, vector: list[float]) -> None:
        self.vector = vector

    async def embed(self, text: str) -> list[float] | None:
        return self.vector


class KeepNone:
    async def choose(self, words: str, candidates: Sequence[RecordView], room: int) -> FilterVerdict | None:
        return FilterVerdict(keep=[])


async def keep(
    kit: Kit,
    said: str,
    *,
    vector: list[float],
    episode_vector: list[float] | None = None,
    conclusion: str = "a moment",
    intensity: float = 0.6,
    join: str | None = None,
    ago: timedelta = timedelta(0),
    author: str = "Ann",
) -> tuple[str, str]:
    """One moment kept through ``memory.encode`` ``ago`` before the kit's now, with the vectors given."""
    now = kit.clock.now()
    kit.clock.set(now - ago)
    try:
        episode = mem.NewEpisode(
            author=author, author_id="u1", message_id=f"m-{next(kit.ids)}", as_happened=f"{author} said: {said}",
            vector=episode_vector or vector,
        )  # fmt: skip
        if join is not None:
            result = await kit.store().encode(mem.EncodeParams(join=join, episode=episode))
        else:
            record = mem.NewRecord(
                author=author, author_id="u1", feeling="calm", conclusion=conclusion, valence=0.4,
                intensity=intensity, vector=vector,
            )  # fmt: skip
            result = await kit.store().encode(mem.EncodeParams(record=record, episode=episode))
        return result.record_id, result.episode_id
    finally:
        kit.clock.set(now)


# ------------------------------------------------------------------ mechanism 14: fading breaks ties


async def test_a_clearly_better_match_from_a_month_ago_beats_a_weak_one_from_yesterday(kit: Kit) -> None:
    """Seed: 0.9 × 0.6 × 0.30 = 0.16 against 0.5 × 0.6 × 0.80 = 0.24, yesterday's weak match first. Ours:
    0.9 × (0.75 + 0.25 × 0.18) = 0.72 against 0.5 × (0.75 + 0.25 × 0.48) = 0.44."""
    sister, _ = await keep(
        kit, "my sister Mara lives in Lisbon", vector=toward(1, 2, 0.9), ago=timedelta(days=30)
    )
    coffee, _ = await keep(kit, "I had coffee", vector=toward(1, 3, 0.5), ago=timedelta(days=1))
    found = await Recall(kit.store(), Fixed(axis(1)), KeepNone()).plain("where does my sister live?")
    assert [r.id for r in found] == [sister, coffee]
    assert [r.score for r in found] == pytest.approx([0.716, 0.435], abs=2e-3)


async def test_equally_relevant_memories_are_still_ordered_by_how_strongly_they_are_felt(kit: Kit) -> None:
    old, _ = await keep(kit, "we baked bread", vector=axis(1), ago=timedelta(days=30))
    fresh, _ = await keep(kit, "we baked bread again", vector=axis(1), ago=timedelta(days=1))
    strong, _ = await keep(kit, "we baked a cake", vector=axis(1), intensity=1.0, ago=timedelta(days=30))
    found = await Recall(kit.store(), Fixed(axis(1)), KeepNone()).plain("baking")
    assert [r.id for r in found] == [fresh, strong, old]  # felt 0.48, 0.30, 0.18: fading breaks the tie


# ------------------------------------------------------------------ mechanism 15: a name that discriminates


async def test_the_person_named_on_every_episode_earns_no_bonus(kit: Kit) -> None:
    """A one-to-one chat: "Ann said: …" on every episode. Seed: every unrelated record scores 0.5 + 0 through
    its episodes, above the record that means the words (1 × 0.4 felt). Ours: Ann on all 26 episodes (more than
    half of them): no bonus among the episodes, and the meaning ranks; among the 13 records only the meant one
    names her, so there she still singles it out (+0.5)."""
    meant, _ = await keep(kit, "hello", conclusion="Ann's brother is a pilot", vector=axis(1),
                          episode_vector=axis(3), intensity=0.4)  # fmt: skip
    await keep(kit, "hi again", join=meant, vector=axis(3))
    for n in range(12):
        other, _ = await keep(kit, f"small talk {n}", vector=axis(4), episode_vector=axis(5))
        await keep(kit, f"more small talk {n}", join=other, vector=axis(5))
    found = await Recall(kit.store(), Fixed(axis(1)), KeepNone()).plain("what does my brother do?")
    assert found[0].id == meant
    result = await kit.store().search(axis(1), ["ann"], k=3)
    assert result.records[0].id == meant and result.records[0].score == pytest.approx(0.85 + 0.5, abs=1e-3)


async def test_records_and_episodes_are_counted_apart_for_the_name_bonus(kit: Kit) -> None:
    """A person who spells their name "jo": every record's conclusion names them as a name ("Jo told me …"),
    no episode does ("jo said: …" is not written as a name). Counted together Jo names 13 of 26 rows (half), so
    every record would earn +0.5 and bury the one whose episode means the words; counted apart, Jo is on every
    record (no bonus among records) and on no episode, and the meaning ranks."""
    meant, episode = await keep(kit, "we swam in the lake", conclusion="Jo told me about a swim",
                                vector=axis(3), episode_vector=toward(1, 3, 0.4), author="jo")  # fmt: skip
    for n in range(12):
        await keep(kit, f"small talk {n}", conclusion=f"Jo told me small thing {n}", vector=axis(4),
                   episode_vector=axis(5), author="jo")  # fmt: skip
    result = await kit.store().search(axis(1), ["jo"], k=3)
    assert result.records[0].id == meant and result.records[0].hit_episode == episode
    assert result.records[0].score < 0.5  # no name bonus on either side: the episode's meaning alone


async def test_a_name_on_few_rows_still_earns_the_bonus(kit: Kit) -> None:
    carol, _ = await keep(kit, "I met Carol at the market", vector=axis(4), episode_vector=axis(4))
    for n in range(12):
        await keep(kit, f"small talk {n}", vector=toward(1, 5, 0.5))
    result = await kit.store().search(axis(1), ["carol"], k=3)
    assert result.records[0].id == carol  # 0 + 0.5 beats 0.5 × (0.75 + 0.25 × 0.6) = 0.45
    assert result.records[0].score == pytest.approx(0.5, abs=1e-3)


# ------------------------------------------------------------------ mechanisms 16, 17: episodes that match


async def test_a_long_record_surfaces_with_the_turns_that_match_the_words(kit: Kit) -> None:
    """Seed: the hit episode and the 3 newest, so the second turn about the lighthouse never shows."""
    record, keeper = await keep(kit, "the lighthouse keeper waved", vector=axis(9), episode_vector=axis(1),
                                ago=timedelta(hours=3))  # fmt: skip
    _, lamp = await keep(
        kit, "its lamp was red", join=record, vector=toward(1, 2, 0.8), ago=timedelta(hours=2)
    )
    for n in range(6):
        await keep(kit, f"and then lunch {n}", join=record, vector=axis(6), ago=timedelta(minutes=50 - n))
    [found] = await Recall(kit.store(), Fixed(axis(1)), KeepNone()).plain("the lighthouse")
    assert found.hit_episode == keeper
    assert [e.id for e in found.episodes][:2] == [keeper, lamp]
    assert len(found.episodes) == 3 and "and then lunch 5" in found.episodes[2].as_happened  # then the newest


async def test_the_state_keeps_the_turns_recall_found_for_the_words(kit: Kit) -> None:
    """A long record recalled into the State, older than the 5 most recently felt: the seed reloaded its 5
    newest episodes (subtle point 5), so the turns about the lighthouse were not in the reply's memory."""
    record, _ = await keep(kit, "the lighthouse keeper waved at us from the gallery", vector=axis(9),
                           episode_vector=axis(1), intensity=0.9, ago=timedelta(days=2))  # fmt: skip
    await keep(kit, "its lamp turned slowly, red and white", join=record, vector=toward(1, 2, 0.8),
               ago=timedelta(days=2) - timedelta(minutes=1))  # fmt: skip
    for n in range(7):
        await keep(kit, f"we talked about lunch, course {n}", join=record, vector=axis(6),
                   ago=timedelta(days=2) - timedelta(minutes=2 + n))  # fmt: skip
    for n in range(5):
        await keep(kit, f"a later day {n}", vector=axis(7), ago=timedelta(hours=5 - n))
    await kit.ongoing()
    kit.model.defaults["filter"] = verdict(keep=[])
    engine = kit.engine()
    engine.embedder = Fixed(axis(1))
    engine.recall.embedder = engine.embedder
    turn = await engine.begin(facts("do you remember the lighthouse?"))
    block = turn.block() or ""
    before = block.split("From before this conversation", 1)[1]
    assert "the lighthouse keeper waved" in before and "its lamp turned slowly" in before


def test_the_hosts_vectorised_weight_is_the_laws_weight() -> None:
    """The host ranks with ``recall_weight_now`` over arrays; the box's laws name the same weight, written out
    here: 0.75 at nothing felt, 1.0 felt fully."""
    import numpy as np

    from box.common.laws import recall_weight
    from impyard.memory.cache import recall_weight_now

    felt = np.array([0.0, 0.18, 0.5, 1.0])
    assert recall_weight_now(felt).tolist() == pytest.approx([0.75, 0.795, 0.875, 1.0])
    assert [recall_weight(float(f)) for f in felt] == pytest.approx([0.75, 0.795, 0.875, 1.0])
