"""Plan and run an evaluation as independent blocks: the work that flows distribute.

A plan cuts queries x database into blocks aligned to the Zarr chunks. Each
histogram block reads its own rows and returns ``H[q, d, g]`` for its queries.
Histogram blocks are cached under content keys. The database's distinct codes (for
mLGAP's ``M_k`` and code usage) are counted in passes of their own over its codes,
split into parts by hash (:func:`count_codes`). Per query block the partial histograms
are summed (exact integers), ``M_k`` is found from the merged code counts, and
per-query metrics follow; the report's means come last. Nothing here needs
Prefect or Dask: :func:`run_local` drives a plan with a thread pool (the kernels
release the GIL), and ``flows/evaluate.py`` drives the same steps as tasks.
"""

from __future__ import annotations

import functools
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np

from hashdist.data.dataset import Dataset, combine_digests, open_dataset, task_url
from hashdist.defaults import DEFAULT_DB_BLOCK_ROWS, DEFAULT_QUERY_BLOCK_ROWS
from hashdist.engine import precompile
from hashdist.engine.blocks import Block, block_rows, row_ranges, split_by_pairs
from hashdist.engine.cache import BlockCache
from hashdist.errors import InputError, check_integer
from hashdist.kernels import KERNEL_VERSION
from hashdist.kernels.binned import binned_histogram_block
from hashdist.kernels.codecounts import (
    ball_lookup_table,
    code_counts,
    max_bucket_within,
    merge_code_counts,
    split_by_code_hash,
)
from hashdist.kernels.codeusage import bit_ones_block, bucket_sizes, code_usage, merge_bucket_sizes
from hashdist.kernels.collapse import auto_histogram_block, should_collapse
from hashdist.kernels.distance import DistanceAxis
from hashdist.kernels.hashtable import hashtable_counts
from hashdist.metrics.summary import MetricParams, aggregate, concat_per_query, per_query_metrics

METRIC_ROWS = 1024  # queries per metrics work item: threads share the work evenly, calls stay vectorised
CODES_PER_PART = 2**22  # database items whose distinct codes one code part may hold (64 MiB at B = 64)


@dataclass(frozen=True)
class Plan:
    """Everything a worker needs to compute any block, and the blocks themselves."""

    url: str
    nbits: int
    relevance: str
    largest_grade: int  # the grade axis: the most labels in common any query can have (uncapped)
    max_radius: int
    query_block_rows: int
    db_block_rows: int
    query_blocks: tuple[tuple[int, int], ...]
    histogram_blocks: tuple[Block, ...]
    count_blocks: tuple[tuple[int, int], ...]  # database rows [d0, d1) whose distinct codes are counted together
    hashtables: tuple[tuple[int, int], ...] = ()  # (K bits, L tables) per hashtable-bucket setting
    distance: DistanceAxis | None = None  # the bins of a ranking distance other than plain Hamming
    code_parts: int | None = None  # parts the distinct database codes are split into by hash (None: by size)
    parts_per_pass: int = 1  # code parts counted, merged and searched at once (see for_threads)

    @property
    def pairs(self) -> int:
        return sum(b.pairs for b in self.histogram_blocks)


def check_relevance(ds: Dataset, relevance: str | None) -> str:
    relevance = relevance or ds.default_relevance
    if relevance not in ds.relevance_kinds:
        raise InputError(
            f"--relevance {relevance}: dataset {ds.url} supports only {', '.join(ds.relevance_kinds)}"
        )
    return relevance


def largest_possible_grade(ds: Dataset, relevance: str) -> int:
    """The largest grade any pair can have, a run-wide constant that sizes the histogram's grade axis:
    1 for classes, the most labels any query has for multi-label data (labels in common cannot exceed
    it), the largest listed grade for explicit ground truth."""
    if relevance == "class":
        return 1
    if relevance == "multilabel":
        words = ds.labels("queries", 0, ds.n_queries)
        return max(1, int(np.bitwise_count(words).sum(axis=1).max(initial=0)))
    if not ds.has("queries/relevant/grades"):
        return 1
    grades = ds.read("queries/relevant/grades", 0, ds.fingerprints["queries/relevant/grades"].rows)
    return max(1, int(grades.max(initial=0)))


def make_plan(
    ds: Dataset,
    *,
    relevance: str | None = None,
    max_radius: int = 2,
    query_block_rows: int | None = None,
    db_block_rows: int | None = None,
    hashtables: tuple[tuple[int, int], ...] = (),
    distance: DistanceAxis | None = None,
    code_parts: int | None = None,
) -> Plan:
    """Blocks aligned to chunks, each keyed on the fingerprints of the rows it reads (and the distance's bins).

    ``code_parts``: how many parts the distinct database codes are split into (default: see
    :func:`for_threads`); no result depends on it.
    """
    relevance = check_relevance(ds, relevance)
    if code_parts is not None:
        check_integer(code_parts, "--code-parts")
    largest_grade = largest_possible_grade(ds, relevance)
    qrows = block_rows(query_block_rows, ds.chunk_rows("queries"), DEFAULT_QUERY_BLOCK_ROWS, "--query-block-rows",
                       ds.n_queries)
    drows = block_rows(db_block_rows, ds.chunk_rows("database"), DEFAULT_DB_BLOCK_ROWS, "--db-block-rows",
                       ds.n_database)
    fp = ds.fingerprints
    common = (KERNEL_VERSION, ds.nbits, relevance, largest_grade, *(f"{bits}x{tables}" for bits, tables in hashtables),
              *(("distance", distance.digest) if distance is not None else ()))

    def query_digest(q0, q1):
        rel = ds.relevant_digest(q0, q1) if relevance == "explicit" else fp["queries/labels"].rows_digest(q0, q1)
        return combine_digests((fp["queries/codes"].rows_digest(q0, q1), rel))

    def db_digest(d0, d1):
        parts = [fp["database/codes"].rows_digest(d0, d1)]
        if relevance != "explicit":
            parts.append(fp["database/labels"].rows_digest(d0, d1))
        return combine_digests(parts)

    query_blocks = row_ranges(ds.n_queries, qrows)
    db_blocks = row_ranges(ds.n_database, drows)
    q_digests = {q: query_digest(*q) for q in query_blocks}
    d_digests = {d: db_digest(*d) for d in db_blocks}
    hist = tuple(
        Block(q0, q1, d0, d1, combine_digests(("histogram", *common, q_digests[q0, q1], d_digests[d0, d1])))
        for (q0, q1) in query_blocks
        for (d0, d1) in db_blocks
    )
    return Plan(task_url(ds.url), ds.nbits, relevance, largest_grade, max_radius, qrows, drows, tuple(query_blocks),
                hist, tuple(db_blocks), tuple(hashtables), distance, code_parts)


def for_threads(plan: Plan, threads: int) -> Plan:
    """The plan's code parts for ``threads`` worker threads: the parts the user chose, else enough that one
    holds the codes of at most CODES_PER_PART items and at least one per thread; one per thread is counted,
    merged and searched in one pass over the database codes, so memory does not grow with the database."""
    n_items = sum(d1 - d0 for d0, d1 in plan.count_blocks)
    parts = plan.code_parts or max(threads, -(-n_items // CODES_PER_PART))
    return replace(plan, code_parts=parts, parts_per_pass=max(1, threads))


def code_passes(plan: Plan) -> list[range]:
    """The code parts of each pass (plan from :func:`for_threads`)."""
    return [range(p, min(p + plan.parts_per_pass, plan.code_parts)) for p in range(0, plan.code_parts,
                                                                                 plan.parts_per_pass)]


# -- block computations (each opens the dataset itself, so it can run anywhere) --


def compute_histogram(plan: Plan, block: Block, ds: Dataset | None = None, memo: dict | None = None
                      ) -> dict[str, np.ndarray]:
    """The block's partial results: ``H`` and, per hashtable setting, per-query TP and retrieved counts;
    with a distance other than plain Hamming, ``H`` is over its bins and ``H_hamming`` the plain Hamming one.
    ``collapse`` is (database rows, their distinct (code, label) rows, 1 if the Hamming histogram was counted
    over the distinct rows with their multiplicities): hashdist.kernels.collapse decides, the result is the same.

    ``memo``, kept by a share across its blocks (see run_blocks), holds the last query block's rows and each
    database block's collapse decision with its distinct rows: a collapsed database block is read only once.
    """
    ds = ds or open_dataset(plan.url)
    memo = {} if memo is None else memo
    if memo.get("queries", (None,))[0] != (block.q0, block.q1):
        qrel = (ds.relevant(block.q0, block.q1) if plan.relevance == "explicit"
                else ds.labels("queries", block.q0, block.q1))
        memo["queries"] = (block.q0, block.q1), ds.codes("queries", block.q0, block.q1), qrel
    _, qc, qrel = memo["queries"]
    key = (block.d0, block.d1, block.q1 - block.q0)
    decision = memo.get(key)
    dc = drel = None  # a collapsed database block's distinct rows are all the histogram needs
    if decision is None or decision[0] is None or plan.distance is not None or plan.hashtables:
        dc = ds.codes("database", block.d0, block.d1)
        drel = None if plan.relevance == "explicit" else ds.labels("database", block.d0, block.d1)
    if decision is None:
        decision = memo[key] = should_collapse(block.q1 - block.q0, dc, drel, plan.relevance)
    H, collapse = auto_histogram_block(qc, dc, plan.nbits, plan.relevance, qrel, drel, db_start=block.d0,
                                       max_grade=plan.largest_grade, decision=decision)
    result = {"H": H, "collapse": np.array([collapse.n_items, collapse.n_distinct, collapse.collapsed], np.int64)}
    if plan.distance is not None:
        scores = ds.read("queries/scores", block.q0, block.q1) if plan.distance.kind == "asymmetric" else None
        result["H_hamming"] = result["H"]
        result["H"] = binned_histogram_block(plan.distance, qc, dc, plan.nbits, plan.relevance, qrel, drel, q0=block.q0,
                                             scores=scores, db_start=block.d0, max_grade=plan.largest_grade)
    for bits, tables in plan.hashtables:
        tp, retrieved = hashtable_counts(qc, dc, plan.nbits, bits, tables, qrel, drel, plan.relevance,
                                         db_start=block.d0)
        result[f"hashtable_tp/{bits}x{tables}"] = tp
        result[f"hashtable_retrieved/{bits}x{tables}"] = retrieved
    return result


def cached_histogram(plan: Plan, block: Block, cache: BlockCache, ds: Dataset | None = None,
                     memo: dict | None = None) -> tuple[dict[str, np.ndarray], bool]:
    """(the block's partial results, True if they came from the cache)."""
    hit = cache.get(block.key)
    if hit is not None and "H" in hit and hit["H"].shape[0] == block.q1 - block.q0:
        return hit, True
    result = compute_histogram(plan, block, ds, memo)
    cache.put(block.key, result)
    return result, False


@dataclass
class CodePieces:
    """Distinct codes with counts of some database rows for the code parts of one pass (pieces per part),
    and with the first pass, how many of those rows have each bit set. Mergeable like Partials."""

    pieces: dict[int, list[tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    bit_ones: np.ndarray | int = 0

    def merge(self, other: CodePieces) -> CodePieces:
        for p, pieces in other.pieces.items():
            self.pieces.setdefault(p, []).extend(pieces)
        self.bit_ones = self.bit_ones + other.bit_ones
        return self


def count_codes(plan: Plan, blocks, parts: range, ds: Dataset | None = None) -> CodePieces:
    """The distinct codes of these database blocks that fall in code parts ``parts``, one merged piece per part.

    Rows are sorted into parts by hash first, so only a pass's share of each block is counted: the
    passes together count every row once, each reading the codes again (cheap against the histograms).
    """
    ds = ds or open_dataset(plan.url)
    result = CodePieces({p: [] for p in parts})
    for d0, d1 in blocks:
        words = ds.codes("database", d0, d1)
        if parts.start == 0:
            result.bit_ones = result.bit_ones + bit_ones_block(words, plan.nbits)
        rows = split_by_code_hash(words, None, plan.code_parts)
        mine = np.concatenate([rows[p][0] for p in parts])
        codes, counts = code_counts(mine)
        by_part = split_by_code_hash(codes, counts, plan.code_parts)[parts.start : parts.stop]
        for p, piece in zip(parts, by_part, strict=True):
            result.pieces[p].append(piece)
    result.pieces = {p: [merge_code_counts(pieces)] if pieces else [] for p, pieces in result.pieces.items()}
    return result


# -- the reduction: one mergeable state, whichever engine drives the blocks ------


TALLIES = ("computed", "cached", "collapsed", "rows", "distinct_rows")


@dataclass
class Partials:
    """The mergeable state of a run's histogram blocks: their results summed per query block (exact integers)
    and tallies (TALLIES: blocks computed, from the cache, collapsed to distinct rows; database rows and
    their distinct rows, summed over blocks).

    ``add_block`` updates it and ``merge`` combines two (in any order, any grouping: the sums are exact).
    """

    sums: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    tallies: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TALLIES, 0))

    def add_block(self, q0: int, result: dict[str, np.ndarray], was_cached: bool) -> None:
        result = dict(result)
        rows, distinct, collapsed = result.pop("collapse", (0, 0, 0))  # absent from blocks cached before it
        self._add_sums(q0, result)
        for key, value in zip(TALLIES, (not was_cached, was_cached, collapsed, rows, distinct), strict=True):
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
    partials, ds, memo = Partials(), None, {}  # see compute_histogram
    for block in blocks:
        ds = ds or open_dataset(plan.url)
        result, was_cached = cached_histogram(plan, block, cache, ds, memo)
        partials.add_block(block.q0, result, was_cached)
        if progress:
            progress(block, was_cached)
    return partials


def work_shares(plan: Plan, parts: int) -> list[tuple[Block, ...]]:
    """The histogram blocks cut into at most ``parts`` runs of consecutive blocks with about equal pairs."""
    return split_by_pairs(plan.histogram_blocks, parts)


def count_shares(plan: Plan, parts: int) -> list[tuple[tuple[int, int], ...]]:
    """The database blocks dealt round into at most ``parts`` groups, for code counting."""
    return [group for group in (plan.count_blocks[i::parts] for i in range(parts)) if group]


# -- after the blocks: code parts, M_k and per-query metrics per metric item ------


def metric_items(plan: Plan) -> list[tuple[int, int, int]]:
    """``(q0 of the query block, start, stop)``: the plan's queries in items of at most METRIC_ROWS,
    each within one query block, so threads and workers share the work evenly (per-query values
    do not depend on the grouping)."""
    return [(q0, q0 + a, q0 + b) for q0, q1 in plan.query_blocks for a, b in row_ranges(q1 - q0, METRIC_ROWS)]


def item_sums(sums: dict[str, np.ndarray], q0: int, start: int, stop: int) -> dict[str, np.ndarray]:
    """The summed partial results of queries [start, stop) of the query block starting at q0."""
    return {key: v[start - q0 : stop - q0] for key, v in sums.items()}


def query_shells(plan: Plan, sums: dict[str, np.ndarray]) -> np.ndarray:
    """Database items at Hamming distance exactly k = 0..max_radius from each query (M_k's search skips)."""
    hamming = sums.get("H_hamming", sums["H"])
    return hamming[:, : plan.max_radius + 1, :].sum(axis=2)


@dataclass(frozen=True)
class CodePart:
    """One code part: its distinct codes (sorted) with their counts."""

    codes: np.ndarray
    counts: np.ndarray
    nbits: int
    radius: int

    @functools.cached_property
    def slots(self) -> np.ndarray | None:
        """The ball lookup table over the codes, built on first use (None: scanning them is cheaper)."""
        return ball_lookup_table(self.codes, self.nbits, self.radius)

    def max_buckets(self, queries: np.ndarray, shells: np.ndarray) -> np.ndarray:
        """M_k of these queries within this part. Only a shell of 2 or more items can hold a bucket above 1,
        so without such a shell, or when every code here holds one item, no search (and no table) is needed."""
        search = len(self.counts) and self.counts.max() > 1 and (shells >= 2).any()
        return max_bucket_within(queries, self.codes, self.counts, self.nbits, self.radius,
                                 self.slots if search else None, shells)


def code_part(plan: Plan, pieces) -> CodePart:
    """A code part from its pieces (one per share or per database block; None for a share without any)."""
    pieces = [piece for piece in pieces if piece is not None]
    if pieces:
        codes, counts = merge_code_counts(pieces)
    else:
        codes, counts = np.zeros((0, -(-plan.nbits // 64)), dtype=np.uint64), np.zeros(0, dtype=np.int64)
    return CodePart(codes, counts, plan.nbits, plan.max_radius)


def part_max_buckets(plan: Plan, part: CodePart, start: int, stop: int, shells: np.ndarray,
                     ds: Dataset | None = None) -> np.ndarray:
    """M_k of queries [start, stop) within one code part; the maximum over parts is M_k."""
    return part.max_buckets((ds or open_dataset(plan.url)).codes("queries", start, stop), shells)


def item_metrics(params: MetricParams, sums: dict[str, np.ndarray], M: np.ndarray) -> dict[str, np.ndarray]:
    """Every per-query value of one metric item from its summed partial results and M_k."""
    per_query = per_query_metrics(sums["H"], M, params, sums.get("H_hamming"))
    per_query.update({key: value for key, value in sums.items() if key.startswith("hashtable_")})
    return per_query


@dataclass
class RunResult:
    """What a run produces, however it was driven."""

    metrics: dict
    queries: dict
    per_query: dict[str, np.ndarray]
    bucket_sizes: np.ndarray  # (size, codes) rows: how many distinct database codes hold each number of items
    code_usage: dict
    blocks: dict  # {total, computed, cached, collapsed, distinct_fraction}
    timing: dict = field(default_factory=dict)


def assemble(plan: Plan, params: MetricParams, item_values, part_sizes, bit_ones, tallies: dict) -> RunResult:
    """The RunResult from every metric item's per-query values (in plan order), each code part's bucket sizes,
    the per-bit set counts and the blocks' tallies: the report's means, the code usage and the block counts."""
    per_query = concat_per_query(list(item_values))
    metrics, queries = aggregate(per_query, params)
    sizes = merge_bucket_sizes(part_sizes)
    usage = code_usage(sizes, bit_ones, int((sizes[:, 0] * sizes[:, 1]).sum()), plan.nbits)
    # distinct (code, label) rows per database row over the blocks that recorded it (exact where collapsed,
    # else hashdist.kernels.collapse's estimate); None when every block came from a cache that predates it
    fraction = tallies["distinct_rows"] / tallies["rows"] if tallies["rows"] else None
    blocks = {"total": len(plan.histogram_blocks), "computed": tallies["computed"], "cached": tallies["cached"],
              "collapsed": tallies["collapsed"], "distinct_fraction": fraction}
    return RunResult(metrics, queries, per_query, sizes, usage, blocks)


def finish(plan: Plan, params: MetricParams, partials: Partials, map_items) -> RunResult:
    """The histogram blocks' state to a RunResult in this process, one pass of code parts at a time.

    ``plan`` comes from :func:`for_threads`. ``map_items(function, items)`` applies ``function`` to every item,
    in order (a thread pool, or a plain map). Records reduce_s (code counts, parts and M_k) and metrics_s.
    """
    t0 = time.perf_counter()
    items = metric_items(plan)
    sums = [item_sums(partials.sums[q0], q0, start, stop) for q0, start, stop in items]
    shells = [query_shells(plan, s) for s in sums]
    ds = open_dataset(plan.url)
    M, part_sizes, bit_ones = [None] * len(items), [], 0
    for parts in code_passes(plan):
        counted = functools.reduce(CodePieces.merge, map_items(
            lambda block, parts=parts: count_codes(plan, [block], parts, ds), plan.count_blocks), CodePieces())
        bit_ones = bit_ones + counted.bit_ones
        for p in parts:
            part = code_part(plan, counted.pieces.pop(p, []))
            found = map_items(lambda i, part=part: part_max_buckets(plan, part, *items[i][1:], shells[i], ds),
                              range(len(items)))
            M = [m if old is None else np.maximum(old, m) for old, m in zip(M, found, strict=True)]
            part_sizes.append(bucket_sizes(part.counts))
    t1 = time.perf_counter()
    precompile.join()  # a first run: the measures compile on two cores
    values = map_items(lambda i: item_metrics(params, sums[i], M[i]), range(len(items)))
    result = assemble(plan, params, values, part_sizes, bit_ones, partials.tallies)
    result.timing = {"reduce_s": t1 - t0, "metrics_s": time.perf_counter() - t1}
    return result


def run_local(plan: Plan, params: MetricParams, cache: BlockCache, *, threads: int, progress=None) -> RunResult:
    """Run every block of the plan with ``threads`` threads in this process; returns a RunResult.

    ``progress(block, cached)`` is called after each histogram block.
    """
    t0 = time.perf_counter()
    precompile.start()
    plan = for_threads(plan, threads)
    with ThreadPoolExecutor(threads) as pool:
        partials = functools.reduce(
            Partials.merge, pool.map(lambda run: run_blocks(plan, run, cache, progress), work_shares(plan, threads)),
            Partials())
        t1 = time.perf_counter()
        result = finish(plan, params, partials, lambda function, items: list(pool.map(function, items)))
    result.timing = {"compute_s": t1 - t0, **result.timing}
    return result
