"""Hamming distances and relevance grades of given (query, database item) pairs: the served entries, recomputed from
the codes and labels exactly as the histogram kernels count them (hashdist.kernels.histogram).

Pairs come flat: ``queries[e]`` the query row of entry e, ``items[e]`` its row among the items read. Work runs in
slices of PAIRS_PER_STEP entries, so memory stays a few MB whatever the lists' size.
"""

from __future__ import annotations

import numpy as np

from hashdist.kernels import cached_njit

PAIRS_PER_STEP = 1 << 18


@cached_njit(nogil=True)
def group_by_chunk(ids, chunk_rows, n_chunks):
    """The entries grouped by the database chunk their id falls in (id // chunk_rows; -1 padding: group
    n_chunks, last): (order, int32 entry indices, ascending within a group; bounds, group g is
    order[bounds[g]:bounds[g + 1]]). A counting sort: two passes, 4 bytes per entry."""
    bounds = np.zeros(n_chunks + 2, dtype=np.int64)
    for e in range(ids.size):
        bounds[(ids[e] // chunk_rows if ids[e] >= 0 else n_chunks) + 1] += 1
    for g in range(n_chunks + 1):
        bounds[g + 1] += bounds[g]
    fill = bounds[:-1].copy()
    order = np.empty(ids.size, dtype=np.int32)
    for e in range(ids.size):
        g = ids[e] // chunk_rows if ids[e] >= 0 else n_chunks
        order[fill[g]] = e
        fill[g] += 1
    return order, bounds


def pair_distances(query_words: np.ndarray, item_words: np.ndarray, queries: np.ndarray,
                   items: np.ndarray) -> np.ndarray:
    """Hamming distance of each pair, int32: popcount of the XOR of the two codes' 64-bit words."""
    out = np.empty(len(queries), dtype=np.int32)
    for s in range(0, len(queries), PAIRS_PER_STEP):
        q, i = queries[s : s + PAIRS_PER_STEP], items[s : s + PAIRS_PER_STEP]
        out[s : s + len(q)] = np.bitwise_count(query_words[q] ^ item_words[i]).sum(axis=1)
    return out


def pair_grades(kind: str, queries: np.ndarray, items: np.ndarray, item_ids: np.ndarray, query_rel, item_rel,
                largest_grade: int) -> np.ndarray:
    """Grade of each pair, int32, capped at ``largest_grade`` (the histogram's grade axis).

    ``class``: 1 for equal labels (``query_rel``, ``item_rel``: label vectors); ``multilabel``: labels in common
    (packed multi-hot words); ``explicit``: the listed grade of (query, database id ``item_ids[e]``), 0 when not
    listed (``query_rel``: the queries' CSR (indptr, indices, grades) over absolute database ids)."""
    out = np.empty(len(queries), dtype=np.int32)
    if kind == "explicit":
        return _listed_grades(queries, item_ids, query_rel, largest_grade)
    for s in range(0, len(queries), PAIRS_PER_STEP):
        q, i = queries[s : s + PAIRS_PER_STEP], items[s : s + PAIRS_PER_STEP]
        if kind == "class":
            out[s : s + len(q)] = query_rel[q] == item_rel[i]
        elif kind == "multilabel":
            common = np.bitwise_count(query_rel[q] & item_rel[i]).sum(axis=1)
            out[s : s + len(q)] = np.minimum(common, largest_grade)
        else:
            raise ValueError(f"unknown relevance kind {kind!r}")
    return out


def _listed_grades(queries: np.ndarray, item_ids: np.ndarray, csr, largest_grade: int) -> np.ndarray:
    """Explicit ground truth: each pair looked up in its query's list (a merged search over query * n + id keys)."""
    indptr, indices, grades = (np.asarray(a, dtype=np.int64) for a in csr)
    n = int(max(indices.max(initial=0), item_ids.max(initial=0))) + 1
    listed = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr)) * n + indices
    order = np.argsort(listed, kind="stable")
    listed, grades = listed[order], grades[order]
    wanted = queries.astype(np.int64) * n + item_ids
    if not len(listed):
        return np.zeros(len(wanted), dtype=np.int32)
    at = np.minimum(np.searchsorted(listed, wanted), len(listed) - 1)
    return np.where(listed[at] == wanted, np.minimum(grades[at], largest_grade), 0).astype(np.int32)
