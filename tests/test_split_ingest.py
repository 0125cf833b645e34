"""ingest --splits and synth --digits --splits: datasets of one split run, checked against the pooled arrays."""

import numpy as np
import pytest
import zarr

from hashdist.cli import main
from hashdist.data.bits import unpack_bits
from hashdist.data.dataset import open_dataset
from hashdist.data.splits import read_split

RUNS = 3


@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
    d = tmp_path_factory.mktemp("pooled")
    assert main(["synth", "--pooled", "--n-database", "1800", "--n-queries", "200", "--labels", "class",
                 "--n-classes", "5", "--nbits", "24", "--out", str(d / "pool")]) == 0
    assert main(["split", "--labels", str(d / "pool" / "labels.npy"), "--runs", str(RUNS), "--test-queries", "100",
                 "--test-database", "900", "--validation-queries", "50", "--validation-database", "300",
                 "--out", str(d / "splits.zarr")]) == 0
    return d


@pytest.mark.parametrize("strategy, validation", [("standard", False), ("improved", False), ("improved", True)])
def test_dataset_holds_exactly_the_runs_rows(pooled, strategy, validation, tmp_path):
    codes, labels = np.load(pooled / "pool" / "codes.npy"), np.load(pooled / "pool" / "labels.npy")
    out = tmp_path / "run.zarr"
    argv = ["ingest", "--codes", str(pooled / "pool" / "codes.npy"), "--labels", str(pooled / "pool" / "labels.npy"),
            "--splits", str(pooled / "splits.zarr"), "--strategy", strategy, "--run", "1", "--chunk-rows", "128",
            "--query-chunk-rows", "32", "--out", str(out)]
    assert main(argv + (["--validation"] if validation else [])) == 0
    roles = read_split(pooled / "splits.zarr", strategy, 1)
    q_role = "validation_queries" if validation else "test_queries"
    d_role = "validation_database" if validation else ("database" if strategy == "standard" else "test_database")
    ds = open_dataset(out)
    np.testing.assert_array_equal(unpack_bits(ds.codes("queries", 0, ds.n_queries), 24), codes[roles[q_role]])
    np.testing.assert_array_equal(unpack_bits(ds.codes("database", 0, ds.n_database), 24), codes[roles[d_role]])
    np.testing.assert_array_equal(ds.labels("queries", 0, ds.n_queries), labels[roles[q_role]])
    np.testing.assert_array_equal(ds.labels("database", 0, ds.n_database), labels[roles[d_role]])
    record = dict(zarr.open_group(str(out), mode="r").attrs)["split"]
    assert (record["strategy"], record["run"], record["queries"], record["database"]) == (strategy, 1, q_role, d_role)


@pytest.mark.parametrize("extra, needle", [
    (["--run", "3"], "run"),
    (["--run", "0", "--strategy", "sideways"], "--strategy"),
    (["--run", "0", "--codes", "{wrong}"], "rows but the splits"),
    (["--run", "0", "--db-codes", "{codes}"], "does not go with --splits"),
    (["--run", "0", "--labels", "{permuted}"], "not the labels"),  # the right labels in another order
])
def test_bad_split_ingest_is_one_line(pooled, tmp_path, capsys, extra, needle):
    np.save(tmp_path / "wrong.npy", np.zeros((10, 24), np.uint8))
    labels = np.load(pooled / "pool" / "labels.npy")
    np.save(tmp_path / "permuted.npy", labels[np.random.default_rng(0).permutation(len(labels))])
    base = {"--codes": str(pooled / "pool" / "codes.npy"), "--labels": str(pooled / "pool" / "labels.npy"),
            "--splits": str(pooled / "splits.zarr"), "--strategy": "standard"}
    for i in range(0, len(extra), 2):
        base[extra[i]] = extra[i + 1].format(wrong=tmp_path / "wrong.npy", codes=pooled / "pool" / "codes.npy",
                                             permuted=tmp_path / "permuted.npy")
    out = tmp_path / "run.zarr"
    argv = ["ingest", *[x for pair in base.items() for x in pair], "--out", str(out)]
    capsys.readouterr()
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and needle in err[0], err
    assert not out.exists()


def test_digits_hashed_per_run_on_its_training_set(tmp_path):
    assert main(["synth", "--digits", "itq", "--pooled", "--out", str(tmp_path / "digits")]) == 0
    assert main(["split", "--labels", str(tmp_path / "digits" / "labels.npy"), "--runs", "2", "--test-queries",
                 "150", "--validation-queries", "100", "--validation-database", "500", "--strategy", "standard",
                 "--out", str(tmp_path / "s.zarr")]) == 0
    for run in (0, 1):
        assert main(["synth", "--digits", "itq", "--nbits", "16", "--splits", str(tmp_path / "s.zarr"),
                     "--strategy", "standard", "--run", str(run), "--out", str(tmp_path / f"itq{run}.zarr")]) == 0
    roles = read_split(tmp_path / "s.zarr", "standard", 0)
    ds = open_dataset(tmp_path / "itq0.zarr")
    assert (ds.n_queries, ds.n_database) == (len(roles["test_queries"]), len(roles["database"]))
    labels = np.load(tmp_path / "digits" / "labels.npy")
    np.testing.assert_array_equal(ds.labels("queries", 0, ds.n_queries), labels[roles["test_queries"]])
    assert dict(ds.attrs())["synth"]["trained_on"] == "training"
    record = dict(ds.attrs())["split"]  # recorded as ingest --splits records it
    assert (record["strategy"], record["run"], record["queries"], record["database"], record["seed"]) == (
        "standard", 0, "test_queries", "database", 0) and len(record["indices_sha256"]) == 64
    other = open_dataset(tmp_path / "itq1.zarr")
    assert other.fingerprint != ds.fingerprint  # another run: other queries, other model


def test_digits_end_to_end_over_ten_runs(tmp_path, capsys):
    """docs/protocols.md's example: split, hash with LSH and ITQ per run, compare over 10 runs."""
    from scipy import stats

    from hashdist.api import evaluate_local

    assert main(["synth", "--digits", "itq", "--pooled", "--out", str(tmp_path / "digits")]) == 0
    assert main(["split", "--labels", str(tmp_path / "digits" / "labels.npy"), "--runs", "10", "--test-queries",
                 "200", "--validation-queries", "100", "--validation-database", "500", "--strategy", "standard",
                 "--out", str(tmp_path / "s.zarr")]) == 0
    runs = {method: [] for method in ("itq", "lsh")}
    for method, paths in runs.items():
        for t in range(10):
            paths.append(str(tmp_path / f"{method}{t}.zarr"))
            assert main(["synth", "--digits", method, "--nbits", "16", "--splits", str(tmp_path / "s.zarr"),
                         "--strategy", "standard", "--run", str(t), "--out", paths[-1]]) == 0
    out = tmp_path / "cmp"
    assert main(["compare", *(f"--method={m}={','.join(p)}" for m, p in runs.items()), "--engine", "local",
                 "--no-cache", "--permutations", "999", "--out", str(out), "--markdown"]) == 0
    import json

    c = json.loads((out / "comparison.json").read_text())
    for method, paths in runs.items():
        values = [evaluate_local(p, cache=False).report["metrics"]["map"]["expected"] for p in paths]
        summary = c["methods"][method]["over_runs"]["mAP"]
        assert summary["values"] == pytest.approx(values, abs=1e-15)
        assert summary["mean"] == pytest.approx(np.mean(values), abs=1e-15)
        assert summary["sd"] == pytest.approx(np.std(values, ddof=1), abs=1e-15)
        lo, hi = stats.t.interval(0.95, 9, loc=np.mean(values), scale=stats.sem(values))
        assert summary["ci"] == pytest.approx([lo, hi], abs=1e-12)
    assert c["ranking"][0] == "itq"  # ITQ beats random hyperplanes on the digits
    assert "±" in (out / "leaderboard.md").read_text()
