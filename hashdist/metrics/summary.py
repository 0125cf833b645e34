"""From histograms to the report: per-query values, then means over the evaluated query set.

``per_query_metrics`` works on any block of queries, so blocks can be processed
apart and concatenated; ``aggregate`` applies the query-set rule (docs/metrics.md, section 3)
and averages with ``math.fsum``, so the result is bit-identical however the
queries were blocked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hashdist.defaults import DEFAULT_BETA, DEFAULT_K, DEFAULT_RADII
from hashdist.metrics import radius as rad
from hashdist.metrics import ranking as rk
from hashdist.metrics.conventions import per_query_values as convention_values
from hashdist.metrics.ranking import counts_shared
from hashdist.metrics.registry import MEASURES, per_query_key

EMPTY_QUERY_RULES = ("exclude", "zero")


@dataclass(frozen=True)
class MetricParams:
    """What to compute: cut-offs K, radii r, F-beta's beta, the rule for queries with R = 0, hashtable settings.
    Built from checked options (hashdist.options.EvaluateOptions.resolve); the registry's measures read the
    parameters they use from it."""

    ks: tuple[int, ...] = DEFAULT_K
    radii: tuple[int, ...] = DEFAULT_RADII
    beta: float = DEFAULT_BETA
    empty_queries: str = "exclude"
    hashtables: tuple[str, ...] = ()  # "KxL" settings whose per-query counts the kernels supply
    max_grade: int | None = None  # the user's cap on graded relevance; None: uncapped (docs/metrics.md, section 5)
    n_database: int | None = None  # database items (Nall): where the grid of cut-offs N ends
    conventions: tuple[str, ...] = ()  # published scripts' mAP@K to reproduce (hashdist.metrics.conventions)
    distance: str = "hamming"  # the ranking distance (hashdist.kernels.distance): radii are in its units
    radius_bins: tuple[int, ...] | None = None  # a binned distance: the last bin inside each radius
    bin_edges: tuple[float, ...] | None = None  # ... and every bin's upper edge (where the PR curve's points lie)

    @property
    def hamming_radii(self) -> tuple[int, ...]:
        """The radii that are plain Hamming radii (mLGAP's): all of them for the Hamming distance, else the
        integer ones (mLGAP stays a plain-Hamming quantity, docs/metrics.md section 4b)."""
        return tuple(int(r) for r in self.radii if float(r).is_integer() and r >= 0)

    @property
    def max_radius(self) -> int:
        """The largest Hamming radius: how far M_k is needed."""
        return max(self.hamming_radii, default=0)

    def position(self, radius) -> int:
        """Where radius r ends on the histogram's distance axis."""
        return int(radius) if self.radius_bins is None else self.radius_bins[self.radii.index(radius)]

    @property
    def cutoffs(self) -> tuple[int, ...]:
        """The cut-offs N of P@N, R@N and the PR curve by rank: 1-2-5 steps up to Nall, Nall and every K."""
        return rk.cutoff_grid(self.ks, self.n_database)


def cap_grades(H: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """H with grades above ``cap`` counted as ``cap``, and per query the number of pairs that changed."""
    if H.shape[2] <= cap + 1:
        return H, np.zeros(H.shape[0], dtype=np.int64)
    capped = H[:, :, : cap + 1].copy()
    capped[:, :, cap] += H[:, :, cap + 1 :].sum(axis=2)
    return capped, H[:, :, cap + 1 :].sum(axis=(1, 2))


def per_query_metrics(H: np.ndarray, max_bucket: np.ndarray, params: MetricParams,
                      hamming: np.ndarray | None = None, measures=MEASURES) -> dict[str, np.ndarray]:
    """Every per-query value of the registry's per-query measures, keyed by ``per_query_key``. NaN = undefined.

    ``H`` is over the ranking distance's axis; ``hamming``, when that distance is not plain Hamming,
    the plain Hamming histogram for the measures that stay Hamming (mLGAP: NaN at a radius that is not
    a Hamming radius).

    Also the counts that micro measures sum: relevant items, items, and TP and |S_r| per radius; and
    ``capped_pairs``, the relevant pairs whose grade the user's cap lowered; and what the requested
    conventions need besides (``hashdist.metrics.conventions.per_query_values``). ``measures``: which of the
    registry's measures, in which order.
    """
    H = np.ascontiguousarray(H, dtype=np.int64)
    capped_pairs = np.zeros(H.shape[0], dtype=np.int64)
    if params.max_grade is not None:
        H, capped_pairs = cap_grades(H, params.max_grade)
        if hamming is not None:
            hamming = cap_grades(np.ascontiguousarray(hamming, dtype=np.int64), params.max_grade)[0]
    with counts_shared(H):
        tp, size, R = rad.retrieved_counts(H)
        out: dict[str, np.ndarray] = {"relevant": R, "items": size[:, -1], "tp_at_radius": tp,
                                      "retrieved_at_radius": size, "capped_pairs": capped_pairs}
        for measure in measures:
            if measure.per_query is None:
                continue
            for value in measure.values(params):
                histogram, argument = H, value
                if measure.parameter == "radius" and measure.hamming and hamming is not None:
                    histogram = hamming
                    if value not in params.hamming_radii:
                        for variant in measure.variants or (None,):
                            out[per_query_key(measure, value, variant)] = np.full(H.shape[0], np.nan)
                        continue
                elif measure.parameter == "radius":
                    argument = params.position(value)
                for variant in measure.variants or (None,):
                    for policy in measure.policies or (None,):
                        out[per_query_key(measure, value, variant, policy)] = measure.per_query(
                            histogram, max_bucket, argument, variant, policy)
        out.update(convention_values(H, params))
    return out


def concat_per_query(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


def _mean(values: np.ndarray, mask: np.ndarray, zero: np.ndarray) -> float:
    """The mean over the ``mask`` queries of their defined values, a query in ``zero`` (R = 0 under
    --empty-queries zero) counting as 0; NaN when none is left."""
    v = np.where(zero & np.isnan(values), 0.0, values)[mask]
    v = v[~np.isnan(v)]
    return math.fsum(v.tolist()) / len(v) if len(v) else math.nan


def _totals(pq: dict[str, np.ndarray], evaluated: np.ndarray, params: MetricParams) -> dict:
    """Counts summed over the evaluated queries, for the micro measures."""
    R = pq["relevant"][evaluated]
    TP = pq["tp_at_radius"][evaluated].sum(axis=0)
    retrieved = pq["retrieved_at_radius"][evaluated]
    hashtable = {s: (int(pq[f"hashtable_tp/{s}"][evaluated].sum()),
                     int(pq[f"hashtable_retrieved/{s}"][evaluated].sum())) for s in params.hashtables}
    return {"relevant": int(R.sum()), "tp": TP, "fp": retrieved.sum(axis=0) - TP, "fn": R.sum() - TP,
            "empty": (retrieved == 0).sum(axis=0), "hashtable": hashtable, "bin_edges": params.bin_edges}


def aggregate(pq: dict[str, np.ndarray], params: MetricParams, measures=MEASURES) -> tuple[dict, dict]:
    """The report's ``metrics`` and ``queries`` sections from concatenated per-query values; ``measures``: which
    of the registry's measures (those ``per_query_metrics`` was given)."""
    R = pq["relevant"]
    counted_as_zero = (R == 0) & (params.empty_queries == "zero")
    evaluated = (R > 0) | counted_as_zero
    # AUC needs a relevant and an irrelevant item: 0 < R < Nall, whatever --empty-queries says
    masks = {"evaluated": evaluated}
    if "items" in pq:  # served lists (hashdist.served) have no AUC and no item count of their own
        masks["with_irrelevant"] = (R > 0) & (pq["items"] > R)
    totals = _totals(pq, evaluated, params) if any(m.from_totals for m in measures) else None

    def value_of(measure, value, variant):
        if measure.from_totals is not None:
            position = params.position(value) if measure.parameter == "radius" else value
            return measure.from_totals(totals, position, params)
        if measure.hamming and measure.parameter == "radius" and value not in params.hamming_radii:
            return math.nan  # a plain-Hamming measure has no value between integer radii, for any query
        mask = masks[measure.queries]
        if not measure.policies:
            return _mean(pq[per_query_key(measure, value, variant)], mask, counted_as_zero)
        return {policy: _mean(pq[per_query_key(measure, value, variant, policy)], mask, counted_as_zero)
                for policy in measure.policies}

    def by_variant(measure, value):
        if not measure.variants:
            return value_of(measure, value, None)
        return {variant: value_of(measure, value, variant) for variant in measure.variants}

    metrics: dict = {}
    for measure in measures:
        if measure.from_metrics is not None:
            metrics[measure.key] = measure.from_metrics(metrics)
        elif measure.parameter is None:
            metrics[measure.key] = by_variant(measure, None)
        else:
            metrics[measure.key] = {str(value): by_variant(measure, value) for value in measure.values(params)}
    queries = {"total": int(len(R)), "evaluated": int(evaluated.sum()), "without_relevant": int((R == 0).sum())}
    return metrics, queries

