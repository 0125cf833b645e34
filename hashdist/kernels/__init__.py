"""numba kernels: per-block Hamming histograms split by relevance grade, and code counts for mLGAP.

Bump KERNEL_VERSION whenever a kernel's output could change: block caches key on it.
"""

KERNEL_VERSION = 2
