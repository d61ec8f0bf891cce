"""The NDJSON codec: framing and the line-length limit (docs/protocol.md)."""

from __future__ import annotations

import pytest

from box.protocol.codec import FrameTooLarge, LineTooLong, NdjsonDecoder, encode_frame


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        ([b'{"a":1}\n'], [b'{"a":1}']),
        ([b'{"a":', b"1}\n"], [b'{"a":1}']),
        ([b'{"a":1}\n{"b":2}\n'], [b'{"a":1}', b'{"b":2}']),
        ([b'{"a":1}\r\n'], [b'{"a":1}']),
        ([b"\n\n  \n"], []),
        ([b'{"a":1}'], []),  # no newline yet: nothing complete
    ],
)
def test_decoder_splits_lines(chunks: list[bytes], expected: list[bytes]) -> None:
    decoder = NdjsonDecoder(max_line_bytes=64)
    out: list[bytes | LineTooLong] = []
    for chunk in chunks:
        out += decoder.feed(chunk)
    assert out == expected


def test_over_long_line_is_dropped_without_buffering_and_the_next_line_survives() -> None:
    decoder = NdjsonDecoder(max_line_bytes=10)
    out = decoder.feed(b"x" * 8)
    out += decoder.feed(b"y" * 100)
    assert decoder.pending_bytes == 108  # counted, but the buffer holds none of it
    assert decoder._buffer == bytearray()
    out += decoder.feed(b'zz\n{"ok":1}\n')
    assert out == [LineTooLong(110), b'{"ok":1}']


def test_line_exactly_at_the_limit_is_kept() -> None:
    decoder = NdjsonDecoder(max_line_bytes=10)
    assert decoder.feed(b"a" * 10 + b"\n") == [b"a" * 10]
    assert decoder.feed(b"a" * 11 + b"\n") == [LineTooLong(11)]


def test_encode_is_one_line_even_with_newlines_in_strings() -> None:
    line = encode_frame({"jsonrpc": "2.0", "method": "log", "params": {"message": "a\nb"}})
    assert line.endswith(b"\n") and line.count(b"\n") == 1


def test_encode_refuses_a_frame_over_the_limit() -> None:
    with pytest.raises(FrameTooLarge):
        encode_frame({"data": "x" * 100}, max_line_bytes=50)
