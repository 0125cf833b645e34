"""The Prefect flow on real Dask clusters gives exactly the in-process result."""

import json

import pytest

from hashdist.api import evaluate_local

pytestmark = pytest.mark.usefixtures("prefect_api")


def _metrics(evaluation):
    return json.dumps(evaluation.report["metrics"], sort_keys=True)


def test_flow_on_local_cluster_equals_single_process(class_dataset, tmp_path):
    from flows.evaluate import run_evaluation

    local = evaluate_local(class_dataset, cache=False)
    flow = run_evaluation(class_dataset, cache=tmp_path / "cache", query_block_rows=16, db_block_rows=500,
                          out=tmp_path / "report")
    assert _metrics(flow) == _metrics(local)
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["blocks"] == {"total": 5 * 6, "computed": 30, "cached": 0, "collapsed": 0, "distinct_fraction": 1.0,
                                "computed_pairs": 70 * 3000}
    assert set(report["timing"]) == {"startup_s", "compute_s", "reduce_s", "metrics_s", "write_s", "wall_s"}
    assert report["throughput"]["pairs"] == 70 * 3000
    rerun = run_evaluation(class_dataset, cache=tmp_path / "cache", query_block_rows=16, db_block_rows=500)
    assert rerun.report["blocks"]["computed"] == 0
    assert _metrics(rerun) == _metrics(local)


def test_code_counts_are_plain_dask_tasks_and_every_way_equals_single_process(class_dataset, monkeypatch):
    """The histogram shares are the only Prefect tasks (one per cluster thread, fewer with fewer blocks): every pass
    of code counts, the first included, runs as plain Dask tasks, whose results go once counted (a Prefect task's
    state held its codes to the run's end, so memory grew with the database). Exact every way, with one pass or
    several (the later ones reading the rows the first set aside)."""
    import flows.evaluate as evaluate_module

    submitted = []
    real = evaluate_module.histogram_task.submit

    def submit(*args, **kwargs):
        submitted.append(evaluate_module.histogram_task.name)
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluate_module.histogram_task, "submit", submit)
    local = _metrics(evaluate_local(class_dataset, cache=False))
    cases = [
        ({}, 1),  # one histogram block
        ({"query_block_rows": 35, "db_block_rows": 1000}, 2),
        ({"query_block_rows": 35}, 2),  # one database block, two query blocks
        ({"query_block_rows": 35, "db_block_rows": 1000, "code_parts": 9}, 2),  # three passes of code counts
    ]
    for options, shares in cases:
        submitted.clear()
        assert _metrics(evaluate_module.run_evaluation(class_dataset, cache=False, threads=2, **options)) == local
        assert submitted == ["histogram-blocks"] * shares, options
    assert not [name for name in vars(evaluate_module) if "count" in name and name.endswith("_task")]


def test_flow_on_external_loopback_cluster_equals_single_process(class_dataset, loopback_cluster):
    from flows.evaluate import run_evaluation

    address, _ = loopback_cluster
    local = evaluate_local(class_dataset, cache=False)
    remote = run_evaluation(class_dataset, cache=False, address=address, query_block_rows=32, db_block_rows=1000)
    assert _metrics(remote) == _metrics(local)
    assert remote.report["blocks"]["computed"] == remote.report["blocks"]["total"] == 3 * 3


def test_flow_publishes_metric_table_and_report_link_artifacts(class_dataset, tmp_path):
    """Keyed by the index, the table rounded to 4 decimals (report.json keeps every digit), the report an absolute
    file:// link."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.evaluate import run_evaluation
    from flows.observe import file_link, index_id

    ev = run_evaluation(class_dataset, cache=False, out=tmp_path / "report")
    index = index_id(class_dataset)

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[f"hashdist-metrics-{index}", f"hashdist-report-{index}"])))

    artifacts = {}
    for a in sorted(asyncio.run(read()), key=lambda a: a.created):  # the newest version of each key wins
        artifacts[a.key] = a
    assert set(artifacts) == {f"hashdist-metrics-{index}", f"hashdist-report-{index}"}
    table = artifacts[f"hashdist-metrics-{index}"].data
    table = json.loads(table) if isinstance(table, str) else table
    assert table[0]["metric"] == "mAP" and table[0]["expected"] == round(ev.report["metrics"]["map"]["expected"], 4)
    assert f"({file_link(tmp_path / 'report' / 'report.html')})" in artifacts[f"hashdist-report-{index}"].data


def test_a_cli_run_checks_its_options_against_the_dataset_once(class_dataset, tmp_path, monkeypatch):
    """The CLI resolves the options before any cluster starts and hands the run to its flow run: one resolve
    (one opening of the dataset and one digest of its blocks) per run, whatever the engine."""
    from hashdist.cli import main
    from hashdist.options import EvaluateOptions

    calls = []
    real = EvaluateOptions.resolve

    def counted(self, dataset):
        calls.append(dataset)
        return real(self, dataset)

    monkeypatch.setattr(EvaluateOptions, "resolve", counted)
    for engine in ("flow", "local"):
        calls.clear()
        out = tmp_path / engine
        assert main(["evaluate", class_dataset, "--out", str(out), "--engine", engine, "--no-cache", "--quiet",
                     "--no-html"]) == 0
        assert [getattr(d, "url", d) for d in calls] == [class_dataset], engine  # a path, or the dataset opened
