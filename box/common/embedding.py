"""What of a text is embedded, the offline hashing vector, and the embeddings request and its checked answer
(mechanisms 14, 30, 62, 63).

Both sides embed: the box's memory engine for what it remembers and searches by (``box.memory.embedder``),
the host for ``impyard memory`` (a record or a query typed by the operator). A vector is only comparable with
one made the same way, so the clipping, the hashing embedder and the request are one law:

* ``clip_for_embedding``: a long message is embedded by its beginning (≤ 8,000 characters and ≤ 12,000 UTF-8
  bytes, so CJK text stays under a model's token limit), whole characters only;
* ``hashing_vector``: the deterministic 64-dimension bag of words (seed 002) the tests use and an imp may
  choose (``[memory] embedder = "hashing"``);
* ``embedding_body`` and ``vector_of``: the ``POST /embeddings`` body, and the answer checked, not trusted:
  exactly ``dimensions`` finite numbers, or no vector this time and why.

Text with no words has no vector: a zero vector cannot be normalised and would match nothing.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

from box.common.busy import Asked

EMBEDDINGS_PATH = "/embeddings"
EMBED_MAX_CHARS = 8_000  # a long message is embedded by its beginning; its meaning is there
EMBED_MAX_BYTES = 12_000  # and at most this much UTF-8, so CJK text stays under a model's token limit
HASHING_DIMS = 64  # seed 002: the test embedder's 64 buckets
# Issue 33: ``[memory] embedder = "local"`` is all-MiniLM-L6-v2 on the host. The box asks for it as for any embedding
# model (POST /embeddings through the gateway) under this reserved name, which the host never sends upstream.
LOCAL_EMBEDDING_MODEL = "local/all-MiniLM-L6-v2"
LOCAL_EMBEDDING_DIMS = 384

_TOKEN = re.compile(r"\w+")


def clip_for_embedding(text: str) -> str:
    """The part of ``text`` that is embedded: ≤ 8,000 characters and ≤ 12,000 UTF-8 bytes, whole characters."""
    clipped = text[:EMBED_MAX_CHARS]
    data = clipped.encode("utf-8")
    if len(data) > EMBED_MAX_BYTES:
        clipped = data[:EMBED_MAX_BYTES].decode("utf-8", errors="ignore")
    return clipped


def hashing_vector(text: str, dims: int = HASHING_DIMS) -> list[float] | None:
    """The hashing embedder's vector (pure, synchronous); None for a text without words.

    Each lowercase ``\\w+`` token adds 1 to bucket md5(token) mod ``dims``; the counts are L2-normalised.
    md5, not ``hash()``: the same text gives the same vector in every process (hash() is salted)."""
    counts = [0.0] * dims
    for token in _TOKEN.findall(text.lower()):
        bucket = int.from_bytes(hashlib.md5(token.encode("utf-8")).digest(), "big") % dims
        counts[bucket] += 1.0
    norm = math.sqrt(sum(c * c for c in counts))
    if norm == 0:
        return None
    return [c / norm for c in counts]


def embedding_body(model: str, text: str, dimensions: int) -> dict[str, Any]:
    """Mechanism 63: the ``POST /embeddings`` body for one (already clipped) text."""
    return {"model": model, "input": [text], "dimensions": dimensions}


def vector_of(asked: Asked, dimensions: int) -> tuple[list[float] | None, str | None]:
    """Mechanism 30: a vector only when the answer's ``data[0].embedding`` is exactly ``dimensions`` finite
    numbers; else None and why not."""
    result = asked.result
    if result is None or result.status != 200:
        return None, asked.error or "no answer"
    body = result.body
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        return None, "the answer has no data[0]"
    raw = data[0].get("embedding")
    if not isinstance(raw, list):
        return None, "data[0].embedding is not a list"
    if len(raw) != dimensions:
        return None, f"the vector has {len(raw)} dimensions, not {dimensions}"
    if not all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in raw):
        return None, "the vector holds something other than finite numbers"
    return [float(x) for x in raw], None
