"""Histogram kernel for real-valued distances on a bin axis (hashdist.kernels.distance): weighted, asymmetric.

A distance is a sum of per-byte table lookups (8 per 64-bit word) of fixed-point integers, so it
is the same number in every block, order and process, within a proven bound delta of the exact value
(0 for integer and other dyadic data); its equal bin is a float estimate corrected by integer products
(no division per pair) and, in a bin that a radius splits, a comparison with the cut. A pair whose exact
distance may lie across an edge or a radius (the straddlers: within delta of one) is not counted by the
kernel but handed back and placed with exact integer arithmetic (hashdist.kernels.distance.exact_bins), so
every pair is counted in the bin of its exact distance. Output: ``H[q, bin, grade]`` as the Hamming
kernel's, with the bin axis in place of the distance axis.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from hashdist.data.bits import unpack_bits
from hashdist.kernels import cached_njit, listed_in_block
from hashdist.kernels.distance import CUT_SENTINEL, DistanceAxis, exact_bins, query_tables
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
def _equal_bin(e, n, width, inv_width):
    """The equal bin u with u W < e <= (u + 1) W, clamped to 0..n-1: a float estimate, off by at most one
    (the quotient is below 2^51), corrected with integer products."""
    c = min(max(e, 1), n * width) - 1
    u = np.int64(c * inv_width)
    if u * width > c:
        u -= 1
    elif (u + 1) * width <= c:
        u += 1
    return u


@njit(nogil=True, inline="always")
def _place(e, delta, width, inv_width, first_bin, first_cut, cuts):
    """The bin of fixed-point distance e, or -1 when a bin edge or a radius lies within delta of it (a
    straddler: the exact distance, within delta of e, may lie on either side). delta 0: e is exact."""
    n = first_bin.shape[0]
    u = _equal_bin(e, n, width, inv_width)
    if delta > 0:
        low = e - u * width  # e's distance above the bin's lower edge (edges 0 and n W are not edges)
        if (low <= delta and u > 0) or (width - low <= delta and u < n - 1):
            return -1
    i, k = first_bin[u], first_cut[u]
    while e > cuts[k]:  # cuts are floor(x(r)): x > x(r) iff e > cut when e = x or far from it
        i += 1
        k += 1
    if delta > 0 and ((k > first_cut[u] and e - cuts[k - 1] <= delta + 1)
                      or (cuts[k] != CUT_SENTINEL and cuts[k] - e <= delta)):
        return -1
    return i


@njit(nogil=True, inline="always")
def _place_pair(e, delta, xor, a, b, width, inv_width, first_bin, first_cut, cuts):
    """_place, except that a weighted item with the query's code is never a straddler: its distance is 0 and
    ``e``, the offset plus table entries of zero bytes (exactly 0), is exact."""
    i = _place(e, delta, width, inv_width, first_bin, first_cut, cuts)
    if i < 0 and xor:
        for w in range(a.shape[0]):
            if a[w] != b[w]:
                return i
        i = _place(e, 0, width, inv_width, first_bin, first_cut, cuts)
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
def _binned_counts(qc, qr, dc, dr, tables, offsets, deltas, xor, width, inv_width, first_bin, first_cut, cuts, top,
                   H, pairs):
    """H[q, bin * ncols + grade] += 1 for every pair of the block but the straddlers, whose (q, j) go to
    ``pairs`` while it has room; returns how many straddlers there are."""
    shared = tables.shape[0] == 1
    ncols = top + 1
    n = 0
    for q in range(qc.shape[0]):
        table = tables[0] if shared else tables[q]
        a, offset, delta, Hq = qc[q], offsets[q], deltas[q], H[q]
        for j in range(dc.shape[0]):
            e = _distance(table, offset, a, dc[j], xor)
            i = _place_pair(e, delta, xor, a, dc[j], width, inv_width, first_bin, first_cut, cuts)
            if i >= 0:
                Hq[i * ncols + _grade(qr, dr, q, j, top)] += 1
            else:
                if n < pairs.shape[0]:
                    pairs[n, 0] = q
                    pairs[n, 1] = j
                n += 1
    return n


@cached_njit(nogil=True, boundscheck=False)
def _apply_explicit_binned(qc, dc, tables, offsets, deltas, xor, width, inv_width, first_bin, first_cut, cuts,
                           db_start, indptr, indices, grades, max_grade, H):
    """Move each listed pair inside this database block from grade 0 to its grade, in its distance bin
    (straddlers are placed with their grades afterwards)."""
    shared = tables.shape[0] == 1
    for q in range(qc.shape[0]):
        table = tables[0] if shared else tables[q]
        p0, p1 = listed_in_block(indptr, indices, q, db_start, dc.shape[0])
        for p in range(p0, p1):
            g = min(grades[p], max_grade)
            if g > 0:
                b = dc[indices[p] - db_start]
                e = _distance(table, offsets[q], qc[q], b, xor)
                i = _place_pair(e, deltas[q], xor, qc[q], b, width, inv_width, first_bin, first_cut, cuts)
                if i >= 0:
                    H[q, i, 0] -= 1
                    H[q, i, g] += 1


@cached_njit(nogil=True, boundscheck=False)
def _pair_grades(qr, dr, pairs, top, out):
    """The grade of each (q, j) pair, as the counting kernel's."""
    for p in range(pairs.shape[0]):
        out[p] = _grade(qr, dr, pairs[p, 0], pairs[p, 1], top)


@cached_njit(nogil=True, boundscheck=False)
def _listed_grades(indptr, indices, grades, pairs, db_start, max_grade, out):
    """Explicit ground truth: the grade of each (q, j) pair (0 unless listed), as _apply_explicit_binned's."""
    for p in range(pairs.shape[0]):
        q, j = pairs[p, 0], pairs[p, 1] + db_start
        lo, hi = indptr[q], indptr[q + 1]
        t = lo + np.searchsorted(indices[lo:hi], j)
        out[p] = max(min(grades[t], max_grade), 0) if t < hi and indices[t] == j else 0


def _count(qc, qr, dc, dr, tables, offsets, deltas, xor, geometry, top, H) -> np.ndarray:
    """Count the block into H; the straddlers' (q, j) pairs, in (q, j) order. A full buffer: count again with
    one of the right size (the same result)."""
    pairs = np.zeros((min(max(1024, qc.shape[0] * dc.shape[0] >> 8), 1 << 20), 2), dtype=np.int64)
    n = _binned_counts(qc, qr, dc, dr, tables, offsets, deltas, xor, *geometry, top, H, pairs)
    if n > len(pairs):
        H[:] = 0
        pairs = np.zeros((n, 2), dtype=np.int64)
        _binned_counts(qc, qr, dc, dr, tables, offsets, deltas, xor, *geometry, top, H, pairs)
    return pairs[:n]


def _straddler_bins(axis: DistanceAxis, pairs, qc, dc, nbits: int, q0: int, scores) -> np.ndarray:
    """The exact bin of each straddling pair (hashdist.kernels.distance.exact_bins), query by query."""
    bins = np.empty(len(pairs), dtype=np.int64)
    starts = np.flatnonzero(np.diff(pairs[:, 0], prepend=-1))
    for s, t in zip(starts, [*starts[1:], len(pairs)], strict=True):
        q = int(pairs[s, 0])
        if axis.kind == "weighted":
            values = axis.weights if axis.weights.ndim == 1 else axis.weights[q0 + q]
        else:
            values = scores[q]
        bins[s:t] = exact_bins(axis, values, unpack_bits(qc[q : q + 1], nbits)[0],
                               unpack_bits(dc[pairs[s:t, 1]], nbits))
    return bins


def _add_straddlers(axis, pairs, qc, dc, nbits, q0, scores, kind, qr, dr, query_rel, db_start, max_grade, H):
    """Count the straddlers into H at their exact bins, with their grades."""
    grades = np.zeros(len(pairs), dtype=np.int64)
    if kind == "explicit":
        _listed_grades(*explicit_lists(query_rel), pairs, db_start, max_grade, grades)
    else:
        _pair_grades(qr, dr, pairs, H.shape[2] - 1, grades)
    np.add.at(H, (pairs[:, 0], _straddler_bins(axis, pairs, qc, dc, nbits, q0, scores), grades), 1)


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
    shape (Qb, axis.n_bins, n_grades): each pair in the bin of its exact distance. ``scores``: the block's query
    vectors for the asymmetric distance. Relevance as :func:`hashdist.kernels.histogram.histogram_block`."""
    qc, dc = as_words(query_codes, db_codes)
    tables, offsets, deltas, xor = query_tables(axis, nbits, q0, q0 + qc.shape[0], scores)
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
    geometry = (axis.width, 1.0 / axis.width, axis.first_bin, axis.first_cut, axis.cuts)
    pairs = _count(qc, qr, dc, dr, tables, offsets, deltas, xor, geometry, ncols - 1, H.reshape(H.shape[0], -1))
    if kind == "explicit":
        _apply_explicit_binned(qc, dc, tables, offsets, deltas, xor, *geometry, db_start, *explicit_lists(query_rel),
                               max_grade, H)
    if len(pairs):
        _add_straddlers(axis, pairs, qc, dc, nbits, q0, scores, kind, qr, dr, query_rel, db_start, max_grade, H)
    return H
