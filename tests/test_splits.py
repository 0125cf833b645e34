"""hashdist split: disjoint, class-balanced, seeded splits (docs/metrics.md section 5b) and their Zarr store."""

import pickle
import shutil

import numpy as np
import pytest
import zarr

from hashdist.cli import main
from hashdist.data.splits import ROLES, make_splits, read_split, split, write_splits
from hashdist.errors import InputError
from tests.conftest import lock_held_elsewhere

N = 900
SIZES = {"test_queries": 37, "test_database": 120, "validation_queries": 23, "validation_database": 61}
STANDARD_DRAWN = SIZES["test_queries"] + SIZES["validation_queries"] + SIZES["validation_database"]


def _labels(kind, n=N, seed=0):
    rng = np.random.default_rng(seed)
    if kind == "class":
        return rng.integers(0, 6, n)
    first, columns = rng.integers(-1, 5, n), np.arange(5)  # first label, -1: none; about 150 items each
    later = (columns > first[:, None]) & (first[:, None] >= 0) & (rng.random((n, 5)) < 0.5)
    return (later | (columns == first[:, None])).astype(np.uint8)


def _source(kind):
    return {"n_items": N} if kind == "none" else {"labels": _labels(kind)}


def _first_label(multihot):
    """Each row's lowest set column, -1 for a row without labels."""
    return np.where(multihot.any(axis=1), multihot.argmax(axis=1), -1)


def _spread(groups, idx):
    """Largest minus smallest count, among items ``idx``, of the groups present in ``groups``."""
    inverse = np.unique(groups, return_inverse=True)[1]
    counts = np.bincount(inverse[idx], minlength=inverse.max() + 1)
    return int(counts.max() - counts.min())


@pytest.mark.parametrize("training", [None, 150])
@pytest.mark.parametrize("kind", ["class", "multilabel", "none"])
def test_roles_are_disjoint_and_cover_the_items(kind, training):
    splits = make_splits(**_source(kind), runs=2, sizes={**SIZES, "training": training})
    everything = np.arange(N)
    for sets in splits["standard"]:
        assert list(sets) == list(ROLES["standard"])
        tq, db, vq, vdb, tr = (sets[role] for role in ROLES["standard"])
        assert not np.intersect1d(tq, db).size and np.array_equal(np.union1d(tq, db), everything)
        assert all(np.isin(part, db).all() for part in (vq, vdb, tr))
        assert not np.intersect1d(vq, vdb).size and not np.intersect1d(tr, np.union1d(vq, vdb)).size
        assert [len(tq), len(vq), len(vdb)] == [SIZES["test_queries"], SIZES["validation_queries"],
                                                SIZES["validation_database"]]
        assert len(tr) == (training or N - STANDARD_DRAWN)
    for sets in splits["improved"]:
        assert list(sets) == list(ROLES["improved"])
        parts = np.concatenate(list(sets.values()))
        assert len(np.unique(parts)) == len(parts)  # pairwise disjoint
        assert [len(sets[role]) for role in SIZES] == list(SIZES.values())
        assert len(parts) == (N if training is None else sum(SIZES.values()) + training)
    for runs in splits.values():
        for idx in (idx for sets in runs for idx in sets.values()):
            assert idx.dtype == np.int64 and idx.ndim == 1 and (np.diff(idx) > 0).all()


def test_class_balance_within_one_item_per_class():
    labels = np.random.default_rng(3).integers(0, 7, 2000)
    splits = make_splits(labels, runs=3, sizes={**SIZES, "training": 200})
    for strategy, runs in splits.items():
        for sets in runs:
            for role, idx in sets.items():
                if role != "database":  # the one set that is not drawn: everything but the test queries
                    assert _spread(labels, idx) <= 1, (strategy, role, np.bincount(labels[idx]))


def test_a_small_class_gives_all_it_has_and_the_others_share_the_rest():
    labels = np.repeat([0, 1, 2, 3], [5, 100, 100, 100])
    sizes = {"test_queries": 60, "test_database": 90, "validation_queries": 0, "validation_database": 0}
    sets = make_splits(labels, strategies=["improved"], runs=1, sizes=sizes)["improved"][0]
    tq = np.bincount(labels[sets["test_queries"]], minlength=4)
    assert tq[0] == 5 and tq.sum() == 60 and tq[1:].max() - tq[1:].min() <= 1
    assert np.bincount(labels[sets["test_database"]], minlength=4).tolist() == [0, 30, 30, 30]
    assert len(sets["validation_queries"]) == len(sets["validation_database"]) == 0
    assert len(sets["training"]) == 305 - 60 - 90


def test_multilabel_balance_is_on_the_first_label():
    labels = _labels("multilabel")
    first = _first_label(labels)
    assert len(np.unique(first)) == 6  # five first labels and the items without a label
    splits = make_splits(labels, runs=2, sizes={**SIZES, "training": 150})
    for runs in splits.values():
        for sets in runs:
            for role, idx in sets.items():
                if role != "database":
                    assert _spread(first, idx) <= 1, (role, np.unique(first[idx], return_counts=True))


@pytest.mark.parametrize("seed", [0, 12345])
def test_unlabelled_indices_are_numpys_pcg64_stream(seed):
    """Without labels, run t of strategy i is the stable argsort of PCG64(SeedSequence([seed, t, i])) words."""
    n, s = 500, {"test_queries": 40, "test_database": 100, "validation_queries": 30, "validation_database": 70}
    spans = {"standard": {"test_queries": (0, 40), "database": (40, n), "validation_queries": (40, 70),
                          "validation_database": (70, 140), "training": (140, n)},
             "improved": {"test_queries": (0, 40), "test_database": (40, 140), "validation_queries": (140, 170),
                          "validation_database": (170, 240), "training": (240, n)}}
    splits = make_splits(n_items=n, runs=3, seed=seed, sizes=s)
    for index, strategy in enumerate(("standard", "improved")):
        for t, sets in enumerate(splits[strategy]):
            words = np.random.PCG64(np.random.SeedSequence([seed, t, index])).random_raw(n)
            order = np.argsort(words, kind="stable")
            for role, (lo, hi) in spans[strategy].items():
                assert np.array_equal(sets[role], np.sort(order[lo:hi])), (strategy, t, role)


def test_same_seed_same_splits_and_every_run_differs(tmp_path):
    labels, runs = _labels("class"), 4
    first = make_splits(labels, runs=runs, seed=7, sizes=SIZES)
    again = make_splits(labels, runs=runs, seed=7, sizes=SIZES)
    alone = make_splits(labels, strategies="improved", runs=runs, seed=7, sizes=SIZES)
    other_seed = make_splits(labels, runs=runs, seed=8, sizes=SIZES)
    attrs = split(tmp_path / "s.zarr", labels, runs=runs, seed=7, sizes=SIZES)
    written = write_splits(tmp_path / "w.zarr", first, n_items=N, label_kind="class", seed=7)
    assert written == {key: value for key, value in attrs.items() if key != "groups_sha256"}  # no labels given
    for strategy, per_run in first.items():
        for t, sets in enumerate(per_run):
            copies = [again[strategy][t], read_split(tmp_path / "s.zarr", strategy, t),
                      read_split(tmp_path / "w.zarr", strategy, t)]
            if strategy == "improved":
                copies.append(alone[strategy][t])
            for copy in copies:
                assert list(copy) == list(sets)
                assert all(np.array_equal(copy[role], sets[role]) for role in sets)
            assert not np.array_equal(sets["test_queries"], other_seed[strategy][t]["test_queries"])
        tests = [sets["test_queries"] for sets in per_run]
        assert all(not np.array_equal(tests[i], tests[j]) for i in range(runs) for j in range(i))


@pytest.mark.parametrize("kind", ["class", "multilabel", "none"])
def test_store_format(tmp_path, capsys, kind):
    out = tmp_path / "splits.zarr"
    if kind == "none":
        source = ["--n-items", N]
    else:
        np.save(tmp_path / "labels.npy", _labels(kind))
        source = ["--labels", tmp_path / "labels.npy"]
    sizes = [f"--{role.replace('_', '-')}={size}" for role, size in SIZES.items()]
    assert main([str(a) for a in ["split", *source, "--runs", 2, "--seed", 3, *sizes, "--training", 150,
                                  "--out", out]]) == 0
    printed = capsys.readouterr().out
    assert f"N = {N}" in printed and "2 runs, seed 3" in printed and "training 150" in printed
    unused = N - sum(SIZES.values()) - 150
    assert f"({unused} items unused)" in printed
    group = zarr.open_group(str(out), mode="r")
    standard = {"test_queries": 37, "database": N - 37, "validation_queries": 23, "validation_database": 61,
                "training": 150}
    attrs = dict(group.attrs)
    # the classes the sets are balanced over (first labels for multi-hot), to refuse other labels at ingest
    assert (attrs.pop("groups_sha256", None) is None) == (kind == "none")
    assert attrs == {
        "format": "hashdist-splits", "format_version": 1, "n_items": N, "label_kind": kind, "seed": 3, "runs": 2,
        "strategies": {"standard": {"sizes": standard, "roles": list(ROLES["standard"]), "unused": 0},
                       "improved": {"sizes": {**SIZES, "training": 150}, "roles": list(ROLES["improved"]),
                                    "unused": unused}}}
    arrays = {path: arr for path, arr in group.members(max_depth=None) if isinstance(arr, zarr.Array)}
    assert set(arrays) == {f"splits/{s}/{t}/{role}" for s in ROLES for t in ("0", "1") for role in ROLES[s]}
    for path, arr in arrays.items():
        values = arr[:]
        assert arr.dtype == np.int64 and arr.ndim == 1 and (np.diff(values) > 0).all(), path
        assert [type(c).__name__ for c in arr.compressors] == ["ZstdCodec", "Crc32cCodec"]
    assert not list(tmp_path.glob(".splits.zarr.tmp-*"))


@pytest.fixture
def store(tmp_path):
    out = tmp_path / "s.zarr"
    split(out, n_items=300, runs=3, sizes={"test_queries": 20, "test_database": 50, "validation_queries": 10,
                                           "validation_database": 30})
    return out


def test_read_split_errors(tmp_path, store):
    assert list(read_split(store, "standard", 2)) == list(ROLES["standard"])
    for strategy, run, needle in [("nope", 0, "unknown strategy 'nope' (the store has standard, improved)"),
                                  ("standard", 3, "run index 3 is out of range 0..2"),
                                  ("improved", -1, "run index -1 is out of range"),
                                  ("improved", "1", "run index '1' is out of range")]:
        with pytest.raises(InputError, match=needle.replace("(", r"\(").replace(")", r"\)")):
            read_split(store, strategy, run)
    only = tmp_path / "only.zarr"
    split(only, n_items=300, strategies=["improved"], runs=1,
          sizes={"test_queries": 20, "test_database": 50, "validation_queries": 10, "validation_database": 30})
    with pytest.raises(InputError, match="unknown strategy 'standard'"):
        read_split(only, "standard", 0)
    with pytest.raises(InputError, match="no such splits store"):
        read_split(tmp_path / "missing.zarr", "standard", 0)
    (tmp_path / "plain").mkdir()
    with pytest.raises(InputError, match="not a"):
        read_split(tmp_path / "plain", "standard", 0)
    shutil.rmtree(store / "splits" / "standard" / "1" / "training")
    with pytest.raises(InputError, match="splits/standard/1/training is missing"):
        read_split(store, "standard", 1)
    (store / "splits" / "improved" / "0" / "test_queries" / "c" / "0").unlink()  # zarr would read zeros
    with pytest.raises(InputError, match="splits/improved/0/test_queries chunk 0 is missing"):
        read_split(store, "improved", 0)
    zarr.open_group(str(store), mode="r+").attrs["format_version"] = 99
    with pytest.raises(InputError, match="format version 99 is not supported"):
        read_split(store, "standard", 0)
    zarr.open_group(str(store), mode="r+").attrs["format"] = "hashdist-dataset"
    with pytest.raises(InputError, match="not a hashdist splits store"):
        read_split(store, "standard", 0)


def _refused(capsys, args, needle, out):
    status = main([str(a) for a in args])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0], lines[0]
    assert not out.exists() and not list(out.parent.glob(f".{out.name}.tmp-*"))


def _bad_labels(tmp_path, name, array):
    np.save(tmp_path / name, array)
    return ["--labels", tmp_path / name]


@pytest.mark.parametrize(
    "make, extra, needle",
    [
        (lambda p: ["--n-items", 3000], [], "--validation-database 5000: the standard split needs 7000 items"),
        (lambda p: ["--n-items", 100], ["--test-queries", 50, "--validation-queries", 20, "--validation-database",
                                        30, "--strategy", "standard"], "leaves none for training"),
        (lambda p: ["--n-items", 100], ["--test-queries", 10, "--test-database", 50, "--validation-queries", 10,
                                        "--validation-database", 10, "--training", 21],
         "--validation-database 10 + --training 21) but there are N = 100"),
        (lambda p: ["--n-items", 100], ["--strategy", "standard", "nope"], "--strategy nope: unknown strategy"),
        (lambda p: ["--n-items", 100], ["--runs", 0], "--runs must be a positive integer"),
        (lambda p: ["--n-items", 100], ["--seed", -1], "--seed must be a non-negative integer"),
        (lambda p: ["--n-items", 100], ["--test-queries", 0], "--test-queries must be a positive integer"),
        (lambda p: ["--n-items", 100], ["--validation-queries", -1], "--validation-queries must be a non-negative"),
        (lambda p: ["--n-items", 100], ["--strategy", "standard", "--test-database", 5], "only to the improved"),
        (lambda p: ["--n-items", 0], [], "--n-items must be an integer in 1..1073741824"),
        (lambda p: ["--n-items", 60000], ["--protocol", "cifar10", "--strategy", "standard"], "does not go with"),
        (lambda p: ["--n-items", 100, "--labels", p / "x.npy"], [], "not allowed with"),
        (lambda p: [], [], "one of the arguments --labels --n-items is required"),
        (lambda p: ["--labels", p / "missing.npy"], [], "no such file"),
        (lambda p: _bad_labels(p, "3d.npy", np.zeros((4, 2, 2), np.uint8)), [], "must be 1-D (classes) or 2-D"),
        (lambda p: _bad_labels(p, "float.npy", np.zeros(10)), [], "class labels must be integers"),
        (lambda p: _bad_labels(p, "two.npy", np.full((10, 3), 2, np.uint8)), [], "only 0 and 1"),
        (lambda p: _bad_labels(p, "empty.npy", np.zeros(0, np.int64)), [], "labels are empty"),
    ],
)
def test_cli_bad_input(tmp_path, capsys, make, extra, needle):
    out = tmp_path / "splits.zarr"
    _refused(capsys, ["split", *make(tmp_path), *extra, "--out", out], needle, out)


def test_cli_refuses_pickled_labels(tmp_path, capsys):
    (tmp_path / "evil.npy").write_bytes(pickle.dumps({"x": 1}))
    obj = np.empty(10, dtype=object)
    np.save(tmp_path / "obj.npy", obj, allow_pickle=True)
    out = tmp_path / "splits.zarr"
    _refused(capsys, ["split", "--labels", tmp_path / "evil.npy", "--out", out], "evil.npy", out)
    _refused(capsys, ["split", "--labels", tmp_path / "obj.npy", "--out", out], "pickle", out)


def test_existing_output_overwrite_and_lock(tmp_path, capsys):
    out = tmp_path / "splits.zarr"
    args = ["split", "--n-items", 200, "--test-queries", 20, "--test-database", 30, "--validation-queries", 10,
            "--validation-database", 20, "--runs", 2, "--out", out]
    assert main([str(a) for a in args]) == 0
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    status = main([str(a) for a in args])
    assert status == 2 and "output exists (pass --overwrite" in capsys.readouterr().err
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert main([str(a) for a in [*args, "--overwrite", "--seed", 5]]) == 0
    assert zarr.open_group(str(out), mode="r").attrs["seed"] == 5
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    assert main([str(a) for a in [*args[:-1], foreign, "--overwrite"]]) == 2
    assert "not a hashdist splits store; refusing to replace it" in capsys.readouterr().err
    assert (foreign / "precious.txt").read_text() == "keep me" and [p.name for p in foreign.iterdir()] == [
        "precious.txt"]
    other = tmp_path / "other.zarr"
    with lock_held_elsewhere(other):
        _refused(capsys, [*args[:-1], other], "another hashdist run is writing this output", other)


def test_protocol_takes_strategy_and_sizes(tmp_path, capsys):
    labels = np.repeat(np.arange(10), 6000)
    np.save(tmp_path / "labels.npy", labels)
    out = tmp_path / "cifar.zarr"
    assert main(["split", "--labels", str(tmp_path / "labels.npy"), "--protocol", "cifar10", "--runs", "2",
                 "--out", str(out)]) == 0
    assert "improved: test_queries 1000, test_database 54000" in capsys.readouterr().out
    attrs = zarr.open_group(str(out), mode="r").attrs
    assert list(attrs["strategies"]) == ["improved"]
    assert attrs["strategies"]["improved"]["sizes"] == {"test_queries": 1000, "test_database": 54000,
                                                       "validation_queries": 0, "validation_database": 0,
                                                       "training": 5000}
    sets = read_split(out, "improved", 1)
    assert np.bincount(labels[sets["test_queries"]]).tolist() == [100] * 10
    assert np.bincount(labels[sets["training"]]).tolist() == [500] * 10


def test_a_fixed_split_of_your_own_is_ingested_as_given(tmp_path):
    """write_splits stores given index lists (validation roles left out: empty); ingest --splits takes exactly
    those rows; malformed splits are refused by name."""
    rng = np.random.default_rng(5)
    codes, labels = rng.integers(0, 2, (N, 16)), _labels("class")
    np.save(tmp_path / "codes.npy", codes)
    np.save(tmp_path / "labels.npy", labels)
    order = rng.permutation(N)
    queries, database = order[:40], order[40:500]
    write_splits(tmp_path / "s.zarr", {"standard": [{"test_queries": queries, "database": database,
                                                     "training": order[500:]}]}, n_items=N)
    assert read_split(tmp_path / "s.zarr", "standard", 0)["validation_queries"].size == 0
    assert main(["ingest", "--codes", str(tmp_path / "codes.npy"), "--labels", str(tmp_path / "labels.npy"),
                 "--splits", str(tmp_path / "s.zarr"), "--strategy", "standard", "--run", "0",
                 "--out", str(tmp_path / "run.zarr")]) == 0
    group = zarr.open_group(str(tmp_path / "run.zarr"), mode="r")
    assert np.array_equal(group["queries/labels"][:], labels[np.sort(queries)])
    assert np.array_equal(group["database/labels"][:], labels[np.sort(database)])
    for bad in ([{"test_queries": queries}], {"test_queries": queries}, "standard"):
        with pytest.raises(InputError, match="^splits: "):
            write_splits(tmp_path / "bad.zarr", {"standard": bad} if bad != "standard" else bad, n_items=N)
    assert not (tmp_path / "bad.zarr").exists()
