"""`hashdist compare` on datasets with modalities: one comparison per task, and the cross-modal paper table
(a column group per task, I→T and T→I, a column per bit length)."""

import contextlib
import io
import json
import re
from dataclasses import dataclass, replace

import numpy as np
import pytest
from conftest import assert_refused, make_dataset

from hashdist.api import compare, evaluate_prepared, run_compare
from hashdist.cli import main
from hashdist.options import CompareOptions
from hashdist.report.comparison import latex_table, markdown_table, paper_cells
from tests import reference as ref

TASKS = ("image->text", "text->image")
# name -> (dataset, bits, noise): a model at 16 and 32 bits, a weaker one, and a copy of the first (its intervals
# overlap the original's, so daggers must appear)
METHODS = {"itq_x@16": ("m16", 16, 0.08), "itq_x@32": ("m32", 32, 0.08), "cvh@16": ("w16", 16, 0.25),
           "copy@16": ("m16", 16, 0.08)}


def _ingest(argv):
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([str(a) for a in argv]) == 0


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Modal datasets (image and text codes on both sides, the same labels; few classes and bits, so heavy ties)
    written with `hashdist ingest NAME=PATH`, and for each dataset and task the unimodal pair dataset."""
    d = tmp_path_factory.mktemp("crossmodal")
    rng = np.random.default_rng(11)
    n_q, n_db, n_classes = 48, 360, 4
    ql, dbl = rng.integers(0, n_classes, n_q), rng.integers(0, n_classes, n_db)
    np.save(d / "ql.npy", ql)
    np.save(d / "dbl.npy", dbl)
    modal, pairs = {}, {}
    for key, bits, noise in dict.fromkeys(METHODS.values()):
        image = rng.integers(0, 2, (n_classes, bits))
        protos = {"image": image, "text": np.where(rng.random(image.shape) < 0.1, 1 - image, image)}
        files = {}
        for side, labels in (("q", ql), ("db", dbl)):
            for mod, proto in protos.items():
                codes = proto[labels]
                files[side, mod] = d / f"{key}_{side}_{mod}.npy"
                np.save(files[side, mod], np.where(rng.random(codes.shape) < noise, 1 - codes, codes).astype(np.uint8))
        labels_args = ["--query-labels", d / "ql.npy", "--db-labels", d / "dbl.npy"]
        modal[key] = d / f"{key}.zarr"
        _ingest(["ingest", "--out", modal[key], *labels_args,
                 *(x for mod in protos for x in ("--query-codes", f"{mod}={files['q', mod]}")),
                 *(x for mod in protos for x in ("--db-codes", f"{mod}={files['db', mod]}"))])
        for task in TASKS:
            a, b = task.split("->")
            pairs[key, task] = d / f"{key}_{a}_{b}.zarr"
            _ingest(["ingest", "--out", pairs[key, task], "--query-codes", files["q", a], "--db-codes",
                     files["db", b], *labels_args])
    (d / "other").mkdir()
    other = make_dataset(d / "other", n_db=100, n_q=10, nbits=16)  # without modalities, other labels
    return {"dir": d, "modal": modal, "pairs": pairs, "other": other}


def _specs(data, names=METHODS, task=None):
    where = (lambda key: data["modal"][key]) if task is None else (lambda key: data["pairs"][key, task])
    return [f"{name}={where(METHODS[name][0])}" for name in names]


@pytest.fixture(scope="module")
def cli_run(data):
    """`hashdist compare --engine local --latex --markdown` over the modal datasets: (out, printed)."""
    out = data["dir"] / "cmp"
    argv = ["compare", *(f"--method={s}" for s in _specs(data)), "--out", str(out), "--engine", "local",
            "--no-cache", "--permutations", "99", "--seed", "3", "--latex", "--markdown"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(argv) == 0
    return out, printed.getvalue()


def _without_paths(comparison: dict) -> dict:
    """A comparison without what names the datasets (paths, fingerprints of the views or the pair datasets)."""
    c = {k: v for k, v in comparison.items() if k not in ("provenance", "outputs")}
    c["methods"] = {n: {k: v for k, v in m.items() if k not in ("dataset", "fingerprint")}
                    for n, m in comparison["methods"].items()}
    return c


def test_each_task_is_the_unimodal_comparison_of_its_pairs(data, cli_run, tmp_path):
    out, printed = cli_run
    c = json.loads((out / "comparison.json").read_text())
    assert c["format"] == "hashdist-comparison" and c["task_order"] == list(TASKS)
    assert set(c) == {"format", "tasks", "task_order", "provenance", "outputs"} and list(c["tasks"]) == list(TASKS)
    assert printed.index("== image\u2192text ==") < printed.index("== text\u2192image ==") < printed.index(
        "comparison:")
    for task in TASKS:
        single = tmp_path / task.replace("->", "_")
        compare(_specs(data, task=task), cache=False, permutations=99, seed=3, out=single)
        pair = json.loads((single / "comparison.json").read_text())
        assert _without_paths(c["tasks"][task]) == _without_paths(pair)
        methods = c["tasks"][task]["methods"]
        assert [methods[n]["nbits"] for n in METHODS] == [16, 32, 16, 16]
        assert methods["itq_x@16"]["metrics"]["map"]["worst"] < methods["itq_x@16"]["metrics"]["map"]["best"]  # ties
        assert "itq_x@16|copy@16" in c["tasks"][task]["map_order_depends_on_ties"]
    # the views' fingerprints differ by task, and from nothing else
    fp = {t: c["tasks"][t]["methods"]["itq_x@16"]["fingerprint"] for t in TASKS}
    assert fp["image->text"] != fp["text->image"]
    page = (out / "comparison.html").read_text()
    ids = re.findall(r"id=['\"]([^'\"]+)", page)
    assert len(ids) == len(set(ids)) and page.count("<figure") == 2 * 4  # each task's four figures
    assert page.index("id='paper-table'") < page.index("image\u2192text</h2>") < page.index("text\u2192image</h2>")
    assert "http://" not in page and "https://" not in page


def _balanced(tex: str) -> bool:
    depth = 0
    for c in tex.replace(r"\{", "").replace(r"\}", ""):
        depth += {"{": 1, "}": -1}.get(c, 0)
        if depth < 0:
            return False
    return depth == 0


def _check_latex(tex: str, groups: list[tuple[str, int]], columns: int) -> list[list[str]]:
    """The LaTeX table's structure; returns the body rows' cells."""
    assert _balanced(tex) and all(line.count("$") % 2 == 0 for line in tex.splitlines())
    for env in ("table", "tabular"):
        assert tex.count(rf"\begin{{{env}}}") == tex.count(rf"\end{{{env}}}") == 1
    assert rf"\begin{{tabular}}{{l{'r' * columns}}}" in tex
    assert tex.index(r"\toprule") < tex.index(r"\midrule") < tex.index(r"\bottomrule")
    rows = [line for line in tex.splitlines() if line.endswith(r"\\")]
    heading = rows[0]
    assert heading.count("&") == len(groups)
    found = re.findall(r"\\multicolumn\{(\d+)\}\{c\}\{([^{}]*)\}", heading)
    assert found == [(str(n), label) for label, n in groups] and sum(n for _, n in groups) == columns
    starts = np.cumsum([2] + [n for _, n in groups])
    assert re.findall(r"\\cmidrule\(lr\)\{(\d+)-(\d+)\}", tex) == [
        (str(a), str(b - 1)) for a, b in zip(starts[:-1], starts[1:], strict=True)]
    assert all(line.count("&") == columns for line in rows[1:])
    return [[cell.strip() for cell in line[:-2].split("&")] for line in rows[2:]]


def _expected_cells(c: dict, rows: list[str], columns: list[tuple[str, dict]]) -> list[list[tuple]]:
    """(value, bold, dagger) each cell should show: ``columns`` (task, {row: method name}) from the per-task
    reports' mAP expected, worst and best."""
    out = [[] for _ in rows]
    for task, names in columns:
        maps = {row: c["tasks"][task]["methods"][name]["metrics"]["map"] for row, name in names.items()}
        best = max(m["expected"] for m in maps.values())
        for i, row in enumerate(rows):
            if row not in maps:
                out[i].append(None)
                continue
            dagger = any(ref.intervals_overlap(maps[row], maps[other]) for other in maps if other != row)
            out[i].append((f"{maps[row]['expected']:.4f}", maps[row]["expected"] == best, dagger))
    return out


def test_paper_table_by_bit_length(cli_run):
    out, _ = cli_run
    c = json.loads((out / "comparison.json").read_text())
    tex, md = (out / "leaderboard.tex").read_text(), (out / "leaderboard.md").read_text()
    assert latex_table(c) == tex and markdown_table(c) == md
    groups = [("I\u2192T", 2), ("T\u2192I", 2)]
    assert paper_cells(c).groups == tuple(groups)
    latex_rows = _check_latex(tex, [("I$\\to$T", 2), ("T$\\to$I", 2)], 4)
    assert r"\multicolumn{2}{c}{I$\to$T} & \multicolumn{2}{c}{T$\to$I} \\" in tex
    assert "Method & 16 bits & 32 bits & 16 bits & 32 bits" in tex
    assert r"itq\_x" in tex and "itq_x" not in tex.replace(r"itq\_x", "")  # escaped
    assert r"I$\to$T: image queries against the text database; T$\to$I: text queries against the image database" \
        in tex and "expected over all orders of items tied" in tex
    header, rows = ref.markdown_rows(md)
    assert header == ["Method", "I\u2192T 16 bits", "I\u2192T 32 bits", "T\u2192I 16 bits", "T\u2192I 32 bits"]
    groups_order = [row[0] for row in rows]
    assert sorted(groups_order) == ["copy", "cvh", "itq_x"] and [row[0] for row in latex_rows] == [
        g.replace("_", r"\_") for g in groups_order]
    columns = [(task, {g: f"{g}@{b}" for g in groups_order if f"{g}@{b}" in METHODS}) for task in TASKS
               for b in (16, 32)]
    expected = _expected_cells(c, groups_order, columns)
    daggers = 0
    for md_row, tex_row, want in zip(rows, latex_rows, expected, strict=True):
        for md_cell, tex_cell, cell in zip(md_row[1:], tex_row[1:], want, strict=True):
            if cell is None:
                assert md_cell == tex_cell == "-"
                continue
            value, bold, dagger = cell
            assert md_cell == (f"**{value}**" if bold else value) + ("\u2020" if dagger else "")
            assert tex_cell == (rf"\textbf{{{value}}}" if bold else value) + (r"$^\dagger$" if dagger else "")
            daggers += dagger
    assert daggers >= 4  # the copy and its original, in both tasks' 16-bit columns
    assert md.count("\u2020") == daggers + 1 and tex.count(r"$^\dagger$") == daggers + 1  # + once in the caption


@dataclass(frozen=True, kw_only=True)
class _WithConvention(CompareOptions):
    """The compare options with the cross-modal convention dcmh evaluated too (the CLI has no such option)."""

    @property
    def evaluate_options(self):
        return replace(super().evaluate_options, conventions=("dcmh",))


def test_methods_at_one_length_and_task_order(data, tmp_path):
    """Not models at several lengths: a column of mAP per task, in --task order; conventions in the reports change
    nothing."""
    names = ["itq_x@16", "cvh@16", "copy@16"]
    tasks = ["text->image", "image->text"]
    c = compare(_specs(data, names), cache=False, permutations=9, bootstrap=10, tasks=tasks)
    assert c["task_order"] == tasks and list(c["tasks"]) == tasks
    header, rows = ref.markdown_rows(markdown_table(c))
    assert header == ["Method", "T\u2192I mAP", "I\u2192T mAP"]
    order = [row[0] for row in rows]
    assert order == c["tasks"]["text->image"]["ranking"]
    expected = _expected_cells(c, order, [(task, {n: n for n in names}) for task in tasks])
    for row, want in zip(rows, expected, strict=True):
        assert row[1:] == [(f"**{v}**" if bold else v) + ("\u2020" if dagger else "") for v, bold, dagger in want]
    assert [row[0] for row in rows if row[1].endswith("\u2020")] == [n for n in order if n != "cvh@16"]
    tex = latex_table(c)
    _check_latex(tex, [("T$\\to$I", 1), ("I$\\to$T", 1)], 2)
    # the evaluations carry the dcmh convention's mAP: the comparison and its tables are the same
    reports = []

    def evaluate(run):
        evaluation = evaluate_prepared(run, False, None, False, 0.0)
        reports.append(evaluation.report)
        return evaluation

    options = _WithConvention(permutations=9, bootstrap=10, tasks=tasks)
    with_conventions = run_compare(_specs(data, names), options, evaluate, out=tmp_path / "cmp",
                                   tables=("latex", "markdown"))
    assert all("dcmh" in r["conventions"] for r in reports) and len(reports) == 2 * len(names)
    assert latex_table(with_conventions) == tex and markdown_table(with_conventions) == markdown_table(c)
    assert (tmp_path / "cmp" / "comparison.html").exists()


@pytest.mark.parametrize("case,needle", [
    ("mixed", "is a dataset without modalities, but --method itq_x@16="),
    ("mixed_first", "is a dataset with modalities (image, text), but --method itq_x@16="),
    ("missing_modality", "--task image->audio: --method itq_x@16="),
    ("mixed_other_labels", "is a dataset without modalities, but --method itq_x@16="),
    ("task_unimodal", "--task image->text: the methods' datasets have no modalities"),
    ("bad_task", "expected QUERY_MODALITY->DATABASE_MODALITY"),
])
def test_bad_input(data, tmp_path, capsys, case, needle):
    modal, pair = _specs(data, ["itq_x@16", "cvh@16"]), _specs(data, ["itq_x@16", "cvh@16"], task="image->text")
    methods, extra = {
        "mixed": ([modal[0], pair[1]], []),
        "mixed_first": ([pair[0], modal[1]], []),
        "mixed_other_labels": ([modal[0], f"other={data['other']}"], []),  # the kind is checked first
        "missing_modality": (modal, ["--task", "image->audio"]),
        "task_unimodal": (pair, ["--task", "image->text"]),
        "bad_task": (modal, ["--task", "image"]),
    }[case]
    out = tmp_path / "cmp"
    line = assert_refused(capsys, ["compare", *(f"--method={m}" for m in methods), "--out", out, "--engine",
                                   "local", "--no-cache", "--latex", *extra], needle, not_created=out)
    if case == "missing_modality":
        assert "has no database modality 'audio' (only image, text)" in line


@pytest.mark.usefixtures("prefect_api")
def test_flow_equals_local(data, tmp_path):
    from flows.compare import run_comparison

    specs = _specs(data, ["itq_x@16", "cvh@16"])
    local = compare(specs, cache=False, permutations=99)
    flow = run_comparison(specs, cache=tmp_path / "cache", permutations=99, out=tmp_path / "cmp", tables=["latex"])
    assert flow["task_order"] == local["task_order"] == list(TASKS)
    for task in TASKS:
        assert flow["tasks"][task]["methods"] == local["tasks"][task]["methods"]
        assert flow["tasks"][task]["pairs"] == local["tasks"][task]["pairs"]
    assert (tmp_path / "cmp" / "leaderboard.tex").read_text() == latex_table(local)
