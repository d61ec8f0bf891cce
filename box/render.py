"""Turning an envelope into what gets posted (seed 003 ResponseRendering; SPEC-001 ENV-03, -08, -09).

One payload per post: the reply (text and its images together) and, separately, staff
notes and hack alerts for the imp's staff channel. Pure functions; the images themselves
are made by ``box.images``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from box.protocol.codec import FrameTooLarge, encode_frame
from box.protocol.models import MAX_SEND_CONTENT_CHARS, DiscordSendParams, SendFile

# ENV-08: @[label](url) → label, [label](url) → url.
_MENTION_LINK = re.compile(r"@\[([^\]]*)\]\(([^)\s]+)\)")
_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
_NO_CHANNEL = {"", "none", "null"}
STAFF_NOTE_CHARS = 1_800


def unwrap_links(text: str) -> str:
    """ENV-08: Discord shows raw URLs; markdown link syntax from the model reads as noise."""
    text = _MENTION_LINK.sub(lambda m: m.group(1), text)
    return _LINK.sub(lambda m: m.group(2), text)


@dataclass(frozen=True)
class Target:
    channel_id: str
    own: bool


def reply_target(channel: str | None, own_channel_id: str, own_channel_name: str = "") -> Target:
    """ENV-09: no channel (null, "none", empty) means the message's own channel; another one is its own act."""
    wanted = (channel or "").strip()
    if wanted.lower() in _NO_CHANNEL:
        return Target(own_channel_id, True)
    if wanted.startswith("<#") and wanted.endswith(">"):
        wanted = wanted[2:-1]  # a Discord channel mention
    if wanted.lstrip("#") in (own_channel_id, own_channel_name) and wanted:
        return Target(own_channel_id, True)
    return Target(wanted[:128], False)


PostKind = Literal["reply", "staff", "other"]


@dataclass
class Payload:
    """One post (seed 003: a single payload object): exactly what one ``discord.send`` carries and Discord
    renders — the text, its files (the turn's pictures), and the message it replies to — where it goes, and
    as which kind of act the gateway judges it. Nothing else: what went missing on the way is a turn note."""

    channel_id: str
    content: str
    kind: PostKind
    reply_to: str | None = None
    files: list[SendFile] = field(default_factory=list)

    def params(self) -> DiscordSendParams:
        return DiscordSendParams(
            channel_id=self.channel_id,
            content=self.content[:MAX_SEND_CONTENT_CHARS],
            reply_to=self.reply_to,
            files=self.files,
            kind=self.kind,
        )


def fit_files(payload: Payload, max_line_bytes: int) -> list[str]:
    """Drop files from the end until the send fits one protocol line; returns the dropped file names."""
    dropped: list[str] = []
    while payload.files:
        frame = {
            "jsonrpc": "2.0",
            "id": 2**31,
            "method": "discord.send",
            "params": payload.params().model_dump(mode="json"),
        }
        try:
            encode_frame(frame, max_line_bytes)
            break
        except FrameTooLarge:
            dropped.insert(0, payload.files.pop().filename)
    return dropped


def staff_note(imp: str, channel_label: str, author: str, note: str, staff_channel: str) -> Payload:
    """ENV-03: the envelope's staff note, as its own post to the imp's staff channel."""
    text = f"Staff note from {imp} ({channel_label}, talking with {author}): {note}"
    return Payload(staff_channel, text[:STAFF_NOTE_CHARS], "staff")


def hack_alert(imp: str, channel_label: str, author: str, excerpt: str, staff_channel: str) -> Payload:
    """A message that tried to subvert the imp, reported to the staff channel."""
    text = f'Possible manipulation attempt on {imp} ({channel_label}) by {author}: "{excerpt[:300]}"'
    return Payload(staff_channel, text[:STAFF_NOTE_CHARS], "staff")
