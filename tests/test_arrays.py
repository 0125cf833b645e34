"""Arrays in, report out: evaluate_codes and the streaming Evaluator against ingest + evaluate and scikit-learn."""

import numpy as np
import pytest

import hashdist
from hashdist.api import evaluate_local
from hashdist.arrays import Evaluator, evaluate_codes
from hashdist.data.ingest import ingest
from hashdist.errors import InputError
from tests.conftest import write_inputs

IGNORED = ("dataset", "timing", "throughput", "provenance", "engine", "outputs")


def _same(a: dict, b: dict) -> None:
    """Identical reports apart from paths and timing."""
    assert {k: v for k, v in a.items() if k not in IGNORED} == {k: v for k, v in b.items() if k not in IGNORED}
    assert a["dataset"]["fingerprint"] == b["dataset"]["fingerprint"]


@pytest.mark.parametrize("kind", ["class", "multilabel"])
def test_arrays_give_the_report_of_the_ingested_dataset(tmp_path, kind):
    p = write_inputs(tmp_path, kind=kind, nbits=20, n_db=2500, n_q=40, seed=3)
    ingest(tmp_path / "d.zarr", p["db"], p["q"], db_labels=p["dbl"], query_labels=p["ql"])
    on_disk = evaluate_local(tmp_path / "d.zarr", cache=False, k=[5, 100], hashtable=["5x4"]).report
    arrays = {name: np.load(path) for name, path in p.items()}
    before = sorted(tmp_path.rglob("*"))
    in_memory = hashdist.evaluate_codes(arrays["q"], arrays["db"], arrays["ql"], arrays["dbl"], k=[5, 100],
                                        hashtable=["5x4"])
    _same(in_memory, on_disk)
    assert in_memory["dataset"]["path"] == "<arrays>"
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


@pytest.mark.parametrize("batches", [(1, 1), (3, 7), (17, 400)])
def test_evaluator_in_batches_equals_whole_arrays(batches):
    rng = np.random.default_rng(5)
    q, db = rng.integers(0, 2, (60, 10)) * 2 - 1, rng.integers(0, 2, (1500, 10)) * 2 - 1  # {-1,+1}
    ql, dbl = rng.integers(0, 5, 60), rng.integers(0, 5, 1500)
    whole = evaluate_codes(q, db, ql, dbl, k=[10])
    qb, dbb = batches
    left, right = Evaluator(), Evaluator()
    for start in range(0, 1500, dbb):
        (left if start < 700 else right).add_database(db[start : start + dbb], dbl[start : start + dbb])
    for start in range(0, 60, qb):
        (left if start < 30 else right).add_queries(q[start : start + qb], ql[start : start + qb])
    _same(left.merge(right).compute(k=[10]), whole)


def test_packed_bool_and_dlpack_inputs_agree():
    rng = np.random.default_rng(1)
    q, db = rng.integers(0, 2, (30, 13)).astype(bool), rng.integers(0, 2, (400, 13)).astype(bool)
    ql, dbl = rng.integers(0, 3, 30), rng.integers(0, 3, 400)
    plain = evaluate_codes(q.astype(np.uint8), db.astype(np.uint8), ql, dbl)
    packed = evaluate_codes(np.packbits(q, axis=1), np.packbits(db, axis=1), ql, dbl, nbits=13)

    class Tensor:  # exposes only __dlpack__, like a CPU torch tensor
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kwargs):
            return self.a.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    tensors = evaluate_codes(Tensor(q), Tensor(db), Tensor(ql), Tensor(dbl))
    _same(packed, plain)
    _same(tensors, plain)


def test_map_against_scikit_learn_on_tie_free_codes():
    """Distinct distances (one database item per distance): mAP is scikit-learn's average precision."""
    from sklearn.metrics import average_precision_score

    nbits = 40
    rng = np.random.default_rng(2)
    q = np.zeros((1, nbits), np.uint8)
    db = np.array([[1] * d + [0] * (nbits - d) for d in range(nbits + 1)], np.uint8)  # distance d for item d
    dbl = rng.integers(0, 2, nbits + 1)
    dbl[0] = 1
    report = evaluate_codes(q, db, np.array([1]), dbl)
    want = average_precision_score(dbl == 1, -np.arange(nbits + 1))
    for policy in ("expected", "best", "worst"):
        assert report["metrics"]["map"][policy] == pytest.approx(want, abs=1e-12)


def test_explicit_relevance_as_lists_and_csr():
    rng = np.random.default_rng(4)
    q, db = rng.integers(0, 2, (5, 8)), rng.integers(0, 2, (90, 8))
    lists = [np.sort(rng.choice(90, size=n, replace=False)) for n in (3, 0, 7, 1, 12)]
    indptr = np.concatenate([[0], np.cumsum([len(x) for x in lists])])
    as_lists = evaluate_codes(q, db, relevant=lists)
    as_csr = evaluate_codes(q, db, relevant=(indptr, np.concatenate(lists)))
    _same(as_lists, as_csr)
    assert as_lists["queries"] == {"total": 5, "evaluated": 4, "without_relevant": 1}


@pytest.mark.parametrize("call, needle", [
    (lambda q, d, ql, dl: evaluate_codes(q[:, :7], d, ql, dl),
     "query_codes: codes have 7 bits but earlier codes have 8"),
    (lambda q, d, ql, dl: evaluate_codes(q, d, ql[:3], dl), "query_labels: 3 labels but 10 codes"),
    (lambda q, d, ql, dl: evaluate_codes(q * 2, d, ql, dl), "query_codes: code values must be in"),
    (lambda q, d, ql, dl: evaluate_codes(q.astype(float) * np.nan, d, ql, dl), "query_codes: codes contain NaN"),
    (lambda q, d, ql, dl: evaluate_codes(q[0], d, ql, dl), "query_codes: codes must be a non-empty 2-D array"),
    (lambda q, d, ql, dl: evaluate_codes(q, d, ql, None), "must be given together"),
    (lambda q, d, ql, dl: evaluate_codes(q, d, ql, dl, k=[0]), "--k"),
    (lambda q, d, ql, dl: evaluate_codes(q, d, ql, dl[:, None] * 0 + 1), "query_labels: 1-D class labels, but"),
    (lambda q, d, ql, dl: evaluate_codes(q, d, relevant=[[1]]), "relevant: 1 lists for 10 queries"),
    (lambda q, d, ql, dl: evaluate_codes(q, d, relevant=[[99]] * 10), "relevant: indices out of range"),
])
def test_bad_input_names_the_argument(call, needle):
    rng = np.random.default_rng(0)
    q, d = rng.integers(0, 2, (10, 8)), rng.integers(0, 2, (50, 8))
    with pytest.raises(InputError, match=needle.replace("(", r"\(").replace("[", r"\[")):
        call(q, d, rng.integers(0, 3, 10), rng.integers(0, 3, 50))


def test_refused_batch_leaves_the_evaluator_usable():
    rng = np.random.default_rng(0)
    q, d = rng.integers(0, 2, (10, 8)), rng.integers(0, 2, (50, 8))
    ql, dl = rng.integers(0, 3, 10), rng.integers(0, 3, 50)
    ev = Evaluator().add_database(d, dl)
    for bad in (lambda: ev.add_database(d[:, :5], dl), lambda: ev.add_database(d * 2 - 1, dl),
                lambda: ev.add_queries(q, None), lambda: ev.add_queries(q, np.ones((10, 4), np.uint8))):
        with pytest.raises(InputError):
            bad()
    ev.add_queries(q, ql)
    _same(ev.compute(), evaluate_codes(q, d, ql, dl))


def test_cache_argument_of_the_python_api(tmp_path, monkeypatch, class_dataset):
    """True means the per-user cache, as None does; anything but a flag or a directory is refused by name."""
    monkeypatch.setenv("HASHDIST_CACHE", str(tmp_path / "user-cache"))
    uncached = hashdist.evaluate(class_dataset, cache=False)
    assert not list((tmp_path / "user-cache").rglob("*.npz"))  # (generated kernels may be cached there)
    cached = hashdist.evaluate(class_dataset, cache=True)
    assert list((tmp_path / "user-cache").rglob("*.npz"))
    _same(cached, uncached)
    with pytest.raises(InputError, match="cache must be None or True .* got float 1.5"):
        hashdist.evaluate(class_dataset, cache=1.5)
