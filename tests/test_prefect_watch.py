"""What an operator watching Prefect sees of `hashdist evaluate` runs, read back from a real `prefect server` on
127.0.0.1: the run's story in its logs (and nothing of it on the terminal), the artifacts keyed by the index with
rounded values and an escaped absolute link, the events, and the threshold automation fired by the server."""

import json
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from flows.observe import file_link, index_id, markdown_text, rounded_rows, truncated
from hashdist.api import evaluate_local
from tests.conftest import BIN, ROOT, make_dataset, running_prefect_server
from tests.test_history import degrade, synth

WAIT_S = 60  # the longest wait for the server to have stored what a finished run sent
EVALUATED = []  # the dataset locations evaluated on the module's server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One `prefect server` for the module; the environment of a user's shell that points hashdist at it (no
    PREFECT_LOGGING_LEVEL: the CLI's own defaults)."""
    with running_prefect_server(tmp_path_factory.mktemp("prefect-server")) as env:
        yield {k: v for k, v in env.items() if k != "PREFECT_LOGGING_LEVEL"}


def hashdist(env, cwd, *args):
    return subprocess.run([str(BIN / "hashdist"), *map(str, args)], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def api(env, path, body):
    response = httpx.post(f"{env['PREFECT_API_URL']}/{path}", json=body, timeout=30)
    response.raise_for_status()
    return response.json()


def until(read, what: str):
    """``read()`` once it is truthy, polled for at most WAIT_S seconds."""
    deadline = time.monotonic() + WAIT_S
    while not (found := read()):
        assert time.monotonic() < deadline, f"{what}: not on the server after {WAIT_S} s"
        time.sleep(1)
    return found


def events(env, name, resource_id):
    return api(env, "events/filter", {"filter": {"event": {"name": [name]}, "resource": {"id": [resource_id]},
                                                 "order": "ASC"}, "limit": 50})["events"]


def artifacts(env, prefix):
    found = api(env, "artifacts/filter", {"artifacts": {"key": {"like_": f"{prefix}%"}}})
    return sorted(found, key=lambda a: a["created"])  # the oldest first


def below(threshold: str) -> list[str]:
    """The label prefixes of the values below ``threshold`` (4 decimals at most, in (0, 1)), as
    deploy/automation-threshold.yaml spells "below 0.70"."""
    digits = threshold[2:].rstrip("0")
    return [f"0.{digits[:i]}{d}*" for i in range(len(digits)) for d in range(int(digits[i]))]


def automation(env, tmp_path, name, resource_id, threshold) -> str:
    """deploy/automation-threshold.yaml for ``resource_id`` below ``threshold``, its action doing nothing, created
    with `prefect automation create --from-file`; its id."""
    spec = yaml.safe_load((ROOT / "deploy" / "automation-threshold.yaml").read_text())
    spec["name"] = name
    spec["trigger"]["match"] = {"prefect.resource.id": resource_id, "hashdist.measure.map": below(threshold)}
    spec["actions"] = [{"type": "do-nothing"}]
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = subprocess.run([str(BIN / "prefect"), "automation", "create", "--from-file", str(path)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    (found,) = [a for a in httpx.post(f"{env['PREFECT_API_URL']}/automations/filter", json={}).json()
                if a["name"] == name]
    return found["id"]


def test_below_spells_the_threshold_as_label_prefixes():
    assert below("0.70") == ["0.0*", "0.1*", "0.2*", "0.3*", "0.4*", "0.5*", "0.6*"]
    for value, threshold in [(0.6999, "0.70"), (0.7, "0.70"), (0.7249, "0.725"), (0.725, "0.725"), (0.05, "0.1")]:
        label = truncated(value)
        assert any(label.startswith(p[:-1]) for p in below(threshold)) == (value < float(threshold)), value


def test_a_cli_run_tells_its_story_to_prefect_and_fires_the_threshold_automation(server, tmp_path):
    data = Path(make_dataset(tmp_path, name="My Index (v2).zarr", n_db=600, n_q=20, nbits=8))
    EVALUATED.append(str(data))
    resource = f"hashdist.index.{index_id(str(data))}"
    assert resource.startswith("hashdist.index.my-index-v2-")
    map_expected = evaluate_local(str(data), cache=False).report["metrics"]["map"]["expected"]
    assert 0.02 < map_expected < 0.98
    fires = automation(server, tmp_path, "fires", resource, f"{map_expected + 0.0001:.4f}")  # just above mAP
    stays = automation(server, tmp_path, "stays", resource, f"{map_expected - 0.01:.4f}")

    out_name = "[y](javascript:alert(1))"  # a hostile --out, given relative
    run = hashdist(server, tmp_path, "evaluate", data, "--out", out_name, "--no-cache")
    assert run.returncode == 0 and run.stderr == "", run.stderr  # the run's log lines stay off the terminal
    work_line = run.stdout.splitlines()[0]
    assert work_line.startswith("hashdist evaluate: 20 queries x 600 items")
    report = json.loads((tmp_path / out_name / "report.json").read_text())
    report_json = str(tmp_path / out_name / "report.json")

    (completed,) = until(lambda: events(server, "hashdist.evaluation.completed", resource), "the completed event")
    assert completed["payload"]["measures"]["mAP"] == {k: report["metrics"]["map"][k]
                                                       for k in ("expected", "worst", "best")}
    assert completed["payload"]["report"] == report_json
    assert completed["resource"]["hashdist.dataset.fingerprint"] == report["dataset"]["fingerprint"]
    assert completed["resource"]["hashdist.measure.map"] == truncated(report["metrics"]["map"]["expected"])
    (run_id,) = [r["prefect.resource.id"].split(".")[-1] for r in completed["related"]
                 if r["prefect.resource.role"] == "flow-run"]

    logs = until(lambda: api(server, "logs/filter", {"logs": {"flow_run_id": {"any_": [run_id]}},
                                                     "sort": "TIMESTAMP_ASC", "limit": 200}), "the run's logs")
    lines = [entry["message"] for entry in logs]
    m = report["metrics"]["map"]
    assert work_line in lines
    assert any(line.startswith("headline (expected [worst, best]): mAP "
                               f"{m['expected']:.4f} [{m['worst']:.4f}, {m['best']:.4f}];") for line in lines)
    assert any(line.startswith(f"report: {report_json}") for line in lines)
    for phase in ("cluster", "blocks", "reduction", "metrics", "writing"):
        assert any(line.startswith(f"{phase}: done in ") for line in lines), phase

    key = index_id(str(data))
    (table,) = artifacts(server, f"hashdist-metrics-{key}")
    assert json.loads(table["data"]) == rounded_rows(report) and table["data"].count(".") > 10
    assert json.loads(table["data"])[0] == {"metric": "mAP", **{k: round(v, 4) for k, v in m.items()}}
    (link,) = artifacts(server, f"hashdist-report-{key}")
    page = tmp_path / out_name / "report.html"
    assert link["data"] == f"[{markdown_text(str(page))}]({file_link(page)})"
    assert file_link(page).startswith("file:///") and "(javascript" not in link["data"]

    until(lambda: events(server, "prefect.automation.triggered", f"prefect.automation.{fires}"), "the trigger")
    assert not events(server, "prefect.automation.triggered", f"prefect.automation.{stays}")


def test_a_drop_in_history_is_an_event_of_the_same_index(server, tmp_path):
    """The nightly case: the codes at one path change, the index (its key, its resource) stays; the drop is an
    event, the history artifact is keyed by the index, and each dataset has its own key."""
    data = synth(tmp_path / "nightly.zarr")
    EVALUATED.append(str(data))
    history = tmp_path / "history"
    assert hashdist(server, tmp_path, "evaluate", data, "--out", "r1", "--history", history, "--no-cache",
                    "--no-html", "--quiet").returncode == 0
    degrade(data, tmp_path)
    second = hashdist(server, tmp_path, "evaluate", data, "--out", "r2", "--history", history, "--no-cache",
                      "--no-html", "--quiet", "--json")
    assert second.returncode == 3 and second.stderr.startswith("mAP dropped significantly"), second.stderr
    assert json.loads(second.stdout)["format"] == "hashdist-report"  # --json prints the report alone
    resource = f"hashdist.index.{index_id(str(data))}"
    (dropped,) = until(lambda: events(server, "hashdist.evaluation.dropped", resource), "the dropped event")
    assert dropped["payload"]["verdict"]["message"] == second.stderr.strip()
    assert dropped["payload"]["report"] == str(tmp_path / "r2" / "report.json")
    assert len(until(lambda: events(server, "hashdist.evaluation.completed", resource), "completed")) == 2
    key = index_id(str(data))
    versions = artifacts(server, f"hashdist-metrics-{key}")
    assert len(versions) == 2 and versions[0]["description"] != versions[1]["description"]  # two fingerprints
    assert "DROP" in artifacts(server, f"hashdist-history-{key}")[-1]["data"]
    keys = {a["key"] for a in artifacts(server, "hashdist-metrics-")}
    assert keys == {f"hashdist-metrics-{index_id(p)}" for p in EVALUATED}  # one key per dataset


def test_the_threshold_automation_file_is_valid():
    from prefect.events.schemas.automations import AutomationCore

    spec = yaml.safe_load((ROOT / "deploy" / "automation-threshold.yaml").read_text())
    AutomationCore.model_validate(spec)
    assert spec["trigger"]["match"]["hashdist.measure.map"] == below("0.70")
    assert spec["trigger"]["match"]["prefect.resource.id"] == \
        f"hashdist.index.{index_id('/srv/hashdist/datasets/production.zarr')}"
    deployed = yaml.safe_load((ROOT / "deploy" / "prefect.yaml").read_text())["deployments"][0]["parameters"]
    assert deployed["dataset"] == "/srv/hashdist/datasets/production.zarr"


def test_bad_input_inside_the_run_is_one_error_line_in_the_log_and_on_the_terminal(server, tmp_path):
    """A chunk that fails its checksum, found by a task: the terminal's one line, and the same line at ERROR in the
    run's log (and nothing else of hashdist's on the terminal)."""
    data = Path(make_dataset(tmp_path, name="corrupt.zarr", n_db=300, n_q=10, nbits=8))
    chunk = sorted((data / "database" / "codes").rglob("c/*/*"))[0]
    chunk.write_bytes(chunk.read_bytes()[:-1] + bytes([chunk.read_bytes()[-1] ^ 0xFF]))
    run = hashdist(server, tmp_path, "evaluate", data, "--out", "r", "--no-cache")
    (line,) = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 2 and line.startswith("hashdist evaluate: error: ") and "database/codes" in line
    (flow_run,) = [r for r in api(server, "flow_runs/filter", {}) if r["parameters"]["dataset"] == str(data)]

    def errors():
        logs = api(server, "logs/filter", {"logs": {"flow_run_id": {"any_": [flow_run["id"]]},
                                                    "level": {"ge_": 40}}, "limit": 50})
        return [entry["message"] for entry in logs if entry["message"].startswith("hashdist evaluate: error: ")]

    assert until(errors, "the run's error line") == [line]


def test_block_progress_is_logged_every_period_while_the_blocks_run(monkeypatch):
    from flows.observe import ProgressLog
    from hashdist import progress

    class Lines(list):
        def info(self, line):
            self.append(line)

    monkeypatch.setattr(progress, "PERIOD_S", 0.1)
    log, started = Lines(), time.monotonic()
    with progress.progress_bar(4, False) as bar, ProgressLog(log, bar):
        for _ in range(4):
            time.sleep(0.12)
            bar.update(1)
    elapsed = time.monotonic() - started
    assert 2 <= len(log) <= elapsed / 0.1 + 1, log  # at most one line a period
    assert all(line.startswith("blocks: ") and " of 4 done after " in line for line in log)
    with progress.progress_bar(4, False) as bar, ProgressLog(log := Lines(), bar):
        bar.update(4)
    assert log == []  # none for a run shorter than a period
