"""The main job: a Prefect 3 flow that evaluates a dataset on a Dask cluster.

Thin orchestration over ``hashdist.engine``. The plan's blocks are the unit of
caching; Prefect tasks take runs of them, because each Prefect task run costs about
0.1 s of CPU (submission in the flow process, context and API clients on the
worker): one histogram task per cluster thread (more for very large runs), each
reading its own Zarr rows on the worker and returning only partial histograms
summed per query block, plus the code counts of a share of the database blocks;
then one metrics task per cluster thread. The flow merges the tasks' partial
results (``hashdist.engine.Partials``, exact integer sums) as they arrive and
finishes them with ``hashdist.engine.finish``, exactly as ``--engine local`` does.
Block results are cached by content in a ``BlockCache`` directory (shared storage
on a cluster).

Run it through ``hashdist evaluate`` or :func:`run_evaluation`; deploy the flow
``evaluate`` itself (see deploy/prefect.yaml).
"""

from __future__ import annotations

import math
import time

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.futures import as_completed

from flows.runtime import TASK_OPTIONS, cluster_threads, progress_bar, task_runner
from hashdist.api import Evaluation, build_report, prepare
from hashdist.cache import resolve_cache
from hashdist.defaults import DEFAULT_BETA, DEFAULT_DISTANCE_BINS, DEFAULT_RADII
from hashdist.engine import Partials, finish, query_block_metrics, run_blocks, work_shares
from hashdist.metrics.registry import headline_rows

# pairs one histogram task may take (a few seconds of one core): the floor on task count for huge runs
PAIRS_PER_TASK = 2e10


@task(name="histogram-blocks", **TASK_OPTIONS)
def histogram_task(plan, blocks, count_blocks, cache_dir) -> Partials:
    """One share of the plan: its blocks' partial results summed per query block, and its code counts."""
    return run_blocks(plan, blocks, count_blocks, resolve_cache(cache_dir))


@task(name="query-block-metrics", **TASK_OPTIONS)
def metrics_task(plan, params, items):
    """Per-query metrics of several query blocks, each ``(q0, q1, summed partial results, code table)``."""
    return [query_block_metrics(plan, *item, params) for item in items]


def _publish_artifacts(report: dict) -> None:
    rows = [{"metric": label, **values} for label, values in headline_rows(report["metrics"])]
    create_table_artifact(table=rows, key="hashdist-metrics",
                          description=f"hashdist metrics for {report['dataset']['path']}")
    html = (report.get("outputs") or {}).get("report_html")
    if html:
        create_markdown_artifact(markdown=f"hashdist report: [{html}](file://{html})", key="hashdist-report",
                                 description="HTML report with plots")


def _metrics_on_cluster(plan, params, threads: int):
    """``map_query_blocks`` for :func:`hashdist.engine.finish`: one metrics task per cluster thread."""

    def map_query_blocks(items):
        groups = [items[i::threads] for i in range(min(threads, len(items)))]
        futures = [metrics_task.submit(plan, params, group) for group in groups]
        done = {item[0]: part for group, fut in zip(groups, futures, strict=True)
                for item, part in zip(group, fut.result(), strict=True)}
        return [done[item[0]] for item in items]

    return map_query_blocks


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
    cache: str | bool | None = None,
    overwrite: bool = False,
    html: bool = True,
    progress: bool = False,
    started_at: float | None = None,
) -> Evaluation:
    """Evaluate DATASET; with ``out``, write report.json, per_query.zarr and report.html there."""
    t_start = time.time()
    ds, params, plan, parameters = prepare(
        dataset, k=k, radius=radius, beta=beta, empty_queries=empty_queries, relevance=relevance,
        max_grade=max_grade, query_block_rows=query_block_rows, db_block_rows=db_block_rows, hashtable=hashtable,
        conventions=conventions, protocol=protocol, distance=distance, bit_weights=bit_weights,
        distance_bins=distance_bins,
    )
    cache_dir = resolve_cache(cache).directory
    cache_arg = False if cache_dir is None else str(cache_dir)

    threads = cluster_threads()
    shares = work_shares(plan, max(threads, math.ceil(plan.pairs / PAIRS_PER_TASK)))
    futures = {histogram_task.submit(plan, blocks, counts, cache_arg): blocks for blocks, counts in shares}
    partials, pairs_done = Partials(), 0
    with progress_bar(len(plan.histogram_blocks), progress) as bar:
        for fut in as_completed(list(futures)):
            blocks = futures.pop(fut)
            partials.merge(fut.result())
            pairs_done += sum(block.pairs for block in blocks)
            bar.update(len(blocks))
            bar.set_postfix_str(f"{pairs_done / max(time.time() - t_start, 1e-9):.3g} pairs/s")
    t_compute = time.time()
    result = finish(plan, params, partials, _metrics_on_cluster(plan, params, threads))
    started_at = started_at or t_start
    timing = {"startup_s": t_start - started_at, "compute_s": t_compute - t_start, **result.timing, "write_s": 0.0,
              "wall_s": time.time() - started_at}
    engine = {"kind": "prefect-dask", "flow": "evaluate", "threads": threads}
    report = build_report(ds, plan, parameters, result, timing, engine)
    evaluation = Evaluation(report, result.per_query, result.code_counts)
    if out is not None:
        evaluation.write(out, overwrite=overwrite, html=html, started_at=started_at)
    _publish_artifacts(report)
    return evaluation


def run_evaluation(dataset, *, out=None, overwrite=False, html=True, cache=None, address=None, cluster_class=None,
                   cluster_kwargs=None, workers=None, threads=None, progress=False, **options) -> Evaluation:
    """Validate the inputs here (bad input fails before any cluster starts), then run the flow."""
    started_at = time.time()
    prepare(dataset, **options)
    cache = cache if cache is None or cache is False else str(cache)
    runner = task_runner(address, cluster_class, cluster_kwargs, workers, threads)
    return evaluate.with_options(task_runner=runner)(
        dataset=str(dataset), out=None if out is None else str(out), overwrite=overwrite, html=html, cache=cache,
        progress=progress, started_at=started_at, **options,
    )
