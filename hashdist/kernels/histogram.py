"""Per-block Hamming histograms ``H[q, d, g]``: database items at distance d with grade g.

One kernel template serves every relevance kind. It walks the database block once
per tile of 8 queries, keeping 8 independent histograms so consecutive increments
never wait on each other, and never forms a distance matrix. Explicit ground truth
is applied afterwards as a correction: each listed (query, item) pair moves one
count from grade 0 to its grade, a merge-walk over the sorted CSR lists.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from hashdist.kernels.popcount import common_bits, hamming, popcount64

TILE = 8

# grade expression per relevance kind; `lab` is the database item's label, `l{t}` the query's
# (single-word label rows are read as scalars)
_GRADE = {
    "none": "0",
    "class": "(lab == l{t})",
    "multilabel": "min(common_bits(l{t}, lab), {max_grade})",
    "multilabel1": "min(popcount64(l{t} & lab), {max_grade})",
}


MAX_UNROLLED_WORDS = 4
MAX_BLOCK_ROWS = 2**31 - 1  # a tile counts into int32 scratch histograms


def _kernel_source(kind: str, words: int, tile: int, ncols: int) -> str:
    """Source of one kernel; ``words`` in 1..MAX_UNROLLED_WORDS unrolls the code words, 0 loops."""
    if words:
        code = "; ".join(f"a{{t}}_{w} = qc[q + {{t}}, {w}]" for w in range(words))
        item = "; ".join(f"c_{w} = dc[j, {w}]" for w in range(words))
        dist = " + ".join(f"popcount64(a{{t}}_{w} ^ c_{w})" for w in range(words))
    else:
        code, item, dist = "a{t} = qc[q + {t}]", "c = dc[j]", "hamming(a{t}, c)"
    label = "qr[q + {t}, 0]" if kind == "multilabel1" else "qr[q + {t}]"
    label_item = "dr[j, 0]" if kind == "multilabel1" else "dr[j]"
    grade = _GRADE[kind]

    def per_query(fmt, indent=8):
        return "\n".join(" " * indent + fmt.format(t=t, max_grade=ncols - 1) for t in range(tile))

    return f"""
def kernel(qc, qr, dc, dr, H):
    Q = qc.shape[0]
    N = dc.shape[0]
    nb = H.shape[1]
    scratch = np.zeros(({tile}, nb), dtype=np.int32)
    for q in range(0, Q - Q % {tile}, {tile}):
{per_query(code)}
{per_query("l{t} = " + label)}
{per_query("h{t} = scratch[{t}]")}
        scratch[:] = 0
        for j in range(N):
            {item}
            lab = {label_item}
{per_query(f"h{{t}}[({dist}) * {ncols} + {grade}] += 1", indent=12)}
        for t in range({tile}):
            for b in range(nb):
                H[q + t, b] += scratch[t, b]
"""


def _compile(kind: str, words: int, tile: int, ncols: int):
    namespace = {"np": np, "popcount64": popcount64, "hamming": hamming, "common_bits": common_bits}
    exec(_kernel_source(kind, words, tile, ncols), namespace)
    return njit(nogil=True, boundscheck=False)(namespace["kernel"])


_KERNELS: dict = {}


def _kernel(kind: str, words: int, tile: int, ncols: int):
    key = (kind, words, tile, ncols)
    if key not in _KERNELS:
        _KERNELS[key] = _compile(*key)
    return _KERNELS[key]


@njit(nogil=True)
def _apply_explicit(qc, dc, db_start, indptr, indices, grades, max_grade, H):
    """Move each listed pair inside this database block from grade 0 to its grade."""
    N = dc.shape[0]
    for q in range(qc.shape[0]):
        lo, hi = indptr[q], indptr[q + 1]
        p = lo + np.searchsorted(indices[lo:hi], db_start)
        while p < hi and indices[p] < db_start + N:
            j = indices[p] - db_start
            g = min(grades[p], max_grade)
            if g > 0:
                d = hamming(qc[q], dc[j])
                H[q, d, 0] -= 1
                H[q, d, g] += 1
            p += 1


def _as_int32_labels(query_labels, db_labels):
    """Class labels as int32 (faster compares); relabel jointly when they do not fit."""
    ql, dl = np.asarray(query_labels), np.asarray(db_labels)
    info = np.iinfo(np.int32)
    if all(a.size == 0 or (a.min() >= info.min and a.max() <= info.max) for a in (ql, dl)):
        return np.ascontiguousarray(ql, dtype=np.int32), np.ascontiguousarray(dl, dtype=np.int32)
    _, ids = np.unique(np.concatenate([ql, dl]), return_inverse=True)
    ids = ids.astype(np.int32)
    return ids[: len(ql)], ids[len(ql) :]


def n_grades(kind: str, max_grade: int) -> int:
    """Size of the grade axis: 2 for class relevance, max_grade + 1 for graded kinds."""
    return 2 if kind == "class" else max_grade + 1


def histogram_block(
    query_codes: np.ndarray,
    db_codes: np.ndarray,
    nbits: int,
    kind: str,
    query_rel=None,
    db_rel=None,
    *,
    db_start: int = 0,
    max_grade: int = 1,
) -> np.ndarray:
    """Histogram of a query block against a database block, shape (Qb, nbits + 1, n_grades).

    kind="class": query_rel, db_rel are int label vectors; grade = 1 for equal labels.
    kind="multilabel": packed multi-hot word rows; grade = labels in common, capped at max_grade.
    kind="explicit": query_rel = (indptr, indices, grades) CSR over the query block with
    absolute database indices; db_start is the block's first database row.
    """
    qc = np.ascontiguousarray(query_codes, dtype=np.uint64)
    dc = np.ascontiguousarray(db_codes, dtype=np.uint64)
    ncols = n_grades(kind, max_grade)
    H = np.zeros((qc.shape[0], nbits + 1, ncols), dtype=np.int64)
    flat = H.reshape(qc.shape[0], -1)
    words = qc.shape[1] if qc.shape[1] <= MAX_UNROLLED_WORDS else 0
    if kind == "class":
        base_kind = kind
        qr, dr = _as_int32_labels(query_rel, db_rel)
    elif kind == "multilabel":
        qr = np.ascontiguousarray(query_rel, dtype=np.uint64)
        dr = np.ascontiguousarray(db_rel, dtype=np.uint64)
        base_kind = "multilabel1" if qr.shape[1] == 1 else kind
    elif kind == "explicit":
        base_kind = "none"
        qr = np.zeros(qc.shape[0], dtype=np.int32)
        dr = np.zeros(dc.shape[0], dtype=np.int32)
    else:
        raise ValueError(f"unknown relevance kind {kind!r}")
    bulk = qc.shape[0] - qc.shape[0] % TILE
    if bulk:
        _kernel(base_kind, words, TILE, ncols)(qc[:bulk], qr[:bulk], dc, dr, flat[:bulk])
    if bulk < qc.shape[0]:
        _kernel(base_kind, words, 1, ncols)(qc[bulk:], qr[bulk:], dc, dr, flat[bulk:])
    if kind == "explicit":
        indptr, indices, grades = (np.ascontiguousarray(a, dtype=np.int64) for a in query_rel)
        _apply_explicit(qc, dc, db_start, indptr, indices, grades, max_grade, H)
    return H
