"""Issue 11 #5: an admin of the requesting guild must not approve posts into another guild.

pip talks in guild A (the yard's guild: BOB is its administrator) and a policy rule lets it post
into channels of guild B, where BEA is the administrator. Its post into B waits for approval; only
pip's owner (OLIVE), the host operator, or an admin of *B* may decide it — by button or by
``/approvals`` — and ``/approvals list`` shows it only to them. The guild of a channel nobody spoke
in is learned from the bot's own view of it; a channel the bot cannot see is decided by owners and
the operator only. Real discord.py against the fake Discord.
"""

from __future__ import annotations

from typing import Any

import pytest

from impyard.paths import home
from testing.fake_discord import FakeChannel, FakeDiscord, FakeGuild, FakeUser, member
from testing.fake_openai import FakeOpenAI, envelope
from tests.discord_yard import (
    BOB,
    CAROL,
    GENERAL,
    GUILD,
    OLIVE,
    OWNERS,
    Yard,
    serving,
    until,
)
from tests.test_discord_commands import answer_to, run, synced

pytestmark = pytest.mark.anyio

GUILD_B = 5_000
B_NEWS = 5_001  # a channel of B the host has seen (someone spoke there)
B_UNSEEN = 5_002  # a channel of B nobody has spoken in: only the bot's view of B says where it is
NOWHERE = 6_666  # no channel the bot can see: nobody can tell its guild
BEA = FakeUser(2_020, "bea")


def with_guild_b(**kwargs: Any) -> FakeDiscord:
    """The yard's fake Discord, plus guild B: BEA administers it; BOB (A's admin) and CAROL are plain members."""
    guild_b = FakeGuild(
        GUILD_B, "the other server", owner_id=BEA.id,
        channels=[FakeChannel(B_NEWS, "news"), FakeChannel(B_UNSEEN, "quiet-corner")],
        members=[member(BEA, administrator=True), member(BOB), member(CAROL)],
    )  # fmt: skip
    kwargs["guilds"] = [*kwargs["guilds"], guild_b]
    return FakeDiscord(**kwargs)


@pytest.fixture(autouse=True)
def two_guilds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tests.discord_yard.FakeDiscord", with_guild_b)
    policies = home() / "policies"
    policies.mkdir(parents=True, exist_ok=True)
    (policies / "cross.toml").write_text(
        f'[[rules]]\nname = "post-into-b"\nmethod = "discord.send"\naction = "allow"\nchannels = ["{B_NEWS}", "{B_UNSEEN}", "{NOWHERE}"]\n'
    )


async def gate_into(yard: Yard, model: FakeOpenAI, target: int) -> tuple[Any, str]:
    """pip, asked in guild A, posts into ``target``: gated (another channel); its card goes to OWNERS (in A)."""
    model.clear_rules()
    model.script(envelope(answer="news for the other server", answer_needed=True, channel=str(target)))
    asked = yard.fake.post_message(GENERAL, CAROL, "pip, tell the other server")
    await yard.answered(asked.id)
    (gate,) = [g for g in yard.rt.gateway.gates.latest(("pending",)) if g.target == str(target)]
    card = await yard.fake.wait_for(
        lambda: next((m for m in yard.fake.messages(OWNERS) if gate.id in m.content), None)
    )
    return card, gate.id


async def seen_in_b(yard: Yard) -> None:
    """Someone speaks in B's news channel: the host records it (and its guild). Mention mode: pip stays asleep."""
    yard.rt.channels.set_mode(str(B_NEWS), "mention")
    said = yard.fake.post_message(B_NEWS, BEA, "morning all")
    await yard.stored(B_NEWS, said.id)


async def test_an_admin_of_the_requesting_guild_cannot_approve_a_post_into_another_guild(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    async with serving(monkeypatch, model, answer=None) as yard:
        await synced(yard)
        await seen_in_b(yard)
        card, gate_id = await gate_into(yard, model, B_NEWS)
        gate = yard.rt.gateway.gates.get(gate_id)
        clicked = await answer_to(
            yard, yard.fake.click_button(card.id, f"impyard:gate:{gate_id}:approve", user=BOB)
        )
        listed_a = await run(yard, "approvals list", BOB)
        approved_a = await run(yard, "approvals approve", BOB, {"gate": gate_id})
        after_a = yard.rt.gateway.gates.get(gate_id).state
        posted_after_a = list(yard.fake.messages(B_NEWS))
        listed_b = await run(yard, "approvals list", BEA, channel=B_NEWS)
        approved_b = await run(
            yard, "approvals approve", BEA, {"gate": gate_id, "note": "fine here"}, channel=B_NEWS
        )
        decided = yard.rt.gateway.gates.get(gate_id)
    assert (gate.origin_guild, gate.target_guild) == (str(GUILD), str(GUILD_B))
    assert (
        clicked.ephemeral and "may not decide" in clicked.content and "would be posted in" in clicked.content
    )
    assert (
        listed_a.ephemeral
        and gate_id not in listed_a.content
        and "No approvals of pip are waiting for you" in listed_a.content
    )
    assert approved_a.ephemeral and "may not decide" in approved_a.content
    assert after_a == "pending" and posted_after_a == []
    assert f"`{gate_id}`" in listed_b.content
    assert "Approved: the reply was posted" in approved_b.content
    assert [m.content for m in yard.fake.messages(B_NEWS)] == ["news for the other server"]
    assert decided.state == "executed" and decided.decided_by == f"user:discord:{BEA.id}"


async def test_the_guild_of_a_channel_nobody_spoke_in_is_learned_from_the_bot(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    async with serving(monkeypatch, model, answer=None) as yard:
        await synced(yard)
        assert yard.rt.channels.info(str(B_UNSEEN)) is None  # the channel store never heard of it
        _, gate_id = await gate_into(yard, model, B_UNSEEN)
        learned = await until(lambda: yard.rt.gateway.gates.get(gate_id).target_guild)
        refused = await run(yard, "approvals approve", BOB, {"gate": gate_id})
        approved = await run(yard, "approvals approve", BEA, {"gate": gate_id}, channel=B_UNSEEN)
    assert learned == str(GUILD_B)
    assert "may not decide" in refused.content
    assert "Approved: the reply was posted" in approved.content
    assert [m.content for m in yard.fake.messages(B_UNSEEN)] == ["news for the other server"]


async def test_owners_decide_a_post_into_a_channel_whose_guild_nobody_knows(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    async with serving(monkeypatch, model, answer=None) as yard:
        await synced(yard)
        card, gate_id = await gate_into(yard, model, NOWHERE)
        gate = yard.rt.gateway.gates.get(gate_id)
        listed_by_b_admin = await run(yard, "approvals list", BEA, channel=B_NEWS)
        refused = await run(yard, "approvals deny", BEA, {"gate": gate_id}, channel=B_NEWS)
        refused_a = await answer_to(
            yard, yard.fake.click_button(card.id, f"impyard:gate:{gate_id}:deny", user=BOB)
        )
        listed_by_owner = await run(yard, "approvals list", OLIVE)
        clicked = yard.fake.click_button(card.id, f"impyard:gate:{gate_id}:deny", user=OLIVE)
        await yard.fake.wait_for(
            lambda: any(r.kind == "edit_original" for r in yard.fake.interaction_responses(clicked))
        )
        decided = yard.rt.gateway.gates.get(gate_id)
    assert gate.target_guild is None
    assert "Who may decide: an owner of pip or the host operator" in card.content
    assert gate_id not in listed_by_b_admin.content
    assert "may not decide" in refused.content and "no guild admin may" in refused.content
    assert "may not decide" in refused_a.content
    assert f"`{gate_id}`" in listed_by_owner.content
    assert decided.state == "denied" and decided.decided_by == f"user:discord:{OLIVE.id}"
