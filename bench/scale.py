"""Scaling out: peak memory of every process and wall time as the database grows, on a loopback cluster.

    .venv/bin/python bench/scale.py [--sizes 10e6 40e6 100e6] [--queries 1000] [--workdir DIR]

For each database size N: random 64-bit codes with class labels (``hashdist synth --noise 0.5``:
every bit a fair coin, so nearly every code is distinct), Q queries, radii 0..2. A `dask scheduler`
and 2 `dask worker` processes x 1 thread on 127.0.0.1 (fresh for each N), and the flow
(`hashdist evaluate --address`, no cache, no HTML) in a third process; the peak RSS of each
process (the flow's own temporary Prefect API server counted separately) is sampled every 0.1 s.
Then, for each N, the embedded default engine and `--engine local` in one process each (issue #44): their
wall and peak RSS, and whether their metrics equal the cluster's. Writes bench/results/<date>-scale.{json,md}.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
GIB = 2**30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dataset(workdir: Path, n: int, queries: int) -> Path:
    path = workdir / f"random-{n}-{queries}.zarr"
    if not (path / "zarr.json").exists():
        subprocess.run([str(BIN / "hashdist"), "synth", "--n-database", str(n), "--n-queries", str(queries),
                        "--nbits", "64", "--labels", "class", "--n-classes", "10", "--noise", "0.5",
                        "--out", str(path), "--overwrite"], check=True, stdout=subprocess.DEVNULL)
    return path


def _rss(processes) -> list[float]:
    return [p.memory_info().rss / GIB for p in processes]


def watch(procs: dict[str, subprocess.Popen], main: subprocess.Popen) -> dict[str, float]:
    """Peak RSS (GiB) of the largest process in each named process's tree (a `dask worker` is a nanny and
    its worker process), the main process's children (its API server) under "flow children", until
    ``main`` exits."""
    peaks: dict[str, float] = {}
    handles = {name: psutil.Process(p.pid) for name, p in procs.items()}
    while main.poll() is None:
        for name, handle in handles.items():
            try:
                children = handle.children(recursive=True)
                if name == "flow":  # the flow's own process; its children (the API server) apart
                    peaks["flow children"] = max([peaks.get("flow children", 0.0), *_rss(children)])
                    children = []
                peaks[name] = max([peaks.get(name, 0.0), *_rss([handle, *children])])
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.1)
    return peaks


def evaluate(ds: Path, out: Path, extra: list[str], others: dict[str, subprocess.Popen]) -> tuple[dict, dict]:
    """(report.json, peak RSS per process) of one `hashdist evaluate` run."""
    cmd = [str(BIN / "hashdist"), "evaluate", str(ds), "--out", str(out), "--overwrite", "--no-cache", "--no-html",
           "--quiet", "--radius", "0", "1", "2", *extra]
    t0 = time.perf_counter()
    main = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    peaks = watch({"flow": main, **others}, main)
    if main.wait() != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    report = json.loads((out / "report.json").read_text())
    report["timing"]["measured_wall_s"] = time.perf_counter() - t0
    return report, peaks


def cluster(port: int, memory_limit: str) -> dict[str, subprocess.Popen]:
    address = f"tcp://127.0.0.1:{port}"
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    from distributed import Client

    from flows.runtime import LOOPBACK_DASK_ARGS

    procs = {"scheduler": subprocess.Popen([str(BIN / "dask"), "scheduler", *LOOPBACK_DASK_ARGS, "--port", str(port)],
                                           **quiet)}
    for i in range(2):
        procs[f"worker {i}"] = subprocess.Popen([str(BIN / "dask"), "worker", address, *LOOPBACK_DASK_ARGS,
                                                 "--nthreads", "1", "--memory-limit", memory_limit], **quiet)

    deadline = time.monotonic() + 120
    while True:
        try:
            with Client(address, timeout=5) as client:
                client.wait_for_workers(2, timeout=120)
            return procs
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def stop(procs: dict[str, subprocess.Popen]) -> None:
    for p in list(procs.values())[::-1]:
        p.terminate()
    for p in procs.values():
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


def one_process(ds: Path, workdir: Path, n: int, cluster_report: dict) -> dict:
    """The embedded default engine and `--engine local` on the same dataset: wall, peak RSS of the process (its
    API server apart) and whether metrics and code usage equal the loopback cluster's."""
    rows = {}
    for engine, extra in (("default", []), ("local", ["--engine", "local"])):
        report, peaks = evaluate(ds, workdir / f"report-{n}-{engine}", extra, {})
        rows[engine] = {"wall_s": report["timing"]["measured_wall_s"], "peak_rss_gib": peaks["flow"],
                        "api_server_gib": peaks.get("flow children", 0.0),
                        "identical": report["metrics"] == cluster_report["metrics"]
                        and report["code_usage"] == cluster_report["code_usage"]}
    return rows


def run_size(workdir: Path, n: int, a) -> dict:
    """One database size: the loopback cluster's run, then the one-process engines'."""
    t = time.perf_counter()
    ds = dataset(workdir, n, a.queries)
    print(f"N = {n:,}: dataset ready ({time.perf_counter() - t:.0f} s)", file=sys.stderr)
    port = free_port()
    procs = cluster(port, a.memory_limit)
    try:
        report, peaks = evaluate(ds, workdir / f"report-{n}", ["--address", f"tcp://127.0.0.1:{port}"], procs)
    finally:
        stop(procs)
    row = {"n": n, "queries": a.queries, "wall_s": report["timing"]["measured_wall_s"],
           "timing": report["timing"], "code_parts": report["engine"]["code_parts"],
           "distinct_codes": report["code_usage"]["distinct_codes"], "peak_rss_gib": peaks,
           "map": report["metrics"]["map"]["expected"], "one_process": one_process(ds, workdir, n, report)}
    print(json.dumps(row), file=sys.stderr)
    return row


def markdown(result: dict, queries: int) -> list[str]:
    rows = result["rows"]
    md = [f"# Scaling out, {result['date']}", "", f"{result['cpu']}, {result['cores']} cores; loopback cluster: "
          "`dask scheduler` + 2 `dask worker --nthreads 1`; flow in its own process; Q = "
          f"{queries}, random 64-bit codes, class labels, radii 0..2, no cache, no HTML.", "",
          "| N | code parts | distinct codes | wall s | compute s | reduce s | peak RSS GiB: flow / its API server / "
          "scheduler / workers |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        p = r["peak_rss_gib"]
        md.append(f"| {r['n']:,} | {r['code_parts']} | {r['distinct_codes']:,} | {r['wall_s']:.1f} | "
                  f"{r['timing']['compute_s']:.1f} | {r['timing']['reduce_s']:.1f} | {p['flow']:.2f} / "
                  f"{p.get('flow children', 0):.2f} / {p['scheduler']:.2f} / {p['worker 0']:.2f}, "
                  f"{p['worker 1']:.2f} |")
    md += ["", "One process, the same datasets (`hashdist evaluate`, the embedded default engine and `--engine local`; "
           "peak RSS of the process, its API server apart):", "",
           "| N | default: wall s | default: peak RSS GiB | local: wall s | local: peak RSS GiB | identical to the "
           "cluster's |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        d, loc = r["one_process"]["default"], r["one_process"]["local"]
        md.append(f"| {r['n']:,} | {d['wall_s']:.1f} | {d['peak_rss_gib']:.2f} | {loc['wall_s']:.1f} | "
                  f"{loc['peak_rss_gib']:.2f} | {d['identical'] and loc['identical']} |")
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        ratio = {name: last["peak_rss_gib"][name] / first["peak_rss_gib"][name]
                 for name in ("flow", "scheduler", "worker 0", "worker 1")}
        for engine in ("default", "local"):
            a, b = first["one_process"][engine], last["one_process"][engine]
            ratio[f"{engine} engine"] = b["peak_rss_gib"] / a["peak_rss_gib"]
        walls = {"cluster": last["wall_s"] / first["wall_s"]} | {
            engine: last["one_process"][engine]["wall_s"] / first["one_process"][engine]["wall_s"]
            for engine in ("default", "local")}
        md += ["", f"{last['n']:,} against {first['n']:,}: wall " + ", ".join(f"{k} {v:.2f}x" for k, v in walls.items())
               + "; peak RSS " + ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items()) + "."]
    return md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[10e6, 40e6, 100e6])
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--workdir", type=Path, default=None, help="where the datasets are kept (default: a temp dir)")
    ap.add_argument("--memory-limit", default="auto",
                    help="each dask worker's --memory-limit (Dask spills to disk above 70%% of it; default auto)")
    a = ap.parse_args()
    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="hashdist-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows = [run_size(workdir, n, a) for n in sorted(int(s) for s in a.sizes)]
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    result = {"date": dt.date.today().isoformat(), "cpu": cpu, "cores": os.cpu_count(), "rows": rows}
    out = HERE / "results" / f"{result['date']}-scale"
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    md = markdown(result, a.queries)
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
