"""Leaderboards as tables for papers: `hashdist compare --latex --markdown`."""

import re

import pytest

from hashdist.api import compare
from hashdist.cli import main
from hashdist.data.synth import synth_dataset
from hashdist.report.comparison import latex_table, markdown_table
from tests import reference as ref

POLICIES = ("worst", "expected", "best")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """Two models at two code lengths, and a near-copy of one, all over the same labels."""
    d = tmp_path_factory.mktemp("paper")
    common = dict(n_database=1200, n_queries=50, labels="class", n_classes=5, seed=9, chunk_rows=400)
    specs = {"itq_hash@16": dict(nbits=16, noise=0.05), "itq_hash@32": dict(nbits=32, noise=0.05),
             "lsh@16": dict(nbits=16, noise=0.25, collision=0.5), "lsh@32": dict(nbits=32, noise=0.25)}
    for name, kw in specs.items():
        synth_dataset(d / f"{name}.zarr", **common, **kw)
    return {name: str(d / f"{name}.zarr") for name in specs}


def test_methods_by_metrics(datasets):
    specs = [f"{n}={p}" for n, p in datasets.items() if n.endswith("@16")] + [f"copy={datasets['itq_hash@16']}"]
    c = compare(specs, cache=False, permutations=9, bootstrap=10, k=[10])
    table = markdown_table(c)
    header, rows = ref.markdown_rows(table)
    assert header[:3] == ["Method", "mAP", "mAP@10"]
    assert "CalcTopMap" in table  # the caption names mAP@K's normaliser where the table has mAP@K
    names = [row[0] for row in rows]
    assert names == c["ranking"]
    for col, key in ((1, "map"), (2, "map_at_k")):
        values = {n: c["methods"][n]["metrics"][key] if key == "map" else
                  c["methods"][n]["metrics"][key]["10"]["retrieved"] for n in names}
        best = max(v["expected"] for v in values.values())
        for n, row in zip(names, rows, strict=True):
            cell = row[col]
            assert cell.startswith("**") == (values[n]["expected"] == best), (n, cell)
            dagger = any(ref.intervals_overlap(values[n], values[o]) for o in names if o != n)
            assert cell.endswith("\u2020") == dagger, (n, cell)
            assert f"{values[n]['expected']:.4f}" in cell
    assert [row[1].startswith("**") and row[1].endswith("\u2020") for row in rows].count(True) == 2  # the copies


def test_models_by_bit_length_and_latex(datasets, tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["compare", *(f"--method={n}={p}" for n, p in datasets.items()), "--out", str(out), "--engine", "local",
            "--no-cache", "--permutations", "9", "--latex", "--markdown"]
    assert main(argv) == 0
    assert "leaderboard.tex" in capsys.readouterr().out
    md = (out / "leaderboard.md").read_text()
    header, rows = ref.markdown_rows(md)
    assert header == ["Method", "16 bits", "32 bits"]
    assert sorted(row[0] for row in rows) == ["itq_hash", "lsh"]
    assert "expected over all orders of items tied" in md and "CalcTopMap" not in md  # no mAP@K column here
    tex = (out / "leaderboard.tex").read_text()
    assert tex.count(r"\begin{tabular}{lrr}") == 1 and r"\toprule" in tex and r"\bottomrule" in tex
    assert r"itq\_hash" in tex and "itq_hash" not in tex.replace(r"itq\_hash", "")  # escaped
    body = [line for line in tex.splitlines() if line.endswith(r"\\")][1:]
    assert all(line.count("&") == 2 for line in body)
    bold = re.findall(r"\\textbf\{([0-9.]+)\}", tex)
    assert len(bold) == 2  # one best per bit-length column
    assert latex_table(__import__("json").loads((out / "comparison.json").read_text())) == tex
