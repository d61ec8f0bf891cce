"""Compact vectors for the host's memory store (issue 23): L2-normalised, float16 little-endian blobs.

A stored vector is normalised once, when it is written, so a cosine is a dot product at query time.
float16 halves the bytes of float32; ``overlap_at_k`` measures what that costs in ranking (the test
asks ≥ 99 % top-10 overlap on random data, the benchmark reports it at scale). A vector is stored with
its length (``dims``), and a vector of another length is never compared (mechanism 30).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

BLOB_DTYPE = np.dtype("<f2")  # float16, little-endian: the same bytes on every host
Floats = npt.NDArray[np.float32]


class VectorError(ValueError):
    """A vector that cannot be stored: empty, or holding NaN or infinity."""


def normalised(vector: Sequence[float] | npt.NDArray[np.floating]) -> Floats:
    """The vector scaled to length 1 (float32); a zero vector stays zero (its cosine with anything is 0)."""
    array = np.asarray(vector, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise VectorError("a vector is a non-empty list of numbers")
    if not np.all(np.isfinite(array)):
        raise VectorError("a vector must hold finite numbers only (no NaN or infinity)")
    norm = float(np.linalg.norm(array))
    if norm > 0.0:
        array = array / norm
    return array.astype(np.float32)


def pack(vector: Sequence[float] | npt.NDArray[np.floating]) -> tuple[int, bytes]:
    """``(dims, blob)``: the normalised vector as float16 little-endian bytes."""
    unit = normalised(vector)
    return int(unit.size), unit.astype(BLOB_DTYPE).tobytes()


def unpack(dims: int, blob: bytes) -> Floats:
    """The stored vector as float32 (exactly the float16 values); refuses a blob of another length."""
    if len(blob) != dims * BLOB_DTYPE.itemsize:
        raise VectorError(f"a vector blob of {len(blob)} bytes does not hold {dims} float16 values")
    return np.frombuffer(blob, dtype=BLOB_DTYPE).astype(np.float32)


def unpack_many(dims: int, blobs: Sequence[bytes]) -> Floats:
    """Several blobs of one length as an (n, dims) float32 matrix, in one pass."""
    if not blobs:
        return np.zeros((0, dims), dtype=np.float32)
    joined = b"".join(blobs)
    if len(joined) != len(blobs) * dims * BLOB_DTYPE.itemsize:
        raise VectorError(f"vector blobs do not all hold {dims} float16 values")
    return np.frombuffer(joined, dtype=BLOB_DTYPE).reshape(len(blobs), dims).astype(np.float32)


def top_k(scores: npt.NDArray[np.floating], k: int) -> npt.NDArray[np.intp]:
    """Indices of the ``k`` highest scores, highest first (ties: the lower index first)."""
    k = min(k, int(scores.size))
    if k <= 0:
        return np.zeros(0, dtype=np.intp)
    if k < scores.size:
        part = np.argpartition(-scores, k - 1)[:k]
    else:
        part = np.arange(scores.size)
    order = np.lexsort((part, -scores[part]))
    return part[order]


def overlap_at_k(matrix: npt.NDArray[np.floating], queries: npt.NDArray[np.floating], k: int = 10) -> float:
    """The share of float32 top-``k`` neighbours that float16 storage keeps in its own top-``k``.

    ``matrix`` (n, d) and ``queries`` (q, d) are raw float vectors; both are normalised, the matrix is
    ranked once in float32 and once through ``pack``/``unpack`` (what the store keeps), and the overlap of
    the two top-k sets is averaged over the queries. 1.0 means compact storage never changed a top-k.
    """
    full = np.stack([normalised(row) for row in matrix])
    compact = np.stack([unpack(*pack(row)) for row in matrix])
    kept = 0
    total = 0
    for query in queries:
        unit = normalised(query)
        exact = set(top_k(full @ unit, k).tolist())
        approx = set(top_k(compact @ unit, k).tolist())
        kept += len(exact & approx)
        total += len(exact)
    return kept / total if total else 1.0
