"""A message as a surface hands it in (docs/conversation.md): the wake facts beside it, its text and attachments bounded.

Every surface (Discord, the terminal) builds an ``Inbound``; the conversation pipeline cleans and bounds it
before anything is stored or routed. Messages are content, never commands: nothing here reads the text.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from box.protocol.models import Attachment, Message

MAX_INBOUND_CHARS = 8_000  # beyond Discord's own 4000 (Nitro); anything longer is cut, visibly
# The operator's own terminal: a pasted file or log arrives whole (issue 17); one delivery still fits its line.
MAX_TERMINAL_CHARS = 50_000
MAX_ATTACHMENTS = 10
MAX_ATTACHMENT_BYTES = 8 * 1024 * 1024  # larger attachments reach the box as metadata only
MAX_ATTACHMENT_DATA_B64 = 700_000  # all attachment data of one message: a delivery must fit the 1 MiB line


@dataclass(frozen=True)
class Inbound:
    """A message as a surface hands it in, with the facts the wake rule needs."""

    surface: str
    channel_id: str
    channel_kind: Literal["dm", "guild", "terminal"]
    message: Message
    channel_name: str = ""
    guild_id: str | None = None
    audience: str | None = (
        None  # a guild channel's: guild | private | None, the surface cannot tell (issue 32 #4)
    )
    author_is_imp: bool = False
    mentions_imp: bool = False
    mentions_imp_role: bool = False
    replies_to_imp: bool = False
    mentions_everyone: bool = False
    max_chars: int = MAX_INBOUND_CHARS  # the terminal allows MAX_TERMINAL_CHARS

    @property
    def from_a_bot(self) -> bool:
        """Bots (other imps included) and the imp itself: never stored as conversation, never woken by."""
        return self.message.author.bot or self.author_is_imp


def clean_content(text: str, limit: int = MAX_INBOUND_CHARS) -> str:
    """Printable text only (no NULs or control bytes), bounded to ``limit``, with the cut made visible."""
    kept = "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch)[0] != "C")
    return bounded(kept, limit).strip()


def bounded(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how many more there were."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[… {len(text) - limit} more characters not shown]"


def bound_attachments(items: Sequence[Attachment]) -> list[Attachment]:
    """At most ``MAX_ATTACHMENTS``; data only while the message's total fits one protocol line."""
    bounded = []
    budget = MAX_ATTACHMENT_DATA_B64
    for item in list(items)[:MAX_ATTACHMENTS]:
        data = item.data_b64 or ""
        if item.size > MAX_ATTACHMENT_BYTES or len(data) > budget:
            item = item.model_copy(update={"data_b64": None})  # the box learns it exists, not its bytes
        else:
            budget -= len(data)
        bounded.append(item)
    return bounded
