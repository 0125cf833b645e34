"""The certified interval of a real-valued distance (docs/metrics.md, section 4b; issue #44).

hashdist counts weighted Hamming and asymmetric distances into bins and reports each order-dependent metric as
[worst, best] over the orders inside bins. The reference here ranks every item by its EXACT distance (the
Fraction of each float64, summed exactly: tests/reference.py) and takes the worst and best orders of exactly
equal distances; hashdist's interval must contain that one, per query and for the mean. The histograms are
also compared with an exact binning: each item in the bin whose exact edges (the axis's definition) hold its
exact distance, which is what makes the binning monotone in the exact distance.
"""

from __future__ import annotations

import bisect
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hashdist
from hashdist.data.bits import pack_bits
from hashdist.kernels import binned
from hashdist.kernels.binned import binned_histogram_block
from hashdist.kernels.distance import CUT_SENTINEL, asymmetric_axis, query_tables, weighted_axis
from hashdist.metrics import ranking
from tests import reference as ref

TOL = 1e-12
KS = (1, 5, 20)


# ----------------------------------------------------------------------------
# the exact reference and the comparison
# ----------------------------------------------------------------------------


def _reference(dist_row, grade_row):
    """{metric: (worst, best)} of one query, ranked by its exact distances (equal values tied)."""
    ranks = ref.exact_ranks(list(dist_row))
    lists = {policy: ref.ranked_list(ranks, grade_row, policy) for policy in ("worst", "best")}
    out = {}
    for name, fn in _list_metrics().items():
        out[name] = tuple(ref.to_float(fn(lists[policy])) for policy in ("worst", "best"))
    return out


def _list_metrics():
    metrics = {"ap": ref.ap_list, "auc": ref.auc_list}
    for k in KS:
        metrics[f"precision/{k}"] = lambda gr, k=k: ref.precision_at_k_list(gr, k)
        metrics[f"recall/{k}"] = lambda gr, k=k: ref.recall_at_k_list(gr, k)
        metrics[f"ndcg/{k}"] = lambda gr, k=k: ref.ndcg_list(gr, k)
        metrics[f"ndcg_structhash/{k}"] = lambda gr, k=k: ref.ndcg_structhash_list(gr, k)
        for normaliser in ("min_k_r", "total"):  # 'retrieved': its extremes are not the grade orders
            metrics[f"ap_at_k/{k}/{normaliser}"] = lambda gr, k=k, n=normaliser: ref.ap_at_k_list(gr, k, n)
    return metrics


def _hashdist(H, policy):
    """{metric: per-query values} of hashdist's histograms under a tie policy."""
    out = {"ap": ranking.average_precision(H, policy), "auc": ranking.roc_auc(H, policy)}
    for k in KS:
        out[f"precision/{k}"] = ranking.precision_at_k(H, k, policy)
        out[f"recall/{k}"] = ranking.recall_at_k(H, k, policy)
        out[f"ndcg/{k}"] = ranking.ndcg_at_k(H, k, policy)
        out[f"ndcg_structhash/{k}"] = ranking.ndcg_structhash_at_k(H, k, policy)
        for normaliser in ("min_k_r", "total"):
            out[f"ap_at_k/{k}/{normaliser}"] = ranking.average_precision_at_k(H, k, normaliser, policy)
    return out


def _check_contains(H, dist, grades, exact=False):
    """hashdist's [worst, best] contains the exact one for every query and metric (equals it when ``exact``);
    returns the reference's per-query values."""
    worst, best = _hashdist(H, "worst"), _hashdist(H, "best")
    refs = [_reference(dist[q], grades[q]) for q in range(len(dist))]
    for q, want in enumerate(refs):
        for name, (w, b) in want.items():
            got = (worst[name][q], best[name][q])
            if np.isnan(w):
                assert np.isnan(got[0]) and np.isnan(got[1]), (name, q)
                continue
            assert got[0] - TOL <= w <= b <= got[1] + TOL, (name, q, got, (w, b))
            if exact:
                assert got[0] == pytest.approx(w, abs=TOL) and got[1] == pytest.approx(b, abs=TOL), (name, q)
    return refs


def _check_mean(report, refs, name="ap", key="map", exact=False):
    """The report's mean [worst, best] contains the mean of the exact per-query ones (queries with a value)."""
    values = np.array([r[name] for r in refs if not np.isnan(r[name][0])])
    w, b = values.mean(axis=0)
    got = report["metrics"][key]
    assert got["worst"] - TOL <= w <= b <= got["best"] + TOL, (got, w, b)
    if exact:
        assert got["worst"] == pytest.approx(w, abs=TOL) and got["best"] == pytest.approx(b, abs=TOL)


def _exact_edges(axis):
    """Each bin's exact upper edge but the last's (open above), by the axis's definition: equal bin u ends at
    lo + (u + 1) W 2^-k, and a radius inside it splits it at r."""
    edges = []
    for u in range(axis.n_equal):
        c = int(axis.first_cut[u])
        while axis.cuts[c] != CUT_SENTINEL:
            edges.append(Fraction(float(axis.cut_radii[c])))
            c += 1
        edges.append(Fraction(axis.lo) + Fraction((u + 1) * axis.width) * Fraction(2) ** -axis.scale_exp)
    return edges[:-1]


def _check_exact_binning(H, axis, dist, grades):
    """H counts each item in the bin of its exact distance: edges[i-1] < d <= edges[i]."""
    edges = _exact_edges(axis)
    want = np.zeros_like(H)
    for q in range(len(dist)):
        for d, g in zip(dist[q], grades[q], strict=True):
            want[q, bisect.bisect_left(edges, d), g] += 1
    assert (H == want).all()
    for r, position in axis.radius_bins.items():  # bins 0..position(r) hold exactly the items within r
        within = [sum(1 for d in row if d <= Fraction(r)) for row in dist]
        assert (H[:, : position + 1].sum(axis=(1, 2)) == within).all(), r


def _histogram(axis, qb, db, kind, ql, dl, scores=None, max_grade=1):
    if kind == "multilabel":
        ql, dl = pack_bits(ql), pack_bits(dl)
    return binned_histogram_block(axis, pack_bits(qb), pack_bits(db), qb.shape[1], kind, ql, dl, scores=scores,
                                  max_grade=max_grade)


def _grades(kind, ql, dl, max_grade=1):
    if kind == "class":
        return ref.grades_class(ql, dl)
    return ref.grades_multilabel(ql, dl, max_grade)


# ----------------------------------------------------------------------------
# cases
# ----------------------------------------------------------------------------


def _repro(seed, n_q=30, n_db=2500, nbits=12, classes=5):
    """Issue #44: database items drawn from 50 codes per class, integer scores +-1, +-2, +-3 as float32."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 2, (classes, 50, nbits))
    dl, ql = rng.integers(0, classes, n_db), rng.integers(0, classes, n_q)
    db, qb = codes[dl, rng.integers(0, 50, n_db)], codes[ql, rng.integers(0, 50, n_q)]
    y = rng.choice([-3, -2, -1, 1, 2, 3], (n_q, nbits)).astype(np.float32)
    return qb, db, ql, dl, y


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_issue_44_repro_is_exact(seed):
    """Integer scores: the distances are integers of few values, one bin each, and the interval is the exact one
    (it used to miss it: rounded partial sums split equal distances across bin edges)."""
    qb, db, ql, dl, y = _repro(seed)
    report = hashdist.evaluate_codes(qb, db, ql, dl, query_scores=y, distance_bins=4096, k=KS)
    assert report["distance"]["exact"] and report["distance"]["bins_used"] <= 73
    dist, grades = ref.exact_asymmetric_distances(y, db), ref.grades_class(ql, dl)
    axis = asymmetric_axis(y.astype(np.float64), 4096, (0, 1, 2), "")
    refs = _check_contains(_histogram(axis, qb, db, "class", ql, dl, scores=y.astype(np.float64)), dist, grades,
                           exact=True)
    _check_mean(report, refs, exact=True)
    _check_mean(report, refs, "auc", "auc", exact=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_issue_44_repro_on_equal_bins(seed):
    """The same scores with too few bins for one per value (63 values or so, 16 bins), and with a non-dyadic
    factor (scores 0.1 y: float64, not exact in fixed point): certified, and binned exactly."""
    qb, db, ql, dl, y = _repro(seed, n_q=12, n_db=600)
    grades = ref.grades_class(ql, dl)
    for scores in (y.astype(np.float64), 0.1 * y.astype(np.float64)):
        axis = asymmetric_axis(scores, 16, (0, 0.5), "")
        assert not axis.exact
        dist = ref.exact_asymmetric_distances(scores, db)
        H = _histogram(axis, qb, db, "class", ql, dl, scores=scores)
        _check_exact_binning(H, axis, dist, grades)
        refs = _check_contains(H, dist, grades)
    report = hashdist.evaluate_codes(qb, db, ql, dl, query_scores=scores, distance_bins=16, k=KS, radius=(0, 0.5))
    _check_mean(report, refs)


def _pair_weights(rng, nbits=16):
    """Weights in pairs (p, 1 - p) on bits i and i + 8 (different bytes), 1 - p exact (Sterbenz): they sum to
    exactly nbits / 2, so with G = nbits / 2 the equal edges are the integers, and every item whose differing
    bits are whole pairs sits exactly on one, whatever the pairs: equal distances from different codes."""
    p = rng.choice([0.7, 0.6, 0.55, 0.9, 0.65, 0.8, 0.95, 0.85], nbits // 2, replace=False)
    w = np.empty(nbits)
    w[: nbits // 2], w[nbits // 2 :] = p, 1.0 - p
    return w


def _pair_codes(rng, n, nbits=16, codes=12):
    """Items from a few codes: whole pairs flipped (on an edge) or a pair and one more bit."""
    base = rng.integers(0, 2, (codes, nbits // 2))
    pool = np.concatenate([base, base], axis=1)
    pool[codes // 2 :, rng.integers(0, nbits, codes - codes // 2)] ^= 1
    return pool[rng.integers(0, codes, n)]


@pytest.mark.parametrize("per_query", [False, True], ids=["shared", "per-query"])
def test_distances_on_bin_edges(per_query):
    rng = np.random.default_rng(11)
    qb, db = np.zeros((6, 16), dtype=np.int64), _pair_codes(rng, 400)
    qb[3:] = _pair_codes(rng, 3)
    ql, dl = rng.integers(0, 3, 6), rng.integers(0, 3, 400)
    w = np.array([_pair_weights(rng) for _ in range(6)]) if per_query else _pair_weights(rng)
    axis = weighted_axis(w, 8, (1.0, 2.5, 3.0))
    assert [float(e) for e in _exact_edges(axis)] == [1.0, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.0]
    dist, grades = ref.exact_weighted_distances(qb, db, w), ref.grades_class(ql, dl)
    on_edges = sum(1 for row in dist for d in row if d.denominator == 1 and 0 < d < 8)
    assert on_edges > 300
    H = _histogram(axis, qb, db, "class", ql, dl)
    _check_exact_binning(H, axis, dist, grades)
    refs = _check_contains(H, dist, grades)
    report = hashdist.evaluate_codes(qb, db, ql, dl, bit_weights=w, distance_bins=8, k=KS, radius=(1.0, 2.5, 3.0))
    _check_mean(report, refs)
    _check_mean(report, refs, "auc", "auc")


@pytest.mark.parametrize("weights, edge", [((1.0, 2.0, 3.0), 3), ((0.1, 0.1, 0.2), Fraction(0.2))],
                         ids=["integers", "tenths"])
def test_equal_distances_from_different_codes(weights, edge):
    """Bits {0, 1} and {2} (in different bytes) at exactly the same distance, on the one edge of 2 bins."""
    rng = np.random.default_rng(12)
    w = np.zeros(24)
    w[[0, 8, 16]] = weights
    db = np.zeros((300, 24), dtype=np.int64)
    kinds = rng.integers(0, 4, 300)
    db[kinds == 1, 0] = db[kinds == 1, 8] = 1  # {0, 1}: w0 + w1
    db[kinds == 2, 16] = 1  # {2}: w2 = w0 + w1
    db[kinds == 3, 0] = 1
    db[:, 1:8] = rng.integers(0, 2, (300, 7))  # zero weights: codes differ, distances do not
    qb, ql, dl = np.zeros((2, 24), dtype=np.int64), np.array([0, 1]), rng.integers(0, 2, 300)
    axis = weighted_axis(w, 2, ())
    assert _exact_edges(axis) == [edge]
    dist, grades = ref.exact_weighted_distances(qb, db, w), ref.grades_class(ql, dl)
    assert sum(d == edge for d in dist[0]) == (kinds == 1).sum() + (kinds == 2).sum()
    H = _histogram(axis, qb, db, "class", ql, dl)
    _check_exact_binning(H, axis, dist, grades)
    _check_contains(H, dist, grades)


def test_near_ties_across_an_edge():
    """0.1 + 0.9, 0.3 + 0.7 and 0.4 + 0.6 (float64, in different bytes) are 1 + 2.8e-17, 1 - 5.6e-17 and 1:
    with the weights summing to 8 and G = 8 the edge is exactly 1, between them."""
    w = np.zeros(56)
    w[[0, 8, 16, 24, 32, 40, 48]] = [0.1, 0.9, 0.3, 0.7, 0.4, 0.6, 5.0]
    near = {(0, 8): 1, (16, 24): -1, (32, 40): 0}
    for bits, side in near.items():
        assert (sum(Fraction(w[b]) for b in bits) > 1) - (sum(Fraction(w[b]) for b in bits) < 1) == side
    rng = np.random.default_rng(13)
    db = np.zeros((240, 56), dtype=np.int64)
    for i, bits in enumerate(near):
        db[i * 80 : (i + 1) * 80, list(bits)] = 1
    db[:, 49:56] = rng.integers(0, 2, (240, 7))
    qb, ql, dl = np.zeros((2, 56), dtype=np.int64), np.array([0, 1]), rng.integers(0, 2, 240)
    axis = weighted_axis(w, 8, (1.0,))
    assert Fraction(1) in _exact_edges(axis)
    dist, grades = ref.exact_weighted_distances(qb, db, w), ref.grades_class(ql, dl)
    H = _histogram(axis, qb, db, "class", ql, dl)
    _check_exact_binning(H, axis, dist, grades)
    assert H[0, axis.position(1.0)].sum() == 160  # exactly 1 and just below: within radius 1
    refs = _check_contains(H, dist, grades)
    report = hashdist.evaluate_codes(qb, db, ql, dl, bit_weights=w, distance_bins=8, k=KS, radius=(1.0,))
    _check_mean(report, refs)


@pytest.mark.parametrize("kind", ["class", "multilabel"])
def test_per_query_weights_and_graded_relevance(kind):
    """Per-query (Q, B) weights, pairs on edges and random ones; multi-label grades 0..3 (NDCG's interval)."""
    rng = np.random.default_rng(14)
    qb, db = _pair_codes(rng, 5), _pair_codes(rng, 300)
    w = np.array([_pair_weights(rng) if q % 2 else rng.random(16) for q in range(5)])
    if kind == "class":
        ql, dl = rng.integers(0, 3, 5), rng.integers(0, 3, 300)
    else:
        ql, dl = (rng.random((5, 6)) < 0.5).astype(np.uint8), (rng.random((300, 6)) < 0.4).astype(np.uint8)
    grades = _grades(kind, ql, dl, 3)
    for bins in (3, 8, 64):
        axis = weighted_axis(w, bins, (0.5, 2.0))
        H = _histogram(axis, qb, db, kind, ql, dl, max_grade=3)
        dist = ref.exact_weighted_distances(qb, db, w)
        _check_exact_binning(H, axis, dist, grades)
        refs = _check_contains(H, dist, grades)
    report = hashdist.evaluate_codes(qb, db, ql, dl, bit_weights=w, distance_bins=64, k=KS, radius=(0.5, 2.0),
                                     max_grade=3)
    _check_mean(report, refs)
    for k in KS:
        values = np.array([r[f"ndcg/{k}"] for r in refs])
        got = report["metrics"]["ndcg_at_k"][str(k)]
        assert got["worst"] - TOL <= values[:, 0].mean() <= values[:, 1].mean() <= got["best"] + TOL


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_asymmetric_scores(dtype):
    """Scores in pairs (p, 1 - p) of random signs: |y| sums to 4 per query, so with G = 8 the edges are the
    integers -3..3 and the distances of items flipping whole pairs are integers on them (float64: not exact in
    fixed point, placed exactly); float32 scores are exact in fixed point."""
    rng = np.random.default_rng(15)
    qb, db = _pair_codes(rng, 6), _pair_codes(rng, 300)
    y = np.array([_pair_weights(rng) * rng.choice([-1, 1], 8).repeat(2) for _ in range(6)]).astype(dtype)
    if dtype is np.float32:
        y = y + rng.normal(size=y.shape).astype(np.float32)
    ql, dl = rng.integers(0, 3, 6), rng.integers(0, 3, 300)
    scores, grades = y.astype(np.float64), ref.grades_class(ql, dl)
    dist = ref.exact_asymmetric_distances(scores, db)
    for bins in (2, 8, 100):
        axis = asymmetric_axis(scores, bins, (-1.0, 0.0, 0.25), "")
        H = _histogram(axis, qb, db, "class", ql, dl, scores=scores)
        _check_exact_binning(H, axis, dist, grades)
        refs = _check_contains(H, dist, grades)
    report = hashdist.evaluate_codes(qb, db, ql, dl, query_scores=y, distance_bins=100, k=KS, radius=(-1.0, 0.0))
    _check_mean(report, refs)


PALETTE = [0.0, 0.1, 0.2, 0.3, 0.7, 1.0 - 0.7, 0.5, 1.0, 1.0 / 3.0, 0.6, 0.4]


@settings(max_examples=100, deadline=None, database=None)
@given(st.data())
def test_heavy_ties_random(data):
    """Few distinct codes and few distinct weight (or score) values, any G and radii: binned exactly, certified."""
    nbits = data.draw(st.integers(2, 20), "nbits")
    n_codes, n_db, n_q = data.draw(st.integers(1, 6)), data.draw(st.integers(2, 40)), data.draw(st.integers(1, 3))
    values = st.sampled_from(PALETTE)
    rows = data.draw(st.lists(st.lists(values, min_size=nbits, max_size=nbits), min_size=1, max_size=n_q))
    if data.draw(st.booleans(), "pairs"):  # (p, 1 - p) on bits i, i + nbits // 2: sums of whole pairs are integers
        half = nbits // 2
        rows = [row[:half] + [1.0 - v for v in row[:half]] + row[2 * half :] for row in rows]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), "seed"))
    pool = rng.integers(0, 2, (n_codes, nbits))
    db, qb = pool[rng.integers(0, n_codes, n_db)], pool[rng.integers(0, n_codes, n_q)]
    ql, dl = rng.integers(0, 2, n_q), rng.integers(0, 2, n_db)
    bins = data.draw(st.sampled_from([1, 2, 3, 5, 8, 64, 4096]), "bins")
    radii = data.draw(st.lists(st.sampled_from([0.0, 0.3, 0.5, 1.0, 1.5, 2.0]), max_size=3), "radii")
    grades = ref.grades_class(ql, dl)
    if data.draw(st.booleans(), "asymmetric"):
        scores = np.array([np.array(rows[q % len(rows)]) * rng.choice([-1, 1], nbits) for q in range(n_q)])
        axis = asymmetric_axis(scores, bins, [r - 1.0 for r in radii if r - 1.0 >= -np.abs(scores).sum(1).max()], "")
        dist = ref.exact_asymmetric_distances(scores, db)
    else:
        scores, weights = None, np.array(rows[0]) if len(rows) == 1 else np.array([rows[q % len(rows)]
                                                                                     for q in range(n_q)])
        axis = weighted_axis(weights, bins, radii)
        dist = ref.exact_weighted_distances(qb, db, weights)
    H = _histogram(axis, qb, db, "class", ql, dl, scores=scores)
    _check_exact_binning(H, axis, dist, grades)
    _check_contains(H, dist, grades)


def test_exact_paths_have_no_interval_without_ties():
    """Integer weights 2^i (every code its own distance, D + 1 = 1024 <= G) and integer scores 2^i (values of
    one parity, 1024 of them): exact, and worst == best == the real-valued value."""
    rng = np.random.default_rng(16)
    nbits = 10
    db = np.array([[(c >> i) & 1 for i in range(nbits)] for c in rng.permutation(1 << nbits)[:300]])
    qb, ql, dl = rng.integers(0, 2, (4, nbits)), rng.integers(0, 3, 4), rng.integers(0, 3, 300)
    grades = ref.grades_class(ql, dl)
    w = 2.0 ** np.arange(nbits)
    y = w[None, :] * rng.choice([-1, 1], (4, nbits))
    for axis, dist, scores, kw in ((weighted_axis(w, 4096, ()), ref.exact_weighted_distances(qb, db, w), None,
                                    {"bit_weights": w}),
                                   (asymmetric_axis(y, 4096, (), ""), ref.exact_asymmetric_distances(y, db), y,
                                    {"query_scores": y})):
        assert axis.exact and axis.n_bins == 1024
        H = _histogram(axis, qb, db, "class", ql, dl, scores=scores)
        refs = _check_contains(H, dist, grades, exact=True)
        for r in refs:
            assert all(np.isnan(w_) or w_ == pytest.approx(b_, abs=TOL) for w_, b_ in r.values())
        report = hashdist.evaluate_codes(qb, db, ql, dl, k=KS, **kw)
        assert report["distance"]["exact"] and report["distance"]["map_interval_width"] == 0
        _check_mean(report, refs, exact=True)


def test_straddlers_are_the_same_in_every_block():
    """Thousands of straddlers (non-dyadic weights, items exactly on edges): more than the kernel's first
    buffer holds, so it counts again; the same histogram whatever the blocks, each item in its exact bin."""
    rng = np.random.default_rng(17)
    w = _pair_weights(rng)
    qb, db = _pair_codes(rng, 4), _pair_codes(rng, 1500)
    ql, dl = rng.integers(0, 3, 4), rng.integers(0, 3, 1500)
    axis = weighted_axis(w, 8, (2.5,))
    tables, offsets, deltas, xor = query_tables(axis, 16, 0, 4)
    assert (deltas > 0).all()
    geometry = (axis.width, 1.0 / axis.width, axis.first_bin, axis.first_cut, axis.cuts)
    H = np.zeros((4, axis.n_bins, 2), dtype=np.int64)
    words = (pack_bits(qb), pack_bits(db))
    pairs = binned._count(words[0], ql, words[1], dl, tables, offsets, deltas, xor, geometry, 1, H.reshape(4, -1))
    assert len(pairs) > 1024
    whole = _histogram(axis, qb, db, "class", ql, dl)
    _check_exact_binning(whole, axis, ref.exact_weighted_distances(qb, db, w), ref.grades_class(ql, dl))
    pieces = np.zeros_like(whole)
    for q0, q1 in ((0, 1), (1, 4)):
        for d0, d1 in ((0, 7), (7, 900), (900, 1500)):
            pieces[q0:q1] += binned_histogram_block(axis, words[0][q0:q1], words[1][d0:d1], 16, "class", ql[q0:q1],
                                                    dl[d0:d1], q0=q0, db_start=d0)
    assert (pieces == whole).all()


def test_explicit_relevance_straddlers():
    """Listed items whose distance straddles an edge get their grades too."""
    rng = np.random.default_rng(18)
    w = _pair_weights(rng)
    qb, db = _pair_codes(rng, 3), _pair_codes(rng, 200)
    lists = [np.sort(rng.choice(200, 40, replace=False)) for _ in range(3)]
    grades = np.zeros((3, 200), dtype=np.int64)
    for q, rows in enumerate(lists):
        grades[q, rows] = rng.integers(1, 4, 40)
    csr = (np.concatenate([[0], np.cumsum([len(r) for r in lists])]), np.concatenate(lists),
           np.concatenate([grades[q, r] for q, r in enumerate(lists)]))
    axis = weighted_axis(w, 8, (2.0,))
    H = binned_histogram_block(axis, pack_bits(qb), pack_bits(db), 16, "explicit", csr, None, max_grade=3)
    dist = ref.exact_weighted_distances(qb, db, w)
    _check_exact_binning(H, axis, dist, grades)
    _check_contains(H, dist, grades)


def test_items_with_the_query_code_are_not_straddlers():
    """Radius 0 (a default) with real weights (70 bits: two words): the query's own code is at distance 0
    exactly, on the radius; the kernel knows it (no table entry is used), so duplicates of the query cost no
    exact recomputation."""
    rng = np.random.default_rng(19)
    qb, db = rng.integers(0, 2, (3, 70)), rng.integers(0, 2, (600, 70))
    db[:500] = qb[rng.integers(0, 3, 500)]
    ql, dl = rng.integers(0, 2, 3), rng.integers(0, 2, 600)
    w = rng.random(70)
    axis = weighted_axis(w, 64, (0, 1, 2))
    tables, offsets, deltas, xor = query_tables(axis, 70, 0, 3)
    assert (deltas > 0).all()
    geometry = (axis.width, 1.0 / axis.width, axis.first_bin, axis.first_cut, axis.cuts)
    H = np.zeros((3, axis.n_bins * 2), dtype=np.int64)
    assert len(binned._count(pack_bits(qb), ql, pack_bits(db), dl, tables, offsets, deltas, xor, geometry, 1, H)) == 0
    _check_exact_binning(_histogram(axis, qb, db, "class", ql, dl), axis, ref.exact_weighted_distances(qb, db, w),
                         ref.grades_class(ql, dl))


@pytest.mark.parametrize("tail", [2.0**-54, 1.5 * 2.0**-53], ids=["total-rounded-down", "total-rounded-up"])
def test_radius_at_the_rounded_largest_distance(tail):
    """D = fsum of the weights is rounded: with 1 + 2^-54 it is 1.0, below the largest exact distance, so a
    radius D must leave the item at 1 + 2^-54 outside (a bin of its own above it); rounded up, it holds all."""
    w = np.zeros(16)
    w[[0, 8, 9]] = [1.0, tail, 0.0]
    db = np.zeros((40, 16), dtype=np.int64)
    db[:20, [0, 8]] = 1
    db[20:30, 0] = 1
    qb, ql, dl = np.zeros((1, 16), dtype=np.int64), np.array([0]), np.arange(40) % 2
    total = float(np.sum(w))
    axis = weighted_axis(w, 4, (total,))
    dist = ref.exact_weighted_distances(qb, db, w)
    H = _histogram(axis, qb, db, "class", ql, dl)
    _check_exact_binning(H, axis, dist, ref.grades_class(ql, dl))
    assert H[0, : axis.position(total) + 1].sum() == (40 if tail > 2.0**-53 else 20)
