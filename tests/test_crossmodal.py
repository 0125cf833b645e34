"""Cross-modal datasets: codes per modality, tasks a->b, each task exactly its pair evaluated on its own.

A dataset with modalities (``--query-codes image=... --query-codes text=...``) evaluates the tasks a->b it is
asked for (default the cross ones) in one run; every task's numbers must be bit-identical to the pair
(queries' a codes, database's b codes) ingested as a unimodal dataset, whatever the engine, the cache,
the input path (files, in-memory dicts, a streaming Evaluator) or the growth of the database (--append).
"""

import json
from pathlib import Path

import numpy as np
import pytest

import hashdist
from hashdist.api import evaluate_local
from hashdist.arrays import Evaluator, evaluate_codes
from hashdist.cli import main
from hashdist.data.dataset import open_dataset
from hashdist.data.ingest import append, ingest
from hashdist.errors import InputError
from hashdist.report.evaluation import json_safe
from tests.conftest import assert_refused

MODALITIES = ("image", "text")
CROSS = ("image->text", "text->image")
ALL_TASKS = (*CROSS, "image->image", "text->text")
SAME = ("metrics", "queries", "conventions", "code_usage")  # what a task shares with its pair's own report
OPTIONS = {"k": [5, 50], "conventions": ["deephash"], "query_block_rows": 8, "db_block_rows": 100}
CLI_OPTIONS = ["--k", "5", "50", "--convention", "deephash", "--query-block-rows", "8", "--db-block-rows", "100"]
CHUNKS = {"chunk_rows": 100, "query_chunk_rows": 8}


# -- inputs -------------------------------------------------------------------

def modal_arrays(*, n_db=300, n_q=24, nbits=7, kind="class", seed=0) -> dict:
    """Codes per side and modality with heavy ties (few bits): the database in {-1,+1}, the queries in {0,1};
    labels shared by the modalities (classes, or multi-hot with 5 concepts)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for m in MODALITIES:
        arrays[f"D_{m}"] = rng.integers(0, 2, (n_db, nbits)).astype(np.int8) * 2 - 1
        arrays[f"Q_{m}"] = rng.integers(0, 2, (n_q, nbits)).astype(np.uint8)
    if kind == "class":
        arrays["DL"], arrays["QL"] = rng.integers(0, 4, n_db), rng.integers(0, 4, n_q)
    else:
        arrays["DL"] = (rng.random((n_db, 5)) < 0.3).astype(np.uint8)
        arrays["QL"] = (rng.random((n_q, 5)) < 0.3).astype(np.uint8)
    return arrays


def save(directory: Path, arrays: dict) -> dict:
    """Each array as ``<name>.npy`` in ``directory``: {name: path}."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, arr in arrays.items():
        paths[name] = str(directory / f"{name}.npy")
        np.save(paths[name], arr)
    return paths


def ingest_modal_argv(p: dict, out, db="D", labels=("QL", "DL")) -> list[str]:
    """`hashdist ingest` of both modalities on both sides (``db``: the prefix of the database's files)."""
    argv = ["ingest", "--out", str(out), "--chunk-rows", "100", "--query-chunk-rows", "8"]
    for m in MODALITIES:
        argv += ["--query-codes", f"{m}={p[f'Q_{m}']}", "--db-codes", f"{m}={p[f'{db}_{m}']}"]
    return argv + ["--query-labels", p[labels[0]], "--db-labels", p[labels[1]]]


def ingest_modal(p: dict, out, db="D") -> Path:
    assert main(ingest_modal_argv(p, out, db)) == 0
    return Path(out)


def pair_report(p: dict, task: str, directory: Path) -> dict:
    """The report (as JSON reads it) of task a->b's pair ingested as a dataset without modalities."""
    a, b = task.split("->")
    out = directory / f"pair-{a}-{b}.zarr"
    if not out.exists():
        ingest(out, p[f"D_{b}"], p[f"Q_{a}"], db_labels=p["DL"], query_labels=p["QL"], **CHUNKS)
    report = evaluate_local(out, cache=False, **OPTIONS).report
    assert "tasks" not in report and "task_mean" not in report  # a unimodal report is as it always was
    return as_json(report)


def as_json(report: dict) -> dict:
    return json.loads(json.dumps(json_safe(report)))


def assert_task_is_its_pair(report: dict, task: str, pair: dict) -> None:
    """The task's metrics, queries, conventions and code usage are the pair's, bit for bit (as JSON)."""
    for key in SAME:
        mine, theirs = json.dumps(report["tasks"][task][key], sort_keys=True), json.dumps(pair[key], sort_keys=True)
        assert mine == theirs, f"{task}: {key} differs from the pair evaluated alone"


def evaluate_cli(dataset, out, *extra) -> dict:
    assert main(["evaluate", str(dataset), "--out", str(out), "--engine", "local", "--quiet", *CLI_OPTIONS,
                 *extra]) == 0
    return json.loads((Path(out) / "report.json").read_text())


@pytest.fixture(scope="module")
def modal(tmp_path_factory):
    """A class-labelled dataset with modalities image and text (300 items, 24 queries, 7 bits) and its files."""
    root = tmp_path_factory.mktemp("modal")
    p = save(root / "in", modal_arrays())
    return {"root": root, "files": p, "dataset": ingest_modal(p, root / "modal.zarr")}


# -- 1. every task is its pair ------------------------------------------------

@pytest.mark.parametrize("kind", ["class", "multilabel"])
def test_each_task_equals_its_pair_ingested_alone_local_engine(tmp_path, kind):
    p = save(tmp_path / "in", modal_arrays(kind=kind, nbits=6 if kind == "class" else 8, seed=3))
    dataset = ingest_modal(p, tmp_path / "modal.zarr")
    assert open_dataset(dataset).modalities == {"database": MODALITIES, "queries": MODALITIES}
    argv = [x for task in ALL_TASKS for x in ("--task", task)]
    report = evaluate_cli(dataset, tmp_path / "report", "--no-cache", "--no-html", *argv)
    assert list(report["tasks"]) == list(ALL_TASKS)
    for task in ALL_TASKS:
        assert_task_is_its_pair(report, task, pair_report(p, task, tmp_path))
    assert report["tasks"]["image->text"]["conventions"]["deephash"]["map_at_k"]["50"]  # not vacuous
    assert report["tasks"]["image->text"]["metrics"] != report["tasks"]["text->image"]["metrics"]


@pytest.mark.usefixtures("prefect_api")
def test_one_flow_run_over_both_tasks_equals_the_pairs(modal, tmp_path):
    from flows.evaluate import run_evaluation

    evaluation = run_evaluation(modal["dataset"], cache=False, out=tmp_path / "report", html=False, **OPTIONS)
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["engine"]["kind"] == "prefect-dask" and list(report["tasks"]) == list(CROSS)
    for task in CROSS:
        assert_task_is_its_pair(report, task, pair_report(modal["files"], task, tmp_path))
    assert as_json(evaluation.report)["task_mean"] == report["task_mean"]
    rows = metric_artifact(modal["dataset"])
    assert {row.get("task") for row in rows} == set(CROSS)  # the Prefect table: a row per task and measure
    rounded = {k: round(v, 4) for k, v in report["tasks"]["text->image"]["metrics"]["map"].items()}
    assert {"task": "text->image", "metric": "mAP", **rounded} in rows


def metric_artifact(dataset) -> list[dict]:
    """The rows of the newest "hashdist-metrics-<index>" table artifact of ``dataset``."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.observe import index_id

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"hashdist-metrics-{index_id(dataset)}"])))

    table = max(asyncio.run(read()), key=lambda a: a.created).data
    return json.loads(table) if isinstance(table, str) else table


@pytest.mark.usefixtures("prefect_api")
def test_history_of_a_modal_dataset_is_refused_before_any_flow_runs(modal, tmp_path, monkeypatch):
    import flows.evaluate as module

    monkeypatch.setattr(module, "task_runner", lambda **kw: pytest.fail("a cluster was set up for bad input"))
    with pytest.raises(InputError, match="--history: not available for a dataset with modalities"):
        module.run_evaluation(modal["dataset"], cache=False, history=tmp_path / "history")
    assert not (tmp_path / "history").exists()


def test_evaluate_codes_with_dicts_equals_the_pairs_arrays():
    x = modal_arrays(n_db=250, n_q=20, nbits=6, kind="multilabel", seed=7)
    q = {m: x[f"Q_{m}"] for m in MODALITIES}
    db = {m: x[f"D_{m}"] for m in MODALITIES}
    report = hashdist.evaluate_codes(q, db, x["QL"], x["DL"], k=[50], tasks=list(ALL_TASKS))
    assert list(report["tasks"]) == list(ALL_TASKS)
    for task in ALL_TASKS:
        a, b = task.split("->")
        pair = as_json(evaluate_codes(q[a], db[b], x["QL"], x["DL"], k=[50]))
        assert_task_is_its_pair(as_json(report), task, pair)
        assert report["tasks"][task]["dataset"]["path"] == "<arrays>"
    default = evaluate_codes(q, db, x["QL"], x["DL"], k=[50])
    assert list(default["tasks"]) == list(CROSS)


def test_evaluator_fed_dict_batches_in_pieces_and_merged_equals_evaluate_codes():
    x = modal_arrays(n_db=250, n_q=20, nbits=6, seed=8)
    q = {m: x[f"Q_{m}"] for m in MODALITIES}
    db = {m: x[f"D_{m}"] for m in MODALITIES}
    whole = as_json(evaluate_codes(q, db, x["QL"], x["DL"], k=[10]))
    left, right = Evaluator(), Evaluator()
    for start in range(0, 250, 60):
        piece = {m: codes[start:start + 60] for m, codes in db.items()}
        (left if start < 120 else right).add_database(piece, x["DL"][start:start + 60])
    for start in range(0, 20, 7):
        piece = {m: codes[start:start + 7] for m, codes in reversed(q.items())}  # modality order does not matter
        (left if start < 10 else right).add_queries(piece, x["QL"][start:start + 7])
    merged = as_json(left.merge(right).compute(k=[10]))
    assert sorted(merged["tasks"]) == sorted(CROSS)  # in the order of the first query batch's modalities
    for task in CROSS:
        assert_task_is_its_pair(merged, task, whole["tasks"][task])
    assert merged["task_mean"] == whole["task_mean"]


# -- 2. the block cache, per task ---------------------------------------------

def test_second_run_computes_no_block_and_one_task_runs_alone(modal, tmp_path):
    cache = ["--cache", str(tmp_path / "cache"), "--no-html"]
    first = evaluate_cli(modal["dataset"], tmp_path / "first", *cache)
    again = evaluate_cli(modal["dataset"], tmp_path / "again", *cache)
    for task in CROSS:
        assert first["tasks"][task]["blocks"]["computed"] == first["tasks"][task]["blocks"]["total"] == 9
        assert again["tasks"][task]["blocks"]["computed"] == 0
        assert again["tasks"][task]["blocks"]["cached"] == 9
        assert again["tasks"][task]["metrics"] == first["tasks"][task]["metrics"]
    assert again["task_mean"] == first["task_mean"]
    alone = evaluate_cli(modal["dataset"], tmp_path / "alone", *cache, "--task", "image->text")
    assert list(alone["tasks"]) == ["image->text"] and alone["parameters"]["tasks"] == ["image->text"]
    assert alone["tasks"]["image->text"]["blocks"]["computed"] == 0  # the same task's blocks, from the cache
    assert alone["tasks"]["image->text"]["metrics"] == first["tasks"]["image->text"]["metrics"]


def test_new_codes_of_one_modality_recompute_only_the_tasks_that_read_them(tmp_path):
    x = modal_arrays(n_db=200, n_q=16, seed=9)
    p = save(tmp_path / "in", x)
    dataset, cache = ingest_modal(p, tmp_path / "modal.zarr"), ["--no-html", "--cache", str(tmp_path / "cache")]
    tasks = [x for t in ("image->image", "image->text", "text->image") for x in ("--task", t)]
    first = evaluate_cli(dataset, tmp_path / "first", *cache, *tasks)
    np.save(p["D_text"], -x["D_text"])  # the database's text codes change (every bit flipped), nothing else
    assert main([*ingest_modal_argv(p, dataset), "--overwrite"]) == 0
    again = evaluate_cli(dataset, tmp_path / "again", *cache, *tasks)
    blocks = {t: again["tasks"][t]["blocks"] for t in again["tasks"]}
    assert blocks["image->image"]["computed"] == 0 and blocks["text->image"]["computed"] == 0
    assert blocks["image->text"]["computed"] == blocks["image->text"]["total"] == 4
    assert again["tasks"]["image->image"]["metrics"] == first["tasks"]["image->image"]["metrics"]
    assert again["tasks"]["image->text"]["metrics"] != first["tasks"]["image->text"]["metrics"]
    assert_task_is_its_pair(again, "image->text", pair_report(p, "image->text", tmp_path))


# -- 3. --append per modality -------------------------------------------------

def _snapshot(directory) -> dict:
    """Every file under ``directory`` with its bytes, and the names beside it (no staged sibling may stay)."""
    directory = Path(directory)
    files = {f.relative_to(directory).as_posix(): f.read_bytes() for f in directory.rglob("*") if f.is_file()}
    return {"files": files, "siblings": sorted(p.name for p in directory.parent.iterdir())}


def test_append_per_modality_equals_one_ingest(tmp_path):
    x = modal_arrays(n_db=330, seed=5)
    x.update({f"H_{m}": x[f"D_{m}"][:170] for m in MODALITIES} | {f"T_{m}": x[f"D_{m}"][170:] for m in MODALITIES})
    x.update(HL=x["DL"][:170], TL=x["DL"][170:])
    p = save(tmp_path / "in", x)
    grown, whole = tmp_path / "grown.zarr", tmp_path / "whole.zarr"
    assert main(ingest_modal_argv(p, grown, db="H", labels=("QL", "HL"))) == 0
    every = ["--no-html", "--cache", str(tmp_path / "cache"), *[x for t in ALL_TASKS for x in ("--task", t)]]
    evaluate_cli(grown, tmp_path / "head", *every)
    tail = [x for m in MODALITIES for x in ("--db-codes", f"{m}={p[f'T_{m}']}")]
    assert main(["ingest", "--append", *tail, "--db-labels", p["TL"], "--out", str(grown)]) == 0
    ingest_modal(p, whole)
    for task in ALL_TASKS:
        assert open_dataset(grown, task).fingerprint == open_dataset(whole, task).fingerprint
    after = evaluate_cli(grown, tmp_path / "after", *every)
    fresh = evaluate_cli(whole, tmp_path / "fresh", *every)
    assert fresh["task_mean"] == after["task_mean"]
    for task in ALL_TASKS:
        # 3 query blocks x 4 database blocks; only the first database block (rows 0-99) was there unchanged
        assert after["tasks"][task]["blocks"]["cached"] == 3 and after["tasks"][task]["blocks"]["total"] == 12
        assert fresh["tasks"][task]["blocks"]["computed"] == 0  # the same content elsewhere: every block cached
        assert fresh["tasks"][task]["metrics"] == after["tasks"][task]["metrics"]
        assert after["tasks"][task]["dataset"]["n_database"] == 330


@pytest.mark.parametrize("codes, needle", [
    (["image={T_image}"], "--db-codes: the dataset's database modalities are image, text"),
    (["{T_image}"], "--db-codes: the dataset's database modalities are image, text; append codes for exactly those "
                    "as NAME=PATH"),
    (["image={T_image}", "text={T_image}", "audio={T_text}"], "--db-codes"),
])
def test_append_refuses_a_missing_modality_or_a_plain_path(tmp_path, capsys, codes, needle):
    x = modal_arrays(n_db=200, seed=6)
    x.update({f"T_{m}": x[f"D_{m}"][:30] for m in MODALITIES}, TL=x["DL"][:30])
    p = save(tmp_path / "in", x)
    dataset = ingest_modal(p, tmp_path / "modal.zarr")
    before, fingerprint = _snapshot(dataset), open_dataset(dataset).fingerprint
    argv = ["ingest", "--append", *[x for c in codes for x in ("--db-codes", c.format(**p))], "--db-labels", p["TL"],
            "--out", dataset]
    assert_refused(capsys, argv, needle)
    assert _snapshot(dataset) == before and open_dataset(dataset).fingerprint == fingerprint
    with pytest.raises(InputError, match="--db-codes"):
        append(dataset, {"image": p["T_image"]}, p["TL"])
    assert _snapshot(dataset) == before


# -- 4. bad input: one line naming the argument, exit 2, nothing written ------

@pytest.fixture(scope="module")
def bad(modal):
    """Files that do not fit the modal dataset's: fewer rows, other widths, wrong label rows."""
    x = modal_arrays()
    return save(modal["root"] / "bad", {
        "Q_text_short": x["Q_text"][:20], "Q_text_wide": np.zeros((24, 9), np.uint8),
        "D_text_wide": np.ones((300, 9), np.int8), "QL_short": x["QL"][:23],
    })


def _swap(argv: list[str], old: str, new: str) -> list[str]:
    """``argv`` with the argument ``old`` replaced by ``new`` (None: dropped with its flag)."""
    i = argv.index(old)
    return argv[:i - 1] + argv[i + 1:] if new is None else [*argv[:i], new, *argv[i + 1:]]


@pytest.mark.parametrize("case, needle", [
    ("rows", "Q_text_short.npy: 20 rows but"),
    ("width", "Q_text_wide.npy: codes have 9 bits but"),
    ("db width", "D_text_wide.npy: codes have 9 bits but"),
    ("one side", "--query-codes and --db-codes: give modalities (NAME=PATH) on both sides or on neither"),
    ("labels", "QL_short.npy: 23 labels but 24 codes"),
    ("name", "--query-codes: modality name '1x' is not an identifier"),
    ("name twice", "--query-codes: modality 'image' is given twice"),
])
def test_ingest_refuses_modalities_that_do_not_fit(modal, bad, tmp_path, capsys, case, needle):
    p = modal["files"]
    argv = ingest_modal_argv(p, tmp_path / "out.zarr")
    argv = {
        "rows": lambda: _swap(argv, f"text={p['Q_text']}", f"text={bad['Q_text_short']}"),
        "width": lambda: _swap(argv, f"text={p['Q_text']}", f"text={bad['Q_text_wide']}"),
        "db width": lambda: _swap(argv, f"text={p['D_text']}", f"text={bad['D_text_wide']}"),
        "one side": lambda: _swap(_swap(argv, f"text={p['D_text']}", None), f"image={p['D_image']}", p["D_image"]),
        "labels": lambda: _swap(argv, p["QL"], bad["QL_short"]),
        "name": lambda: _swap(argv, f"image={p['Q_image']}", f"1x={p['Q_image']}"),
        "name twice": lambda: _swap(argv, f"text={p['Q_text']}", f"image={p['Q_text']}"),
    }[case]()
    assert_refused(capsys, argv, needle, tmp_path / "out.zarr")


@pytest.mark.parametrize("extra, needle", [
    (["--task", "image->audio"], "--task image->audio: the dataset's database have no modality 'audio'"),
    (["--task", "audio->text"], "--task audio->text: the dataset's queries have no modality 'audio'"),
    (["--task", "text-"], "--task 'text-': the shell took '>' as a redirection; quote the task"),
    (["--task", "image"], "--task 'image': expected QUERY_MODALITY->DATABASE_MODALITY"),
    (["--task", "image->text", "--task", "image->text"], "--task: image->text is given twice"),
    (["--task", "image->text", "--task", "image→text"], "--task: image->text is given twice"),
    (["--history", "{tmp}/history"], "--history: not available for a dataset with modalities"),
    (["--distance", "asymmetric"], "--distance asymmetric is not available for a dataset with modalities"),
])
def test_evaluate_refuses_tasks_that_do_not_fit(modal, tmp_path, capsys, extra, needle):
    out = tmp_path / "report"
    argv = ["evaluate", modal["dataset"], "--out", out, "--engine", "local", *[e.format(tmp=tmp_path) for e in extra]]
    assert_refused(capsys, argv, needle, out)
    assert not (tmp_path / "history").exists()


def test_task_on_a_dataset_without_modalities_is_refused(class_dataset, tmp_path, capsys):
    out = tmp_path / "report"
    assert_refused(capsys, ["evaluate", class_dataset, "--out", out, "--engine", "local", "--task", "image->text"],
                   "--task image->text: ", out)
    with pytest.raises(InputError, match="has no modalities"):
        evaluate_local(class_dataset, cache=False, tasks=["image->text"])
    report = hashdist.evaluate(class_dataset, cache=False)
    assert "tasks" not in report and "task_mean" not in report and "task" not in report["parameters"]


def test_the_api_refuses_the_same_input(modal, bad, tmp_path):
    p, dataset = modal["files"], modal["dataset"]
    q = {m: p[f"Q_{m}"] for m in MODALITIES}
    db = {m: p[f"D_{m}"] for m in MODALITIES}
    labels = {"db_labels": p["DL"], "query_labels": p["QL"]}
    out = tmp_path / "out.zarr"
    for codes, needle in [({**q, "text": bad["Q_text_short"]}, "20 rows but"),
                          ({**q, "text": bad["Q_text_wide"]}, "codes have 9 bits"),
                          (p["Q_image"], "on both sides or on neither"),
                          ({"1x": p["Q_image"], "text": p["Q_text"]}, "'1x' is not an identifier")]:
        with pytest.raises(InputError, match=needle):
            ingest(out, db, codes, **labels)
        assert not out.exists()
    with pytest.raises(InputError, match="QL_short.npy: 23 labels but 24 codes"):
        ingest(out, db, q, db_labels=p["DL"], query_labels=bad["QL_short"])
    assert not out.exists()
    for tasks, needle in [(["image->audio"], "no modality 'audio'"), (["text-"], "quote the task"),
                          (["text->image", "text→image"], "given twice")]:
        with pytest.raises(InputError, match=needle):
            evaluate_local(dataset, cache=False, tasks=tasks)


def test_evaluate_codes_refuses_dicts_that_do_not_fit():
    x = modal_arrays(n_db=100, n_q=10)
    q = {m: x[f"Q_{m}"] for m in MODALITIES}
    db = {m: x[f"D_{m}"] for m in MODALITIES}
    cases = [
        ({"my-img": x["Q_image"], "text": x["Q_text"]}, db, {}, "modality name 'my-img' is not an identifier"),
        ({**q, "text": x["Q_text"][:9]}, db, {}, r"query_codes\['text'\]: 9 codes of 7 bits but"),
        (q, {**db, "text": np.ones((100, 8), np.int8)}, {}, r"db_codes\['text'\]: 100 codes of 8 bits"),
        (q, x["D_image"], {}, "on both sides or on neither"),
        (q, db, {"tasks": ["image->audio"]}, "no modality 'audio'"),
        (q, db, {"tasks": ["image->text", "image->text"]}, "given twice"),
        ({}, db, {}, "query_codes: an empty dict"),
    ]
    for queries, database, options, needle in cases:
        with pytest.raises(InputError, match=needle):
            evaluate_codes(queries, database, x["QL"], x["DL"], **options)
    with pytest.raises(InputError, match="query_labels: 9 labels but 10 codes"):
        evaluate_codes(q, db, x["QL"][:9], x["DL"])
    with pytest.raises(InputError, match="--task image->text: <arrays> has no modalities"):
        evaluate_codes(x["Q_image"], x["D_text"], x["QL"], x["DL"], tasks=["image->text"])
    evaluator = Evaluator().add_database(db, x["DL"])
    with pytest.raises(InputError, match="modalities image but earlier batches have image, text"):
        evaluator.add_database({"image": x["D_image"]}, x["DL"])
    with pytest.raises(InputError, match="on both sides or on neither"):
        evaluator.add_queries(x["Q_image"], x["QL"])


# -- 5. the outputs -------------------------------------------------------------

@pytest.fixture(scope="module")
def written(modal, tmp_path_factory):
    """The modal dataset evaluated by the CLI, with report.html: (report.json read, the output directory)."""
    out = tmp_path_factory.mktemp("written") / "report"
    assert main(["evaluate", str(modal["dataset"]), "--out", str(out), "--engine", "local", "--no-cache", "--quiet",
                 *CLI_OPTIONS]) == 0
    return json.loads((out / "report.json").read_text()), out


def test_report_json_and_per_query_arrays(written):
    report, out = written
    assert list(report["tasks"]) == list(CROSS) and report["dataset"]["tasks"] == list(CROSS)
    for task in CROSS:
        assert set(report["tasks"][task]) >= {"metrics", "queries", "conventions", "dataset", "distance", "grades",
                                              "code_usage", "blocks"}
    for key in ("parameters", "provenance", "timing", "engine"):
        assert key in report and key not in report["tasks"]["image->text"]
    maps = [report["tasks"][t]["metrics"]["map"]["expected"] for t in CROSS]
    assert report["task_mean"]["mAP"]["expected"] == float(np.mean(maps))
    import zarr

    per_query = zarr.open_group(str(out / "per_query.zarr"), mode="r")
    assert sorted(per_query.group_keys()) == sorted(CROSS)
    for task in CROSS:
        arrays = dict(per_query[task].arrays())
        assert "ap.expected" in arrays and all(a.shape[0] == 24 for a in arrays.values())
    assert not np.array_equal(per_query["image->text"]["ap.expected"][:], per_query["text->image"]["ap.expected"][:])


def test_terminal_output_shows_a_column_per_task_and_their_mean(modal, tmp_path, capsys):
    capsys.readouterr()
    assert main(["evaluate", str(modal["dataset"]), "--out", str(tmp_path / "r"), "--engine", "local", "--no-cache",
                 "--no-html", "--quiet", *CLI_OPTIONS]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "in 2 tasks (image->text, text->image)" in lines[0]
    header = next(line for line in lines if line.startswith("metric") and "mean" in line)
    assert header.split() == ["metric", "image→text", "text→image", "mean"]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    map_row = next(line for line in lines if line.startswith("mAP "))  # the side-by-side table's, first
    expected = [report["tasks"][t]["metrics"]["map"]["expected"] for t in CROSS]
    assert map_row.split()[1::3] == [f"{v:.4f}" for v in [*expected, report["task_mean"]["mAP"]["expected"]]]
    assert "== image→text ==" in lines and "== text→image ==" in lines


def test_report_page_in_chromium_shows_the_tasks_side_by_side(written, tmp_path):
    from tests.test_html import CHROMIUM, rendered

    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (apt-get install chromium); report.html was not checked in a browser")
    report, out = written
    view = rendered(out / "report.html", tmp_path)
    assert view["images"] == view["decoded"] >= 3
    assert all(view["alts"]) and len(view["alts"]) == view["images"]
    [headline] = [t for t in view["tables"] if t["caption"].startswith("Headline per task")]
    assert headline["header"] == ["metric", "image→text", "text→image", "mean"]
    rows = {row[0]: row[1:] for row in headline["rows"]}
    maps = [report["tasks"][t]["metrics"]["map"]["expected"] for t in CROSS] + [report["task_mean"]["mAP"]["expected"]]
    assert [cell.split()[0] for cell in rows["mAP"]] == [f"{v:.4f}" for v in maps]
    assert "image→text" in view["title"] and "text→image" in view["title"]
    assert "2 tasks" in view["headline"]
    html = (out / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') == view["images"]
