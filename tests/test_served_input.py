"""Served lists in: every format gives the same report section for the same lists; faiss IndexBinaryFlat's lists are
exact; recomputed grades agree with the histogram kernels; bad input is refused in one line (spec section 5d)."""

import json

import numpy as np
import pytest

import hashdist
from hashdist.data.dataset import open_dataset
from tests.conftest import assert_refused, make_dataset

K = 10


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A 16-bit class dataset (600 items, 40 queries; heavy ties), its codes as bytes, and reference k-NN lists: a
    stable argsort of the exhaustive distances, with those distances."""
    directory = tmp_path_factory.mktemp("served")
    path = make_dataset(directory, n_db=600, n_q=40, nbits=16)
    ds = open_dataset(path)
    q, db = ds.codes("queries", 0, ds.n_queries), ds.codes("database", 0, ds.n_database)
    dist = np.bitwise_count(q[:, None, :] ^ db[None, :, :]).sum(axis=2)
    ids = np.argsort(dist, axis=1, kind="stable")[:, :K]
    return {"path": path, "dir": directory, "ids": ids, "D": np.take_along_axis(dist, ids, axis=1), "dist": dist,
            "q_bytes": q.view(np.uint8)[:, :2].copy(), "db_bytes": db.view(np.uint8)[:, :2].copy()}


def _section(path, served, **options):
    report = hashdist.evaluate(path, k=(1, 5, K), served=served, cache=False, threads=2, **options)
    return report["served"]


def _same(a: dict, b: dict):
    for key in ("neighbours", "metrics", "cost"):
        assert json.dumps(a[key], sort_keys=True) == json.dumps(b[key], sort_keys=True), key


def test_every_format_gives_the_same_section(small, tmp_path):
    import h5py

    ids, D = small["ids"].copy(), small["D"].astype(np.float64)
    ids[3, 7:] = -1  # a shorter list: padding
    D[3, 7:] = np.inf
    np.savez(tmp_path / "run.npz", I=ids, D=np.where(ids >= 0, D, 2**31 - 1).astype(np.int32),
             time_per_query_s=np.float64(2e-5))
    np.save(tmp_path / "run.npy", ids)
    np.save(tmp_path / "one.npy", np.where(ids >= 0, ids + 1, -1))
    with h5py.File(tmp_path / "run.hdf5", "w") as f:
        f.create_dataset("neighbors", data=ids.astype(np.int32))
        f.create_dataset("distances", data=(D / 16).astype(np.float32))
        f.attrs["best_search_time"] = 3e-5
    with open(tmp_path / "run.bin", "wb") as f:
        np.array(ids.shape, dtype="<u4").tofile(f)
        ids.astype("<i4").tofile(f)
        np.where(ids >= 0, D, np.inf).astype("<f4").tofile(f)
    lines = [f"{q} Q0 {doc} {rank + 1} {-D[q, rank]:g} run" for q in range(len(ids))
             for rank, doc in enumerate(ids[q]) if doc >= 0]
    (tmp_path / "run.trec").write_text("\n".join(lines[::-1]) + "\n")  # any line order: ranks order each query
    served = {"npz": str(tmp_path / "run.npz"), "npy": str(tmp_path / "run.npy"),
              "one": f"{tmp_path / 'one.npy'}:1based", "hdf5": str(tmp_path / "run.hdf5"),
              "bin": str(tmp_path / "run.bin"), "trec": str(tmp_path / "run.trec"), "array": ids,
              "pair": (ids, np.where(ids >= 0, D, 2**31 - 1)), "dict": {"I": ids, "time_per_query_s": 1e-5}}
    sections = _section(small["path"], served)
    for name in served:
        _same(sections["npz"], sections[name])
    assert sections["npz"]["time_per_query_s"] == 2e-5 and sections["hdf5"]["time_per_query_s"] == 3e-5
    assert "time_per_query_s" not in sections["npy"]


def test_multi_index_hashing_output(small, tmp_path, capsys):
    """norouzi/mih's HDF5 layout (/refs/<name><i>.res, Q x K uint32, 1-based) with :1based gives the 0-based
    lists' section; without it the range check's hint names the suffix; a file of two result sets is refused."""
    import h5py

    ids = small["ids"].copy()
    ids[0, -1] = 599 if 599 not in ids[0] else ids[0, -1]  # the last item: 600 when 1-based
    with h5py.File(tmp_path / "mih.h5", "w") as f:
        f.create_group("refs").create_dataset("mih0.res", data=(ids + 1).astype(np.uint32))
    sections = _section(small["path"], {"mih": f"{tmp_path / 'mih.h5'}:1based", "ids": ids})
    _same(sections["ids"], sections["mih"])
    _bad(small, tmp_path, capsys, [f"mih={tmp_path / 'mih.h5'}"], "an id equals N = 600: 1-based ids? then give the "
         "path as NAME=PATH:1based")
    with h5py.File(tmp_path / "two.h5", "w") as f:
        for i in range(2):
            f.require_group("refs").create_dataset(f"mih{i}.res", data=(small["ids"] + 1).astype(np.uint32))
    _bad(small, tmp_path, capsys, [f"two={tmp_path / 'two.h5'}:1based"], "a multi-index hashing file of 2 result "
         "sets (/refs/mih0.res, /refs/mih1.res)")


def test_faiss_flat_lists_are_exact(small):
    faiss = pytest.importorskip("faiss")
    index = faiss.IndexBinaryFlat(16)
    index.add(small["db_bytes"])
    distances, ids = index.search(small["q_bytes"], K)
    section = _section(small["path"], {"flat": (ids, distances), "reference": small["ids"]})
    for name in ("flat", "reference"):
        neighbours = section[name]["neighbours"]
        for k in ("1", "5", str(K)):
            recall = neighbours["recall_at_k"][k]
            assert recall["best"] == 1 and neighbours["exact_at_k"][k] == 1 and neighbours["lenient_at_k"][k] == 1
            assert recall["worst"] <= recall["expected"] <= 1


def test_faiss_range_search(small):
    faiss = pytest.importorskip("faiss")
    index = faiss.IndexBinaryFlat(16)
    index.add(small["db_bytes"])
    lims, distances, ids = index.range_search(small["q_bytes"], 4)  # d < 4: the inclusive radius 3
    section = _section(small["path"], {"ball": {"lims": lims, "I": ids, "D": distances, "radius": 3},
                                       "candidates": {"lims": lims, "I": ids, "radius": 2}})
    ball = section["ball"]["range"]
    empty = int(((small["dist"] <= 3).sum(axis=1) == 0).sum())
    assert ball["recall"] == 1 and ball["micro"] == {"recall": 1.0, "precision": 1.0}
    assert ball["queries_with_empty_ball"] == empty and ball["queries_served_nothing"] == empty
    candidates = section["candidates"]["range"]  # without D: a candidate set, items beyond r lower its precision
    within = (small["dist"] <= 2).sum()
    assert candidates["micro"]["precision"] == pytest.approx(within / len(ids))
    with pytest.raises(hashdist.InputError, match=r"beyond the radius r = 2 in \d+ entr.*r = radius - 1"):
        _section(small["path"], {"ball": {"lims": lims, "I": ids, "D": distances, "radius": 2}})


@pytest.mark.parametrize("relevance", ["class", "multilabel"])
def test_serving_every_item_by_distance_gives_the_exhaustive_measures(tmp_path, relevance):
    """At K = Nall the served histogram is H: the grades recomputed per pair agree with the histogram kernels."""
    path = make_dataset(tmp_path, n_db=300, n_q=20, nbits=12 if relevance == "class" else 65,
                        kind=relevance, seed=3)
    ds = open_dataset(path)
    q, db = ds.codes("queries", 0, ds.n_queries), ds.codes("database", 0, ds.n_database)
    ids = np.argsort(np.bitwise_count(q[:, None, :] ^ db[None]).sum(axis=2), axis=1, kind="stable")
    report = hashdist.evaluate(path, k=(300,), served={"all": ids}, cache=False, threads=2)
    served = report["served"]["all"]["metrics"]
    for key, value in served.items():
        assert json.dumps(value, sort_keys=True) == json.dumps(report["metrics"][key], sort_keys=True), key


def test_evaluate_codes_takes_arrays(small):
    rng = np.random.default_rng(0)
    q = rng.integers(0, 2, (12, 8))
    db = rng.integers(0, 2, (50, 8))
    ql, dbl = rng.integers(0, 3, 12), rng.integers(0, 3, 50)
    ids = np.argsort(np.abs(q[:, None, :] - db[None]).sum(axis=2), axis=1, kind="stable")[:, :5]
    report = hashdist.evaluate_codes(q, db, ql, dbl, k=(5,), served={"ivf": ids[:, ::-1].copy()})
    assert report["served"]["ivf"]["neighbours"]["exact_at_k"]["5"] == 1
    as_served = hashdist.evaluate_codes(q, db, ql, dbl, k=(5,), served={"ivf": ids[:, ::-1].copy()},
                                        served_order="as-served")["served"]["ivf"]["metrics"]["map_at_k"]["5"]
    assert as_served["retrieved"]["best"] == as_served["retrieved"]["worst"]


# -- bad input --------------------------------------------------------------------------------------------------


def _bad(small, tmp_path, capsys, served, needle, *extra):
    out = tmp_path / "out"
    argv = ["evaluate", small["path"], "--out", out, "--engine", "local", "--k", "5", *extra]
    for item in served:
        argv += ["--served", item]
    return assert_refused(capsys, argv, needle, out)


def _file(tmp_path, name, **arrays):
    path = tmp_path / name
    if name.endswith(".npy"):
        np.save(path, arrays["I"])
    else:
        np.savez(path, **arrays)
    return f"{name.split('.')[0]}={path}"


def test_ids_out_of_range_and_the_one_based_hint(small, tmp_path, capsys):
    ids = small["ids"].copy()
    ids[0, -1] = 599 if 599 not in ids[0] else ids[0, -1]
    line = _bad(small, tmp_path, capsys, [_file(tmp_path, "one.npy", I=ids + 1)], "out of range 0..599")
    assert line.startswith("hashdist evaluate: error: --served one (")
    assert "first at query 0 position 9 (id 600)" in line
    assert "an id equals N = 600: 1-based ids? then give the path as NAME=PATH:1based" in line
    ids = small["ids"].copy()
    ids[5, 2], ids[9, 0] = 1000, -7
    line = _bad(small, tmp_path, capsys, [_file(tmp_path, "far.npz", I=ids)],
                "ids out of range 0..599 (-1: padding) in 2 entries")
    assert "first at query 5 position 2 (id 1000)" in line


def test_duplicates_padding_rows_and_width(small, tmp_path, capsys):
    ids = small["ids"].copy()
    ids[4, 6] = ids[4, 1]
    line = _bad(small, tmp_path, capsys, [_file(tmp_path, "dup.npz", I=ids)],
                "an id served twice to one query (a list holds each item once) in 1 entry")
    assert "first at query 4 position 6" in line
    ids = small["ids"].copy()
    ids[2, 3] = -1
    _bad(small, tmp_path, capsys, [_file(tmp_path, "gap.npz", I=ids)], "-1 padding before a valid id (padding is a "
         "trailing run only) in 1 entry, first at query 2 position 3")
    _bad(small, tmp_path, capsys, [_file(tmp_path, "rows.npz", I=small["ids"][:-1])], "39 rows of served lists, "
         "but the dataset has 40 queries")
    _bad(small, tmp_path, capsys, [_file(tmp_path, "wide.npz", I=small["ids"])], "--k 20 is wider than its lists "
         "(K = 10)", "--k", "20")


def test_distances_that_disagree(small, tmp_path, capsys):
    D = small["D"].copy()
    D[7, 4] += 1
    D[8, 0] += 2
    line = _bad(small, tmp_path, capsys, [_file(tmp_path, "d.npz", I=small["ids"], D=D)],
                "a served distance that disagrees with the codes in 2 entries, first at query 7 position 4")
    assert f"served {D[7, 4]}, recomputed {D[7, 4] - 1}" in line and "normalised" in line and "1-based" in line


def test_unreadable_unknown_radius_and_names(small, tmp_path, capsys):
    (tmp_path / "x.txt").write_text("not a run\n")
    _bad(small, tmp_path, capsys, [f"x={tmp_path / 'x.txt'}"], "unknown format")
    _bad(small, tmp_path, capsys, [f"x={tmp_path / 'missing.npz'}"], "no such file")
    (tmp_path / "broken.npz").write_bytes(b"PK\x03\x04garbage")
    _bad(small, tmp_path, capsys, [f"x={tmp_path / 'broken.npz'}"], "unreadable")
    lims = np.arange(41)
    _bad(small, tmp_path, capsys, [_file(tmp_path, "r.npz", lims=lims, I=np.arange(40))],
         "without 'radius'; store the inclusive Hamming radius r (faiss's range_search(x, radius) keeps d < radius")
    _bad(small, tmp_path, capsys, ["noequals"], "expected NAME=PATH")
    _bad(small, tmp_path, capsys, [f"a={tmp_path / 'x.txt'}", f"a={tmp_path / 'x.txt'}"], "given twice")


def test_a_dataset_with_modalities_needs_the_task(tmp_path, capsys):
    rng = np.random.default_rng(1)
    codes = {m: rng.integers(0, 2, (60, 8)) for m in ("image", "text")}
    queries = {m: rng.integers(0, 2, (6, 8)) for m in ("image", "text")}
    ids = np.tile(np.arange(5), (6, 1))
    with pytest.raises(hashdist.InputError, match=r"has modalities; name the task .*'image->text:ivf=PATH'"):
        hashdist.evaluate_codes(queries, codes, rng.integers(0, 2, 6), rng.integers(0, 2, 60), k=(5,),
                                served={"ivf": ids})
    report = hashdist.evaluate_codes(queries, codes, rng.integers(0, 2, 6), rng.integers(0, 2, 60), k=(5,),
                                     served={"image->text:ivf": ids})
    assert "ivf" in report["tasks"]["image->text"]["served"] and "served" not in report["tasks"]["text->image"]


def test_explicit_graded_relevance_recomputed_per_pair():
    """Explicit ground truth with grades: at K = Nall the served measures are the exhaustive ones."""
    rng = np.random.default_rng(5)
    q, db = rng.integers(0, 2, (15, 10)), rng.integers(0, 2, (120, 10))
    lists = [np.sort(rng.choice(120, int(rng.integers(0, 12)), replace=False)) for _ in range(15)]
    indptr = np.concatenate([[0], np.cumsum([len(x) for x in lists])])
    grades = rng.integers(1, 4, indptr[-1])
    ids = np.argsort((q[:, None, :] != db[None]).sum(axis=2), axis=1, kind="stable")
    report = hashdist.evaluate_codes(q, db, relevant=(indptr, np.concatenate(lists), grades), k=(120,),
                                     served={"all": ids})
    for key, value in report["served"]["all"]["metrics"].items():
        assert json.dumps(value, sort_keys=True) == json.dumps(report["metrics"][key], sort_keys=True), key
