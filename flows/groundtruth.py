"""A Prefect 3 flow that computes feature ground truth (``hashdist groundtruth``) on a Dask cluster.

Thin orchestration over ``hashdist.engine.groundtruth``: each sweep is one task per (query block,
database block), each reading its own feature rows on the worker; results are merged in the
flow as they arrive, and the CSR is written into the dataset at the end. Block results are
cached by content in a ``BlockCache`` directory, as for ``evaluate``.
"""

from __future__ import annotations

import time

from prefect import flow, task
from prefect.context import FlowRunContext
from prefect.futures import as_completed

from flows.observe import ProgressLog, failures_logged, run_log
from flows.runtime import TASK_OPTIONS, api_for_workers, cache_parameter, handed_over, runner_where, taken, task_runner
from hashdist.engine import groundtruth as gt
from hashdist.engine.cache import resolve_cache
from hashdist.options import ExecutionOptions, GroundTruthOptions, split_keywords
from hashdist.progress import Phases, progress_bar


@task(name="groundtruth-block", **TASK_OPTIONS)
def block_task(sweep, block, cache_dir):
    return gt.cached_block(sweep, block, resolve_cache(cache_dir))


@flow(name="groundtruth", persist_result=False, log_prints=True, task_runner=task_runner())
def groundtruth(
    dataset: str,
    options: GroundTruthOptions,
    cache: str | bool | None = None,
    progress: bool = False,
    prepared: str | None = None,
) -> dict:
    """Compute and store DATASET's ground truth; returns the ``groundtruth`` record plus blocks and timing.
    ``prepared``: the key of the request :func:`run_groundtruth` checked in this process. The run's story goes to
    its Prefect logs (flows.observe)."""
    log = run_log()
    with failures_logged(log, "groundtruth"):
        return _groundtruth(log, dataset, options, cache, progress, prepared)


def _groundtruth(log, dataset, options, cache, progress, prepared) -> dict:
    t_start = time.time()
    ds, params = taken(prepared) or options.resolve(dataset)
    log.info(f"hashdist groundtruth: {params.method} over {ds.n_queries:,} queries x {ds.n_database:,} items of "
             f"{ds.url}; blocks of up to {params.query_block_rows:,} x {params.db_block_rows:,}; "
             f"{runner_where(FlowRunContext.get().task_runner)}")
    cache_arg = resolve_cache(cache).argument
    blocks = {"computed": 0, "cached": 0}
    phases = Phases(log, words={"writing": "writing the ground truth"})
    with phases, progress_bar(0, progress) as bar, ProgressLog(log, bar):

        def run_sweep(sweep, merger):
            phases.start(f"{sweep.kind} sweep ({len(sweep.blocks):,} blocks)")
            bar.total += len(sweep.blocks)
            bar.refresh()
            futures = {block_task.submit(sweep, b, cache_arg): b for b in sweep.blocks}
            for fut in as_completed(list(futures)):
                result, was_cached = fut.result()
                merger.add(futures.pop(fut), result)
                blocks["cached" if was_cached else "computed"] += 1
                bar.update(1)

        result = gt.compute(ds, params, run_sweep)
        t_compute = time.time()
        phases.start("writing")
        stored = gt.write(ds, result)
    timing = {"compute_s": t_compute - t_start, "write_s": time.time() - t_compute}
    record = stored.attrs()["groundtruth"]
    rule = f"epsilon {record['epsilon']:.6g}" if params.method == "epsilon_ball" else f"k {record['k']}"
    log.info(f"{params.method}: {rule}; {record['relevant_pairs']:,} relevant pairs written to {ds.url} "
             f"(queries/relevant); blocks: {blocks['computed']} computed, {blocks['cached']} cached")
    return {**record, "blocks": blocks, "timing": timing}


def run_groundtruth(dataset, *, options: GroundTruthOptions | None = None, execution: ExecutionOptions | None = None,
                    prepared=None, **keywords) -> dict:
    """Check the inputs here (bad input fails before any cluster starts), then run the flow on the cluster that
    ``execution`` names. ``options`` / ``execution``: the objects, or their fields as keywords (method=,
    percent=, threads=, cache=, ...); ``prepared``: the request the caller (the CLI) checked, not checked again."""
    groundtruth_keywords, execution_keywords = split_keywords("run_groundtruth", keywords, GroundTruthOptions,
                                                              ExecutionOptions)
    options = options or GroundTruthOptions(**groundtruth_keywords)
    execution = execution or ExecutionOptions(**execution_keywords)
    with handed_over(prepared or options.resolve(dataset)) as key, \
            api_for_workers(execution.address, execution.cluster_class, execution.cluster_kwargs):
        return groundtruth.with_options(task_runner=task_runner(**execution.cluster))(
            dataset=str(dataset), options=options, cache=cache_parameter(execution.cache),
            progress=execution.progress, prepared=key)
