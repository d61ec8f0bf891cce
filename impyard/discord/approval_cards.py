"""Approval cards (docs/security.md, docs/architecture.md): a gated reply shown to the imp's owners with Approve / Deny buttons.

When the gateway opens a gate, the card is posted by the imp's bot to its configured ``[discord]
owner_channel`` (the gate also waits in ``impyard approvals ls`` and ``/approvals list``). A click is
one more approval request: it is acknowledged at once, then checked against the approver policy by
``Gateway.decide`` — only the imp's owners and admins of the guild the reply would be posted in (not
those of the guild the request came from, when it goes elsewhere) may decide — and an approved gate is
executed there, exactly once. The card then shows the outcome and loses its
buttons. Gates decided elsewhere (the CLI, ``/approvals``, the deadline) update their cards too.
Before its card is posted, a gate whose target channel the host never saw a message in learns that
channel's guild from the imp's bot (``learn_target_guild``), so that guild's admins may decide it.

The buttons are ``DynamicItem``s: their custom id carries the gate id, so cards posted before a
restart keep working.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import discord

from impyard.discord.buttons import Faces, action_button, custom_id_template, persistent_view
from impyard.discord.inbound import channel_facts
from impyard.discord.surface import is_discord_channel
from impyard.gateway.gates import FINAL_STATES, GATE_ID, Gate, GateError, deciding_guild
from impyard.imps.store import ImpConfig

if TYPE_CHECKING:
    from impyard.discord.client import ImpClient
    from impyard.gateway.core import Gateway

log = logging.getLogger("impyard.discord.cards")

CARD_PREVIEW_CHARS = 1_200
QUEUE_SIZE = 1_000
GATE_FACES: Faces = {
    "approve": ("Approve", discord.ButtonStyle.success),
    "deny": ("Deny", discord.ButtonStyle.danger),
}
CUSTOM_ID = custom_id_template("gate", GATE_ID.pattern, GATE_FACES)

STATE_BADGE = {
    "approved": "✅ Approved",
    "executing": "✅ Approved — posting",
    "executed": "✅ Approved and posted",
    "failed": "⚠️ Approved, but posting failed",
    "denied": "❌ Denied",
    "expired": "⌛ Expired",
}


def card_text(gate: Gate) -> str:
    """The card's content: who wants to post what, where, why it waits, and (once decided) the outcome."""
    content = gate.send.content
    preview = content[:CARD_PREVIEW_CHARS] + ("…" if len(content) > CARD_PREVIEW_CHARS else "")
    quoted = "\n".join(f"> {line}" for line in (preview.splitlines() or [""]))
    files = gate.send.files
    lines = [
        f"**Approval needed** — gate `{gate.id}`",
        f"**{gate.imp}** wants to post in <#{gate.target}>"
        + (
            f" (its conversation is in <#{gate.session_channel}>)"
            if gate.session_channel != gate.target
            else ""
        ),
        f"Why it waits: {gate.reason}",
        *(
            [
                f"Who may decide: an owner of {gate.imp} or the host operator (no server admin may: <#{gate.target}> "
                "is a DM or in a server this host does not know)"
            ]
            if deciding_guild(gate) is None
            else []
        ),
        f"Deadline: <t:{int(gate.deadline.timestamp())}:R>"
        + (f" · {len(files)} file{'s' if len(files) != 1 else ''} attached" if files else ""),
        quoted,
    ]
    if gate.state != "pending":
        outcome = STATE_BADGE.get(gate.state, gate.state)
        if gate.decided_by:
            who = gate.decided_by.removeprefix("user:")
            outcome += (
                f" by <@{who.removeprefix('discord:')}>" if who.startswith("discord:") else f" by {who}"
            )
        if gate.state == "failed" and gate.error:
            outcome += f": {gate.error[:200]}"
        lines.insert(0, f"**{outcome}**")
    return "\n".join(lines)[:2000]


class GateButton(discord.ui.DynamicItem[discord.ui.Button[Any]], template=CUSTOM_ID):
    """Approve or Deny on a card; the custom id names the gate."""

    def __init__(self, gate_id: str, action: str) -> None:
        super().__init__(action_button("gate", gate_id, action, GATE_FACES))
        self.gate_id = gate_id
        self.action = action

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction[Any], item: discord.ui.Item[Any], match: re.Match[str], /
    ) -> GateButton:
        return cls(match["key"], match["action"])

    async def callback(self, interaction: discord.Interaction[ImpClient]) -> None:  # type: ignore[override]
        await interaction.response.defer()  # acknowledged within Discord's 3 s; the card is edited after
        cards = interaction.client.cards
        if cards is None:
            await interaction.followup.send("This impyard host is not serving approvals.", ephemeral=True)
            return
        await cards.clicked(interaction, self.gate_id, self.action == "approve")


@dataclass(frozen=True)
class Card:
    imp: str
    channel_id: int
    message_id: int


class ApprovalCards:
    """Posts a card for each gate opened, and keeps the cards in step with their gates."""

    def __init__(self, clients: Mapping[str, ImpClient], configs: Mapping[str, ImpConfig]) -> None:
        self.clients = dict(clients)
        self.configs = dict(configs)
        self.gateway: Gateway | None = None
        self.cards: dict[str, Card] = {}
        self._opened, self._queue = anyio.create_memory_object_stream[Gate](QUEUE_SIZE)

    def bind(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def gate_opened(self, gate: Gate) -> None:
        """The gateway's ``on_gate``: never blocks the box's request; the worker posts the card."""
        try:
            self._opened.send_nowait(gate)
        except anyio.WouldBlock:
            log.warning("too many approval cards waiting; gate %s is only in `impyard approvals ls`", gate.id)

    async def run(self) -> None:
        """The worker (in the host's task group): post cards as gates open. Decisions taken elsewhere reach
        the cards through the host's gate pump (``refresh_decided``)."""
        async with self._queue:
            async for gate in self._queue:
                try:
                    await self.post(await self.learn_target_guild(gate))
                except Exception:  # noqa: BLE001 - one card that cannot be posted never stops the others
                    log.exception("could not post the approval card of gate %s", gate.id)

    async def learn_target_guild(self, gate: Gate) -> Gate:
        """A post into a channel the host never saw a message in: record its guild as the imp's bot sees it.

        Discord's own view of the channel (never what the box or a user wrote) says whose admins may decide
        (issue 11 #5); until it is known, and for a channel the bot cannot see, only owners and the operator may.
        """
        client = self.clients.get(gate.imp)
        if (
            self.gateway is None
            or client is None
            or deciding_guild(gate) is not None
            or not is_discord_channel(gate.target)
        ):
            return gate
        channel = client.get_channel(int(gate.target))
        guild_id = channel_facts(channel)[2] if channel is not None else None
        if guild_id is None:
            return gate
        log.info("gate %s: <#%s> is in guild %s; its admins may decide", gate.id, gate.target, guild_id)
        return await self.gateway.gates.db.run(self.gateway.gates.learn_target_guild, gate.id, guild_id)

    async def post(self, gate: Gate) -> Card | None:
        config = self.configs.get(gate.imp)
        client = self.clients.get(gate.imp)
        channel_id = config.discord.owner_channel if config is not None else None
        if client is None or not channel_id:
            log.info(
                "gate %s of %s waits; no [discord] owner_channel to post its card to: `impyard approvals approve %s`",
                gate.id, gate.imp, gate.id,
            )  # fmt: skip
            return None
        view = persistent_view(GateButton(gate.id, action) for action in GATE_FACES)
        channel = client.get_channel(int(channel_id)) or client.get_partial_messageable(int(channel_id))
        message = await channel.send(  # type: ignore[union-attr]
            card_text(gate), view=view, allowed_mentions=discord.AllowedMentions.none()
        )
        card = Card(gate.imp, int(channel_id), message.id)
        self.cards[gate.id] = card
        log.info("approval card for gate %s posted in %s (message %s)", gate.id, channel_id, message.id)
        return card

    async def clicked(self, interaction: discord.Interaction[ImpClient], gate_id: str, approve: bool) -> None:
        from impyard.discord.commands import approver_of

        assert self.gateway is not None, "bind() the gateway first"
        approver = approver_of(interaction)
        try:
            gate = await self.gateway.decide(gate_id, approver, approve=approve)
        except GateError as exc:
            log.info("card click on %s by %s refused: %s", gate_id, approver.id, exc)
            await interaction.followup.send(f"Nothing was changed: {exc}", ephemeral=True)
            if exc.kind in ("not_pending", "expired"):
                await self.refresh(await self.gateway.gates.db.run(self.gateway.gates.get, gate_id))
            return
        log.info("gate %s %s from its card by %s", gate.id, gate.state, approver.id)
        self.cards.pop(gate.id, None)
        await interaction.edit_original_response(
            content=card_text(gate), view=None, allowed_mentions=discord.AllowedMentions.none()
        )

    async def refresh(self, gate: Gate) -> None:
        """Show a decided gate's outcome on its card (a no-op while it is pending, or without a card)."""
        if gate.state == "pending" or gate.state not in (*FINAL_STATES, "approved", "executing"):
            return
        if gate.state in FINAL_STATES:
            card = self.cards.pop(gate.id, None)
        else:
            card = self.cards.get(gate.id)
        client = self.clients.get(card.imp) if card is not None else None
        if card is None or client is None:
            return
        try:
            await (
                client.get_partial_messageable(card.channel_id)
                .get_partial_message(card.message_id)
                .edit(content=card_text(gate), view=None, allowed_mentions=discord.AllowedMentions.none())
            )
        except discord.HTTPException as exc:
            log.warning("could not update the card of gate %s: %s", gate.id, exc)

    async def refresh_decided(self) -> None:
        """A gate pump follower: cards of gates decided elsewhere (the CLI, the deadline) show the outcome."""
        if not self.cards or self.gateway is None:
            return
        for gate_id in list(self.cards):
            try:
                gate = await self.gateway.gates.db.run(self.gateway.gates.get, gate_id)
            except GateError:
                self.cards.pop(gate_id, None)
                continue
            if gate.state in FINAL_STATES:
                await self.refresh(gate)
