"""The prompt package of one turn (seed 003 ContextBuilding; SPEC-001 ENV-10, ENV-20; issue 33).

The reply request is laid out stable-first, so the provider's prompt cache hits (ENV-20's purpose):

1. **The system message** (the Responses API's ``instructions``): the persona — the operator's template with the
   legacy ``{date}``, ``{time}``, ``{news}`` and ``{memory}`` placeholders removed — then the memory engine's static
   rules when memory is on (issue 23: mechanisms 7, 8, 13, 56), then ``LAYOUT_NOTE`` (where the turn's context is).
   Byte-identical from call to call and from turn to turn.
2. **The history**: the conversation before the current message, a window that moves in steps (``box.history``), so
   consecutive turns share it.
3. **The current message**, opened by this turn's ``## Context``: the date, time, channel, the version line (the
   imp's configured model and the impyard release, seed 003), news (when the host sent the news file's text), the
   framing note — what the framing asks of the model, and in every framing where it may stay silent, what a silent
   answer means (ENV-02, ENV-04) — and last the memory block (when the memory engine gave one: it is the part a
   second hop of the same turn recomposes, mechanism 36), then ``## Message`` and the message itself.
4. Tool rounds, appended after it.

**Departure from ENV-10's letter** (docs/conversation.md): ENV-10 puts the dynamic context in a suffix of the
*system* message, before the history; that makes every request differ from the previous turn's right after the
persona (0.14 of a request shared, issue 33). The context now opens the current *user* message instead — not a
second system message, which strict local chat templates refuse when it is not first (llama.cpp serving Qwen3.x:
"System message must be at the beginning", llama.cpp issues #20733 and #27367), and not a message of its own,
which templates that require user and assistant to alternate refuse. That form works alike on chat/completions,
the Responses API and local servers. ``LAYOUT_NOTE`` tells the model that the context is impyard's, not the
person's.

Pure functions of plain values: the machine gathers the facts, this module only arranges them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from box import __version__ as box_version
from box.history import PromptEntry
from box.protocol.models import Attachment, Framing, ImpSpec, Message, SessionInfo

# ENV-10 / ENV-20: the old inline placeholders; their values now live in the turn's ## Context.
LEGACY_PLACEHOLDERS = re.compile(r"\{(?:date|time|news|memory)\}")
MAX_REPLY_EXCERPT_CHARS = 300
# Static (part of the byte-stable system text): where this turn's context is, and that a person did not write it.
LAYOUT_NOTE = (
    "The newest message opens with this turn's context (date, time, channel, notes and what you remember), "
    'written by impyard, not by the person; what they wrote follows the line "## Message".'
)
CONTEXT_HEADER = "## Context"
MESSAGE_HEADER = "## Message"

# What a silent answer means, told in every framing where the model may choose it (ENV-02, ENV-04).
SILENT_MEANS = "A silent answer (answer_needed false) posts nothing; the message stays in the conversation."
JUDGE_NOTE = (
    "Several people are talking here. Reply only when you are addressed or have something genuinely useful "
    "to add; otherwise set answer_needed to false. Staying silent is fine. " + SILENT_MEANS
)
ADDRESSED_NOTE = "You were addressed directly in this message: your answer is posted."
DM_NOTE = "This is a direct message: the person expects an answer, and your answer is posted."
ONE_TO_ONE_NOTE = (
    'You are talking with one person here. When their message needs no reply (a "brb", an "ok", a '
    "goodbye), set answer_needed to false. " + SILENT_MEANS
)
ONE_TO_ONE_ADDRESSED_NOTE = "You are talking with one person here. " + ADDRESSED_NOTE
TASK_NOTE = (
    "This is a scheduled task, not a chat message. Set answer_needed to true only when your answer should be "
    "posted to the channel."
)


@dataclass(frozen=True)
class VersionInfo:
    """Seed 003 version metadata: the imp's configured model and the impyard release it runs on."""

    model: str
    impyard: str

    def line(self) -> str:
        return f"Running as: model {self.model} on impyard {self.impyard}"


def persona_prefix(imp: ImpSpec) -> str:
    """ENV-20: the static persona, every dynamic placeholder removed. Byte-stable for a given imp."""
    persona = LEGACY_PLACEHOLDERS.sub("", imp.persona).strip()
    return persona or f"You are {imp.name}, a helpful companion in a chat."


def _channel_line(session: SessionInfo) -> str:
    if session.channel_kind == "dm":
        return "Channel: a direct message"
    if session.channel_kind == "terminal":
        return "Channel: a terminal session"
    if session.channel_kind == "task":
        return "Channel: a scheduled task"
    return f"Channel: #{session.channel_name}" if session.channel_name else f"Channel: {session.channel_id}"


def framing_note(framing: Framing, *, addressed: bool = False) -> str | None:
    """What the framing asks of the model; ``addressed``: the message mentions the imp or replies to it."""
    if framing.reason == "task":
        return TASK_NOTE
    if framing.mode == "judge":
        note = JUDGE_NOTE
        if framing.participants:
            note += "\nPeople here: " + ", ".join(p.name for p in framing.participants[:20])
        if framing.reason == "mention" or addressed:
            note += "\n" + ADDRESSED_NOTE
        return note
    if framing.reason == "dm":
        return DM_NOTE  # ENV-04
    if framing.reason == "mention" or addressed:
        return ONE_TO_ONE_ADDRESSED_NOTE  # ENV-04: addressed directly
    return ONE_TO_ONE_NOTE  # ENV-02: a one-to-one server channel, the message addressed to nobody


def context_suffix(
    now: datetime,
    session: SessionInfo,
    framing: Framing,
    *,
    news: str | None,
    memory: str | None,
    addressed: bool = False,
    version: VersionInfo | None = None,
) -> str:
    """ENV-10: date, time, channel, news, the framing note, memory — everything that changes from call to call.

    It opens the current message (``with_context``), after the history (issue 33). The memory block comes last: it
    is the only part a later hop of the same turn recomposes (mechanism 36), so the hops share all before it."""
    at = now.astimezone(UTC)
    lines = [CONTEXT_HEADER, f"Date: {at:%Y-%m-%d (%A)}", f"Time: {at:%H:%M} UTC", _channel_line(session)]
    if version is not None:
        lines.append(version.line())  # seed 003: version metadata
    if news and news.strip():
        lines += ["", "### News", news.strip()]
    note = framing_note(framing, addressed=addressed)
    if note:
        lines += ["", note]
    if memory and memory.strip():
        lines += ["", "### Memory", memory.strip()]
    return "\n".join(lines)


def system_message(prefix: str) -> str:
    """The whole system text: the byte-stable prefix and where the turn's context is (ENV-20, issue 33)."""
    return f"{prefix}\n\n{LAYOUT_NOTE}"


def with_context(context: str, content: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """The current message's content opened by the turn's context (issue 33): a string, or the first text part."""
    if isinstance(content, str):
        return f"{context}\n\n{MESSAGE_HEADER}\n{content}"
    parts = list(content)
    for index, part in enumerate(parts):
        if part.get("type") == "text":
            parts[index] = {**part, "text": with_context(context, str(part.get("text", "")))}
            return parts
    return [{"type": "text", "text": f"{context}\n\n{MESSAGE_HEADER}"}, *parts]


# ------------------------------------------------------------------ the conversation


def is_image(attachment: Attachment) -> bool:
    return attachment.content_type.startswith("image/") and bool(attachment.data_b64)


def data_url(attachment: Attachment) -> str:
    return f"data:{attachment.content_type};base64,{attachment.data_b64}"


def message_body(message: Message) -> str:
    """What the message says, with what came with it (images are described when their bytes did not come)."""
    parts = [message.content]
    for item in message.attachments:
        if not is_image(item):
            parts.append(f"[attachment: {item.filename}, {item.content_type}, {item.size} bytes]")
    return "\n".join(part for part in parts if part)


def message_text(message: Message) -> str:
    """The message as one line of talk: what it answers, who said it, what came with it."""
    prefix = ""
    if message.reply_to is not None:
        who = message.reply_to.author.name if message.reply_to.author else "someone"
        prefix = f'(in reply to {who}: "{message.reply_to.content[:MAX_REPLY_EXCERPT_CHARS]}")\n'
    return f"{prefix}{message.author.name}: {message_body(message)}"


def user_content(message: Message) -> str | list[dict[str, Any]]:
    """A plain string, or text plus image parts when the message carries images (the vision model reads them)."""
    text = message_text(message)
    images = [item for item in message.attachments if is_image(item)]
    if not images:
        return text
    return [
        {"type": "text", "text": text},
        *({"type": "image_url", "image_url": {"url": data_url(i)}} for i in images),
    ]


def entry_message(entry: PromptEntry) -> dict[str, Any]:
    if entry.role == "assistant":
        return {"role": "assistant", "content": entry.content}
    if entry.role == "event":
        return {"role": "user", "content": f"[{entry.content}]"}
    return {"role": "user", "content": f"{entry.author}: {entry.content}"}


@dataclass
class PromptPackage:
    """Everything the reply call needs; mutable during the turn (tool rounds append to ``messages``).

    ``messages`` holds the history, then the current message (at ``current``) as the person wrote it, then tool
    rounds; the turn's context (``suffix``) is put into the current message only when a request is made
    (``conversation``), so a later hop can recompose it (mechanism 36)."""

    prefix: str  # the persona and the memory rules: byte-stable (ENV-20)
    suffix: str  # this turn's ## Context (ENV-10), opening the current message (issue 33)
    messages: list[
        dict[str, Any]
    ]  # the conversation after the system message; the current message at ``current``
    image_urls: list[str] = field(default_factory=list)  # data URLs of the message's images
    tool_results: int = 0  # how many tool results have been appended
    version: VersionInfo | None = None  # seed 003: the imp's model and impyard's version (also in ``suffix``)
    current: int = -1  # the index of the current message in ``messages`` (-1: the last one, as built)

    def __post_init__(self) -> None:
        if self.current < 0:
            self.current += len(self.messages)

    @property
    def system(self) -> str:
        return system_message(self.prefix)

    @property
    def has_images(self) -> bool:
        return bool(self.image_urls)

    def conversation(self) -> list[dict[str, Any]]:
        """The messages after the system message as sent: the history, the current message opened by the turn's
        context, the tool rounds."""
        out = list(self.messages)
        if 0 <= self.current < len(out):
            message = out[self.current]
            out[self.current] = {**message, "content": with_context(self.suffix, message["content"])}
        return out

    def chat_messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.system}, *self.conversation()]


def build_package(
    imp: ImpSpec,
    session: SessionInfo,
    message: Message,
    framing: Framing,
    now: datetime,
    history: Sequence[PromptEntry],
    *,
    news: str | None,
    memory: str | None,
    rules: str | None = None,
    version: VersionInfo | None = None,
) -> PromptPackage:
    """The whole prompt package of one turn (seed 003 ContextBuilding); ``version`` defaults to the imp's
    configured model on this box's own release."""
    version = version or VersionInfo(imp.responder.model, box_version)
    messages = [entry_message(entry) for entry in history]
    messages.append({"role": "user", "content": user_content(message)})
    prefix = persona_prefix(imp)
    if rules and rules.strip():  # static for the imp, so the prefix stays byte-stable (ENV-20)
        prefix = f"{prefix}\n\n{rules.strip()}"
    return PromptPackage(
        prefix=prefix,
        suffix=context_suffix(
            now, session, framing, news=news, memory=memory, addressed=message.mentions_imp, version=version
        ),
        messages=messages,
        image_urls=[data_url(item) for item in message.attachments if is_image(item)],
        version=version,
    )


def split_context(content: str) -> tuple[str, str]:
    """A current message's text as (its ``## Context``, what follows ``## Message``); ("", text) for a message that
    has none (a history line). For tests and the benchmark, which read captured requests."""
    if not content.startswith(CONTEXT_HEADER + "\n"):
        return "", content
    context, marker, rest = content.partition(f"\n\n{MESSAGE_HEADER}\n")
    return (context, rest) if marker else ("", content)


def turn_context(messages: Sequence[dict[str, Any]]) -> str:
    """The ``## Context`` of a chat request's current message (the last user message that has one), or ""."""
    for message in reversed(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = next(
                (
                    p.get("text")
                    for p in content
                    if isinstance(p, dict) and p.get("type") in ("text", "input_text")
                ),
                None,
            )
        if message.get("role") == "user" and isinstance(content, str):
            context, _ = split_context(content)
            if context:
                return context
    return ""


def memory_block_of(messages: Sequence[dict[str, Any]]) -> str:
    """The ``### Memory`` block of a chat request's turn context (it ends the context), or "" when it has none."""
    context = turn_context(messages)
    return context.split("\n### Memory\n", 1)[1] if "\n### Memory\n" in context else ""
