"""Framing without waste (issue 18): a model goes onto the wire serialised once, as the same JSON value the dict
round trip made; a frame's depth is checked only when its brackets could nest past the limit, first on its bytes
(the brackets outside strings), and the check still refuses every frame that does and no frame it did not."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from pydantic import BaseModel

from box.protocol.codec import (
    MAX_FRAME_DEPTH,
    FrameInvalid,
    FrameTooLarge,
    bracket_depth,
    decode_frame,
    encode_frame,
    encode_model_frame,
    nesting_depth,
)
from box.protocol.models import LogParams, ModelRequestParams


class Loose(BaseModel):
    value: Any = None
    ratio: float = 0.5
    text: str = ""


MODELS: list[BaseModel] = [
    LogParams(
        level="info", message='ünïcode ✓ \u2028 line\nbreak "quoted" \\ back\x00slash', fields={"n": 3}
    ),
    ModelRequestParams(
        path="/chat/completions",
        body={"messages": [{"role": "user", "content": "hi [there] {you}"}] * 5, "n": 2**70, "t": None},
        purpose="reply",
    ),
    Loose(value={"deep": [[[{"x": [1, 2.5, True, None]}]]]}, ratio=1e-7, text="e"),
    Loose(),
]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: type(m).__name__)
@pytest.mark.parametrize(
    "head", [{"jsonrpc": "2.0", "id": 7, "method": "log"}, {"jsonrpc": "2.0", "id": "s"}, {}]
)
def test_a_model_frame_is_the_json_of_its_dict(head: dict[str, Any], model: BaseModel) -> None:
    line = encode_model_frame(head, "params", model)
    through_dict = encode_frame({**head, "params": model.model_dump(mode="json")})
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == json.loads(through_dict)
    if (
        not isinstance(model, Loose) or model.ratio != 1e-7
    ):  # only a float's spelling may differ (1e-7, 1e-07)
        assert line == through_dict


def test_a_model_frame_over_the_limit_is_refused() -> None:
    with pytest.raises(FrameTooLarge):
        encode_model_frame({"jsonrpc": "2.0"}, "params", Loose(text="x" * 100), max_line_bytes=64)


@pytest.mark.parametrize(
    ("value", "depth"),
    [
        (1, 0),
        ("[[[", 0),
        ([], 1),
        ({"a": 1}, 1),
        ({"a": [{}]}, 3),
        ([[1], {"b": [[2]]}], 4),
        ([[[[[[]]]]]], 6),
    ],
)
def test_nesting_depth(value: Any, depth: int) -> None:
    assert nesting_depth(json.loads(json.dumps(value)), 64) == depth


def test_nesting_depth_stops_past_the_limit() -> None:
    value: Any = 1
    for _ in range(500):
        value = {"a": [value]}
    assert nesting_depth(value, 10) == 11


def _dicts(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


@pytest.mark.parametrize(
    ("line", "ok"),
    [
        (_dicts(MAX_FRAME_DEPTH), True),
        (_dicts(MAX_FRAME_DEPTH + 1), False),
        (b'{"a":[' + b"[1]," * 200 + b"1]}", True),  # many brackets, shallow
        (b'{"text":"' + b"[{" * 500 + b'"}', True),  # brackets inside a string nest nothing
        (b'{"text":"' + b"[" * 100 + b'","deep":' + _dicts(MAX_FRAME_DEPTH) + b"}", False),
        (b'{"text":"' + b"[" * 100 + b'","deep":' + _dicts(MAX_FRAME_DEPTH + 1) + b"}", False),
        # quotes and backslashes inside strings do not hide a level
        (b'{"q":"\\"","deep":' + _dicts(MAX_FRAME_DEPTH + 1) + b"}", False),
        (b'{"q":"\\\\","deep":' + _dicts(MAX_FRAME_DEPTH + 1) + b"}", False),
        (b'{"q":"\\\\\\"]]]]","deep":' + _dicts(MAX_FRAME_DEPTH + 1) + b"}", False),
        (b'{"q":"\\\\\\"]]]]","deep":' + _dicts(MAX_FRAME_DEPTH - 1) + b"}", True),
        # UTF-16 (json.loads reads it; its bytes are not its characters)
        (_dicts(MAX_FRAME_DEPTH + 1).decode().encode("utf-16"), False),
        (_dicts(MAX_FRAME_DEPTH).decode().encode("utf-16"), True),
        # a repeated key drops the deep value: the value is what counts, as it always did
        (b'{"a":' + _dicts(MAX_FRAME_DEPTH + 1) + b',"a":1}', True),
        (b'{"a":1,"a":' + _dicts(MAX_FRAME_DEPTH + 1) + b"}", False),
    ],
)
def test_the_depth_limit_holds_whatever_the_brackets(line: bytes, ok: bool) -> None:
    if ok:
        decode_frame(line)
    else:
        with pytest.raises(FrameInvalid, match="nested deeper"):
            decode_frame(line)


@pytest.mark.parametrize(
    ("line", "depth"),
    [
        (b"1", 0),
        (b"[]", 1),
        (b'{"a":1}', 1),
        (b'{"a":[{}]}', 3),
        (b'[[1],{"b":[[2]]}]', 4),
        (b'{"a":"x\\"y","b":[[]]}', 3),  # an escaped quote is text
        (b'{"a":"x\\\\","b":[[]]}', 3),  # an escaped backslash, then the string's closing quote
        (b'{"a":"\\u005b","b":[]}', 2),  # an escaped bracket is no bracket byte
        ('{"ä":["✓ ☃"]}'.encode(), 2),
        (b'\xef\xbb\xbf{"a":[]}', 2),  # a UTF-8 byte order mark
        (b'{"a":[[1]],"a":1}', 3),  # the bytes' depth: a repeated key may hide a level from the value
        # the bytes alone cannot tell
        (b'"[[["', None),
        (b'{"a":"x\\\\\\"[","b":1}', None),  # escaped backslash, escaped quote, a bracket: all text
        ('{"ä":"✓ []"}'.encode(), None),
        ('{"a":[]}'.encode("utf-16"), None),
        ('{"a":[]}'.encode("utf-32"), None),
    ],
)
def test_bracket_depth(line: bytes, depth: int | None) -> None:
    json.loads(line)  # a line json.loads accepts
    assert bracket_depth(line, 64) == depth


def test_bracket_depth_stops_past_the_limit() -> None:
    assert bracket_depth(b"[" * 500 + b"]" * 500, 10) == 11
    assert bracket_depth(b"[" * 11 + b"]" * 11, 10) == 11
    assert bracket_depth(b"[" * 10 + b"]" * 10, 10) == 10


def _value(rng: random.Random, depth: int) -> Any:
    """A random JSON value; its strings hold brackets, quotes, backslashes and non-ASCII text, or none of them."""
    kind = rng.randrange(6 if depth < 8 else 3)
    if kind == 0:
        return rng.choice([None, True, 1, -2.5, 1e-7])
    if kind in (1, 2):
        return "".join(rng.choice(STRING_CHARS[rng.randrange(2)]) for _ in range(rng.randrange(6)))
    if kind == 3:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {
        f"{n}{_value(rng, 8) if kind == 5 else ''}": _value(rng, depth + 1) for n in range(rng.randrange(4))
    }


STRING_CHARS = ('ab "\\/\n\tä✓\u2028', 'ab[]{}"\\x')


@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_bracket_depth_is_the_values_depth_or_says_it_cannot_tell(ensure_ascii: bool) -> None:
    rng = random.Random(18)
    told = 0
    for _ in range(3_000):
        value = _value(rng, 0)
        line = json.dumps(value, ensure_ascii=ensure_ascii).encode()
        depth = bracket_depth(line, 64)
        if depth is not None:
            told += 1
            assert depth == nesting_depth(value, 64), line
        if not _string_brackets(value):
            assert depth is not None, line  # only a bracket inside a string makes the bytes unsure
    assert told > 1_000


def _string_brackets(value: Any) -> bool:
    if isinstance(value, str):
        return any(ch in value for ch in "[]{}")
    if isinstance(value, list):
        return any(_string_brackets(item) for item in value)
    if isinstance(value, dict):
        return any(_string_brackets(key) or _string_brackets(item) for key, item in value.items())
    return False


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            encode_frame({"jsonrpc": "2.0", "id": 3, "error": {"code": -32600, "message": 'ü ✓ "x"\n'}}),
            b'{"jsonrpc":"2.0","id":3,"error":{"code":-32600,"message":"\xc3\xbc \xe2\x9c\x93 \\"x\\"\\n"}}\n',
        ),
        (
            encode_model_frame(
                {"jsonrpc": "2.0", "method": "log", "ünï": None},
                "params",
                LogParams(level="info", message="✓"),
            ),
            b'{"jsonrpc":"2.0","method":"log","\xc3\xbcn\xc3\xaf":null,'
            b'"params":{"level":"info","message":"\xe2\x9c\x93","fields":{}}}\n',
        ),
        (
            encode_model_frame({"jsonrpc": "2.0", "id": 9}, "result", Loose(text="a")),
            b'{"jsonrpc":"2.0","id":9,"result":{"value":null,"ratio":0.5,"text":"a"}}\n',
        ),
    ],
)
def test_frames_are_compact_utf8_json(line: bytes, expected: bytes) -> None:
    assert line == expected
