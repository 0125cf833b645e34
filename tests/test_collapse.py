"""Histograms over distinct (code, label) rows equal histogram_block's; distinct_rows; the collisions preset."""

import numpy as np
import pytest

from hashdist.data.dataset import open_dataset
from hashdist.data.synth import PRESETS, synth_dataset
from hashdist.errors import InputError
from hashdist.kernels import collapse
from hashdist.kernels.collapse import (
    auto_histogram_block,
    collapsed_histogram_block,
    should_collapse,
)
from hashdist.kernels.distinct import distinct_rows
from hashdist.kernels.histogram import histogram_block


def _codes(rng, n, nbits):
    words = rng.integers(0, 2**64, size=(n, (nbits + 63) // 64), dtype=np.uint64)
    if nbits % 64:
        words[:, -1] &= np.uint64((1 << (nbits % 64)) - 1)
    return words


def _labels(rng, n, kind, n_labels=24):
    if kind == "class":
        return rng.integers(0, 7, n)
    hot = rng.random((n, n_labels)) < 0.15  # 0..several labels in common: grades get capped
    return (hot.astype(np.uint64) << np.arange(n_labels, dtype=np.uint64)).sum(axis=1, dtype=np.uint64)[:, None]


def _data(rng, n_q, n_db, nbits, kind, collisions):
    """Queries and database rows; with collisions, copies of a few (code, label) rows (some codes shared
    by rows of different labels), else random rows."""
    if not collisions:
        return (_codes(rng, n_q, nbits), _labels(rng, n_q, kind), _codes(rng, n_db, nbits),
                _labels(rng, n_db, kind))
    pool_codes, pool_labels = _codes(rng, 40, nbits), _labels(rng, 60, kind)
    rows = np.stack([rng.integers(0, 40, 60), np.arange(60)], axis=1)  # 60 (code, label) rows over 40 codes

    def draw(n):
        r = rows[rng.integers(0, 60, n)]
        return pool_codes[r[:, 0]], pool_labels[r[:, 1]]

    (qc, ql), (dc, dl) = draw(n_q), draw(n_db)
    return qc, ql, dc, dl


def _assert_identical(H, expected):
    assert H.dtype == expected.dtype and H.shape == expected.shape
    np.testing.assert_array_equal(H, expected)


@pytest.mark.parametrize("collisions", [True, False])
@pytest.mark.parametrize("nbits", [32, 64, 128, 13, 100])
@pytest.mark.parametrize("kind, max_grade", [("class", 1), ("class", 3), ("multilabel", 1), ("multilabel", 2),
                                             ("multilabel", 7)])
def test_collapsed_equals_histogram_block(kind, max_grade, nbits, collisions):
    rng = np.random.default_rng([nbits, max_grade, collisions])
    qc, ql, dc, dl = _data(rng, 37, 1001, nbits, kind, collisions)
    expected = histogram_block(qc, dc, nbits, kind, ql, dl, max_grade=max_grade)
    _assert_identical(collapsed_histogram_block(qc, dc, nbits, kind, ql, dl, max_grade=max_grade), expected)


@pytest.mark.parametrize("kind", ["class", "multilabel"])
@pytest.mark.parametrize("n_q, n_db", [(1, 1), (5, 3), (257, 700), (300, 5003)])
def test_collapsed_equals_histogram_block_odd_sizes(kind, n_q, n_db):
    """Partial query tiles, a partial chunk, and (300 queries) histogram_block's class-split route."""
    rng = np.random.default_rng([n_q, n_db])
    qc, ql, dc, dl = _data(rng, n_q, n_db, 64, kind, True)
    expected = histogram_block(qc, dc, 64, kind, ql, dl, max_grade=3)
    _assert_identical(collapsed_histogram_block(qc, dc, 64, kind, ql, dl, max_grade=3), expected)
    H, info = auto_histogram_block(qc, dc, 64, kind, ql, dl, max_grade=3)
    _assert_identical(H, expected)


def test_many_distinct_rows_span_chunks():
    rng = np.random.default_rng(5)
    qc, ql, dc, dl = _data(rng, 70, 3000, 128, "class", False)
    dc, dl = np.concatenate([dc, dc]), np.concatenate([dl, dl])  # 3,000 distinct rows, each twice
    _assert_identical(collapsed_histogram_block(qc, dc, 128, "class", ql, dl),
                      histogram_block(qc, dc, 128, "class", ql, dl))


@pytest.mark.parametrize("labels", [
    np.array([-3, 5, 2**40, -3, 7], dtype=np.int64),  # beyond int32: relabelled
    np.array([3, 5, 2**63 + 1, 3, 7], dtype=np.uint64),
    np.array([1, 0, 1, 1, 0], dtype=np.int8),
    np.array([True, False, True, True, False]),
])
def test_class_label_dtypes(labels):
    rng = np.random.default_rng(0)
    dc = _codes(rng, 5, 64)[[0, 1, 0, 0, 1]]
    db_labels = np.tile(labels, 40)
    dc = np.tile(dc, (40, 1))
    qc, ql = dc[:9], db_labels[:9]
    _assert_identical(collapsed_histogram_block(qc, dc, 64, "class", ql, db_labels),
                      histogram_block(qc, dc, 64, "class", ql, db_labels))


def test_empty_blocks():
    qc, dc = np.zeros((3, 1), np.uint64), np.zeros((0, 1), np.uint64)
    ql, dl = np.zeros(3, np.int64), np.zeros(0, np.int64)
    _assert_identical(collapsed_histogram_block(qc, dc, 64, "class", ql, dl),
                      histogram_block(qc, dc, 64, "class", ql, dl))
    _assert_identical(collapsed_histogram_block(dc, qc, 64, "class", dl, ql),
                      histogram_block(dc, qc, 64, "class", dl, ql))


def test_other_kinds_are_refused_and_passed_through():
    rng = np.random.default_rng(1)
    qc, dc = _codes(rng, 80, 64), _codes(rng, 2000, 64)
    with pytest.raises(ValueError, match="explicit"):
        collapsed_histogram_block(qc, dc, 64, "explicit", None, None)
    q = np.arange(80)
    csr = (np.arange(0, 161, 2), np.stack([q, q + 1], axis=1).ravel(), np.full(160, 2))  # items q, q + 1
    H, info = auto_histogram_block(qc, dc, 64, "explicit", csr, None, db_start=0, max_grade=2)
    assert not info.collapsed and info.decided_by == "kind"
    _assert_identical(H, histogram_block(qc, dc, 64, "explicit", csr, None, max_grade=2))


# -- distinct_rows ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["class", "multilabel", None])
@pytest.mark.parametrize("nbits", [32, 64, 128, 200])
def test_distinct_rows_round_trip(kind, nbits):
    rng = np.random.default_rng(nbits)
    _, _, codes, labels = _data(rng, 1, 5000, nbits, kind or "class", True)
    if kind is None:
        labels = None
    rows = distinct_rows(codes, labels)
    np.testing.assert_array_equal(rows.codes[rows.inverse], codes)
    assert rows.codes.dtype == np.uint64 and rows.counts.dtype == np.int64
    assert rows.counts.sum() == len(codes)
    np.testing.assert_array_equal(rows.counts, np.bincount(rows.inverse, minlength=len(rows.counts)))
    keys = codes if labels is None else np.concatenate([codes, np.asarray(labels).reshape(len(codes), -1)
                                                        .astype(np.uint64)], axis=1)
    assert len(rows.counts) == len(np.unique(keys, axis=0))
    if labels is None:
        assert rows.labels is None
    else:
        np.testing.assert_array_equal(rows.labels[rows.inverse], labels)
        assert rows.labels.dtype == np.asarray(labels).dtype
    # order of first occurrence: ids appear as 0, 1, 2, ...
    _, first = np.unique(rows.inverse, return_index=True)
    assert np.all(np.diff(first) > 0)


def test_distinct_rows_deterministic_and_same_code_other_label():
    codes = np.array([[5], [5], [7], [5], [7]], dtype=np.uint64)
    labels = np.array([1, 2, 1, 1, 1])
    rows = distinct_rows(codes, labels)
    np.testing.assert_array_equal(rows.codes[:, 0], [5, 5, 7])
    np.testing.assert_array_equal(rows.labels, [1, 2, 1])
    np.testing.assert_array_equal(rows.counts, [2, 1, 2])
    np.testing.assert_array_equal(rows.inverse, [0, 1, 2, 0, 2])


def test_distinct_rows_high_bits_and_table_growth():
    """Codes differing only in their top bits, and enough of them to grow the table several times."""
    n = 20_000
    codes = (np.arange(n, dtype=np.uint64) << np.uint64(48))[:, None]
    codes = np.concatenate([codes, codes[::-1]])
    rows = distinct_rows(codes, np.zeros(2 * n, dtype=np.int64))
    assert len(rows.counts) == n and np.all(rows.counts == 2)
    np.testing.assert_array_equal(rows.codes[rows.inverse], codes)


def test_distinct_rows_max_distinct():
    rng = np.random.default_rng(2)
    _, _, codes, labels = _data(rng, 1, 3000, 64, "class", True)
    u = len(distinct_rows(codes, labels).counts)
    assert distinct_rows(codes, labels, max_distinct=u) is not None
    assert distinct_rows(codes, labels, max_distinct=u - 1) is None


def test_distinct_rows_engine_sized_block_with_repeats():
    """262,144 rows drawn from 2,000 (code, label) rows: the table grows from 1,024 slots, and every
    row maps back to its own (speed is measured in bench/collapse.py, not here)."""
    rng = np.random.default_rng(3)
    codes, labels = _codes(rng, 2000, 64), rng.integers(0, 10, 2000)
    pick = rng.integers(0, 2000, 262_144)
    rows = distinct_rows(codes[pick], labels[pick])
    keys = np.stack([codes[pick, 0], labels[pick].astype(np.uint64)], axis=1)
    assert len(rows.counts) == len(np.unique(keys, axis=0))
    np.testing.assert_array_equal(rows.codes[rows.inverse], codes[pick])
    np.testing.assert_array_equal(rows.labels[rows.inverse], labels[pick])
    np.testing.assert_array_equal(rows.counts, np.bincount(rows.inverse))


# -- the decision ------------------------------------------------------------------


def test_decision_collapses_collisions_and_keeps_distinct_codes():
    rng = np.random.default_rng(4)
    n = 65_536
    qc, ql, dc, dl = _data(rng, 100, n, 64, "class", True)
    H, info = auto_histogram_block(qc, dc, 64, "class", ql, dl)
    assert info.collapsed and info.exact and info.decided_by == "count"
    assert info.n_distinct == len(distinct_rows(dc, dl).counts) and info.n_items == n
    assert info.distinct_fraction == info.n_distinct / n < 0.01
    assert 0 < info.n_distinct_queries <= 60
    _assert_identical(H, histogram_block(qc, dc, 64, "class", ql, dl))

    rc, rl = _codes(rng, n, 64), rng.integers(0, 10, n)
    H, info = auto_histogram_block(qc, rc, 64, "class", ql, rl)
    assert not info.collapsed and info.decided_by == "sample" and not info.exact
    assert info.distinct_fraction == 1.0
    _assert_identical(H, histogram_block(qc, rc, 64, "class", ql, rl))


def test_decision_counts_when_the_sample_is_unsure():
    """A third of the rows distinct: the sample sees repeats, the count stops past the limit."""
    rng = np.random.default_rng(6)
    n = 65_536
    pool, labels = _codes(rng, n // 3, 64), rng.integers(0, 10, n // 3)
    pick = rng.permutation(np.arange(n) % (n // 3))
    rows, info = should_collapse(100, pool[pick], labels[pick], "class")
    assert rows is None and not info.collapsed and info.decided_by == "count" and not info.exact
    assert 0.3 < info.distinct_fraction <= 1.0


def test_collapse_limit():
    assert collapse.collapse_limit(1000, 0) == 0
    assert collapse.collapse_limit(1000, 40) == 0  # counting the block costs more than it saves
    assert 0 < collapse.collapse_limit(100_000, 48) < 0.1 * 100_000  # collapsing pays up to ~1/12 (bench)
    assert 0.15 * 100_000 < collapse.collapse_limit(100_000, 64) < 0.25 * 100_000  # ~1/5 to 1/4
    assert collapse.collapse_limit(100_000, 2048) == 100_000 * collapse.COLLAPSE_FRACTION
    limits = [collapse.collapse_limit(100_000, q) for q in range(1, 3000, 7)]
    assert limits == sorted(limits)


def test_decision_limits():
    rng = np.random.default_rng(7)
    qc, ql, dc, dl = _data(rng, 40, 5000, 64, "class", True)
    _, info = should_collapse(len(qc), dc, dl, "class")
    assert not info.collapsed and info.decided_by == "small"
    rows, info = should_collapse(200, dc, dl, "class")
    assert info.collapsed and rows is not None and rows.counts.sum() == 5000
    _, info = should_collapse(1000, dc[: collapse.MIN_COLLAPSE_ITEMS - 1], dl[: collapse.MIN_COLLAPSE_ITEMS - 1],
                              "class")
    assert not info.collapsed and info.decided_by == "small"
    _, info = should_collapse(1000, dc, None, "explicit")
    assert not info.collapsed and info.decided_by == "kind"


def test_collapsed_histogram_block_reuses_given_rows():
    rng = np.random.default_rng(8)
    qc, ql, dc, dl = _data(rng, 90, 4000, 64, "multilabel", True)
    rows, _ = should_collapse(len(qc), dc, dl, "multilabel")
    assert rows is not None
    _assert_identical(collapsed_histogram_block(qc, dc, 64, "multilabel", ql, dl, max_grade=2, db=rows),
                      histogram_block(qc, dc, 64, "multilabel", ql, dl, max_grade=2))


# -- the collisions preset -------------------------------------------------------------


def _read_all(ds, part):
    n = ds.n_database if part == "database" else ds.n_queries
    return ds.read(f"{part}/codes", 0, n), ds.read(f"{part}/labels", 0, n)


def test_collisions_preset_collapses(tmp_path):
    params = PRESETS["collisions"]
    assert params["labels"] == "class" and params["prototypes"] == 200
    ds = open_dataset(synth_dataset(tmp_path / "c", **params))
    assert (ds.n_database, ds.n_queries, ds.nbits) == (params["n_database"], params["n_queries"], params["nbits"])
    assert ds.attrs()["synth"]["prototypes"] == 200 and ds.attrs()["synth"]["stray"] == params["stray"]
    dc, dl = _read_all(ds, "database")
    rows = distinct_rows(dc, dl)
    assert len(rows.counts) / len(dc) < 0.03  # ~2,000 prototypes + 1% strays
    # one class per prototype code; items stay near their class (prototypes are centre + noise)
    top = np.argsort(rows.counts)[::-1][:2000]
    assert rows.counts[top].sum() > 0.98 * len(dc)
    assert len(np.unique(rows.codes[top], axis=0)) == 2000
    qc, ql = _read_all(ds, "queries")
    H, info = auto_histogram_block(qc[:500], dc[:50_000], 64, "class", ql[:500], dl[:50_000])
    assert info.collapsed
    _assert_identical(H, histogram_block(qc[:500], dc[:50_000], 64, "class", ql[:500], dl[:50_000]))


def test_prototypes_deterministic_per_seed(tmp_path):
    kw = dict(PRESETS["collisions"], n_database=6000, n_queries=50, chunk_rows=1000)
    a = open_dataset(synth_dataset(tmp_path / "a", **kw, seed=3))
    b = open_dataset(synth_dataset(tmp_path / "b", **dict(kw, chunk_rows=4096), seed=3))
    c = open_dataset(synth_dataset(tmp_path / "c", **kw, seed=4))
    for part in ("database", "queries"):
        for x, y in zip(_read_all(a, part), _read_all(b, part), strict=True):
            np.testing.assert_array_equal(x, y)
    assert not np.array_equal(_read_all(a, "database")[0], _read_all(c, "database")[0])


def test_prototypes_multilabel_and_strays(tmp_path):
    ds = open_dataset(synth_dataset(tmp_path / "m", n_database=4000, n_queries=10, nbits=128, labels="multilabel",
                                    n_concepts=12, noise=0.1, prototypes=5, stray=0.0))
    codes, _ = _read_all(ds, "database")
    assert len(np.unique(codes, axis=0)) <= 12 * 5
    ds = open_dataset(synth_dataset(tmp_path / "s", n_database=4000, n_queries=10, nbits=64, labels="class",
                                    n_classes=3, prototypes=2, stray=0.5))
    codes, labels = _read_all(ds, "database")
    rows = distinct_rows(codes, labels)
    top = np.argsort(rows.counts)[::-1][:6]  # the 3 x 2 prototypes, each on ~1/12 of the items
    assert 0.45 < rows.counts[top].sum() / len(codes) < 0.55
    assert 6 < len(rows.counts) <= 6 + 6 * 64
    # every code is a prototype of its class or one bit off it
    bits = np.unpackbits(codes.view(np.uint8), axis=1)
    proto_bits = np.unpackbits(rows.codes[top].view(np.uint8), axis=1)
    dist = (bits[:, None, :] != proto_bits[None, :, :]).sum(axis=2)
    same_class = labels[:, None] == rows.labels[top][None, :]
    assert np.all(np.where(same_class, dist, 99).min(axis=1) <= 1)


def test_without_prototypes_datasets_are_unchanged(tmp_path):
    ds = open_dataset(synth_dataset(tmp_path / "x", n_database=500, n_queries=5, nbits=16))
    assert "prototypes" not in ds.attrs()["synth"] and "stray" not in ds.attrs()["synth"]


@pytest.mark.parametrize("kw, option", [
    (dict(prototypes=-1), "--prototypes"),
    (dict(prototypes=1.5), "--prototypes"),
    (dict(stray=0.1), "--stray"),  # without prototypes
    (dict(prototypes=3, stray=1.5), "--stray"),
    (dict(prototypes=2**20, n_classes=2**10, nbits=64), "--prototypes"),
])
def test_bad_prototype_arguments(tmp_path, kw, option):
    with pytest.raises(InputError) as exc:
        synth_dataset(tmp_path / "bad", **dict(dict(n_database=100, n_queries=10, labels="class"), **kw))
    assert option in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "bad").exists()
