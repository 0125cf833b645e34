"""How a method uses its code space (docs/metrics.md, section 4; the mLGAP paper's Fig. 1 and 8).

From the database's bucket sizes (how many distinct codes hold exactly s items, for
each s: a small, mergeable summary, so no process needs every distinct code) and the
per-bit counts of set bits: the number of distinct codes, the largest bucket, the
fraction of items sharing their code with another item, the entropy of the code
distribution in bits (and divided by B), and each bit's mean (bit balance, 0.5 ideal).
"""

from __future__ import annotations

import math

import numpy as np

from hashdist.kernels import cached_njit


@cached_njit(nogil=True)
def _bit_ones(words, out):
    for w in range(words.shape[1]):
        for b in range(64):
            shift = np.uint64(b)
            ones = 0
            for j in range(words.shape[0]):
                ones += np.int64((words[j, w] >> shift) & np.uint64(1))
            out[w * 64 + b] = ones


def bit_ones_block(codes_words: np.ndarray, nbits: int) -> np.ndarray:
    """int64 (B,): how many rows of this block have bit i set (sum the blocks for the database)."""
    words = np.ascontiguousarray(codes_words, dtype=np.uint64)
    out = np.zeros(words.shape[1] * 64, dtype=np.int64)
    _bit_ones(words, out)
    return out[:nbits]


def bucket_sizes(code_counts: np.ndarray) -> np.ndarray:
    """(S, 2) int64 rows ``(size, codes)``, sizes ascending: ``codes`` distinct codes hold ``size`` items each."""
    sizes, codes = np.unique(np.asarray(code_counts, dtype=np.int64), return_counts=True)
    return np.stack([sizes, codes.astype(np.int64)], axis=1).reshape(-1, 2)


def merge_bucket_sizes(parts) -> np.ndarray:
    """Bucket sizes of disjoint sets of codes (code-count parts), summed per size."""
    rows = np.concatenate([np.asarray(p, dtype=np.int64).reshape(-1, 2) for p in parts])
    sizes, inverse = np.unique(rows[:, 0], return_inverse=True)
    codes = np.zeros(len(sizes), dtype=np.int64)
    np.add.at(codes, inverse.reshape(-1), rows[:, 1])
    return np.stack([sizes, codes], axis=1).reshape(-1, 2)


def rank_size_steps(sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rank-size curve (codes ordered by items, most used first) as steps: x = first rank of each
    run of equal sizes plus one past the last code, y = that run's size (the last repeated)."""
    sizes = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)[::-1]
    ranks = np.concatenate([[1], 1 + np.cumsum(sizes[:, 1])])
    return ranks, np.append(sizes[:, 0], sizes[-1:, 0])


def code_usage(sizes: np.ndarray, bit_ones: np.ndarray, n_items: int, nbits: int) -> dict:
    """Code-usage summary of a database of ``n_items`` ``nbits``-bit codes.

    ``sizes``: bucket sizes from :func:`bucket_sizes` (their items sum to n_items); ``bit_ones[i]``: items with
    bit i set. Entropy is of the empirical code distribution p_c = count_c / n_items, in bits (at most
    min(B, log2 N)), summed per bucket size.
    """
    sizes = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
    bit_ones = np.asarray(bit_ones, dtype=np.int64)
    size, codes = sizes[:, 0], sizes[:, 1]
    if n_items < 1 or int((size * codes).sum()) != n_items or bit_ones.shape != (nbits,) or (size < 1).any():
        raise ValueError(f"need bucket sizes holding n_items >= 1 items and {nbits} bit counts")
    p = size / n_items
    entropy = max(0.0, -math.fsum((codes * p * np.log2(p)).tolist()))
    return {
        "distinct_codes": int(codes.sum()),
        "max_bucket": int(size.max()),
        "collision_fraction": int((size * codes)[size > 1].sum()) / n_items,
        "entropy_bits": entropy,
        "entropy_ratio": entropy / nbits,
        "bit_balance": (bit_ones / n_items).tolist(),
    }
