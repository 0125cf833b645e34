"""Histograms over distinct (code, label) rows: cost in distinct rows, not items (issue #14).

Supervised hash codes collapse: most items of a class share a few codes. A database
block then holds few distinct (code, label) rows, and a query's histogram is the sum,
over those rows, of the row's multiplicity at the row's (distance, grade) cell. The
queries are collapsed the same way and their histograms scattered back, so the work is
distinct queries x distinct database rows instead of queries x items. The result is
identical to :func:`hashdist.kernels.histogram.histogram_block` (same dtype, shape and
counts) for class and multi-label relevance.

:func:`auto_histogram_block` (the engine's entry point) decides per block with
:func:`should_collapse`: a sample of ~8 sqrt(N) database rows rules out blocks of
(mostly) distinct rows at once; otherwise a hash table counts the block's distinct rows,
giving up as soon as there are more than ``COLLAPSE_FRACTION`` of the items, and the
block is collapsed below that (those distinct rows are then reused).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

from hashdist.kernels import cached_njit
from hashdist.kernels.distinct import HASH_MULTIPLIER, DistinctRows, distinct_rows, label_words, scan_distinct_rows
from hashdist.kernels.histogram import _as_int32_labels, histogram_block, n_grades
from hashdist.kernels.popcount import popcount64

# Collapse when the database block has at most this share of distinct (code, label) rows. Measured with
# bench/collapse.py (1 thread, 1,000 distinct queries, so only the database collapses): the weighted kernel
# does about half the tuned kernel's pairs/s (B=64 class), and the collapsed path breaks even near U/N = 1/2
# (class B=64; 1.35-1.5x there for multi-label B=64 and class B=128) and is 2.0x (class B=64) to 2.7-2.9x
# (multi-label B=64, class B=128) faster at 1/4 (`--quick`, 65,536 items).
COLLAPSE_FRACTION = 1 / 4
# With few queries the fixed cost of counting the block's distinct rows matters: collapsing pays while
# N * COUNT_COST_PAIRS + Q * U < Q * N * WEIGHTED_TO_TUNED (in weighted pairs), so the limit is
# U <= N * min(COLLAPSE_FRACTION, WEIGHTED_TO_TUNED - COUNT_COST_PAIRS / Q).
WEIGHTED_TO_TUNED = 0.55  # the weighted kernel's pairs/s over the tuned kernel's (0.5-0.6 measured at 1,000 queries)
# Fitted to where collapsing starts to pay at 32 to 128 queries (bench/collapse.py's few-queries table at
# 262,144 items, the engine's block; class B = 64, where collapsing gains least): 1/32 of the rows distinct at
# 32 queries, 1/12 to 1/8 at 48, 1/5 to 1/4 at 64. The count alone costs about 25 ns a row there (~33 weighted
# pairs), but at so few queries the weighted kernel runs at ~0.8 of the tuned kernel's pairs/s, not 0.55.
COUNT_COST_PAIRS = 22
MIN_COLLAPSE_ITEMS = 1024
SAMPLE_FACTOR = 8  # rows sampled per sqrt(items) before counting a block's distinct rows
COLLAPSIBLE_KINDS = ("class", "multilabel")

_TILE = 4  # queries per pass of the weighted kernels
_CHUNK = 512  # distinct database rows per pass


class CollapseInfo(NamedTuple):
    """What :func:`auto_histogram_block` did with one block.

    ``n_distinct`` is the database block's exact distinct (code, label) row count when ``exact`` (always
    when collapsed). Otherwise it is an estimate: from the sample's repeated rows ("sample"; ``n_items``
    when it had none), or the distinct share of the rows counted before the count gave up, times the
    block's rows ("count"); ``n_items`` for blocks not looked at ("kind", "small"). Sum ``n_distinct``
    and ``n_items`` over blocks for a run's distinct fraction.
    """

    collapsed: bool
    n_items: int
    n_distinct: int
    exact: bool
    n_queries: int
    n_distinct_queries: int  # 0 when the queries were not collapsed
    decided_by: str  # "kind" (not class or multilabel), "small" (block), "sample" or "count" (distinct rows)

    @property
    def distinct_fraction(self) -> float:
        return self.n_distinct / self.n_items if self.n_items else 1.0


# -- weighted histogram over distinct rows --------------------------------------------


@njit(nogil=True, inline="always")
def _add_distances(a, dc, j0, C, scale, cell):
    """cell[j] += scale * Hamming distance of code words a[1:] to database row j0 + j (word-major dc)."""
    for w in range(1, a.shape[0]):
        x, d = a[w], dc[w, j0 : j0 + C]
        for j in range(C):
            cell[j] += scale * popcount64(x ^ d[j])


@njit(nogil=True, inline="always")
def _add_counts(Hf, q0, T, cells, counts, j0, C):
    """Hf[q0 + t, cells[t, j]] += counts[j0 + j]: TILE queries' independent increments per row."""
    cnt = counts[j0 : j0 + C]
    if T == _TILE:
        c0, c1, c2, c3 = cells[0], cells[1], cells[2], cells[3]
        h0, h1, h2, h3 = Hf[q0], Hf[q0 + 1], Hf[q0 + 2], Hf[q0 + 3]
        for j in range(C):
            n = cnt[j]
            h0[c0[j]] += n
            h1[c1[j]] += n
            h2[c2[j]] += n
            h3[c3[j]] += n
    else:
        for t in range(T):
            h, c = Hf[q0 + t], cells[t]
            for j in range(C):
                h[c[j]] += cnt[j]


@cached_njit(nogil=True, boundscheck=False)
def _weighted_class(qc, ql, dc, dl, counts, H, cells):
    """H[q, d, (ql[q] == dl[j])] += counts[j] over distinct database rows j; dc is word-major (W, Nu).

    A chunk of CHUNK rows at a time (it stays in L1) against TILE queries at a time: a vectorisable
    pass computes each pair's cell d * 2 + grade, then a scalar pass adds the rows' counts.
    """
    Q, Nu = qc.shape[0], dc.shape[1]
    Hf = H.reshape(Q, H.shape[1] * H.shape[2])
    for j0 in range(0, Nu, _CHUNK):
        C = min(_CHUNK, Nu - j0)
        lab, d = dl[j0 : j0 + C], dc[0, j0 : j0 + C]
        for q0 in range(0, Q, _TILE):
            for t in range(_TILE):  # a last partial tile repeats its last query (not counted)
                q = min(q0 + t, Q - 1)
                cell, lq, x = cells[t], ql[q], qc[q, 0]
                for j in range(C):
                    cell[j] = 2 * popcount64(x ^ d[j]) + (lab[j] == lq)
                _add_distances(qc[q], dc, j0, C, 2, cell)
            _add_counts(Hf, q0, min(_TILE, Q - q0), cells, counts, j0, C)


@cached_njit(nogil=True, boundscheck=False)
def _weighted_multilabel(qc, ql, dc, dl, counts, top, H, cells, common):
    """H[q, d, min(|ql[q] & dl[j]|, top)] += counts[j]; dc and dl are word-major (W, Nu), (L, Nu)."""
    Q, Nu, ncols = qc.shape[0], dc.shape[1], H.shape[2]
    Hf = H.reshape(Q, H.shape[1] * ncols)
    for j0 in range(0, Nu, _CHUNK):
        C = min(_CHUNK, Nu - j0)
        d = dc[0, j0 : j0 + C]
        for q0 in range(0, Q, _TILE):
            for t in range(_TILE):  # a last partial tile repeats its last query (not counted)
                q = min(q0 + t, Q - 1)
                cell, x = cells[t], qc[q, 0]
                _fill_common(ql[q], dl, j0, C, common)
                for j in range(C):
                    cell[j] = ncols * popcount64(x ^ d[j]) + min(common[j], top)
                _add_distances(qc[q], dc, j0, C, ncols, cell)
            _add_counts(Hf, q0, min(_TILE, Q - q0), cells, counts, j0, C)


@njit(nogil=True, inline="always")
def _fill_common(a, dl, j0, C, common):
    """common[j] = labels that label words a share with database row j0 + j (word-major dl), j < C."""
    for j in range(C):
        common[j] = 0
    for w in range(a.shape[0]):
        x, d = a[w], dl[w, j0 : j0 + C]
        for j in range(C):
            common[j] += popcount64(x & d[j])


def weighted_histogram(qc, qrel, db: DistinctRows, nbits: int, kind: str, max_grade: int = 1) -> np.ndarray:
    """Histograms of queries against a collapsed database block: each distinct row adds its count.

    Returns (Q, nbits + 1, n_grades(kind, max_grade)) int64, as histogram_block does for the items.
    """
    qc = np.ascontiguousarray(qc, dtype=np.uint64)
    ncols = n_grades(kind, max_grade)
    H = np.zeros((qc.shape[0], nbits + 1, ncols), dtype=np.int64)
    if qc.shape[0] == 0 or db.counts.shape[0] == 0:
        return H
    dc = np.ascontiguousarray(db.codes.T)
    cells = np.empty((_TILE, _CHUNK), dtype=np.uint32)  # unsigned: no negative-index check per increment
    if kind == "class":
        ql, dl = _as_int32_labels(qrel, db.labels)
        _weighted_class(qc, ql, dc, dl, db.counts, H, cells)
    elif kind == "multilabel":
        ql = np.ascontiguousarray(qrel, dtype=np.uint64)
        dl = np.ascontiguousarray(np.asarray(db.labels, dtype=np.uint64).T)
        _weighted_multilabel(qc, ql, dc, dl, db.counts, max_grade, H, cells, np.empty(_CHUNK, dtype=np.int64))
    else:
        raise ValueError(f"relevance {kind!r} cannot be collapsed (only {', '.join(COLLAPSIBLE_KINDS)})")
    return H


def collapsed_histogram_block(query_codes, db_codes, nbits: int, kind: str, query_rel, db_rel, *,
                              max_grade: int = 1, db: DistinctRows | None = None) -> np.ndarray:
    """``histogram_block`` for class or multi-label relevance over distinct rows, always collapsing.

    The database block (or its precomputed ``db = distinct_rows(db_codes, db_rel)``) and the queries
    are reduced to distinct (code, label) rows; the histograms of the distinct queries, each
    database row weighted by its count, are scattered back to every query. Identical output.
    """
    if kind not in COLLAPSIBLE_KINDS:
        raise ValueError(f"relevance {kind!r} cannot be collapsed (only {', '.join(COLLAPSIBLE_KINDS)})")
    if db is None:
        db = distinct_rows(db_codes, db_rel)
    return _over_distinct_rows(query_codes, query_rel, db, nbits, kind, max_grade)[0]


def _over_distinct_rows(query_codes, query_rel, db: DistinctRows, nbits: int, kind: str, max_grade: int):
    """(the histograms of every query against collapsed database rows ``db``, the queries' distinct rows):
    each distinct query's histogram is computed once and scattered back to the queries that share it."""
    queries = distinct_rows(query_codes, query_rel)
    H = weighted_histogram(queries.codes, queries.labels, db, nbits, kind, max_grade)[queries.inverse]
    return H, int(queries.counts.shape[0])


# -- the decision ----------------------------------------------------------------------


def collapse_limit(n_items: int, n_queries: int) -> int:
    """Most distinct database rows for which a block of n_items rows against n_queries queries is collapsed."""
    if n_queries <= 0:
        return 0
    fraction = min(COLLAPSE_FRACTION, WEIGHTED_TO_TUNED - COUNT_COST_PAIRS / n_queries)
    return max(0, int(math.floor(fraction * n_items)))


def _sample_repeats(codes, labels, n: int) -> tuple[int, int] | None:
    """(sampled rows, rows in the sample repeating another sampled row), or None if the block is small.

    The same ~SAMPLE_FACTOR * sqrt(n) distinct row indices (a fixed random draw) for every block of n rows.
    Rows are compared by a 64-bit hash (a collision can only add a repeat, which sends the block on to the
    exact count), in plain numpy: blocks that do not collapse compile no kernel of this module.
    """
    s = int(math.ceil(SAMPLE_FACTOR * math.sqrt(n)))
    if 4 * s > n:
        return None
    idx = np.sort(np.random.default_rng(n).integers(0, n, size=s))
    idx = idx[np.r_[True, idx[1:] != idx[:-1]]]  # (np.unique takes 10x longer here)
    columns = list(np.asarray(codes, dtype=np.uint64)[idx].T)
    if labels is not None:
        columns += list(label_words(np.asarray(labels)[idx], len(idx)).T)
    h = np.zeros(len(idx), dtype=np.uint64)
    for column in columns:
        h = (h ^ column) * HASH_MULTIPLIER
    h = np.sort(h ^ (h >> np.uint64(32)))
    return len(idx), int(np.count_nonzero(h[1:] == h[:-1]))


def should_collapse(n_queries: int, db_codes, db_rel, kind: str) -> tuple[DistinctRows | None, CollapseInfo]:
    """Whether to collapse a block, from its database rows' distinct count: (distinct rows or None, info).

    Collapses class or multi-label blocks of at least MIN_COLLAPSE_ITEMS items whose distinct (code, label)
    rows are at most :func:`collapse_limit` (COLLAPSE_FRACTION of the items with enough queries, less with
    few; none below ~COUNT_COST_PAIRS / WEIGHTED_TO_TUNED = 40 queries). The distinct rows returned are
    reused by the collapsed path. Two steps keep blocks that do not collapse cheap:

    - a sample of s ~ SAMPLE_FACTOR * sqrt(N) rows: at most F N distinct rows among N give the sample
      at least s^2 (1/F - 1) / 2N repeated rows on average (s^2 / 2U pairs share a row, fewest when
      the U rows are equally frequent); under a quarter of that means no (rows of distinct codes give none);
    - otherwise the count over the block, which stops once the limit is passed.
    """
    n = int(np.shape(db_codes)[0])
    if kind not in COLLAPSIBLE_KINDS:
        return None, CollapseInfo(False, n, n, False, n_queries, 0, "kind")
    limit = collapse_limit(n, n_queries)
    if limit < 1 or n < MIN_COLLAPSE_ITEMS:
        return None, CollapseInfo(False, n, n, False, n_queries, 0, "small")
    sample = _sample_repeats(db_codes, db_rel, n)
    if sample is not None:
        s, repeats = sample
        expected = s * s * (n / limit - 1) / (2 * n)
        if repeats < expected / 4:
            # equally frequent rows: repeats ~ C(s, 2) (N / U - 1) / (N - 1)
            estimate = n / (1 + repeats * (n - 1) / (s * (s - 1) / 2))
            return None, CollapseInfo(False, n, int(round(estimate)), False, n_queries, 0, "sample")
    rows, u, scanned = scan_distinct_rows(db_codes, db_rel, limit)
    if rows is None:
        estimate = max(u, min(n, round(u / scanned * n)))
        return None, CollapseInfo(False, n, estimate, False, n_queries, 0, "count")
    return rows, CollapseInfo(True, n, u, True, n_queries, 0, "count")


def auto_histogram_block(query_codes, db_codes, nbits: int, kind: str, query_rel=None, db_rel=None, *,
                         db_start: int = 0, max_grade: int = 1, decision=None) -> tuple[np.ndarray, CollapseInfo]:
    """``histogram_block`` with the same arguments, collapsed to distinct rows when that pays: (H, info).

    H is identical to ``histogram_block``'s; info says whether the block was collapsed and its
    distinct count (see :class:`CollapseInfo`). ``decision``: :func:`should_collapse`'s answer for this
    database block and query count, when the caller kept it from an earlier query block.
    """
    db, info = decision or should_collapse(int(np.shape(query_codes)[0]), db_codes, db_rel, kind)
    if db is None:
        return histogram_block(query_codes, db_codes, nbits, kind, query_rel, db_rel, db_start=db_start,
                               max_grade=max_grade), info
    H, n_distinct_queries = _over_distinct_rows(query_codes, query_rel, db, nbits, kind, max_grade)
    return H, info._replace(n_distinct_queries=n_distinct_queries)
