"""Slash commands (docs/architecture.md, docs/conversation.md): ``/channel mode|trust|untrust|show``, ``/approvals list|approve|deny``
and ``/forget-me`` (issue 23).

Administration happens only on authenticated surfaces: every command is checked here, in code, for
who runs it — the server owner, a member with Administrator or Manage Server, or one of the imp's
configured owners (``discord:<id>`` in imp.toml) — whatever ``default_permissions`` Discord applies.
``/approvals`` then shows and decides only the gates the approver policy (``gates.may_decide``) lets this
user decide: an owner of the imp, or an admin of the guild the reply would be posted in.
Every interaction is deferred (ephemeral) before anything else, well inside Discord's 3 seconds;
answers and refusals are ephemeral and say why. ``/channel`` acts on the channel it is run in (a
thread is a channel of its own) through the same store as ``impyard channel``. ``/forget-me`` is anyone's,
for themselves only: it asks first (a button only the person who ran it may press), then forgets everything
by or about them in every scope of this imp's memory, as ``impyard memory forget`` does (a name too short
or too common to tell apart, "Al" or "the", counts only where they wrote under it; the answer says so).
The commands act on the running host's own stores, handed in by ``impyard serve`` (``CommandHost``).
Syncing the command tree is explicit: ``impyard discord sync``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import discord
from discord import app_commands

from impyard.channels.store import ChannelModeError, ChannelStore, parse_mode
from impyard.conversation.history import History
from impyard.discord.buttons import Faces, action_button, custom_id_template, persistent_view
from impyard.gateway.gates import Approver, Gate, GateError, GateStore, may_decide
from impyard.gateway.trust import ALWAYS_TRUSTED_KINDS, ChannelInfo
from impyard.imps.store import ImpConfig
from impyard.memory.forgetting import Forgotten
from impyard.memory.store import MemoryStore

if TYPE_CHECKING:
    from impyard.discord.approval_cards import ApprovalCards
    from impyard.discord.client import ImpClient
    from impyard.gateway.core import Gateway

log = logging.getLogger("impyard.discord.commands")

MAX_LISTED_GATES = 10
MODE_CHOICES = [
    app_commands.Choice(name="all — every message wakes the imp", value="all"),
    app_commands.Choice(name="mention — only @mentions and replies wake it", value="mention"),
]
MODE_MEANING = {
    "all": "every message here wakes the imp (it judges when to speak once several people talk)",
    "mention": "only @mentions of the imp and replies to it wake it; other messages are kept as context",
}


@dataclass
class CommandHost:
    """What the commands act on: the running host's stores (``impyard.host.Host``), gateway and imp configs."""

    channels: ChannelStore
    gateway: Gateway
    configs: Mapping[str, ImpConfig]
    memory: MemoryStore  # the host's memory store: /forget-me and deleted messages
    history: History  # the host's history: deleted messages, the names a person wrote under
    cards: ApprovalCards | None = None

    @property
    def gates(self) -> GateStore:
        """The gate store the gateway was handed (awaited through its own ``db.run``)."""
        return self.gateway.gates


# ------------------------------------------------------------------ who may (a pure rule)


def admin_reason(
    *,
    user_id: int,
    owners: Collection[str],
    guild_owner_id: int | None,
    permissions: discord.Permissions | None,
) -> str | None:
    """Why this user may administer the imp where the command runs, or None. ``permissions``: in that guild."""
    if f"discord:{user_id}" in owners:
        return "an owner of the imp"
    if guild_owner_id is not None and user_id == guild_owner_id:
        return "the server owner"
    if permissions is not None and permissions.administrator:
        return "a server administrator"
    if permissions is not None and permissions.manage_guild:
        return "a member with Manage Server"
    return None


def is_guild_admin(interaction: discord.Interaction[Any]) -> bool:
    """Owner, Administrator or Manage Server of the guild the interaction happens in (never in a DM)."""
    if interaction.guild_id is None:
        return False
    guild_owner = interaction.guild.owner_id if interaction.guild is not None else None
    perms = interaction.permissions
    return interaction.user.id == guild_owner or perms.administrator or perms.manage_guild


def refusal_text(imp: str, what: str) -> str:
    return (
        f"Only the server owner, members with Administrator or Manage Server, or an owner of {imp} may {what}. "
        "You are none of these here, so nothing was changed."
    )


def channel_text(info: ChannelInfo) -> str:
    trusted = "yes (always, a DM)" if info.kind in ALWAYS_TRUSTED_KINDS else ("yes" if info.trusted else "no")
    trust_meaning = (
        "the imp's replies here are posted without approval"
        if info.trusted or info.kind in ALWAYS_TRUSTED_KINDS
        else "the imp's replies here wait for an owner's approval"
    )
    return (
        f"Channel <#{info.channel_id}>: mode **{info.mode}** ({MODE_MEANING.get(info.mode, '?')}); "
        f"trusted: **{trusted}** ({trust_meaning})."
    )


def gate_line(gate: Gate) -> str:
    content = " ".join(gate.send.content.split())
    preview = content[:80] + ("…" if len(content) > 80 else "")
    return f"`{gate.id}` → <#{gate.target}>: “{preview}” (deadline <t:{int(gate.deadline.timestamp())}:R>)"


# ------------------------------------------------------------------ the tree


class ImpCommandTree(app_commands.CommandTree["ImpClient"]):
    async def on_error(
        self, interaction: discord.Interaction[ImpClient], error: app_commands.AppCommandError
    ) -> None:
        log.error(
            "slash command /%s failed: %s",
            interaction.command.qualified_name if interaction.command else "?",
            error,
        )
        text = "That did not work: something went wrong on the impyard host (it is logged there)."
        try:
            if interaction.response.is_done():
                await interaction.followup.send(text, ephemeral=True)
            else:
                await interaction.response.send_message(text, ephemeral=True)
        except discord.HTTPException:
            pass


def _context(interaction: discord.Interaction[ImpClient]) -> tuple[ImpClient, CommandHost]:
    client = interaction.client
    if client.host is None:
        raise app_commands.AppCommandError("this bot is not serving (start `impyard serve`)")
    return client, client.host


async def _answer(interaction: discord.Interaction[Any], text: str) -> None:
    await interaction.followup.send(text, ephemeral=True, allowed_mentions=discord.AllowedMentions.none())


async def _admin_or_refuse(interaction: discord.Interaction[ImpClient], what: str) -> str | None:
    client, _ = _context(interaction)
    guild = interaction.guild
    reason = admin_reason(
        user_id=interaction.user.id,
        owners=client.config.owners,
        guild_owner_id=guild.owner_id if guild is not None else None,
        permissions=interaction.permissions if interaction.guild_id is not None else None,
    )
    if reason is None:
        log.info("refused /%s by %s in %s", what, interaction.user.id, interaction.channel_id)
        await _answer(interaction, refusal_text(client.imp, what))
    return reason


async def _this_channel(interaction: discord.Interaction[ImpClient]) -> ChannelInfo:
    """Record the channel as Discord describes it (surface, kind, name, guild) before changing it."""
    _, host = _context(interaction)
    channel = interaction.channel
    name = (getattr(channel, "name", "") or "")[:256]
    kind = "dm" if interaction.guild_id is None else "guild"
    return await host.channels.db.run(host.channels.seen,
        str(interaction.channel_id), surface="discord", kind=kind, name=name,
        guild_id=str(interaction.guild_id) if interaction.guild_id else None,
    )  # fmt: skip


def build_tree(client: ImpClient) -> ImpCommandTree:
    tree = ImpCommandTree(client)
    channel = app_commands.Group(
        name="channel",
        description="This channel's settings for the imp: response mode and trust",
        default_permissions=discord.Permissions(
            manage_guild=True
        ),  # a hint to Discord; checked in code anyway
        guild_only=True,
    )

    @channel.command(name="mode", description="When the imp answers in this channel")
    @app_commands.describe(mode="all: every message wakes the imp; mention: only @mentions and replies")
    @app_commands.choices(mode=MODE_CHOICES)
    async def channel_mode(interaction: discord.Interaction[ImpClient], mode: str) -> None:
        await interaction.response.defer(ephemeral=True, thinking=True)
        if await _admin_or_refuse(interaction, "set this channel's mode") is None:
            return
        _, host = _context(interaction)
        try:
            checked = parse_mode(mode)  # Discord offers only the choices; a forged request gets here too
        except ChannelModeError as exc:
            await _answer(interaction, f"Nothing was changed: {exc}.")
            return
        await _this_channel(interaction)
        info = await host.channels.db.run(host.channels.set_mode, str(interaction.channel_id), checked)
        log.info("channel %s mode set to %s by %s", info.channel_id, checked, interaction.user.id)
        await _answer(interaction, "Done. " + channel_text(info))

    @channel.command(name="trust", description="Trust this channel: the imp's replies here need no approval")
    async def channel_trust(interaction: discord.Interaction[ImpClient]) -> None:
        await _set_trust(interaction, True)

    @channel.command(
        name="untrust", description="Stop trusting this channel: the imp's replies here wait for approval"
    )
    async def channel_untrust(interaction: discord.Interaction[ImpClient]) -> None:
        await _set_trust(interaction, False)

    @channel.command(name="show", description="Show this channel's mode and trust")
    async def channel_show(interaction: discord.Interaction[ImpClient]) -> None:
        await interaction.response.defer(ephemeral=True, thinking=True)
        if await _admin_or_refuse(interaction, "see this channel's settings") is None:
            return
        info = await _this_channel(interaction)
        await _answer(interaction, channel_text(info))

    approvals = app_commands.Group(name="approvals", description="The imp's replies waiting for approval")

    @approvals.command(name="list", description="Pending approvals you may decide")
    async def approvals_list(interaction: discord.Interaction[ImpClient]) -> None:
        await interaction.response.defer(ephemeral=True, thinking=True)
        if await _admin_or_refuse(interaction, "see the approvals") is None:
            return
        client, host = _context(interaction)
        await host.gateway.expire_due()
        pending = await host.gates.db.run(host.gates.latest, ("pending",))
        approver, owners = approver_of(interaction), host.gateway.owners.get(client.imp, frozenset())
        # Only the gates this user may decide here: the approver policy itself, never a looser filter (issue 11 #5).
        mine = [g for g in pending if g.imp == client.imp and may_decide(approver, g, owners)[0]]
        if not mine:
            await _answer(interaction, f"No approvals of {client.imp} are waiting for you.")
            return
        lines = [gate_line(gate) for gate in mine[:MAX_LISTED_GATES]]
        more = len(mine) - MAX_LISTED_GATES
        if more > 0:
            lines.append(f"…and {more} more (`impyard approvals ls` on the host lists them all)")
        await _answer(interaction, f"Waiting for approval ({len(mine)}):\n" + "\n".join(lines))

    @approvals.command(name="approve", description="Approve a pending reply: it is posted once")
    @app_commands.describe(
        gate="The gate id, e.g. g-1a2b3c4d5e6f (from /approvals list)", note="Why (kept in the audit)"
    )
    async def approvals_approve(
        interaction: discord.Interaction[ImpClient], gate: str, note: str = ""
    ) -> None:
        await _decide(interaction, gate, True, note)

    @approvals.command(name="deny", description="Deny a pending reply: it is never posted")
    @app_commands.describe(
        gate="The gate id, e.g. g-1a2b3c4d5e6f (from /approvals list)", note="Why (kept in the audit)"
    )
    async def approvals_deny(interaction: discord.Interaction[ImpClient], gate: str, note: str = "") -> None:
        await _decide(interaction, gate, False, note)

    @tree.command(
        name="forget-me", description="Make the imp forget everything you said and everything about you"
    )
    async def forget_me(interaction: discord.Interaction[ImpClient]) -> None:
        await interaction.response.defer(ephemeral=True, thinking=True)
        client, _ = _context(interaction)
        view = persistent_view(ForgetMeButton(interaction.user.id, action) for action in FORGET_ME_FACES)
        await interaction.followup.send(
            forget_me_question(client.imp),
            ephemeral=True,
            view=view,
            allowed_mentions=discord.AllowedMentions.none(),
        )

    tree.add_command(channel)
    tree.add_command(approvals)
    return tree


async def _set_trust(interaction: discord.Interaction[ImpClient], trusted: bool) -> None:
    await interaction.response.defer(ephemeral=True, thinking=True)
    if await _admin_or_refuse(interaction, "trust or untrust this channel") is None:
        return
    _, host = _context(interaction)
    await _this_channel(interaction)
    info = await host.channels.db.run(host.channels.set_trusted, str(interaction.channel_id), trusted)
    log.info("channel %s trusted=%s by %s", info.channel_id, trusted, interaction.user.id)
    await _answer(interaction, "Done. " + channel_text(info))


def approver_of(interaction: discord.Interaction[Any]) -> Approver:
    """A Discord user as the approver policy sees them (``discord:<id>``, as owners are written)."""
    return Approver(
        kind="user",
        id=f"discord:{interaction.user.id}",
        is_guild_admin=is_guild_admin(interaction),
        guild_id=str(interaction.guild_id) if interaction.guild_id else None,
    )


async def decide_gate(
    interaction: discord.Interaction[ImpClient], gate_id: str, approve: bool, note: str = ""
) -> tuple[Gate | None, str]:
    """Decide through the gateway (approver policy, exactly-once execution); the gate and what to tell the user."""
    client, host = _context(interaction)
    gate_id = gate_id.strip()[:64]
    try:
        gate = await host.gates.db.run(host.gates.get, gate_id)
        if gate.imp != client.imp:
            return (
                None,
                f"Gate `{gate_id}` belongs to {gate.imp}, not {client.imp}: use {gate.imp}'s /approvals.",
            )
        decided = await host.gateway.decide(
            gate_id, approver_of(interaction), approve=approve, note=note[:500]
        )
    except GateError as exc:
        return None, f"Nothing was changed: {exc}"
    log.info("gate %s %s by discord:%s", decided.id, decided.state, interaction.user.id)
    if host.cards is not None:
        await host.cards.refresh(decided)
    return decided, outcome_text(decided)


def outcome_text(gate: Gate) -> str:
    if gate.state == "executed":
        count = len(gate.message_ids)
        return f"Approved: the reply was posted in <#{gate.target}> ({count} message{'s' if count != 1 else ''})."
    if gate.state == "failed":
        return f"Approved, but posting failed: {gate.error}"
    if gate.state == "denied":
        return "Denied: the reply will not be posted."
    if gate.state in ("approved", "executing"):
        return "Approved: the reply is being posted."
    return f"The gate is {gate.state}."


async def _decide(
    interaction: discord.Interaction[ImpClient], gate_id: str, approve: bool, note: str
) -> None:
    await interaction.response.defer(ephemeral=True, thinking=True)
    if await _admin_or_refuse(interaction, "decide approvals") is None:
        return
    _, text = await decide_gate(interaction, gate_id, approve, note)
    await _answer(interaction, text)


# ------------------------------------------------------------------ /forget-me (issue 23)

FORGET_ME_FACES: Faces = {
    "confirm": ("Forget me", discord.ButtonStyle.danger),
    "cancel": ("Cancel", discord.ButtonStyle.secondary),
}
FORGET_ME_ID = custom_id_template("forget-me", "[0-9]{1,20}", FORGET_ME_FACES)


def forget_me_question(imp: str) -> str:
    return (
        f"**Forget you?** {imp} will forget everything you said to it and everything it remembers about you, "
        "in every channel and DM, for good. This cannot be undone."
    )


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def forgotten_text(imp: str, forgotten: Forgotten) -> str:
    """The answer: what went, how it was matched, and the names too common to match where merely mentioned."""
    records, episodes, talks = forgotten.records, forgotten.episodes, forgotten.conversations
    if not records and not episodes and not talks:
        text = f"Done: {imp} remembered nothing by or about you, so there was nothing to forget."
    else:
        text = (
            f"Done: {imp} forgot you — {_plural(records, 'memory', 'memories')}, "
            f"{_plural(episodes, 'moment', 'moments')} and {_plural(talks, 'conversation', 'conversations')} "
            f"({forgotten.by_id} found by your account, {forgotten.by_name} by your name)."
        )
    if forgotten.author_only:
        names = ", ".join(f"“{name}”" for name in forgotten.author_only)
        text += (
            f" Memories that only mention {names} were kept: too short or too common a word to tell from "
            "others' memories (what you wrote under it went)."
        )
    return text


def names_of(user: discord.abc.User) -> list[str]:
    """The names a Discord user goes by (server nickname, display name, username), as memories name them."""
    names = [getattr(user, "nick", None), user.display_name, user.global_name, user.name]
    return list(dict.fromkeys(name.strip() for name in names if name and name.strip()))


async def forget_person(host: CommandHost, imp: str, person_id: str, names: list[str]) -> Forgotten:
    """Everything by ``person_id`` or about any of ``names`` or the names the history knows them by."""
    known = await host.history.db.run(host.history.author_names, person_id)
    return await host.memory.db.run(host.memory.forget_person, imp, [person_id], [*names, *known])


class ForgetMeButton(discord.ui.DynamicItem[discord.ui.Button[Any]], template=FORGET_ME_ID):
    """Forget me / Cancel under the /forget-me question; the custom id names whose question it is."""

    def __init__(self, user_id: int, action: str) -> None:
        super().__init__(action_button("forget-me", user_id, action, FORGET_ME_FACES))
        self.user_id = user_id
        self.action = action

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction[Any], item: discord.ui.Item[Any], match: re.Match[str], /
    ) -> ForgetMeButton:
        return cls(int(match["key"]), match["action"])

    async def callback(self, interaction: discord.Interaction[ImpClient]) -> None:  # type: ignore[override]
        await interaction.response.defer()  # acknowledged within Discord's 3 s; the question is edited after
        if interaction.user.id != self.user_id:  # only ever one's own: the id is in the button, checked here
            log.info("refused a /forget-me click by %s on %s's question", interaction.user.id, self.user_id)
            await interaction.followup.send(
                "This button forgets the person who asked, not you: run /forget-me yourself. Nothing was forgotten.",
                ephemeral=True,
            )
            return
        if self.action == "cancel":
            await interaction.edit_original_response(content="Cancelled: nothing was forgotten.", view=None)
            return
        client, host = _context(interaction)
        forgotten = await forget_person(
            host, client.imp, str(interaction.user.id), names_of(interaction.user)
        )
        log.info("/forget-me: %s forgot discord:%s: %s", client.imp, interaction.user.id, forgotten)
        await interaction.edit_original_response(
            content=forgotten_text(client.imp, forgotten),
            view=None,
            allowed_mentions=discord.AllowedMentions.none(),
        )
