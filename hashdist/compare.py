"""Compare several code sets (methods x bit lengths) over the same queries and ground truth.

A method is given as ``NAME=DATASET``. ``NAME`` is letters, digits and ``_.+-``,
optionally followed by ``@`` and a tag: methods sharing the part before ``@`` form
one group (``itq@32``, ``itq@64``), whose bit lengths, read from each dataset's
``nbits``, give the x axis of the metric-against-bit-length plots.

Every dataset must have the same queries' ground truth: the same number of queries
and database items, the same relevance kind, and identical label arrays (or explicit
relevance lists), checked by their fingerprints. Each dataset is evaluated once;
the comparison is then built from the evaluations alone:

- ``methods[NAME]``: dataset, group, nbits, the headline metrics, bootstrap 95%
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

import base64
import html
import io
import json
import math
import re
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import numpy as np

from hashdist.atomic import staged_directory
from hashdist.dataset import Dataset, chunk_digest, combine_digests, open_dataset
from hashdist.errors import InputError
from hashdist.report import json_safe

COMPARISON_MARKER = "hashdist-comparison"
DEFAULT_PERMUTATIONS = 10000
DEFAULT_BOOTSTRAP = 2000
METRICS = {"ap": "ap/expected", "lgap": "lgap_at_radius/{r}"}
_NAME = re.compile(r"^[A-Za-z0-9_.+-]+(@[A-Za-z0-9_.+-]+)?$")
_CHUNK = 500  # permutations or bootstrap resamples drawn at a time


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
    for method, ds in zip(methods[1:], datasets[1:]):
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


# -- paired statistics -----------------------------------------------------------


def paired_t_pvalue(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided paired t-test; when every difference is equal: 1 if they are 0, else 0."""
    from scipy.stats import ttest_rel

    d = np.asarray(a, float) - np.asarray(b, float)
    if len(d) < 2:
        return math.nan
    if np.all(d == d[0]):
        return 1.0 if d[0] == 0 else 0.0
    return float(ttest_rel(a, b).pvalue)


def randomization_pvalue(a: np.ndarray, b: np.ndarray, permutations: int, seed: int) -> float:
    """Two-sided paired sign-flip test of mean(a - b): (1 + #{|permuted mean| >= |observed|}) / (P + 1)."""
    d = np.asarray(a, float) - np.asarray(b, float)
    if len(d) == 0:
        return math.nan
    observed = abs(d.mean())
    tolerance = 1e-12 * np.abs(d).mean()  # equal sums computed in another order
    rng = np.random.default_rng(seed)
    at_least = 0
    for start in range(0, permutations, _CHUNK):
        signs = rng.integers(0, 2, (min(_CHUNK, permutations - start), len(d)), dtype=np.int8) * 2 - 1
        at_least += int((np.abs(signs @ d) / len(d) >= observed - tolerance).sum())
    return (1 + at_least) / (permutations + 1)


def holm(pvalues) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order (NaN stays NaN and is not counted)."""
    p = np.asarray(pvalues, float)
    valid = np.flatnonzero(~np.isnan(p))
    order = valid[np.argsort(p[valid], kind="stable")]
    adjusted = np.full(len(p), math.nan)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p[i]))
        adjusted[i] = running
    return adjusted.tolist()


def bootstrap_ci(values: np.ndarray, resamples: int, seed: int, level: float = 0.95) -> list[float]:
    """Percentile bootstrap interval of the mean: [lo, hi]."""
    v = np.asarray(values, float)
    if len(v) == 0:
        return [math.nan, math.nan]
    rng = np.random.default_rng(seed)
    means = np.concatenate([
        v[rng.integers(0, len(v), (min(_CHUNK, resamples - start), len(v)))].mean(axis=1)
        for start in range(0, resamples, _CHUNK)
    ])
    tail = (1 - level) / 2 * 100
    return np.percentile(means, [tail, 100 - tail]).tolist()


# -- building the comparison ---------------------------------------------------------


def _evaluated_mask(evaluations) -> np.ndarray:
    """Queries with relevant items (identical for every method) whose AP is defined for all."""
    mask = np.ones(len(evaluations[0].per_query["relevant"]), bool)
    for ev in evaluations:
        mask &= (ev.per_query["relevant"] > 0) & np.isfinite(ev.per_query["ap/expected"])
    return mask


def _headline(m: dict, ks, r: int) -> dict:
    k_keys = [str(k) for k in ks]
    return {
        "map": m["map"],
        "map_at_k": {k: m["map_at_k"][k]["retrieved"] for k in k_keys},
        "precision_at_k": {k: m["precision_at_k"][k] for k in k_keys},
        "ndcg_at_k": {k: m["ndcg_at_k"][k] for k in k_keys},
        "auc": m["auc"],
        "mlgap": m["mlgap_at_radius"][str(r)],
        "micro_at_radius": m["micro_at_radius"][str(r)],
        "auprc": m["auprc"],
        "pr_curve": m["pr_curve"],
    }


def build_comparison(methods, datasets, evaluations, *, k, radius, permutations=DEFAULT_PERMUTATIONS,
                     bootstrap=DEFAULT_BOOTSTRAP, seed=0) -> tuple[dict, dict]:
    """(comparison document, {name: sorted code counts} for the occupancy plot) from finished evaluations."""
    r = max(radius)
    mask = _evaluated_mask(evaluations)
    values = {
        m.name: {metric: np.asarray(ev.per_query[key.format(r=r)], float)[mask] for metric, key in METRICS.items()}
        for m, ev in zip(methods, evaluations)
    }
    out_methods, occupancy = {}, {}
    for i, (m, ds, ev) in enumerate(zip(methods, datasets, evaluations)):
        usage = ev.report["code_usage"]
        occupancy[m.name] = np.sort(np.asarray(ev.code_counts))[::-1]
        out_methods[m.name] = {
            "dataset": m.dataset,
            "group": m.group,
            "nbits": ds.nbits,
            "fingerprint": ds.fingerprint,
            **_headline(ev.report["metrics"], k, r),
            "map_ci": bootstrap_ci(values[m.name]["ap"], bootstrap, seed),
            "mlgap_ci": bootstrap_ci(values[m.name]["lgap"], bootstrap, seed),
            "code_usage": usage,
        }
    pair_names = list(combinations([m.name for m in methods], 2))
    pairs = {f"{a}|{b}": [] for a, b in pair_names}
    for metric in METRICS:
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
                                   holm([x["t_pvalue"] for x in rows])):
            row["holm_adjusted"], row["t_holm_adjusted"] = adj, t_adj
        for (a, b), row in zip(pair_names, rows):
            pairs[f"{a}|{b}"].append(row)

    def overlap(a, b):
        ma, mb = out_methods[a]["map"], out_methods[b]["map"]
        return max(ma["worst"], mb["worst"]) <= min(ma["best"], mb["best"])

    comparison = {
        "format": COMPARISON_MARKER,
        "methods": out_methods,
        "ranking": sorted(out_methods, key=lambda n: -out_methods[n]["map"]["expected"]),
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


def compare(specs, *, evaluate=None, k=(10, 100, 1000), radius=(0, 1, 2), permutations=DEFAULT_PERMUTATIONS,
            bootstrap=DEFAULT_BOOTSTRAP, seed=0, cache=None, out=None, overwrite=False) -> dict:
    """Evaluate every ``NAME=DATASET`` and compare them; with ``out``, write comparison.json and .html there.

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
        write_comparison(out, comparison, occupancy, overwrite=overwrite)
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


# -- output ------------------------------------------------------------------------


def check_comparison_dir(out, overwrite: bool) -> Path:
    """Refuse an existing directory that is not a previous comparison, unless overwrite."""
    out = Path(out)
    if out.exists() and not overwrite:
        marker = out / "comparison.json"
        try:
            ok = out.is_dir() and json.loads(marker.read_text()).get("format") == COMPARISON_MARKER
        except Exception:
            ok = False
        if not ok:
            raise InputError(
                f"{out}: exists and is not a hashdist comparison directory (pass --overwrite to replace it)"
            )
    return out


def write_comparison(out, comparison: dict, occupancy: dict, *, overwrite: bool = False) -> Path:
    """comparison.json and a self-contained comparison.html, replacing ``out`` atomically."""
    with staged_directory(check_comparison_dir(out, overwrite)) as tmp:
        out = Path(out)
        comparison["outputs"] = {"comparison_json": str(out / "comparison.json"),
                                 "comparison_html": str(out / "comparison.html")}
        (tmp / "comparison.json").write_text(json.dumps(json_safe(comparison), indent=2))
        (tmp / "comparison.html").write_text(render_html(comparison, plots(comparison, occupancy)))
    return out


def _f(x, digits=4) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _p(x) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"


def leaderboard_rows(comparison: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows (methods by expected mAP, best first); a * marks an mAP order that depends on ties."""
    p = comparison["parameters"]
    ks, r = [str(k) for k in p["k"]], p["lgap_radius"]
    tied = {n for pair in comparison["map_order_depends_on_ties"] for n in pair.split("|")}
    header = ["method", "bits", "mAP [worst, best]", "mAP 95% CI"]
    header += [f"mAP@{k}" for k in ks] + [f"P@{k}" for k in ks] + [f"NDCG@{k}" for k in ks]
    header += ["AUC", f"mLGAP@{r}", f"F@r={r}", "AUPRC"]
    rows = []
    for name in comparison["ranking"]:
        m = comparison["methods"][name]
        mp = m["map"]
        row = [name + (" *" if name in tied else ""), str(m["nbits"]),
               f"{_f(mp['expected'])} [{_f(mp['worst'])}, {_f(mp['best'])}]",
               f"[{_f(m['map_ci'][0])}, {_f(m['map_ci'][1])}]"]
        row += [_f(m["map_at_k"][k]["expected"]) for k in ks]
        row += [_f(m["precision_at_k"][k]["expected"]) for k in ks]
        row += [_f(m["ndcg_at_k"][k]["expected"]) for k in ks]
        row += [_f(m["auc"]), _f(m["mlgap"]), _f(m["micro_at_radius"]["f_beta"]), _f(m["auprc"]["step"])]
        rows.append(row)
    return header, rows


def format_leaderboard(comparison: dict) -> str:
    """The leaderboard and the significance of each pair as aligned text."""
    header, rows = leaderboard_rows(comparison)
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    lines = ["  ".join(x.ljust(w) for x, w in zip(line, widths)) for line in [header, *rows]]
    if comparison["map_order_depends_on_ties"]:
        lines.append("* mAP intervals overlap (order depends on tie-breaking): "
                     + ", ".join(comparison["map_order_depends_on_ties"]))
    lines.append("")
    lines.append(f"{'pair':<28}{'metric':<8}{'mean diff':>11}{'t p':>10}{'rand p':>10}{'Holm':>10}")
    for pair, entries in comparison["pairs"].items():
        for e in entries:
            lines.append(f"{pair:<28}{e['metric']:<8}{_f(e['mean_diff']):>11}{_p(e['t_pvalue']):>10}"
                         f"{_p(e['randomization_pvalue']):>10}{_p(e['holm_adjusted']):>10}")
    return "\n".join(lines)


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def plots(comparison: dict, occupancy: dict) -> dict[str, str]:
    """Base64 PNGs: overlaid PR curves, mAP and mLGAP against bit length, code occupancy, bit balance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = comparison["methods"]
    r = comparison["parameters"]["lgap_radius"]
    figs = {}

    fig, ax = plt.subplots(figsize=(5, 4))
    for name, m in methods.items():
        curve = m["pr_curve"]
        ax.plot([p["recall"] for p in curve], [p["precision"] for p in curve], marker="o", ms=2, label=name)
    ax.set(xlabel="recall (micro)", ylabel="precision (micro)", title="PR curves (Hamming radius 0..B)",
           xlim=(0, 1.02), ylim=(0, 1.02))
    ax.legend(fontsize=7)
    figs["pr_curves"] = fig

    groups: dict[str, list] = {}
    for name, m in methods.items():
        groups.setdefault(m["group"], []).append(m)
    lengths = {g: sorted(ms, key=lambda m: m["nbits"]) for g, ms in groups.items()
               if len({m["nbits"] for m in ms}) > 1}
    if lengths:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
        for g, ms in lengths.items():
            bits = [m["nbits"] for m in ms]
            axes[0].plot(bits, [m["map"]["expected"] for m in ms], marker="o", label=g)
            axes[1].plot(bits, [m["mlgap"] for m in ms], marker="o", label=g)
        axes[0].set(xlabel="bits", ylabel="mAP (expected)", title="mAP against bit length")
        axes[1].set(xlabel="bits", ylabel=f"mLGAP@{r}", title=f"mLGAP@{r} against bit length")
        for ax in axes:
            ax.legend(fontsize=7)
        figs["bit_length"] = fig

    fig, ax = plt.subplots(figsize=(5, 4))
    for name, sizes in occupancy.items():
        ax.plot(np.arange(1, len(sizes) + 1), sizes, drawstyle="steps-post", label=name)
    ax.set(xscale="log", yscale="log", xlabel="distinct codes, most used first", ylabel="database items with the code",
           title="code occupancy")
    ax.legend(fontsize=7)
    figs["code_occupancy"] = fig

    fig, ax = plt.subplots(figsize=(5, 4))
    for name, m in methods.items():
        balance = m["code_usage"]["bit_balance"]
        ax.plot(np.arange(len(balance)), balance, marker=".", lw=0.8, label=name)
    ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    ax.set(xlabel="bit", ylabel="fraction of database items with the bit set", title="bit balance", ylim=(0, 1))
    ax.legend(fontsize=7)
    figs["bit_balance"] = fig

    out = {name: _png(fig) for name, fig in figs.items()}
    for fig in figs.values():
        plt.close(fig)
    return out


def _table(header, rows) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(comparison: dict, images: dict[str, str]) -> str:
    methods, q = comparison["methods"], comparison["queries"]
    header, rows = leaderboard_rows(comparison)
    tied = comparison["map_order_depends_on_ties"]
    note = (f"<p>* mAP intervals overlap, so their order depends on tie-breaking: {html.escape(', '.join(tied))}</p>"
            if tied else "<p>No two methods' mAP intervals [worst, best] overlap.</p>")
    pair_rows = [[pair, e["metric"], _f(e["mean_diff"]), _p(e["t_pvalue"]), _p(e["randomization_pvalue"]),
                  _p(e["holm_adjusted"]), _p(e["t_holm_adjusted"])]
                 for pair, entries in comparison["pairs"].items() for e in entries]
    pair_header = ["pair A|B", "metric", "mean(A - B)", "t-test p", "randomisation p", "Holm (randomisation)",
                   "Holm (t)"]
    usage_rows = [[name, str(m["nbits"]), str(m["code_usage"]["distinct_codes"]), str(m["code_usage"]["max_bucket"]),
                   _f(m["code_usage"]["collision_fraction"]), _f(m["code_usage"]["entropy_bits"], 2),
                   _f(m["code_usage"]["entropy_ratio"])] for name, m in methods.items()]
    usage_header = ["method", "bits", "distinct codes", "largest bucket", "items sharing a code", "entropy (bits)",
                    "entropy / B"]
    datasets = "".join(f"<li><code>{html.escape(n)}</code>: <code>{html.escape(str(m['dataset']))}</code></li>"
                       for n, m in methods.items())
    imgs = "".join(
        f'<figure><img alt="{name}" src="data:image/png;base64,{data}"><figcaption>{name.replace("_", " ")}'
        "</figcaption></figure>"
        for name, data in images.items()
    )
    p = comparison["parameters"]
    body = (
        f"<h1>hashdist comparison</h1><ul>{datasets}</ul><p>{q['evaluated']} of {q['total']} queries evaluated "
        f"(those with relevant items). mAP and the @K columns are expectations over tie orders; mAP@K uses the "
        f"'retrieved' normaliser; mLGAP and micro F at radius {p['lgap_radius']}.</p>"
        f"<h2>Leaderboard</h2>{_table(header, rows)}{note}"
        f"<h2>Paired significance</h2><p>Per-query AP (expected) and LGAP@{p['lgap_radius']}; paired t-test and "
        f"sign-flip randomisation test ({p['permutations']} permutations, seed {p['seed']}); Holm's correction "
        f"across all pairs of a metric.</p>{_table(pair_header, pair_rows)}"
        f"<h2>Code usage</h2>{_table(usage_header, usage_rows)}<h2>Plots</h2>{imgs}"
    )
    style = ("body{font-family:sans-serif;max-width:1200px;margin:auto}figure{display:inline-block;margin:8px}"
             "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:2px 6px;"
             "font-size:13px;text-align:right}td:first-child{text-align:left}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>hashdist comparison</title><style>{style}"
            f"</style></head><body>{body}</body></html>")
