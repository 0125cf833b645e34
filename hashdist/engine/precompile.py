"""A first run's compilation on two cores: a second process compiles part of the metric functions.

numba compiles holding the GIL, so threads cannot share a first run's compilation. When numba's
on-disk cache holds none of the metric functions, :func:`start` runs a process that compiles its
share into the cache while this process compiles the histogram kernels: the scan for M_k (needed
first, after the histograms), then the AP measures (mAP, mAP@K, mAP@r: their harmonic-number helpers
are then compiled once). This process goes on to compile the other code-count functions when it
counts codes. :func:`join`, called after the code counts and before the measures, compiles this
process's share of the measures (the others), then waits for the second process, so the measures
load its functions from the cache and nothing is compiled twice. Both compile by calling the
functions on tiny inputs of the run's types. With a warm cache, or a cache numba cannot write (a
read-only install), nothing is started and :func:`join` does nothing. The process ends with this
one: it is killed at exit, and exits on its own if this process is killed.

A run in the command's own process (``--engine local``) starts that process earlier, from the launcher
(:func:`start_early`, before hashdist loads), when the stamp file a run leaves does not show the metric
functions cached (:func:`looks_cached`: reading it needs only the standard library). Its imports and first
functions then overlap the CLI's loading and the histogram kernels' compiling, so it also takes the NDCG
measures. It checks numba's cache itself and exits at once (status NOTHING_TO_COMPILE) when the functions are
there; :func:`start` then takes it as the run's second process, or, if it found nothing to compile, as none, and
writes the stamp.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from hashdist.data.atomic import read_marker, replace_file
from hashdist.defaults import kernels_dir

# the second process's share of the measures: the AP measures, which share the harmonic-number helpers; started
# early (by the launcher, as the run's modules load), also the NDCG measures, which share the discounts and the DCG
# loop (demo, Intel, 10 rounds against the late start: cold - warm 5.55 -> 5.24 s; started late with them, a cold
# flow run waited for it: 10.1 -> 12.0 s)
SECOND_PROCESS_MEASURES = frozenset({"map", "map_at_k", "map_at_radius"})
SECOND_PROCESS_MEASURES_EARLY = SECOND_PROCESS_MEASURES | {"ndcg_at_k", "ndcg_structhash_at_k"}
JOIN_TIMEOUT_S = 300  # seconds join waits for the second process: far beyond its few seconds of compiling
NOTHING_TO_COMPILE = 3  # the second process's exit status when numba's cache already holds the metric functions

_lock = threading.Lock()
_process: subprocess.Popen | None = None
_second_share = SECOND_PROCESS_MEASURES  # the measures the second process compiles
_joined = False


def _metric_dispatchers():
    from hashdist.metrics import ranking

    return (ranking._ap_at_radius, ranking._ap_at_k, ranking._dcg, ranking._hits_at_k)


def _index_files() -> list[str] | None:
    """numba's index files of the metric functions (one for each process's share), None where it cannot cache."""
    indexes = [getattr(getattr(f._cache, "_cache_file", None), "_index_path", None) for f in _metric_dispatchers()]
    return [str(index) for index in indexes] if all(indexes) else None


def _needs_compiling() -> bool:
    """True when numba can cache the metric functions and has cached none of them yet."""
    indexes = _index_files()
    return indexes is not None and not any(Path(index).exists() for index in indexes)


def stamp_path() -> Path:
    """The stamp naming the metric functions' index files once they are cached, in the generated kernels'
    directory: one per Python environment, $NUMBA_CACHE_DIR and hashdist install (where numba's cache lies)."""
    where = "\0".join((sys.prefix, sys.version, os.environ.get("NUMBA_CACHE_DIR", ""),
                       str(Path(__file__).resolve().parent)))
    return kernels_dir() / f"metrics-cached-{hashlib.sha256(where.encode()).hexdigest()[:16]}.json"


def looks_cached() -> bool:
    """Whether the stamp names index files that are all there (none: numba cannot cache). Only a hint: without a
    stamp the early process checks numba's cache itself, and with a stale one :func:`start` does."""
    indexes = read_marker(stamp_path(), "index_files")
    return isinstance(indexes, list) and all(isinstance(index, str) and os.path.exists(index) for index in indexes)


def _note_cached() -> None:
    """Write the stamp (best effort: without it, the next run's launcher starts a process that only checks)."""
    stamp, indexes = stamp_path(), _index_files() or []
    if read_marker(stamp, "index_files") == indexes:
        return
    with contextlib.suppress(OSError):
        stamp.parent.mkdir(parents=True, exist_ok=True)
        replace_file(stamp, json.dumps({"index_files": indexes}))


def start() -> None:
    """Compile the second process's share in a second process if the cache lacks the metric functions (at most
    once a process); a process :func:`start_early` started is taken as that process, unless it found them
    cached. With them cached, note it in the stamp."""
    global _process
    with _lock:
        if _process is not None and _process.poll() == NOTHING_TO_COMPILE:
            _process = None  # started early, it found the metric functions cached
        if _process is not None:
            return
        if _needs_compiling():
            _process = _spawn(SECOND_PROCESS_MEASURES)
        else:
            _note_cached()


def start_early() -> None:
    """Start the second process, with the larger share, before this process knows whether the cache lacks the
    metric functions: it checks, and exits at once if they are there (see :func:`start`)."""
    global _process
    with _lock:
        if _process is None:
            _process = _spawn(SECOND_PROCESS_MEASURES_EARLY)


def _spawn(share: frozenset) -> subprocess.Popen:
    global _second_share
    _second_share = share
    code = "from hashdist.engine.precompile import compile_second_share; compile_second_share()"
    process = subprocess.Popen([sys.executable, "-c", code, str(os.getpid()), ",".join(sorted(share))],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    atexit.register(_stop, process)
    return process


def join(timeout: float = JOIN_TIMEOUT_S) -> None:
    """When a second process was started: compile this process's share, then wait for that process (at most
    ``timeout`` seconds; then it is stopped, and what it has not cached compiles at first call here). Once it
    has cached its share, or found it cached, note it in the stamp."""
    global _joined
    with _lock:
        if _process is None or _joined:
            return
        _joined = True
        if _process.poll() != NOTHING_TO_COMPILE:
            compile_measures(lambda key: key not in _second_share)
        try:
            if _process.wait(timeout) in (0, NOTHING_TO_COMPILE):
                _note_cached()
        except subprocess.TimeoutExpired:
            _stop(_process)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()


def compile_measures(chosen) -> None:
    """Compile the per-query measures whose keys ``chosen(key)`` accepts, in registry order: each computed once
    for a small histogram with three grades."""
    import numpy as np

    from hashdist.metrics.registry import MEASURES
    from hashdist.metrics.summary import MetricParams, per_query_metrics

    H = np.random.default_rng(0).integers(0, 4, size=(4, 9, 3)).astype(np.int64)
    params = MetricParams(ks=(1, 5), radii=(0, 2), n_database=int(H[0].sum()))
    M = np.ones((H.shape[0], params.max_radius + 1), dtype=np.int64)
    per_query_metrics(H, M, params, measures=[m for m in MEASURES if chosen(m.key)])


def compile_second_share() -> None:
    """The second process (``sys.argv[1]``: the parent's pid; ``sys.argv[2]``: its share, the measures' keys
    joined by commas): M_k (by scanning) for a few codes, then its share of the measures; nothing (exit status
    NOTHING_TO_COMPILE) if numba's cache holds the metric functions or cannot."""
    parent, share = int(sys.argv[1]), frozenset(sys.argv[2].split(","))

    def exit_with_parent():
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=exit_with_parent, daemon=True).start()
    if not _needs_compiling():
        sys.exit(NOTHING_TO_COMPILE)
    import numpy as np

    from hashdist.kernels.codecounts import code_counts, max_bucket_within

    codes = np.random.default_rng(0).integers(0, 4, size=(16, 1), dtype=np.uint64)
    distinct, counts = code_counts(codes)
    max_bucket_within(codes, distinct, counts, 64, 2, None, np.full((16, 3), 2))
    compile_measures(lambda key: key in share)
    os._exit(0)  # numba's cache files are written: no interpreter teardown (0.2-0.3 s the run would wait for)
