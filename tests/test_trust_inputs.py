"""Issue #50, points 5, 6 and 8: runs without a relevant item write their report; sizes that would exhaust memory
are refused in one line or bounded; malformed dataset and history attributes are refused in one line naming the
file and the key. Every case runs the real CLI on real files (hand-edited zarr.json included)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from hashdist.cli import main
from tests.conftest import assert_refused

N_DB, N_Q, NBITS = 200, 10, 8


def _inputs(directory):
    """Codes, labels and features as .npy files: database labels 0..2, query labels 7 (shared by no item)."""
    rng = np.random.default_rng(5)
    arrays = {"db": rng.integers(0, 2, (N_DB, NBITS)).astype(np.uint8),
              "q": rng.integers(0, 2, (N_Q, NBITS)).astype(np.uint8),
              "dbl": rng.integers(0, 3, N_DB), "ql": np.full(N_Q, 7), "dbf": rng.random((N_DB, 4)),
              "qf": rng.random((N_Q, 4)) + 5.0}
    paths = {}
    for name, array in arrays.items():
        paths[name] = str(directory / f"{name}.npy")
        np.save(paths[name], array)
    return paths


def _explicit(directory, grades) -> str:
    """An explicit ground truth .npz: every query lists database items 1, 5 and 9 with ``grades``."""
    path = directory / "relevant.npz"
    np.savez(path, indptr=np.arange(0, 3 * N_Q + 1, 3), indices=np.tile([1, 5, 9], N_Q),
             grades=np.resize(np.asarray(grades, dtype=np.int64), 3 * N_Q))
    return str(path)


def no_relevant_dataset(directory, case: str) -> tuple[str, list[str]]:
    """A dataset in which no query has a relevant item, and the evaluate options that make it so."""
    p, out = _inputs(directory), str(directory / f"{case}.zarr")
    if case == "unshared_labels":
        assert main(["ingest", "--db-codes", p["db"], "--query-codes", p["q"], "--db-labels", p["dbl"],
                     "--query-labels", p["ql"], "--out", out]) == 0
        return out, []
    if case == "zero_grades":
        assert main(["ingest", "--db-codes", p["db"], "--query-codes", p["q"], "--query-relevant",
                     _explicit(directory, 0), "--out", out]) == 0
        return out, []
    assert main(["ingest", "--db-codes", p["db"], "--query-codes", p["q"], "--db-labels", p["dbl"], "--query-labels",
                 p["ql"], "--db-features", p["dbf"], "--query-features", p["qf"], "--out", out]) == 0
    assert main(["groundtruth", out, "--method", "epsilon_ball", "--epsilon", "0", "--engine", "local", "--quiet",
                 "--no-cache"]) == 0
    return out, ["--relevance", "explicit"]


def _check_no_relevant_report(out, total=N_Q):
    """The report says every mean is undefined (null), every micro count 0, and the page says why near the
    headline."""
    report = json.loads((out / "report.json").read_text())
    assert report["queries"] == {"total": total, "evaluated": 0, "without_relevant": total}
    m = report["metrics"]
    assert m["map"] == {"expected": None, "best": None, "worst": None}
    assert all(v["expected"] is None for v in m["precision_at_k"].values())
    assert all(v["expected"] is None for v in m["ndcg_at_k"].values())
    assert m["auc"]["expected"] is None
    assert all(v == {"precision": 0.0, "recall": 0.0, "f_beta": 0.0, "tp": 0, "fp": 0, "fn": 0}
               for v in m["micro_at_radius"].values())
    assert m["auprc"] == {"step": 0.0, "trapezoid": 0.0} and m["pr_curve"] == []
    page = (out / "report.html").read_text()
    headline = page[page.index("<section class='headline'>"):page.index("</section>")]
    assert f"No query has a relevant database item: all {total} queries have R = 0" in headline
    assert "mAP n/a</b>: undefined" in headline
    assert 'id="fig-code_usage"' in page and 'id="fig-precision_at_n"' not in page


@pytest.mark.parametrize("case", ["unshared_labels", "epsilon_zero", "zero_grades"])
def test_a_run_without_relevant_items_writes_its_report(tmp_path, capsys, case):
    """Point 5: each of these made evaluate exit 1 with a traceback (a log-scale plot of an empty series)."""
    dataset, options = no_relevant_dataset(tmp_path, case)
    out = tmp_path / "report"
    capsys.readouterr()
    assert main(["evaluate", dataset, "--out", str(out), "--engine", "local", "--no-cache", "--quiet",
                 *options]) == 0
    printed = capsys.readouterr()
    assert "Traceback" not in printed.err
    assert "No query has a relevant database item" in printed.out
    _check_no_relevant_report(out)


def test_counted_as_zero_the_page_says_so(tmp_path, capsys):
    """With --empty-queries zero every mean is 0 (AUC undefined), and the page says why."""
    dataset, _ = no_relevant_dataset(tmp_path, "unshared_labels")
    out = tmp_path / "report"
    assert main(["evaluate", dataset, "--out", str(out), "--engine", "local", "--no-cache", "--quiet",
                 "--empty-queries", "zero"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["metrics"]["map"] == {"expected": 0.0, "best": 0.0, "worst": 0.0}
    assert report["metrics"]["auc"]["expected"] is None
    assert "each counts as 0 (--empty-queries zero)" in (out / "report.html").read_text()


def test_a_flow_run_without_relevant_items_writes_its_report(tmp_path, cli_env):
    """Point 5 with the default engine (Prefect + Dask), as a user runs it: a separate process."""
    dataset, options = no_relevant_dataset(tmp_path, "unshared_labels")
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "hashdist.cli", "evaluate", dataset, "--out", str(out), "--quiet",
                           *options], env=cli_env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    _check_no_relevant_report(out)


# -- point 6: sizes that would exhaust memory ----------------------------------------------------------------------


@pytest.fixture
def labelled(tmp_path):
    """A class-labelled dataset of N_DB items (labels 0..2 on both sides) and its label files."""
    p = _inputs(tmp_path)
    np.save(p["ql"], np.random.default_rng(6).integers(0, 3, N_Q))
    out = str(tmp_path / "labelled.zarr")
    assert main(["ingest", "--db-codes", p["db"], "--query-codes", p["q"], "--db-labels", p["dbl"],
                 "--query-labels", p["ql"], "--out", out]) == 0
    return out, p


K_MEASURES = ("map_at_k", "precision_at_k", "recall_at_k", "ndcg_at_k", "ndcg_structhash_at_k")


def test_k_beyond_the_database_is_the_database_size(tmp_path, labelled):
    """K = 10^12 (and 10^30) on 200 items ran out of memory (an array of K discounts); K > N behaves as K = N,
    reported under the K asked for. P@K at K > N is R/N per query, from the label files."""
    dataset, p = labelled
    huge = [10**12, 10**30]
    out = tmp_path / "report"
    assert main(["evaluate", dataset, "--out", str(out), "--engine", "local", "--no-cache", "--quiet", "--k",
                 str(N_DB), *map(str, huge), "--convention", "hashnet", "--convention", "dcmh_topk"]) == 0
    report = json.loads((out / "report.json").read_text())
    m, conventions = report["metrics"], report["conventions"]
    for k in map(str, huge):
        for key in K_MEASURES:
            assert m[key][k] == m[key][str(N_DB)], (key, k)
        for name in ("hashnet", "dcmh_topk"):
            assert conventions[name]["map_at_k"][k] == conventions[name]["map_at_k"][str(N_DB)]
    R = (np.load(p["ql"])[:, None] == np.load(p["dbl"])[None, :]).sum(axis=1)
    assert m["precision_at_k"][str(10**12)]["expected"] == pytest.approx(np.mean(R[R > 0] / N_DB), abs=1e-12)
    assert (out / "report.html").exists()


def test_compare_with_k_beyond_the_database(tmp_path, labelled):
    dataset, _ = labelled
    out = tmp_path / "cmp"
    assert main(["compare", "--method", f"a={dataset}", "--method", f"b={dataset}", "--out", str(out), "--engine",
                 "local", "--no-cache", "--k", str(10**12)]) == 0
    assert json.loads((out / "comparison.json").read_text())["format"] == "hashdist-comparison"


# -- point 8: malformed dataset and history attributes --------------------------------------------------------------


def _edit_json(path, edit):
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document))


def _attrs(edit):
    return lambda document: edit(document["attributes"])


DATASET_DAMAGE = [  # (file in the dataset, edit of its JSON or replacement text, the key the one line names)
    ("zarr.json", _attrs(lambda a: a.update(relevance=["multilabel"])), "attribute n_labels"),  # was AxisError
    ("zarr.json", _attrs(lambda a: a.update(relevance=[["class"]])), "attribute relevance"),
    ("zarr.json", _attrs(lambda a: a.update(relevance="class")), "attribute relevance"),
    ("zarr.json", _attrs(lambda a: a["fingerprints"].pop("database/labels")),  # was KeyError
     "attribute fingerprints has no entry 'database/labels'"),
    ("zarr.json", _attrs(lambda a: a.update(nbits=True)), "attribute nbits must be an integer"),  # was --radius
    ("zarr.json", _attrs(lambda a: a.update(nbits="8")), "attribute nbits must be an integer"),
    ("zarr.json", _attrs(lambda a: a["fingerprints"]["database/codes"].update(rows="200")),
     "attribute fingerprints['database/codes'].rows"),
    ("zarr.json", _attrs(lambda a: a["fingerprints"]["queries/codes"].update(chunks=[1])),
     "attribute fingerprints['queries/codes'].chunks"),
    ("zarr.json", _attrs(lambda a: a.update(modalities="image")), "attribute modalities"),
    ("database/codes/zarr.json", "{not json", "database/codes/zarr.json: unreadable array metadata"),  # was JSON...
    ("database/labels/zarr.json", lambda d: d.update(data_type="float64"),
     "database/labels/zarr.json: class labels must be 1-D integers"),
]


@pytest.mark.parametrize("file, damage, needle", DATASET_DAMAGE)
def test_malformed_dataset_attributes_are_refused_naming_file_and_key(tmp_path, capsys, labelled, file, damage,
                                                                      needle):
    """Each hand edit gave a traceback (AxisError, KeyError, JSONDecodeError), a wrong blame (--radius) or, with
    float labels, a silent run; now one line naming the file and the key, exit 2, nothing written."""
    dataset, _ = labelled
    path = tmp_path / "labelled.zarr" / file
    if isinstance(damage, str):
        path.write_text(damage)
    else:
        _edit_json(path, damage)
    out = tmp_path / "report"
    line = assert_refused(capsys, ["evaluate", dataset, "--out", out, "--engine", "local", "--no-cache"], needle,
                          out)
    assert str(path.parent / "zarr.json") in line or str(path) in line


@pytest.fixture
def history(tmp_path, labelled):
    """A history store of two evaluate --history runs of the labelled dataset."""
    dataset, _ = labelled
    store = tmp_path / "history"
    for _ in range(2):
        assert main(["evaluate", dataset, "--out", str(tmp_path / "run"), "--engine", "local", "--no-cache",
                     "--quiet", "--no-html", "--overwrite", "--history", str(store)]) == 0
    return store


HISTORY_DAMAGE = [
    (lambda e: e["metrics"]["map"].update(expected="0.5"), "key metrics.map.expected has the wrong type"),  # TypeError
    (lambda e: e.pop("metrics"), "key metrics.map.expected is missing"),  # was KeyError
    (lambda e: e.update(time=5), "key time has the wrong type"),
    (lambda e: e.update(time="yesterday"), "key time is not an ISO 8601 time"),
    (lambda e: e["query_set"].update(n_queries="10"), "key query_set.n_queries has the wrong type"),
    (lambda e: e["dataset"].update(fingerprint=None), "key dataset.fingerprint has the wrong type"),
    (lambda e: e["metrics"].update(mlgap={"radius": 2}), "key metrics.mlgap is missing"),
    (lambda e: e.update(settings=[1]), "key settings has the wrong type"),
]


@pytest.mark.parametrize("damage, needle", HISTORY_DAMAGE)
def test_malformed_history_entries_are_refused_naming_file_and_key(tmp_path, capsys, history, damage, needle):
    run = sorted(p for p in (history / "runs").iterdir() if p.is_dir())[-1]
    _edit_json(run / "zarr.json", _attrs(damage))
    page = tmp_path / "page.html"
    line = assert_refused(capsys, ["history", history, "--out", page], needle, page)
    assert f"{run / 'zarr.json'}: key" in line


def test_history_arrays_that_disagree_are_refused(tmp_path, capsys, history):
    """Duplicate query indices would pair the wrong queries (np.intersect1d assumes them distinct)."""
    import zarr

    run = sorted(p for p in (history / "runs").iterdir() if p.is_dir())[-1]
    group = zarr.open_group(str(run), mode="r+")
    query = np.asarray(group["query"][:])
    group["query"][:] = np.full_like(query, query[-1])  # not all 0: zarr would drop the chunk
    assert_refused(capsys, ["history", history], "query indices must be distinct")


def _explicit_dataset(directory, name, grades) -> str:
    p = _inputs(directory)
    out = str(directory / f"{name}.zarr")
    assert main(["ingest", "--db-codes", p["db"], "--query-codes", p["q"], "--query-relevant",
                 _explicit(directory, grades), "--out", out]) == 0
    return out


@pytest.mark.parametrize("grade", [10**6, 2**62])
def test_huge_grades_are_refused_naming_max_grade_and_capped_with_it(tmp_path, capsys, grade):
    """Grades of 10^6 took 3.5 GB (a grade axis of 10^6 + 1 columns), 2^62 gave 'array is too big', and
    --max-grade 3 did not help. Now refused in one line naming --max-grade; with it, the run equals one whose grades
    are G (the cap's definition) and reports the pairs it changed."""
    dataset = _explicit_dataset(tmp_path, "huge", [1, grade, 2])
    out = tmp_path / "report"
    assert_refused(capsys, ["evaluate", dataset, "--out", out, "--engine", "local", "--no-cache"],
                   f"explicit grades up to {grade:,}, above 255, the largest grade counted uncapped; pass --max-grade",
                   out)
    assert_refused(capsys, ["evaluate", dataset, "--out", out, "--engine", "local", "--max-grade", "256"],
                   "--max-grade must be an integer in 1..255", out)
    assert main(["evaluate", dataset, "--out", str(out), "--engine", "local", "--no-cache", "--quiet", "--max-grade",
                 "3"]) == 0
    capped = json.loads((out / "report.json").read_text())
    (tmp_path / "three").mkdir()
    same = _explicit_dataset(tmp_path / "three", "three", [1, 3, 2])
    assert main(["evaluate", same, "--out", str(tmp_path / "same"), "--engine", "local", "--no-cache", "--quiet"]) == 0
    want = json.loads((tmp_path / "same" / "report.json").read_text())
    assert capped["metrics"] == want["metrics"]
    assert capped["grades"] == {"largest": grade, "cap": 3, "relevant_pairs_capped": N_Q}


def test_split_of_too_many_items_is_refused_naming_the_limit(tmp_path, capsys):
    """--n-items 10^11 ran out of memory (an int64 per item, several times over); now one line with the limit."""
    out = tmp_path / "splits.zarr"
    assert_refused(capsys, ["split", "--n-items", 10**11, "--out", out], "--n-items must be an integer in "
                   "1..1073741824", out)


def test_a_run_over_tasks_without_relevant_items_says_why_per_task(tmp_path, capsys):
    """A dataset with modalities whose query labels no database item has: the page names each task's reason."""
    p = _inputs(tmp_path)
    dataset, out = tmp_path / "modal.zarr", tmp_path / "report"
    assert main(["ingest", "--db-codes", f"image={p['db']}", "--db-codes", f"text={p['db']}", "--query-codes",
                 f"image={p['q']}", "--query-codes", f"text={p['q']}", "--db-labels", p["dbl"], "--query-labels",
                 p["ql"], "--out", str(dataset)]) == 0
    assert main(["evaluate", str(dataset), "--out", str(out), "--engine", "local", "--no-cache", "--quiet"]) == 0
    page = (out / "report.html").read_text()
    for task in ("image→text", "text→image"):
        assert f"<b>{task}: No query has a relevant database item" in page
