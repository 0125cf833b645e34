"""The main job: a Prefect 3 flow that evaluates a dataset on a Dask cluster.

Thin orchestration over ``hashdist.engine``. The plan's blocks are the unit of
caching; Prefect tasks take runs of them, because each Prefect task run costs about
0.1 s of CPU (submission in the flow process, context and API clients on the
worker): one histogram task per cluster thread (more for very large runs), each
reading its own Zarr rows on the worker and returning partial histograms summed
per query block (``hashdist.engine.compute.Partials``). The first pass of code counts
(a group of database blocks per cluster thread) is submitted beside them as plain
Dask tasks, whose results go as soon as the pass is counted (a Prefect task's
state would keep them to the end of the run).

Those results stay on the workers, and the reduction runs there too: the recipe
``hashdist.engine.reduction.reduce_blocks`` that ``--engine local`` runs on threads,
here on a Dask executor (plain Dask tasks on the workers): each finished share
is taken apart on its worker (sums per metric item, tallies), each metric item's
partial histograms are summed in a tree, and per-query metrics are computed beside
the sums. The database's distinct codes are counted in passes of a few code parts
(a group of database blocks per cluster thread and pass, as a plain Dask task): each part is merged from its
pieces on one worker and searched for M_k there, and a pass starts when the one
before has finished, so no process holds every distinct code and memory does not
grow with the database. Only per-query values (O(Q)) and small tallies reach the
flow process, which finishes the report (``hashdist.engine.reduction.assemble``). Sums are
exact integers and M_k a maximum, so the result is bit-identical to
``--engine local`` whatever the cluster's shape. Block results are cached by content
in a ``BlockCache`` directory (shared storage on a cluster).

On a dataset with modalities the run's tasks (``image->text``, ``text->image``, ...) are planned each as a
dataset of its own and their shares submitted together, so the blocks of every task spread over the cluster
at once; each task is then reduced as above and the reports are combined (``hashdist.report.tasks``).
Run it through ``hashdist evaluate`` or :func:`run_evaluation`; deploy the flow
``evaluate`` itself (see deploy/prefect.yaml).
"""

from __future__ import annotations

import math
import time
from contextlib import ExitStack
from dataclasses import dataclass, field

import dask
from dask.utils import parse_bytes
from distributed import as_completed, wait
from prefect import flow, task
from prefect.context import FlowRunContext
from prefect.states import State

from flows.history import drop_state, watch
from flows.observe import ProgressLog, absolute, failures_logged, headline_lines, publish_evaluation, run_log
from flows.runtime import (
    TASK_OPTIONS,
    api_for_workers,
    cache_parameter,
    cluster_threads,
    handed_over,
    runner_where,
    taken,
    task_runner,
    workers_in_this_process,
)
from hashdist.defaults import cache_in_use
from hashdist.engine import precompile
from hashdist.engine.cache import resolve_cache
from hashdist.engine.compute import count_codes, run_blocks
from hashdist.engine.plan import Plan, code_passes, count_shares, for_threads, metric_items, work_shares
from hashdist.engine.reduction import RunResult, item_sums, reduce_blocks
from hashdist.engine.spill import spill_directory
from hashdist.errors import InputError
from hashdist.options import EvaluateOptions, ExecutionOptions, PreparedRun, split_keywords
from hashdist.progress import Phases, advance, progress_bar
from hashdist.report.document import Evaluation, build_report
from hashdist.report.evaluation import check_output_dir
from hashdist.report.tasks import combine_tasks, work_line

# pairs one histogram task may take (a few seconds of one core): the floor on task count for huge runs
PAIRS_PER_TASK = 2e10
GRAPH_WARNING = "distributed.admin.large-graph-warning-threshold"


@task(name="histogram-blocks", **TASK_OPTIONS)
def histogram_task(plan, blocks, cache_dir):
    """One share of the plan: its blocks' partial results summed per query block."""
    return run_blocks(plan, blocks, resolve_cache(cache_dir))


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


class DaskExecutor:
    """The reduction's executor on a Dask client: each step runs on the workers, beside the data it takes."""

    def __init__(self, client):
        self.client = client

    def submit(self, function, *args):
        return self.client.submit(function, *args)

    def wait(self, handles) -> None:
        wait(handles)

    def gather(self, nested):
        return self.client.gather(nested)


def reduce_on_cluster(client, plan, params, picks: list[SharePicks], threads: int, first_counts: list,
                      spill: str | None = None, served=(), on_metrics=None) -> RunResult:
    """:func:`hashdist.engine.reduction.reduce_blocks` on the workers, over the shares' picks and the code counts
    (``first_counts``: the first pass's, submitted with the histogram tasks; later passes as plain Dask tasks,
    reading the rows the first set aside in ``spill`` when there is one); ``on_metrics()`` is called as the
    metrics step starts.
    Only per-query values and tallies are gathered here. The plan and parameters (a few KB) travel inside the
    tasks: scattered data cannot be recomputed, and a broadcast scatter waits forever for a worker that died
    meanwhile.
    """
    item_parts = [[share.sums[i] for share in picks if i in share.sums] for i in range(len(metric_items(plan)))]

    def count_pass(parts):
        """The first pass: the counts submitted with the histograms, handed over (not kept here); later passes
        submitted now. All are plain Dask tasks: a Prefect task's state would hold its codes to the run's end."""
        if parts.start == 0:
            handed, first_counts[:] = list(first_counts), []
            return handed
        return [client.submit(count_codes, plan, group, parts, None, spill) for group in count_shares(plan, threads)]

    with dask.config.set({GRAPH_WARNING: _graph_warning_bytes(plan, served)}):
        return reduce_blocks(DaskExecutor(client), plan, params, item_parts, [share.tallies for share in picks],
                             count_pass, served=served, on_metrics=on_metrics)


def _graph_warning_bytes(plan: Plan, served) -> int:
    """Dask's large-graph warning threshold for the reduction: a metric item's served rows travel inside its task
    by design (a scatter could not be recomputed if a worker died), so the warning's advice does not apply to them;
    it still fires for anything larger than they are plus Dask's default."""
    largest = max((sum(run.rows(start, stop).nbytes for run in served) for _, start, stop in metric_items(plan)),
                  default=0)
    return parse_bytes(dask.config.get(GRAPH_WARNING)) + largest


@flow(name="evaluate", persist_result=False, log_prints=True, task_runner=task_runner())
def evaluate(
    dataset: str,
    options: EvaluateOptions = EvaluateOptions(),  # noqa: B008 - frozen: one shared default is safe
    out: str | None = None,
    overwrite: bool = False,
    html: bool = True,
    cache: str | bool | None = None,
    progress: bool = False,
    started_at: float | None = None,
    history: str | None = None,
    prepared: str | None = None,
) -> Evaluation:
    """Evaluate DATASET with ``options``; with ``out``, write report.json, per_query.zarr and report.html there;
    with ``history``, record the run there and fail on a significant drop. ``prepared``: the key of a run that
    :func:`run_evaluation` checked in this process, so it is not checked again. The run's story goes to its
    Prefect logs (flows.observe)."""
    log = run_log()
    with failures_logged(log, "evaluate"):
        return _evaluate(log, dataset, options, out, overwrite, html, cache, progress, started_at, history, prepared)


def _evaluate(log, dataset, options, out, overwrite, html, cache, progress, started_at, history, prepared):
    t_start = time.time()
    runs = taken(prepared) or options.resolve_tasks(dataset)
    if history is not None and runs[0].plan.task is not None:
        raise InputError(f"--history: not available for a dataset with modalities ({dataset})")
    log.info(work_line(runs, runner_where(FlowRunContext.get().task_runner)))
    started_at = started_at or t_start
    cache_arg = resolve_cache(cache).argument
    results, threads = _compute(log, runs, cache_arg, progress, t_start)
    evaluations = {run.plan.task: _evaluation(run, *result, threads, t_start, started_at)
                   for run, result in zip(runs, results, strict=True)}
    first = next(iter(evaluations.values())).report
    timing = {"startup_s": t_start - started_at, "compute_s": max(r[2] for r in results) - t_start}  # at once
    evaluation = evaluations.get(None) or combine_tasks(evaluations, timing, time.time() - started_at,
                                                        first["engine"])
    for line in headline_lines(evaluation.report):
        log.info(line)
    if out is not None:
        with Phases(log) as phases:
            phases.start("writing")
            evaluation.write(out, overwrite=overwrite, html=html, started_at=started_at)
        log.info("report: " + ", ".join(absolute(p) for p in evaluation.report["outputs"].values() if p))
    publish_evaluation(log, evaluation.report)
    if history is not None:  # append to the history store, compare with the previous run (flows/history.py)
        evaluation.verdict = verdict = watch(evaluation, history, log=log)
        if verdict["flagged"]:  # Failed, message "mAP dropped significantly: ..."; the outputs stay written
            return drop_state(verdict, evaluation)
    return evaluation


def _evaluation(run: PreparedRun, result: RunResult, plan: Plan, t_reduce: float, threads: int, t_start: float,
                started_at: float) -> Evaluation:
    """A run's (a dataset's, or one task's) evaluation from its reduced result."""
    timing = {"startup_s": t_start - started_at, "compute_s": t_reduce - t_start, **result.timing, "write_s": 0.0,
              "wall_s": time.time() - started_at}
    engine = {"kind": "prefect-dask", "flow": "evaluate", "threads": threads, "code_parts": plan.code_parts}
    report = build_report(run.ds, plan, run.parameters, result, timing, engine)
    return Evaluation(report, result.per_query, result.bucket_sizes)


@dataclass
class _Submitted:
    """One run's (a dataset's, or one task's) histogram shares in flight, the first pass of its code counts, and
    the parts of the shares taken so far."""

    run: PreparedRun
    plan: Plan
    shares: list
    first_counts: list  # the first pass's code counts, a plain Dask task per group of database blocks
    items: list
    spill: str | None  # where the first pass sets aside the later passes' codes (hashdist.engine.spill)
    picks: list = field(default_factory=list)


def _submit(client, run: PreparedRun, threads: int, cache_arg, spills: ExitStack) -> tuple[_Submitted, dict]:
    """The run's histogram shares as Prefect tasks and the first pass of its code counts as plain Dask tasks
    beside them (a Prefect task's state would hold the codes to the run's end): (its state, {future: share}).
    With the workers in this process, the first pass sets aside the later passes' codes in a temporary
    directory that ``spills`` removes."""
    plan = for_threads(run.plan, threads)
    shares = work_shares(plan, max(threads, math.ceil(plan.pairs / PAIRS_PER_TASK)))
    futures = {histogram_task.submit(plan, share, cache_arg).wrapped_future: i for i, share in enumerate(shares)}
    spill = spills.enter_context(spill_directory(plan, workers_in_this_process()))
    first_pass = code_passes(plan)[0]
    counts = [client.submit(count_codes, plan, group, first_pass, None, spill)
              for group in count_shares(plan, threads)]
    return _Submitted(run, plan, shares, counts, metric_items(plan), spill), futures


def _compute(log, runs: tuple[PreparedRun, ...], cache_arg, progress: bool, t_start: float):
    """Every run's histogram shares at once (the blocks of all tasks spread over the cluster together), then each
    run's reduction on the workers: ([(RunResult, plan, time its reduction started)], cluster threads)."""
    phases = Phases(log)
    phases.start("cluster")
    threads = cluster_threads()
    if workers_in_this_process():  # a first run's metric functions compile in a second process meanwhile
        precompile.start()
    client = FlowRunContext.get().task_runner.client
    phases.end(f" ({threads} worker thread{'s' if threads != 1 else ''})")
    submitted, owner = [], {}
    with ExitStack() as spills:
        for run in runs:
            one, futures = _submit(client, run, threads, cache_arg, spills)
            submitted.append(one)
            owner.update({future: (one, i) for future, i in futures.items()})
        pairs_done, blocks = 0, sum(len(one.plan.histogram_blocks) for one in submitted)
        phases.start("blocks")
        with client.as_current(), progress_bar(blocks, progress) as bar:
            with ProgressLog(log, bar):  # a log line every PERIOD_S seconds while the blocks are computed
                for state in as_completed(list(owner)):  # waits without fetching: the results stay on the workers
                    one, i = owner.pop(state)
                    one.picks.append(pick_share(client, one.items, one.shares[i], state))  # released once taken
                    pairs_done += sum(block.pairs for block in one.shares[i])
                    advance(bar, len(one.shares[i]), pairs_done, t_start)
                state = None
            phases.end(f" ({blocks:,} block{'s' if blocks != 1 else ''}, {pairs_done:,} pairs)")
            return [_reduce(log, client, one, threads) for one in submitted], threads


def _reduce(log, client, one: _Submitted, threads: int):
    """A run's reduction on the workers, once its shares are in: (RunResult, plan, time it started)."""
    first_counts, one.first_counts = one.first_counts, []  # referenced by the reduction alone, until counted
    t_reduce = time.time()
    with Phases(log, f"{one.plan.task}: " if one.plan.task else "") as phases:
        phases.start("reduction")
        result = reduce_on_cluster(client, one.plan, one.run.params, one.picks, threads, first_counts, one.spill,
                                   one.run.served, on_metrics=lambda: phases.start("metrics"))
    one.picks = []
    return result, one.plan, t_reduce


def run_evaluation(dataset, *, out=None, overwrite: bool = False, html: bool = True, history=None,
                   options: EvaluateOptions | None = None, execution: ExecutionOptions | None = None,
                   prepared: tuple[PreparedRun, ...] | None = None, started_at: float | None = None,
                   **keywords) -> Evaluation:
    """Check the inputs here (bad input fails before any cluster starts), then run the flow on the cluster that
    ``execution`` names. ``options`` / ``execution``: the objects, or their fields as keywords (k=, threads=,
    cache=, ...). ``prepared``: the runs (one per task) already checked by the caller (the CLI), not checked again."""
    started_at = started_at or time.time()
    evaluate_keywords, execution_keywords = split_keywords("run_evaluation", keywords, EvaluateOptions,
                                                           ExecutionOptions)
    options = options or EvaluateOptions(**evaluate_keywords)
    execution = execution or ExecutionOptions(**execution_keywords)
    if out is not None:
        check_output_dir(out, (dataset, options.bit_weights), cache_in_use(execution.cache))
    if history is not None:
        from hashdist.compare.history import check_history_dir

        check_history_dir(history)  # a path that is not a history store fails here, before the run
    runs = prepared or options.resolve_tasks(dataset)
    if history is not None and runs[0].plan.task is not None:
        raise InputError(f"--history: not available for a dataset with modalities ({dataset})")
    with handed_over(runs) as key, \
            api_for_workers(execution.address, execution.cluster_class, execution.cluster_kwargs):
        return evaluate.with_options(task_runner=task_runner(**execution.cluster))(
            dataset=str(dataset), options=options.as_parameters(), out=None if out is None else str(out),
            overwrite=overwrite,
            html=html, cache=cache_parameter(execution.cache), progress=execution.progress, started_at=started_at,
            history=None if history is None else str(history), prepared=key)
