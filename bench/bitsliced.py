"""A bit-sliced histogram against faiss and hashdist's kernel (#13 item 3): why hashdist does not use one.

    .venv/bin/python bench/bitsliced.py [--quick]

With a vector popcount (AVX-512 VPOPCNTDQ) faiss computes 8 distances with one XOR and one VPOPCNTQ and stores
them; hashdist's kernels add one increment per pair (or per two pairs, in joint tables), and the increments
alone take longer than faiss's pass. A bit-sliced histogram has no increment per pair: the database block is
stored as bit planes (plane k of 512 items: bit k of each item's code, one 512-bit vector), each query flips
the planes where its own bit is 1, a carry-save adder tree sums the B planes into the distances' bit planes,
and a tree of ANDs over those splits the 512 items by distance, counted with one VPOPCNTQ per distance. This
bench builds that kernel (a numba intrinsic on LLVM <8 x i64> vectors, so the vector code does not depend on
the auto-vectoriser) and times, on one thread and in thread CPU time, best of 3 (faiss: of 5, as in
bench/fixed_costs.py), for the same clustered codes (bench/run.py's) at B = 64 and 128:

- faiss ``hammings`` in cache-sized output tiles (as bench/fixed_costs.py);
- hashdist's distance-only counts (``histogram_block`` with explicit ground truth and no listed pair: the
  all-items pass of the class route);
- the bit-sliced kernel's adder tree alone (its distance bit planes, no histogram); each query meets 64 batches
  (their planes stay in L2) before the next 64;
- the whole bit-sliced histogram, checked equal to hashdist's.

--quick uses 256 x 65,536 codes instead of 1,024 x 262,144. Prints a markdown table and the machine.
"""

from __future__ import annotations

import os

os.environ["NUMBA_NUM_THREADS"] = "1"  # before numba is imported

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numba  # noqa: E402
import numpy as np  # noqa: E402
from llvmlite import ir  # noqa: E402
from numba import types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

from hashdist.data.bits import pack_bits  # noqa: E402
from hashdist.kernels.histogram import histogram_block  # noqa: E402

HERE = Path(__file__).resolve().parent
LANES = 8  # 64-bit lanes of a vector: 8 x 64 = 512 items per bit plane
TILE_BATCHES = 64  # batches of 512 items that every query meets in turn: their planes (256 KiB at B = 64) stay in L2


def _bench_module(name: str):
    spec = importlib.util.spec_from_file_location(f"hashdist_bench_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bit_planes(codes: np.ndarray, nbits: int) -> np.ndarray:
    """Packed codes (N, words) -> planes (ceil(N / 512), nbits, LANES): bit i of planes[b, k, l] is bit k of item
    b * 512 + l * 64 + i. Missing items of the last batch are all-zero codes."""
    n = len(codes)
    padded = np.zeros((-(-n // 512) * 512, codes.shape[1]), dtype=np.uint64)
    padded[:n] = codes
    shifts = np.arange(64, dtype=np.uint64)
    bits = ((padded[:, :, None] >> shifts) & np.uint64(1)).astype(np.uint8).reshape(-1, LANES, 64, nbits)
    planes = np.packbits(bits.transpose(0, 3, 1, 2), axis=-1, bitorder="little")  # batch, k, lane, 8 bytes
    return np.ascontiguousarray(planes).view(np.uint64)[..., 0]


def _adder_tree(builder, planes):
    """Carry-save adder tree: the bit planes of the sum of one-bit ``planes``, lowest first."""
    columns, weight = {0: list(planes)}, 0
    while weight in columns:
        column = columns[weight]
        while len(column) > 1:
            if len(column) >= 3:
                a, b, c = column.pop(0), column.pop(0), column.pop(0)
                x = builder.xor(a, b)
                column.append(builder.xor(x, c))
                carry = builder.or_(builder.and_(a, b), builder.and_(c, x))
            else:
                a, b = column.pop(0), column.pop(0)
                column.append(builder.xor(a, b))
                carry = builder.and_(a, b)
            columns.setdefault(weight + 1, []).append(carry)
        weight += 1
    return [columns[w][0] for w in range(weight)]


def _vector_access(builder, vector):
    """load(array, offset) and add_to(array, offset, value) of the LANES x 64-bit vector at array + offset."""

    def at(array, offset):
        return builder.bitcast(builder.gep(array, [offset]), vector.as_pointer())

    def load(array, offset):
        return builder.load(at(array, offset), align=8)

    def add_to(array, offset, value):
        builder.store(builder.add(load(array, offset), value), at(array, offset), align=8)

    return load, add_to


def _count_by_distance(builder, sums, nbits: int, counts_data, add_to) -> None:
    """counts[d] += the items at distance d, for d in 0..nbits: a tree of ANDs over the distances' bit planes
    ``sums`` (lowest first) splits the items by distance, each distance counted with one VPOPCNTQ."""
    i64 = ir.IntType(64)
    vector = ir.VectorType(i64, LANES)
    ctpop = builder.module.globals.get("llvm.ctpop.v8i64") or ir.Function(
        builder.module, ir.FunctionType(vector, [vector]), "llvm.ctpop.v8i64")

    def count(value, mask, level):
        if level < 0:
            add_to(counts_data, ir.Constant(i64, value * LANES), builder.call(ctpop, [mask]))
            return
        for bit in (0, 1):
            if value | bit << level <= nbits:
                term = sums[level] if bit else builder.not_(sums[level])
                count(value | bit << level, term if mask is None else builder.and_(mask, term), level - 1)

    count(0, None, len(sums) - 1)


def _batch_codegen(nbits: int, histogram: bool):
    """The code of one batch of 512 items (planes[b]) against a query (its bit flips): the adder tree, then its
    histogram into ``counts``, or without ``histogram`` the XOR of the tree's planes added to counts[0]."""

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        vector = ir.VectorType(i64, LANES)
        planes_data, flips_data, counts_data = (
            context.make_array(signature.args[i])(context, builder, args[i]).data for i in (0, 2, 3))
        base = builder.mul(args[1], ir.Constant(i64, nbits * LANES))
        load, add_to = _vector_access(builder, vector)
        flipped = [builder.xor(load(planes_data, builder.add(base, ir.Constant(i64, k * LANES))),
                               load(flips_data, ir.Constant(i64, k * LANES))) for k in range(nbits)]
        sums = _adder_tree(builder, flipped)
        if histogram:
            _count_by_distance(builder, sums, nbits, counts_data, add_to)
        else:
            total = sums[0]
            for plane in sums[1:]:
                total = builder.xor(total, plane)
            add_to(counts_data, ir.Constant(i64, 0), total)
        return context.get_dummy_value()

    return codegen


def make_kernel(nbits: int, histogram: bool):
    """The bit-sliced kernel: H[q, d] += items at distance d, for every query; or, without ``histogram``, the
    adder tree only (the XOR of its planes added to counts[0], so that nothing is optimised away)."""
    codegen = _batch_codegen(nbits, histogram)

    @intrinsic
    def batch(typingctx, planes, b, flips, counts):
        return types.void(planes, b, flips, counts), codegen

    @numba.njit(nogil=True, boundscheck=False)
    def kernel(qc, planes, H, flips, counts):
        for b0 in range(0, planes.shape[0], TILE_BATCHES):
            for q in range(qc.shape[0]):
                for k in range(nbits):
                    flip = np.uint64(0) - ((qc[q, k // 64] >> np.uint64(k % 64)) & np.uint64(1))
                    for lane in range(LANES):
                        flips[k, lane] = flip
                for b in range(b0, min(b0 + TILE_BATCHES, planes.shape[0])):
                    batch(planes, b, flips, counts)
                for d in range(nbits + 1):
                    for lane in range(LANES):
                        H[q, d] += counts[d, lane]
                        counts[d, lane] = 0

    return kernel


def run_bit_sliced(kernel, qc, planes, nbits, n_db):
    """H (Q, nbits + 1) from the kernel, less the padding's all-zero codes (at distance popcount(query))."""
    H = np.zeros((len(qc), nbits + 1), dtype=np.int64)
    kernel(qc, planes, H, np.zeros((nbits, LANES), np.uint64), np.zeros((nbits + 1, LANES), np.int64))
    H[np.arange(len(qc)), np.bitwise_count(qc).sum(axis=1)] -= planes.shape[0] * 512 - n_db
    return H


def measure(codes, nbits: int, faiss_tiled, best_of) -> dict:
    """Seconds of faiss, hashdist's distance-only counts, the adder tree and the bit-sliced histogram."""
    db_bits, _, q_bits, _ = codes
    dc, qc = pack_bits(db_bits), pack_bits(q_bits)
    planes = bit_planes(dc, nbits)
    no_pairs = (np.zeros(len(qc) + 1, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    expected = histogram_block(qc, dc, nbits, "explicit", no_pairs)[:, :, 0]
    sliced, tree_only = make_kernel(nbits, histogram=True), make_kernel(nbits, histogram=False)
    if not np.array_equal(run_bit_sliced(sliced, qc, planes, nbits, len(dc)), expected):
        raise SystemExit(f"bit-sliced histogram differs from histogram_block at B = {nbits}")
    run_bit_sliced(tree_only, qc[:1], planes, nbits, len(dc))  # compile
    return {"faiss": faiss_tiled(qc, dc, best_of),
            "hashdist": best_of(lambda: histogram_block(qc, dc, nbits, "explicit", no_pairs)),
            "tree": best_of(lambda: run_bit_sliced(tree_only, qc, planes, nbits, len(dc))),
            "sliced": best_of(lambda: run_bit_sliced(sliced, qc, planes, nbits, len(dc)))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="256 x 65,536 codes instead of 1,024 x 262,144")
    a = ap.parse_args()
    n_q, n_db = (256, 65_536) if a.quick else (1_024, 262_144)
    run, fixed = _bench_module("run"), _bench_module("fixed_costs")
    import faiss

    faiss.omp_set_num_threads(1)
    m = run.machine()
    print(f"CPU: {m['cpu']}, SIMD: {' '.join(m['simd'])}, numba target {m['numba_target']}; numba {m['numba']}, "
          f"faiss-cpu {m['faiss-cpu']}; {n_q:,} x {n_db:,} clustered codes, 1 thread, thread CPU time\n")
    print("| B | faiss hammings | hashdist distance-only counts | bit-sliced: adder tree only | bit-sliced histogram |")
    print("| --- | --- | --- | --- | --- |")
    rng = np.random.default_rng(0)
    for nbits in (64, 128):
        seconds = measure(run.clustered_codes(rng, n_db, n_q, nbits), nbits, lambda *a: fixed.faiss_tiled(faiss, *a),
                          lambda fn, repeats=3: run.best_of(fn, repeats, clock=time.thread_time))
        cells = [f"{s * 1e3:.1f} ms, {n_q * n_db / s:.3g} pairs/s ({s / seconds['faiss']:.2f}x faiss)"
                 for s in seconds.values()]
        print(f"| {nbits} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
