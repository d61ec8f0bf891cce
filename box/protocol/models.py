"""Pydantic models for every params and result shape of the box protocol v1 (docs/protocol.md).

Direction decides strictness: what the *host* sends, the box parses leniently
(unknown fields ignored, the host may be newer); what the *box* sends, the host
parses strictly (unknown fields refused with -32602), because every byte from a
box is hostile input.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from box.protocol import history as hist
from box.protocol import memory as mem
from box.protocol.base import Empty, EmptyFromHost, FromBox, FromHost, Id, Name
from box.protocol.memory import PresenceEntry, SessionMemory

PROTOCOL_VERSION = 1

# Bounds on what a box may ask for; the gateway's policy applies finer limits.
MAX_SEND_CONTENT_CHARS = 20_000
MAX_SEND_FILES = 10
MAX_URL_CHARS = 2_048
MAX_LOG_MESSAGE_CHARS = 4_000
MAX_POST_CHANNELS = 25  # issue 38: other channels an imp's envelope may name

# ---------------------------------------------------------------- host -> box


ModelName = Annotated[str, Field(min_length=1, max_length=128)]


class ResponderSettings(FromHost):
    """How the box's responder calls the model (SPEC-001). Every field has a default.

    The host fills these from the imp's ``[model]`` table by field name (``ImpConfig.imp_spec``),
    plus ``news`` (the news file's text) and ``staff_channel`` (``[discord] staff_channel``).
    Open-ended values (effort, tool names) are plain strings so a newer host never breaks box.init.
    These defaults are the only ones: ``[model]`` in imp.toml takes each shared key's default from here.
    """

    model: str = "gpt-5.1"  # issue 16: a reasoning model that takes every SPEC-001 parameter
    max_tokens: int = Field(default=1024, ge=1, le=128_000)
    temperature: float | None = None
    history_limit: int = Field(default=20, ge=0, le=500)
    # Added with the responder (issue 6); all optional.
    vision_model: ModelName | None = None  # the message carries images (default: model)
    factual_model: ModelName | None = None  # the call answers from tool results (default: model)
    retry_model: ModelName | None = None  # after an HTTP 429, until a call succeeds again (ENV-15)
    reasoning_effort: Annotated[str, Field(max_length=16)] = "none"  # ENV-21 / ENV-22
    use_responses_api: bool = False  # ENV-22
    # Issue 16: where OPENAI_BASE_URL points ("openai", "ollama", "llama.cpp", "vllm", "lmstudio",
    # "compatible"); with the model it picks the profile of what a request may carry (box.common.model_profiles).
    server: Annotated[str, Field(max_length=32)] = "openai"
    responses_tool_rounds: int = Field(default=4, ge=1, le=16)  # ENV-23
    tool_rounds: int = Field(default=3, ge=0, le=16)  # chat/completions tool rounds
    history_per_channel: int = Field(default=3, ge=0, le=500)  # ENV-11
    short_path: list[tuple[str, str]] = Field(default_factory=list)  # ENV-05: (channel_regex, user_regex)
    tools: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list)  # "web_fetch", "search"
    news: Annotated[str, Field(max_length=65_536)] | None = (
        None  # ENV-10: the news file's text, read host-side
    )
    staff_channel: Id | None = None  # ENV-03: where staff notes and hack alerts go
    retry_backoff_s: float = Field(default=1.0, ge=0, le=60)  # ENV-12: first backoff; doubles per attempt
    # Issue 19 #6: how long one model attempt may take; the host derives it from the turn ceiling and
    # ENV-12's attempt count (box.common.attempts.attempt_timeout_s); the default is its value for the default
    # 120 s turn ceiling (tests/test_faults_settings.py holds the two together). None: no limit of its own.
    attempt_timeout_s: float | None = Field(default=35.0, gt=0, le=3600)
    image_model: ModelName = "gpt-image-1"
    image_size: Annotated[str, Field(max_length=16)] = "1024x1024"
    image_quality: Annotated[str, Field(max_length=16)] = "low"  # small images fit one protocol line
    # Issue 38: what the envelope asks for (box.common.envelope.EnvelopeAsks). ``images``: the imp's server
    # makes pictures and the policy allows them (None: only on server "openai"); ``post_channels``: the
    # channels besides the conversation's own and the staff channel that the policy lets the imp post to
    # (the host reads them off the policy; none: the envelope asks no ``channel``).
    images: bool | None = None
    post_channels: list[Id] = Field(default_factory=list, max_length=MAX_POST_CHANNELS)


MemoryPurpose = Literal["reply", "arrival", "appraisal", "filter", "summary", "embedding", "introspection", "selection", "learning", "classification", "sleep"]  # fmt: skip


class MemorySettings(FromHost):
    """The memory engine's settings (issue 23); ``[memory]`` in imp.toml takes its defaults from here."""

    enabled: bool = False
    # hashing: the offline 64-dim test embedder; local: the host's all-MiniLM-L6-v2 (issue 33), asked through the
    # gateway like a hosted model, with the host's reserved model name and its 384 dimensions (ImpConfig.imp_spec)
    embedder: Literal["gateway", "hashing", "local"] = "gateway"
    embedding_model: ModelName = "text-embedding-3-small"
    dimensions: int = Field(default=256, ge=8, le=4096)  # asked of the embedding model; small on purpose
    models: dict[MemoryPurpose, ModelName] = Field(default_factory=dict)  # mechanism 55; unrouted: [model]
    valence_bias: float = Field(default=0.0, ge=-3.0, le=3.0)  # mechanism 60
    intensity_amplification: float = Field(default=1.0, ge=0.0, le=10.0)  # mechanism 60
    avoidance_weight: float = Field(default=2.0, ge=1.0, le=10.0)  # mechanism 96
    introspection: bool = True  # mechanism 52
    timezone: Annotated[str, Field(max_length=64)] = "UTC"  # ages in words are local to this zone (9)
    call_log_bytes: int = Field(default=2_000_000, ge=0, le=100_000_000)  # mechanism 119, under /state


class ImpSpec(FromHost):
    name: Name
    persona: str = ""
    responder: ResponderSettings = Field(default_factory=ResponderSettings)
    memory: MemorySettings = Field(default_factory=MemorySettings)


ChannelKind = Literal["dm", "guild", "terminal", "task"]


class SessionInfo(FromHost):
    id: Id
    channel_id: Id
    channel_kind: ChannelKind
    channel_name: Name = ""
    turn_ceiling_s: float | None = Field(default=None, gt=0)  # the host stops a longer turn (its box killed)


class BoxInitParams(FromHost):
    protocol: Literal[1]
    imp: ImpSpec
    session: SessionInfo
    now: datetime
    memory: SessionMemory | None = None  # the session's memory scopes (issue 23); None: memory is off
    # Seed 003 version metadata: the host's impyard release, for the prompt (None: the box says its own).
    impyard_version: Annotated[str, Field(max_length=32)] | None = None


class BoxInitResult(FromBox):
    protocol: int
    box: str


class Author(FromHost):
    id: Id
    name: Name
    bot: bool = False


class ReplyRef(FromHost):
    id: Id
    author: Author | None = None
    content: str = ""


class Attachment(FromHost):
    filename: Name
    content_type: str = "application/octet-stream"
    size: int = Field(ge=0)
    data_b64: str | None = None


class Message(FromHost):
    id: Id
    author: Author
    content: str
    created_at: datetime
    mentions_imp: bool = False
    reply_to: ReplyRef | None = None
    attachments: list[Attachment] = Field(default_factory=list)


class Participant(FromHost):
    id: Id
    name: Name


class Framing(FromHost):
    mode: Literal["respond", "judge"]
    reason: Literal["dm", "mention", "one_to_one", "group", "task"]
    participants: list[Participant] = Field(default_factory=list)


class HistoryEntry(FromHost):
    id: Id
    author: Author
    content: str
    created_at: datetime
    from_imp: bool = False


class DeliverParams(FromHost):
    message: Message
    framing: Framing
    recent: list[HistoryEntry] = Field(default_factory=list)
    now: datetime
    presence: list[PresenceEntry] = Field(default_factory=list, max_length=50)  # mechanism 10


Outcome = Literal["sent", "silent", "pending", "failed"]


class DeliverResult(FromBox):
    outcome: Outcome
    message_ids: list[Id] = Field(default_factory=list, max_length=100)
    error: str | None = Field(default=None, max_length=4_000)


TaskArg = str | int | float | bool | None


class TaskSpec(FromHost):
    id: Id
    kind: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,39}$")]  # an open set: prompt, reflect, ...
    prompt: str | None = None
    person: str | None = None
    # A kind's own arguments (issue 15: a ``sleep`` task's ``since`` and ``consolidate``); plain values only.
    args: dict[Annotated[str, Field(max_length=40)], TaskArg] = Field(default_factory=dict, max_length=16)


class TaskRunParams(FromHost):
    task: TaskSpec
    now: datetime


ReportValue = str | int | float | bool | None


class TaskRunResult(FromBox):
    outcome: Literal["done", "failed", "pending"]
    summary: str = Field(default="", max_length=20_000)
    # Structured observations (the lockdown probe uses it); an addition to §3.
    report: dict[Annotated[str, Field(max_length=64)], ReportValue] = Field(
        default_factory=dict, max_length=64
    )


class MailboxEventParams(FromHost):
    """Something happened in the channel that is not a message (a notification; no answer).

    ``kind`` is an open set; the box records the kinds it knows and ignores the rest.
    ``reaction_clear`` (ENV-13): every reaction was removed from ``message_id``; ``reactions``
    lists the emoji that were there (discord.py's ``on_reaction_clear(message, reactions)``).
    """

    kind: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,39}$")]
    channel_id: Id
    message_id: Id
    reactions: list[Annotated[str, Field(max_length=100)]] = Field(default_factory=list, max_length=100)
    at: datetime | None = None


# ---------------------------------------------------------------- box -> host

ModelPath = Literal["/chat/completions", "/responses", "/embeddings", "/images/generations", "/images/edits"]


class ModelRequestParams(FromBox):
    path: ModelPath
    body: dict[str, Any]
    purpose: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,39}$")]
    # Issue 38: the box gives the call up after ``timeout_s`` (its attempt timeout), and the host then ends the
    # upstream request too, its connection closed; None: the policy's [upstream] timeout_s. ``end_with_box``:
    # the call also ends when the box that asked does (a local server's compute is the host's own); False,
    # it is finished and charged what it cost (issue 19 #4b).
    timeout_s: float | None = Field(default=None, gt=0, le=3600)
    end_with_box: bool = False


class ModelRequestResult(FromHost):
    status: int
    body: Any = None
    headers: dict[str, str] = Field(default_factory=dict)


class SendFile(FromBox):
    filename: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^/\\\x00]+$")]
    data_b64: str


class DiscordSendParams(FromBox):
    channel_id: Id
    content: Annotated[str, Field(max_length=MAX_SEND_CONTENT_CHARS)]
    reply_to: Id | None = None
    files: list[SendFile] = Field(default_factory=list, max_length=MAX_SEND_FILES)
    kind: Literal["reply", "staff", "other"] = "reply"


class DiscordSendResult(FromHost):
    status: Literal["delivered", "pending"]
    message_ids: list[str] = Field(default_factory=list)
    gate_id: str | None = None


class HttpFetchParams(FromBox):
    url: Annotated[str, Field(min_length=1, max_length=MAX_URL_CHARS)]
    method: Literal["GET"] = "GET"
    max_bytes: int = Field(default=1_000_000, ge=1, le=10_000_000)


class HttpFetchResult(FromHost):
    status: int
    content_type: str = ""
    text: str = ""
    truncated: bool = False


Stage = Literal["context", "tools", "decision", "render", "send", "post", "failed"]


class TurnStageParams(FromBox):
    message_id: Id
    stage: Stage


class LogParams(FromBox):
    level: Literal["debug", "info", "warning", "error"]
    message: Annotated[str, Field(max_length=MAX_LOG_MESSAGE_CHARS)]
    fields: dict[Annotated[str, Field(max_length=64)], ReportValue] = Field(
        default_factory=dict, max_length=32
    )


# ---------------------------------------------------------------- method tables


@dataclass(frozen=True)
class MethodSpec:
    """One method of the protocol: its params model, and its result model (None = notification)."""

    name: str
    params: type[BaseModel]
    result: type[BaseModel] | None

    @property
    def is_notification(self) -> bool:
        return self.result is None


def _table(*specs: MethodSpec) -> dict[str, MethodSpec]:
    return {spec.name: spec for spec in specs}


# Methods the box serves (host -> box).
BOX_METHODS: dict[str, MethodSpec] = _table(
    MethodSpec("box.init", BoxInitParams, BoxInitResult),
    MethodSpec("mailbox.deliver", DeliverParams, DeliverResult),
    MethodSpec("task.run", TaskRunParams, TaskRunResult),
    MethodSpec("box.shutdown", EmptyFromHost, Empty),
    MethodSpec(
        "box.ready", EmptyFromHost, Empty
    ),  # issue 37: a spare is up, its program loaded; before init too
    MethodSpec("mailbox.event", MailboxEventParams, None),  # a notification (issue 6, ENV-13)
)

# Methods the host serves (box -> host).
HOST_METHODS: dict[str, MethodSpec] = _table(
    MethodSpec("model.request", ModelRequestParams, ModelRequestResult),
    MethodSpec("discord.send", DiscordSendParams, DiscordSendResult),
    MethodSpec("http.fetch", HttpFetchParams, HttpFetchResult),
    MethodSpec("memory.search", mem.SearchParams, mem.RecordsResult),
    MethodSpec("memory.recent", mem.RecentParams, mem.RecordsResult),
    MethodSpec("memory.about", mem.AboutParams, mem.RecordsResult),
    MethodSpec("memory.constructs", mem.ConstructsParams, mem.RecordsResult),
    MethodSpec("memory.episodes", mem.EpisodesParams, mem.EpisodesResult),
    MethodSpec("memory.encode", mem.EncodeParams, mem.EncodeResult),
    MethodSpec("memory.restore", mem.RestoreParams, mem.RestoreResult),
    MethodSpec("memory.conversation.get", mem.ConversationGetParams, mem.ConversationState),
    MethodSpec("memory.conversation.put", mem.ConversationPutParams, EmptyFromHost),
    MethodSpec("memory.construct", mem.ConstructParams, mem.ConstructResult),
    MethodSpec("memory.slot", mem.SlotParams, mem.SlotResult),
    MethodSpec("memory.slot.refresh", mem.SlotRefreshParams, mem.SlotResult),
    MethodSpec("memory.dispositions", mem.DispositionsParams, mem.DispositionsResult),
    MethodSpec("memory.dispositions.learn", mem.LearnParams, mem.LearnResult),
    MethodSpec("memory.night", mem.NightParams, mem.RecordsResult),
    MethodSpec("memory.consolidate", mem.ConsolidateParams, mem.ConsolidateResult),
    MethodSpec("memory.forget", mem.ForgetParams, mem.ForgetResult),
    MethodSpec("history.load", hist.HistoryLoadParams, hist.HistoryLoadResult),  # issue 22
    MethodSpec("history.commit", hist.HistoryCommitParams, hist.HistoryCommitResult),
    MethodSpec("turn.stage", TurnStageParams, None),
    MethodSpec("log", LogParams, None),
)
