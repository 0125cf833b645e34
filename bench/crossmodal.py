"""Cross-modal runs against unimodal ones: what two tasks cost through hashdist.evaluate_codes, warm.

    .venv/bin/python -m bench.crossmodal [--repeats 5]      # from the repository root

Issue #42's targets: MIRFlickr-25K sizes (2,000 queries x 18,015 items, 24 labels, image->text and
text->image, 64 bits) within 0.5 s; NUS-WIDE-21 sizes (2,100 x 193,734, 21 concepts, 2 tasks) within
2.2x one unimodal task of the same pair. The two-task run and the one-task run alternate (interleaved),
each case reports the best and the median of the repeats, and the CPU is printed with the figures.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import hashdist
from bench.arrays import _cpu


def pairs(rng, n_queries: int, n_database: int, n_labels: int, nbits: int = 64, text_noise: float = 0.1):
    """Image and text codes per item over shared multi-hot labels: image codes from the first label's centre plus
    15% noise, text codes the image codes with every bit flipped again with probability ``text_noise``."""
    n = n_queries + n_database
    labels = rng.random((n, n_labels)) < 1.5 / n_labels
    labels[np.arange(n), rng.integers(0, n_labels, n)] = True
    centres = rng.integers(0, 2, (n_labels, nbits), dtype=np.uint8)
    image = centres[labels.argmax(axis=1)] ^ (rng.random((n, nbits)) < 0.15)
    text = image ^ (rng.random((n, nbits)) < text_noise)
    split = {"queries": slice(0, n_queries), "database": slice(n_queries, n)}
    codes = {side: {"image": image[rows], "text": text[rows]} for side, rows in split.items()}
    return codes, labels[split["queries"]], labels[split["database"]]


def timed(function) -> float:
    t = time.perf_counter()
    function()
    return time.perf_counter() - t


def case(name: str, codes, ql, dl, repeats: int) -> str:
    q, d = codes["queries"], codes["database"]
    both = lambda: hashdist.evaluate_codes(q, d, ql, dl, k=[50])  # noqa: E731
    one = lambda: hashdist.evaluate_codes(q["image"], d["text"], ql, dl, k=[50])  # noqa: E731
    both(), one()  # warm: numba's cache loaded, first-call costs paid
    times = {"two tasks": [], "one task": []}
    for _ in range(repeats):
        times["two tasks"].append(timed(both))
        times["one task"].append(timed(one))
    best = {k: min(v) for k, v in times.items()}
    median = {k: statistics.median(v) for k, v in times.items()}
    return (f"| {name} | {best['two tasks']:.3f} / {median['two tasks']:.3f} | {best['one task']:.3f} / "
            f"{median['one task']:.3f} | {median['two tasks'] / median['one task']:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats per case (default 5)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"machine: {_cpu()}\n")
    print("| case | two tasks s (best / median) | one task s (best / median) | ratio of medians |")
    print("| --- | --- | --- | --- |")
    print(case("MIRFlickr-25K sizes, 2,000 x 18,015, 24 labels", *pairs(rng, 2_000, 18_015, 24), args.repeats))
    print(case("NUS-WIDE-21 sizes, 2,100 x 193,734, 21 labels", *pairs(rng, 2_100, 193_734, 21), args.repeats))


if __name__ == "__main__":
    main()
