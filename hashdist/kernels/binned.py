"""Histogram kernel for real-valued distances on a bin axis (hashdist.kernels.distance): weighted, asymmetric.

A distance is a sum of per-byte table lookups (8 per 64-bit word) of fixed-point integers, so it
is the same number in every block, order and process; its bin is a shift (no division per pair)
and, in a bin that a radius splits, a comparison with the cut. Output: ``H[q, bin, grade]`` as the Hamming
kernel's, with the bin axis in place of the distance axis.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from hashdist.kernels import cached_njit, listed_in_block
from hashdist.kernels.distance import DistanceAxis, query_tables
from hashdist.kernels.histogram import as_words, explicit_lists, n_grades
from hashdist.kernels.popcount import common_bits

_BYTE = np.uint64(255)


@njit(nogil=True, inline="always")
def _distance(table, offset, a, b, xor):
    """offset + sum over the bytes of (a XOR b) (or of b alone) of their table entries (integers)."""
    e = offset
    for w in range(b.shape[0]):
        x = (a[w] ^ b[w]) if xor else b[w]
        k = 8 * w
        s0 = table[k, x & _BYTE] + table[k + 1, (x >> np.uint64(8)) & _BYTE]
        s1 = table[k + 2, (x >> np.uint64(16)) & _BYTE] + table[k + 3, (x >> np.uint64(24)) & _BYTE]
        s2 = table[k + 4, (x >> np.uint64(32)) & _BYTE] + table[k + 5, (x >> np.uint64(40)) & _BYTE]
        s3 = table[k + 6, (x >> np.uint64(48)) & _BYTE] + table[k + 7, x >> np.uint64(56)]
        e += (s0 + s1) + (s2 + s3)
    return e


@njit(nogil=True, inline="always")
def _bin(e, shift, first_bin, first_cut, cuts):
    """The bin of fixed-point distance e: its equal bin, then past the cuts below e in that bin."""
    u = min(max(e, 0) >> shift, first_bin.shape[0] - 1)
    i, k = first_bin[u], first_cut[u]
    while e > cuts[k]:
        i += 1
        k += 1
    return i


def _grade(qr, dr, q, j, top):
    """Grade of pair (q, j); the label types pick the rule (see _grade_rule)."""


@overload(_grade, inline="always")
def _grade_rule(qr, dr, q, j, top):
    """Class labels (vectors): 1 for equal labels; packed multi-hot rows: labels in common, at most top; None: 0."""
    if qr is types.none:
        return lambda qr, dr, q, j, top: 0
    if qr.ndim == 1:
        return lambda qr, dr, q, j, top: 1 if qr[q] == dr[j] else 0
    return lambda qr, dr, q, j, top: min(common_bits(qr[q], dr[j]), top)


@cached_njit(nogil=True, boundscheck=False)
def _binned_counts(qc, qr, dc, dr, tables, offsets, xor, shift, first_bin, first_cut, cuts, top, H):
    """H[q, bin * ncols + grade] += 1 for every pair of the block."""
    shared = tables.shape[0] == 1
    ncols = top + 1
    for q in range(qc.shape[0]):
        table = tables[0] if shared else tables[q]
        a, offset, Hq = qc[q], offsets[q], H[q]
        for j in range(dc.shape[0]):
            i = _bin(_distance(table, offset, a, dc[j], xor), shift, first_bin, first_cut, cuts)
            Hq[i * ncols + _grade(qr, dr, q, j, top)] += 1


@cached_njit(nogil=True, boundscheck=False)
def _apply_explicit_binned(qc, dc, tables, offsets, xor, shift, first_bin, first_cut, cuts, db_start, indptr, indices,
                           grades, max_grade, H):
    """Move each listed pair inside this database block from grade 0 to its grade, in its distance bin."""
    shared = tables.shape[0] == 1
    for q in range(qc.shape[0]):
        table = tables[0] if shared else tables[q]
        p0, p1 = listed_in_block(indptr, indices, q, db_start, dc.shape[0])
        for p in range(p0, p1):
            g = min(grades[p], max_grade)
            if g > 0:
                d = _distance(table, offsets[q], qc[q], dc[indices[p] - db_start], xor)
                i = _bin(d, shift, first_bin, first_cut, cuts)
                H[q, i, 0] -= 1
                H[q, i, g] += 1


def binned_histogram_block(
    axis: DistanceAxis,
    query_codes: np.ndarray,
    db_codes: np.ndarray,
    nbits: int,
    kind: str,
    query_rel=None,
    db_rel=None,
    *,
    q0: int = 0,
    scores: np.ndarray | None = None,
    db_start: int = 0,
    max_grade: int = 1,
) -> np.ndarray:
    """Histogram of a query block (rows q0.. of the run's queries) against a database block on ``axis``'s bins,
    shape (Qb, axis.n_bins, n_grades). ``scores``: the block's query vectors for the asymmetric distance.
    Relevance as :func:`hashdist.kernels.histogram.histogram_block`."""
    qc, dc = as_words(query_codes, db_codes)
    tables, offsets, xor = query_tables(axis, nbits, q0, q0 + qc.shape[0], scores)
    ncols = n_grades(kind, max_grade)
    H = np.zeros((qc.shape[0], axis.n_bins, ncols), dtype=np.int64)
    if kind == "class":
        qr = np.ascontiguousarray(query_rel, dtype=np.int64)
        dr = np.ascontiguousarray(db_rel, dtype=np.int64)
    elif kind == "multilabel":
        qr, dr = as_words(query_rel, db_rel)
    elif kind == "explicit":
        qr = dr = None
    else:
        raise ValueError(f"unknown relevance kind {kind!r}")
    geometry = (axis.shift, axis.first_bin, axis.first_cut, axis.cuts)
    _binned_counts(qc, qr, dc, dr, tables, offsets, xor, *geometry, ncols - 1, H.reshape(H.shape[0], -1))
    if kind == "explicit":
        _apply_explicit_binned(qc, dc, tables, offsets, xor, *geometry, db_start, *explicit_lists(query_rel),
                               max_grade, H)
    return H
