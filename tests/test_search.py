"""hashdist search (#48 point 4): faiss's lists against brute-force Hamming distances computed with numpy from the
codes as they were written (before hashdist packed them), the radius lookup's inclusive radius, the optional faiss
extra, and bad input."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, assert_refused, make_dataset

pytest.importorskip("faiss")

import hashdist  # noqa: E402
from hashdist.cli import main  # noqa: E402


def _reference(directory: Path) -> np.ndarray:
    """(Q, N) Hamming distances from the .npy codes make_dataset ingested ({-1,+1} database, {0,1} queries)."""
    db = np.load(directory / "db.npy") == 1
    q = np.load(directory / "q.npy") == 1
    return (q[:, None, :] != db[None, :, :]).sum(axis=2)


@pytest.fixture(scope="module", params=[12, 65], ids=["12bits", "65bits"])
def data(request, tmp_path_factory):
    """A dataset of 600 items in 6 chunks (the database is streamed) and 11 queries, with heavy ties, and its
    reference distances; 12 bits leave 4 unused bits in faiss's last byte, 65 bits take two words."""
    directory = tmp_path_factory.mktemp(f"search{request.param}")
    path = make_dataset(directory, n_db=600, n_q=11, nbits=request.param, chunk_rows=100, seed=request.param)
    return path, _reference(directory)


def _load(path) -> dict:
    with np.load(path, allow_pickle=False) as z:
        return {name: z[name] for name in z.files}


def _check_knn_rows(out: dict, reference: np.ndarray) -> None:
    """Every returned id is a distinct database item, its D is its true distance, and -1 padding only at the end."""
    for q, (ids, distances) in enumerate(zip(out["I"], out["D"], strict=True)):
        valid = ids >= 0
        n_valid = int(valid.sum())
        assert valid[:n_valid].all(), "padding before a valid id"
        assert len(set(ids[:n_valid].tolist())) == n_valid
        assert (reference[q, ids[:n_valid]] == distances[:n_valid]).all()


def test_flat_gives_the_exact_k_nearest(data, tmp_path):
    dataset, reference = data
    k = 40
    (path,) = hashdist.search(dataset, index="BFlat", k=k, out=tmp_path / "runs")
    assert Path(path) == tmp_path / "runs" / "BFlat.npz"
    out = _load(path)
    assert out["I"].dtype == np.int64 and out["D"].dtype == np.int32 and out["I"].shape == (len(reference), k)
    _check_knn_rows(out, reference)
    assert (out["I"] >= 0).all()
    # the k smallest distances, and the ids hold them: no strictly closer item was left out
    assert (out["D"] == np.sort(reference, axis=1)[:, :k]).all()
    kth = out["D"][:, -1]
    assert all((reference[q] < kth[q]).sum() <= k for q in range(len(reference)))
    assert out["time_per_query_s"].dtype == np.float64 and out["time_per_query_s"].shape == ()
    assert out["time_per_query_s"] > 0
    assert str(out["index"]) == "BFlat" and str(out["parameter"]) == "" and int(out["k"]) == k


def test_ivf_searching_every_list_equals_flat(data, tmp_path):
    dataset, reference = data
    k, nlist = 25, 8
    paths = hashdist.search(dataset, index=f"BIVF{nlist}", k=k, nprobe=[1, nlist], out=tmp_path / "ivf")
    assert [Path(p).name for p in paths] == [f"BIVF{nlist}-nprobe1.npz", f"BIVF{nlist}-nprobe{nlist}.npz"]
    exact = np.sort(reference, axis=1)[:, :k]
    one, every = (_load(p) for p in paths)
    assert (every["D"] == exact).all()
    _check_knn_rows(every, reference)
    _check_knn_rows(one, reference)
    # one list of eight: a subset of the database, so its j-th distance is never below the exhaustive j-th
    found = np.where(one["I"] >= 0, one["D"], np.iinfo(np.int32).max)
    assert (found >= exact).all()
    assert str(one["parameter"]) == "nprobe" and int(one["value"]) == 1 and int(every["value"]) == nlist
    assert int(one["train_rows"]) == len(reference[0])  # all 600 rows: fewer than 256 per list


def test_a_hash_index_pads_short_lists(data, tmp_path):
    dataset, reference = data
    (path,) = hashdist.search(dataset, index="BHash8", k=200, nflip=[0], out=tmp_path / "hash")
    out = _load(path)
    assert Path(path).name == "BHash8-nflip0.npz"
    _check_knn_rows(out, reference)
    assert (out["I"] == -1).any()  # a bucket of 8 bits holds fewer than 200 of 600 items
    assert (out["D"][out["I"] == -1] == np.iinfo(np.int32).max).all()  # faiss's padding, as documented


def test_hnsw_lists_at_each_ef_search(data, tmp_path):
    dataset, reference = data
    paths = hashdist.search(dataset, index="BHNSW8", k=10, ef_search=[10, 600], out=tmp_path / "hnsw")
    assert [Path(p).name for p in paths] == ["BHNSW8-efSearch10.npz", "BHNSW8-efSearch600.npz"]
    for path in paths:
        _check_knn_rows(_load(path), reference)
    assert str(_load(paths[1])["parameter"]) == "efSearch" and int(_load(paths[1])["value"]) == 600


@pytest.mark.parametrize("spec, nprobe", [("BFlat", None), ("BIVF4", 4), ("BHash2x6", None)])
def test_radius_lookup_is_inclusive(data, tmp_path, spec, nprobe):
    dataset, reference = data
    r = 3
    options = {"nprobe": [nprobe]} if nprobe else {}
    paths = hashdist.search(dataset, index=spec, radius=r, out=tmp_path / "ball", **options)
    out = _load(paths[0])
    assert Path(paths[0]).name.endswith(f"-r{r}.npz") and int(out["radius"]) == r
    assert out["lims"].dtype == np.int64 and out["lims"].shape == (len(reference) + 1,) and out["lims"][0] == 0
    assert out["D"].dtype == np.int32 and "k" not in out
    for q in range(len(reference)):
        ids = out["I"][out["lims"][q]:out["lims"][q + 1]]
        assert (reference[q, ids] == out["D"][out["lims"][q]:out["lims"][q + 1]]).all()
        assert (reference[q, ids] <= r).all() and len(set(ids.tolist())) == len(ids)
        if spec != "BHash2x6":  # exhaustive over the ball (a multi-hash lookup may miss items)
            assert sorted(ids.tolist()) == np.flatnonzero(reference[q] <= r).tolist()


def test_k_and_radius_together_through_the_command_line(data, tmp_path, capsys):
    dataset, reference = data
    out = tmp_path / "both"
    assert main(["search", dataset, "--index", "BIVF4", "--k", "5", "--radius", "1", "--nprobe", "2", "4",
                 "--out", str(out), "--json", "--quiet", "--threads", "1"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = ["BIVF4-nprobe2.npz", "BIVF4-nprobe2-r1.npz", "BIVF4-nprobe4.npz", "BIVF4-nprobe4-r1.npz"]
    assert [Path(r["path"]).name for r in rows] == names and sorted(p.name for p in out.glob("*.npz")) == sorted(names)
    assert int(_load(out / names[0])["threads"]) == 1
    assert rows[3]["served_per_query"] == pytest.approx((reference <= 1).sum(axis=1).mean())
    assert main(["search", dataset, "--index", "BFlat", "--k", "5", "--out", str(out), "--overwrite"]) == 0
    assert "BFlat.npz" in capsys.readouterr().out and [p.name for p in out.glob("*.npz")] == ["BFlat.npz"]


def test_a_task_of_a_dataset_with_modalities(tmp_path):
    from hashdist.data.bits import unpack_bits
    from hashdist.data.dataset import open_dataset
    from hashdist.data.synth import synth_dataset

    dataset = synth_dataset(tmp_path / "xm.zarr", n_database=300, n_queries=9, nbits=16, labels="class",
                            n_classes=3, text_noise=0.2, seed=3)
    assert_refused_api(dataset, "give the task searched with --task", index="BFlat", k=5)
    (path,) = hashdist.search(dataset, index="BFlat", k=300, task="image->text", out=tmp_path / "it")
    ds = open_dataset(dataset, "image->text")
    q = unpack_bits(ds.group["queries/codes/image"][:], 16).astype(bool)
    db = unpack_bits(ds.group["database/codes/text"][:], 16).astype(bool)
    reference = (q[:, None] != db[None]).sum(axis=2)
    out = _load(path)
    assert str(out["task"]) == "image->text"
    assert (np.take_along_axis(reference, out["I"], axis=1) == out["D"]).all()
    assert (out["D"] == np.sort(reference, axis=1)).all()


def assert_refused_api(dataset, needle, **keywords):
    with pytest.raises(hashdist.InputError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        hashdist.search(dataset, out="unused", **keywords)


BAD = [
    (["--index", "BNope7", "--k", "5"], "--index BNope7: faiss cannot make it (description BNope7 did not generate"),
    (["--index", "BFlat", "--k", "5", "--nprobe", "4"], "--nprobe: only for an IVF index (BIVF...); BFlat is a "
     "faiss IndexBinaryFlat and takes no search parameter"),
    (["--index", "BIVF4", "--k", "5", "--ef-search", "16"], "--ef-search: only for an HNSW index"),
    (["--index", "BIVF4", "--k", "5", "--nprobe", "8"], "--nprobe 8 exceeds the 4 inverted lists of BIVF4"),
    (["--index", "BIVF4", "--k", "5", "--nprobe", "1", "--ef-search", "16"], "--nprobe and --ef-search:"),
    (["--index", "BIVF4", "--k", "5", "--nprobe", "0"], "--nprobe must be a positive integer, got 0"),
    (["--index", "BIVF4", "--k", "5", "--nprobe", "2", "2"], "--nprobe: 2 is given twice"),
    (["--index", "BFlat", "--k", "0"], "--k must be a positive integer, got 0"),
    (["--index", "BFlat", "--k", "601"], "--k 601 exceeds the database's 600 items"),
    (["--index", "BFlat"], "give --k K (k nearest neighbours) or --radius r"),
    (["--index", "BFlat", "--radius", "-1"], "--radius must be a non-negative integer, got -1"),
    (["--index", "BFlat", "--radius", "99"], "--radius 99 exceeds the codes'"),
    (["--index", "BHNSW8", "--radius", "1"], "--radius: BHNSW8 is an HNSW index, which has no range search"),
    (["--index", "BFlat", "--k", "5", "--train-rows", "10"], "--train-rows: BFlat needs no training"),
    (["--index", "BIVF4", "--k", "5", "--train-rows", "2"], "4 inverted lists need at least 4 training rows"),
    (["--index", "BIVF1024", "--k", "5"], "1024 inverted lists need at least 1024 training rows, the database has"),
    (["--index", "BFlat", "--k", "5", "--task", "image->text"], "has no modalities"),
    (["--index", "BIVF0", "--k", "5"], "--index BIVF0: an IVF index needs at least one inverted list"),
    (["--index", "BHash99", "--k", "5"], "--index BHash99: hashes 99 bits, more than the codes'"),
    (["--index", "BHash4", "--k", "5", "--nflip", "5"], "--nflip 5 exceeds the 4 bits hashed by BHash4"),
    (["--index", "BFlat", "--k", "5", "--nprobee", "4"], "(did you mean --nprobe?)"),
]


@pytest.mark.parametrize("argv, needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line(data, tmp_path, capsys, argv, needle):
    dataset, _ = data
    out = tmp_path / "runs"
    assert_refused(capsys, ["search", dataset, *argv, "--out", out], needle, not_created=out)


def test_an_existing_output_needs_overwrite(data, tmp_path, capsys):
    dataset, _ = data
    out = tmp_path / "runs"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    for extra in ([], ["--overwrite"]):  # a directory search did not write is never replaced
        assert_refused(capsys, ["search", dataset, "--index", "BFlat", "--k", "3", "--out", out, *extra],
                       f"--out {out}: exists and is not a hashdist search output")
    assert (out / "keep.txt").read_text() == "mine"
    written = tmp_path / "written"
    assert main(["search", dataset, "--index", "BFlat", "--k", "3", "--out", str(written)]) == 0
    assert_refused(capsys, ["search", dataset, "--index", "BFlat", "--k", "3", "--out", written],
                   f"{written}: output exists (pass --overwrite to replace it)")
    assert_refused(capsys, ["search", dataset, "--index", "BFlat", "--k", "3", "--out", dataset], "the input")


def test_a_misspelt_keyword_names_the_option(data, tmp_path):
    with pytest.raises(TypeError, match="did you mean 'nprobe'"):
        hashdist.search(data[0], index="BIVF4", k=3, nprobes=[1], out=tmp_path / "x")


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_without_faiss_the_command_names_the_extra(data, tmp_path):
    out = tmp_path / "runs"
    code = ("import sys; sys.modules['faiss'] = None\n"  # `import faiss` now fails as if it were not installed
            "from hashdist.cli import main\n"
            f"sys.exit(main(['search', {data[0]!r}, '--index', 'BFlat', '--k', '5', '--out', {str(out)!r}]))")
    done = _python(code)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0] == "hashdist search: error: hashdist search needs faiss, an optional extra: " \
        "pip install 'hashdist[faiss]'"
    assert not out.exists()


def test_importing_hashdist_never_loads_faiss():
    code = ("import sys, hashdist, hashdist.api, hashdist.cli.app, hashdist.served.search\n"
            "hashdist.search, hashdist.SearchOptions, hashdist.cli.app.build_parser()\n"
            "print('faiss' in sys.modules)")
    done = _python(code)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr


def test_a_prepared_search_runs_again_with_the_same_lists(data, tmp_path):
    """Each run builds its own index (nothing added twice), and the seeded training gives the same lists."""
    from hashdist.options import SearchOptions
    from hashdist.served.search import prepare, run_search

    run = prepare(data[0], SearchOptions(index="BIVF8", k=30, nprobe=2, train_rows=300, seed=5))
    first, second = (run_search(run, tmp_path / name)[0]["path"] for name in ("a", "b"))
    a, b = _load(first), _load(second)
    assert (a["I"] == b["I"]).all() and (a["D"] == b["D"]).all() and int(a["train_rows"]) == 300
