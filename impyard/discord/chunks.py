"""Split a reply into Discord-sized messages (2000 characters) without breaking code fences.

Cuts prefer, in order: a paragraph break, a line break, the end of a sentence,
a space; only a single unbroken run longer than a message is cut hard. A chunk
that ends inside a ``` fence is closed there and the fence (with its language)
is reopened at the start of the next chunk, so every chunk renders on its own.
"""

from __future__ import annotations

import re

DISCORD_MESSAGE_LIMIT = 2000
_FENCE = re.compile(r"^\s*```(\S*)", re.MULTILINE)
_SENTENCE_END = re.compile(r"[.!?…][\"')\]]*\s")


def _fence_state(text: str, open_lang: str | None) -> str | None:
    """The language of the fence still open at the end of ``text`` (``""`` for a bare one), else None."""
    for match in _FENCE.finditer(text):
        open_lang = None if open_lang is not None else match.group(1)
    return open_lang


def _cut_point(text: str, window: int) -> int:
    """Where to end a chunk of at most ``window`` characters of ``text``."""
    head = text[:window]
    floor = window // 3  # never make a tiny chunk just to hit a nicer boundary
    for boundary in ("\n\n", "\n"):
        at = head.rfind(boundary)
        if at > floor:
            return at + len(boundary)
    ends = [match.end() for match in _SENTENCE_END.finditer(head)]
    if ends and ends[-1] > floor:
        return ends[-1]
    at = head.rfind(" ")
    if at > floor:
        return at + 1
    return window


def chunk_message(text: str, limit: int = DISCORD_MESSAGE_LIMIT) -> list[str]:
    if limit < 50:
        raise ValueError("a chunk limit below 50 characters leaves no room for code fences")
    if len(text) <= limit:
        return [text] if text else []
    chunks: list[str] = []
    open_lang: str | None = None
    rest = text
    while rest:
        prefix = f"```{open_lang}\n" if open_lang is not None else ""
        if len(prefix) + len(rest) <= limit:
            chunks.append(prefix + rest)
            break
        closing_room = 4  # "\n```" if this chunk ends inside a fence
        window = limit - len(prefix) - closing_room
        cut = _cut_point(rest, window)
        body, rest = rest[:cut], rest[cut:]
        state = _fence_state(body, open_lang)
        chunk = prefix + body.rstrip("\n") if state is None else prefix + body.rstrip("\n") + "\n```"
        chunks.append(chunk)
        open_lang = state
        if state is None:
            rest = rest.lstrip("\n")
    return [chunk for chunk in chunks if chunk.strip()]
