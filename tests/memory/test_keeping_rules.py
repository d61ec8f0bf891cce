"""Issue 32, finding 7, the rules of keeping (docs/memory.md "Keeping: what lasts"), on each side.

The box: only a JSON ``true`` makes an appraised moment lasting; a lasting moment never joins the living record
and is sent as a new record marked lasting; the night's code never offers a kept record for folding. The host
(requests as the box's peer sends them, through ``MemoryService.serve``): a lasting record is stored with origin
``kept``; no forgetting takes it at any age, while a lived one of the same strength goes; it is never absorbed and
never anchors; only a lived moment may be lasting. The whole story through the host is tests/memory/test_keeping.py.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from box.common.laws import Temperament
from box.memory import night
from box.memory.moment import Felt, encoding, joins, read_appraisal
from box.protocol import memory as mem
from box.protocol.models import HOST_METHODS
from impyard.backends.base import BoxSpec
from impyard.clock import FixedClock
from impyard.memory.night import anchor_refusal, forgets, member_refusal
from impyard.memory.scopes import SessionScopes
from impyard.memory.service import MemoryService
from impyard.memory.store import MemoryStore
from tests.memory.conftest import GUILD, IMP, T0, moment, rows

pytestmark = pytest.mark.anyio


# ------------------------------------------------------------------ the box


@pytest.mark.parametrize(
    ("lasting", "read"),
    [(True, True), (False, False), ("true", False), (1, False), (None, False), ("missing", False)],
)
def test_only_a_json_true_makes_a_moment_lasting(lasting: object, read: bool) -> None:
    answer: dict[str, Any] = {"feeling": "warmth", "conclusion": "Ann's sister is Maja.", "valence": 0.4,
                              "intensity": 0.3}  # fmt: skip
    if lasting != "missing":
        answer["lasting"] = lasting
    felt = read_appraisal(answer)
    assert felt is not None and felt.lasting is read


def test_a_lasting_moment_never_joins_the_living_record_and_opens_a_lasting_one() -> None:
    small_talk = Felt("easy", "We chatted.", 0.2, 0.2)
    fact = Felt("warmth", "Ann's sister is Maja.", 0.4, 0.3, lasting=True)
    assert joins(small_talk, "living-1", 0.3) is True  # same sign: joins (mechanism 64)
    assert joins(fact, "living-1", 0.3) is False  # same sign, lasting: its own record
    common: dict[str, Any] = dict(person="Ann", person_id="a1", message_id="m1", as_happened="Ann said: …",
                                  told=None, episode_vector=None, record_vector=None, associations=[])  # fmt: skip
    sent = encoding(fact, living="living-1", living_valence=0.3, **common)
    assert sent.join is None and sent.record is not None and sent.record.lasting is True
    assert encoding(small_talk, living="living-1", living_valence=0.3, **common).join == "living-1"
    assert fact.bent(Temperament(valence_bias=-1.0, intensity_amplification=2.0)).lasting  # the bend keeps it


def test_the_night_never_offers_a_kept_record_for_folding() -> None:
    def view(origin: str, intensity: float, record_id: str | None = None) -> mem.RecordView:
        return mem.RecordView(id=record_id or origin, origin=origin, author="Ann", feeling="f", conclusion="c",  # type: ignore[arg-type]
                              valence=0.4, intensity=intensity, felt=intensity, happened_at=T0, last_felt=T0)  # fmt: skip

    kept, lived = view("kept", 0.9), view("lived", 0.3)
    assert night.protected(kept) and not night.protected(lived)
    assert not night.may_anchor(kept, 0.9)  # small talk folded into it would never fade
    assert not night.may_join(kept, 0.1, view("lived", 0.9, "anchor"), 0.9)
    plan = [night.Proposed(anchor=1, absorbed=(2,)), night.Proposed(anchor=3, absorbed=(1,))]
    checked = night.check(plan, [kept, lived, view("given", 0.8)])
    assert checked.groups == [] and checked.refused == 2


# ------------------------------------------------------------------ the host


@pytest.fixture(autouse=True)
def nights(service: MemoryService, guild_box: BoxSpec) -> None:
    service.open(guild_box, GUILD, nights=True)  # the box stands for a sleep task's: it may fold and forget


async def ask(service: MemoryService, spec: BoxSpec, method: str, params: dict[str, Any]) -> Any:
    """As the box's peer: the params as JSON text parsed strictly, the answer back through JSON."""
    spec_of = HOST_METHODS[method]
    sent = spec_of.params.model_validate_json(json.dumps(params))
    answer = await service.serve(spec, method, sent)
    assert spec_of.result is not None and isinstance(answer, BaseModel)
    return spec_of.result.model_validate_json(answer.model_dump_json())


def encode(service: MemoryService, conclusion: str, intensity: float, *, lasting: bool) -> dict[str, Any]:
    params = moment(conclusion, intensity=intensity, valence=0.4).model_dump(mode="json")
    params["record"]["lasting"] = lasting
    return params


def origin_of(store: MemoryStore, record_id: str) -> str | None:
    found = rows(store.db, "SELECT origin FROM memory_records WHERE id = :id", id=record_id)
    return str(found[0]["origin"]) if found else None


@pytest.mark.parametrize(
    ("kind", "origin", "intensity", "days", "forgotten"),
    [
        ("lived", "lived", 0.3, 3.0, True),  # the seed's curve: 0.3 goes within three days …
        ("lived", "kept", 0.3, 3.0, False),  # … what lasts does not,
        ("lived", "kept", 0.05, 400.0, False),  # at any strength or age
        ("lived", "lived", 0.5, 11.0, True),
        ("lived", "given", 0.05, 400.0, False),  # as before (113)
    ],
)
def test_what_is_kept_is_never_forgotten_by_age(
    kind: str, origin: str, intensity: float, days: float, forgotten: bool
) -> None:
    assert forgets(kind, origin, intensity, T0, T0 + timedelta(days=days)) is forgotten


def test_a_kept_record_is_never_folded_nor_anchors() -> None:
    assert anchor_refusal("lived", "kept", 0.9) == "kept"
    assert member_refusal("m", "lived", "kept", 0.1, anchor="a", anchor_intensity=0.9) == "protected"


async def test_a_lasting_moment_is_kept_by_the_host_through_every_night(
    service: MemoryService, store: MemoryStore, clock: FixedClock, guild_box: BoxSpec
) -> None:
    fact = await ask(
        service, guild_box, "memory.encode", encode(service, "Ann's sister is Maja.", 0.3, lasting=True)
    )
    chat = await ask(service, guild_box, "memory.encode", encode(service, "We chatted.", 0.3, lasting=False))
    assert (origin_of(store, fact.record_id), origin_of(store, chat.record_id)) == ("kept", "lived")
    recent = await ask(service, guild_box, "memory.recent", {"k": 5})
    assert {r.origin for r in recent.records} == {"kept", "lived"}  # the box sees which is which

    folded = await ask(service, guild_box, "memory.consolidate", {"groups": [
        {"anchor": fact.record_id, "members": [chat.record_id]},  # a kept record never anchors
    ]})  # fmt: skip
    assert folded == mem.ConsolidateResult(groups=0, absorbed=0, episodes=0, refused=1)

    clock.advance(days=400)
    assert await ask(service, guild_box, "memory.forget", {}) == mem.ForgetResult(forgotten=1, episodes=1)
    assert origin_of(store, fact.record_id) == "kept" and origin_of(store, chat.record_id) is None
    scoped = store.scoped(IMP, SessionScopes("guild:G1", ("guild:G1",)), "g1")
    assert [r.conclusion for r in scoped.recent(k=5)] == ["Ann's sister is Maja."]


async def test_only_a_lived_moment_may_be_lasting(service: MemoryService, guild_box: BoxSpec) -> None:
    params = encode(service, "I believe Ann is kind.", 0.5, lasting=True)
    params["record"]["kind"], params["record"]["construct_kind"] = "construct", "belief"
    with pytest.raises(ValidationError, match="only a lived moment may be lasting"):
        await ask(service, guild_box, "memory.encode", params)
