"""Fixed costs of hashdist (#13 item 4): engine overhead, first-run compilation, kernel vs faiss, end to end.

    .venv/bin/python bench/fixed_costs.py [--quick]

1. the machine (CPU model, cores, SIMD flags, versions), in every output;
2. fixed overhead of the default engine: `hashdist evaluate` on the demo preset, new processes, numba cache and
   Prefect's template database warm, flow (default) and `--engine local` alternating, median of 5 each;
3. first-run compile cost: `--engine local --no-cache` with an empty numba cache and an empty HASHDIST_CACHE
   (nothing compiled, no generated kernel sources), then the same command again (warm); median of 3; demo and
   Flickr-1M presets;
4. the histogram kernel against faiss `hammings` on one thread, same codes, B = 64 and 128, class and multi-label,
   best of 5 interleaved rounds;
   on a CPU with AVX-512, again as an AVX2 machine runs them (--avx2-target, default znver3: numba compiling for
   that CPU in a child process, faiss at its AVX2 SIMD level);
5. Flickr-1M end to end (new process, `--no-cache`, warm numba cache), flow and local, against the bare kernel
   over all its pairs in this process on all cores; and each command's CPU seconds (its own and those of the
   processes it waited for, as the flow's API server) over the cores: the least wall those seconds allow.

--quick skips the Flickr-1M parts and uses 256 x 65,536 codes for 4. Writes bench/results/<date>-fixed-costs.json
and .md (<date>-fixed-costs-quick.* with --quick). Not part of the test suite; run it on a quiet machine: before
each timing it waits (--wait-quiet, up to 30 s) for other processes to leave the CPUs, and it records the CPU seconds
other processes used while each part ran.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import importlib.util
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
HASHDIST = str(BIN / "hashdist")
TIMEOUT_DEMO = 600  # seconds for any one demo-sized subprocess
TIMEOUT_FLICKR = 1800  # seconds for any one Flickr-1M subprocess
TILE_Q, TILE_D = 256, 4096  # faiss output tiles: 4 MiB of int32, within the last-level cache


def log(msg: str) -> None:
    print(f"[fixed_costs {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@functools.cache
def _bench_run():
    """bench/run.py as a module (machine, clustered_codes, best_of), loaded once, without putting bench/ on
    sys.path."""
    spec = importlib.util.spec_from_file_location("hashdist_bench_run", HERE / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def source() -> dict:
    """Which hashdist the run measures: where it is imported from, and the repository's commit and local changes."""
    spec = importlib.util.find_spec("hashdist")
    path = str(Path(spec.origin).parent) if spec and spec.origin else None

    def git(*args):
        try:
            out = subprocess.run(["git", "-C", str(HERE.parent), *args], capture_output=True, text=True, timeout=30)
            return out.stdout.strip() if out.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            return None

    changed = git("status", "--porcelain", "--", "hashdist", "flows")
    return {"hashdist_path": path, "from_repository": path == str(HERE.parent / "hashdist"),
            "repo_head": git("rev-parse", "--short", "HEAD"),
            "repo_changes_in_hashdist_flows": None if changed is None else len(changed.splitlines())}


def source_line(s: dict) -> str:
    if not s["from_repository"]:
        return (f"hashdist imported from {s['hashdist_path']}, outside this repository's working tree (repository "
                f"HEAD at the start: {s['repo_head']})")
    return (f"hashdist from this repository, HEAD {s['repo_head']} with {s['repo_changes_in_hashdist_flows']} "
            "uncommitted changes under hashdist/ and flows/")


def _cpu_seconds() -> tuple[float, float]:
    """(busy CPU seconds of the whole machine since boot, CPU seconds of this process and its reaped children)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait
    except (OSError, ValueError, IndexError):
        busy = float("nan")
    mine = sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))
    return busy, mine


class Noise:
    """Keeps timings away from other processes: waits for quiet CPUs before each timing (at most wait_s), and
    records the CPU seconds other processes used while each part ran, the waits left out."""

    def __init__(self, wait_s: float):
        self.sections: dict[str, dict] = {}
        self.wait_s = wait_s
        self.waited_s = 0.0  # all waits so far
        self.waited_other_cpu_s = 0.0  # CPU seconds other processes used during them

    def _others_over(self, seconds: float) -> tuple[float, float]:
        (busy0, mine0), t = _cpu_seconds(), time.perf_counter()
        time.sleep(seconds)
        (busy1, mine1), wall = _cpu_seconds(), time.perf_counter() - t
        return max(0.0, (busy1 - busy0) - (mine1 - mine0)), wall

    def wait_quiet(self, name: str) -> None:
        """Wait for a 2 s window in which other processes use < 15% of the machine, at most wait_s."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < self.wait_s:
            others, wall = self._others_over(2.0)
            self.waited_other_cpu_s += others
            if others < 0.15 * wall * (os.cpu_count() or 1):
                break
        waited = time.perf_counter() - t0
        self.waited_s += waited
        if waited > 2.5:
            log(f"{name}: waited {waited:.0f} s for other processes to quieten")

    def measure(self, name: str, fn, *args, **kwargs):
        (busy0, mine0), t0 = _cpu_seconds(), time.perf_counter()
        waited0, waited_other0 = self.waited_s, self.waited_other_cpu_s
        try:
            return fn(*args, **kwargs)
        finally:
            (busy1, mine1), wall = _cpu_seconds(), time.perf_counter() - t0
            waited = self.waited_s - waited0
            others = (busy1 - busy0) - (mine1 - mine0) - (self.waited_other_cpu_s - waited_other0)
            others, timed_s = max(0.0, others), max(1e-9, wall - waited)
            self.sections[name] = {"wall_s": wall, "waited_s": waited, "other_cpu_s": others,
                                   "other_share": others / (timed_s * (os.cpu_count() or 1)),
                                   "loadavg_1min_end": os.getloadavg()[0]}
            log(f"{name}: other processes used {others:.1f} CPU s in {timed_s:.1f} s (waits of {waited:.0f} s "
                "left out)")


NOISE = Noise(0.0)  # main() sets the wait


def cache_env(hashdist_cache: Path, numba_cache: Path) -> dict:
    """Environment for a subprocess: its own HASHDIST_CACHE (block results, generated kernels) and numba cache.

    XDG_CACHE_HOME is left alone, so the flow's Prefect template database stays in ~/.cache/hashdist."""
    return {**os.environ, "PREFECT_LOGGING_LEVEL": "WARNING", "HASHDIST_CACHE": str(hashdist_cache),
            "NUMBA_CACHE_DIR": str(numba_cache)}


def timed(cmd: list[str], env: dict, timeout: float) -> float:
    """Wall seconds of a new process; on timeout its whole process group (Prefect server, workers) is killed.

    The CPU seconds (user + system) of the process and of every process it waited for (the flow's API server)
    are added to CPU_SECONDS under the command."""
    NOISE.wait_quiet(Path(cmd[0]).name + " " + cmd[1])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RuntimeError(f"timed out after {timeout} s: {' '.join(cmd)}") from None
    secs = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU_SECONDS.setdefault(tuple(cmd), []).append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return secs


CPU_SECONDS: dict[tuple[str, ...], list[float]] = {}  # command -> CPU seconds of each of its runs (see timed)


def evaluate_cmd(data: Path, out: Path, *extra: str) -> list[str]:
    return [HASHDIST, "evaluate", str(data), "--out", str(out), "--overwrite", "--quiet", *extra]


def synth(preset: str, data: Path, timeout: float) -> float:
    log(f"synth --preset {preset} ...")
    return timed([HASHDIST, "synth", "--preset", preset, "--out", str(data), "--overwrite"],
                 {**os.environ, "PREFECT_LOGGING_LEVEL": "WARNING"}, timeout)


def alternate(flow_cmd, local_cmd, out: Path, env: dict, timeout: float, repeats: int, label: str):
    """The two commands in turn, ``repeats`` times: flow and local walls, their CPU seconds, and the last flow
    run's report timing."""
    flow, local, timing = [], [], None
    for i in range(repeats):
        flow.append(timed(flow_cmd, env, timeout))
        timing = json.loads((out / "report.json").read_text())["timing"]
        local.append(timed(local_cmd, env, timeout))
        log(f"{label} {i + 1}/{repeats}: flow {flow[-1]:.2f} s, local {local[-1]:.2f} s")
    cpu = {name: CPU_SECONDS[tuple(cmd)][-repeats:] for name, cmd in (("flow", flow_cmd), ("local", local_cmd))}
    return {"flow_s": flow, "local_s": local, "flow_median_s": statistics.median(flow),
            "local_median_s": statistics.median(local), "flow_cpu_s": cpu["flow"], "local_cpu_s": cpu["local"],
            "flow_cpu_median_s": statistics.median(cpu["flow"]), "local_cpu_median_s": statistics.median(cpu["local"]),
            "last_flow_timing": timing}


def fixed_overhead(work: Path, demo: Path, env: dict, repeats: int = 5) -> dict:
    """Flow (default engine) and local engine on the demo, new processes, warm caches, alternating."""
    out = work / "report-demo"
    flow_cmd = evaluate_cmd(demo, out, "--no-html")
    local_cmd = flow_cmd + ["--engine", "local"]
    log("overhead: warm-up (local run fills the numba cache, flow run the Prefect template and imports) ...")
    timed(local_cmd, env, TIMEOUT_DEMO)
    timed(flow_cmd, env, TIMEOUT_DEMO)
    runs = alternate(flow_cmd, local_cmd, out, env, TIMEOUT_DEMO, repeats, "overhead")
    return {**runs, "difference_s": runs["flow_median_s"] - runs["local_median_s"]}


def compile_cost(work: Path, data: Path, name: str, timeout: float, repeats: int = 3) -> dict:
    """`--engine local --no-cache` with empty numba and hashdist caches (cold), then again with them (warm)."""
    cold, warm = [], []
    for i in range(repeats):
        fresh = work / f"cold-{name}-{i}"
        env = cache_env(fresh / "hashdist", fresh / "numba")
        cmd = evaluate_cmd(data, work / f"report-cold-{name}", "--no-html", "--engine", "local", "--no-cache")
        cold.append(timed(cmd, env, timeout))
        warm.append(timed(cmd, env, timeout))
        shutil.rmtree(fresh, ignore_errors=True)
        log(f"compile {name} {i + 1}/{repeats}: cold {cold[-1]:.2f} s, warm {warm[-1]:.2f} s")
    return {"cold_s": cold, "warm_s": warm, "cold_median_s": statistics.median(cold),
            "warm_median_s": statistics.median(warm),
            "difference_s": statistics.median(cold) - statistics.median(warm)}


def faiss_tiles(faiss, qc: np.ndarray, dc: np.ndarray):
    """A function that runs faiss.hammings over all pairs, in (256, 4096) int32 output tiles that stay in cache."""
    qb, db = np.ascontiguousarray(qc).view(np.uint8), np.ascontiguousarray(dc).view(np.uint8)
    dis = np.empty((TILE_Q, TILE_D), dtype=np.int32)
    dis_ptr = faiss.swig_ptr(dis)
    q_tiles = [(faiss.swig_ptr(qb[s : s + TILE_Q]), len(qb[s : s + TILE_Q])) for s in range(0, len(qb), TILE_Q)]
    d_tiles = [(faiss.swig_ptr(db[s : s + TILE_D]), len(db[s : s + TILE_D])) for s in range(0, len(db), TILE_D)]
    nbytes = qb.shape[1]

    def run(keep=(qb, db, dis)):  # swig pointers do not keep their arrays alive: the function does
        for q_ptr, nq in q_tiles:
            for d_ptr, nd in d_tiles:
                faiss.hammings(q_ptr, d_ptr, nq, nd, nbytes, dis_ptr)

    return run


def faiss_tiled(faiss, qc: np.ndarray, dc: np.ndarray, best_of) -> float:
    """Best-of-5 seconds of :func:`faiss_tiles`."""
    run = faiss_tiles(faiss, qc, dc)
    run()
    NOISE.wait_quiet("faiss")
    return best_of(run, repeats=5)


def interleaved_best(runs: dict, repeats: int = 5) -> dict:
    """Best-of-``repeats`` seconds of each function, timed in rounds of one call each: a slower few seconds of the
    machine (this project's machines have them) then reach every function of a ratio alike."""
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, run in runs.items():
            t = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def kernel_vs_faiss(n_q: int, n_db: int, helpers, faiss_level: str | None = None) -> list[dict]:
    """histogram_block and faiss.hammings on one thread, the same clustered codes (bench/run.py's); faiss at
    ``faiss_level`` (a faiss.SIMDLevel_* name such as AVX2), else the best its CPU allows."""
    from hashdist.data.bits import pack_bits
    from hashdist.kernels.histogram import histogram_block

    try:
        import faiss
    except ImportError:
        return [{"error": "faiss-cpu not installed (pip install -e '.[bench]')"}]
    faiss.omp_set_num_threads(1)
    if faiss_level and not hasattr(faiss, "SIMDConfig"):
        return [{"error": f"faiss-cpu {version('faiss-cpu')} cannot choose its SIMD level (1.15 can)"}]
    if faiss_level:
        faiss.SIMDConfig.set_level(getattr(faiss, f"SIMDLevel_{faiss_level}"))
    level = faiss.SIMDConfig.get_level_name() if hasattr(faiss, "SIMDConfig") else None
    rng = np.random.default_rng(0)
    pairs = n_q * n_db
    rows = []
    for nbits in (64, 128):
        db_bits, db_lab, q_bits, q_lab = helpers.clustered_codes(rng, n_db, n_q, nbits)
        dc, qc = pack_bits(db_bits), pack_bits(q_bits)
        multi_db = pack_bits((rng.random((n_db, 24)) < 0.08) | (np.arange(24) == db_lab[:, None]))
        multi_q = pack_bits((rng.random((n_q, 24)) < 0.08) | (np.arange(24) == q_lab[:, None]))
        runs, grades = {"faiss": faiss_tiles(faiss, qc, dc)}, {}
        for kind, qr, dr in (("class", q_lab, db_lab), ("multilabel", multi_q, multi_db)):
            grades[kind] = 1 if kind == "class" else int(np.bitwise_count(multi_q).sum(axis=1).max())
            runs[kind] = functools.partial(histogram_block, qc, dc, nbits, kind, qr, dr, max_grade=grades[kind])
            histogram_block(qc[:64], dc[:8192], nbits, kind, qr[:64], dr[:8192], max_grade=grades[kind])  # compile
        runs["faiss"]()
        log(f"kernel vs faiss: B={nbits}, faiss and hashdist class and multi-label (max_grade {grades['multilabel']}),"
            " 5 rounds ...")
        NOISE.wait_quiet("kernel vs faiss")
        best = interleaved_best(runs)
        for kind, grade in grades.items():
            rows.append({"nbits": nbits, "relevance": kind, "max_grade": grade, "n_queries": n_q,
                         "n_database": n_db, "hashdist_s": best[kind], "faiss_s": best["faiss"], "faiss_level": level,
                         "hashdist_pairs_per_s": pairs / best[kind], "faiss_pairs_per_s": pairs / best["faiss"],
                         "ratio": best[kind] / best["faiss"]})
    return rows


def kernel_vs_faiss_as_avx2(n_q: int, n_db: int, target: str) -> dict:
    """kernel_vs_faiss as an AVX2 machine runs it, on this CPU: in a child process whose numba compiles for
    ``target`` (NUMBA_CPU_NAME, with that CPU's own features: no AVX-512), faiss at its AVX2 level."""
    env = {**os.environ, "NUMBA_CPU_NAME": target, "NUMBA_CPU_FEATURES": ""}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--kernel-vs-faiss-child", str(n_q), str(n_db)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_DEMO)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return {"numba_target": target, "rows": json.loads(out.stdout.splitlines()[-1])}


def flickr_end_to_end(work: Path, data: Path, env: dict, helpers, repeats: int = 2) -> dict:
    """New processes with `--no-cache` (flow and local, alternating, median), and the bare kernel in-process."""
    out = work / "report-flickr"
    flow_cmd = evaluate_cmd(data, out, "--no-cache")
    local_cmd = flow_cmd + ["--engine", "local"]
    log("flickr1m end to end: warm-up (local) ...")
    timed(local_cmd, env, TIMEOUT_FLICKR)
    runs = alternate(flow_cmd, local_cmd, out, env, TIMEOUT_FLICKR, repeats, "flickr1m")

    import hashdist
    from hashdist.engine.plan import largest_possible_grade
    from hashdist.kernels.histogram import histogram_block

    ds = hashdist.open_dataset(data)
    relevance = ds.default_relevance
    grade = largest_possible_grade(ds, relevance)
    qc, dc = ds.codes("queries", 0, ds.n_queries), ds.codes("database", 0, ds.n_database)
    qr, dr = ds.labels("queries", 0, ds.n_queries), ds.labels("database", 0, ds.n_database)
    threads = os.cpu_count() or 1
    bounds = np.linspace(0, ds.n_queries, threads + 1).astype(int)
    parts = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    histogram_block(qc[:64], dc[:8192], ds.nbits, relevance, qr[:64], dr[:8192], max_grade=grade)  # compile/load
    log(f"flickr1m bare kernel: {ds.n_queries} x {ds.n_database}, {relevance}, {threads} threads ...")

    def run():
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda p: histogram_block(qc[p], dc, ds.nbits, relevance, qr[p], dr, max_grade=grade),
                          parts))

    NOISE.wait_quiet("histogram_block")
    kernel_s = helpers.best_of(run, repeats=2)
    return {**runs, "kernel_s": kernel_s, "kernel_threads": threads, "relevance": relevance,
            "max_grade": grade, "pairs": ds.n_queries * ds.n_database,
            "flow_over_kernel": runs["flow_median_s"] / kernel_s,
            "local_over_kernel": runs["local_median_s"] / kernel_s,
            # the wall a run could reach on these cores if every part of it kept them all busy
            "flow_cpu_floor_over_kernel": runs["flow_cpu_median_s"] / threads / kernel_s,
            "local_cpu_floor_over_kernel": runs["local_cpu_median_s"] / threads / kernel_s}


def _met(ok) -> str:
    return "-" if ok is None else ("yes" if ok else "no")


def markdown(r: dict) -> str:
    lines = [f"# hashdist fixed costs (#13), {r['date']}{' (--quick)' if r['quick'] else ''}", "",
             f"machine: {_bench_run().machine_line(r['machine'])}", "", f"code: {source_line(r['source'])}", "",
             "| what | measured | target | met |", "| --- | --- | --- | --- |"]
    o = r["overhead"]
    lines.append(f"| demo, new process, warm caches: flow (default) - local engine, median of "
                 f"{len(o['flow_s'])} | {o['flow_median_s']:.2f} - {o['local_median_s']:.2f} = "
                 f"{o['difference_s']:.2f} s | <= 2 s | {_met(o['difference_s'] <= 2)} |")
    for name, target in (("demo", 5), ("flickr1m", 8)):
        c = r["compile"].get(name)
        if c:
            lines.append(f"| {name}: first-run compile, `--engine local --no-cache`, cold - warm caches, median of "
                         f"{len(c['cold_s'])} | {c['cold_median_s']:.2f} - {c['warm_median_s']:.2f} = "
                         f"{c['difference_s']:.2f} s | <= {target} s | {_met(c['difference_s'] <= target)} |")
    as_avx2 = r.get("kernel_vs_faiss_as_avx2")
    rows = [("", k) for k in r["kernel_vs_faiss"]]
    if as_avx2:
        rows += [(f"as AVX2 (numba target {as_avx2['numba_target']}), ", k) for k in as_avx2["rows"]]
    for how, k in rows:
        if "error" in k:
            lines.append(f"| kernel vs faiss {how.rstrip(', ')} | {k['error']} | <= 1.0 | - |")
            continue
        lines.append(f"| 1 thread, {how}{k['n_queries']:,} x {k['n_database']:,}, B={k['nbits']}, {k['relevance']}: "
                     f"hashdist / faiss ({k.get('faiss_level') or 'faiss level not recorded'}) time | "
                     f"{k['hashdist_pairs_per_s']:.3g} vs {k['faiss_pairs_per_s']:.3g} "
                     f"pairs/s: {k['ratio']:.2f} | <= 1.0 | {_met(k['ratio'] <= 1.0)} |")
    e = r.get("flickr1m")
    if e:
        ratio = e["flow_over_kernel"]
        lines.append(f"| flickr1m, new process, `--no-cache`, warm numba cache: flow wall / bare kernel "
                     f"({e['kernel_threads']} threads), median of {len(e['flow_s'])} | {e['flow_median_s']:.2f} / "
                     f"{e['kernel_s']:.2f} s = {ratio:.2f} | <= 2 | {_met(ratio <= 2)} |")
        lines.append(f"| flickr1m, same, `--engine local` wall / bare kernel | {e['local_median_s']:.2f} / "
                     f"{e['kernel_s']:.2f} s = {e['local_over_kernel']:.2f} | - | - |")
        for name in ("flow", "local"):
            lines.append(f"| flickr1m, {name}: CPU seconds (user + system, with the processes it waited for) / "
                         f"{e['kernel_threads']} cores, the least wall they allow, / bare kernel | "
                         f"{e[f'{name}_cpu_median_s']:.2f} / {e['kernel_threads']} / {e['kernel_s']:.2f} s = "
                         f"{e[f'{name}_cpu_floor_over_kernel']:.2f} | - | - |")
    fmt = ", ".join(f"{k} {v:.2f}" for k, v in (o["last_flow_timing"] or {}).items())
    lines += ["", f"Last demo flow run, report.json `timing` (s): {fmt}.",
              f"Demo CPU seconds (user + system, medians): flow {o['flow_cpu_median_s']:.2f}, local "
              f"{o['local_cpu_median_s']:.2f}."]
    if e and e["last_flow_timing"]:
        fmt = ", ".join(f"{k} {v:.2f}" for k, v in e["last_flow_timing"].items())
        lines.append(f"Last flickr1m flow run, report.json `timing` (s): {fmt}.")
    if r.get("noise"):
        lines += ["", "CPU used by other processes while each part ran (from /proc/stat, less this run's own): "
                  + "; ".join(f"{name} {n['other_cpu_s']:.1f} s in {n['wall_s'] - n['waited_s']:.0f} s "
                              f"({100 * n['other_share']:.0f}% of the machine)" for name, n in r["noise"].items())
                  + "."]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="skip Flickr-1M; 256 x 65,536 codes for kernel vs faiss")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--wait-quiet", type=float, default=30, metavar="S",
                    help="before each timing, wait up to S seconds for other processes to leave the CPUs (default 30)")
    ap.add_argument("--avx2-target", default="znver3", metavar="CPU",
                    help="on a CPU with AVX-512, also time kernel vs faiss as an AVX2 machine runs them: numba "
                         "compiling for CPU (LLVM's name; default znver3, AMD Zen 3) in a child process, faiss at its "
                         "AVX2 level; 'none' skips it")
    ap.add_argument("--kernel-vs-faiss-child", nargs=2, type=int, metavar=("NQ", "NDB"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.kernel_vs_faiss_child:  # kernel_vs_faiss_as_avx2's child: the rows as one line of JSON
        print(json.dumps(kernel_vs_faiss(*a.kernel_vs_faiss_child, _bench_run(), faiss_level="AVX2")))
        return
    results = {"date": dt.date.today().isoformat(), "quick": a.quick, "source": source()}
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hashdist-fixed-costs-") as tmp:
        work = Path(tmp)
        warm_env = cache_env(work / "hashdist-cache", work / "numba-cache")
        # this process loads kernels too (kernel vs faiss, Flickr-1M bare kernel): the same warm caches;
        # numba reads NUMBA_CACHE_DIR when it is first imported, which is below
        os.environ.update({k: warm_env[k] for k in ("HASHDIST_CACHE", "NUMBA_CACHE_DIR", "PREFECT_LOGGING_LEVEL")})
        helpers = _bench_run()
        results["machine"] = helpers.machine()  # imports numba
        log(f"machine: {helpers.machine_line(results['machine'])}")
        log(f"code: {source_line(results['source'])}")
        demo = work / "demo.zarr"
        NOISE.wait_s = a.wait_quiet
        noise = NOISE
        synth("demo", demo, TIMEOUT_DEMO)
        results["overhead"] = noise.measure("overhead", fixed_overhead, work, demo, warm_env)
        log("compile: demo ...")
        results["compile"] = {"demo": noise.measure("compile demo", compile_cost, work, demo, "demo", TIMEOUT_DEMO)}
        n_q, n_db = (256, 1 << 16) if a.quick else (1024, 1 << 18)
        results["kernel_vs_faiss"] = noise.measure("kernel vs faiss", kernel_vs_faiss, n_q, n_db, helpers)
        if "avx512f" in results["machine"]["simd"] and a.avx2_target != "none":
            log(f"kernel vs faiss as AVX2 (numba target {a.avx2_target}, faiss level AVX2), child process ...")
            results["kernel_vs_faiss_as_avx2"] = noise.measure("kernel vs faiss as AVX2", kernel_vs_faiss_as_avx2,
                                                               n_q, n_db, a.avx2_target)
        if not a.quick:
            flickr = work / "flickr1m.zarr"
            synth("flickr1m", flickr, TIMEOUT_FLICKR)
            log("compile: flickr1m ...")
            results["compile"]["flickr1m"] = noise.measure("compile flickr1m", compile_cost, work, flickr,
                                                           "flickr1m", TIMEOUT_FLICKR)
            results["flickr1m"] = noise.measure("flickr1m end to end", flickr_end_to_end, work, flickr, warm_env,
                                                helpers)
        results["noise"] = noise.sections
    results["bench_s"] = time.perf_counter() - t_start
    text = markdown(results)
    stem = _bench_run().write_results(a.out, f"{results['date']}-fixed-costs" + ("-quick" if a.quick else ""),
                                      results, text)
    log(f"wrote {stem}.json and .md in {results['bench_s']:.0f} s")
    print(text)


if __name__ == "__main__":
    main()
