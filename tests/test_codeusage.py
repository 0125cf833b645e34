"""Code usage against plain numpy on small data."""

import numpy as np
import pytest

from hashdist.data.bits import pack_bits
from hashdist.kernels.codecounts import _build_table, code_counts, code_parts_of, rows_in_parts, split_by_code_hash
from hashdist.kernels.codeusage import bit_ones_block, bucket_sizes, code_usage, merge_bucket_sizes, rank_size_steps


@pytest.mark.parametrize("nbits", [1, 13, 64, 65, 130])
def test_bit_ones_block(nbits):
    rng = np.random.default_rng(nbits)
    bits = (rng.random((257, nbits)) < rng.random(nbits)).astype(np.uint8)
    assert (bit_ones_block(pack_bits(bits), nbits) == bits.sum(0)).all()


@pytest.mark.parametrize("words", [1, 3])
def test_rows_in_parts_are_the_rows_of_split_by_code_hash(words):
    """A pass's rows are those split_by_code_hash puts in its parts, in row order; a pass over every part takes
    every row (without hashing them)."""
    codes = np.random.default_rng(words).integers(0, 1 << 62, (400, words), dtype=np.uint64)
    codes[200:] = codes[:200]  # repeated codes: a code's rows all go to its part
    parts = 5
    piece_of = np.empty(len(codes), dtype=np.int64)
    for p, (piece, _) in enumerate(split_by_code_hash(codes, None, parts)):
        for row in piece:
            piece_of[(codes == row).all(axis=1)] = p
    for start, stop in [(0, 5), (-1, 9), (0, 1), (1, 3), (4, 5), (2, 2)]:
        want = codes[(piece_of >= start) & (piece_of < stop)]
        got = rows_in_parts(codes, parts, start, stop)
        assert got.dtype == np.uint64 and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert len(rows_in_parts(codes, parts, 0, parts)) == len(codes)
    assert 0 < len(rows_in_parts(codes, parts, 0, 1)) < len(codes)


def _splitmix_chain(row) -> int:
    """The code hash in Python integers: splitmix64's finaliser chained over the words (mod 2^64)."""
    mask, h = (1 << 64) - 1, 0x9E3779B97F4A7C15
    for word in row:
        x = int(word) ^ h
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        h = x ^ (x >> 31)
    return h


@pytest.mark.parametrize("words", [1, 2, 3])
@pytest.mark.parametrize("parts", [1, 2, 7, 300, 70000])
def test_code_parts_and_split_against_python_integers(words, parts):
    """A code's part is the upper 32 bits of its hash scaled to the parts; split keeps each part's rows in order."""
    rng = np.random.default_rng(words * parts)
    codes = rng.integers(0, 1 << 63, (300, words), dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    codes[150:] = codes[:150]
    want = np.array([((_splitmix_chain(row) >> 32) * parts) >> 32 for row in codes])
    np.testing.assert_array_equal(code_parts_of(codes, parts), want)
    counts = np.arange(len(codes), dtype=np.int64)
    pieces = split_by_code_hash(codes, counts, parts)
    assert len(pieces) == parts
    for p, (piece, piece_counts) in enumerate(pieces):
        np.testing.assert_array_equal(piece, codes[want == p])
        np.testing.assert_array_equal(piece_counts, counts[want == p])


def test_the_tables_hash_is_the_parts_hash():
    """The jitted hash tables use the lower bits of the same hash (a part's codes fill its table evenly)."""
    codes = np.random.default_rng(5).integers(0, 1 << 62, (3, 2), dtype=np.uint64)
    slots = np.full(1 << 20, -1, dtype=np.int64)  # few codes, a large table: each lands in its home slot
    _build_table(codes, slots)
    for i, row in enumerate(codes):
        assert slots[_splitmix_chain(row) & ((1 << 20) - 1)] == i


def test_code_usage_matches_numpy():
    rng = np.random.default_rng(0)
    nbits = 6
    bits = rng.integers(0, 2, (500, nbits), dtype=np.uint8)
    bits[:100] = 1  # one heavy bucket
    _, counts = code_counts(pack_bits(bits))
    usage = code_usage(bucket_sizes(counts), bit_ones_block(pack_bits(bits), nbits), 500, nbits)

    _, inverse, per_code = np.unique(bits, axis=0, return_inverse=True, return_counts=True)
    p = per_code / 500
    assert usage["distinct_codes"] == len(per_code)
    assert usage["max_bucket"] == per_code.max() >= 100
    assert usage["collision_fraction"] == pytest.approx((per_code[inverse.ravel()] > 1).mean(), abs=1e-15)
    assert usage["entropy_bits"] == pytest.approx(-(p * np.log2(p)).sum(), rel=1e-13)
    assert usage["entropy_ratio"] == pytest.approx(usage["entropy_bits"] / nbits, rel=1e-13)
    assert usage["bit_balance"] == pytest.approx(bits.mean(0).tolist(), abs=1e-15)


def test_extremes():
    all_same = code_usage(bucket_sizes(np.array([10])), np.full(4, 10), 10, 4)
    assert all_same["entropy_bits"] == 0.0 and all_same["collision_fraction"] == 1.0
    assert all_same["bit_balance"] == [1.0] * 4
    all_distinct = code_usage(bucket_sizes(np.ones(16, np.int64)), np.full(4, 8), 16, 4)
    assert all_distinct["entropy_bits"] == pytest.approx(4.0) and all_distinct["entropy_ratio"] == pytest.approx(1.0)
    assert all_distinct["collision_fraction"] == 0.0 and all_distinct["max_bucket"] == 1
    with pytest.raises(ValueError):
        code_usage(bucket_sizes(np.array([3, 4])), np.zeros(4), 8, 4)


def test_bucket_sizes_merge_over_any_split_and_give_the_rank_size_curve():
    rng = np.random.default_rng(1)
    counts = rng.zipf(1.6, 3000).clip(max=10**6).astype(np.int64)
    whole = bucket_sizes(counts)
    cuts = np.sort(rng.choice(np.arange(1, len(counts)), 6, replace=False))
    parts = [bucket_sizes(c) for c in np.split(rng.permutation(counts), cuts)]
    assert np.array_equal(merge_bucket_sizes(parts[::-1]), whole)
    ranks, sizes = rank_size_steps(whole)
    descending = np.sort(counts)[::-1]
    # each step's size is the count of the code at that rank (1-based), and the last rank is past the end
    assert np.array_equal(descending[ranks[:-1] - 1], sizes[:-1]) and ranks[-1] == len(counts) + 1


def test_code_usage_plot_axes_span_a_decade_with_power_of_ten_labels():
    """A database of distinct codes (every bucket size 1) still gets two labelled decades on each log axis,
    labelled 10 with a superscript exponent."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hashdist.report.render import log_count_axes, png

    ranks, sizes = rank_size_steps(bucket_sizes(np.ones(5, dtype=np.int64)))
    fig, ax = plt.subplots()
    ax.plot(ranks, sizes, drawstyle="steps-post")
    log_count_axes(ax, ranks[-1], sizes[0])
    assert png(fig)
    for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
        labels = [t.get_text() for t in axis.get_ticklabels() if lo <= t.get_position()[axis is ax.yaxis] <= hi]
        assert labels[:2] == ["10\u2070", "10\u00b9"], labels
    plt.close(fig)
