"""NDJSON framing for the box protocol: one UTF-8 JSON object per line, bounded length."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_LINE_BYTES = 1024 * 1024  # design.md §3: 1 MiB


@dataclass(frozen=True)
class LineTooLong:
    """Marks a line that exceeded the limit; its bytes were dropped, not buffered."""

    size: int


class FrameTooLarge(ValueError):
    """An outgoing frame would exceed the line limit."""


def encode_frame(frame: dict[str, Any], max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> bytes:
    """Serialise one frame as a single line. JSON escapes newlines inside strings."""
    line = json.dumps(frame, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
    if len(line) > max_line_bytes:
        raise FrameTooLarge(f"frame of {len(line)} bytes exceeds the {max_line_bytes}-byte line limit")
    return line


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
