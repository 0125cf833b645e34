"""Arrays in, report out: hashdist.evaluate_codes at the sizes most papers evaluate, warm (numba cache filled).

    .venv/bin/python bench/arrays.py

Prints a markdown table (best of 3 runs each, with the engine's phase timings) and the CPU model.
CIFAR-10-like: 10,000 queries x 50,000 items; NUS-WIDE-like: 2,100 x 190,000, 81 concepts.
"""

from __future__ import annotations

import time

import numpy as np

import hashdist


def _cpu() -> str:
    try:
        lines = open("/proc/cpuinfo").read().splitlines()
        model = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
        flags = next(line.split(":", 1)[1].split() for line in lines if line.startswith("flags"))
        return f"{model}; {'AVX-512' if 'avx512f' in flags else 'AVX2, no AVX-512' if 'avx2' in flags else 'no AVX2'}"
    except (OSError, StopIteration):
        return "unknown CPU"


def _codes(rng, labels, centres, noise):
    return centres[labels] ^ (rng.random((len(labels), centres.shape[1])) < noise)


def cases(rng):
    centres = rng.integers(0, 2, (10, 64))
    ql, dl = rng.integers(0, 10, 10_000), rng.integers(0, 10, 50_000)
    yield "CIFAR-10-like, class, 10,000 x 50,000, 64 bits", (
        _codes(rng, ql, centres, 0.15), _codes(rng, dl, centres, 0.15), ql, dl)
    concepts = rng.integers(0, 2, (81, 64))
    qm, dm = rng.random((2_100, 81)) < 0.025, rng.random((190_000, 81)) < 0.025
    qm[np.arange(2_100), rng.integers(0, 81, 2_100)] = True
    dm[np.arange(190_000), rng.integers(0, 81, 190_000)] = True
    first_q, first_d = qm.argmax(axis=1), dm.argmax(axis=1)
    yield "NUS-WIDE-like, multi-label, 2,100 x 190,000, 64 bits", (
        _codes(rng, first_q, concepts, 0.15), _codes(rng, first_d, concepts, 0.15), qm, dm)


def main():
    rng = np.random.default_rng(0)
    print(f"machine: {_cpu()}\n")
    print("| case | wall s (best of 3) | compute s | metrics s | pairs/s |")
    print("| --- | --- | --- | --- | --- |")
    for name, (q, d, ql, dl) in cases(rng):
        hashdist.evaluate_codes(q[:64], d[:2048], ql[:64], dl[:2048])  # compile or load the numba cache
        best = None
        for _ in range(3):
            t = time.perf_counter()
            report = hashdist.evaluate_codes(q, d, ql, dl)
            wall = time.perf_counter() - t
            if best is None or wall < best[0]:
                best = (wall, report["timing"])
        wall, timing = best
        print(f"| {name} | {wall:.2f} | {timing['compute_s']:.2f} | {timing['metrics_s']:.2f} "
              f"| {len(q) * len(d) / wall:.3g} |")


if __name__ == "__main__":
    main()
