"""Text to vectors for recall (mechanisms 14, 30, 62, 63).

Two embedders share one small interface. ``GatewayEmbedder`` asks the imp's embedding model
through the gateway — for ``[memory] embedder = "local"`` too: the host sends the box the reserved name
``local/all-MiniLM-L6-v2`` and 384 dimensions, and computes those vectors itself (issue 33; the box never loads
a model); ``HashingEmbedder`` is the offline bag-of-words one the tests use (and an
imp may choose, ``[memory] embedder = "hashing"``): deterministic, no model, 64 dimensions. What is
embedded of a text, the hashing vector and the checked answer are ``box.common.embedding``: the host
embeds the same way for ``impyard memory``.

Neither raises for a model failure: ``None`` means "no vector this time" and the engine stores the
record without one (it is then found by recency and by person, not by meaning). Text with no
words has no vector either: a zero vector cannot be normalised and would match nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from box.common.embedding import HASHING_DIMS, clip_for_embedding, hashing_vector
from box.memory.calls import MemoryModel


class Embedder(Protocol):
    """Mechanism 30: ``name`` and ``dims`` say which vectors can be compared with this one's."""

    name: str
    dims: int | None  # None: whatever the model gives (vectors of another length are never compared)

    async def embed(self, text: str) -> list[float] | None:
        """The vector of ``text``, or None: no vector this time (never raises for a model failure)."""
        ...


@dataclass
class HashingEmbedder:
    """The deterministic 64-dim bag of words (seed 002, "Embedder and recall scoring").

    Each lowercase ``\\w+`` token adds 1 to bucket md5(token) mod 64; the counts are L2-normalised.
    md5, not ``hash()``: the same text gives the same vector in every process (hash() is salted).
    """

    name: str = "hashing-64"
    dims: int | None = HASHING_DIMS

    async def embed(self, text: str) -> list[float] | None:
        return hashing_vector(clip_for_embedding(text))


class GatewayEmbedder:
    """The imp's embedding model via the gateway (``POST /embeddings``, purpose "embedding").

    The text is clipped before it goes out, blank text is not sent (the API refuses empty input),
    and the answer must be exactly ``dimensions`` finite numbers (checked in ``MemoryModel``).
    The name carries model and size, so vectors of another model or size are told apart (30).
    """

    def __init__(self, model: MemoryModel, model_name: str, dimensions: int) -> None:
        self.model = model
        self.model_name = model_name
        self.name = f"{model_name}@{dimensions}"
        self.dims: int | None = dimensions
        self._dimensions = dimensions

    async def embed(self, text: str) -> list[float] | None:
        clipped = clip_for_embedding(text)
        if not clipped.strip():
            return None
        return await self.model.embedding(self.model_name, clipped, self._dimensions)
