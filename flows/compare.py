"""A Prefect 3 flow that compares several code sets: thin orchestration over ``hashdist.compare.comparison``.

Each method's dataset (each run's, with ``NAME=DS1,DS2,...``) is evaluated by the
``evaluate`` flow as a subflow (its blocks run on the Dask cluster; the block cache is
shared, so a rerun computes nothing), one after the other. The ground truth is shared
(per run index with repeated runs): it is checked once by fingerprints before anything
runs, and the comparison is built from the finished evaluations. Run it
through ``hashdist compare`` or :func:`run_comparison`.
"""

from __future__ import annotations

from prefect import flow
from prefect.artifacts import create_table_artifact

from flows.evaluate import evaluate
from flows.runtime import api_for_workers, cache_parameter, task_runner
from hashdist.compare.comparison import build_comparison, validate
from hashdist.defaults import DEFAULT_BOOTSTRAP, DEFAULT_K, DEFAULT_PERMUTATIONS, DEFAULT_RADII
from hashdist.report.comparison import leaderboard_rows, write_comparison


@flow(name="compare", persist_result=False, log_prints=True)
def compare(
    methods: list[str],
    out: str | None = None,
    k: list[int] = DEFAULT_K,
    radius: list[int] = DEFAULT_RADII,
    permutations: int = DEFAULT_PERMUTATIONS,
    bootstrap: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    cache: str | bool | None = None,
    overwrite: bool = False,
    tables: list[str] = (),
    address: str | None = None,
    cluster_class: str | None = None,
    cluster_kwargs: dict | None = None,
    workers: int | None = None,
    threads: int | None = None,
    progress: bool = False,
) -> dict:
    """Evaluate each run of each ``NAME=DATASET[,DATASET...]`` and compare; with ``out``, write comparison.json and
    comparison.html."""
    parsed, datasets = validate(methods, k=k, radius=radius, permutations=permutations, seed=seed, out=out,
                                overwrite=overwrite)
    runner = task_runner(address, cluster_class, cluster_kwargs, workers, threads)
    evaluations = [
        [evaluate.with_options(task_runner=runner)(dataset=path, k=list(k), radius=list(radius), cache=cache,
                                                   progress=progress) for path in m.runs]
        for m in parsed
    ]
    comparison, occupancy = build_comparison(parsed, datasets, evaluations, k=k, radius=radius,
                                             permutations=permutations, bootstrap=bootstrap, seed=seed)
    if out is not None:
        write_comparison(out, comparison, occupancy, overwrite=overwrite, tables=tuple(tables))
    header, rows = leaderboard_rows(comparison)
    create_table_artifact(table=[dict(zip(header, row, strict=True)) for row in rows], key="hashdist-comparison",
                          description="hashdist leaderboard (methods by expected mAP)")
    return comparison


def run_comparison(methods, *, out=None, overwrite=False, k=DEFAULT_K, radius=DEFAULT_RADII,
                   permutations=DEFAULT_PERMUTATIONS, bootstrap=DEFAULT_BOOTSTRAP, seed=0, cache=None, tables=(),
                   **cluster):
    """Validate the inputs here (bad input fails before any cluster starts), then run the flow."""
    validate(methods, k=k, radius=radius, permutations=permutations, seed=seed, out=out, overwrite=overwrite)
    cache = cache_parameter(cache)
    with api_for_workers(cluster.get("address"), cluster.get("cluster_class"), cluster.get("cluster_kwargs")):
        return compare(methods=[str(m) for m in methods], out=None if out is None else str(out), overwrite=overwrite,
                       k=list(k), radius=list(radius), permutations=permutations, bootstrap=bootstrap, seed=seed,
                       cache=cache, tables=list(tables), **cluster)
