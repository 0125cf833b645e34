"""Compare several code sets (methods x bit lengths) over the same queries and ground truth.

A method is given as ``NAME=DATASET``. ``NAME`` is letters, digits and ``_.+-``,
optionally followed by ``@`` and a tag: methods sharing the part before ``@`` form
one group (``itq@32``, ``itq@64``), whose bit lengths, read from each dataset's
``nbits``, give the x axis of the metric-against-bit-length plots.

Every dataset must have the same queries' ground truth: the same number of queries
and database items, the same relevance kind, and identical label arrays (or explicit
relevance lists), checked by their fingerprints. Each dataset is evaluated once;
the comparison is then built from the evaluations alone:

- ``methods[NAME]``: dataset, group, nbits, its report's ``metrics``, bootstrap 95%
  percentile intervals ``map_ci`` and ``mlgap_ci`` (per-query AP expected and
  LGAP at the largest radius, resampled over the evaluated queries), and code usage.
- ``pairs["A|B"]``: a list with one dict per metric (``ap``: per-query AP under the
  expected tie policy; ``lgap``: per-query LGAP at the largest radius) holding
  ``mean_diff`` (mean of A - B), the paired t-test p-value ``t_pvalue``, the seeded
  sign-flip randomisation p-value ``randomization_pvalue`` = (1 + #{|mean| >= observed})
  / (P + 1), and Holm's step-down adjustment across all pairs of that metric, of the
  randomisation p-value (``holm_adjusted``) and of the t-test p-value (``t_holm_adjusted``).
- ``map_order_depends_on_ties``: pairs whose mAP intervals [worst, best] overlap, so
  that some tie-breaking rule ranks them either way.

Every method uses the same evaluated queries: those with at least one relevant item.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from hashdist.compare_report import COMPARISON_MARKER, check_comparison_dir, write_comparison
from hashdist.dataset import Dataset, chunk_digest, combine_digests, open_dataset
from hashdist.defaults import DEFAULT_K, DEFAULT_RADII
from hashdist.errors import InputError
from hashdist.metrics.registry import BY_KEY, per_query_key
from hashdist.stats import bootstrap_ci, holm, paired_t_pvalue, randomization_pvalue

DEFAULT_PERMUTATIONS = 10000
DEFAULT_BOOTSTRAP = 2000
_NAME = re.compile(r"^[A-Za-z0-9_.+-]+(@[A-Za-z0-9_.+-]+)?$")


def _per_query_values(r: int) -> dict[str, str]:
    """The per-query values paired between methods: AP (expected) and LGAP at radius r."""
    return {"ap": per_query_key(BY_KEY["map"], policy="expected"),
            "lgap": per_query_key(BY_KEY["mlgap_at_radius"], r)}


@dataclass(frozen=True)
class Method:
    name: str
    dataset: str

    @property
    def group(self) -> str:
        return self.name.split("@")[0]


def parse_methods(specs) -> list[Method]:
    """``NAME=DATASET`` strings to methods; at least two, names unique."""
    methods = []
    for spec in specs:
        name, sep, dataset = str(spec).partition("=")
        if not sep or not dataset:
            raise InputError(f"--method {spec}: expected NAME=DATASET")
        if not _NAME.match(name):
            raise InputError(f"--method {spec}: NAME must be letters, digits or _.+- with an optional @TAG")
        if any(m.name == name for m in methods):
            raise InputError(f"--method {spec}: the name {name} is used twice")
        methods.append(Method(name, dataset))
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


def check_same_ground_truth(methods: list[Method], datasets: list[Dataset]) -> None:
    """Refuse datasets whose queries, database size, relevance kind or ground truth differ from the first's."""
    first, ref = methods[0], datasets[0]
    for method, ds in zip(methods[1:], datasets[1:], strict=True):
        what = f"--method {method.name}={method.dataset}: differs from {first.name}"
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


def open_methods(specs) -> tuple[list[Method], list[Dataset]]:
    """Parse, open and check the methods (all bad input fails here, before any evaluation)."""
    methods = parse_methods(specs)
    datasets = []
    for m in methods:
        try:
            datasets.append(open_dataset(m.dataset))
        except InputError as exc:
            raise InputError(f"--method {m.name}: {exc}") from None
    check_same_ground_truth(methods, datasets)
    return methods, datasets


# -- building the comparison ---------------------------------------------------------


def _evaluated_mask(evaluations) -> np.ndarray:
    """Queries with relevant items (identical for every method) whose AP is defined for all."""
    mask = np.ones(len(evaluations[0].per_query["relevant"]), bool)
    for ev in evaluations:
        mask &= (ev.per_query["relevant"] > 0) & np.isfinite(ev.per_query[_per_query_values(0)["ap"]])
    return mask


def build_comparison(methods, datasets, evaluations, *, k, radius, permutations=DEFAULT_PERMUTATIONS,
                     bootstrap=DEFAULT_BOOTSTRAP, seed=0) -> tuple[dict, dict]:
    """(comparison document, {name: sorted code counts} for the occupancy plot) from finished evaluations."""
    r = max(radius)
    mask = _evaluated_mask(evaluations)
    values = {
        m.name: {metric: np.asarray(ev.per_query[key], float)[mask] for metric, key in _per_query_values(r).items()}
        for m, ev in zip(methods, evaluations, strict=True)
    }
    out_methods, occupancy = {}, {}
    for m, ds, ev in zip(methods, datasets, evaluations, strict=True):
        usage = ev.report["code_usage"]
        occupancy[m.name] = np.sort(np.asarray(ev.code_counts))[::-1]
        out_methods[m.name] = {
            "dataset": m.dataset,
            "group": m.group,
            "nbits": ds.nbits,
            "fingerprint": ds.fingerprint,
            "metrics": ev.report["metrics"],
            "map_ci": bootstrap_ci(values[m.name]["ap"], bootstrap, seed),
            "mlgap_ci": bootstrap_ci(values[m.name]["lgap"], bootstrap, seed),
            "code_usage": usage,
        }
    pair_names = list(combinations([m.name for m in methods], 2))
    pairs = {f"{a}|{b}": [] for a, b in pair_names}
    for metric in _per_query_values(r):
        rows = []
        for a, b in pair_names:
            va, vb = values[a][metric], values[b][metric]
            rows.append({
                "metric": metric,
                "mean_diff": float(np.mean(va - vb)) if len(va) else math.nan,
                "t_pvalue": paired_t_pvalue(va, vb),
                "randomization_pvalue": randomization_pvalue(va, vb, permutations, seed),
            })
        for row, adj, t_adj in zip(rows, holm([x["randomization_pvalue"] for x in rows]),
                                   holm([x["t_pvalue"] for x in rows]), strict=True):
            row["holm_adjusted"], row["t_holm_adjusted"] = adj, t_adj
        for (a, b), row in zip(pair_names, rows, strict=True):
            pairs[f"{a}|{b}"].append(row)

    def overlap(a, b):
        ma, mb = out_methods[a]["metrics"]["map"], out_methods[b]["metrics"]["map"]
        return max(ma["worst"], mb["worst"]) <= min(ma["best"], mb["best"])

    comparison = {
        "format": COMPARISON_MARKER,
        "methods": out_methods,
        "ranking": sorted(out_methods, key=lambda n: -out_methods[n]["metrics"]["map"]["expected"]),
        "pairs": pairs,
        "map_order_depends_on_ties": [f"{a}|{b}" for a, b in pair_names if overlap(a, b)],
        "queries": {"total": int(len(mask)), "evaluated": int(mask.sum())},
        "parameters": {"k": list(k), "radius": list(radius), "lgap_radius": r, "micro_f_radius": r,
                       "permutations": permutations, "bootstrap": bootstrap, "seed": seed, "relevance":
                       datasets[0].default_relevance, "ground_truth": _ground_truth_digest(datasets[0])},
    }
    return comparison, occupancy


def _ground_truth_digest(ds: Dataset) -> str:
    return combine_digests(ds.fingerprints[n].digest for n in _ground_truth_arrays(ds))


def compare(specs, *, evaluate=None, k=DEFAULT_K, radius=DEFAULT_RADII, permutations=DEFAULT_PERMUTATIONS,
            bootstrap=DEFAULT_BOOTSTRAP, seed=0, cache=None, out=None, overwrite=False, tables=()) -> dict:
    """Evaluate every ``NAME=DATASET`` and compare them; with ``out``, write comparison.json and .html there
    (and ``tables``: "latex", "markdown", the leaderboard as a table for a paper).

    ``evaluate(dataset, k=..., radius=...)`` returns an :class:`hashdist.api.Evaluation`
    (default: :func:`hashdist.api.evaluate_local` with ``cache``).
    """
    from hashdist.api import evaluate_local

    methods, datasets = validate(specs, k=k, radius=radius, permutations=permutations, seed=seed, out=out,
                                 overwrite=overwrite)
    if evaluate is None:
        def evaluate(dataset, **options):
            return evaluate_local(dataset, cache=cache, **options)
    evaluations = [evaluate(m.dataset, k=list(k), radius=list(radius)) for m in methods]
    comparison, occupancy = build_comparison(methods, datasets, evaluations, k=k, radius=radius,
                                             permutations=permutations, bootstrap=bootstrap, seed=seed)
    if out is not None:
        write_comparison(out, comparison, occupancy, overwrite=overwrite, tables=tuple(tables))
    return comparison


def validate(specs, *, k, radius, permutations, seed, out, overwrite) -> tuple[list[Method], list[Dataset]]:
    """Check every input before anything is evaluated; returns the methods and their opened datasets."""
    from hashdist.api import prepare

    methods, datasets = open_methods(specs)
    for option, value, lo in (("--permutations", permutations, 1), ("--seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise InputError(f"{option} must be an integer >= {lo}, got {value}")
    for ds in datasets:
        prepare(ds.url, k=k, radius=radius)
    if out is not None:
        check_comparison_dir(out, overwrite)
    return methods, datasets


