"""The main job: a Prefect 3 flow that evaluates a dataset on a Dask cluster.

Thin orchestration over ``hashdist.engine.run``. The plan's blocks are the unit of
caching; Prefect tasks take runs of them, because each Prefect task run costs about
0.1 s of CPU (submission in the flow process, context and API clients on the
worker): one histogram task per cluster thread (more for very large runs), each
reading its own Zarr rows on the worker and returning partial histograms summed
per query block (``hashdist.engine.Partials``). Each histogram share also takes
a group of the first pass of code counts along, while there are groups (one per
cluster thread), in the same task.

Those results stay on the workers, and the reduction runs there too, as plain Dask
tasks over the same library functions ``--engine local`` uses: each finished share
is taken apart on its worker (sums per metric item, tallies), each metric item's
partial histograms are summed in a tree, and per-query metrics are computed beside
the sums. The database's distinct codes are counted in passes of a few code parts
(a group of database blocks per cluster thread and pass: in the first pass with a
share, in later ones as a ``code-counts`` task): each part is merged from its
pieces on one worker and searched for M_k there, and a pass starts when the one
before has finished, so no process holds every distinct code and memory does not
grow with the database. Only per-query values (O(Q)) and small tallies reach the
flow process, which finishes the report with ``hashdist.engine.assemble``. Sums are
exact integers and M_k a maximum, so the result is bit-identical to
``--engine local`` whatever the cluster's shape. Block results are cached by content
in a ``BlockCache`` directory (shared storage on a cluster).

Run it through ``hashdist evaluate`` or :func:`run_evaluation`; deploy the flow
``evaluate`` itself (see deploy/prefect.yaml).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from distributed import as_completed, wait
from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.context import FlowRunContext
from prefect.states import State

from flows.history import drop_state, watch
from flows.runtime import (
    TASK_OPTIONS,
    api_for_workers,
    cache_parameter,
    cluster_threads,
    task_runner,
    workers_in_this_process,
)
from hashdist.api import Evaluation, build_report, prepare
from hashdist.defaults import DEFAULT_BETA, DEFAULT_DISTANCE_BINS, DEFAULT_RADII
from hashdist.engine.cache import resolve_cache
from hashdist.engine.run import (
    TALLIES,
    CodePieces,
    RunResult,
    add_sums,
    assemble,
    code_part,
    code_passes,
    count_codes,
    count_shares,
    for_threads,
    item_metrics,
    item_sums,
    metric_items,
    part_max_buckets,
    precompile,
    query_shells,
    run_blocks,
    work_shares,
)
from hashdist.kernels.codeusage import bucket_sizes
from hashdist.metrics.registry import headline_rows
from hashdist.progress import advance, progress_bar

# pairs one histogram task may take (a few seconds of one core): the floor on task count for huge runs
PAIRS_PER_TASK = 2e10


@task(name="histogram-blocks", **TASK_OPTIONS)
def histogram_task(plan, blocks, cache_dir):
    """One share of the plan: its blocks' partial results summed per query block."""
    return run_blocks(plan, blocks, resolve_cache(cache_dir))


@task(name="code-counts", **TASK_OPTIONS)
def count_task(plan, blocks, parts):
    """The distinct codes of some database blocks in one pass's code parts, a piece per part."""
    return count_codes(plan, blocks, parts)


@dataclass
class ShareAndCounts:
    """A histogram share's Partials fields (the reduction picks sums and tallies from it as from a Partials) and
    a group's code counts."""

    sums: dict
    tallies: dict
    counts: CodePieces


@task(name="histogram-blocks-and-code-counts", **TASK_OPTIONS)
def share_and_counts_task(plan, blocks, count_blocks, parts, cache_dir):
    """A histogram share and a group of code counts in one task: a Prefect task run costs the flow's process
    about 0.1 s of CPU (0.04 s of it submitting), and the counts, a fraction of the histograms' work, would wait
    for a free thread anyway."""
    share = run_blocks(plan, blocks, resolve_cache(cache_dir))
    counts = count_codes(plan, count_blocks, parts)
    return ShareAndCounts(share.sums, share.tallies, counts)


def _publish_artifacts(report: dict) -> None:
    rows = [{"metric": label, **values} for label, values in headline_rows(report["metrics"])]
    create_table_artifact(table=rows, key="hashdist-metrics",
                          description=f"hashdist metrics for {report['dataset']['path']}")
    html = (report.get("outputs") or {}).get("report_html")
    if html:
        create_markdown_artifact(markdown=f"hashdist report: [{html}](file://{html})", key="hashdist-report",
                                 description="HTML report with plots")


# -- the reduction, as Dask tasks on the workers that hold the shares ----------


def _value(state):
    """A task's result: Dask holds a Prefect task run's final State (raises the task's error)."""
    return state.result() if isinstance(state, State) else state


def _failure(state) -> BaseException | None:
    """The error a task run ended with (after its retries), or None when it completed."""
    if isinstance(state, State) and not state.is_completed():
        try:
            state.result()
        except BaseException as exc:  # noqa: BLE001 - handed to the flow, which raises it
            return exc
    return None


def _raise_failures(client, states) -> None:
    """A failed task fails the run with its own error (bad input: one line), before anything depends on it."""
    failure = next((exc for exc in client.gather([client.submit(_failure, s) for s in states]) if exc), None)
    if failure is not None:
        raise failure


def _share_sums(state, q0: int, start: int, stop: int):
    return item_sums(_value(state).sums[q0], q0, start, stop)


def _share_tallies(state):
    return _value(state).tallies


def _piece(state, part: int):
    pieces = _value(state).pieces.get(part)
    return pieces[0] if pieces else None


def _bit_ones(state):
    return _value(state).bit_ones


def _share_counts(state) -> CodePieces:
    """The code counts a completed share-and-counts task carries, apart from its histograms."""
    return _value(state).counts


def _part_bucket_sizes(part):
    return bucket_sizes(part.counts)


def _tree(client, combine, futures):
    """``combine`` applied pairwise, level by level, down to one future (a balanced reduction tree)."""
    while len(futures) > 1:
        futures = [client.submit(combine, *futures[i : i + 2]) if i + 1 < len(futures) else futures[i]
                   for i in range(0, len(futures), 2)]
    return futures[0]


@dataclass
class SharePicks:
    """A finished share's result taken apart on its worker, so each piece can be kept, moved or spilled on its
    own: its partial sums per metric item it touches, and its tallies (Dask futures)."""

    sums: dict[int, object]
    tallies: object


def pick_share(client, items, blocks, state) -> SharePicks:
    """A finished histogram task's result taken apart (its error raised here if it failed)."""
    _raise_failures(client, [state])
    touched = {block.q0 for block in blocks}
    return SharePicks(sums={i: client.submit(_share_sums, state, q0, start, stop)
                            for i, (q0, start, stop) in enumerate(items) if q0 in touched},
                      tallies=client.submit(_share_tallies, state))


def submit_counts(plan, parts: range, threads: int) -> list:
    """One pass of code counting: a ``code-counts`` task per cluster thread (Dask futures of their states)."""
    return [count_task.submit(plan, group, parts).wrapped_future for group in count_shares(plan, threads)]


def reduce_on_cluster(client, plan, params, items, picks: list[SharePicks], threads: int, first_counts: list
                      ) -> RunResult:
    """The RunResult from the shares' picks, reduced on the workers, and the code counts, one pass of code
    parts at a time (``first_counts``: the first pass, submitted with the histogram tasks); only per-query
    values and tallies are gathered here. The plan and parameters (a few KB) travel inside the tasks: scattered
    data cannot be recomputed, and a broadcast scatter waits forever for a worker that died meanwhile."""
    t0 = time.perf_counter()
    sums = [_tree(client, add_sums, [share.sums[i] for share in picks if i in share.sums]) for i in range(len(items))]
    shells = [client.submit(query_shells, plan, s) for s in sums]
    found, sizes, bit_ones = [[] for _ in items], [], []
    for parts in code_passes(plan):
        counted = first_counts if parts.start == 0 else submit_counts(plan, parts, threads)
        _raise_failures(client, counted)
        if parts.start == 0:
            bit_ones = [client.submit(_bit_ones, state) for state in counted]
        for p in parts:
            part = client.submit(code_part, plan, [client.submit(_piece, state, p) for state in counted])
            for i, (_, start, stop) in enumerate(items):
                found[i].append(client.submit(part_max_buckets, plan, part, start, stop, shells[i]))
            sizes.append(client.submit(_part_bucket_sizes, part))
        wait([f for fs in found for f in fs[-len(parts):]] + sizes[-len(parts):])  # this pass's parts are done
    M = [_tree(client, np.maximum, fs) for fs in found]
    t1 = time.perf_counter()
    precompile.join()  # a first run: the measures compile on two cores (for the cluster's threads in this process)
    values = [client.submit(item_metrics, params, s, m) for s, m in zip(sums, M, strict=True)]
    values, sizes, bit_ones, tallies = client.gather([values, sizes, bit_ones, [share.tallies for share in picks]])
    totals = {key: sum(t[key] for t in tallies) for key in TALLIES}
    result = assemble(plan, params, values, sizes, sum(bit_ones), totals)
    result.timing = {"reduce_s": t1 - t0, "metrics_s": time.perf_counter() - t1}
    return result


@flow(name="evaluate", persist_result=False, log_prints=True, task_runner=task_runner())
def evaluate(
    dataset: str,
    out: str | None = None,
    k: list[int] | None = None,
    radius: list[int | float] = DEFAULT_RADII,
    beta: float = DEFAULT_BETA,
    empty_queries: str = "exclude",
    relevance: str | None = None,
    max_grade: int | None = None,
    query_block_rows: int | None = None,
    db_block_rows: int | None = None,
    hashtable: list[str] = (),
    conventions: list[str] = (),
    protocol: str | None = None,
    distance: str | None = None,
    bit_weights: str | None = None,
    distance_bins: int = DEFAULT_DISTANCE_BINS,
    code_parts: int | None = None,
    cache: str | bool | None = None,
    overwrite: bool = False,
    html: bool = True,
    progress: bool = False,
    started_at: float | None = None,
    history: str | None = None,
) -> Evaluation:
    """Evaluate DATASET; with ``out``, write report.json, per_query.zarr and report.html there."""
    t_start = time.time()
    ds, params, plan, parameters = prepare(
        dataset, k=k, radius=radius, beta=beta, empty_queries=empty_queries, relevance=relevance,
        max_grade=max_grade, query_block_rows=query_block_rows, db_block_rows=db_block_rows, hashtable=hashtable,
        conventions=conventions, protocol=protocol, distance=distance, bit_weights=bit_weights,
        distance_bins=distance_bins, code_parts=code_parts,
    )
    cache_arg = resolve_cache(cache).argument

    threads = cluster_threads()
    if workers_in_this_process():  # a first run's metric functions compile in a second process meanwhile
        precompile.start()
    plan = for_threads(plan, threads)
    shares = work_shares(plan, max(threads, math.ceil(plan.pairs / PAIRS_PER_TASK)))
    groups, first_pass = count_shares(plan, threads), code_passes(plan)[0]
    # a task per share, taking a group of the first pass's code counts along while there are groups
    paired = min(len(shares), len(groups))
    futures = {(share_and_counts_task.submit(plan, share, groups[i], first_pass, cache_arg) if i < paired
                else histogram_task.submit(plan, share, cache_arg)).wrapped_future: i for i, share in enumerate(shares)}
    later_groups = [count_task.submit(plan, group, first_pass).wrapped_future for group in groups[paired:]]
    items, picks, pairs_done, share_counts = metric_items(plan), [], 0, {}
    client = FlowRunContext.get().task_runner.client
    with client.as_current(), progress_bar(len(plan.histogram_blocks), progress) as bar:
        for state in as_completed(list(futures)):  # waits without fetching: the results stay on the workers
            i = futures.pop(state)
            picks.append(pick_share(client, items, shares[i], state))  # its result is released once taken apart
            if i < paired:  # its code counts apart too, now that it is known to have completed
                share_counts[i] = client.submit(_share_counts, state)
            pairs_done += sum(block.pairs for block in shares[i])
            advance(bar, len(shares[i]), pairs_done, t_start)
        first_counts = [share_counts[i] for i in range(paired)] + later_groups
        t_compute = time.time()
        result = reduce_on_cluster(client, plan, params, items, picks, threads, first_counts)
    started_at = started_at or t_start
    timing = {"startup_s": t_start - started_at, "compute_s": t_compute - t_start, **result.timing, "write_s": 0.0,
              "wall_s": time.time() - started_at}
    engine = {"kind": "prefect-dask", "flow": "evaluate", "threads": threads, "code_parts": plan.code_parts}
    report = build_report(ds, plan, parameters, result, timing, engine)
    evaluation = Evaluation(report, result.per_query, result.bucket_sizes)
    if out is not None:
        evaluation.write(out, overwrite=overwrite, html=html, started_at=started_at)
    _publish_artifacts(report)
    if history is not None:  # append to the history store, compare with the previous run (flows/history.py)
        evaluation.verdict = verdict = watch(evaluation, history)
        if verdict["flagged"]:  # Failed, message "mAP dropped significantly: ..."; the outputs stay written
            return drop_state(verdict, evaluation)
    return evaluation


def run_evaluation(dataset, *, out=None, overwrite=False, html=True, cache=None, address=None, cluster_class=None,
                   cluster_kwargs=None, workers=None, threads=None, progress=False, history=None,
                   **options) -> Evaluation:
    """Validate the inputs here (bad input fails before any cluster starts), then run the flow."""
    started_at = time.time()
    prepare(dataset, **options)
    if history is not None:
        from hashdist.compare.history import check_history_dir

        check_history_dir(history)  # a path that is not a history store fails here, before the run
    cache = cache_parameter(cache)
    runner = task_runner(address, cluster_class, cluster_kwargs, workers, threads)
    with api_for_workers(address, cluster_class, cluster_kwargs):
        return evaluate.with_options(task_runner=runner)(
            dataset=str(dataset), out=None if out is None else str(out), overwrite=overwrite, html=html, cache=cache,
            progress=progress, started_at=started_at, history=None if history is None else str(history), **options,
        )
