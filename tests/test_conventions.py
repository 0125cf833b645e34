"""Conventions of published evaluation scripts (docs/metrics.md, section 3b) against independent references.

The references below transcribe each script's logic on explicit ranked relevance lists (one per query):
DeepHash-pytorch's ``CalcTopMap``, HashNet's ``mean_average_precision`` and trec_eval's ``map_cut``. Without
ties the list is unique and every tie policy must give the script's number. With heavy ties every combination
of tie orders across ALL queries is enumerated (``ref.arrangements`` per query, ``itertools.product`` across
them): expected is the mean over the combinations, best the largest, worst the smallest; this includes
HashNet's query set, which then depends on the tie order.
"""

import itertools
import json
import math
from fractions import Fraction

import numpy as np
import pytest

from hashdist.api import evaluate_local, prepare
from hashdist.cli import main
from hashdist.engine.blocks import Block
from hashdist.engine.compute import compute_histogram
from hashdist.errors import InputError
from hashdist.metrics.conventions import (
    CONVENTIONS,
    conventions_report,
    expectations_leaving_out,
    extreme_mean,
    poisson_binomial,
)
from hashdist.metrics.summary import MetricParams, per_query_metrics
from hashdist.options import EvaluateOptions
from tests import reference as ref

histogram = ref.histogram_of_groups  # queries as {distance: (irrelevant, relevant)}

NAMES = tuple(c.name for c in CONVENTIONS)
TOL = 1e-12


# --- the scripts, transcribed onto ranked relevance lists (grade >= 1 is relevant) ---------------


def calc_top_map(ranked, topk):
    """DeepHash-pytorch ``CalcTopMap``: over every query, AP of the top K over its relevant count, 0 if none."""
    topkmap = 0.0
    for gr in ranked:
        tgnd = (np.asarray(gr[:topk]) >= 1).astype(np.float64)
        tsum = int(np.sum(tgnd))
        if tsum == 0:
            continue
        count = np.linspace(1, tsum, tsum)
        tindex = np.asarray(np.where(tgnd == 1)) + 1.0
        topkmap += np.mean(count / tindex)
    return topkmap / len(ranked)


def hashnet_map(ranked, R):
    """HashNet's ``mean_average_precision(R)``: queries without a relevant item in the top R are skipped.

    HashNet's ``np.mean`` of no query is NaN; docs/metrics.md (section 3b) defines it as 0.
    """
    APx = []
    for gr in ranked:
        imatch = np.asarray(gr[:R]) >= 1
        relevant_num = np.sum(imatch)
        Lx = np.cumsum(imatch)
        Px = Lx.astype(float) / np.arange(1, len(imatch) + 1, 1)  # HashNet: np.arange(1, R + 1), lists >= R long
        if relevant_num != 0:
            APx.append(np.sum(Px * imatch) / relevant_num)
    return float(np.mean(np.array(APx))) if APx else 0.0


def trec_map_cut(ranked, cutoff):
    """trec_eval ``map_cut``: precisions at the relevant ranks <= cutoff over num_rel; queries with num_rel > 0."""
    values = []
    for gr in ranked:
        num_rel = sum(1 for g in gr if g >= 1)
        if num_rel == 0:
            continue
        rel_so_far, total = 0, 0.0
        for i, g in enumerate(gr[:cutoff]):
            if g >= 1:
                rel_so_far += 1
                total += rel_so_far / (i + 1)
        values.append(total / num_rel)
    return float(np.mean(values)) if values else math.nan


SCRIPTS = {"deephash": calc_top_map, "hashnet": hashnet_map, "trec": trec_map_cut}


def hashdist_conventions(H, ks):
    """report["conventions"] as hashdist computes it from the histogram alone."""
    params = MetricParams(ks=tuple(ks), radii=(0,), conventions=NAMES)
    per_query = per_query_metrics(H, np.ones((H.shape[0], 1), np.int64), params)
    return conventions_report(per_query, NAMES, ks)


def assert_close(got, want, what):
    assert (math.isnan(got) and math.isnan(want)) or abs(got - want) <= TOL, (what, got, want)


# --- (a) no ties: every policy is the script's number ----------------------------------------------


def tie_free_histogram(rng, Q, B=40):
    """At most one item per distance; some queries without relevant items, some with few."""
    H = np.zeros((Q, B + 1, 3), np.int64)
    for q in range(Q):
        dists = rng.choice(B + 1, size=rng.integers(1, B + 2), replace=False)
        p_relevant = rng.choice([0.0, 0.1, 0.4, 0.8])
        for d in dists:
            H[q, d, rng.choice(3, p=[1 - p_relevant, p_relevant / 2, p_relevant / 2])] = 1
    return H


@pytest.mark.parametrize("seed", range(5))
def test_tie_free_data_gives_each_scripts_number_for_every_policy(seed):
    rng = np.random.default_rng(seed)
    H = tie_free_histogram(rng, Q=int(rng.integers(1, 25)))
    ks = [1, 2, 5, 10, 30, 60]
    ranked = []
    for q in range(H.shape[0]):
        dist, grade = ref.expand_histogram(H[q])
        ranked.append(grade[np.argsort(dist, kind="stable")].tolist())  # the scripts: np.argsort(hamm)
    got = hashdist_conventions(H, ks)
    for name, script in SCRIPTS.items():
        for k in ks:
            want = script(ranked, k)
            for policy, value in got[name]["map_at_k"][str(k)].items():
                assert_close(value, want, (name, k, policy))


# --- (b) heavy ties: enumerate every combination of tie orders across all queries ------------------


def top_k_orders(Hq, k):
    """{top-K prefix: (probability, one full ranked list with it)} over the query's tie orders."""
    dist, grade = ref.expand_histogram(Hq)
    out = {}
    for prob, gr in ref.arrangements(dist, grade):
        key = tuple(gr[:k])
        p, example = out.get(key, (Fraction(0), gr))
        out[key] = (p + prob, example)
    return list(out.values())


def enumerated(H, k):
    """{convention: {expected, best, worst}} over every combination of the queries' tie orders."""
    per_query = [top_k_orders(H[q], k) for q in range(H.shape[0])]
    values = {name: [] for name in SCRIPTS}
    for combo in itertools.product(*per_query):
        prob = math.prod(p for p, _ in combo)
        ranked = [gr for _, gr in combo]
        for name, script in SCRIPTS.items():
            values[name].append((prob, script(ranked, k)))
    return {name: {"expected": math.fsum(float(p) * v for p, v in vs), "best": max(v for _, v in vs),
                   "worst": min(v for _, v in vs)} for name, vs in values.items()}


HAND_MADE = {
    # hashnet: one query in the mean only when its boundary group puts a relevant item in the top K,
    # one always in it, one never (R = 0)
    "sometimes, always, never": (histogram([{0: (2, 0), 1: (3, 2)}, {0: (1, 1), 1: (2, 2)}, {0: (4, 0)}]), [3, 4]),
    # no query is in hashnet's mean for sure: its worst is the empty mean, 0
    "no query certain": (histogram([{0: (1, 0), 1: (3, 2)}, {1: (2, 1), 2: (1, 1)}]), [2, 3]),
    # the boundary group holds too few irrelevant items to fill the cut: always in the mean
    "boundary forces a relevant item": (histogram([{0: (2, 0), 1: (1, 3)}, {0: (0, 1), 2: (4, 1)}]), [3, 4]),
    # K beyond every list, and a query without any item
    "K beyond the lists": (histogram([{1: (2, 1), 3: (1, 1)}, {}, {0: (1, 0), 2: (1, 2)}]), [9]),
    # two queries in hashnet's mean by chance (different probabilities), one for sure; then three by chance
    "two by chance, one sure": (histogram([{0: (1, 0), 1: (3, 2)}, {1: (2, 2)}, {0: (0, 1), 1: (3, 1)}]), [2, 3]),
    "three by chance": (histogram([{0: (1, 0), 1: (3, 2)}, {1: (2, 2)}, {2: (4, 1)}]), [1, 2]),
    # nothing relevant in any top K
    "nothing relevant at the top": (histogram([{0: (3, 0), 1: (1, 2)}, {0: (2, 0), 2: (1, 1)}]), [2]),
}


def random_heavy_ties(rng):
    """2-3 queries on 4 distances, groups of 1-5 items; K at, just before or just after group boundaries."""
    H = histogram(ref.random_group_queries(rng, 2, 3, 5))
    ends = {int(e) for q in range(H.shape[0]) for e in np.cumsum(H[q].sum(axis=1)) if e}
    candidates = sorted({max(1, e + shift) for e in ends for shift in (-2, -1, 0, 1)})
    return H, sorted(rng.choice(candidates, size=min(3, len(candidates)), replace=False).tolist())


CASES = [(name, *case) for name, case in HAND_MADE.items()]
CASES += [(f"random {seed}", *random_heavy_ties(np.random.default_rng(seed))) for seed in range(40)]


@pytest.mark.parametrize("name, H, ks", CASES, ids=[c[0] for c in CASES])
def test_heavy_ties_expected_best_worst_are_mean_max_min_over_all_tie_orders(name, H, ks):
    got = hashdist_conventions(H, ks)
    for k in ks:
        want = enumerated(H, k)
        for convention, values in want.items():
            for policy, value in values.items():
                assert_close(got[convention]["map_at_k"][str(k)][policy], value, (convention, k, policy))


def test_hand_made_cases_reach_every_hashnet_situation():
    """The cases above do exercise what makes hashnet hard: a query set that depends on the tie order."""
    H, ks = HAND_MADE["no query certain"]
    assert hashdist_conventions(H, ks)["hashnet"]["map_at_k"]["2"]["worst"] == 0.0
    H, ks = HAND_MADE["sometimes, always, never"]
    params = MetricParams(ks=(3,), radii=(0,), conventions=("hashnet",))
    per_query = per_query_metrics(H, np.ones((3, 1), np.int64), params)
    assert per_query["hashnet/3/state"].tolist() == [1, 2, 0]
    assert per_query["hashnet/3/p"][0] == pytest.approx(2 / 5)  # one slot of a group of 5 holding 2 relevant


# --- the pieces of hashnet's expectation and bounds ------------------------------------------------


def exact_leave_one_out(p, C):
    """E[1/(1 + C + S_{-q})] per q, by a sequential DP in rationals."""
    out = []
    for q in range(len(p)):
        dist = [Fraction(1)]
        for i, pi in enumerate(p):
            if i != q:
                dist = [(dist[s] if s < len(dist) else 0) * (1 - pi) + (dist[s - 1] * pi if s else 0)
                        for s in range(len(dist) + 1)]
        out.append(sum(f / (1 + C + s) for s, f in enumerate(dist)))
    return out


@pytest.mark.parametrize("n, C", [(1, 0), (2, 3), (7, 0), (12, 5)])
def test_poisson_binomial_and_leave_one_out_expectations_are_exact(n, C):
    rng = np.random.default_rng(n + C)
    p = [Fraction(int(a), 64) for a in rng.integers(0, 65, n)]
    pf = np.array([float(x) for x in p])
    got = expectations_leaving_out(pf, 1.0 / (1 + C + np.arange(n)))
    np.testing.assert_allclose(got, [float(x) for x in exact_leave_one_out(p, C)], rtol=1e-14, atol=0)
    want = [Fraction(1)]
    for pi in p:
        want = [(want[s] if s < len(want) else 0) * (1 - pi) + (want[s - 1] * pi if s else 0)
                for s in range(len(want) + 1)]
    np.testing.assert_allclose(poisson_binomial(pf), [float(x) for x in want], rtol=1e-13, atol=1e-300)


def test_leave_one_out_expectations_for_many_queries():
    """300 random queries, several levels of halving: each against its own sequential DP."""
    rng = np.random.default_rng(0)
    p = rng.random(300) ** 3
    h = 1.0 / (4 + np.arange(300))
    got = expectations_leaving_out(p, h)
    for q in range(0, 300, 7):
        dist = np.ones(1)
        for pi in np.delete(p, q):
            dist = np.convolve(dist, [1 - pi, pi])
        assert abs(got[q] - dist @ h) <= 1e-14


@pytest.mark.parametrize("seed", range(40))
def test_extreme_mean_is_the_best_and_worst_subset(seed):
    rng = np.random.default_rng(seed)
    fixed, optional = rng.random(int(rng.integers(0, 4))), rng.random(int(rng.integers(0, 9)))
    means = [math.fsum([*fixed, *s]) / (len(fixed) + len(s)) if len(fixed) + len(s) else 0.0
             for size in range(len(optional) + 1) for s in itertools.combinations(optional.tolist(), size)]
    assert abs(extreme_mean(fixed, optional, True) - max(means)) <= 1e-15
    assert abs(extreme_mean(fixed, optional, False) - min(means)) <= 1e-15


# --- the pipeline, bad input, the command line ---------------------------------------------------


def test_report_conventions_match_the_histogram_and_the_default_metrics(class_dataset):
    """The report (blocks of 16 queries) equals the conventions of the whole histogram at once; trec's mean is
    the default map_at_k 'total', and deephash's the 'retrieved' one times the evaluated share."""
    ks = [5, 100]
    ev = evaluate_local(class_dataset, cache=False, k=ks, conventions=list(NAMES), query_block_rows=16)
    report = ev.report
    assert report["parameters"]["conventions"] == list(NAMES)
    _, _, plan, *_ = prepare(class_dataset)
    ds_q, ds_n = report["dataset"]["n_queries"], report["dataset"]["n_database"]
    H = compute_histogram(plan, Block(0, ds_q, 0, ds_n, ""))["H"]
    assert report["conventions"] == hashdist_conventions(H, ks)
    q = report["queries"]
    for k in map(str, ks):
        assert report["conventions"]["trec"]["map_at_k"][k] == report["metrics"]["map_at_k"][k]["total"]
        for policy, value in report["conventions"]["deephash"]["map_at_k"][k].items():
            default = report["metrics"]["map_at_k"][k]["retrieved"][policy]
            assert value == pytest.approx(default * q["evaluated"] / q["total"], abs=TOL)


def test_unknown_convention_is_bad_input(class_dataset):
    with pytest.raises(InputError, match="'bogus'.*deephash, hashnet, trec"):
        EvaluateOptions(conventions=("trec", "bogus"))
    with pytest.raises(InputError, match="bogus"):
        prepare(class_dataset, conventions=["bogus"])


def test_cli_refuses_an_unknown_convention_in_one_line(class_dataset, tmp_path, capsys):
    out = tmp_path / "r"
    status = main(["evaluate", class_dataset, "--out", str(out), "--engine", "local", "--convention", "bogus"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and "bogus" in lines[0] and "Traceback" not in err
    assert not out.exists()


def test_cli_prints_each_convention_under_the_script_it_reproduces(class_dataset, tmp_path, capsys):
    out = tmp_path / "r"
    argv = ["evaluate", class_dataset, "--out", str(out), "--engine", "local", "--no-cache", "--no-html",
            "--k", "5", "--convention", "hashnet", "--convention", "deephash"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert list(report["conventions"]) == ["hashnet", "deephash"]
    for name, script in (("hashnet", "HashNet's mean_average_precision(R=K)"),
                         ("deephash", "DeepHash-pytorch CalcTopMap(topk=K)")):
        heading = next(line for line in text.splitlines() if line.startswith(f"{name}: "))
        assert script in heading
        row = text.splitlines()[text.splitlines().index(heading) + 2]
        values = report["conventions"][name]["map_at_k"]["5"]
        assert row.split() == ["mAP@5", *(f"{values[p]:.4f}" for p in ("expected", "best", "worst"))]
    assert "trec_eval" not in text
