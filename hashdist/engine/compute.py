"""The blocks' work, each opening the dataset itself so that it runs anywhere: a histogram block's partial
results (from the cache or computed), a group of database blocks' distinct codes, and the mergeable state
(:class:`Partials`) a worker's share of histogram blocks adds up to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from hashdist.data.dataset import Dataset, content_digest, open_dataset
from hashdist.engine.blocks import Block, content_key
from hashdist.engine.cache import BlockCache
from hashdist.engine.heap import map_large_arrays
from hashdist.engine.plan import Plan
from hashdist.engine.spill import spill_rows, take_rows
from hashdist.kernels.binned import binned_histogram_block
from hashdist.kernels.codecounts import code_counts, rows_in_parts, split_by_code_hash
from hashdist.kernels.codeusage import bit_ones_block
from hashdist.kernels.collapse import auto_histogram_block, should_collapse
from hashdist.kernels.hashtable import hashtable_counts
from hashdist.kernels.histogram import n_grades
from hashdist.kernels.torchhist import torch_histogram_block

ENTRY_SLACK = 1 << 16  # bytes of a cache entry beyond its int64 arrays (zip and .npy headers, names, digest)


def _query_rows(plan: Plan, block: Block, ds: Dataset, memo: dict):
    """(codes, relevance, scores or None) of the block's queries; a share reads each query block once (kept in
    ``memo``)."""
    rows = (block.q0, block.q1)
    if memo.get("queries", (None,))[0] != rows:
        qc = ds.codes("queries", *rows)
        qrel = ds.relevant(*rows) if plan.relevance == "explicit" else ds.labels("queries", *rows)
        asymmetric = plan.distance is not None and plan.distance.kind == "asymmetric"
        scores = ds.read("queries/scores", *rows) if asymmetric else None
        memo["queries"] = rows, qc, qrel, scores
    return memo["queries"][1:]


def _database_rows(plan: Plan, block: Block, ds: Dataset, memo: dict):
    """(codes, labels or None) of the block's database rows, read now unless they are the share's last ones read
    (kept in ``memo``, where rows read anew drop the digest of the earlier read: see :func:`_content_key`)."""
    rows = (block.d0, block.d1)
    if memo.get("database", (None,))[0] != rows:
        dc = ds.codes("database", *rows)
        drel = None if plan.relevance == "explicit" else ds.labels("database", *rows)
        memo["database"] = rows, dc, drel
        memo.pop(("digest", rows), None)
    return memo["database"][1:]


def compute_histogram(plan: Plan, block: Block, ds: Dataset | None = None, memo: dict | None = None
                      ) -> dict[str, np.ndarray]:
    """The block's partial results: ``H`` and, per hashtable setting, per-query TP and retrieved counts;
    with a distance other than plain Hamming, ``H`` is over its bins and ``H_hamming`` the plain Hamming one.
    ``collapse`` is (database rows, their distinct (code, label) rows, 1 if the Hamming histogram was counted
    over the distinct rows with their multiplicities): hashdist.kernels.collapse decides, the result is the same.

    ``memo``, kept by a share across its blocks (see run_blocks), holds the last query block's rows, the last
    database block's rows, the content digests of the rows read (with a cache), and each database block's
    collapse decision with its distinct rows: a collapsed database block is read only once.
    """
    ds = ds or open_dataset(plan.url, plan.task)
    memo = {} if memo is None else memo
    qc, qrel, scores = _query_rows(plan, block, ds, memo)
    key = (block.d0, block.d1, block.q1 - block.q0)
    decision = memo.get(key)
    dc = drel = None  # a collapsed database block's distinct rows are all the histogram needs
    if decision is None or decision[0] is None or plan.distance is not None or plan.hashtables:
        dc, drel = _database_rows(plan, block, ds, memo)
    H, collapse = _hamming_histogram(plan, block, (qc, qrel), (dc, drel), memo)
    result = {"H": H, "collapse": collapse}
    if plan.distance is not None:
        result["H_hamming"] = result["H"]
        result["H"] = binned_histogram_block(plan.distance, qc, dc, plan.nbits, plan.relevance, qrel, drel, q0=block.q0,
                                             scores=scores, db_start=block.d0, max_grade=plan.grade_top)
    for bits, tables in plan.hashtables:
        tp, retrieved = hashtable_counts(qc, dc, plan.nbits, bits, tables, qrel, drel, plan.relevance,
                                         db_start=block.d0)
        result[f"hashtable_tp/{bits}x{tables}"] = tp
        result[f"hashtable_retrieved/{bits}x{tables}"] = retrieved
    return result


def _content_key(plan: Plan, block: Block, ds: Dataset, memo: dict) -> str:
    """The block's cache key: its plan key and the content digests of its query and database rows as this share
    read them (hashed only here, so a run without a cache hashes nothing). A database block's digest is kept
    in ``memo``: a later query block meeting it reads its rows only to compute."""
    queries = (block.q0, block.q1)
    if memo.get("query digest", (None,))[0] != queries:
        memo["query digest"] = queries, content_digest(*_query_rows(plan, block, ds, memo))
    rows = (block.d0, block.d1)
    if ("digest", rows) not in memo:
        memo["digest", rows] = content_digest(*_database_rows(plan, block, ds, memo))
    return content_key(block, memo["query digest"][1], memo["digest", rows])


def _hamming_histogram(plan: Plan, block: Block, queries, database, memo: dict) -> tuple[np.ndarray, np.ndarray]:
    """The block's Hamming histogram by the plan's engine, and its collapse tally (see compute_histogram); the
    torch engine counts every row (never collapsed)."""
    (qc, qrel), (dc, drel) = queries, database
    if plan.engine == "torch":
        H = torch_histogram_block(qc, dc, plan.nbits, plan.relevance, qrel, drel, db_start=block.d0,
                                  max_grade=plan.grade_top, device=plan.device)
        return H, np.array([len(dc), len(dc), 0], np.int64)
    key = (block.d0, block.d1, block.q1 - block.q0)
    if memo.get(key) is None:
        memo[key] = should_collapse(block.q1 - block.q0, dc, drel, plan.relevance)
    H, collapse = auto_histogram_block(qc, dc, plan.nbits, plan.relevance, qrel, drel, db_start=block.d0,
                                       max_grade=plan.grade_top, decision=memo[key])
    return H, np.array([collapse.n_items, collapse.n_distinct, collapse.collapsed], np.int64)


def cached_histogram(plan: Plan, block: Block, cache: BlockCache, ds: Dataset | None = None,
                     memo: dict | None = None) -> tuple[dict[str, np.ndarray], bool]:
    """(the block's partial results, True if they came from the cache).

    The cache key holds the digests of the rows' content as read in this run (a rerun reads and hashes each
    block's rows once per share, but runs no kernel), so data changed in place is never answered from the
    cache. A cached entry whose arrays are not what this block's result can be (:func:`valid_histogram`) is
    a miss, recomputed."""
    if cache.directory is None:
        return compute_histogram(plan, block, ds, memo), False
    ds = ds or open_dataset(plan.url, plan.task)
    memo = {} if memo is None else memo
    shapes = result_shapes(plan, block)
    largest = 8 * sum(map(math.prod, shapes.values())) + ENTRY_SLACK
    hit = cache.get(_content_key(plan, block, ds, memo), max_bytes=largest)
    if hit is not None and valid_histogram(plan, block, hit, shapes):
        return hit, True
    result = compute_histogram(plan, block, ds, memo)
    cache.put(_content_key(plan, block, ds, memo), result)  # the digests of the rows the result came from
    return result, False


def _counts(a: np.ndarray, shape: tuple) -> bool:
    """``a`` is a non-negative int64 array of this shape."""
    return a.dtype == np.int64 and a.shape == shape and not (a < 0).any()


def result_shapes(plan: Plan, block: Block) -> dict[str, tuple[int, ...]]:
    """The name and shape of each array of the block's result (:func:`compute_histogram`), all int64."""
    queries, grades = block.q1 - block.q0, n_grades(plan.relevance, plan.grade_top)
    shapes = {"H": (queries, plan.nbits + 1, grades), "collapse": (3,)}
    if plan.distance is not None:
        shapes.update(H=(queries, plan.distance.n_bins, grades), H_hamming=(queries, plan.nbits + 1, grades))
    for bits, tables in plan.hashtables:
        shapes[f"hashtable_tp/{bits}x{tables}"] = shapes[f"hashtable_retrieved/{bits}x{tables}"] = (queries,)
    return shapes


def valid_histogram(plan: Plan, block: Block, arrays: dict[str, np.ndarray], shapes: dict | None = None) -> bool:
    """Whether ``arrays`` can be this block's result: the names and shapes it has (``shapes``: from
    :func:`result_shapes`), non-negative int64 counts, every query's histograms counting each database row
    once, hashtable TP <= retrieved <= rows. A forged entry that passes is still possible (see docs/errors.md);
    one that fails is a miss, and cannot reach the reduction."""
    rows = block.d1 - block.d0
    shapes = shapes or result_shapes(plan, block)
    if set(arrays) != set(shapes) or not all(_counts(arrays[name], shape) for name, shape in shapes.items()):
        return False
    n_items, n_distinct, collapsed = arrays["collapse"]
    if n_items != rows or n_distinct > rows or collapsed > 1:
        return False
    histograms = (arrays["H"], arrays.get("H_hamming", arrays["H"]))
    if any((h.sum(axis=(1, 2)) != rows).any() for h in histograms):
        return False
    return all((arrays[f"hashtable_tp/{b}x{t}"] <= arrays[f"hashtable_retrieved/{b}x{t}"]).all()
               and (arrays[f"hashtable_retrieved/{b}x{t}"] <= rows).all() for b, t in plan.hashtables)


@dataclass
class CodePieces:
    """Distinct codes with counts of some database rows for the code parts of one pass (a piece per database
    block and part, merged only when the part is: a group of blocks never holds its codes twice), and with the
    first pass, how many of those rows have each bit set."""

    pieces: dict[int, list[tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    bit_ones: np.ndarray | int = 0


def count_codes(plan: Plan, blocks, parts: range, ds: Dataset | None = None, spill: str | None = None) -> CodePieces:
    """The distinct codes of these database blocks that fall in code parts ``parts``, a piece per block and part.

    A pass takes its rows of each block by a hash of the code (the others are skipped, not sorted), so only its
    share is counted: the passes together count every row once. Without ``spill`` each pass reads the codes
    again; with a spill directory (:mod:`hashdist.engine.spill`) the first pass sets aside the later passes'
    rows there, and they read only those.
    """
    map_large_arrays()
    ds = ds or open_dataset(plan.url, plan.task)
    result = CodePieces({p: [] for p in parts})
    for d0, d1 in blocks:
        if spill is not None and parts.start > 0:
            mine = take_rows(spill, plan, parts, d0)
        else:
            words = ds.codes("database", d0, d1)
            if parts.start == 0:
                result.bit_ones = result.bit_ones + bit_ones_block(words, plan.nbits)
            if spill is not None:  # the first pass: it sets the later passes' rows aside and keeps its own
                mine = spill_rows(spill, plan, words, d0)
            else:
                mine = rows_in_parts(words, plan.code_parts, parts.start, parts.stop)
        codes, counts = code_counts(mine)
        by_part = split_by_code_hash(codes, counts, plan.code_parts)[parts.start : parts.stop]
        for p, piece in zip(parts, by_part, strict=True):
            result.pieces[p].append(piece)
    return result


TALLIES = ("computed", "cached", "collapsed", "rows", "distinct_rows", "computed_pairs")


@dataclass
class Partials:
    """The mergeable state of a run's histogram blocks: their results summed per query block (exact integers)
    and tallies (TALLIES: blocks computed, from the cache, collapsed to distinct rows; database rows and
    their distinct rows, summed over blocks; the pairs of the computed blocks).

    ``add_block`` updates it and ``merge`` combines two (in any order, any grouping: the sums are exact).
    """

    sums: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    tallies: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TALLIES, 0))

    def add_block(self, q0: int, result: dict[str, np.ndarray], was_cached: bool, pairs: int = 0) -> None:
        result = dict(result)
        rows, distinct, collapsed = result.pop("collapse", (0, 0, 0))  # absent from blocks cached before it
        self._add_sums(q0, result)
        computed = (not was_cached, was_cached, collapsed, rows, distinct, 0 if was_cached else pairs)
        for key, value in zip(TALLIES, computed, strict=True):
            self.tallies[key] += int(value)

    def merge(self, other: Partials) -> Partials:
        for q0, part in other.sums.items():
            self._add_sums(q0, part)
        self.tallies = {key: self.tallies[key] + other.tallies[key] for key in TALLIES}
        return self

    def _add_sums(self, q0: int, part: dict[str, np.ndarray]) -> None:
        total = self.sums.get(q0)
        self.sums[q0] = dict(part) if total is None else add_sums(total, part)


def add_sums(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Two partial results of the same queries summed (exact integers)."""
    return {key: a[key] + b[key] for key in a}


def run_blocks(plan: Plan, blocks, cache: BlockCache, progress=None) -> Partials:
    """One worker's share: these histogram blocks, from the cache or computed.

    ``progress(block, cached)`` is called after each histogram block.
    """
    map_large_arrays()
    partials, ds, memo = Partials(), None, {}  # see compute_histogram
    for block in blocks:
        ds = ds or open_dataset(plan.url, plan.task)
        result, was_cached = cached_histogram(plan, block, cache, ds, memo)
        partials.add_block(block.q0, result, was_cached, block.pairs)
        if progress:
            progress(block, was_cached)
    return partials
