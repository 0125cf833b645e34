"""Weighted-Hamming kernel against a numpy per-query sort of the same distances (issue #15), one thread.

    .venv/bin/python bench/weighted.py

Prints pairs/s of hashdist's binned histogram kernel (B = 64 and 128, class labels, G = 4096) and of
the way papers evaluate re-ranking: numpy distances, argsort per query, AP over the ranked list.
"""

from __future__ import annotations

import time

import numpy as np

from hashdist.data.bits import pack_bits
from hashdist.kernels.binned import binned_histogram_block
from hashdist.kernels.distance import weighted_axis


def main(n_q=256, n_db=262_144):
    rng = np.random.default_rng(0)
    for nbits in (64, 128):
        q_bits, db_bits = rng.integers(0, 2, (n_q, nbits)), rng.integers(0, 2, (n_db, nbits))
        ql, dl = rng.integers(0, 24, n_q), rng.integers(0, 24, n_db)
        qc, dc = pack_bits(q_bits), pack_bits(db_bits)
        axis = weighted_axis(rng.random(nbits), 4096, (0, 1, 2))
        binned_histogram_block(axis, qc[:2], dc[:16], nbits, "class", ql[:2], dl[:16])  # compile
        t = time.perf_counter()
        binned_histogram_block(axis, qc, dc, nbits, "class", ql, dl)
        kernel = n_q * n_db / (time.perf_counter() - t)
        w = axis.weights
        n_np = 16
        t = time.perf_counter()
        for q in range(n_np):
            d = (q_bits[q] != db_bits) @ w
            relevant = (dl == ql[q])[np.argsort(d, kind="stable")]
            hits = np.flatnonzero(relevant)
            np.mean(np.arange(1, len(hits) + 1) / (hits + 1))
        numpy_rate = n_np * n_db / (time.perf_counter() - t)
        print(f"B={nbits}: hashdist binned kernel {kernel:.3g} pairs/s, numpy distances + argsort + AP "
              f"{numpy_rate:.3g} pairs/s, ratio {kernel / numpy_rate:.1f}")


if __name__ == "__main__":
    main()
