"""Served runs through both engines and into the outputs: bit-identical sections whatever the engine, block sizes
and thread count; a cached rerun takes the exhaustive blocks from the cache; the terminal table, report.json,
per_query.zarr and report.html hold them."""

import json

import numpy as np
import pytest

from hashdist.api import evaluate_local
from hashdist.cli import main
from hashdist.data.dataset import open_dataset
from hashdist.errors import InputError


@pytest.fixture(scope="module")
def served_files(class_dataset, tmp_path_factory):
    """Two k-NN runs (a stable argsort's top 20; a degraded one: every third list shifted by a few ranks) and a
    radius lookup of the class dataset (70 queries x 3000 items, 12 bits)."""
    directory = tmp_path_factory.mktemp("runs")
    ds = open_dataset(class_dataset)
    q, db = ds.codes("queries", 0, ds.n_queries), ds.codes("database", 0, ds.n_database)
    dist = np.bitwise_count(q[:, None, :] ^ db[None]).sum(axis=2)
    ranked = np.argsort(dist, axis=1, kind="stable")
    exact, rough = ranked[:, :20], ranked[:, :20].copy()
    rough[::3] = ranked[::3, 5:25]
    np.savez(directory / "exact.npz", I=exact, D=np.take_along_axis(dist, exact, axis=1),
             time_per_query_s=np.float64(4e-4))
    np.savez(directory / "rough.npz", I=rough, time_per_query_s=np.float64(1e-4))
    lims = np.concatenate([[0], np.cumsum((dist <= 2).sum(axis=1))])
    np.savez(directory / "ball.npz", lims=lims, I=np.concatenate([np.flatnonzero(row <= 2) for row in dist]),
             radius=np.int64(2))
    return {name: str(directory / f"{name}.npz") for name in ("exact", "rough", "ball")}


def _served(evaluation):
    return json.dumps(evaluation.report["served"], sort_keys=True)


def test_both_engines_give_the_same_sections(class_dataset, served_files, tmp_path, prefect_api):
    from flows.evaluate import run_evaluation

    options = dict(k=(5, 20), served=served_files, conventions=("trec", "hashnet"))
    local = evaluate_local(class_dataset, cache=False, threads=1, **options)
    assert set(local.report["served"]) == {"exact", "rough", "ball"}
    for threads, rows in ((3, {}), (2, {"query_block_rows": 16, "db_block_rows": 500})):
        assert _served(evaluate_local(class_dataset, cache=False, threads=threads, **options, **rows)) == \
            _served(local)
    flow = run_evaluation(class_dataset, cache=tmp_path / "cache", query_block_rows=16, db_block_rows=500,
                          threads=2, **options)
    assert _served(flow) == _served(local)
    rerun = run_evaluation(class_dataset, cache=tmp_path / "cache", query_block_rows=16, db_block_rows=500,
                           threads=2, **options)
    assert rerun.report["blocks"]["computed"] == 0 and _served(rerun) == _served(local)
    exact = local.report["served"]["exact"]
    assert exact["neighbours"]["exact_at_k"]["20"] == 1 and exact["time_per_query_s"] == 4e-4
    assert set(exact["conventions"]) == {"trec", "hashnet"}
    rough = local.report["served"]["rough"]["neighbours"]["recall_at_k"]["20"]
    assert rough["worst"] <= rough["expected"] <= rough["best"] < 1
    assert local.report["served"]["ball"]["range"]["recall"] == 1


def test_the_outputs_show_the_served_runs(class_dataset, served_files, tmp_path, capsys):
    import zarr

    out = tmp_path / "report"
    argv = ["evaluate", class_dataset, "--out", str(out), "--engine", "local", "--no-cache", "--quiet", "--k", "10"]
    for name, path in served_files.items():
        argv += ["--served", f"{name}={path}"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "Served lists against the exhaustive ranking" in printed and "Served radius lookups" in printed
    row = next(line for line in printed.splitlines() if line.startswith("rough "))
    report = json.loads((out / "report.json").read_text())
    recall = report["served"]["rough"]["neighbours"]["recall_at_k"]["10"]
    assert f"{recall['expected']:.4f} [{recall['worst']:.4f}, {recall['best']:.4f}]" in row and "0.1 ms" in row
    assert report["parameters"]["served"] == served_files and report["parameters"]["served_order"] == "distance"
    stored = zarr.open_group(str(out / "per_query.zarr"), mode="r")
    names = set(stored.array_keys())
    assert {"served.rough.neighbours.recall_at_k.10.expected", "served.rough.ap_at_k.10.retrieved.expected",
            "served.ball.range.in_ball"} <= names
    assert not any(n.startswith("served.rough.precision_at_k") for n in names)
    per_query = np.asarray(stored["served.rough.neighbours.recall_at_k.10.expected"])
    assert per_query.mean() == pytest.approx(recall["expected"], abs=1e-12)
    page = (out / "report.html").read_text()
    assert "Served lists against the exhaustive ranking" in page and "neighbour recall@K at the largest K" in page


@pytest.mark.parametrize("relevance", ["class", "multilabel"])
def test_recomputed_entries_are_brute_force_pairs_in_every_chunk(tmp_path, relevance):
    """A metric item's rows recompute each entry's distance and grade (the database read chunk by chunk, entries
    grouped by chunk) exactly as a brute-force loop over the pairs does; padding stays -1 / 0; a radius lookup's
    in-ball counts likewise."""
    from hashdist.options import EvaluateOptions
    from hashdist.served.engine import recompute, served_entries
    from tests.conftest import make_dataset

    path = make_dataset(tmp_path, n_db=400, n_q=30, nbits=12 if relevance == "class" else 65, kind=relevance,
                        seed=7, chunk_rows=37)
    rng = np.random.default_rng(11)
    ids = np.stack([rng.permutation(400)[:25] for _ in range(30)])
    ids[rng.random(30) < 0.3, 20:] = -1
    run = EvaluateOptions(k=(5,), max_grade=2, served={"r": ids}).resolve(path)
    ds, plan, served = run.ds, run.plan, run.served[0]
    q, db = ds.codes("queries", 0, 30), ds.codes("database", 0, 400)
    ql, dbl = ds.labels("queries", 0, 30), ds.labels("database", 0, 400)
    part = served.rows(9, 23)
    distance, grade = recompute(ds, plan, part.lists)
    for e, item in enumerate(part.lists.ids.reshape(-1)):
        query = 9 + e // 25
        if item < 0:
            assert (distance[e], grade[e]) == (-1, 0)
            continue
        assert distance[e] == sum(bin(int(a) ^ int(b)).count("1") for a, b in zip(q[query], db[item], strict=True))
        expected = int(ql[query] == dbl[item]) if relevance == "class" else min(  # counted up to cap + 1
            3, sum(bin(int(a) & int(b)).count("1") for a, b in zip(ql[query], dbl[item], strict=True)))
        assert grade[e] == expected
    lims = np.concatenate([[0], np.cumsum(rng.integers(0, 9, 30))])
    ball = np.concatenate([rng.permutation(400)[: lims[i + 1] - lims[i]] for i in range(30)])
    run = EvaluateOptions(k=(5,), served={"b": {"lims": lims, "I": ball, "radius": 4}}).resolve(path)
    entries, flagged = served_entries(ds, plan, run.served[0].rows(3, 30))
    for i, query in enumerate(range(3, 30)):
        within = [x for x in ball[lims[query] : lims[query + 1]]
                  if np.bitwise_count(q[query] ^ db[x]).sum() <= 4]
        assert entries.in_ball[i] == len(within) and entries.served[i] == lims[query + 1] - lims[query]
    assert flagged["count"].sum() == 0


@pytest.mark.parametrize(("engine", "sample"), [("local", 20), ("flow", 20), ("local", 4096)])
def test_disagreeing_distances_are_counted_over_every_item(class_dataset, served_files, tmp_path, engine, sample,
                                                           capsys, monkeypatch, prefect_api):
    """Metric items recompute their own rows; the error still counts the entries of every item and names the first
    query, whichever item finishes first; nothing is written. With the first queries' entries checked up front
    (``sample``: 20, query 0 alone, which agrees; 4,096: every query) the same line comes before any block."""
    from flows.evaluate import run_evaluation
    from hashdist.served import engine as served_engine
    from tests.conftest import assert_refused

    monkeypatch.setattr(served_engine, "SAMPLE_ENTRIES", sample)

    with np.load(served_files["exact"]) as z:
        ids, D = z["I"], z["D"].copy()
    D[50, 3] += 1
    D[17, 0] += 2
    D[17, 9] += 1
    D[5, 19] -= 1
    np.savez(tmp_path / "x.npz", I=ids, D=D)
    needle = (f"--served x ({tmp_path / 'x.npz'}): a served distance that disagrees with the codes in 4 entries, "
              f"first at query 5 position 19 (served {D[5, 19]}, recomputed {D[5, 19] + 1})")
    out = tmp_path / "out"
    if engine == "local":
        cache = tmp_path / "cache"
        assert_refused(capsys, ["evaluate", class_dataset, "--out", out, "--engine", "local", "--k", "5",
                                "--query-block-rows", "16", "--cache", cache, "--served", f"x={tmp_path / 'x.npz'}"],
                       needle, out)
        blocks = [p for p in cache.rglob("*") if p.is_file()] if cache.exists() else []
        assert bool(blocks) == (sample == 20)  # checked up front: no block ran
        return
    with pytest.raises(InputError) as caught:
        run_evaluation(class_dataset, cache=tmp_path / "cache", threads=2, out=str(out), k=(5,), query_block_rows=16,
                       served={"x": str(tmp_path / "x.npz")})
    assert needle in str(caught.value) and not out.exists()


def test_grouping_by_chunk_is_a_stable_sort_of_the_chunk_numbers():
    """The counting sort against numpy's stable argsort of id // chunk (padding last), int32 and int64 ids."""
    from hashdist.served.pairs import group_by_chunk

    rng = np.random.default_rng(4)
    for dtype in (np.int32, np.int64):
        ids = rng.integers(-1, 1000, 5000).astype(dtype)
        order, bounds = group_by_chunk(ids, 64, 16)
        key = np.where(ids >= 0, ids // 64, 16)
        assert np.array_equal(order, np.argsort(key, kind="stable"))
        assert np.array_equal(bounds, np.concatenate([[0], np.cumsum(np.bincount(key, minlength=17))]))


def test_a_flow_with_served_arrays_sends_them_once(class_dataset, prefect_api):
    """Arrays given from Python are not flow parameters (Prefect would send them to its API and with every
    histogram task: "arrays" is what travels), and a metric item's rows, which travel inside its task by design,
    raise no large-graph warning; anything else larger than Dask's threshold still would."""
    import warnings

    import dask

    from flows.evaluate import run_evaluation

    ids = np.stack([np.random.default_rng(i).permutation(3000)[:200] for i in range(70)])  # 56 KB as int32
    with dask.config.set({"distributed.admin.large-graph-warning-threshold": "40kB"}), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        evaluation = run_evaluation(class_dataset, cache=False, threads=2, k=(5,), served={"a": ids, "b": ids})
    assert [str(w.message) for w in caught if "large graph" in str(w.message)] == []
    assert evaluation.report["parameters"]["served"] == {"a": "arrays", "b": "arrays"}
    assert set(evaluation.report["served"]) == {"a", "b"}
