"""Served lists' measures (spec section 5d) against brute force: every order of the tied items enumerated, the
measures computed directly on each ranked list (tests/reference.py's list functions), mean / min / max."""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import reference as ref

from hashdist.metrics.summary import MetricParams, aggregate, per_query_metrics
from hashdist.served.measures import ServedEntries, neighbour_recall, served_section, served_values

K_VALUES = (1, 2, 3, 5)


def _random_query(rng, n_items=7, nbits=3, max_grade=2):
    """One query's database: (distance, grade) of each item, heavy ties; and a served list of ids (served order,
    -1 padding), some ids repeated across queries, never within a row."""
    dist = rng.integers(0, nbits + 1, n_items)
    grade = rng.integers(0, max_grade + 1, n_items) * (rng.random(n_items) < 0.6)
    width = max(K_VALUES)
    length = int(rng.integers(0, width + 1))
    served = rng.permutation(n_items)[:length]
    if rng.random() < 0.5:  # an index that serves by distance, ties in any order
        served = served[np.argsort(dist[served], kind="stable")]
    ids = np.full(width, -1)
    ids[:length] = served
    return dist, grade, ids


def _orders(dist):
    """Every ranking of the items (ids) by distance, all orders inside each tie group: equally likely."""
    groups = [np.flatnonzero(dist == d).tolist() for d in sorted(set(dist.tolist()))]
    for combo in itertools.product(*(itertools.permutations(g) for g in groups)):
        yield [i for part in combo for i in part]


def _recall_reference(dist, ids, k):
    """|first k served ∩ exhaustive top k| / k over every tie order: (mean, min, max) as Fractions."""
    served = {int(i) for i in ids[:k] if i >= 0}
    values = [Fraction(len(served & set(order[:k])), k) for order in _orders(dist)]
    return sum(values) / len(values), min(values), max(values)


def _served_orders(dist, ids, k):
    """Every ranking of the first k served entries by distance, all orders of entries tied at one distance."""
    served = [int(i) for i in ids[:k] if i >= 0]
    by_distance = sorted({int(dist[i]) for i in served})
    groups = [[i for i in served if dist[i] == d] for d in by_distance]
    for combo in itertools.product(*(itertools.permutations(g) for g in groups)):
        yield [i for part in combo for i in part]


def _list_measures(ranked, grade, k):
    """The top-k measures of one served ranked list (ids; misses past its end), R and the ideal DCG from the
    database's grades: the textbook definitions, item by item."""
    gr = [int(grade[i]) for i in ranked][:k] + [0] * (k - len(ranked[:k]))
    R = int((grade > 0).sum())
    hits, s = 0, Fraction(0)
    for i, g in enumerate(gr, start=1):
        if g > 0:
            hits += 1
            s += Fraction(hits, i)
    out = {"precision_at_k": Fraction(hits, k)}
    if R:
        out.update({"recall_at_k": Fraction(hits, R), "ap_at_k/retrieved": s / hits if hits else Fraction(0),
                    "ap_at_k/min_k_r": s / min(k, R), "ap_at_k/total": s / R})
        ideal = ref.dcg_list(sorted(grade.tolist(), reverse=True), k)
        out["ndcg_at_k"] = ref.dcg_list(gr, k) / ideal
    return out


def _hashdist_values(queries, k_values=K_VALUES, order="distance", nbits=3, grades=3):
    H = np.stack([ref.histogram_from_items(d, g, nbits, grades) for d, g, _ in queries])
    distances = np.stack([np.where(ids >= 0, d[np.maximum(ids, 0)], -1) for d, _, ids in queries])
    grade = np.stack([np.where(ids >= 0, g[np.maximum(ids, 0)], 0) for _, g, ids in queries])
    params = MetricParams(ks=k_values, radii=(1,), n_database=len(queries[0][0]))
    entries = ServedEntries("run", distances, grade, order=order)
    values = served_values(H, entries, params)
    return {key.removeprefix("served/run/"): v for key, v in values.items()}, H, entries, params


KEYS = {"precision_at_k": "precision_at_k/{k}/{p}", "recall_at_k": "recall_at_k/{k}/{p}",
        "ndcg_at_k": "ndcg_at_k/{k}/{p}", **{f"ap_at_k/{n}": f"ap_at_k/{{k}}/{n}/{{p}}"
                                              for n in ("retrieved", "min_k_r", "total")}}


def test_the_spec_worked_check():
    counts = np.array([[1, 3, 1]])  # exhaustive distances 0, 1, 1, 1, 2; k = 2
    first = neighbour_recall(counts, np.array([[0, 1]]), 2)
    second = neighbour_recall(counts, np.array([[1, 1]]), 2)
    assert {key: float(v[0]) for key, v in first.items()} == pytest.approx(
        {"expected": 2 / 3, "best": 1, "worst": 1 / 2, "lenient": 1, "exact": 1}, abs=1e-15)
    assert {key: float(v[0]) for key, v in second.items()} == pytest.approx(
        {"expected": 1 / 3, "best": 1 / 2, "worst": 0, "lenient": 1, "exact": 0}, abs=1e-15)


@pytest.mark.parametrize("seed", range(6))
def test_neighbour_recall_over_every_tie_order(seed):
    rng = np.random.default_rng(seed)
    queries = [_random_query(rng) for _ in range(12)]
    values, *_ = _hashdist_values(queries)
    for q, (dist, _, ids) in enumerate(queries):
        for k in K_VALUES:
            mean, low, high = _recall_reference(dist, ids, k)
            got = {p: values[f"neighbours/recall_at_k/{k}/{p}"][q] for p in ("expected", "worst", "best")}
            assert got == pytest.approx({"expected": float(mean), "worst": float(low), "best": float(high)},
                                        abs=1e-12), (q, k)
            served = [int(i) for i in ids[:k] if i >= 0]
            kth = sorted(dist.tolist())[k - 1]
            assert values[f"neighbours/lenient_at_k/{k}"][q] == pytest.approx(sum(dist[i] <= kth for i in served) / k)
            assert values[f"neighbours/exact_at_k/{k}"][q] == float(high == 1)


@pytest.mark.parametrize("seed", range(6))
def test_served_top_k_measures_over_every_tie_order_of_the_served_entries(seed):
    rng = np.random.default_rng(100 + seed)
    queries = [_random_query(rng) for _ in range(10)]
    values, *_ = _hashdist_values(queries)
    for q, (dist, grade, ids) in enumerate(queries):
        for k in K_VALUES:
            lists = [_list_measures(order, grade, k) for order in _served_orders(dist, ids, k)]
            for name, key in KEYS.items():
                if name not in lists[0]:
                    assert all(math.isnan(values[key.format(k=k, p=p)][q]) for p in ("expected", "best", "worst"))
                    continue
                reference = {"expected": sum(x[name] for x in lists) / len(lists),
                             "worst": min(x[name] for x in lists), "best": max(x[name] for x in lists)}
                got = {p: values[key.format(k=k, p=p)][q] for p in reference}
                assert got == pytest.approx({p: float(v) for p, v in reference.items()}, abs=1e-12), (q, k, name)


@pytest.mark.parametrize("seed", range(3))
def test_as_served_ranks_in_served_order(seed):
    rng = np.random.default_rng(200 + seed)
    queries = [_random_query(rng) for _ in range(10)]
    values, *_ = _hashdist_values(queries, order="as-served")
    for q, (_, grade, ids) in enumerate(queries):
        for k in K_VALUES:
            reference = _list_measures([int(i) for i in ids if i >= 0], grade, k)
            for name, key in KEYS.items():
                got = [values[key.format(k=k, p=p)][q] for p in ("expected", "best", "worst")]
                if name not in reference:
                    assert all(math.isnan(v) for v in got)
                else:
                    assert got == pytest.approx([float(reference[name])] * 3, abs=1e-12), (q, k, name)


@pytest.mark.parametrize("seed", range(4))
def test_reference_knn_lists_fall_inside_the_interval(seed):
    """A stable argsort and a random tie order of the exhaustive ranking, served as they are: recall inside
    [worst, best], best = 1, exact = 1."""
    rng = np.random.default_rng(300 + seed)
    for tie_break in ("stable", "random"):
        queries = []
        for _ in range(10):
            dist, grade, _ = _random_query(rng)
            key = np.arange(len(dist)) if tie_break == "stable" else rng.permutation(len(dist))
            ranked = np.lexsort((key, dist))[: max(K_VALUES)]
            queries.append((dist, grade, ranked))
        values, *_ = _hashdist_values(queries)
        for k in K_VALUES:
            expected, worst, best = (values[f"neighbours/recall_at_k/{k}/{p}"] for p in ("expected", "worst", "best"))
            assert (worst <= expected + 1e-15).all() and (expected <= best + 1e-15).all()
            assert (best == 1).all() and (values[f"neighbours/exact_at_k/{k}"] == 1).all()


def test_serving_everything_by_distance_gives_the_exhaustive_values():
    """A list of every item by distance, at k = Nall: S is H, so every served top-k measure is the exhaustive one
    (below Nall the first k served entries are one tie order's, not the exhaustive tie interval)."""
    rng = np.random.default_rng(7)
    queries = []
    for _ in range(15):
        dist, grade, _ = _random_query(rng)
        queries.append((dist, grade, np.argsort(dist, kind="stable")))
    values, H, entries, params = _hashdist_values(queries, k_values=(7,))
    exhaustive = per_query_metrics(H, np.ones((len(H), 2), np.int64), params)
    compared = [key for key in values if key in exhaustive and key != "relevant"]
    assert len(compared) >= 20
    for key in compared:
        value = values[key]
        np.testing.assert_allclose(value, exhaustive[key], rtol=0, atol=1e-12, err_msg=key)


def test_the_section_holds_the_report_keys_and_the_cost():
    rng = np.random.default_rng(11)
    queries = [_random_query(rng) for _ in range(20)]
    values, H, entries, params = _hashdist_values(queries, k_values=(2, 5))
    params = MetricParams(ks=(2, 5), radii=(1,), n_database=7, conventions=("trec", "deephash", "dcmh"))
    pq = served_values(H, entries, params)
    exhaustive, _ = aggregate(per_query_metrics(H, np.ones((len(H), 2), np.int64), params), params)
    conventions = {"trec": {"map_at_k": {"2": {"expected": 0.5}, "5": {"expected": 0.25}}},
                   "deephash": {"map_at_k": {"2": {"expected": 0.0}, "5": {"expected": 0.0}}}}
    section = served_section(pq, entries, params, exhaustive, conventions)
    assert set(section["metrics"]) == {"map_at_k", "precision_at_k", "recall_at_k", "ndcg_at_k",
                                       "ndcg_structhash_at_k"}
    for key, value in section["metrics"].items():
        assert list(value) == list(exhaustive[key])
        assert set(value["5"]) == set(exhaustive[key]["5"])
    assert set(section["conventions"]) == {"trec", "deephash"}  # dcmh looks past the top K: not a served measure
    served_map = section["metrics"]["map_at_k"]["5"]["total"]["expected"]
    assert section["cost"]["map_at_k"]["5"]["total"] == exhaustive["map_at_k"]["5"]["total"]["expected"] - served_map
    assert section["cost"]["conventions"]["trec"]["map_at_k"]["2"] == pytest.approx(
        0.5 - section["conventions"]["trec"]["map_at_k"]["2"]["expected"])
    recall = section["neighbours"]["recall_at_k"]["5"]
    assert recall["expected"] == pytest.approx(values["neighbours/recall_at_k/5/expected"].mean())
    assert recall["worst"] <= recall["expected"] <= recall["best"]


def test_a_radius_lookup():
    H = np.zeros((3, 4, 2), np.int64)
    H[0, :, 0] = [1, 2, 0, 5]  # ball of radius 1: 3 items
    H[2, 3, 0] = 4  # an empty ball
    H[1, 0, 1] = 2  # a ball of 2
    entries = ServedEntries("ball", radius=1, served=np.array([2, 0, 1]), in_ball=np.array([2, 0, 0]))
    pq = served_values(H, entries, MetricParams(ks=(1,), radii=(1,)))
    section = served_section(pq, entries, MetricParams(ks=(1,), radii=(1,)), {}, {})
    assert section["range"] == {"radius": 1, "recall": pytest.approx((2 / 3 + 0) / 2),
                                "precision": pytest.approx((1 + 0 + 0) / 3),
                                "micro": {"recall": pytest.approx(2 / 5), "precision": pytest.approx(2 / 3)},
                                "queries_with_empty_ball": 1, "queries_served_nothing": 1}


@pytest.mark.parametrize("order", ["distance", "as-served"])
def test_queries_taken_a_few_at_a_time_give_the_same_values(order, monkeypatch):
    """served_values builds the served histograms a few queries at a time (bounded memory at any K); one query per
    step gives bit-identical values to all of them in one step (checked against the references above)."""
    from hashdist.served import measures

    rng = np.random.default_rng(9)
    queries = [_random_query(rng) for _ in range(11)]
    whole, *_ = _hashdist_values(queries, order=order)
    monkeypatch.setattr(measures, "HISTOGRAM_CELLS_PER_STEP", 1)
    stepped, *_ = _hashdist_values(queries, order=order)
    assert whole.keys() == stepped.keys()
    for key, value in whole.items():
        assert np.array_equal(value, stepped[key], equal_nan=True), key
