"""Distinct rows of a block (codes, optionally with labels), found by hashing in O(N) expected time.

The collapsed path (:mod:`hashdist.kernels.collapse`) counts a block's distinct (code, label) rows, and the
grouped multi-label kernel (:mod:`hashdist.kernels.histogram`) groups a block's items by label row.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from hashdist.kernels import cached_njit

_MIN_TABLE_BITS = 10  # the distinct-row table starts at 1,024 slots and grows 4x at a load of 1/4
_MIN_TABLE = 1 << _MIN_TABLE_BITS
HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)


class DistinctRows(NamedTuple):
    """Distinct (code, label) rows of a block, in order of first occurrence.

    ``codes[inverse] == codes_in`` and ``labels[inverse] == labels_in``; ``counts[u]`` rows map to ``u``.
    """

    codes: np.ndarray  # (U, W) uint64
    labels: np.ndarray  # (U,) class labels or (U, L) uint64 label words, the input's dtype
    counts: np.ndarray  # (U,) int64, sums to N
    inverse: np.ndarray  # (N,) int64 in [0, U)


@njit(nogil=True, inline="always")
def _row_hash(codes, labels, i):
    """Multiplicative hash of a row's code words then label words: its high bits depend on every bit."""
    h = np.uint64(0)
    for w in range(codes.shape[1]):
        h = (h ^ codes[i, w]) * HASH_MULTIPLIER
    for w in range(labels.shape[1]):
        h = (h ^ labels[i, w]) * HASH_MULTIPLIER
    return h


@njit(nogil=True, inline="always")
def _key_hash(keys, k):
    """_row_hash of a row kept in ``keys`` (its code words then its label words). Not _row_hash(keys, an empty
    label array, k): the count then ran 8-15% slower and compiled slower (2026-11-23)."""
    h = np.uint64(0)
    for w in range(keys.shape[1]):
        h = (h ^ keys[k, w]) * HASH_MULTIPLIER
    return h


@njit(nogil=True, inline="always")
def _keep_row(keys, u, codes, labels, i):
    """keys[u] = row i's code words then its label words."""
    W = codes.shape[1]
    for w in range(W):
        keys[u, w] = codes[i, w]
    for w in range(labels.shape[1]):
        keys[u, W + w] = labels[i, w]


@cached_njit(nogil=True, boundscheck=False)
def _distinct_ids(codes, labels, max_distinct, first, counts, inverse):
    """Give each row the id of its (code, label) row, ids in order of first occurrence.

    Open addressing (linear probing) in a table of ids + 1 (0: empty), 8 bytes a slot; each
    distinct row is kept once, in id order, in ``keys``, where a probe compares it. The table
    grows 4x at a load of 1/4 (fewer second probes, so fewer mispredicted branches) by
    re-inserting the ids from ``keys``. Fills first[u] (the first row with id u), counts[u] and
    inverse[i]; returns (U, rows scanned). Stops after the row that makes U exceed max_distinct.
    """
    n = codes.shape[0]
    W, L = codes.shape[1], labels.shape[1]
    keys = np.empty((first.shape[0], W + L), dtype=np.uint64)
    size, bits = _MIN_TABLE, _MIN_TABLE_BITS
    mask, shift = np.uint64(size - 1), np.uint64(64 - bits)
    table = np.zeros(size, dtype=np.int64)
    u = 0
    for i in range(n):
        slot = _row_hash(codes, labels, i) >> shift  # the hash's top bits
        while True:
            id1 = table[slot]
            if id1 == 0:
                table[slot] = u + 1
                _keep_row(keys, u, codes, labels, i)
                first[u] = i
                counts[u] = 1
                inverse[i] = u
                u += 1
                break
            eq = True  # no early exit: branch-free is faster here
            for w in range(W):
                eq &= keys[id1 - 1, w] == codes[i, w]
            for w in range(L):
                eq &= keys[id1 - 1, W + w] == labels[i, w]
            if eq:
                counts[id1 - 1] += 1
                inverse[i] = id1 - 1
                break
            slot = (slot + np.uint64(1)) & mask
        if u > max_distinct:
            return u, i + 1
        if 4 * u > size:
            size, bits = size * 4, bits + 2
            mask, shift = np.uint64(size - 1), np.uint64(64 - bits)
            table = np.zeros(size, dtype=np.int64)
            for k in range(u):
                slot = _key_hash(keys, k) >> shift
                while table[slot] != 0:
                    slot = (slot + np.uint64(1)) & mask
                table[slot] = k + 1
    return u, n


def label_words(labels: np.ndarray, n: int) -> np.ndarray:
    """Labels as (n, L) uint64 rows the hash and compare see: a class label as its int64 bits."""
    labels = np.asarray(labels)
    if labels.ndim == 1:
        if labels.dtype.kind in "iub" and labels.dtype.itemsize <= 8:
            return np.ascontiguousarray(labels.astype(np.int64, copy=False)).view(np.uint64).reshape(n, 1)
        _, ids = np.unique(labels, return_inverse=True)  # other dtypes: equal labels, equal ids
        return ids.astype(np.uint64).reshape(n, 1)
    return np.ascontiguousarray(labels, dtype=np.uint64)


def distinct_rows(codes: np.ndarray, labels: np.ndarray | None = None, *,
                  max_distinct: int | None = None) -> DistinctRows | None:
    """Distinct (code, label) rows of a block with their multiplicities, in order of first occurrence.

    ``codes`` are (N, W) uint64 word rows; ``labels`` class labels (N,) or packed multi-label words
    (N, L), or None for codes alone. With ``max_distinct``, returns None as soon as the block has more
    distinct rows than that (having scanned only part of it). O(N) expected time.
    """
    return scan_distinct_rows(codes, labels, max_distinct)[0]


def scan_distinct_rows(codes, labels, max_distinct):
    """(DistinctRows or None, distinct rows seen, rows scanned)."""
    codes = np.ascontiguousarray(codes, dtype=np.uint64)
    n = codes.shape[0]
    if codes.ndim != 2:
        raise ValueError(f"codes must be (N, words) uint64 rows, got shape {codes.shape}")
    words = np.zeros((n, 0), dtype=np.uint64) if labels is None else label_words(labels, n)
    if words.shape[0] != n:
        raise ValueError(f"{words.shape[0]} label rows for {n} code rows")
    limit = n if max_distinct is None else max(0, int(max_distinct))
    first = np.empty(min(n, limit + 1), dtype=np.int64)
    counts = np.empty(min(n, limit + 1), dtype=np.int64)
    inverse = np.empty(n, dtype=np.int64)
    u, scanned = _distinct_ids(codes, words, limit, first, counts, inverse) if n else (0, 0)
    if u > limit:
        return None, u, scanned
    first, counts = first[:u], counts[:u]
    labels_u = None if labels is None else np.asarray(labels)[first]
    return DistinctRows(codes[first], labels_u, counts, inverse), u, scanned
