"""deploy/prefect.yaml works: a real `prefect server` on 127.0.0.1, the nightly deployment on a process
work pool, a triggered run executed by a worker, and the report it writes."""

import json
import subprocess
import sys
from pathlib import Path

from hashdist.api import evaluate_local
from hashdist.report.evaluation import json_safe

ROOT = Path(__file__).resolve().parent.parent
PREFECT = str(Path(sys.executable).parent / "prefect")


def _prefect(env, *args, timeout=180):
    out = subprocess.run([PREFECT, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"prefect {' '.join(args)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def test_nightly_deployment_runs_on_a_process_worker(prefect_server, class_dataset, tmp_path):
    env = prefect_server
    _prefect(env, "work-pool", "create", "hashdist-process", "--type", "process")
    _prefect(env, "--no-prompt", "deploy", "--prefect-file", "deploy/prefect.yaml", "--all")
    inspected = _prefect(env, "deployment", "inspect", "evaluate/nightly")
    assert "0 2 * * *" in inspected and "hashdist-process" in inspected
    out = tmp_path / "nightly-report"
    _prefect(env, "deployment", "run", "evaluate/nightly", "--param", f"dataset={class_dataset}",
             "--param", f"out={out}", "--param", f"cache={tmp_path / 'cache'}",
             "--param", f"history={tmp_path / 'history'}")
    _prefect(env, "worker", "start", "--pool", "hashdist-process", "--run-once", timeout=300)
    report = json.loads((out / "report.json").read_text())
    local = evaluate_local(class_dataset, cache=False)
    assert report["metrics"] == json_safe(local.report["metrics"])
    assert report["engine"]["kind"] == "prefect-dask"
    from hashdist.compare.history import load_history

    (recorded,) = load_history(tmp_path / "history", arrays=False)  # the nightly run is in the history store
    assert recorded["dataset"]["fingerprint"] == report["dataset"]["fingerprint"]


def test_nightly_deployment_runs_on_an_existing_cluster(prefect_server, class_dataset, tmp_path):
    """The deployment with $HASHDIST_DASK_ADDRESS set to a loopback `dask scheduler` and two `dask worker`
    processes: the functions the run ships to those processes must be importable there (the entrypoint is a
    module path), and the report is the local engine's."""
    from distributed import Client

    from tests.conftest import loopback_dask

    env = prefect_server
    with loopback_dask(env) as (address, _):
        _prefect(env, "work-pool", "create", "hashdist-process", "--type", "process")
        _prefect(env, "--no-prompt", "deploy", "--prefect-file", "deploy/prefect.yaml", "--all")
        out = tmp_path / "report"
        _prefect(env, "deployment", "run", "evaluate/nightly", "--param", f"dataset={class_dataset}",
                 "--param", f"out={out}", "--param", "cache=false", "--param", "history=null",
                 "--job-variable", "env=" + json.dumps({"HASHDIST_DASK_ADDRESS": address,
                                                         "PREFECT_LOGGING_LEVEL": "WARNING"}))
        _prefect(env, "worker", "start", "--pool", "hashdist-process", "--run-once", timeout=300)
        with Client(address, timeout=10) as client:  # the blocks ran on this cluster, not an embedded one
            assert client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.transition_counter) > 0
    assert (out / "report.json").is_file(), "the deployment's run wrote no report"
    report = json.loads((out / "report.json").read_text())
    assert report["metrics"] == json_safe(evaluate_local(class_dataset, cache=False).report["metrics"])
