"""E. The reply, its actions and the turn loop (mechanisms 46-55; subtle point 3)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest

from box.common.envelope import ENVELOPE_FIELDS
from box.memory import CommittedTurn
from box.memory.prompts import Prompts
from tests.memory.engine_kit import Kit, draft, envelope, facts, memory_block, verdict

pytestmark = pytest.mark.anyio


async def known(kit: Kit) -> None:
    """A record with Ann outside this conversation, too weak and old to come to mind: no probe 25."""
    await kit.seed("Ann and I planted tulips.", intensity=0.1, ago=timedelta(days=60))


def sent(kit: Kit) -> list[str]:
    return [str(getattr(p, "content", "")) for p in kit.host.sent]


async def test_m46_the_reply_call_carries_the_moment_told_and_action(kit: Kit) -> None:
    await known(kit)
    async with kit.box() as box:
        await box.say("hello")
    [call] = kit.model.of("reply")
    schema = call.body["response_format"]["json_schema"]["schema"]
    # ENV-19's order; issue 38: channel, staff, pictures and hack only where they apply
    assert list(schema["properties"]) == [name for name in ENVELOPE_FIELDS if name in schema["properties"]]
    assert {"answer", "answer_needed", "moment", "told", "action"} <= set(schema["properties"])
    assert {"moment", "told", "action"} <= set(schema["required"])
    assert set(schema["properties"]["moment"]["properties"]) == {
        "feeling",
        "conclusion",
        "valence",
        "intensity",
        "refeels",
    }
    assert schema["properties"]["action"]["properties"]["type"]["enum"] == ["none", "search", "introspect"]


async def test_m46_an_unreadable_reply_is_asked_at_most_three_times(kit: Kit) -> None:
    await known(kit)
    kit.model.script("reply", "{broken", "also broken", envelope("third time lucky"))
    async with kit.box() as box:
        result = await box.say("hello")
    assert result.outcome == "sent" and sent(kit) == ["third time lucky"]
    assert len(kit.model.of("reply")) == 3


async def test_m47_silence_keeps_only_what_the_person_said(kit: Kit) -> None:
    await known(kit)
    kit.model.script("reply", envelope("I'd rather not", answer_needed=False))
    async with kit.box() as box:
        result = await box.say("psst", mode="judge")
    assert result.outcome == "silent" and kit.host.sent == []
    newest = max(await kit.records(), key=lambda r: r.happened_at)
    [episode] = newest.episodes
    assert episode.as_happened == "Ann said: psst" and episode.told is None  # nothing the imp did not do


async def test_m25_m48_the_unknown_person_probe_runs_before_any_draft(kit: Kit) -> None:
    """Issue 33: the probe's null is known before the first reply call, whatever the draft will be; it takes
    no hop, so a memory act still gets the one self-chosen hop (49)."""
    engine = kit.engine()
    turn = await engine.begin(facts("hello"))
    assert [n.query for n in turn.searches][0].startswith("Ann — who is this person")  # type: ignore[attr-defined]
    assert await turn.next_hop(draft(action="search", action_text="tulips"))  # a memory act: searched
    assert [n.query for n in turn.searches][-1] == "tulips"  # type: ignore[attr-defined]
    assert not await turn.next_hop(draft(action="none"))  # a world act: said


async def test_m49_one_self_chosen_hop_then_the_draft_is_said(kit: Kit) -> None:
    await known(kit)
    kit.model.script(
        "reply",
        envelope("first", action="search", action_text="tulips"),
        envelope("second", action="search", action_text="roses"),
        envelope("never"),
    )
    async with kit.box() as box:
        await box.say("hello")
    assert len(kit.model.of("reply")) == 2 and sent(kit) == ["second"]  # the last allowed hop's words
    assert '"roses"' not in memory_block(kit.model.of("reply")[-1])


async def test_m49_the_probes_run_before_the_first_reply_call_and_leave_the_hop(kit: Kit) -> None:
    """Issue 33: all three probes (25-27) are in the first reply call; none of them is a draft thrown away, and
    the self-chosen hop (49) is still there: two reply calls, where the seed made four."""
    await kit.seed("Bob sailed alone.", author="Bob", author_id="u2", intensity=0.2, ago=timedelta(days=5))
    kit.model.script("filter", verdict(keep=[], asks_for_memory=True, asks_for_own="dream"))
    kit.model.script(
        "reply",
        envelope("one", action="search", action_text="sailing"),  # the self-chosen hop
        envelope("two", action="search", action_text="boats"),  # the last allowed hop: said
        envelope("never"),
    )
    async with kit.box() as box:
        await box.say("what did you dream of, and do you remember sailing?")
    replies = kit.model.of("reply")
    assert len(replies) == 2 and sent(kit) == ["two"]
    first = memory_block(replies[0]).split("Searches you made just now:")[1]
    assert "who is this person" in first and "what did you dream of" in first and '"sailing"' not in first
    assert '"sailing"' in memory_block(replies[1]).split("Searches you made just now:")[1]


async def test_m49_the_kind_probe_takes_no_hop(kit: Kit) -> None:
    """Issue 33: the kind probe (27) ran before the first draft, so the draft's own search is the hop (49)."""
    await known(kit)
    await kit.seed("Bob sailed alone.", author="Bob", author_id="u2", intensity=0.2, ago=timedelta(days=5))
    kit.model.script("filter", verdict(keep=[], asks_for_own="goal"))
    engine = kit.engine()
    turn = await engine.begin(facts("what do you want?"))
    assert turn.kind_probed  # type: ignore[attr-defined]
    assert await turn.next_hop(draft(answer="one", action="search", action_text="wants"))  # the hop
    assert not await turn.next_hop(draft(answer="two", action="search", action_text="more"))  # 1 >= 1


async def test_m52_with_introspection_off_introspect_lets_the_draft_stand(kit: Kit) -> None:
    await known(kit)
    kit.model.script("reply", envelope("draft", action="introspect", action_text="why?"))
    async with kit.box(introspection=False) as box:
        await box.say("hello")
    assert len(kit.model.of("reply")) == 1 and sent(kit) == ["draft"]
    assert kit.model.of("introspection") == []  # on, it reflects: tests/memory/test_m50_m52_midturn.py


async def test_m53_a_failed_first_reply_fails_the_turn_and_keeps_nothing(kit: Kit) -> None:
    kit.model.script("reply", "{bad", "{bad", "{bad")
    async with kit.box() as box:
        result = await box.say("hello")
    assert result.outcome == "failed" and kit.host.sent == []
    assert await kit.records() == [] and kit.model.of("appraisal") == []
    assert not [m for m, _ in kit.host.memory_requests() if m in ("memory.encode", "memory.conversation.put")]


async def test_m53_a_failed_later_hop_leaves_the_last_good_reply(kit: Kit) -> None:
    await known(kit)
    kit.model.script(
        "reply", envelope("the good draft", action="search", action_text="tulips"), "{bad", "{bad", "{bad"
    )
    async with kit.box() as box:
        result = await box.say("hello")
    assert result.outcome == "sent" and sent(kit) == ["the good draft"]
    assert any("previous draft stands" in line for line in kit.host.log_lines())
    assert len(await kit.records()) == 2  # the moment was kept


async def test_m54_a_model_block_replaces_the_plain_block_for_the_routed_model(kit: Kit) -> None:
    loaded = Prompts.load()
    variant = Prompts({**loaded.blocks, "filter.system@tiny-model": "Pick memories for {imp}. JSON."})
    await kit.seed("Ann's owl Hoot is sick.", intensity=0.3, ago=timedelta(days=2))
    for models in ({"filter": "tiny-model"}, {}):
        engine = kit.engine(prompts=variant, models=models)
        await engine.begin(facts("owl Hoot"))
    routed, plain = kit.model.of("filter")
    assert routed.body["model"] == "tiny-model" and routed.system == "Pick memories for pip. JSON."
    # issue 33: unrouted on OpenAI, the filter goes to its shipped default, with the plain block
    assert plain.body["model"] == "gpt-4.1-mini" and plain.system.startswith("You are the part of pip's mind")


async def test_m55_each_purpose_is_routed_to_its_model_the_rest_to_the_default(kit: Kit) -> None:
    await kit.seed("Ann's owl Hoot is sick.", intensity=0.3, ago=timedelta(days=2))
    async with kit.box(models={"filter": "filter-model", "appraisal": "appraisal-model"}) as box:
        await box.say("owl Hoot")
    models = {c.purpose: c.body["model"] for c in kit.model.calls}
    assert models == {
        "reply": "gpt-5.1", "filter": "filter-model", "appraisal": "appraisal-model",
        "arrival": "gpt-5.1",  # unrouted, the arrival goes where the reply goes (101)
    }  # fmt: skip


def test_m121_the_memory_budget_follows_the_hosts_turn_ceiling(kit: Kit) -> None:
    """The busy backoff (121) never waits past the turn: the host's ceiling, less a share kept for the reply."""
    told = kit.engine()
    told.init.session.turn_ceiling_s = 20.0
    assert 16.9 < (told.deadline() or 0) <= 17.0  # 0.85 of the 20 s ceiling
    untold = kit.engine()
    untold.init.session.turn_ceiling_s = None
    assert 99.9 < (untold.deadline() or 0) <= 100.0  # an older host: under its default 120 s


async def test_m99_the_selection_seam_runs_beside_recall_and_m100_its_rules_reach_only_the_reply(
    kit: Kit,
) -> None:
    """Issue II fills the seam; issue I runs it beside recall (off the critical path) and shows what it picks
    under WHAT YOU HAVE LEARNED in the reply only — the appraisal never sees it."""
    engine = kit.engine()
    selecting = anyio.Event()

    class Selector:
        async def select(self, turn: object) -> list[str]:
            selecting.set()
            return ["when someone is sad → listen first", "when asked twice → answer plainly", "a", "b"]

    involuntary = engine.recall.involuntary

    async def recall_after_selection_started(*args: Any, **kwargs: Any) -> Any:
        with anyio.fail_after(2):  # run one after the other, this would wait for ever
            await selecting.wait()
        return await involuntary(*args, **kwargs)

    engine.dispositions = Selector()
    engine.recall.involuntary = recall_after_selection_started  # type: ignore[method-assign]
    turn = await engine.begin(facts("I feel low today"))
    block = turn.block() or ""
    assert "WHAT YOU HAVE LEARNED (fits this situation):\n- when someone is sad → listen first" in block
    learned = block.split("WHAT YOU HAVE LEARNED (fits this situation):\n")[1].split("\n\n")[0]
    assert learned.splitlines() == [
        "- when someone is sad → listen first",
        "- when asked twice → answer plainly",
        "- a",
    ]  # at most 3 (dispositionsMax)
    await turn.commit(
        CommittedTurn(channel_id="c1", message_id="m1", author="Ann", said="I feel low today", outcome="sent",
                      delivered="I'm here.", envelope=draft(answer="I'm here."), author_id="u1")
    )  # fmt: skip
    (appraisal,) = kit.model.of("appraisal")
    assert "listen first" not in appraisal.system + appraisal.user
