"""The ``hashdist`` command line: synth, ingest, split, evaluate, compare, groundtruth, history, search.

Bad input ends with one line on stderr naming the problem and exit status 2;
nothing is written. ``evaluate --history DIR`` exits with status 3 when the new run's
mAP dropped significantly against the previous run in DIR. ``--debug`` shows tracebacks.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import json
import os
import sys

from hashdist.cli.fields import add_fields, from_args
from hashdist.cli.hints import hints, versions
from hashdist.cli.signals import EXIT_GRACE_S, EXIT_STATUS, SignalWatch, exit_within
from hashdist.data.protocols import PROTOCOLS
from hashdist.defaults import (
    DEFAULT_ALPHA,
    DEFAULT_CHUNK_ROWS,
    DEFAULT_PERMUTATIONS,
    DEFAULT_QUERY_CHUNK_ROWS,
    DEFAULT_SEED,
)
from hashdist.errors import InputError
from hashdist.options import (
    CompareOptions,
    EvaluateOptions,
    ExecutionOptions,
    GroundTruthOptions,
    SearchOptions,
    cluster_kwargs_option,
)

DESCRIPTION = """\
Exact, tie-aware evaluation of binary hash codes for retrieval.

  hashdist synth --preset demo --out demo/data.zarr          make a synthetic dataset
  hashdist ingest --db-codes DB.npy --query-codes Q.npy \\
      --db-labels DBL.npy --query-labels QL.npy --out data.zarr     store your codes
  hashdist evaluate data.zarr --out report/                   metrics, report.json, report.html
  hashdist compare --method a=a.zarr --method b=b.zarr --out cmp/   leaderboard, significance
  hashdist evaluate data.zarr --out report/ --history hist/   also record the run; exit 3 on a significant drop
  hashdist history hist/                                      the trend of recorded runs, hist/history.html
  hashdist search data.zarr --index BIVF1024 --k 100 --nprobe 1 4 16 --out runs/
      a faiss index's lists (one .npz per nprobe), for evaluate --served
  hashdist split --labels ALL_LABELS.npy --protocol cifar10 --out splits.zarr
      then ingest --splits and compare --method NAME=RUN0.zarr,RUN1.zarr,...   repeated runs

Every order-dependent metric is reported for the three tie policies (expected
over all orders of items at equal Hamming distance, best, worst). See README.md,
docs/cli.md and docs/metrics.md (the metric definitions).
"""


class _Dropped(Exception):
    """A finished ``evaluate --history`` run whose mAP dropped significantly: print ``output``, then
    ``message`` on stderr, exit status 3."""

    def __init__(self, output: str, message: str):
        super().__init__(message)
        self.output, self.message = output, message


class _Parser(argparse.ArgumentParser):
    words: list[str] = []  # the command line being parsed, for the hints of a missing argument's error

    def error(self, message):  # one line, exit status 2; no command at all: the commands and their examples
        if self.prog == "hashdist" and message.endswith("required: command"):
            sys.stderr.write(f"{self.format_help()}\nhashdist: give a command (hashdist COMMAND --help for its "
                             "options)\n")
            sys.exit(2)
        if message.startswith("the following arguments are required"):  # --output for --out: say so
            message += hints(_Parser.words, list(self._option_string_actions), named=True)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)

    def parse_args(self, args=None, namespace=None):
        """As argparse's, with an unknown option answered by the option it most likely means."""
        _Parser.words = list(sys.argv[1:] if args is None else args)
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self._subparsers._group_actions[0].choices.get(getattr(parsed, "command", None), self) \
                if self._subparsers else self
            command.error(f"unrecognized arguments: {' '.join(extras)}"
                          + hints(extras, list(command._option_string_actions)))
        return parsed


class _Version(argparse.Action):
    """``--version``: hashdist's version and its dependencies' (from package metadata; nothing else loads)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(versions())
        parser.exit()


def _add_ingest(sub):
    p = sub.add_parser(
        "ingest",
        help="store codes, labels and ground truth as a Zarr dataset",
        description="Store query and database codes (and labels or explicit ground truth) as a hashdist dataset. "
        "Codes: (N, B) arrays of {0,1} or {-1,+1} in any numeric or bool dtype, or numpy-packbits uint8 "
        "rows with --packed --nbits B; .npy files are memory-mapped and streamed. Labels: 1-D integers are "
        "classes, 2-D 0/1 is multi-label.",
    )
    p.add_argument("--db-codes", metavar="[NAME=]DB.npy", action="append",
                   help="database codes, required unless --splits; repeat as NAME=PATH for a dataset with modalities "
                   "(e.g. --db-codes image=D_img.npy --db-codes text=D_txt.npy: same rows and bits)")
    p.add_argument("--query-codes", metavar="[NAME=]Q.npy", action="append",
                   help="query codes, required unless --append; NAME=PATH per modality as for --db-codes")
    p.add_argument("--db-labels", metavar="DBL.npy", help="database labels: 1-D integer classes or a 2-D 0/1 "
                   "multi-hot matrix (N rows)")
    p.add_argument("--query-labels", metavar="QL.npy", help="query labels, of the same kind as --db-labels (Q rows)")
    p.add_argument("--query-relevant", metavar="REL.npz", help="explicit ground truth: CSR indptr, indices[, grades]")
    p.add_argument("--db-features", metavar="F.npy", help="(N, D) float32/float64 features, for hashdist groundtruth")
    p.add_argument("--query-features", metavar="F.npy", help="(Q, D) query features, with --db-features")
    p.add_argument("--query-scores", metavar="S.npy",
                   help="(Q, B) real-valued query vectors (before sign), for evaluate --distance asymmetric")
    p.add_argument("--relevance", choices=["class", "multilabel", "explicit"], help="default relevance kind")
    p.add_argument("--packed", action="store_true", help="codes are numpy packbits uint8 rows")
    p.add_argument("--nbits", type=int, help="bits per code with --packed")
    p.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS,
                   help=f"database rows per Zarr chunk (default {DEFAULT_CHUNK_ROWS})")
    p.add_argument("--query-chunk-rows", type=int, default=DEFAULT_QUERY_CHUNK_ROWS,
                   help=f"query rows per Zarr chunk (default {DEFAULT_QUERY_CHUNK_ROWS})")
    p.add_argument("--append", action="store_true", help="append --db-codes (and --db-labels) to the dataset at --out")
    p.add_argument("--codes", metavar="ALL.npy", help="with --splits: the pooled codes of every item")
    p.add_argument("--labels", metavar="ALL_LABELS.npy", help="with --splits: the pooled labels of every item")
    p.add_argument("--splits", metavar="SPLITS.zarr",
                   help="take one run of a `hashdist split` store: queries = its test queries, database = its "
                   "database (standard) or test database (improved)")
    p.add_argument("--strategy", choices=["standard", "improved"], help="with --splits: the split strategy")
    p.add_argument("--run", type=int, help="with --splits: the run index, 0..T-1")
    p.add_argument("--validation", action="store_true",
                   help="with --splits: the validation queries and validation database instead of the test pair")
    p.add_argument("--overwrite", action="store_true", help="replace a dataset hashdist wrote at --out (nothing else "
                   "is ever replaced)")
    p.add_argument("--out", required=True, metavar="DATASET.zarr", help="the dataset to write (a Zarr directory)")


def _given(a, name: str) -> bool:
    """Whether option ``name`` was given (a value, or a flag set); 0 counts as given."""
    value = getattr(a, name)
    return value is not None and value is not False


def _check_split_options(a) -> None:
    """--strategy, --run and --validation pick a run of --splits: refused without it."""
    for name in ("strategy", "run", "validation"):
        if a.splits is None and _given(a, name):
            raise InputError(f"--{name} goes with --splits")


def _run_ingest(a):
    from hashdist.data.ingest import append, ingest, parse_modal_paths

    a.db_codes = parse_modal_paths(a.db_codes, "--db-codes")
    a.query_codes = parse_modal_paths(a.query_codes, "--query-codes")
    if a.splits is not None:
        return _ingest_split(a)
    if a.codes is not None or a.labels is not None:
        raise InputError("--codes and --labels go with --splits (use --db-codes and --query-codes otherwise)")
    _check_split_options(a)
    if a.db_codes is None:
        raise InputError("--db-codes is required (or --splits with --codes and --labels)")
    if a.append:
        for name in ("query_codes", "query_labels", "query_relevant", "db_features", "query_features",
                     "query_scores", "relevance"):
            if getattr(a, name) is not None:
                raise InputError(f"--{name.replace('_', '-')}: not with --append, which adds database rows only")
        append(a.out, a.db_codes, a.db_labels, packed=a.packed, nbits=a.nbits)
        named = ", ".join(a.db_codes.values()) if isinstance(a.db_codes, dict) else a.db_codes
        return f"appended {named} to {a.out}"
    if a.query_codes is None:
        raise InputError("--query-codes is required (unless --append)")
    ingest(
        a.out, a.db_codes, a.query_codes, db_labels=a.db_labels, query_labels=a.query_labels,
        query_relevant=a.query_relevant, db_features=a.db_features, query_features=a.query_features,
        query_scores=a.query_scores,
        relevance=a.relevance, packed=a.packed, nbits=a.nbits,
        chunk_rows=a.chunk_rows, query_chunk_rows=a.query_chunk_rows, overwrite=a.overwrite,
    )
    return f"wrote {a.out}"


def _ingest_split(a):
    from hashdist.data.ingest import ingest_split

    for option in ("codes", "labels", "strategy", "run"):
        if getattr(a, option) is None:
            raise InputError(f"--splits needs --{option}")
    for option in ("db_codes", "query_codes", "db_labels", "query_labels", "query_relevant", "db_features"):
        if getattr(a, option) is not None:
            raise InputError(f"--{option.replace('_', '-')} does not go with --splits (use --codes and --labels)")
    if a.append:
        raise InputError("--append does not go with --splits")
    ingest_split(a.out, a.codes, a.labels, a.splits, strategy=a.strategy, run=a.run, validation=a.validation,
                 packed=a.packed, nbits=a.nbits, chunk_rows=a.chunk_rows, query_chunk_rows=a.query_chunk_rows,
                 overwrite=a.overwrite)
    pair = "validation" if a.validation else "test"
    return f"wrote {a.out} ({a.strategy} run {a.run}, {pair} queries and database of {a.splits})"


def _add_synth(sub):
    p = sub.add_parser(
        "synth",
        help="write a synthetic or digits-derived dataset",
        description="Synthetic class-structured codes (single- or multi-label, with a collision knob), presets "
        "(demo, flickr1m, nuswide, cifar, collisions), or scikit-learn's digits hashed with LSH, PCA-hashing or ITQ.",
    )
    p.add_argument("--preset", help="demo | flickr1m | nuswide | cifar | collisions | mirflickr25k-xm (cross-modal: "
                   "image and text codes, MIRFlickr-25K sizes)")
    p.add_argument("--digits", choices=["lsh", "pcah", "itq"], help="hash scikit-learn's digits with this method")
    p.add_argument("--features", choices=["lsh", "itq"],
                   help="Gaussian-mixture features (no labels) hashed with this method, for hashdist groundtruth")
    p.add_argument("--dim", type=int, help="feature dimensions with --features (default 128)")
    p.add_argument("--n-clusters", type=int, help="mixture components with --features (default 1000)")
    p.add_argument("--n-database", type=int, help="database items (default: the preset's)")
    p.add_argument("--n-queries", type=int, help="queries (default: the preset's)")
    p.add_argument("--nbits", type=int, help="bits per code (default: the preset's)")
    p.add_argument("--labels", choices=["class", "multilabel"], help="single-label classes or multi-label concepts "
                   "(default: the preset's)")
    p.add_argument("--n-classes", type=int, help="classes (with --labels class)")
    p.add_argument("--n-concepts", type=int, help="concepts (with --labels multilabel)")
    p.add_argument("--labels-per-item", type=float, help="mean concepts per item (with --labels multilabel)")
    p.add_argument("--noise", type=float, help="per-bit flip probability around the class centres")
    p.add_argument("--collision", type=float, help="fraction of items set exactly to their centre code")
    p.add_argument("--prototypes", type=int,
                   help="codes per class (centre plus noise) that every item copies: most items then share a few "
                   "codes, as with supervised models (the collisions preset: 200)")
    p.add_argument("--stray", type=float, help="with --prototypes: fraction of items with one random bit flipped")
    p.add_argument("--text-noise", type=float,
                   help="a cross-modal dataset: modalities image (the codes) and text (each image code with every "
                   "bit flipped again with this probability); the mirflickr25k-xm preset: 0.06")
    p.add_argument("--seed", type=int, default=0, help="seed of every random draw (default 0): the same seed, the "
                   "same dataset")
    p.add_argument("--chunk-rows", type=int, help="database rows per Zarr chunk (default 65536)")
    p.add_argument("--overwrite", action="store_true", help="replace what hashdist wrote at --out (a dataset, or with "
                   "--pooled a pooled directory; nothing else is ever replaced)")
    p.add_argument("--pooled", action="store_true",
                   help="write every item unsplit to --out DIR as codes.npy and labels.npy (for hashdist split "
                   "and ingest --splits); the size is --n-database plus --n-queries")
    p.add_argument("--splits", metavar="SPLITS.zarr",
                   help="with --digits: queries and database of one run of a `hashdist split` store of the digits' "
                   "labels, hashing learned on its training set")
    p.add_argument("--strategy", choices=["standard", "improved"], help="with --splits")
    p.add_argument("--run", type=int, help="with --splits: the run index")
    p.add_argument("--validation", action="store_true", help="with --splits: the validation pair")
    p.add_argument("--out", required=True, metavar="DATASET.zarr", help="the dataset to write (a Zarr directory; "
                   "with --pooled a directory of .npy files)")


# the options each source of data does not take (refused rather than ignored)
_SYNTHETIC_ONLY = ("labels", "n_classes", "n_concepts", "labels_per_item", "noise", "collision", "prototypes",
                   "stray", "text_noise")
_NOT_TAKEN_BY = {"digits": ("n_database", "dim", "n_clusters", "chunk_rows", *_SYNTHETIC_ONLY),
                 "features": ("pooled", *_SYNTHETIC_ONLY), None: ("dim", "n_clusters")}


def _check_synth_source(a) -> None:
    """One source of data (a preset and synthetic options, --digits or --features), and only its options."""
    sources = [name for name in ("preset", "digits", "features") if getattr(a, name)]
    if len(sources) > 1:
        raise InputError(f"--{sources[0]} and --{sources[1]}: give one source of data")
    source = next((name for name in sources if name != "preset"), None)
    for name in _NOT_TAKEN_BY[source]:
        if _given(a, name):
            rule = f"not with --{source}" if source else "only with --features"
            raise InputError(f"--{name.replace('_', '-')}: {rule}")


def _run_synth(a):
    _check_synth_source(a)
    if a.splits is not None and not a.digits:
        raise InputError("--splits goes with --digits")
    _check_split_options(a)
    if a.digits:
        return _synth_digits(a)
    if a.features:
        return _synth_features(a)
    return _synth_codes(a)


def _wrote_pooled(out: str, what: str) -> str:
    return f"wrote {os.path.join(out, 'codes.npy')} and {os.path.join(out, 'labels.npy')} ({what})"


def _synth_digits(a):
    """synth --digits: scikit-learn's digits hashed by --digits METHOD (pooled, one split run, or a fixed split)."""
    from hashdist.data import synth

    kwargs = {k: v for k, v in (("nbits", a.nbits), ("n_queries", a.n_queries)) if v is not None}
    if a.pooled:
        kwargs.pop("n_queries", None)
        synth.digits_pooled(a.out, method=a.digits, seed=a.seed, overwrite=a.overwrite, **kwargs)
        return _wrote_pooled(a.out, "1797 digits")
    if a.splits is not None:
        for option in ("strategy", "run"):
            if getattr(a, option) is None:
                raise InputError(f"--splits needs --{option}")
        kwargs.update(splits=a.splits, strategy=a.strategy, run=a.run, validation=a.validation)
    synth.digits_dataset(a.out, method=a.digits, seed=a.seed, overwrite=a.overwrite, **kwargs)
    return f"wrote {a.out}"


def _synth_features(a):
    """synth --features: real-valued features in clusters, with codes hashed from them."""
    from hashdist.data import synth

    names = ("n_database", "n_queries", "nbits", "dim", "n_clusters", "chunk_rows")
    kwargs = {k: getattr(a, k) for k in names if getattr(a, k) is not None}
    for name in ("n_database", "n_queries"):
        if name not in kwargs:
            raise InputError(f"--{name.replace('_', '-')} is required with --features")
    synth.features_dataset(a.out, method=a.features, seed=a.seed, overwrite=a.overwrite, **kwargs)
    return f"wrote {a.out}"


def _synth_codes(a):
    """synth [--preset NAME]: synthetic codes and labels, a preset's sizes overridden by the options given."""
    from hashdist.data import synth

    if a.preset is not None and a.preset not in synth.PRESETS:
        raise InputError(f"--preset {a.preset}: unknown preset (choose from {', '.join(synth.PRESETS)})")
    kwargs = dict(synth.PRESETS.get(a.preset, {}))
    for name in ("n_database", "n_queries", "nbits", "labels", "n_classes", "n_concepts", "labels_per_item",
                 "noise", "collision", "prototypes", "stray", "text_noise", "chunk_rows"):
        if getattr(a, name) is not None:
            kwargs[name] = getattr(a, name)
    for name in ("n_database", "n_queries"):
        if name not in kwargs:
            raise InputError(f"--{name.replace('_', '-')} is required without --preset")
    if a.pooled:
        if kwargs.get("text_noise") is not None:
            raise InputError("--pooled: not for a cross-modal dataset (--text-noise or the mirflickr25k-xm preset)")
        kwargs.pop("chunk_rows", None)
        n_items = kwargs.pop("n_database") + kwargs.pop("n_queries")
        synth.synth_pooled(a.out, n_items=n_items, seed=a.seed, overwrite=a.overwrite, **kwargs)
        return _wrote_pooled(a.out, f"{n_items} items")
    synth.synth_dataset(a.out, seed=a.seed, overwrite=a.overwrite, **kwargs)
    return f"wrote {a.out}"


def _add_execution_options(p):
    """Where blocks run (ExecutionOptions: engine, cluster, threads, cache)."""
    add_fields(p, ExecutionOptions)
    p.add_argument("--no-cache", action="store_true", help="compute every block, store nothing")


def _execution(a) -> ExecutionOptions:
    """The command line's ExecutionOptions (checked as it is made): one block cache choice, one cluster."""
    if a.cache is not None and a.no_cache:
        raise InputError("--cache and --no-cache: give one of them")
    return from_args(ExecutionOptions, a, cache=False if a.no_cache else a.cache,
                     cluster_kwargs=cluster_kwargs_option(getattr(a, "cluster_kwargs", None)),
                     progress=not getattr(a, "quiet", True))


def _add_evaluate(sub):
    p = sub.add_parser(
        "evaluate",
        help="compute every metric and write a report",
        description="Evaluate a dataset: a Prefect flow chunks the work across Dask workers (by default a local "
        "cluster, and a temporary Prefect API server that the command starts and stops itself; no server to start). "
        "Writes DIR/report.json, DIR/per_query.zarr and "
        "DIR/report.html and prints the metric table. Exit status: 0 done, 2 bad input (nothing written), 3 with "
        "--history when mAP dropped significantly against the previous recorded run (the report is written and the "
        "run recorded; the last line on stderr starts 'mAP dropped significantly:').",
    )
    p.add_argument("dataset", metavar="DATASET", help="a hashdist dataset (a Zarr directory made by hashdist "
                   "ingest or hashdist synth)")
    p.add_argument("--out", required=True, metavar="DIR", help="the report's directory: report.json, "
                   "per_query.zarr, report.html (replaced by a rerun)")
    add_fields(p, EvaluateOptions)
    _add_execution_options(p)
    p.add_argument("--no-html", action="store_true", help="skip report.html")
    p.add_argument("--json", action="store_true", help="print report.json instead of the table")
    p.add_argument("--overwrite", action="store_true", help="accepted for older scripts: a previous report at DIR "
                   "is replaced anyway, and nothing else ever is (docs/errors.md, Overwriting)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--history", metavar="HISTORY",
                   help="also append this run to the history store HISTORY (created if missing) and compare it with "
                   "the previous run on the queries both evaluated (paired sign-flip and t-tests); exit status 3 "
                   f"when mAP dropped significantly (randomisation p < {DEFAULT_ALPHA} and a lower mean AP). See "
                   "hashdist history")


def _run_evaluate(a):
    from hashdist.data.atomic import exclusive

    with exclusive(a.out):  # a second run into the same --out is refused, not interleaved
        return _evaluate_into(a)


def _check_evaluate(a):
    """--out, --history, the execution options, then the options against the dataset: the run, checked once."""
    from hashdist.defaults import cache_in_use
    from hashdist.report.evaluation import check_output_dir

    a.execution = _execution(a)
    check_output_dir(a.out, (a.dataset, a.bit_weights), cache_in_use(a.execution.cache))
    if a.history is not None:
        _check_history_option(a)
    a.options = from_args(EvaluateOptions, a)
    a.prepared = a.options.resolve_tasks(a.dataset)
    if a.history is not None and a.prepared[0].plan.task is not None:
        raise InputError(f"--history: not available for a dataset with modalities ({a.dataset}); record each task's "
                         "pair as its own dataset")


def _work_line(a) -> str:
    """What the run is about to do, in one line: the pairs, the code length, the blocks and where they run."""
    from hashdist.report.tasks import where_blocks_run, work_line

    execution = a.execution
    where = where_blocks_run(execution.engine, execution.address or os.environ.get("HASHDIST_DASK_ADDRESS"),
                             execution.cluster_class or os.environ.get("HASHDIST_CLUSTER_CLASS"))
    return work_line(a.prepared, where)


def _evaluate_into(a):
    import time

    from hashdist.progress import reporting

    started_at = time.time()
    if not a.json:  # the output's first line (stderr keeps one line for an error)
        print(_work_line(a), flush=True)
    with reporting(not a.quiet, _first_phase(a.execution), started_at):  # off a terminal: a line every 10 s
        evaluation = _evaluation(a, started_at)
    verdict = evaluation.verdict
    output = _evaluate_output(a, evaluation, verdict)
    if verdict is not None and verdict["flagged"]:
        raise _Dropped(output, verdict["message"])
    return output


def _first_phase(execution: ExecutionOptions) -> str:
    """What a command does before its blocks run: start its cluster, or (--engine local) load the dataset."""
    if execution.engine == "local":
        return "loading the dataset and compiling"
    address = execution.address or os.environ.get("HASHDIST_DASK_ADDRESS")
    return f"connecting to the cluster at {address}" if address else "starting the cluster (Prefect and Dask)"


def _evaluation(a, started_at: float):
    """The run of ``evaluate``, its report written (and recorded with --history)."""
    from hashdist.progress import Phases

    if a.execution.engine == "local":
        from hashdist.api import evaluate_runs

        evaluation = evaluate_runs(a.prepared, a.execution.cache, a.threads, not a.quiet, started_at)
        with Phases() as phases:
            phases.start("writing")
            evaluation.write(a.out, overwrite=a.overwrite, html=not a.no_html, started_at=started_at)
        if a.history is not None:
            from hashdist.compare.history import record

            evaluation.verdict = record(a.history, evaluation)
    else:
        from flows.evaluate import run_evaluation
        from hashdist.compare.history import SignificantDrop

        try:  # with --history the flow records the run and fails on a significant drop
            evaluation = run_evaluation(a.dataset, out=a.out, overwrite=a.overwrite, html=not a.no_html,
                                        history=a.history, options=a.options, execution=a.execution,
                                        prepared=a.prepared, started_at=started_at)
        except SignificantDrop as drop:
            evaluation = drop.evaluation
    return evaluation


def _check_history_option(a):
    """--history must be a history store, a missing path or an empty directory, and not inside --out (which a
    rerun replaces)."""
    from pathlib import Path

    from hashdist.compare.history import check_history_dir
    from hashdist.data.atomic import check_lock_path

    check_history_dir(a.history)
    check_lock_path(a.history)
    history, out = Path(a.history).absolute(), Path(a.out).absolute()
    if history == out or out in history.parents:
        raise InputError(f"--history {a.history}: inside --out {a.out}, which each run replaces; put the history "
                         "beside the reports")


def _evaluate_output(a, evaluation, verdict) -> str:
    from hashdist.report.evaluation import format_table, json_safe
    from hashdist.report.tasks import format_tasks_table, run_blocks

    out = a.out
    if a.json:
        return json.dumps(json_safe(evaluation.report), indent=2)
    r = evaluation.report
    blocks, timing = run_blocks(r), r["timing"]
    pairs = blocks.get("computed_pairs") or 0
    rate = (f"{pairs:.3g} pairs computed at {pairs / max(timing['compute_s'], 1e-9):.3g} pairs/s" if blocks["computed"]
            else "nothing to compute: every block came from the cache")
    tail = (f"\nblocks: {blocks['computed']} computed, {blocks['cached']} cached of {blocks['total']}; {rate}; "
            f"{timing['wall_s']:.2f} s in all\nreport: {out}/report.json"
            + ("" if a.no_html else f", {out}/report.html"))
    if verdict is not None:
        tail += f"\nhistory: {a.history}: {verdict['message']}"
    return (format_tasks_table(r) if "tasks" in r else format_table(r)) + tail


def _add_compare(sub):
    p = sub.add_parser(
        "compare",
        help="compare several code sets over the same queries and ground truth",
        description="Evaluate each NAME=DATASET (methods x bit lengths; NAME may carry an @TAG, e.g. itq@32, and "
        "methods sharing the part before @ are plotted against their bit length) and write DIR/comparison.json and "
        "DIR/comparison.html: a leaderboard, PR curves, code usage, and paired significance tests on per-query AP "
        "and LGAP with Holm's correction. Every dataset must have the same queries and ground truth. Repeated runs: "
        "NAME=DS1,DS2,... gives one dataset (split) per run; every method needs as many, run t of each with the "
        "same ground truth; each metric is reported per run and as mean, sample sd and 95% t interval over runs, "
        "and the tests pair run t with run t. Datasets with modalities (all or none): compared per task (--task, "
        "default the cross tasks image->text and text->image), each task as datasets without modalities; the paper "
        "tables then have a column group per task.",
    )
    p.add_argument("--method", action="append", required=True, metavar="NAME=DATASET[,DATASET...]",
                   help="a method's dataset, or one per run separated by commas (repeat; at least two methods, "
                   "each with the same number of runs)")
    p.add_argument("--out", required=True, metavar="DIR", help="the comparison's directory: comparison.json, "
                   "comparison.html and the leaderboard tables")
    add_fields(p, CompareOptions)
    add_fields(p, ExecutionOptions, skip=("address", "cluster_class", "cluster_kwargs", "workers", "threads"))
    p.add_argument("--no-cache", action="store_true", help="compute every block, store nothing")
    p.add_argument("--latex", action="store_true",
                   help="also write DIR/leaderboard.tex: the leaderboard as a LaTeX table for a paper (best in bold, "
                   "a dagger where the order depends on tie-breaking, the convention in the caption)")
    p.add_argument("--markdown", action="store_true", help="also write DIR/leaderboard.md, the same table in Markdown")
    p.add_argument("--overwrite", action="store_true", help="accepted for older scripts: a previous comparison at DIR "
                   "is replaced anyway, and nothing else ever is (docs/errors.md, Overwriting)")


def _check_compare(a):
    """Every --method's datasets (the same queries and ground truth), the options and --out: checked once."""
    from hashdist.compare.comparison import validate

    a.execution = _execution(a)
    a.options = from_args(CompareOptions, a)
    a.checked = validate(a.method, a.options, a.out, a.execution.cache)


def _run_compare(a):
    from hashdist.data.atomic import exclusive
    from hashdist.report.comparison import format_leaderboard

    tables = [kind for kind in ("latex", "markdown") if getattr(a, kind)]
    given = dict(out=a.out, overwrite=a.overwrite, tables=tables, options=a.options, checked=a.checked)
    with exclusive(a.out):
        if a.execution.engine == "local":
            from hashdist.api import compare

            comparison = compare(a.method, cache=a.execution.cache, **given)
        else:
            from flows.compare import run_comparison

            comparison = run_comparison(a.method, execution=a.execution, **given)
    written = ", ".join(comparison["outputs"].values())
    return f"{format_leaderboard(comparison)}\ncomparison: {written}"


def _add_groundtruth(sub):
    p = sub.add_parser(
        "groundtruth",
        help="ground truth from the dataset's features (epsilon ball or top percent)",
        description="Find each query's relevant database items from real-valued features (Euclidean distance, exact "
        "under ties) with a Prefect flow over Dask, and store them in the dataset as explicit ground truth "
        "(queries/relevant, replacing any previous one). epsilon_ball: distance <= epsilon, by default the mean "
        "distance of --sample database points to their --neighbors-th neighbour; top_percent: the --percent nearest.",
    )
    p.add_argument("dataset", metavar="DATASET", help="a hashdist dataset with features (hashdist ingest "
                   "--db-features --query-features, or hashdist synth --features)")
    add_fields(p, GroundTruthOptions)
    _add_execution_options(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _check_groundtruth(a):
    """The execution options, then the method's options against the dataset's features: checked once."""
    a.execution = _execution(a)
    a.options = from_args(GroundTruthOptions, a)
    a.prepared = a.options.resolve(a.dataset)


def _run_groundtruth(a):
    from hashdist.progress import reporting

    with reporting(a.execution.progress, _first_phase(a.execution)):  # off a terminal: a line every 10 s
        return _groundtruth(a)


def _groundtruth(a):
    execution = a.execution
    if execution.engine == "local":
        from hashdist.engine import groundtruth

        gt, run = groundtruth.run_local(*a.prepared, cache=execution.cache, threads=execution.threads,
                                        progress=execution.progress)
        summary = {**groundtruth.write(a.prepared[0], gt).attrs()["groundtruth"], **run}
    else:
        from flows.groundtruth import run_groundtruth

        summary = run_groundtruth(a.dataset, options=a.options, execution=execution, prepared=a.prepared)
    rule = f"epsilon {summary['epsilon']:.6g}" if a.method == "epsilon_ball" else f"k {summary['k']}"
    blocks = summary["blocks"]
    return (f"{a.method}: {rule}; {summary['relevant_pairs']} relevant pairs written to {a.dataset} "
            f"(queries/relevant; evaluate with --relevance explicit)\nblocks: {blocks['computed']} computed, "
            f"{blocks['cached']} cached")


def _add_split(sub):
    p = sub.add_parser(
        "split",
        help="seeded, class-balanced dataset splits for repeated runs; --check: check a paper's split index files",
        description="Draw, for each of --runs runs, disjoint sets of item indices from one pooled dataset of N items "
        "(docs/metrics.md, section 5b) and store them as a Zarr group, for ingest --splits. standard: test queries, "
        "every other item as the database, and from the database validation queries, a validation database and a "
        "training set; improved: test queries, test database, validation queries, validation database and training, "
        "pairwise disjoint. Every set is balanced over the classes (multi-hot labels: each item's first label); "
        "training takes what is left unless --training sizes it. Run t depends only on the inputs, --seed, t, the "
        "strategy and numpy's PCG64. With --check, read the query, database and training index files a paper ships "
        "instead and report, with counts, duplicates, out-of-range indices, queries in the database (a leak), "
        "training items inside or outside the database against --protocol, the set sizes against --protocol and "
        "the items per class or label in each set; nothing is written. Exit status: 0 done (--check: every rule "
        "kept); 2 bad input, one line on stderr (nothing written); 3 with --check when a rule is broken (the report "
        "is printed, the broken rules on stderr).",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument("--labels", metavar="ALL_LABELS.npy",
                        help="labels of all N items: 1-D integer classes or 2-D 0/1 multi-hot (--check: for the "
                        "range check and the items per class or label)")
    source.add_argument("--n-items", type=int, metavar="N", help="N items without labels (uniform draws, N "
                        "at most 2^30; --check: the pool size for the range check)")
    p.add_argument("--strategy", nargs="+", metavar="NAME",
                   help="standard and/or improved (default both, or the protocol's)")
    p.add_argument("--protocol", metavar="NAME",
                   help="a literature protocol's strategy and sizes, with no validation sets unless sized (--check: "
                   "its set sizes and where its training set lies): " + ", ".join(x.name for x in PROTOCOLS)
                   + " (docs/protocols.md)")
    p.add_argument("--runs", type=int, help="number of runs T (default 10)")
    p.add_argument("--seed", type=int, help="default 0")
    for role, default in (("test-queries", "1000"), ("test-database", "5000; improved only"),
                          ("validation-queries", "1000; 0 for none"), ("validation-database", "5000; 0 for none"),
                          ("training", "what the other sets leave")):
        p.add_argument(f"--{role}", type=int, metavar="SIZE", help=f"set size (default {default})")
    p.add_argument("--overwrite", action="store_true", help="replace an existing splits store at --out")
    p.add_argument("--out", metavar="SPLITS.zarr", help="the splits store to write (for ingest --splits); required "
                   "unless --check")
    _add_split_check_options(p)


CHECK_ONLY = ("query_index", "db_index", "train_index", "index_base", "json")
DRAW_ONLY = ("strategy", "runs", "seed", "test_queries", "test_database", "validation_queries",
             "validation_database", "training", "out")


def _add_split_check_options(p):
    """The options of ``split --check`` (hashdist.data.splitcheck)."""
    p.add_argument("--check", action="store_true", help="check a shipped split (the index files below) instead of "
                   "drawing one; exit status 3 when a rule is broken")
    index = "FILE[:NAME]"
    for flag, what in (("--query-index", "query"), ("--db-index", "database"), ("--train-index", "training")):
        p.add_argument(flag, metavar=index, help=f"--check: the {what} indices into the pool: .npy, .npz:NAME, "
                       ".txt/.csv (integers) or .mat (FILE.mat:NAME names the variable; v7.3 files need h5py)"
                       + ("; optional" if what == "training" else ""))
    p.add_argument("--index-base", type=int, metavar="0|1", help="--check: 1 for MATLAB's 1-based indices "
                   "(default 0); the report says when the indices look 1-based")
    p.add_argument("--json", action="store_true", help="--check: print the report as one JSON document")


class _SplitRulesBroken(_Dropped):
    """``split --check`` found a broken rule: the report on stdout, the broken rules on stderr, exit status 3."""


def _refuse_mixed(a, names: tuple[str, ...], why: str) -> None:
    """InputError naming the first option of ``names`` given on the command line."""
    for name in names:
        value = getattr(a, name)
        if value is not None and value is not False:
            raise InputError(f"--{name.replace('_', '-')} {why}")


def _run_split(a):
    if a.check:
        return _run_split_check(a)
    from hashdist.data.splits import DEFAULT_SIZES, STRATEGIES, protocol_options, split

    _refuse_mixed(a, CHECK_ONLY, "goes with --check (checking a shipped split)")
    if a.labels is None and a.n_items is None:
        raise InputError("one of the arguments --labels --n-items is required to draw splits")
    if a.out is None:
        raise InputError("--out SPLITS.zarr is required to draw splits (or pass --check to check index files)")
    strategies = a.strategy or STRATEGIES
    sizes = {role: getattr(a, role) for role in DEFAULT_SIZES if getattr(a, role) is not None}
    if a.protocol is not None:
        preset = protocol_options(a.protocol)
        if a.strategy is not None and set(a.strategy) != set(preset["strategies"]):
            raise InputError(f"--strategy {' '.join(a.strategy)} does not go with --protocol {a.protocol} "
                             f"(a {preset['strategies'][0]} protocol)")
        strategies, sizes = preset["strategies"], {**preset["sizes"], **sizes}
    try:
        attrs = split(a.out, labels=a.labels, n_items=a.n_items, strategies=strategies,
                      runs=10 if a.runs is None else a.runs, seed=0 if a.seed is None else a.seed, sizes=sizes,
                      overwrite=a.overwrite)
    except InputError as exc:
        if a.protocol is None:
            raise
        raise InputError(f"{exc} (sizes from --protocol {a.protocol} where not given)") from None
    kind = {"class": "class labels", "multilabel": "balanced on first labels", "none": "no labels"}
    runs = f"{attrs['runs']} run{'s' if attrs['runs'] != 1 else ''}"
    lines = [f"wrote {a.out}: N = {attrs['n_items']} ({kind[attrs['label_kind']]}), {runs}, "
             f"seed {attrs['seed']}"]
    for name, entry in attrs["strategies"].items():
        unused = f" ({entry['unused']} items unused)" if entry["unused"] else ""
        lines.append(f"{name}: " + ", ".join(f"{role} {n}" for role, n in entry["sizes"].items()) + unused)
    return "\n".join(lines)


def _run_split_check(a):
    """``split --check``: the report (table or JSON); :class:`_SplitRulesBroken` when a rule is broken."""
    from hashdist.data.splitcheck import broken_summary, check_split, format_check

    _refuse_mixed(a, DRAW_ONLY, "draws splits and does not go with --check")
    if a.overwrite:
        raise InputError("--overwrite draws splits and does not go with --check (nothing is written)")
    if a.query_index is None or a.db_index is None:
        raise InputError("--check needs --query-index FILE and --db-index FILE (--train-index is optional)")
    if a.index_base not in (None, 0, 1):
        raise InputError(f"--index-base must be 0 or 1 (1 for MATLAB's 1-based indices), got {a.index_base}")
    report = check_split(a.query_index, a.db_index, a.train_index, labels=a.labels, n_items=a.n_items,
                         protocol=a.protocol, index_base=a.index_base or 0)
    output = json.dumps(report, indent=2) if a.json else format_check(report)
    if report["broken"]:
        raise _SplitRulesBroken(output, broken_summary(report))
    return output


def _add_history(sub):
    p = sub.add_parser(
        "history",
        help="the trend of the runs recorded with evaluate --history, and whether the latest got worse",
        description="Read the history store HISTORY (written by hashdist evaluate --history or the nightly "
        "deployment) and print one row per run: time, dataset fingerprint, mAP with its tie interval, mLGAP, the "
        "mean AP change against the previous run over the queries both evaluated, the paired sign-flip randomisation "
        "and t-test p-values, and the verdict (DROP: randomisation p < alpha and a lower mean AP; runs whose query "
        "set or settings differ are not comparable). Writes HISTORY/history.html (or --out): a captioned plot of mAP "
        "over the runs with its tie interval, and the table.",
    )
    p.add_argument("history", metavar="HISTORY", help="a history store written by evaluate --history")
    p.add_argument("--out", metavar="PAGE.html", help="where to write the page (default HISTORY/history.html): a new "
                   "file or a page this command wrote, outside the store")
    p.add_argument("--no-html", action="store_true", help="write no page")
    p.add_argument("--json", action="store_true", help="print the trend as JSON instead of the table")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help=f"significance level (default {DEFAULT_ALPHA})")
    p.add_argument("--min-drop", type=float, default=0.0,
                   help="flag only drops of mean AP larger than this (default 0: any significant drop)")
    p.add_argument("--permutations", type=int, default=DEFAULT_PERMUTATIONS,
                   help=f"sign-flip patterns per test (default {DEFAULT_PERMUTATIONS})")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED,
                   help=f"seed of the randomisation tests (default {DEFAULT_SEED})")


def _run_history(a):
    from pathlib import Path

    from hashdist.compare.history import check_history_dir, trend
    from hashdist.report.evaluation import json_safe
    from hashdist.report.history import DEFAULT_PAGE, check_history_page, format_trend, write_history_html

    check_history_dir(a.history, must_exist=True)
    page = None
    if not a.no_html:
        page = check_history_page(Path(a.out) if a.out else Path(a.history) / DEFAULT_PAGE, a.history)
    result = trend(a.history, alpha=a.alpha, permutations=a.permutations, seed=a.seed, min_drop=a.min_drop)
    if page is not None:
        write_history_html(page, result)
    if a.json:
        return json.dumps(json_safe({**result, "html": None if page is None else str(page)}), indent=2)
    return format_trend(result) + ("" if page is None else f"\npage: {page}")


def _add_search(sub):
    p = sub.add_parser(
        "search",
        help="a faiss binary index's lists of the queries (for evaluate --served)",
        description="Build a faiss binary index from its factory string (--index), train it on the dataset's "
        "database codes when it needs training, stream the database into it, and search the dataset's queries: the "
        "K nearest (--k, faiss's search) and/or every item within Hamming distance r, inclusive (--radius, faiss's "
        "range_search at r + 1). Writes DIR/NAME.npz per setting of the index's search parameter (--nprobe, "
        "--ef-search or --nflip; e.g. BIVF1024-nprobe16.npz) with I, D, the measured search time per query and the "
        "setting: the inputs of hashdist evaluate DATASET --served NAME=DIR/NAME.npz. Needs faiss "
        "(pip install 'hashdist[faiss]'). docs/served.md",
    )
    p.add_argument("dataset", metavar="DATASET", help="a hashdist dataset (a Zarr directory made by hashdist "
                   "ingest or hashdist synth)")
    p.add_argument("--out", required=True, metavar="DIR", help="the directory of the .npz files (an existing "
                   "one is replaced only if search wrote it, with --overwrite)")
    add_fields(p, SearchOptions)
    p.add_argument("--overwrite", action="store_true", help="replace DIR if search wrote it")
    p.add_argument("--json", action="store_true", help="print one JSON object per file written instead of the table")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _check_search(a):
    """The options, faiss, the index's factory string and settings against the dataset, and --out: checked once."""
    from hashdist.served.search import prepare

    a.options = from_args(SearchOptions, a)
    a.prepared = prepare(a.dataset, a.options, a.out, a.overwrite)


def _run_search(a):
    from hashdist.served.search import format_summaries, run_search

    summaries = run_search(a.prepared, a.out, overwrite=a.overwrite, progress=not a.quiet)
    if a.json:
        return json.dumps(summaries, indent=2)
    return (f"{format_summaries(summaries, a.options)}\nwritten to {a.out}; evaluate with hashdist evaluate "
            f"{a.dataset} --served NAME={a.out}/FILE.npz ...")


COMMANDS = {"ingest": (_add_ingest, _run_ingest), "synth": (_add_synth, _run_synth),
            "evaluate": (_add_evaluate, _run_evaluate), "compare": (_add_compare, _run_compare),
            "groundtruth": (_add_groundtruth, _run_groundtruth),
            "split": (_add_split, _run_split), "history": (_add_history, _run_history),
            "search": (_add_search, _run_search)}

# Checks of a command's whole input, run before anything else: before a flow command loads Prefect (2 to 3 s),
# so bad input fails as fast with the default engine as with --engine local. The flows check again before their
# cluster starts, for callers of the Python API.
CHECKS = {"evaluate": _check_evaluate, "compare": _check_compare, "groundtruth": _check_groundtruth,
          "search": _check_search}


DEBUG_HELP = "show tracebacks, and the log lines of a Dask cluster the run starts"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hashdist", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    parser.add_argument("--version", action=_Version, help="print the versions of hashdist, numpy, numba, zarr, "
                        "Prefect and Dask, and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (add, _) in COMMANDS.items():
        add(sub)
        # after the command too (hashdist evaluate ... --debug); unset there, the value before it stands
        sub.choices[name].add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                                       help=DEBUG_HELP)
    return parser


def main(argv=None, server=None, collector_paused: bool = False) -> int:
    """The command line; ``server``: a temporary Prefect API server already started for a flow run
    (``hashdist.cli.launch``), stopped here if the command does not run a flow; ``collector_paused``: the
    caller turned Python's garbage collector off while modules load, to be turned on when the command starts."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already reported in one line
        if server is not None:
            server.stop()
        return int(exc.code or 0)
    # Prefect's INFO lines would drown the table; PREFECT_LOGGING_LEVEL still wins when set. A flow run's own log
    # (Prefect's run logger: hashdist's lines and Prefect's) still goes to the API at INFO, for an operator watching
    # the run in Prefect's UI: its records reach the console handler, which shows only warnings (hashdist's records
    # never: flows.runtime.cli_run)
    if "PREFECT_LOGGING_LEVEL" not in os.environ:
        os.environ["PREFECT_LOGGING_LEVEL"] = "WARNING"
        os.environ.setdefault("PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL", "INFO")
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
    with SignalWatch() as signals:
        try:
            message = _run(args, server, collector_paused)
        except _Dropped as exc:  # evaluate --history: the report is written, the run recorded
            print(exc.output)
            sys.stderr.write(f"{exc.message}\n")
            return 3
        except InputError as exc:
            if args.debug:  # the traceback, then the same line and exit status
                import traceback

                traceback.print_exc()
            one_line = str(exc).replace("\r", "\\r").replace("\n", "\\n")  # a name that carried a newline
            sys.stderr.write(f"hashdist {args.command}: error: {one_line}\n")
            return exc.exit_status
        except BaseException as exc:
            if (ending := signals.ending(exc)) is None:
                raise
            status, word = ending
            sys.stderr.write(f"hashdist: {word}\n")
            return status
        print(message)
        if (ending := signals.ending()) is not None:  # the signal came as the run finished: its outputs stand
            status, word = ending
            sys.stderr.write(f"hashdist: {word} after the command had finished\n")
            return status
    return 0


def _run(args, server, collector_paused: bool = False) -> str:
    """Runs the parsed command, the flow commands with Prefect set up (and the temporary API server); a paused
    garbage collector (see :func:`main`) is turned back on just before the command runs, what was loaded frozen."""
    with contextlib.ExitStack() as stack:
        if args.command in CHECKS:
            CHECKS[args.command](args)
        if getattr(args, "engine", None) == "flow":
            from flows.apiserver import TemporaryAPIServer

            # unless $PREFECT_API_URL names a server, a temporary API server boots while Prefect and Dask load here
            # (runtime.cli_run stops it if Prefect's profile names one)
            if server is None and not os.environ.get("PREFECT_API_URL"):
                server = TemporaryAPIServer()
            from flows import runtime  # importing it sets hashdist's Prefect defaults before Prefect loads

            plots = getattr(args, "out", None) is not None and not getattr(args, "no_html", False)
            stack.enter_context(runtime.cli_run(debug=args.debug, server=server, plots=plots))
        elif server is not None:
            server.stop()
        if collector_paused:
            gc.freeze()
            gc.enable()
        return COMMANDS[args.command][1](args)


def console(server=None, collector_paused: bool = False) -> int:
    """:func:`main` as a process's entry point: once a signal has ended the command, the process is gone
    within EXIT_GRACE_S, even if a thread the run left behind never ends (not done by :func:`main`, which
    other programs call). At exit the collector's heap is frozen: the interpreter's last collection would
    otherwise walk every object the command left (about 0.15 s of a 1 s command)."""
    atexit.register(gc.freeze)
    status = main(server=server, collector_paused=collector_paused)
    if status in EXIT_STATUS.values():
        exit_within(EXIT_GRACE_S, status)
    return status


if __name__ == "__main__":
    sys.exit(console())
