"""A Prefect 3 flow that compares several code sets: thin orchestration over ``hashdist.api.run_compare``.

Each method's dataset (each run's, with ``NAME=DS1,DS2,...``) is evaluated by the
``evaluate`` flow as a subflow (its blocks run on the Dask cluster; the block cache is
shared, so a rerun computes nothing), one after the other. Every input is checked once
before anything runs (the same driver as ``--engine local``), and each subflow takes its
checked run. On datasets with modalities each task's run is evaluated on its own (the
``evaluate`` flow's report over that one task, taken apart again) and the comparison is built
per task. Run it through ``hashdist compare`` or :func:`run_comparison`.
"""

from __future__ import annotations

from prefect import flow
from prefect.artifacts import create_table_artifact

from flows.evaluate import evaluate
from flows.runtime import api_for_workers, cache_parameter, handed_over, taken, task_runner
from hashdist.api import run_compare
from hashdist.compare.comparison import validate
from hashdist.options import CompareOptions, ExecutionOptions, PreparedRun, split_keywords
from hashdist.report.comparison import leaderboard_rows
from hashdist.report.document import Evaluation
from hashdist.report.tasks import RUN_KEYS, task_label


@flow(name="compare", persist_result=False, log_prints=True)
def compare(
    methods: list[str],
    options: CompareOptions = CompareOptions(),  # noqa: B008 - frozen: one shared default is safe
    out: str | None = None,
    overwrite: bool = False,
    tables: list[str] = (),
    execution: ExecutionOptions = ExecutionOptions(),  # noqa: B008 - frozen
    checked: str | None = None,
) -> dict:
    """Evaluate each run of each ``NAME=DATASET[,DATASET...]`` and compare; with ``out``, write comparison.json and
    comparison.html."""
    runner = task_runner(**execution.cluster)
    cache = cache_parameter(execution.cache)

    def evaluate_on_cluster(run: PreparedRun) -> Evaluation:
        with handed_over((run,)) as key:  # the evaluate flow takes a run per task
            evaluation = evaluate.with_options(task_runner=runner)(
                dataset=run.ds.url, options=options.evaluate_options, cache=cache, progress=execution.progress,
                prepared=key)
        return _one_task(evaluation, run.plan.task)

    comparison = run_compare(methods, options, evaluate_on_cluster, out=out, overwrite=overwrite, tables=tables,
                             checked=taken(checked))
    per_task = comparison.get("tasks") or {None: comparison}
    table = [{**({"task": task_label(task)} if task else {}), **dict(zip(header, row, strict=True))}
             for task, sub in per_task.items() for header, rows in [leaderboard_rows(sub)] for row in rows]
    create_table_artifact(table=table, key="hashdist-comparison", description="hashdist leaderboard (methods by "
                          f"expected mAP{', per task' if 'tasks' in comparison else ''})")
    return comparison


def _one_task(evaluation: Evaluation, task: str | None) -> Evaluation:
    """The evaluation of one task's run as the local engine gives it: the evaluate flow reports a run over tasks
    (``report["tasks"]``, arrays per task) even for one task."""
    if task is None or "tasks" not in evaluation.report:
        return evaluation
    report = {**{k: v for k, v in evaluation.report.items() if k in RUN_KEYS}, **evaluation.report["tasks"][task]}
    return Evaluation(report, evaluation.per_query[task], evaluation.bucket_sizes[task])


def run_comparison(methods, *, out=None, overwrite: bool = False, tables=(), options: CompareOptions | None = None,
                   execution: ExecutionOptions | None = None, checked=None, **keywords) -> dict:
    """Check the inputs here (bad input fails before any cluster starts), then run the flow on the cluster that
    ``execution`` names. ``options`` / ``execution``: the objects, or their fields as keywords (k=, permutations=,
    cache=, ...); ``checked``: the inputs the caller (the CLI) already checked, not checked again."""
    compare_keywords, execution_keywords = split_keywords("run_comparison", keywords, CompareOptions,
                                                          ExecutionOptions)
    options = options or CompareOptions(**compare_keywords)
    execution = execution or ExecutionOptions(**execution_keywords)
    checked = checked or validate(methods, options, out, execution.cache)
    with handed_over(checked) as key, \
            api_for_workers(execution.address, execution.cluster_class, execution.cluster_kwargs):
        return compare(methods=[str(m) for m in methods], options=options, out=None if out is None else str(out),
                       overwrite=overwrite, tables=list(tables), execution=execution, checked=key)
