"""A Prefect 3 flow that computes feature ground truth (``hashdist groundtruth``) on a Dask cluster.

Thin orchestration over ``hashdist.engine.groundtruth``: each sweep is one task per (query block,
database block), each reading its own feature rows on the worker; results are merged in the
flow as they arrive, and the CSR is written into the dataset at the end. Block results are
cached by content in a ``BlockCache`` directory, as for ``evaluate``.
"""

from __future__ import annotations

import time

from prefect import flow, task
from prefect.futures import as_completed

from flows.runtime import TASK_OPTIONS, api_for_workers, cache_parameter, task_runner
from hashdist.engine import groundtruth as gt
from hashdist.engine.cache import resolve_cache
from hashdist.progress import progress_bar


@task(name="groundtruth-block", **TASK_OPTIONS)
def block_task(sweep, block, cache_dir):
    return gt.cached_block(sweep, block, resolve_cache(cache_dir))


@flow(name="groundtruth", persist_result=False, log_prints=True, task_runner=task_runner())
def groundtruth(
    dataset: str,
    method: str,
    neighbors: int | None = None,
    sample: int | None = None,
    seed: int | None = None,
    epsilon: float | None = None,
    percent: float | None = None,
    query_block_rows: int | None = None,
    db_block_rows: int | None = None,
    cache: str | bool | None = None,
    progress: bool = False,
) -> dict:
    """Compute and store DATASET's ground truth; returns the ``groundtruth`` record plus blocks and timing."""
    t_start = time.time()
    ds, params = gt.prepare(dataset, method=method, neighbors=neighbors, sample=sample, seed=seed, epsilon=epsilon,
                            percent=percent, query_block_rows=query_block_rows, db_block_rows=db_block_rows)
    cache_arg = resolve_cache(cache).argument
    blocks = {"computed": 0, "cached": 0}
    with progress_bar(0, progress) as bar:

        def run_sweep(sweep, merger):
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
    stored = gt.write(ds, result)
    timing = {"compute_s": t_compute - t_start, "write_s": time.time() - t_compute}
    return {**stored.attrs()["groundtruth"], "blocks": blocks, "timing": timing}


def run_groundtruth(dataset, *, cache=None, address=None, cluster_class=None, cluster_kwargs=None, workers=None,
                    threads=None, progress=False, **options) -> dict:
    """Validate the inputs here (bad input fails before any cluster starts), then run the flow."""
    gt.prepare(dataset, **options)
    cache = cache_parameter(cache)
    runner = task_runner(address, cluster_class, cluster_kwargs, workers, threads)
    with api_for_workers(address, cluster_class, cluster_kwargs):
        return groundtruth.with_options(task_runner=runner)(dataset=str(dataset), cache=cache, progress=progress,
                                                            **options)
