"""Hamming-radius retrieval: the set S_r = {j : d(q, j) <= r} (docs/metrics.md, section 4).

Macro precision/recall are per query; micro precision/recall/F-beta, the PR curve
and AUPRC sum TP, FP and FN over queries first (the thesis's eq. 3.8-3.10).
These do not depend on tie order.
"""

from __future__ import annotations

import math

import numpy as np

from hashdist.data.bits import ball_volumes
from hashdist.defaults import DEFAULT_BETA
from hashdist.metrics.ranking import group_counts


def _check_radius(H, r) -> int:
    nbits = np.shape(H)[1] - 1
    if int(r) != r or not 0 <= r <= nbits:
        raise ValueError(f"radius must be an integer in 0..{nbits}, got {r!r}")
    return int(r)


def retrieved_counts(H) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cumulative TP_r and |S_r| per query and radius, and R per query."""
    n, r = group_counts(H)
    return np.cumsum(r, axis=1), np.cumsum(n, axis=1), r.sum(axis=1)


def precision_at_radius(H, r) -> np.ndarray:
    """TP_r / |S_r| per query; 0 where nothing lies within radius r."""
    tp, size, _ = retrieved_counts(H)
    r = _check_radius(H, r)
    return np.where(size[:, r] > 0, tp[:, r] / np.maximum(size[:, r], 1), 0.0)


def recall_at_radius(H, r) -> np.ndarray:
    """TP_r / R per query; NaN where R = 0."""
    tp, _, R = retrieved_counts(H)
    r = _check_radius(H, r)
    return np.where(R > 0, tp[:, r] / np.maximum(R, 1), np.nan)


def micro_scores(tp: int, fp: int, fn: int, beta: float) -> dict:
    """Micro precision, recall and F-beta from summed counts (0 where a denominator is 0)."""
    b2 = beta * beta
    f_den = (1 + b2) * tp + b2 * fn + fp
    return {
        "precision": tp / (tp + fp) if tp + fp else 0.0,
        "recall": tp / (tp + fn) if tp + fn else 0.0,
        "f_beta": (1 + b2) * tp / f_den if f_den else 0.0,
        "tp": int(tp),
        "fp": int(fp),
        "fn": int(fn),
    }


def hashtable_metrics(tp_total: int, retrieved_total: int, relevant_total: int, beta: float) -> dict:
    """The hashtable-bucket paradigm: micro scores of the retrieved sets (items colliding in some table),
    from TP, retrieved and relevant counts summed over queries."""
    return micro_scores(int(tp_total), int(retrieved_total - tp_total), int(relevant_total - tp_total), beta)


def micro_counts(H) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Summed TP, FP, FN over all queries of H for every radius 0..B (exact integers)."""
    tp, size, R = retrieved_counts(H)
    TP = tp.sum(axis=0)
    return TP, size.sum(axis=0) - TP, R.sum() - TP


def micro_at_radius(H, r, beta: float = DEFAULT_BETA) -> dict:
    """Micro precision, recall and F-beta of S_r, with the summed TP, FP, FN: the report's ``micro_at_radius`` when
    every query is evaluated (the same :func:`micro_scores` of the same sums)."""
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta!r}")
    TP, FP, FN = micro_counts(H)
    r = _check_radius(H, r)
    return micro_scores(int(TP[r]), int(FP[r]), int(FN[r]), beta)


def pr_curve_from_counts(TP, FP, FN, radii=None) -> list[dict]:
    """Micro PR points for every radius at which some query retrieves something; ``radii``: the radius of
    each position of the distance axis (default: the position itself, a Hamming radius)."""
    return [
        {"radius": int(r) if radii is None else radii[r], "precision": TP[r] / (TP[r] + FP[r]),
         "recall": TP[r] / (TP[r] + FN[r]) if TP[r] + FN[r] else 0.0}
        for r in range(len(TP))
        if TP[r] + FP[r] > 0
    ]


def pr_curve(H) -> list[dict]:
    """The micro PR curve: (recall, precision) at radius 0..B, skipping empty radii."""
    return pr_curve_from_counts(*micro_counts(H))


def auprc(curve: list[dict]) -> dict:
    """Area under the micro PR curve: ``step`` (sum of P(r) * recall gain, R(-1) = 0) and
    ``trapezoid`` (the curve started at (0, P(r_first)))."""
    if not curve:
        return {"step": 0.0, "trapezoid": 0.0}
    step = [p["precision"] * (p["recall"] - (curve[i - 1]["recall"] if i else 0.0)) for i, p in enumerate(curve)]
    points = [(0.0, curve[0]["precision"])] + [(p["recall"], p["precision"]) for p in curve]
    trap = [(x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False)]
    return {"step": math.fsum(step), "trapezoid": math.fsum(trap)}


def _as_float(v: int) -> float:
    return float(v) if v.bit_length() <= 1023 else math.inf


def lgap_at_radius(H, max_bucket, r) -> np.ndarray:
    """LGAP@r = (1/(r+1)) sum_{k<=r} TP_k / (M_k V_k), a term being 0 where the ball is empty.

    ``max_bucket[q, k]`` is M_k: the most database items sharing one code within distance k.
    """
    r = _check_radius(H, r)
    nbits = np.shape(H)[1] - 1
    tp, _, _ = retrieved_counts(H)
    M = np.asarray(max_bucket)[:, : r + 1].astype(np.float64)
    V = np.array([_as_float(v) for v in ball_volumes(nbits, r)])
    with np.errstate(invalid="ignore", divide="ignore"):
        terms = np.where(M > 0, tp[:, : r + 1] / (np.where(M > 0, M, 1.0) * V), 0.0)
    return np.array([math.fsum(row) for row in terms]) / (r + 1)
