"""Large arrays mapped straight from the system, so that freed ones go back to it.

glibc's malloc serves an allocation of at least its mmap threshold with a mapping of its own, returned to the
system when freed; smaller ones come from its heaps, which keep freed memory for reuse. The threshold starts
at 128 KiB and rises to the size of every mapped block freed (up to 32 MiB), so after a few large arrays come
and go, arrays of several MB come from the heaps and their freed memory stays resident, scattered between
live allocations: a run's peak memory then grew with the database (0.44 GiB at 10M items, 0.55 GiB at 100M,
issue #44). A fixed threshold of 4 MiB stops that drift (0.42 GiB at both). Set once per process, on Linux
with glibc; elsewhere nothing is done.
"""

from __future__ import annotations

import ctypes
import functools
import sys

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
MMAP_THRESHOLD = 4 << 20


@functools.cache
def map_large_arrays() -> bool:
    """Fix glibc's mmap threshold at MMAP_THRESHOLD for this process (once); whether it was set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):  # not glibc
        return False
