"""The hashtable-bucket paradigm (docs/metrics.md, section 4; the thesis, section 3.4.2).

The code is cut into L contiguous substrings of K bits, substring l being bits
[l*K, (l+1)*K) (L*K <= B; a substring may cross a 64-bit word boundary). Each
substring indexes one of L hashtables, and database item j is retrieved for query
q iff j shares q's bucket in at least one table: some substring of j equals the
same substring of q. Per query block and database block the kernel counts the
retrieved items and the relevant ones among them (grade >= 1), exact integers that
sum over database blocks; micro precision, recall and F-beta follow from the totals.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from hashdist.kernels import cached_njit, listed_in_block
from hashdist.kernels.popcount import common_bits


@njit(nogil=True, inline="always")
def _bits(row, start, length):
    """Bits [start, start + length) of a word row as one uint64 (length <= 64)."""
    w, o = start >> 6, start & 63
    v = row[w] >> np.uint64(o)
    if o and o + length > 64:
        v |= row[w + 1] << np.uint64(64 - o)
    if length < 64:
        v &= (np.uint64(1) << np.uint64(length)) - np.uint64(1)
    return v


@cached_njit(nogil=True)
def _substrings(codes, k_bits, n_tables):
    """keys[i, t, p]: the p-th 64-bit piece of substring (table) t of code i."""
    pieces = (k_bits + 63) // 64
    keys = np.empty((codes.shape[0], n_tables, pieces), dtype=np.uint64)
    for i in range(codes.shape[0]):
        for table in range(n_tables):
            for p in range(pieces):
                start = table * k_bits + p * 64
                keys[i, table, p] = _bits(codes[i], start, min(64, table * k_bits + k_bits - start))
    return keys


@njit(nogil=True, inline="always")
def _collide(a, b):
    """True iff the substring keys a, b (L, P) agree in some table."""
    for table in range(a.shape[0]):
        same = True
        for p in range(a.shape[1]):
            if a[table, p] != b[table, p]:
                same = False
                break
        if same:
            return True
    return False


def _relevant(qr, dr, q, j):
    """Whether database item j is relevant to query q; the label types pick the rule (see _relevance_rule)."""


@overload(_relevant, inline="always")
def _relevance_rule(qr, dr, q, j):
    """Class labels (vectors): equal labels; packed multi-hot rows: a label in common; None: never."""
    if qr is types.none:
        return lambda qr, dr, q, j: False
    if qr.ndim == 1:
        return lambda qr, dr, q, j: qr[q] == dr[j]
    return lambda qr, dr, q, j: common_bits(qr[q], dr[j]) > 0


@cached_njit(nogil=True)
def _count(qk, dk, qr, dr, tp, retrieved):
    for q in range(qk.shape[0]):
        for j in range(dk.shape[0]):
            if _collide(qk[q], dk[j]):
                retrieved[q] += 1
                if _relevant(qr, dr, q, j):
                    tp[q] += 1


@cached_njit(nogil=True)
def _count_explicit(qk, dk, db_start, indptr, indices, grades, tp):
    """TP from the listed pairs inside this database block that collide."""
    for q in range(qk.shape[0]):
        p0, p1 = listed_in_block(indptr, indices, q, db_start, dk.shape[0])
        for p in range(p0, p1):
            if grades[p] >= 1 and _collide(qk[q], dk[indices[p] - db_start]):
                tp[q] += 1


def hashtable_counts(
    query_codes: np.ndarray,
    db_codes: np.ndarray,
    nbits: int,
    k_bits: int,
    n_tables: int,
    query_rel,
    db_rel,
    kind: str,
    db_start: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Per query of the block: (tp, retrieved), int64 arrays of shape (Qb,), over this database block.

    Relevance kinds as :func:`hashdist.kernels.histogram.histogram_block`: "class" (int label
    vectors), "multilabel" (packed word rows; relevant iff a label in common), "explicit"
    (query_rel = CSR (indptr, indices, grades) over the query block with absolute database
    indices, db_start = the block's first database row; relevant iff grade >= 1).
    """
    if k_bits < 1 or n_tables < 1 or k_bits * n_tables > nbits:
        raise ValueError(f"need K >= 1, L >= 1 and K*L <= {nbits}, got K={k_bits}, L={n_tables}")
    qk = _substrings(np.ascontiguousarray(query_codes, dtype=np.uint64), k_bits, n_tables)
    dk = _substrings(np.ascontiguousarray(db_codes, dtype=np.uint64), k_bits, n_tables)
    tp = np.zeros(qk.shape[0], dtype=np.int64)
    retrieved = np.zeros(qk.shape[0], dtype=np.int64)
    if kind == "class":
        qr = np.ascontiguousarray(query_rel, dtype=np.int64)
        dr = np.ascontiguousarray(db_rel, dtype=np.int64)
        _count(qk, dk, qr, dr, tp, retrieved)
    elif kind == "multilabel":
        qr = np.ascontiguousarray(query_rel, dtype=np.uint64)
        dr = np.ascontiguousarray(db_rel, dtype=np.uint64)
        _count(qk, dk, qr, dr, tp, retrieved)
    elif kind == "explicit":
        _count(qk, dk, None, None, tp, retrieved)
        indptr, indices, grades = (np.ascontiguousarray(a, dtype=np.int64) for a in query_rel)
        _count_explicit(qk, dk, db_start, indptr, indices, grades, tp)
    else:
        raise ValueError(f"unknown relevance kind {kind!r}")
    return tp, retrieved
