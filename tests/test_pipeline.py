"""The evaluation pipeline end to end: ingest -> dataset -> blocks -> report, local and as a Prefect flow."""

import json

import numpy as np
import pytest

from hashdist.api import evaluate_local
from hashdist.data.bits import unpack_bits
from hashdist.data.dataset import open_dataset
from hashdist.data.ingest import append, ingest
from hashdist.engine.blocks import MAX_BLOCK_ROWS, Block, block_rows, split_by_pairs
from hashdist.engine.compute import compute_histogram
from hashdist.engine.plan import make_plan
from hashdist.errors import InputError
from tests.conftest import write_inputs


def _metrics(evaluation):
    return json.dumps(evaluation.report["metrics"], sort_keys=True)


def test_ingest_round_trip_and_histogram_matches_brute_force(tmp_path):
    p = write_inputs(tmp_path, n_db=700, n_q=20, nbits=70)
    ingest(tmp_path / "d.zarr", p["db"], p["q"], db_labels=p["dbl"], query_labels=p["ql"], chunk_rows=128)
    ds = open_dataset(tmp_path / "d.zarr")
    db, q = np.load(p["db"]), np.load(p["q"])
    assert (unpack_bits(ds.codes("database", 0, ds.n_database), 70) == (db == 1)).all()
    assert (unpack_bits(ds.codes("queries", 0, ds.n_queries), 70) == q).all()
    plan = make_plan(ds, db_block_rows=256)
    assert len(plan.histogram_blocks) == 3  # 700 rows in blocks of 2 chunks of 128
    H = sum(compute_histogram(plan, b)["H"] for b in plan.histogram_blocks)
    dist = ((q[:, None, :] == 1) != (db[None, :, :] == 1)).sum(-1)
    rel = np.load(p["ql"])[:, None] == np.load(p["dbl"])[None, :]
    expected = np.zeros_like(H)
    np.add.at(expected, (np.arange(20)[:, None].repeat(700, 1), dist, rel.astype(int)), 1)
    assert (H == expected).all()


@pytest.mark.parametrize("parts", [1, 2, 3, 4, 7, 40])
def test_split_by_pairs_covers_every_block_once_in_balanced_runs(parts):
    rng = np.random.default_rng(parts)
    blocks = [Block(q, q + int(rng.integers(1, 9)), d, d + int(rng.integers(1, 50)), f"{q}-{d}")
              for q in range(0, 40, 8) for d in range(0, 300, 50)]
    runs = split_by_pairs(blocks, parts)
    assert [b for run in runs for b in run] == blocks and all(runs)
    assert len(runs) <= parts
    total, largest = sum(b.pairs for b in blocks), max(b.pairs for b in blocks)
    assert all(sum(b.pairs for b in run) <= total / parts + largest for run in runs)


def test_block_rows_are_whole_chunks_and_a_block_fits_int32_counts():
    assert block_rows(None, 1000, 4096, "--db-block-rows", 10**6) == 5000
    assert block_rows(1, 1000, 4096, "--db-block-rows", 10**6) == 1000
    assert block_rows(3 * 10**9, 1000, 4096, "--db-block-rows", 10**6) == 3 * 10**9  # the database is one block
    assert block_rows(MAX_BLOCK_ROWS, 1, 4096, "--db-block-rows", 3 * 10**9) == MAX_BLOCK_ROWS
    with pytest.raises(InputError, match="--db-block-rows 2147483648 makes blocks of 2147483648 rows: at most"):
        block_rows(MAX_BLOCK_ROWS + 1, 1, 4096, "--db-block-rows", 3 * 10**9)
    with pytest.raises(InputError, match="makes blocks of 2147484000 rows: at most 2147483647"):  # whole chunks
        block_rows(MAX_BLOCK_ROWS, 1000, 4096, "--db-block-rows", 3 * 10**9)
    with pytest.raises(InputError, match="--db-block-rows must be a positive integer, got 2.5"):
        block_rows(2.5, 1000, 4096, "--db-block-rows", 10**6)


def test_packed_ingest_equals_unpacked(tmp_path):
    p = write_inputs(tmp_path, n_db=300, n_q=10, nbits=13)
    packed_db = np.packbits(np.load(p["db"]) == 1, axis=1)
    packed_q = np.packbits(np.load(p["q"]) == 1, axis=1)
    np.save(tmp_path / "pdb.npy", packed_db)
    np.save(tmp_path / "pq.npy", packed_q)
    ingest(tmp_path / "a.zarr", p["db"], p["q"], db_labels=p["dbl"], query_labels=p["ql"])
    ingest(tmp_path / "b.zarr", tmp_path / "pdb.npy", tmp_path / "pq.npy", db_labels=p["dbl"], query_labels=p["ql"],
           packed=True, nbits=13)
    assert open_dataset(tmp_path / "a.zarr").fingerprint == open_dataset(tmp_path / "b.zarr").fingerprint


@pytest.mark.parametrize("blocks", [(16, 500), (32, 1000), (1024, 4096)])
def test_block_size_invariance(class_dataset, blocks):
    base = evaluate_local(class_dataset, cache=False, threads=1)
    other = evaluate_local(class_dataset, cache=False, threads=2, query_block_rows=blocks[0], db_block_rows=blocks[1])
    assert _metrics(base) == _metrics(other)


def test_multilabel_graded_evaluation_runs_and_is_block_invariant(multilabel_dataset):
    a = evaluate_local(multilabel_dataset, cache=False, query_block_rows=16, db_block_rows=500, max_grade=3)
    b = evaluate_local(multilabel_dataset, cache=False, query_block_rows=64, db_block_rows=3000, max_grade=3)
    assert _metrics(a) == _metrics(b)
    assert a.report["dataset"]["relevance"] == "multilabel"
    ndcg = a.report["metrics"]["ndcg_at_k"]["10"]
    assert ndcg["worst"] <= ndcg["expected"] <= ndcg["best"]


def test_rerun_computes_nothing_and_corrupt_cache_entries_are_recomputed(class_dataset, tmp_path):
    cache = tmp_path / "cache"
    first = evaluate_local(class_dataset, cache=cache, query_block_rows=16, db_block_rows=1000)
    assert first.report["blocks"]["computed"] == first.report["blocks"]["total"] > 1
    again = evaluate_local(class_dataset, cache=cache, query_block_rows=16, db_block_rows=1000)
    assert (again.report["blocks"]["computed"] == 0
            and again.report["blocks"]["cached"] == first.report["blocks"]["total"])
    assert _metrics(first) == _metrics(again)
    victim = sorted(cache.rglob("*.npz"))[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    third = evaluate_local(class_dataset, cache=cache, query_block_rows=16, db_block_rows=1000)
    assert _metrics(third) == _metrics(first)
    assert third.report["blocks"]["computed"] <= 1  # the corrupted entry (if it was a histogram) and nothing else


def test_append_computes_only_new_blocks_and_matches_fresh_ingest(tmp_path):
    p = write_inputs(tmp_path, n_db=3000, n_q=40)
    db, dbl = np.load(p["db"]), np.load(p["dbl"])
    np.save(tmp_path / "db_head.npy", db[:2000])
    np.save(tmp_path / "dbl_head.npy", dbl[:2000])
    np.save(tmp_path / "db_tail.npy", db[2000:])
    np.save(tmp_path / "dbl_tail.npy", dbl[2000:])
    grown = tmp_path / "grown.zarr"
    ingest(grown, tmp_path / "db_head.npy", p["q"], db_labels=tmp_path / "dbl_head.npy", query_labels=p["ql"],
           chunk_rows=500, query_chunk_rows=16)
    cache = tmp_path / "cache"
    opts = dict(cache=cache, query_block_rows=16, db_block_rows=500)
    evaluate_local(grown, **opts)
    append(grown, tmp_path / "db_tail.npy", tmp_path / "dbl_tail.npy")
    after = evaluate_local(grown, **opts)
    n_qblocks = 3  # 40 queries in blocks of 16
    assert after.report["blocks"]["computed"] == n_qblocks * 2  # the two new 500-row database blocks
    fresh = tmp_path / "fresh.zarr"
    ingest(fresh, p["db"], p["q"], db_labels=p["dbl"], query_labels=p["ql"], chunk_rows=500, query_chunk_rows=16)
    assert open_dataset(fresh).fingerprint == open_dataset(grown).fingerprint
    same = evaluate_local(fresh, **opts)
    assert same.report["blocks"]["computed"] == 0  # identical content, other path: all cached
    assert _metrics(same) == _metrics(after)


def test_explicit_ground_truth_equals_class_labels(tmp_path):
    p = write_inputs(tmp_path, n_db=800, n_q=30)
    dbl, ql = np.load(p["dbl"]), np.load(p["ql"])
    lists = [np.flatnonzero(dbl == c) for c in ql]
    indptr = np.r_[0, np.cumsum([len(x) for x in lists])]
    np.savez(tmp_path / "rel.npz", indptr=indptr, indices=np.concatenate(lists))
    ingest(tmp_path / "e.zarr", p["db"], p["q"], query_relevant=tmp_path / "rel.npz", chunk_rows=200,
           query_chunk_rows=16)
    ingest(tmp_path / "c.zarr", p["db"], p["q"], db_labels=p["dbl"], query_labels=p["ql"], chunk_rows=200,
           query_chunk_rows=16)
    e = evaluate_local(tmp_path / "e.zarr", cache=False, db_block_rows=200, query_block_rows=16)
    c = evaluate_local(tmp_path / "c.zarr", cache=False, db_block_rows=400, query_block_rows=32)
    assert e.report["dataset"]["relevance"] == "explicit"
    assert _metrics(e) == _metrics(c)


def test_report_outputs(class_dataset, tmp_path):
    ev = evaluate_local(class_dataset, cache=False)
    out = ev.write(tmp_path / "report")
    report = json.loads((out / "report.json").read_text())
    for key in ("metrics", "queries", "dataset", "parameters", "provenance", "blocks", "timing", "throughput"):
        assert key in report
    assert set(report["metrics"]["map"]) == {"expected", "best", "worst"}
    assert "retrieved" in report["metrics"]["map_at_k"]["10"]
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 7  # PR, radius, P@N, PR by rank, AP, mAP interval, code usage
    import zarr

    per_query = zarr.open_group(str(out / "per_query.zarr"), mode="r")
    assert per_query["ap.expected"].shape == (report["queries"]["total"],)


def test_hashtable_paradigm_and_code_usage_in_the_report(class_dataset):
    from hashdist.kernels.codeusage import bit_ones_block, bucket_sizes, code_usage
    from hashdist.kernels.hashtable import hashtable_counts
    from hashdist.metrics.radius import micro_scores

    ev = evaluate_local(class_dataset, cache=False, hashtable=["4x3", "6x2"], query_block_rows=16, db_block_rows=500)
    ds = open_dataset(class_dataset)
    qc, dc = ds.codes("queries", 0, ds.n_queries), ds.codes("database", 0, ds.n_database)
    ql, dl = ds.labels("queries", 0, ds.n_queries), ds.labels("database", 0, ds.n_database)
    R = (ql[:, None] == dl[None, :]).sum(axis=1)
    evaluated = R > 0
    for setting, (k, tables) in (("4x3", (4, 3)), ("6x2", (6, 2))):
        tp, retrieved = hashtable_counts(qc, dc, ds.nbits, k, tables, ql, dl, "class")
        expected = micro_scores(int(tp[evaluated].sum()), int((retrieved - tp)[evaluated].sum()),
                                int((R - tp)[evaluated].sum()), 1.0)
        assert ev.report["metrics"]["hashtable"][setting] == expected
    _, counts = np.unique(dc[:, 0], return_counts=True)
    usage = code_usage(bucket_sizes(counts), bit_ones_block(dc, ds.nbits), ds.n_database, ds.nbits)
    assert ev.report["code_usage"] == usage


def test_interrupted_append_leaves_the_previous_dataset(tmp_path, monkeypatch):
    import hashdist.data.dataset as dataset_module

    p = write_inputs(tmp_path, n_db=600, n_q=10)
    ingest(tmp_path / "d.zarr", p["db"], p["q"], db_labels=p["dbl"], query_labels=p["ql"], chunk_rows=256)
    before = open_dataset(tmp_path / "d.zarr").fingerprint
    real_close = dataset_module._ArrayWriter.close
    calls = {"n": 0}

    def crash_on_labels(self):
        calls["n"] += 1
        if calls["n"] == 2:  # codes written, labels not yet
            raise KeyboardInterrupt
        return real_close(self)

    monkeypatch.setattr(dataset_module._ArrayWriter, "close", crash_on_labels)
    with pytest.raises(KeyboardInterrupt):
        append(tmp_path / "d.zarr", p["db"], p["dbl"])
    assert open_dataset(tmp_path / "d.zarr").fingerprint == before
    assert [x.name for x in tmp_path.iterdir() if x.name.startswith(".d.zarr.") and "lock" not in x.name] == []
