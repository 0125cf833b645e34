"""Distinct database codes with their counts, and mLGAP's ``M_k`` from them.

``M_k`` for a query is the largest number of database items sharing one code among
the codes within Hamming distance k of the query. Code counts are a mergeable
state (sum per code across chunks). They are split into parts by a hash of the code,
so every item of a code lands in the same part and no process needs all distinct
codes: ``M_k`` is the maximum over parts of each part's largest count within the
ball (a max is mergeable). Per part it is found either by enumerating the Hamming
ball and looking each code up in a hash table, or by scanning the distinct codes,
whichever is cheaper.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from hashdist.data.bits import ball_volumes
from hashdist.kernels import cached_njit
from hashdist.kernels.popcount import hamming


def code_counts(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct code rows (sorted lexicographically by word) and how many rows have each."""
    codes = np.ascontiguousarray(codes, dtype=np.uint64)
    if codes.shape[0] == 0:
        return codes.reshape(0, codes.shape[1]), np.zeros(0, dtype=np.int64)
    if codes.shape[1] == 1:
        unique, counts = np.unique(codes[:, 0], return_counts=True)
        return unique.reshape(-1, 1), counts.astype(np.int64)
    unique, counts = np.unique(codes, axis=0, return_counts=True)
    return np.ascontiguousarray(unique), counts.astype(np.int64)


def split_by_code_hash(codes: np.ndarray, counts: np.ndarray | None, parts: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Code rows (with their counts, if any) split into ``parts`` pieces by a hash of the code: a code's part
    never depends on the chunk it came from. Each piece keeps the rows' order."""
    codes = np.ascontiguousarray(codes, dtype=np.uint64)
    if parts == 1:
        return [(codes, counts)]
    part = code_parts_of(codes, parts)
    order = np.argsort(part.astype(np.uint16) if parts <= 1 << 16 else part, kind="stable")  # radix: 16 bits
    bounds = np.concatenate([[0], np.cumsum(np.bincount(part, minlength=parts))])
    return [(codes[order[a:b]], None if counts is None else counts[order[a:b]])
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def rows_in_parts(codes: np.ndarray, parts: int, start: int, stop: int) -> np.ndarray:
    """The code rows whose part (as :func:`split_by_code_hash` assigns it) is in [start, stop), in row order:
    one pass of code counting takes its rows without sorting the others. A range of every part takes every row,
    without hashing them."""
    codes = np.ascontiguousarray(codes, dtype=np.uint64)
    if start <= 0 and stop >= parts:
        return codes
    part = code_parts_of(codes, parts)
    return codes[(part >= start) & (part < stop)]


# the splitmix64 finaliser chained over a code's words: the hash tables' slots take its lower bits (_mix, jitted),
# the code parts its upper 32 bits (code_parts_of, numpy: nothing for a first run to compile)
MIX_SEED, MIX_M1, MIX_M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def code_parts_of(codes: np.ndarray, parts: int) -> np.ndarray:
    """Each code row's part, 0..parts-1: the upper 32 bits of the code's hash scaled to ``parts``, so a part's
    codes still fill its hash table (which uses the lower bits) evenly."""
    codes = np.ascontiguousarray(codes, dtype=np.uint64)
    h = np.full(codes.shape[0], MIX_SEED, dtype=np.uint64)
    for w in range(codes.shape[1]):  # uint64 arithmetic wraps, as the jitted _mix's
        x = codes[:, w] ^ h
        x = (x ^ (x >> np.uint64(30))) * np.uint64(MIX_M1)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(MIX_M2)
        h = x ^ (x >> np.uint64(31))
    return (((h >> np.uint64(32)) * np.uint64(parts)) >> np.uint64(32)).astype(np.int64)


def merge_code_counts(pieces) -> tuple[np.ndarray, np.ndarray]:
    """Sum the (codes, counts) pieces of several chunks (exact, order-independent result: codes sorted by
    word); ``pieces`` is not empty."""
    pieces = list(pieces)
    codes = np.concatenate([p[0] for p in pieces])
    counts = np.concatenate([p[1] for p in pieces]).astype(np.int64, copy=False)
    if codes.shape[0] == 0:
        return codes, counts
    order = np.lexsort(codes.T[::-1])  # first word most significant, as np.unique(axis=0)
    codes = codes[order]
    starts = np.flatnonzero(np.concatenate([[True], (codes[1:] != codes[:-1]).any(axis=1)]))
    return np.ascontiguousarray(codes[starts]), np.add.reduceat(counts[order], starts)


# -- hash table over code rows (open addressing, linear probing) ---------------


@njit(nogil=True, inline="always")
def _mix(codes_row):
    h = np.uint64(MIX_SEED)
    for w in range(codes_row.shape[0]):
        x = codes_row[w] ^ h
        x = (x ^ (x >> np.uint64(30))) * np.uint64(MIX_M1)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(MIX_M2)
        h = x ^ (x >> np.uint64(31))
    return h


@cached_njit(nogil=True)
def _build_table(codes, slots):
    """Insert every code's row number into ``slots`` (all -1, a power of two long)."""
    mask = np.uint64(slots.shape[0] - 1)
    for i in range(codes.shape[0]):
        s = _mix(codes[i]) & mask
        while slots[s] >= 0:
            s = (s + np.uint64(1)) & mask
        slots[s] = i


@njit(nogil=True, inline="always")
def _lookup(slots, codes, key):
    mask = np.uint64(slots.shape[0] - 1)
    s = _mix(key) & mask
    while slots[s] >= 0:
        i = slots[s]
        same = True
        for w in range(key.shape[0]):
            if codes[i, w] != key[w]:
                same = False
                break
        if same:
            return i
        s = (s + np.uint64(1)) & mask
    return -1


@njit(nogil=True, inline="always")
def _flip_bits(key, queries, q, pos, k):
    """key = query q's code with the bits pos[0], ..., pos[k - 1] flipped."""
    for w in range(key.shape[0]):  # not key[:] = queries[q]: its shape check compiles slowly
        key[w] = queries[q, w]
    for i in range(k):
        key[pos[i] >> 6] ^= np.uint64(1) << np.uint64(pos[i] & 63)


@njit(nogil=True, inline="always")
def _next_subset(pos, k, nbits):
    """Advance pos[0] < ... < pos[k - 1] to the next k-subset of range(nbits) (lexicographic order); False after
    the last one."""
    i = k - 1
    while i >= 0 and pos[i] == nbits - k + i:
        i -= 1
    if i < 0:
        return False
    pos[i] += 1
    for m in range(i + 1, k):
        pos[m] = pos[m - 1] + 1
    return True


@cached_njit(nogil=True)
def _max_count_by_ball(queries, codes, counts, slots, nbits, radius, shells, cmax, out, key, pos):
    """out[q, k] = M_k. Shell k (the codes at distance exactly k) is enumerated, flipping every
    k-subset of bits, only when its item count ``shells[q, k]`` (-1: unknown) could raise M.
    ``key`` (a code row) and ``pos`` (radius entries) are work arrays."""
    for q in range(queries.shape[0]):
        best = 0
        for k in range(radius + 1):
            shell = shells[q, k]
            if shell == 1 and best == 0:
                best = 1
            elif (shell < 0 or shell > best) and best < cmax:
                ceiling = cmax if shell < 0 else min(shell, cmax)  # no bucket in the shell holds more
                # iterate over all k-subsets pos[0] < ... < pos[k-1] of range(nbits)
                for i in range(k):
                    pos[i] = i
                while best < ceiling:
                    _flip_bits(key, queries, q, pos, k)
                    found = _lookup(slots, codes, key)
                    if found >= 0 and counts[found] > best:
                        best = counts[found]
                    if not _next_subset(pos, k, nbits):
                        break
            out[q, k] = best


@cached_njit(nogil=True)
def _max_count_by_scan(queries, codes, counts, radius, shells, cmax, out, exact):
    """out[q, k] = M_k, scanning the distinct codes for queries with a shell of >= 2 (or -1: unknown) items.
    ``exact`` (radius + 1 entries) is a work array."""
    for q in range(queries.shape[0]):
        scan = False
        for k in range(radius + 1):
            shell = shells[q, k]
            exact[k] = min(shell, 1) if shell >= 0 else 0
            scan |= shell < 0 or (shell > 1 and cmax > 1)
        if scan:
            for u in range(codes.shape[0]):
                d = hamming(queries[q], codes[u])
                if d <= radius and counts[u] > exact[d]:
                    exact[d] = counts[u]
        best = 0
        for k in range(radius + 1):
            best = max(best, exact[k])
            out[q, k] = best


def ball_lookup_table(codes: np.ndarray, nbits: int, radius: int) -> np.ndarray | None:
    """Hash-table slots over the distinct codes when enumerating Hamming balls is cheaper than
    scanning them (each ball code costs a few word operations, a scan one distance per code);
    ``None`` means scan. Build it once per run and pass it to :func:`max_bucket_within`."""
    codes = np.ascontiguousarray(codes, dtype=np.uint64)
    if not len(codes) or 4 * ball_volumes(nbits, min(radius, nbits))[-1] >= len(codes):
        return None
    slots = np.full(1 << int(2 * len(codes) - 1).bit_length(), -1, dtype=np.int64)
    _build_table(codes, slots)
    return slots


def max_bucket_within(
    queries: np.ndarray, codes: np.ndarray, counts: np.ndarray, nbits: int, radius: int, slots="auto",
    shell_counts: np.ndarray | None = None,
) -> np.ndarray:
    """M_k for k = 0..radius: (Q, radius + 1) int64, 0 where the ball holds no database item.

    ``slots`` from :func:`ball_lookup_table` (default: built here) selects ball enumeration;
    ``None`` scans the distinct codes. ``shell_counts[q, k]``, the number of database items at
    distance exactly k (from the histogram), lets most queries skip the search: a shell of
    0 or 1 items, or of no more items than M_{k-1}, cannot raise M_k beyond what it already is.
    """
    queries = np.ascontiguousarray(queries, dtype=np.uint64)
    codes = np.ascontiguousarray(codes, dtype=np.uint64)
    counts = np.ascontiguousarray(counts, dtype=np.int64)
    radius = min(radius, nbits)
    if isinstance(slots, str):
        slots = ball_lookup_table(codes, nbits, radius)
    if shell_counts is None:
        shells = np.full((queries.shape[0], radius + 1), -1 if len(codes) else 0, dtype=np.int64)
    else:
        shells = np.ascontiguousarray(shell_counts[:, : radius + 1], dtype=np.int64)
    cmax = int(counts.max()) if len(counts) else 0
    out = np.zeros((queries.shape[0], radius + 1), dtype=np.int64)
    if slots is not None:
        key, pos = np.empty(queries.shape[1], dtype=np.uint64), np.empty(max(radius, 1), dtype=np.int64)
        _max_count_by_ball(queries, codes, counts, slots, nbits, radius, shells, cmax, out, key, pos)
    else:
        _max_count_by_scan(queries, codes, counts, radius, shells, cmax, out, np.empty(radius + 1, dtype=np.int64))
    return out
