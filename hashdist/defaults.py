"""Defaults shared by the API, the CLI, the flows and the comparison (one place to change them)."""

import os
from pathlib import Path

DEFAULT_K = (10, 100, 1000)  # cut-offs K of the @K metrics
DEFAULT_RADII = (0, 1, 2)  # Hamming radii of the radius metrics and mLGAP
DEFAULT_BETA = 1.0  # F-beta's beta
DEFAULT_QUERY_BLOCK_ROWS = 2048  # evaluate's blocks (queries x database rows)
DEFAULT_DB_BLOCK_ROWS = 262144
GROUNDTRUTH_QUERY_BLOCK_ROWS = 1024  # groundtruth's blocks (its distances are float: smaller)
GROUNDTRUTH_NEIGHBORS = 50  # epsilon_ball: the R-th neighbour of a sampled item sets epsilon...
GROUNDTRUTH_SAMPLE = 100  # ...averaged over this many sampled database items
GROUNDTRUTH_PERCENT = 2.0  # top_percent: the share of the database relevant to each query
DEFAULT_CHUNK_ROWS = 65536  # Zarr chunks of a dataset's database rows...
DEFAULT_QUERY_CHUNK_ROWS = 1024  # ...and of its query rows
DEFAULT_DISTANCE_BINS = 4096  # bins of a real-valued ranking distance (weighted Hamming, asymmetric)
DEFAULT_PERMUTATIONS = 10000  # sign-flip permutations of a randomisation test (compare, history)
DEFAULT_BOOTSTRAP = 2000  # bootstrap resamples of a confidence interval (compare)
DEFAULT_SEED = 0  # seed of the tests and the bootstrap
DEFAULT_ALPHA = 0.05  # significance level of history's drop test


def cache_in_use(cache) -> list[tuple[str, str]]:
    """[("the block cache", its directory)] of a cache setting (None or True: the per-user one; a path), [] for
    False (no cache): what an output must not hold or lie inside."""
    if cache is False:
        return []
    return [("the block cache", str(default_cache_dir() if cache is None or cache is True else cache))]


def default_cache_dir() -> Path:
    """Per-user cache shared by all runs: $HASHDIST_CACHE, else $XDG_CACHE_HOME/hashdist, else ~/.cache/hashdist."""
    if os.environ.get("HASHDIST_CACHE"):
        return Path(os.environ["HASHDIST_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hashdist"


def kernels_dir() -> Path:
    """Where generated kernels are written as modules (so numba can cache their machine code), with the stamp of
    the cached metric functions: ``kernels/`` in the per-user cache."""
    return default_cache_dir() / "kernels"
