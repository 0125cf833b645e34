"""How a method uses its code space (docs/metrics.md, section 4; the mLGAP paper's Fig. 1 and 8).

From the database's distinct-code counts (items per code, as the engine merges them)
and the per-bit counts of set bits: the number of distinct codes, the largest bucket,
the fraction of items sharing their code with another item, the entropy of the code
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


def code_usage(code_counts: np.ndarray, bit_ones: np.ndarray, n_items: int, nbits: int) -> dict:
    """Code-usage summary of a database of ``n_items`` ``nbits``-bit codes.

    ``code_counts``: items per distinct code (they sum to n_items); ``bit_ones[i]``: items with bit i set.
    Entropy is of the empirical code distribution p_c = count_c / n_items, in bits (at most min(B, log2 N)).
    """
    counts = np.asarray(code_counts, dtype=np.int64)
    bit_ones = np.asarray(bit_ones, dtype=np.int64)
    if n_items < 1 or int(counts.sum()) != n_items or bit_ones.shape != (nbits,):
        raise ValueError(f"need code counts summing to n_items >= 1 and {nbits} bit counts")
    p = counts[counts > 0] / n_items
    entropy = max(0.0, -math.fsum((p * np.log2(p)).tolist()))
    return {
        "distinct_codes": int((counts > 0).sum()),
        "max_bucket": int(counts.max()),
        "collision_fraction": int(counts[counts > 1].sum()) / n_items,
        "entropy_bits": entropy,
        "entropy_ratio": entropy / nbits,
        "bit_balance": (bit_ones / n_items).tolist(),
    }
