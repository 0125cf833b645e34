"""The torch engine: per-block histograms identical (==) to the numba kernel's and to a brute force over pairs,
for B from 1 to 4,096, class, multi-label and explicit relevance, and database blocks not a multiple of the
sub-block; evaluate_codes(engine="torch") and HashingMetrics(engine="torch") give the numba engine's report."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import hashdist  # noqa: E402
from hashdist.data.bits import pack_bits  # noqa: E402
from hashdist.kernels.histogram import histogram_block  # noqa: E402
from hashdist.kernels.torchhist import _steps, popcount64, torch_histogram_block  # noqa: E402
from tests.reference import grades_class, grades_multilabel, hamming_bruteforce, histograms_bruteforce  # noqa: E402

WIDTHS = (1, 7, 8, 63, 64, 65, 128, 1000, 4096)


def test_popcount64_every_bit_pattern_kind():
    rng = np.random.default_rng(0)
    words = np.concatenate([rng.integers(0, 2**63, 1000, dtype=np.uint64) * np.uint64(2) + np.uint64(1),
                            np.array([0, 2**64 - 1, 2**63, 2**63 - 1, 1], dtype=np.uint64)])
    got = popcount64(torch.from_numpy(words.view(np.int64)).clone()).numpy()  # in place: a copy
    assert np.array_equal(got, np.bitwise_count(words).astype(np.int64))


def _data(rng, nbits, n_q=9, n_db=203, n_concepts=70):
    """Clustered codes (many equal codes and distances) and labels."""
    centres = rng.integers(0, 2, (3, nbits))
    qb = centres[rng.integers(0, 3, n_q)] ^ (rng.random((n_q, nbits)) < 0.05)
    db = centres[rng.integers(0, 3, n_db)] ^ (rng.random((n_db, nbits)) < 0.05)
    qm = (rng.random((n_q, n_concepts)) < 0.1).astype(np.uint8)
    dm = (rng.random((n_db, n_concepts)) < 0.1).astype(np.uint8)
    return qb, db, rng.integers(0, 3, n_q), rng.integers(0, 3, n_db), qm, dm


@pytest.mark.parametrize("nbits", WIDTHS)
def test_histograms_equal_numba_and_brute_force(nbits):
    rng = np.random.default_rng(nbits)
    qb, db, ql, dl, qm, dm = _data(rng, nbits)
    q, d = pack_bits(qb), pack_bits(db)
    dist = hamming_bruteforce(qb, db)
    top = int(qm.sum(axis=1).max())
    budget = 9 * 50  # sub-blocks of 9 x 50 items: 203 is not a multiple
    assert _steps(9, 203, budget) == (9, 50)
    cases = {
        "class": (ql, dl, 1, grades_class(ql, dl), 2),
        "multilabel": (pack_bits(qm), pack_bits(dm), top, grades_multilabel(qm, dm, top), top + 1),
    }
    for kind, (qr, dr, max_grade, grades, ncols) in cases.items():
        got = torch_histogram_block(q, d, nbits, kind, qr, dr, max_grade=max_grade, budget=budget)
        assert np.array_equal(got, histogram_block(q, d, nbits, kind, qr, dr, max_grade=max_grade)), kind
        assert np.array_equal(got, histograms_bruteforce(dist, grades, nbits, ncols)), kind
        assert got.dtype == np.int64


def test_explicit_relevance_and_capped_grades():
    rng = np.random.default_rng(5)
    qb, db, *_ , qm, dm = _data(rng, 33)
    q, d = pack_bits(qb), pack_bits(db)
    indptr, indices = np.array([0, 2, 2, 5, 5, 5, 6, 6, 6, 7]), np.array([3, 100, 0, 1, 202, 7, 150])
    grades = np.array([1, 3, 2, 1, 1, 2, 1])
    rel = (indptr, indices, grades)
    for kind, qr, dr, max_grade in (("explicit", rel, None, 2), ("multilabel", pack_bits(qm), pack_bits(dm), 1)):
        want = histogram_block(q, d, 33, kind, qr, dr, max_grade=max_grade, db_start=0)
        assert np.array_equal(torch_histogram_block(q, d, 33, kind, qr, dr, max_grade=max_grade, budget=100), want)


@pytest.mark.parametrize("labels", ["class", "multilabel"])
def test_evaluate_codes_torch_engine_report(labels):
    rng = np.random.default_rng(11)
    qb, db, ql, dl, qm, dm = _data(rng, 20, n_q=40, n_db=900, n_concepts=6)
    qr, dr = (ql, dl) if labels == "class" else (qm, dm)
    numba = hashdist.evaluate_codes(qb, db, qr, dr, k=[10, 100], radius=[0, 3], engine="numba")
    by_torch = hashdist.evaluate_codes(torch.from_numpy(qb), torch.from_numpy(db), qr, dr, k=[10, 100],
                                       radius=[0, 3], engine="torch", db_block_rows=512)
    assert by_torch["metrics"] == numba["metrics"]
    assert by_torch["code_usage"] == numba["code_usage"]
    assert by_torch["engine"]["histograms"] == "torch on cpu" and "histograms" not in numba["engine"]


def test_hashing_metrics_torch_engine():
    from hashdist.integrations.torchmetrics import HashingMetrics

    rng = np.random.default_rng(12)
    qb, db, ql, dl, *_ = _data(rng, 64, n_q=30, n_db=500)
    reports = []
    for engine in ("numba", "torch", "auto"):
        metric = HashingMetrics(k=[10], engine=engine)
        metric.update_database(torch.from_numpy(db), torch.from_numpy(dl))
        metric.update_queries(torch.from_numpy(qb), torch.from_numpy(ql))
        reports.append(metric.report())
    assert reports[0]["metrics"] == reports[1]["metrics"] == reports[2]["metrics"]
    assert reports[1]["engine"]["histograms"] == "torch on cpu"
    assert "histograms" not in reports[2]["engine"]  # auto on the CPU: numba


def test_engine_option_checked():
    with pytest.raises(hashdist.InputError, match="engine='cuda'"):
        hashdist.EvaluateOptions(engine="cuda")
    with pytest.raises(hashdist.InputError, match="device="):
        hashdist.EvaluateOptions(device=0)
    assert hashdist.EvaluateOptions(device="cuda:1").histogram_engine == "torch"
    assert hashdist.EvaluateOptions(device="cpu").histogram_engine == "numba"


def test_tensors_that_require_grad_are_accepted():
    rng = np.random.default_rng(13)
    qb, db, ql, dl, *_ = _data(rng, 16, n_q=10, n_db=100)
    outputs = torch.from_numpy(db * 2.0 - 1).requires_grad_()
    report = hashdist.evaluate_codes(torch.from_numpy(qb), outputs, ql, dl, k=[5])
    assert report["metrics"] == hashdist.evaluate_codes(qb, db, ql, dl, k=[5])["metrics"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_cuda_tensors_take_the_torch_engine():
    """engine="auto" with codes on a GPU: histograms counted there, the numba engine's report."""
    from hashdist.integrations.torchmetrics import HashingMetrics

    rng = np.random.default_rng(14)
    qb, db, ql, dl, qm, dm = _data(rng, 100, n_q=50, n_db=3000, n_concepts=8)
    for qr, dr in ((ql, dl), (qm, dm)):
        numba = hashdist.evaluate_codes(qb, db, qr, dr, k=[10, 100])
        on_gpu = hashdist.evaluate_codes(torch.from_numpy(qb).cuda(), torch.from_numpy(db).cuda(), qr, dr, k=[10, 100])
        assert on_gpu["engine"]["histograms"].startswith("torch on cuda")
        assert on_gpu["metrics"] == numba["metrics"]
        metric = HashingMetrics(k=[10, 100]).cuda()
        metric.update_database(torch.from_numpy(db).cuda(), torch.from_numpy(dr).cuda())
        metric.update_queries(torch.from_numpy(qb).cuda(), torch.from_numpy(qr).cuda())
        assert metric.report()["metrics"] == numba["metrics"]


def test_every_width_through_three_words():
    """Every B from 1 to 192 (each word boundary and padding), class and multi-label in turn, tiny blocks."""
    rng = np.random.default_rng(15)
    qb, db = rng.integers(0, 2, (3, 192)), rng.integers(0, 2, (17, 192))
    ql, dl = rng.integers(0, 2, 3), rng.integers(0, 2, 17)
    qm, dm = pack_bits(rng.integers(0, 2, (3, 5))), pack_bits(rng.integers(0, 2, (17, 5)))
    for nbits in range(1, 193):
        q, d = pack_bits(qb[:, :nbits]), pack_bits(db[:, :nbits])
        kind, qr, dr, top = ("class", ql, dl, 1) if nbits % 2 else ("multilabel", qm, dm, 5)
        got = torch_histogram_block(q, d, nbits, kind, qr, dr, max_grade=top, budget=20)
        assert np.array_equal(got, histogram_block(q, d, nbits, kind, qr, dr, max_grade=top)), nbits
