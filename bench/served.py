"""`hashdist evaluate --served` on the Flickr-1M preset (issue #48): the nprobe sweep and the --served overhead.

    .venv/bin/python -m bench.served [--dataset PATH] [--k 1000] [--nprobe 1 4 16 64] [--overhead-nprobe 16]
                                     [--repeats 3] [--wait-quiet 30] [--quick]      # from the repository root

1. Lists: without --dataset it writes the flickr1m preset (10,000 x 1,000,000, 64 bits; --quick: the demo preset,
   K = 100) into a temporary directory, then runs ``hashdist.search`` once: one BIVF1024 index (trained on 262,144
   seeded rows), searched at K and at each --nprobe, one ``NAME.npz`` each (I int64, D int32, time per query),
   kept in the temporary directory.
2. The --served overhead: `hashdist evaluate DATA --engine local --no-html --quiet --k K --no-cache` without
   --served and with one (BIVF1024-nprobe16, Q x K entries), new processes, numba cache warm (one untimed run of
   each first), alternating, median of --repeats; each process's own peak RSS (VmHWM). Targets: wall at most
   +25%; peak RSS growth at most the served arrays held once: Q x K x 12 bytes (faiss's I int64 and D int32).
   Then a cached rerun: a run without --served fills a block cache, and --repeats runs with --served read it;
   report.json's ``blocks`` must show every exhaustive block taken from the cache.
3. The sweep: one `hashdist evaluate` with every --nprobe run as --served; per run from report.json: neighbour
   recall@K expected [worst, best], lenient, exact, served mAP@K (normaliser: retrieved) and P@K against the
   exhaustive ones, and the time per query the file carries.

Before each timing it waits up to --wait-quiet s for other processes to use under 15% of the CPUs (bench/fixed_costs.py
Noise) and records the share they took. Prints markdown with the CPU model; writes bench/results/<date>-served.json
and .md (<date>-served-quick.* with --quick).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

import hashdist
from bench.fixed_costs import HASHDIST, NOISE, cache_env, source, source_line
from bench.run import machine, machine_line, write_results
from hashdist.data.synth import PRESETS, synth_dataset

HERE = Path(__file__).resolve().parent
INDEX = "BIVF1024"
TIMEOUT = 1800  # seconds for any one evaluate process
HWM_POLL_S = 0.02  # how often a child's VmHWM is read
FAISS_BYTES_PER_ENTRY = 8 + 4  # faiss's I (int64) and D (int32), as hashdist search writes them


def log(msg: str) -> None:
    print(f"[served {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def child(cmd: list[str], env: dict, label: str) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes) of one new process, after waiting for quiet CPUs; its process group is
    killed after TIMEOUT s. The peak is the process's own high-water mark (VmHWM, read every HWM_POLL_S until it
    exits): wait4's ru_maxrss is not, since Linux folds the parent's high-water mark into a child started by
    vfork and exec (this bench's own, after it built the index, was 488 MiB)."""
    NOISE.wait_quiet(label)
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True)
        timer = threading.Timer(TIMEOUT, os.killpg, (proc.pid, signal.SIGKILL))
        timer.start()
        peak = [0]
        watcher = threading.Thread(target=_watch_hwm, args=(proc.pid, peak), daemon=True)
        watcher.start()
        try:
            _, status, _ = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        wall = time.perf_counter() - t0
        watcher.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}; killed after {TIMEOUT} s if -9):\n"
                               f"{err.read().decode(errors='replace')[-3000:]}")
    return wall, peak[0]


def _watch_hwm(pid: int, peak: list) -> None:
    """The process's VmHWM in bytes into peak[0], until /proc no longer shows it running (bounded by TIMEOUT)."""
    for _ in range(int(TIMEOUT / HWM_POLL_S) + 1):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("State", "").split()[:1] == ["Z"]:  # exited, not yet waited for
            return
        if "VmHWM" in fields:
            peak[0] = max(peak[0], int(fields["VmHWM"].split()[0]) * 1024)
        time.sleep(HWM_POLL_S)


def evaluate_cmd(dataset: str, out: Path, k: int, *extra: str) -> list[str]:
    return [HASHDIST, "evaluate", str(dataset), "--engine", "local", "--no-html", "--quiet", "--k", str(k),
            "--out", str(out), "--overwrite", *extra]


def make_lists(dataset: str, out: Path, args) -> dict[str, Path]:
    """One BIVF1024 index searched at K and every nprobe: {run name: its .npz}."""
    paths = NOISE.measure("search", hashdist.search, dataset, index=INDEX, k=args.k, nprobe=args.nprobe,
                          threads=args.threads, out=out, overwrite=True)
    return {Path(p).stem: Path(p) for p in paths}


def _summary(walls: list[float], rss: list[int]) -> dict:
    return {"wall_s": walls, "peak_rss_bytes": rss, "wall_median_s": statistics.median(walls),
            "peak_rss_median_bytes": statistics.median(rss)}


def overhead(dataset: str, work: Path, env: dict, served: str, args) -> dict:
    """Without and with one --served run (--no-cache), alternating, after one untimed run of each; then the
    cached rerun with --served."""
    out = work / "report-overhead"
    plain = evaluate_cmd(dataset, out, args.k, "--no-cache")
    with_served = plain + ["--served", served]
    log("overhead: warm-up runs (numba cache, kernels) ...")
    child(plain, env, "warm-up")
    child(with_served, env, "warm-up --served")
    runs = {"plain": ([], []), "served": ([], [])}
    for i in range(args.repeats):
        for name, cmd in (("plain", plain), ("served", with_served)):
            wall, rss = child(cmd, env, f"evaluate {name}")
            runs[name][0].append(wall)
            runs[name][1].append(rss)
        log(f"overhead {i + 1}/{args.repeats}: without {runs['plain'][0][-1]:.2f} s "
            f"{runs['plain'][1][-1] / 2**20:.0f} MiB, with --served {runs['served'][0][-1]:.2f} s "
            f"{runs['served'][1][-1] / 2**20:.0f} MiB")
    found = {name: _summary(*v) for name, v in runs.items()}
    found["wall_ratio"] = found["served"]["wall_median_s"] / found["plain"]["wall_median_s"]
    found["rss_growth_bytes"] = found["served"]["peak_rss_median_bytes"] - found["plain"]["peak_rss_median_bytes"]
    found["cached"] = cached_rerun(dataset, work, env, served, args)
    return found


def cached_rerun(dataset: str, work: Path, env: dict, served: str, args) -> dict:
    """A run without --served fills a block cache; --repeats runs with --served read it: walls, peak RSS and
    report.json's blocks (every exhaustive block must come from the cache)."""
    out, cache = work / "report-cached", work / "block-cache"
    child(evaluate_cmd(dataset, out, args.k, "--cache", str(cache)), env, "fill the cache")
    cmd = evaluate_cmd(dataset, out, args.k, "--cache", str(cache), "--served", served)
    walls, rss, blocks = [], [], []
    for i in range(args.repeats):
        wall, peak = child(cmd, env, "cached rerun --served")
        walls.append(wall)
        rss.append(peak)
        blocks.append(json.loads((out / "report.json").read_text())["blocks"])
        log(f"cached rerun {i + 1}/{args.repeats}: {wall:.2f} s {peak / 2**20:.0f} MiB, blocks {blocks[-1]}")
    return {**_summary(walls, rss), "blocks": blocks,
            "all_blocks_cached": all(b["cached"] == b["total"] and not b["computed"] for b in blocks)}


def sweep(dataset: str, work: Path, env: dict, lists: dict[str, Path], k: int) -> dict:
    """One evaluate with every run as --served: per run the neighbour measures, served against exhaustive mAP@K
    and P@K, and the time per query its file carries."""
    out = work / "report-sweep"
    cmd = evaluate_cmd(dataset, out, k, "--no-cache")
    for name, path in lists.items():
        cmd += ["--served", f"{name}={path}"]
    log(f"sweep: one evaluate with {len(lists)} served runs ...")
    wall, rss = child(cmd, env, "sweep")
    report = json.loads((out / "report.json").read_text())
    key, rows = str(k), {}
    for name, path in lists.items():
        s = report["served"][name]
        with np.load(path) as z:
            file_time = float(z["time_per_query_s"])
        rows[name] = {"recall": s["neighbours"]["recall_at_k"][key], "lenient": s["neighbours"]["lenient_at_k"][key],
                      "exact": s["neighbours"]["exact_at_k"][key],
                      "map_served": s["metrics"]["map_at_k"][key]["retrieved"],
                      "precision_served": s["metrics"]["precision_at_k"][key],
                      "cost_map": s["cost"]["map_at_k"][key]["retrieved"],
                      "time_per_query_s": file_time, "report_time_per_query_s": s.get("time_per_query_s")}
    return {"wall_s": wall, "peak_rss_bytes": rss, "k": k, "runs": rows,
            "map_exhaustive": report["metrics"]["map_at_k"][key]["retrieved"],
            "precision_exhaustive": report["metrics"]["precision_at_k"][key]}


def _num(x) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def _interval(v: dict) -> str:
    return f"{_num(v['expected'])} [{_num(v['worst'])}, {_num(v['best'])}]"


def sweep_table(s: dict) -> list[str]:
    k = s["k"]
    lines = [f"| run | recall@{k} expected [worst, best] | lenient | exact | mAP@{k} served / exhaustive | "
             f"P@{k} served / exhaustive | µs per query |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in s["runs"].items():
        lines.append(f"| {name} | {_interval(r['recall'])} | {_num(r['lenient'])} | {_num(r['exact'])} | "
                     f"{_num(r['map_served']['expected'])} / {_num(s['map_exhaustive']['expected'])} | "
                     f"{_num(r['precision_served']['expected'])} / {_num(s['precision_exhaustive']['expected'])} | "
                     f"{r['time_per_query_s'] * 1e6:.1f} |")
    return lines


def overhead_table(r: dict) -> list[str]:
    o, entries = r["overhead"], r["entries"]
    n, mib = len(o["plain"]["wall_s"]), 2**20
    bound = entries * FAISS_BYTES_PER_ENTRY
    c = o["cached"]
    blocks = c["blocks"][-1]
    return [
        "| what | measured | target | met |", "| --- | --- | --- | --- |",
        f"| wall, `--engine local --no-cache`, median of {n}: with --served / without | "
        f"{o['served']['wall_median_s']:.2f} / {o['plain']['wall_median_s']:.2f} s = {o['wall_ratio']:.3f} | "
        f"<= 1.25 | {'yes' if o['wall_ratio'] <= 1.25 else 'no'} |",
        f"| peak RSS, median of {n}: with --served - without | {o['served']['peak_rss_median_bytes'] / mib:.0f} - "
        f"{o['plain']['peak_rss_median_bytes'] / mib:.0f} MiB = {o['rss_growth_bytes'] / mib:.1f} MiB | <= "
        f"{bound / mib:.1f} MiB ({entries:,} entries x {FAISS_BYTES_PER_ENTRY} bytes) | "
        f"{'yes' if o['rss_growth_bytes'] <= bound else 'no'} |",
        f"| cached rerun with --served (blocks from a cache filled without it), median of {n} | "
        f"{c['wall_median_s']:.2f} s, {c['peak_rss_median_bytes'] / mib:.0f} MiB; blocks {blocks['cached']} of "
        f"{blocks['total']} cached, {blocks['computed']} computed | every block cached | "
        f"{'yes' if c['all_blocks_cached'] else 'no'} |"]


def markdown(r: dict) -> str:
    ds = r["dataset"]
    lines = [f"# hashdist --served (issue #48), {r['date']}{' (--quick)' if r['quick'] else ''}", "",
             f"machine: {machine_line(r['machine'])}", "", f"code: {source_line(r['source'])}", "",
             f"{ds['n_queries']:,} queries x {ds['n_database']:,} items, {ds['nbits']} bits ({ds['preset']}); "
             f"{INDEX} searched at K = {r['sweep']['k']}, one build ({r['search_s']:.1f} s); served run in the "
             f"overhead rows: {r['overhead_run']} ({r['entries']:,} entries)", "", "## --served overhead", ""]
    lines += overhead_table(r)
    lines += ["", f"Served arrays held once: faiss's I and D, {FAISS_BYTES_PER_ENTRY} bytes per entry. hashdist holds "
              "I as int32 (the ids fit) and D as int32, 8 bytes per entry, and each metric item its rows' "
              "recomputed entries while it runs.", "", "## nprobe sweep", ""]
    lines += sweep_table(r["sweep"])
    lines += ["", "mAP@K: the `retrieved` normaliser; expected values over tie orders. Time per query: faiss's, from "
              "the files (`time_per_query_s`).", "", "CPU share other processes took: " + "; ".join(
                  f"{name} {100 * n['other_share']:.0f}%" for name, n in r["noise"].items()) + "."]
    return "\n".join(lines) + "\n"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", help="a hashdist dataset (default: the flickr1m preset, demo with --quick, "
                        "written into a temporary directory)")
    parser.add_argument("--k", type=int, help="K of the lists and of --k (default 1000; 100 with --quick)")
    parser.add_argument("--nprobe", type=int, nargs="+", default=[1, 4, 16, 64], help="the sweep's settings")
    parser.add_argument("--overhead-nprobe", type=int, default=16, help="the served run of the overhead rows")
    parser.add_argument("--threads", type=int, help="faiss's threads (default: all cores)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each command (median)")
    parser.add_argument("--wait-quiet", type=float, default=30.0, help="seconds to wait for quiet CPUs, each timing")
    parser.add_argument("--quick", action="store_true", help="the demo preset and K = 100")
    parser.add_argument("--out", default=str(HERE / "results"), help="where the .json and .md go")
    args = parser.parse_args()
    if args.overhead_nprobe not in args.nprobe:
        parser.error(f"--overhead-nprobe {args.overhead_nprobe} is not among --nprobe {args.nprobe}")
    args.k = args.k or (100 if args.quick else 1000)
    return args


def main() -> None:
    args = parse_args()
    NOISE.wait_s = args.wait_quiet
    preset = "demo" if args.quick else "flickr1m"
    results = {"date": dt.date.today().isoformat(), "quick": args.quick, "source": source(), "machine": machine()}
    log(f"machine: {machine_line(results['machine'])}")
    with tempfile.TemporaryDirectory(prefix="hashdist-bench-served-") as tmp:
        work = Path(tmp)
        dataset = args.dataset
        if dataset is None:
            t0 = time.perf_counter()
            dataset = synth_dataset(work / f"{preset}.zarr", **PRESETS[preset])
            log(f"synth --preset {preset}: {time.perf_counter() - t0:.1f} s")
        ds = hashdist.open_dataset(dataset)
        results["dataset"] = {"path": args.dataset, "preset": "given" if args.dataset else preset,
                              "n_queries": ds.n_queries, "n_database": ds.n_database, "nbits": ds.nbits}
        env = cache_env(work / "hashdist-cache", work / "numba-cache")
        t0 = time.perf_counter()
        lists = make_lists(dataset, work / "runs", args)
        results["search_s"] = time.perf_counter() - t0
        name = f"{INDEX}-nprobe{args.overhead_nprobe}"
        results["overhead_run"], results["entries"] = name, ds.n_queries * args.k
        results["overhead"] = NOISE.measure("overhead", overhead, dataset, work, env, f"{name}={lists[name]}", args)
        results["sweep"] = NOISE.measure("sweep", sweep, dataset, work, env, lists, args.k)
        results["noise"] = NOISE.sections
    text = markdown(results)
    stem = write_results(args.out, f"{results['date']}-served" + ("-quick" if args.quick else ""), results, text)
    log(f"wrote {stem}.json and .md")
    print(text)


if __name__ == "__main__":
    main()
