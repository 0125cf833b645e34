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

Edges: with integer weights whose largest total D satisfies D + 1 <= G, one bin per integer
0..D (exact results); otherwise G equal bins over [0, D] (weighted, D the largest sum of a
query's weights) or [-S, S] (asymmetric, S the largest sum of |y_i| of a query). Every radius
of the run is an edge as well, so the items within a radius r are exactly the bins up to r.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from hashdist.data.bits import n_words
from hashdist.errors import InputError, check_integer

KINDS = ("hamming", "weighted", "asymmetric")


@dataclass(frozen=True, eq=False)
class DistanceAxis:
    """The bins of a non-Hamming distance, and what the kernel needs to place a distance in them.

    Distances are fixed-point integers ``e = round((d - lo) * scale)`` summed from integer byte
    tables (exact integer sums: the same in every block, order and process; with integer weights
    ``scale`` is 1 and ``e = d``). ``G`` equal bins are ``e >> shift``; a radius inside a bin splits
    it, found by comparing ``e`` with ``cuts[first_cut[u]:]`` (each bin's cuts end with a sentinel).
    ``upper``: the upper edge of every bin in distance units. ``weights``: (B,) or (Q, B) float64 for
    ``weighted``, None for ``asymmetric`` (the kernel reads the dataset's ``queries/scores``).
    """

    kind: str
    bins: int  # G, the user's (or the default) number of bins
    rule: str  # how the edges were chosen, for the report
    exact: bool  # every bin holds one distance value
    lo: float
    scale: float
    shift: int
    first_bin: np.ndarray  # int64 per equal bin u: the index of its first (possibly split) bin
    first_cut: np.ndarray  # int64 per equal bin u: where its cuts start in ``cuts``
    cuts: np.ndarray  # int64 fixed-point radii splitting bins, each bin's list ended by a sentinel
    upper: np.ndarray  # float64 upper edge of each bin
    radius_bins: dict  # radius -> the last bin inside it
    weights: np.ndarray | None
    digest: str

    @property
    def n_bins(self) -> int:
        return len(self.upper)

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
    return check_integer(bins, "--distance-bins")


_SENTINEL = np.iinfo(np.int64).max


def _axis(kind, bins, rule, exact, lo, hi, radii, weights, source_digest) -> DistanceAxis:
    """``bins`` equal bins over [lo, hi] in fixed point, split at the radii (unless exact: then bins of width 1)."""
    if exact:
        scale, shift = 1.0, 0
    else:
        shift = 61 - max(bins - 1, 1).bit_length()  # e <= bins << shift <= 2^61 over [lo, hi]
        scale = float(bins << shift) / (hi - lo) if hi > lo else 1.0
    radii = sorted({float(r) for r in radii})
    fixed_radii = [int(np.floor((r - lo) * scale)) for r in radii]
    bin_width = 1 << shift
    splits: dict[int, dict[int, float]] = {}  # equal bin -> {fixed-point cut: the radius}
    for r, e in zip(radii, fixed_radii, strict=True):
        u = min(max(e, 0) >> shift, bins - 1)
        if 0 <= e < (u + 1) * bin_width - 1:  # not already the bin's last unit
            splits.setdefault(u, {}).setdefault(e, r)
    first_bin, first_cut, cuts, upper, ends = [], [], [], [], []  # ends: each bin's last fixed-point unit
    for u in range(bins):
        first_bin.append(len(upper))
        first_cut.append(len(cuts))
        for e, r in sorted(splits.get(u, {}).items()):
            cuts.append(e)
            upper.append(r)
            ends.append(e)
        cuts.append(_SENTINEL)
        upper.append(lo + (u + 1) * bin_width / scale if not exact else float(u))
        ends.append((u + 1) * bin_width - 1)
    # radii are >= lo (refused below it), so e >= 0; one beyond every bin is in the last
    radius_bins = {r: min(int(np.searchsorted(ends, e)), len(upper) - 1)
                   for r, e in zip(radii, fixed_radii, strict=True)}
    digest = hashlib.sha256("|".join([kind, str(bins), repr(lo), repr(scale), repr(radii), source_digest]).encode())
    return DistanceAxis(kind, bins, rule, exact, float(lo), scale, shift, np.array(first_bin, dtype=np.int64),
                        np.array(first_cut, dtype=np.int64), np.array(cuts, dtype=np.int64), np.array(upper),
                        radius_bins, weights, digest.hexdigest())


def weighted_axis(weights: np.ndarray, bins: int, radii) -> DistanceAxis:
    """Weighted Hamming's axis: one bin per integer if the weights are integers and few enough, else G bins."""
    total = max(math.fsum(row) for row in np.atleast_2d(weights))
    source = hashlib.sha256(np.ascontiguousarray(weights).tobytes() + str(weights.shape).encode()).hexdigest()
    if (weights == np.round(weights)).all() and total + 1 <= bins:
        rule = f"one bin per integer distance 0..{int(total)} (integer weights)"
        return _axis("weighted", int(total) + 1, rule, True, 0.0, total, radii, weights, source)
    rule = f"{bins} equal bins over [0, {total!r}] (the largest sum of a query's weights)"
    return _axis("weighted", bins, rule, False, 0.0, total, radii, weights, source)


def asymmetric_axis(scores: np.ndarray, bins: int, radii, source_digest: str) -> DistanceAxis:
    """The asymmetric distance's axis: G equal bins over [-S, S], S the largest sum of |y_i| of a query."""
    span = max((math.fsum(row) for row in np.abs(scores.astype(np.float64))), default=0.0)
    below = [r for r in radii if r < -span]
    if below:
        raise InputError(f"--radius {below[0]}: below the smallest possible asymmetric distance -{span!r}")
    rule = f"{bins} equal bins over [-{span!r}, {span!r}] (the largest sum of |y_i| of a query)"
    return _axis("asymmetric", bins, rule, False, -span, span, radii, None, source_digest)


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


def query_tables(axis: DistanceAxis, nbits: int, q0: int, q1: int, scores: np.ndarray | None = None):
    """(tables, offsets, xor_queries) for queries [q0, q1), in fixed point:
    ``e = offset + sum over bytes of tables[byte]`` approximates ``(d - lo) * scale`` (equals d for integer weights).

    Weighted: bytes of (query XOR item), offset 0. Asymmetric: bytes of the item alone,
    ``d = sum_i y_i - 2 sum_{i set} y_i``, so the tables hold -2 y and the offset sum y.
    """
    if axis.kind == "weighted":
        w = axis.weights if axis.weights.ndim == 1 else axis.weights[q0:q1]
        tables, offsets = byte_tables(w, nbits), np.zeros(q1 - q0)
    else:
        y = np.asarray(scores, dtype=np.float64)
        tables = byte_tables(-2.0 * y, nbits)
        offsets = np.array([math.fsum(row) for row in y]) if len(y) else np.zeros(0)
    fixed_tables = np.rint(tables * axis.scale).astype(np.int64)
    fixed_offsets = np.rint((offsets - axis.lo) * axis.scale).astype(np.int64)
    return fixed_tables, fixed_offsets, axis.kind == "weighted"
