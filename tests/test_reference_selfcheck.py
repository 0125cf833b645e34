"""Self-checks of the brute-force reference (tests/reference.py) alone.

These never touch hashdist.metrics: they pin the reference to the spec's worked
examples and check its independent routes against each other (multiset vs item
permutations, exact vs Monte Carlo, list vs vectorised, enumeration vs
position-by-position expectation), so a failure in test_metrics_reference.py can be
trusted to point at the implementation.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import reference as ref

RANKING = ("ap", "ap_at_k", "precision_at_k", "recall_at_k", "ndcg_at_k", "ndcg_structhash_at_k")


def _kwargs(metric, k, normaliser="total"):
    if metric == "ap":
        return {}
    if metric == "ap_at_k":
        return dict(k=k, normaliser=normaliser)
    return dict(k=k)


def _same(a, b, tol=1e-12):
    a, b = ref.to_float(a), ref.to_float(b)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= tol


def _random_items(rng, max_items=7, max_dist=3, max_grade=2):
    n = int(rng.integers(0, max_items + 1))
    return rng.integers(0, max_dist + 1, n), rng.integers(0, max_grade + 1, n)


# --- spec section 6 -----------------------------------------------------------


def test_worked_example_1_ap_exact_fractions():
    dist = np.zeros(10, dtype=np.int64)
    grade = np.array([1] * 5 + [0] * 5)
    assert ref.policy_exact("ap", dist, grade, "best") == 1
    assert ref.policy_exact("ap", dist, grade, "worst") == Fraction(893, 2520)
    assert ref.policy_exact("ap", dist, grade, "expected") == Fraction(27541, 45360)
    assert abs(ref.expected_ap_positionwise(dist, grade) - 27541 / 45360) < 1e-15


def worked_example_2():
    """Spec 6.2: (query bits (1, 4), database bits (N, 4), database labels (N,)), query label 1."""
    table = [("0000", 1, 1), ("0001", 2, 1), ("0010", 1, 1), ("0100", 1, 2), ("1000", 1, 2),
             ("0011", 1, 1), ("0011", 1, 2), ("0101", 1, 2), ("0110", 1, 2)]
    bits, labels = [], []
    for code, count, label in table:
        for _ in range(count):
            bits.append([int(c) for c in code])
            labels.append(label)
    return np.zeros((1, 4), dtype=np.int64), np.array(bits), np.array(labels)


def test_worked_example_2_lgap():
    qbits, dbbits, labels = worked_example_2()
    dist = ref.hamming_bruteforce(qbits, dbbits)[0]
    grade = ref.grades_class(np.array([1]), labels)[0]
    M = ref.max_bucket_bruteforce(qbits, dbbits, 2)
    assert M.tolist() == [[1, 2, 2]]
    assert [ref.ball_volume(4, k) for k in range(3)] == [1, 5, 11]
    assert [ref.precision_at_radius_items(dist, grade, k) for k in range(3)] == [1, Fraction(4, 6), Fraction(5, 10)]
    v = ref.lgap_items(dist, grade, M[0], 4, 2)
    assert v == (1 + Fraction(2, 5) + Fraction(5, 22)) / 3
    assert abs(float(v) - 0.5424242424242424) < 1e-15


# --- internal consistency -------------------------------------------------------


def test_multiset_enumeration_matches_item_permutations():
    rng = np.random.default_rng(1)
    for _ in range(60):
        dist, grade = _random_items(rng, max_items=6)
        n_arr = sum(1 for _ in ref.arrangements(dist, grade))
        assert n_arr == ref.n_arrangements(dist, grade)
        assert sum(p for p, _ in ref.arrangements(dist, grade)) == 1
        k = int(rng.integers(1, len(dist) + 3))
        for metric in ("ap", "ap_at_k", "precision_at_k", "recall_at_k"):
            for normaliser in ref.NORMALISERS if metric == "ap_at_k" else ("total",):
                kw = _kwargs(metric, k, normaliser)
                fn = ref.LIST_METRICS[metric]
                vals = [(p, fn(gr, **kw)) for p, gr in ref.arrangements_by_item_permutation(dist, grade)]
                if vals[0][1] is None:
                    assert ref.policy_exact(metric, dist, grade, "expected", **kw) is None
                    continue
                slow = sum(p * v for p, v in vals)
                assert slow == ref.policy_exact(metric, dist, grade, "expected", **kw)


def test_matrix_metrics_equal_list_metrics():
    rng = np.random.default_rng(2)
    for _ in range(200):
        n = int(rng.integers(0, 12))
        gr = rng.integers(0, 4, n)
        for k in (1, 2, 3, max(n, 1), n + 2):
            for metric in RANKING:
                for normaliser in ref.NORMALISERS if metric == "ap_at_k" else ("total",):
                    kw = _kwargs(metric, k, normaliser)
                    a = ref.LIST_METRICS[metric](gr.tolist(), **kw)
                    b = ref.MATRIX_METRICS[metric](gr.reshape(1, -1), **kw)[0]
                    assert _same(a, b), (metric, kw, gr)


def test_grade_orders_bracket_every_arrangement():
    """The grade-first / grade-last orders bound every arrangement for every metric but AP@K 'retrieved'."""
    rng = np.random.default_rng(3)
    for _ in range(80):
        dist, grade = _random_items(rng)
        k = int(rng.integers(1, len(dist) + 3))
        for metric in RANKING:
            for normaliser in ("min_k_r", "total") if metric == "ap_at_k" else ("total",):
                kw = _kwargs(metric, k, normaliser)
                best = ref.grade_ordered_value(metric, dist, grade, "best", **kw)
                worst = ref.grade_ordered_value(metric, dist, grade, "worst", **kw)
                assert best == ref.policy_value(metric, dist, grade, "best", **kw) or math.isnan(best)
                assert worst == ref.policy_value(metric, dist, grade, "worst", **kw) or math.isnan(worst)
                if math.isnan(best):
                    continue
                for _, gr in ref.arrangements(dist, grade):
                    v = ref.to_float(ref.LIST_METRICS[metric](gr, **kw))
                    assert worst - 1e-12 <= v <= best + 1e-12, (metric, kw, dist, grade, gr)


def test_monte_carlo_agrees_with_enumeration():
    rng = np.random.default_rng(4)
    for _ in range(40):
        dist, grade = _random_items(rng, max_items=8)
        k = int(rng.integers(1, len(dist) + 3))
        for metric in RANKING:
            for normaliser in ref.NORMALISERS if metric == "ap_at_k" else ("total",):
                kw = _kwargs(metric, k, normaliser)
                exact = ref.policy_value(metric, dist, grade, "expected", **kw)
                mean, se = ref.expected_mc(metric, dist, grade, 4000, rng, **kw)
                if math.isnan(exact):
                    assert math.isnan(mean)
                    continue
                assert abs(mean - exact) <= 6 * se + 5 / 4000, (metric, kw, exact, mean, se)


def test_positionwise_expectation_matches_enumeration():
    rng = np.random.default_rng(5)
    for _ in range(150):
        dist, grade = _random_items(rng, max_items=8, max_grade=3)
        assert _same(ref.policy_value("ap", dist, grade, "expected"), ref.expected_ap_positionwise(dist, grade))
        for k in range(1, len(dist) + 3):
            for normaliser in ref.NORMALISERS:
                assert _same(
                    ref.policy_value("ap_at_k", dist, grade, "expected", k=k, normaliser=normaliser),
                    ref.expected_ap_at_k_positionwise(dist, grade, k, normaliser),
                ), (dist, grade, k, normaliser)
            assert _same(ref.policy_value("ndcg_at_k", dist, grade, "expected", k=k),
                         ref.expected_ndcg_positionwise(dist, grade, k))


def test_auc_by_pairs_matches_rank_statistic():
    """Pair counting vs the Mann-Whitney statistic from midranks (scipy's rankdata)."""
    from scipy.stats import rankdata

    rng = np.random.default_rng(6)
    for _ in range(100):
        dist, grade = _random_items(rng, max_items=15)
        v = ref.roc_auc_items(dist, grade)
        rel = grade >= 1
        if rel.all() or not rel.any():
            assert v is None
            continue
        ranks = rankdata(-dist)  # larger score = closer = higher rank
        R, Qn = rel.sum(), (~rel).sum()
        U = ranks[rel].sum() - R * (R + 1) / 2
        assert abs(float(v) - U / (R * Qn)) < 1e-12


def test_ball_volume_and_hamming():
    for B in range(0, 9):
        for k in range(0, B + 2):
            assert ref.ball_volume(B, k) == ref.ball_volume_by_enumeration(B, k)
    rng = np.random.default_rng(7)
    q, d = rng.integers(0, 2, (3, 70)), rng.integers(0, 2, (5, 70))
    D = ref.hamming_bruteforce(q, d)
    for i in range(3):
        for j in range(5):
            assert D[i, j] == sum(int(a != b) for a, b in zip(q[i], d[j], strict=True))


def test_histogram_roundtrip():
    rng = np.random.default_rng(8)
    for _ in range(30):
        H = rng.integers(0, 3, (6, 3))
        dist, grade = ref.expand_histogram(H)
        assert (ref.histogram_from_items(dist, grade, 5, 3) == H).all()


def test_auprc_by_hand():
    curve = [dict(radius=0, precision=Fraction(1), recall=Fraction(1, 4)),
             dict(radius=2, precision=Fraction(1, 2), recall=Fraction(3, 4))]
    a = ref.auprc_items(curve)
    assert a["step"] == Fraction(1, 4) + Fraction(1, 2) * Fraction(1, 2)
    assert a["trapezoid"] == Fraction(1, 4) * 1 + Fraction(1, 2) * Fraction(3, 4)


def test_retrieved_normaliser_counterexample_at_reference_level():
    """AP@K('retrieved'): the grade orders are not its extremes (spec section 2); enumeration finds them."""
    dist = np.array([0, 1, 2, 2])
    grade = np.array([1, 0, 1, 0])
    kw = dict(k=3, normaliser="retrieved")
    assert ref.grade_ordered_exact("ap_at_k", dist, grade, "best", **kw) == Fraction(5, 6)
    assert ref.grade_ordered_exact("ap_at_k", dist, grade, "worst", **kw) == 1
    assert ref.policy_exact("ap_at_k", dist, grade, "best", **kw) == 1
    assert ref.policy_exact("ap_at_k", dist, grade, "worst", **kw) == Fraction(5, 6)
    assert ref.policy_exact("ap_at_k", dist, grade, "expected", **kw) == Fraction(11, 12)
    spec_example = (np.array([0] + [1] * 8 + [2] * 5), np.array([1] + [0] * 8 + [1] + [0] * 4))  # section 4
    assert [ref.policy_exact("ap_at_k", *spec_example, p, k=10, normaliser="retrieved")
            for p in ("best", "worst", "expected")] == [1, Fraction(3, 5), Fraction(23, 25)]


@pytest.mark.parametrize("nbits", [1, 63, 64, 65, 130])
def test_reference_packing(nbits):
    rng = np.random.default_rng(nbits)
    bits = rng.integers(0, 2, (5, nbits))
    words = ref.pack_bits_reference(bits)
    for i in range(5):
        for b in range(nbits):
            assert (int(words[i, b // 64]) >> (b % 64)) & 1 == bits[i, b]


# --- audit of the spec's closed forms (section 4) against enumeration -------------------
#
# These transcribe the spec's formulas literally (exact rationals) and compare them with
# the brute-force reference. They test the SPEC TEXT, not hashdist: if one fails, the
# spec's formula is wrong (or transcribed wrongly here).


def _dH(a, b):
    return sum((Fraction(1, i) for i in range(a + 1, b + 1)), Fraction(0))


def _T(N, n):
    t = n - (N + 1) * _dH(N, N + n)
    assert t == sum((Fraction(j - 1, N + j) for j in range(1, n + 1)), Fraction(0))
    return t


def _groups(dist, grade):
    """[(n, r, N, R'), ...] per occupied distance."""
    out, N, Rp = [], 0, 0
    for _, n, r, _ in ref.group_sizes(dist, grade):
        out.append((n, r, N, Rp))
        N += n
        Rp += r
    return out


def _spec_group_expected(n, r, N, Rp, m):
    a = Fraction(r - 1, n - 1) if n > 1 else Fraction(0)
    return Fraction(r, n) * ((Rp + 1) * _dH(N, N + m) + a * _T(N, m))


def spec_ap(dist, grade, policy):
    groups = _groups(dist, grade)
    R = sum(g[1] for g in groups)
    if R == 0:
        return None
    s = Fraction(0)
    for n, r, N, Rp in groups:
        if policy == "expected":
            s += _spec_group_expected(n, r, N, Rp, n)
        elif policy == "best":
            s += r + (Rp - N) * _dH(N, N + r)
        else:
            M = N + n - r
            s += r + (Rp - M) * _dH(M, M + r)
    return s / R


def spec_ap_at_k_expected(dist, grade, k, normaliser):
    from math import comb

    groups = _groups(dist, grade)
    R = sum(g[1] for g in groups)
    if R == 0:
        return None
    S = Fraction(0)
    for n, r, N, Rp in groups:
        if N >= k:  # the previous group ended exactly at rank K
            break
        if N + n <= k:
            S += _spec_group_expected(n, r, N, Rp, n)
            continue
        m = k - N
        if normaliser != "retrieved":
            return (S + _spec_group_expected(n, r, N, Rp, m)) / (min(k, R) if normaliser == "min_k_r" else R)
        E = Fraction(0)
        for x in range(0, min(r, m) + 1):
            p = Fraction(comb(r, x) * comb(n - r, m - x), comb(n, m))
            if p == 0 or Rp + x == 0:
                continue
            E += p * (S + _spec_group_expected(m, x, N, Rp, m)) / (Rp + x)
        return E
    if normaliser == "retrieved":
        retrieved = sum(r for n, r, N, Rp in groups if N + n <= k)
        return S / retrieved if retrieved else Fraction(0)
    return S / (R if normaliser == "total" else min(k, R))


def spec_auc(dist, grade):
    groups = ref.group_sizes(dist, grade)
    R = sum(g[2] for g in groups)
    Qn = sum(g[1] - g[2] for g in groups)
    if R == 0 or Qn == 0:
        return None
    s = Fraction(0)
    for i, (_, n, r, _) in enumerate(groups):
        q_later = sum(g[1] - g[2] for g in groups[i + 1:])
        s += r * (q_later + Fraction(n - r, 2))
    return s / (R * Qn)


def test_spec_closed_forms_match_enumeration():
    rng = np.random.default_rng(9)
    for _ in range(100):
        dist, grade = _random_items(rng, max_items=8, max_grade=2)
        for policy in ref.POLICIES:
            assert spec_ap(dist, grade, policy) == ref.policy_exact("ap", dist, grade, policy), (dist, grade, policy)
        assert spec_auc(dist, grade) == ref.roc_auc_items(dist, grade)
        for k in range(1, len(dist) + 3):
            for normaliser in ref.NORMALISERS:
                assert spec_ap_at_k_expected(dist, grade, k, normaliser) == ref.policy_exact(
                    "ap_at_k", dist, grade, "expected", k=k, normaliser=normaliser), (dist, grade, k, normaliser)
            # P@K: E[relevant in top K] = R'_b + m r_b / n_b
            hits = Fraction(0)
            for n, r, N, Rp in _groups(dist, grade):
                if N < k:
                    hits = Rp + Fraction(min(k - N, n) * r, n)
            # ... over K, or over Nall when K > Nall (K > Nall behaves as K = Nall)
            assert hits / (min(k, len(dist)) or k) == ref.policy_exact("precision_at_k", dist, grade, "expected", k=k)
