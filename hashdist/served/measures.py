"""What a deployed index serves, measured against the exhaustive ranking, exact under ties (docs/served.md; spec
section 5d). Pure functions of the exhaustive histogram ``H[q, d, g]`` and of the served entries' recomputed
distances and grades (in served order; -1: no entry, trailing only).

Neighbour recall@k compares the first k served entries with the exhaustive k nearest neighbours under a uniformly
random order of the items tied at the k-th distance d_k: with a items closer than d_k, t tied at d_k and m = k - a
of them in the top k, and h< / h= served entries below / at d_k, expected = (h< + h= m / t) / k, best =
(h< + min(h=, m)) / k, worst = (h< + max(0, h= - (t - m))) / k; lenient = (h< + h=) / k (ann-benchmarks' rule);
exact = 1 when the served top k is a valid exhaustive answer (h< = a, h= = m).

What the user is served: the first k entries have their own histogram S. Every top-K measure of
hashdist.metrics is computed, by the registry's own functions, on S completed by two groups past every distance:
k - |served| irrelevant misses (so nothing unserved enters the top k), then the database's relevant items that
were not served (so R, the AP@K normalisers' R and NDCG's ideal DCG are the database's, from H). Ties among served
entries at one distance give the interval; ``as-served`` ranks them in served order instead (one value).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from hashdist.metrics.conventions import CONVENTIONS, conventions_report
from hashdist.metrics.registry import MEASURES, POLICIES
from hashdist.metrics.summary import MetricParams, aggregate, concat_per_query, per_query_metrics

ORDERS = ("distance", "as-served")
HISTOGRAM_CELLS_PER_STEP = 1 << 18  # cells of the served histograms built at once (queries x width x grades)
TOP_K_MEASURES = tuple(m for m in MEASURES if m.parameter == "k")  # P@K, R@K, mAP@K, NDCG@K, StructHash's NDCG
TOP_K_CONVENTIONS = tuple(c.name for c in CONVENTIONS if c.key == "map_at_k" and c.normaliser)  # AP@K-based ones


@dataclass(frozen=True)
class ServedEntries:
    """One served run's entries for a run of queries, as the measures take them.

    A k-NN list: ``distances`` and ``grades`` (Q, K) in served order, -1 where there is no entry. A radius
    lookup: ``radius`` (inclusive) and per query ``served`` (items served) and ``in_ball`` (those within r).
    ``order``: rank served entries by distance with a tie interval, or ``as-served``.
    """

    name: str
    distances: np.ndarray | None = None
    grades: np.ndarray | None = None
    radius: int | None = None
    served: np.ndarray | None = None
    in_ball: np.ndarray | None = None
    order: str = "distance"
    time_per_query_s: float | None = None

    @property
    def is_range(self) -> bool:
        return self.radius is not None

    @property
    def width(self) -> int:
        """K of a k-NN list (its columns); 0 for a radius lookup."""
        return 0 if self.distances is None else int(self.distances.shape[1])


def neighbour_recall(counts: np.ndarray, distances: np.ndarray, k: int) -> dict[str, np.ndarray]:
    """Per query: neighbour recall@k (expected, best, worst), lenient and exact, from ``counts[q, d]`` (the
    exhaustive ranking's items at distance d) and the served ``distances`` (-1: no entry; the first k count).

    A database of fewer than k items: the exhaustive top k is all of them (a = Nall, t = m = 0)."""
    counts = np.asarray(counts, dtype=np.int64)
    Q, width = counts.shape
    cum = np.cumsum(counts, axis=1)
    reach = cum >= k
    has = reach.any(axis=1)
    dk = np.where(has, reach.argmax(axis=1), width)  # past every distance when k > Nall
    at_dk = np.minimum(dk, width - 1)
    t = np.where(has, counts[np.arange(Q), at_dk], 0)
    a = np.where(has, cum[np.arange(Q), at_dk] - t, cum[:, -1])
    m = np.where(has, k - a, 0)
    d = np.asarray(distances)[:, :k]
    below = ((d >= 0) & (d < dk[:, None])).sum(axis=1)
    at = (d == dk[:, None]).sum(axis=1)
    share = np.divide(at * m, t, out=np.zeros(Q), where=t > 0)
    return {"expected": (below + share) / k, "best": (below + np.minimum(at, m)) / k,
            "worst": (below + np.maximum(0, at - (t - m))) / k, "lenient": (below + at) / k,
            "exact": ((below == a) & (at == m)).astype(np.float64)}


def served_histogram(distances: np.ndarray, grades: np.ndarray, k: int, n_distances: int, n_grades: int,
                     order: str = "distance") -> np.ndarray:
    """S[q, d, g]: the first k served entries by distance d and grade g, shape (Q, n_distances, n_grades); with
    ``as-served`` order, by position instead (Q, k, n_grades): each entry a group of its own."""
    d, g = np.asarray(distances)[:, :k], np.asarray(grades)[:, :k]
    Q = d.shape[0]
    valid = d >= 0
    width = n_distances if order == "distance" else k
    slot = d if order == "distance" else np.broadcast_to(np.arange(d.shape[1]), d.shape)
    query = np.broadcast_to(np.arange(Q)[:, None], d.shape)
    cells = (query[valid].astype(np.int64) * width + slot[valid]) * n_grades + g[valid]
    return np.bincount(cells, minlength=Q * width * n_grades).reshape(Q, width, n_grades)


def completed_histogram(S: np.ndarray, H: np.ndarray, k: int) -> np.ndarray:
    """S followed by two groups past every distance: k - |served| irrelevant misses, then the database's relevant
    items that were not served. Its top k is the served list; its R and ideal DCG are H's."""
    Q, _, G = S.shape
    misses = np.zeros((Q, 1, G), dtype=np.int64)
    misses[:, 0, 0] = k - S.sum(axis=(1, 2))
    unserved = np.zeros((Q, 1, G), dtype=np.int64)
    unserved[:, 0, 1:] = np.asarray(H).sum(axis=1)[:, 1:] - S.sum(axis=1)[:, 1:]
    return np.concatenate([S, misses, unserved], axis=1)


def _top_k_params(params: MetricParams, k: int) -> MetricParams:
    return replace(params, ks=(k,), hashtables=(),
                   conventions=tuple(c for c in params.conventions if c in TOP_K_CONVENTIONS))


def served_values(H: np.ndarray, entries: ServedEntries, params: MetricParams) -> dict[str, np.ndarray]:
    """Every per-query value of one served run for these queries (``H``: their exhaustive histogram), keyed
    ``served/NAME/...``: ``neighbours/recall_at_k/K/<policy>``, ``neighbours/lenient_at_k/K``,
    ``neighbours/exact_at_k/K``, the top-K measures'
    per-query keys of hashdist.metrics.registry and ``relevant`` (the database's R); for a radius lookup
    ``range/ball``, ``range/served``, ``range/in_ball``."""
    H = np.asarray(H, dtype=np.int64)
    out: dict[str, np.ndarray] = {}
    if entries.is_range:
        out = {"range/ball": H[:, : entries.radius + 1, :].sum(axis=(1, 2)),
               "range/served": np.asarray(entries.served, np.int64), "range/in_ball": np.asarray(entries.in_ball,
                                                                                                  np.int64)}
    else:
        for k in params.ks:
            cells = (H.shape[1] if entries.order == "distance" else k) * H.shape[2]
            step = max(1, HISTOGRAM_CELLS_PER_STEP // cells)  # queries at once: a few MB whatever K
            out.update(concat_per_query([_top_k_values(H[s : s + step], entries.distances[s : s + step],
                                                       entries.grades[s : s + step], k, params, entries.order)
                                         for s in range(0, max(H.shape[0], 1), step)]))
    return {f"served/{entries.name}/{key}": value for key, value in out.items()}


def _top_k_values(H: np.ndarray, distances: np.ndarray, grades: np.ndarray, k: int, params: MetricParams,
                  order: str) -> dict[str, np.ndarray]:
    """Neighbour recall@k and the top-k measures of a few queries."""
    recall = neighbour_recall(H.sum(axis=2), distances, k)
    out = {f"neighbours/recall_at_k/{k}/{p}": recall[p] for p in POLICIES}
    out.update({f"neighbours/lenient_at_k/{k}": recall["lenient"], f"neighbours/exact_at_k/{k}": recall["exact"]})
    S = served_histogram(distances, grades, k, H.shape[1], H.shape[2], order)
    values = per_query_metrics(completed_histogram(S, H, k), None, _top_k_params(params, k), measures=TOP_K_MEASURES)
    for key in ("items", "tp_at_radius", "retrieved_at_radius", "capped_pairs"):
        values.pop(key)
    return {**out, **values}


def _mean(values) -> float:
    values = np.asarray(values, dtype=np.float64)
    return math.fsum(values.tolist()) / len(values) if len(values) else math.nan


def _ratio(a: int, b: int) -> float:
    return a / b if b else math.nan


def range_section(pq: dict[str, np.ndarray], radius: int) -> dict:
    """A radius lookup's measures: recall (mean over the queries whose ball holds an item) and precision (mean over
    every query, 0 for one served nothing), micro-averaged both, and the two query counts."""
    ball, served, hit = pq["range/ball"], pq["range/served"], pq["range/in_ball"]
    with np.errstate(invalid="ignore", divide="ignore"):
        recall = hit[ball > 0] / ball[ball > 0]
        precision = np.where(served > 0, hit / np.maximum(served, 1), 0.0)
    return {"radius": int(radius), "recall": _mean(recall), "precision": _mean(precision),
            "micro": {"recall": _ratio(int(hit.sum()), int(ball.sum())),
                      "precision": _ratio(int(hit.sum()), int(served.sum()))},
            "queries_with_empty_ball": int((ball == 0).sum()), "queries_served_nothing": int((served == 0).sum())}


def neighbours_section(pq: dict[str, np.ndarray], ks) -> dict:
    """Neighbour recall@K {expected, best, worst}, lenient@K and exact@K, means over every query."""
    return {"recall_at_k": {str(k): {p: _mean(pq[f"neighbours/recall_at_k/{k}/{p}"]) for p in POLICIES}
                            for k in ks},
            "lenient_at_k": {str(k): _mean(pq[f"neighbours/lenient_at_k/{k}"]) for k in ks},
            "exact_at_k": {str(k): _mean(pq[f"neighbours/exact_at_k/{k}"]) for k in ks}}


def cost(exhaustive, served):
    """Exhaustive minus served, key by key down to {expected, best, worst} (of which the expected values)."""
    if isinstance(served, dict) and "expected" in served:
        return exhaustive["expected"] - served["expected"]
    if isinstance(served, dict):
        return {key: cost(exhaustive[key], value) for key, value in served.items()}
    return exhaustive - served


def served_section(pq: dict[str, np.ndarray], entries: ServedEntries, params: MetricParams, exhaustive: dict,
                   exhaustive_conventions: dict) -> dict:
    """``report["served"][NAME]`` from the run's per-query values (every query): neighbours, the top-K measures with
    report["metrics"]'s keys and shapes, their conventions, what the index costs, or a radius lookup's range."""
    prefix = f"served/{entries.name}/"
    mine = {key[len(prefix):]: value for key, value in pq.items() if key.startswith(prefix)}
    section: dict = {"kind": "range" if entries.is_range else "knn", "order": entries.order}
    if entries.is_range:
        section["range"] = range_section(mine, entries.radius)
    else:
        section["width"] = entries.width
        section["neighbours"] = neighbours_section(mine, params.ks)
        metrics, _ = aggregate(mine, params, measures=TOP_K_MEASURES)
        names = [c for c in params.conventions if c in TOP_K_CONVENTIONS]
        conventions = conventions_report(mine, names, params.ks)
        section.update(metrics=metrics, conventions=conventions,
                       cost={**cost({key: exhaustive[key] for key in metrics}, metrics),
                             **({"conventions": cost({n: exhaustive_conventions[n] for n in names}, conventions)}
                                if names else {})})
    if entries.time_per_query_s is not None:
        section["time_per_query_s"] = float(entries.time_per_query_s)
    return section
