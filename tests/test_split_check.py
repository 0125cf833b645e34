"""hashdist split --check: index files a paper ships (.npy, .txt, .mat), checked with counts; exit 0 / 2 / 3."""

import json
import pickle
import subprocess
import sys

import numpy as np
import pytest
import scipy.io as sio

from hashdist.cli import main
from hashdist.data.splitcheck import check_split
from hashdist.errors import InputError

N = 20_015  # MIRFlickr-25K's pairs


def _run(capsys, *args):
    """(exit status, stdout, stderr lines) of ``hashdist split --check ...``."""
    status = main(["split", "--check", *map(str, args)])
    captured = capsys.readouterr()
    return status, captured.out, [line for line in captured.err.splitlines() if line.strip()]


@pytest.fixture
def mirflickr(tmp_path):
    """A clean MIRFlickr-25K-sized split in three formats: 2,000 queries (.npy), 18,015 database items (.txt) and
    10,000 training items drawn from the database (.mat, beside the queries); 24 multi-hot labels."""
    rng = np.random.default_rng(7)
    perm = rng.permutation(N)
    query, database = perm[:2_000], perm[2_000:]
    training = rng.choice(database, 10_000, replace=False)
    labels = (rng.random((N, 24)) < 0.12).astype(np.uint8)
    np.save(tmp_path / "query.npy", query)
    np.savetxt(tmp_path / "database.txt", database, fmt="%d")
    sio.savemat(tmp_path / "split.mat", {"train_idx": training.reshape(1, -1), "query_idx": query.reshape(-1, 1)})
    np.save(tmp_path / "labels.npy", labels)
    return {"query": query, "database": database, "training": training, "labels": labels, "dir": tmp_path}


def _files(d, train="split.mat:train_idx"):
    return ["--query-index", d / "query.npy", "--db-index", d / "database.txt", "--train-index", d / train]


def test_a_clean_mirflickr_split_keeps_every_rule(mirflickr, capsys):
    d = mirflickr["dir"]
    status, out, err = _run(capsys, *_files(d), "--labels", d / "labels.npy", "--protocol", "mirflickr25k")
    assert status == 0 and err == []
    assert "every rule checked is kept" in out and "BROKEN" not in out
    assert "database: 18,015 as mirflickr25k says" in out and "training inside the database" in out
    status, out, _ = _run(capsys, *_files(d), "--labels", d / "labels.npy", "--protocol", "mirflickr25k", "--json")
    report = json.loads(out)  # one JSON document
    assert status == 0 and report["broken"] == 0 and report["protocol"] == "mirflickr25k"
    assert {role: s["size"] for role, s in report["sets"].items()} == {
        "queries": 2_000, "database": 18_015, "training": 10_000}
    assert report["overlaps"] == {"queries_in_database": 0, "training_in_queries": 0, "training_in_database": 10_000,
                                  "training_outside_database": 0, "database_outside_training": 8_015, "in_no_set": 0}
    labels = mirflickr["labels"]
    for role, key in (("queries", "query"), ("database", "database"), ("training", "training")):
        rows = labels[mirflickr[key]]  # per-label counts are the label sums of the set's rows
        assert report["balance"]["counts"][role] == rows.sum(axis=0).tolist()
        assert report["balance"]["no_label"][role] == int((rows.sum(axis=1) == 0).sum())
    assert report["pool"] == {"n_items": N, "from": "--labels", "label_kind": "multilabel", "labels": 24,
                              "protocol_pooled_items": N, "protocol_labels": 24}


def test_a_leaking_split_like_three_separate_shuffles(tmp_path, capsys):
    """UCCH's raw-image loader shuffles the pool once per partition (train, retrieval, test) from one seeded
    stream: with seed 123, 1,783 of the 2,000 test queries are also in the retrieval set."""
    stream = np.random.RandomState(123)
    shuffles = []
    for _ in range(3):
        order = np.arange(N)
        stream.shuffle(order)
        shuffles.append(order)
    np.save(tmp_path / "q.npy", shuffles[2][-2_000:])
    np.save(tmp_path / "db.npy", shuffles[1][:-2_000])
    np.save(tmp_path / "train.npy", shuffles[0][:-2_000])
    status, out, err = _run(capsys, "--query-index", tmp_path / "q.npy", "--db-index", tmp_path / "db.npy",
                            "--train-index", tmp_path / "train.npy", "--n-items", N, "--json")
    report = json.loads(out)
    assert status == 3 and report["overlaps"]["queries_in_database"] == 1_783
    assert report["overlaps"]["training_in_queries"] == len(np.intersect1d(shuffles[2][-2_000:],
                                                                          shuffles[0][:-2_000]))
    assert len(err) == 1 and err[0].startswith("split check: 2 rules broken: ")
    assert "1,783 of 2,000 queries are in the database" in err[0] and "Traceback" not in err[0]
    status, out, _ = _run(capsys, "--query-index", tmp_path / "q.npy", "--db-index", tmp_path / "db.npy", "--n-items",
                          N)
    assert status == 3 and "BROKEN  no query in the database" in out and "1,783 of 2,000" in out


def test_duplicates_and_out_of_range_are_counted(tmp_path, capsys):
    query = np.array([0, 1, 1, 2, 2, 2, 100, -1])
    database = np.arange(3, 100)
    np.savetxt(tmp_path / "q.txt", query, fmt="%d")
    np.save(tmp_path / "db.npy", database)
    status, out, err = _run(capsys, "--query-index", tmp_path / "q.txt", "--db-index", tmp_path / "db.npy",
                            "--n-items", 100, "--json")
    report = json.loads(out)
    assert status == 3
    assert report["sets"]["queries"] == {"source": str(tmp_path / "q.txt"), "size": 8, "distinct": 5,
                                         "duplicates": 3, "out_of_range": 2, "expected": None}
    assert report["sets"]["database"]["duplicates"] == 0 and report["overlaps"]["in_no_set"] == 0
    assert [r["ok"] for r in report["rules"]] == [False, False, True]
    assert "queries: 3 duplicate entries" in err[0] and "queries: 2 out of range" in err[0]
    # without N only negative indices are out of range, and the rule says so
    report = check_split(query, database)
    assert report["sets"]["queries"]["out_of_range"] == 1 and "N unknown" in report["rules"][1]["rule"]


def test_one_based_mat_files(tmp_path, capsys):
    rng = np.random.default_rng(3)
    perm = rng.permutation(500)
    sio.savemat(tmp_path / "split.mat", {"q": perm[:50] + 1, "db": (perm[50:] + 1).reshape(-1, 1),
                                         "tr": perm[50:250] + 1.0})  # MATLAB doubles, counted from 1
    files = ["--query-index", f"{tmp_path / 'split.mat'}:q", "--db-index", f"{tmp_path / 'split.mat'}:db",
             "--train-index", f"{tmp_path / 'split.mat'}:tr", "--n-items", 500]
    status, out, _ = _run(capsys, *files, "--index-base", 1)
    assert status == 0 and "indices 1-based" in out
    status, out, err = _run(capsys, *files)
    assert status == 3 and "so 1-based (MATLAB); rerun with --index-base 1" in out
    assert "every index in 0..499" in err[0]
    np.save(tmp_path / "zero.npy", np.array([0, 4, 9]))  # 0-based queries under --index-base 1
    status, out, _ = _run(capsys, "--query-index", tmp_path / "zero.npy", *files[2:], "--index-base", 1)
    assert status == 3 and "queries: an index is 0, so 0-based" in out


def test_training_rules_of_the_protocols(tmp_path):
    classes = np.repeat(np.arange(10), [287] * 6 + [286] * 4)  # 2,866 single-label pairs
    rng = np.random.default_rng(5)
    perm = rng.permutation(classes.size)
    query, database = perm[:693], perm[693:]
    wiki = check_split(query, database, database, labels=classes, protocol="wiki")
    assert wiki["broken"] == 0 and wiki["rules"][-1]["rule"] == "training set = database"
    assert sum(wiki["balance"]["counts"]["queries"]) == 693 and wiki["balance"]["kind"] == "class"
    part = check_split(query, database, database[:2_000], labels=classes, protocol="wiki")
    assert [r["rule"] for r in part["rules"] if r["ok"] is False] == [
        "training: 2,173 as wiki says", "training set = database"]
    assert part["overlaps"]["database_outside_training"] == 173
    # improved (cifar10): the training set is held out of the database
    perm = rng.permutation(60_000)
    held = check_split(perm[:1_000], perm[1_000:55_000], perm[55_000:], n_items=60_000, protocol="cifar10")
    assert held["broken"] == 0 and held["rules"][-1]["rule"] == "training apart from the database"
    inside = check_split(perm[:1_000], perm[1_000:55_000], perm[1_000:6_000], n_items=60_000, protocol="cifar10")
    assert inside["rules"][-1] == {"rule": "training apart from the database", "ok": False,
                                   "detail": "5,000 training items are in the database"}
    # a pool size that is not verified is not held against the database
    perm = rng.permutation(20_000)
    iapr = check_split(perm[:2_000], perm[2_000:19_000], perm[2_000:12_000], n_items=20_000, protocol="iaprtc12")
    assert iapr["broken"] == 0 and iapr["rules"][5]["ok"] is None and "not checked" in iapr["rules"][5]["detail"]


def test_notes_on_the_pool(mirflickr):
    d, labels = mirflickr["dir"], mirflickr["labels"]
    wide = np.concatenate([labels, labels[:, :14]], axis=1)  # DeepHash-pytorch's 38 label columns
    report = check_split(d / "query.npy", d / "database.txt", labels=wide, protocol="mirflickr25k")
    assert report["broken"] == 0
    assert "the labels have 38 columns, mirflickr25k 24" in report["notes"]
    report = check_split(d / "query.npy", d / "database.txt", n_items=N + 5, protocol="mirflickr25k")
    assert any(note.startswith("the pool has N = 20,020 items, mirflickr25k 20,015") for note in report["notes"])
    assert report["overlaps"]["in_no_set"] == 5 and report["broken"] == 0


def _bad(tmp_path):
    """(name, extra arguments, text of the one-line error) for every kind of bad input."""
    np.save(tmp_path / "q.npy", np.arange(10))
    np.save(tmp_path / "float.npy", np.array([0.5, 1.0]))
    np.save(tmp_path / "matrix.npy", np.zeros((3, 4), np.int64))
    np.save(tmp_path / "mask.npy", np.ones(5, bool))
    np.save(tmp_path / "obj.npy", np.empty(3, dtype=object), allow_pickle=True)
    (tmp_path / "evil.npy").write_bytes(pickle.dumps({"x": 1}))
    (tmp_path / "words.txt").write_text("# query list\n1 2 3\nimage_17.jpg 4\n")
    (tmp_path / "empty.txt").write_text("# nothing\n")
    sio.savemat(tmp_path / "two.mat", {"a": np.arange(3), "b": np.arange(4)})
    sio.savemat(tmp_path / "cell.mat", {"c": np.array([np.arange(2), np.arange(3)], dtype=object)})
    header = b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: Mon Jan  1 00:00:00 2024 HDF5 schema 1.00 ."
    (tmp_path / "v73.mat").write_bytes(header.ljust(116) + b"\0" * 8 + b"\x00\x02IM" + b"\0" * 512)
    (tmp_path / "split.json").write_text("[1, 2]")
    db = ["--db-index", tmp_path / "q.npy"]
    return [
        ("missing", ["--query-index", tmp_path / "none.npy", *db], "--query-index", "no such file"),
        ("pickle", ["--query-index", tmp_path / "evil.npy", *db], "--query-index", "evil.npy"),
        ("object", ["--query-index", tmp_path / "obj.npy", *db], "--query-index", "pickle"),
        ("float", ["--query-index", tmp_path / "float.npy", *db], "--query-index", "whole numbers, found 0.5"),
        ("matrix", ["--query-index", tmp_path / "matrix.npy", *db], "--query-index", "must be a vector"),
        ("mask", ["--query-index", tmp_path / "mask.npy", *db], "--query-index", "numpy.flatnonzero"),
        ("words", ["--query-index", tmp_path / "words.txt", *db], "--query-index", "'image_17.jpg' is not an index"),
        ("empty", ["--query-index", tmp_path / "empty.txt", *db], "--query-index", "holds no indices"),
        ("which", ["--query-index", tmp_path / "two.mat", *db], "--query-index",
         "holds 2 variables (a, b); name one as"),
        ("name", ["--query-index", f"{tmp_path / 'two.mat'}:z", *db], "--query-index", "no variable 'z' (it has a, b)"),
        ("cell", ["--query-index", tmp_path / "cell.mat", *db], "--query-index", "cell array"),
        ("suffix", ["--query-index", tmp_path / "split.json", *db], "--query-index", "unknown index file type"),
        ("no db", ["--query-index", tmp_path / "q.npy"], "--check", "needs --query-index FILE and --db-index FILE"),
        ("base", ["--query-index", tmp_path / "q.npy", *db, "--index-base", 2], "--index-base", "must be 0 or 1"),
        ("out", ["--query-index", tmp_path / "q.npy", *db, "--out", tmp_path / "s.zarr"], "--out", "does not go"),
        ("protocol", ["--query-index", tmp_path / "q.npy", *db, "--protocol", "mirflikr"], "--protocol",
         "did you mean mirflickr25k?"),
        ("labels", ["--query-index", tmp_path / "q.npy", *db, "--labels", tmp_path / "float.npy"], "--labels",
         "class labels must be integers"),
        ("v7.3", ["--query-index", tmp_path / "v73.mat", *db], "--query-index", "MATLAB v7.3 (HDF5)"),
    ]


def test_bad_input_is_one_line_and_status_2(tmp_path, capsys):
    for name, args, option, needle in _bad(tmp_path):
        if name == "v7.3" and _has_h5py():
            continue  # with h5py installed the file is read (and this fake one refused as unreadable)
        status, out, err = _run(capsys, *args)
        assert status == 2 and out == "" and len(err) == 1, (name, err)
        assert err[0].startswith(f"hashdist split: error: {option}") and needle in err[0], (name, err[0])
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".zarr") == []  # nothing written


def _has_h5py() -> bool:
    try:
        import h5py  # noqa: F401
    except ImportError:
        return False
    return True


def test_drawing_still_needs_its_inputs(tmp_path, capsys):
    assert main(["split", "--n-items", "50", "--query-index", str(tmp_path / "q.npy"), "--out",
                 str(tmp_path / "s.zarr")]) == 2
    assert "--query-index goes with --check" in capsys.readouterr().err
    assert main(["split", "--n-items", "50"]) == 2
    assert "--out SPLITS.zarr is required" in capsys.readouterr().err
    with pytest.raises(InputError, match="at most one of --labels and --n-items"):
        check_split([0], [1], labels=np.zeros(3, np.int64), n_items=3)


def test_the_command_line_process(mirflickr):
    """python -m hashdist.cli: the report on stdout, one line on stderr, exit status 3; JSON on stdout with --json."""
    d = mirflickr["dir"]
    args = [sys.executable, "-m", "hashdist.cli", "split", "--check", "--query-index", str(d / "query.npy"),
            "--db-index", str(d / "query.npy"), "--n-items", str(N), "--json"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert json.loads(proc.stdout)["overlaps"]["queries_in_database"] == 2_000
    assert len(proc.stderr.strip().splitlines()) == 1 and "no query in the database" in proc.stderr


def test_matlab_v73_files_are_read_with_h5py(tmp_path):
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "v73.mat"
    with h5py.File(path, "w", userblock_size=512) as f:  # MATLAB's v7.3 layout: HDF5 after a 512-byte header
        f["q"] = (np.arange(10) + 1.0).reshape(-1, 1)
        f["db"] = (np.arange(10, 50) + 1.0).reshape(1, -1)
        f.create_group("#refs#")
    header = b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: Mon Jan  1 00:00:00 2024 HDF5 schema 1.00 ."
    with open(path, "r+b") as fh:
        fh.write(header.ljust(116) + b"\0" * 8 + b"\x00\x02IM")
    report = check_split(f"{path}:q", f"{path}:db", n_items=50, index_base=1)
    assert report["broken"] == 0 and report["sets"]["database"]["size"] == 40
    with pytest.raises(InputError, match=r"holds 2 variables \(db, q\)"):
        check_split(path, f"{path}:db")
