"""Watching an index over time: the history store, the paired test against the previous run, the
`hashdist history` command and its page, `evaluate --history` (exit status 3), and the flow's Failed state."""

import inspect
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from hashdist.api import evaluate_local
from hashdist.cli import main
from hashdist.compare.history import append_run, compare_with_previous, load_history, record
from hashdist.data.bits import unpack_bits
from hashdist.data.dataset import open_dataset
from hashdist.errors import InputError
from tests.conftest import lock_held_elsewhere

ROOT = Path(__file__).resolve().parent.parent
DROP = "mAP dropped significantly: "


def cli(capsys, *argv):
    status = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def synth(path, seed=0):
    assert main(["synth", "--n-database", "3000", "--n-queries", "120", "--nbits", "16", "--labels", "class",
                 "--n-classes", "8", "--noise", "0.1", "--seed", str(seed), "--chunk-rows", "1000",
                 "--out", str(path), "--overwrite"]) == 0
    return path


def degrade(path, workdir, flip=0.3):
    """Rewrite the dataset at ``path`` in place with ``flip`` of its database bits flipped; same queries."""
    ds = open_dataset(path)
    bits = unpack_bits(ds.codes("database", 0, ds.n_database), ds.nbits)
    bits ^= (np.random.default_rng(7).random(bits.shape) < flip).astype(np.uint8)
    files = {"db": bits, "q": unpack_bits(ds.codes("queries", 0, ds.n_queries), ds.nbits),
             "dbl": ds.labels("database", 0, ds.n_database), "ql": ds.labels("queries", 0, ds.n_queries)}
    for name, values in files.items():
        np.save(workdir / f"{name}.npy", values)
    assert main(["ingest", "--db-codes", str(workdir / "db.npy"), "--query-codes", str(workdir / "q.npy"),
                 "--db-labels", str(workdir / "dbl.npy"), "--query-labels", str(workdir / "ql.npy"),
                 "--out", str(path), "--overwrite"]) == 0


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    """Three `evaluate --engine local --history` runs of one dataset path: the index, the same index again, and
    the index with 30% of its database bits flipped (same queries). Returns paths and what each run printed."""
    root = tmp_path_factory.mktemp("watched")
    data, history, out = synth(root / "data.zarr"), root / "history", root / "report"
    runs = []
    for step in ("first", "same", "degraded"):
        if step == "degraded":
            degrade(data, root)
        status = main(["evaluate", str(data), "--out", str(out), "--engine", "local", "--no-cache", "--quiet",
                       "--overwrite", "--history", str(history)])
        runs.append({"status": status, "report": json.loads((out / "report.json").read_text())})
    return {"root": root, "data": data, "history": history, "out": out, "runs": runs}


def test_identical_index_is_not_flagged_and_a_degraded_one_is(watched):
    first, same, degraded = watched["runs"]
    assert first["status"] == 0 and same["status"] == 0
    assert degraded["status"] == 3
    assert degraded["report"]["metrics"]["map"]["expected"] < first["report"]["metrics"]["map"]["expected"] - 0.2
    runs = load_history(watched["history"])
    assert len(runs) == 3
    assert [r["metrics"]["map"] for r in runs] == [r["report"]["metrics"]["map"] for r in watched["runs"]]
    assert len({r["query_set"]["fingerprint"] for r in runs}) == 1  # same queries, the database changed
    assert len({r["dataset"]["fingerprint"] for r in runs}) == 2
    assert runs[0]["dataset"]["fingerprint"] == first["report"]["dataset"]["fingerprint"]
    relevant = np.asarray(runs[0]["relevant"])
    assert len(runs[0]["query"]) == first["report"]["queries"]["evaluated"] and (relevant > 0).all()
    assert [r["label"] for r in runs[0]["metrics"]["headline"]][:2] == ["mAP", "mAP@10 (retrieved)"]
    # the verdicts, recomputed from the store
    verdicts = [compare_with_previous(watched["history"], run=r["run"]) for r in runs]
    assert verdicts[0]["status"] == "first run" and not verdicts[0]["flagged"]
    v = verdicts[1]
    assert v["status"] == "compared" and not v["flagged"] and v["mean_ap_diff"] == 0.0
    assert v["randomization_pvalue"] == 1.0 and v["t_pvalue"] == 1.0
    v = verdicts[2]
    assert v["status"] == "compared" and v["flagged"] and v["significant"] and v["drop"]
    assert v["shared_queries"] == first["report"]["queries"]["evaluated"]
    assert v["mean_ap_diff"] < -0.2 and v["randomization_pvalue"] == 1 / 10001 and v["t_pvalue"] < 1e-10
    assert v["message"].startswith(DROP) and "\n" not in v["message"]
    assert compare_with_previous(watched["history"]) == v  # the latest run by default


@pytest.mark.usefixtures("prefect_api")
def test_evaluate_history_exit_status_and_message(watched, tmp_path, capsys):
    history = tmp_path / "history"
    shutil.copytree(watched["history"], history)
    status, out, err = cli(capsys, "evaluate", watched["data"], "--out", tmp_path / "r", "--no-cache", "--quiet",
                           "--history", history)
    # the degraded index again, against the degraded run: no change (the flow's verdict, as the CLI prints it)
    assert status == 0, err
    assert "history: " in out and "no significant change" in out and err == ""
    synth(watched["root"] / "better.zarr")  # the original index, at another path, queries identical
    status, out, err = cli(capsys, "evaluate", watched["root"] / "better.zarr", "--out", tmp_path / "r", "--engine",
                           "local", "--no-cache", "--quiet", "--history", history)
    assert status == 0 and "significant rise" in out
    degrade(watched["root"] / "better.zarr", tmp_path, flip=0.35)
    status, out, err = cli(capsys, "evaluate", watched["root"] / "better.zarr", "--out", tmp_path / "r",
                           "--engine", "local", "--no-cache", "--quiet", "--history", history)
    assert status == 3
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(DROP), err
    assert "Ranking by Hamming distance" in out and (tmp_path / "r" / "report.json").is_file()  # outputs kept
    assert len(load_history(history)) == 6
    status, out, _ = cli(capsys, "evaluate", "--help")
    assert status == 0
    assert "3 with --history when mAP dropped significantly" in " ".join(out.split())


def test_another_query_set_is_not_comparable(watched, tmp_path, capsys):
    history = tmp_path / "history"
    shutil.copytree(watched["history"], history)
    other = synth(tmp_path / "other.zarr", seed=5)  # other queries (labels) of the same size
    status, out, err = cli(capsys, "evaluate", other, "--out", tmp_path / "r", "--engine", "local", "--no-cache",
                           "--quiet", "--history", history)
    assert status == 0, err
    verdict = compare_with_previous(history)
    assert verdict["status"] == "not comparable" and not verdict["flagged"]
    assert "the query set changed" in verdict["reason"] and verdict["randomization_pvalue"] is None
    assert "not comparable" in out


def test_history_command_table_page_and_json(watched, tmp_path, capsys):
    history = watched["history"]
    status, out, err = cli(capsys, "history", history)
    assert status == 0, err
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("run "))
    assert header.split()[:4] == ["run", "time", "(UTC)", "dataset"]
    rows = [line.split() for line in lines[lines.index(header) + 1:] if line[:1].isdigit()]
    runs = load_history(history)
    assert [r[0] for r in rows] == ["1", "2", "3"]
    assert [r[-1] for r in rows] == ["run", "ok", "DROP"]  # "first run" ends in "run"
    assert [r[4] for r in rows] == [f"{x['metrics']['map']['expected']:.4f}" for x in runs]
    assert rows[0][3] == runs[0]["dataset"]["fingerprint"][:12]
    assert any(line.startswith(f"latest: {DROP}") for line in lines)
    page = history / "history.html"
    assert page.is_file() and "<figure" in page.read_text() and "data:image/png;base64," in page.read_text()
    status, out, err = cli(capsys, "history", history, "--json", "--out", tmp_path / "page.html")
    assert status == 0, err
    doc = json.loads(out)
    assert doc["html"] == str(tmp_path / "page.html") and (tmp_path / "page.html").is_file()
    assert [r["verdict"]["status"] for r in doc["runs"]] == ["first run", "compared", "compared"]
    assert [r["verdict"]["flagged"] for r in doc["runs"]] == [False, False, True]
    assert doc["verdict"] == doc["runs"][-1]["verdict"] and doc["verdict"]["message"].startswith(DROP)
    assert doc["runs"][2]["metrics"]["map"] == watched["runs"][2]["report"]["metrics"]["map"]
    assert doc["parameters"] == {"alpha": 0.05, "permutations": 10000, "seed": 0, "min_drop": 0.0}
    # a drop smaller than --min-drop is not flagged
    status, out, _ = cli(capsys, "history", history, "--json", "--no-html", "--min-drop", "0.9")
    assert status == 0 and json.loads(out)["verdict"]["flagged"] is False and json.loads(out)["html"] is None


def test_bad_input_is_one_line_exit_2_and_writes_nothing(watched, tmp_path, capsys):
    def refused(*argv, needle):
        status, out, err = cli(capsys, *argv)
        lines = err.splitlines()
        assert status == 2 and len(lines) == 1 and "Traceback" not in err, err
        assert needle in lines[0], lines[0]

    missing = tmp_path / "missing"
    refused("history", missing, needle="no such history store")
    assert not missing.exists()
    not_store = tmp_path / "not-a-store"
    not_store.mkdir()
    (not_store / "notes.txt").write_text("x")
    refused("history", not_store, needle="not a hashdist history store")
    refused("history", watched["data"], needle="not a hashdist history store")  # a dataset is not a history
    assert sorted(p.name for p in not_store.iterdir()) == ["notes.txt"]
    assert not (watched["data"] / "history.html").exists()
    refused("history", watched["history"], "--alpha", "2", "--out", tmp_path / "p.html", needle="--alpha")
    refused("history", watched["history"], "--alpha", "0.00001", needle="the smallest p-value the test can give")
    refused("history", watched["history"], "--out", tmp_path / "no" / "p.html", needle="--out")
    assert not (tmp_path / "p.html").exists()
    # evaluate --history refuses a bad store before evaluating anything
    refused("evaluate", watched["data"], "--out", tmp_path / "r", "--engine", "local", "--history", not_store,
            needle="not a hashdist history store")
    refused("evaluate", watched["data"], "--out", tmp_path / "r", "--engine", "local", "--history",
            tmp_path / "r" / "history", needle="inside --out")
    assert not (tmp_path / "r").exists()


def test_a_lost_chunk_is_named_not_read_as_zeros(watched, tmp_path, capsys):
    """A run's per-query AP with its chunk file gone would read as zeros, a drop that never happened."""
    damaged = tmp_path / "history"
    shutil.copytree(watched["history"], damaged)
    run = sorted(p for p in (damaged / "runs").iterdir() if p.is_dir())[-1]
    (run / "ap" / "c" / "0").unlink()
    status, _, err = cli(capsys, "history", damaged)
    assert status == 2 and len(err.splitlines()) == 1, err
    assert f"run {run.name}: ap chunk 0 is missing (damaged history)" in err, err


_CRASH = """
import os, sys
import zarr
from hashdist.api import evaluate_local
from hashdist.compare.history import append_run

create_array = zarr.Group.create_array

def dying(self, name, **kwargs):  # the process dies after writing the run's first array
    array = create_array(self, name, **kwargs)
    os._exit(17)

evaluation = evaluate_local(sys.argv[2], cache=False)
zarr.Group.create_array = dying
append_run(sys.argv[1], evaluation)
"""


def test_a_crashed_append_leaves_the_store_readable(watched, tmp_path, capsys):
    history = tmp_path / "history"
    shutil.copytree(watched["history"], history)
    before = load_history(history)
    done = subprocess.run([sys.executable, "-c", _CRASH, str(history), str(watched["data"])], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 17, done.stderr[-2000:]
    leftovers = [p for p in (history / "runs").iterdir() if p.name.startswith(".")]
    assert len(leftovers) == 1 and (leftovers[0] / "query").is_dir()  # the half-written run is there, hidden
    after = load_history(history)
    assert [r["run"] for r in after] == [r["run"] for r in before]
    assert all(np.array_equal(a["ap"], b["ap"]) for a, b in zip(after, before, strict=True))
    status, out, err = cli(capsys, "history", history, "--no-html")
    assert status == 0 and "DROP" in out, err
    # an append that fails in this process cleans up after itself
    evaluation = evaluate_local(watched["data"], cache=False)
    import zarr

    real = zarr.Group.create_array

    def failing(self, name, **kwargs):
        real(self, name, **kwargs)
        raise KeyboardInterrupt

    zarr.Group.create_array = failing
    try:
        with pytest.raises(KeyboardInterrupt):
            append_run(history, evaluation)
    finally:
        zarr.Group.create_array = real
    assert len(load_history(history)) == len(before)
    # the next append succeeds and removes the crashed one's leftover
    verdict = record(history, evaluation)
    assert verdict["status"] == "compared" and not verdict["flagged"]
    assert not [p for p in (history / "runs").iterdir() if p.name.startswith(".")]
    assert len(load_history(history)) == len(before) + 1
    # the first append of a new store is atomic too: a crash leaves no store
    fresh = tmp_path / "fresh"
    done = subprocess.run([sys.executable, "-c", _CRASH, str(fresh), str(watched["data"])], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 17 and not fresh.exists()
    with pytest.raises(InputError, match="no such history store"):
        load_history(fresh)
    assert record(fresh, evaluation)["status"] == "first run"
    assert not list(tmp_path.glob(".fresh.tmp-*"))  # the crashed creation's leftover is gone


def test_one_writer_at_a_time(watched, tmp_path):
    history = tmp_path / "history"
    shutil.copytree(watched["history"], history)
    evaluation = evaluate_local(watched["data"], cache=False)
    with lock_held_elsewhere(history):
        with pytest.raises(InputError, match="another hashdist run"):
            append_run(history, evaluation, wait=0.5)
        assert len(load_history(history)) == 3  # readers need no lock
    entry = append_run(history, evaluation, when="2000-01-01T00:00:00Z")  # an earlier time sorts first
    runs = load_history(history)
    assert runs[0]["run"] == entry["run"] and runs[0]["time"] == "2000-01-01T00:00:00.000000Z"
    assert entry["run"].startswith("20000101T000000000000Z-")


def test_history_page_in_chromium(watched, tmp_path, capsys):
    from tests.test_html import CHROMIUM, rendered

    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (apt-get install chromium); the history page was not checked")
    page = tmp_path / "history.html"
    status, out, err = cli(capsys, "history", watched["history"], "--out", page)
    assert status == 0, err
    view = rendered(page, tmp_path)
    assert view["images"] == view["decoded"] == 1
    assert len(view["captions"]) == 1 and "tie interval" in view["captions"][0] and len(view["captions"][0]) > 60
    [table] = view["tables"]
    assert table["caption"].startswith("Runs, oldest first")
    assert table["header"][:4] == ["run", "time (UTC)", "dataset", "mAP"]
    runs = load_history(watched["history"])
    assert [row[3] for row in table["rows"]] == [f"{r['metrics']['map']['expected']:.4f}" for r in runs]
    assert [row[-1] for row in table["rows"]] == ["first run", "ok", "DROP"]
    m = runs[2]["metrics"]["map"]
    assert table["rows"][2][4] == f"[{m['worst']:.4f}, {m['best']:.4f}]"


@pytest.mark.usefixtures("prefect_api")
def test_flow_ends_failed_on_a_significant_drop_and_the_automation_matches(tmp_path):
    """The flow pattern given for flows/evaluate.py, around the real `evaluate` flow: the Failed state, its
    message, the exception a caller gets, the artifact, and deploy/automation-history.yaml's trigger."""
    import asyncio
    from datetime import datetime, timezone

    import yaml
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.events.schemas.automations import AutomationCore
    from prefect.server.events.schemas.automations import EventTrigger
    from prefect.server.events.schemas.events import ReceivedEvent

    from flows.evaluate import evaluate
    from flows.history import drop_state, watch
    from flows.observe import index_id
    from hashdist.compare.history import SignificantDrop

    @flow(name="evaluate-watched", persist_result=False)
    def evaluate_watched(dataset: str, out: str, history: str):
        evaluation = evaluate(dataset=dataset, out=out, overwrite=True, cache=False)
        verdict = watch(evaluation, history)
        if verdict["flagged"]:
            return drop_state(verdict, evaluation)
        return evaluation

    data, history, out = synth(tmp_path / "data.zarr"), tmp_path / "history", tmp_path / "report"
    first = evaluate_watched(str(data), str(out), str(history))
    assert first.report["metrics"]["map"]["expected"] > 0.5
    degrade(data, tmp_path)
    state = evaluate_watched(str(data), str(out), str(history), return_state=True)
    assert state.is_failed() and state.name == "Failed"
    assert state.message.startswith(DROP) and "\n" not in state.message
    with pytest.raises(SignificantDrop) as raised:
        state.result()
    assert raised.value.verdict["flagged"] and str(raised.value) == state.message
    assert raised.value.evaluation.report["dataset"]["fingerprint"] == open_dataset(data).fingerprint
    assert json.loads((out / "report.json").read_text())["metrics"] == json.loads(
        json.dumps(raised.value.evaluation.report["metrics"]))  # the outputs were written
    assert len(load_history(history)) == 2

    async def artifacts():
        async with get_client() as client:
            found = await client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(
                any_=[f"hashdist-history-{index_id(str(data))}"])))
            run = await client.read_flow_run(state.state_details.flow_run_id)
            return found, run

    found, run = asyncio.run(artifacts())
    latest = max(found, key=lambda a: a.created)
    assert DROP in latest.data and "| DROP |" in latest.data and "| first run |" in latest.data
    assert run.state.type.value == "FAILED" and run.state.message == state.message  # what the server recorded

    # deploy/automation-history.yaml: a valid automation whose trigger covers the event of this Failed state
    spec = yaml.safe_load((ROOT / "deploy" / "automation-history.yaml").read_text())
    AutomationCore.model_validate(spec)
    trigger = EventTrigger.model_validate(spec["trigger"])

    def event(name, message):
        return ReceivedEvent(
            id=uuid.uuid4(), occurred=datetime.now(timezone.utc), event=f"prefect.flow-run.{name}",
            resource={"prefect.resource.id": f"prefect.flow-run.{run.id}", "prefect.resource.name": run.name,
                      "prefect.state-message": message, "prefect.state-name": name,
                      "prefect.state-type": name.upper()},
            related=[{"prefect.resource.id": "prefect.flow.1", "prefect.resource.role": "flow",
                      "prefect.resource.name": "evaluate"},
                     {"prefect.resource.id": "prefect.deployment.2", "prefect.resource.role": "deployment",
                      "prefect.resource.name": "nightly"}])

    assert trigger.covers(event(run.state.name, run.state.message))
    assert not trigger.covers(event("Failed", "Flow run encountered an exception: InputError: bad chunk"))
    assert not trigger.covers(event("Completed", ""))


@pytest.mark.skipif("history" not in inspect.signature(__import__("flows.evaluate").evaluate.evaluate.fn).parameters,
                    reason="flows/evaluate.py has no `history` parameter yet")
def test_cli_flow_engine_history_exit_status(tmp_path, cli_env):
    """`hashdist evaluate --history` through the Prefect flow (the default engine), in a new process."""
    data, history = synth(tmp_path / "data.zarr"), tmp_path / "history"

    def hashdist(*args):
        return subprocess.run([str(Path(sys.executable).parent / "hashdist"), *map(str, args)], env=cli_env,
                              capture_output=True, text=True, timeout=600, cwd=tmp_path)

    done = hashdist("evaluate", data, "--out", tmp_path / "r", "--quiet", "--history", history)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "first run in the history" in done.stdout
    degrade(data, tmp_path)
    done = hashdist("evaluate", data, "--out", tmp_path / "r", "--quiet", "--history", history)
    assert done.returncode == 3, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith(DROP), done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "Ranking by Hamming distance" in done.stdout and len(load_history(history)) == 2
    assert os.path.isfile(tmp_path / "r" / "report.json")
