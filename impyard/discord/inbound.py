"""A Discord message, as the conversation pipeline takes it (docs/conversation.md, docs/architecture.md).

``on_message`` → :func:`skip_reason` (system and command messages: not conversation) → :func:`to_inbound`:
who wrote it (a bot, a webhook, an imp of this host — ``Conversations.route`` drops those, the one place
bots are filtered) and the wake facts read from the message itself — a user mention from
``message.mentions`` (never ``mentioned_in()``, which is true for ``@everyone``), a mention of the bot's
own managed role, a reply to one of its messages — the replied-to message as ``reply_to``, and image
attachments fetched here, on the host, bounded in type and size, and passed to the box as data. A
thread is a channel of its own (its own id, mode and trust).

A deleted message (``on_raw_message_delete``; Discord does not say who deleted it, so whoever did — its
author or a moderator — it goes) leaves the host's history and the memory of every imp: its episodes,
and a record left without an episode with them; a turn still running on it keeps nothing of it
(:func:`forget_deleted`, ``MemoryStore.forget_message``).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import anyio
import discord

from box.protocol.models import Attachment, Author, Message, ReplyRef
from impyard.channels.store import PRIVATE, PUBLIC
from impyard.conversation.pipeline import Inbound, clean_content

if TYPE_CHECKING:
    from impyard.discord.commands import CommandHost

log = logging.getLogger("impyard.discord.inbound")

# Images only, and few bytes: they travel base64 inside one protocol line (1 MiB), with the text around them.
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
MAX_IMAGE_BYTES = 512 * 1024  # one image; base64 makes it ~683 KB
MAX_IMAGES_TOTAL_BYTES = 512 * 1024  # all images of one message together: base64 stays under ~700 KB
MAX_ATTACHMENTS = 10
FETCH_TIMEOUT_S = 10.0
MAX_REPLY_CONTEXT_CHARS = 2_000
SURFACE = "discord"

# What the first bytes of each allowed type look like: Discord derives content_type from the filename.
_MAGIC = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),
}
_CONVERSATION_TYPES = frozenset({discord.MessageType.default, discord.MessageType.reply})


def skip_reason(message: discord.Message) -> str | None:
    """Why a message is not conversation at all, or None. Bots are not skipped here: ``Conversations.route``
    drops them (issue 12: bots are filtered once, for every surface)."""
    if message.type not in _CONVERSATION_TYPES:
        return "system"  # joins, pins, slash-command echoes: not conversation
    return None


def channel_facts(channel: object) -> tuple[str, str, str | None]:
    """(kind, name, guild id) of the channel a message is in; a thread is a channel of its own."""
    if isinstance(channel, discord.DMChannel | discord.GroupChannel):
        recipient = getattr(channel, "recipient", None)
        return "dm", f"DM with {recipient}" if recipient else "DM", None
    guild = getattr(channel, "guild", None)
    name = getattr(channel, "name", "") or ""
    return "guild", name[:256], str(guild.id) if guild is not None else None


def audience_of(channel: object) -> str | None:
    """Who can read a server channel (issue 32 #4; docs/memory.md, "Privacy scopes"), from discord.py's cache of
    the channel as Discord sent it (GUILD_CREATE, CHANNEL_CREATE / UPDATE, THREAD_CREATE): ``"guild"`` when
    everyone in the server can, ``"private"`` when fewer can, None for a DM (no server).

    Private: a private thread (its members and moderators only); a thread of a private channel; a channel
    where @everyone cannot VIEW_CHANNEL (the server's @everyone role with that channel's @everyone overwrite),
    or where any overwrite denies VIEW_CHANNEL to a role or a member (someone in the server is kept out). A
    channel this client cannot inspect (not cached: a partial channel, a thread whose parent it has not seen)
    counts as private: a wrong guess keeps a public channel's memories to itself, never the other way round.
    """
    if isinstance(channel, discord.DMChannel | discord.GroupChannel):
        return None
    if isinstance(channel, discord.Thread):
        if channel.is_private():
            return PRIVATE
        channel = channel.parent  # a thread has no overwrites of its own: its parent's audience
    guild = getattr(channel, "guild", None)
    if not isinstance(channel, discord.abc.GuildChannel) or guild is None:
        return PRIVATE
    try:
        everyone = channel.permissions_for(guild.default_role)
        kept_out = any(overwrite.view_channel is False for overwrite in channel.overwrites.values())
    except (discord.ClientException, AttributeError, TypeError):  # no default role cached, or a stray shape
        return PRIVATE
    return PRIVATE if kept_out or not everyone.view_channel else PUBLIC


@dataclass(frozen=True)
class SeenAudience:
    """A server channel's audience as the client's cache has it now (``audience_of``), for the channel store."""

    channel_id: str
    name: str
    guild_id: str | None
    audience: str


def audiences(channels: Iterable[object]) -> list[SeenAudience]:
    """The audiences of these server channels and threads (DMs, and what is not a channel, left out)."""
    found: list[SeenAudience] = []
    for channel in channels:
        kind, name, guild_id = channel_facts(channel)
        audience = audience_of(channel) if kind == "guild" else None
        channel_id = getattr(channel, "id", None)
        if audience is not None and channel_id is not None:
            found.append(SeenAudience(str(channel_id), name, guild_id, audience))
    return found


def author_of(user: discord.abc.User, *, webhook: bool = False) -> Author:
    """A webhook's post counts as a bot's (its "author" is whatever name the webhook gave itself)."""
    name = (user.display_name or user.name or str(user.id))[:256]
    return Author(id=str(user.id), name=name, bot=user.bot or webhook)


@dataclass(frozen=True)
class WakeSignals:
    mentions_imp: bool
    mentions_imp_role: bool
    replies_to_imp: bool
    mentions_everyone: bool


def wake_signals(
    message: discord.Message, bot_user_id: int, bot_role_ids: Collection[int], replied: discord.Message | None
) -> WakeSignals:
    return WakeSignals(
        mentions_imp=any(user.id == bot_user_id for user in message.mentions),  # not mentioned_in(): §12
        mentions_imp_role=any(role.id in bot_role_ids for role in message.role_mentions),
        replies_to_imp=replied is not None and replied.author.id == bot_user_id,
        mentions_everyone=message.mention_everyone,
    )


async def replied_message(message: discord.Message) -> discord.Message | None:
    """The message this one replies to: as Discord sent it, from the cache, or fetched (one bounded call)."""
    reference = message.reference
    if reference is None or reference.message_id is None:
        return None
    if isinstance(reference.resolved, discord.Message):
        return reference.resolved
    if reference.cached_message is not None:
        return reference.cached_message
    if isinstance(reference.resolved, discord.DeletedReferencedMessage):
        return None
    try:
        with anyio.fail_after(FETCH_TIMEOUT_S):
            return await message.channel.fetch_message(reference.message_id)
    except (discord.HTTPException, TimeoutError) as exc:
        log.debug("could not fetch the message %s replies to: %s", message.id, exc)
        return None


def _looks_like(content_type: str, data: bytes) -> bool:
    if not data.startswith(_MAGIC[content_type]):
        return False
    return content_type != "image/webp" or data[8:12] == b"WEBP"


async def fetch_attachments(items: list[discord.Attachment]) -> list[Attachment]:
    """Images within the limits come as data; everything else as what it is (name, type, size) only."""
    out: list[Attachment] = []
    budget = MAX_IMAGES_TOTAL_BYTES
    for item in items[:MAX_ATTACHMENTS]:
        content_type = (item.content_type or "application/octet-stream").split(";")[0].strip().lower()
        meta = Attachment(
            filename=item.filename[:256], content_type=content_type[:100], size=max(item.size, 0)
        )
        if content_type not in IMAGE_TYPES:
            out.append(meta)  # not an image: the box learns it exists, never its bytes
            continue
        if item.size > min(MAX_IMAGE_BYTES, budget):
            log.info(
                "attachment %s (%d bytes) is over the image limit; passed without its data",
                item.filename,
                item.size,
            )
            out.append(meta)
            continue
        try:
            with anyio.fail_after(FETCH_TIMEOUT_S):
                data = await item.read()
        except (discord.HTTPException, TimeoutError, OSError) as exc:
            log.warning("could not fetch attachment %s: %s", item.filename, exc)
            out.append(meta)
            continue
        if len(data) > min(MAX_IMAGE_BYTES, budget) or not _looks_like(content_type, data):
            log.info(
                "attachment %s is not the image it claims to be (or too big); passed without its data",
                item.filename,
            )
            out.append(meta.model_copy(update={"size": len(data)}))
            continue
        budget -= len(data)
        out.append(meta.model_copy(update={"size": len(data), "data_b64": base64.b64encode(data).decode()}))
    return out


async def to_inbound(
    message: discord.Message,
    *,
    bot_user_id: int,
    bot_role_ids: Collection[int] = (),
    imp_user_ids: Collection[int] = (),
) -> Inbound:
    """The pipeline's view of a message that passed :func:`skip_reason` (content stays content).

    A message the pipeline drops (``Inbound.from_a_bot``: a bot, a webhook, this imp or another) comes
    without its replied-to message and its attachments: nothing is fetched for what no imp will read.
    """
    kind, name, guild_id = channel_facts(message.channel)
    bare = Inbound(
        surface=SURFACE,
        channel_id=str(message.channel.id),
        channel_kind=kind,  # type: ignore[arg-type]
        message=Message(
            id=str(message.id),
            author=author_of(message.author, webhook=message.webhook_id is not None),
            content=message.clean_content,  # <@id> → @name: who was addressed, readable; cleaned again downstream
            created_at=message.created_at,
        ),
        channel_name=name,
        guild_id=guild_id,
        audience=audience_of(message.channel) if kind == "guild" else None,
        author_is_imp=message.author.id == bot_user_id or message.author.id in imp_user_ids,
    )
    if bare.from_a_bot:
        return bare
    replied = await replied_message(message)
    signals = wake_signals(message, bot_user_id, bot_role_ids, replied)
    reply_to = None
    if replied is not None:
        reply_to = ReplyRef(
            id=str(replied.id), author=author_of(replied.author),
            content=clean_content(replied.content)[:MAX_REPLY_CONTEXT_CHARS],
        )  # fmt: skip
    elif message.reference is not None and message.reference.message_id is not None:
        reply_to = ReplyRef(id=str(message.reference.message_id))
    attachments = await fetch_attachments(list(message.attachments))
    converted = bare.message.model_copy(
        update={
            "mentions_imp": signals.mentions_imp or signals.mentions_imp_role or signals.replies_to_imp,
            "reply_to": reply_to,
            "attachments": attachments,
        }
    )
    return replace(
        bare,
        message=converted,
        mentions_imp=signals.mentions_imp,
        mentions_imp_role=signals.mentions_imp_role,
        replies_to_imp=signals.replies_to_imp,
        mentions_everyone=signals.mentions_everyone,
    )


def bot_role_ids(message: discord.Message) -> set[int]:
    """The bot's own managed role in the message's guild (a mention of it addresses the imp)."""
    guild = message.guild
    role = guild.self_role if guild is not None else None
    return {role.id} if role is not None else set()


async def forget_deleted(host: CommandHost, channel_id: int, message_ids: Sequence[int]) -> dict[str, int]:
    """Messages deleted on Discord: out of the host's history, and their episodes out of every imp's memory
    (a record left without an episode goes too). Returns the counts; a failure is logged, never raised into
    discord.py's event loop."""
    counts = {"history": 0, "records": 0, "episodes": 0}
    try:
        for message_id in message_ids:
            counts["history"] += await host.history.db.run(
                host.history.forget, str(channel_id), str(message_id)
            )
            forgotten = await host.memory.db.run(host.memory.forget_message, str(channel_id), str(message_id))
            counts["records"] += forgotten.get("records", 0)
            counts["episodes"] += forgotten.get("episodes", 0)
    except Exception:  # noqa: BLE001 - an event handler: log, and keep the bot running
        log.exception("could not forget deleted messages %s in channel %s", list(message_ids), channel_id)
        return counts
    if any(counts.values()):
        log.info("deleted in channel %s: %s message(s) forgotten: %s", channel_id, len(message_ids), counts)
    return counts
