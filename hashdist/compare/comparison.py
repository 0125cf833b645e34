"""Compare several code sets (methods x bit lengths) over the same queries and ground truth.

A method is given as ``NAME=DATASET``, or with repeated runs as ``NAME=DS1,DS2,...``: one
dataset per run t = 1..T (each run a split of one pooled dataset, docs/metrics.md 5b; paths
cannot contain commas). ``NAME`` is letters, digits and ``_.+-``, optionally followed by ``@``
and a tag: methods sharing the part before ``@`` form one group (``itq@32``, ``itq@64``), whose
bit lengths, read from each dataset's ``nbits``, give the x axis of the metric-against-bit-length
plots. Every method has the same number of runs, and the runs of a method share their code
length and relevance kind.

Run t of every dataset must have the same queries' ground truth as run t of the others (runs
are never compared with each other): the same number of queries and database items, the same
relevance kind, and identical label arrays (or explicit relevance lists), checked by their
fingerprints. Each dataset is evaluated once; the comparison is then built from the
evaluations alone. With one run (T = 1):

- ``methods[NAME]``: dataset, group, nbits, fingerprint, its report's ``metrics``, bootstrap
  95% percentile intervals ``map_ci`` and ``mlgap_ci`` (per-query AP expected and LGAP at the
  largest radius, resampled over the evaluated queries), and code usage.
- ``pairs["A|B"]``: a list with one dict per metric (``ap``: per-query AP under the
  expected tie policy; ``lgap``: per-query LGAP at the largest radius) holding
  ``mean_diff`` (mean of A - B), the paired t-test p-value ``t_pvalue``, the seeded
  sign-flip randomisation p-value ``randomization_pvalue`` = (1 + #{|mean| >= observed})
  / (P + 1), and Holm's step-down adjustment across all pairs of that metric, of the
  randomisation p-value (``holm_adjusted``) and of the t-test p-value (``t_holm_adjusted``).
- ``map_order_depends_on_ties``: pairs whose mAP intervals [worst, best] overlap, so
  that some tie-breaking rule ranks them either way.
- ``ranking`` by expected mAP; ``queries {total, evaluated}``; ``parameters``.

With repeated runs (T > 1) the run is the unit of the statistics:

- ``methods[NAME]``: group, nbits, ``runs`` (one ``{dataset, fingerprint, metrics, map_ci,
  mlgap_ci, code_usage}`` per run, as above) and ``over_runs {label: {values, mean, sd, ci}}``
  for the headline measures (``headline_rows`` labels, expected over tie orders, radius
  measures at the largest radius) and ``mAP worst`` / ``mAP best``: each run's value, the mean,
  the sample sd and the 95% t interval over runs (``hashdist.metrics.stats.t_interval``). There is no
  method-level ``dataset``, ``fingerprint``, ``metrics``, ``map_ci``, ``mlgap_ci`` or
  ``code_usage``: they belong to a run.
- ``pairs["A|B"]``: the same dicts, with metric ``map`` (each run's mAP, expected) and
  ``mlgap`` (each run's mLGAP at the largest radius), run t of A paired with run t of B: the
  paired t-test over the T runs and the sign-flip test over runs, exact (all 2^T sign
  patterns, p = #{|mean| >= observed} / 2^T) when 2^T <= P, else sampled as above; Holm across
  pairs as above. These replace the per-query tests: pooling queries of different splits would
  ignore the variation between splits, which repeated runs exist to measure. With few runs the
  sign-flip test cannot be small (T = 5: p >= 1/16).
- ``map_order_depends_on_ties``: pairs whose intervals [mean worst, mean best] overlap.
- ``ranking`` by mean expected mAP; ``queries {total, evaluated}`` hold one count per run;
  ``parameters`` adds ``runs`` (T), ``paired_over: "runs"`` and ``exact_randomization``, and
  ``ground_truth`` holds one digest per run.

Every method uses the same evaluated queries in a run: those with at least one relevant item.

Datasets with modalities (cross-modal retrieval, docs/cross-modal.md): every method's datasets have them (a
mix with datasets without modalities is refused), and the comparison runs per task ``a->b`` (``--task``, default
the datasets' cross tasks, which must then be the same for all). The ground truth is checked once (the labels
are the pair's); each task's comparison is the one above of the datasets' task views, and the document is
``{"format", "tasks": {task: comparison}, "task_order": [task, ...], "provenance", "outputs"}``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from itertools import combinations
from typing import NamedTuple

import numpy as np

from hashdist.data.dataset import Dataset, chunk_digest, combine_digests, open_dataset, parse_task
from hashdist.defaults import cache_in_use
from hashdist.errors import InputError
from hashdist.metrics.registry import AP_EXPECTED, BY_KEY, headline_rows, per_query_key
from hashdist.metrics.stats import (
    bootstrap_ci,
    exact_randomization_pvalue,
    holm,
    paired_t_pvalue,
    randomization_pvalue,
    t_interval,
)
from hashdist.options import CompareOptions, PreparedRun
from hashdist.report.comparison import (
    COMPARISON_MARKER,
    check_comparison_dir,
    map_interval,
    per_run_labels,
)

_NAME = re.compile(r"[A-Za-z0-9_.+-]+(@[A-Za-z0-9_.+-]+)?")  # the whole name (fullmatch: no trailing newline)


def _per_query_values(r: int) -> dict[str, str]:
    """The per-query values paired between methods: AP (expected) and LGAP at radius r."""
    return {"ap": AP_EXPECTED,
            "lgap": per_query_key(BY_KEY["mlgap_at_radius"], r)}



@dataclass(frozen=True)
class Method:
    name: str
    dataset: str  # as given: one dataset, or one per run separated by commas

    @property
    def group(self) -> str:
        return self.name.split("@")[0]

    @property
    def runs(self) -> tuple[str, ...]:
        return tuple(self.dataset.split(","))

    def where(self, t: int) -> str:
        """How error messages name run t (0-based) of this method."""
        if len(self.runs) == 1:
            return f"--method {self.name}={self.dataset}"
        return f"--method {self.name} run {t} ({self.runs[t]})"


def _runs(n: int) -> str:
    return f"{n} run" + ("s" if n != 1 else "")


def parse_methods(specs) -> list[Method]:
    """``NAME=DATASET[,DATASET...]`` strings to methods; at least two, names unique, the same number of runs."""
    methods = []
    for spec in specs:
        name, sep, dataset = str(spec).partition("=")
        if not sep or not dataset:
            raise InputError(f"--method {spec}: expected NAME=DATASET, or NAME=DATASET,DATASET,... (one per run)")
        if not _NAME.fullmatch(name):
            shown = spec if str(spec).isprintable() else repr(str(spec))
            raise InputError(f"--method {shown}: NAME must be letters, digits or _.+- with an optional @TAG")
        if any(m.name == name for m in methods):
            raise InputError(f"--method {spec}: the name {name} is used twice")
        method = Method(name, dataset)
        if not all(method.runs):
            raise InputError(f"--method {spec}: an empty dataset among its runs (one dataset per comma)")
        if methods and len(method.runs) != len(methods[0].runs):
            raise InputError(f"--method {spec}: {_runs(len(method.runs))}, but {methods[0].name} has "
                             f"{_runs(len(methods[0].runs))}; methods are compared run by run, so all need as many "
                             "datasets")
        methods.append(method)
    if len(methods) < 2:
        raise InputError("--method: give at least two methods to compare")
    return methods


# -- same ground truth ---------------------------------------------------------


def _ground_truth_arrays(ds: Dataset) -> list[str]:
    if ds.default_relevance == "explicit":
        names = ("queries/relevant/indptr", "queries/relevant/indices", "queries/relevant/grades")
        return [n for n in names if ds.has(n)]
    return ["queries/labels", "database/labels"]


def _content_digest(ds: Dataset, name: str) -> str:
    """The array's rows themselves, whatever their chunking."""
    return chunk_digest(ds.read(name, 0, ds.fingerprints[name].rows))


def _check_same(what: str, ds: Dataset, ref: Dataset) -> None:
    for label, a, b in (("queries", ds.n_queries, ref.n_queries), ("database items", ds.n_database, ref.n_database),
                        ("relevance", ds.default_relevance, ref.default_relevance)):
        if a != b:
            raise InputError(f"{what} in {label} ({a} vs {b}); compare needs the same queries and ground truth")
    names = _ground_truth_arrays(ref)
    if _ground_truth_arrays(ds) != names:
        raise InputError(f"{what} in its ground truth arrays; compare needs the same queries and ground truth")
    for name in names:
        fa, fb = ds.fingerprints[name], ref.fingerprints[name]
        same = fa.digest == fb.digest or (
            fa.chunk_rows != fb.chunk_rows and _content_digest(ds, name) == _content_digest(ref, name)
        )
        if not same:
            raise InputError(f"{what} in {name}; compare needs the same queries and ground truth")


def check_same_ground_truth(methods: list[Method], datasets: list[list[Dataset]]) -> None:
    """Refuse a run t whose queries, database size, relevance kind or ground truth differ from the first
    method's run t (``datasets[i][t]``: method i's run t), and runs of one method with other code lengths or
    relevance kinds than its first run."""
    for method, runs in zip(methods, datasets, strict=True):
        for t, ds in enumerate(runs[1:], 1):
            for label, a, b in (("bits", ds.nbits, runs[0].nbits),
                                ("relevance", ds.default_relevance, runs[0].default_relevance)):
                if a != b:
                    raise InputError(f"{method.where(t)}: {label} {a}, but run 0 has {b}; the runs of a method "
                                     "are splits of one dataset")
    first = methods[0]
    for method, runs in zip(methods[1:], datasets[1:], strict=True):
        for t, (ds, ref) in enumerate(zip(runs, datasets[0], strict=True)):
            run = f" run {t}" if len(runs) > 1 else ""
            _check_same(f"{method.where(t)}: differs from {first.name}{run}", ds, ref)


def open_methods(specs) -> tuple[list[Method], list[list[Dataset]]]:
    """Parse, open and check the methods (all bad input fails here, before any evaluation); the datasets of
    each method's runs."""
    methods = parse_methods(specs)
    datasets = []
    for m in methods:
        runs = []
        for t, path in enumerate(m.runs):
            try:
                runs.append(open_dataset(path))
            except InputError as exc:
                where = f"--method {m.name}" + (f" run {t}" if len(m.runs) > 1 else "")
                raise InputError(f"{where}: {exc}") from None
        datasets.append(runs)
    check_same_kind(methods, datasets)
    check_same_ground_truth(methods, datasets)
    return methods, datasets


# -- building the comparison ---------------------------------------------------------


def _evaluated_mask(evaluations) -> np.ndarray:
    """Queries with relevant items (identical for every method) whose AP is defined for all."""
    mask = np.ones(len(evaluations[0].per_query["relevant"]), bool)
    for ev in evaluations:
        mask &= (ev.per_query["relevant"] > 0) & np.isfinite(ev.per_query[_per_query_values(0)["ap"]])
    return mask


def _pair_tests(names: list[str], values: dict, randomization) -> dict[str, list[dict]]:
    """``pairs`` from {name: {metric: paired values}}; ``randomization(a, b)`` gives the sign-flip p-value."""
    pair_names = list(combinations(names, 2))
    pairs = {f"{a}|{b}": [] for a, b in pair_names}
    for metric in values[names[0]]:
        rows = []
        for a, b in pair_names:
            va, vb = values[a][metric], values[b][metric]
            rows.append({
                "metric": metric,
                "mean_diff": float(np.mean(va - vb)) if len(va) else math.nan,
                "t_pvalue": paired_t_pvalue(va, vb),
                "randomization_pvalue": randomization(va, vb),
            })
        for row, adj, t_adj in zip(rows, holm([x["randomization_pvalue"] for x in rows]),
                                   holm([x["t_pvalue"] for x in rows]), strict=True):
            row["holm_adjusted"], row["t_holm_adjusted"] = adj, t_adj
        for (a, b), row in zip(pair_names, rows, strict=True):
            pairs[f"{a}|{b}"].append(row)
    return pairs


def _over_runs(runs: list[dict], r: int) -> dict[str, dict]:
    """{label: {values, mean, sd, ci}} over the runs: headline measures (expected), then mAP worst and best."""
    per_run = []
    for run in runs:
        mp = run["metrics"]["map"]
        per_run.append({"mAP": mp["expected"], "mAP worst": mp["worst"], "mAP best": mp["best"],
                        **{label: v["expected"] for label, v in headline_rows(run["metrics"], r, exclude=("map",))}})
    out = {}
    for label in per_run[0]:
        values = [v[label] for v in per_run]
        mean, sd, lo, hi = t_interval(values)
        out[label] = {"values": values, "mean": mean, "sd": sd, "ci": [lo, hi]}
    return out


def build_comparison(methods, datasets, evaluations, options: CompareOptions) -> tuple[dict, dict]:
    """(comparison document, {name: [bucket sizes of each run]} for the occupancy plot) from finished
    evaluations; ``datasets[i][t]`` and ``evaluations[i][t]`` are method i's run t."""
    k, radius, permutations, bootstrap, seed = (options.k, options.radius, options.permutations, options.bootstrap,
                                                options.seed)
    r = max(radius)
    n_runs = len(methods[0].runs)
    masks = [_evaluated_mask([evs[t] for evs in evaluations]) for t in range(n_runs)]
    per_query, runs, occupancy = {}, {}, {}
    for m, dss, evs in zip(methods, datasets, evaluations, strict=True):
        per_query[m.name] = [{metric: np.asarray(ev.per_query[key], float)[mask]
                              for metric, key in _per_query_values(r).items()}
                             for ev, mask in zip(evs, masks, strict=True)]
        runs[m.name] = [{"dataset": path, "fingerprint": ds.fingerprint, "metrics": ev.report["metrics"],
                         "map_ci": bootstrap_ci(v["ap"], bootstrap, seed),
                         "mlgap_ci": bootstrap_ci(v["lgap"], bootstrap, seed), "code_usage": ev.report["code_usage"]}
                        for path, ds, ev, v in zip(m.runs, dss, evs, per_query[m.name], strict=True)]
        occupancy[m.name] = [ev.bucket_sizes for ev in evs]
    names = [m.name for m in methods]
    parameters = {"k": list(k), "radius": list(radius), "lgap_radius": r,
                  "permutations": permutations, "bootstrap": bootstrap, "seed": seed,
                  "relevance": datasets[0][0].default_relevance}
    if n_runs == 1:
        out_methods = {m.name: {"dataset": m.dataset, "group": m.group, "nbits": dss[0].nbits,
                                **{key: v for key, v in runs[m.name][0].items() if key != "dataset"}}
                       for m, dss in zip(methods, datasets, strict=True)}
        pairs = _pair_tests(names, {n: v[0] for n, v in per_query.items()},
                            lambda a, b: randomization_pvalue(a, b, permutations, seed))
        queries = {"total": int(len(masks[0])), "evaluated": int(masks[0].sum())}
        parameters["ground_truth"] = _ground_truth_digest(datasets[0][0])
    else:
        out_methods = {m.name: {"group": m.group, "nbits": dss[0].nbits, "runs": runs[m.name],
                                "over_runs": _over_runs(runs[m.name], r)}
                       for m, dss in zip(methods, datasets, strict=True)}
        labels = per_run_labels(r)
        exact = 2**n_runs <= permutations
        pairs = _pair_tests(names, {n: {metric: np.asarray(m["over_runs"][label]["values"], float)
                                        for metric, label in labels.items()} for n, m in out_methods.items()},
                            exact_randomization_pvalue if exact
                            else lambda a, b: randomization_pvalue(a, b, permutations, seed))
        queries = {"total": [int(len(mask)) for mask in masks], "evaluated": [int(mask.sum()) for mask in masks]}
        parameters |= {"ground_truth": [_ground_truth_digest(ds) for ds in datasets[0]], "runs": n_runs,
                       "paired_over": "runs", "exact_randomization": exact}

    def overlap(a, b):
        (wa, _, ba), (wb, _, bb) = map_interval(out_methods[a]), map_interval(out_methods[b])
        return max(wa, wb) <= min(ba, bb)

    comparison = {
        "format": COMPARISON_MARKER,
        "methods": out_methods,
        "ranking": sorted(out_methods, key=lambda n: -map_interval(out_methods[n])[1]),
        "pairs": pairs,
        "map_order_depends_on_ties": [p for p in pairs if overlap(*p.split("|"))],
        "queries": queries,
        "parameters": parameters,
    }
    return comparison, occupancy


def _ground_truth_digest(ds: Dataset) -> str:
    return combine_digests(ds.fingerprints[n].digest for n in _ground_truth_arrays(ds))


class CheckedComparison(NamedTuple):
    """A comparison's inputs, checked: its methods, their runs' datasets, and each run checked for evaluation,
    by task (``runs[task][i][t]``: method i's run t; the one key None when the datasets have no modalities)."""

    methods: list[Method]
    datasets: list[list[Dataset]]
    runs: dict[str | None, list[list[PreparedRun]]]

    @property
    def tasks(self) -> tuple[str, ...]:
        """The tasks compared, in order (none for datasets without modalities)."""
        return tuple(task for task in self.runs if task is not None)


def _kind(ds: Dataset) -> str:
    if not ds.modalities:
        return "a dataset without modalities"
    names = dict.fromkeys(name for side in ds.modalities.values() for name in side)
    return f"a dataset with modalities ({', '.join(names)})"


def check_same_kind(methods: list[Method], datasets: list[list[Dataset]]) -> None:
    """Every dataset has modalities, or none has."""
    first, ref = datasets[0][0], methods[0]
    for method, runs in zip(methods, datasets, strict=True):
        for t, ds in enumerate(runs):
            if bool(ds.modalities) != bool(first.modalities):
                raise InputError(f"{method.where(t)} is {_kind(ds)}, but {ref.where(0)} is {_kind(first)}; "
                                 "compare datasets that all have modalities (cross-modal) or none")


def comparison_tasks(methods: list[Method], datasets: list[list[Dataset]], options: CompareOptions
                     ) -> tuple[str, ...]:
    """The tasks the comparison runs: none when the datasets have no modalities (checked by
    :func:`check_same_kind`), else ``--task`` or the datasets' cross tasks, which every dataset has."""
    first, ref = datasets[0][0], methods[0]
    if not first.modalities:
        if options.tasks:
            raise InputError(f"--task {options.tasks[0]}: the methods' datasets have no modalities (e.g. "
                             f"{first.url}); --task is for datasets with modalities")
        return ()
    tasks = options.tasks or first.tasks
    for method, runs in zip(methods, datasets, strict=True):
        for t, ds in enumerate(runs):
            if not options.tasks and ds.tasks != first.tasks:
                raise InputError(f"{method.where(t)}: its tasks ({', '.join(ds.tasks)}) differ from "
                                 f"{ref.name}'s ({', '.join(first.tasks)}); name the tasks to compare with --task")
            for task in tasks:
                for side, name in zip(("queries", "database"), parse_task(task), strict=True):
                    if name not in ds.modalities[side]:
                        raise InputError(f"--task {task}: {method.where(t)} has no {side} modality {name!r} "
                                         f"(only {', '.join(ds.modalities[side])})")
    return tuple(tasks)


def validate(specs, options: CompareOptions, out=None, cache=False) -> CheckedComparison:
    """Check every input before anything is evaluated: the methods, their datasets (the same ground truth, once),
    the tasks of datasets with modalities, each dataset (each task's view) against the options, and ``out`` (apart
    from the datasets and from the block ``cache``, a setting as for :func:`hashdist.api.evaluate`)."""
    methods, datasets = open_methods(specs)
    tasks = comparison_tasks(methods, datasets, options)
    evaluate_options = options.evaluate_options
    if tasks:
        per_run = [[[evaluate_options.resolve(ds.for_task(task)) for task in tasks] for ds in dss] for dss in datasets]
        runs = {task: [[by_task[j] for by_task in method_runs] for method_runs in per_run]
                for j, task in enumerate(tasks)}
    else:
        runs = {None: [[evaluate_options.resolve(ds.url) for ds in dss] for dss in datasets]}
    if out is not None:
        check_comparison_dir(out, [ds.url for runs in datasets for ds in runs], cache_in_use(cache))
    return CheckedComparison(methods, datasets, runs)


def compare_checked(checked: CheckedComparison, options: CompareOptions, evaluate) -> tuple[dict, dict]:
    """(comparison document, occupancy) of checked inputs, each run evaluated by ``evaluate(run)``. Datasets with
    modalities: one comparison per task, built from the evaluations of the datasets' task views exactly as a
    comparison of datasets without modalities, in ``{"tasks": {task: comparison}, "task_order": [...]}``, and
    ``{task: occupancy}``."""
    if not checked.tasks:
        evaluations = [[evaluate(run) for run in runs] for runs in checked.runs[None]]
        return build_comparison(checked.methods, checked.datasets, evaluations, options)
    comparisons, occupancy = {}, {}
    for task in checked.tasks:
        runs = checked.runs[task]
        evaluations = [[evaluate(run) for run in method_runs] for method_runs in runs]
        datasets = [[run.ds for run in method_runs] for method_runs in runs]
        comparisons[task], occupancy[task] = build_comparison(checked.methods, datasets, evaluations, options)
    return {"format": COMPARISON_MARKER, "tasks": comparisons, "task_order": list(checked.tasks)}, occupancy
