"""The reduction, written once for both executors: from the histogram blocks' partial sums to the RunResult.

Per metric item (a run of at most METRIC_ROWS queries within one query block) the partial
histograms are summed (exact integers), the database's distinct codes are counted in passes of
a few code parts, each part is merged from its pieces and searched for M_k (a maximum over
parts), and per-query metrics follow; the report's means come last (:func:`assemble`). The
steps are submitted to an executor: :class:`ThreadExecutor` (``--engine local``, threads in
this process) or ``flows/evaluate.py``'s Dask executor (the steps run on the workers that hold
the data; only per-query values reach the flow). Sums are exact and M_k a maximum, so the
result is bit-identical whichever executor and however the work was shared.
"""

from __future__ import annotations

import functools
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from hashdist.data.dataset import Dataset, open_dataset
from hashdist.engine import precompile
from hashdist.engine.cache import BlockCache
from hashdist.engine.compute import TALLIES, CodePieces, Partials, add_sums, count_codes, run_blocks
from hashdist.engine.plan import Plan, code_passes, for_threads, metric_items, work_shares
from hashdist.engine.spill import spill_directory
from hashdist.kernels.codecounts import ball_lookup_table, max_bucket_within, merge_code_counts
from hashdist.kernels.codeusage import bucket_sizes, code_usage, merge_bucket_sizes
from hashdist.metrics.conventions import conventions_report
from hashdist.metrics.summary import MetricParams, aggregate, concat_per_query, per_query_metrics
from hashdist.served.engine import refuse_flagged, served_entries
from hashdist.served.measures import served_section, served_values


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


def code_part(plan: Plan, groups) -> CodePart:
    """A code part from its pieces: a list of pieces per group of database blocks (each piece a block's distinct
    codes in the part), merged here, once."""
    pieces = [piece for group in groups for piece in group]
    if pieces:
        codes, counts = merge_code_counts(pieces)
    else:
        codes, counts = np.zeros((0, -(-plan.nbits // 64)), dtype=np.uint64), np.zeros(0, dtype=np.int64)
    return CodePart(codes, counts, plan.nbits, plan.max_radius)


def part_max_buckets(plan: Plan, part: CodePart, start: int, stop: int, shells: np.ndarray,
                     ds: Dataset | None = None) -> np.ndarray:
    """M_k of queries [start, stop) within one code part; the maximum over parts is M_k."""
    return part.max_buckets((ds or open_dataset(plan.url, plan.task)).codes("queries", start, stop), shells)


def item_metrics(plan: Plan, params: MetricParams, sums: dict[str, np.ndarray], M: np.ndarray, served=(),
                 ds: Dataset | None = None) -> dict[str, np.ndarray]:
    """Every per-query value of one metric item from its summed partial results and M_k; and of each served run
    (``served``: its rows for these queries, hashdist.served.engine), its entries recomputed here, beside the
    exhaustive histogram, with the entries it flags (``served/NAME/flagged/...``)."""
    per_query = per_query_metrics(sums["H"], M, params, sums.get("H_hamming"))
    per_query.update({key: value for key, value in sums.items() if key.startswith("hashtable_")})
    for run in served:
        entries, flagged = served_entries(ds or open_dataset(plan.url, plan.task), plan, run)
        per_query.update({f"served/{run.name}/flagged/{key}": value for key, value in flagged.items()})
        per_query.update(served_values(sums["H"], entries, params))
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
    served: dict = field(default_factory=dict)  # report["served"]: a section per served run (hashdist.served)


def assemble(plan: Plan, params: MetricParams, item_values, part_sizes, bit_ones, tallies: dict,
             served=()) -> RunResult:
    """The RunResult from every metric item's per-query values (in plan order), each code part's bucket sizes,
    the per-bit set counts and the blocks' tallies: the report's means, the code usage and the block counts; and
    a section per served run (``served``: the runs, hashdist.served.engine.ServedRun)."""
    per_query = concat_per_query(list(item_values))
    refuse_flagged(per_query, served)
    metrics, queries = aggregate(per_query, params)
    exhaustive_conventions = conventions_report(per_query, params.conventions, params.ks) if served else {}
    sections = {e.name: served_section(per_query, e, params, metrics, exhaustive_conventions) for e in served}
    sizes = merge_bucket_sizes(part_sizes)
    usage = code_usage(sizes, bit_ones, int((sizes[:, 0] * sizes[:, 1]).sum()), plan.nbits)
    # distinct (code, label) rows per database row over the blocks that recorded it (exact where collapsed,
    # else hashdist.kernels.collapse's estimate); None when every block came from a cache that predates it
    fraction = tallies["distinct_rows"] / tallies["rows"] if tallies["rows"] else None
    blocks = {"total": len(plan.histogram_blocks), "computed": tallies["computed"], "cached": tallies["cached"],
              "collapsed": tallies["collapsed"], "distinct_fraction": fraction,
              "computed_pairs": tallies["computed_pairs"]}
    return RunResult(metrics, queries, per_query, sizes, usage, blocks, served=sections)


def pieces_of(counted: CodePieces, part: int) -> list:
    """A group's pieces of one code part (none when the group had no code in it)."""
    return counted.pieces.get(part, [])


def bit_ones_of(counted: CodePieces):
    return counted.bit_ones


def part_bucket_sizes(part: CodePart) -> np.ndarray:
    return bucket_sizes(part.counts)


def tree(executor, combine, handles: list):
    """``combine`` applied pairwise, level by level, down to one handle (a balanced reduction tree)."""
    while len(handles) > 1:
        handles = [executor.submit(combine, *handles[i : i + 2]) if i + 1 < len(handles) else handles[i]
                   for i in range(0, len(handles), 2)]
    return handles[0]


def reduce_blocks(executor, plan: Plan, params: MetricParams, item_parts: list[list], tallies: list, count_pass,
                  ds: Dataset | None = None, served=(), on_metrics=None) -> RunResult:
    """The RunResult from each metric item's partial sums (``item_parts[i]``: handles of dicts of arrays) and the
    shares' tallies, one pass of code parts at a time. ``count_pass(parts)`` gives the handles of one pass's
    CodePieces (one per group of database blocks), and keeps no reference to them. ``executor``:
    ``submit(function, *args)`` returning a handle (arguments may be handles, or lists of them),
    ``wait(handles)`` and ``gather(nested handles)``. ``plan`` comes from
    :func:`hashdist.engine.plan.for_threads`. ``served``: the served runs (hashdist.served.engine.ServedRun), each
    metric item's rows going with its step. Records reduce_s (sums, code parts, M_k) and metrics_s;
    ``on_metrics()``, if given, is called as the metrics step starts (a flow logs its phases).
    """
    t0 = time.perf_counter()
    items = metric_items(plan)
    sums = [tree(executor, add_sums, parts) for parts in item_parts]
    shells = [executor.submit(query_shells, plan, s) for s in sums]
    found, sizes, bit_ones = [[] for _ in items], [], []
    for parts in code_passes(plan):
        counted = count_pass(parts)
        if parts.start == 0:
            bit_ones = [executor.submit(bit_ones_of, c) for c in counted]
        for p in parts:
            part = executor.submit(code_part, plan, [executor.submit(pieces_of, c, p) for c in counted])
            for i, (_, start, stop) in enumerate(items):
                found[i].append(executor.submit(part_max_buckets, plan, part, start, stop, shells[i], ds))
            sizes.append(executor.submit(part_bucket_sizes, part))
        counted = part = None  # held by the steps alone: a part's pieces go once it is merged, a part once searched
        executor.wait([f for fs in found for f in fs[-len(parts):]] + sizes[-len(parts):])  # this pass is done
    M = [tree(executor, np.maximum, fs) for fs in found]
    t1 = time.perf_counter()
    if on_metrics is not None:
        on_metrics()
    precompile.join()  # a first run: the measures compile on two cores
    values = [executor.submit(item_metrics, plan, params, s, m, [run.rows(start, stop) for run in served], ds)
              for s, m, (_, start, stop) in zip(sums, M, items, strict=True)]
    values, sizes, bit_ones, tallies = executor.gather([values, sizes, bit_ones, tallies])
    totals = {key: sum(t[key] for t in tallies) for key in TALLIES}
    result = assemble(plan, params, values, sizes, sum(bit_ones), totals, served)
    result.timing = {"reduce_s": t1 - t0, "metrics_s": time.perf_counter() - t1}
    return result


def _resolved(value):
    """A handle's value; a list's handles resolved (one level, as Dask resolves futures in a list argument)."""
    if isinstance(value, Future):
        return value.result()
    if isinstance(value, list):
        return [_resolved(v) for v in value]
    return value


class ThreadExecutor:
    """The reduction's executor on a thread pool in this process (the kernels release the GIL). A step waits for
    the steps it takes as arguments; those were submitted before it and the pool runs steps first in, first out,
    so they are running or done: no step waits on one that cannot start."""

    def __init__(self, pool: ThreadPoolExecutor):
        self.pool = pool

    def submit(self, function, *args) -> Future:
        return self.pool.submit(lambda: function(*(_resolved(a) for a in args)))

    def wait(self, handles) -> None:
        for handle in handles:
            handle.result()

    def gather(self, nested):
        return [self.gather(v) for v in nested] if isinstance(nested, list) else _resolved(nested)


def run_local(plan: Plan, params: MetricParams, cache: BlockCache, *, threads: int, progress=None,
              served=()) -> RunResult:
    """Run every block of the plan with ``threads`` threads in this process; returns a RunResult.

    ``progress(block, cached)`` is called after each histogram block; ``served``: the served runs.
    """
    t0 = time.perf_counter()
    precompile.start()
    plan = for_threads(plan, threads)
    with ThreadPoolExecutor(threads) as pool:
        partials = functools.reduce(
            Partials.merge, pool.map(lambda run: run_blocks(plan, run, cache, progress), work_shares(plan, threads)),
            Partials())
        t1 = time.perf_counter()
        result = reduce_partials(ThreadExecutor(pool), plan, params, partials, served)
    result.timing = {"compute_s": t1 - t0, **result.timing}
    return result


def reduce_partials(executor, plan: Plan, params: MetricParams, partials: Partials, served=()) -> RunResult:
    """:func:`reduce_blocks` over one process's merged Partials, the code counted per database block, the later
    passes' rows set aside in a spill directory by the first (:mod:`hashdist.engine.spill`)."""
    ds = open_dataset(plan.url, plan.task)
    item_parts = [[item_sums(partials.sums[q0], q0, start, stop)] for q0, start, stop in metric_items(plan)]
    with spill_directory(plan) as spill:

        def count_pass(parts):
            return [executor.submit(count_codes, plan, [block], parts, ds, spill) for block in plan.count_blocks]

        return reduce_blocks(executor, plan, params, item_parts, [partials.tallies], count_pass, ds, served)
