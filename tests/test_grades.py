"""Multi-label grades are uncapped by default (docs/metrics.md, section 5); a cap is the user's explicit choice,
recorded in the report with the number of relevant pairs it changed."""

import math

import numpy as np
import pytest

from hashdist.api import evaluate_local
from hashdist.data.ingest import ingest
from hashdist.errors import InputError
from tests import reference as ref


def _write(directory, db_bits, q_bits, db_labels, q_labels):
    paths = {}
    for name, arr in (("db", db_bits), ("q", q_bits), ("dbl", db_labels), ("ql", q_labels)):
        paths[name] = str(directory / f"{name}.npy")
        np.save(paths[name], np.asarray(arr, dtype=np.uint8))
    out = directory / "data.zarr"
    ingest(out, paths["db"], paths["q"], db_labels=paths["dbl"], query_labels=paths["ql"], chunk_rows=64,
           query_chunk_rows=8)
    return str(out)


def test_ndcg_at_1_with_many_labels_in_common(tmp_path):
    """The top item shares 8 labels, one further down shares 11: NDCG@1 = (2^8 - 1)/(2^11 - 1), not 1."""
    nbits, concepts = 8, 16
    query = np.zeros((1, nbits))
    db = np.ones((20, nbits))  # far from the query
    db[0] = 0  # distance 0
    db[1, :5] = 0  # distance 3
    labels = np.zeros((20, concepts))
    q_labels = np.zeros((1, concepts))
    q_labels[0, :12] = 1
    labels[0, :8] = 1
    labels[1, :11] = 1
    labels[2:, 12:] = 1  # irrelevant
    data = _write(tmp_path, db, query, labels, q_labels)
    uncapped = evaluate_local(data, cache=False, k=[1])
    assert uncapped.report["metrics"]["ndcg_at_k"]["1"]["expected"] == pytest.approx(255 / 2047, abs=1e-15)
    assert uncapped.report["grades"] == {"largest": 12, "cap": None, "relevant_pairs_capped": 0}
    capped = evaluate_local(data, cache=False, k=[1], max_grade=8)
    assert capped.report["metrics"]["ndcg_at_k"]["1"]["expected"] == 1.0
    assert capped.report["grades"] == {"largest": 12, "cap": 8, "relevant_pairs_capped": 1}
    assert capped.report["parameters"]["max_grade"] == 8


@pytest.mark.parametrize("cap", [None, 1, 3])
def test_graded_metrics_match_a_brute_force_ranking(tmp_path, cap):
    """Dense labels (grades up to 10): NDCG@K and P@K against ranked lists built item by item."""
    rng = np.random.default_rng(7)
    nbits, concepts, n_db, n_q = 6, 10, 300, 12
    db, q = rng.integers(0, 2, (n_db, nbits)), rng.integers(0, 2, (n_q, nbits))
    dl, ql = (rng.random((n_db, concepts)) < 0.6), (rng.random((n_q, concepts)) < 0.6)
    data = _write(tmp_path, db, q, dl, ql)
    ks = [1, 7, 40]
    ev = evaluate_local(data, cache=False, k=ks, max_grade=cap)
    grades = ref.grades_multilabel(ql, dl, cap if cap is not None else concepts)
    dist = ref.hamming_bruteforce(q, db)
    uncapped = ref.grades_multilabel(ql, dl, concepts)
    want_capped = 0 if cap is None else int(((uncapped > cap) & (uncapped > 0)).sum())
    assert ev.report["grades"]["relevant_pairs_capped"] == want_capped
    assert ev.report["grades"]["largest"] == int(ql.sum(axis=1).max())
    for k in ks:
        for policy in ("best", "worst"):
            want = [ref.to_float(ref.ndcg_list(ref.ranked_list(dist[i], grades[i], policy), k)) for i in range(n_q)]
            got = ev.per_query[f"ndcg_at_k/{k}/{policy}"]
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        want = [ref.expected_ndcg_positionwise(dist[i], grades[i], k) for i in range(n_q)]
        np.testing.assert_allclose(ev.per_query[f"ndcg_at_k/{k}/expected"], want, rtol=0, atol=1e-12)
        defined = [w for w in want if not math.isnan(w)]
        assert ev.report["metrics"]["ndcg_at_k"][str(k)]["expected"] == pytest.approx(np.mean(defined), abs=1e-12)


@pytest.mark.parametrize("cap", [0, -2, 2.5])
def test_bad_cap_is_refused(multilabel_dataset, cap):
    with pytest.raises(InputError, match=r"--max-grade must be an integer in 1\.\.255"):
        evaluate_local(multilabel_dataset, cache=False, max_grade=cap)
