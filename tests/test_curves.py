"""Curves over the cut-off N (P@N, R@N, the PR curve by rank) and mAP within a Hamming radius
(docs/metrics.md, section 4) against the brute-force reference (tests/reference.py).

The reference enumerates every order of the tied items (``ref.arrangements``): best/worst are the largest and
smallest value over those orders, expected is their exact mean; the means over queries follow section 3.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import reference as ref
from hypothesis import given, settings
from hypothesis import strategies as st
from test_metrics_reference import SETTINGS, TOL, close, describe, histograms, items

from hashdist.api import evaluate_local
from hashdist.metrics import POLICIES, average_precision, average_precision_at_k
from hashdist.metrics.ranking import average_precision_at_radius, cutoff_grid
from hashdist.metrics.registry import BY_KEY, per_query_key
from hashdist.metrics.summary import EMPTY_QUERY_RULES, MetricParams, aggregate, per_query_metrics
from hashdist.report.evaluation import FIGURES, plots, tables

BITS = (1, 4, 12, 65)


def one_two_five(top: int) -> set[int]:
    """1, 2, 5, 10, 20, 50, ... up to top, written out digit by digit."""
    return {int(m + "0" * j) for j in range(len(str(max(top, 1))) + 1) for m in "125" if int(m + "0" * j) <= top}


def radii_of(H) -> tuple[int, ...]:
    """Every radius for few bits; else 0, B and each occupied distance with the one before it."""
    B = H.shape[1] - 1
    if B <= 12:
        return tuple(range(B + 1))
    occupied = np.flatnonzero(H.sum(axis=(0, 2))).tolist()
    return tuple(sorted({0, B, *occupied, *(max(d - 1, 0) for d in occupied)}))


def macro_mean(values, R, rule):
    """The mean over the query set of section 3: queries with R > 0, or every query with NaN counted 0."""
    kept = [0.0 if math.isnan(v) else v for v, r in zip(values, R, strict=True) if rule == "zero" or r > 0]
    return math.fsum(kept) / len(kept) if kept else math.nan


# --- the grid of cut-offs N ------------------------------------------------------------


def test_cutoff_grid_examples():
    assert cutoff_grid((10, 100, 1000), 3000) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 3000)
    assert cutoff_grid((7, 5000), 1000) == (1, 2, 5, 7, 10, 20, 50, 100, 200, 500, 1000, 5000)
    assert cutoff_grid((10,), 1) == (1, 10)
    assert cutoff_grid((3,), 0) == (3,)
    assert cutoff_grid((3,), None) == (1, 2, 3)
    assert MetricParams(ks=(10, 100, 1000), n_database=3000).cutoffs == cutoff_grid((10, 100, 1000), 3000)
    assert MetricParams(ks=(10, 100, 1000)).cutoffs == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
    with pytest.raises(ValueError):
        cutoff_grid((0,), 10)


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.integers(1, 10**8), min_size=1, max_size=6), st.one_of(st.none(), st.integers(0, 10**8)))
def test_cutoff_grid_is_the_125_steps_nall_and_every_k(ks, n_all):
    grid = cutoff_grid(ks, n_all)
    assert list(grid) == sorted(set(grid))  # sorted, no repeats
    top = max(ks) if n_all is None else n_all
    assert set(ks) <= set(grid)
    assert top in grid or top == 0
    assert one_two_five(top) <= set(grid)
    assert all(n in ks or n == top or n in one_two_five(top) for n in grid)  # nothing else
    assert cutoff_grid(list(reversed(ks)) + ks, n_all) == grid


# --- the spec's AP@K example ------------------------------------------------------------


def spec_example(B=4):
    """docs/metrics.md section 4: d0: 1 relevant; d1: 8 irrelevant; d2: 1 relevant + 4 irrelevant."""
    H = np.zeros((1, B + 1, 2), dtype=np.int64)
    H[0, 0], H[0, 1], H[0, 2] = [0, 1], [8, 0], [4, 1]
    return H


@pytest.mark.parametrize("B", [2, 4, 65])
def test_spec_ap_at_k_example_and_its_radius_and_cutoff_values(B):
    H = spec_example(B)
    want_ap10 = {"best": 1.0, "worst": 0.6, "expected": 23 / 25}
    second = {"best": 2 / 10, "worst": 2 / 14, "expected": math.fsum(2 / i for i in range(10, 15)) / 5}
    for policy in POLICIES:
        assert abs(average_precision_at_k(H, 10, "retrieved", policy)[0] - want_ap10[policy]) <= TOL
        # S_0 and S_1 hold one relevant item, at rank 1; S_2 is the whole list: AP, and AP@14 'retrieved'
        assert average_precision_at_radius(H, 0, policy)[0] == average_precision_at_radius(H, 1, policy)[0] == 1.0
        full = average_precision_at_radius(H, 2, policy)[0]
        assert abs(full - (1 + second[policy]) / 2) <= TOL, policy
        assert abs(full - average_precision(H, policy)[0]) <= TOL
        assert abs(full - average_precision_at_k(H, 14, "retrieved", policy)[0]) <= TOL
        assert average_precision_at_radius(H, B, policy)[0] == full
    params = MetricParams(ks=(10,), radii=(0, 1, 2), n_database=14)
    metrics, _ = aggregate(per_query_metrics(H, np.ones((1, 3), dtype=np.int64), params), params)
    assert list(metrics["precision_at_n"]) == ["1", "2", "5", "10", "14"]
    # top 10: the first relevant item, plus the second with probability 1/5 (always in best, never in worst)
    for policy, hits in {"expected": 1.2, "best": 2.0, "worst": 1.0}.items():
        assert abs(metrics["precision_at_n"]["10"][policy] - hits / 10) <= TOL
        assert abs(metrics["recall_at_n"]["10"][policy] - hits / 2) <= TOL
        assert metrics["precision_at_n"]["5"][policy] == 0.2 and metrics["recall_at_n"]["5"][policy] == 0.5
        assert metrics["precision_at_n"]["14"][policy] == 2 / 14 and metrics["recall_at_n"]["14"][policy] == 1.0
        assert abs(metrics["map_at_radius"]["2"][policy] - (1 + second[policy]) / 2) <= TOL
    assert [p["n"] for p in metrics["pr_curve_by_rank"]] == [1, 2, 5, 10, 14]
    assert metrics["pr_curve_by_rank"][0] == {"n": 1, "precision": 1.0, "recall": 0.5}
    assert abs(metrics["pr_curve_by_rank"][3]["precision"] - 0.12) <= TOL
    assert abs(metrics["pr_curve_by_rank"][3]["recall"] - 0.6) <= TOL


# --- every tie order enumerated ----------------------------------------------------------


@settings(max_examples=120, **SETTINGS)
@given(histograms(max_items=8, bits=BITS), st.lists(st.integers(1, 12), min_size=1, max_size=3, unique=True),
       st.sampled_from(EMPTY_QUERY_RULES))
def test_curves_and_map_at_radius_by_enumeration(H, ks, rule):
    """P@N, R@N at every N of the grid and mAP within every radius, per query and as the reported means,
    against max/min/mean over every tie order; the PR curve by rank is the reported (R@N, P@N)."""
    radii = radii_of(H)
    params = MetricParams(ks=tuple(sorted(ks)), radii=radii, empty_queries=rule,
                          n_database=int(H.sum(axis=(1, 2)).max()))
    pq = per_query_metrics(H, np.ones((H.shape[0], max(radii) + 1), dtype=np.int64), params)
    metrics, _ = aggregate(pq, params)
    per_query, R = items(H), H[:, :, 1:].sum(axis=(1, 2))
    assert list(metrics["precision_at_n"]) == list(metrics["recall_at_n"]) == [str(n) for n in params.cutoffs]
    assert list(metrics["map_at_radius"]) == [str(r) for r in radii]
    cases = [("precision_at_n", n, "precision_at_k", dict(k=n)) for n in params.cutoffs]
    cases += [("recall_at_n", n, "recall_at_k", dict(k=n)) for n in params.cutoffs]
    cases += [("map_at_radius", r, None, dict(r=r)) for r in radii]
    for key, value, metric, kw in cases:
        for policy in POLICIES:
            got = pq[per_query_key(BY_KEY[key], value, None, policy)]
            want = [ref.to_float(ref.ap_at_radius_items(dist, grade, policy=policy, **kw)) if metric is None
                    else ref.policy_value(metric, dist, grade, policy, **kw) for dist, grade in per_query]
            for q in range(H.shape[0]):
                assert close(got[q], want[q]), (key, value, policy, describe(H, q), float(got[q]), want[q])
            assert close(metrics[key][str(value)][policy], macro_mean(want, R, rule)), (key, value, policy)
    assert metrics["pr_curve_by_rank"] == [
        {"n": n, "precision": metrics["precision_at_n"][str(n)]["expected"],
         "recall": metrics["recall_at_n"][str(n)]["expected"]} for n in params.cutoffs]
    for policy in POLICIES:  # mAP's mean follows the rule
        want = macro_mean([ref.policy_value("ap", dist, grade, policy) for dist, grade in per_query], R, rule)
        assert close(metrics["map"][policy], want), policy
    # AUC's over the queries with 0 < R < Nall, whatever the rule: one without a relevant item is never a 0
    auc = [ref.to_float(ref.roc_auc_items(dist, grade)) for dist, grade in per_query]
    defined = [a for a, r, n in zip(auc, R, H.sum(axis=(1, 2)), strict=True) if 0 < r < n]
    assert close(metrics["auc"]["expected"], math.fsum(defined) / len(defined) if defined else math.nan)


@settings(max_examples=30, **SETTINGS)
@given(histograms(max_items=60, bits=BITS))
def test_map_at_radius_on_longer_lists(H):
    """Too long to enumerate: best/worst are the grade-first/grade-last orders (the cut falls between tie groups,
    so the normaliser TP_r is fixed), expected is the reference's position-wise AP@K 'retrieved' at K = |S_r|;
    and each policy equals hashdist's own AP@K 'retrieved' at that K."""
    for r in radii_of(H):
        got = {policy: average_precision_at_radius(H, r, policy) for policy in POLICIES}
        for q, (dist, grade) in enumerate(items(H)):
            _, size, relevant = ref.radius_counts(dist, grade, r)
            for policy in ("best", "worst"):
                want = ref.grade_ordered_value("ap_at_radius", dist, grade, policy, size=size)
                assert close(got[policy][q], want), (r, policy, describe(H, q), float(got[policy][q]), want)
            if relevant == 0:
                assert all(math.isnan(got[p][q]) for p in POLICIES)
                continue
            want = ref.expected_ap_at_k_positionwise(dist, grade, size, "retrieved") if size else 0.0
            assert close(got["expected"][q], want), (r, describe(H, q), float(got["expected"][q]), want)
            if size:
                for policy in POLICIES:
                    at_k = average_precision_at_k(H[q : q + 1], size, "retrieved", policy)[0]
                    assert close(got[policy][q], at_k), (r, policy, describe(H, q))
            assert got["worst"][q] <= got["expected"][q] + TOL and got["expected"][q] <= got["best"][q] + TOL


# --- the report ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reports(class_dataset, multilabel_dataset):
    return {"class": evaluate_local(class_dataset, cache=False),
            "multilabel": evaluate_local(multilabel_dataset, cache=False, k=[5, 50, 7000], radius=[0, 3, 65])}


@pytest.mark.parametrize("name", ["class", "multilabel"])
def test_report_has_the_curves_and_map_at_radius(reports, name):
    report = reports[name].report
    m, k = report["metrics"], report["parameters"]["k"]
    grid = cutoff_grid(k, report["dataset"]["n_database"])
    assert grid[-1] == max(3000, *k) and 3000 in grid and set(k) <= set(grid)
    assert list(m["precision_at_n"]) == list(m["recall_at_n"]) == [str(n) for n in grid]
    assert list(m["map_at_radius"]) == [str(r) for r in report["parameters"]["radius"]]
    for key in ("precision_at_n", "recall_at_n", "map_at_radius"):
        for value, v in m[key].items():
            assert set(v) == set(POLICIES)
            assert 0 <= v["worst"] <= v["expected"] + 1e-12 and v["expected"] <= v["best"] + 1e-12 <= 1 + 1e-12, (
                key, value, v)
    for K in k:  # the same function at the same cut-off, over the same queries
        assert m["precision_at_n"][str(K)] == m["precision_at_k"][str(K)]
        assert m["recall_at_n"][str(K)] == m["recall_at_k"][str(K)]
    assert m["recall_at_n"][str(grid[-1])] == {p: 1.0 for p in POLICIES}
    assert m["pr_curve_by_rank"] == [{"n": n, "precision": m["precision_at_n"][str(n)]["expected"],
                                      "recall": m["recall_at_n"][str(n)]["expected"]} for n in grid]


def test_report_curves_do_not_depend_on_blocks(reports, class_dataset):
    blocked = evaluate_local(class_dataset, cache=False, query_block_rows=16, db_block_rows=500).report["metrics"]
    whole = reports["class"].report["metrics"]
    for key in ("precision_at_n", "recall_at_n", "pr_curve_by_rank", "map_at_radius"):
        assert blocked[key] == whole[key]


def test_report_plots_and_tables_show_the_curves(reports):
    ev = reports["multilabel"]
    images = plots(ev.report, ev.per_query, ev.bucket_sizes)
    names = list(images)
    assert names[names.index("radius") + 1 : names.index("radius") + 3] == ["precision_at_n", "pr_curve_by_rank"]
    for name in ("precision_at_n", "pr_curve_by_rank"):
        assert images[name] and "expected" in FIGURES[name].caption and "evaluated queries" in FIGURES[name].caption
    ranked, _, radius = (t for t in tables(ev.report) if not t[0].startswith("Hashtable"))
    labels = [row[0] for row in ranked[2]]
    assert "mAP@r=65" in labels and not any(label.startswith(("P@N", "R@N")) for label in labels)  # plotted
    assert "expected (mAP)" in radius[1]
    assert [row[radius[1].index("expected (mAP)")] for row in radius[2]] == [
        f"{ev.report['metrics']['map_at_radius'][r]['expected']:.4f}" for r in ("0", "3", "65")]
