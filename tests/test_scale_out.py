"""Beyond one process: the reduction on the workers and the distinct codes in parts give the in-process bits."""

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from hashdist.api import evaluate_local
from tests.conftest import BIN, ROOT, free_port, listening_sockets

pytestmark = pytest.mark.usefixtures("prefect_api")


def _same(a, b):
    assert json.dumps(a.report["metrics"], sort_keys=True) == json.dumps(b.report["metrics"], sort_keys=True)
    assert a.report["code_usage"] == b.report["code_usage"]
    np.testing.assert_array_equal(a.bucket_sizes, b.bucket_sizes)
    assert a.per_query.keys() == b.per_query.keys()
    for key, values in a.per_query.items():
        np.testing.assert_array_equal(values, b.per_query[key], err_msg=key)


@pytest.mark.parametrize(("code_parts", "query_block_rows", "db_block_rows"), [(1, 16, 500), (3, 32, 1000),
                                                                               (8, 64, 500)])
def test_loopback_cluster_is_bit_identical_for_any_code_parts_and_blocks(
        class_dataset, loopback_cluster, code_parts, query_block_rows, db_block_rows):
    from flows.evaluate import run_evaluation

    address, _ = loopback_cluster
    local = evaluate_local(class_dataset, cache=False)
    remote = run_evaluation(class_dataset, cache=False, address=address, code_parts=code_parts,
                            query_block_rows=query_block_rows, db_block_rows=db_block_rows)
    _same(remote, local)
    assert remote.report["engine"]["code_parts"] == code_parts
    assert remote.report["code_usage"]["max_bucket"] > 1  # the codes collide: M_k is not trivially 1


def test_a_relative_dataset_path_reaches_workers_in_another_directory(class_dataset, loopback_cluster, monkeypatch):
    """The workers were started in another working directory: tasks open the dataset by its absolute path."""
    from pathlib import Path

    from flows.evaluate import run_evaluation

    address, _ = loopback_cluster
    monkeypatch.chdir(Path(class_dataset).parent)
    remote = run_evaluation(Path(class_dataset).name, cache=False, address=address)
    _same(remote, evaluate_local(class_dataset, cache=False))
    assert remote.report["dataset"]["path"] == Path(class_dataset).name  # the report names it as given


def test_multilabel_on_the_embedded_cluster_with_many_parts(multilabel_dataset):
    """Several passes of code counts (4 parts a pass), the later ones reading the rows the first set aside
    (hashdist.engine.spill), on the embedded cluster and on threads: the counts of one part."""
    from flows.evaluate import run_evaluation

    local = evaluate_local(multilabel_dataset, cache=False, code_parts=1)
    _same(run_evaluation(multilabel_dataset, cache=False, code_parts=5, threads=2, query_block_rows=16), local)
    _same(evaluate_local(multilabel_dataset, cache=False, code_parts=9, threads=3, db_block_rows=500), local)


@pytest.mark.parametrize("spilled", [False, True])
def test_code_counts_in_passes_count_every_row_once(class_dataset, tmp_path, spilled):
    """Each pass counts only its parts' rows; together the passes hold every distinct code once. With a spill
    directory the first pass sets aside the later passes' rows, which read them once and remove them."""
    from dataclasses import replace

    from hashdist.api import prepare
    from hashdist.data.dataset import open_dataset
    from hashdist.engine.compute import count_codes
    from hashdist.engine.plan import code_passes, for_threads
    from hashdist.kernels.codecounts import merge_code_counts

    _, _, plan, *_ = prepare(class_dataset, db_block_rows=500, code_parts=7)
    plan = replace(for_threads(plan, 1), parts_per_pass=2)  # 4 passes
    spill = str(tmp_path) if spilled else None
    codes = open_dataset(class_dataset).codes("database", 0, 3000)[:, 0]
    want_codes, want_counts = np.unique(codes, return_counts=True)
    got = {}
    for parts in code_passes(plan):
        counted = count_codes(plan, plan.count_blocks, parts, None, spill)
        if spilled:  # what is left: the files of the passes still to come, one per pass and block
            left = sorted(int(f.name.split("-")[0]) for f in tmp_path.iterdir())
            assert left == sorted(j for j in range(parts.start // 2 + 1, 4) for _ in plan.count_blocks)
        assert set(counted.pieces) == set(parts)
        assert isinstance(counted.bit_ones, np.ndarray) == (parts.start == 0)
        # a piece per block and part; merged per part, the parts hold every distinct code once
        for piece_codes, piece_counts in (merge_code_counts(pieces) for pieces in counted.pieces.values() if pieces):
            for code, count in zip(piece_codes[:, 0].tolist(), piece_counts.tolist(), strict=True):
                assert code not in got
                got[code] = count
    assert got == dict(zip(want_codes.tolist(), want_counts.tolist(), strict=True))


def test_collapsed_blocks_give_the_same_bits_and_report_their_distinct_fraction(tmp_path):
    """Most items on a few codes per class: blocks are counted over distinct (code, label) rows."""
    from flows.evaluate import run_evaluation
    from hashdist.data.synth import synth_dataset

    url = synth_dataset(tmp_path / "collide.zarr", n_database=12_000, n_queries=300, nbits=64, labels="class",
                        n_classes=5, noise=0.15, collision=0.0, prototypes=20, stray=0.01, chunk_rows=4096)
    local = evaluate_local(url, cache=False, threads=2, db_block_rows=4096)
    blocks = local.report["blocks"]
    assert blocks["collapsed"] == blocks["computed"] == blocks["total"] == 3
    assert 0 < blocks["distinct_fraction"] < 0.1
    # the same run with every block counted item by item: the collapse threshold set to never
    import hashdist.kernels.collapse as collapse

    never = pytest.MonkeyPatch()
    never.setattr(collapse, "collapse_limit", lambda n_items, n_queries: -1)
    try:
        plain = evaluate_local(url, cache=False, threads=2, db_block_rows=4096)
    finally:
        never.undo()
    assert plain.report["blocks"]["collapsed"] == 0
    _same(local, plain)
    _same(run_evaluation(url, cache=False, threads=2, code_parts=3, db_block_rows=4096), local)


def test_loopback_cluster_and_deploy_script_listen_on_loopback_only(tmp_path, loopback_cluster):
    """`dask scheduler` and `dask worker` as tests/conftest.py and deploy/local-cluster.sh start them: every
    server on 127.0.0.1 (the HTTP server runs even with --no-dashboard)."""
    _, procs = loopback_cluster
    sockets = set().union(*(listening_sockets(p.pid) for p in procs))
    assert len(sockets) >= 5, sockets  # the scheduler's comm and HTTP ports, and each worker's (and nanny's)
    assert {address for address, _ in sockets} == {"127.0.0.1"}, sockets

    script = subprocess.Popen(["bash", str(ROOT / "deploy" / "local-cluster.sh"), "1", str(free_port())],
                              env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline, sockets = time.monotonic() + 120, set()
        while len(sockets) < 5 and script.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            sockets = listening_sockets(script.pid)  # scheduler: comm and HTTP; nanny; worker: comm and HTTP
        assert len(sockets) >= 5, sockets
        assert {address for address, _ in sockets} == {"127.0.0.1"}, sockets
    finally:
        os.killpg(script.pid, signal.SIGTERM)
        script.wait(timeout=60)


def test_a_python_run_on_an_existing_cluster_gives_its_workers_an_api(tmp_path, class_dataset):
    """run_evaluation from Python, no $PREFECT_API_URL anywhere, on workers in other processes: they report to
    the API the run gives them (hashdist's temporary server, gone with the Python process) and start no Prefect
    server of their own; a relative --cache path is the caller's directory, not the workers'."""
    import psutil

    from tests.conftest import loopback_dask

    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    script = ("import sys; from flows.evaluate import run_evaluation; "
              "ev = run_evaluation(sys.argv[1], address=sys.argv[2], cache='cache'); "
              "print(ev.report['metrics']['map']['expected'])")
    with loopback_dask(env) as (address, procs):
        done = subprocess.run([str(BIN / "python"), "-c", script, class_dataset, address], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        workers = [psutil.Process(p.pid) for p in procs[1:]]
        servers = [c.cmdline() for w in workers for c in w.children(recursive=True)
                   if any("uvicorn" in part or "prefect" in part for part in c.cmdline())]
        assert not servers  # no Prefect server of their own
    local = evaluate_local(class_dataset, cache=False)
    assert float(done.stdout.split()[-1]) == local.report["metrics"]["map"]["expected"]
    assert any((tmp_path / "cache").rglob("*.npz"))  # the blocks went to the caller's cache directory
