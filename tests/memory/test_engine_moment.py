"""F. Forming and keeping a moment (mechanisms 57-66), and G. strength over time as a turn lives it (67-70)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.memory.engine_kit import NOW, Kit, appraisal, envelope, memory_block, verdict

pytestmark = pytest.mark.anyio


async def newest(kit: Kit):  # type: ignore[no-untyped-def]
    return max(await kit.records(), key=lambda r: (r.happened_at, len(r.episodes)))


async def test_m57_the_appraisal_has_the_mood_withheld_and_the_focus_as_events_only(kit: Kit) -> None:
    await kit.seed("Ann's owl Hoot is sick.", intensity=0.9)
    kit.model.script("appraisal", appraisal(feeling="elation"), appraisal(feeling="calm"))
    async with kit.box() as box:
        await box.say("my owl Hoot")
        await box.say("and the weather")
    call = kit.model.of("appraisal")[1]
    assert call.body["temperature"] == 0.4
    assert call.body["response_format"]["json_schema"]["strict"] is True
    assert "Your mood is intentionally NOT shown here." in call.system
    for withheld in ("YOUR STATE", "YOUR OWN THOUGHTS", "WHAT YOU HAVE LEARNED", "You felt", "elation"):
        assert withheld not in call.user and withheld not in call.system
    assert (
        "- just now: Ann said: my owl Hoot\n  pip replied: hello" in call.user
    )  # the earlier event, as it happened


async def test_m58_the_appraisal_sees_what_was_recalled_into_the_state_and_nothing_else(kit: Kit) -> None:
    await kit.ongoing()  # a turn of an ongoing conversation: no arrival (101)
    await kit.seed("Ann's owl Hoot is sick.", intensity=0.9, told="Ann told Pip that Hoot was ill.")
    await kit.seed(
        "We fixed a bicycle.", intensity=0.4, ago=timedelta(hours=1)
    )  # recent, the filter drops it
    async with kit.box() as box:
        await box.say("how is my owl Hoot?")
    user = kit.model.of("appraisal")[0].user
    remembered = user.split("WHAT YOU REMEMBER ABOUT THIS\n")[1].split("\n\nWHAT JUST HAPPENED")[0]
    assert "Ann's owl Hoot is sick." in remembered and "Ann told Pip that Hoot was ill." in remembered
    assert "bicycle" not in user
    assert "bicycle" in memory_block(kit.model.of("reply")[0])  # it was in the reply's state all along


async def test_m59_an_unreadable_appraisal_keeps_the_replys_own_feeling(kit: Kit) -> None:
    kit.model.script("appraisal", "no json here", "still none")
    shy = envelope("hi", feeling="shy delight", conclusion="Ann greets me.", valence=0.35, intensity=0.45)
    kit.model.script("reply", shy, shy)  # the draft and its regeneration after the unknown-person probe (25)
    async with kit.box() as box:
        await box.say("hello")
    [kept] = await kit.records()
    assert (kept.feeling, kept.conclusion, kept.valence) == ("shy delight", "Ann greets me.", 0.35)
    assert kept.intensity == pytest.approx(0.45)
    assert len(kit.model.of("appraisal")) == 2  # asked once more first (120)


@pytest.mark.parametrize(
    ("temperament", "valence", "intensity"),
    [
        ({}, 0.5, 0.6),  # neutral by default
        (
            {"valence_bias": 0.5, "intensity_amplification": 2.0},
            0.7815,
            0.7746,
        ),  # tanh(atanh(.5)+.5), .6^(1/2)
        ({"valence_bias": -0.5}, 0.0, 0.6),  # tanh(atanh(.5)-.5) = tanh(0.0493) = 0.0493
    ],
)
async def test_m60_the_temperament_bends_the_kept_feeling(
    kit: Kit, temperament: dict[str, float], valence: float, intensity: float
) -> None:
    kit.model.defaults["appraisal"] = appraisal(valence=0.5, intensity=0.6)
    async with kit.box(**temperament) as box:
        await box.say("hello")
    [kept] = await kit.records()
    expected_valence = 0.0493 if temperament.get("valence_bias") == -0.5 else valence
    assert kept.valence == pytest.approx(expected_valence, abs=1e-3)
    assert kept.intensity == pytest.approx(intensity, abs=1e-3)


async def test_m61_the_retelling_is_kept_on_the_episode_and_shown_when_retold(kit: Kit) -> None:
    greeted = envelope("Hello Ann!", told="Ann said hello to Pip, and Pip greeted her back.")
    kit.model.script("reply", greeted, greeted)  # the draft and its regeneration after probe 25
    async with kit.box() as box:
        await box.say("hello")
    [kept] = await kit.records()
    assert kept.episodes[0].told == "Ann said hello to Pip, and Pip greeted her back."
    kit.clock.advance(hours=2)  # past the presence window: the next message starts a new conversation
    async with kit.box() as box:
        await box.say("remember me?")
    before = memory_block(kit.model.of("reply")[-1]).split("From before this conversation")[1]
    assert "Ann said hello to Pip, and Pip greeted her back." in before and "Ann said: hello" not in before


async def test_m62_m63_the_event_as_it_happened_and_the_vectors(kit: Kit) -> None:
    kit.model.script("appraisal", appraisal(conclusion="Ann likes lighthouses."))
    async with kit.box(embedder="gateway", dimensions=64) as box:
        await box.say("I love lighthouses")
    [kept] = await kit.records()
    event = "Ann said: I love lighthouses\npip replied: hello"
    assert kept.episodes[0].as_happened == event
    embedded = [" ".join(c.body["input"]) for c in kit.model.of("embedding")]
    # The words (recall's query, and the event's vector: mechanism 62 as we apply it — issue 32, the person's
    # words, not the diluted "Ann said: … / pip replied: …"; embedded once), then the conclusion (63).
    assert embedded == ["I love lighthouses", "Ann likes lighthouses."]
    assert all(c.body["dimensions"] == 64 for c in kit.model.of("embedding"))


async def test_m64_same_sign_joins_the_living_record_a_change_of_sign_opens_a_new_one(kit: Kit) -> None:
    kit.model.script(
        "appraisal",
        appraisal(feeling="glad", conclusion="Ann is nice.", valence=0.4),
        appraisal(feeling="calm", conclusion="All is fine.", valence=0.0),  # zero counts as positive
        appraisal(feeling="hurt", conclusion="Ann mocked me.", valence=-0.6),
        appraisal(feeling="sting", conclusion="It still stings.", valence=-0.2),
    )
    async with kit.box() as box:
        for words in ("hi", "all good?", "you are silly", "really silly"):
            await box.say(words)
    records = sorted(await kit.records(), key=lambda r: r.happened_at)
    assert [(r.conclusion, len(r.episodes)) for r in records] == [("Ann is nice.", 2), ("Ann mocked me.", 2)]
    assert [r.valence for r in records] == [0.4, -0.6]  # the record keeps the valence it opened with (117)


async def test_m65_a_new_record_echoes_the_strongest_same_sign_association(kit: Kit) -> None:
    weak = await kit.seed(
        "We watched colours in the sky.", feeling="wonder", valence=0.6, intensity=0.3, ago=timedelta(hours=1)
    )
    stronger = await kit.seed("A rainbow arched over the harbour.", feeling="joy", valence=0.5, intensity=0.35,
                              ago=timedelta(days=4))  # fmt: skip
    sad = await kit.seed("The storm wrecked the garden.", feeling="grief", valence=-0.5, intensity=0.4,
                         ago=timedelta(days=4))  # fmt: skip
    kit.model.script("filter", verdict(keep=[1, 2, 3]))
    kit.model.script("appraisal", appraisal(valence=0.7, intensity=0.9))
    before = {rid: (await kit.record(rid)).felt for rid in (weak, stronger, sad)}
    async with kit.box() as box:
        await box.say("a rainbow today!")
    after = {rid: await kit.record(rid) for rid in (weak, stronger, sad)}
    echoed = after[stronger]
    assert echoed.intensity == pytest.approx(before[stronger] + 0.6 * (0.9 - before[stronger]), abs=1e-3)
    assert echoed.last_felt == NOW and len(echoed.episodes) == 1  # re-felt, but it does not take the event
    assert (
        after[weak].last_felt < NOW and after[sad].last_felt < NOW
    )  # weaker by stored intensity; other sign


async def test_m66_a_moment_joining_the_living_record_restores_it(kit: Kit) -> None:
    kit.model.script(
        "appraisal", appraisal(valence=0.4, intensity=0.3), appraisal(valence=0.2, intensity=0.9)
    )
    async with kit.box() as box:
        await box.say("hi")
        first = (await kit.records())[0].intensity
        await box.say("you made my day")
    [living] = await kit.records()
    assert first == pytest.approx(0.3, abs=1e-3)
    assert living.intensity == pytest.approx(0.3 + 0.6 * (0.9 - 0.3), abs=1e-3)  # 0.66


async def test_m67_m70_a_loss_recalled_days_later_is_restored_above_its_faded_strength(kit: Kit) -> None:
    loss = await kit.seed("Ann's dog Rex died.", feeling="grief", valence=-0.8, intensity=0.9)
    happened = (await kit.record(loss)).happened_at
    kit.clock.advance(days=6)
    faded = (await kit.record(loss)).felt
    assert faded == pytest.approx(
        0.9 * (0.3 + 0.7 * 0.26360), abs=1e-3
    )  # τ = 4.5 d for a negative feeling (68)
    kit.model.script("filter", verdict(keep=[1]))
    kit.model.script(
        "appraisal", appraisal(feeling="sadness", conclusion="I still miss Rex.", valence=-0.7, intensity=0.8)
    )
    async with kit.box() as box:
        await box.say("I still miss Rex so much")
    after = await kit.record(loss)
    assert after.intensity == pytest.approx(
        faded + 0.6 * (0.8 - faded), abs=1e-3
    )  # 69, 70: from the faded value
    assert after.intensity > faded and after.intensity < 0.9
    assert after.valence == -0.8 and after.happened_at == happened  # never rewritten (70, 117)
    assert after.last_felt == kit.clock.now() - timedelta(seconds=30)  # felt again at the turn
