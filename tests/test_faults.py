"""Faults a cluster really has: the run completes with the exact result, or resumes from its cache."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hashdist.api import evaluate_local
from tests.conftest import make_dataset

pytestmark = pytest.mark.usefixtures("prefect_api")
BIN = Path(sys.executable).parent


def _metrics(evaluation):
    return json.dumps(evaluation.report["metrics"], sort_keys=True)


@pytest.fixture(scope="module")
def busy_dataset(tmp_path_factory):
    """Enough small blocks that a run lasts several seconds."""
    return make_dataset(tmp_path_factory.mktemp("busy"), n_db=40_000, n_q=640, nbits=64, chunk_rows=1000,
                        query_chunk_rows=64)


def test_transient_task_failure_is_retried(class_dataset, monkeypatch):
    import hashdist.engine.compute as engine
    from flows.evaluate import run_evaluation

    real = engine.compute_histogram
    calls = {"n": 0}
    lock = threading.Lock()

    def flaky(plan, block, ds=None, memo=None):
        with lock:
            calls["n"] += 1
            first = calls["n"] == 1
        if first:
            raise ConnectionError("injected transient fault")
        return real(plan, block, ds, memo)

    monkeypatch.setattr(engine, "compute_histogram", flaky)
    result = run_evaluation(class_dataset, cache=False, query_block_rows=16, db_block_rows=1000)
    assert calls["n"] == result.report["blocks"]["total"] + 1  # one block ran twice
    assert _metrics(result) == _metrics(evaluate_local(class_dataset, cache=False))


def test_killed_dask_worker_does_not_change_the_result(busy_dataset, loopback_cluster, tmp_path, monkeypatch):
    """A worker process is killed while it runs a histogram task: the task runs again and the result is exact.

    The histogram tasks wait at a gate (a file) after announcing which worker runs them, so the kill lands
    mid-task however fast the machine is."""
    from prefect import task

    import flows.evaluate as evaluate_module
    from flows.runtime import TASK_OPTIONS

    address, procs = loopback_cluster
    gate = tmp_path / "open"

    def gated(real):
        def run(*args):
            call = f"{os.getpid()}-{time.monotonic_ns()}"
            (tmp_path / f"running-{call}").touch()
            deadline = time.monotonic() + 300
            while not gate.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            (tmp_path / f"passed-{call}").touch()
            return real(*args)

        return run

    real = evaluate_module.histogram_task  # the shares' task (code counts are plain Dask tasks beside them)
    monkeypatch.setattr(evaluate_module, "histogram_task", task(gated(real.fn), name=real.name, **TASK_OPTIONS))
    outcome = {}

    def run():
        outcome["result"] = evaluate_module.run_evaluation(busy_dataset, cache=False, address=address,
                                                           query_block_rows=64, db_block_rows=1000)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    deadline = time.monotonic() + 120
    while not (running := list(tmp_path.glob("running-*"))) and runner.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running, "no histogram task started"
    victim = int(running[0].name.split("-")[1])
    parent = int(Path(f"/proc/{victim}/stat").read_text().rpartition(")")[2].split()[1])
    assert parent in {p.pid for p in procs[1:]}  # a worker process, under one of the two nannies
    os.kill(victim, signal.SIGKILL)
    gate.touch()
    runner.join(timeout=300)
    assert not runner.is_alive()
    started, passed = ({f.name.split("-", 1)[1] for f in tmp_path.glob(f"{kind}-*")} for kind in ("running", "passed"))
    assert started - passed == {running[0].name.split("-", 1)[1]}  # the killed task never ran on; it ran again
    assert _metrics(outcome["result"]) == _metrics(evaluate_local(busy_dataset, cache=False))


def test_worker_killed_as_the_reduction_starts_does_not_hang_the_run(tmp_path, loopback_cluster, monkeypatch):
    """The worker dies just before the reduction sends its first tasks, before the scheduler has noticed: the run
    completes with the exact result (a broadcast scatter of the plan used to wait for that worker forever)."""
    import flows.evaluate as evaluate_module

    address, procs = loopback_cluster
    dataset = make_dataset(tmp_path, n_db=4000, n_q=64, nbits=64, chunk_rows=1000, query_chunk_rows=64)
    reduce, pid = evaluate_module.reduce_on_cluster, procs[1].pid  # (the patch must pickle: no Popen in it)

    def kill_then_reduce(*args, **kwargs):
        os.kill(pid, signal.SIGKILL)
        return reduce(*args, **kwargs)

    monkeypatch.setattr(evaluate_module, "reduce_on_cluster", kill_then_reduce)
    outcome = {}

    def run():
        outcome["result"] = evaluate_module.run_evaluation(dataset, cache=False, address=address,
                                                           query_block_rows=64, db_block_rows=1000)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(timeout=120)
    assert not runner.is_alive(), "the run hung after the worker died"
    assert _metrics(outcome["result"]) == _metrics(evaluate_local(dataset, cache=False))


def test_killed_evaluate_process_resumes_from_cached_blocks(busy_dataset, tmp_path):
    cache, out = tmp_path / "cache", tmp_path / "report"
    cmd = [str(BIN / "hashdist"), "evaluate", busy_dataset, "--out", str(out), "--cache", str(cache),
           "--threads", "1", "--query-block-rows", "64", "--db-block-rows", "4000", "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    # 10 code-count blocks are stored first, then 100 histogram blocks: wait for a few of those
    while len(list(cache.rglob("*.npz"))) < 13 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert not out.exists()  # nothing half-written
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["blocks"]["cached"] > 0
    assert report["metrics"] == json.loads(json.dumps(evaluate_local(busy_dataset, cache=False).report["metrics"]))
