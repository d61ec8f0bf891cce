"""The Docker Engine's multiplexed attach stream (a container without a TTY): stdout and stderr on one socket.

Each frame is an 8-byte header — the stream (1 stdout, 2 stderr; 0 stdin, shown as stdout), three zero bytes,
the payload's size as a big-endian uint32 — then the payload. The engine writes the headers; the box writes
only payloads, so a box cannot forge a frame. Pure: bytes in, ``(stream, payload)`` pieces out, byte-exact,
with a payload handed on as it arrives (a frame is never buffered whole) and a header split across reads kept.
"""

from __future__ import annotations

from dataclasses import dataclass

STDOUT = 1
STDERR = 2
HEADER_BYTES = 8
_STREAMS = {0: STDOUT, 1: STDOUT, 2: STDERR}  # the engine documents 0 (stdin) as written on stdout


class MultiplexError(ValueError):
    """The engine's stream is not the multiplexed format (e.g. a container created with a TTY)."""


@dataclass
class MultiplexDecoder:
    """Splits the engine's attach stream into ``(STDOUT | STDERR, payload)`` pieces."""

    _header: bytearray | None = None
    _stream: int = STDOUT
    _left: int = 0  # payload bytes of the current frame still to come

    def feed(self, chunk: bytes) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        view = memoryview(chunk)
        at, end = 0, len(chunk)
        while at < end:
            if self._left:
                take = min(self._left, end - at)
                out.append((self._stream, bytes(view[at : at + take])))
                self._left -= take
                at += take
                continue
            if self._header is None and end - at >= HEADER_BYTES:  # the common case: a whole header here
                header = view[at : at + HEADER_BYTES]
                at += HEADER_BYTES
            else:
                partial = self._header if self._header is not None else bytearray()
                take = min(HEADER_BYTES - len(partial), end - at)
                partial += view[at : at + take]
                at += take
                if len(partial) < HEADER_BYTES:
                    self._header = partial
                    break
                header, self._header = memoryview(bytes(partial)), None
            stream = _STREAMS.get(header[0])
            if stream is None or header[1] or header[2] or header[3]:
                raise MultiplexError(f"not a multiplexed frame header: {bytes(header).hex()}")
            self._stream = stream
            self._left = int.from_bytes(header[4:8], "big")
        return out

    @property
    def inside_frame(self) -> bool:
        """Whether the stream stopped inside a frame (what EOF would cut off)."""
        return bool(self._left) or self._header is not None


def frame(stream: int, payload: bytes) -> bytes:
    """One frame as the engine writes it (for tests and fakes of the engine)."""
    return bytes([stream, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload
