"""Ground truth from features: exact agreement with brute force (ties included), invariance, storage, bad input."""

import json
import math

import numpy as np
import pytest

from hashdist.api import evaluate_local, groundtruth_local
from hashdist.cli import main
from hashdist.data.dataset import open_dataset
from hashdist.data.ingest import ingest
from hashdist.data.synth import features_dataset
from hashdist.engine import groundtruth
from hashdist.errors import InputError


def reference_sq_distances(x, y):
    """Brute force, in the module's convention: float64 squared differences summed over dimensions in order."""
    out = np.zeros((len(x), len(y)))
    for j in range(x.shape[1]):
        out += (x[:, j].astype(np.float64)[:, None] - y[:, j].astype(np.float64)[None, :]) ** 2
    return out


def reference_top_percent(x, y, percent):
    d2 = reference_sq_distances(x, y)
    k = math.ceil(percent * len(y) / 100)
    return d2 <= np.sort(d2, axis=1)[:, k - 1 : k]


def reference_epsilon(y, sample, neighbors):
    d2 = reference_sq_distances(y[sample], y)
    d2[np.arange(len(sample)), sample] = np.inf
    return math.fsum(np.sqrt(np.sort(d2, axis=1)[:, neighbors - 1])) / len(sample)


def as_matrix(gt, n_database):
    dense = np.zeros((len(gt.indptr) - 1, n_database), dtype=bool)
    for q in range(len(gt.indptr) - 1):
        row = gt.indices[gt.indptr[q] : gt.indptr[q + 1]]
        assert (np.diff(row) > 0).all()  # sorted, no repeats
        dense[q, row] = True
    return dense


def feature_inputs(directory, *, n_db=600, n_q=40, dim=6, integer=True, dtype=np.float32, seed=0, labels=None):
    """Codes and features as .npy files. Integer features in 0..3 tie heavily; rows 1..29 repeat row 0..14."""
    rng = np.random.default_rng(seed)
    if integer:
        db = rng.integers(0, 4, (n_db, dim)).astype(dtype)
        q = rng.integers(0, 4, (n_q, dim)).astype(dtype)
    else:
        db = rng.standard_normal((n_db, dim)).astype(dtype)
        q = rng.standard_normal((n_q, dim)).astype(dtype)
    db[15:30] = db[:15]  # duplicate database points
    q[:5] = db[:5]  # queries that are database points
    paths = {}
    arrays = {"db": rng.integers(0, 2, (n_db, 16)).astype(np.uint8),
              "q": rng.integers(0, 2, (n_q, 16)).astype(np.uint8),
              "df": db, "qf": q}
    if labels is not None:
        arrays.update(dbl=labels[0], ql=labels[1])
    for name, arr in arrays.items():
        paths[name] = str(directory / f"{name}.npy")
        np.save(paths[name], arr)
    return paths, db, q


def features_data(directory, name="f.zarr", **kw):
    paths, db, q = feature_inputs(directory, **kw)
    out = directory / name
    ingest(out, paths["db"], paths["q"], db_features=paths["df"], query_features=paths["qf"], chunk_rows=100,
           query_chunk_rows=8)
    return str(out), db, q


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    return features_data(tmp_path_factory.mktemp("tied"))


BLOCKS = [dict(query_block_rows=8, db_block_rows=100), dict(query_block_rows=24, db_block_rows=300),
          dict(query_block_rows=64, db_block_rows=1000)]


@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("percent", [0.1, 2, 7.5, 100])
def test_top_percent_equals_brute_force_with_boundary_ties(tied, blocks, percent):
    url, db, q = tied
    gt, _ = groundtruth_local(url, method="top_percent", percent=percent, cache=False, **blocks)
    expected = reference_top_percent(q, db, percent)
    assert (as_matrix(gt, len(db)) == expected).all()
    assert gt.record["k"] == math.ceil(percent * len(db) / 100)
    if percent == 2:  # integer features: many items tie with the k-th, and all of them are in
        assert (expected.sum(axis=1) > gt.record["k"]).any()


@pytest.mark.parametrize("blocks", BLOCKS)
def test_epsilon_ball_equals_brute_force_with_ties_at_epsilon(tied, blocks):
    url, db, q = tied
    d2 = reference_sq_distances(q, db)
    for epsilon in (0.0, 2.0, 3.0):  # squared distances are integers: many pairs sit exactly at epsilon
        gt, _ = groundtruth_local(url, method="epsilon_ball", epsilon=epsilon, cache=False, **blocks)
        assert (d2 == epsilon**2).any()
        assert (as_matrix(gt, len(db)) == (np.sqrt(d2) <= epsilon)).all()
        assert gt.record["epsilon"] == epsilon and gt.record["sample_indices"] == []


@pytest.mark.parametrize("blocks", BLOCKS)
def test_estimated_epsilon_equals_brute_force(tied, blocks):
    url, db, q = tied
    gt, _ = groundtruth_local(url, method="epsilon_ball", neighbors=20, sample=30, seed=3, cache=False, **blocks)
    sample = np.sort(np.random.default_rng(3).choice(len(db), size=30, replace=False))
    assert gt.record["sample_indices"] == sample.tolist()
    epsilon = reference_epsilon(db, sample, 20)
    assert gt.record["epsilon"] == epsilon
    assert (as_matrix(gt, len(db)) == (np.sqrt(reference_sq_distances(q, db)) <= epsilon)).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_real_valued_features(tmp_path, dtype):
    url, db, q = features_data(tmp_path, integer=False, dtype=dtype, dim=24)
    assert open_dataset(url).array("database/features").dtype == dtype
    top, _ = groundtruth_local(url, method="top_percent", percent=3, cache=False)
    assert (as_matrix(top, len(db)) == reference_top_percent(q, db, 3)).all()
    ball, _ = groundtruth_local(url, method="epsilon_ball", neighbors=10, sample=50, cache=False,
                                    db_block_rows=200)
    epsilon = reference_epsilon(db, np.array(ball.record["sample_indices"]), 10)
    assert ball.record["epsilon"] == epsilon
    assert (as_matrix(ball, len(db)) == (np.sqrt(reference_sq_distances(q, db)) <= epsilon)).all()


def test_written_into_the_dataset_and_replaced_on_rerun(tmp_path):
    url, db, q = features_data(tmp_path)
    assert open_dataset(url).relevance_kinds == ()
    with pytest.raises(InputError, match="no relevance data"):
        evaluate_local(url, cache=False)
    fingerprints = {name: open_dataset(url).fingerprints[name].digest for name in ("database/features",
                                                                                   "queries/features")}
    gt, _ = groundtruth_local(url, method="top_percent", percent=5, cache=False)
    ds = groundtruth.write(open_dataset(url), gt)
    assert ds.relevance_kinds == ("explicit",)
    record = ds.attrs()["groundtruth"]
    assert record["method"] == "top_percent" and record["parameters"] == {"percent": 5}
    assert record["features"] == fingerprints and record["relevant_pairs"] == gt.indptr[-1]
    indptr, indices, grades = ds.relevant(0, ds.n_queries)
    assert (indptr == gt.indptr).all() and (indices == gt.indices).all() and (grades == 1).all()
    assert evaluate_local(url, cache=False).report["dataset"]["relevance"] == "explicit"

    again, _ = groundtruth_local(url, method="epsilon_ball", epsilon=1.5, cache=False)
    ds = groundtruth.write(ds, again)
    assert ds.relevance_kinds == ("explicit",)
    assert ds.attrs()["groundtruth"]["method"] == "epsilon_ball"
    assert ds.fingerprints["queries/relevant/indices"].rows == again.indptr[-1] != gt.indptr[-1]
    assert (ds.relevant(0, ds.n_queries)[1] == again.indices).all()
    assert not list((tmp_path / "f.zarr" / "queries").glob(".relevant*"))


def test_evaluate_on_explicit_ground_truth_equals_class_labels(tmp_path):
    """Features at the class's corner of a simplex: the epsilon-0 ball is exactly the query's class."""
    rng = np.random.default_rng(5)
    dbl, ql = rng.integers(0, 4, 500), rng.integers(0, 4, 30)
    paths, _, _ = feature_inputs(tmp_path, n_db=500, n_q=30, labels=(dbl, ql))
    np.save(paths["df"], np.eye(4, dtype=np.float32)[dbl] * 3)
    np.save(paths["qf"], np.eye(4, dtype=np.float32)[ql] * 3)
    url = tmp_path / "c.zarr"
    ingest(url, paths["db"], paths["q"], db_labels=paths["dbl"], query_labels=paths["ql"], db_features=paths["df"],
           query_features=paths["qf"], chunk_rows=100, query_chunk_rows=8)
    gt, _ = groundtruth_local(url, method="epsilon_ball", epsilon=0.0, cache=False)
    np.save(tmp_path / "other_df.npy", np.eye(4, dtype=np.float32)[dbl] * 2)  # the same rows, other features
    other = tmp_path / "other.zarr"
    ingest(other, paths["db"], paths["q"], db_labels=paths["dbl"], query_labels=paths["ql"],
           db_features=str(tmp_path / "other_df.npy"), query_features=paths["qf"], chunk_rows=100, query_chunk_rows=8)
    with pytest.raises(InputError, match="computed from other features than the dataset's"):
        groundtruth.write(other, gt)
    ds = groundtruth.write(url, gt)  # a path, as docs/groundtruth.md writes it
    assert ds.relevance_kinds == ("class", "explicit")  # labels stay the default
    by_class = evaluate_local(url, cache=False, relevance="class")
    explicit = evaluate_local(url, cache=False, relevance="explicit")
    assert json.dumps(explicit.report["metrics"], sort_keys=True) == json.dumps(by_class.report["metrics"],
                                                                               sort_keys=True)


def test_synth_features_dataset(tmp_path):
    for method in ("lsh", "itq"):
        a = features_dataset(tmp_path / f"{method}.zarr", n_database=3000, n_queries=20, dim=16, nbits=8,
                             method=method, n_clusters=5, chunk_rows=1000)
        b = features_dataset(tmp_path / f"{method}-b.zarr", n_database=3000, n_queries=20, dim=16, nbits=8,
                             method=method, n_clusters=5, chunk_rows=700)
        da, dbb = open_dataset(a), open_dataset(b)
        assert da.relevance_kinds == () and da.array("database/features").shape == (3000, 16)
        for name in ("database/features", "database/codes", "queries/codes"):
            assert (da.read(name, 0, 3000) == dbb.read(name, 0, 3000)).all()
    assert (da.read("database/codes", 0, 3000) != open_dataset(tmp_path / "lsh.zarr").read("database/codes", 0,
                                                                                             3000)).any()


# -- bad input: one line, exit status 2, nothing written ----------------------------------------


def refused(capsys, argv, needle):
    status = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0], lines[0]


def test_bad_feature_files_are_refused(tmp_path, capsys):
    paths, db, q = feature_inputs(tmp_path)
    out = tmp_path / "bad.zarr"
    base = ["ingest", "--db-codes", paths["db"], "--query-codes", paths["q"], "--out", out]
    np.save(tmp_path / "wide.npy", np.zeros((len(q), 7), dtype=np.float32))
    refused(capsys, base + ["--db-features", paths["df"], "--query-features", tmp_path / "wide.npy"],
            "feature dimensions")
    for bad in (np.nan, np.inf):
        broken = db.copy()
        broken[123, 2] = bad
        np.save(tmp_path / "broken.npy", broken)
        refused(capsys, base + ["--db-features", tmp_path / "broken.npy", "--query-features", paths["qf"]],
                "NaN or infinity (row 123)")
    np.save(tmp_path / "ints.npy", db.astype(np.int32))
    refused(capsys, base + ["--db-features", tmp_path / "ints.npy", "--query-features", paths["qf"]],
            "float32 or float64")
    refused(capsys, base + ["--db-features", paths["df"]], "given together")
    assert not out.exists() and not list(tmp_path.glob(".bad.zarr.tmp*"))


def test_bad_groundtruth_options_are_refused(tied, capsys, tmp_path):
    url, db, _ = tied
    before = open_dataset(url).fingerprint
    for args, needle in (
        (["--method", "top_percent", "--percent", "0"], "--percent must be in (0, 100]"),
        (["--method", "top_percent", "--percent", "100.5"], "--percent must be in (0, 100]"),
        (["--method", "epsilon_ball", "--neighbors", str(len(db))], "--neighbors 600 must be below"),
        (["--method", "epsilon_ball", "--sample", str(len(db) + 1)], "--sample 601 exceeds"),
        (["--method", "epsilon_ball", "--epsilon", "-1"], "--epsilon must be >= 0"),
        (["--method", "epsilon_ball", "--percent", "2"], "--percent applies only to --method top_percent"),
        (["--method", "epsilon_ball", "--epsilon", "1", "--sample", "5"], "cannot be combined with --epsilon"),
    ):
        refused(capsys, ["groundtruth", url, *args, "--no-cache"], needle)
    assert open_dataset(url).fingerprint == before and not open_dataset(url).has("queries/relevant/indptr")
    paths, _, _ = feature_inputs(tmp_path, labels=(np.zeros(600, np.int64), np.zeros(40, np.int64)))
    ingest(tmp_path / "codes.zarr", paths["db"], paths["q"], db_labels=paths["dbl"], query_labels=paths["ql"])
    refused(capsys, ["groundtruth", tmp_path / "codes.zarr", "--method", "top_percent"], "dataset has no features")


# -- the Prefect flow ------------------------------------------------------------------------


def test_flow_on_two_workers_equals_local_and_reruns_from_cache(tmp_path, prefect_api):
    from flows.groundtruth import run_groundtruth

    url, db, q = features_data(tmp_path)
    local, _ = groundtruth_local(url, method="epsilon_ball", neighbors=20, sample=30, cache=False)
    options = dict(method="epsilon_ball", neighbors=20, sample=30, query_block_rows=8, db_block_rows=100,
                   cache=tmp_path / "cache")
    summary = run_groundtruth(url, workers=2, threads=1, **options)
    assert summary["epsilon"] == local.record["epsilon"]
    # blocks of 8 queries x 100 rows: the sample's 2 sweeps of 4 x 6 blocks, then the queries' 5 x 6
    assert summary["blocks"] == {"computed": 2 * 4 * 6 + 5 * 6, "cached": 0}
    ds = open_dataset(url)
    indptr, indices, _ = ds.relevant(0, ds.n_queries)
    assert (indptr == local.indptr).all() and (indices == local.indices).all()
    rerun = run_groundtruth(url, **options)
    assert rerun["blocks"]["computed"] == 0 and rerun["epsilon"] == local.record["epsilon"]
