"""Repeated runs in `hashdist compare`: NAME=DS1,DS2,... (one split per run), summaries over runs, run-wise tests."""

import itertools
import json
import math

import numpy as np
import pytest
from scipy import stats as sps

from hashdist.api import compare
from hashdist.cli import main
from hashdist.data.dataset import open_dataset
from hashdist.data.synth import synth_dataset
from hashdist.errors import InputError
from hashdist.metrics.stats import exact_randomization_pvalue, holm, t_interval
from hashdist.report.comparison import format_leaderboard, latex_table, markdown_table
from tests import reference as ref

SEEDS = (11, 12, 13)  # run t has the labels of seed SEEDS[t] (its own split)
COMMON = dict(n_database=300, n_queries=25, labels="class", n_classes=4, chunk_rows=128)
KINDS = {"good@16": dict(nbits=16, noise=0.1), "poor@16": dict(nbits=16, noise=0.3, collision=0.3),
         "good@32": dict(nbits=32, noise=0.1)}


def _t_reference(values):
    """mean, sd (ddof 1) and the 95% t interval, computed with numpy and scipy.stats.t."""
    v = np.asarray(values, float)
    mean, sd = np.mean(v), np.std(v, ddof=1)
    lo, hi = sps.t.interval(0.95, len(v) - 1, loc=mean, scale=sd / math.sqrt(len(v)))
    return mean, sd, lo, hi


def _sign_flip_reference(a, b):
    """Every sign pattern enumerated with itertools: #{|mean| >= |observed|} / 2^n."""
    d = np.asarray(a, float) - np.asarray(b, float)
    observed = abs(d.mean())
    means = [abs(np.dot(signs, d)) / len(d) for signs in itertools.product((1, -1), repeat=len(d))]
    return sum(m >= observed - 1e-12 for m in means) / 2 ** len(d)


def test_t_interval_matches_numpy_and_scipy():
    rng = np.random.default_rng(0)
    for T, level in ((2, 0.95), (5, 0.95), (10, 0.9)):
        v = rng.random(T)
        mean, sd, lo, hi = t_interval(v, level=level)
        assert mean == pytest.approx(np.mean(v), rel=1e-12) and sd == pytest.approx(np.std(v, ddof=1), rel=1e-12)
        ref = sps.t.interval(level, T - 1, loc=np.mean(v), scale=np.std(v, ddof=1) / math.sqrt(T))
        assert (lo, hi) == pytest.approx(ref, rel=1e-12)
    assert t_interval([0.25])[0] == 0.25 and all(math.isnan(x) for x in t_interval([0.25])[1:])  # one run: no spread
    assert all(math.isnan(x) for x in t_interval([]))
    assert all(math.isnan(x) for x in t_interval([0.5, math.nan, 0.7]))


def test_exact_sign_flip_matches_enumeration():
    assert exact_randomization_pvalue(np.array([1.0, 2, 3, 4]), np.zeros(4)) == 2 / 16
    rng = np.random.default_rng(1)
    for n in (1, 3, 6):
        a, b = rng.random(n), rng.random(n)
        assert exact_randomization_pvalue(a, b) == pytest.approx(_sign_flip_reference(a, b), abs=1e-15)
    assert exact_randomization_pvalue(np.ones(5), np.ones(5)) == 1.0


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{method: [dataset of run 0, 1, 2]}: run t of every method has the labels of SEEDS[t]."""
    d = tmp_path_factory.mktemp("runs")
    return {name: [synth_dataset(d / f"{name}-{seed}.zarr", seed=seed, **COMMON, **kw) for seed in SEEDS]
            for name, kw in KINDS.items()}


def _spec(name, paths):
    return f"{name}={','.join(paths)}"


def test_summaries_and_tests_over_runs(runs):
    names = ["good@16", "poor@16"]
    c = compare([_spec(n, runs[n]) for n in names], cache=False, k=[10], permutations=99, bootstrap=20)
    T = len(SEEDS)
    assert c["parameters"]["runs"] == T and c["parameters"]["paired_over"] == "runs"
    assert c["parameters"]["exact_randomization"] is True  # 2^3 <= 99
    assert c["queries"]["total"] == [COMMON["n_queries"]] * T and len(c["parameters"]["ground_truth"]) == T
    from hashdist.api import evaluate_local

    for name in names:
        m = c["methods"][name]
        assert set(m) == {"group", "nbits", "runs", "over_runs"}  # no method-level metrics with repeated runs
        assert [run["dataset"] for run in m["runs"]] == runs[name]
        assert [run["fingerprint"] for run in m["runs"]] == [open_dataset(p).fingerprint for p in runs[name]]
        direct = evaluate_local(runs[name][1], cache=False, k=[10]).report["metrics"]
        assert m["runs"][1]["metrics"]["map"] == direct["map"]  # run 1 is the second dataset
        o = m["over_runs"]
        assert list(o)[:3] == ["mAP", "mAP worst", "mAP best"] and {"mLGAP@2", "P@10", "AUC"} <= set(o)
        per_run = {"mAP": [r["metrics"]["map"]["expected"] for r in m["runs"]],
                   "mAP worst": [r["metrics"]["map"]["worst"] for r in m["runs"]],
                   "mAP best": [r["metrics"]["map"]["best"] for r in m["runs"]],
                   "P@10": [r["metrics"]["precision_at_k"]["10"]["expected"] for r in m["runs"]],
                   "mLGAP@2": [r["metrics"]["mlgap_at_radius"]["2"] for r in m["runs"]]}
        for label, values in per_run.items():
            assert o[label]["values"] == values
            mean, sd, lo, hi = _t_reference(values)
            assert o[label]["mean"] == pytest.approx(mean, rel=1e-12)
            assert o[label]["sd"] == pytest.approx(sd, rel=1e-12)
            assert o[label]["ci"] == pytest.approx([lo, hi], rel=1e-12)
    good, poor = (c["methods"][n]["over_runs"] for n in names)
    assert c["ranking"] == sorted(names, key=lambda n: -c["methods"][n]["over_runs"]["mAP"]["mean"])
    entries = c["pairs"]["good@16|poor@16"]
    assert [e["metric"] for e in entries] == ["map", "mlgap"]
    for e, label in zip(entries, ["mAP", "mLGAP@2"], strict=True):
        a, b = np.array(good[label]["values"]), np.array(poor[label]["values"])
        assert e["mean_diff"] == pytest.approx(np.mean(a - b), rel=1e-12)
        assert e["t_pvalue"] == pytest.approx(sps.ttest_rel(a, b).pvalue, rel=1e-12)
        assert e["randomization_pvalue"] == pytest.approx(_sign_flip_reference(a, b))
        assert e["holm_adjusted"] == e["randomization_pvalue"]  # one pair: nothing to adjust
    overlap = max(good["mAP worst"]["mean"], poor["mAP worst"]["mean"]) <= min(good["mAP best"]["mean"],
                                                                              poor["mAP best"]["mean"])
    assert c["map_order_depends_on_ties"] == (["good@16|poor@16"] if overlap else [])


def test_sampled_sign_flip_when_patterns_exceed_permutations(runs):
    names = list(KINDS)
    c = compare([_spec(n, runs[n]) for n in names], cache=False, k=[10], permutations=5, bootstrap=10)
    assert c["parameters"]["exact_randomization"] is False
    for metric in (0, 1):
        rows = [entries[metric] for entries in c["pairs"].values()]
        assert all(1 / 6 <= e["randomization_pvalue"] <= 1 for e in rows)
        assert [e["holm_adjusted"] for e in rows] == pytest.approx(holm([e["randomization_pvalue"] for e in rows]))
        assert [e["t_holm_adjusted"] for e in rows] == pytest.approx(holm([e["t_pvalue"] for e in rows]))


def test_run_t_is_paired_with_run_t(tmp_path):
    """Runs sharing one ground truth (same seed) may be given in any order: the pairing follows the order."""
    a = [synth_dataset(tmp_path / f"a{i}.zarr", seed=5, nbits=16, noise=noise, **COMMON)
         for i, noise in enumerate((0.05, 0.2, 0.35))]
    b = [synth_dataset(tmp_path / f"b{i}.zarr", seed=5, nbits=16, noise=noise, **COMMON)
         for i, noise in enumerate((0.1, 0.15, 0.4))]
    results = []
    for order in ((0, 1, 2), (2, 0, 1)):
        shuffled = [b[i] for i in order]
        c = compare([_spec("a", a), _spec("b", shuffled)], cache=False, k=[10], permutations=99, bootstrap=10)
        va = c["methods"]["a"]["over_runs"]["mAP"]["values"]
        vb = c["methods"]["b"]["over_runs"]["mAP"]["values"]
        assert [run["dataset"] for run in c["methods"]["b"]["runs"]] == shuffled
        entry = c["pairs"]["a|b"][0]
        assert entry["t_pvalue"] == pytest.approx(sps.ttest_rel(va, vb).pvalue, rel=1e-12)
        results.append((vb, entry, c["methods"]["b"]["over_runs"]["mAP"]))
    (vb0, e0, s0), (vb1, e1, s1) = results
    assert vb1 == [vb0[i] for i in (2, 0, 1)] and vb1 != vb0  # each run's value follows its dataset
    assert e1["mean_diff"] == pytest.approx(e0["mean_diff"])  # the mean difference does not depend on the pairing
    assert e1["t_pvalue"] != pytest.approx(e0["t_pvalue"])  # the paired test does
    assert s1["mean"] == pytest.approx(s0["mean"]) and s1["sd"] == pytest.approx(s0["sd"])


@pytest.mark.parametrize("case,needle", [
    ("fewer", "--method poor@16={b1},{b2}: 2 runs, but good@16 has 3 runs"),
    ("swapped", "--method poor@16 run 0 ({b2}): differs from good@16 run 0 in queries/labels"),
    ("other_split", "--method poor@16 run 2 ({b1}): differs from good@16 run 2 in queries/labels"),
    ("empty", "--method poor@16={b1},,{b3}: an empty dataset among its runs"),
    ("missing", "--method poor@16 run 1: nowhere.zarr: no such dataset"),
    ("bits", "--method poor@16 run 1 ({c2}): bits 32, but run 0 has 16"),
])
def test_mismatched_runs_refused_in_one_line(runs, tmp_path, capsys, case, needle):
    b1, b2, b3 = runs["poor@16"]
    c2 = runs["good@32"][1]
    poor = {"fewer": [b1, b2], "swapped": [b2, b1, b3], "other_split": [b1, b2, b1], "empty": [b1, "", b3],
            "missing": [b1, "nowhere.zarr", b3], "bits": [b1, c2, b3]}[case]
    out = tmp_path / "cmp"
    argv = ["compare", "--method", _spec("good@16", runs["good@16"]), "--method", _spec("poor@16", poor),
            "--out", str(out), "--engine", "local", "--no-cache"]
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and needle.format(b1=b1, b2=b2, b3=b3, c2=c2) in err[0], err
    assert not out.exists()


def test_single_dataset_keeps_the_single_run_document(runs):
    c = compare([f"a={runs['good@16'][0]}", f"b={runs['poor@16'][0]}"], cache=False, permutations=9, bootstrap=10)
    assert set(c["methods"]["a"]) == {"dataset", "group", "nbits", "fingerprint", "metrics", "map_ci", "mlgap_ci",
                                      "code_usage"}
    assert "runs" not in c["parameters"] and isinstance(c["queries"]["evaluated"], int)
    assert [e["metric"] for e in c["pairs"]["a|b"]] == ["ap", "lgap"]
    with pytest.raises(InputError, match=r"^--method b=\S+: differs from a in queries/labels"):
        compare([f"a={runs['good@16'][0]}", f"b={runs['poor@16'][1]}"], cache=False)


def test_cli_writes_runs_and_summaries(runs, tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["compare", *(f"--method={_spec(n, p)}" for n, p in runs.items()), "--out", str(out), "--engine", "local",
            "--no-cache", "--k", "10", "--permutations", "99", "--latex", "--markdown"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    c = json.loads((out / "comparison.json").read_text())
    T = len(SEEDS)

    def cell(summary):
        return f"{summary['mean']:.4f} \u00b1 {summary['sd']:.4f}"

    # text: the leaderboard in mean ± sd, each method's mAP and mLGAP of every run, the tests over runs
    assert f"Leaderboard over {T} runs" in printed and "Paired tests over runs" in printed
    for m in c["methods"].values():
        o = m["over_runs"]
        assert cell(o["mAP"]) in printed and cell(o["P@10"]) in printed
        run_line = next(line for line in printed.splitlines() if line.startswith("mLGAP@2 ") and
                        all(f"{v:.4f}" in line for v in o["mLGAP@2"]["values"]))
        assert f"[{o['mLGAP@2']['ci'][0]:.4f}, {o['mLGAP@2']['ci'][1]:.4f}]" in run_line
        assert len(m["runs"]) == T and all(set(r) >= {"dataset", "fingerprint", "metrics"} for r in m["runs"])
    assert format_leaderboard(c) in printed

    # HTML: a table per method with every run's value, the mean, sd and t interval; datasets named per run
    page = (out / "comparison.html").read_text()
    for name, m in c["methods"].items():
        table = page.split(f'<table id="runs-{name}">')[1].split("</table>")[0]
        assert f"<th>run {T - 1}</th>" in table and "<th>95% CI</th>" in table  # runs from 0
        for label, summary in m["over_runs"].items():
            row = table.split(f"<tr><td>{label}</td>")[1].split("</tr>")[0]
            expected = [*(f"{v:.4f}" for v in summary["values"]), f"{summary['mean']:.4f}", f"{summary['sd']:.4f}",
                        f"[{summary['ci'][0]:.4f}, {summary['ci'][1]:.4f}]"]
            assert row == "".join(f"<td>{x}</td>" for x in expected), (name, label)
        assert all(f"<code>{p}</code>" in page for p in runs[name])
    assert cell(c["methods"]["poor@16"]["over_runs"]["mAP"]) in page.split('id="leaderboard"')[1]
    assert '<figure id="fig-bit_length"><div class="plot"><img' in page

    # paper tables: models x bit lengths, mean ± sd, bold on the best mean
    header, rows = ref.markdown_rows((out / "leaderboard.md").read_text())
    assert header == ["Method", "16 bits", "32 bits"]
    cells = {row[0]: row[1:] for row in rows}
    good16, poor16 = (c["methods"][n]["over_runs"]["mAP"] for n in ("good@16", "poor@16"))
    best = max(good16["mean"], poor16["mean"])
    for row_cell, summary in ((cells["good"][0], good16), (cells["poor"][0], poor16)):
        assert cell(summary) in row_cell and row_cell.startswith("**") == (summary["mean"] == best)
    assert cells["poor"][1] == "-" and cells["good"][1].startswith("**")
    tex = (out / "leaderboard.tex").read_text()
    assert r"\textbf{" + cell(good16 if best == good16["mean"] else poor16).replace("\u00b1", r"$\pm$") + "}" in tex
    assert "mean $\\pm$ sample standard deviation over 3 runs" in tex
    assert latex_table(c) == tex


def test_paper_table_by_metrics_marks_overlapping_mean_tie_intervals(runs):
    specs = [_spec("good", runs["good@16"]), _spec("copy", runs["good@16"]), _spec("poor", runs["poor@16"])]
    c = compare(specs, cache=False, k=[10], permutations=9, bootstrap=10)
    header, rows = ref.markdown_rows(markdown_table(c))
    assert header[:3] == ["Method", "mAP", "mAP@10"]
    assert [row[0] for row in rows] == c["ranking"]
    for column, key in ((1, "map"), (2, "map_at_k")):
        summary = {}
        for name in c["ranking"]:
            values = [r["metrics"][key] if key == "map" else r["metrics"][key]["10"]["retrieved"]
                      for r in c["methods"][name]["runs"]]
            summary[name] = {p: np.mean([v[p] for v in values]) for p in ("worst", "expected", "best")}
            summary[name]["sd"] = np.std([v["expected"] for v in values], ddof=1)
        best = max(s["expected"] for s in summary.values())
        for name, row in zip(c["ranking"], rows, strict=True):
            s, text = summary[name], row[column]
            assert f"{s['expected']:.4f} \u00b1 {s['sd']:.4f}" in text
            assert text.startswith("**") == (s["expected"] == best), (name, text)
            dagger = any(max(s["worst"], o["worst"]) <= min(s["best"], o["best"])
                         for other, o in summary.items() if other != name)
            assert text.endswith("\u2020") == dagger, (name, text)
    assert rows[0][1].endswith("\u2020") and rows[1][1].endswith("\u2020")  # the copies tie


@pytest.mark.usefixtures("prefect_api")
def test_flow_equals_local_with_runs(runs, tmp_path):
    from flows.compare import run_comparison

    specs = [_spec("a", runs["good@16"]), _spec("b", runs["poor@16"])]
    local = compare(specs, cache=False, permutations=99, bootstrap=10)
    flow = run_comparison(specs, cache=tmp_path / "cache", permutations=99, bootstrap=10)
    assert flow["methods"] == local["methods"] and flow["pairs"] == local["pairs"]
