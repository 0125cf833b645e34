"""The main job: a Prefect 3 flow that evaluates a dataset on a Dask cluster.

Thin orchestration over ``hashdist.engine``. The plan's blocks are the unit of
caching; Prefect tasks take runs of them, because each Prefect task run costs about
0.1 s of CPU (submission in the flow process, context and API clients on the
worker): one histogram task per cluster thread (more for very large runs), each
reading its own Zarr rows on the worker and returning only partial histograms
summed per query block, plus the code counts of a share of the database blocks;
then one metrics task per cluster thread. The flow sums the partial histograms
(exact integers) as they arrive. Block results are cached by content in a
``BlockCache`` directory (shared storage on a cluster).

Run it through ``hashdist evaluate`` or :func:`run_evaluation`; deploy the flow
``evaluate`` itself (see deploy/prefect.yaml).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext
from prefect.futures import as_completed
from prefect_dask import DaskTaskRunner

from hashdist.api import Evaluation, build_report, prepare, resolve_cache
from hashdist.engine import (
    add_partials,
    cached_code_counts,
    code_table,
    finish,
    query_block_metrics,
    split_by_pairs,
    sum_histogram_blocks,
)

# Results travel through Dask, never through Prefect's result storage: no caching,
# no persistence. Retries cover transient worker faults.
_TASK_OPTIONS = dict(cache_policy=NO_CACHE, persist_result=False, retries=2, retry_delay_seconds=1)


# pairs one histogram task may take (a few seconds of one core): the floor on task count for huge runs
PAIRS_PER_TASK = 2e10


@task(name="histogram-blocks", **_TASK_OPTIONS)
def histogram_task(plan, blocks, count_blocks, cache_dir):
    """(partial histograms summed per query block, blocks computed, code counts of ``count_blocks``)."""
    cache = resolve_cache(cache_dir)
    sums, computed = sum_histogram_blocks(plan, blocks, cache)
    return sums, computed, [cached_code_counts(plan, block, cache) for block in count_blocks]


@task(name="query-block-metrics", **_TASK_OPTIONS)
def metrics_task(plan, query_blocks, partials, table, params):
    return [query_block_metrics(plan, q0, q1, partials[q0], table, params) for q0, q1 in query_blocks]


def _cluster_threads() -> int:
    """Worker threads of the flow's Dask cluster (at least 1)."""
    client = FlowRunContext.get().task_runner.client
    return max(1, sum(client.nthreads().values()))


def _progress_bar(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="block", file=sys.stderr, disable=not enabled, dynamic_ncols=True)


def _publish_artifacts(report: dict) -> None:
    m = report["metrics"]
    rows = [{"metric": "mAP", **m["map"]}]
    for k in m["precision_at_k"]:
        rows.append({"metric": f"mAP@{k} (retrieved)", **m["map_at_k"][k]["retrieved"]})
        rows.append({"metric": f"P@{k}", **m["precision_at_k"][k]})
        rows.append({"metric": f"NDCG@{k}", **m["ndcg_at_k"][k]})
    rows.append({"metric": "AUC", "expected": m["auc"], "best": m["auc"], "worst": m["auc"]})
    for r in m["mlgap_at_radius"]:
        v = m["mlgap_at_radius"][r]
        rows.append({"metric": f"mLGAP@{r}", "expected": v, "best": v, "worst": v})
    create_table_artifact(table=rows, key="hashdist-metrics", description=f"hashdist metrics for {report['dataset']['path']}")
    html = (report.get("outputs") or {}).get("report_html")
    if html:
        create_markdown_artifact(markdown=f"hashdist report: [{html}](file://{html})", key="hashdist-report",
                                 description="HTML report with plots")


def task_runner(address=None, cluster_class=None, cluster_kwargs=None, workers=None, threads=None) -> DaskTaskRunner:
    """An existing cluster (address), a per-run cluster (cluster_class), or the embedded LocalCluster of threads.

    Unset arguments fall back to $HASHDIST_DASK_ADDRESS, $HASHDIST_CLUSTER_CLASS and
    $HASHDIST_CLUSTER_KWARGS (JSON): that is how a deployed, scheduled run finds its cluster.
    """
    address = address or os.environ.get("HASHDIST_DASK_ADDRESS")
    cluster_class = cluster_class or os.environ.get("HASHDIST_CLUSTER_CLASS")
    if cluster_kwargs is None and os.environ.get("HASHDIST_CLUSTER_KWARGS"):
        cluster_kwargs = json.loads(os.environ["HASHDIST_CLUSTER_KWARGS"])
    if address:
        return DaskTaskRunner(address=address)
    if cluster_class:
        return DaskTaskRunner(cluster_class=cluster_class, cluster_kwargs=cluster_kwargs or {})
    # threads: the kernels release the GIL, and a thread worker needs no Prefect server of its own
    kwargs = {"n_workers": workers or 1, "threads_per_worker": threads or os.cpu_count() or 1, "processes": False,
              "dashboard_address": None}
    return DaskTaskRunner(cluster_kwargs={**kwargs, **(cluster_kwargs or {})})


@flow(name="evaluate", persist_result=False, log_prints=True, task_runner=task_runner())
def evaluate(
    dataset: str,
    out: str | None = None,
    k: list[int] = (10, 100, 1000),
    radius: list[int] = (0, 1, 2),
    beta: float = 1.0,
    empty_queries: str = "exclude",
    relevance: str | None = None,
    max_grade: int = 8,
    query_block_rows: int | None = None,
    db_block_rows: int | None = None,
    hashtable: list[str] = (),
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
    )
    cache_dir = resolve_cache(cache).directory
    cache_arg = False if cache_dir is None else str(cache_dir)

    threads = _cluster_threads()
    runs = split_by_pairs(plan.histogram_blocks, max(threads, math.ceil(plan.pairs / PAIRS_PER_TASK)))
    count_shares = [plan.count_blocks[i :: len(runs)] for i in range(len(runs))]
    hist_futures = {histogram_task.submit(plan, run, share, cache_arg): run for run, share in zip(runs, count_shares)}
    sums, computed, pairs_done, counts = {}, 0, 0, []
    with _progress_bar(len(plan.histogram_blocks), progress) as bar:
        for fut in as_completed(list(hist_futures)):
            run = hist_futures[fut]
            run_sums, run_computed, run_counts = fut.result()
            counts += run_counts
            for q0, part in run_sums.items():
                sums[q0] = add_partials(sums.get(q0), part)
            computed += run_computed
            pairs_done += sum(block.pairs for block in run)
            bar.update(len(run))
            bar.set_postfix_str(f"{pairs_done / max(time.time() - t_start, 1e-9):.3g} pairs/s")
    cached = len(plan.histogram_blocks) - computed
    t_compute = time.time()
    table = code_table(plan, counts)
    t_reduce = time.time()
    groups = [plan.query_blocks[i::threads] for i in range(min(threads, len(plan.query_blocks)))]
    metric_futures = [
        metrics_task.submit(plan, group, {q0: sums.pop(q0) for q0, _ in group}, table, params) for group in groups
    ]
    parts = {q0: part for group, fut in zip(groups, metric_futures) for (q0, _), part in zip(group, fut.result())}
    result = finish(plan, params, [parts[q0] for q0, _ in plan.query_blocks], table, computed, cached)
    t_metrics = time.time()
    started_at = started_at or t_start
    timing = {
        "startup_s": t_start - started_at,
        "compute_s": t_compute - t_start,
        "reduce_s": t_reduce - t_compute,
        "metrics_s": t_metrics - t_reduce,
        "write_s": 0.0,
        "wall_s": t_metrics - started_at,
    }
    engine = {"kind": "prefect-dask", "flow": "evaluate"}
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
