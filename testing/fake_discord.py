"""A loopback fake of Discord — REST API and gateway websocket — for the real discord.py client (docs/contributing.md).

    async with FakeDiscord(guilds=[FakeGuild(GUILD, "yard", owner_id=ALICE.id,
                                             channels=[FakeChannel(CHAN, "general")],
                                             members=[member(ALICE, administrator=True)])]) as fake:
        client = discord.Client(intents=intents)
        async with fake.connected(client):            # patches discord.py, logs in, waits for the guilds
            fake.post_message(CHAN, ALICE, f"hi {fake.bot_user.mention}")   # MESSAGE_CREATE
            ...
            sent = await fake.wait_for(lambda: fake.messages(CHAN))          # what the bot posted
            assert sent[0].content == "hello"

It is an aiohttp server on 127.0.0.1 (ephemeral port) in the current event loop (``async with``), or in a
thread of its own for sync callers such as ``CliRunner`` (``with FakeDiscord(...) as fake``). Every
injection method (``post_message``, ``invoke_command``, ``click_button``, ``drop_connection``...) is a plain
thread-safe function; what the client does in response is awaited with :meth:`FakeDiscord.wait_for`.

How discord.py 2.7 finds Discord, and so how it is pointed here (:meth:`FakeDiscord.patch_discord`):

* REST: ``discord.http.Route.BASE`` (a class attribute read on every request; webhooks and interaction
  callbacks use the same ``Route``).
* Gateway: a plain ``discord.Client`` does NOT ask ``GET /gateway/bot``; it connects straight to the class
  attribute ``discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY`` (only ``AutoShardedClient`` asks
  ``/gateway/bot``). After READY it reconnects to ``resume_gateway_url`` for RESUME, and after an
  INVALID_SESSION it falls back to ``DEFAULT_GATEWAY``. Both attributes are patched.
* Compression: discord.py always asks ``?encoding=json&v=10&compress=zlib-stream`` (``zstd-stream`` when
  ``zstandard`` is installed) but only decompresses *binary* frames, so this fake answers with uncompressed
  JSON text frames. ``FakeDiscord(gateway_compression=True)`` honours ``zlib-stream`` instead (one zlib
  stream per connection, each frame ending in a Z_SYNC_FLUSH).
* A 429 is retried by discord.py only if the response carries a ``Via`` header (otherwise it assumes a
  Cloudflare ban) and its ``Content-Type`` is exactly ``application/json``; both are sent here.
* ``Client`` waits ``guild_ready_timeout`` (2 s) after the last GUILD_CREATE before ``on_ready``;
  :meth:`FakeDiscord.connected` shortens it. It also sleeps 5 s before every IDENTIFY but the first
  (``Client.before_identify_hook``): override the hook in tests that make it identify again.
* Login asks ``GET /users/@me`` (401 -> ``discord.LoginFailure``) then ``GET /oauth2/applications/@me``.
* Like Discord, the fake sends a bot its own messages (MESSAGE_CREATE for what it posted).

What it enforces, like Discord: the bot token on every authenticated REST call (401) and at IDENTIFY
(close 4004); privileged intents the application has not switched on (close 4014); MESSAGE_CONTENT (a
message's content, embeds, attachments and components reach a bot without it only in DMs, when the bot
is mentioned, or when the bot wrote it); GUILD_MEMBERS (without it GUILD_CREATE lists only the bot);
2000 characters per message; 10 files of 10 MiB; empty messages; one acknowledgement per interaction
within 3 s; command names and descriptions.

Channel permissions (issue 32 #4), like Discord: a guild channel carries ``permission_overwrites`` (:class:`Overwrite`:
``type`` 0 a role — the guild's own id is @everyone — or 1 a member, ``allow`` / ``deny`` bit strings) in
GUILD_CREATE, CHANNEL_CREATE and CHANNEL_UPDATE (:meth:`FakeDiscord.update_channel`); a thread carries none (it
follows its parent), and a private thread (``ChannelType.PRIVATE_THREAD``, :meth:`FakeChannel.private_thread`) is
seen only by its members and by those who may MANAGE_THREADS. A user's permissions in a channel are worked out
as Discord does (:meth:`FakeDiscord.permissions_in`: owner, then @everyone and the member's roles, ADMINISTRATOR,
then the @everyone overwrite, the member's roles' overwrites together, the member's own). A bot is sent
MESSAGE_CREATE only from channels it can VIEW_CHANNEL, GUILD_CREATE lists and THREAD_CREATE announces only the
threads it can see, and its REST calls into a channel it cannot see are answered 403 Missing Access (50001).
Refused at configuration (``ValueError``), as Discord's API refuses them: an overwrite of another type, of a role
the guild has not or a user who is not a member, two overwrites of one target, bits past the known permissions,
overwrites on a thread, a thread whose parent is not a text channel of its guild, a private thread in an
announcement channel.

Shards, like Discord: IDENTIFY's ``shard`` ``[shard_id, num_shards]`` (discord.py sends it when a ``Client``
has ``shard_id`` and ``shard_count``) must be two integers with ``0 <= shard_id < num_shards``, else the
connection is closed with 4010 (invalid shard); a session that would hold more than
``max_guilds_per_shard`` guilds (Discord: 2500) is closed with 4011 (sharding required). A sharded session
gets only its guilds — ``(guild_id >> 22) % num_shards == shard_id`` — in READY, GUILD_CREATE, messages,
channel events and interactions; events without a guild (DMs, and commands run in DMs) go to shard 0 only.
:meth:`FakeDiscord.broadcast_to_every_shard` plays a gateway that ignores that rule (issue 36): every session
gets every guild's events (interactions still go to one session). ``GET /gateway/bot`` recommends one shard per thousand guilds (:attr:`FakeDiscord.recommended_shards`).

Records: :attr:`FakeDiscord.rest_calls` (every REST call, Authorization value removed), messages the bots
post, typing calls, interaction responses, registered commands, gateway connects, IDENTIFYs (with their
shard) and RESUMEs, presence updates (with the shard they came on); :attr:`FakeDiscord.shards_connected`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import enum
import fnmatch
import json
import mimetypes
import re
import secrets
import socket
import threading
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, NamedTuple, TypeVar

import anyio
import discord
import yarl
from aiohttp import BodyPartReader, WSMsgType, web

__all__ = [
    "ALL_PERMISSIONS",
    "API_PREFIX",
    "DEFAULT_BOT_PERMISSIONS",
    "DEFAULT_EVERYONE_PERMISSIONS",
    "DEFAULT_TOKEN",
    "PRIVILEGED_INTENTS",
    "CallbackType",
    "ChannelType",
    "FakeAttachment",
    "FakeBot",
    "FakeChannel",
    "FakeDiscord",
    "FakeGuild",
    "FakeInteraction",
    "FakeMember",
    "FakeRole",
    "FakeUser",
    "FormPart",
    "GatewayConnect",
    "Identify",
    "Intent",
    "InteractionResponse",
    "MessageRecord",
    "Overwrite",
    "Perm",
    "PresenceUpdate",
    "RestCall",
    "Resume",
    "TypingCall",
    "member",
]

T = TypeVar("T")

API_VERSION = 10
API_PREFIX = f"/api/v{API_VERSION}"
DEFAULT_TOKEN = "fake-token"
DEFAULT_BOT_USER_ID = 990_000_000_000_000_001
DEFAULT_APP_OWNER_ID = 990_000_000_000_000_002
DISCORD_EPOCH_MS = 1_420_070_400_000
HEARTBEAT_INTERVAL_MS = 41_250
INTERACTION_ACK_DEADLINE_S = 3.0  # Discord forgets an interaction not acked within 3 s (docs/architecture.md)
MAX_CONTENT_CHARS = 2000
MAX_FILES_PER_MESSAGE = 10
ATTACHMENT_SIZE_LIMIT_BYTES = 10 * 1024 * 1024
MAX_REQUEST_BYTES = 64 * 1024 * 1024  # above Discord's limit, so oversized uploads get Discord's own 413
REPLAY_BUFFER_EVENTS = 2000  # dispatches kept per session for RESUME
MAX_GUILDS_PER_SHARD = 2500  # Discord: a session past this is closed with 4011, sharding required
GUILDS_PER_RECOMMENDED_SHARD = 1000  # GET /gateway/bot recommends about one shard per thousand guilds
SHUTDOWN_TIMEOUT_S = 2.0
DEFAULT_WAIT_S = 5.0


class Intent(enum.IntFlag):
    """Gateway intents (the subset that matters to impyard)."""

    GUILDS = 1 << 0
    GUILD_MEMBERS = 1 << 1
    GUILD_PRESENCES = 1 << 8
    GUILD_MESSAGES = 1 << 9
    GUILD_MESSAGE_REACTIONS = 1 << 10
    GUILD_MESSAGE_TYPING = 1 << 11
    DIRECT_MESSAGES = 1 << 12
    MESSAGE_CONTENT = 1 << 15


PRIVILEGED_INTENTS = Intent.GUILD_MEMBERS | Intent.GUILD_PRESENCES | Intent.MESSAGE_CONTENT


class Perm(enum.IntFlag):
    """Permission bits."""

    CREATE_INSTANT_INVITE = 1 << 0
    KICK_MEMBERS = 1 << 1
    BAN_MEMBERS = 1 << 2
    ADMINISTRATOR = 1 << 3
    MANAGE_CHANNELS = 1 << 4
    MANAGE_GUILD = 1 << 5
    ADD_REACTIONS = 1 << 6
    VIEW_CHANNEL = 1 << 10
    SEND_MESSAGES = 1 << 11
    MANAGE_MESSAGES = 1 << 13
    EMBED_LINKS = 1 << 14
    ATTACH_FILES = 1 << 15
    READ_MESSAGE_HISTORY = 1 << 16
    MENTION_EVERYONE = 1 << 17
    USE_APPLICATION_COMMANDS = 1 << 31
    MANAGE_THREADS = 1 << 34
    SEND_MESSAGES_IN_THREADS = 1 << 38


ALL_PERMISSIONS = (1 << 51) - 1
DEFAULT_EVERYONE_PERMISSIONS = int(
    Perm.VIEW_CHANNEL
    | Perm.SEND_MESSAGES
    | Perm.READ_MESSAGE_HISTORY
    | Perm.ADD_REACTIONS
    | Perm.EMBED_LINKS
    | Perm.ATTACH_FILES
    | Perm.USE_APPLICATION_COMMANDS
    | Perm.SEND_MESSAGES_IN_THREADS
)
DEFAULT_BOT_PERMISSIONS = DEFAULT_EVERYONE_PERMISSIONS


class ChannelType(enum.IntEnum):
    GUILD_TEXT = 0
    DM = 1
    GUILD_ANNOUNCEMENT = 5
    ANNOUNCEMENT_THREAD = 10
    PUBLIC_THREAD = 11
    PRIVATE_THREAD = 12


THREAD_TYPES = frozenset(
    {ChannelType.ANNOUNCEMENT_THREAD, ChannelType.PUBLIC_THREAD, ChannelType.PRIVATE_THREAD}
)


class CallbackType(enum.IntEnum):
    """Interaction callback types (POST /interactions/{id}/{token}/callback)."""

    PONG = 1
    CHANNEL_MESSAGE = 4
    DEFERRED_CHANNEL_MESSAGE = 5
    DEFERRED_UPDATE_MESSAGE = 6
    UPDATE_MESSAGE = 7
    AUTOCOMPLETE_RESULT = 8
    MODAL = 9


class _Op(enum.IntEnum):
    DISPATCH = 0
    HEARTBEAT = 1
    IDENTIFY = 2
    PRESENCE_UPDATE = 3
    VOICE_STATE_UPDATE = 4
    RESUME = 6
    RECONNECT = 7
    REQUEST_GUILD_MEMBERS = 8
    INVALID_SESSION = 9
    HELLO = 10
    HEARTBEAT_ACK = 11


# Gateway close codes.
CLOSE_UNKNOWN_ERROR = 4000  # resumable: discord.py reconnects and RESUMEs
CLOSE_UNKNOWN_OPCODE = 4001
CLOSE_DECODE_ERROR = 4002
CLOSE_NOT_AUTHENTICATED = 4003
CLOSE_AUTHENTICATION_FAILED = 4004
CLOSE_ALREADY_AUTHENTICATED = 4005
CLOSE_INVALID_SHARD = 4010
CLOSE_SHARDING_REQUIRED = 4011
CLOSE_INVALID_INTENTS = 4013
CLOSE_DISALLOWED_INTENTS = 4014

INTERACTION_PING = 1
INTERACTION_APPLICATION_COMMAND = 2
INTERACTION_MESSAGE_COMPONENT = 3
COMPONENT_ACTION_ROW = 1
COMPONENT_BUTTON = 2
MESSAGE_TYPE_DEFAULT = 0
MESSAGE_TYPE_REPLY = 19
MESSAGE_TYPE_CHAT_INPUT_COMMAND = 20
FLAG_EPHEMERAL = 1 << 6
FLAG_LOADING = 1 << 7
APP_FLAG_GATEWAY_PRESENCE = 1 << 12
APP_FLAG_GATEWAY_GUILD_MEMBERS = 1 << 14
APP_FLAG_GATEWAY_MESSAGE_CONTENT = 1 << 18

OPTION_SUB_COMMAND = 1
OPTION_SUB_COMMAND_GROUP = 2
OPTION_STRING = 3
OPTION_INTEGER = 4
OPTION_BOOLEAN = 5
OPTION_USER = 6
OPTION_CHANNEL = 7
OPTION_ROLE = 8
OPTION_MENTIONABLE = 9
OPTION_NUMBER = 10

_USER_MENTION = re.compile(r"<@!?(\d+)>")
_ROLE_MENTION = re.compile(r"<@&(\d+)>")
_EVERYONE_MENTION = re.compile(r"@(everyone|here)\b")
_COMMAND_NAME = re.compile(r"^[-_'\w]{1,32}$")
_FILE_FIELD = re.compile(r"^files\[(\d+)\]$")


# ---------------------------------------------------------------------------------------------------------
# What the fake Discord is configured with


@dataclass(frozen=True)
class FakeUser:
    """A Discord user (a human, or a bot when ``bot=True``)."""

    id: int
    username: str
    bot: bool = False
    global_name: str | None = None

    @property
    def mention(self) -> str:
        return f"<@{self.id}>"

    def payload(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "username": self.username,
            "discriminator": "0",
            "global_name": self.global_name,
            "avatar": None,
            "bot": self.bot,
            "system": False,
            "public_flags": 0,
            "flags": 0,
            "banner": None,
            "accent_color": None,
            "avatar_decoration_data": None,
        }


@dataclass(frozen=True)
class FakeRole:
    id: int
    name: str
    permissions: int = 0
    position: int = 1
    mentionable: bool = True
    managed: bool = False

    @property
    def mention(self) -> str:
        return f"<@&{self.id}>"

    def payload(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "name": self.name,
            "color": 0,
            "colors": {"primary_color": 0, "secondary_color": None, "tertiary_color": None},
            "hoist": False,
            "icon": None,
            "unicode_emoji": None,
            "position": self.position,
            "permissions": str(self.permissions),
            "managed": self.managed,
            "mentionable": self.mentionable,
            "flags": 0,
        }


@dataclass(frozen=True)
class FakeMember:
    """A user's membership of a guild. ``permissions`` are granted through a role the guild makes for it."""

    user: FakeUser
    roles: tuple[int, ...] = ()
    nick: str | None = None
    permissions: int = 0


def member(
    user: FakeUser,
    *,
    administrator: bool = False,
    manage_guild: bool = False,
    permissions: int = 0,
    roles: Sequence[int] = (),
    nick: str | None = None,
) -> FakeMember:
    """A guild member with the given extra permission bits (on top of @everyone's)."""
    bits = (
        permissions
        | (Perm.ADMINISTRATOR if administrator else 0)
        | (Perm.MANAGE_GUILD if manage_guild else 0)
    )
    return FakeMember(user=user, roles=tuple(roles), nick=nick, permissions=int(bits))


OVERWRITE_ROLE = 0
OVERWRITE_MEMBER = 1


@dataclass(frozen=True)
class Overwrite:
    """A channel's permission overwrite, as Discord sends it in ``permission_overwrites``: ``type`` 0 a role (the
    guild's own id: @everyone) or 1 a member; ``allow`` and ``deny`` permission bits (sent as strings)."""

    id: int
    type: int = OVERWRITE_ROLE
    allow: int = 0
    deny: int = 0

    @classmethod
    def role(cls, role: FakeRole | int, *, allow: int = 0, deny: int = 0) -> Overwrite:
        return cls(
            role.id if isinstance(role, FakeRole) else int(role), OVERWRITE_ROLE, int(allow), int(deny)
        )

    @classmethod
    def member(cls, user: FakeUser | FakeMember | int, *, allow: int = 0, deny: int = 0) -> Overwrite:
        found = (
            user.user.id if isinstance(user, FakeMember) else user.id if isinstance(user, FakeUser) else user
        )
        return cls(int(found), OVERWRITE_MEMBER, int(allow), int(deny))

    def payload(self) -> dict[str, Any]:
        return {"id": str(self.id), "type": self.type, "allow": str(self.allow), "deny": str(self.deny)}


def hidden_from_everyone(
    guild_id: int, *seen_by: FakeRole | FakeUser | FakeMember | int
) -> tuple[Overwrite, ...]:
    """The overwrites of a staff-only channel: @everyone denied VIEW_CHANNEL, each of ``seen_by`` (a role, or a
    user or member) allowed it. An int is taken as a role id."""
    view = int(Perm.VIEW_CHANNEL)
    granted = [
        Overwrite.member(who, allow=view)
        if isinstance(who, FakeUser | FakeMember)
        else Overwrite.role(who, allow=view)
        for who in seen_by
    ]
    return (Overwrite.role(guild_id, deny=view), *granted)


@dataclass(frozen=True)
class FakeChannel:
    """A guild text channel (default), a thread (``parent_id``), or a DM (``type=ChannelType.DM``, ``recipient``).

    A DM belongs to one bot: ``bot_user_id`` (default: the main bot). ``overwrites``: a guild channel's
    permission overwrites (a thread has none). ``thread_members``: who a private thread lets in (its owner
    always), besides those who may MANAGE_THREADS.
    """

    id: int
    name: str = ""
    type: int = ChannelType.GUILD_TEXT
    parent_id: int | None = None
    recipient: FakeUser | None = None
    topic: str | None = None
    position: int = 0
    owner_id: int | None = None
    bot_user_id: int | None = None
    overwrites: Sequence[Overwrite] = ()
    thread_members: Sequence[int] = ()

    @classmethod
    def dm(cls, id: int, recipient: FakeUser, *, bot_user_id: int | None = None) -> FakeChannel:
        return cls(id=id, type=ChannelType.DM, recipient=recipient, bot_user_id=bot_user_id)

    @classmethod
    def thread(cls, id: int, name: str, *, parent_id: int, owner_id: int | None = None) -> FakeChannel:
        return cls(id=id, name=name, type=ChannelType.PUBLIC_THREAD, parent_id=parent_id, owner_id=owner_id)

    @classmethod
    def private_thread(
        cls, id: int, name: str, *, parent_id: int, owner_id: int, members: Sequence[FakeUser | int] = ()
    ) -> FakeChannel:
        """A private thread: seen by its owner, its ``members`` and those who may MANAGE_THREADS."""
        ids = tuple(
            dict.fromkeys([owner_id, *(m.id if isinstance(m, FakeUser) else int(m) for m in members)])
        )
        return cls(id=id, name=name, type=ChannelType.PRIVATE_THREAD, parent_id=parent_id, owner_id=owner_id,
                   thread_members=ids)  # fmt: skip

    @property
    def is_dm(self) -> bool:
        return self.type == ChannelType.DM

    @property
    def mention(self) -> str:
        return f"<#{self.id}>"


@dataclass(frozen=True)
class FakeGuild:
    """A guild. Every bot of the fake is a member of every guild (added automatically)."""

    id: int
    name: str = "guild"
    owner_id: int = 0
    channels: Sequence[FakeChannel] = ()
    roles: Sequence[FakeRole] = ()
    members: Sequence[FakeMember] = ()
    everyone_permissions: int = DEFAULT_EVERYONE_PERMISSIONS


@dataclass(frozen=True)
class FakeBot:
    """A bot application: its token, its bot user, and which privileged intents its portal page allows."""

    token: str
    user: FakeUser
    application_id: int
    privileged_intents: int = int(PRIVILEGED_INTENTS)
    permissions: int = DEFAULT_BOT_PERMISSIONS
    owner: FakeUser = FakeUser(DEFAULT_APP_OWNER_ID, "app-owner")


@dataclass(frozen=True)
class FakeAttachment:
    """A file on an injected message. ``size`` may claim more than ``data`` holds (to test size limits cheaply)."""

    filename: str
    data: bytes = b""
    content_type: str | None = None
    size: int | None = None
    width: int | None = None
    height: int | None = None
    description: str | None = None


# ---------------------------------------------------------------------------------------------------------
# What the fake Discord records


@dataclass(frozen=True)
class FormPart:
    """One part of a multipart body (``payload_json`` or ``files[n]``)."""

    name: str
    filename: str | None
    content_type: str | None
    data: bytes


@dataclass(frozen=True)
class RestCall:
    method: str
    path: str  # below /api/v10, e.g. "/channels/1/messages"
    query: dict[str, str]
    headers: dict[str, str]  # the request's headers, Authorization left out
    auth_present: bool
    auth_valid: bool  # the Authorization header named a configured bot's token
    bot_user_id: int | None  # whose token it was
    body: Any  # the JSON body, or a multipart body's payload_json
    parts: tuple[FormPart, ...]  # multipart parts, payload_json included
    status: int
    response: Any
    at: float  # time.monotonic() when it arrived

    @property
    def files(self) -> tuple[FormPart, ...]:
        return tuple(p for p in self.parts if p.filename is not None)


@dataclass
class MessageRecord:
    """A message Discord holds: ``payload`` is the REST message object (what GET returns)."""

    payload: dict[str, Any]
    guild_id: int | None
    source: str  # "injected" | "rest" | "interaction"
    files: tuple[FormPart, ...] = ()
    bot_user_id: int | None = None  # the bot that created it (REST or interaction)
    deleted: bool = False
    ephemeral: bool = False

    @property
    def id(self) -> int:
        return int(self.payload["id"])

    @property
    def channel_id(self) -> int:
        return int(self.payload["channel_id"])

    @property
    def content(self) -> str:
        return self.payload.get("content", "")

    @property
    def author_id(self) -> int:
        return int(self.payload["author"]["id"])

    @property
    def reference_id(self) -> int | None:
        ref = self.payload.get("message_reference")
        return int(ref["message_id"]) if ref and ref.get("message_id") else None

    @property
    def embeds(self) -> list[dict[str, Any]]:
        return self.payload.get("embeds", [])

    @property
    def components(self) -> list[dict[str, Any]]:
        return self.payload.get("components", [])

    @property
    def attachments(self) -> list[dict[str, Any]]:
        return self.payload.get("attachments", [])

    @property
    def flags(self) -> int:
        return int(self.payload.get("flags", 0))


@dataclass(frozen=True)
class TypingCall:
    channel_id: int
    bot_user_id: int | None
    at: float


@dataclass
class FakeInteraction:
    """An interaction the fake dispatched; its acknowledgement state is updated as the bot answers."""

    id: int
    token: str
    application_id: int
    type: int
    channel_id: int
    guild_id: int | None
    user_id: int
    payload: dict[str, Any]
    created_at: float  # time.monotonic()
    message_id: int | None = None  # the message a component sat on
    acknowledged_type: int | None = None
    original_message_id: int | None = None

    @property
    def acknowledged(self) -> bool:
        return self.acknowledged_type is not None


@dataclass(frozen=True)
class InteractionResponse:
    """One thing the bot did with an interaction's token."""

    interaction_id: int
    kind: str  # "callback" | "edit_original" | "delete_original" | "followup" | "edit_followup"
    type: int | None  # the callback type, for kind == "callback"
    flags: int
    content: str | None
    payload: dict[str, Any]
    files: tuple[FormPart, ...]
    status: int  # what the fake answered (a late or second callback is refused)
    message_id: int | None
    after_s: float  # seconds since the interaction was dispatched

    @property
    def ephemeral(self) -> bool:
        return bool(self.flags & FLAG_EPHEMERAL)

    @property
    def deferred(self) -> bool:
        return self.type in (CallbackType.DEFERRED_CHANNEL_MESSAGE, CallbackType.DEFERRED_UPDATE_MESSAGE)


@dataclass(frozen=True)
class GatewayConnect:
    path: str  # "/gateway" (DEFAULT_GATEWAY) or "/gateway/resume" (resume_gateway_url)
    query: dict[str, str]
    compressed: bool
    at: float


@dataclass(frozen=True)
class Identify:
    token_valid: bool
    bot_user_id: int | None
    intents: int | None
    properties: dict[str, Any]
    accepted: bool
    close_code: int | None
    at: float
    shard: tuple[int, int] | None = None  # [shard_id, num_shards] as sent (when it was a pair of ints)


@dataclass(frozen=True)
class PresenceUpdate:
    """An op 3 PRESENCE_UPDATE a bot sent: its status and activities (a custom status is type 4, ``state``)."""

    bot_user_id: int
    status: str | None
    activities: list[dict[str, Any]]
    afk: bool | None
    at: float
    shard: tuple[int, int] | None = None  # the shard of the session it came on (None: unsharded)

    @property
    def custom_status(self) -> str | None:
        """The text of the custom status (activity type 4), or None when none is set."""
        custom = [a for a in self.activities if a.get("type") == 4]
        return str(custom[0].get("state") or custom[0].get("name") or "") if custom else None


@dataclass(frozen=True)
class Resume:
    session_id: str | None
    seq: int | None
    accepted: bool
    replayed: int
    at: float


# ---------------------------------------------------------------------------------------------------------
# Internal state


class _Reply(NamedTuple):
    status: int
    body: Any = None
    headers: Mapping[str, str] = {}


class _Ctx(NamedTuple):
    """One REST request, as a handler sees it."""

    bot: FakeBot | None  # whose token authorised it
    body: Any
    parts: tuple[FormPart, ...]
    query: dict[str, str]


@dataclass
class _Fault:
    method: str
    path_pattern: str
    status: int | None
    times: int
    delay_s: float = 0.0
    retry_after: float = 0.2
    global_: bool = False
    body: Any = None


@dataclass
class _GuildState:
    config: FakeGuild
    roles: dict[int, FakeRole]
    members: dict[int, FakeMember]
    joined_at: str


@dataclass
class _ChannelState:
    config: FakeChannel
    guild_id: int | None
    message_ids: list[int] = field(default_factory=list)

    @property
    def id(self) -> int:
        return self.config.id


@dataclass(frozen=True)
class _Close:
    code: int
    reason: str = ""


@dataclass(eq=False)
class _Connection:
    ws: web.WebSocketResponse
    outbox: asyncio.Queue[dict[str, Any] | _Close]
    compressor: Any  # a zlib compressobj, or None for plain text frames
    session: _Session | None = None
    closed_by_server: bool = False


@dataclass(eq=False)
class _Session:
    id: str
    bot: FakeBot
    intents: int
    shard: tuple[int, int] | None  # (shard_id, num_shards); None: unsharded, every guild and the DMs
    seq: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    connection: _Connection | None = None
    resumable: bool = True
    created_at: float = field(default_factory=time.monotonic)


class _Snowflakes:
    """Discord ids: milliseconds since 2015 << 22, plus a counter, strictly increasing."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._last_ms = 0
        self._increment = 0
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            ms = max(int(self._clock() * 1000), self._last_ms)
            if ms == self._last_ms:
                self._increment += 1
                if self._increment >= 4096:
                    ms, self._increment = ms + 1, 0
            else:
                self._increment = 0
            self._last_ms = ms
            return ((ms - DISCORD_EPOCH_MS) << 22) | (1 << 17) | self._increment


def _error(status: int, code: int, message: str, errors: Any = None) -> _Reply:
    body: dict[str, Any] = {"message": message, "code": code}
    if errors is not None:
        body["errors"] = errors
    return _Reply(status, body)


def _form_error(path: Sequence[str], code: str, message: str) -> _Reply:
    errors: dict[str, Any] = {"_errors": [{"code": code, "message": message}]}
    for key in reversed(path):
        errors = {key: errors}
    return _error(400, 50035, "Invalid Form Body", errors)


def _unknown(what: str, code: int) -> _Reply:
    return _error(404, code, f"Unknown {what}")


_UNAUTHORIZED = _Reply(401, {"message": "401: Unauthorized", "code": 0})
_NOT_FOUND = _Reply(404, {"message": "404: Not Found", "code": 0})
_NO_CONTENT = _Reply(204)


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _shard_of_identify(d: Mapping[str, Any]) -> tuple[tuple[int, int] | None, bool]:
    """IDENTIFY's ``shard``: (the pair or None when absent, whether Discord takes it).

    Discord takes ``[shard_id, num_shards]`` with ``0 <= shard_id < num_shards``; anything else in the
    field is an invalid shard (close 4010).
    """
    raw = d.get("shard")
    if raw is None:
        return None, True
    if (
        not isinstance(raw, list)
        or len(raw) != 2
        or not all(isinstance(n, int) and not isinstance(n, bool) for n in raw)
    ):
        return None, False
    shard_id, count = raw
    return (shard_id, count), 0 <= shard_id < count


def _on_shard(shard: tuple[int, int] | None, guild_id: int | None) -> bool:
    """Whether a session of ``shard`` gets a guild's events; ``guild_id`` None (a DM, or any event without a
    guild) goes to shard 0 only. Discord's rule: ``(guild_id >> 22) % num_shards == shard_id``."""
    if shard is None:
        return True
    shard_id, count = shard
    if guild_id is None:
        return shard_id == 0
    return (guild_id >> 22) % count == shard_id


def _user_of(who: FakeUser | FakeMember) -> FakeUser:
    return who.user if isinstance(who, FakeMember) else who


# ---------------------------------------------------------------------------------------------------------
# The fake


class FakeDiscord:
    """A loopback Discord. See the module docstring for what it speaks and enforces."""

    def __init__(
        self,
        token: str = DEFAULT_TOKEN,
        *,
        bot_user_id: int = DEFAULT_BOT_USER_ID,
        bot_name: str = "impbot",
        application_id: int | None = None,
        guilds: Sequence[FakeGuild] = (),
        dms: Sequence[FakeChannel] = (),
        other_bots: Sequence[FakeBot] = (),
        privileged_intents: int = int(PRIVILEGED_INTENTS),
        bot_permissions: int = DEFAULT_BOT_PERMISSIONS,
        gateway_compression: bool = False,
        heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS,
        interaction_ack_deadline_s: float | None = INTERACTION_ACK_DEADLINE_S,
        max_guilds_per_shard: int = MAX_GUILDS_PER_SHARD,
        clock: Callable[[], float] = time.time,
        host: str = "127.0.0.1",
    ) -> None:
        self.bot = FakeBot(
            token=token,
            user=FakeUser(bot_user_id, bot_name, bot=True),
            # Bots made since 2019 have application id == bot user id.
            application_id=application_id if application_id is not None else bot_user_id,
            privileged_intents=privileged_intents,
            permissions=bot_permissions,
        )
        self.bots: tuple[FakeBot, ...] = (self.bot, *other_bots)
        if len({b.token for b in self.bots}) != len(self.bots):
            raise ValueError("every bot needs its own token")
        self.gateway_compression = gateway_compression
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.interaction_ack_deadline_s = interaction_ack_deadline_s
        self.max_guilds_per_shard = max_guilds_per_shard
        self.ack_heartbeats = True  # set False to play a zombie connection
        self.host = host
        self._clock = clock
        self._ids = _Snowflakes(clock)
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

        self._users: dict[int, FakeUser] = {}
        self._guilds: dict[int, _GuildState] = {}
        self._channels: dict[int, _ChannelState] = {}
        for bot in self.bots:
            self._users[bot.user.id] = bot.user
            self._users.setdefault(bot.owner.id, bot.owner)
        for guild in guilds:
            self._add_guild(guild)
        for dm in dms:
            self._add_dm(dm)

        self._messages: dict[int, MessageRecord] = {}
        self._attachments: dict[int, bytes] = {}
        self._nonces: dict[tuple[int, int, str], int] = {}  # (channel, author, nonce) -> message id
        self._interactions: dict[int, FakeInteraction] = {}
        self._interactions_by_token: dict[str, FakeInteraction] = {}
        self._responses: dict[int, list[InteractionResponse]] = {}
        self._commands: dict[tuple[int, int | None], list[dict[str, Any]]] = {}
        self._faults: list[_Fault] = []
        self._sessions: dict[str, _Session] = {}
        self._connections: set[_Connection] = set()
        self._route_table = self._routes()

        self._rest_calls: list[RestCall] = []
        self._typing: list[TypingCall] = []
        self.gateway_connects: list[GatewayConnect] = []
        self.identifies: list[Identify] = []
        self.resumes: list[Resume] = []
        self.presence_updates: list[PresenceUpdate] = []
        self.heartbeats = 0
        self.attachment_fetches: list[str] = []

        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # --- addresses --------------------------------------------------------------------------------------

    @property
    def token(self) -> str:
        return self.bot.token

    @property
    def bot_user(self) -> FakeUser:
        return self.bot.user

    @property
    def application_id(self) -> int:
        return self.bot.application_id

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def api_base(self) -> str:
        """What ``discord.http.Route.BASE`` (and ``IMPYARD_DISCORD_API_BASE``) should be."""
        return f"{self.base_url}{API_PREFIX}"

    @property
    def gateway_url(self) -> str:
        return f"ws://{self.host}:{self.port}/gateway"

    @property
    def resume_gateway_url(self) -> str:
        return f"ws://{self.host}:{self.port}/gateway/resume"

    def env(self) -> dict[str, str]:
        """Environment for a product process that talks to this fake."""
        return {"IMPYARD_DISCORD_API_BASE": self.api_base}

    # --- lifecycle --------------------------------------------------------------------------------------

    async def __aenter__(self) -> FakeDiscord:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Serve in the running event loop."""
        if self._runner is not None:
            raise RuntimeError("fake Discord already started")
        self._loop = asyncio.get_running_loop()
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_route("*", API_PREFIX + "{tail:/.*}", self._rest_entry)
        app.router.add_get("/gateway", self._gateway_entry)
        app.router.add_get("/gateway/resume", self._gateway_entry)
        app.router.add_get("/attachments/{channel_id}/{attachment_id}/{filename}", self._attachment_entry)
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_TIMEOUT_S
        )
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        try:
            await web.SockSite(runner, sock).start()
        except BaseException:
            sock.close()
            await runner.cleanup()
            raise
        self.port = sock.getsockname()[1]
        self._runner = runner

    async def stop(self) -> None:
        """Close every gateway connection (1001) and the server."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        with self._lock:
            conns = list(self._connections)
        for conn in conns:
            conn.closed_by_server = True
            self._send(conn, _Close(1001, "fake Discord stopping"))
        with contextlib.suppress(TimeoutError):
            await self.wait_for(lambda: not self._connections, timeout=SHUTDOWN_TIMEOUT_S)
        await runner.cleanup()

    def __enter__(self) -> FakeDiscord:
        """Serve on a thread of its own (for sync callers, e.g. a CLI under CliRunner)."""
        started = threading.Event()
        failure: list[BaseException] = []
        loop = asyncio.new_event_loop()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start())
            except BaseException as exc:  # handed to the caller below
                failure.append(exc)
                started.set()
                loop.close()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=serve, name="fake-discord", daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            self._thread.join()
            raise failure[0]
        return self

    def __exit__(self, *exc_info: object) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self.stop(), loop).result(timeout=SHUTDOWN_TIMEOUT_S * 3)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=SHUTDOWN_TIMEOUT_S * 3)
        self._thread = None

    @contextlib.contextmanager
    def patch_discord(self) -> Iterator[FakeDiscord]:
        """Point discord.py (REST ``Route.BASE`` and ``DiscordWebSocket.DEFAULT_GATEWAY``) here, and back after."""
        old_base = discord.http.Route.BASE
        old_gateway = discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
        discord.http.Route.BASE = self.api_base
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(self.gateway_url)
        try:
            yield self
        finally:
            discord.http.Route.BASE = old_base
            discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = old_gateway

    @contextlib.asynccontextmanager
    async def connected(
        self,
        client: discord.Client,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        guild_ready_timeout: float | None = 0.05,
    ) -> AsyncIterator[discord.Client]:
        """Log ``client`` in here, run it, and wait until it is ready with every guild cached; close it after.

        A login failure (``discord.LoginFailure``) is raised from ``async with``; a failure of the running
        connection (e.g. ``discord.PrivilegedIntentsRequired``) cancels the body and is raised after it.
        ``guild_ready_timeout`` replaces discord.py's 2 s wait after the last GUILD_CREATE (None keeps it).
        """
        with self.patch_discord():
            if guild_ready_timeout is not None:
                # discord.py has no public setter; it is a plain attribute of the connection state.
                client._connection.guild_ready_timeout = guild_ready_timeout
            try:
                await client.login(token if token is not None else self.token)
            except BaseException:
                await client.close()
                raise
            failure: list[BaseException] = []
            try:
                async with anyio.create_task_group() as tg:

                    async def run() -> None:
                        try:
                            await client.connect(reconnect=True)
                        except Exception as exc:  # raised to the caller once the body is unwound
                            failure.append(exc)
                            tg.cancel_scope.cancel()

                    tg.start_soon(run)
                    try:
                        with anyio.fail_after(timeout):
                            await self._until_ready(client)
                        yield client
                    finally:
                        with anyio.CancelScope(shield=True):
                            await client.close()
            except BaseExceptionGroup as group:
                # The task group wraps whatever the body raised; hand the test its own exception back.
                if len(group.exceptions) == 1:
                    raise group.exceptions[0] from None
                raise
            if failure:
                raise failure[0]

    async def _until_ready(self, client: discord.Client) -> None:
        await client.wait_until_ready()
        assert client.user is not None
        bot = self._bot_by_user_id(client.user.id)
        shard = (
            (client.shard_id, client.shard_count)
            if client.shard_id is not None and client.shard_count is not None
            else None
        )
        expected = {g for g in self._guilds if self._delivers(shard, g)} if bot is not None else set()
        # A GUILD_CREATE that lands after on_ready is announced as guild_available rather than folded in.
        while missing := {g for g in expected if client.get_guild(g) is None}:
            await client.wait_for("guild_available", check=lambda g, wanted=missing: g.id in wanted)

    # --- waiting ----------------------------------------------------------------------------------------

    async def wait_for(self, predicate: Callable[[], T], timeout: float = DEFAULT_WAIT_S) -> T:
        """Wait until ``predicate()`` (over this fake's records) is truthy, and return its value.

        It is re-checked whenever the fake records something; TimeoutError after ``timeout`` seconds.
        """
        loop = asyncio.get_running_loop()
        try:
            with anyio.fail_after(timeout):
                while True:
                    waiter = (loop, asyncio.Event())
                    with self._lock:
                        self._waiters.add(waiter)
                    try:
                        value = predicate()
                        if value:
                            return value
                        await waiter[1].wait()
                    finally:
                        with self._lock:
                            self._waiters.discard(waiter)
        except TimeoutError:
            raise TimeoutError(f"fake Discord: condition still false after {timeout} s") from None

    def wait_for_sync(self, predicate: Callable[[], T], timeout: float = DEFAULT_WAIT_S) -> T:
        """:meth:`wait_for` for a thread that is not running the fake's loop (thread mode)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                value = predicate()
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"fake Discord: condition still false after {timeout} s")
                self._changed.wait(left)

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()
            waiters = list(self._waiters)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # that loop has closed
                loop.call_soon_threadsafe(event.set)

    # --- accessors --------------------------------------------------------------------------------------

    @property
    def rest_calls(self) -> list[RestCall]:
        with self._lock:
            return list(self._rest_calls)

    def calls(self, method: str | None = None, path_pattern: str | None = None) -> list[RestCall]:
        """REST calls, filtered by method and an fnmatch pattern over the path (e.g. ``/channels/*/messages``)."""
        return [
            c
            for c in self.rest_calls
            if (method is None or c.method == method.upper())
            and (path_pattern is None or fnmatch.fnmatchcase(c.path, self._strip_prefix(path_pattern)))
        ]

    def messages(
        self, channel_id: int | None = None, *, bot_user_id: int | None = None
    ) -> list[MessageRecord]:
        """Messages bots created with POST /channels/{id}/messages (not deleted), oldest first."""
        with self._lock:
            return [
                m
                for m in self._messages.values()
                if m.source == "rest"
                and not m.deleted
                and (channel_id is None or m.channel_id == channel_id)
                and (bot_user_id is None or m.bot_user_id == bot_user_id)
            ]

    def all_messages(self, channel_id: int) -> list[MessageRecord]:
        """Everything visible in a channel: injected, bot-posted, and non-ephemeral interaction messages."""
        with self._lock:
            state = self._channels.get(channel_id)
            ids = state.message_ids if state else []
            return [self._messages[i] for i in ids if not self._messages[i].deleted]

    def message(self, message_id: int) -> MessageRecord:
        with self._lock:
            return self._messages[message_id]

    def typing_calls(self, channel_id: int | None = None) -> list[TypingCall]:
        with self._lock:
            return [t for t in self._typing if channel_id is None or t.channel_id == channel_id]

    def interaction(self, interaction_id: int | FakeInteraction) -> FakeInteraction:
        key = interaction_id.id if isinstance(interaction_id, FakeInteraction) else interaction_id
        with self._lock:
            return self._interactions[key]

    def interaction_responses(self, interaction_id: int | FakeInteraction) -> list[InteractionResponse]:
        key = interaction_id.id if isinstance(interaction_id, FakeInteraction) else interaction_id
        with self._lock:
            return list(self._responses.get(key, []))

    def commands(
        self, guild_id: int | None = None, *, application_id: int | None = None
    ) -> list[dict[str, Any]]:
        """Registered application commands: global (``guild_id=None``) or one guild's."""
        app = application_id if application_id is not None else self.application_id
        with self._lock:
            return copy.deepcopy(self._commands.get((app, guild_id), []))

    def command(
        self, name: str, guild_id: int | None = None, *, application_id: int | None = None
    ) -> dict[str, Any]:
        for cmd in self.commands(guild_id, application_id=application_id):
            if cmd["name"] == name:
                return cmd
        raise KeyError(f"no /{name} registered for guild {guild_id}")

    def channel(self, channel_id: int) -> FakeChannel:
        with self._lock:
            return self._channels[channel_id].config

    @property
    def sessions_connected(self) -> int:
        """Gateway sessions with a live, identified or resumed connection."""
        with self._lock:
            return sum(1 for s in self._sessions.values() if s.connection is not None)

    @property
    def recommended_shards(self) -> int:
        """What GET /gateway/bot recommends: about one shard per thousand guilds, at least one."""
        with self._lock:
            return max(1, -(-len(self._guilds) // GUILDS_PER_RECOMMENDED_SHARD))

    @property
    def shards_connected(self) -> list[tuple[int, int] | None]:
        """The shard of each session with a live connection (None: unsharded), sorted."""
        with self._lock:
            shards = [s.shard for s in self._sessions.values() if s.connection is not None]
        return sorted(shards, key=lambda shard: (-1, 0) if shard is None else shard)

    def _guilds_on(self, shard: tuple[int, int] | None) -> int:
        return sum(1 for guild_id in self._guilds if _on_shard(shard, guild_id))

    # --- configuration at runtime -----------------------------------------------------------------------

    def set_commands(
        self,
        commands: Sequence[Mapping[str, Any]],
        guild_id: int | None = None,
        *,
        application_id: int | None = None,
    ) -> list[dict[str, Any]]:
        """Register commands as if the bot had synced them (for tests that skip the sync)."""
        app = application_id if application_id is not None else self.application_id
        with self._lock:
            reply = self._put_commands(app, guild_id, list(commands))
        if reply.status != 200:
            raise ValueError(f"invalid commands: {reply.body}")
        self._notify()
        return reply.body

    def add_channel(self, channel: FakeChannel, guild_id: int | None = None) -> None:
        """Add a channel (or thread, or DM) and tell the bots (CHANNEL_CREATE / THREAD_CREATE)."""
        with self._lock:
            if channel.is_dm:
                state = self._add_dm(channel)
                self._notify()
                return
            if guild_id is None:
                raise ValueError("a guild channel needs guild_id")
            guild = self._guilds.get(guild_id)
            if guild is None:
                raise ValueError(f"fake Discord has no guild {guild_id}")
            self._check_channel(guild, channel)
            state = _ChannelState(channel, guild_id)
            self._channels[channel.id] = state
            event = "THREAD_CREATE" if channel.type in THREAD_TYPES else "CHANNEL_CREATE"
            payload = self._channel_payload(state)
            if channel.type in THREAD_TYPES:
                payload["newly_created"] = True

            def shape(session: _Session) -> dict[str, Any] | None:
                # Like Discord: a thread is announced only to those who can see it (a private one: its members).
                if channel.type in THREAD_TYPES and not self._can_view(state, session.bot.user.id):
                    return None
                return payload

            self._dispatch_all(event, shape, guild_id=guild_id)
        self._notify()

    def update_channel(self, channel_id: int, *, overwrites: Sequence[Overwrite] | None = None,
                       name: str | None = None) -> None:  # fmt: skip
        """Change a guild channel's permission overwrites (or name) and tell the bots (CHANNEL_UPDATE), as a
        server admin's edit in Discord does."""
        with self._lock:
            state = self._channel_state(channel_id)
            if state.guild_id is None or state.config.type in THREAD_TYPES:
                raise ValueError(f"channel {channel_id} is not a guild channel with overwrites of its own")
            changed = replace(
                state.config,
                overwrites=tuple(overwrites) if overwrites is not None else state.config.overwrites,
                name=name if name is not None else state.config.name,
            )
            self._check_channel(self._guilds[state.guild_id], changed)
            state.config = changed
            payload = self._channel_payload(state)
            self._dispatch_all("CHANNEL_UPDATE", lambda _s: payload, guild_id=state.guild_id)
        self._notify()

    def permissions_in(self, channel_id: int, who: FakeUser | FakeMember | int) -> int:
        """``who``'s permission bits in a guild channel or thread, worked out as Discord does (0: cannot see it)."""
        user_id = _user_of(who).id if isinstance(who, FakeUser | FakeMember) else int(who)
        with self._lock:
            state = self._channel_state(channel_id)
            return self._channel_permissions(state, user_id)

    def can_view(self, channel_id: int, who: FakeUser | FakeMember | int) -> bool:
        return bool(self.permissions_in(channel_id, who) & Perm.VIEW_CHANNEL)

    def fail_next(
        self,
        method: str,
        path_pattern: str,
        status: int = 429,
        *,
        retry_after: float = 0.2,
        global_: bool = False,
        times: int = 1,
        body: Any = None,
        delay_s: float = 0.0,
    ) -> None:
        """Answer the next ``times`` matching REST calls with ``status`` (a Discord-shaped 429 by default).

        ``method`` may be ``"*"``; ``path_pattern`` is an fnmatch pattern over the path below /api/v10.
        Note discord.py sleeps 1 s, 3 s... before retrying a 500/502/504.
        """
        with self._lock:
            self._faults.append(
                _Fault(
                    method.upper(),
                    self._strip_prefix(path_pattern),
                    status,
                    times,
                    delay_s,
                    retry_after,
                    global_,
                    body,
                )
            )

    def delay_next(self, method: str, path_pattern: str, delay_s: float, *, times: int = 1) -> None:
        """Hold the next matching REST calls for ``delay_s`` before answering them normally."""
        with self._lock:
            self._faults.append(
                _Fault(method.upper(), self._strip_prefix(path_pattern), None, times, delay_s)
            )

    # --- misrouting: every event to every shard (issue 36) ----------------------------------------------

    _broadcasting = False  # off: events go by Discord's shard rule (``_on_shard``)

    def broadcast_to_every_shard(self, on: bool = True) -> None:
        """Play a gateway that ignores sharding (issue 36): from now on every session — whatever its shard — gets
        every guild in READY and GUILD_CREATE, every guild's message and channel events, and its bot's DM events;
        what Discord would send to one shard only. An interaction still goes to one session (Discord's rule:
        ``_create_interaction``), and the 4011 guild limit still counts the shard's own guilds."""
        with self._lock:
            self._broadcasting = on

    def _delivers(self, shard: tuple[int, int] | None, guild_id: int | None) -> bool:
        """Whether a session of ``shard`` gets the events of ``guild_id`` (None: no guild): Discord's rule, unless
        broadcasting."""
        return self._broadcasting or _on_shard(shard, guild_id)

    # --- injection: gateway -----------------------------------------------------------------------------

    def post_message(
        self,
        channel_id: int,
        author: FakeUser | FakeMember | int,
        content: str = "",
        *,
        mentions: Sequence[FakeUser | FakeMember | int] | None = None,
        mention_roles: Sequence[FakeRole | int] | None = None,
        mention_everyone: bool | None = None,
        referenced_message: int | MessageRecord | None = None,
        attachments: Sequence[FakeAttachment] = (),
        embeds: Sequence[Mapping[str, Any]] = (),
        webhook_id: int | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> MessageRecord:
        """A user (or another bot) posts a message: stored, and dispatched as MESSAGE_CREATE.

        Mentions not given are worked out from ``content`` as Discord does (``<@id>``, ``<@&id>``,
        ``@everyone``/``@here``); a reply's referenced message comes from the store.
        """
        with self._lock:
            state = self._channel_state(channel_id)
            user = self._resolve_user(author)
            guild = self._guilds.get(state.guild_id) if state.guild_id is not None else None
            if guild is not None and user.id in guild.members and not self._can_view(state, user.id):
                raise ValueError(f"{user.username} cannot see channel {channel_id}, so cannot post in it")
            self._users.setdefault(user.id, user)
            derived_users, derived_roles, derived_everyone = self._derive_mentions(state, content, None)
            mention_users = derived_users if mentions is None else [self._resolve_user(m) for m in mentions]
            role_ids = (
                derived_roles
                if mention_roles is None
                else [r.id if isinstance(r, FakeRole) else int(r) for r in mention_roles]
            )
            message_id = self._ids.next()
            payload = self._message_payload(
                message_id,
                state,
                user,
                content=content,
                mentions=mention_users,
                mention_roles=role_ids,
                mention_everyone=derived_everyone if mention_everyone is None else mention_everyone,
                embeds=[dict(e) for e in embeds],
                attachments=[self._store_attachment(state, a) for a in attachments],
            )
            if referenced_message is not None:
                ref_id = (
                    referenced_message.id
                    if isinstance(referenced_message, MessageRecord)
                    else referenced_message
                )
                self._attach_reference(payload, state, {"message_id": ref_id})
            if webhook_id is not None:
                payload["webhook_id"] = str(webhook_id)
            if extra:
                payload.update(extra)
            record = MessageRecord(payload=payload, guild_id=state.guild_id, source="injected")
            self._store_message(record)
            self._dispatch_message("MESSAGE_CREATE", record)
        self._notify()
        return record

    def invoke_command(
        self,
        name: str,
        options: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        *,
        user: FakeUser | FakeMember | int,
        channel_id: int,
        guild_id: int | None = None,
        member_permissions: int | None = None,
        application_id: int | None = None,
        locale: str = "en-US",
        require_registered: bool = True,
    ) -> FakeInteraction:
        """A user runs a slash command; dispatched as INTERACTION_CREATE to the application's bot.

        ``name`` is the full path, e.g. ``"channel mode"`` or ``"approvals list"`` (group + subcommand
        when three words). ``options`` maps option names to values (types taken from the registered
        command, else from the Python type); a list is passed through as raw Discord options. The
        command must be registered (synced) unless ``require_registered=False``. Values outside an
        option's choices are sent as given (Discord's client would not; a forged request could).
        ``member_permissions`` overrides the invoker's computed permissions.
        """
        with self._lock:
            bot = self._bot_for_application(application_id)
            state = self._channel_state(channel_id)
            if guild_id is not None and guild_id != state.guild_id:
                raise ValueError(f"channel {channel_id} is not in guild {guild_id}")
            path = name.strip().lstrip("/").split()
            if not 1 <= len(path) <= 3:
                raise ValueError(f"bad command path {name!r}")
            registered = self._find_command(bot.application_id, path[0], state.guild_id)
            if registered is None and require_registered:
                raise LookupError(
                    f"/{path[0]} is not registered for application {bot.application_id} "
                    f"(globally or in guild {state.guild_id}); sync the command tree or call set_commands()"
                )
            schema: list[dict[str, Any]] = registered.get("options", []) if registered else []
            for sub in path[1:]:
                spec = next((o for o in schema if o.get("name") == sub), None)
                if spec is None and registered is not None and require_registered:
                    raise LookupError(f"/{name} has no subcommand {sub!r}")
                schema = spec.get("options", []) if spec else []
            resolved: dict[str, dict[str, Any]] = {}
            leaf = self._build_options(options, schema, resolved, state)
            if len(path) == 3:
                wrapped = [
                    {
                        "type": OPTION_SUB_COMMAND_GROUP,
                        "name": path[1],
                        "options": [{"type": OPTION_SUB_COMMAND, "name": path[2], "options": leaf}],
                    }
                ]
            elif len(path) == 2:
                wrapped = [{"type": OPTION_SUB_COMMAND, "name": path[1], "options": leaf}]
            else:
                wrapped = leaf
            data: dict[str, Any] = {
                "id": registered["id"] if registered else str(self._ids.next()),
                "name": path[0],
                "type": 1,
                "options": wrapped,
            }
            if registered and registered.get("guild_id"):
                data["guild_id"] = registered["guild_id"]
            if resolved:
                data["resolved"] = resolved
            interaction = self._create_interaction(
                bot, INTERACTION_APPLICATION_COMMAND, data, user, state, member_permissions, locale
            )
        self._notify()
        return interaction

    def click_button(
        self,
        message_id: int,
        custom_id: str,
        *,
        user: FakeUser | FakeMember | int,
        member_permissions: int | None = None,
        values: Sequence[str] | None = None,
        locale: str = "en-US",
    ) -> FakeInteraction:
        """A user clicks a button (or picks ``values`` in a select) on a message a bot posted.

        Dispatched as INTERACTION_CREATE (type 3) to the bot that posted the message; the component must be
        on the message.
        """
        with self._lock:
            record = self._messages.get(message_id)
            if record is None or record.deleted:
                raise LookupError(f"no message {message_id}")
            component = self._find_component(record.components, custom_id)
            if component is None:
                raise LookupError(f"message {message_id} has no component {custom_id!r}")
            bot = self._bot_by_user_id(record.author_id)
            if bot is None:
                raise LookupError(f"message {message_id} was not posted by a bot of this fake")
            state = self._channels[record.channel_id]
            data: dict[str, Any] = {
                "custom_id": custom_id,
                "component_type": component.get("type", COMPONENT_BUTTON),
            }
            if component.get("id") is not None:
                data["id"] = component["id"]
            if values is not None:
                data["values"] = list(values)
            interaction = self._create_interaction(
                bot,
                INTERACTION_MESSAGE_COMPONENT,
                data,
                user,
                state,
                member_permissions,
                locale,
                message=record,
            )
        self._notify()
        return interaction

    def delete_message(self, message_id: int) -> MessageRecord:
        """A user deletes a message (their own, or as a moderator): marked deleted, dispatched as
        MESSAGE_DELETE (id, channel_id, guild_id) to the bots that see the channel, as Discord does.
        Discord's event does not say who deleted it, and neither does this."""
        with self._lock:
            record = self._messages.get(message_id)
            if record is None or record.deleted:
                raise LookupError(f"no message {message_id}")
            self._mark_deleted(record)
        self._notify()
        return record

    def dispatch(self, event: str, data: Mapping[str, Any], *, bot_user_id: int | None = None) -> None:
        """Send a raw DISPATCH to every session (or one bot's) — for events this fake does not model.

        Like Discord, a sharded session gets it only when its ``guild_id`` is on its shard, or, without
        a ``guild_id``, when it is shard 0.
        """
        guild_id = _as_int(data.get("guild_id"))
        with self._lock:
            for session in list(self._sessions.values()):
                if (bot_user_id is None or session.bot.user.id == bot_user_id) and self._delivers(
                    session.shard, guild_id
                ):
                    self._dispatch_to(session, event, copy.deepcopy(dict(data)))
        self._notify()

    def drop_connection(
        self, code: int = CLOSE_UNKNOWN_ERROR, *, bot_user_id: int | None = None, resumable: bool = True
    ) -> int:
        """Close live gateway connections with ``code`` (4000: discord.py reconnects and RESUMEs).

        Events dispatched meanwhile are kept and replayed on RESUME. ``resumable=False`` answers the
        RESUME with INVALID_SESSION, so discord.py identifies afresh. Returns how many were closed.
        """
        with self._lock:
            dropped = 0
            for session in list(self._sessions.values()):
                if bot_user_id is not None and session.bot.user.id != bot_user_id:
                    continue
                if not resumable:
                    session.resumable = False
                conn = session.connection
                if conn is not None:
                    conn.closed_by_server = True
                    session.connection = None
                    self._send(conn, _Close(code, "dropped by fake Discord"))
                    dropped += 1
        self._notify()
        return dropped

    def request_reconnect(self, *, bot_user_id: int | None = None) -> None:
        """Send op 7 RECONNECT: discord.py closes and RESUMEs."""
        with self._lock:
            for session in self._sessions.values():
                if session.connection is not None and (
                    bot_user_id is None or session.bot.user.id == bot_user_id
                ):
                    self._send(session.connection, {"op": _Op.RECONNECT, "d": None, "s": None, "t": None})

    def invalidate_session(self, *, resumable: bool = False, bot_user_id: int | None = None) -> None:
        """Send op 9 INVALID_SESSION; with ``resumable=False`` discord.py drops the session and identifies."""
        with self._lock:
            for session in list(self._sessions.values()):
                if session.connection is None or (
                    bot_user_id is not None and session.bot.user.id != bot_user_id
                ):
                    continue
                if not resumable:
                    session.resumable = False
                self._send(
                    session.connection, {"op": _Op.INVALID_SESSION, "d": resumable, "s": None, "t": None}
                )

    # --- REST plumbing ----------------------------------------------------------------------------------

    def _routes(self) -> list[tuple[str, re.Pattern[str], Callable[..., _Reply], bool]]:
        app = r"/applications/(?P<application_id>\d+)"
        hook = r"/webhooks/(?P<application_id>\d+)/(?P<token>[^/]+)"
        msg = r"/channels/(?P<channel_id>\d+)/messages/(?P<message_id>\d+)"
        table: list[tuple[str, str, Callable[..., _Reply], bool]] = [
            ("GET", r"/users/@me", self._get_me, True),
            ("GET", r"/users/(?P<user_id>\d+)", self._get_user, True),
            ("POST", r"/users/@me/channels", self._create_dm, True),
            ("GET", r"/applications/@me", self._get_application, True),
            ("GET", r"/oauth2/applications/@me", self._get_application, True),  # what discord.py's login asks
            ("GET", r"/gateway", self._get_gateway, False),
            ("GET", r"/gateway/bot", self._get_gateway_bot, True),
            ("GET", r"/channels/(?P<channel_id>\d+)", self._get_channel, True),
            ("GET", r"/channels/(?P<channel_id>\d+)/messages", self._get_history, True),
            ("POST", r"/channels/(?P<channel_id>\d+)/messages", self._create_message, True),
            ("GET", msg, self._get_message, True),
            ("PATCH", msg, self._edit_message, True),
            ("DELETE", msg, self._delete_message, True),
            ("PUT", msg + r"/reactions/(?P<emoji>[^/]+)/@me", self._no_content, True),
            ("DELETE", msg + r"/reactions/(?P<emoji>[^/]+)/@me", self._no_content, True),
            ("POST", r"/channels/(?P<channel_id>\d+)/typing", self._typing_call, True),
            (
                "POST",
                r"/interactions/(?P<interaction_id>\d+)/(?P<token>[^/]+)/callback",
                self._callback,
                False,
            ),
            ("GET", hook + r"/messages/(?P<message_id>@original|\d+)", self._get_webhook_message, False),
            ("PATCH", hook + r"/messages/(?P<message_id>@original|\d+)", self._edit_webhook_message, False),
            (
                "DELETE",
                hook + r"/messages/(?P<message_id>@original|\d+)",
                self._delete_webhook_message,
                False,
            ),
            ("POST", hook, self._followup, False),
            ("GET", app + r"/commands", self._list_commands, True),
            ("PUT", app + r"/commands", self._bulk_commands, True),
            ("POST", app + r"/commands", self._upsert_command, True),
            ("GET", app + r"/commands/(?P<command_id>\d+)", self._get_command, True),
            ("PATCH", app + r"/commands/(?P<command_id>\d+)", self._patch_command, True),
            ("DELETE", app + r"/commands/(?P<command_id>\d+)", self._delete_command, True),
            ("GET", app + r"/guilds/(?P<guild_id>\d+)/commands", self._list_commands, True),
            ("PUT", app + r"/guilds/(?P<guild_id>\d+)/commands", self._bulk_commands, True),
            ("POST", app + r"/guilds/(?P<guild_id>\d+)/commands", self._upsert_command, True),
            ("GET", app + r"/guilds/(?P<guild_id>\d+)/commands/(?P<command_id>\d+)", self._get_command, True),
            (
                "PATCH",
                app + r"/guilds/(?P<guild_id>\d+)/commands/(?P<command_id>\d+)",
                self._patch_command,
                True,
            ),
            (
                "DELETE",
                app + r"/guilds/(?P<guild_id>\d+)/commands/(?P<command_id>\d+)",
                self._delete_command,
                True,
            ),
            ("GET", r"/guilds/(?P<guild_id>\d+)", self._get_guild, True),
            ("GET", r"/guilds/(?P<guild_id>\d+)/channels", self._get_guild_channels, True),
            ("GET", r"/guilds/(?P<guild_id>\d+)/roles", self._get_guild_roles, True),
            ("GET", r"/guilds/(?P<guild_id>\d+)/members/(?P<user_id>\d+)", self._get_guild_member, True),
        ]
        return [(m, re.compile(p), h, auth) for m, p, h, auth in table]

    @staticmethod
    def _strip_prefix(path: str) -> str:
        return path[len(API_PREFIX) :] if path.startswith(API_PREFIX) else path

    def _bot_for_auth(self, header: str | None) -> FakeBot | None:
        if not header or not header.startswith("Bot "):
            return None
        token = header[len("Bot ") :]
        return next((b for b in self.bots if b.token == token), None)

    def _take_fault(self, method: str, path: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if (
                    fault.times > 0
                    and fault.method in ("*", method)
                    and fnmatch.fnmatchcase(path, fault.path_pattern)
                ):
                    fault.times -= 1
                    if fault.times == 0:
                        self._faults.remove(fault)
                    return fault
        return None

    async def _read_body(self, request: web.Request) -> tuple[Any, tuple[FormPart, ...], _Reply | None]:
        if request.content_type.startswith("multipart/"):
            parts: list[FormPart] = []
            reader = await request.multipart()
            async for part in reader:
                if not isinstance(part, BodyPartReader):
                    continue  # nested multipart: Discord does not take it either
                data = bytes(await part.read(decode=False))
                parts.append(FormPart(part.name or "", part.filename, part.headers.get("Content-Type"), data))
            payload = next((p for p in parts if p.name == "payload_json"), None)
            try:
                body = json.loads(payload.data) if payload else {}
            except ValueError:
                return None, tuple(parts), _error(400, 50109, "The request body contains invalid JSON.")
            return body, tuple(parts), None
        raw = await request.read()
        if not raw:
            return None, (), None
        try:
            return json.loads(raw), (), None
        except ValueError:
            return None, (), _error(400, 50109, "The request body contains invalid JSON.")

    async def _rest_entry(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        path = self._strip_prefix(request.path)
        method = request.method.upper()
        auth_header = request.headers.get("Authorization")
        bot = self._bot_for_auth(auth_header)
        body, parts, bad_body = await self._read_body(request)
        fault = self._take_fault(method, path)
        if fault is not None and fault.delay_s > 0:
            await asyncio.sleep(fault.delay_s)
        if fault is not None and fault.status is not None:
            reply = self._fault_reply(fault, path)
        elif bad_body is not None:
            reply = bad_body
        else:
            with self._lock:
                reply = self._route(method, path, bot, body, parts, dict(request.query))
        call = RestCall(
            method=method,
            path=path,
            query=dict(request.query),
            headers={k: v for k, v in request.headers.items() if k.lower() != "authorization"},
            auth_present=auth_header is not None,
            auth_valid=bot is not None,
            bot_user_id=bot.user.id if bot else None,
            body=body,
            parts=parts,
            status=reply.status,
            response=reply.body,
            at=arrived,
        )
        with self._lock:
            self._rest_calls.append(call)
        self._notify()
        if reply.status == 204:
            return web.Response(status=204, headers=dict(reply.headers))
        # discord.py parses JSON only when Content-Type is exactly "application/json" (no charset).
        headers = {"Content-Type": "application/json", **reply.headers}
        return web.Response(status=reply.status, body=json.dumps(reply.body).encode(), headers=headers)

    def _fault_reply(self, fault: _Fault, path: str) -> _Reply:
        status = fault.status or 500
        if status != 429:
            body = (
                fault.body
                if fault.body is not None
                else {"message": f"{status}: injected by fake Discord", "code": 0}
            )
            return _Reply(status, body)
        retry = fault.retry_after
        body = (
            fault.body
            if fault.body is not None
            else {
                "message": "You are being rate limited.",
                "retry_after": retry,
                "global": fault.global_,
            }
        )
        headers = {
            "Via": "1.1 google",  # without it discord.py takes a 429 for a Cloudflare ban and gives up
            "Retry-After": str(max(1, round(retry))),
            "X-RateLimit-Limit": "5",
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Reset": f"{time.time() + retry:.3f}",
            "X-RateLimit-Reset-After": f"{retry:.3f}",
            "X-RateLimit-Bucket": f"fake-{abs(hash(re.sub(r'[0-9]+', 'N', path))) % 10**8:08d}",
            "X-RateLimit-Scope": "global" if fault.global_ else "user",
        }
        if fault.global_:
            headers["X-RateLimit-Global"] = "true"
        return _Reply(429, body, headers)

    def _route(
        self,
        method: str,
        path: str,
        bot: FakeBot | None,
        body: Any,
        parts: tuple[FormPart, ...],
        query: dict[str, str],
    ) -> _Reply:
        allowed = False
        for route_method, pattern, handler, needs_auth in self._route_table:
            match = pattern.fullmatch(path)
            if match is None:
                continue
            allowed = True
            if route_method != method:
                continue
            if needs_auth and bot is None:
                return _UNAUTHORIZED
            ctx = _Ctx(bot=bot, body=body if body is not None else {}, parts=parts, query=query)
            return handler(ctx, **match.groupdict())
        if allowed:
            return _Reply(405, {"message": "405: Method Not Allowed", "code": 0})
        return _NOT_FOUND

    async def _attachment_entry(self, request: web.Request) -> web.StreamResponse:
        attachment_id = _as_int(request.match_info["attachment_id"])
        with self._lock:
            self.attachment_fetches.append(request.path)
            data = self._attachments.get(attachment_id) if attachment_id is not None else None
        self._notify()
        if data is None:
            return web.Response(status=404, text="not found")
        ctype = mimetypes.guess_type(request.match_info["filename"])[0] or "application/octet-stream"
        return web.Response(body=data, headers={"Content-Type": ctype})

    # --- REST handlers (run under self._lock) -------------------------------------------------------------

    def _no_content(self, ctx: _Ctx, **_: str) -> _Reply:
        return _NO_CONTENT

    def _get_me(self, ctx: _Ctx) -> _Reply:
        assert ctx.bot is not None
        return _Reply(
            200,
            {
                **ctx.bot.user.payload(),
                "verified": True,
                "mfa_enabled": False,
                "locale": "en-US",
                "email": None,
                "bio": "",
            },
        )

    def _get_user(self, ctx: _Ctx, user_id: str) -> _Reply:
        user = self._users.get(int(user_id))
        return _Reply(200, user.payload()) if user else _unknown("User", 10013)

    @staticmethod
    def _app_flags(bot: FakeBot) -> int:
        return (
            (APP_FLAG_GATEWAY_PRESENCE if bot.privileged_intents & Intent.GUILD_PRESENCES else 0)
            | (APP_FLAG_GATEWAY_GUILD_MEMBERS if bot.privileged_intents & Intent.GUILD_MEMBERS else 0)
            | (APP_FLAG_GATEWAY_MESSAGE_CONTENT if bot.privileged_intents & Intent.MESSAGE_CONTENT else 0)
        )

    def _get_application(self, ctx: _Ctx) -> _Reply:
        bot = ctx.bot
        assert bot is not None
        flags = self._app_flags(bot)
        return _Reply(
            200,
            {
                "id": str(bot.application_id),
                "name": bot.user.username,
                "icon": None,
                "description": "",
                "summary": "",
                "type": None,
                "hook": True,
                "bot_public": True,
                "bot_require_code_grant": False,
                "verify_key": "0" * 64,
                "owner": bot.owner.payload(),
                "team": None,
                "flags": flags,
                "bot": bot.user.payload(),
                "redirect_uris": [],
                "interactions_endpoint_url": None,
                "approximate_guild_count": len(self._guilds),
                "tags": [],
            },
        )

    def _get_gateway(self, ctx: _Ctx) -> _Reply:
        return _Reply(200, {"url": self.gateway_url})

    def _get_gateway_bot(self, ctx: _Ctx) -> _Reply:
        return _Reply(
            200,
            {
                "url": self.gateway_url,
                "shards": self.recommended_shards,
                "session_start_limit": {
                    "total": 1000,
                    "remaining": 999,
                    "reset_after": 14_400_000,
                    "max_concurrency": 1,
                },
            },
        )

    def _visible_channel(self, ctx: _Ctx, channel_id: str) -> _ChannelState | None:
        state = self._channels.get(int(channel_id))
        if state is None or ctx.bot is None:
            return None
        if state.config.is_dm and self._dm_bot_id(state) != ctx.bot.user.id:
            return None
        return state

    def _missing_access(self, ctx: _Ctx, state: _ChannelState) -> _Reply | None:
        """Discord's answer to a bot's call into a guild channel it cannot see: 403, Missing Access (50001)."""
        if state.guild_id is None or ctx.bot is None or self._can_view(state, ctx.bot.user.id):
            return None
        return _error(403, 50001, "Missing Access")

    def _get_channel(self, ctx: _Ctx, channel_id: str) -> _Reply:
        state = self._visible_channel(ctx, channel_id)
        if state is None:
            return _unknown("Channel", 10003)
        return self._missing_access(ctx, state) or _Reply(200, self._channel_payload(state))

    def _create_dm(self, ctx: _Ctx) -> _Reply:
        assert ctx.bot is not None
        recipient = self._users.get(_as_int(ctx.body.get("recipient_id")) or 0)
        if recipient is None:
            return _form_error(["recipient_id"], "NUMBER_TYPE_COERCE", "Value is not snowflake.")
        for state in self._channels.values():
            if (
                state.config.is_dm
                and state.config.recipient == recipient
                and self._dm_bot_id(state) == ctx.bot.user.id
            ):
                return _Reply(200, self._channel_payload(state))
        state = self._add_dm(FakeChannel.dm(self._ids.next(), recipient, bot_user_id=ctx.bot.user.id))
        return _Reply(200, self._channel_payload(state))

    def _get_history(self, ctx: _Ctx, channel_id: str) -> _Reply:
        state = self._visible_channel(ctx, channel_id)
        if state is None:
            return _unknown("Channel", 10003)
        if (refused := self._missing_access(ctx, state)) is not None:
            return refused
        limit, refused = self._history_query(ctx)
        if refused is not None:
            return refused
        ids = [i for i in state.message_ids if not self._messages[i].deleted]
        before, after, around = (_as_int(ctx.query.get(k)) for k in ("before", "after", "around"))
        if before is not None:
            picked = [i for i in ids if i < before][-limit:]
        elif after is not None:
            picked = [i for i in ids if i > after][:limit]
        elif around is not None:
            older = [i for i in ids if i <= around][-(limit // 2 + limit % 2) :]
            newer = [i for i in ids if i > around][: limit // 2]
            picked = older + newer
        else:
            picked = ids[-limit:]
        return _Reply(200, [copy.deepcopy(self._messages[i].payload) for i in reversed(picked)])

    # --- message history: the query as Discord checks it (issue 36: a host reads back what it missed) -----

    @staticmethod
    def _history_query(ctx: _Ctx) -> tuple[int, _Reply | None]:
        """GET /channels/{id}/messages: ``limit`` is 1 to 100 (50 when absent), ``before``/``after``/``around``
        snowflakes; Discord refuses anything else with 50035 Invalid Form Body rather than clamping it."""
        for key in ("before", "after", "around"):
            raw = ctx.query.get(key)
            if raw is not None and not (raw.isdigit() and int(raw) < 2**64):
                return 0, _form_error([key], "NUMBER_TYPE_COERCE", f'Value "{raw}" is not snowflake.')
        raw = ctx.query.get("limit")
        if raw is None:
            return 50, None
        limit = _as_int(raw)
        if limit is None:
            return 0, _form_error(["limit"], "NUMBER_TYPE_COERCE", f'Value "{raw}" is not int.')
        if limit < 1:
            return 0, _form_error(
                ["limit"], "NUMBER_TYPE_MIN", "int value should be greater than or equal to 1."
            )
        if limit > 100:
            return 0, _form_error(
                ["limit"], "NUMBER_TYPE_MAX", "int value should be less than or equal to 100."
            )
        return limit, None

    def _get_message(self, ctx: _Ctx, channel_id: str, message_id: str) -> _Reply:
        state = self._visible_channel(ctx, channel_id)
        if state is None:
            return _unknown("Channel", 10003)
        if (refused := self._missing_access(ctx, state)) is not None:
            return refused
        record = self._messages.get(int(message_id))
        if record is None or record.deleted or record.ephemeral or record.channel_id != state.id:
            return _unknown("Message", 10008)
        return _Reply(200, copy.deepcopy(record.payload))

    def _create_message(self, ctx: _Ctx, channel_id: str) -> _Reply:
        bot = ctx.bot
        assert bot is not None
        state = self._visible_channel(ctx, channel_id)
        if state is None:
            return _unknown("Channel", 10003)
        if (refused := self._missing_access(ctx, state)) is not None:
            return refused
        nonce = ctx.body.get("nonce")
        if nonce is not None and ctx.body.get("enforce_nonce"):
            seen = self._nonces.get((state.id, bot.user.id, str(nonce)))
            if seen is not None:  # Discord answers a repeated nonce with the message it already made
                return _Reply(200, copy.deepcopy(self._messages[seen].payload))
        built = self._build_bot_message(ctx, state, source="rest")
        if isinstance(built, _Reply):
            return built
        if nonce is not None:
            built.payload["nonce"] = nonce
            self._nonces[(state.id, bot.user.id, str(nonce))] = built.id
        self._store_message(built)
        self._dispatch_message("MESSAGE_CREATE", built)
        return _Reply(200, copy.deepcopy(built.payload))

    def _edit_message(self, ctx: _Ctx, channel_id: str, message_id: str) -> _Reply:
        assert ctx.bot is not None
        state = self._visible_channel(ctx, channel_id)
        record = self._messages.get(int(message_id))
        if state is None:
            return _unknown("Channel", 10003)
        if record is None or record.deleted or record.channel_id != state.id:
            return _unknown("Message", 10008)
        if record.author_id != ctx.bot.user.id:
            return _error(403, 50005, "Cannot edit a message authored by another user")
        return self._apply_edit(ctx, record)

    def _delete_message(self, ctx: _Ctx, channel_id: str, message_id: str) -> _Reply:
        state = self._visible_channel(ctx, channel_id)
        record = self._messages.get(int(message_id))
        if state is None:
            return _unknown("Channel", 10003)
        if record is None or record.deleted or record.channel_id != state.id:
            return _unknown("Message", 10008)
        self._mark_deleted(record)
        return _NO_CONTENT

    def _typing_call(self, ctx: _Ctx, channel_id: str) -> _Reply:
        state = self._visible_channel(ctx, channel_id)
        if state is None:
            return _unknown("Channel", 10003)
        if (refused := self._missing_access(ctx, state)) is not None:
            return refused
        self._typing.append(TypingCall(state.id, ctx.bot.user.id if ctx.bot else None, time.monotonic()))
        return _NO_CONTENT

    def _get_guild(self, ctx: _Ctx, guild_id: str) -> _Reply:
        guild = self._guilds.get(int(guild_id))
        return _Reply(200, self._guild_payload(guild)) if guild else _unknown("Guild", 10004)

    def _get_guild_channels(self, ctx: _Ctx, guild_id: str) -> _Reply:
        gid = int(guild_id)
        if gid not in self._guilds:
            return _unknown("Guild", 10004)
        return _Reply(
            200,
            [
                self._channel_payload(s)
                for s in self._channels.values()
                if s.guild_id == gid and s.config.type not in THREAD_TYPES
            ],
        )

    def _get_guild_roles(self, ctx: _Ctx, guild_id: str) -> _Reply:
        guild = self._guilds.get(int(guild_id))
        return _Reply(200, [r.payload() for r in guild.roles.values()]) if guild else _unknown("Guild", 10004)

    def _get_guild_member(self, ctx: _Ctx, guild_id: str, user_id: str) -> _Reply:
        guild = self._guilds.get(int(guild_id))
        if guild is None:
            return _unknown("Guild", 10004)
        found = guild.members.get(int(user_id))
        return _Reply(200, self._member_payload(guild, found)) if found else _unknown("Member", 10007)

    # --- application commands ---------------------------------------------------------------------------

    def _command_scope(
        self, ctx: _Ctx, application_id: str, guild_id: str | None
    ) -> tuple[int, int | None] | _Reply:
        assert ctx.bot is not None
        app = int(application_id)
        if app != ctx.bot.application_id:
            return _error(403, 50001, "Missing Access")
        gid = int(guild_id) if guild_id is not None else None
        if gid is not None and gid not in self._guilds:
            return _error(403, 50001, "Missing Access")
        return app, gid

    def _list_commands(self, ctx: _Ctx, application_id: str, guild_id: str | None = None) -> _Reply:
        scope = self._command_scope(ctx, application_id, guild_id)
        if isinstance(scope, _Reply):
            return scope
        return _Reply(200, copy.deepcopy(self._commands.get(scope, [])))

    def _bulk_commands(self, ctx: _Ctx, application_id: str, guild_id: str | None = None) -> _Reply:
        scope = self._command_scope(ctx, application_id, guild_id)
        if isinstance(scope, _Reply):
            return scope
        if not isinstance(ctx.body, list):
            return _form_error([], "LIST_TYPE_CONVERT", "Must be an array.")
        return self._put_commands(scope[0], scope[1], ctx.body)

    def _put_commands(self, app: int, guild_id: int | None, payloads: list[Any]) -> _Reply:
        problem = self._validate_commands(payloads)
        if problem is not None:
            return problem
        existing = {(c["name"], c.get("type", 1)): c for c in self._commands.get((app, guild_id), [])}
        stored = []
        for payload in payloads:
            old = existing.get((payload["name"], payload.get("type", 1)))
            stored.append(self._command_object(app, guild_id, payload, old["id"] if old else None))
        self._commands[(app, guild_id)] = stored
        return _Reply(200, copy.deepcopy(stored))

    def _upsert_command(self, ctx: _Ctx, application_id: str, guild_id: str | None = None) -> _Reply:
        scope = self._command_scope(ctx, application_id, guild_id)
        if isinstance(scope, _Reply):
            return scope
        problem = self._validate_commands([ctx.body])
        if problem is not None:
            return problem
        commands = self._commands.setdefault(scope, [])
        key = (ctx.body["name"], ctx.body.get("type", 1))
        for index, old in enumerate(commands):
            if (old["name"], old.get("type", 1)) == key:
                commands[index] = self._command_object(scope[0], scope[1], ctx.body, old["id"])
                return _Reply(200, copy.deepcopy(commands[index]))
        commands.append(self._command_object(scope[0], scope[1], ctx.body, None))
        return _Reply(201, copy.deepcopy(commands[-1]))

    def _get_command(
        self, ctx: _Ctx, application_id: str, command_id: str, guild_id: str | None = None
    ) -> _Reply:
        scope = self._command_scope(ctx, application_id, guild_id)
        if isinstance(scope, _Reply):
            return scope
        for cmd in self._commands.get(scope, []):
            if cmd["id"] == command_id:
                return _Reply(200, copy.deepcopy(cmd))
        return _unknown("application command", 10063)

    def _patch_command(
        self, ctx: _Ctx, application_id: str, command_id: str, guild_id: str | None = None
    ) -> _Reply:
        scope = self._command_scope(ctx, application_id, guild_id)
        if isinstance(scope, _Reply):
            return scope
        commands = self._commands.get(scope, [])
        for index, cmd in enumerate(commands):
            if cmd["id"] == command_id:
                merged = {**cmd, **ctx.body}
                problem = self._validate_commands([merged])
                if problem is not None:
                    return problem
                commands[index] = self._command_object(scope[0], scope[1], merged, command_id)
                return _Reply(200, copy.deepcopy(commands[index]))
        return _unknown("application command", 10063)

    def _delete_command(
        self, ctx: _Ctx, application_id: str, command_id: str, guild_id: str | None = None
    ) -> _Reply:
        scope = self._command_scope(ctx, application_id, guild_id)
        if isinstance(scope, _Reply):
            return scope
        commands = self._commands.get(scope, [])
        for cmd in commands:
            if cmd["id"] == command_id:
                commands.remove(cmd)
                return _NO_CONTENT
        return _unknown("application command", 10063)

    def _command_object(
        self, app: int, guild_id: int | None, payload: Mapping[str, Any], command_id: str | None
    ) -> dict[str, Any]:
        obj = {
            "type": 1,
            "description": "",
            "options": [],
            "default_member_permissions": None,
            "nsfw": False,
            "name_localizations": None,
            "description_localizations": None,
            "contexts": None,
            "integration_types": [0],
            **copy.deepcopy(dict(payload)),
            "id": command_id or str(self._ids.next()),
            "application_id": str(app),
            "version": str(self._ids.next()),
        }
        if guild_id is not None:
            obj["guild_id"] = str(guild_id)
        return obj

    def _validate_commands(self, payloads: list[Any]) -> _Reply | None:
        seen: set[tuple[str, int]] = set()
        for index, payload in enumerate(payloads):
            if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
                return _form_error([str(index), "name"], "BASE_TYPE_REQUIRED", "This field is required")
            kind = payload.get("type", 1)
            key = (payload["name"], kind)
            if key in seen:
                return _form_error(
                    [str(index), "name"],
                    "APPLICATION_COMMANDS_DUPLICATE_NAME",
                    f"Application command names must be unique ({payload['name']})",
                )
            seen.add(key)
            problem = self._validate_command(payload, [str(index)], chat_input=kind == 1)
            if problem is not None:
                return problem
        return None

    def _validate_command(
        self, spec: Mapping[str, Any], where: list[str], *, chat_input: bool
    ) -> _Reply | None:
        name = spec.get("name", "")
        if chat_input and (not _COMMAND_NAME.match(name) or name != name.lower()):
            return _form_error(
                [*where, "name"], "APPLICATION_COMMAND_INVALID_NAME", f"Command name is invalid: {name!r}"
            )
        if not chat_input and not 1 <= len(name) <= 32:
            return _form_error(
                [*where, "name"], "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 32 in length."
            )
        description = spec.get("description", "")
        if chat_input and not 1 <= len(description) <= 100:
            return _form_error(
                [*where, "description"], "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 100 in length."
            )
        options = spec.get("options") or []
        if len(options) > 25:
            return _form_error([*where, "options"], "BASE_TYPE_MAX_LENGTH", "Must be 25 or fewer in length.")
        seen_optional = False
        for index, option in enumerate(options):
            at = [*where, "options", str(index)]
            if option.get("type") not in range(1, 12):
                return _form_error([*at, "type"], "BASE_TYPE_CHOICES", "Value must be one of (1..11).")
            if len(option.get("choices") or []) > 25:
                return _form_error([*at, "choices"], "BASE_TYPE_MAX_LENGTH", "Must be 25 or fewer in length.")
            if option["type"] not in (OPTION_SUB_COMMAND, OPTION_SUB_COMMAND_GROUP):
                if option.get("required") and seen_optional:
                    return _form_error(
                        [*at, "required"],
                        "APPLICATION_COMMAND_OPTIONS_REQUIRED_INVALID",
                        "Required options must be placed before non-required options",
                    )
                seen_optional = seen_optional or not option.get("required")
            problem = self._validate_command(option, at, chat_input=True)
            if problem is not None:
                return problem
        return None

    def _find_command(self, app: int, name: str, guild_id: int | None) -> dict[str, Any] | None:
        scopes = [(app, guild_id), (app, None)] if guild_id is not None else [(app, None)]
        for scope in scopes:
            for cmd in self._commands.get(scope, []):
                if cmd["name"] == name and cmd.get("type", 1) == 1:
                    return cmd
        return None

    # --- interactions -----------------------------------------------------------------------------------

    def _interaction_for(self, interaction_id: str, token: str) -> FakeInteraction | None:
        found = self._interactions.get(int(interaction_id))
        return found if found is not None and found.token == token else None

    def _record_response(
        self,
        interaction: FakeInteraction,
        kind: str,
        reply: _Reply,
        *,
        type_: int | None = None,
        body: Mapping[str, Any] | None = None,
        files: tuple[FormPart, ...] = (),
        message_id: int | None = None,
    ) -> _Reply:
        data = dict(body or {})
        inner = data.get("data") if kind == "callback" else data
        inner = inner if isinstance(inner, dict) else {}
        self._responses.setdefault(interaction.id, []).append(
            InteractionResponse(
                interaction_id=interaction.id,
                kind=kind,
                type=type_,
                flags=int(inner.get("flags") or 0),
                content=inner.get("content"),
                payload=copy.deepcopy(data),
                files=files,
                status=reply.status,
                message_id=message_id,
                after_s=time.monotonic() - interaction.created_at,
            )
        )
        return reply

    def _callback(self, ctx: _Ctx, interaction_id: str, token: str) -> _Reply:
        interaction = self._interaction_for(interaction_id, token)
        if interaction is None:
            return _unknown("interaction", 10062)
        body = ctx.body if isinstance(ctx.body, dict) else {}
        kind = body.get("type")
        raw_data = body.get("data")
        data: dict[str, Any] = raw_data if isinstance(raw_data, dict) else {}
        files = tuple(p for p in ctx.parts if p.filename is not None)

        def answer(reply: _Reply, message_id: int | None = None) -> _Reply:
            return self._record_response(
                interaction, "callback", reply, type_=kind, body=body, files=files, message_id=message_id
            )

        late = time.monotonic() - interaction.created_at
        if interaction.acknowledged:
            return answer(_error(400, 40060, "Interaction has already been acknowledged."))
        if self.interaction_ack_deadline_s is not None and late > self.interaction_ack_deadline_s:
            return answer(_unknown("interaction", 10062))
        component_only = (CallbackType.DEFERRED_UPDATE_MESSAGE, CallbackType.UPDATE_MESSAGE)
        if kind in component_only and interaction.type != INTERACTION_MESSAGE_COMPONENT:
            return answer(
                _form_error(
                    ["type"],
                    "INTERACTION_CALLBACK_TYPE_INVALID",
                    f"Callback type {kind} is only for message components",
                )
            )
        if kind not in {int(t) for t in CallbackType} or kind == CallbackType.PONG:
            return answer(_form_error(["type"], "BASE_TYPE_CHOICES", f"Invalid callback type {kind!r}"))

        resource: dict[str, Any] = {"type": kind}
        message_id: int | None = None
        state = self._channels[interaction.channel_id]
        if kind in (CallbackType.CHANNEL_MESSAGE, CallbackType.DEFERRED_CHANNEL_MESSAGE):
            if kind == CallbackType.DEFERRED_CHANNEL_MESSAGE:
                data = {"content": "", "flags": int(data.get("flags") or 0) | FLAG_LOADING}
            built = self._build_bot_message(
                _Ctx(
                    bot=self._bot_for_application(interaction.application_id),
                    body=data,
                    parts=ctx.parts,
                    query={},
                ),
                state,
                source="interaction",
                interaction=interaction,
            )
            if isinstance(built, _Reply):
                return answer(built)
            self._store_message(built)
            if not built.ephemeral:
                self._dispatch_message("MESSAGE_CREATE", built)
            message_id = interaction.original_message_id = built.id
            resource["message"] = copy.deepcopy(built.payload)
        elif kind == CallbackType.UPDATE_MESSAGE:
            record = self._messages[interaction.message_id or 0]
            edited = self._apply_edit(_Ctx(bot=None, body=data, parts=ctx.parts, query={}), record)
            if edited.status != 200:
                return answer(edited)
            message_id = interaction.original_message_id = record.id
            resource["message"] = copy.deepcopy(record.payload)
        elif kind == CallbackType.DEFERRED_UPDATE_MESSAGE:
            message_id = interaction.original_message_id = interaction.message_id
        interaction.acknowledged_type = kind
        if ctx.query.get("with_response") not in ("1", "true", "True"):
            return answer(_NO_CONTENT, message_id)
        flags = int(data.get("flags") or 0)
        callback = {
            "interaction": {
                "id": str(interaction.id),
                "type": interaction.type,
                "response_message_id": str(message_id) if message_id else None,
                "response_message_loading": kind == CallbackType.DEFERRED_CHANNEL_MESSAGE,
                "response_message_ephemeral": bool(flags & FLAG_EPHEMERAL),
            },
            "resource": resource,
        }
        return answer(_Reply(200, callback), message_id)

    def _webhook_interaction(self, application_id: str, token: str) -> FakeInteraction | None:
        found = self._interactions_by_token.get(token)
        return found if found is not None and found.application_id == int(application_id) else None

    def _webhook_target(self, interaction: FakeInteraction, message_id: str) -> MessageRecord | None:
        if message_id == "@original":
            target = interaction.original_message_id
        else:
            target = int(message_id)
        record = self._messages.get(target) if target is not None else None
        return None if record is None or record.deleted else record

    def _get_webhook_message(self, ctx: _Ctx, application_id: str, token: str, message_id: str) -> _Reply:
        interaction = self._webhook_interaction(application_id, token)
        if interaction is None:
            return _unknown("Webhook", 10015)
        record = self._webhook_target(interaction, message_id)
        return _Reply(200, copy.deepcopy(record.payload)) if record else _unknown("Message", 10008)

    def _edit_webhook_message(self, ctx: _Ctx, application_id: str, token: str, message_id: str) -> _Reply:
        interaction = self._webhook_interaction(application_id, token)
        if interaction is None:
            return _unknown("Webhook", 10015)
        kind = "edit_original" if message_id == "@original" else "edit_followup"
        files = tuple(p for p in ctx.parts if p.filename is not None)
        record = self._webhook_target(interaction, message_id)
        if record is None:
            return self._record_response(
                interaction, kind, _unknown("Message", 10008), body=ctx.body, files=files
            )
        body = dict(ctx.body) if isinstance(ctx.body, dict) else {}
        reply = self._apply_edit(
            _Ctx(bot=None, body=body, parts=ctx.parts, query={}), record, clear_loading=True
        )
        return self._record_response(interaction, kind, reply, body=body, files=files, message_id=record.id)

    def _delete_webhook_message(self, ctx: _Ctx, application_id: str, token: str, message_id: str) -> _Reply:
        interaction = self._webhook_interaction(application_id, token)
        if interaction is None:
            return _unknown("Webhook", 10015)
        record = self._webhook_target(interaction, message_id)
        if record is None:
            return self._record_response(interaction, "delete_original", _unknown("Message", 10008))
        self._mark_deleted(record)
        return self._record_response(interaction, "delete_original", _NO_CONTENT, message_id=record.id)

    def _followup(self, ctx: _Ctx, application_id: str, token: str) -> _Reply:
        interaction = self._webhook_interaction(application_id, token)
        if interaction is None or not interaction.acknowledged:
            return _unknown("Webhook", 10015)  # Discord makes the webhook only once the interaction is acked
        files = tuple(p for p in ctx.parts if p.filename is not None)
        state = self._channels[interaction.channel_id]
        bot = self._bot_for_application(interaction.application_id)
        built = self._build_bot_message(
            _Ctx(bot=bot, body=ctx.body, parts=ctx.parts, query={}),
            state,
            source="interaction",
            interaction=interaction,
        )
        if isinstance(built, _Reply):
            return self._record_response(interaction, "followup", built, body=ctx.body, files=files)
        self._store_message(built)
        if not built.ephemeral:
            self._dispatch_message("MESSAGE_CREATE", built)
        wait = ctx.query.get("wait", "false").lower() in ("1", "true")
        reply = _Reply(200, copy.deepcopy(built.payload)) if wait else _NO_CONTENT
        return self._record_response(
            interaction, "followup", reply, body=ctx.body, files=files, message_id=built.id
        )

    def _create_interaction(
        self,
        bot: FakeBot,
        kind: int,
        data: dict[str, Any],
        who: FakeUser | FakeMember | int,
        state: _ChannelState,
        member_permissions: int | None,
        locale: str,
        *,
        message: MessageRecord | None = None,
    ) -> FakeInteraction:
        user = self._resolve_user(who)
        self._users.setdefault(user.id, user)
        interaction_id = self._ids.next()
        token = "aW50ZXJhY3Rpb246" + secrets.token_urlsafe(48)
        payload: dict[str, Any] = {
            "id": str(interaction_id),
            "application_id": str(bot.application_id),
            "type": kind,
            "data": data,
            "token": token,
            "version": 1,
            "locale": locale,
            "entitlements": [],
            "attachment_size_limit": ATTACHMENT_SIZE_LIMIT_BYTES,
            "channel_id": str(state.id),
            "channel": self._channel_payload(state),
        }
        if state.guild_id is not None:
            guild = self._guilds[state.guild_id]
            found = guild.members.get(user.id) or FakeMember(user)
            permissions = (
                member_permissions if member_permissions is not None else self._permissions(guild, user.id)
            )
            payload.update(
                guild_id=str(state.guild_id),
                guild={"id": str(state.guild_id), "locale": "en-US", "features": []},
                guild_locale="en-US",
                member={**self._member_payload(guild, found), "permissions": str(permissions)},
                app_permissions=str(self._permissions(guild, bot.user.id)),
                authorizing_integration_owners={"0": str(state.guild_id)},
                context=0,
            )
        else:
            payload.update(
                user=user.payload(),
                app_permissions=str(DEFAULT_BOT_PERMISSIONS),
                authorizing_integration_owners={"0": "0"},
                context=1,
            )
        if message is not None:
            payload["message"] = copy.deepcopy(message.payload)
        interaction = FakeInteraction(
            id=interaction_id,
            token=token,
            application_id=bot.application_id,
            type=kind,
            channel_id=state.id,
            guild_id=state.guild_id,
            user_id=user.id,
            payload=payload,
            created_at=time.monotonic(),
            message_id=message.id if message else None,
        )
        self._interactions[interaction_id] = interaction
        self._interactions_by_token[token] = interaction
        sessions = [s for s in self._sessions.values() if s.bot == bot and _on_shard(s.shard, state.guild_id)]
        live = [s for s in sessions if s.connection is not None] or sessions
        if live:  # Discord sends an interaction to one session of the application: one of the guild's shard
            self._dispatch_to(max(live, key=lambda s: s.created_at), "INTERACTION_CREATE", payload)
        return interaction

    def _build_options(
        self,
        values: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None,
        schema: list[dict[str, Any]],
        resolved: dict[str, dict[str, Any]],
        state: _ChannelState,
    ) -> list[dict[str, Any]]:
        if values is None:
            return []
        if not isinstance(values, Mapping):
            return [dict(v) for v in values]
        options = []
        guild = self._guilds.get(state.guild_id) if state.guild_id is not None else None
        for name, value in values.items():
            spec = next((o for o in schema if o.get("name") == name), None)
            kind = spec["type"] if spec else self._option_type(value)
            is_role = isinstance(value, FakeRole) or (
                kind == OPTION_MENTIONABLE
                and isinstance(value, int)
                and guild is not None
                and value in guild.roles
            )
            if kind == OPTION_USER or (kind == OPTION_MENTIONABLE and not is_role):
                user = self._resolve_user(value)
                resolved.setdefault("users", {})[str(user.id)] = user.payload()
                if guild is not None and user.id in guild.members:
                    partial = self._member_payload(guild, guild.members[user.id])
                    partial.pop("user")
                    partial["permissions"] = str(self._permissions(guild, user.id))
                    resolved.setdefault("members", {})[str(user.id)] = partial
                wire: Any = str(user.id)
            elif kind in (OPTION_ROLE, OPTION_MENTIONABLE):
                role_id = value.id if isinstance(value, FakeRole) else int(value)
                if guild is not None and role_id in guild.roles:
                    resolved.setdefault("roles", {})[str(role_id)] = guild.roles[role_id].payload()
                wire = str(role_id)
            elif kind == OPTION_CHANNEL:
                channel_id = value.id if isinstance(value, FakeChannel) else int(value)
                target = self._channels.get(channel_id)
                if target is not None:
                    resolved.setdefault("channels", {})[str(channel_id)] = {
                        **self._channel_payload(target),
                        "permissions": str(ALL_PERMISSIONS),
                    }
                wire = str(channel_id)
            elif (
                kind == OPTION_INTEGER
                and isinstance(value, int | float | str)
                and not isinstance(value, bool)
            ):
                wire = int(value)
            elif (
                kind == OPTION_NUMBER and isinstance(value, int | float | str) and not isinstance(value, bool)
            ):
                wire = float(value)
            else:
                wire = value
            options.append({"type": kind, "name": name, "value": wire})
        return options

    @staticmethod
    def _option_type(value: Any) -> int:
        if isinstance(value, bool):
            return OPTION_BOOLEAN
        if isinstance(value, int):
            return OPTION_INTEGER
        if isinstance(value, float):
            return OPTION_NUMBER
        if isinstance(value, FakeUser | FakeMember):
            return OPTION_USER
        if isinstance(value, FakeChannel):
            return OPTION_CHANNEL
        if isinstance(value, FakeRole):
            return OPTION_ROLE
        return OPTION_STRING

    @staticmethod
    def _find_component(components: list[dict[str, Any]], custom_id: str) -> dict[str, Any] | None:
        for component in components:
            if component.get("custom_id") == custom_id:
                return component
            nested = FakeDiscord._find_component(component.get("components") or [], custom_id)
            if nested is not None:
                return nested
        return None

    # --- messages ---------------------------------------------------------------------------------------

    def _build_bot_message(
        self,
        ctx: _Ctx,
        state: _ChannelState,
        *,
        source: str,
        interaction: FakeInteraction | None = None,
    ) -> MessageRecord | _Reply:
        bot = ctx.bot
        assert bot is not None
        body = ctx.body if isinstance(ctx.body, dict) else {}
        content = body.get("content")
        content = "" if content is None else str(content)
        if len(content) > MAX_CONTENT_CHARS:
            return _form_error(
                ["content"], "BASE_TYPE_MAX_LENGTH", f"Must be {MAX_CONTENT_CHARS} or fewer in length."
            )
        files = [p for p in ctx.parts if p.filename is not None and _FILE_FIELD.match(p.name)]
        if len(files) > MAX_FILES_PER_MESSAGE:
            return _form_error(
                ["files"], "BASE_TYPE_MAX_LENGTH", f"Must be {MAX_FILES_PER_MESSAGE} or fewer in length."
            )
        if any(len(p.data) > ATTACHMENT_SIZE_LIMIT_BYTES for p in files):
            return _error(413, 40005, "Request entity too large")
        embeds = list(body.get("embeds") or [])
        components = list(body.get("components") or [])
        flags = int(body.get("flags") or 0)
        loading = bool(flags & FLAG_LOADING)
        if not (
            content or embeds or files or components or body.get("sticker_ids") or body.get("poll") or loading
        ):
            return _error(400, 50006, "Cannot send an empty message")
        users, roles, everyone = self._derive_mentions(state, content, body.get("allowed_mentions"))
        message_id = self._ids.next()
        payload = self._message_payload(
            message_id,
            state,
            bot.user,
            content=content,
            mentions=users,
            mention_roles=roles,
            mention_everyone=everyone,
            embeds=embeds,
            attachments=self._attachments_from_parts(state, files, body.get("attachments") or []),
            components=components,
            flags=flags,
            tts=bool(body.get("tts")),
        )
        ephemeral = bool(flags & FLAG_EPHEMERAL)
        if interaction is not None:
            payload["webhook_id"] = str(interaction.application_id)
            payload["application_id"] = str(interaction.application_id)
            payload["interaction_metadata"] = {
                "id": str(interaction.id),
                "type": interaction.type,
                "user": self._users[interaction.user_id].payload(),
                "authorizing_integration_owners": interaction.payload.get(
                    "authorizing_integration_owners", {}
                ),
            }
            if (
                interaction.type == INTERACTION_APPLICATION_COMMAND
                and interaction.original_message_id is None
            ):
                payload["type"] = MESSAGE_TYPE_CHAT_INPUT_COMMAND
        reference = body.get("message_reference")
        if isinstance(reference, dict) and reference.get("message_id") is not None:
            problem = self._attach_reference(payload, state, reference, allowed=body.get("allowed_mentions"))
            if problem is not None:
                return problem
        return MessageRecord(
            payload=payload,
            guild_id=state.guild_id,
            source=source,
            files=tuple(files),
            bot_user_id=bot.user.id,
            ephemeral=ephemeral,
        )

    def _apply_edit(self, ctx: _Ctx, record: MessageRecord, *, clear_loading: bool = False) -> _Reply:
        body = ctx.body if isinstance(ctx.body, dict) else {}
        state = self._channels[record.channel_id]
        payload = record.payload
        if "content" in body:
            content = "" if body["content"] is None else str(body["content"])
            if len(content) > MAX_CONTENT_CHARS:
                return _form_error(
                    ["content"], "BASE_TYPE_MAX_LENGTH", f"Must be {MAX_CONTENT_CHARS} or fewer in length."
                )
            payload["content"] = content
            users, roles, everyone = self._derive_mentions(state, content, body.get("allowed_mentions"))
            payload.update(
                mentions=[u.payload() for u in users],
                mention_roles=[str(r) for r in roles],
                mention_everyone=everyone,
            )
        for key in ("embeds", "components"):
            if key in body:
                payload[key] = list(body[key] or [])
        if "flags" in body and body["flags"] is not None:
            payload["flags"] = int(body["flags"]) | (payload.get("flags", 0) & FLAG_EPHEMERAL)
        files = [p for p in ctx.parts if p.filename is not None and _FILE_FIELD.match(p.name)]
        if "attachments" in body or files:
            keep = {str(a.get("id")) for a in body.get("attachments") or []}
            kept = [a for a in payload.get("attachments", []) if a["id"] in keep]
            payload["attachments"] = kept + self._attachments_from_parts(
                state, files, body.get("attachments") or []
            )
            record.files = record.files + tuple(files)
        if clear_loading or payload.get("flags", 0) & FLAG_LOADING:
            payload["flags"] = payload.get("flags", 0) & ~FLAG_LOADING
        payload["edited_timestamp"] = self._now_iso()
        if not record.ephemeral:
            self._dispatch_message("MESSAGE_UPDATE", record)
        return _Reply(200, copy.deepcopy(payload))

    def _mark_deleted(self, record: MessageRecord) -> None:
        record.deleted = True
        if record.ephemeral:
            return
        data = {"id": str(record.id), "channel_id": str(record.channel_id)}
        if record.guild_id is not None:
            data["guild_id"] = str(record.guild_id)
        self._dispatch_all(
            "MESSAGE_DELETE",
            lambda _s: data,
            guild_id=record.guild_id,
            dm_state=self._channels[record.channel_id],
        )

    def _message_payload(
        self,
        message_id: int,
        state: _ChannelState,
        author: FakeUser,
        *,
        content: str,
        mentions: Sequence[FakeUser],
        mention_roles: Sequence[int],
        mention_everyone: bool,
        embeds: list[dict[str, Any]],
        attachments: list[dict[str, Any]],
        components: list[dict[str, Any]] | None = None,
        flags: int = 0,
        tts: bool = False,
    ) -> dict[str, Any]:
        return {
            "id": str(message_id),
            "channel_id": str(state.id),
            "author": author.payload(),
            "content": content,
            "timestamp": self._now_iso(),
            "edited_timestamp": None,
            "tts": tts,
            "mention_everyone": mention_everyone,
            "mentions": [u.payload() for u in mentions],
            "mention_roles": [str(r) for r in mention_roles],
            "mention_channels": [],
            "attachments": attachments,
            "embeds": embeds,
            "components": components or [],
            "reactions": [],
            "pinned": False,
            "type": MESSAGE_TYPE_DEFAULT,
            "flags": flags,
        }

    def _attach_reference(
        self,
        payload: dict[str, Any],
        state: _ChannelState,
        reference: Mapping[str, Any],
        *,
        allowed: Mapping[str, Any] | None = None,
    ) -> _Reply | None:
        ref_id = _as_int(reference.get("message_id"))
        ref_channel = _as_int(reference.get("channel_id")) or state.id
        target = self._messages.get(ref_id) if ref_id is not None else None
        if target is None or target.deleted or target.channel_id != ref_channel:
            if reference.get("fail_if_not_exists", True):
                return _form_error(["message_reference"], "REPLIES_UNKNOWN_MESSAGE", "Unknown message")
            return None
        payload["type"] = MESSAGE_TYPE_REPLY
        payload["message_reference"] = {
            "type": 0,
            "message_id": str(target.id),
            "channel_id": str(target.channel_id),
            **({"guild_id": str(state.guild_id)} if state.guild_id is not None else {}),
        }
        payload["referenced_message"] = copy.deepcopy(target.payload)
        payload["referenced_message"].pop("referenced_message", None)
        replied = self._users.get(target.author_id)
        ping_author = allowed is None or allowed.get("replied_user", True)
        if (
            replied is not None
            and ping_author
            and all(int(u["id"]) != replied.id for u in payload["mentions"])
        ):
            payload["mentions"].append(replied.payload())
        return None

    def _derive_mentions(
        self, state: _ChannelState, content: str, allowed: Mapping[str, Any] | None
    ) -> tuple[list[FakeUser], list[int], bool]:
        parse = set(allowed.get("parse") or []) if allowed is not None else {"users", "roles", "everyone"}
        allowed_users = {int(u) for u in (allowed.get("users") or [])} if allowed is not None else set()
        allowed_roles = {int(r) for r in (allowed.get("roles") or [])} if allowed is not None else set()
        users: list[FakeUser] = []
        for raw in dict.fromkeys(_USER_MENTION.findall(content)):
            user = self._users.get(int(raw))
            if user is not None and ("users" in parse or user.id in allowed_users):
                users.append(user)
        roles: list[int] = []
        guild = self._guilds.get(state.guild_id) if state.guild_id is not None else None
        if guild is not None:
            for raw in dict.fromkeys(_ROLE_MENTION.findall(content)):
                role_id = int(raw)
                if role_id in guild.roles and ("roles" in parse or role_id in allowed_roles):
                    roles.append(role_id)
        everyone = guild is not None and "everyone" in parse and bool(_EVERYONE_MENTION.search(content))
        return users, roles, everyone

    def _store_attachment(self, state: _ChannelState, attachment: FakeAttachment) -> dict[str, Any]:
        attachment_id = self._ids.next()
        self._attachments[attachment_id] = attachment.data
        ctype = attachment.content_type or mimetypes.guess_type(attachment.filename)[0]
        return self._attachment_payload(
            state,
            attachment_id,
            attachment.filename,
            ctype,
            attachment.size if attachment.size is not None else len(attachment.data),
            attachment.description,
            attachment.width,
            attachment.height,
        )

    def _attachments_from_parts(
        self, state: _ChannelState, files: Sequence[FormPart], metadata: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        out = []
        for part in files:
            match = _FILE_FIELD.match(part.name)
            index = match.group(1) if match else ""
            meta = next((m for m in metadata if str(m.get("id")) == index), {})
            filename = meta.get("filename") or part.filename or "file"
            ctype = part.content_type
            if not ctype or ctype == "application/octet-stream":
                ctype = mimetypes.guess_type(filename)[0] or ctype
            attachment_id = self._ids.next()
            self._attachments[attachment_id] = part.data
            out.append(
                self._attachment_payload(
                    state, attachment_id, filename, ctype, len(part.data), meta.get("description"), None, None
                )
            )
        return out

    def _attachment_payload(
        self,
        state: _ChannelState,
        attachment_id: int,
        filename: str,
        content_type: str | None,
        size: int,
        description: str | None,
        width: int | None,
        height: int | None,
    ) -> dict[str, Any]:
        url = f"{self.base_url}/attachments/{state.id}/{attachment_id}/{filename}"
        payload: dict[str, Any] = {
            "id": str(attachment_id),
            "filename": filename,
            "size": size,
            "url": url,
            "proxy_url": url,
            "content_type": content_type,
            "description": description,
            "flags": 0,
        }
        if width is not None and height is not None:
            payload.update(width=width, height=height)
        return payload

    def _store_message(self, record: MessageRecord) -> None:
        self._messages[record.id] = record
        if not record.ephemeral:
            self._channels[record.channel_id].message_ids.append(record.id)

    def _dispatch_message(self, event: str, record: MessageRecord) -> None:
        state = self._channels[record.channel_id]
        self._dispatch_all(
            event, lambda session: self._message_for(session, record), guild_id=state.guild_id, dm_state=state
        )

    def _message_for(self, session: _Session, record: MessageRecord) -> dict[str, Any] | None:
        bot_id = session.bot.user.id
        guild = self._guilds.get(record.guild_id) if record.guild_id is not None else None
        if guild is not None and not self._can_view(self._channels[record.channel_id], bot_id):
            return None  # Discord sends a bot no message of a channel it cannot see
        data = copy.deepcopy(record.payload)
        if guild is not None:
            data["guild_id"] = str(guild.config.id)
            author = guild.members.get(record.author_id)
            if author is not None and "webhook_id" not in data:
                data["member"] = self._partial_member(guild, author)
            for mentioned in data["mentions"]:
                found = guild.members.get(int(mentioned["id"]))
                if found is not None:
                    mentioned["member"] = self._partial_member(guild, found)
        visible = (
            bool(session.intents & Intent.MESSAGE_CONTENT)
            or guild is None
            or record.author_id == bot_id
            or any(int(u["id"]) == bot_id for u in data["mentions"])
        )
        if not visible:  # what a bot without the MESSAGE_CONTENT intent sees
            data.update(content="", embeds=[], attachments=[], components=[])
            data.pop("poll", None)
        return data

    # --- gateway ----------------------------------------------------------------------------------------

    async def _gateway_entry(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(max_msg_size=MAX_REQUEST_BYTES)
        await ws.prepare(request)
        compressed = self.gateway_compression and request.query.get("compress") == "zlib-stream"
        conn = _Connection(
            ws=ws, outbox=asyncio.Queue(), compressor=zlib.compressobj() if compressed else None
        )
        with self._lock:
            self.gateway_connects.append(
                GatewayConnect(request.path, dict(request.query), compressed, time.monotonic())
            )
            self._connections.add(conn)
        self._notify()
        try:
            async with asyncio.TaskGroup() as tg:
                writer = tg.create_task(self._write_frames(conn))
                if request.query.get("encoding", "json") != "json":
                    self._send(conn, _Close(CLOSE_DECODE_ERROR, "Only encoding=json is supported."))
                else:
                    self._send(
                        conn,
                        {
                            "op": _Op.HELLO,
                            "d": {
                                "heartbeat_interval": self.heartbeat_interval_ms,
                                "_trace": ["fake-discord"],
                            },
                            "s": None,
                            "t": None,
                        },
                    )
                await self._read_frames(conn)
                writer.cancel()
        finally:
            with self._lock:
                self._connections.discard(conn)
                session = conn.session
                if session is not None and session.connection is conn:
                    session.connection = None
                    if not conn.closed_by_server and ws.close_code in (1000, 1001):
                        self._sessions.pop(session.id, None)  # a clean close by the client ends its session
            self._notify()
        return ws

    async def _write_frames(self, conn: _Connection) -> None:
        while True:
            item = await conn.outbox.get()
            try:
                if isinstance(item, _Close):
                    await conn.ws.close(code=item.code, message=item.reason.encode())
                    return
                text = json.dumps(item)
                if conn.compressor is not None:
                    await conn.ws.send_bytes(
                        conn.compressor.compress(text.encode()) + conn.compressor.flush(zlib.Z_SYNC_FLUSH)
                    )
                else:
                    await conn.ws.send_str(text)
            except (ConnectionError, RuntimeError):
                return  # the client went away; its read side ends the handler

    async def _read_frames(self, conn: _Connection) -> None:
        async for msg in conn.ws:
            if msg.type == WSMsgType.TEXT:
                raw = msg.data
            elif msg.type == WSMsgType.BINARY:
                raw = msg.data.decode("utf-8", "replace")
            else:
                break
            try:
                frame = json.loads(raw)
                op = int(frame["op"])
            except (ValueError, KeyError, TypeError):
                self._close(conn, CLOSE_DECODE_ERROR, "Error while decoding payload.")
                continue
            with self._lock:
                self._on_frame(conn, op, frame.get("d"))
            self._notify()

    def _close(self, conn: _Connection, code: int, reason: str) -> None:
        conn.closed_by_server = True
        self._send(conn, _Close(code, reason))

    def _send(self, conn: _Connection, item: dict[str, Any] | _Close) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop is shutting down
            loop.call_soon_threadsafe(conn.outbox.put_nowait, item)

    def _on_frame(self, conn: _Connection, op: int, d: Any) -> None:
        if op == _Op.HEARTBEAT:
            self.heartbeats += 1
            if self.ack_heartbeats:
                self._send(conn, {"op": _Op.HEARTBEAT_ACK, "d": None, "s": None, "t": None})
        elif op == _Op.IDENTIFY:
            self._identify(conn, d if isinstance(d, dict) else {})
        elif op == _Op.RESUME:
            self._resume(conn, d if isinstance(d, dict) else {})
        elif conn.session is None:
            self._close(conn, CLOSE_NOT_AUTHENTICATED, "Not authenticated.")
        elif op == _Op.REQUEST_GUILD_MEMBERS:
            self._members_chunk(conn.session, d if isinstance(d, dict) else {})
        elif op == _Op.PRESENCE_UPDATE:
            self._presence(conn, conn.session, d)
        elif op == _Op.VOICE_STATE_UPDATE:
            pass
        else:
            self._close(conn, CLOSE_UNKNOWN_OPCODE, "Unknown opcode.")

    def _presence(self, conn: _Connection, session: _Session, d: Any) -> None:
        """Op 3, recorded; a payload that is not the documented object closes the connection like Discord does."""
        activities = d.get("activities") if isinstance(d, dict) else None
        if not isinstance(activities, list) or not all(isinstance(a, dict) for a in activities):
            self._close(conn, CLOSE_DECODE_ERROR, "Error while decoding payload.")
            return
        self.presence_updates.append(
            PresenceUpdate(
                bot_user_id=session.bot.user.id,
                status=d.get("status") if isinstance(d.get("status"), str) else None,
                activities=[dict(a) for a in activities],
                afk=d.get("afk") if isinstance(d.get("afk"), bool) else None,
                at=self._clock(),
                shard=session.shard,
            )
        )

    def _identify(self, conn: _Connection, d: dict[str, Any]) -> None:
        token = d.get("token")
        bot = next((b for b in self.bots if b.token == token), None)
        intents = d.get("intents")
        close: tuple[int, str] | None = None
        if conn.session is not None:
            close = (CLOSE_ALREADY_AUTHENTICATED, "Already authenticated.")
        elif bot is None:
            close = (CLOSE_AUTHENTICATION_FAILED, "Authentication failed.")
        elif not isinstance(intents, int) or intents < 0:
            close = (CLOSE_INVALID_INTENTS, "Invalid intent(s).")
        elif intents & PRIVILEGED_INTENTS & ~bot.privileged_intents:
            close = (CLOSE_DISALLOWED_INTENTS, "Disallowed intent(s).")
        shard, shard_ok = _shard_of_identify(d)
        if close is None and not shard_ok:
            close = (CLOSE_INVALID_SHARD, "Invalid shard.")
        elif close is None and self._guilds_on(shard) > self.max_guilds_per_shard:
            close = (CLOSE_SHARDING_REQUIRED, "Sharding required.")
        self.identifies.append(
            Identify(
                token_valid=bot is not None,
                bot_user_id=bot.user.id if bot else None,
                intents=intents if isinstance(intents, int) else None,
                properties=dict(d.get("properties") or {}),
                accepted=close is None,
                close_code=close[0] if close else None,
                at=time.monotonic(),
                shard=shard,
            )
        )
        if close is not None or bot is None or not isinstance(intents, int):
            self._close(conn, *(close or (CLOSE_AUTHENTICATION_FAILED, "Authentication failed.")))
            return
        session = _Session(id=secrets.token_hex(16), bot=bot, intents=intents, shard=shard)
        self._sessions[session.id] = session
        session.connection, conn.session = conn, session
        ready: dict[str, Any] = {
            "v": API_VERSION,
            "user": {**bot.user.payload(), "verified": True, "mfa_enabled": False},
            "guilds": [{"id": str(g), "unavailable": True} for g in self._guilds if self._delivers(shard, g)],
            "session_id": session.id,
            "session_type": "normal",
            "resume_gateway_url": self.resume_gateway_url,
            "application": {"id": str(bot.application_id), "flags": self._app_flags(bot)},
            "private_channels": [],
            "relationships": [],
            "presences": [],
            "guild_join_requests": [],
            "geo_ordered_rtc_regions": [],
            "user_settings": {},
            "_trace": ["fake-discord"],
        }
        if shard is not None:
            ready["shard"] = list(shard)
        self._dispatch_to(session, "READY", ready)
        for guild in self._guilds.values():
            if self._delivers(shard, guild.config.id):
                self._dispatch_to(session, "GUILD_CREATE", self._guild_create_payload(guild, session))

    def _resume(self, conn: _Connection, d: dict[str, Any]) -> None:
        session = self._sessions.get(str(d.get("session_id")))
        seq = d.get("seq")
        token = d.get("token")
        ok = (
            session is not None
            and session.resumable
            and session.bot.token == token
            and isinstance(seq, int)
            and seq <= session.seq
            and (not session.history or session.history[0]["s"] <= seq + 1)
        )
        if not ok or session is None or not isinstance(seq, int):
            self.resumes.append(
                Resume(d.get("session_id"), seq if isinstance(seq, int) else None, False, 0, time.monotonic())
            )
            if session is not None:
                self._sessions.pop(session.id, None)
            self._send(conn, {"op": _Op.INVALID_SESSION, "d": False, "s": None, "t": None})
            return
        old = session.connection
        if old is not None and old is not conn:
            self._close(old, CLOSE_UNKNOWN_ERROR, "Session resumed elsewhere.")
        session.connection, conn.session = conn, session
        missed = [frame for frame in session.history if frame["s"] > seq]
        for frame in missed:
            self._send(conn, frame)
        self.resumes.append(Resume(session.id, seq, True, len(missed), time.monotonic()))
        self._dispatch_to(session, "RESUMED", {"_trace": ["fake-discord"]})

    def _members_chunk(self, session: _Session, d: dict[str, Any]) -> None:
        guild = self._guilds.get(_as_int(d.get("guild_id")) or 0)
        if guild is None:
            return
        wanted = [_as_int(u) for u in d.get("user_ids") or []]
        query = str(d.get("query") or "").lower()
        limit = _as_int(d.get("limit")) or 0
        if wanted:
            found = [guild.members[u] for u in wanted if u in guild.members]
        else:
            found = [m for m in guild.members.values() if m.user.username.lower().startswith(query)]
            found = found[:limit] if limit else found
        chunk: dict[str, Any] = {
            "guild_id": str(guild.config.id),
            "members": [self._member_payload(guild, m) for m in found],
            "chunk_index": 0,
            "chunk_count": 1,
            "not_found": [str(u) for u in wanted if u not in guild.members],
        }
        if d.get("nonce") is not None:
            chunk["nonce"] = d["nonce"]
        self._dispatch_to(session, "GUILD_MEMBERS_CHUNK", chunk)

    def _dispatch_to(self, session: _Session, event: str, data: dict[str, Any]) -> None:
        session.seq += 1
        frame = {"op": _Op.DISPATCH, "t": event, "s": session.seq, "d": data}
        session.history.append(frame)
        if len(session.history) > REPLAY_BUFFER_EVENTS:
            del session.history[: len(session.history) - REPLAY_BUFFER_EVENTS]
        if session.connection is not None:
            self._send(session.connection, frame)

    def _dispatch_all(
        self,
        event: str,
        shape: Callable[[_Session], dict[str, Any] | None],
        *,
        guild_id: int | None,
        dm_state: _ChannelState | None = None,
    ) -> None:
        """Send an event to every session that would get it: a guild's events to every bot's session of the
        guild's shard; DM events to its bot's shard 0."""
        for session in list(self._sessions.values()):
            if not self._delivers(session.shard, guild_id):
                continue
            if guild_id is None:
                if dm_state is None or self._dm_bot_id(dm_state) != session.bot.user.id:
                    continue
                if event.startswith("MESSAGE_") and not session.intents & Intent.DIRECT_MESSAGES:
                    continue
            elif event.startswith("MESSAGE_") and not session.intents & Intent.GUILD_MESSAGES:
                continue
            data = shape(session)
            if data is not None:
                self._dispatch_to(session, event, data)

    # --- payloads and lookups ---------------------------------------------------------------------------

    def _now_iso(self) -> str:
        return datetime.fromtimestamp(self._clock(), UTC).isoformat(timespec="microseconds")

    def _add_guild(self, guild: FakeGuild) -> None:
        roles: dict[int, FakeRole] = {
            guild.id: FakeRole(guild.id, "@everyone", guild.everyone_permissions, 0, False)
        }
        for role in guild.roles:
            roles[role.id] = role
        members: dict[int, FakeMember] = {}
        declared = list(guild.members)
        for bot in self.bots:
            if all(m.user.id != bot.user.id for m in declared):
                declared.append(FakeMember(bot.user, permissions=bot.permissions))
        for found in declared:
            extra: tuple[int, ...] = ()
            if found.permissions:
                role = FakeRole(
                    self._ids.next(),
                    found.user.username if found.user.bot else f"perms-{found.user.id}",
                    found.permissions,
                    managed=found.user.bot,
                    mentionable=False,
                )
                roles[role.id] = role
                extra = (role.id,)
            members[found.user.id] = replace(found, roles=tuple(found.roles) + extra)
            self._users.setdefault(found.user.id, found.user)
        state = _GuildState(guild, roles, members, self._now_iso())
        self._guilds[guild.id] = state
        for channel in guild.channels:
            self._channels[channel.id] = _ChannelState(channel, guild.id)
        for channel in guild.channels:
            self._check_channel(state, channel)

    def _add_dm(self, channel: FakeChannel) -> _ChannelState:
        if channel.recipient is None:
            raise ValueError(f"DM channel {channel.id} needs a recipient")
        state = _ChannelState(channel, None)
        self._channels[channel.id] = state
        self._users.setdefault(channel.recipient.id, channel.recipient)
        return state

    def _dm_bot_id(self, state: _ChannelState) -> int:
        return state.config.bot_user_id if state.config.bot_user_id is not None else self.bot.user.id

    def _channel_state(self, channel_id: int) -> _ChannelState:
        state = self._channels.get(channel_id)
        if state is None:
            raise LookupError(f"fake Discord has no channel {channel_id}")
        return state

    def _resolve_user(self, who: FakeUser | FakeMember | int) -> FakeUser:
        if isinstance(who, FakeUser | FakeMember):
            return _user_of(who)
        user = self._users.get(int(who))
        if user is None:
            raise LookupError(f"fake Discord knows no user {who}")
        return user

    def _bot_by_user_id(self, user_id: int) -> FakeBot | None:
        return next((b for b in self.bots if b.user.id == user_id), None)

    def _bot_for_application(self, application_id: int | None) -> FakeBot:
        if application_id is None:
            return self.bot
        for bot in self.bots:
            if bot.application_id == application_id:
                return bot
        raise LookupError(f"fake Discord has no application {application_id}")

    @staticmethod
    def _permissions(guild: _GuildState, user_id: int) -> int:
        if user_id == guild.config.owner_id:
            return ALL_PERMISSIONS
        bits = guild.roles[guild.config.id].permissions
        found = guild.members.get(user_id)
        for role_id in found.roles if found else ():
            role = guild.roles.get(role_id)
            bits |= role.permissions if role else 0
        return ALL_PERMISSIONS if bits & Perm.ADMINISTRATOR else bits

    def _check_channel(self, guild: _GuildState, channel: FakeChannel) -> None:
        """What Discord's API refuses of a guild channel's permissions and a thread's parent (``ValueError``)."""
        where = f"channel {channel.id}"
        if channel.type in THREAD_TYPES:
            if channel.overwrites:
                raise ValueError(
                    f"{where}: a thread has no permission_overwrites of its own (it follows its parent)"
                )
            parent = self._channels.get(channel.parent_id) if channel.parent_id is not None else None
            if parent is None or parent.guild_id != guild.config.id or parent.config.type not in (
                ChannelType.GUILD_TEXT, ChannelType.GUILD_ANNOUNCEMENT,
            ):  # fmt: skip
                raise ValueError(
                    f"{where}: a thread's parent must be a text channel of guild {guild.config.id}"
                )
            if channel.type == ChannelType.PRIVATE_THREAD and parent.config.type != ChannelType.GUILD_TEXT:
                raise ValueError(f"{where}: Discord makes private threads in text channels only")
            return
        if channel.thread_members:
            raise ValueError(f"{where}: only a private thread has members of its own")
        targets: set[int] = set()
        for overwrite in channel.overwrites:
            if overwrite.type not in (OVERWRITE_ROLE, OVERWRITE_MEMBER):
                raise ValueError(
                    f"{where}: an overwrite's type is 0 (role) or 1 (member), not {overwrite.type!r}"
                )
            if overwrite.id in targets:
                raise ValueError(f"{where}: two overwrites for {overwrite.id}")
            targets.add(overwrite.id)
            if overwrite.type == OVERWRITE_ROLE and overwrite.id not in guild.roles:
                raise ValueError(
                    f"{where}: unknown role {overwrite.id} in an overwrite (Discord: Unknown Role)"
                )
            if overwrite.type == OVERWRITE_MEMBER and overwrite.id not in guild.members:
                raise ValueError(
                    f"{where}: {overwrite.id} is not a member of the guild (Discord: Unknown Member)"
                )
            for bits in (overwrite.allow, overwrite.deny):
                if bits < 0 or bits & ~ALL_PERMISSIONS:
                    raise ValueError(f"{where}: {bits} holds bits that are no permission")

    def _can_view(self, state: _ChannelState, user_id: int) -> bool:
        return bool(self._channel_permissions(state, user_id) & Perm.VIEW_CHANNEL)

    def _channel_permissions(self, state: _ChannelState, user_id: int) -> int:
        """Discord's permission resolution in a guild channel; a thread takes its parent's, and a private one
        lets in only its members and those who may MANAGE_THREADS. 0 for a DM or a user outside the guild."""
        guild = self._guilds.get(state.guild_id) if state.guild_id is not None else None
        if guild is None or (user_id != guild.config.owner_id and user_id not in guild.members):
            return 0
        channel = state.config
        target = state
        if channel.type in THREAD_TYPES and channel.parent_id is not None:
            target = self._channels.get(channel.parent_id, state)
        bits = self._overwritten(guild, target.config, user_id)
        if not bits & Perm.VIEW_CHANNEL:
            return 0
        if channel.type == ChannelType.PRIVATE_THREAD and not (
            user_id in channel.thread_members or bits & (Perm.MANAGE_THREADS | Perm.ADMINISTRATOR)
        ):
            return 0
        return bits

    def _overwritten(self, guild: _GuildState, channel: FakeChannel, user_id: int) -> int:
        base = self._permissions(guild, user_id)
        if base & Perm.ADMINISTRATOR or user_id == guild.config.owner_id:
            return ALL_PERMISSIONS
        found = guild.members.get(user_id)
        roles = set(found.roles) if found else set()
        by_id = {o.id: o for o in channel.overwrites}
        everyone = by_id.get(guild.config.id)
        if everyone is not None and everyone.type == OVERWRITE_ROLE:
            base = (base & ~everyone.deny) | everyone.allow
        allow = deny = 0
        for overwrite in channel.overwrites:
            if overwrite.type == OVERWRITE_ROLE and overwrite.id in roles and overwrite.id != guild.config.id:
                allow |= overwrite.allow
                deny |= overwrite.deny
        base = (base & ~deny) | allow
        own = by_id.get(user_id)
        if own is not None and own.type == OVERWRITE_MEMBER:
            base = (base & ~own.deny) | own.allow
        return base

    def _member_payload(self, guild: _GuildState, found: FakeMember) -> dict[str, Any]:
        return {"user": found.user.payload(), **self._partial_member(guild, found)}

    @staticmethod
    def _partial_member(guild: _GuildState, found: FakeMember) -> dict[str, Any]:
        return {
            "roles": [str(r) for r in found.roles],
            "nick": found.nick,
            "avatar": None,
            "banner": None,
            "joined_at": guild.joined_at,
            "premium_since": None,
            "deaf": False,
            "mute": False,
            "flags": 0,
            "pending": False,
            "communication_disabled_until": None,
        }

    def _guild_payload(self, guild: _GuildState) -> dict[str, Any]:
        config = guild.config
        return {
            "id": str(config.id),
            "name": config.name,
            "icon": None,
            "splash": None,
            "discovery_splash": None,
            "banner": None,
            "description": None,
            "owner_id": str(config.owner_id),
            "afk_channel_id": None,
            "afk_timeout": 300,
            "verification_level": 0,
            "default_message_notifications": 0,
            "explicit_content_filter": 0,
            "roles": [r.payload() for r in guild.roles.values()],
            "emojis": [],
            "stickers": [],
            "features": [],
            "mfa_level": 0,
            "system_channel_id": None,
            "system_channel_flags": 0,
            "rules_channel_id": None,
            "vanity_url_code": None,
            "premium_tier": 0,
            "premium_subscription_count": 0,
            "preferred_locale": "en-US",
            "public_updates_channel_id": None,
            "nsfw_level": 0,
            "premium_progress_bar_enabled": False,
        }

    def _guild_create_payload(self, guild: _GuildState, session: _Session) -> dict[str, Any]:
        bot_id = session.bot.user.id
        if session.intents & Intent.GUILD_MEMBERS:
            members = list(guild.members.values())
        else:  # without GUILD_MEMBERS Discord sends only the bot itself
            members = [m for m in guild.members.values() if m.user.id == bot_id]
        channels = [s for s in self._channels.values() if s.guild_id == guild.config.id]
        return {
            **self._guild_payload(guild),
            "joined_at": guild.joined_at,
            "large": False,
            "unavailable": False,
            "member_count": len(guild.members),
            "members": [self._member_payload(guild, m) for m in members],
            "channels": [self._channel_payload(s) for s in channels if s.config.type not in THREAD_TYPES],
            "threads": [  # like Discord: the active threads the bot can see
                self._channel_payload(s)
                for s in channels
                if s.config.type in THREAD_TYPES and self._can_view(s, bot_id)
            ],  # fmt: skip
            "voice_states": [],
            "presences": [],
            "stage_instances": [],
            "guild_scheduled_events": [],
            "soundboard_sounds": [],
        }

    def _channel_payload(self, state: _ChannelState) -> dict[str, Any]:
        config = state.config
        last = str(state.message_ids[-1]) if state.message_ids else None
        if config.is_dm:
            assert config.recipient is not None
            return {
                "id": str(config.id),
                "type": int(ChannelType.DM),
                "last_message_id": last,
                "flags": 0,
                "recipients": [config.recipient.payload()],
            }
        payload: dict[str, Any] = {
            "id": str(config.id),
            "type": int(config.type),
            "guild_id": str(state.guild_id),
            "name": config.name,
            "position": config.position,
            "permission_overwrites": [overwrite.payload() for overwrite in config.overwrites],
            "nsfw": False,
            "parent_id": str(config.parent_id) if config.parent_id is not None else None,
            "last_message_id": last,
            "rate_limit_per_user": 0,
            "flags": 0,
        }
        if config.type in THREAD_TYPES:
            owner = config.owner_id if config.owner_id is not None else self.bot.user.id
            payload.update(
                owner_id=str(owner),
                message_count=len(state.message_ids),
                member_count=1,
                total_message_sent=len(state.message_ids),
                thread_metadata={
                    "archived": False,
                    "auto_archive_duration": 1440,
                    "archive_timestamp": self._now_iso(),
                    "locked": False,
                },
            )
            payload.pop("permission_overwrites")
            payload.pop("position")
        else:
            payload["topic"] = config.topic
        return payload
