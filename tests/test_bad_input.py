"""Bad input: one line naming the problem, exit status 2, no traceback, nothing written."""

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hashdist.cli import main
from tests.conftest import assert_refused, ingest_argv, lock_held_elsewhere


def run_cli(capsys, *argv):
    status = main([str(a) for a in argv])
    err = capsys.readouterr().err
    return status, err


@pytest.mark.parametrize(
    "case, make, needle",
    [
        ("different bit lengths", lambda d: np.zeros((10, 9), np.uint8), "queries have 9 bits"),
        ("values outside", lambda d: np.full((10, 8), 2, np.int8), "code values must be"),
        ("NaN", lambda d: np.full((10, 8), np.nan), "NaN"),
        ("mixed conventions", lambda d: np.array([[-1, 0, 1, 1, 0, 1, 0, 1]] * 10), "mix"),
        ("empty", lambda d: np.zeros((0, 8), np.uint8), "empty"),
        ("1-D codes", lambda d: np.zeros(10, np.uint8), "2-D"),
    ],
)
def test_ingest_bad_query_codes(tmp_path, capsys, files, case, make, needle):
    bad = tmp_path / "bad.npy"
    np.save(bad, make(None))
    out = tmp_path / "out.zarr"
    assert_refused(capsys, ingest_argv(files, out, **{"--query-codes": bad}), needle, out)


def test_ingest_label_count_mismatch(tmp_path, capsys, files):
    np.save(tmp_path / "short.npy", np.zeros(5, np.int64))
    out = tmp_path / "out.zarr"
    assert_refused(capsys, ingest_argv(files, out, **{"--db-labels": tmp_path / "short.npy"}), "5 labels but 200 codes",
                   out)


def test_ingest_refuses_pickles(tmp_path, capsys, files):
    obj = np.empty(10, dtype=object)
    np.save(tmp_path / "obj.npy", obj, allow_pickle=True)
    out = tmp_path / "out.zarr"
    assert_refused(capsys, ingest_argv(files, out, **{"--db-labels": tmp_path / "obj.npy"}), "pickle", out)
    (tmp_path / "evil.npy").write_bytes(pickle.dumps({"x": 1}))
    assert_refused(capsys, ingest_argv(files, out, **{"--db-codes": tmp_path / "evil.npy"}), "evil.npy", out)


def test_ingest_missing_file_and_existing_output(tmp_path, capsys, files):
    out = tmp_path / "out.zarr"
    assert_refused(capsys, ingest_argv(files, out, **{"--db-codes": tmp_path / "nope.npy"}), "no such file", out)
    assert main(ingest_argv(files, out)) == 0
    before = sorted(p.name for p in out.rglob("*"))
    assert_refused(capsys, ingest_argv(files, out), "exists")
    assert sorted(p.name for p in out.rglob("*")) == before


def test_ingest_bad_explicit_ground_truth(tmp_path, capsys, files):
    np.savez(tmp_path / "rel.npz", indptr=np.array([0, 3, 2] + [3] * 8), indices=np.array([1, 2, 3]))
    out = tmp_path / "out.zarr"
    args = ingest_argv(files, out,
                   **{"--db-labels": None, "--query-labels": None, "--query-relevant": tmp_path / "rel.npz"})
    assert_refused(capsys, args, "not monotone", out)
    np.savez(tmp_path / "rel.npz", indptr=np.array([0, 1] + [1] * 9), indices=np.array([500]))
    assert_refused(capsys, args, "out of range", out)


@pytest.fixture
def dataset(tmp_path, files):
    out = tmp_path / "data.zarr"
    assert main(ingest_argv(files, out)) == 0
    return out


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--k", "0"], "--k"),
        (["--radius", "9"], "--radius"),
        (["--radius", "-1"], "--radius"),
        (["--beta", "0"], "--beta"),
        (["--relevance", "explicit"], "supports only class"),
        (["--cluster-kwargs", "{bad json"], "--cluster-kwargs"),
        (["--code-parts", "0"], "--code-parts"),
        (["--query-block-rows", "0"], "--query-block-rows must be a positive integer"),
        (["--metric", "foo"], "unrecognized arguments"),
    ],
)
def test_evaluate_bad_options(tmp_path, capsys, dataset, extra, needle):
    out = tmp_path / "report"
    assert_refused(capsys, ["evaluate", dataset, "--out", out, "--engine", "local", *extra], needle, out)


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--cache", "{file}"], "{file} is not a directory"),
        (["--cache", "{file}/blocks"], "{file} is not a directory"),
        (["--cache", "{tmp}/cache", "--no-cache"], "--cache and --no-cache: give one of them"),
        (["--threads", "0"], "--threads must be at least 1"),
        (["--address", "tcp://127.0.0.1:8786"], "--address places the blocks on a cluster: only with the flow"),
        (["--cluster-class", "distributed.LocalCluster"], "--cluster-class places the blocks on a cluster"),
        (["--cluster-kwargs", '{{"n_workers": 1}}'], "--cluster-kwargs: only with the flow engine"),
    ],
)
def test_evaluate_bad_execution_options(tmp_path, capsys, dataset, extra, needle):
    """A cache that is a file, both cache options, no threads, cluster options that --engine local would ignore."""
    (tmp_path / "file").write_text("not a cache")
    extra = [arg.format(file=tmp_path / "file", tmp=tmp_path) for arg in extra]
    out = tmp_path / "report"
    assert_refused(capsys, ["evaluate", dataset, "--out", out, "--engine", "local", *extra],
                   needle.format(file=tmp_path / "file"), out)
    assert not (tmp_path / "cache").exists()


def test_a_cache_variable_naming_a_file_is_one_line(tmp_path, capsys, dataset, monkeypatch):
    (tmp_path / "afile").write_text("not a cache")
    monkeypatch.setenv("HASHDIST_CACHE", str(tmp_path / "afile"))
    out = tmp_path / "report"
    assert_refused(capsys, ["evaluate", dataset, "--out", out, "--engine", "local"],
                   f"$HASHDIST_CACHE {tmp_path / 'afile'}: {tmp_path / 'afile'} is not a directory", out)


def test_evaluate_missing_or_foreign_dataset(tmp_path, capsys):
    out = tmp_path / "report"
    assert_refused(capsys, ["evaluate", tmp_path / "missing.zarr", "--out", out], "no such dataset", out)
    (tmp_path / "plain").mkdir()
    assert_refused(capsys, ["evaluate", tmp_path / "plain", "--out", out], "not a", out)


@pytest.mark.parametrize("command", [
    ["evaluate", "{missing}", "--out", "{out}"],
    ["evaluate", "{dataset}", "--out", "{out}", "--k", "0"],
    ["evaluate", "{dataset}", "--out", "{out}", "--workers", "0"],
    ["evaluate", "{dataset}", "--out", "{out}", "--address", "tcp://127.0.0.1:8786", "--workers", "2"],
    ["evaluate", "{dataset}", "--out", "{out}", "--cluster-class", "distributed.LocalCluster", "--threads", "1"],
    ["compare", "--method", "a={dataset}", "--method", "b={missing}", "--out", "{out}"],
    ["groundtruth", "--method", "top_percent", "{dataset}"],  # a dataset without features
])
def test_flow_commands_refuse_bad_input_before_prefect_loads(tmp_path, dataset, cli_env, command):
    """With the default engine, bad input is refused before Prefect is imported (seconds sooner) or a temporary
    API server started."""
    argv = [a.format(missing=tmp_path / "missing.zarr", dataset=dataset, out=tmp_path / "out") for a in command]
    script = ("import sys; from hashdist.cli import main; status = main(sys.argv[1:]); "
              "print(sorted({m.split('.')[0] for m in sys.modules} & {'prefect', 'distributed'})); sys.exit(status)")
    proc = subprocess.run([sys.executable, "-c", script, *argv], env=cli_env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.strip() == "[]"
    assert not (tmp_path / "out").exists()


def test_evaluate_refuses_foreign_output_directory(tmp_path, capsys, dataset):
    out = tmp_path / "mydir"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    assert_refused(capsys, ["evaluate", dataset, "--out", out, "--engine", "local"], "not a hashdist report")
    assert (out / "precious.txt").read_text() == "keep me"


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupted_chunk_is_named(tmp_path, capsys, dataset, damage):
    chunk = sorted((dataset / "database" / "codes").rglob("c/*/*"))[0]
    data = bytearray(chunk.read_bytes())
    if damage == "flip":
        data[-1] ^= 0xFF
    else:
        del data[len(data) // 2 :]
    chunk.write_bytes(bytes(data))
    out = tmp_path / "new" / "report"  # found during the run: not even the directory it would have made is left
    assert_refused(capsys, ["evaluate", dataset, "--out", out, "--engine", "local", "--no-cache"],
                   "database/codes", out)
    assert not (tmp_path / "new").exists()


def test_output_path_through_a_file_is_refused(tmp_path, capsys, dataset):
    (tmp_path / "afile").write_text("not a directory")
    out = tmp_path / "afile" / "sub" / "report"
    assert_refused(capsys, ["evaluate", dataset, "--out", out, "--engine", "local"], "cannot write there")
    assert (tmp_path / "afile").read_text() == "not a directory"


def test_synth_bad_option(tmp_path, capsys):
    out = tmp_path / "s.zarr"
    assert_refused(capsys, ["synth", "--n-database", "100", "--n-queries", "10", "--noise", "2", "--out", out],
                   "--noise", out)
    assert_refused(capsys, ["synth", "--preset", "nope", "--out", out], "--preset", out)


@pytest.mark.parametrize("args, needle", [
    (["--digits", "lsh", "--preset", "demo"], "--preset and --digits: give one source of data"),
    (["--digits", "lsh", "--features", "itq"], "--digits and --features: give one source of data"),
    (["--digits", "lsh", "--noise", "0.1"], "--noise: not with --digits"),
    (["--features", "lsh", "--n-database", "100", "--n-queries", "10", "--labels", "class"],
     "--labels: not with --features"),
    (["--preset", "demo", "--dim", "8"], "--dim: only with --features"),
    (["--digits", "lsh", "--noise", "0"], "--noise: not with --digits"),  # 0 is given too
    (["--digits", "lsh", "--run", "0"], "--run goes with --splits"),
])
def test_synth_refuses_options_its_source_would_ignore(tmp_path, capsys, args, needle):
    out = tmp_path / "s.zarr"
    assert_refused(capsys, ["synth", *args, "--out", out], needle, out)


def test_missing_chunk_is_named(tmp_path, capsys, dataset):
    chunk = sorted((dataset / "database" / "labels").rglob("c/*"))[0]
    chunk.unlink()
    out = tmp_path / "report"
    assert_refused(capsys, ["evaluate", dataset, "--out", out, "--engine", "local", "--no-cache"],
                   "database/labels chunk 0 is missing", out)


def test_concurrent_run_into_the_same_output_is_refused(tmp_path, capsys, dataset, files):
    out = tmp_path / "report"
    with lock_held_elsewhere(out):  # another run holds the output
        assert_refused(capsys, ["evaluate", dataset, "--out", out, "--engine", "local"], "another hashdist run", out)
        target = tmp_path / "other.zarr"
        with lock_held_elsewhere(target):
            assert_refused(capsys, ingest_argv(files, target), "another hashdist run", target)
    status, _ = run_cli(capsys, "evaluate", dataset, "--out", out, "--engine", "local")
    assert status == 0 and (out / "report.json").is_file()


@pytest.mark.parametrize(
    "damage, needle",
    [
        (lambda g, p: g.attrs.update({"format_version": 99}), "format version 99"),
        (lambda g, p: g.attrs.update({"nbits": 200}), "needs (rows, 4) uint64"),
        (lambda g, p: __import__("shutil").rmtree(p / "database" / "labels"), "database/labels"),
        (lambda g, p: g.attrs.__delitem__("nbits"), "zarr.json: attribute nbits is missing"),
        (lambda g, p: g.attrs.update({"fingerprints": {"database/codes": {"rows": "many"}}}),
         "attribute fingerprints['database/codes'] has no 'chunk_rows'"),
        (lambda g, p: g.attrs.update({"fingerprints": {k: v for k, v in g.attrs["fingerprints"].items()
                                                       if k != "queries/codes"}}),
         "attribute fingerprints has no entry 'queries/codes'"),
        (lambda g, p: g.attrs.update({"fingerprints": {**g.attrs["fingerprints"], "database/codes": {
            **g.attrs["fingerprints"]["database/codes"], "chunk_rows": 0}}}),
         "fingerprints['database/codes'].chunk_rows must be an integer >= 1"),
    ],
)
def test_damaged_dataset_is_refused(tmp_path, capsys, dataset, damage, needle):
    import zarr

    damage(zarr.open_group(str(dataset), mode="r+"), dataset)
    out = tmp_path / "report"
    assert_refused(capsys, ["evaluate", dataset, "--out", out, "--engine", "local", "--no-cache"], needle, out)


def test_bad_hashtable_setting(tmp_path, capsys, dataset):
    out = tmp_path / "report"
    assert_refused(capsys, ["evaluate", dataset, "--out", out, "--engine", "local", "--hashtable", "8x2"], "8x2", out)


@pytest.mark.parametrize("writer", ["evaluation", "comparison"])
def test_library_writers_take_the_output_lock(tmp_path, class_dataset, writer):
    """Evaluation.write and compare(out=...) refuse an output another process is writing, and write nothing."""
    from hashdist.api import compare, evaluate_local
    from hashdist.errors import InputError

    out = tmp_path / "out"
    with lock_held_elsewhere(out), pytest.raises(InputError, match="another hashdist run"):
        if writer == "evaluation":
            evaluate_local(class_dataset, cache=False).write(out)
        else:
            compare([f"a={class_dataset}", f"b={class_dataset}"], cache=False, out=out, permutations=10)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_error_itself_before_or_after_the_command(tmp_path, where, capsys):
    """--debug goes before the command or after it; either way bad input then shows its traceback before the
    same one line, with the same exit status 2."""
    args = ["evaluate", str(tmp_path / "missing.zarr"), "--out", str(tmp_path / "r"), "--engine", "local"]
    assert main(["--debug", *args] if where == "before" else [*args, "--debug"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and "InputError" in err
    assert err.splitlines()[-1].startswith("hashdist evaluate: error: ") and "no such dataset" in err


def test_an_output_that_overlaps_an_input_is_refused_even_with_overwrite(tmp_path, capsys, files, dataset):
    """--out that is the dataset, lies inside it or holds it (and ingest's --out holding its input files) would
    be replaced by the output: refused, and the inputs are left as they were."""
    import hashdist

    before = hashdist.open_dataset(dataset).fingerprint
    local = ["--engine", "local", "--overwrite"]
    assert_refused(capsys, ["evaluate", dataset, "--out", dataset, *local], f"--out {dataset}: is the input")
    assert_refused(capsys, ["evaluate", dataset, "--out", dataset / "database", *local], "lies inside the input")
    assert_refused(capsys, ["evaluate", dataset, "--out", tmp_path, *local], "holds the input")
    assert_refused(capsys, ["compare", "--method", f"a={dataset}", "--method", f"b={dataset}", "--out", dataset,
                            *local], "is the input")
    assert hashdist.open_dataset(dataset).fingerprint == before
    assert_refused(capsys, [*ingest_argv(files, tmp_path), "--overwrite"], f"--out {tmp_path}: holds the input")
    assert all(Path(path).is_file() for path in files.values())
