"""hashdist benchmarks, side by side with faiss and the usual numpy evaluation, in one run.

    .venv/bin/pip install -q -e '.[bench]' && .venv/bin/python bench/run.py [--quick]

Writes bench/results/<date>.json and bench/results/<date>.md. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SIMD_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vpopcntdq", "popcnt")
BIN = Path(sys.executable).parent


def machine() -> dict:
    model, flags = "unknown", set()
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == "unknown":
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    versions = {}
    for package in ("numba", "prefect", "numpy", "faiss-cpu"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = None
    from llvmlite import binding

    from hashdist.kernels.popcount import target_popcount

    # the kernels' routes depend on the popcount instructions of numba's target CPU
    scalar, vector = target_popcount()
    return {"cpu": model, "cores": os.cpu_count(), "simd": [f for f in SIMD_FLAGS if f in flags],
            "numba_target": os.environ.get("NUMBA_CPU_NAME") or binding.get_host_cpu_name(),
            "numba_popcount": {"scalar": scalar, "vector": vector}, "python": platform.python_version(), **versions}


def _popcount_line(m: dict) -> str:
    counts = m.get("numba_popcount")
    if counts is None:
        return "popcount instructions not recorded"
    return f"scalar POPCNT {'yes' if counts['scalar'] else 'no'}, vector VPOPCNTQ {'yes' if counts['vector'] else 'no'}"


def machine_line(m: dict) -> str:
    return (f"{m['cpu']}, {m['cores']} cores, SIMD: {' '.join(m['simd']) or 'none of ' + ' '.join(SIMD_FLAGS)}, "
            f"numba target {m.get('numba_target', 'not recorded')} ({_popcount_line(m)}); "
            f"Python {m['python']}, numba {m['numba']}, prefect {m['prefect']}, numpy {m['numpy']}, "
            f"faiss-cpu {m['faiss-cpu']}")


def write_results(out_dir, stem: str, results: dict, text: str) -> Path:
    """``results`` as ``<stem>.json`` and ``text`` as ``<stem>.md`` in ``out_dir`` (made if missing); the stem's
    path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / f"{stem}.md").write_text(text)
    return out / stem


def clustered_codes(rng, n_db, n_q, nbits, n_classes=24, noise=0.15):
    """Database and query codes around the same class centres (like learned codes), with their class labels."""
    centres = rng.integers(0, 2, (n_classes, nbits), dtype=np.uint8)
    labels = rng.integers(0, n_classes, n_db + n_q)
    bits = (centres[labels] ^ (rng.random((n_db + n_q, nbits)) < noise)).astype(np.uint8)
    return bits[:n_db], labels[:n_db], bits[n_db:], labels[n_db:]


def best_of(fn, repeats=3, clock=time.perf_counter):
    times = []
    for _ in range(repeats):
        t = clock()
        fn()
        times.append(clock() - t)
    return min(times)


def bench_kernels(n_db, n_q):
    from hashdist.data.bits import pack_bits
    from hashdist.kernels.histogram import histogram_block

    rng = np.random.default_rng(0)
    rows = []
    for nbits in (64, 128):
        db_bits, db_lab, q_bits, q_lab = clustered_codes(rng, n_db, n_q, nbits)
        dc, qc = pack_bits(db_bits), pack_bits(q_bits)
        multi_db = pack_bits((rng.random((n_db, 24)) < 0.08) | (np.arange(24) == db_lab[:, None]))
        multi_q = pack_bits((rng.random((n_q, 24)) < 0.08) | (np.arange(24) == q_lab[:, None]))
        for kind, qr, dr in (("class", q_lab, db_lab), ("multilabel", multi_q, multi_db)):
            histogram_block(qc[:16], dc[:16], nbits, kind, qr[:16], dr[:16], max_grade=8)  # compile
            for threads in (1, 2):
                parts = np.array_split(np.arange(n_q), threads)

                def run(threads=threads, qc=qc, dc=dc, nbits=nbits, kind=kind, qr=qr, dr=dr, parts=parts):
                    with ThreadPoolExecutor(threads) as pool:
                        list(pool.map(lambda p: histogram_block(qc[p], dc, nbits, kind, qr[p], dr, max_grade=8), parts))

                secs = best_of(run)
                rows.append({"engine": "hashdist histogram", "nbits": nbits, "relevance": kind, "threads": threads,
                             "pairs": n_q * n_db, "seconds": secs, "pairs_per_s": n_q * n_db / secs})
        if nbits == 64:
            rows += bench_faiss(qc, dc, n_q, n_db)
    return rows


def bench_faiss(qc, dc, n_q, n_db):
    try:
        import faiss
    except ImportError:
        return [{"engine": "faiss hammings", "error": "faiss-cpu not installed (pip install -e '.[bench]')"}]
    qb = np.ascontiguousarray(qc).view(np.uint8)
    db = np.ascontiguousarray(dc).view(np.uint8)
    rows = []
    step = max(1, (1 << 26) // n_db)  # distance matrix chunks of <= 64M int32
    dis = np.empty((step, n_db), dtype=np.int32)
    for threads in (1, 2):
        faiss.omp_set_num_threads(threads)

        def run():
            for s in range(0, n_q, step):
                m = min(step, n_q - s)
                faiss.hammings(faiss.swig_ptr(qb[s : s + m]), faiss.swig_ptr(db), m, n_db, qb.shape[1],
                               faiss.swig_ptr(dis))

        secs = best_of(run)
        rows.append({"engine": "faiss hammings (distances only)", "nbits": 64, "relevance": "-", "threads": threads,
                     "pairs": n_q * n_db, "seconds": secs, "pairs_per_s": n_q * n_db / secs})
    return rows


def bench_numpy_eval(n_db, n_q, k=1000):
    """The learning-to-hash evaluation: +-1 dot products, argsort per query, AP@K (CalcTopMap)."""
    rng = np.random.default_rng(1)
    db_bits, db_lab, q_bits, q_lab = clustered_codes(rng, n_db, n_q, 64)
    B = (db_bits.astype(np.float32) * 2 - 1)
    Qs = (q_bits.astype(np.float32) * 2 - 1)

    def run():
        aps = []
        for i in range(n_q):
            ham = 0.5 * (64 - B @ Qs[i])
            order = np.argsort(ham)
            gnd = (db_lab[order[:k]] == q_lab[i]).astype(np.float64)
            hits = gnd.sum()
            if hits:
                pos = np.flatnonzero(gnd) + 1
                aps.append(np.mean(np.arange(1, hits + 1) / pos))
        return aps

    secs = best_of(run, repeats=1)
    rows = [{"engine": "numpy +-1 dot + argsort + AP@K", "nbits": 64, "relevance": "class", "threads": 1,
             "pairs": n_q * n_db, "seconds": secs, "pairs_per_s": n_q * n_db / secs}]
    from sklearn.metrics import average_precision_score

    n_sk = max(1, n_q // 5)

    def run_sklearn():
        for i in range(n_sk):
            ham = 0.5 * (64 - B @ Qs[i])
            average_precision_score(db_lab == q_lab[i], -ham)

    secs = best_of(run_sklearn, repeats=1)
    rows.append({"engine": "sklearn average_precision_score", "nbits": 64, "relevance": "class", "threads": 1,
                 "pairs": n_sk * n_db, "seconds": secs, "pairs_per_s": n_sk * n_db / secs})
    return rows


def run_timed(cmd, env=None):
    """Run a command; return (seconds, peak RSS of that process in MiB)."""
    t = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], capture_output=True, text=True, env=env)
    secs = time.perf_counter() - t
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return secs, int(out.stderr.strip().splitlines()[-1]) / 1024


def bench_end_to_end(work: Path, preset_kwargs: dict):
    from hashdist.data.synth import synth_dataset

    data = work / "flickr.zarr"
    synth_dataset(data, overwrite=True, **preset_kwargs)
    rows = []
    env = {**os.environ, "PREFECT_LOGGING_LEVEL": "WARNING"}
    for label, engine in (("cold, new process, flow", "flow"), ("new process, local threads", "local")):
        out = work / f"report-{engine}"
        secs, rss = run_timed([str(BIN / "hashdist"), "evaluate", str(data), "--out", str(out), "--no-cache",
                               "--quiet", "--overwrite", "--engine", engine], env)
        rep = json.loads((out / "report.json").read_text())
        rows.append({"run": label, "process_s": secs, "peak_rss_mib": rss, **rep["timing"], **rep["throughput"]})
    rows.append(bench_warm(data))
    return rows


WARM = """
import json, os, resource, sys, time
from concurrent.futures import ThreadPoolExecutor
from distributed import LocalCluster
from flows.evaluate import run_evaluation
from flows.runtime import embedded_cluster_kwargs
from hashdist.api import evaluate_local, prepare
from hashdist.data.dataset import open_dataset
from hashdist.kernels.histogram import histogram_block

data, threads = sys.argv[1], os.cpu_count()
cluster = LocalCluster(**embedded_cluster_kwargs(threads=threads), protocol="tcp://", host="127.0.0.1")  # an address
# that run_evaluation takes (it refuses inproc://, which reaches no other process)
work = lambda t: t["compute_s"] + t["reduce_s"] + t["metrics_s"]
flow = [run_evaluation(data, cache=False, address=cluster.scheduler_address).report for _ in range(3)][1:]
local = [evaluate_local(data, cache=False, threads=threads).report for _ in range(3)][1:]
prepared = prepare(data)
ds, plan = prepared.ds, prepared.plan
blocks = [(ds.codes("queries", b.q0, b.q1), ds.codes("database", b.d0, b.d1), ds.labels("queries", b.q0, b.q1),
           ds.labels("database", b.d0, b.d1)) for b in plan.histogram_blocks]
kernel_s = []
with ThreadPoolExecutor(threads) as pool:
    for _ in range(3):
        t = time.perf_counter()
        list(pool.map(lambda a: histogram_block(a[0], a[1], ds.nbits, plan.relevance, a[2], a[3],
                                                max_grade=plan.largest_grade), blocks))
        kernel_s.append(time.perf_counter() - t)
best_flow = min(flow, key=lambda r: work(r["timing"]))
print(json.dumps({"timing": best_flow["timing"], "throughput": best_flow["throughput"],
                  "flow_work_s": work(best_flow["timing"]), "local_work_s": min(work(r["timing"]) for r in local),
                  "kernel_s": min(kernel_s[1:]), "threads": threads,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def bench_warm(data: Path) -> dict:
    """Warm runs in one process (Prefect's API and the Dask cluster up, kernels compiled): the flow, the same
    library work without Prefect or Dask, and the bare kernel over the plan's blocks, each the best of 2.

    Prefect + Dask overhead = flow work - local work; work = compute + reduce + metrics (no writing)."""
    env = {**os.environ, "PREFECT_LOGGING_LEVEL": "WARNING"}
    out = subprocess.run([sys.executable, "-c", WARM, str(data)], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return {"run": "warm (API + cluster up), one process", **r["timing"], **r["throughput"],
            "peak_rss_mib": r["peak_rss_mib"],
            "overhead": {"kernel_s": r["kernel_s"], "local_work_s": r["local_work_s"], "flow_work_s": r["flow_work_s"],
                         "threads": r["threads"],
                         "prefect_dask_over_kernel": (r["flow_work_s"] - r["local_work_s"]) / r["kernel_s"],
                         "flow_over_kernel": (r["flow_work_s"] - r["kernel_s"]) / r["kernel_s"]}}


def _start_loopback_cluster(workers: int, threads: int, env: dict):
    """`dask scheduler` + `dask worker --nworkers W --nthreads T` on 127.0.0.1; returns (address, processes)."""
    import socket

    from distributed import Client

    from flows.runtime import LOOPBACK_DASK_ARGS

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    quiet = dict(env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs = [subprocess.Popen([str(BIN / "dask"), "scheduler", *LOOPBACK_DASK_ARGS, "--port", str(port)], **quiet)]
    procs.append(subprocess.Popen([str(BIN / "dask"), "worker", address, *LOOPBACK_DASK_ARGS, "--nworkers",
                                   str(workers), "--nthreads", str(threads)], **quiet))
    deadline = time.monotonic() + 60
    while True:
        try:
            with Client(address, timeout=5) as client:
                client.wait_for_workers(workers, timeout=60)
            return address, procs
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def bench_cluster(work: Path, data: Path, shapes=((1, 1), (2, 1), (1, 2))):
    """The flow on a loopback `dask scheduler` + workers, for workers x threads shapes; the blocks phase."""
    env = {**os.environ, "PREFECT_LOGGING_LEVEL": "WARNING"}
    rows = []
    for workers, threads in shapes:
        address, procs = _start_loopback_cluster(workers, threads, env)
        try:
            out = work / "cluster-report"
            cmd = [str(BIN / "hashdist"), "evaluate", str(data), "--out", str(out), "--no-cache", "--quiet",
                   "--overwrite", "--no-html", "--address", address]
            subprocess.run(cmd, check=True, capture_output=True, env=env)  # workers load the kernels
            secs, _ = run_timed(cmd, env)
            rep = json.loads((out / "report.json").read_text())
        finally:
            for p in procs[::-1]:
                p.terminate()
            for p in procs:
                p.wait(timeout=30)
        t = rep["timing"]
        rows.append({"workers": workers, "threads": threads, "process_s": secs, **t,
                     "pairs_per_s_compute": rep["throughput"]["pairs"] / t["compute_s"]})
    return rows


def bench_block_sizes(data: Path, sizes=((512, 262144), (2048, 65536), (2048, 262144), (8192, 262144),
                                         (2048, 1048576))):
    """The local engine in one warm process for several (query block rows, database block rows)."""
    code = f"""
import json, resource, sys
from hashdist.api import evaluate_local
rows = []
for qrows, drows in {sizes!r}:
    runs = [evaluate_local({str(data)!r}, cache=False, query_block_rows=qrows, db_block_rows=drows).report
            for _ in range(2)]
    t = min((r["timing"] for r in runs), key=lambda t: t["compute_s"])
    rows.append({{"query_block_rows": qrows, "db_block_rows": drows, "blocks": runs[0]["blocks"]["total"], **t,
                 "pairs_per_s_compute": runs[0]["throughput"]["pairs"] / t["compute_s"]}})
print(json.dumps(rows))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PREFECT_LOGGING_LEVEL": "WARNING"})
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


# frames where a thread waits rather than works (py-spy's idle detection misses some)
_WAITING = ("threading.py", "selectors.py", "queue.py", "concurrent/futures/thread.py", "concurrent/futures/_base.py")
# where CPU time goes: the first category whose marker is on a sample's stack
_CATEGORIES = (
    ("histogram kernel", "histogram_block ("),
    ("M_k (mLGAP bucket sizes)", "max_bucket_within ("),
    ("per-query metrics", "per_query_metrics ("),
    ("code counts and bit balance", "cached_code_counts ("),
    ("reading Zarr blocks", "Dataset.read ("),
    ("summing partial histograms", "add_partials"),
    ("writing report, plots, per_query.zarr", "write_outputs ("),
    ("Prefect task submission", "Task.submit ("),
    ("Prefect task-run machinery on workers", "run_task_sync ("),
    ("imports", "_find_and_load ("),
    ("numba: loading compiled kernels", "numba/"),
)


def bench_profile(work: Path, data: Path) -> dict:
    """py-spy over a cold `hashdist evaluate` (flow): CPU seconds per category, all threads, waits left out."""
    raw = work / "profile.txt"
    cmd = [str(BIN / "py-spy"), "record", "--nonblocking", "--rate", "200", "--format", "raw", "--output", str(raw),
           "--",
           str(BIN / "hashdist"), "evaluate", str(data), "--out", str(work / "profile-report"), "--no-cache",
           "--quiet", "--overwrite"]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PREFECT_LOGGING_LEVEL": "WARNING"})
    if out.returncode != 0:
        return {"error": f"py-spy failed: {out.stderr.strip()[-300:]}"}
    seconds: dict[str, float] = {}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if any(w in stack.rpartition(";")[2] for w in _WAITING):
            continue
        label = next((name for name, marker in _CATEGORIES if marker in stack), "other (Prefect, Dask, Python)")
        seconds[label] = seconds.get(label, 0.0) + int(count) / 200
    return {"cpu_seconds": sum(seconds.values()), "categories": dict(sorted(seconds.items(), key=lambda kv: -kv[1]))}


def bench_scaling(work: Path, sizes_db, sizes_q):
    from hashdist.data.synth import synth_dataset

    rows = []
    env = {**os.environ, "PREFECT_LOGGING_LEVEL": "WARNING"}
    for n_db in sizes_db:
        for n_q in sizes_q:
            data = work / f"scale-{n_db}-{n_q}.zarr"
            synth_dataset(data, n_database=n_db, n_queries=n_q, nbits=64, labels="multilabel", n_concepts=24,
                          overwrite=True)
            out = work / "scale-report"
            secs, rss = run_timed([str(BIN / "hashdist"), "evaluate", str(data), "--out", str(out), "--no-cache",
                                   "--quiet", "--overwrite", "--engine", "local", "--no-html"], env)
            rep = json.loads((out / "report.json").read_text())
            rows.append({"n_database": n_db, "n_queries": n_q, "process_s": secs, "peak_rss_mib": rss,
                         "compute_s": rep["timing"]["compute_s"], "pairs_per_s_compute": n_db * n_q /
                         rep["timing"]["compute_s"]})
    return rows


def markdown(results) -> str:
    lines = [f"# hashdist benchmarks, {results['date']}", "", f"machine: {machine_line(results['machine'])}", ""]
    lines += ["## Kernel throughput (query-item pairs per second)", "",
              "| engine | bits | relevance | threads | pairs/s |", "| --- | --- | --- | --- | --- |"]
    for r in results["kernels"] + results["baselines"]:
        if "error" in r:
            lines.append(f"| {r['engine']} | - | - | - | {r['error']} |")
        else:
            lines.append(f"| {r['engine']} | {r['nbits']} | {r['relevance']} | {r['threads']} "
                         f"| {r['pairs_per_s']:.3g} |")
    lines += ["", "## End to end, Flickr-1M-like preset", "",
              "| run | wall s | startup | compute | reduce | metrics | write | pairs/s | peak RSS MiB |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results["end_to_end"]:
        lines.append(f"| {r['run']} | {r['wall_s']:.1f} | {r['startup_s']:.1f} | {r['compute_s']:.1f} | "
                     f"{r['reduce_s']:.2f} | {r['metrics_s']:.1f} | {r.get('write_s', 0):.1f} | "
                     f"{r['pairs_per_s']:.3g} | {r['peak_rss_mib']:.0f} |")
    warm = [r for r in results["end_to_end"] if "overhead" in r]
    if warm:
        o = warm[0]["overhead"]
        lines += ["", f"Warm, {o['threads']} threads, best of 2: bare kernel over the plan's blocks "
                  f"{o['kernel_s']:.2f} s; "
                  f"the same work in-process (local engine: blocks, code counts, M_k, metrics) "
                  f"{o['local_work_s']:.2f} s; "
                  f"through Prefect + Dask {o['flow_work_s']:.2f} s. Prefect + Dask overhead "
                  f"{100 * o['prefect_dask_over_kernel']:.0f}% of the bare kernel time; everything beyond the kernel "
                  f"{100 * o['flow_over_kernel']:.0f}%."]
    if results.get("cluster"):
        lines += ["", "## Loopback Dask cluster (`dask scheduler` + `dask worker` on 127.0.0.1, flow, new process)", "",
                  "| workers | threads each | blocks phase s | blocks pairs/s | metrics s | wall s |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in results["cluster"]:
            lines.append(f"| {r['workers']} | {r['threads']} | {r['compute_s']:.2f} | {r['pairs_per_s_compute']:.3g} | "
                         f"{r['metrics_s']:.2f} | {r['wall_s']:.1f} |")
    if results.get("block_sizes"):
        lines += ["", "## Block sizes (local engine, warm, all cores)", "",
                  "| query block rows | database block rows | blocks | blocks phase s | pairs/s |",
                  "| --- | --- | --- | --- | --- |"]
        for r in results["block_sizes"]:
            lines.append(f"| {r['query_block_rows']} | {r['db_block_rows']} | {r['blocks']} | {r['compute_s']:.2f} | "
                         f"{r['pairs_per_s_compute']:.3g} |")
    prof = results.get("profile")
    if prof and "categories" in prof:
        lines += ["", f"## Profile: py-spy over a cold `hashdist evaluate` (flow), {prof['cpu_seconds']:.1f} CPU s "
                  "in all threads, waits left out", "", "| where | CPU s | share |", "| --- | --- | --- |"]
        for name, secs in prof["categories"].items():
            lines.append(f"| {name} | {secs:.2f} | {100 * secs / prof['cpu_seconds']:.0f}% |")
    lines += ["", "## Scaling (local engine, new process each)", "",
              "| N | Q | process s | compute s | compute pairs/s | peak RSS MiB |",
              "| --- | --- | --- | --- | --- | --- |"]
    for r in results["scaling"]:
        lines.append(f"| {r['n_database']} | {r['n_queries']} | {r['process_s']:.1f} | {r['compute_s']:.1f} | "
                     f"{r['pairs_per_s_compute']:.3g} | {r['peak_rss_mib']:.0f} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, to check the script runs")
    ap.add_argument("--out", default=str(HERE / "results"))
    a = ap.parse_args()
    if a.quick:
        n_db, n_q, preset = 1 << 16, 256, dict(n_database=100_000, n_queries=1_000, nbits=64, labels="multilabel")
        scale_db, scale_q = (50_000, 100_000), (200, 400)
    else:
        n_db, n_q = 1 << 20, 2048
        preset = dict(n_database=1_000_000, n_queries=10_000, nbits=64, labels="multilabel", n_concepts=24)
        scale_db, scale_q = (250_000, 500_000, 1_000_000), (1_000, 5_000, 10_000)
    results = {"date": dt.date.today().isoformat(), "machine": machine(),
               "quick": a.quick}
    print("kernels ...", file=sys.stderr)
    rows = bench_kernels(n_db, n_q)
    results["kernels"] = [r for r in rows if r.get("engine") == "hashdist histogram"]
    results["baselines"] = [r for r in rows if r.get("engine") != "hashdist histogram"]
    print("numpy / sklearn evaluation ...", file=sys.stderr)
    results["baselines"] += bench_numpy_eval(n_db, 20 if not a.quick else 5)
    with tempfile.TemporaryDirectory(prefix="hashdist-bench-") as tmp:
        print("end to end ...", file=sys.stderr)
        results["end_to_end"] = bench_end_to_end(Path(tmp), preset)
        print("loopback cluster and block sizes ...", file=sys.stderr)
        results["cluster"] = bench_cluster(Path(tmp), Path(tmp) / "flickr.zarr")
        results["block_sizes"] = bench_block_sizes(Path(tmp) / "flickr.zarr", **(
            {"sizes": ((256, 16384), (1024, 65536))} if a.quick else {}))
        print("profile ...", file=sys.stderr)
        results["profile"] = bench_profile(Path(tmp), Path(tmp) / "flickr.zarr")
        print("scaling ...", file=sys.stderr)
        results["scaling"] = bench_scaling(Path(tmp), scale_db, scale_q)
    results["peak_rss_bench_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    text = markdown(results)
    write_results(a.out, results["date"] + ("-quick" if a.quick else ""), results, text)
    print(text)


if __name__ == "__main__":
    main()
