"""Method comparison: paired statistics, the same-ground-truth check, and `hashdist compare` end to end."""

import json
import math

import numpy as np
import pytest
from scipy.stats import ttest_rel

from hashdist.api import compare
from hashdist.cli import main
from hashdist.compare.comparison import parse_methods
from hashdist.data.synth import digits_dataset, synth_dataset
from hashdist.errors import InputError
from hashdist.metrics.stats import bootstrap_ci, holm, paired_t_pvalue, randomization_pvalue


def test_t_pvalue_matches_scipy():
    rng = np.random.default_rng(0)
    a = rng.random(40)
    b = a + rng.normal(0.05, 0.1, 40)
    assert paired_t_pvalue(a, b) == pytest.approx(ttest_rel(a, b).pvalue, rel=1e-12)
    assert paired_t_pvalue(b, a) == pytest.approx(ttest_rel(b, a).pvalue, rel=1e-12)


def test_zero_variance_differences():
    a = np.random.default_rng(1).integers(0, 8, 30) / 8  # exact sums
    assert paired_t_pvalue(a, a) == 1.0
    assert randomization_pvalue(a, a, 99, seed=0) == 1.0
    assert paired_t_pvalue(a + 0.25, a) == 0.0  # every query gains exactly 0.25


def test_holm_against_hand_computation():
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, max(0.04*1, 0.06) = 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    adjusted = holm([0.02, math.nan, 0.04])
    assert adjusted[0] == pytest.approx(0.04) and math.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.04)


def test_randomization_pvalue_range_determinism_and_exact_value():
    rng = np.random.default_rng(2)
    a, b = rng.random(25), rng.random(25)
    P = 499
    p = randomization_pvalue(a, b, P, seed=7)
    assert 1 / (P + 1) <= p <= 1
    assert p == randomization_pvalue(a, b, P, seed=7)
    assert randomization_pvalue(a + 1, a, P, seed=7) == 1 / (P + 1)  # no sign pattern reaches all +1
    # d = 1, 2, 3, 4: |sum of signed d| >= 10 for 2 of the 16 sign patterns
    d = np.array([1.0, 2.0, 3.0, 4.0])
    assert randomization_pvalue(d, np.zeros(4), 20000, seed=0) == pytest.approx(2 / 16, abs=0.01)


def test_bootstrap_ci_contains_the_mean_and_is_seeded():
    v = np.random.default_rng(3).beta(2, 5, 200)
    lo, hi = bootstrap_ci(v, 2000, seed=1)
    assert lo < v.mean() < hi and hi - lo < 0.1
    assert bootstrap_ci(v, 2000, seed=1) == [lo, hi]


def test_method_names():
    methods = parse_methods(["itq@32=a.zarr", "itq@64=b.zarr", "lsh=c=d.zarr"])
    assert [(m.name, m.group, m.dataset) for m in methods] == [
        ("itq@32", "itq", "a.zarr"), ("itq@64", "itq", "b.zarr"), ("lsh", "lsh", "c=d.zarr")]
    assert [m.runs for m in parse_methods(["a=x.zarr,y.zarr", "b=z.zarr,w.zarr"])] == [("x.zarr", "y.zarr"),
                                                                                       ("z.zarr", "w.zarr")]
    for bad, needle in ((["a=x", "a=y"], "used twice"), (["a=x"], "at least two"), (["a|b=x", "c=y"], "NAME must"),
                        (["a", "b=y"], "NAME=DATASET"), (["a@=x", "b=y"], "NAME must"),
                        (["a=x,y", "b=z"], "1 run, but a has 2 runs"), (["a=x,", "b=y,z"], "an empty dataset")):
        with pytest.raises(InputError, match=needle):
            parse_methods(bad)


@pytest.fixture(scope="module")
def methods(tmp_path_factory):
    """Three synthetic methods with the same labels (same seed; bits, noise and collision differ)."""
    d = tmp_path_factory.mktemp("methods")
    common = dict(n_database=1500, n_queries=60, labels="class", n_classes=6, seed=4, chunk_rows=512)
    specs = {"good@16": dict(nbits=16, noise=0.05, collision=0.0), "good@32": dict(nbits=32, noise=0.05),
             "collapsed@16": dict(nbits=16, noise=0.2, collision=0.9)}
    for name, kw in specs.items():
        synth_dataset(d / f"{name}.zarr", **common, **kw)
    return {name: str(d / f"{name}.zarr") for name in specs}


def test_method_compared_with_itself(methods):
    c = compare([f"a={methods['good@16']}", f"b={methods['good@16']}"], cache=False, permutations=99, bootstrap=200)
    for entry in c["pairs"]["a|b"]:
        assert entry["mean_diff"] == 0.0
        assert entry["t_pvalue"] == entry["randomization_pvalue"] == entry["holm_adjusted"] == 1.0
    assert c["methods"]["a"]["metrics"]["map"] == c["methods"]["b"]["metrics"]["map"]
    assert c["map_order_depends_on_ties"] == ["a|b"]


def test_mismatched_ground_truth_is_refused(methods, tmp_path):
    other = synth_dataset(tmp_path / "other.zarr", n_database=1500, n_queries=60, labels="class", n_classes=6,
                          seed=5, nbits=16, chunk_rows=512)
    with pytest.raises(InputError, match="differs from a in queries/labels"):
        compare([f"a={methods['good@16']}", f"b={other}"], cache=False)
    fewer = synth_dataset(tmp_path / "fewer.zarr", n_database=1500, n_queries=59, labels="class", n_classes=6,
                          seed=4, nbits=16, chunk_rows=512)
    with pytest.raises(InputError, match=r"differs from a in queries \(59 vs 60\)"):
        compare([f"a={methods['good@16']}", f"b={fewer}"], cache=False)
    digits = digits_dataset(tmp_path / "digits.zarr", method="lsh", nbits=16)
    with pytest.raises(InputError, match="differs from a"):
        compare([f"a={methods['good@16']}", f"b={digits}"], cache=False)


def test_same_labels_in_other_chunking_are_accepted(methods, tmp_path):
    rechunked = synth_dataset(tmp_path / "rechunked.zarr", n_database=1500, n_queries=60, labels="class",
                              n_classes=6, seed=4, nbits=16, noise=0.1, chunk_rows=300)
    c = compare([f"a={methods['good@16']}", f"b={rechunked}"], cache=False, permutations=9, bootstrap=10)
    assert set(c["methods"]) == {"a", "b"}


def test_cli_end_to_end(methods, tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["compare", *(f"--method={n}={p}" for n, p in methods.items()), "--out", str(out), "--engine", "local",
            "--no-cache", "--k", "10", "50", "--permutations", "999", "--seed", "3"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "mAP [worst, best]" in printed and "comparison.html" in printed
    c = json.loads((out / "comparison.json").read_text())
    assert c["format"] == "hashdist-comparison"
    assert list(c["methods"]) == list(methods)
    good, collapsed = c["methods"]["good@16"], c["methods"]["collapsed@16"]
    assert good["nbits"] == 16 and c["methods"]["good@32"]["nbits"] == 32 and good["group"] == "good"
    assert good["metrics"]["map"]["expected"] > collapsed["metrics"]["map"]["expected"]
    assert good["map_ci"][0] <= good["metrics"]["map"]["expected"] <= good["map_ci"][1]
    assert good["mlgap_ci"][0] <= good["metrics"]["mlgap_at_radius"]["2"] <= good["mlgap_ci"][1]
    assert collapsed["code_usage"]["max_bucket"] > good["code_usage"]["max_bucket"]
    assert collapsed["code_usage"]["entropy_bits"] < good["code_usage"]["entropy_bits"]
    assert len(good["code_usage"]["bit_balance"]) == 16
    assert set(good["metrics"]["map_at_k"]) == {"10", "50"}
    assert set(c["pairs"]) == {"good@16|good@32", "good@16|collapsed@16", "good@32|collapsed@16"}
    for entries in c["pairs"].values():
        assert [e["metric"] for e in entries] == ["ap", "lgap"]
        for e in entries:
            assert 1 / 1000 <= e["randomization_pvalue"] <= e["holm_adjusted"] <= 1
    ap = {p: e[0]["randomization_pvalue"] for p, e in c["pairs"].items()}
    assert sorted(e[0]["holm_adjusted"] for e in c["pairs"].values()) == pytest.approx(
        sorted(holm(list(ap.values()))))
    page = (out / "comparison.html").read_text()
    for figure in ("pr_curves", "bit_length", "code_occupancy", "bit_balance"):
        assert f'<figure id="fig-{figure}"><div class="plot"><img' in page and "data:image/png;base64," in page
    assert "http://" not in page and "https://" not in page
    # a rerun with the same seed gives the same numbers
    assert main([*argv, "--overwrite"]) == 0
    again = json.loads((out / "comparison.json").read_text())
    assert again["pairs"] == c["pairs"] and again["methods"] == c["methods"]


@pytest.mark.parametrize("extra,needle", [
    ([], "at least two"),
    (["--method", "b=nowhere.zarr"], "--method b: nowhere.zarr: no such dataset"),
    (["--method", "b={good}", "--permutations", "0"], "--permutations must be a positive integer"),
    (["--method", "b={good}", "--radius", "40"], "--radius"),
])
def test_cli_bad_input(methods, tmp_path, capsys, extra, needle):
    out = tmp_path / "cmp"
    argv = ["compare", "--method", f"a={methods['good@16']}", *[x.format(good=methods["good@16"]) for x in extra],
            "--out", str(out), "--engine", "local", "--no-cache"]
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and needle in err[0], err
    assert not out.exists()


@pytest.mark.usefixtures("prefect_api")
def test_flow_equals_local(methods, tmp_path):
    from flows.compare import run_comparison

    specs = [f"a={methods['good@16']}", f"b={methods['collapsed@16']}"]
    local = compare(specs, cache=False, permutations=99)
    flow = run_comparison(specs, cache=tmp_path / "cache", permutations=99, out=tmp_path / "cmp")
    assert flow["methods"] == local["methods"] and flow["pairs"] == local["pairs"]
    assert (tmp_path / "cmp" / "comparison.html").exists()
