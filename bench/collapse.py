"""Histograms over distinct (code, label) rows against the tuned kernel (issue #14 item 3), one thread.

    .venv/bin/python bench/collapse.py [--quick]

Prints a markdown report:

1. collision data (the ``collisions`` synth preset: 10 classes x 200 prototype codes, 1% of items one bit
   off), 1,000 queries x 262,144 and x 2,097,152 items, B = 64, class relevance: ``histogram_block``
   against ``auto_histogram_block`` (which decides per block and collapses here), with the distinct
   fraction, the decision's own cost (``should_collapse``: sample, then the distinct count it hands on) and a
   check that both histograms are identical;
2. random distinct codes, same sizes: the decision rule keeps the tuned kernel;
3. the threshold: ``histogram_block`` against the always-collapsed path at distinct fractions 1/64 .. 1/2
   (random distinct queries, so only the database collapses), B = 64 and 128, class and multi-label;
4. the same at few queries (32 to 128), class B = 64 (where collapsing gains least), beside the rule's limit:
   where the cost of counting the block's distinct rows decides, and what ``COUNT_COST_PAIRS`` is fitted to;
5. ``distinct_rows`` on 262,144 rows against numpy's ``unique(axis=0)``.

Times are the best of 3 in thread CPU time (``time.thread_time``): everything runs single-threaded in
this thread (NUMBA_NUM_THREADS=1), and CPU time is not inflated by other processes on a shared machine;
the wall-clock speed-up is shown next to it. --quick uses 65,536 and 262,144 items.
"""

from __future__ import annotations

import os

os.environ["NUMBA_NUM_THREADS"] = "1"  # before numba is imported

import argparse  # noqa: E402
import datetime as dt  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numba  # noqa: E402
import numpy as np  # noqa: E402

from hashdist.data.dataset import open_dataset  # noqa: E402
from hashdist.data.synth import PRESETS, synth_dataset  # noqa: E402
from hashdist.kernels import collapse  # noqa: E402
from hashdist.kernels.collapse import (  # noqa: E402
    auto_histogram_block,
    collapsed_histogram_block,
    should_collapse,
)
from hashdist.kernels.distinct import distinct_rows  # noqa: E402
from hashdist.kernels.histogram import histogram_block  # noqa: E402

N_QUERIES = 1_000
REPEATS = 3


def timed(fn, *args, **kwargs):
    """(fn(*args, **kwargs), best thread CPU seconds, best wall seconds) of REPEATS calls."""
    cpu, wall, result = [], [], None
    for _ in range(REPEATS):
        c, w = time.thread_time(), time.perf_counter()
        result = fn(*args, **kwargs)
        cpu.append(time.thread_time() - c)
        wall.append(time.perf_counter() - w)
    return result, min(cpu), min(wall)


def machine() -> str:
    model = platform.processor() or "unknown CPU"
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        model = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
        flags = next(line.split(":", 1)[1].split() for line in lines if line.startswith("flags"))
        model += "; " + ("AVX-512" if "avx512f" in flags else "AVX2, no AVX-512" if "avx2" in flags else "no AVX2")
    except (OSError, StopIteration):
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, check=False).stdout.strip() or "?"
    except OSError:
        commit = "?"
    return (f"{dt.date.today()}, {model}, {os.cpu_count()} cores; Python {platform.python_version()}, "
            f"numba {numba.__version__}, numpy {np.__version__}; commit {commit} (working tree)")


def warm_up():
    rng = np.random.default_rng(0)
    for kind, nbits in (("class", 64), ("class", 128), ("multilabel", 64)):
        w = nbits // 64
        qc, dc = rng.integers(0, 2**63, (300, w), dtype=np.uint64), rng.integers(0, 2**63, (3000, w), dtype=np.uint64)
        if kind == "class":
            ql, dl = rng.integers(0, 10, 300), rng.integers(0, 10, 3000)
        else:
            ql, dl = (rng.integers(0, 2**24, (m, 1), dtype=np.uint64) for m in (300, 3000))
        histogram_block(qc, dc, nbits, kind, ql, dl, max_grade=5)
        collapsed_histogram_block(qc, dc, nbits, kind, ql, dl, max_grade=5)
        auto_histogram_block(qc, dc[:2000], nbits, kind, ql, dl[:2000], max_grade=5)


def compare_rows(qc, ql, dc, dl, sizes, name):
    rows = []
    for n in sizes:
        d, lab = dc[:n], dl[:n]
        tuned, t_cpu, t_wall = timed(histogram_block, qc, d, 64, "class", ql, lab)
        (H, info), a_cpu, a_wall = timed(auto_histogram_block, qc, d, 64, "class", ql, lab)
        _, decide_cpu, _ = timed(should_collapse, len(qc), d, lab, "class")
        same = H.dtype == tuned.dtype and H.shape == tuned.shape and np.array_equal(H, tuned)
        queries = f"{info.n_distinct_queries:,}" if info.collapsed else "-"
        rows.append(f"| {name} | {len(qc):,} x {n:,} | {info.distinct_fraction:.4f}{'' if info.exact else ' (est.)'} "
                    f"| {queries} | {'collapsed' if info.collapsed else 'tuned'} ({info.decided_by}) "
                    f"| {decide_cpu * 1e3:.2f} | {t_cpu:.4f} | {a_cpu:.4f} | **{t_cpu / a_cpu:.1f}x** "
                    f"| {t_wall / a_wall:.1f}x | {same} |")
    return rows


def pooled_codes(rng, n, fraction, words):
    """n codes drawn from a pool of n * fraction random codes, repeats scattered: (pool size, codes, pool index)."""
    u = max(1, int(n * fraction))
    pool = rng.integers(0, 2**63, (u, words), dtype=np.uint64)
    idx = rng.permutation(np.arange(n) % u)
    return u, pool[idx], idx


def tuned_over_collapsed(qc, dc, nbits, kind, ql, dl, max_grade=1) -> str:
    """histogram_block's CPU time over the always-collapsed path's, formatted."""
    _, t_cpu, _ = timed(histogram_block, qc, dc, nbits, kind, ql, dl, max_grade=max_grade)
    _, c_cpu, _ = timed(collapsed_histogram_block, qc, dc, nbits, kind, ql, dl, max_grade=max_grade)
    return f"{t_cpu / c_cpu:.2f}"


def sweep_rows(n, fractions):
    rng = np.random.default_rng(1)
    rows = []
    for kind, nbits in (("class", 64), ("class", 128), ("multilabel", 64)):
        w = nbits // 64
        qc = rng.integers(0, 2**63, (N_QUERIES, w), dtype=np.uint64)
        cells = []
        for f in fractions:
            u, dc, idx = pooled_codes(rng, n, f, w)
            if kind == "class":
                ql, dl, max_grade = rng.integers(0, 10, N_QUERIES), rng.integers(0, 10, u)[idx], 1
            else:  # sparse 24-concept multi-hot rows, grades up to 5
                def hot(m):
                    return rng.integers(0, 2**24, (m, 1), dtype=np.uint64) & rng.integers(0, 2**24, (m, 1),
                                                                                          dtype=np.uint64)
                ql, dl, max_grade = hot(N_QUERIES), hot(u)[idx], 5
            cells.append(tuned_over_collapsed(qc, dc, nbits, kind, ql, dl, max_grade))
        rows.append(f"| {kind}, B={nbits} | " + " | ".join(cells) + " |")
    return rows


FEW_QUERIES = (32, 48, 64, 80, 100, 128)
FEW_QUERY_FRACTIONS = (1 / 32, 1 / 16, 1 / 12, 1 / 8, 1 / 6, 1 / 4)


def few_queries_rows(n):
    """histogram_block time / always-collapsed time at few queries, class B = 64, and the rule's limit."""
    rng = np.random.default_rng(3)
    rows = []
    for q in FEW_QUERIES:
        qc, ql = rng.integers(0, 2**63, (q, 1), dtype=np.uint64), rng.integers(0, 10, q)
        cells = []
        for f in FEW_QUERY_FRACTIONS:
            u, dc, idx = pooled_codes(rng, n, f, 1)
            cells.append(tuned_over_collapsed(qc, dc, 64, "class", ql, rng.integers(0, 10, u)[idx]))
        rows.append(f"| {q} | " + " | ".join(cells) + f" | {collapse.collapse_limit(n, q) / n:.3f} |")
    return rows


def distinct_timing_rows(dc, dl, rc, rl, n):
    rows = []
    for name, codes, labels in (("collision data", dc[:n], dl[:n]), ("random distinct codes", rc[:n], rl[:n])):
        rows_u, t_ours, _ = timed(distinct_rows, codes, labels)
        keys = np.concatenate([codes, labels.astype(np.int64).view(np.uint64).reshape(-1, 1)], axis=1)
        _, t_np, _ = timed(np.unique, keys, axis=0, return_inverse=True, return_counts=True)
        rows.append(f"| {name} | {n:,} | {len(rows_u.counts):,} | {t_ours * 1e3:.1f} | {t_np * 1e3:.1f} |")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="65,536 and 262,144 items")
    args = ap.parse_args(argv)
    sizes = (65_536, 262_144) if args.quick else (262_144, 2_097_152)
    print(f"[bench/collapse] generating {sizes[-1]:,} items of the collisions preset ...", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        params = dict(PRESETS["collisions"], n_database=sizes[-1], n_queries=N_QUERIES)
        ds = open_dataset(synth_dataset(Path(tmp) / "collisions.zarr", **params))
        dc, dl = ds.read("database/codes", 0, ds.n_database), ds.read("database/labels", 0, ds.n_database)
        qc, ql = ds.read("queries/codes", 0, ds.n_queries), ds.read("queries/labels", 0, ds.n_queries)
    rng = np.random.default_rng(2)
    rc, rl = rng.integers(0, 2**63, (sizes[-1], 1), dtype=np.uint64), rng.integers(0, 10, sizes[-1])
    rqc, rql = rng.integers(0, 2**63, (N_QUERIES, 1), dtype=np.uint64), rng.integers(0, 10, N_QUERIES)
    print("[bench/collapse] compiling ...", file=sys.stderr)
    warm_up()

    out = ["# Collapsed histograms (issue #14 item 3)", "", machine(), "",
           f"Decision rule: collapse when distinct (code, label) rows U <= N min({collapse.COLLAPSE_FRACTION:g}, "
           f"{collapse.WEIGHTED_TO_TUNED:g} - {collapse.COUNT_COST_PAIRS:g} / Q) and N >= "
           f"{collapse.MIN_COLLAPSE_ITEMS}; a sample of {collapse.SAMPLE_FACTOR} sqrt(N) rows first. Times: thread "
           f"CPU seconds, best of {REPEATS}, 1 thread.", "",
           "## Collision data and random distinct codes, B = 64, class", "",
           "| data | queries x items | distinct fraction | distinct queries | path (decided by) | decision ms "
           "| histogram_block s | auto_histogram_block s | speed-up (CPU) | speed-up (wall) | identical |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    print("[bench/collapse] collision data ...", file=sys.stderr)
    out += compare_rows(qc, ql, dc, dl, sizes, "collisions preset")
    print("[bench/collapse] random codes ...", file=sys.stderr)
    out += compare_rows(rqc, rql, rc, rl, sizes, "random distinct codes")
    fractions = (1 / 64, 1 / 16, 1 / 8, 1 / 4, 1 / 2)
    n = sizes[0]
    print("[bench/collapse] threshold sweep ...", file=sys.stderr)
    out += ["", f"## Where collapsing pays: histogram_block time / always-collapsed time, {N_QUERIES:,} random "
            f"distinct queries x {n:,} items", "",
            "| kind | " + " | ".join(f"U/N = 1/{round(1 / f)}" for f in fractions) + " |",
            "| --- |" + " --- |" * len(fractions)]
    out += sweep_rows(n, fractions)
    print("[bench/collapse] few queries ...", file=sys.stderr)
    out += ["", f"## Few queries: the same ratio, class B = 64, random distinct queries x {n:,} items, and the "
            "rule's limit (collapse up to U/N)", "",
            "| queries | " + " | ".join(f"U/N = 1/{round(1 / f)}" for f in FEW_QUERY_FRACTIONS) + " | limit U/N |",
            "| --- |" + " --- |" * (len(FEW_QUERY_FRACTIONS) + 1)]
    out += few_queries_rows(n)
    print("[bench/collapse] distinct_rows ...", file=sys.stderr)
    out += ["", "## distinct_rows, 64-bit codes + class labels", "",
            "| data | rows | distinct | distinct_rows ms | numpy unique(axis=0) ms |",
            "| --- | --- | --- | --- | --- |"]
    out += distinct_timing_rows(dc, dl, rc, rl, 262_144 if not args.quick else sizes[0])
    print("\n".join(out))


if __name__ == "__main__":
    main()
