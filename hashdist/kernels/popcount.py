"""Hardware popcount and Hamming distance on uint64 words."""

import functools

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


_POPCOUNT_IR = """
declare i64 @llvm.ctpop.i64(i64)
declare <8 x i64> @llvm.ctpop.v8i64(<8 x i64>)
define i64 @scalar(i64 %x) {
  %r = call i64 @llvm.ctpop.i64(i64 %x)
  ret i64 %r
}
define <8 x i64> @vector(<8 x i64> %x) {
  %r = call <8 x i64> @llvm.ctpop.v8i64(<8 x i64> %x)
  ret <8 x i64> %r
}
"""


@functools.cache
def target_popcount() -> tuple[bool, bool]:
    """How numba's target counts bits: (a 64-bit word with one POPCNT, 64-bit lanes of a vector with VPOPCNTQ).

    The target is numba's: NUMBA_CPU_NAME and NUMBA_CPU_FEATURES where set, else this host. LLVM compiles a
    popcount of each kind for it and the instructions are read off the assembly (about 5 ms), so no table of
    CPU names is kept. Without the vector instruction (x86 before AVX-512 VPOPCNTDQ) LLVM counts a vector's
    bits by byte-table lookups. On other architectures both are False: the routes they choose were measured on
    x86 only.
    """
    from llvmlite import binding
    from numba import config
    from numba.core.codegen import get_host_cpu_features

    triple = binding.get_process_triple()
    if not triple.startswith(("x86_64", "i386", "i486", "i586", "i686")):
        return False, False
    binding.initialize_native_target()
    binding.initialize_native_asmprinter()
    machine = binding.Target.from_triple(triple).create_target_machine(
        cpu=config.CPU_NAME or binding.get_host_cpu_name(),
        features=get_host_cpu_features() if config.CPU_FEATURES is None else config.CPU_FEATURES,
    )
    scalar, vector = machine.emit_assembly(binding.parse_assembly(_POPCOUNT_IR)).split("vector:", 1)
    return "popcnt" in scalar, "vpopcntq" in vector
