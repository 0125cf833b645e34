"""A disk that fills while `hashdist evaluate` writes its block cache, its report or its history store.

Each test mounts a small tmpfs (256 KiB, as root) and points one output at it; the others stay on the ordinary
disk. A full disk must give one line on stderr naming the output, exit status 2, nothing partial left behind (no
half-written report or temporary sibling, no temporary cache file, the history loadable with its earlier runs),
and the same command must succeed once space is back (a filler file deleted, or the filesystem remounted bigger).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hashdist.engine.cache import BlockCache
from tests.conftest import make_dataset

BIN = Path(sys.executable).parent
BLOCKS = ["--engine", "local", "--threads", "1", "--query-block-rows", "16", "--db-block-rows", "500", "--quiet"]
NO_SPACE = "No space left on device"


@pytest.fixture
def tiny(tmp_path):
    """A 256 KiB tmpfs mounted at tmp_path/tiny for the test, unmounted after it (skipped where mounting is refused:
    not root, or no permission to mount in this container)."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root and mount permission): "
                    f"{done.stderr.strip() or f'mount exited with status {done.returncode}'}")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=30)


def resize(mount_point: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mount_point)], check=True, timeout=30)


def fill(mount_point: Path, leave: int = 0) -> Path:
    """Fill the filesystem with a filler file, leaving about ``leave`` bytes free; the filler's path."""
    filler = mount_point / "filler"
    with open(filler, "ab", buffering=0) as f:
        try:
            while f.write(b"\0" * 4096):
                pass
        except OSError:  # full
            pass
    if leave:
        with open(filler, "r+b") as f:
            f.truncate(max(0, filler.stat().st_size - leave))
    return filler


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """3,000 items x 64 queries, 32-bit codes, in chunks of 500 items and 16 queries (24 blocks)."""
    return make_dataset(tmp_path_factory.mktemp("fulldisk"), nbits=32, n_db=3000, n_q=64)


@pytest.fixture(scope="module")
def reference(dataset, tmp_path_factory):
    """The metrics of a run without a cache, on the ordinary disk."""
    out = tmp_path_factory.mktemp("reference") / "report"
    done = evaluate(dataset, out, "--no-cache")
    assert done.returncode == 0, done.stderr
    return json.loads((out / "report.json").read_text())["metrics"]


def evaluate(dataset, out, *options) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "hashdist"), "evaluate", dataset, "--out", str(out), *BLOCKS,
                           *map(str, options)], capture_output=True, text=True, timeout=120)


def one_line(done: subprocess.CompletedProcess, *needles) -> str:
    """The run failed with exit status 2 and one line on stderr (no traceback) holding every needle."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def leftovers(directory: Path, name: str) -> list[Path]:
    """Temporary siblings of output ``name`` in ``directory`` (staged or old versions)."""
    return sorted(directory.glob(f".{name}.tmp-*")) + sorted(directory.glob(f".{name}.old-*"))


def report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def test_full_disk_while_writing_the_cache(dataset, reference, tiny, tmp_path):
    """The cache on a filesystem with room for a few of its 24 entries: one line naming the cache, status 2, no
    report (nor its temporary sibling or lock) on the ordinary disk, no temporary file in the cache, every entry
    left there complete and verified. With the filler deleted and the filesystem remounted bigger the same command
    succeeds, reuses the entries that were stored, and its metrics equal a run without cache."""
    cache, out = tiny / "cache", tmp_path / "report"
    filler = fill(tiny, leave=24 * 1024)
    failed = evaluate(dataset, out, "--cache", cache)
    line = one_line(failed, f"cache {cache}", NO_SPACE)
    assert line.startswith("hashdist evaluate: error: "), line
    assert not out.exists() and not leftovers(tmp_path, "report") and not (tmp_path / ".report.lock").exists()
    assert not [p for p in cache.rglob(".*") if p.is_file()], "a temporary cache file was left"
    kept = sorted(cache.rglob("*.npz"))
    assert kept, "no entry fitted: the test does not show that earlier entries survive"
    for path in kept:
        assert BlockCache(cache).get(path.stem) is not None, f"{path}: a half-written entry"
    filler.unlink()
    resize(tiny, "2m")  # the whole cache (24 entries in their directories) needs more than 256 KiB
    again = evaluate(dataset, out, "--cache", cache)
    assert again.returncode == 0, again.stderr
    assert report(out)["blocks"]["cached"] == len(kept)
    assert report(out)["metrics"] == reference


def test_full_disk_while_writing_the_report(dataset, reference, tiny, tmp_path):
    """--out on the full filesystem. A new report that does not fit: one line naming it, status 2, and nothing on
    that filesystem afterwards (no directory, temporary sibling or lock). Remounted bigger, the run writes it; then
    with the disk filled again a rerun fails the same way and leaves the previous report exactly as it was; with
    the filler deleted the rerun replaces it. Every report written equals a run without cache."""
    out, cache = tiny / "report", tmp_path / "cache"
    one_line(evaluate(dataset, out, "--cache", cache), str(out), NO_SPACE)
    assert sorted(tiny.iterdir()) == [], "something was left on the full filesystem"

    resize(tiny, "4m")
    done = evaluate(dataset, out, "--cache", cache)
    assert done.returncode == 0, done.stderr
    assert report(out)["metrics"] == reference
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    filler = fill(tiny)
    one_line(evaluate(dataset, out, "--cache", cache), str(out), NO_SPACE)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert not leftovers(tiny, "report")

    filler.unlink()
    done = evaluate(dataset, out, "--cache", cache)
    assert done.returncode == 0, done.stderr
    assert report(out)["metrics"] == reference
    assert report(out)["provenance"]["created"] >= json.loads(before[Path("report.json")])["provenance"]["created"]
    assert not leftovers(tiny, "report")


def test_full_disk_while_appending_to_the_history(dataset, reference, tiny, tmp_path):
    """--history on the small filesystem: the first run is recorded; with the disk full the second fails with one
    line naming the store, status 2, no staging directory left, and the store still loads with its first run
    intact. With the filler deleted the same command records the run (two runs, the second compared with the
    first)."""
    from hashdist.compare.history import load_history

    history, out, cache = tiny / "H", tmp_path / "report", tmp_path / "cache"
    done = evaluate(dataset, out, "--cache", cache, "--history", history)
    assert done.returncode == 0, done.stderr
    first = load_history(history)
    assert len(first) == 1

    filler = fill(tiny)
    one_line(evaluate(dataset, out, "--cache", cache, "--history", history), str(history), NO_SPACE, "not recorded")
    assert not list((history / "runs").glob(".*")) and not leftovers(tiny, "H")
    runs = load_history(history)
    assert [e["run"] for e in runs] == [e["run"] for e in first]
    assert (runs[0]["ap"] == first[0]["ap"]).all() and (runs[0]["query"] == first[0]["query"]).all()

    filler.unlink()
    done = evaluate(dataset, out, "--cache", cache, "--history", history)
    assert done.returncode == 0, done.stderr
    assert "history:" in done.stdout and "no significant change" in done.stdout
    runs = load_history(history)
    assert len(runs) == 2 and runs[0]["run"] == first[0]["run"]
    assert runs[1]["metrics"]["map"] == reference["map"]


def test_full_disk_while_creating_the_history(dataset, tiny, tmp_path):
    """A new history store on a full filesystem: one line naming it, status 2, and no store, staging directory or
    lock file left; once there is room the same command creates it with the run."""
    from hashdist.compare.history import load_history

    history, out, cache = tiny / "H", tmp_path / "report", tmp_path / "cache"
    filler = fill(tiny)
    one_line(evaluate(dataset, out, "--cache", cache, "--history", history), str(history), NO_SPACE)
    assert sorted(p.name for p in tiny.iterdir()) == ["filler"]
    filler.unlink()
    done = evaluate(dataset, out, "--cache", cache, "--history", history)
    assert done.returncode == 0, done.stderr
    assert len(load_history(history)) == 1


def test_flow_engine_full_disk_gives_one_line(dataset, reference, tiny, tmp_path):
    """With the default engine the cache is written by a Dask worker inside a Prefect task, and the history by
    the flow: a full disk there still ends in one line naming the cache (the task is not retried, Prefect's own
    log lines about it are not shown) or the store, status 2, no temporary file left; with room again the run
    succeeds with the same metrics."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "HASHDIST_CLUSTER_KWARGS")}
    flow = [str(BIN / "hashdist"), "evaluate", dataset, "--workers", "1", "--threads", "1", "--query-block-rows",
            "16", "--db-block-rows", "500", "--quiet", "--no-html"]
    cache, out, history = tiny / "cache", tmp_path / "report", tiny / "H"

    def run(*options):
        return subprocess.run([*flow, *map(str, options)], capture_output=True, text=True, timeout=180, env=env)

    filler = fill(tiny, leave=24 * 1024)
    one_line(run("--out", out, "--cache", cache), f"cache {cache}", NO_SPACE)
    assert not [p for p in cache.rglob(".*") if p.is_file()] and not out.exists()
    filler.unlink()
    resize(tiny, "2m")
    done = run("--out", out, "--cache", cache, "--history", history)
    assert done.returncode == 0, done.stderr
    assert report(out)["metrics"] == reference
    filler = fill(tiny)
    one_line(run("--out", out, "--cache", cache, "--history", history), str(history), NO_SPACE)
    assert not list((history / "runs").glob(".*")) and not leftovers(tiny, "H")
    from hashdist.compare.history import load_history

    assert len(load_history(history)) == 1


def test_read_only_filesystem_is_refused_at_once(dataset, tiny, tmp_path):
    """The cache, the report or the history on a read-only filesystem: one line naming it, status 2, at once (an
    append does not wait for a lock it can never take, as if another run held it)."""
    import time

    history, cache = tiny / "H", tmp_path / "cache"
    done = evaluate(dataset, tmp_path / "report", "--cache", cache, "--history", history)
    assert done.returncode == 0, done.stderr
    subprocess.run(["mount", "-o", "remount,ro", str(tiny)], check=True, timeout=30)
    read_only = "Read-only file system"
    one_line(evaluate(dataset, tmp_path / "r1", "--cache", tiny / "cache"), f"cache {tiny / 'cache'}", read_only)
    one_line(evaluate(dataset, tiny / "report", "--cache", cache), str(tiny / "report"), read_only)
    started = time.monotonic()
    one_line(evaluate(dataset, tmp_path / "r2", "--cache", cache, "--history", history), str(history), read_only)
    assert time.monotonic() - started < 30  # not the 60 s an append waits for another writer
    assert not (tmp_path / "r1").exists()


def test_full_disk_while_setting_aside_codes_for_counting(dataset, reference, tiny, tmp_path):
    """The code-counting passes' spill directory (hashdist.engine.spill) under TMPDIR on a full filesystem: one
    line naming it and what to do, status 2, no report, nothing left in TMPDIR; with room, the same command
    succeeds, with the metrics of a run that reads the codes in every pass, and again leaves TMPDIR empty."""
    out, env = tmp_path / "report", {**os.environ, "TMPDIR": str(tiny)}
    filler = fill(tiny, leave=4 * 1024)
    command = [str(BIN / "hashdist"), "evaluate", dataset, "--out", str(out), *BLOCKS, "--no-cache", "--code-parts",
               "12"]  # 3 passes of 4 parts: the first sets aside the rows of the other two
    failed = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    one_line(failed, str(tiny), NO_SPACE, "TMPDIR")
    assert not out.exists() and not leftovers(tmp_path, "report")
    assert [p.name for p in tiny.iterdir()] == ["filler"]
    filler.unlink()
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert report(out)["metrics"] == reference
    assert list(tiny.iterdir()) == []
