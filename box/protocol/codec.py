"""NDJSON framing for the box protocol: one UTF-8 JSON object per line, bounded length."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pydantic import BaseModel

DEFAULT_MAX_LINE_BYTES = 1024 * 1024  # docs/protocol.md: 1 MiB
# No frame of the protocol nests deeper than a model body with a JSON schema in it; far below what
# recursion in json.loads, pydantic or json.dumps can take (issue 11 #1: 100,000 levels crashed the host).
MAX_FRAME_DEPTH = 64
_CONTAINERS = (dict, list)  # what json.loads makes containers of
# For the depth bound read off a line's bytes: quotes and brackets stay, every other byte goes, and the
# brackets become parentheses (a well-nested line of both kinds nests as its parentheses do).
_NOT_STRUCTURE = bytes(byte for byte in range(256) if byte not in b'"[]{}')
_PARENTHESES = bytes.maketrans(b"[]{}", b"()()")
# One encoder for every frame: json.dumps with these arguments builds a new one at each call (issue 18).
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class LineTooLong:
    """Marks a line that exceeded the limit; its bytes were dropped, not buffered."""

    size: int


class FrameInvalid(ValueError):
    """A line that is not one acceptable JSON value: not UTF-8, not JSON, or nested too deep."""


def decode_frame(line: bytes, max_depth: int = MAX_FRAME_DEPTH) -> Any:
    """Parse one line. Every failure — whatever the bytes make the parser raise — is ``FrameInvalid``.

    The bytes come from the other side, which may be hostile: no exception they cause may escape
    as anything the caller does not expect (issue 11 #1).
    """
    try:
        value = json.loads(line)
    except RecursionError as exc:
        raise FrameInvalid(f"nested deeper than {max_depth} levels") from exc
    except (ValueError, TypeError, MemoryError) as exc:  # UnicodeDecodeError is a ValueError
        raise FrameInvalid("not JSON") from exc
    if line.count(b"[") + line.count(b"{") > max_depth:  # (fewer brackets cannot nest deeper)
        bound = bracket_depth(line, max_depth)
        if (bound is None or bound > max_depth) and nesting_depth(value, max_depth) > max_depth:
            raise FrameInvalid(f"nested deeper than {max_depth} levels")
    return value


def bracket_depth(line: bytes, limit: int) -> int | None:
    """How deep the brackets outside strings nest in ``line``, a line ``json.loads`` accepted, counted up to
    ``limit + 1``: at least the depth of the value it parsed to (each of its containers is a bracket pair; a
    repeated key may drop one, never add one). None when the bytes alone cannot tell: the line is not UTF-8 (a
    NUL byte: UTF-16 or UTF-32, which json.loads reads too), or a string holds a bracket. A few byte operations
    in C, where walking the parsed value of a frame carrying 50 messages costs several times more (issue 18).

    Once the escaped backslashes and then the escaped quotes are gone, every quote left opens or closes a
    string, so a bracket is inside a string exactly when an odd number of quotes come before it. Dropping
    adjacent pairs of quotes keeps that count's parity at every bracket: when no quote is left, no bracket was
    inside a string, and what is left is the value's brackets in order. Each round of dropping every ``()``
    peels the innermost level off: the depth is the number of rounds that empty it."""
    if b"\x00" in line:
        return None
    if b"\\" in line:
        line = line.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = line.translate(_PARENTHESES, _NOT_STRUCTURE).replace(b'""', b"")
    if b'"' in brackets:
        return None
    depth = 0
    while brackets:
        if depth > limit:
            return depth
        brackets = brackets.replace(b"()", b"")
        depth += 1
    return depth


def nesting_depth(value: Any, limit: int) -> int:
    """How deep containers nest in a parsed JSON value (a scalar is 0), counted up to ``limit + 1``.

    Level by level, so it cannot itself run out of stack; stops as soon as the limit is passed. A container's
    children are looked at one by one only when one of them is a container (``set(map(type, …))`` runs in C):
    most of a frame's containers hold only scalars (issue 18)."""
    level = [value] if type(value) in _CONTAINERS else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return depth
        deeper: list[Any] = []
        for item in level:
            children = item.values() if type(item) is dict else item
            kinds = set(map(type, children))
            if dict in kinds or list in kinds:
                deeper += [child for child in children if type(child) in _CONTAINERS]
        level = deeper
    return depth


class FrameTooLarge(ValueError):
    """An outgoing frame would exceed the line limit."""


def encode_frame(frame: dict[str, Any], max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> bytes:
    """Serialise one frame as a single line. JSON escapes newlines inside strings."""
    line = _ENCODER.encode(frame).encode("utf-8") + b"\n"
    if len(line) > max_line_bytes:
        raise FrameTooLarge(f"frame of {len(line)} bytes exceeds the {max_line_bytes}-byte line limit")
    return line


def encode_model_frame(
    frame: dict[str, Any], key: str, model: BaseModel, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> bytes:
    """The line of ``{**frame, key: model.model_dump(mode="json")}``, with the model serialised straight to JSON
    by its own serializer: no dict of it built and walked again (issue 18). The same JSON value; only a float's
    spelling may differ (``1e-7`` for ``1e-07``)."""
    body = model.__pydantic_serializer__.to_json(model)
    pair = b"%s:%s}\n" % (_json_key(key), body)
    head = _ENCODER.encode(frame).encode("utf-8")
    line = head[:-1] + (b"," if frame else b"") + pair
    if len(line) > max_line_bytes:
        raise FrameTooLarge(f"frame of {len(line)} bytes exceeds the {max_line_bytes}-byte line limit")
    return line


@lru_cache(maxsize=16)
def _json_key(key: str) -> bytes:
    """A frame's key as JSON (the peer's are "params" and "result")."""
    return json.dumps(key).encode()


class NdjsonDecoder:
    """Splits a byte stream into lines without ever holding more than the limit.

    ``feed`` returns complete lines (without the newline) and a ``LineTooLong``
    marker for each over-long line, whose bytes are discarded as they arrive.
    """

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self.max_line_bytes = max_line_bytes
        self._buffer = bytearray()
        self._discarding = 0  # >0: inside an over-long line, this many bytes dropped so far

    def feed(self, chunk: bytes) -> list[bytes | LineTooLong]:
        out: list[bytes | LineTooLong] = []
        start = 0
        while start < len(chunk):
            newline = chunk.find(b"\n", start)
            end = len(chunk) if newline < 0 else newline
            piece = chunk[start:end]
            if self._discarding:
                self._discarding += len(piece)
            elif len(self._buffer) + len(piece) > self.max_line_bytes:
                self._discarding = len(self._buffer) + len(piece)
                self._buffer.clear()
            else:
                self._buffer += piece
            if newline < 0:
                break
            if self._discarding:
                out.append(LineTooLong(self._discarding))
                self._discarding = 0
            else:
                line = bytes(self._buffer).rstrip(b"\r")
                self._buffer.clear()
                if line.strip():
                    out.append(line)
            start = newline + 1
        return out

    @property
    def pending_bytes(self) -> int:
        """Bytes of an unfinished line (what EOF would cut off)."""
        return self._discarding or len(self._buffer)
