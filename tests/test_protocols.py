"""Protocol presets: consistent sizes, and evaluate --protocol takes the protocol's K and convention."""

import json

import numpy as np
import pytest

from hashdist.api import evaluate_local
from hashdist.cli import main
from hashdist.data.protocols import PROTOCOLS, TRAINING_RULES, expected_sizes, get_protocol, training_rule
from hashdist.data.splitcheck import check_split
from hashdist.data.splits import make_splits, protocol_options
from hashdist.errors import InputError


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.name)
def test_preset_sizes_fit_their_pooled_dataset(protocol):
    sizes = protocol.sizes
    assert sizes["test_queries"] > 0 and sizes["training"] > 0
    if protocol.strategy == "improved":
        assert sum(sizes.values()) == protocol.pooled_items
    else:  # the database is everything but the test queries, and holds the training set
        assert sizes["training"] <= protocol.pooled_items - sizes["test_queries"]
    assert protocol.k is None or all(0 < k < protocol.pooled_items for k in protocol.k)
    assert protocol.source and protocol.summary


def test_unknown_protocol():
    with pytest.raises(InputError, match="--protocol nope: unknown protocol"):
        get_protocol("nope")


def test_evaluate_with_a_protocol_takes_its_k_and_convention(class_dataset, tmp_path, capsys):
    report = evaluate_local(class_dataset, cache=False, protocol="nuswide21").report
    assert list(report["metrics"]["map_at_k"]) == ["5000"]
    assert list(report["conventions"]) == ["deephash"]
    assert report["parameters"]["protocol"] == "nuswide21"
    whole = evaluate_local(class_dataset, cache=False, protocol="cifar10", k=[7]).report  # --k wins
    assert list(whole["metrics"]["map_at_k"]) == ["7"] and list(whole["conventions"]) == ["deephash"]
    out = tmp_path / "r"
    assert main(["evaluate", class_dataset, "--out", str(out), "--engine", "local", "--no-cache", "--no-html",
                 "--protocol", "cifar10"]) == 0
    written = json.loads((out / "report.json").read_text())
    assert list(written["metrics"]["map_at_k"]) == ["3000"]  # the whole database
    # mAP@N_database under the 'total' normaliser is mAP over the full ranking
    for policy in ("expected", "best", "worst"):
        assert written["metrics"]["map_at_k"]["3000"]["total"][policy] == pytest.approx(
            written["metrics"]["map"][policy], abs=1e-12)
    assert "DeepHash-pytorch" in capsys.readouterr().out
    assert main(["evaluate", class_dataset, "--out", str(tmp_path / "x"), "--protocol", "nope"]) == 2
    assert not (tmp_path / "x").exists()


def test_deephash_convention_at_the_whole_database_counts_every_query(class_dataset):
    report = evaluate_local(class_dataset, cache=False, protocol="cifar10").report
    per_policy = report["conventions"]["deephash"]["map_at_k"]["3000"]
    retrieved = report["metrics"]["map_at_k"]["3000"]["retrieved"]
    share = report["queries"]["evaluated"] / report["queries"]["total"]
    assert per_policy["expected"] == pytest.approx(retrieved["expected"] * share, abs=1e-12)
    assert np.isfinite(per_policy["best"]) and per_policy["worst"] <= per_policy["expected"] <= per_policy["best"]


CROSS_MODAL = [p for p in PROTOCOLS if p.cross_modal]


def test_every_preset_names_a_registered_convention():
    from hashdist.metrics.conventions import BY_NAME as CONVENTIONS

    assert {p.name: p.convention for p in PROTOCOLS if p.convention not in CONVENTIONS} == {}


def test_cross_modal_presets():
    assert [p.name for p in CROSS_MODAL] == ["mirflickr25k", "nuswide21-cm", "nuswide10-djsrh", "nuswide10-ucch",
                                             "iaprtc12", "mscoco-cm", "wiki"]
    assert len({p.name for p in PROTOCOLS}) == len(PROTOCOLS)
    for p in CROSS_MODAL:
        assert p.labels and p.label_kind in ("class", "multilabel") and p.training_set in TRAINING_RULES
        assert p.strategy == "standard" and training_rule(p) == p.training_set
        sizes = expected_sizes(p)
        if "pooled_items" in p.unverified:  # the database follows from a pool size no source confirmed
            assert sizes["database"] is None and "not verified" in p.note
        else:
            assert sizes["queries"] + sizes["database"] == p.pooled_items
        if p.training_set == "database":
            assert sizes["training"] == p.pooled_items - sizes["queries"]
    assert {p.name: (p.pooled_items, p.sizes["test_queries"], p.sizes["training"]) for p in CROSS_MODAL} == {
        "mirflickr25k": (20_015, 2_000, 10_000), "nuswide21-cm": (195_834, 2_100, 10_000),
        "nuswide10-djsrh": (186_577, 2_000, 5_000), "nuswide10-ucch": (186_577, 2_100, 184_477),
        "iaprtc12": (20_000, 2_000, 10_000), "mscoco-cm": (122_218, 5_000, 10_000), "wiki": (2_866, 693, 2_173)}
    assert get_protocol("wiki").label_kind == "class" and get_protocol("nuswide10-djsrh").k == (50,)


def test_training_rules_of_the_image_presets():
    assert {p.name: training_rule(p) for p in PROTOCOLS if not p.cross_modal} == {
        "cifar10": "held_out", "cifar10-1": "subset", "cifar10-2": "database", "nuswide21": "subset",
        "coco": "subset", "imagenet100": "subset"}


def test_unknown_protocol_names_the_closest():
    with pytest.raises(InputError, match="--protocol nuswide10: unknown protocol; did you mean nuswide10-djsrh or "
                       "nuswide10-ucch"):
        get_protocol("nuswide10")
    with pytest.raises(InputError, match="did you mean mirflickr25k"):
        get_protocol("mirflikr25k")


def test_a_drawn_cross_modal_split_passes_the_check():
    labels = np.repeat(np.arange(10), [287] * 6 + [286] * 4)  # Wiki-sized, single-label
    drawn = make_splits(labels, runs=1, **protocol_options("wiki"))["standard"][0]
    report = check_split(drawn["test_queries"], drawn["database"], drawn["training"], labels=labels,
                         protocol="wiki")
    assert report["broken"] == 0 and [r["ok"] for r in report["rules"]] == [True] * 8
