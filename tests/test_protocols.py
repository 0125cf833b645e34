"""Protocol presets: consistent sizes, and evaluate --protocol takes the protocol's K and convention."""

import json

import numpy as np
import pytest

from hashdist.api import evaluate_local
from hashdist.cli import main
from hashdist.data.protocols import PROTOCOLS, get_protocol
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
