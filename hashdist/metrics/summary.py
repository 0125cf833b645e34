"""From histograms to the report: per-query values, then means over the evaluated query set.

``per_query_metrics`` works on any block of queries, so blocks can be processed
apart and concatenated; ``aggregate`` applies the query-set rule (spec section 3)
and averages with ``math.fsum``, so the result is bit-identical however the
queries were blocked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hashdist.metrics import radius as rad
from hashdist.metrics import ranking as rk

EMPTY_QUERY_RULES = ("exclude", "zero")
_AT_K = {
    "precision_at_k": rk.precision_at_k,
    "recall_at_k": rk.recall_at_k,
    "ndcg_at_k": rk.ndcg_at_k,
    "ndcg_structhash_at_k": rk.ndcg_structhash_at_k,
}


@dataclass(frozen=True)
class MetricParams:
    """What to compute: cut-offs K, radii r, F-beta's beta and the rule for queries with R = 0."""

    ks: tuple[int, ...] = (10, 100, 1000)
    radii: tuple[int, ...] = (0, 1, 2)
    beta: float = 1.0
    empty_queries: str = "exclude"

    def validate(self, nbits: int) -> None:
        from hashdist.errors import InputError

        if not self.ks or any(int(k) != k or k < 1 for k in self.ks):
            raise InputError(f"--k: every K must be a positive integer, got {list(self.ks)}")
        if not self.radii or any(int(r) != r or not 0 <= r <= nbits for r in self.radii):
            raise InputError(f"--radius: every radius must be an integer in 0..{nbits}, got {list(self.radii)}")
        if not (isinstance(self.beta, (int, float)) and math.isfinite(self.beta) and self.beta > 0):
            raise InputError(f"--beta must be a finite number > 0, got {self.beta}")
        if self.empty_queries not in EMPTY_QUERY_RULES:
            raise InputError(f"--empty-queries must be one of {EMPTY_QUERY_RULES}, got {self.empty_queries!r}")

    @property
    def max_radius(self) -> int:
        return max(self.radii)


def per_query_metrics(H: np.ndarray, max_bucket: np.ndarray, params: MetricParams) -> dict[str, np.ndarray]:
    """Every per-query value the report needs, as flat arrays keyed 'metric/K/...'. NaN = undefined."""
    H = np.ascontiguousarray(H, dtype=np.int64)
    tp, size, R = rad.retrieved_counts(H)
    out: dict[str, np.ndarray] = {"relevant": R, "items": size[:, -1], "tp_at_radius": tp, "retrieved_at_radius": size}
    for policy in rk.POLICIES:
        out[f"ap/{policy}"] = rk.average_precision(H, policy)
    for k in params.ks:
        for norm in rk.AP_AT_K_NORMALISERS:
            for policy in rk.POLICIES:
                out[f"ap_at_k/{k}/{norm}/{policy}"] = rk.average_precision_at_k(H, k, norm, policy)
        for name, fn in _AT_K.items():
            for policy in rk.POLICIES:
                out[f"{name}/{k}/{policy}"] = fn(H, k, policy)
    out["auc"] = rk.roc_auc(H)
    for r in params.radii:
        out[f"precision_at_radius/{r}"] = rad.precision_at_radius(H, r)
        out[f"recall_at_radius/{r}"] = rad.recall_at_radius(H, r)
        out[f"lgap_at_radius/{r}"] = rad.lgap_at_radius(H, max_bucket, r)
    return out


def concat_per_query(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


def _mean(values: np.ndarray, mask: np.ndarray, zero_fill: bool) -> float:
    v = values[mask]
    if zero_fill:
        v = np.nan_to_num(v, nan=0.0)
    else:
        v = v[~np.isnan(v)]
    return math.fsum(v.tolist()) / len(v) if len(v) else math.nan


def _policies(pq, prefix, mask, zero):
    return {p: _mean(pq[f"{prefix}/{p}"], mask, zero) for p in rk.POLICIES}


def aggregate(pq: dict[str, np.ndarray], params: MetricParams) -> tuple[dict, dict]:
    """The report's ``metrics`` and ``queries`` sections from concatenated per-query values."""
    R = pq["relevant"]
    zero = params.empty_queries == "zero"
    evaluated = np.ones(len(R), bool) if zero else R > 0
    m: dict = {"map": _policies(pq, "ap", evaluated, zero)}
    m["map_at_k"] = {
        str(k): {norm: _policies(pq, f"ap_at_k/{k}/{norm}", evaluated, zero) for norm in rk.AP_AT_K_NORMALISERS}
        for k in params.ks
    }
    for name in _AT_K:
        m[name] = {str(k): _policies(pq, f"{name}/{k}", evaluated, zero) for k in params.ks}
    has_irrelevant = pq["items"] > R
    m["auc"] = _mean(pq["auc"], evaluated & has_irrelevant, zero)
    m["precision_at_radius"] = {str(r): _mean(pq[f"precision_at_radius/{r}"], evaluated, zero) for r in params.radii}
    m["recall_at_radius"] = {str(r): _mean(pq[f"recall_at_radius/{r}"], evaluated, zero) for r in params.radii}
    TP = pq["tp_at_radius"][evaluated].sum(axis=0)
    FP = pq["retrieved_at_radius"][evaluated].sum(axis=0) - TP
    FN = R[evaluated].sum() - TP
    m["micro_at_radius"] = {str(r): rad.micro_scores(int(TP[r]), int(FP[r]), int(FN[r]), params.beta) for r in params.radii}
    m["pr_curve"] = rad.pr_curve_from_counts(TP, FP, FN)
    m["auprc"] = rad.auprc(m["pr_curve"])
    m["mlgap_at_radius"] = {str(r): _mean(pq[f"lgap_at_radius/{r}"], evaluated, zero) for r in params.radii}
    m["hashtable"] = {}
    for key in sorted(k for k in pq if k.startswith("hashtable_tp/")):
        setting = key.split("/", 1)[1]  # "KxL": L tables of K-bit substrings, micro over evaluated queries
        tp = int(pq[key][evaluated].sum())
        retrieved_items = int(pq[f"hashtable_retrieved/{setting}"][evaluated].sum())
        m["hashtable"][setting] = rad.micro_scores(tp, retrieved_items - tp, int(R[evaluated].sum()) - tp, params.beta)
    retrieved = pq["retrieved_at_radius"][evaluated]
    m["retrieved_nothing_at_radius"] = {str(r): int((retrieved[:, r] == 0).sum()) for r in params.radii}
    queries = {"total": int(len(R)), "evaluated": int(evaluated.sum()), "without_relevant": int((R == 0).sum())}
    return m, queries


def compute_metrics(H: np.ndarray, max_bucket: np.ndarray, params: MetricParams) -> tuple[dict, dict]:
    """Convenience for one histogram holding every query: ``aggregate(per_query_metrics(...))``."""
    return aggregate(per_query_metrics(H, max_bucket, params), params)
