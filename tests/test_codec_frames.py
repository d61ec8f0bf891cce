"""Framing without waste (issue 18): a model goes onto the wire serialised once, as the same JSON value the dict
round trip made; a frame's depth is checked only when its brackets could nest past the limit, and the check
still refuses every frame that does."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from box.protocol.codec import (
    MAX_FRAME_DEPTH,
    FrameInvalid,
    FrameTooLarge,
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
    ],
)
def test_the_depth_limit_holds_whatever_the_brackets(line: bytes, ok: bool) -> None:
    if ok:
        decode_frame(line)
    else:
        with pytest.raises(FrameInvalid, match="nested deeper"):
            decode_frame(line)
