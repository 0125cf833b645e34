"""A first run's compilation on two cores: a second process compiles part of the metric functions.

numba compiles holding the GIL, so threads cannot share a first run's compilation. When numba's
on-disk cache holds none of the metric functions, :func:`start` runs a process that compiles its
share into the cache while this process compiles the histogram kernels: the scan for M_k (needed
first, after the histograms) and the AP measures (mAP, mAP@K, mAP@r: their harmonic-number helpers
are then compiled once). This process goes on to compile the other code-count functions when it
counts codes. :func:`join`, called after the code counts and before the measures, compiles this
process's share of the measures (the others), then waits for the second process, so the measures
load its functions from the cache and nothing is compiled twice. The shares are about equal on
two cores (the second process starts compiling about 0.6 s later, after its imports). Both compile by calling
the functions on tiny inputs of the run's types. With a warm cache, or a cache numba cannot write (a
read-only install), nothing is started and :func:`join` does nothing. The process ends with this
one: it is killed at exit, and exits on its own if this process is killed.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

# the second process's share of the measures: the AP measures, which share the harmonic-number helpers
SECOND_PROCESS_MEASURES = frozenset({"map", "map_at_k", "map_at_radius"})
JOIN_TIMEOUT_S = 300  # seconds join waits for the second process: far beyond its few seconds of compiling

_lock = threading.Lock()
_process: subprocess.Popen | None = None
_joined = False


def _metric_dispatchers():
    from hashdist.metrics import ranking

    return (ranking._ap_at_radius, ranking._ap_at_k, ranking._dcg, ranking._hits_at_k)


def _needs_compiling() -> bool:
    """True when numba can cache the metric functions and has cached none of them yet."""
    indexes = [getattr(getattr(f._cache, "_cache_file", None), "_index_path", None) for f in _metric_dispatchers()]
    return all(indexes) and not any(Path(index).exists() for index in indexes)


def start() -> None:
    """Compile the second process's share in a second process if the cache lacks the metric functions (at most
    once a process)."""
    global _process
    with _lock:
        if _process is not None or not _needs_compiling():
            return
        code = "from hashdist.engine.precompile import compile_second_share; compile_second_share()"
        _process = subprocess.Popen([sys.executable, "-c", code, str(os.getpid())], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        atexit.register(_stop)


def join(timeout: float = JOIN_TIMEOUT_S) -> None:
    """When a second process was started: compile this process's share, then wait for that process (at most
    ``timeout`` seconds; then it is stopped, and what it has not cached compiles at first call here)."""
    global _joined
    with _lock:
        if _process is None or _joined:
            return
        _joined = True
        compile_measures(lambda key: key not in SECOND_PROCESS_MEASURES)
        try:
            _process.wait(timeout)
        except subprocess.TimeoutExpired:
            _stop()


def _stop() -> None:
    if _process.poll() is None:
        _process.kill()
    _process.wait()


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
    """The second process (``sys.argv[1]``: the parent's pid): M_k (by scanning) for a few codes, then the AP
    measures."""
    parent = int(sys.argv[1])

    def exit_with_parent():
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=exit_with_parent, daemon=True).start()
    import numpy as np

    from hashdist.kernels.codecounts import code_counts, max_bucket_within

    codes = np.random.default_rng(0).integers(0, 4, size=(16, 1), dtype=np.uint64)
    distinct, counts = code_counts(codes)
    max_bucket_within(codes, distinct, counts, 64, 2, None, np.full((16, 3), 2))
    compile_measures(lambda key: key in SECOND_PROCESS_MEASURES)
