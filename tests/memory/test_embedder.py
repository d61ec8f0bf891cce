"""Text to vectors (box/memory/embedder.py): the hashing embedder and the checked gateway embedder."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from typing import Any

import pytest

from box.common.embedding import clip_for_embedding
from box.memory.calls import CallRecord
from box.memory.embedder import Embedder, GatewayEmbedder, HashingEmbedder
from box.protocol import ErrorCode, RpcError
from box.protocol.models import ModelRequestResult
from tests.memory.test_calls import FakeClient, Sleeps, model

pytestmark = pytest.mark.anyio


def embedding_answer(vector: Any) -> ModelRequestResult:
    return ModelRequestResult(
        status=200, body={"object": "list", "data": [{"index": 0, "embedding": vector}]}
    )


# ------------------------------------------------------------------ the hashing embedder


async def test_m63_hashing_vector_is_64_dims_and_unit_length() -> None:
    vector = await HashingEmbedder().embed("The quick brown fox jumps over the lazy dog")
    assert vector is not None and len(vector) == 64
    assert math.sqrt(sum(x * x for x in vector)) == pytest.approx(1.0)


async def test_m63_hashing_buckets_are_md5_of_lowercase_tokens() -> None:
    # md5("hello") mod 64 = 18 and md5("world") mod 64 = 39, written out here on purpose.
    vector = await HashingEmbedder().embed("Hello, HELLO world!")
    assert vector is not None
    expected = [0.0] * 64
    expected[18], expected[39] = 2 / math.sqrt(5), 1 / math.sqrt(5)
    assert vector == pytest.approx(expected)


async def test_m14_similar_texts_are_closer_than_unrelated_ones() -> None:
    embed = HashingEmbedder().embed
    a, b, c = await embed("my dog ran away"), await embed("the dog ran off"), await embed("tax forms due")
    assert a is not None and b is not None and c is not None
    assert sum(x * y for x, y in zip(a, b, strict=True)) > sum(x * y for x, y in zip(a, c, strict=True))


@pytest.mark.parametrize("text", ["", "   ", "?!… —"])
async def test_m30_text_without_words_has_no_vector(text: str) -> None:
    assert await HashingEmbedder().embed(text) is None


def test_m63_hashing_is_deterministic_across_processes() -> None:
    code = "import asyncio; from box.memory.embedder import HashingEmbedder; print(asyncio.run(HashingEmbedder().embed('ein Hund, a dog')))"
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1


def test_embedders_satisfy_the_protocol() -> None:
    embedders: list[Embedder] = [HashingEmbedder(), GatewayEmbedder(model(FakeClient([])), "m", 8)]
    assert [(e.name, e.dims) for e in embedders] == [("hashing-64", 64), ("m@8", 8)]


# ------------------------------------------------------------------ clipping


def test_m62_long_text_is_clipped_to_8000_characters() -> None:
    assert clip_for_embedding("a" * 100_000) == "a" * 8_000


def test_m62_wide_characters_are_clipped_to_12000_bytes_whole() -> None:
    clipped = clip_for_embedding("語" * 8_000)  # 3 bytes each
    assert clipped == "語" * 4_000
    assert clip_for_embedding("a" + "語" * 5_000) == "a" + "語" * 3_999  # never half a character


async def test_m62_a_100000_char_message_embeds() -> None:
    assert await HashingEmbedder().embed("word " * 20_000) is not None
    client = FakeClient([embedding_answer([0.5] * 8)])
    assert await GatewayEmbedder(model(client), "emb", 8).embed("word " * 20_000) == [0.5] * 8
    assert len(client.requests[0][1]["input"][0]) == 8_000


# ------------------------------------------------------------------ the gateway embedder


async def test_m63_gateway_request_shape() -> None:
    recorded: list[CallRecord] = []
    client = FakeClient([embedding_answer([0.1, -0.2, 0.3, 0.0])])
    vector = await GatewayEmbedder(model(client, recorded=recorded), "text-embedding-3-small", 4).embed(
        "hi there"
    )
    assert vector == [0.1, -0.2, 0.3, 0.0]
    assert client.requests == [
        (
            "/embeddings",
            {"model": "text-embedding-3-small", "input": ["hi there"], "dimensions": 4},
            "embedding",
        )
    ]
    assert [(r.purpose, r.format, r.user, r.answer) for r in recorded] == [
        ("embedding", "embedding", "hi there", "vector of 4 floats")
    ]


async def test_m30_integers_in_the_vector_become_floats() -> None:
    vector = await GatewayEmbedder(model(FakeClient([embedding_answer([1, 0, 0])])), "m", 3).embed("x")
    assert vector == [1.0, 0.0, 0.0] and all(isinstance(x, float) for x in vector)


@pytest.mark.parametrize(
    "body",
    [
        {"data": [{"embedding": [0.1, 0.2]}]},  # wrong length
        {"data": [{"embedding": [0.1, 0.2, 0.3, 0.4]}]},  # wrong length
        {"data": [{"embedding": [0.1, float("nan"), 0.3]}]},
        {"data": [{"embedding": [0.1, float("inf"), 0.3]}]},
        {"data": [{"embedding": [0.1, "0.2", 0.3]}]},
        {"data": [{"embedding": [0.1, True, 0.3]}]},
        {"data": [{"embedding": [0.1, None, 0.3]}]},
        {"data": [{"embedding": "AAAA"}]},  # base64, which was not asked for
        {"data": [{"embedding": {"0": 0.1}}]},
        {"data": [{}]},
        {"data": []},
        {"data": "nope"},
        {"data": ["x"]},
        {},
        None,
        [0.1, 0.2, 0.3],
    ],
)
async def test_m30_bad_embedding_answers_give_no_vector(body: Any) -> None:
    recorded: list[CallRecord] = []
    client = FakeClient([ModelRequestResult(status=200, body=body)])
    assert await GatewayEmbedder(model(client, recorded=recorded), "m", 3).embed("text") is None
    assert recorded[0].answer is None and recorded[0].error


async def test_m30_blank_text_is_not_sent() -> None:
    client = FakeClient([embedding_answer([0.1, 0.2, 0.3])])
    assert await GatewayEmbedder(model(client), "m", 3).embed("  \n ") is None
    assert client.requests == []


async def test_m121_embedding_backs_off_when_busy() -> None:
    sleeps = Sleeps()
    client = FakeClient([ModelRequestResult(status=429), embedding_answer([0.1, 0.2, 0.3])])
    assert await GatewayEmbedder(model(client, sleeps=sleeps), "m", 3).embed("x") == [0.1, 0.2, 0.3]
    assert sleeps.slept == [2.0]


@pytest.mark.parametrize(
    "answer", [ModelRequestResult(status=400), RpcError(ErrorCode.DENIED, "embedding model not allowed")]
)
async def test_m30_a_failed_embedding_call_gives_none(answer: ModelRequestResult | RpcError) -> None:
    assert await GatewayEmbedder(model(FakeClient([answer])), "m", 3).embed("x") is None
