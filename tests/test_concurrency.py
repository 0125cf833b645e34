"""Two `hashdist evaluate` processes at once: one shared block cache (the nightly deployment and a person's run)
and one history store both append to. Real processes, released together from a start line so they overlap;
every result is checked against a run without a cache.

Each process loads the CLI and warms up (evaluates the dataset once without a cache, so numba's kernels are
loaded), prints "ready", waits for a line on stdin and then runs ``hashdist evaluate ...``
(:func:`hashdist.cli.app.console`, what the console script runs): the test releases both at the same moment,
and they compute the same blocks in step.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hashdist.engine.cache import BlockCache
from tests.conftest import make_dataset

BIN = Path(sys.executable).parent
# small blocks (16 queries x 500 items: 24 of them) so both processes write many of the same cache keys
BLOCKS = ["--engine", "local", "--threads", "1", "--query-block-rows", "16", "--db-block-rows", "500", "--quiet",
          "--no-html"]
STARTER = ("import sys\n"
           "import hashdist.cli.app as app\n"
           "from hashdist.api import evaluate_local\n"
           "evaluate_local(sys.argv[2], cache=False, threads=1)\n"  # argv: evaluate DATASET ...
           "print('ready', flush=True)\n"
           "sys.stdin.readline()\n"
           "sys.exit(app.console())\n")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """3,000 items x 64 queries, 32-bit codes, 4 classes, in chunks of 500 items and 16 queries."""
    return make_dataset(tmp_path_factory.mktemp("concurrency"), nbits=32, n_db=3000, n_q=64)


@pytest.fixture(scope="module")
def reference(dataset, tmp_path_factory):
    """The metrics of a run without any cache (a separate process)."""
    out = tmp_path_factory.mktemp("reference") / "report"
    done = subprocess.run([str(BIN / "hashdist"), "evaluate", dataset, "--out", str(out), "--no-cache", *BLOCKS],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads((out / "report.json").read_text())["metrics"]


def release_together(procs) -> None:
    """Wait until every process has loaded what it needs (it prints "ready"), then let all of them go at once."""
    for p in procs:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()


def run_together(*argvs, timeout=120) -> list[subprocess.CompletedProcess]:
    """Run ``hashdist ARGV`` for each argv at the same moment (each process loads the CLI first, then all are
    released at once); their completed processes, in order."""
    procs = [subprocess.Popen([sys.executable, "-c", STARTER, *map(str, argv)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for argv in argvs]
    try:
        release_together(procs)
        results = []
        for p, argv in zip(procs, argvs, strict=True):
            out, err = p.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(argv, p.returncode, out, err))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)


def report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def cache_entries(cache: Path) -> list[Path]:
    return sorted(cache.rglob("*.npz"))


def assert_cache_sound(cache: Path) -> None:
    """Every entry verifies against its own key, and no temporary file is left."""
    store = BlockCache(cache)
    for path in cache_entries(cache):
        assert store.get(path.stem) is not None, f"{path}: an entry that does not verify"
    assert not [p for p in cache.rglob(".*") if p.is_file()], "temporary files left in the cache"


def test_two_runs_sharing_one_cache_write_the_same_keys_safely(dataset, reference, tmp_path):
    """Two runs on one empty cache, released together, compute and store the same blocks at the same moment
    (their reports say they both computed, and stored, a quarter of the blocks or more: typically 20 of 24).
    Both reports equal a run without cache, every entry verifies, no temporary file is left, and a third run
    takes every block from the cache with the same metrics. Up to 4 rounds, until one shows the two runs really
    wrote the same keys."""
    overlapped = False
    for round_ in range(4):
        cache = tmp_path / f"cache{round_}"
        outs = [tmp_path / f"r{round_}-{i}" for i in range(2)]
        runs = run_together(*(["evaluate", dataset, "--out", out, "--cache", cache, *BLOCKS] for out in outs))
        for run in runs:
            assert run.returncode == 0 and not run.stderr.strip(), run.stderr
        reports = [report(out) for out in outs]
        for r in reports:
            assert r["metrics"] == reference
        total = reports[0]["blocks"]["total"]
        assert len(cache_entries(cache)) == total
        assert_cache_sound(cache)
        # blocks computed by both runs: each stored them (same key, same moment)
        overlapped = sum(r["blocks"]["computed"] for r in reports) >= total + total // 4
        if overlapped:
            break
    assert overlapped, "the two runs never computed the same block at once (the machine too busy?)"
    again = subprocess.run([str(BIN / "hashdist"), "evaluate", dataset, "--out", str(tmp_path / "again"),
                            "--cache", str(cache), *BLOCKS], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert report(tmp_path / "again")["blocks"]["cached"] == total
    assert report(tmp_path / "again")["metrics"] == reference


def _damage(cache: Path) -> dict[str, Path]:
    """Damage five entries of the cache five ways; {how: path}."""
    entries = cache_entries(cache)
    assert len(entries) >= 6
    damaged = dict(zip(("truncated", "flipped", "empty", "garbage", "moved"), entries, strict=False))
    data = damaged["truncated"].read_bytes()
    damaged["truncated"].write_bytes(data[: len(data) // 2])
    data = bytearray(damaged["flipped"].read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, in the middle of the arrays
    damaged["flipped"].write_bytes(bytes(data))
    damaged["empty"].write_bytes(b"")
    damaged["garbage"].write_bytes(os.urandom(2000))
    # another block's complete, self-consistent entry (same shapes) under this key's name
    damaged["moved"].write_bytes(entries[-1].read_bytes())
    return damaged


def test_damaged_cache_entries_are_recomputed_never_trusted(dataset, reference, tmp_path):
    """Between two runs, five entries are damaged on disk: truncated, a bit flipped, emptied, overwritten with
    random bytes, and replaced by another block's valid entry. The next run recomputes exactly those five blocks
    (the others come from the cache), its metrics equal a run without cache, and it stores the five anew."""
    cache = tmp_path / "cache"
    first = subprocess.run([str(BIN / "hashdist"), "evaluate", dataset, "--out", str(tmp_path / "a"), "--cache",
                            str(cache), *BLOCKS], capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    total = report(tmp_path / "a")["blocks"]["total"]
    damaged = _damage(cache)
    store = BlockCache(cache)
    for how, path in damaged.items():
        assert store.get(path.stem) is None, f"the {how} entry would be trusted"
    second = subprocess.run([str(BIN / "hashdist"), "evaluate", dataset, "--out", str(tmp_path / "b"), "--cache",
                             str(cache), *BLOCKS], capture_output=True, text=True, timeout=120)
    assert second.returncode == 0 and not second.stderr.strip(), second.stderr
    blocks = report(tmp_path / "b")["blocks"]
    assert (blocks["computed"], blocks["cached"]) == (len(damaged), total - len(damaged))
    assert report(tmp_path / "b")["metrics"] == reference
    assert_cache_sound(cache)  # the damaged entries were replaced by good ones


def test_two_runs_append_to_one_history_at_once(dataset, reference, tmp_path):
    """Three times, two runs released together append to one history store (the first time both find no store
    and race to create it). All six runs are in `hashdist history H --json` and load_history, each whole (its
    arrays read back and match its report), with six distinct ids; no staging directory is left; each report
    equals a run without cache."""
    from hashdist.compare.history import load_history

    history, cache = tmp_path / "H", tmp_path / "cache"
    outs = []
    for round_ in range(3):
        pair = [tmp_path / f"r{round_}-{i}" for i in range(2)]
        runs = run_together(*(["evaluate", dataset, "--out", out, "--cache", cache, "--history", history, *BLOCKS]
                              for out in pair))
        for run in runs:
            assert run.returncode == 0, run.stderr
            assert "history:" in run.stdout
        outs += pair
    listed = subprocess.run([str(BIN / "hashdist"), "history", str(history), "--json", "--no-html"],
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    trend = json.loads(listed.stdout)
    assert len(trend["runs"]) == len(outs)
    assert len({row["run"] for row in trend["runs"]}) == len(outs)
    assert sorted(row["report"] for row in trend["runs"]) == sorted(str(out / "report.json") for out in outs)
    runs = load_history(history)
    assert len(runs) == len(outs)
    for entry in runs:
        r = report(Path(entry["report"]).parent)
        assert r["metrics"] == reference
        assert entry["metrics"]["map"] == reference["map"]
        per_query = r["queries"]
        assert len(entry["query"]) == len(entry["ap"]) == len(entry["relevant"]) == per_query["evaluated"]
        assert np.isclose(entry["ap"].mean(), reference["map"]["expected"])
    assert not list((history / "runs").glob(".*")), "a staging directory was left in the history"
    assert not list(tmp_path.glob(".H.tmp-*")), "a staging directory of the store was left"


APPENDER = ("import sys\n"
            "from hashdist.api import evaluate_local\n"
            "from hashdist.compare.history import record\n"
            "evaluation = evaluate_local(sys.argv[1], cache=False, threads=1)\n"
            "print('ready', flush=True)\n"
            "sys.stdin.readline()\n"
            "for _ in range(int(sys.argv[3])):\n"
            "    print(record(sys.argv[2], evaluation)['run'], flush=True)\n")


def test_many_appends_at_once_lose_nothing(dataset, reference, tmp_path):
    """Heavier contention on the store's lock than two evaluate runs give: three processes, released together,
    each record (append, then compare with the run before) five runs back to back into one new store. All 15
    runs are there, whole, each id the one its process was told, and no staging directory is left."""
    from hashdist.compare.history import load_history

    history, per_process = tmp_path / "H", 5
    procs = [subprocess.Popen([sys.executable, "-c", APPENDER, dataset, str(history), str(per_process)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    try:
        release_together(procs)
        ids = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            ids += out.split()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    assert len(ids) == len(set(ids)) == 3 * per_process
    runs = load_history(history)
    assert sorted(e["run"] for e in runs) == sorted(ids)
    for entry in runs:
        assert entry["metrics"]["map"] == reference["map"]
        assert np.isclose(entry["ap"].mean(), reference["map"]["expected"])
    assert not list((history / "runs").glob(".*")) and not list(tmp_path.glob(".H.tmp-*"))


def test_an_append_waits_for_the_writer_before_it(dataset, tmp_path):
    """While another process holds the store's lock an append waits (here up to 0.5 s, then one line saying
    another run has been appending); when the holder lets go within the wait, the append goes through."""
    import threading
    import time

    from hashdist.api import evaluate_local
    from hashdist.compare.history import append_run, load_history
    from hashdist.errors import InputError
    from tests.conftest import lock_held_elsewhere

    history = tmp_path / "H"
    evaluation = evaluate_local(dataset, cache=False, threads=1)
    append_run(history, evaluation)
    with lock_held_elsewhere(history):
        started = time.monotonic()
        with pytest.raises(InputError, match=r"another hashdist run has been appending to this history for 0.5 s"):
            append_run(history, evaluation, wait=0.5)
        assert 0.5 <= time.monotonic() - started < 5
    holder = lock_held_elsewhere(history)
    holder.__enter__()
    releaser = threading.Timer(1.0, holder.__exit__, (None, None, None))
    releaser.start()
    try:
        started = time.monotonic()
        append_run(history, evaluation, wait=30)
        assert time.monotonic() - started >= 0.9  # it waited for the holder
    finally:
        releaser.join(timeout=60)
    assert len(load_history(history)) == 2
