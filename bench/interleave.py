"""Two installs of hashdist timed against each other, interleaved: `hashdist evaluate` wall time in new processes,
the default engine and `--engine local`, `--no-cache`, alternating old and new so that a slower moment of the
machine hits both alike.

    .venv/bin/python bench/interleave.py --old /tmp/old-venv/bin/hashdist --new .venv/bin/hashdist \\
        --dataset demo.zarr --repeats 6 [--dataset flickr1m.zarr --repeats 3]

Each --dataset takes the --repeats given after it (default 5). One warm-up run per install, engine and dataset
first (numba's cache, Prefect's template database). Prints the medians and every run; no file is written but
the reports in a temporary directory. Run it on a quiet machine; record the CPU with the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time


def run(binary: str, dataset: str, engine: str, out: str, env: dict) -> float:
    cmd = [binary, "evaluate", dataset, "--out", out, "--overwrite", "--no-cache", "--quiet", "--no-html"]
    if engine == "local":
        cmd += ["--engine", "local"]
    started = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=1800)
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True, help="the old install's hashdist command")
    ap.add_argument("--new", required=True, help="the new install's hashdist command")
    ap.add_argument("--dataset", action="append", required=True, help="a dataset (repeatable)")
    ap.add_argument("--repeats", type=int, action="append", help="runs per install and engine, for each --dataset")
    a = ap.parse_args()
    repeats = (a.repeats or []) + [5] * (len(a.dataset) - len(a.repeats or []))
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, HASHDIST_CACHE=os.path.join(tmp, "cache"))
        out, times = os.path.join(tmp, "out"), {}
        for dataset, n in zip(a.dataset, repeats, strict=True):
            for engine in ("flow", "local"):
                for binary in (a.old, a.new):
                    run(binary, dataset, engine, out, env)  # warm-up
                for i in range(n):
                    for name in ("old", "new") if i % 2 == 0 else ("new", "old"):
                        key = f"{os.path.basename(dataset.rstrip('/'))} {engine} {name}"
                        times.setdefault(key, []).append(run(getattr(a, name), dataset, engine, out, env))
    for key, values in times.items():
        print(f"{key}: median {statistics.median(values):.2f} s ({', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
