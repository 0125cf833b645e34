"""Evaluation works when the compile caches cannot be written, as on a read-only install.

Numba's cache directory (NUMBA_CACHE_DIR, the only one numba may use here) and the directory the
histogram kernels are generated in ($HASHDIST_CACHE/kernels) are made read-only; each run is a
subprocess with empty in-memory state and must give the report of a run with writable caches.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

# root writes through permission bits; setpriv runs the evaluation without the capabilities that allow it
_CAPS = "-dac_override,-dac_read_search"
AS_OWNER = ["setpriv", f"--inh-caps={_CAPS}", f"--bounding-set={_CAPS}"] if os.geteuid() == 0 else []

pytestmark = pytest.mark.skipif(bool(AS_OWNER) and not shutil.which("setpriv"), reason="root without setpriv")


def _evaluate(dataset, out, numba_dir, hashdist_dir) -> str:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(numba_dir), "HASHDIST_CACHE": str(hashdist_dir),
           "NUMBA_CACHE_LOCATOR_CLASSES": "UserProvidedCacheLocator"}
    subprocess.run([*AS_OWNER, sys.executable, "-m", "hashdist.cli", "evaluate", dataset, "--out", str(out),
                    "--engine", "local", "--no-cache", "--no-html", "--quiet"], env=env, check=True,
                   capture_output=True)
    report = json.loads((out / "report.json").read_text())
    return json.dumps({key: report[key] for key in ("metrics", "queries", "code_usage")}, sort_keys=True)


def _files(directory) -> list[str]:
    return sorted(os.path.relpath(os.path.join(root, name), directory)
                  for root, dirs, files in os.walk(directory) for name in dirs + files)


def _set_read_only(directory, read_only: bool) -> None:
    for root, _, files in os.walk(directory):
        for name in files:
            os.chmod(os.path.join(root, name), 0o444 if read_only else 0o644)
        os.chmod(root, 0o555 if read_only else 0o755)


def test_read_only_caches(multilabel_dataset, tmp_path):
    expected = _evaluate(multilabel_dataset, tmp_path / "r0", tmp_path / "numba", tmp_path / "hd")
    assert list((tmp_path / "hd" / "kernels").glob("hashdist_kernel_*.py"))
    empty_numba, empty_hd = tmp_path / "numba_ro", tmp_path / "hd_ro"
    (empty_hd / "kernels").mkdir(parents=True)
    empty_numba.mkdir()
    read_only = [empty_numba, empty_hd, tmp_path / "hd"]
    for directory in read_only:
        _set_read_only(directory, True)
    try:
        before = [_files(d) for d in read_only]
        # nothing writable: every function is compiled in memory
        assert _evaluate(multilabel_dataset, tmp_path / "r1", empty_numba, empty_hd) == expected
        # the generated kernels only readable, numba's cache writable: kernels load from their files and are cached
        assert _evaluate(multilabel_dataset, tmp_path / "r2", tmp_path / "numba2", tmp_path / "hd") == expected
        assert [_files(d) for d in read_only] == before
        assert any("hashdist_kernel_" in name for name in _files(tmp_path / "numba2"))
    finally:
        for directory in read_only:
            _set_read_only(directory, False)


_PROBE = """
import json, sys, time
from numba.core import event
from hashdist.engine import precompile

compiled = []


class Compiled(event.Listener):
    def on_start(self, ev):
        compiled.append(ev.data["dispatcher"].py_func.__name__)

    def on_end(self, ev):
        pass


event.register("numba:compile", Compiled())
early = None
if sys.argv[1].startswith("early"):  # as the command line's launcher, before the run knows what it needs
    precompile.start_early()
    early = precompile._process
    if sys.argv[1] == "early-exited":
        early.wait(60)
precompile.start()
process = precompile._process
if process is not None and sys.argv[1] != "exit":
    precompile.join()
if sys.argv[1] != "exit":
    precompile.compile_measures(lambda key: True)  # as the run then computes every measure
print(json.dumps({"started": process is not None, "pid": None if process is None else process.pid,
                  "running": process is not None and process.poll() is None, "compiled": compiled,
                  "same": early is not None and early is process,
                  "early_status": None if early is None else early.poll(),
                  "looks_cached": precompile.looks_cached()}), flush=True)
"""

# what the second process compiles, and what join() compiles here; started early, the NDCG functions move over
SECOND_SHARE = ("_ap_at_radius", "_ap_at_k", "_max_count_by_scan")
FIRST_SHARE = ("_hits_at_k", "_dcg", "_ideal_dcg", "_fill_discounts")
NDCG = ("_dcg", "_ideal_dcg", "_fill_discounts")


def _probe(numba_dir, mode: str, as_owner=(), hashdist_dir=None) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(numba_dir), "NUMBA_CACHE_LOCATOR_CLASSES": "UserProvidedCacheLocator",
           "HASHDIST_CACHE": str(hashdist_dir or numba_dir.parent / "hashdist")}
    run = subprocess.run([*as_owner, sys.executable, "-c", _PROBE, mode], env=env, check=True, capture_output=True,
                         text=True, timeout=300)
    return json.loads(run.stdout)


def _cached(numba_dir, function: str) -> bool:
    return any(f"{function}-" in name and name.endswith(".nbi") for name in _files(numba_dir))


def test_a_cold_cache_compiles_each_metric_function_once_on_two_processes(tmp_path):
    numba_dir = tmp_path / "numba"
    first = _probe(numba_dir, "join")
    assert first["started"] and not first["running"]  # join() waited for the second process
    for function in SECOND_SHARE + FIRST_SHARE:
        assert _cached(numba_dir, function), function
    assert set(FIRST_SHARE) <= set(first["compiled"])
    assert not set(SECOND_SHARE) & set(first["compiled"])  # loaded from the cache, not compiled again here
    assert first["looks_cached"]  # the stamp names the index files, all there
    warm = _probe(numba_dir, "join")
    assert not warm["started"] and warm["compiled"] == []  # warm: nothing to compile, no process


@pytest.mark.parametrize("mode", ["early", "early-exited"])
def test_a_process_started_early_is_the_second_process_or_exits_when_nothing_is_left_to_compile(tmp_path, mode):
    """The launcher's early process: with a cold cache, the run's second process (each function compiled once);
    with a warm one, it exits at once with NOTHING_TO_COMPILE and the run has no second process."""
    from hashdist.engine.precompile import NOTHING_TO_COMPILE

    numba_dir = tmp_path / "numba"
    cold = _probe(numba_dir, mode)
    assert cold["started"] and cold["same"] and not cold["running"] and cold["early_status"] == 0
    for function in SECOND_SHARE + FIRST_SHARE:
        assert _cached(numba_dir, function), function
    assert set(FIRST_SHARE) - set(NDCG) <= set(cold["compiled"])
    assert not (set(SECOND_SHARE) | set(NDCG)) & set(cold["compiled"])  # the early process's larger share
    assert cold["looks_cached"]
    warm = _probe(numba_dir, mode)
    assert warm["early_status"] in ((None, NOTHING_TO_COMPILE) if mode == "early" else (NOTHING_TO_COMPILE,))
    assert warm["compiled"] == []
    if mode == "early-exited":  # it had exited before the run started: taken as no second process
        assert not warm["started"]


def _stamp(hashdist_dir):
    (stamp,) = (hashdist_dir / "kernels").glob("metrics-cached-*.json")
    return stamp


def test_the_stamp_shows_the_cache_warm_only_while_every_index_file_is_there(tmp_path, monkeypatch):
    """The launcher's hint: true once a run has cached the metric functions, false once numba's cache is
    emptied (the next run then compiles on two processes again), and false for a stamp that is not a regular
    file of JSON (a link to a good stamp, a FIFO, garbage), which the next warm run replaces."""
    from hashdist.engine import precompile

    numba_dir, hashdist_dir = tmp_path / "numba", tmp_path / "hashdist"
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(numba_dir))
    monkeypatch.setenv("HASHDIST_CACHE", str(hashdist_dir))
    assert not precompile.looks_cached()
    _probe(numba_dir, "exit")
    assert not list(hashdist_dir.glob("kernels/metrics-cached-*"))  # killed before its share was cached: no stamp
    _probe(numba_dir, "join")
    assert precompile.looks_cached()
    stamp = _stamp(hashdist_dir)
    indexes = json.loads(stamp.read_text())["index_files"]
    assert len(indexes) == 4 and all(os.path.exists(index) for index in indexes)
    good, moved = stamp.read_bytes(), tmp_path / "elsewhere.json"
    for plant in ("link", "fifo", "garbage"):
        stamp.unlink()
        if plant == "link":
            moved.write_bytes(good)
            stamp.symlink_to(moved)
        elif plant == "fifo":
            os.mkfifo(stamp)
        else:
            stamp.write_bytes(b"\x00not json")
        assert not precompile.looks_cached(), plant
        assert not _probe(numba_dir, "exit")["started"]  # warm: no process, and the stamp written anew
        assert stamp.is_file() and not stamp.is_symlink() and precompile.looks_cached(), plant
    assert moved.read_bytes() == good  # the link was replaced, its target left alone
    shutil.rmtree(numba_dir)
    assert not precompile.looks_cached()
    cold = _probe(numba_dir, "early")
    assert cold["started"] and cold["early_status"] == 0 and precompile.looks_cached()


def test_the_compiling_process_ends_with_the_run(tmp_path):
    import psutil

    started = _probe(tmp_path / "numba", "exit")  # the run exits at once: its compiling process is killed
    assert started["started"]
    assert not psutil.pid_exists(started["pid"]) or psutil.Process(started["pid"]).status() == psutil.STATUS_ZOMBIE


def test_no_compiling_process_without_a_writable_cache(tmp_path):
    read_only = tmp_path / "numba_ro"
    read_only.mkdir()
    _set_read_only(read_only, True)
    try:
        assert not _probe(read_only, "join", AS_OWNER)["started"]
        assert _files(read_only) == []
    finally:
        _set_read_only(read_only, False)
