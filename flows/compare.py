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

import hashlib

from prefect import flow
from prefect.artifacts import create_table_artifact

from flows.evaluate import evaluate
from flows.observe import absolute, failures_logged, interval, link_artifact, markdown_text, run_log, slug
from flows.runtime import api_for_workers, cache_parameter, handed_over, taken, task_runner
from hashdist.api import run_compare
from hashdist.compare.comparison import validate
from hashdist.options import CompareOptions, ExecutionOptions, PreparedRun, split_keywords
from hashdist.progress import Phases
from hashdist.report.comparison import leaderboard_rows, map_interval
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
    comparison.html. The run's story goes to its Prefect logs (flows.observe)."""
    log = run_log()
    with failures_logged(log, "compare"):
        return _compare(log, methods, options, out, overwrite, tables, execution, checked)


def _compare(log, methods, options, out, overwrite, tables, execution, checked) -> dict:
    runner = task_runner(**execution.cluster)
    cache = cache_parameter(execution.cache)
    log.info(f"hashdist compare: {len(methods)} methods ({', '.join(m.split('=', 1)[0] for m in methods)})"
             + (f" into {absolute(out)}" if out is not None else ""))

    def evaluate_on_cluster(run: PreparedRun) -> Evaluation:
        log.info(f"evaluating {run.ds.url}" + (f" ({run.plan.task})" if run.plan.task else ""))
        with handed_over((run,)) as key:  # the evaluate flow takes a run per task
            evaluation = evaluate.with_options(task_runner=runner)(
                dataset=run.ds.url, options=options.evaluate_options.as_parameters(), cache=cache,
                progress=execution.progress, prepared=key)
        return _one_task(evaluation, run.plan.task)

    with Phases(log) as phases:
        phases.start("evaluations and tests")
        comparison = run_compare(methods, options, evaluate_on_cluster, out=out, overwrite=overwrite, tables=tables,
                                 checked=taken(checked), on_compared=lambda: phases.start("writing") if out else None)
    _publish(log, methods, comparison)
    return comparison


def comparison_id(methods) -> str:
    """The comparison as its artifact keys name it: the slug of its method names and 8 hex digits of its methods'
    names and absolute dataset locations, so a rerun of the same comparison keeps its keys."""
    specs = [f"{name}={','.join(absolute(d) for d in datasets.split(','))}"
             for name, _, datasets in (str(m).partition("=") for m in methods)]
    names = "-".join(spec.split("=", 1)[0] for spec in specs)
    return f"{slug(names)}-{hashlib.sha256(chr(10).join(sorted(specs)).encode()).hexdigest()[:8]}"


def _publish(log, methods, comparison: dict) -> None:
    """The leaderboard's log lines and artifacts (its table; a link to comparison.html), keyed by the comparison."""
    per_task = comparison.get("tasks") or {None: comparison}
    for task, sub in per_task.items():
        cells = []
        for name in sub["ranking"]:
            worst, expected, best = map_interval(sub["methods"][name])
            cells.append(f"{name} {interval({'expected': expected, 'worst': worst, 'best': best})}")
        log.info(f"mAP{f' {task_label(task)}' if task else ''} (expected [worst, best]): " + "; ".join(cells))
    key = comparison_id(methods)
    table = [{**({"task": task_label(task)} if task else {}), **dict(zip(header, row, strict=True))}
             for task, sub in per_task.items() for header, rows in [leaderboard_rows(sub)] for row in rows]
    create_table_artifact(table=table, key=f"hashdist-comparison-{key}", description="hashdist leaderboard (methods "
                          f"by expected mAP{', per task' if 'tasks' in comparison else ''}, 4 decimals)")
    outputs = comparison.get("outputs") or {}
    if outputs:
        log.info("comparison: " + ", ".join(absolute(p) for p in outputs.values()))
        link_artifact(outputs["comparison_html"], f"hashdist-comparison-page-{key}",
                      f"hashdist comparison of {markdown_text(', '.join(next(iter(per_task.values()))['ranking']))}")


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
