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
