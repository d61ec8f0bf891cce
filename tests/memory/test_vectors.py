"""Compact vectors: normalised float16 blobs, lengths kept, compact ranking close to float32 (issue 23)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from impyard.memory.vectors import VectorError, normalised, overlap_at_k, pack, top_k, unpack, unpack_many


def test_pack_normalises_and_stores_float16_little_endian() -> None:
    dims, blob = pack([3.0, 4.0])
    assert dims == 2
    assert blob == b"\xcd\x38\x66\x3a"  # 0.6 and 0.8 as float16, little-endian
    assert unpack(dims, blob).tolist() == pytest.approx([0.6, 0.8], abs=1e-3)


def test_a_zero_vector_stays_zero() -> None:
    assert unpack(*pack([0.0, 0.0, 0.0])).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("bad", [[], [math.nan, 1.0], [math.inf], [1.0, -math.inf]])
def test_nan_infinite_and_empty_vectors_are_refused(bad: list[float]) -> None:
    with pytest.raises(VectorError):
        pack(bad)


def test_m30_a_blob_of_another_length_is_refused() -> None:
    dims, blob = pack([1.0, 2.0, 3.0])
    with pytest.raises(VectorError):
        unpack(4, blob)
    with pytest.raises(VectorError):
        unpack_many(4, [blob])


def test_unpack_many_stacks_rows() -> None:
    rows = unpack_many(2, [pack([1.0, 0.0])[1], pack([0.0, 2.0])[1]])
    assert rows.shape == (2, 2)
    assert rows.tolist() == [[1.0, 0.0], [0.0, 1.0]]


def test_top_k_is_highest_first_with_ties_by_index() -> None:
    scores = np.array([0.1, 0.9, 0.5, 0.9, -1.0])
    assert top_k(scores, 3).tolist() == [1, 3, 2]
    assert top_k(scores, 10).tolist() == [1, 3, 2, 0, 4]
    assert top_k(scores, 0).tolist() == []


def test_float16_top10_overlap_with_float32_is_at_least_99_percent() -> None:
    rng = np.random.default_rng(23)
    matrix = rng.standard_normal((2_000, 64))
    queries = rng.standard_normal((50, 64))
    assert overlap_at_k(matrix, queries, k=10) >= 0.99


def test_normalised_has_length_one() -> None:
    assert float(np.linalg.norm(normalised([1.0, 2.0, 2.0]))) == pytest.approx(1.0, abs=1e-6)
