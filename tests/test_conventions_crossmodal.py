"""The cross-modal conventions dcmh and dcmh_topk (docs/metrics.md, section 3b) against the scripts.

``tests/reference.py`` transcribes DCMH's ``calc_map`` and DCMH-PyTorch's ``calc_map_k`` line by line
(numpy, from the originals), plus an exact value of ``calc_map_k`` on a ranked list (``first_hits_list``)
and its expectation over tie orders from the distribution of each relevant item's rank
(``first_hits_expected_positionwise``). Without ties every policy must give the scripts' number; with ties
every tie order is enumerated (Fractions) on small cases, and on larger random data the scripts themselves
give best and worst (relevant items moved first / last inside ties) and lie in [worst, best] under any sort.
"""

import json
import math
import time
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import hypergeom

import hashdist
from hashdist.cli import main
from hashdist.metrics.conventions import BY_NAME, conventions_report, dcmh_topk_values
from hashdist.metrics.summary import MetricParams, per_query_metrics
from tests import reference as ref

histogram = ref.histogram_of_groups  # queries as {distance: (irrelevant, relevant)}

NAMES = ("dcmh", "dcmh_topk")
POLICIES = ("expected", "best", "worst")
TOL = 1e-12


def crossmodal(H, ks):
    """report["conventions"] for dcmh and dcmh_topk from the histogram alone."""
    params = MetricParams(ks=tuple(ks), radii=(0,), conventions=NAMES)
    per_query = per_query_metrics(H, np.ones((H.shape[0], 1), np.int64), params)
    return conventions_report(per_query, NAMES, ks)


def as_float(x):
    return 0.0 if x is None else float(x)


# --- the spec's worked check and the report's shape ------------------------------------------------


def test_spec_worked_check_one_group_of_three_with_two_relevant_at_k_1():
    """docs/metrics.md 3b (the spec's 5c): orders RRI, RIR, IRR give 1, 1, 1/2."""
    got = crossmodal(histogram([{0: (1, 2)}]), [1])
    assert got["dcmh_topk"] == {"map_at_k": {"1": pytest.approx({"expected": 5 / 6, "best": 1.0, "worst": 0.5},
                                                                 abs=1e-15)}}
    # dcmh is AP of the whole list: (1 + 1)/2, (1 + 2/3)/2, (1/2 + 2/3)/2 over the three orders
    assert got["dcmh"] == {"map": pytest.approx({"expected": (2 + 5 / 3 + 7 / 6) / 6, "best": 1.0,
                                                 "worst": 7 / 12}, abs=1e-15)}


def test_conventions_are_declared_with_their_report_keys():
    assert BY_NAME["dcmh"].key == "map" and BY_NAME["dcmh_topk"].key == "map_at_k"
    assert "calc_map" in BY_NAME["dcmh"].reproduces and "calc_map_k(k=K)" in BY_NAME["dcmh_topk"].reproduces
    assert "calculate_top_map" in BY_NAME["deephash"].reproduces  # DJSRH/JDSH top-50 = deephash at K = 50
    assert BY_NAME["deephash"].averaged == "AP@K 'retrieved'"


# --- (a) no ties: every policy is the scripts' number ----------------------------------------------


def ranked_lists(H):
    """The unique ranked grade list of each query of a tie-free histogram."""
    out = []
    for q in range(H.shape[0]):
        dist, grade = ref.expand_histogram(H[q])
        out.append(grade[np.argsort(dist, kind="stable")].tolist())
    return out


@pytest.mark.parametrize("seed", range(6))
def test_tie_free_data_gives_the_scripts_number_for_every_policy(seed):
    rng = np.random.default_rng(seed)
    Q, B = int(rng.integers(1, 20)), 40
    H = np.zeros((Q, B + 1, 2), np.int64)
    for q in range(Q):
        p = rng.choice([0.0, 0.1, 0.5, 0.9])
        for d in rng.choice(B + 1, size=int(rng.integers(1, B + 2)), replace=False):
            H[q, d, int(rng.random() < p)] = 1
    ks = [1, 2, 3, 7, 20, 60]
    got = crossmodal(H, ks)
    ranked = ranked_lists(H)
    for k in ks:
        want_map, want_k = ref.dcmh_scripts_on_ranked(ranked, k)
        exact = math.fsum(as_float(ref.first_hits_list(gr, k)) for gr in ranked) / Q
        assert abs(want_k - exact) <= TOL
        for policy in POLICIES:
            assert abs(got["dcmh_topk"]["map_at_k"][str(k)][policy] - want_k) <= TOL, (k, policy)
            assert abs(got["dcmh"]["map"][policy] - want_map) <= TOL, policy


# --- (b) heavy ties: every tie order enumerated ----------------------------------------------------


def random_small_ties(rng):
    """1-3 queries on 4 distances, groups of 1-8 items, at most 3000 distinct orders per query."""
    while True:
        H = histogram(ref.random_group_queries(rng, 1, 3, 8))
        if all(ref.n_arrangements(*ref.expand_histogram(H[q])) <= 3000 for q in range(H.shape[0])):
            return H


HAND_MADE = {
    "spec check": histogram([{0: (1, 2)}]),
    "one group of 8, half relevant": histogram([{1: (4, 4)}]),
    "straddle after a relevant group": histogram([{0: (0, 2)}, {0: (1, 1), 1: (3, 3), 3: (2, 1)}]),
    "no relevant item, and an empty query": histogram([{0: (3, 0), 2: (2, 0)}, {}, {1: (2, 2)}]),
    "relevant items only at the end": histogram([{0: (5, 0), 1: (4, 0), 2: (2, 3)}]),
}
CASES = list(HAND_MADE.items()) + [(f"random {s}", random_small_ties(np.random.default_rng(s))) for s in range(40)]


def enumerated(H, ks):
    """{dcmh: {policy: Fraction}, dcmh_topk: {K: {policy: Fraction}}} by enumerating each query's tie orders
    (orders of different queries are independent, so the mean over queries of each query's mean, max and
    min is the mean, max and min over every combination); R = 0 counts 0 in the mean over all queries.
    Checks on the way that the transcribed scripts give the exact value of every order."""
    Q = H.shape[0]
    per_query = []
    for q in range(Q):
        dist, grade = ref.expand_histogram(H[q])
        values = {}  # measure -> [(p, value)]
        for p, gr in ref.arrangements(dist, grade):
            scripts = [ref.dcmh_scripts_on_ranked([gr], k) for k in ks]
            ap = ref.ap_list(gr) or Fraction(0)
            assert all(abs(s[0] - float(ap)) <= TOL for s in scripts)
            values.setdefault("map", []).append((p, ap))
            for k, s in zip(ks, scripts, strict=True):
                v = ref.first_hits_list(gr, k) or Fraction(0)
                assert abs(s[1] - float(v)) <= TOL
                values.setdefault(k, []).append((p, v))
        per_query.append({key: {"expected": sum(p * v for p, v in vs), "best": max(v for _, v in vs),
                                "worst": min(v for _, v in vs)} for key, vs in values.items()})
    zero = dict.fromkeys(POLICIES, Fraction(0))
    return {key: {policy: sum(pq.get(key, zero)[policy] for pq in per_query) / Q for policy in POLICIES}
            for key in ("map", *ks)}


@pytest.mark.parametrize("name, H", CASES, ids=[c[0] for c in CASES])
def test_heavy_ties_expected_best_worst_are_mean_max_min_over_every_tie_order(name, H):
    R = H[:, :, 1].sum(axis=1)
    ks = sorted({1, 2, 3, *(int(x) for x in R), int(R.max()) + 1, 50} - {0})
    got = crossmodal(H, ks)
    want = enumerated(H, ks)
    for policy in POLICIES:
        assert abs(got["dcmh"]["map"][policy] - float(want["map"][policy])) <= TOL, policy
        for k in ks:
            assert abs(got["dcmh_topk"]["map_at_k"][str(k)][policy] - float(want[k][policy])) <= TOL, (k, policy)


# --- (c) the public API on random heavy-tie data ---------------------------------------------------


def random_codes(rng, kind, n_db=500, n_q=40, nbits=5):
    """{-1,+1} codes (few bits: heavy ties); labels as the scripts take them ({0,1} rows) and as hashdist
    takes them (class integers or the same multi-hot rows). Some queries have no relevant item."""
    db = rng.integers(0, 2, (n_db, nbits)) * 2 - 1
    q = rng.integers(0, 2, (n_q, nbits)) * 2 - 1
    if kind == "class":
        dbl, ql = rng.integers(0, 6, n_db), rng.integers(0, 7, n_q)  # class 6: no database item
        ql[:3] = 6
        return q, db, ql, dbl, np.eye(7)[ql], np.eye(7)[dbl]
    dbl = (rng.random((n_db, 8)) < 0.15).astype(np.int64)
    ql = (rng.random((n_q, 8)) < 0.15).astype(np.int64)
    ql[:3] = 0  # no label: nothing relevant
    return q, db, ql, dbl, ql, dbl


def script_bounds_and_expectation(qB, rB, query_L, retrieval_L, ks):
    """Per query: the scripts' AP and calc_map_k with relevant items moved first (best) or last (worst) inside
    their tie groups (a quarter-bit shift of the distance), and the expected values of the references."""
    out = {"map": {p: [] for p in POLICIES}, **{k: {p: [] for p in POLICIES} for k in ks}}
    for i in range(qB.shape[0]):
        gnd = (np.dot(query_L[i], retrieval_L.T) > 0).astype(np.float64)
        hamm = ref.dcmh_hamming(qB[i], rB)
        dist, grade = hamm.astype(np.int64), gnd.astype(np.int64)
        for policy, shift in (("best", -0.25), ("worst", 0.25)):
            out["map"][policy].append(as_float(ref.dcmh_ap(gnd, hamm + shift * gnd)))
            for k in ks:
                out[k][policy].append(as_float(ref.dcmh_ap_k(gnd, hamm + shift * gnd, k, dtype=np.float64)))
        out["map"]["expected"].append(np.nan_to_num(ref.expected_ap_positionwise(dist, grade)))
        for k in ks:
            out[k]["expected"].append(np.nan_to_num(ref.first_hits_expected_positionwise(dist, grade, k)))
    return {key: {p: math.fsum(v) / qB.shape[0] for p, v in by_policy.items()} for key, by_policy in out.items()}


@pytest.mark.parametrize("kind, zero_one", [("class", False), ("multilabel", True), ("class", True)])
def test_public_api_matches_the_scripts_and_the_references_on_random_heavy_ties(kind, zero_one):
    rng = np.random.default_rng({"class": 1, "multilabel": 2}[kind] + 10 * zero_one)
    q, db, ql, dbl, query_L, retrieval_L = random_codes(rng, kind)
    ks = [1, 5, 50, len(db)]
    codes = ((q + 1) // 2, (db + 1) // 2) if zero_one else (q, db)
    report = hashdist.evaluate_codes(*codes, ql, dbl, k=ks, conventions=list(NAMES))
    conv = report["conventions"]
    assert set(conv["dcmh"]) == {"map"} and list(conv["dcmh_topk"]["map_at_k"]) == [str(k) for k in ks]
    want = script_bounds_and_expectation(q, db, query_L, retrieval_L, ks)
    for policy in POLICIES:
        assert abs(conv["dcmh"]["map"][policy] - want["map"][policy]) <= TOL, policy
        for k in ks:
            assert abs(conv["dcmh_topk"]["map_at_k"][str(k)][policy] - want[k][policy]) <= TOL, (k, policy)
    # the scripts, whatever their sort and the database order, land in [worst, best]
    for kind_ in ("quicksort", "stable"):
        for order in (np.arange(len(db)), rng.permutation(len(db))):
            values = {"map": ref.dcmh_calc_map(q, db[order], query_L, retrieval_L[order], kind=kind_)}
            for k in ks:
                values[k] = ref.dcmh_calc_map_k(q, db[order], query_L, retrieval_L[order], k, kind_, np.float64)
                f32 = ref.dcmh_calc_map_k(q, db[order], query_L, retrieval_L[order], k, kind_)
                assert abs(f32 - values[k]) <= 1e-5  # the script's own float32
            for key, v in values.items():
                got = conv["dcmh"]["map"] if key == "map" else conv["dcmh_topk"]["map_at_k"][str(key)]
                assert got["worst"] - TOL <= v <= got["best"] + TOL, (key, kind_)
    # dcmh is the default mAP counted over every query; calc_map_k at K >= every R is calc_map
    share = report["queries"]["evaluated"] / report["queries"]["total"]
    assert report["queries"]["without_relevant"] >= 3
    for policy in POLICIES:
        assert conv["dcmh"]["map"][policy] == pytest.approx(report["metrics"]["map"][policy] * share, abs=TOL)
        assert conv["dcmh_topk"]["map_at_k"][str(len(db))][policy] == pytest.approx(conv["dcmh"]["map"][policy],
                                                                                    abs=TOL)


def test_both_directions_of_a_cross_modal_run_match_the_scripts():
    """Image and text codes over shared multi-labels: each task a->b of one run (I->T, T->I) gives what the
    scripts give for queries' a-codes against the database's b-codes (best, worst, expected as above)."""
    rng = np.random.default_rng(5)
    q, db, ql, dbl, query_L, retrieval_L = random_codes(rng, "multilabel", n_db=300, n_q=25)
    codes = {"image": (q, db), "text": (rng.integers(0, 2, q.shape) * 2 - 1, rng.integers(0, 2, db.shape) * 2 - 1)}
    ks = [1, 20]
    report = hashdist.evaluate_codes({m: c[0] for m, c in codes.items()}, {m: c[1] for m, c in codes.items()},
                                     ql, dbl, k=ks, conventions=list(NAMES))
    for task in ("image->text", "text->image"):
        a, b = task.split("->")
        want = script_bounds_and_expectation(codes[a][0], codes[b][1], query_L, retrieval_L, ks)
        conv = report["tasks"][task]["conventions"]
        for policy in POLICIES:
            assert abs(conv["dcmh"]["map"][policy] - want["map"][policy]) <= TOL, (task, policy)
            for k in ks:
                assert abs(conv["dcmh_topk"]["map_at_k"][str(k)][policy] - want[k][policy]) <= TOL, (task, k)

def test_the_scripts_own_example_lies_in_the_interval():
    """The __main__ example of DCMH's utils.py (4-bit codes, ties) through evaluate_codes."""
    qB = np.array([[1, -1, 1, 1], [-1, -1, -1, 1], [1, 1, -1, 1], [1, 1, 1, -1]])
    rB = np.array([[1, -1, 1, -1], [-1, -1, 1, -1], [-1, -1, 1, -1], [1, 1, -1, -1], [-1, 1, -1, -1],
                   [1, 1, -1, 1]])
    query_L = np.array([[0, 1, 0, 0], [1, 1, 0, 0], [1, 0, 0, 1], [0, 1, 0, 1]])
    retrieval_L = np.array([[1, 0, 0, 1], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 1, 0]])
    report = hashdist.evaluate_codes(qB, rB, query_L, retrieval_L, k=[1, 2, 6], conventions=list(NAMES))
    got = report["conventions"]
    assert got["dcmh"]["map"]["worst"] < got["dcmh"]["map"]["best"]  # the example has ties that matter
    for kind in ("quicksort", "stable"):
        v = ref.dcmh_calc_map(qB, rB, query_L, retrieval_L, kind=kind)
        assert got["dcmh"]["map"]["worst"] - TOL <= v <= got["dcmh"]["map"]["best"] + TOL
        for k in (1, 2, 6):
            v = ref.dcmh_calc_map_k(qB, rB, query_L, retrieval_L, k, kind, np.float64)
            values = got["dcmh_topk"]["map_at_k"][str(k)]
            assert values["worst"] - TOL <= v <= values["best"] + TOL


# --- (d) large tie groups: exact and fast -----------------------------------------------------------


def one_group(N_before, R_before, n, r):
    """One query: N_before items (R_before relevant) at distance 0, then a group of n items, r relevant."""
    H = np.zeros((1, 2, 2), np.int64)
    H[0, 0] = (N_before - R_before, R_before)
    H[0, 1] = (n - r, r)
    return H


@pytest.mark.parametrize("N, Rp, n, r, J", [(50, 7, 300, 120, 1), (50, 7, 300, 120, 2), (50, 7, 300, 120, 60),
                                             (50, 7, 300, 120, 119), (0, 0, 400, 3, 2), (3, 3, 250, 249, 100),
                                             (1000, 0, 120, 60, 30)])
def test_expected_matches_the_direct_sum_over_rank_distributions(N, Rp, n, r, J):
    """Against sum_j (R'+j) sum_x C(x-1,j-1) C(n-x,r-j) / C(n,r) / (N+x), exact binomials (ref)."""
    H = one_group(N, Rp, n, r)
    k = Rp + J
    dist, grade = ref.expand_histogram(H[0])
    want = ref.first_hits_expected_positionwise(dist, grade, k)
    assert abs(dcmh_topk_values(H, k)[0] - want) <= 1e-13 * max(1.0, want)


def per_slot_expectation(N, Rp, n, r, J):
    """The same sum by slots x: (r/n) E[(R'+1+Y) 1{Y <= J-1}] / (N+x), Y ~ Hypergeometric(n-1, r-1, x-1), with
    E[Y 1{Y <= c}] = (x-1)(r-1)/(n-1) P(Y' <= c-1), Y' ~ Hypergeometric(n-2, r-2, x-2) (scipy's cdf). Away
    from the slots where the cdfs move, they are 1 (early slots: the full-group term) or 0 (late slots)."""
    x = np.arange(1, n + 1, dtype=np.float64)
    centre = n * (J - 1) / (r - 1)
    spread = 15 * math.sqrt(n * (r / n) * (1 - r / n)) + 50  # > 30 standard deviations of Y
    lo, hi = int(max(1, centre - spread)), int(min(n, centre + spread))
    window = np.arange(lo, hi + 1)
    F1 = np.ones(n)
    F2 = np.ones(n)
    F1[hi:], F2[hi:] = 0.0, 0.0
    F1[lo - 1:hi] = hypergeom.cdf(J - 1, n - 1, r - 1, window - 1)
    F2[lo - 1:hi] = np.nan_to_num(hypergeom.cdf(J - 2, n - 2, r - 2, window - 2))  # x = 1: times x - 1 = 0
    assert lo == 1 or (F1[lo - 1] > 1 - 1e-16 and F2[lo - 1] > 1 - 1e-16)  # monotone in x: 1 before lo
    assert hi == n or (F1[hi - 1] < 1e-16 and F2[hi - 1] < 1e-16)  # and 0 after hi
    terms = (r / n) * ((Rp + 1) * F1 + (x - 1) * (r - 1) / (n - 1) * F2) / (N + x)
    return math.fsum(terms.tolist())


def test_a_large_group_is_fast_and_matches_the_per_slot_hypergeometric_sum():
    dcmh_topk_values(one_group(5, 1, 20, 10), 4)  # compiled
    N, Rp, n, r = 1234, 17, 100_000, 50_000
    H = one_group(N, Rp, n, r)
    for J in (1, 20_000, 49_999):
        start = time.perf_counter()
        got = dcmh_topk_values(H, Rp + J)[0]
        assert time.perf_counter() - start < 1.0
        before = math.fsum(ref._slot_terms(0, N, Rp, 0, N).tolist())  # the first group, all of it
        want = (before + per_slot_expectation(N, Rp, n, r, J)) / (Rp + J)
        assert abs(got - want) <= 1e-12 * want, (J, got, want)
    # best and worst: the first J relevant items in the group's first / last J relevant slots
    J = 20_000
    best = (Rp + math.fsum((Rp + j) / (N + j) for j in range(1, J + 1))) / (Rp + J)
    worst_before = math.fsum(j / (N - Rp + j) for j in range(1, Rp + 1))
    worst = (worst_before + math.fsum((Rp + j) / (N + n - r + j) for j in range(1, J + 1))) / (Rp + J)
    assert abs(dcmh_topk_values(H, Rp + J, "best")[0] - best) <= 1e-12
    assert abs(dcmh_topk_values(H, Rp + J, "worst")[0] - worst) <= 1e-12


def test_millions_of_tied_items_do_not_overflow():
    """n = 3,000,000 with 3 relevant (the rank distribution spans the whole group), and n = 10^7 with half
    relevant: finite, inside [worst, best], quick; the first against an explicit float sum over slots."""
    n, r = 3_000_000, 3
    H = one_group(0, 0, n, r)
    start = time.perf_counter()
    got = dcmh_topk_values(H, 2)[0]
    assert time.perf_counter() - start < 2.0
    x = np.arange(1, n + 1, dtype=np.float64)
    total = math.comb(n, 3)
    p1, p2 = (n - x) * (n - x - 1) / 2 / total, (x - 1) * (n - x) / total  # P(X_1 = x), P(X_2 = x)
    want = (math.fsum((p1 / x).tolist()) + 2 * math.fsum((p2 / x).tolist())) / 2
    assert abs(got - want) <= 1e-12 * want
    H = one_group(10, 2, 10_000_000, 5_000_000)
    start = time.perf_counter()
    values = [dcmh_topk_values(H, 2_000_000, p)[0] for p in POLICIES]
    assert time.perf_counter() - start < 2.0
    assert all(np.isfinite(values)) and values[2] < values[0] < values[1]


# --- the command line and the report page -------------------------------------------------------------


def test_cli_prints_dcmh_as_one_map_and_dcmh_topk_by_k(class_dataset, tmp_path, capsys):
    out = tmp_path / "r"
    argv = ["evaluate", class_dataset, "--out", str(out), "--engine", "local", "--no-cache", "--k", "5", "100",
            "--convention", "dcmh", "--convention", "dcmh_topk"]
    assert main(argv) == 0
    text = capsys.readouterr().out.splitlines()
    report = json.loads((out / "report.json").read_text())
    assert list(report["conventions"]) == list(NAMES) and (out / "report.html").exists()
    for name, script, rows in (("dcmh", "DCMH calc_map", [("mAP", ("map",))]),
                               ("dcmh_topk", "calc_map_k(k=K)", [("mAP@5", ("map_at_k", "5")),
                                                                 ("mAP@100", ("map_at_k", "100"))])):
        heading = next(line for line in text if line.startswith(f"{name}: "))
        assert script in heading and BY_NAME[name].averaged in heading
        for offset, (label, path) in enumerate(rows, start=2):
            values = report["conventions"][name]
            for key in path:
                values = values[key]
            assert text[text.index(heading) + offset].split() == [label, *(f"{values[p]:.4f}" for p in POLICIES)]
