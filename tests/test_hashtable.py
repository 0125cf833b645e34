"""The hashtable-bucket kernel against brute force over unpacked bits."""

import numpy as np
import pytest

from hashdist.data.bits import pack_bits
from hashdist.errors import InputError
from hashdist.kernels.hashtable import hashtable_counts
from hashdist.metrics.radius import hashtable_metrics
from hashdist.options import parse_hashtable


def _brute_retrieved(q_bits, db_bits, k_bits, n_tables):
    """(Q, N) bool: some substring [l*K, (l+1)*K) of the item equals the query's."""
    hit = np.zeros((len(q_bits), len(db_bits)), bool)
    for table in range(n_tables):
        s = slice(table * k_bits, (table + 1) * k_bits)
        hit |= (q_bits[:, None, s] == db_bits[None, :, s]).all(-1)
    return hit


def _codes(rng, n, nbits, flip=0.08, centres=None):
    """Random codes with many shared substrings: copies of a few centres with some bits flipped."""
    centres = rng.integers(0, 2, (4, nbits), dtype=np.uint8) if centres is None else centres
    bits = centres[rng.integers(0, len(centres), n)]
    return bits ^ (rng.random((n, nbits)) < flip).astype(np.uint8), centres


@pytest.mark.parametrize("nbits,k_bits,n_tables", [(12, 3, 4), (70, 7, 10), (130, 65, 2), (200, 40, 3), (64, 64, 1)])
def test_class_counts_match_brute_force(nbits, k_bits, n_tables):
    rng = np.random.default_rng(nbits)
    q, centres = _codes(rng, 13, nbits, flip=0.7 / k_bits)
    db, _ = _codes(rng, 300, nbits, flip=0.7 / k_bits, centres=centres)
    ql, dl = rng.integers(0, 3, 13), rng.integers(0, 3, 300)
    tp, retrieved = hashtable_counts(pack_bits(q), pack_bits(db), nbits, k_bits, n_tables, ql, dl, "class")
    hit = _brute_retrieved(q, db, k_bits, n_tables)
    assert hit.any() and not hit.all()
    assert (retrieved == hit.sum(1)).all()
    assert (tp == (hit & (ql[:, None] == dl[None, :])).sum(1)).all()


def test_multilabel_counts_any_common_label():
    rng = np.random.default_rng(1)
    nbits, k_bits, n_tables = 66, 11, 6  # substrings cross the word boundary at bit 64
    q, centres = _codes(rng, 9, nbits)
    db, _ = _codes(rng, 200, nbits, centres=centres)
    ql = (rng.random((9, 70)) < 0.05).astype(np.uint8)  # two label words
    dl = (rng.random((200, 70)) < 0.05).astype(np.uint8)
    tp, retrieved = hashtable_counts(
        pack_bits(q), pack_bits(db), nbits, k_bits, n_tables, pack_bits(ql), pack_bits(dl), "multilabel"
    )
    hit = _brute_retrieved(q, db, k_bits, n_tables)
    relevant = (ql.astype(int) @ dl.T.astype(int)) > 0
    assert (retrieved == hit.sum(1)).all()
    assert (tp == (hit & relevant).sum(1)).all()


def test_explicit_counts_sum_over_database_blocks():
    rng = np.random.default_rng(2)
    nbits, k_bits, n_tables = 16, 4, 4
    q, centres = _codes(rng, 7, nbits)
    db, _ = _codes(rng, 120, nbits, centres=centres)
    grade = rng.integers(0, 3, (7, 120)) * (rng.random((7, 120)) < 0.3)
    listed = grade > 0
    listed[:, ::11] = True  # some listed pairs with grade 0: not relevant
    indptr = np.concatenate([[0], np.cumsum(listed.sum(1))])
    indices = np.nonzero(listed)[1]
    grades = grade[listed]
    tp = np.zeros(7, np.int64)
    retrieved = np.zeros(7, np.int64)
    for d0 in range(0, 120, 50):
        t, r = hashtable_counts(pack_bits(q), pack_bits(db[d0 : d0 + 50]), nbits, k_bits, n_tables,
                                (indptr, indices, grades), None, "explicit", db_start=d0)
        tp += t
        retrieved += r
    hit = _brute_retrieved(q, db, k_bits, n_tables)
    assert (retrieved == hit.sum(1)).all()
    assert (tp == (hit & (grade >= 1)).sum(1)).all()


def test_one_table_of_all_bits_is_radius_zero():
    rng = np.random.default_rng(3)
    q, centres = _codes(rng, 5, 10)
    db, _ = _codes(rng, 100, 10, centres=centres)
    _, retrieved = hashtable_counts(pack_bits(q), pack_bits(db), 10, 10, 1, np.zeros(5), np.zeros(100), "class")
    assert (retrieved == (q[:, None, :] == db[None, :, :]).all(-1).sum(1)).all()


def test_metrics_are_micro_scores():
    m = hashtable_metrics(tp_total=3, retrieved_total=4, relevant_total=5, beta=1.0)  # the thesis's toy example
    assert (m["tp"], m["fp"], m["fn"]) == (3, 1, 2)
    assert m["precision"] == 0.75 and m["recall"] == 0.6
    assert m["f_beta"] == pytest.approx(2 * 0.75 * 0.6 / 1.35)


def test_parse_spec():
    assert parse_hashtable("8x4") == (8, 4)
    assert parse_hashtable(" 16X2 ", nbits=32) == (16, 2)
    for bad in ("8", "8x", "x4", "0x4", "8x0", "-8x4", "8*4", "a x b"):
        with pytest.raises(InputError, match="expected KxL"):
            parse_hashtable(bad)
    with pytest.raises(InputError, match="exceeds the 32-bit codes"):
        parse_hashtable("8x5", nbits=32)


def test_kernel_refuses_substrings_beyond_the_code():
    with pytest.raises(ValueError):
        hashtable_counts(np.zeros((1, 1), np.uint64), np.zeros((1, 1), np.uint64), 16, 8, 3,
                         np.zeros(1), np.zeros(1), "class")
