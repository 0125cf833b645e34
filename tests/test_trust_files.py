"""Shared machines and hostile files (issue 50, points 1, 2, 9 and 10; issue 51, point 4): lock files that are
links, FIFOs or directories; --overwrite that would delete an input or something hashdist did not write; method
names with a trailing newline; a staged directory left by SIGTERM. Real files, links, FIFOs and processes."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hashdist.cli import main
from tests.conftest import BIN, assert_refused, ingest_argv

LOCAL = ["--engine", "local", "--no-cache", "--quiet"]
SMALL = ["--n-database", "300", "--n-queries", "30", "--nbits", "16", "--labels", "class"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """a.zarr of the issue: 300 items, 30 queries, 16 bits, class labels."""
    out = tmp_path_factory.mktemp("trust") / "a.zarr"
    assert main(["synth", *SMALL, "--out", str(out)]) == 0
    return out


def snapshot(directory: Path) -> dict:
    """Every path under ``directory`` (links not followed) with its bytes for a regular file."""
    return {str(p.relative_to(directory)): (p.read_bytes() if p.is_file() and not p.is_symlink() else p.is_symlink())
            for p in sorted(directory.rglob("*"))}


def hidden(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


# -- Locks ---------------------------------------------------------------------


def plant(lock: Path, kind: str, victim: Path) -> None:
    if kind == "symlink":
        lock.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.mkdir()


def writers(dataset, out: Path) -> dict[str, list]:
    return {"evaluate": ["evaluate", dataset, "--out", out, *LOCAL],
            "synth": ["synth", *SMALL, "--out", out],
            "compare": ["compare", "--method", f"a={dataset}", "--method", f"b={dataset}", "--out", out,
                        "--engine", "local", "--no-cache", "--permutations", "10"]}


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
@pytest.mark.parametrize("command", ["evaluate", "synth", "compare"])
def test_a_lock_path_that_is_not_a_regular_file_is_refused_and_never_followed(tmp_path, capsys, dataset, kind,
                                                                              command):
    """A link planted at the output's lock path (to a file with data), a FIFO or a directory: one line, exit 2,
    no output; the link's target keeps its bytes (the old lock truncated it to 0 bytes, and exited 0)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("data\n")
    out = tmp_path / "out"
    lock = tmp_path / ".out.lock"
    plant(lock, kind, victim)
    needle = f"{lock}: hashdist's lock file is a"
    if kind == "fifo":  # in a process of its own, bounded: the old open(lock, "w") waited for a FIFO's reader forever
        done = subprocess.run([str(BIN / "hashdist"), *map(str, writers(dataset, out)[command])], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and needle in done.stderr, done.stderr
    else:
        assert_refused(capsys, writers(dataset, out)[command], needle, out)
    assert victim.read_text() == "data\n"
    assert os.path.lexists(lock) and not out.exists()


def test_the_history_store_lock_is_not_followed(tmp_path, capsys, dataset):
    victim = tmp_path / "victim.txt"
    victim.write_text("data\n")
    (tmp_path / ".hist.lock").symlink_to(victim)
    out = tmp_path / "report"
    assert_refused(capsys, ["evaluate", dataset, "--out", out, *LOCAL, "--history", tmp_path / "hist"],
                   "lock file is a symbolic link", out)
    assert victim.read_text() == "data\n" and not (tmp_path / "hist").exists()


def test_no_lock_file_is_left_beside_any_output(tmp_path, dataset):
    """Issue 51.4: after synth, ingest, evaluate (with --history), compare, split and history, the directory holds
    the outputs and no hidden file (the old locks stayed as .NAME.lock beside each output)."""
    work = tmp_path / "work"
    work.mkdir()
    assert main(["synth", *SMALL, "--out", str(work / "d.zarr")]) == 0
    assert main(["synth", "--pooled", *SMALL, "--out", str(work / "pool")]) == 0
    assert main(["evaluate", str(work / "d.zarr"), "--out", str(work / "r"), *LOCAL,
                 "--history", str(work / "hist")]) == 0
    assert main(["compare", "--method", f"a={dataset}", "--method", f"b={work / 'd.zarr'}", "--out",
                 str(work / "cmp"), "--engine", "local", "--no-cache", "--permutations", "10"]) == 0
    assert main(["split", "--n-items", "400", "--runs", "2", "--test-queries", "20", "--test-database", "40",
                 "--validation-queries", "10", "--validation-database", "20", "--out", str(work / "s.zarr")]) == 0
    assert main(["history", str(work / "hist"), "--out", str(work / "h.html")]) == 0
    assert sorted(p.name for p in work.iterdir()) == ["cmp", "d.zarr", "h.html", "hist", "pool", "r", "s.zarr"]
    assert not [p for p in work.rglob(".*lock*")]


LOCKER = """
import os, sys, time
from hashdist.data.atomic import exclusive
target, log, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
for _ in range(rounds):
    with exclusive(target, wait=60):
        with open(log, "a") as f:
            f.write(f"in {os.getpid()}\\n")
        time.sleep(0.002)
        with open(log, "a") as f:
            f.write(f"out {os.getpid()}\\n")
"""


def test_locks_removed_by_their_holder_still_exclude(tmp_path):
    """Three processes take and release one output's lock 40 times each, as fast as they can, the file removed by
    each holder as it releases: the log of who holds it never shows two holders at once."""
    target, log = tmp_path / "out", tmp_path / "log"
    procs = [subprocess.Popen([sys.executable, "-c", LOCKER, str(target), str(log), "40"]) for _ in range(3)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    lines = log.read_text().split("\n")[:-1]
    assert len(lines) == 3 * 40 * 2
    for enter, leave in zip(lines[::2], lines[1::2], strict=True):
        assert enter.startswith("in ") and leave == "out " + enter[3:]
    assert hidden(tmp_path) == []


# -- Overwriting ---------------------------------------------------------------


def test_a_file_url_input_is_resolved_before_the_output_check(tmp_path, capsys):
    """evaluate and compare with a file:// dataset URL and --out the directory holding it, with --overwrite: refused
    (the old check skipped URLs and the run deleted d.zarr and its neighbours)."""
    holder = tmp_path / "holder"
    dataset = holder / "d.zarr"
    assert main(["synth", *SMALL, "--out", str(dataset)]) == 0
    (holder / "neighbour.txt").write_text("keep")
    before = snapshot(holder)
    url = f"file://{dataset}"
    assert_refused(capsys, ["evaluate", url, "--out", holder, "--overwrite", *LOCAL], f"holds the input {url}")
    assert_refused(capsys, ["compare", "--method", f"a={url}", "--method", f"b={dataset}", "--out", holder,
                            "--overwrite", "--engine", "local", "--no-cache"], f"holds the input {url}")
    linked = tmp_path / "link"
    linked.symlink_to(holder)
    assert_refused(capsys, ["evaluate", linked / "d.zarr", "--out", holder, "--overwrite", *LOCAL], "holds the input")
    assert snapshot(holder) == before


@pytest.mark.parametrize("command", ["synth", "synth-pooled", "ingest", "evaluate", "compare", "split"])
@pytest.mark.parametrize("what", ["directory", "file"])
def test_overwrite_replaces_only_what_hashdist_wrote(tmp_path, capsys, dataset, files, command, what):
    """A plain directory (with a file) or a plain file at --out, with --overwrite: refused in one line, left as it
    was (the old synth and ingest deleted both; evaluate and compare replaced a directory)."""
    out = tmp_path / "mine"
    if what == "directory":
        out.mkdir()
        (out / "precious.txt").write_text("keep me")
    else:
        out.write_text("keep me")
    before = snapshot(tmp_path)
    argv = {"synth": ["synth", *SMALL, "--out", out],
            "synth-pooled": ["synth", "--pooled", *SMALL, "--out", out],
            "ingest": ingest_argv(files, out),
            "split": ["split", "--n-items", "20000", "--runs", "1", "--out", out],
            **writers(dataset, out)}[command]
    assert_refused(capsys, [*argv, "--overwrite"], "refusing to replace it (hashdist replaces only what it wrote)")
    assert snapshot(tmp_path) == before


def test_own_outputs_are_still_replaced(tmp_path, capsys, dataset):
    """A dataset and a pooled directory hashdist wrote, with --overwrite; a report and a comparison by a rerun."""
    for argv in (["synth", *SMALL, "--seed", "1", "--out", tmp_path / "d.zarr"],
                 ["synth", "--pooled", *SMALL, "--out", tmp_path / "pool"],
                 ["evaluate", dataset, "--out", tmp_path / "r", *LOCAL],
                 ["compare", "--method", f"a={dataset}", "--method", f"b={dataset}", "--out", tmp_path / "c",
                  "--engine", "local", "--no-cache", "--permutations", "10"]):
        assert main([str(a) for a in argv]) == 0
        again = [*argv, "--overwrite"] if argv[0] == "synth" else argv
        assert main([str(a) for a in again]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "pool" / "hashdist.json").read_text())["format"] == "hashdist-pooled"


@pytest.mark.parametrize("where", [".", "..", "/", "cwd"])
@pytest.mark.parametrize("command", ["evaluate", "synth"])
def test_the_current_directory_its_parents_and_the_root_are_refused_before_any_work(tmp_path, capsys, monkeypatch,
                                                                                   dataset, where, command):
    """--out ., .., / or the current directory by its full path, with --overwrite: one line before the run (the old
    run computed, then failed with a traceback or EBUSY and left lock files), nothing written anywhere."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    out = str(work) if where == "cwd" else where
    argv = (["evaluate", dataset, "--out", out, *LOCAL] if command == "evaluate"
            else ["synth", *SMALL, "--out", out])
    before = snapshot(tmp_path)
    assert_refused(capsys, [*argv, "--overwrite"], "current directory")
    assert snapshot(tmp_path) == before


def test_a_cache_inside_the_output_is_refused_before_the_run(tmp_path, capsys, dataset):
    """--cache OUT/cache: refused before anything is computed (the old run computed every block into the cache,
    then refused OUT); the per-user cache held by --out too."""
    out = tmp_path / "r"
    assert_refused(capsys, ["evaluate", dataset, "--out", out, "--engine", "local", "--cache", out / "cache"],
                   f"--out {out}: holds the block cache {out / 'cache'}", out)
    assert_refused(capsys, ["compare", "--method", f"a={dataset}", "--method", f"b={dataset}", "--out", out,
                            "--engine", "local", "--cache", out / "cache"], "holds the block cache", out)
    os.environ["HASHDIST_CACHE"], before = str(tmp_path / "home" / "cache"), os.environ.get("HASHDIST_CACHE")
    try:
        assert_refused(capsys, ["evaluate", dataset, "--out", tmp_path / "home", "--engine", "local"],
                       "holds the block cache")
    finally:
        os.environ.pop("HASHDIST_CACHE") if before is None else os.environ.update(HASHDIST_CACHE=before)
    assert not (tmp_path / "home").exists()


def test_an_output_that_is_a_link_is_refused(tmp_path, capsys, dataset):
    elsewhere = tmp_path / "elsewhere"
    assert main(["evaluate", str(dataset), "--out", str(elsewhere), *LOCAL]) == 0
    (tmp_path / "r").symlink_to(elsewhere)
    before = snapshot(tmp_path)
    assert_refused(capsys, ["evaluate", dataset, "--out", tmp_path / "r", *LOCAL], "is a symbolic link")
    assert snapshot(tmp_path) == before


def test_history_out_replaces_only_a_history_page(tmp_path, capsys, dataset):
    """history --out hist/zarr.json, a file inside the store, or a file it did not write: refused, store and file
    unchanged (the old command replaced any file); a page it wrote, and the store's own page, are rewritten."""
    hist = tmp_path / "hist"
    assert main(["evaluate", str(dataset), "--out", str(tmp_path / "r"), *LOCAL, "--history", str(hist)]) == 0
    mine = tmp_path / "mine.html"
    mine.write_text("<p>my notes</p>")
    before = snapshot(tmp_path)
    assert_refused(capsys, ["history", hist, "--out", hist / "zarr.json"], "an .html file")
    assert_refused(capsys, ["history", hist, "--out", hist / "runs" / "x.html"], "lies inside the input")
    assert_refused(capsys, ["history", hist, "--out", mine], "not a hashdist history page")
    assert snapshot(tmp_path) == before
    page = tmp_path / "page.html"
    for _ in range(2):
        assert main(["history", str(hist), "--out", str(page)]) == 0
        assert main(["history", str(hist)]) == 0
    assert (hist / "history.html").is_file() and "hashdist-history-page" in page.read_text()[:200]


# -- Names ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a\n", "a@32\n", "\na", "a\n@32"])
def test_a_method_name_with_a_newline_is_refused(tmp_path, capsys, dataset, name):
    """`$` matched before a final newline, so "a\\n" passed and split the leaderboard's Markdown row."""
    out = tmp_path / "cmp"
    assert_refused(capsys, ["compare", "--method", f"{name}={dataset}", "--method", f"b={dataset}", "--out", out,
                            "--engine", "local", "--no-cache", "--markdown"], "NAME must be letters", out)


def test_a_hashtable_setting_with_a_trailing_newline_is_refused():
    from hashdist.errors import InputError
    from hashdist.options import parse_hashtable

    assert parse_hashtable(" 8x4 ") == (8, 4)
    with pytest.raises(InputError):
        parse_hashtable("8x4\nx")


# -- SIGTERM while split stages ------------------------------------------------

# `hashdist split` in a process on a slow filesystem (shared, under load, as where 1.3 GB of staged splits were
# left): each Zarr store write takes 0.3 s more, and removing a directory tree takes 0.5 s more after the files are
# gone. A signal that comes while a chunk write is in flight in zarr's IO thread: the write lands while the main
# thread is still removing the staged directory. Each chunk write says "writing" on stderr as it starts.
SLOW_SPLIT = """
import asyncio, shutil, sys, time
from zarr.storage import LocalStore
real_set, real_rmtree = LocalStore.set, shutil.rmtree
async def slow_set(self, key, value):
    if "/c/" in key:
        sys.stderr.write("writing " + key + "\\n")
        sys.stderr.flush()
    await asyncio.sleep(0.3)
    return await real_set(self, key, value)
def slow_rmtree(*args, **kwargs):
    real_rmtree(*args, **kwargs)
    time.sleep(0.5)
LocalStore.set, shutil.rmtree = slow_set, slow_rmtree
from hashdist.cli.app import console
sys.argv = ["hashdist", *sys.argv[1:]]
sys.exit(console())
"""


def test_sigterm_while_split_stages_leaves_no_staged_directory(tmp_path):
    """SIGTERM while a chunk write is in flight in zarr's IO thread (the process said "writing"): exit 143, and
    neither the output nor a .NAME.tmp-* staging directory nor a lock file is left. The old code removed the
    staging directory while the write went on, and the write made it again. Three rounds."""
    for round_ in range(3):
        out = tmp_path / f"s{round_}.zarr"
        proc = subprocess.Popen([sys.executable, "-c", SLOW_SPLIT, "split", "--n-items", "200000", "--runs", "3",
                                 "--out", str(out)], stderr=subprocess.PIPE, text=True)
        try:
            lines = []
            while not (lines and lines[-1].startswith("writing ")):
                lines.append(proc.stderr.readline())
                assert lines[-1], f"the split ended before writing a chunk: {lines}"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=90) == 143
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        assert proc.stderr.read().strip().splitlines()[-1] == "hashdist: terminated"
        assert sorted(p.name for p in tmp_path.iterdir()) == [], [str(p) for p in tmp_path.rglob("*")][:5]
