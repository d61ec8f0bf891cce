"""L. The imp's day in the box: the idle reflection and the night (mechanisms 105-114; subtle points 16, 17, 20).

The host's half — the clock that decides when (104-107), the store's own checks and the forgetting curve
(108-113) — is tested in tests/test_wakefulness.py and tests/memory/test_store_night.py. Here the box runs
what a ``reflect`` or ``sleep`` task asks, over the host's real memory store (the Kit), with the scripted
fake model. Expectations are written out, never read from the module.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest

from box.memory.engine import ChatMemory
from box.memory.night import NightFailed, Proposed, check, combined, plan_user, read_plan
from box.memory.prompts import Prompts
from box.memory.store_client import StoreClient
from box.protocol import memory as mem
from box.protocol.memory import ConstructParams, EpisodeView, RecordView
from impyard.backends import BoxSpec
from impyard.memory.scopes import SessionScopes
from tests import sqlfile
from tests.memory.engine_kit import IMP, NOW, DirectPeer, Kit, thought, vector

pytestmark = pytest.mark.anyio

WOKE = NOW - timedelta(hours=1)  # the imp woke an hour before the kit's now


def requested(engine: ChatMemory) -> list[str]:
    peer = engine.store.peer
    assert isinstance(peer, DirectPeer)
    return [method for method, _ in peer.requests]


async def night(kit: Kit, engine: ChatMemory | None = None, *, consolidate: bool = True) -> str:
    return await (engine or kit.engine()).night(now=kit.clock.now(), since=WOKE, consolidate=consolidate)


def plan(*groups: tuple[int, list[int]], fact: str = "These are about one thing.") -> dict[str, Any]:
    """A consolidation plan answer: (anchor, absorbed) numbers as the records were shown (oldest first)."""
    return {"groups": [{"anchor": a, "absorbed": m, "summary_fact": fact} for a, m in groups]}


async def given(kit: Kit, event: str, *, intensity: float = 0.8, age_hours: float = 0.5) -> str:
    """A given record (mechanism 115) in the kit's scope."""
    now = kit.clock.now()
    return await kit.db.run(
        lambda: kit.service.store.remember(IMP, "dm:u1", event, 0.4, intensity, age_hours=age_hours, now=now)
    )


async def belief(kit: Kit, statement: str, *, intensity: float = 0.9) -> str:
    made = await kit.store().construct(
        ConstructParams(
            construct_kind="belief",
            statement=statement,
            intensity=intensity,
            vector=vector(statement),
            slot=False,
        )
    )
    return made.record_id


# ------------------------------------------------------------------ the code's checks (108, 113; subtle point 16)


def record(
    rid: str,
    intensity: float,
    *,
    kind: str = "lived",
    origin: str = "lived",
    felt: float | None = None,
    episodes: int = 1,
) -> RecordView:
    at = NOW - timedelta(minutes=40)
    return RecordView(
        id=rid, kind=kind, construct_kind="belief" if kind == "construct" else None,  # type: ignore[arg-type]
        origin=origin, author="Self" if origin == "given" or kind == "construct" else "Ann",  # type: ignore[arg-type]
        author_id=None, feeling=f"feeling {rid}", conclusion=f"Conclusion {rid}.", valence=0.3,
        intensity=intensity, felt=intensity if felt is None else felt, happened_at=at, last_felt=at,
        statement=f"statement {rid}" if kind == "construct" else None,
        episodes=[
            EpisodeView(id=f"{rid}-e{n}", record_id=rid, author="Ann", as_happened=f"Ann said: {rid} event {n}",
                        happened_at=at - timedelta(minutes=n))
            for n in range(episodes)
        ],
    )  # fmt: skip


SHOWN = [
    record("A", 0.6),  # 1
    record("B", 0.5),  # 2
    record("C", 0.7),  # 3
    record("D", 0.9, kind="construct"),  # 4
    record("E", 0.8, origin="given"),  # 5
    record("F", 0.39),  # 6
    record("G", 0.1),  # 7
    record("H", 0.4),  # 8
    record("I", 0.5),  # 9
    record("J", 0.3, origin="given"),  # 10: weaker than A
    record("K", 0.2, kind="construct"),  # 11: weaker than A
]


@pytest.mark.parametrize(
    ("proposed", "groups", "refused"),
    [
        pytest.param([Proposed(1, (2,))], [("A", ["B"])], 0, id="a weaker member folds into the anchor"),
        pytest.param([Proposed(2, (9,))], [("B", ["I"])], 0, id="an equally strong member folds"),
        pytest.param([Proposed(1, (3,))], [], 1, id="a stronger member is refused"),
        pytest.param([Proposed(1, (11,))], [], 1, id="a construct is never absorbed"),
        pytest.param([Proposed(1, (10,))], [], 1, id="a given record is never absorbed"),
        pytest.param([Proposed(1, (4, 5))], [], 2, id="nor a stronger construct or given record"),
        pytest.param([Proposed(1, (1, 2))], [("A", ["B"])], 1, id="the anchor is not its own member"),
        pytest.param([Proposed(1, (2, 2))], [("A", ["B"])], 1, id="a member is taken once"),
        pytest.param([Proposed(4, (2,))], [], 1, id="a construct never anchors"),
        pytest.param([Proposed(6, (7,))], [], 1, id="an anchor under the minimum is refused"),
        pytest.param([Proposed(8, (7,))], [("H", ["G"])], 0, id="an anchor at the minimum anchors"),
        pytest.param([Proposed(5, (1,))], [("E", ["A"])], 0, id="a given record may anchor"),
        pytest.param(
            [Proposed(1, (2,)), Proposed(3, (2, 7))], [("A", ["B"]), ("C", ["G"])], 1, id="absorbed once only"
        ),
        pytest.param(
            [Proposed(3, (1,)), Proposed(1, (2,))], [("C", ["A"])], 1, id="an absorbed record is gone"
        ),
        pytest.param(
            [Proposed(1, (2,)), Proposed(3, (1,))],
            [("A", ["B"])],
            1,
            id="an anchor is the stronger for its members",
        ),
        pytest.param([Proposed(99, (1,)), Proposed(1, (0, 12))], [], 3, id="numbers outside the list"),
        pytest.param([Proposed(7, (2,))], [], 1, id="a weak anchor takes nothing, not even weaker"),
    ],
)
def test_m108_the_codes_checks_override_the_plan(
    proposed: list[Proposed], groups: list[tuple[str, list[str]]], refused: int
) -> None:
    checked = check(proposed, SHOWN)
    assert (checked.groups, checked.refused) == (groups, refused)


@pytest.mark.parametrize(
    ("answer", "proposed"),
    [
        pytest.param(plan((1, [2, 3])), [Proposed(1, (2, 3))], id="a plain plan"),
        pytest.param(
            {"groups": [{"anchor": "2", "absorbed": ["[3]", 4.0]}]}, [Proposed(2, (3, 4))], id="numbers"
        ),
        pytest.param(
            {"groups": [{"anchor": 1, "absorbed": [True, 2.5, "two", None, 3]}]},
            [Proposed(1, (3,))],
            id="junk",
        ),
        pytest.param({"groups": [{"absorbed": [2]}, {"anchor": 1, "absorbed": 2}, "x"]}, [], id="bad groups"),
        pytest.param({"groups": {"anchor": 1}}, [], id="groups not a list"),
        pytest.param({}, [], id="no groups"),
        pytest.param(None, [], id="no answer"),
    ],
)
def test_m108_the_plan_is_read_tolerantly(answer: dict[str, Any] | None, proposed: list[Proposed]) -> None:
    assert read_plan(answer) == proposed


@pytest.mark.parametrize(
    ("intensities", "expected"),
    [((0.5, 0.5), 0.75), ((0.6, 0.5, 0.2), 0.84), ((0.4,), 0.4), ((1.0, 0.3), 1.0), ((0.0, 0.0), 0.0)],
)
def test_m110_the_anchor_takes_one_minus_the_product_of_what_is_left(
    intensities: tuple[float, ...], expected: float
) -> None:
    assert combined(intensities) == pytest.approx(expected)


def test_m108_the_plan_sees_numbered_records_at_raw_intensity_with_the_protected_marked() -> None:
    shown = [
        record("A", 0.9, felt=0.15, episodes=8),
        record("D", 0.7, kind="construct"),
        record("E", 0.3, origin="given"),
    ]
    text = plan_user(Prompts.load(), None, shown, NOW, "UTC")
    lines = text.splitlines()
    first = next(line for line in lines if line.startswith("[1] "))
    assert first == "[1] pleasant, overwhelming: feeling A. Conclusion A. (with Ann; 40 min ago)"  # raw (20)
    assert "[2] I believe: statement D (pleasant, strong; 40 min ago) — protected: your own" in text
    assert "[3] pleasant, faint: feeling E. Conclusion E. (40 min ago) — protected: from your past" in text
    assert [line.strip() for line in lines if "Ann said: A event" in line] == [
        f"{40 + n} min ago: Ann said: A event {n}" for n in range(6)
    ]  # six episodes per record (seed 002)
    assert "3 memories, oldest first" in text
    assert not re.search(r"\d\.\d", text)  # feelings in words only (12)


# ------------------------------------------------------------------ the night through the store (107-114)


async def test_m108_no_plan_call_under_two_records_but_forgetting_still_runs(kit: Kit) -> None:
    await kit.seed("Ann likes tea.", ago=timedelta(minutes=20))
    engine = kit.engine()
    summary = await night(kit, engine)
    assert summary == "nothing to fold (1 record since waking); forgot 0 records"
    assert kit.model.of("sleep") == []
    assert requested(engine) == ["memory.night", "memory.forget"]


async def test_m108_one_plan_call_at_temperature_0_3_then_consolidation_then_forgetting(kit: Kit) -> None:
    await kit.seed("Ann is worried about her exam.", ago=timedelta(minutes=50))
    await kit.seed("Ann studied all night for her exam.", ago=timedelta(minutes=40), intensity=0.4)
    await kit.seed("Ann asked about the weather.", ago=timedelta(minutes=30), intensity=0.3)
    kit.model.script("sleep", plan((1, [2])))
    engine = kit.engine()
    summary = await night(kit, engine)
    assert summary == "folded 1 record into 1; forgot 0 records"
    [call] = kit.model.of("sleep")
    assert call.body["temperature"] == 0.3
    assert call.body["response_format"]["type"] == "json_schema"
    assert (
        "[1] pleasant, strong: a feeling. Ann is worried about her exam. (with Ann; 50 min ago)" in call.user
    )
    assert "[3] pleasant, faint: a feeling. Ann asked about the weather. (with Ann; 30 min ago)" in call.user
    assert "summary_fact" in call.system
    assert requested(engine) == ["memory.night", "memory.consolidate", "memory.forget"]


async def test_m107_only_the_records_since_waking_are_shown(kit: Kit) -> None:
    await kit.seed("Before waking: the old news.", ago=timedelta(hours=3))
    await kit.seed("Ann is here today.", ago=timedelta(minutes=50))
    await kit.seed("Ann brought a cake today.", ago=timedelta(minutes=40))
    await night(kit)
    [call] = kit.model.of("sleep")
    assert "the old news" not in call.user
    assert "2 memories, oldest first" in call.user


async def test_m109_m110_members_fold_into_the_anchor_and_no_episode_is_lost(kit: Kit) -> None:
    anchor = await kit.seed("Ann's exam worries her.", ago=timedelta(minutes=50), intensity=0.6)
    await kit.seed("Ann's exam is on Monday.", ago=timedelta(minutes=48), join=anchor)  # a second episode
    one = await kit.seed("Ann fears the exam.", ago=timedelta(minutes=40), intensity=0.5)
    two = await kit.seed("Ann's exam again.", ago=timedelta(minutes=30), intensity=0.2)
    before = {r.id: r for r in await kit.records()}
    episodes_before = sorted(ep.as_happened for r in before.values() for ep in r.episodes)
    kit.model.script("sleep", plan((1, [2, 3])))
    assert await night(kit) == "folded 2 records into 1; forgot 0 records"
    after = {r.id: r for r in await kit.records()}
    assert set(after) == {anchor}  # the members are deleted (109)
    assert sorted(ep.as_happened for ep in after[anchor].episodes) == episodes_before  # none lost (109)
    assert after[anchor].intensity == pytest.approx(1 - (1 - 0.6) * (1 - 0.5) * (1 - 0.2))  # 0.84 (110)
    assert {one, two}.isdisjoint(after)


async def test_m111_the_plans_summary_fact_changes_no_stored_text(kit: Kit) -> None:
    anchor = await kit.seed("Ann likes green tea.", ago=timedelta(minutes=50), feeling="fondness")
    await kit.seed("Ann drinks tea at five.", ago=timedelta(minutes=40), intensity=0.3)
    kit.model.script("sleep", plan((1, [2]), fact="SUMMARY-FACT Ann is a tea person."))
    await night(kit)
    [kept] = await kit.records()
    assert (kept.id, kept.conclusion, kept.feeling) == (anchor, "Ann likes green tea.", "fondness")
    rows = await kit.db.run(lambda: sqlfile.query(kit.db, "SELECT * FROM memory_records"))
    episodes = await kit.db.run(lambda: sqlfile.query(kit.db, "SELECT * FROM memory_episodes"))
    assert "SUMMARY-FACT" not in json.dumps([dict(r) for r in [*rows, *episodes]], default=str)


async def test_m113_constructs_and_given_records_are_never_absorbed_but_a_given_one_anchors(kit: Kit) -> None:
    past = await given(kit, "I grew up by the sea.", intensity=0.45, age_hours=0.9)  # [1]
    lived = await kit.seed("Ann talked about the sea.", ago=timedelta(minutes=40), intensity=0.5)  # [2]
    small = await kit.seed("Ann said the sea was cold.", ago=timedelta(minutes=30), intensity=0.4)  # [3]
    held = await belief(kit, "The sea is home.", intensity=0.3)  # [4]: formed now, the newest
    kit.model.script("sleep", plan((2, [1, 4]), (1, [3])))  # both protected ones weaker than their anchor
    engine = kit.engine()
    summary = await night(kit, engine)
    assert summary == "folded 1 record into 1; forgot 0 records"
    ids = {r.id for r in await kit.records()}
    assert ids == {past, lived, held}  # the small one folded into the given anchor; protected ones stay
    consolidate = [p for m, p in engine.store.peer.requests if m == "memory.consolidate"]  # type: ignore[attr-defined]
    assert [(g.anchor, g.members) for g in consolidate[0].groups] == [(past, [small])]


async def test_m112_m114_without_consolidation_the_night_only_forgets(kit: Kit) -> None:
    weak = await kit.seed("A passing remark.", ago=timedelta(days=10), intensity=0.3)  # threshold 0.5 at 10 d
    strong = await kit.seed("Ann's wedding.", ago=timedelta(days=10), intensity=0.7)
    await kit.seed("Ann is here.", ago=timedelta(minutes=50))
    await kit.seed("Ann is here again.", ago=timedelta(minutes=40))
    engine = kit.engine()
    summary = await night(kit, engine, consolidate=False)
    assert summary == "no folding asked; forgot 1 record"
    assert requested(engine) == ["memory.forget"]
    assert kit.model.of("sleep") == []
    ids = {r.id for r in await kit.records()}
    assert weak not in ids and strong in ids


async def test_m108_a_model_failure_folds_nothing_and_still_forgets(kit: Kit) -> None:
    weak = await kit.seed("A passing remark.", ago=timedelta(days=30), intensity=0.5)  # threshold 0.6 at 30 d
    await kit.seed("Ann is here.", ago=timedelta(minutes=50))
    await kit.seed("Ann is here again.", ago=timedelta(minutes=40), intensity=0.3)
    kit.model.defaults["sleep"] = "I would rather not."
    summary = await night(kit)
    assert summary == "nothing folded (no plan came back); forgot 1 record"
    assert len(kit.model.of("sleep")) == 2  # asked once more on bad JSON (120)
    assert weak not in {r.id for r in await kit.records()}
    assert len(await kit.records()) == 2


async def test_m108_a_plan_of_no_group_folds_nothing(kit: Kit) -> None:
    await kit.seed("Ann is here.", ago=timedelta(minutes=50))
    await kit.seed("Ann is here again.", ago=timedelta(minutes=40), intensity=0.3)
    kit.model.script("sleep", {"groups": []})
    engine = kit.engine()
    assert await night(kit, engine) == "nothing folded (2 records since waking); forgot 0 records"
    assert requested(engine) == ["memory.night", "memory.forget"]


async def test_a_store_that_does_not_answer_fails_the_night_after_forgetting_was_tried(kit: Kit) -> None:
    await kit.seed("Ann is here.", ago=timedelta(minutes=50))
    await kit.seed("Ann is here again.", ago=timedelta(minutes=40), intensity=0.3)
    kit.model.script("sleep", plan((1, [2])))
    engine = kit.engine()
    peer = engine.store.peer
    assert isinstance(peer, DirectPeer)
    peer.down.add("memory.consolidate")
    with pytest.raises(
        NightFailed, match=r"^the memory store did not answer \(consolidation: memory.consolidate"
    ):
        await night(kit, engine)
    assert requested(engine) == ["memory.night", "memory.consolidate", "memory.forget"]
    assert len(await kit.records()) == 2  # nothing folded


async def test_a_night_sees_and_folds_only_its_own_scope(kit: Kit) -> None:
    guild = SessionScopes("guild:g1", ("guild:g1",))
    spec = BoxSpec(IMP, "g1", kit.tmp_path / "guild")
    kit.service.open(spec, guild, learns=0)
    elsewhere = StoreClient(DirectPeer(kit.service, spec, guild))
    episode = mem.NewEpisode(
        author="Bob", as_happened="Bob said: the guild's picnic", vector=vector("picnic")
    )
    record = mem.NewRecord(
        author="Bob", feeling="joy", conclusion="The guild's picnic.", valence=0.5, intensity=0.3,
        vector=vector("picnic"),
    )  # fmt: skip
    other = (await elsewhere.encode(mem.EncodeParams(record=record, episode=episode))).record_id
    await kit.seed("Ann is here.", ago=timedelta(minutes=50))
    await kit.seed("Ann is here again.", ago=timedelta(minutes=40), intensity=0.3)
    kit.model.script("sleep", plan((1, [2, 3])))
    await night(kit)
    [call] = kit.model.of("sleep")
    assert "picnic" not in call.user and "2 memories" in call.user
    assert other in {r.id for r in await kit.records()}


# ------------------------------------------------------------------ the idle reflection (105, 106)


async def test_m105_an_idle_reflection_is_one_quiet_reflection_where_the_imp_last_was(kit: Kit) -> None:
    await kit.seed("Ann told me about her garden.", ago=timedelta(minutes=20))
    engine = kit.engine(channel_kind="guild", channel_name="general")
    summary = await engine.reflect_idle(now=kit.clock.now())
    assert summary == "a quiet reflection: 1 thought"
    [call] = kit.model.of("introspection")
    assert "WHERE YOU ARE: #general, a text channel of a chat server." in call.user
    assert "Ann told me about her garden." in call.user
    assert {c.purpose for c in kit.model.calls} <= {"introspection", "embedding"}  # no reply, no learning
    assert [r.statement for r in await kit.records() if r.kind == "construct"] == [thought()["thought"]]


async def test_m105_an_idle_reflection_in_a_direct_message_names_the_person(kit: Kit) -> None:
    engine = kit.engine(channel_kind="dm", channel_name="DM with Ann")
    await engine.reflect_idle(now=kit.clock.now())
    [call] = kit.model.of("introspection")
    assert "WHERE YOU ARE: a direct message with Ann." in call.user


async def test_m105_an_idle_reflection_may_think_on_and_form_a_belief(kit: Kit) -> None:
    kit.model.script(
        "introspection",
        thought("First thought.", act="keep_thinking"),
        thought("Second thought.", act="belief", text="Gardens are patient."),
    )
    summary = await kit.engine().reflect_idle(now=kit.clock.now())
    assert summary == "a quiet reflection: 2 thoughts; formed belief"


async def test_m105_an_idle_reflection_without_an_answer_is_quiet(kit: Kit) -> None:
    kit.model.defaults["introspection"] = "no"
    summary = await kit.engine().reflect_idle(now=kit.clock.now())
    assert summary == "a quiet reflection: 0 thoughts (none came)"
    assert await kit.records() == []
