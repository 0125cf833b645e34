"""Issue #50, points 3, 4 and 7: what the block cache and the code reader trust, against real files and processes.

- A dataset's codes or labels rewritten in place with zarr (chunk checksums valid, zarr.json kept): the next run
  with the same cache recomputes and equals a run without a cache (the cache key holds the rows' content).
- A cache entry forged with a valid digest but impossible counts (negative, a row counted twice, a float, a
  missing array): a miss, recomputed, never a traceback.
- zarr.json's nbits lowered below the codes' width: one line, exit status 2, nothing written.
- A FIFO, a symbolic link or a directory at a cache entry's path: the run neither hangs nor follows the link.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from hashdist.cli import main
from hashdist.data.bits import unpack_bits
from hashdist.engine.cache import BlockCache, _digest
from tests.conftest import assert_refused

BIN = Path(sys.executable).parent
RUN = ["--engine", "local", "--threads", "1", "--quiet", "--no-html"]
SMALL = ["--n-database", "300", "--n-queries", "30", "--nbits", "16", "--labels", "class"]  # the a.zarr


def synth(path: Path, *args: str) -> Path:
    assert main(["synth", "--out", str(path), *SMALL, *args]) == 0
    return path


def evaluate(dataset: Path, out: Path, *cache: str) -> dict:
    """`hashdist evaluate` in this process (status 0): its report."""
    assert main(["evaluate", str(dataset), "--out", str(out), *RUN, *(cache or ["--no-cache"])]) == 0
    return json.loads((out / "report.json").read_text())


def mean_ap(report: dict) -> float:
    return report["metrics"]["map"]["expected"]


@pytest.fixture
def dataset(tmp_path) -> Path:
    return synth(tmp_path / "a.zarr")


def entries(cache: Path) -> list[Path]:
    return sorted(cache.rglob("*.npz"))


@pytest.fixture
def chunked(tmp_path) -> Path:
    """The issue's a.zarr in database chunks of 100 rows: evaluated in 3 blocks with BLOCKS."""
    return synth(tmp_path / "chunked.zarr", "--chunk-rows", "100")


BLOCKS = ("--db-block-rows", "100")


@pytest.mark.parametrize(("array", "changed"), [("database/codes", 1), ("database/labels", 1), ("queries/codes", 3)])
def test_rows_rewritten_in_place_are_recomputed_not_answered_from_the_cache(chunked, tmp_path, array, changed):
    """Rows 100..200 of a database array (one block) or every query's code rewritten with zarr, zarr.json and
    its fingerprints kept: the blocks that read them are computed again, the others come from the cache, and the
    metrics equal a run without a cache. Before, every block came from the cache, with the old mAP."""
    cache = tmp_path / "cache"
    first = evaluate(chunked, tmp_path / "first", "--cache", str(cache), *BLOCKS)
    metadata = (chunked / "zarr.json").read_bytes()
    stored = zarr.open_array(str(chunked / array), mode="r+")
    part = slice(100, 200) if array.startswith("database") else slice(None)
    rows = stored[part]
    stored[part] = rows[np.random.default_rng(1).permutation(len(rows))]  # the same values, other rows
    assert (chunked / "zarr.json").read_bytes() == metadata  # the fingerprints still describe the old rows
    again = evaluate(chunked, tmp_path / "again", "--cache", str(cache), *BLOCKS)
    fresh = evaluate(chunked, tmp_path / "fresh", *BLOCKS)
    assert mean_ap(fresh) != mean_ap(first)  # the change matters
    assert again["metrics"] == fresh["metrics"]
    assert (again["blocks"]["computed"], again["blocks"]["total"]) == (changed, 3)


def test_unchanged_rerun_still_comes_from_the_cache(chunked, tmp_path):
    cache = tmp_path / "cache"
    first = evaluate(chunked, tmp_path / "first", "--cache", str(cache), *BLOCKS)
    again = evaluate(chunked, tmp_path / "again", "--cache", str(cache), *BLOCKS)
    assert again["blocks"]["cached"] == again["blocks"]["total"] == 3 and again["metrics"] == first["metrics"]


def _forge(path: Path, change) -> None:
    """Rewrite a cache entry as a hostile writer would: change its arrays and store a valid digest with them."""
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files if k != "__digest__"}
    change(arrays)
    with open(path, "wb") as f:
        np.savez(f, __digest__=np.array(_digest(path.stem, arrays)), **arrays)


def _negative(a):  # one cell -5, another raised to match: every query still counts 300 rows
    a["H"][0, 1, 0] += a["H"][0, 0, 0] + 5
    a["H"][0, 0, 0] = -5


def _counted_twice(a):
    a["H"][1, 3, 1] += 1


def _as_float(a):
    a["H"] = a["H"].astype(np.float64)


def _missing(a):
    del a["collapse"]


def _wider(a):
    a["H"] = np.concatenate([a["H"], a["H"][:1]])


@pytest.mark.parametrize("change", [_negative, _counted_twice, _as_float, _missing, _wider])
def test_forged_entries_with_valid_digests_are_misses_and_recomputed(dataset, tmp_path, capsys, change):
    cache = tmp_path / "cache"
    reference = evaluate(dataset, tmp_path / "first", "--cache", str(cache))
    (entry,) = entries(cache)
    _forge(entry, change)
    assert BlockCache(cache).get(entry.stem) is not None  # the digest alone would trust it
    capsys.readouterr()
    again = evaluate(dataset, tmp_path / "again", "--cache", str(cache))
    assert "Traceback" not in capsys.readouterr().err
    assert again["metrics"] == reference["metrics"] and again["blocks"]["computed"] == 1
    with np.load(entry) as f:  # the forged entry was replaced by the real result
        assert (f["H"] >= 0).all() and f["H"].dtype == np.int64


def _set_nbits(dataset: Path, nbits) -> None:
    """Hand-edit zarr.json's nbits (only the dataset's attribute; the synth provenance keeps its own)."""
    meta = json.loads((dataset / "zarr.json").read_text())
    meta["attributes"]["nbits"] = nbits
    (dataset / "zarr.json").write_text(json.dumps(meta, indent=2))


def test_nbits_narrower_than_the_codes_is_refused_in_one_line(dataset, tmp_path, capsys):
    cache = tmp_path / "cache"
    evaluate(dataset, tmp_path / "at16", "--cache", str(cache))  # a cache from the honest width changes nothing
    _set_nbits(dataset, 8)
    out = tmp_path / "out"
    line = assert_refused(capsys, ["evaluate", dataset, "--out", out, *RUN, "--cache", cache],
                          "has bits set above nbits=8", not_created=out)
    assert f"{dataset}/zarr.json" in line and "--nbits" in line
    assert_refused(capsys, ["evaluate", dataset, "--out", out, *RUN, "--no-cache"], "above nbits=8", out)


def test_codes_that_fit_their_nbits_pass_and_the_check_matches_the_bits(tmp_path):
    from hashdist.data.bits import first_wide_row

    rng = np.random.default_rng(0)
    for nbits in (1, 8, 63, 64, 65, 100, 128):
        words = np.zeros((50, -(-nbits // 64)), dtype=np.uint64)
        width = words.shape[1] * 64
        words[:] = rng.integers(0, 2**63, words.shape, dtype=np.uint64) << np.uint64(1) | np.uint64(1)
        bits = unpack_bits(words, width)
        honest = words.copy()
        honest[:, -1] &= np.uint64((1 << (nbits - (words.shape[1] - 1) * 64)) - 1) if nbits % 64 else ~np.uint64(0)
        assert first_wide_row(honest, nbits) is None
        expected = np.flatnonzero(bits[:, nbits:].any(axis=1))  # brute force over the unpacked bits
        assert first_wide_row(words, nbits) == (expected[0] if len(expected) else None)


def _cached_once(dataset: Path, tmp_path: Path) -> tuple[Path, Path, dict]:
    cache = tmp_path / "cache"
    report = evaluate(dataset, tmp_path / "first", "--cache", str(cache))
    (entry,) = entries(cache)
    return cache, entry, report


def test_a_fifo_at_an_entry_path_is_a_miss_and_does_not_hang_the_run(dataset, tmp_path):
    """A separate `hashdist evaluate` process with a FIFO (no writer) where its one entry belongs: it finishes
    within a bounded time with the right metrics, and stores a regular entry in the FIFO's place. Before, it
    blocked in open() for good, SIGINT and SIGTERM ignored."""
    cache, entry, reference = _cached_once(dataset, tmp_path)
    entry.unlink()
    os.mkfifo(entry)
    out = tmp_path / "again"
    proc = subprocess.Popen([str(BIN / "hashdist"), "evaluate", str(dataset), "--out", str(out), *RUN,
                             "--cache", str(cache)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("hashdist evaluate hung on a FIFO in the cache")
    assert proc.returncode == 0, err
    again = json.loads((out / "report.json").read_text())
    assert again["metrics"] == reference["metrics"] and again["blocks"]["computed"] == 1
    assert entry.is_file() and not entry.is_symlink() and BlockCache(cache).get(entry.stem) is not None


def test_a_symbolic_link_at_an_entry_path_is_not_followed(dataset, tmp_path):
    """The entry moved away and linked back: not read through the link (a miss, recomputed), and the link's
    target is left as it was when the new entry takes the link's place."""
    cache, entry, reference = _cached_once(dataset, tmp_path)
    target = tmp_path / "elsewhere.npz"
    entry.rename(target)
    before = target.read_bytes()
    entry.symlink_to(target)
    again = evaluate(dataset, tmp_path / "again", "--cache", str(cache))
    assert again["blocks"]["computed"] == 1 and again["metrics"] == reference["metrics"]
    assert target.read_bytes() == before and not entry.is_symlink() and entry.is_file()


def test_other_files_at_an_entry_path_are_misses(tmp_path):
    store = BlockCache(tmp_path)
    arrays = {"H": np.arange(6, dtype=np.int64)}
    store.put("ab" + "0" * 62, arrays)
    entry = store._path("ab" + "0" * 62)
    assert store.get(entry.stem) is not None
    assert store.get(entry.stem, max_bytes=entry.stat().st_size - 1) is None  # larger than its block's result
    for key, make in (("ac" + "0" * 62, os.mkfifo), ("ad" + "0" * 62, os.mkdir)):
        path = store._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        make(path)
        assert store.get(key) is None


def test_a_directory_at_an_entry_path_stops_the_run_in_one_line(dataset, tmp_path, capsys):
    cache, entry, _ = _cached_once(dataset, tmp_path)
    entry.unlink()
    entry.mkdir()
    out = tmp_path / "again"
    line = assert_refused(capsys, ["evaluate", dataset, "--out", out, *RUN, "--cache", cache], f"cache {cache}", out)
    assert f"{entry} is a directory, not a cache entry; remove it" in line
