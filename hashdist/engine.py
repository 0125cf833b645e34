"""Plan and run an evaluation as independent blocks: the work that flows distribute.

A plan cuts queries x database into blocks aligned to the Zarr chunks. Each
histogram block reads its own rows and returns ``H[q, d, g]`` for its queries;
each database block also yields its distinct-code counts for mLGAP. Block
results are cached under content keys. Per query block the partial histograms
are summed (exact integers), ``M_k`` is found from the merged code counts, and
per-query metrics follow; the report's means come last. Nothing here needs
Prefect or Dask: :func:`run_local` drives a plan with a thread pool (the kernels
release the GIL), and ``flows/evaluate.py`` drives the same steps as tasks.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from hashdist.cache import BlockCache
from hashdist.dataset import Dataset, combine_digests, open_dataset
from hashdist.errors import InputError
from hashdist.kernels import KERNEL_VERSION
from hashdist.kernels.codecounts import ball_lookup_table, code_counts, max_bucket_within, merge_code_counts
from hashdist.codeusage import bit_ones_block, code_usage
from hashdist.kernels.hashtable import hashtable_counts
from hashdist.kernels.histogram import histogram_block
from hashdist.metrics.summary import MetricParams, aggregate, concat_per_query, per_query_metrics

DEFAULT_QUERY_BLOCK_ROWS = 2048
DEFAULT_DB_BLOCK_ROWS = 262144
DEFAULT_MAX_GRADE = 8


@dataclass(frozen=True)
class HistogramBlock:
    q0: int
    q1: int
    d0: int
    d1: int
    key: str

    @property
    def pairs(self) -> int:
        return (self.q1 - self.q0) * (self.d1 - self.d0)


@dataclass(frozen=True)
class CountBlock:
    d0: int
    d1: int
    key: str


@dataclass(frozen=True)
class Plan:
    """Everything a worker needs to compute any block, and the blocks themselves."""

    url: str
    nbits: int
    relevance: str
    max_grade: int
    max_radius: int
    query_blocks: tuple[tuple[int, int], ...]
    histogram_blocks: tuple[HistogramBlock, ...]
    count_blocks: tuple[CountBlock, ...]
    hashtables: tuple[tuple[int, int], ...] = ()  # (K bits, L tables) per hashtable-bucket setting

    @property
    def pairs(self) -> int:
        return sum(b.pairs for b in self.histogram_blocks)

    def blocks_of_query_block(self, q0: int) -> list[HistogramBlock]:
        return [b for b in self.histogram_blocks if b.q0 == q0]


def _aligned(rows: int | None, chunk: int, default: int, option: str) -> int:
    rows = default if rows is None else rows
    if int(rows) != rows or rows < 1:
        raise InputError(f"{option} must be a positive integer, got {rows}")
    return -(-int(rows) // chunk) * chunk  # round up to whole chunks


def _ranges(total: int, step: int) -> list[tuple[int, int]]:
    return [(start, min(start + step, total)) for start in range(0, total, step)]


def check_relevance(ds: Dataset, relevance: str | None) -> str:
    relevance = relevance or ds.default_relevance
    if relevance not in ds.relevance_kinds:
        raise InputError(
            f"--relevance {relevance}: dataset {ds.url} supports only {', '.join(ds.relevance_kinds)}"
        )
    return relevance


def make_plan(
    ds: Dataset,
    *,
    relevance: str | None = None,
    max_grade: int = DEFAULT_MAX_GRADE,
    max_radius: int = 2,
    query_block_rows: int | None = None,
    db_block_rows: int | None = None,
    hashtables: tuple[tuple[int, int], ...] = (),
) -> Plan:
    """Blocks aligned to chunks, each keyed on the fingerprints of the rows it reads."""
    relevance = check_relevance(ds, relevance)
    if relevance == "class":
        max_grade = 1
    elif int(max_grade) != max_grade or max_grade < 1:
        raise InputError(f"--max-grade must be a positive integer, got {max_grade}")
    qrows = _aligned(query_block_rows, ds.chunk_rows("queries"), DEFAULT_QUERY_BLOCK_ROWS, "--query-block-rows")
    drows = _aligned(db_block_rows, ds.chunk_rows("database"), DEFAULT_DB_BLOCK_ROWS, "--db-block-rows")
    fp = ds.fingerprints
    common = (KERNEL_VERSION, ds.nbits, relevance, max_grade, *(f"{k}x{l}" for k, l in hashtables))

    def query_digest(q0, q1):
        rel = ds.relevant_digest(q0, q1) if relevance == "explicit" else fp["queries/labels"].rows_digest(q0, q1)
        return combine_digests((fp["queries/codes"].rows_digest(q0, q1), rel))

    def db_digest(d0, d1):
        parts = [fp["database/codes"].rows_digest(d0, d1)]
        if relevance != "explicit":
            parts.append(fp["database/labels"].rows_digest(d0, d1))
        return combine_digests(parts)

    query_blocks = _ranges(ds.n_queries, qrows)
    db_blocks = _ranges(ds.n_database, drows)
    q_digests = {q: query_digest(*q) for q in query_blocks}
    d_digests = {d: db_digest(*d) for d in db_blocks}
    hist = tuple(
        HistogramBlock(q0, q1, d0, d1, combine_digests(("histogram", *common, q_digests[q0, q1], d_digests[d0, d1])))
        for (q0, q1) in query_blocks
        for (d0, d1) in db_blocks
    )
    counts = tuple(
        CountBlock(d0, d1, combine_digests(("code_counts", KERNEL_VERSION, fp["database/codes"].rows_digest(d0, d1))))
        for (d0, d1) in db_blocks
    )
    return Plan(ds.url, ds.nbits, relevance, max_grade, max_radius, tuple(query_blocks), hist, counts,
                tuple(hashtables))


# -- block computations (each opens the dataset itself, so it can run anywhere) --


def compute_histogram(plan: Plan, block: HistogramBlock, ds: Dataset | None = None) -> dict[str, np.ndarray]:
    """The block's partial results: ``H`` and, per hashtable setting, per-query TP and retrieved counts."""
    ds = ds or open_dataset(plan.url)
    qc = ds.codes("queries", block.q0, block.q1)
    dc = ds.codes("database", block.d0, block.d1)
    if plan.relevance == "explicit":
        qrel, drel = ds.relevant(block.q0, block.q1), None
    else:
        qrel = ds.labels("queries", block.q0, block.q1)
        drel = ds.labels("database", block.d0, block.d1)
    result = {
        "H": histogram_block(qc, dc, plan.nbits, plan.relevance, qrel, drel, db_start=block.d0,
                             max_grade=plan.max_grade)
    }
    for k, l in plan.hashtables:
        tp, retrieved = hashtable_counts(qc, dc, plan.nbits, k, l, qrel, drel, plan.relevance, db_start=block.d0)
        result[f"hashtable_tp/{k}x{l}"] = tp
        result[f"hashtable_retrieved/{k}x{l}"] = retrieved
    return result


def cached_histogram(plan: Plan, block: HistogramBlock, cache: BlockCache) -> tuple[dict[str, np.ndarray], bool]:
    """(the block's partial results, True if they came from the cache)."""
    hit = cache.get(block.key)
    if hit is not None and "H" in hit and hit["H"].shape[0] == block.q1 - block.q0:
        return hit, True
    result = compute_histogram(plan, block)
    cache.put(block.key, result)
    return result, False


def add_partials(total: dict | None, part: dict) -> dict:
    """Exact integer sum of two blocks' partial results for the same queries."""
    return dict(part) if total is None else {key: total[key] + part[key] for key in total}


def sum_histogram_blocks(plan: Plan, blocks, cache: BlockCache) -> tuple[dict[int, dict], int]:
    """Several blocks in turn: (summed partial results per query block start q0, blocks computed)."""
    sums: dict[int, dict] = {}
    computed = 0
    for block in blocks:
        part, was_cached = cached_histogram(plan, block, cache)
        sums[block.q0] = add_partials(sums.get(block.q0), part)
        computed += not was_cached
    return sums, computed


def split_by_pairs(blocks, parts: int) -> list[tuple[HistogramBlock, ...]]:
    """Consecutive runs of blocks with about equal query-item pairs, at most ``parts`` of them."""
    blocks = tuple(blocks)
    total = sum(b.pairs for b in blocks)
    runs, start, done = [], 0, 0
    for i, block in enumerate(blocks):
        done += block.pairs
        if done * parts >= total * (len(runs) + 1) or i == len(blocks) - 1:
            runs.append(blocks[start : i + 1])
            start = i + 1
    return runs


def cached_code_counts(plan: Plan, block: CountBlock, cache: BlockCache) -> dict[str, np.ndarray]:
    """Distinct codes with counts, and per-bit set counts, of one database block."""
    hit = cache.get(block.key)
    if hit is not None:
        return hit
    words = open_dataset(plan.url).codes("database", block.d0, block.d1)
    codes, counts = code_counts(words)
    result = {"codes": codes, "counts": counts, "bit_ones": bit_ones_block(words, plan.nbits)}
    cache.put(block.key, result)
    return result


@dataclass(frozen=True)
class CodeTable:
    """The database's distinct codes with their counts, the ball lookup table (built once per run)
    and how many items have each bit set."""

    codes: np.ndarray
    counts: np.ndarray
    slots: np.ndarray | None
    bit_ones: np.ndarray


def code_table(plan: Plan, parts) -> CodeTable:
    parts = list(parts)
    codes, counts = merge_code_counts([(p["codes"], p["counts"]) for p in parts])
    bit_ones = np.sum([p["bit_ones"] for p in parts], axis=0)
    return CodeTable(codes, counts, ball_lookup_table(codes, plan.nbits, plan.max_radius), bit_ones)


def query_block_metrics(plan: Plan, q0: int, q1: int, partials: dict, table: CodeTable, params: MetricParams):
    """M_k and every per-query value for one query block from its summed partial results."""
    queries = open_dataset(plan.url).codes("queries", q0, q1)
    shells = partials["H"][:, : plan.max_radius + 1, :].sum(axis=2)
    M = max_bucket_within(queries, table.codes, table.counts, plan.nbits, plan.max_radius, table.slots, shells)
    per_query = per_query_metrics(partials["H"], M, params)
    per_query.update({key: value for key, value in partials.items() if key.startswith("hashtable_")})
    return per_query


# -- running a whole plan in this process --------------------------------------


@dataclass
class RunResult:
    """What a run produces, however it was driven."""

    metrics: dict
    queries: dict
    per_query: dict[str, np.ndarray]
    code_counts: np.ndarray  # items per distinct database code
    code_usage: dict
    blocks: dict  # {total, computed, cached}
    timing: dict = field(default_factory=dict)


def finish(plan: Plan, params: MetricParams, per_query_parts, table: CodeTable, computed: int, cached: int):
    """Concatenate per-query values, aggregate them, and summarise the database's code usage."""
    per_query = concat_per_query(list(per_query_parts))
    metrics, queries = aggregate(per_query, params)
    usage = code_usage(table.counts, table.bit_ones, int(table.counts.sum()), plan.nbits)
    blocks = {"total": len(plan.histogram_blocks), "computed": computed, "cached": cached}
    return RunResult(metrics, queries, per_query, table.counts, usage, blocks)


def run_local(plan: Plan, params: MetricParams, cache: BlockCache, *, threads: int | None = None, progress=None):
    """Run every block of the plan with a thread pool in this process; returns a RunResult.

    ``progress(block, cached)`` is called after each histogram block.
    """
    threads = threads or os.cpu_count() or 1
    computed = cached = 0
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        counts = list(pool.map(lambda b: cached_code_counts(plan, b, cache), plan.count_blocks))
        sums: dict[int, dict] = {}
        for block, (part, was_cached) in zip(
            plan.histogram_blocks, pool.map(lambda b: cached_histogram(plan, b, cache), plan.histogram_blocks)
        ):
            sums[block.q0] = add_partials(sums.get(block.q0), part)
            cached += was_cached
            computed += not was_cached
            if progress:
                progress(block, was_cached)
        t1 = time.perf_counter()
        table = code_table(plan, counts)
        t2 = time.perf_counter()
        parts = pool.map(lambda q: query_block_metrics(plan, q[0], q[1], sums[q[0]], table, params), plan.query_blocks)
        result = finish(plan, params, parts, table, computed, cached)
    result.timing = {"compute_s": t1 - t0, "reduce_s": t2 - t1, "metrics_s": time.perf_counter() - t2}
    return result
