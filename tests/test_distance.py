"""Weighted Hamming and asymmetric distances on a bin axis (docs/metrics.md, section 4b).

The reference sorts every query's database by the real-valued distance computed directly in numpy
(any tie-break among exactly equal values) and evaluates the ranked list item by item
(tests/reference.py): that value must lie in hashdist's [worst, best] for every metric and query.
Integer weights are checked against plain Hamming on codes whose bit i is repeated w_i times,
which is the same distance, evaluated by the (separately tested) Hamming path.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import hashdist
from hashdist.api import evaluate_local
from hashdist.data.bits import pack_bits
from hashdist.kernels.binned import binned_histogram_block
from hashdist.kernels.distance import weighted_axis
from tests import reference as ref

TOL = 1e-12
KS = (1, 5, 40)
RADII = (0, 0.75, 2)


def _random_case(seed, kind, nbits=16, n_q=8, n_db=220):
    rng = np.random.default_rng(seed)
    centres = rng.integers(0, 2, (3, nbits))
    labels = rng.integers(0, 3, n_db + n_q)
    bits = (centres[labels] ^ (rng.random((n_db + n_q, nbits)) < 0.2)).astype(np.uint8)
    bits[n_q + 5 : n_q + 15] = bits[n_q + 4]  # items sharing one code: exactly equal distances
    if kind == "class":
        lab = labels
    else:
        lab = ((rng.random((n_db + n_q, 5)) < 0.3) | (np.arange(5) == labels[:, None] % 5)).astype(np.uint8)
    return rng, bits[n_q:], lab[n_q:], bits[:n_q], lab[:n_q]


def _grades(kind, query_labels, db_labels):
    if kind == "class":
        return (query_labels[:, None] == db_labels[None, :]).astype(np.int64)
    return (query_labels[:, None, :] & db_labels[None, :, :]).sum(axis=2).astype(np.int64)


def _true_values(dist_row, grade_row, rng, radii):
    """Every checked metric of the ranking by the real distance (random tie-break among equal values)."""
    order = np.lexsort((rng.random(len(dist_row)), dist_row))
    gr = [int(g) for g in grade_row[order]]
    values = {"ap": ref.LIST_METRICS["ap"](gr), "auc": ref.auc_list(gr)}
    for k in KS:
        for normaliser in ref.NORMALISERS:
            values[f"ap_at_k/{k}/{normaliser}"] = ref.LIST_METRICS["ap_at_k"](gr, k=k, normaliser=normaliser)
        for name in ("precision_at_k", "recall_at_k", "ndcg_at_k", "ndcg_structhash_at_k"):
            values[f"{name}/{k}"] = ref.LIST_METRICS[name](gr, k=k)
    for r in radii:
        values[f"ap_at_radius/{r}"] = ref.LIST_METRICS["ap_at_radius"](gr, size=int((dist_row <= r).sum()))
    return {key: ref.to_float(v) for key, v in values.items()}


def _check_certified(per_query, dist, grades, rng, radii=RADII):
    checked = 0
    for q in range(dist.shape[0]):
        for key, true in _true_values(dist[q], grades[q], rng, radii).items():
            best, worst = per_query[f"{key}/best"][q], per_query[f"{key}/worst"][q]
            if np.isnan(true):
                assert np.isnan(best) and np.isnan(worst), (key, q)
                continue
            assert worst - TOL <= true <= best + TOL, (key, q, worst, true, best)
            checked += 1
        inside = dist[q][None, :] <= np.array(radii, dtype=float)[:, None]
        size, tp = inside.sum(axis=1), (inside & (grades[q] >= 1)).sum(axis=1)
        for r, s, t in zip(radii, size, tp, strict=True):  # radii are bin edges: exact
            assert per_query[f"precision_at_radius/{r}"][q] == pytest.approx(t / s if s else 0.0, abs=TOL)
            relevant = (grades[q] >= 1).sum()
            if relevant:
                assert per_query[f"recall_at_radius/{r}"][q] == pytest.approx(t / relevant, abs=TOL)
    assert checked > 100


def _check_bin_columns(per_query, report, dist, grades):
    """The report's upper bin edges are the distances of per_query's columns over bins: column j counts the
    items within upper_edges[j] (up to the bins' fixed-point rounding)."""
    edges = np.array(report["distance"]["upper_edges"])
    assert len(edges) == report["distance"]["bins_used"] == per_query["retrieved_at_radius"].shape[1]
    assert (np.diff(edges) >= 0).all()  # a radius on an equal bin's edge makes a bin of its own
    tol = 1e-9 * (np.abs(dist).max() + 1)
    for q in range(dist.shape[0]):
        for column, counted in ((per_query["retrieved_at_radius"][q], np.ones_like(grades[q], dtype=bool)),
                                (per_query["tp_at_radius"][q], grades[q] >= 1)):
            surely = ((dist[q][None, :] <= edges[:, None] - tol) & counted).sum(axis=1)
            maybe = ((dist[q][None, :] <= edges[:, None] + tol) & counted).sum(axis=1)
            assert ((surely <= column) & (column <= maybe)).all(), q


def _ingest(tmp_path, db_bits, db_labels, q_bits, q_labels, scores=None, name="ds.zarr"):
    paths = {}
    for key, arr in dict(dc=db_bits, qc=q_bits, dl=db_labels, ql=q_labels, ys=scores).items():
        if arr is not None:
            paths[key] = str(tmp_path / f"{name}-{key}.npy")
            np.save(paths[key], arr)
    return hashdist.ingest(str(tmp_path / name), paths["dc"], paths["qc"], db_labels=paths["dl"],
                           query_labels=paths["ql"], query_scores=paths.get("ys"), chunk_rows=64, query_chunk_rows=4)


@pytest.mark.parametrize("kind", ["class", "multilabel"])
@pytest.mark.parametrize("per_query", [False, True], ids=["shared-weights", "per-query-weights"])
def test_weighted_hamming_certified_interval(tmp_path, kind, per_query):
    rng, db, dl, qb, ql = _random_case(1, kind)
    w = rng.random((len(qb), qb.shape[1]) if per_query else qb.shape[1]) * 2
    path = _ingest(tmp_path, db, dl, qb, ql)
    ev = evaluate_local(path, cache=False, bit_weights=w, distance_bins=64, k=KS, radius=RADII)
    dist = ((qb[:, None, :] != db[None, :, :]) * np.atleast_2d(w)[:, None, :]).sum(axis=2)
    _check_certified(ev.per_query, dist, _grades(kind, ql, dl), rng)
    _check_bin_columns(ev.per_query, ev.report, dist, _grades(kind, ql, dl))
    d = ev.report["distance"]
    assert d["kind"] == "weighted" and d["bins"] == 64 and not d["exact"]
    assert d["map_interval_width"] == ev.report["metrics"]["map"]["best"] - ev.report["metrics"]["map"]["worst"]


@pytest.mark.parametrize("kind", ["class", "multilabel"])
def test_asymmetric_certified_interval(tmp_path, kind):
    rng, db, dl, qb, ql = _random_case(2, kind)
    y = rng.normal(size=qb.shape).astype(np.float32)
    path = _ingest(tmp_path, db, dl, qb, ql, scores=y)
    radii = (-1.5, 0, 2.25)
    ev = evaluate_local(path, cache=False, distance="asymmetric", distance_bins=128, k=KS, radius=radii)
    dist = -(y.astype(np.float64) @ (2.0 * db - 1).T)
    _check_certified(ev.per_query, dist, _grades(kind, ql, dl), rng, radii)
    _check_bin_columns(ev.per_query, ev.report, dist, _grades(kind, ql, dl))
    # the arrays API gives the same report
    codes = hashdist.evaluate_codes(qb, db, ql, dl, query_scores=y, distance_bins=128, k=KS, radius=radii)
    assert json.dumps(codes["metrics"], sort_keys=True) == json.dumps(ev.report["metrics"], sort_keys=True)


def test_explicit_relevance_with_weights(tmp_path):
    rng, db, dl, qb, ql = _random_case(3, "class")
    lists = [np.sort(rng.choice(len(db), 30, replace=False)) for _ in range(len(qb))]
    grades = np.zeros((len(qb), len(db)), dtype=np.int64)
    for q, rows in enumerate(lists):
        grades[q, rows] = 1
    w = rng.random(qb.shape[1])
    report = hashdist.evaluate_codes(qb, db, relevant=lists, bit_weights=w, distance_bins=32, k=KS, radius=RADII)
    dist = ((qb[:, None, :] != db[None, :, :]) * w).sum(axis=2)
    true_ap = np.mean([ref.to_float(ref.LIST_METRICS["ap"]([int(g) for g in grades[q][np.argsort(dist[q])]]))
                       for q in range(len(qb))])
    assert report["metrics"]["map"]["worst"] - TOL <= true_ap <= report["metrics"]["map"]["best"] + TOL


def test_interval_narrows_as_bins_grow(tmp_path):
    rng, db, dl, qb, ql = _random_case(4, "multilabel", n_db=400)
    w = rng.random(qb.shape[1])
    widths = [hashdist.evaluate_codes(qb, db, ql, dl, bit_weights=w, distance_bins=g)["distance"]["map_interval_width"]
              for g in (8, 64, 512, 4096)]  # nested bins: each splits the one before
    assert all(a >= b for a, b in zip(widths, widths[1:], strict=False)) and widths[-1] < widths[0], widths


@pytest.mark.parametrize("kind", ["class", "multilabel"])
def test_integer_weights_are_exact(kind):
    """Integer weights w_i: the same distances as plain Hamming on codes with bit i repeated w_i times."""
    rng, db, dl, qb, ql = _random_case(5, kind)
    w = rng.integers(0, 4, qb.shape[1])
    weighted = hashdist.evaluate_codes(qb, db, ql, dl, bit_weights=w.astype(float), k=KS)
    expanded = hashdist.evaluate_codes(np.repeat(qb, w, axis=1), np.repeat(db, w, axis=1), ql, dl, k=KS)
    assert weighted["distance"]["exact"] and weighted["distance"]["bins_used"] == w.sum() + 1
    lgap = "mlgap_at_radius"  # plain Hamming on the original codes, not on the expanded ones
    assert {k: v for k, v in weighted["metrics"].items() if k != lgap} == \
           {k: v for k, v in expanded["metrics"].items() if k != lgap}
    plain = hashdist.evaluate_codes(qb, db, ql, dl, k=KS)
    assert weighted["metrics"][lgap] == plain["metrics"][lgap]


def test_bins_are_identical_in_every_block_and_order(tmp_path):
    rng, db, dl, qb, ql = _random_case(6, "multilabel", n_db=500)
    w = rng.random(qb.shape[1])
    path = _ingest(tmp_path, db, dl, qb, ql)
    reports = [evaluate_local(path, cache=False, bit_weights=w, query_block_rows=qr, db_block_rows=dr,
                              threads=t).report["metrics"] for qr, dr, t in ((4, 64, 1), (8, 128, 2), (8, 512, 2))]
    assert reports[0] == reports[1] == reports[2]


def test_kernel_places_each_distance_in_its_bin():
    rng = np.random.default_rng(7)
    qb, db = rng.integers(0, 2, (6, 70)), rng.integers(0, 2, (400, 70))
    ql, dl = rng.integers(0, 3, 6), rng.integers(0, 3, 400)
    w = rng.random(70)
    axis = weighted_axis(w, 50, (0, 1.3))
    H = binned_histogram_block(axis, pack_bits(qb), pack_bits(db), 70, "class", ql, dl)
    dist = ((qb[:, None, :] != db[None, :, :]) * w).sum(axis=2)
    bins = np.minimum(np.searchsorted(axis.upper, dist, side="left"), axis.n_bins - 1)
    want = np.zeros_like(H)
    for q in range(6):
        np.add.at(want[q], (bins[q], (ql[q] == dl).astype(int)), 1)
    assert (H == want).all()
    assert axis.upper[axis.position(1.3)] == 1.3 and axis.upper[axis.position(0)] == 0


def test_auc_bounds_are_the_extreme_tie_orders():
    rng = np.random.default_rng(8)
    from hashdist.metrics.ranking import roc_auc

    for _ in range(20):
        dist, grade = rng.integers(0, 4, 30), (rng.random(30) < 0.4).astype(int)
        H = ref.histogram_from_items(dist, grade, 3, 2)[None]
        for policy in ("best", "worst"):
            want = ref.auc_list(ref.ranked_list(dist, grade, policy))
            got = roc_auc(H, policy)[0]
            assert (want is None and np.isnan(got)) or got == pytest.approx(float(want), abs=1e-15)


BAD = [
    (["--bit-weights", "NEG"], "non-negative"),
    (["--bit-weights", "NAN"], "NaN"),
    (["--bit-weights", "SHORT"], "shape"),
    (["--bit-weights", "OK", "--distance-bins", "0"], "--distance-bins"),
    (["--distance", "asymmetric"], "query-scores"),
    (["--bit-weights", "OK", "--distance", "asymmetric"], "--bit-weights"),
    (["--distance", "weighted"], "--bit-weights"),
]


@pytest.mark.parametrize("args,needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_distance_input(tmp_path, class_dataset, args, needle):
    nbits = hashdist.open_dataset(class_dataset).nbits
    files = {"NEG": -np.ones(nbits), "NAN": np.full(nbits, np.nan), "SHORT": np.ones(nbits - 1),
             "OK": np.ones(nbits)}
    for name, arr in files.items():
        np.save(tmp_path / f"{name}.npy", arr)
    args = [str(tmp_path / f"{a}.npy") if a in files else a for a in args]
    out = tmp_path / "report"
    run = subprocess.run([sys.executable, "-m", "hashdist.cli", "evaluate", class_dataset, "--out", str(out),
                          "--engine", "local", "--quiet", *args], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and needle in run.stderr, run.stderr
    assert not out.exists()


def test_bad_query_scores_on_ingest(tmp_path):
    rng, db, dl, qb, ql = _random_case(9, "class")
    for name, scores in (("shape", rng.normal(size=(len(qb), qb.shape[1] + 1))),
                         ("NaN", np.full(qb.shape, np.nan))):
        with pytest.raises(hashdist.InputError, match=name):
            _ingest(tmp_path, db, dl, qb, ql, scores=scores, name=f"bad-{name}.zarr")
        assert not (tmp_path / f"bad-{name}.zarr").exists()


def test_flow_cli_with_weights_equals_local(tmp_path, class_dataset, cli_env):
    nbits = hashdist.open_dataset(class_dataset).nbits
    np.save(tmp_path / "w.npy", np.random.default_rng(10).random(nbits))
    reports = []
    for engine in ("flow", "local"):
        out = tmp_path / engine
        subprocess.run([sys.executable, "-m", "hashdist.cli", "evaluate", class_dataset, "--out", str(out),
                        "--engine", engine, "--quiet", "--no-html", "--bit-weights", str(tmp_path / "w.npy"),
                        "--distance-bins", "256", "--radius", "0", "0.5", "1"], env=cli_env, check=True,
                       capture_output=True, timeout=300)
        reports.append(json.loads((out / "report.json").read_text()))
    assert reports[0]["metrics"] == reports[1]["metrics"]
    assert reports[0]["distance"] == reports[1]["distance"]
    assert reports[0]["distance"]["kind"] == "weighted"


@pytest.mark.parametrize("rule", ["exclude", "zero"])
def test_mlgap_is_null_at_a_radius_that_is_not_an_integer(rule):
    """mLGAP stays plain Hamming: at a radius between integers it has no value, null in report.json, whether
    queries without a relevant item are excluded or counted as 0 (which applies to those queries only)."""
    rng, db, dl, qb, ql = _random_case(3, "class")
    ql[0] = dl.max() + 1  # a query with no relevant item
    report = hashdist.evaluate_codes(qb, db, ql, dl, bit_weights=np.ones(qb.shape[1]), radius=(0.5, 1),
                                     empty_queries=rule)
    lgap = report["metrics"]["mlgap_at_radius"]
    assert lgap["0.5"] is None or np.isnan(lgap["0.5"])
    plain = hashdist.evaluate_codes(qb, db, ql, dl, radius=(1,), empty_queries=rule)
    assert lgap["1"] == plain["metrics"]["mlgap_at_radius"]["1"]
    assert report["queries"]["evaluated"] == len(qb) - (rule == "exclude")


def test_asymmetric_scores_are_not_rounded():
    """Query scores are ranked as given: float64 values 4e-8 apart order the items as they do (float32 would
    round them together and swap the two items), and the certified interval holds the real AP."""
    y = np.array([[1 + 5e-8, 0.5, 0.5 + 4e-8]])
    db = np.array([[1, 0, 0], [0, 1, 1]])  # distances -1e-8 (relevant) and +1e-8
    report = hashdist.evaluate_codes(np.ones((1, 3), int), db, np.array([0]), np.array([0, 1]), query_scores=y,
                                     distance_bins=2)
    assert report["metrics"]["map"]["worst"] <= 1.0 <= report["metrics"]["map"]["best"]
    assert report["metrics"]["map"]["expected"] == 1.0
