"""The Python API over datasets: evaluate one, or compare several, in this process; no Prefect or Dask needed."""

from __future__ import annotations

import os
import threading
import time

from hashdist.compare.comparison import CheckedComparison, compare_checked, validate
from hashdist.engine.cache import resolve_cache
from hashdist.engine.groundtruth import run_local as run_groundtruth_local
from hashdist.engine.plan import for_threads
from hashdist.engine.reduction import run_local
from hashdist.errors import InputError, is_integer
from hashdist.options import (
    CompareOptions,
    EvaluateOptions,
    GroundTruthOptions,
    PreparedRun,
    SearchOptions,
    split_keywords,
)
from hashdist.progress import advance, progress_bar
from hashdist.report.comparison import write_comparison
from hashdist.report.document import Evaluation, build_report
from hashdist.report.evaluation import run_provenance
from hashdist.report.tasks import combine_tasks

__all__ = ["Evaluation", "compare", "evaluate", "evaluate_local", "groundtruth_local", "options_of", "prepare",
           "prepare_tasks",
           "run_compare", "evaluate_runs", "search"]


def options_of(function: str, options, keywords: dict, cls=EvaluateOptions):
    """A public function's options: the ``cls`` object given, or built from its keywords (a keyword no option
    declares is a TypeError naming ``function`` and the closest option); not both."""
    if options is not None and keywords:
        raise TypeError(f"{function}(): give options= or keyword options, not both")
    (keywords,) = split_keywords(function, keywords, cls)
    return options if options is not None else cls(**keywords)


def prepare(dataset, options: EvaluateOptions | None = None, **keywords) -> PreparedRun:
    """The dataset opened and checked with the options, and its blocks planned: a
    :class:`hashdist.options.PreparedRun` (``ds``, ``params``, ``plan``, ``parameters``, ``served``; read them by
    name) (:meth:`hashdist.options.EvaluateOptions.resolve`; on a dataset with modalities, its first task's: see
    :func:`prepare_tasks`)."""
    return options_of("prepare", options, keywords).resolve(dataset)


def prepare_tasks(dataset, options: EvaluateOptions | None = None, **keywords) -> tuple[PreparedRun, ...]:
    """:func:`prepare` for every task a run evaluates: one for a dataset without modalities, one per task for a
    dataset with them (:meth:`hashdist.options.EvaluateOptions.resolve_tasks`)."""
    return options_of("prepare_tasks", options, keywords).resolve_tasks(dataset)


def evaluate_local(dataset, *, cache=None, threads: int | None = None, progress: bool = False,
                   options: EvaluateOptions | None = None, **keywords) -> Evaluation:
    """Evaluate in this process with a thread pool; see :func:`evaluate` for the options. ``progress``: a bar
    of histogram blocks on stderr while they run, when stderr is a terminal."""
    t0 = time.time()
    if threads is not None and (not is_integer(threads) or threads < 1):
        raise InputError(f"--threads / threads=: expected a positive integer or None, got {threads!r}")
    runs = prepare_tasks(dataset, options_of("evaluate_local", options, keywords))
    return evaluate_runs(runs, cache, threads, progress, t0)


def evaluate_runs(runs: tuple[PreparedRun, ...], cache, threads: int | None, progress: bool, t0: float
                  ) -> Evaluation:
    """Prepared runs in this process: the one run of a dataset without modalities, or each task's, combined into
    the report of a run over tasks (:mod:`hashdist.report.tasks`)."""
    if runs[0].plan.task is None:
        return evaluate_prepared(runs[0], cache, threads, progress, t0)
    evaluations = {run.plan.task: evaluate_prepared(run, cache, threads, progress, time.time()) for run in runs}
    first = next(iter(evaluations.values())).report
    compute = sum(e.report["timing"]["compute_s"] for e in evaluations.values())  # one task after the other
    return combine_tasks(evaluations, {"startup_s": 0.0, "compute_s": compute}, time.time() - t0, first["engine"])


def evaluate_prepared(run: PreparedRun, cache, threads: int | None, progress: bool, t0: float) -> Evaluation:
    """A prepared run's blocks on ``threads`` threads in this process, and its report."""
    threads = threads or os.cpu_count() or 1
    plan = for_threads(run.plan, threads)
    lock, pairs = threading.Lock(), [0]  # the blocks' threads report to one bar
    with progress_bar(len(plan.histogram_blocks), progress) as bar:

        def block_done(block, _cached):
            with lock:
                pairs[0] += block.pairs
                advance(bar, 1, pairs[0], t0)

        result = run_local(plan, run.params, resolve_cache(cache), threads=threads, progress=block_done,
                           served=run.served)
    timing = {"startup_s": 0.0, **result.timing, "write_s": 0.0, "wall_s": time.time() - t0}
    engine = {"kind": "local-threads", "threads": threads, "code_parts": plan.code_parts,
              **({"histograms": f"torch on {plan.device}"} if plan.engine == "torch" else {})}
    report = build_report(run.ds, plan, run.parameters, result, timing, engine)
    return Evaluation(report, result.per_query, result.bucket_sizes)


def evaluate(dataset, *, cache=None, threads: int | None = None, options: EvaluateOptions | None = None,
             **keywords) -> dict:
    """Evaluate a dataset in this process and return the report dict.

    Options: an :class:`hashdist.options.EvaluateOptions` as ``options=``, or its fields as keywords (k, radius,
    beta, empty_queries, relevance, max_grade, block rows, hashtable, conventions, protocol, distance,
    bit_weights, distance_bins, code_parts), each the CLI option of the same name. ``cache``: None or True for
    the per-user cache, False for none, or a directory.
    """
    return evaluate_local(dataset, cache=cache, threads=threads, options=options_of("evaluate", options, keywords)
                          ).report


def run_compare(specs, options: CompareOptions, evaluate, *, out=None, overwrite: bool = False, tables=(),
                checked: CheckedComparison | None = None, on_compared=None) -> dict:
    """The comparison, for either engine: check every input, evaluate each run (``evaluate(run)``: a
    :class:`hashdist.options.PreparedRun` to its :class:`Evaluation`; on datasets with modalities each task's
    run), build the comparison (:mod:`hashdist.compare.comparison`; one per task on datasets with modalities) and,
    with ``out``, write comparison.json and .html there (and ``tables``: "latex", "markdown", the leaderboard as a
    table for a paper). ``checked``: the inputs already checked by the caller (the CLI), not checked again;
    ``on_compared()``, if given, is called once the comparison is built, before it is written."""
    checked = checked or validate(specs, options, out)
    comparison, occupancy = compare_checked(checked, options, evaluate)
    if on_compared is not None:
        on_compared()
    comparison["provenance"] = run_provenance()
    if out is not None:
        write_comparison(out, comparison, occupancy, overwrite=overwrite, tables=tuple(tables))
    return comparison


def compare(specs, *, cache=None, out=None, overwrite: bool = False, tables=(), options: CompareOptions | None = None,
            checked: CheckedComparison | None = None, **keywords) -> dict:
    """Evaluate every run of every ``NAME=DATASET[,DATASET...]`` in this process and compare them (see
    :mod:`hashdist.compare.comparison`). Options: a :class:`hashdist.options.CompareOptions` as ``options=``, or
    its fields as keywords (k, radius, permutations, bootstrap, seed, tasks: on datasets with modalities, the
    tasks ``a->b`` compared, default their cross tasks). ``cache`` as for :func:`evaluate`."""
    options = options_of("compare", options, keywords, CompareOptions)
    checked = checked or validate(specs, options, out, cache)
    return run_compare(specs, options, lambda run: evaluate_prepared(run, cache, None, False, time.time()), out=out,
                       overwrite=overwrite, tables=tables, checked=checked)


def groundtruth_local(dataset, *, cache=None, threads: int | None = None, progress: bool = False,
                      options: GroundTruthOptions | None = None, **keywords):
    """Ground truth from the dataset's features, computed in this process: (ground truth, {blocks, timing}); write
    it with :func:`hashdist.engine.groundtruth.write`. Options: a :class:`hashdist.options.GroundTruthOptions`, or
    its fields as keywords (method, neighbors, sample, seed, epsilon, percent, block rows)."""
    ds, params = options_of("groundtruth_local", options, keywords, GroundTruthOptions).resolve(dataset)
    return run_groundtruth_local(ds, params, cache=cache, threads=threads, progress=progress)


def search(dataset, *, out, overwrite: bool = False, progress: bool = False, options: SearchOptions | None = None,
           **keywords) -> list[str]:
    """Build a faiss binary index over the dataset's database codes and write its lists of the dataset's queries,
    one ``NAME.npz`` per setting, into the directory ``out`` (:mod:`hashdist.served.search`); the paths written.

    Options: a :class:`hashdist.options.SearchOptions` as ``options=``, or its fields as keywords: index (a faiss
    binary factory string, e.g. "BIVF1024"), k, radius (inclusive), nprobe / ef_search / nflip (a value or a list:
    one file each), task, threads, train_rows, seed. Needs faiss (``pip install 'hashdist[faiss]'``).
    ``overwrite``: replace ``out`` if it exists."""
    from hashdist.served.search import prepare, run_search

    run = prepare(dataset, options_of("search", options, keywords, SearchOptions), out, overwrite)
    return [s["path"] for s in run_search(run, out, overwrite=overwrite, progress=progress)]
