"""Every reported metric, declared once (docs/metrics.md defines them).

A :class:`Measure` names a metric's report key, its parameter (a cut-off K, a
cut-off N of the curves over N, a Hamming radius, a hashtable setting or none),
its variants (AP@K's normalisers), whether it has tie policies, its display label,
a one-line description, and the pure function that computes it: either per query
from the histogram (then the report holds its mean over the evaluated queries),
or from counts summed over the evaluated queries (micro measures), or from the
aggregated values of measures declared before it (the PR curve by rank). The
summary, the terminal and HTML tables, the comparison, Prefect artifacts and
per-query storage all read this table. Adding a metric means one :class:`Measure` and
its function here; its definition in docs/metrics.md and its key in docs/report.md;
an independent reference in tests/reference.py that tests/test_metrics_reference.py
compares it with; and, for a measure no table of hashdist.report.evaluation shows (a
per-K value without tie policies, a curve), a place there.

Report layout: ``metrics[key][str(parameter value)][variant][policy]``, each level
present only when the measure has it (``metrics.map.expected``,
``metrics.map_at_k["10"].retrieved.best``, ``metrics.auc``). Per-query arrays use
the same path joined by ``/``, named for the per-query value (``ap_at_k/10/retrieved/best``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hashdist.metrics import radius as rad
from hashdist.metrics import ranking as rk

POLICIES = rk.POLICIES


@dataclass(frozen=True)
class Measure:
    key: str
    label: str  # "{}" stands for the parameter value, e.g. "P@{}"
    description: str
    parameter: str | None = None  # "k", "cutoff" (the grid of N), "radius", "hashtable" or None
    variants: tuple[str, ...] = ()
    policies: tuple[str, ...] = ()  # POLICIES for order-dependent measures
    per_query: Callable | None = None  # (H, max_bucket, value, variant, policy) -> per-query array (NaN: undefined)
    from_totals: Callable | None = None  # (totals, value, params) -> number or dict, micro over evaluated queries
    from_metrics: Callable | None = None  # (metrics) -> value, from the aggregated values of measures before it
    fields: tuple[str, ...] = ()  # the fields of a dict value shown in tables
    queries: str = "evaluated"  # the mean runs over "evaluated" queries, or "with_irrelevant": those with 0 < R < Nall
    headline: bool = False  # a column of the comparison leaderboard and a row of the Prefect artifact
    headline_variant: str | None = None
    stored_per_query: bool = False  # written to per_query.zarr
    per_query_name: str = ""  # name of the per-query value when it differs from the mean's (AP for mAP)
    column: str = ""  # heading in a table with a row per parameter value (radius, hashtable setting)
    curve: bool = False  # a list of points, plotted rather than tabulated
    hamming: bool = False  # always over plain Hamming distances, whatever the ranking distance

    def values(self, params) -> tuple:
        """The parameter values a run reports: its K, its cut-offs N, its radii, its hashtable settings, or (None,)."""
        return {None: (None,), "k": params.ks, "cutoff": params.cutoffs, "radius": params.radii,
                "hashtable": params.hashtables}[self.parameter]

    def label_for(self, value=None, variant=None) -> str:
        text = self.label.format(value)
        return f"{text} ({variant})" if variant else text


def per_query_key(measure: Measure, value=None, variant=None, policy=None) -> str:
    """Name of a per-query array: the report path joined by '/'."""
    name = measure.per_query_name or measure.key
    return "/".join(str(p) for p in (name, value, variant, policy) if p is not None)


def lookup(metrics: dict, measure: Measure, value=None, variant=None):
    """The report's value of a measure at one parameter value and variant."""
    v = metrics[measure.key]
    if measure.parameter is not None:
        v = v[str(value)]
    return v[variant] if variant is not None else v


def _ranked(fn):
    return lambda H, M, k, variant, policy: fn(H, k, policy)


def _ap_at_k(H, M, k, normaliser, policy):
    return rk.average_precision_at_k(H, k, normaliser, policy)


def _micro(totals, r, params):
    return rad.micro_scores(int(totals["tp"][r]), int(totals["fp"][r]), int(totals["fn"][r]), params.beta)


def _hashtable(totals, setting, params):
    tp, retrieved = totals["hashtable"][setting]
    return rad.hashtable_metrics(tp, retrieved, totals["relevant"], params.beta)


def _pr_curve(totals, _, params):
    return rad.pr_curve_from_counts(totals["tp"], totals["fp"], totals["fn"], totals.get("bin_edges"))


def _auprc(totals, _, params):
    return rad.auprc(_pr_curve(totals, None, params))


def _retrieved_nothing(totals, r, params):
    return int(totals["empty"][r])


def _pr_curve_by_rank(metrics):
    """(R@N, P@N) at every cut-off N, the expected values, each macro over the evaluated queries as reported."""
    return [{"n": int(n), "precision": p["expected"], "recall": metrics["recall_at_n"][n]["expected"]}
            for n, p in metrics["precision_at_n"].items()]


MEASURES: tuple[Measure, ...] = (
    Measure("map", "mAP", "mean average precision over the full Hamming ranking", policies=POLICIES,
            per_query=lambda H, M, _, variant, policy: rk.average_precision(H, policy), headline=True,
            stored_per_query=True, per_query_name="ap"),
    Measure("map_at_k", "mAP@{}", "AP of the top K; normalised by the relevant items retrieved, min(K, R) or R",
            parameter="k", variants=rk.AP_AT_K_NORMALISERS, policies=POLICIES, per_query=_ap_at_k, headline=True,
            headline_variant="retrieved", per_query_name="ap_at_k"),
    Measure("precision_at_k", "P@{}", "relevant items in the top K, divided by K", parameter="k", policies=POLICIES,
            per_query=_ranked(rk.precision_at_k), headline=True, stored_per_query=True),
    Measure("recall_at_k", "R@{}", "relevant items in the top K, divided by R", parameter="k", policies=POLICIES,
            per_query=_ranked(rk.recall_at_k)),
    Measure("ndcg_at_k", "NDCG@{}", "graded NDCG of the top K: gain 2^g - 1, discount 1/log2(rank + 1)",
            parameter="k", policies=POLICIES, per_query=_ranked(rk.ndcg_at_k), headline=True, stored_per_query=True),
    Measure("ndcg_structhash_at_k", "NDCG-SH@{}", "StructHash's NDCG (eq. 21): binary gain, S(1) = 1, "
            "S(i) = 1/log2(i), over the sum of S(i) to K", parameter="k", policies=POLICIES,
            per_query=_ranked(rk.ndcg_structhash_at_k)),
    Measure("precision_at_n", "P@N={}", "P@K at every cut-off N of the grid: 1, 2, 5, 10, 20, 50, ... up to the "
            "database size, and every K", parameter="cutoff", policies=POLICIES, per_query=_ranked(rk.precision_at_k)),
    Measure("recall_at_n", "R@N={}", "R@K at every cut-off N of the grid", parameter="cutoff", policies=POLICIES,
            per_query=_ranked(rk.recall_at_k)),
    Measure("pr_curve_by_rank", "PR curve by rank", "the points (R@N, P@N) over the grid of N, expected over tie "
            "orders, macro over queries", from_metrics=_pr_curve_by_rank, curve=True),
    Measure("auc", "AUC", "fraction of (relevant, irrelevant) pairs ranked correctly; a tied pair counts 1/2 "
            "(expected), 1 (best) or 0 (worst)", policies=POLICIES,
            per_query=lambda H, M, _, variant, policy: rk.roc_auc(H, policy), queries="with_irrelevant",
            headline=True),
    Measure("precision_at_radius", "P@r={} (macro)", "relevant share of the items within radius r (0 if none)",
            parameter="radius", per_query=lambda H, M, r, variant, policy: rad.precision_at_radius(H, r),
            column="P (macro)"),
    Measure("recall_at_radius", "R@r={} (macro)", "share of the relevant items within radius r",
            parameter="radius", per_query=lambda H, M, r, variant, policy: rad.recall_at_radius(H, r),
            column="R (macro)"),
    Measure("micro_at_radius", "micro@r={}", "precision, recall and F-beta of the items within radius r, "
            "counts summed over queries", parameter="radius", from_totals=_micro,
            fields=("precision", "recall", "f_beta"), column="micro", headline=True),
    Measure("map_at_radius", "mAP@r={}", "AP of the items within radius r, normalised by the relevant items among "
            "them (0 if none)", parameter="radius", policies=POLICIES,
            per_query=lambda H, M, r, variant, policy: rk.average_precision_at_radius(H, r, policy),
            fields=("expected",), per_query_name="ap_at_radius", column="mAP"),
    Measure("mlgap_at_radius", "mLGAP@{}", "mean local group average precision: sum over k <= r of "
            "TP_k / (M_k V_k), over r + 1", parameter="radius",
            per_query=lambda H, M, r, variant, policy: rad.lgap_at_radius(H, M, r), headline=True,
            stored_per_query=True, per_query_name="lgap_at_radius", column="mLGAP", hamming=True),
    Measure("retrieved_nothing_at_radius", "empty@r={}", "queries whose radius-r ball holds no database item",
            parameter="radius", from_totals=_retrieved_nothing, column="empty queries"),
    Measure("pr_curve", "PR curve", "micro precision and recall at every radius 0..B (every bin's upper edge "
            "for a binned distance) that retrieves something", from_totals=_pr_curve, curve=True),
    Measure("auprc", "AUPRC", "area under the micro PR curve: step sum and trapezoid", from_totals=_auprc,
            fields=("step", "trapezoid"), headline=True),
    Measure("hashtable", "hashtable {}", "hashtable-bucket paradigm: items colliding with the query in one of L "
            "K-bit tables; micro precision, recall, F-beta", parameter="hashtable", from_totals=_hashtable,
            fields=("precision", "recall", "f_beta")),
)

BY_KEY = {m.key: m for m in MEASURES}
# each query's AP over the full ranking, expected over tie orders: what comparisons and histories pair
AP_EXPECTED = per_query_key(BY_KEY["map"], policy="expected")
FIELD_LABELS = {"precision": "P", "recall": "R", "f_beta": "F-beta", "step": "step", "trapezoid": "trapezoid",
                "expected": "expected"}


def headline_rows(metrics: dict, radius=None, exclude: tuple[str, ...] = ()) -> list[tuple[str, dict]]:
    """(label, {expected, best, worst}) for the headline measures of a report's metrics, but those whose key is
    in ``exclude``; a measure without tie policies repeats its value (its first field for a dict). Radius
    measures at ``radius``, default the largest reported."""
    rows = []
    for m in MEASURES:
        if not m.headline or m.key in exclude:
            continue
        values = list(metrics[m.key]) if m.parameter else [None]
        if m.parameter == "radius":
            values = [str(radius) if radius is not None else max(values, key=float)]
        for value in values:
            v = lookup(metrics, m, value, m.headline_variant)
            if isinstance(v, dict) and not m.policies:
                v = v[m.fields[0]]
            if not isinstance(v, dict):
                v = {policy: v for policy in POLICIES}
            label = m.label_for(value, m.headline_variant)
            if m.fields and not m.policies:
                label += f" {FIELD_LABELS[m.fields[0]]}"
            rows.append((label, v))
    return rows
