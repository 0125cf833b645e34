"""hashdist.metrics (and the histogram / code-count kernels) against the brute-force reference.

The reference (tests/reference.py) works on explicit item lists and ranked lists and
never calls hashdist's metric code; see its docstring. Histograms here are drawn with
HEAVY ties (1-3 distinct distances per query), binary and graded relevance, queries
with no relevant item, all-relevant queries, empty queries, and K values at and
around tie-group boundaries and beyond the list length.
"""

from __future__ import annotations

import math
import os
import platform
import re
import subprocess
import sys
import zlib

import numpy as np
import pytest
import reference as ref
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hashdist.kernels import histogram
from hashdist.kernels.codecounts import max_bucket_within
from hashdist.kernels.histogram import histogram_block
from hashdist.metrics import (
    POLICIES,
    auprc,
    average_precision,
    average_precision_at_k,
    lgap_at_radius,
    micro_at_radius,
    ndcg_at_k,
    ndcg_structhash_at_k,
    pr_curve,
    precision_at_k,
    precision_at_radius,
    recall_at_k,
    recall_at_radius,
    roc_auc,
)
from hashdist.metrics.summary import MetricParams, aggregate, per_query_metrics

TOL = 1e-12
BITS = (1, 4, 12, 64, 65, 128)
MC_SAMPLES = 3000
SETTINGS = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

IMPL = {
    "ap": lambda H, policy: average_precision(H, policy=policy),
    "ap_at_k": lambda H, policy, k, normaliser: average_precision_at_k(H, k, normaliser=normaliser, policy=policy),
    "precision_at_k": lambda H, policy, k: precision_at_k(H, k, policy=policy),
    "recall_at_k": lambda H, policy, k: recall_at_k(H, k, policy=policy),
    "ndcg_at_k": lambda H, policy, k: ndcg_at_k(H, k, policy=policy),
    "ndcg_structhash_at_k": lambda H, policy, k: ndcg_structhash_at_k(H, k, policy=policy),
}


def metric_specs(ks):
    """(metric, kwargs) for every ranking metric, every K in ks and every AP@K normaliser."""
    specs = [("ap", {})]
    for k in ks:
        for normaliser in ref.NORMALISERS:
            specs.append(("ap_at_k", dict(k=k, normaliser=normaliser)))
        for metric in ("precision_at_k", "recall_at_k", "ndcg_at_k", "ndcg_structhash_at_k"):
            specs.append((metric, dict(k=k)))
    return specs


def close(got, want, tol=TOL):
    got, want = float(got), float(want)
    if math.isnan(want) or math.isnan(got):
        return math.isnan(want) and math.isnan(got)
    return abs(got - want) <= tol


def describe(H, q):
    """Compact text of one query's histogram: {distance: [count per grade]}."""
    return {d: H[q, d].tolist() for d in range(H.shape[1]) if H[q, d].any()}


# --- strategies -------------------------------------------------------------------


@st.composite
def histograms(draw, max_items, max_queries=3, bits=BITS, max_grade=None):
    """(Q, B+1, G+1) int64 histograms with heavy ties (1-4 occupied distances per query).

    Sizes are drawn explicitly (hypothesis would otherwise favour tiny lists): about
    half of the queries hold between max_items/2 and max_items items."""
    B = draw(st.sampled_from(bits))
    G = draw(st.integers(1, 3)) if max_grade is None else max_grade
    Q = draw(st.integers(1, max_queries))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    H = np.zeros((Q, B + 1, G + 1), dtype=np.int64)
    for q in range(Q):
        kind = draw(st.sampled_from(["mixed", "mixed", "mixed", "mixed", "no_relevant", "all_relevant", "empty"]))
        if kind == "empty":
            continue
        n_dist = draw(st.integers(1, min(4, B + 1)))
        dists = draw(st.lists(st.integers(0, B), min_size=n_dist, max_size=n_dist, unique=True))
        grades = {"mixed": range(G + 1), "no_relevant": [0], "all_relevant": range(1, G + 1)}[kind]
        grades = list(grades)
        n = draw(st.one_of(st.integers(1, max(1, max_items // 2)), st.integers(max(1, max_items // 2), max_items)))
        p_d = rng.dirichlet(np.ones(len(dists)))
        p_g = rng.dirichlet(np.ones(len(grades)))
        for _ in range(n):
            H[q, dists[rng.choice(len(dists), p=p_d)], grades[rng.choice(len(grades), p=p_g)]] += 1
    return H


def boundary_ks(H):
    """K values at, just after and just before every tie-group boundary, plus 1 and beyond Nall."""
    ks = {1}
    for q in range(H.shape[0]):
        n = H[q].sum(axis=1)
        ends = np.cumsum(n)
        nall = int(ends[-1])
        for e in ends[n > 0].tolist():
            ks.update({e, e + 1, e - 1})
        ks.update({nall + 1, nall + 7})
    return sorted(k for k in ks if k >= 1)


@st.composite
def histograms_and_ks(draw, max_items, max_queries=3, n_ks=4, **kw):
    H = draw(histograms(max_items, max_queries, **kw))
    candidates = boundary_ks(H)
    ks = draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=n_ks, unique=True))
    return H, sorted(ks)


def items(H):
    return [ref.expand_histogram(H[q]) for q in range(H.shape[0])]


# --- spec section 6: worked examples ------------------------------------------------


@pytest.mark.parametrize("B", [4, 64, 65])
def test_worked_example_1_ap(B):
    H = np.zeros((1, B + 1, 2), dtype=np.int64)
    H[0, 0] = [5, 5]
    want = {"best": 1.0, "worst": 893 / 2520, "expected": 27541 / 45360}
    for policy, value in want.items():
        got = average_precision(H, policy=policy)
        assert got.shape == (1,)
        assert abs(got[0] - value) <= TOL, (policy, got[0], value)


def test_worked_example_2_lgap():
    from test_reference_selfcheck import worked_example_2

    qbits, dbbits, labels = worked_example_2()
    qw, dw = ref.pack_bits_reference(qbits), ref.pack_bits_reference(dbbits)
    H = histogram_block(qw, dw, 4, "class", np.array([1]), labels)
    assert H[0].tolist() == [[0, 1], [2, 3], [3, 1], [0, 0], [0, 0]]
    codes, counts = np.unique(dw[:, 0], return_counts=True)
    M = max_bucket_within(qw, codes.reshape(-1, 1), counts.astype(np.int64), 4, 2)
    assert M.tolist() == [[1, 2, 2]]
    for k, p in enumerate([1, 4 / 6, 5 / 10]):
        assert abs(precision_at_radius(H, k)[0] - p) <= TOL
    got = lgap_at_radius(H, M, 2)
    assert abs(got[0] - (1 + 0.4 + 5 / 22) / 3) <= TOL
    assert abs(got[0] - 0.5424242424242424) <= TOL


# --- ranking metrics: exact enumeration (tiny lists) ----------------------------------


@settings(max_examples=150, **SETTINGS)
@given(histograms_and_ks(max_items=9))
def test_ranking_metrics_exact(data):
    H, ks = data
    per_query = items(H)
    for metric, kw in metric_specs(ks):
        for policy in POLICIES:
            got = IMPL[metric](H, policy, **kw)
            assert got.shape == (H.shape[0],)
            for q, (dist, grade) in enumerate(per_query):
                want = ref.policy_value(metric, dist, grade, policy, **kw)
                assert close(got[q], want), (metric, kw, policy, describe(H, q), float(got[q]), want)


# --- ranking metrics: larger lists (best/worst exact, expected by MC and position-wise) --


@settings(max_examples=25, **SETTINGS)
@given(histograms_and_ks(max_items=60, n_ks=3))
def test_ranking_metrics_best_worst_larger(data):
    """Too long to enumerate: the grade-first / grade-last orders, which the spec (section 2) and
    test_reference_selfcheck show are the extremes for every metric but AP@K 'retrieved' (whose bounds
    are checked against enumeration in test_ranking_metrics_exact)."""
    H, ks = data
    per_query = items(H)
    for metric, kw in metric_specs(ks):
        if kw.get("normaliser") == "retrieved":
            continue
        for policy in ("best", "worst"):
            got = IMPL[metric](H, policy, **kw)
            for q, (dist, grade) in enumerate(per_query):
                want = ref.grade_ordered_value(metric, dist, grade, policy, **kw)
                assert close(got[q], want), (metric, kw, policy, describe(H, q), float(got[q]), want)


@settings(max_examples=25, **SETTINGS)
@given(histograms_and_ks(max_items=60, n_ks=3))
def test_ranking_metrics_expected_monte_carlo(data):
    H, ks = data
    per_query = items(H)
    seed = zlib.crc32(H.tobytes()) ^ zlib.crc32(str(ks).encode())
    rng = np.random.default_rng(seed)
    for metric, kw in metric_specs(ks):
        got = IMPL[metric](H, "expected", **kw)
        for q, (dist, grade) in enumerate(per_query):
            mean, se = ref.expected_mc(metric, dist, grade, MC_SAMPLES, rng, **kw)
            if math.isnan(mean):
                assert math.isnan(got[q]), (metric, kw, describe(H, q), float(got[q]))
                continue
            tol = 6 * se + 5 / MC_SAMPLES + TOL
            assert abs(got[q] - mean) <= tol, (metric, kw, describe(H, q), float(got[q]), mean, se)


@settings(max_examples=25, **SETTINGS)
@given(histograms_and_ks(max_items=80, n_ks=4))
def test_ranking_metrics_expected_positionwise(data):
    """Expected AP, AP@K (all normalisers) and NDCG@K to 1e-12 on lists too long to enumerate."""
    H, ks = data
    per_query = items(H)
    got_ap = average_precision(H, policy="expected")
    for q, (dist, grade) in enumerate(per_query):
        assert close(got_ap[q], ref.expected_ap_positionwise(dist, grade)), describe(H, q)
    for k in ks:
        got_ndcg = ndcg_at_k(H, k, policy="expected")
        for normaliser in ref.NORMALISERS:
            got = average_precision_at_k(H, k, normaliser=normaliser, policy="expected")
            for q, (dist, grade) in enumerate(per_query):
                want = ref.expected_ap_at_k_positionwise(dist, grade, k, normaliser)
                assert close(got[q], want), (k, normaliser, describe(H, q), float(got[q]), want)
        for q, (dist, grade) in enumerate(per_query):
            assert close(got_ndcg[q], ref.expected_ndcg_positionwise(dist, grade, k)), (k, describe(H, q))


def _big_histogram(seed):
    """Three queries with ~10^6 items in a few huge tie groups (spec section 7's regime)."""
    rng = np.random.default_rng(seed)
    B = 64
    H = np.zeros((3, B + 1, 3), dtype=np.int64)
    for q in range(3):
        for d in sorted(rng.choice(B + 1, size=4, replace=False).tolist()):
            H[q, d] = rng.integers(0, 150_000, size=3)
    H[2, :, 1:] = 0  # one query with few relevant items, all in one group
    H[2, 40] = [300_000, 3, 2]
    return H


def test_expected_numerics_on_million_item_histograms():
    H = _big_histogram(11)
    per_query = items(H)
    got = average_precision(H, policy="expected")
    for q, (dist, grade) in enumerate(per_query):
        want = ref.expected_ap_positionwise(dist, grade)
        assert abs(got[q] - want) <= TOL, (q, float(got[q]), want)
    for k in (1000, 123_457, int(H[0].sum()) - 1):
        got_ndcg = ndcg_at_k(H, k, policy="expected")
        for normaliser in ("min_k_r", "total"):
            got = average_precision_at_k(H, k, normaliser=normaliser, policy="expected")
            for q, (dist, grade) in enumerate(per_query):
                want = ref.expected_ap_at_k_positionwise(dist, grade, k, normaliser)
                assert abs(got[q] - want) <= TOL, (k, normaliser, q, float(got[q]), want)
        for q, (dist, grade) in enumerate(per_query):
            want = ref.expected_ndcg_positionwise(dist, grade, k)
            assert abs(got_ndcg[q] - want) <= TOL, (k, q, float(got_ndcg[q]), want)
    # 'retrieved' on the query whose boundary group has few relevant items
    # (the reference sums the hypergeometric mixture term by term)
    k = int(H[2, :40].sum()) + 100_000
    got = average_precision_at_k(H, k, normaliser="retrieved", policy="expected")
    want = ref.expected_ap_at_k_positionwise(*per_query[2], k, "retrieved")
    assert abs(got[2] - want) <= TOL, (float(got[2]), want)


def test_best_worst_numerics_on_million_item_histograms():
    """Best/worst AP summed item by item with math.fsum (correctly rounded sum)."""
    H = _big_histogram(12)
    for policy in ("best", "worst"):
        got = average_precision(H, policy=policy)
        for q in range(H.shape[0]):
            dist, grade = ref.expand_histogram(H[q])
            gr = np.array(ref.ranked_list(dist, grade, policy))
            rel = gr >= 1
            hits = np.cumsum(rel)
            i = np.arange(1, len(gr) + 1)
            want = math.fsum((hits[rel] / i[rel]).tolist()) / rel.sum()
            assert abs(got[q] - want) <= TOL, (policy, q, float(got[q]), want)


# --- the tie-policy bracket --------------------------------------------------------


BRACKETED = [("ap", None), ("ap_at_k", "min_k_r"), ("ap_at_k", "total"), ("precision_at_k", None),
             ("recall_at_k", None), ("ndcg_at_k", None), ("ndcg_structhash_at_k", None)]


@settings(max_examples=40, **SETTINGS)
@given(histograms_and_ks(max_items=40, n_ks=3), st.integers(0, 2**32 - 1))
def test_concrete_tiebreak_within_worst_best(data, seed):
    """Spec section 2: any tie-breaking rule (here: stable index order after a random shuffle,
    and plain stable index order of the expanded histogram) gives a value in [worst, best];
    so does the expected value."""
    H, ks = data
    rng = np.random.default_rng(seed)
    per_query = items(H)
    for metric, normaliser in BRACKETED:
        for k in ks if metric != "ap" else [None]:
            kw = {} if metric == "ap" else dict(k=k)
            if normaliser:
                kw["normaliser"] = normaliser
            best, worst, expected = (IMPL[metric](H, p, **kw) for p in ("best", "worst", "expected"))
            for q, (dist, grade) in enumerate(per_query):
                if math.isnan(best[q]):
                    continue
                for key in (rng.permutation(len(dist)), np.arange(len(dist))):
                    v = ref.tiebreak_value(metric, dist, grade, key.tolist(), **kw)
                    assert worst[q] - TOL <= v <= best[q] + TOL, (metric, kw, describe(H, q), v, worst[q], best[q])
                assert worst[q] - TOL <= expected[q] <= best[q] + TOL, (metric, kw, describe(H, q))


def _retrieved_counterexample():
    """d=0: 1 relevant; d=1: 1 irrelevant; d=2: 1 relevant + 1 irrelevant; K = 3."""
    H = np.zeros((1, 5, 2), dtype=np.int64)
    H[0, 0] = [0, 1]
    H[0, 1] = [1, 0]
    H[0, 2] = [1, 1]
    return H, 3


def test_ap_at_k_retrieved_bounds_are_the_extremes_over_tie_orders():
    """AP@K 'retrieved' (spec sections 2 and 4): putting the boundary group's relevant item first
    retrieves one more relevant item at a low precision and lowers AP@K, so best = 1 (it falls after
    the cut), worst = (1 + 2/3)/2 = 5/6, expected = 11/12; and the spec's example gives 1, 0.6, 0.92."""
    H, cut = _retrieved_counterexample()
    spec = np.zeros((1, 3, 2), dtype=np.int64)
    spec[0, 0], spec[0, 1], spec[0, 2] = [0, 1], [8, 0], [4, 1]
    for hist, k, want in ((H, cut, {"best": 1.0, "worst": 5 / 6, "expected": 11 / 12}),
                          (spec, 10, {"best": 1.0, "worst": 0.6, "expected": 0.92})):
        for policy, value in want.items():
            got = average_precision_at_k(hist, k, normaliser="retrieved", policy=policy)[0]
            assert abs(got - value) <= TOL, (policy, got, value)
            assert abs(value - ref.policy_value("ap_at_k", *ref.expand_histogram(hist[0]), policy, k=k,
                                                normaliser="retrieved")) <= TOL


def test_ap_at_k_retrieved_tiebreak_within_worst_best():
    H, k = _retrieved_counterexample()
    dist, grade = ref.expand_histogram(H[0])
    best = average_precision_at_k(H, k, normaliser="retrieved", policy="best")[0]
    worst = average_precision_at_k(H, k, normaliser="retrieved", policy="worst")[0]
    for key in ([0, 1, 2, 3], [0, 1, 3, 2]):
        v = ref.tiebreak_value("ap_at_k", dist, grade, key, k=k, normaliser="retrieved")
        assert worst - TOL <= v <= best + TOL


def test_ap_at_k_retrieved_tiebreak_within_policy_hull():
    # d=0: 1 relevant; d=1: 3 items, 1 relevant; K = 3: the order (rel | irr, rel, irr) gives 5/6
    H = np.zeros((1, 3, 2), dtype=np.int64)
    H[0, 0] = [0, 1]
    H[0, 1] = [2, 1]
    dist, grade = ref.expand_histogram(H[0])
    best = average_precision_at_k(H, 3, normaliser="retrieved", policy="best")[0]
    worst = average_precision_at_k(H, 3, normaliser="retrieved", policy="worst")[0]
    assert worst <= 5 / 6 + TOL and best >= 1 - TOL
    for key in ([0, 1, 2, 3], [0, 1, 3, 2], [0, 2, 3, 1]):
        v = ref.tiebreak_value("ap_at_k", dist, grade, key, k=3, normaliser="retrieved")
        assert worst - TOL <= v <= best + TOL, (v, worst, best)


# --- ROC AUC ----------------------------------------------------------------------


@settings(max_examples=40, **SETTINGS)
@given(histograms(max_items=60))
def test_roc_auc_pair_counting_and_sklearn(H):
    from sklearn.metrics import roc_auc_score

    got = roc_auc(H)
    assert got.shape == (H.shape[0],)
    for q, (dist, grade) in enumerate(items(H)):
        want = ref.to_float(ref.roc_auc_items(dist, grade))
        assert close(got[q], want), (describe(H, q), float(got[q]), want)
        if not math.isnan(want):
            sk = roc_auc_score(grade >= 1, -dist)
            assert abs(sk - want) <= TOL


# --- NDCG against scikit-learn ---------------------------------------------------------


@settings(max_examples=40, **SETTINGS)
@given(histograms_and_ks(max_items=60, n_ks=4))
def test_ndcg_sklearn(data):
    from sklearn.metrics import ndcg_score

    H, ks = data
    for k in ks:
        got = ndcg_at_k(H, k, policy="expected")
        for q, (dist, grade) in enumerate(items(H)):
            if len(dist) < 2 or not (grade >= 1).any():
                continue
            gains = (2.0 ** grade - 1.0).reshape(1, -1)
            sk = ndcg_score(gains, -dist.reshape(1, -1).astype(float), k=k)
            assert abs(got[q] - sk) <= 1e-10, (k, describe(H, q), float(got[q]), sk)


# --- Hamming-radius metrics, micro P/R/F, PR curve, AUPRC --------------------------------


def pipeline_micro(H, radii, beta=1.0) -> dict:
    """The report's ``micro_at_radius`` of H, by radius: the pipeline's per-query counts summed over every query
    (--empty-queries zero evaluates them all) and its micro scores of the sums."""
    params = MetricParams(radii=tuple(radii), beta=beta, empty_queries="zero")
    per_query = per_query_metrics(H, np.ones((H.shape[0], max(radii) + 1), dtype=np.int64), params)
    return aggregate(per_query, params)[0]["micro_at_radius"]


@settings(max_examples=40, **SETTINGS)
@given(histograms(max_items=40, max_queries=4), st.sampled_from([1.0, 0.5, 2.0, 0.3]))
def test_radius_metrics(H, beta):
    B = H.shape[1] - 1
    per_query = items(H)
    radii = sorted({0, 1, B // 2, B - 1, B} | {int(d) for dist, _ in per_query for d in dist} & set(range(B + 1)))
    radii = [r for r in radii if r >= 0]
    micro = pipeline_micro(H, radii, beta)
    for r in radii:
        p, rc = precision_at_radius(H, r), recall_at_radius(H, r)
        for q, (dist, grade) in enumerate(per_query):
            want_p = ref.to_float(ref.precision_at_radius_items(dist, grade, r))
            want_r = ref.to_float(ref.recall_at_radius_items(dist, grade, r))
            assert close(p[q], want_p), ("P@r", r, describe(H, q), float(p[q]), want_p)
            assert close(rc[q], want_r), ("R@r", r, describe(H, q), float(rc[q]), want_r)
        got = micro[str(r)]
        assert micro_at_radius(H, r, beta) == got  # the public function of H is the pipeline's value
        want = ref.micro_at_radius_items(per_query, r, beta=beta)
        for key in ("tp", "fp", "fn"):
            assert int(got[key]) == want[key], (key, r)
        for key in ("precision", "recall", "f_beta"):
            if want[key] is None:
                continue  # 0/0: not defined by the spec; see test_micro_zero_over_zero_convention
            assert close(got[key], ref.to_float(want[key])), (key, r, beta, got[key], want[key])


def test_micro_zero_over_zero_convention():
    """Not in the spec: micro P, R, F_beta when their denominator is 0. The implementation
    reports 0.0 (like the spec's macro P@r for an empty S_r); pinned here so that a change
    is noticed. Counts must be exact in any case."""
    H = np.zeros((2, 5, 2), dtype=np.int64)
    H[1, 3] = [2, 0]  # no relevant item anywhere; nothing within radius 1
    micro = pipeline_micro(H, (1, 4))
    for r, fp in ((1, 0), (4, 2)):
        got = micro[str(r)]
        assert (got["tp"], got["fp"], got["fn"]) == (0, fp, 0)
        for key in ("precision", "recall", "f_beta"):
            assert got[key] == 0.0, (r, key, got[key])


@settings(max_examples=40, **SETTINGS)
@given(histograms(max_items=40, max_queries=4))
def test_pr_curve_and_auprc(H):
    B = H.shape[1] - 1
    per_query = items(H)
    want_curve = ref.pr_curve_items(per_query, B)
    got_curve = pr_curve(H)
    total_relevant = sum(int((g >= 1).sum()) for _, g in per_query)
    assert [pt["radius"] for pt in got_curve] == [pt["radius"] for pt in want_curve]
    for g, w in zip(got_curve, want_curve, strict=True):
        assert close(g["precision"], ref.to_float(w["precision"]))
        if total_relevant:
            assert close(g["recall"], ref.to_float(w["recall"]))
    if total_relevant == 0 or not want_curve:
        return
    want = ref.auprc_items(want_curve)
    for curve in (got_curve, [dict(radius=pt["radius"], precision=ref.to_float(pt["precision"]),
                                   recall=ref.to_float(pt["recall"])) for pt in want_curve]):
        got = auprc(curve)
        assert close(got["step"], ref.to_float(want["step"])), (got, want)
        assert close(got["trapezoid"], ref.to_float(want["trapezoid"])), (got, want)


def test_pr_curve_skips_leading_empty_radii_and_auprc_by_hand():
    # query 0: d=2 -> 1 rel, 1 irr; d=3 -> 2 rel. query 1: d=3 -> 1 irr. B = 4.
    H = np.zeros((2, 5, 2), dtype=np.int64)
    H[0, 2] = [1, 1]
    H[0, 3] = [0, 2]
    H[1, 3] = [1, 0]
    curve = pr_curve(H)
    assert [pt["radius"] for pt in curve] == [2, 3, 4]
    assert [pt["precision"] for pt in curve] == pytest.approx([1 / 2, 3 / 5, 3 / 5], abs=TOL)
    assert [pt["recall"] for pt in curve] == pytest.approx([1 / 3, 1, 1], abs=TOL)
    a = auprc(curve)
    assert a["step"] == pytest.approx(1 / 2 * 1 / 3 + 3 / 5 * 2 / 3, abs=TOL)
    assert a["trapezoid"] == pytest.approx(1 / 3 * 1 / 2 + 2 / 3 * (1 / 2 + 3 / 5) / 2, abs=TOL)


# --- mLGAP and M_k -------------------------------------------------------------------


@st.composite
def coded_database(draw, bits=BITS, max_db=40):
    """Query/database bits with many duplicate and nearby codes, and class labels."""
    B = draw(st.sampled_from(bits))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    n_base = draw(st.integers(1, 5))
    base = rng.integers(0, 2, (n_base, B))

    def near(n, max_flips):
        out = base[rng.integers(0, n_base, n)].copy()
        for row in out:
            flips = rng.integers(0, max_flips + 1)
            row[rng.choice(B, size=min(flips, B), replace=False)] ^= 1
        return out

    N = draw(st.integers(0, max_db))
    Q = draw(st.integers(1, 10))
    dbbits, qbits = near(N, 2), near(Q, 2)
    n_labels = draw(st.integers(1, 3))
    return B, qbits, dbbits, rng.integers(0, n_labels, Q), rng.integers(0, n_labels, N)


@settings(max_examples=40, **SETTINGS)
@given(coded_database(), st.integers(0, 4))
def test_lgap_and_max_bucket(data, r):
    B, qbits, dbbits, qlab, dlab = data
    r = min(r, B)
    D = ref.hamming_bruteforce(qbits, dbbits)
    Gr = ref.grades_class(qlab, dlab)
    H = ref.histograms_bruteforce(D, Gr, B, 2)
    M = ref.max_bucket_bruteforce(qbits, dbbits, r)
    qw, dw = ref.pack_bits_reference(qbits), ref.pack_bits_reference(dbbits)
    if len(dw):
        codes, counts = np.unique(dw, axis=0, return_counts=True)
    else:
        codes, counts = dw, np.zeros(0, dtype=np.int64)
    got_M = max_bucket_within(qw, codes, counts.astype(np.int64), B, r)
    assert np.array_equal(got_M, M), (got_M, M)
    shells = H.sum(axis=2)[:, : r + 1]  # items at each distance let most queries skip the search
    assert np.array_equal(max_bucket_within(qw, codes, counts.astype(np.int64), B, r, shell_counts=shells), M)
    got = lgap_at_radius(H, M, r)
    for q in range(H.shape[0]):
        want = ref.to_float(ref.lgap_items(D[q], Gr[q], M[q], B, r))
        assert close(got[q], want), (q, r, describe(H, q), M[q].tolist(), float(got[q]), want)


@settings(max_examples=25, **SETTINGS)
@given(st.sampled_from([(4, 0), (12, 1), (12, 2), (64, 0), (65, 0), (65, 1), (128, 0)]),
       st.integers(0, 2**32 - 1))
def test_max_bucket_within_ball_path(cfg, seed):
    """Many distinct codes, small radius: exercises the ball-enumeration branch."""
    B, radius = cfg
    rng = np.random.default_rng(seed)
    V = ref.ball_volume(B, radius)
    N = min(2**B, 8 * V + 100 + int(rng.integers(0, 100)))
    base = rng.integers(0, 2, (3, B))
    dbbits = rng.integers(0, 2, (N, B))
    dbbits[: N // 3] = base[rng.integers(0, 3, N // 3)]  # duplicates near the queries
    for row in dbbits[: N // 3]:
        row[rng.integers(0, B)] ^= rng.integers(0, 2)
    qbits = np.vstack([base, rng.integers(0, 2, (2, B))])
    dw = ref.pack_bits_reference(dbbits)
    codes, counts = np.unique(dw, axis=0, return_counts=True)
    assert 4 * V < len(codes) or B == 4
    want = ref.max_bucket_bruteforce(qbits, dbbits, radius)
    qw = ref.pack_bits_reference(qbits)
    assert np.array_equal(max_bucket_within(qw, codes, counts.astype(np.int64), B, radius), want)
    D = ref.hamming_bruteforce(qbits, dbbits)
    shells = np.stack([(D == k).sum(axis=1) for k in range(radius + 1)], axis=1)
    got = max_bucket_within(qw, codes, counts.astype(np.int64), B, radius, shell_counts=shells)
    assert np.array_equal(got, want)


@settings(max_examples=40, **SETTINGS)
@given(st.sampled_from([(12, 2), (16, 2), (64, 2), (65, 1)]), st.integers(0, 2**32 - 1))
def test_max_bucket_within_shell_shortcut_small_buckets(cfg, seed):
    """Buckets of 1-3 items close to the queries, so shell counts are near M_{k-1}: the search
    may be skipped only where it cannot raise M_k (both the ball and the scan path)."""
    B, radius = cfg
    rng = np.random.default_rng(seed)
    qbits = rng.integers(0, 2, (6, B))
    near = []
    for q in qbits:
        for _ in range(int(rng.integers(0, 6))):
            code = q.copy()
            code[rng.choice(B, int(rng.integers(0, radius + 1)), replace=False)] ^= 1
            near += [code] * int(rng.integers(1, 4))
    far = rng.integers(0, 2, (8 * ref.ball_volume(B, radius) + 50, B))
    dbbits = np.vstack([far, *near]) if near else far
    dw, qw = ref.pack_bits_reference(dbbits), ref.pack_bits_reference(qbits)
    codes, counts = np.unique(dw, axis=0, return_counts=True)
    D = ref.hamming_bruteforce(qbits, dbbits)
    shells = np.stack([(D == k).sum(axis=1) for k in range(radius + 1)], axis=1)
    want = ref.max_bucket_bruteforce(qbits, dbbits, radius)
    for slots in ("auto", None):
        got = max_bucket_within(qw, codes, counts.astype(np.int64), B, radius, slots, shell_counts=shells)
        assert np.array_equal(got, want), (slots, got, want)


# --- histogram kernel ------------------------------------------------------------------


HIST_BITS = (1, 12, 64, 65, 128, 300)


@st.composite
def histogram_inputs(draw):
    kind = draw(st.sampled_from(["class", "multilabel", "explicit"]))
    B = draw(st.sampled_from(HIST_BITS))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    Q = draw(st.integers(1, 19))
    N = draw(st.integers(0, 50))
    base = rng.integers(0, 2, (3, B))
    qbits = base[rng.integers(0, 3, Q)] ^ (rng.random((Q, B)) < 0.05)
    dbbits = base[rng.integers(0, 3, N)] ^ (rng.random((N, B)) < 0.05)
    if kind == "class":
        max_grade = 1
        big = draw(st.booleans())  # labels outside int32: exercises the joint relabelling
        pool = np.array([-3, 0, 7, 2**40, -(2**35)] if big else [0, 1, 2])
        ql, dl = pool[rng.integers(0, len(pool), Q)], pool[rng.integers(0, len(pool), N)]
        grades = ref.grades_class(ql, dl)
        args = (ql, dl)
    elif kind == "multilabel":
        max_grade = 3
        L = draw(st.sampled_from([5, 64, 70]))
        qm = (rng.random((Q, L)) < 0.3).astype(np.int64)
        dm = (rng.random((N, L)) < 0.3).astype(np.int64)
        grades = ref.grades_multilabel(qm, dm, max_grade)
        args = (ref.pack_bits_reference(qm), ref.pack_bits_reference(dm))
    else:
        max_grade = 2
        lists = []
        for _ in range(Q):
            chosen = sorted(rng.choice(N, size=int(rng.integers(0, N + 1)), replace=False).tolist()) if N else []
            lists.append({j: int(rng.integers(-1, 5)) for j in chosen})
        grades = ref.grades_explicit(lists, N, max_grade)
        args = lists
    return kind, B, qbits.astype(np.int64), dbbits.astype(np.int64), args, grades, max_grade


def _csr(lists):
    indptr = np.zeros(len(lists) + 1, dtype=np.int64)
    indices, grades = [], []
    for q, rel in enumerate(lists):
        for j in sorted(rel):
            indices.append(j)
            grades.append(rel[j])
        indptr[q + 1] = len(indices)
    return indptr, np.array(indices, dtype=np.int64), np.array(grades, dtype=np.int64)


def _call_histogram(kind, B, qw, dw, args, max_grade, db_start=0):
    if kind == "explicit":
        return histogram_block(qw, dw, B, "explicit", _csr(args), None, db_start=db_start, max_grade=max_grade)
    return histogram_block(qw, dw, B, kind, args[0], args[1], db_start=db_start, max_grade=max_grade)


@settings(max_examples=40, **SETTINGS)
@given(histogram_inputs(), st.integers(0, 2**32 - 1))
def test_histogram_block_bruteforce_and_chunk_invariance(data, split_seed):
    kind, B, qbits, dbbits, args, grades, max_grade = data
    want = ref.histograms_bruteforce(ref.hamming_bruteforce(qbits, dbbits), grades, B, max_grade + 1)
    qw, dw = ref.pack_bits_reference(qbits), ref.pack_bits_reference(dbbits)
    one = _call_histogram(kind, B, qw, dw, args, max_grade)
    assert one.dtype == np.int64 and one.shape == want.shape
    assert np.array_equal(one, want)
    # random database chunking (absolute db_start for explicit ground truth)
    rng = np.random.default_rng(split_seed)
    N = dbbits.shape[0]
    cuts = sorted(set(rng.integers(0, N + 1, size=int(rng.integers(0, 4))).tolist()) | {0, N})
    total = np.zeros_like(one)
    for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
        if kind == "class":
            part_args = (args[0], args[1][lo:hi])
        elif kind == "multilabel":
            part_args = (args[0], args[1][lo:hi])
        else:
            part_args = args
        total += _call_histogram(kind, B, qw, dw[lo:hi], part_args, max_grade, db_start=lo)
    assert np.array_equal(total, one)
    # random query split (the explicit CSR is per query block)
    Q = qbits.shape[0]
    s = int(rng.integers(0, Q + 1))
    parts = []
    for lo, hi in ((0, s), (s, Q)):
        if hi == lo:
            continue
        if kind == "explicit":
            part_args = args[lo:hi]
        else:
            part_args = (args[0][lo:hi], args[1])
        parts.append(_call_histogram(kind, B, qw[lo:hi], dw, part_args, max_grade))
    assert np.array_equal(np.concatenate(parts), one)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("nbits", [12, 64, 100, 128, 256])
def test_fused_and_two_phase_distance_counts_match_bruteforce(monkeypatch, fused, nbits):
    """Distance-only counts (class split, explicit) by each kernel in turn, whatever this CPU would pick: codes
    of one, two and four words, a last partial tile of queries (300) and same-label runs of about 10 queries."""
    monkeypatch.setattr(histogram, "_fused_distance_counts", lambda: fused)
    rng = np.random.default_rng(nbits)
    Q, N = 300, 700  # 300 queries: the class-split route
    base = rng.integers(0, 2, (3, nbits))
    qbits = base[rng.integers(0, 3, Q)] ^ (rng.random((Q, nbits)) < 0.05)
    dbbits = base[rng.integers(0, 3, N)] ^ (rng.random((N, nbits)) < 0.05)
    ql, dl = rng.integers(0, 30, Q), rng.integers(0, 30, N)
    qw, dw = ref.pack_bits_reference(qbits), ref.pack_bits_reference(dbbits)
    dist = ref.hamming_bruteforce(qbits, dbbits)
    want = ref.histograms_bruteforce(dist, ref.grades_class(ql, dl), nbits, 2)
    assert np.array_equal(histogram_block(qw, dw, nbits, "class", ql, dl), want)
    lists = [{int(j): 2 for j in rng.choice(N, size=5, replace=False)} for _ in range(Q)]
    want = ref.histograms_bruteforce(dist, ref.grades_explicit(lists, N, 2), nbits, 3)
    assert np.array_equal(_call_histogram("explicit", nbits, qw, dw, lists, 2), want)


@pytest.mark.parametrize("nbits,concepts", [(1, 64), (12, 5), (64, 70), (64, 600), (100, 5), (128, 70)])
def test_multilabel_grouped_by_label_rows_matches_bruteforce(monkeypatch, nbits, concepts):
    """Multi-label blocks of one- and two-word codes whose label rows recur (a few label sets, heavy distance ties) are
    counted over runs of equal label rows (whatever this CPU would pick): every item (MIN_RUN 1), runs of 2 or
    more and the rest by the cell kernel, or none; grades capped below the most labels a query has, and not."""
    monkeypatch.setattr(histogram, "_grouped_multilabel", lambda: True)
    monkeypatch.setattr(histogram, "MIN_GROUPED_PAIRS", 0)
    rng = np.random.default_rng(nbits + concepts)
    Q, N = 257, 800  # 257 queries: the grouped route, and a last partial tile
    base = rng.integers(0, 2, (3, nbits))
    qbits = base[rng.integers(0, 3, Q)] ^ (rng.random((Q, nbits)) < 0.05)
    dbbits = base[rng.integers(0, 3, N)] ^ (rng.random((N, nbits)) < 0.05)
    dm = (rng.random((12, concepts)) < 0.3)[rng.integers(0, 12, N)]  # 12 label sets, runs of about 50 items
    dm[rng.random(N) < 0.3] = rng.random(concepts) < 0.3  # a 13th
    dm[: N // 5] = rng.random((N // 5, concepts)) < 0.3  # and items with label rows of their own
    qm = rng.random((Q, concepts)) < 0.3
    qw, dw = ref.pack_bits_reference(qbits), ref.pack_bits_reference(dbbits)
    ql, dl = ref.pack_bits_reference(qm), ref.pack_bits_reference(dm)
    assert histogram._labels_recur(dl)
    grouped, _, run_labels, rest = histogram._label_runs(dl)
    assert len(grouped) > N / 2 and len(rest) > 0 and len(run_labels) > 1
    most = int(qm.sum(axis=1).max())
    for max_grade in (3, most):  # grades capped (queries with more labels), and not (the cap never binds)
        want = ref.histograms_bruteforce(ref.hamming_bruteforce(qbits, dbbits),
                                         ref.grades_multilabel(qm, dm, max_grade), nbits, max_grade + 1)
        assert (histogram._cap(ql, max_grade) is None) == (max_grade == most)
        for min_run in (1, histogram.MIN_RUN, N + 1):
            monkeypatch.setattr(histogram, "MIN_RUN", min_run)
            got = histogram_block(qw, dw, nbits, "multilabel", ql, dl, max_grade=max_grade)
            assert np.array_equal(got, want), (max_grade, min_run)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 CPU names")
@pytest.mark.parametrize("cpu,features,expected", [
    ("znver3", "", (True, False)),  # AMD Zen 3: POPCNT, AVX2, no AVX-512
    ("skylake", "", (True, False)),  # Intel Skylake (client): POPCNT, AVX2, no AVX-512
    ("znver4", "", (True, True)),  # AMD Zen 4: AVX-512 VPOPCNTDQ
    ("icelake-server", "", (True, True)),  # Intel Ice Lake: AVX-512 VPOPCNTDQ
    ("znver4", "-avx512vpopcntdq", (True, False)),  # a feature turned off by NUMBA_CPU_FEATURES
    ("generic", "", (False, False)),  # baseline x86-64: no POPCNT instruction
])
def test_target_popcount_reads_numba_target(cpu, features, expected):
    """The kernels' routes follow numba's target (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES), which is read in a new
    process: the CPUs' instruction sets are public facts."""
    env = {**os.environ, "NUMBA_CPU_NAME": cpu, "NUMBA_CPU_FEATURES": features}
    code = "from hashdist.kernels.popcount import target_popcount; print(*target_popcount())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert tuple(word == "True" for word in out.stdout.split()) == expected


@pytest.mark.parametrize("nbits", [1, 64, 65, 130])
def test_pack_bits_matches_reference_packing(nbits):
    from hashdist.data.bits import pack_bits, unpack_bits

    rng = np.random.default_rng(nbits)
    bits = rng.integers(0, 2, (7, nbits))
    assert np.array_equal(pack_bits(bits), ref.pack_bits_reference(bits))
    assert np.array_equal(unpack_bits(pack_bits(bits), nbits), bits)


@pytest.mark.parametrize("shape", [(3, 5), (3, 5, 1), (3, 0, 2), (5,)])
def test_metric_functions_name_a_histogram_of_the_wrong_shape(shape):
    """The pure functions take H[q, d, g] of shape (Q, B+1, G+1 >= 2); anything else is refused by its shape."""
    for measure in (average_precision, lambda H: ndcg_at_k(H, 3), lambda H: precision_at_k(H, 3), roc_auc):
        with pytest.raises(ValueError, match=r"H must be counts of shape .*got shape " + re.escape(str(shape))):
            measure(np.zeros(shape, np.int64))
