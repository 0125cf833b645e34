"""Distances other than plain Hamming, on a run-wide axis of bins (docs/metrics.md, section 4b).

- ``weighted``: ``d(q, j) = sum_i w_i [q_i != j_i]`` with per-bit weights ``w >= 0``, one vector
  for the run (B,) or one per query (Q, B) (StructHash eq. 6).
- ``asymmetric``: a real-valued query vector ``y`` against binary database codes ``b`` in
  {-1, +1}^B (a set bit is +1): ``d(y, b) = -y . b``, which orders the database as ``||y - b||^2``.

A real-valued distance is counted into bins whose upper edges ``upper`` ascend: bin ``i``
holds ``upper[i-1] < d <= upper[i]`` (bin 0 everything up to ``upper[0]``, the last bin
everything above ``upper[-2]``). The edges depend on the run's parameters only (weights or
scores, G, radii), never on a block's data, so every block uses the same axis and sums stay
exact. Items in one bin count as tied, so each order-dependent metric of the real-valued
ranking lies in its reported [worst, best]: a certified interval.

Edges. Write ``x(d) = (d - lo) * 2^k`` (``k`` = ``scale_exp``: the scale is a power of two, so
multiplying by it is exact) and ``W`` (``width``) a positive integer. Equal bin ``u`` is
``u W < x <= (u + 1) W`` (bin 0 open below, the last open above). When the distances take few
enough values - the weights, or the scores, are multiples of a power of two ``2^j <= 1`` (integers:
``2^j = 1``) and the attainable values ``base, base + step, ...`` number at most G - each value gets a
bin of its own (``W = 1``, ``lo = base - step``, ``2^k = 1 / step``; ``exact``). Otherwise G equal bins
over [0, D] (weighted, D the largest sum of a query's weights) or [-S, S] (asymmetric, S the largest
sum of |y_i| of a query), up to the integer rounding of ``W``. Every radius ``r`` of the run is an
edge as well (it splits the bin it falls in at ``x(r)``), so the items within r are exactly the
bins up to ``position(r)``; on an exact axis the radius is the last value ``<= r``.

**Monotone binning (the certificate).** The bin of an item is a function of its EXACT distance:
``bin(x)`` above, for the exact rational ``x``. So ``d(a) = d(b)`` gives one bin and
``d(a) < d(b)`` never a later bin for ``a``, whatever the codes. The kernel computes
``e = offset + sum over bytes of round(table[byte] * 2^k)`` (integers, the same in every block) and

    |e - x| <= delta_q,   delta_q = ceil(0.5 ceil(B/8) + 2^(k-48) sum_i |a_i| + offset error + 2)

for the query's table values ``a`` (the weights, or ``-2 y``). Proof: a table entry is a float sum
of at most 8 values taken in a fixed order, whose error is at most ``gamma_8 sum |a_i|`` over its
byte with ``gamma_8 = 8u / (1 - 8u) < 2^-49.99`` (u = 2^-53; Higham, recursive summation); scaling
by 2^k is exact (a tiny subnormal loss is covered by the +2); rounding to an integer adds at most
1/2 per byte; summing over bytes, each bit is in one byte, so the float terms add to at most
``2^(k-49.99) sum_i |a_i|`` (the bound uses 2^(k-48): 4x margin, which also covers the float
evaluation of the bound). The asymmetric offset ``(sum y - lo) 2^k`` is ``F 2^k`` rounded, with
``F = fsum(y, -lo)`` correctly rounded: error at most ``1/2 + 2^(k-52) |F|`` (bounded with
2^(k-50)). When every ``a_i 2^k`` is an integer and ``sum |a_i| <= 2^(52 + j)`` (every value a
multiple of ``2^j``) each partial sum is exactly representable, the tables are exact integers, and
with an exact offset (checked with fsum) ``delta_q = 0``: ``e = x``. This holds for integer and
other dyadic data (such as float32 scores of few distinct values), whatever G.

The kernel counts an item in ``bin(e)`` only if no bin edge and no radius lies within ``delta_q``
of ``e`` (then ``x``, in ``[e - delta_q, e + delta_q]``, has the same bin); it hands back the others,
the *straddlers*, and :func:`exact_bins` places them with exact integer arithmetic (every float64 is
an integer times a power of two). Either way the item lands in ``bin(x)``, so the histogram does
not depend on ``delta``, on blocks or on processes.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from hashdist.data.bits import n_words
from hashdist.errors import InputError, check_integer

KINDS = ("hamming", "weighted", "asymmetric")
MAX_BINS = 1 << 40
_FIXED_BITS = 61  # every fixed-point distance lies in about [-2^62, 2^62]
_NO_BITS = 1 << 20  # the lowest-bit exponent of zero: above every float's
CUT_SENTINEL = np.iinfo(np.int64).max


@dataclass(frozen=True, eq=False)
class DistanceAxis:
    """The bins of a non-Hamming distance, and what the kernel needs to place a distance in them.

    Fixed point: ``x = (d - lo) * 2^scale_exp``; equal bin u holds ``u W < x <= (u + 1) W``, W = ``width``
    (bin 0 open below, the last open above). A radius inside an equal bin splits it: ``cuts[first_cut[u]:]``
    are floor(x(r)) of the radii splitting bin u, ``cut_radii`` the radii themselves, each bin's list ended by
    a sentinel; ``first_bin[u]`` is the index of its first (possibly split) bin. ``upper``: the upper edge of
    every bin in distance units. ``weights``: (B,) or (Q, B) float64 for ``weighted``, None for
    ``asymmetric`` (the kernel reads the dataset's ``queries/scores``).
    """

    kind: str
    bins: int  # G, the user's (or the default) number of bins
    rule: str  # how the edges were chosen, for the report
    exact: bool  # every bin holds one distance value
    lo: float
    scale_exp: int
    width: int
    first_bin: np.ndarray  # int64 per equal bin u: the index of its first (possibly split) bin
    first_cut: np.ndarray  # int64 per equal bin u: where its cuts start in ``cuts``
    cuts: np.ndarray  # int64 floor(x(r)) of the radii splitting bins, each bin's list ended by a sentinel
    cut_radii: np.ndarray  # float64 the radius of each cut (inf for a sentinel)
    upper: np.ndarray  # float64 upper edge of each bin
    radius_bins: dict  # radius -> the last bin inside it
    weights: np.ndarray | None
    digest: str

    @property
    def n_bins(self) -> int:
        return len(self.upper)

    @property
    def n_equal(self) -> int:
        return len(self.first_bin)

    def position(self, radius: float) -> int:
        """The last bin inside radius r: bins 0..position hold exactly the items with d <= r."""
        return self.radius_bins[float(radius)]

    def summary(self) -> dict:
        """The report's account of the distance; ``upper_edges``: each bin's upper edge, the distance at which
        the per-query counts over bins (tp_at_radius, retrieved_at_radius: the PR curve, the radius figure) are
        taken."""
        return {"kind": self.kind, "bins": self.bins, "bins_used": self.n_bins, "edges_rule": self.rule,
                "exact": self.exact, "upper_edges": self.upper.tolist()}


def check_weights(weights, nbits: int, n_queries: int, name: str = "--bit-weights") -> np.ndarray:
    """Per-bit weights as float64 (B,) or (Q, B): finite and non-negative."""
    w = np.asarray(weights)
    if w.dtype.kind not in "fiub" or w.dtype == object:
        raise InputError(f"{name}: weights must be numbers, got dtype {w.dtype}")
    w = w.astype(np.float64)
    if w.ndim not in (1, 2) or w.shape[-1] != nbits or (w.ndim == 2 and w.shape[0] != n_queries):
        raise InputError(f"{name}: weights must have shape ({nbits},) or ({n_queries}, {nbits}), got {w.shape}")
    if not np.isfinite(w).all():
        raise InputError(f"{name}: weights contain NaN or infinity")
    if (w < 0).any():
        raise InputError(f"{name}: weights must be non-negative, got {w.min()}")
    return np.ascontiguousarray(w)


def check_bins(bins) -> int:
    bins = check_integer(bins, "--distance-bins")
    if bins > MAX_BINS:
        raise InputError(f"--distance-bins must be at most 2^40 = {MAX_BINS}, got {bins}")
    return bins


# ----------------------------------------------------------------------------
# exact arithmetic on floats: every float64 is an integer times a power of two
# ----------------------------------------------------------------------------


def _dyadic(v: float) -> tuple[int, int]:
    """(m, e) with v = m * 2^e exactly."""
    num, den = float(v).as_integer_ratio()  # den is a power of two
    return num, 1 - den.bit_length()


def _exact(m: int, e: int) -> Fraction:
    return Fraction(m << e) if e >= 0 else Fraction(m, 1 << -e)


def _lowest_bit_exponents(a: np.ndarray) -> np.ndarray:
    """Per row of a 2-D float64 array: the largest e with every entry a multiple of 2^e (_NO_BITS for zeros)."""
    mantissa, exponent = np.frexp(a)
    m = np.abs(np.ldexp(mantissa, 53)).astype(np.int64)  # the integer significand, exactly
    trailing = np.frexp((m & -m).astype(np.float64))[1].astype(np.int64) - 1
    low = np.where(a != 0, exponent.astype(np.int64) - 53 + trailing, _NO_BITS)
    return low.min(axis=1) if low.shape[1] else np.full(len(low), _NO_BITS)


def _unit_exponent(values: np.ndarray) -> int:
    """The largest j <= 0 such that every value is a multiple of 2^j (0 if all are zero)."""
    return min(int(_lowest_bit_exponents(np.reshape(values, (1, -1)))[0]), 0)


def _exceeds(m: int, e: int, r: float) -> bool:
    """m 2^e > r, exactly."""
    rm, re = _dyadic(r)
    base = min(e, re)
    return (m << (e - base)) > (rm << (re - base))


# ----------------------------------------------------------------------------
# the axis
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Grid:
    """x = (d - lo) 2^k; n equal bins of width W in x; lattice: one attainable value per bin (at x = u + 1)."""

    lo: float
    k: int
    width: int
    n: int
    lattice: bool

    def x(self, d: float) -> Fraction:
        return (Fraction(d) - Fraction(self.lo)) * _exact(1, self.k)

    def upper(self, u: int) -> float:
        return self.lo + math.ldexp(float((u + 1) * self.width), -self.k)


def _radius_places(grid: _Grid, radii, beyond) -> tuple[dict, dict]:
    """({equal bin: [(cut, r), ...]}, {r: (equal bin, True if r splits it)}); ``beyond(r)``: r >= every distance."""
    splits: dict[int, list] = {}
    where: dict[float, tuple[int, bool]] = {}
    for r in radii:
        x = grid.x(r)
        if grid.lattice:  # the values are at x = 1..n: the last one <= r
            where[r] = (min(max(math.floor(x) - 1, 0), grid.n - 1), False)
            continue
        u = min(max(math.ceil(x / grid.width) - 1, 0), grid.n - 1)
        if (u < grid.n - 1 and x == (u + 1) * grid.width) or (u == grid.n - 1 and beyond(r)):
            where[r] = (u, False)  # on the bin's upper edge, or above every distance
        else:
            splits.setdefault(u, []).append((math.floor(x), r))
            where[r] = (u, True)
    return splits, where


def _axis(kind, bins, rule, grid: _Grid, radii, beyond, weights, source_digest) -> DistanceAxis:
    """The axis of ``grid``'s equal bins, split at the radii."""
    radii = sorted({float(r) for r in radii})
    splits, where = _radius_places(grid, radii, beyond)
    first_bin, first_cut, cuts, cut_radii, upper = [], [], [], [], []
    split_bin, last_bin = {}, []
    for u in range(grid.n):
        first_bin.append(len(upper))
        first_cut.append(len(cuts))
        for cut, r in sorted(splits.get(u, [])):
            split_bin[r] = len(upper)
            cuts.append(cut)
            cut_radii.append(r)
            upper.append(r)
        cuts.append(CUT_SENTINEL)
        cut_radii.append(math.inf)
        upper.append(grid.upper(u))
        last_bin.append(len(upper) - 1)
    radius_bins = {r: split_bin[r] if splits_it else last_bin[u] for r, (u, splits_it) in where.items()}
    digest = hashlib.sha256("|".join([kind, str(bins), repr(grid), repr(radii), source_digest]).encode())
    return DistanceAxis(kind, bins, rule, grid.lattice, float(grid.lo), grid.k, grid.width,
                        np.array(first_bin, dtype=np.int64), np.array(first_cut, dtype=np.int64),
                        np.array(cuts, dtype=np.int64), np.array(cut_radii), np.array(upper), radius_bins, weights,
                        digest.hexdigest())


def _equal_grid(lo: float, hi: float, bins: int) -> _Grid:
    """G equal bins over [lo, hi]: 2^k the power of two with (hi - lo) 2^k in (2^60, 2^61], W = ceil of 1/G of it."""
    span = hi - lo
    if not (math.isfinite(span) and span > 0):
        raise InputError(f"distances over [{lo!r}, {hi!r}]: too large to bin")
    k = _FIXED_BITS - math.frexp(span)[1]
    top = int(math.ldexp(span, k))  # an integer: a float's 53-bit significand shifted up
    return _Grid(lo, k, -(-top // bins), bins, False)


def _lattice_grid(base: float, step_exp: int, n: int) -> _Grid:
    """One bin per value base + u 2^step_exp, u = 0..n-1: x = u + 1, W = 1."""
    return _Grid(base - math.ldexp(1.0, step_exp), -step_exp, 1, n, True)


def _largest_total(rows: np.ndarray, r: float) -> bool:
    """r >= every row's exact sum (fsum rounds correctly, so the sign of r - sum is exact)."""
    return all(math.fsum([r, *(-row).tolist()]) >= 0 for row in rows)


def _beyond(rows: np.ndarray, hi: float):
    """r >= the largest exact row sum, hi its float rounding: decided by hi unless r == hi."""
    return lambda r: r > hi or (r == hi and _largest_total(rows, r))


def _unit_totals(rows: np.ndarray, j: int) -> np.ndarray:
    """Exact row sums in units of 2^j of non-negative multiples of 2^j (the caller keeps them below 2^53)."""
    return np.ldexp(rows, -j).astype(np.int64).sum(axis=1) if rows.size else np.zeros(len(rows), np.int64)


def _weight_lattice(rows: np.ndarray, total: float, bins: int) -> tuple[int, int] | None:
    """(unit exponent j, number of values) when the weights are multiples of 2^j <= 1 (integers: j = 0) and
    their largest per-query sum D takes D / 2^j + 1 <= G values."""
    j = _unit_exponent(rows)
    if math.ldexp(total, -j) + 1 > bins:
        return None
    values = int(_unit_totals(rows, j).max()) + 1
    return (j, values) if values <= bins else None


def weighted_axis(weights: np.ndarray, bins: int, radii) -> DistanceAxis:
    """Weighted Hamming's axis: one bin per attainable value if the weights are multiples of 2^j <= 1 (integers:
    j = 0) and few enough, else G equal bins over [0, D]."""
    rows = np.atleast_2d(weights)
    total = max(math.fsum(row) for row in rows)
    source = hashlib.sha256(np.ascontiguousarray(weights).tobytes() + str(weights.shape).encode()).hexdigest()
    lattice = _weight_lattice(rows, total, bins)
    if lattice is not None:
        j, values = lattice
        rule = (f"one bin per integer distance 0..{int(total)} (integer weights)" if j == 0 else
                f"one bin per multiple of {math.ldexp(1.0, j)!r} in 0..{total!r} (weights multiples of it)")
        return _axis("weighted", values, rule, _lattice_grid(0.0, j, values), radii, None, weights, source)
    rule = f"{bins} equal bins over [0, {total!r}] (the largest sum of a query's weights)"
    return _axis("weighted", bins, rule, _equal_grid(0.0, total, bins), radii, _beyond(rows, total), weights,
                 source)


def _score_lattice(scores: np.ndarray, span: float, bins: int) -> tuple[int, int] | None:
    """(step exponent, number of values) when the asymmetric distances take at most G values: scores multiples
    of 2^j <= 1, so d = sum_i +-y_i is a multiple of 2^j in [-S, S], of step 2^(j+1) when every query's sum of
    |y_i| has the parity of S (in units of 2^j) - d changes by 2|y_i| when bit i flips."""
    j = _unit_exponent(scores)
    if math.ldexp(span, -j) + 1 > bins:
        return None
    totals = _unit_totals(np.abs(scores), j)
    largest = int(totals.max()) if len(totals) else 0
    step = 2 if ((largest - totals) % 2 == 0).all() else 1
    values = 2 * largest // step + 1
    return (j + (step == 2), values) if values <= bins else None


def asymmetric_axis(scores: np.ndarray, bins: int, radii, source_digest: str) -> DistanceAxis:
    """The asymmetric distance's axis: one bin per attainable value if the scores are multiples of 2^j <= 1
    (integers: j = 0) and the values few enough, else G equal bins over [-S, S], S the largest sum of |y_i|."""
    scores = np.asarray(scores, dtype=np.float64)
    magnitudes = np.abs(scores)
    span = max((math.fsum(row) for row in magnitudes), default=0.0)
    below = [r for r in radii if r < -span]
    if below:
        raise InputError(f"--radius {below[0]}: below the smallest possible asymmetric distance -{span!r}")
    lattice = _score_lattice(scores, span, bins)
    if lattice is not None:
        step_exp, values = lattice
        rule = (f"one bin per attainable distance -{span!r}..{span!r} in steps of {math.ldexp(1.0, step_exp)!r} "
                f"(scores multiples of {math.ldexp(1.0, _unit_exponent(scores))!r})")
        return _axis("asymmetric", values, rule, _lattice_grid(-span, step_exp, values), radii, None, None,
                     source_digest)
    rule = f"{bins} equal bins over [-{span!r}, {span!r}] (the largest sum of |y_i| of a query)"
    return _axis("asymmetric", bins, rule, _equal_grid(-span, span, bins), radii, _beyond(magnitudes, span), None,
                 source_digest)


# ----------------------------------------------------------------------------
# fixed point for the kernel, and its error bound
# ----------------------------------------------------------------------------


def byte_tables(values: np.ndarray, nbits: int) -> np.ndarray:
    """(R, 8W, 256) float64: entry [r, k, v] sums ``values[r, 8k + b]`` over the set bits b of byte v.

    Byte k of a code is bits 8k..8k+7 (bit i is bit i % 64 of word i // 64, little-endian).
    Summed bit by bit in a fixed order, so every process builds identical tables.
    """
    values = np.atleast_2d(np.asarray(values, dtype=np.float64))
    padded = np.zeros((values.shape[0], n_words(nbits) * 64))
    padded[:, :nbits] = values
    per_byte = padded.reshape(values.shape[0], -1, 8)
    bits = (np.arange(256)[:, None] >> np.arange(8)) & 1  # (256, 8)
    tables = np.zeros((values.shape[0], per_byte.shape[1], 256))
    for b in range(8):
        tables += np.where(bits[:, b][None, None, :] == 1, per_byte[:, :, b : b + 1], 0.0)
    return tables


def _table_errors(a: np.ndarray, k: int, nbits: int) -> np.ndarray:
    """Per row of table values ``a``: a bound on |sum over bytes of round(table * 2^k) - exact|, 0 when exact
    (every a_i 2^k an integer and every partial sum representable); see the module's docstring."""
    absum = np.abs(a).sum(axis=1)
    low = _lowest_bit_exponents(a)
    exact = (low + k >= 0) & (absum <= np.ldexp(1.0, (np.minimum(low, 960) + 52).astype(np.int32)))
    bound = 0.5 * ((nbits + 7) // 8) + np.ldexp(absum, k - 48) + 2.0
    return np.where(exact, 0.0, bound)


def _offsets(axis: DistanceAxis, y: np.ndarray | None, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(fixed-point offsets, their error bounds): round((sum y - lo) 2^k) (asymmetric) or -lo 2^k (weighted)."""
    if y is None:
        fixed = math.ldexp(-axis.lo, axis.scale_exp)  # 0, or 1 on a lattice: exact
        return np.full(n, int(fixed), dtype=np.int64), np.zeros(n)
    fixed, errors = np.zeros(n, dtype=np.int64), np.zeros(n)
    for q, row in enumerate(y.tolist()):
        total = math.fsum([*row, -axis.lo])
        scaled = math.ldexp(total, axis.scale_exp)
        fixed[q] = round(scaled)
        if math.fsum([*row, -axis.lo, -total]) != 0 or scaled != fixed[q]:
            errors[q] = 0.5 + math.ldexp(abs(total), axis.scale_exp - 50) + 1.0
    return fixed, errors


def query_tables(axis: DistanceAxis, nbits: int, q0: int, q1: int, scores: np.ndarray | None = None):
    """(tables, offsets, deltas, xor_queries) for queries [q0, q1), in fixed point:
    ``e = offset + sum over bytes of tables[byte]`` is within ``deltas[q]`` of ``x = (d - lo) 2^k``
    (equal to it when ``deltas[q]`` is 0; see the module's docstring).

    Weighted: bytes of (query XOR item), offset -lo 2^k. Asymmetric: bytes of the item alone,
    ``d = sum_i y_i - 2 sum_{i set} y_i``, so the tables hold -2 y and the offset (sum y - lo) 2^k.
    """
    if axis.kind == "weighted":
        a = np.atleast_2d(axis.weights if axis.weights.ndim == 1 else axis.weights[q0:q1])
        y = None
    else:
        y = np.asarray(scores, dtype=np.float64)
        a = -2.0 * y
    fixed_tables = np.rint(np.ldexp(byte_tables(a, nbits), axis.scale_exp)).astype(np.int64)
    offsets, offset_errors = _offsets(axis, y, q1 - q0)
    deltas = np.ceil(np.broadcast_to(_table_errors(a, axis.scale_exp, nbits), (q1 - q0,)) + offset_errors)
    if len(deltas) and 4 * deltas.max() >= axis.width:
        raise InputError(f"--distance-bins {axis.bins}: too many bins for this distance's fixed point")
    return fixed_tables, offsets, deltas.astype(np.int64), axis.kind == "weighted"


# ----------------------------------------------------------------------------
# exact placement
# ----------------------------------------------------------------------------


def _dot(mask: np.ndarray, values: list[int]) -> np.ndarray:
    """mask (m, B) times integers, exactly: int64 when the sum cannot overflow, else Python integers."""
    if sum(abs(v) for v in values) < 1 << 62:
        return (mask.astype(np.int64) @ np.array(values, dtype=np.int64)).astype(object)
    return mask.astype(object) @ np.array(values, dtype=object)


def _sub_bin(axis: DistanceAxis, u: int, m: int, e: int) -> int:
    """The bin of an item of equal bin u at distance m 2^e: past the radii of that bin below it."""
    i, c = int(axis.first_bin[u]), int(axis.first_cut[u])
    while axis.cuts[c] != CUT_SENTINEL and _exceeds(m, e, float(axis.cut_radii[c])):
        i, c = i + 1, c + 1
    return i


def exact_bins(axis: DistanceAxis, values: np.ndarray, query_bits: np.ndarray, db_bits: np.ndarray) -> np.ndarray:
    """The bins of one query's items computed exactly (the kernel's straddlers): ``values`` the query's weights
    or scores (B,), ``query_bits`` its code (B,) and ``db_bits`` the items' codes (m, B), as 0/1.

    Each value is m_i 2^e_i, so d = N 2^E with E the smallest e_i and N an integer; x / W is then an integer
    times a power of two over W, and the bin ``ceil(x / W) - 1`` (clamped) an integer division."""
    parts = [_dyadic(v) for v in np.asarray(values, dtype=np.float64).tolist()]
    e = min((p[1] for p in parts), default=0)
    scaled = [m << (pe - e) for m, pe in parts]
    if axis.kind == "weighted":
        n = _dot(db_bits != query_bits[None, :], scaled)
    else:
        n = sum(scaled) - 2 * _dot(db_bits == 1, scaled)
    lo_m, lo_e = _dyadic(axis.lo)
    base = min(e, lo_e)
    m = n * (1 << (e - base)) - (lo_m << (lo_e - base))  # (d - lo) = m 2^base
    p = base + axis.scale_exp
    num, den = (m * (1 << p), axis.width) if p >= 0 else (m, axis.width << -p)
    equal = [min(max(-((-v) // den) - 1, 0), axis.n_equal - 1) for v in num.tolist()]
    return np.array([_sub_bin(axis, u, v, e) for u, v in zip(equal, n.tolist(), strict=True)], dtype=np.int64)
