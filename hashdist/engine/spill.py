"""Database codes of the later code-counting passes, written once by the first (see
:func:`hashdist.engine.compute.count_codes`).

The distinct database codes are counted in passes of a few code parts, so that memory does not grow with the
database; but each pass would read and hash every database code again, passes x N work for a database of N
items. With a spill directory, the first pass reads each block once and writes the rows of every later pass to
a file of their own, ``<directory>/<pass>-<first row>.npy``; a later pass reads only its rows and removes the
file. The work is then linear in N, and the directory holds at most the database's codes (8 bytes per item
and code word), less as the passes go. Used where every worker shares this machine's temporary directory (the
local engine, the embedded cluster); the counts are the same either way.
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from hashdist.engine.plan import Plan, code_passes
from hashdist.errors import NO_ROOM, write_failed
from hashdist.kernels.codecounts import code_parts_of


@contextmanager
def spill_directory(plan: Plan, wanted: bool = True):
    """A temporary directory for the plan's later passes (removed on exit), or None with one pass or none
    ``wanted``. ``plan`` comes from :func:`hashdist.engine.plan.for_threads`."""
    if not wanted or len(code_passes(plan)) < 2:
        yield None
        return
    try:
        spill = tempfile.TemporaryDirectory(prefix="hashdist-codes-")
    except OSError as exc:
        raise _no_room(exc, tempfile.gettempdir()) if exc.errno in NO_ROOM else exc from None
    with spill as directory:
        yield directory


def _no_room(exc: OSError, directory: str):
    return write_failed(exc, directory, "while setting aside database codes for counting", "nothing else was "
                        "written; point TMPDIR at a file system with room (8 bytes per database item and code word)")


def spill_rows(directory: str, plan: Plan, words: np.ndarray, d0: int) -> np.ndarray:
    """Write the code rows of database block ``d0`` that later passes count, a file per pass; return the first
    pass's rows (each row's part hashed once for all passes)."""
    passes = code_parts_of(words, plan.code_parts) // plan.parts_per_pass
    order = np.argsort(passes, kind="stable")
    bounds = np.searchsorted(passes[order], np.arange(len(code_passes(plan)) + 1))
    for j in range(1, len(bounds) - 1):
        try:
            np.save(Path(directory) / f"{j}-{d0}.npy", words[order[bounds[j] : bounds[j + 1]]])
        except OSError as exc:
            if exc.errno in NO_ROOM:
                raise _no_room(exc, directory) from None
            raise
    return words[order[bounds[0] : bounds[1]]]


def take_rows(directory: str, plan: Plan, parts: range, d0: int) -> np.ndarray:
    """The code rows of database block ``d0`` in the pass of code parts ``parts``; their file is removed."""
    path = Path(directory) / f"{parts.start // plan.parts_per_pass}-{d0}.npy"
    rows = np.load(path, allow_pickle=False)
    path.unlink()
    return rows
