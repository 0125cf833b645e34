"""numba kernels: per-block Hamming histograms split by relevance grade, and code counts for mLGAP.

Bump KERNEL_VERSION whenever a kernel's output could change: block caches key on it.
"""

import numpy as np
from numba import njit
from numba.extending import register_jitable

KERNEL_VERSION = 3


def cached_njit(**options):
    """``njit(cache=True, **options)``, or ``njit(**options)`` where numba finds no writable cache directory.

    Numba chooses the cache directory (NUMBA_CACHE_DIR, else next to the source, else the user's cache)
    when a function is decorated and raises if none is writable, as on a read-only install: such
    functions are compiled in memory in each process instead.
    """

    def decorate(func):
        try:
            return njit(cache=True, **options)(func)
        except RuntimeError:
            return njit(**options)(func)

    return decorate


def jit_helper(func):
    """A helper of jitted functions, compiled into its callers: once per process for each argument type.

    ``register_jitable`` types calls with int64 for literal arguments (a call to an njit function compiles
    once per literal value passed), and the flags of :func:`cached_njit` let one compilation serve every caller.
    """
    return register_jitable(nogil=True, no_cpython_wrapper=False)(func)


@jit_helper
def listed_in_block(indptr, indices, q, db_start, n):
    """Explicit ground truth (CSR, indices sorted per query): the range p0:p1 of query q's listed items that
    fall in the database block db_start:db_start + n."""
    lo, hi = indptr[q], indptr[q + 1]
    return (lo + np.searchsorted(indices[lo:hi], db_start), lo + np.searchsorted(indices[lo:hi], db_start + n))
