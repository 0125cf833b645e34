"""`hashdist search` on the Flickr-1M preset: faiss's search time per query along an nprobe sweep (issue #48
point 4), and BFlat's (exhaustive) for reference.

    .venv/bin/python -m bench.search [--dataset PATH] [--k 1000] [--nprobe 1 4 16 64] [--threads N]
                                     [--repeats 3] [--wait-quiet 30] [--quick]      # from the repository root

Without --dataset it writes the flickr1m preset (10,000 x 1,000,000, 64 bits; --quick: the demo preset) into a
temporary directory. Each repeat builds the index again (``hashdist.search``: BIVF1024 trained on 262,144 seeded
rows, then BFlat), after waiting up to --wait-quiet s for other processes to use under 15% of the CPUs; the
figures are the median and best over the repeats of the files' ``time_per_query_s`` (faiss's wall time over the
queries in batches of 4,096, after an untimed warm-up call; with 2 threads the inverse of the throughput) and
``build_s``. The lists are deleted after each repeat (10,000 x 1,000 x 12 bytes = 120 MB per file). Prints a
markdown table with the CPU model and the CPU share other processes took; writes no file.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import hashdist
from bench.fixed_costs import NOISE
from hashdist.data.synth import PRESETS, synth_dataset


def cpu_model() -> str:
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown CPU")


def one_repeat(dataset: str, out: Path, args, repeat: int) -> dict[str, tuple[float, float]]:
    """{file stem: (time per query, build seconds)} of one BIVF1024 sweep and one BFlat search."""
    found = {}
    for index, nprobe in (("BIVF1024", args.nprobe), ("BFlat", [])):
        NOISE.wait_quiet(index)
        paths = NOISE.measure(f"{index}, repeat {repeat}", hashdist.search, dataset, index=index, k=args.k,
                              nprobe=nprobe, threads=args.threads, out=out, overwrite=True)
        for path in paths:
            with np.load(path) as z:
                found[Path(path).stem] = (float(z["time_per_query_s"]), float(z["build_s"]))
        shutil.rmtree(out)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", help="a hashdist dataset (default: the flickr1m preset, written here)")
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--nprobe", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--threads", type=int, help="faiss's threads (default: all cores)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--wait-quiet", type=float, default=30.0, help="seconds to wait for quiet CPUs, each search")
    parser.add_argument("--quick", action="store_true", help="the demo preset instead of flickr1m")
    args = parser.parse_args()
    NOISE.wait_s = args.wait_quiet
    with tempfile.TemporaryDirectory(prefix="hashdist-bench-search-") as tmp:
        dataset = args.dataset
        if dataset is None:
            preset = "demo" if args.quick else "flickr1m"
            t0 = time.perf_counter()
            dataset = synth_dataset(Path(tmp) / f"{preset}.zarr", **PRESETS[preset])
            print(f"synth --preset {preset}: {time.perf_counter() - t0:.1f} s")
        runs = [one_repeat(dataset, Path(tmp) / "runs", args, r) for r in range(args.repeats)]
        ds = hashdist.open_dataset(dataset)
    print(f"\n{cpu_model()}, {os.cpu_count()} CPUs, threads {args.threads or 'all'}; {ds.n_queries:,} queries x "
          f"{ds.n_database:,} items, {ds.nbits} bits, K = {args.k}; {args.repeats} repeats; load average "
          f"{os.getloadavg()[0]:.2f} at the end\n")
    print("| index, setting | µs per query, median | best | build s, median |\n| --- | --- | --- | --- |")
    for name in runs[0]:
        times = [run[name][0] * 1e6 for run in runs]
        builds = [run[name][1] for run in runs]
        print(f"| {name} | {statistics.median(times):.1f} | {min(times):.1f} | {statistics.median(builds):.1f} |")
    shares = [s["other_share"] for s in NOISE.sections.values()]
    print(f"\nother processes' share of the CPUs while searching: median {statistics.median(shares):.0%}, "
          f"max {max(shares):.0%}")


if __name__ == "__main__":
    main()
