"""Hardware popcount and Hamming distance on uint64 words."""

from numba import njit, types
from numba.extending import intrinsic


@intrinsic
def popcount64(typingctx, x):
    """LLVM ``ctpop`` on a uint64 (POPCNT where the CPU has it), returned as int64."""
    sig = types.int64(types.uint64)

    def codegen(context, builder, signature, args):
        return builder.ctpop(args[0])

    return sig, codegen


@njit(nogil=True, inline="always")
def hamming(a, b):
    """Hamming distance between two codes given as uint64 word rows."""
    d = 0
    for w in range(a.shape[0]):
        d += popcount64(a[w] ^ b[w])
    return d


@njit(nogil=True, inline="always")
def common_bits(a, b):
    """Number of set bits two word rows share (labels in common for packed multi-hot)."""
    c = 0
    for w in range(a.shape[0]):
        c += popcount64(a[w] & b[w])
    return c
