"""What the flows share: Prefect task options, the Dask task runner, the progress bar."""

from __future__ import annotations

import json
import os
import sys

from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext
from prefect_dask import DaskTaskRunner

# Results travel through Dask, never through Prefect's result storage: no caching,
# no persistence. Retries cover transient worker faults.
TASK_OPTIONS = dict(cache_policy=NO_CACHE, persist_result=False, retries=2, retry_delay_seconds=1)


def cluster_threads() -> int:
    """Worker threads of the flow's Dask cluster (at least 1)."""
    client = FlowRunContext.get().task_runner.client
    return max(1, sum(client.nthreads().values()))


def progress_bar(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="block", file=sys.stderr, disable=not enabled, dynamic_ncols=True)


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
