"""A first run's compilation on two cores: the metric functions also compile in a second process.

numba compiles holding the GIL, so threads cannot share a first run's compilation. When numba's
on-disk cache holds none of the metric functions, :func:`start` runs a process that calls the
code-count functions and then the registry's measures, in reverse order, on tiny inputs, compiling
them into the cache, while this process compiles the histogram kernels, then counts codes and
computes the measures in registry order: each function is compiled by whichever process reaches it
first and loaded from the cache by the other (numba looks there at a function's first call), so the
two meet in the middle of the measures. With a warm cache, or a cache numba cannot write (a read-only
install), nothing is started. The process ends with this one: it is killed at exit, and exits on its
own if this process is killed.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

_lock = threading.Lock()
_process: subprocess.Popen | None = None


def _metric_dispatchers():
    from hashdist.metrics import ranking

    return (ranking._ap_at_radius, ranking._ap_at_k, ranking._dcg, ranking._hits_at_k)


def _needs_compiling() -> bool:
    """True when numba can cache the metric functions and has cached none of them yet."""
    indexes = [getattr(getattr(f._cache, "_cache_file", None), "_index_path", None) for f in _metric_dispatchers()]
    return all(indexes) and not any(Path(index).exists() for index in indexes)


def start() -> None:
    """Compile the metric functions in a second process if the cache lacks them (at most once a process)."""
    global _process
    with _lock:
        if _process is not None or not _needs_compiling():
            return
        code = "from hashdist.precompile import compile_metrics; compile_metrics()"
        _process = subprocess.Popen([sys.executable, "-c", code, str(os.getpid())], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        atexit.register(_stop)


def _stop() -> None:
    if _process.poll() is None:
        _process.kill()
    _process.wait()


def compile_metrics() -> None:
    """The compiling process (``sys.argv[1]``: the parent's pid): code counts and M_k (by scanning) of a few
    codes, then every per-query measure of a small histogram with three grades, last first."""
    parent = int(sys.argv[1])

    def exit_with_parent():
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=exit_with_parent, daemon=True).start()
    import numpy as np

    from hashdist.codeusage import bit_ones_block
    from hashdist.kernels.codecounts import code_counts, code_parts, max_bucket_within
    from hashdist.metrics.registry import MEASURES
    from hashdist.metrics.summary import MetricParams, per_query_metrics

    rng = np.random.default_rng(0)
    codes = rng.integers(0, 4, size=(16, 1), dtype=np.uint64)
    code_parts(codes, None, 2)
    bit_ones_block(codes, 64)
    distinct, counts = code_counts(codes)
    max_bucket_within(codes, distinct, counts, 64, 2, None, np.full((16, 3), 2))
    H = rng.integers(0, 4, size=(4, 9, 3)).astype(np.int64)
    params = MetricParams(ks=(1, 5), radii=(0, 2), n_database=int(H[0].sum()))
    M = np.ones((H.shape[0], params.max_radius + 1), dtype=np.int64)
    per_query_metrics(H, M, params, measures=MEASURES[::-1])
