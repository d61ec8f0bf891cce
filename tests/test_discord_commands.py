"""Slash commands and approval cards on Discord, end to end (issue 5, docs/security.md, docs/architecture.md).

Who may: the server owner (ALICE), an administrator (BOB), or pip's configured owner (OLIVE);
CAROL may not. Every interaction is deferred first, and every answer is ephemeral.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from impyard.cli import cli
from testing.fake_discord import CallbackType, FakeInteraction, FakeUser, Perm
from testing.fake_openai import FakeOpenAI
from tests.discord_yard import (
    ALICE,
    BOB,
    CAROL,
    GENERAL,
    GUILD,
    OLIVE,
    OWNERS,
    Yard,
    serving,
)

pytestmark = pytest.mark.anyio


async def synced(yard: Yard) -> None:
    await yard.host.clients["pip"].tree.sync()  # what `impyard discord sync` does


def edited_card(yard: Yard, click: FakeInteraction) -> bool:
    """The click's interaction ended by editing the card."""
    return any(r.kind == "edit_original" for r in yard.fake.interaction_responses(click))


async def answer_to(yard: Yard, interaction: FakeInteraction) -> Any:
    """The deferral, then the (ephemeral) answer; checks Discord's 3 seconds."""
    responses = await yard.fake.wait_for(
        lambda: len(r := yard.fake.interaction_responses(interaction)) >= 2 and r
    )
    first, answer = responses[0], responses[-1]
    assert first.kind == "callback" and first.deferred and first.status in (200, 204) and first.after_s < 3
    return answer


async def run(
    yard: Yard, name: str, user: FakeUser, options: dict[str, Any] | None = None, channel: int = GENERAL
) -> Any:
    return await answer_to(yard, yard.fake.invoke_command(name, options, user=user, channel_id=channel))


@pytest.mark.parametrize("who", [BOB, ALICE, OLIVE], ids=["administrator", "server owner", "imp owner"])
async def test_channel_mode_by_an_admin_flips_the_mode(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI, impyard_home: Any, who: FakeUser
) -> None:
    async with serving(monkeypatch, model) as yard:
        await synced(yard)
        answer = await run(yard, "channel mode", who, {"mode": "mention"})
        mode = yard.rt.channels.mode(str(GENERAL))
        shown = CliRunner().invoke(cli, ["channel", "show", str(GENERAL)])
        # ...and the next ambient message wakes nobody.
        ambient = yard.fake.post_message(GENERAL, CAROL, "chit chat")
        await yard.stored(GENERAL, ambient.id)
        boxes = yard.rt.sessions.boxes_started
    assert answer.kind == "followup" and answer.ephemeral and "mode **mention**" in answer.content
    assert mode == "mention" and boxes == 0
    assert shown.exit_code == 0 and "mode=mention" in shown.output and "surface=discord" in shown.output


async def test_channel_mode_by_anyone_else_is_refused_and_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    async with serving(monkeypatch, model) as yard:
        await synced(yard)
        answer = await run(yard, "channel mode", CAROL, {"mode": "mention"})
        # Discord's default_permissions is only a hint: a member the server let through is still checked here.
        forged = await run(yard, "channel trust", CAROL, channel=OWNERS)
        info, owners = yard.rt.channels.info(str(GENERAL)), yard.rt.channels.info(str(OWNERS))
        registered = yard.fake.command("channel")
    assert (
        answer.ephemeral
        and "Only the server owner, members with Administrator or Manage Server" in answer.content
    )
    assert (
        "nothing was changed" in answer.content
        and forged.ephemeral
        and "nothing was changed" in forged.content
    )
    assert info is not None and info.mode == "all" and info.trusted  # as the test set it up
    assert owners is None or not owners.trusted
    assert str(registered["default_member_permissions"]) == str(int(Perm.MANAGE_GUILD))


async def test_a_mode_outside_the_choices_is_refused(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    async with serving(monkeypatch, model) as yard:
        await synced(yard)
        choices = [c["value"] for c in yard.fake.command("channel")["options"][0]["options"][0]["choices"]]
        answer = await run(yard, "channel mode", BOB, {"mode": "loud"})  # Discord's client would not send it
        mode = yard.rt.channels.mode(str(GENERAL))
    assert choices == ["all", "mention"]
    assert answer.ephemeral and "Nothing was changed: unknown mode 'loud'" in answer.content
    assert "'all'" in answer.content and "'mention'" in answer.content and mode == "all"


async def test_channel_trust_untrust_and_show(monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI) -> None:
    async with serving(monkeypatch, model, trusted=()) as yard:
        await synced(yard)
        shown = await run(yard, "channel show", BOB)
        trusted = await run(yard, "channel trust", BOB)
        after_trust = yard.rt.channels.info(str(GENERAL))
        untrusted = await run(yard, "channel untrust", OLIVE)
        after_untrust = yard.rt.channels.info(str(GENERAL))
    assert (
        "mode **all**" in shown.content
        and "trusted: **no**" in shown.content
        and "wait for an owner" in shown.content
    )
    assert "trusted: **yes**" in trusted.content and after_trust is not None and after_trust.trusted
    assert (
        after_trust.surface == "discord"
        and after_trust.name == "general"
        and after_trust.guild_id == str(GUILD)
    )
    assert "trusted: **no**" in untrusted.content and after_untrust is not None and not after_untrust.trusted


async def untrusted_reply(yard: Yard) -> tuple[Any, Any, str]:
    """pip answers in an untrusted channel: the reply waits; its card is posted to the owners' channel."""
    asked = yard.fake.post_message(GENERAL, ALICE, "hello pip")
    await yard.answered(asked.id)
    (card,) = await yard.posted(OWNERS)
    (gate,) = yard.rt.gateway.gates.latest()
    return asked, card, gate.id


async def test_an_untrusted_reply_waits_for_approval_and_is_posted_exactly_once(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    async with serving(monkeypatch, model, trusted=()) as yard:
        asked, card, gate_id = await untrusted_reply(yard)
        assert (
            yard.fake.messages(GENERAL) == []
            and yard.rt.history.outcome("pip", str(GENERAL), str(asked.id)) == "pending"
        )
        listed = CliRunner().invoke(cli, ["approvals", "ls", "--json"])
        buttons = [b["custom_id"] for row in card.components for b in row["components"]]
        # CAROL is neither an owner of pip nor an admin: refused, nothing changes.
        refused = await answer_to(
            yard, yard.fake.click_button(card.id, f"impyard:gate:{gate_id}:approve", user=CAROL)
        )
        assert yard.rt.gateway.gates.get(gate_id).state == "pending" and yard.fake.messages(GENERAL) == []
        # OLIVE owns pip: approved, posted once, the card says so.
        approved = yard.fake.click_button(card.id, f"impyard:gate:{gate_id}:approve", user=OLIVE)
        (reply,) = await yard.posted(GENERAL)
        await yard.fake.wait_for(lambda: edited_card(yard, approved))
        assert await yard.rt.host.pump.run_once() == []  # a pass of the gate pump (and the cards): still once
        gate = yard.rt.gateway.gates.get(gate_id)
    assert [g["id"] for g in json.loads(listed.output)] == [gate_id]  # the desk on the CLI shows it too
    assert buttons == [f"impyard:gate:{gate_id}:approve", f"impyard:gate:{gate_id}:deny"]
    assert (
        card.author_id == yard.fake.bot_user.id
        and "hello there" in card.content
        and f"<#{GENERAL}>" in card.content
    )
    assert refused.ephemeral and "may not decide" in refused.content and "an owner of pip" in refused.content
    first = yard.fake.interaction_responses(approved)[0]
    assert first.type == CallbackType.DEFERRED_UPDATE_MESSAGE and first.after_s < 3
    assert [m.content for m in yard.fake.messages(GENERAL)] == [
        "hello there"
    ] and reply.reference_id == asked.id
    assert (
        gate.state == "executed"
        and gate.decided_by == f"user:discord:{OLIVE.id}"
        and gate.message_ids == [str(reply.id)]
    )
    edited = yard.fake.message(card.id)
    assert (
        edited.content.startswith(f"**✅ Approved and posted by <@{OLIVE.id}>**") and edited.components == []
    )


async def test_a_guild_admin_may_deny_from_the_card(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    async with serving(monkeypatch, model, trusted=()) as yard:
        _, card, gate_id = await untrusted_reply(yard)
        denied = yard.fake.click_button(card.id, f"impyard:gate:{gate_id}:deny", user=BOB)
        await yard.fake.wait_for(lambda: edited_card(yard, denied))
        gate = yard.rt.gateway.gates.get(gate_id)
    assert gate.state == "denied" and gate.decided_by == f"user:discord:{BOB.id}"
    assert yard.fake.messages(GENERAL) == [] and yard.fake.message(card.id).content.startswith(
        "**❌ Denied by"
    )


async def test_approvals_list_and_approve_as_slash_commands(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    async with serving(monkeypatch, model, trusted=()) as yard:
        await synced(yard)
        _, card, gate_id = await untrusted_reply(yard)
        refused = await run(yard, "approvals list", CAROL)
        listed = await run(yard, "approvals list", OLIVE, channel=OWNERS)
        approved = await run(yard, "approvals approve", BOB, {"gate": gate_id, "note": "fine"})
        again = await run(yard, "approvals deny", OLIVE, {"gate": gate_id})
        unknown = await run(yard, "approvals approve", OLIVE, {"gate": "g-000000000000"})
        await yard.fake.wait_for(lambda: yard.fake.message(card.id).components == [])
    assert refused.ephemeral and "Only the server owner" in refused.content
    assert listed.ephemeral and f"`{gate_id}`" in listed.content and "hello there" in listed.content
    assert approved.ephemeral and "Approved: the reply was posted" in approved.content
    assert [m.content for m in yard.fake.messages(GENERAL)] == ["hello there"]
    assert (
        f"was already approved by user:discord:{BOB.id} at " in again.content
    )  # who decided first, and when
    assert "(now executed)" in again.content and "no gate 'g-000000000000'" in unknown.content
    assert yard.fake.message(card.id).content.startswith(f"**✅ Approved and posted by <@{BOB.id}>**")


async def test_a_gate_approved_on_the_cli_is_posted_and_its_card_updated(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    async with serving(monkeypatch, model, trusted=()) as yard:
        _, card, gate_id = await untrusted_reply(yard)
        result = CliRunner().invoke(cli, ["approvals", "approve", gate_id])
        await yard.rt.host.pump.run_once()  # the running host's gate pump sends it, and updates the card
        await yard.posted(GENERAL)
        await yard.fake.wait_for(lambda: yard.fake.message(card.id).components == [])
    assert result.exit_code == 0
    assert [m.content for m in yard.fake.messages(GENERAL)] == ["hello there"]
    assert yard.fake.message(card.id).content.startswith("**✅ Approved and posted by operator:")
