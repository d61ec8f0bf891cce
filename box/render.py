"""Turning an envelope into what gets posted (seed 003 ResponseRendering; SPEC-001 ENV-03, -08, -09 widened).

One payload per post: the reply (text and its images together) and, separately, staff
notes and hack alerts for the imp's staff channel. Pure functions; the images themselves
are made by ``box.images``.
"""

from __future__ import annotations

import re
from collections.abc import Collection
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
    unknown: str | None = None  # issue 38: what the envelope named that the imp cannot address


def reply_target(
    channel: str | None,
    own_channel_id: str,
    own_channel_name: str = "",
    addressable: Collection[str] = (),
) -> Target:
    """ENV-09, widened (issue 38): where the reply goes.

    No channel (null, "none", empty) is the message's own channel (ENV-09). A channel the imp can address —
    its own by id, ``<#id>`` mention or name, or one of ``addressable`` (the host's ``post_channels``, the
    other channels its policy lets it post to) — is that channel; another one is an act of its own there.
    Anything else — free text a small model copied from the prompt ("a terminal session"), a name or id the
    imp cannot post to — is the conversation's own channel too, never a post the policy would deny: the
    reply reaches the person, and ``unknown`` keeps what was named so the turn can say so.
    """
    wanted = (channel or "").strip()
    if wanted.lower() in _NO_CHANNEL:
        return Target(own_channel_id, True)
    named = wanted
    if named.startswith("<#") and named.endswith(">"):
        named = named[2:-1]  # a Discord channel mention
    named = named.lstrip("#").strip()
    if named and named in (own_channel_id, own_channel_name):
        return Target(own_channel_id, True)
    if named and named in addressable and named != own_channel_id:
        return Target(named, False)
    return Target(own_channel_id, True, unknown=wanted[:128])


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
