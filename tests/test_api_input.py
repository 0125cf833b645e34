"""Input checks of the Python API: options given as one value, explicit relevance beside labels, bad arguments."""

import re

import numpy as np
import pytest

import hashdist
from hashdist.arrays import Evaluator, evaluate_codes
from hashdist.errors import InputError
from tests.test_arrays import _same


@pytest.fixture
def data():
    """8-bit codes and class labels: 10 queries, 50 database items."""
    rng = np.random.default_rng(0)
    return rng.integers(0, 2, (10, 8)), rng.integers(0, 2, (50, 8)), rng.integers(0, 3, 10), rng.integers(0, 3, 50)


def test_an_empty_list_means_no_relevant_items(data):
    q, d, _, _ = data
    lists = [[0], [], [1, 7]]
    as_lists = evaluate_codes(q[:3], d, relevant=lists)
    _same(as_lists, evaluate_codes(q[:3], d, relevant=(np.array([0, 1, 1, 3]), np.array([0, 1, 7]))))
    assert as_lists["queries"] == {"total": 3, "evaluated": 2, "without_relevant": 1}
    assert evaluate_codes(q[:2], d, relevant=[[], []])["queries"]["evaluated"] == 0


def test_relevant_replaces_labels_unless_relevance_says_otherwise(data):
    q, d, ql, dl = data
    rel = [np.flatnonzero(d[:, 0] == q[i, 0])[:5] for i in range(10)]
    explicit = evaluate_codes(q, d, ql, dl, relevant=rel, relevance="explicit")
    assert explicit["parameters"]["relevance"] == "explicit"
    _same(evaluate_codes(q, d, ql, dl, relevant=rel), explicit)
    ev = Evaluator().add_database(d, dl).add_queries(q, ql)
    _same(ev.compute(relevant=rel), explicit)
    by_class = evaluate_codes(q, d, ql, dl, relevant=rel, relevance="class")
    assert by_class["metrics"] == evaluate_codes(q, d, ql, dl)["metrics"] != explicit["metrics"]


@pytest.mark.parametrize("one, listed", [
    ({"k": 5}, {"k": [5]}),
    ({"k": np.int64(5)}, {"k": [5]}),
    ({"radius": 2}, {"radius": [2]}),
    ({"conventions": "deephash"}, {"conventions": ["deephash"]}),
    ({"hashtable": "4x2"}, {"hashtable": ["4x2"]}),
])
def test_one_value_is_a_one_element_list(data, one, listed):
    report = evaluate_codes(*data, **one)
    _same(report, evaluate_codes(*data, **listed))
    assert all(report["parameters"][key] == value for key, value in listed.items())


@pytest.mark.parametrize("call, needle", [
    (lambda *a: evaluate_codes(*a, k="10"), "--k / k=: expected a number or a list of them, got '10'"),
    (lambda *a: evaluate_codes(*a, k=np.array(5)), "--k / k=: expected a number or a list of them, got array(5)"),
    (lambda *a: evaluate_codes(*a, k=[5, None]), "--k / k=: expected a number or a list of them"),
    (lambda *a: evaluate_codes(*a, k=[float("nan")]), "--k: every K must be a positive integer"),
    (lambda *a: evaluate_codes(*a, k=[float("inf")]), "--k: every K must be a positive integer"),
    (lambda *a: evaluate_codes(*a, radius="2"), "--radius / radius=: expected a number or a list of them"),
    (lambda *a: evaluate_codes(*a, radius=[True]), "--radius / radius=: expected a number or a list of them"),
    (lambda *a: evaluate_codes(*a, radius=[float("nan")]), "--radius: every radius must be an integer in 0..8"),
    (lambda *a: evaluate_codes(*a, radius=[float("inf")]), "--radius: every radius must be an integer in 0..8"),
    (lambda *a: evaluate_codes(*a, hashtable=5), "--hashtable / hashtable=: expected a KxL setting or a list"),
    (lambda *a: evaluate_codes(*a, conventions=[1]), "--convention / conventions=: expected a convention name"),
    (lambda *a: evaluate_codes(*a, bit_weights=np.ones(8), distance_bins="x"),
     "--distance-bins must be a positive integer, got 'x'"),
    (lambda *a: evaluate_codes(*a, bit_weights=np.ones(8), distance_bins=[3]),
     "--distance-bins must be a positive integer, got [3]"),
    (lambda *a: evaluate_codes(*a, max_grade="x"), "--max-grade must be an integer in 1..255, got 'x'"),
    (lambda *a: evaluate_codes(*a, max_grade=2.0), "--max-grade must be an integer in 1..255, got 2.0"),
    (lambda *a: evaluate_codes(*a, code_parts="x"), "--code-parts must be a positive integer, got 'x'"),
    (lambda *a: evaluate_codes(*a, db_block_rows="x"), "--db-block-rows must be a positive integer, got 'x'"),
    (lambda *a: evaluate_codes(*a, conventions=["hashdist"]),
     "--convention 'hashdist': hashdist's own convention is always reported (map_at_k"),
    (lambda *a: evaluate_codes(*a, conventions=["trec_eval"]), "--convention 'trec_eval': unknown convention"),
    (lambda *a: evaluate_codes(*a, threads="x"), "--threads / threads=: expected a positive integer or None, got 'x'"),
    (lambda *a: evaluate_codes(*a, threads=0), "--threads / threads=: expected a positive integer or None, got 0"),
    (lambda *a: evaluate_codes(*a, nbits=8.0), "nbits: expected an integer in 1..4096 or None, got 8.0"),
    (lambda *a: Evaluator(nbits="x"), "nbits: expected an integer in 1..4096 or None, got 'x'"),
    (lambda *a: Evaluator(nbits=4097), "nbits: expected an integer in 1..4096 or None, got 4097"),
    (lambda *a: Evaluator().merge(5), "merge: expected an Evaluator, got int"),
    (lambda *a: Evaluator(nbits=4).add_database(np.array([[0b10001000]], np.uint8)),
     "db_codes: packed codes have bits set beyond nbits=4"),
    (lambda q, d, ql, dl: evaluate_codes(q, d, relevant=[[0.5]] + [[]] * 9),
     "relevant: query 0's list holds float64, not integer indices"),
])
def test_bad_arguments_are_refused_by_name(data, call, needle):
    with pytest.raises(InputError, match="^" + re.escape(needle)):
        call(*data)


def test_the_python_api_on_a_dataset_takes_one_value_and_checks_threads(class_dataset):
    _same(hashdist.evaluate(class_dataset, cache=False, k=5, radius=1, threads=1),
          hashdist.evaluate(class_dataset, cache=False, k=[5], radius=[1], threads=1))
    with pytest.raises(InputError, match="--threads / threads="):
        hashdist.evaluate(class_dataset, cache=False, threads=-1)


def test_a_refused_merge_or_compute_leaves_the_evaluator_unchanged(data):
    q, d, ql, dl = data
    ev = Evaluator().add_database(d, dl).add_queries(q, ql)
    for bad in (lambda: ev.merge(None), lambda: ev.merge(ev), lambda: ev.compute(k="5"), lambda: ev.compute(threads=0),
                lambda: ev.compute(relevant=[[]] * 9)):
        with pytest.raises(InputError):
            bad()
    _same(ev.compute(), evaluate_codes(q, d, ql, dl))


def test_errors_about_the_arrays_do_not_name_the_runs_in_memory_store(data):
    q, d, ql, dl = data
    with pytest.raises(InputError, match="^--relevance multilabel: dataset <arrays> supports only class$"):
        evaluate_codes(q, d, ql, dl, relevance="multilabel")
