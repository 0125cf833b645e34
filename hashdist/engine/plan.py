"""The plan of an evaluation: queries x database cut into blocks aligned to the Zarr chunks, each keyed on its rows
and the parameters its result depends on (the content of those rows joins the key as they are read:
hashdist.engine.compute), and how the work is shared (histogram shares, code-count groups, metric items).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from hashdist.data.dataset import Dataset, combine_digests, task_url
from hashdist.defaults import DEFAULT_DB_BLOCK_ROWS, DEFAULT_QUERY_BLOCK_ROWS
from hashdist.engine.blocks import Block, block_rows, row_ranges, split_by_pairs
from hashdist.errors import InputError
from hashdist.kernels import KERNEL_VERSION
from hashdist.kernels.distance import DistanceAxis

MAX_GRADE = 255  # the largest grade the histogram counts uncapped: its grade axis has at most MAX_GRADE + 2 columns
METRIC_ROWS = 1024  # queries per metrics work item: threads share the work evenly, calls stay vectorised
CODES_PER_PART = 2**21  # database items whose distinct codes one code part may hold (32 MiB at B = 64)
PASS_CODES = 2**23  # database items whose distinct codes one pass holds at most, beyond one part per thread


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
    task: str | None = None  # on a dataset with modalities, the task a->b whose codes the blocks read
    engine: str = "numba"  # what counts the histograms: numba kernels, or torch on ``device`` (no result differs)
    device: str | None = None
    max_grade: int | None = None  # the user's cap on grades (--max-grade); None: uncapped

    @property
    def grade_top(self) -> int:
        """The top of the histograms' grade axis, the grade the kernels count at most: the largest grade, or
        under a cap G at most G + 1 (that column counts the pairs the cap lowers, metrics.summary.cap_grades)."""
        return grade_top(self.largest_grade, self.max_grade)

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


def grade_top(largest_grade: int, max_grade: int | None) -> int:
    """The top of the histograms' grade axis: the largest grade, or under a cap G at most G + 1."""
    return largest_grade if max_grade is None else min(largest_grade, max_grade + 1)


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
    max_grade: int | None = None,
) -> Plan:
    """Blocks aligned to chunks, each keyed on its rows and parameters (and the distance's bins).

    ``code_parts``: how many parts the distinct database codes are split into (default: see
    :func:`for_threads`); no result depends on it. The options were checked by their object
    (hashdist.options); the block rows are rounded to whole chunks here.
    """
    relevance = check_relevance(ds, relevance)
    largest_grade = largest_possible_grade(ds, relevance)
    if max_grade is None and largest_grade > MAX_GRADE:
        raise InputError(f"{ds.url}: {relevance} grades up to {largest_grade:,}, above {MAX_GRADE}, the largest "
                         f"grade counted uncapped; pass --max-grade G (G <= {MAX_GRADE}) to count grades above G "
                         "as G")
    qrows = block_rows(query_block_rows, ds.chunk_rows("queries"), DEFAULT_QUERY_BLOCK_ROWS, "--query-block-rows",
                       ds.n_queries)
    drows = block_rows(db_block_rows, ds.chunk_rows("database"), DEFAULT_DB_BLOCK_ROWS, "--db-block-rows",
                       ds.n_database)
    top = grade_top(largest_grade, max_grade)  # what the histograms count: a capped run's differ
    common = (KERNEL_VERSION, ds.nbits, relevance, top, *(f"{bits}x{tables}" for bits, tables in hashtables),
              *(("distance", distance.digest) if distance is not None else ()))
    query_blocks = row_ranges(ds.n_queries, qrows)
    db_blocks = row_ranges(ds.n_database, drows)
    hist = tuple(
        Block(q0, q1, d0, d1, combine_digests(("histogram", *common, q0, q1, d0, d1)))
        for (q0, q1) in query_blocks
        for (d0, d1) in db_blocks
    )
    return Plan(task_url(ds.url), ds.nbits, relevance, largest_grade, max_radius, qrows, drows, tuple(query_blocks),
                hist, tuple(db_blocks), tuple(hashtables), distance, code_parts, task=ds.task, max_grade=max_grade)


def for_threads(plan: Plan, threads: int) -> Plan:
    """The plan's code parts for ``threads`` worker threads: the parts the user chose, else enough that one
    holds the codes of at most CODES_PER_PART items, and at least one per thread. A pass over the database
    codes counts, merges and searches the codes of PASS_CODES items (at least a part per thread): every pass
    but the last holds about as many codes whatever the database's size, so memory does not grow with it."""
    n_items = sum(d1 - d0 for d0, d1 in plan.count_blocks)
    parts = plan.code_parts or max(threads, -(-n_items // CODES_PER_PART))
    return replace(plan, code_parts=parts, parts_per_pass=max(1, threads, PASS_CODES // CODES_PER_PART))


def code_passes(plan: Plan) -> list[range]:
    """The code parts of each pass (plan from :func:`for_threads`)."""
    return [range(p, min(p + plan.parts_per_pass, plan.code_parts)) for p in range(0, plan.code_parts,
                                                                                 plan.parts_per_pass)]



def work_shares(plan: Plan, parts: int) -> list[tuple[Block, ...]]:
    """The histogram blocks cut into at most ``parts`` runs of consecutive blocks with about equal pairs."""
    return split_by_pairs(plan.histogram_blocks, parts)


def count_shares(plan: Plan, parts: int) -> list[tuple[tuple[int, int], ...]]:
    """The database blocks dealt round into at most ``parts`` groups, for code counting."""
    return [group for group in (plan.count_blocks[i::parts] for i in range(parts)) if group]


def metric_items(plan: Plan) -> list[tuple[int, int, int]]:
    """``(q0 of the query block, start, stop)``: the plan's queries in items of at most METRIC_ROWS,
    each within one query block, so threads and workers share the work evenly (per-query values
    do not depend on the grouping)."""
    return [(q0, q0 + a, q0 + b) for q0, q1 in plan.query_blocks for a, b in row_ranges(q1 - q0, METRIC_ROWS)]
