"""Order-dependent metrics of the Hamming ranking, exact under ties (docs/metrics.md, sections 2 and 4).

Every function takes the histogram ``H[q, d, g]`` (Q, B+1, G+1) and returns one
value per query, NaN where the query has nothing to measure (no relevant item,
or for AUC no irrelevant one). ``policy`` is how items tied at one distance are
ordered: ``expected`` (the exact mean over all orders), ``best`` (higher grade
first) or ``worst`` (higher grade last): the largest and smallest value over all
tie orders. For AP@K with the ``retrieved`` normaliser those two orders are not
the extremes, and its bounds are found as docs/metrics.md section 4 says. Grade
>= 1 is relevant; NDCG's gain is ``2^g - 1``.

The loops over queries are cached jitted functions; helpers shared by several are
:func:`hashdist.kernels.jit_helper`, small single-use ones inlined, so that each is
compiled once per process.
"""

from __future__ import annotations

import contextlib
import math
import threading

import numpy as np
from numba import njit

from hashdist.kernels import cached_njit, jit_helper
from hashdist.metrics.harmonic import harmonic_diff, tie_sum

POLICIES = ("expected", "best", "worst")
AP_AT_K_NORMALISERS = ("retrieved", "min_k_r", "total")
_EXPECTED, _BEST, _WORST = 0, 1, 2
_RETRIEVED, _MIN_K_R, _TOTAL = 0, 1, 2


def _policy(policy: str) -> int:
    if policy not in POLICIES:
        raise ValueError(f"tie policy must be one of {POLICIES}, got {policy!r}")
    return POLICIES.index(policy)


def _check_k(k) -> int:
    if int(k) != k or k < 1:
        raise ValueError(f"K must be a positive integer, got {k!r}")
    return int(k)


def effective_k(k, n_all) -> int:
    """K for the kernels: a K beyond the largest list (``n_all``: each query's item count, an array or a number)
    is that list's length, since the whole list is then used (docs/metrics.md, section 4: K > Nall behaves as
    K = Nall). Nothing is ever sized by K."""
    return max(1, min(_check_k(k), int(np.max(n_all, initial=0))))


def as_histogram(H) -> np.ndarray:
    """``H`` as contiguous int64 counts of shape (Q, B+1, G+1); a ValueError naming the shape otherwise."""
    H = np.ascontiguousarray(H, dtype=np.int64)
    if H.ndim != 3 or H.shape[1] < 1 or H.shape[2] < 2:
        raise ValueError(f"H must be counts of shape (queries, distances B+1, grades G+1 >= 2), got shape {H.shape}")
    return H


_shared = threading.local()


@contextlib.contextmanager
def counts_shared(H: np.ndarray):
    """Within the block, :func:`group_counts` and :func:`group_totals` of this very array are computed once
    (per thread).

    The summary computes dozens of measures of one histogram; the array must not change meanwhile.
    """
    previous = getattr(_shared, "entry", None)
    n, r = _group_counts(as_histogram(H))
    _shared.entry = (H, (n, r), (n.sum(axis=1), r.sum(axis=1)))
    try:
        yield
    finally:
        _shared.entry = previous


def _shared_entry(H: np.ndarray):
    entry = getattr(_shared, "entry", None)
    return entry if entry is not None and entry[0] is H else None


def group_counts(H: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Items n[q, d] and relevant items r[q, d] at each distance."""
    entry = _shared_entry(H)
    return entry[1] if entry else _group_counts(as_histogram(H))


def group_totals(H: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Items and relevant items R of each query: n and r of :func:`group_counts` summed over distances."""
    entry = _shared_entry(H)
    if entry:
        return entry[2]
    n, r = group_counts(H)
    return n.sum(axis=1), r.sum(axis=1)


def _group_counts(H):
    r = np.zeros(H.shape[:2], dtype=np.int64)
    for g in range(1, H.shape[2]):  # faster than H[:, :, 1:].sum(axis=2), and nothing to compile
        r += H[:, :, g]
    return r + H[:, :, 0], r


# -- AP ------------------------------------------------------------------------


@jit_helper
def _group_precision_sum(policy, N, n, r, Rp, t):
    """Sum of precisions at the relevant items among the first t slots of a group.

    The group has n items, r relevant, after N items of which Rp are relevant.
    For the expected policy t may be any 0..n; best/worst count the relevant
    items that fall inside the first t slots of their fixed order.
    """
    if r == 0 or t == 0:
        return 0.0
    if policy == _EXPECTED:
        a = (r - 1) / (n - 1) if n > 1 else 0.0
        return (r / n) * ((Rp + 1) * harmonic_diff(N, N + t) + a * tie_sum(N, t))
    if policy == _BEST:
        k = min(r, t)
        return k + (Rp - N) * harmonic_diff(N, N + k)
    M = N + n - r  # worst: the r relevant items occupy the last r slots
    k = min(r, max(0, N + t - M))
    return k + (Rp - M) * harmonic_diff(M, M + k)


@njit(inline="always")
def _relevant_in_slots(policy, n, r, t):
    """Relevant items among the first t slots of a group of n items with r relevant."""
    if policy == _EXPECTED:
        return t * r / n if n else 0.0
    if policy == _BEST:
        return float(min(r, t))
    return float(max(0, t - (n - r)))


def average_precision(H, policy: str = "expected") -> np.ndarray:
    """AP over the full Hamming ranking; NaN where the query has no relevant item."""
    n, r = group_counts(H)
    out = np.empty(n.shape[0])
    _ap_at_radius(n, r, n.shape[1] - 1, _policy(policy), out)  # the radius B keeps every item
    return out


@njit(inline="always")
def _boundary(n_q, K):
    """(group b holding rank K, items before it, slots of it inside the top K); b = -1 if K >= Nall."""
    N = 0
    for d in range(n_q.shape[0]):
        if N + n_q[d] >= K:
            return d, N, K - N
        N += n_q[d]
    return -1, N, 0


@njit(inline="always")
def _hypergeometric_mean(N, n, r, Rp, m, S):
    """E[(S + s(X)) / (Rp + X)] for X ~ Hypergeometric(n, r, m) relevant in the first m slots.

    Given X = x the m slots are a group of size m holding x relevant, so
    s(x) is its expected precision sum. Weights come from the ratio recurrence
    started at the mode and normalised, stopping where they fall below 1e-18.
    """
    lo, hi = max(0, m - (n - r)), min(r, m)
    mode = min(max((m + 1) * (r + 1) // (n + 2), lo), hi)
    total_w = 0.0
    total = 0.0
    dH = harmonic_diff(N, N + m)
    T = tie_sum(N, m)
    for direction in (1, -1):
        x = mode if direction == 1 else mode - 1
        w = 1.0
        if direction == -1 and x >= lo:  # w(mode - 1) from w(mode) = 1
            w = mode * (n - r - m + mode) / ((r - mode + 1) * (m - mode + 1))
        while lo <= x <= hi and w > 1e-18:
            if Rp + x > 0:
                a = (x - 1) / (m - 1) if m > 1 else 0.0
                s = (x / m) * ((Rp + 1) * dH + a * T) if x > 0 else 0.0
                total += w * (S + s) / (Rp + x)
            total_w += w
            if direction == 1:
                w *= (r - x) * (m - x) / ((x + 1) * (n - r - m + x + 1))
            else:
                w *= x * (n - r - m + x) / ((r - x + 1) * (m - x + 1))
            x += direction
    return total / total_w


@njit(inline="always")
def _retrieved_extreme(policy, N, n, r, Rp, m, S):
    """Largest (best) or smallest (worst) AP@K 'retrieved' over the tie orders (docs/metrics.md, section 4).

    For x relevant items in the m boundary slots the normaliser Rp + x is fixed, so the value is
    extreme with the earlier groups' relevant items first (best, S) or last (worst, S) and the x
    boundary items in the first (best) or last (worst) x slots; then the max or min over feasible x.
    """
    lo, hi = max(0, m - (n - r)), min(r, m)
    extreme = -1.0 if policy == _BEST else 2.0
    for x in range(lo, hi + 1):
        value = (S + _group_precision_sum(policy, N, m, x, Rp, m)) / (Rp + x) if Rp + x > 0 else 0.0
        extreme = max(extreme, value) if policy == _BEST else min(extreme, value)
    return extreme


@cached_njit(nogil=True)
def _ap_at_k(n, r, K, normaliser, policy, out):
    for q in range(n.shape[0]):
        R = 0
        for d in range(r.shape[1]):  # not r[q].sum(): one overload less to compile
            R += r[q, d]
        if R == 0:
            out[q] = np.nan
            continue
        b, Nb, m = _boundary(n[q], K)
        S = 0.0
        N = 0
        Rp = 0
        last = b if b >= 0 else n.shape[1]
        for d in range(last):
            S += _group_precision_sum(policy, N, n[q, d], r[q, d], Rp, n[q, d])
            N += n[q, d]
            Rp += r[q, d]
        if b < 0:
            out[q] = S / R
            continue
        if normaliser == _RETRIEVED:
            if policy == _EXPECTED:
                out[q] = _hypergeometric_mean(Nb, n[q, b], r[q, b], Rp, m, S)
            else:
                out[q] = _retrieved_extreme(policy, Nb, n[q, b], r[q, b], Rp, m, S)
            continue
        S += _group_precision_sum(policy, Nb, n[q, b], r[q, b], Rp, m)
        if normaliser == _MIN_K_R:
            out[q] = S / min(K, R)
        else:
            out[q] = S / R


def average_precision_at_k(H, k, normaliser: str = "retrieved", policy: str = "expected") -> np.ndarray:
    """AP@K: precisions at relevant items in the top K over the chosen normaliser (docs/metrics.md, section 4).

    ``retrieved``: relevant items in the top K (0 when none); ``min_k_r``: min(K, R);
    ``total``: R. NaN where the query has no relevant item.
    """
    if normaliser not in AP_AT_K_NORMALISERS:
        raise ValueError(f"AP@K normaliser must be one of {AP_AT_K_NORMALISERS}, got {normaliser!r}")
    n, r = group_counts(H)
    out = np.empty(n.shape[0])
    _ap_at_k(n, r, effective_k(k, group_totals(H)[0]), AP_AT_K_NORMALISERS.index(normaliser), _policy(policy), out)
    return out


# -- P@K, R@K ------------------------------------------------------------------


@cached_njit(nogil=True)
def _hits_at_k(n, r, K, policy, out):
    for q in range(n.shape[0]):
        b, Nb, m = _boundary(n[q], K)
        last = b if b >= 0 else n.shape[1]
        hits = 0.0
        for d in range(last):
            hits += r[q, d]
        if b >= 0:
            hits += _relevant_in_slots(policy, n[q, b], r[q, b], m)
        out[q] = hits


def _hits(H, k, policy):
    n, r = group_counts(H)
    out = np.empty(n.shape[0])
    _hits_at_k(n, r, effective_k(k, group_totals(H)[0]), _policy(policy), out)
    return out


def precision_at_k(H, k, policy: str = "expected") -> np.ndarray:
    """Relevant items in the top K divided by K; a K beyond the query's Nall items is Nall (P@Nall = R/Nall)."""
    n_all = group_totals(H)[0]
    return _hits(H, k, policy) / np.minimum(effective_k(k, n_all), np.maximum(n_all, 1))


def recall_at_k(H, k, policy: str = "expected") -> np.ndarray:
    """Relevant items in the top K divided by R; NaN where R = 0."""
    hits, R = _hits(H, k, policy), group_totals(H)[1]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(R > 0, hits / np.maximum(R, 1), np.nan)



def cutoff_grid(ks, n_all: int | None) -> tuple[int, ...]:
    """The cut-offs N of the curves over N (docs/metrics.md, section 4), sorted: 1, 2, 5, 10, 20, 50, ...
    up to ``n_all`` (the largest database size of any query), ``n_all`` itself, and every K.

    Run-wide only (never one block's). Without ``n_all`` the 1-2-5 steps run up to the largest K.
    """
    ks = tuple(_check_k(k) for k in ks)
    top = max(ks, default=0) if n_all is None else int(n_all)
    grid = set(ks) | ({top} if top >= 1 else set())
    step = 1
    while step <= top:
        grid.update(m * step for m in (1, 2, 5) if m * step <= top)
        step *= 10
    return tuple(sorted(grid))


# -- AP within a Hamming radius ------------------------------------------------


@cached_njit(nogil=True)
def _ap_at_radius(n, r, radius, policy, out):
    for q in range(n.shape[0]):
        R = 0
        for d in range(r.shape[1]):
            R += r[q, d]
        if R == 0:
            out[q] = np.nan
            continue
        N = 0
        Rp = 0
        s = 0.0
        for d in range(radius + 1):
            s += _group_precision_sum(policy, N, n[q, d], r[q, d], Rp, n[q, d])
            N += n[q, d]
            Rp += r[q, d]
        out[q] = s / Rp if Rp > 0 else 0.0


def average_precision_at_radius(H, radius, policy: str = "expected") -> np.ndarray:
    """AP of the list cut to S_r = {d <= r} over the relevant items in it, TP_r; 0 when TP_r = 0.

    This is AP@K 'retrieved' at K = |S_r| (docs/metrics.md, section 4); the cut falls between tie groups, so
    the normaliser TP_r does not depend on the order and best/worst are the relevant-first/relevant-last
    orders. NaN where the query has no relevant item.
    """
    nbits = np.shape(H)[1] - 1
    if int(radius) != radius or not 0 <= radius <= nbits:
        raise ValueError(f"radius must be an integer in 0..{nbits}, got {radius!r}")
    n, r = group_counts(H)
    out = np.empty(n.shape[0])
    _ap_at_radius(n, r, int(radius), _policy(policy), out)
    return out


# -- NDCG ----------------------------------------------------------------------


def _cumulative_discounts(length, structhash):
    """D[t] = sum_{i<=t} discount(i), Neumaier-compensated.

    discount(i) = 1/log2(i+1); StructHash's: S(1) = 1, S(i) = 1/log2(i) for i > 1.
    """
    D = np.zeros(length + 1)
    _fill_discounts(D, structhash)
    return D


@cached_njit(nogil=True)
def _fill_discounts(D, structhash):
    s = 0.0
    c = 0.0
    for i in range(1, D.shape[0]):
        if structhash:
            x = 1.0 if i == 1 else 1.0 / math.log2(i)
        else:
            x = 1.0 / math.log2(i + 1)
        t = s + x
        if abs(s) >= abs(x):
            c += (s - t) + x
        else:
            c += (x - t) + s
        s = t
        D[i] = s + c


@njit(inline="always")
def _span(D, K, start, count):
    """Sum of discounts over ranks start+1 .. start+count, truncated at K."""
    return D[min(start + count, K)] - D[min(start, K)]


@cached_njit(nogil=True)
def _dcg(H, gains, K, policy, D, out):
    Q, nd, ng = H.shape
    for q in range(Q):
        N = 0
        s = 0.0
        for d in range(nd):
            if N >= K:
                break
            n = 0
            for g in range(ng):
                n += H[q, d, g]
            if policy == _EXPECTED:
                G = 0.0
                for g in range(ng):
                    G += H[q, d, g] * gains[g]
                if n > 0:
                    s += (G / n) * _span(D, K, N, n)
            else:
                start = N
                for i in range(ng):
                    g = ng - 1 - i if policy == _BEST else i
                    s += gains[g] * _span(D, K, start, H[q, d, g])
                    start += H[q, d, g]
            N += n
        out[q] = s


@cached_njit(nogil=True)
def _ideal_dcg(H, gains, K, D, out):
    Q, nd, ng = H.shape
    for q in range(Q):
        start = 0
        s = 0.0
        for i in range(ng):
            g = ng - 1 - i
            count = 0
            for d in range(nd):
                count += H[q, d, g]
            s += gains[g] * _span(D, K, start, count)
            start += count
        out[q] = s


def _discounted(H, k, policy, gains, structhash):
    K_eff = effective_k(k, group_totals(H)[0])
    D = _cumulative_discounts(K_eff, structhash)
    dcg = np.empty(H.shape[0])
    _dcg(H, gains, K_eff, _policy(policy), D, dcg)
    return dcg, D, K_eff


def ndcg_at_k(H, k, policy: str = "expected") -> np.ndarray:
    """NDCG@K with gain 2^g - 1 and discount 1/log2(rank + 1); NaN where IDCG = 0."""
    H = as_histogram(H)
    gains = 2.0 ** np.arange(H.shape[2]) - 1.0
    dcg, D, K_eff = _discounted(H, k, policy, gains, False)
    idcg = np.empty(H.shape[0])
    _ideal_dcg(H, gains, K_eff, D, idcg)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(idcg > 0, dcg / np.where(idcg > 0, idcg, 1.0), np.nan)


def ndcg_structhash_at_k(H, k, policy: str = "expected") -> np.ndarray:
    """StructHash's NDCG (its eq. 21): binary gains, S(1)=1, S(i)=1/log2(i), over sum_{i<=K} S(i).

    NaN where the query has no relevant item.
    """
    H = as_histogram(H)
    gains = np.ones(H.shape[2])
    gains[0] = 0.0
    dcg, D, K_eff = _discounted(H, k, policy, gains, True)
    n_all, R = group_totals(H)
    norm = D[np.clip(n_all, 1, K_eff)]  # sum_{i <= K} S(i), K beyond the query's Nall items being Nall
    return np.where(R > 0, dcg / norm, np.nan)


# -- ROC AUC -------------------------------------------------------------------


def roc_auc(H, policy: str = "expected") -> np.ndarray:
    """Fraction of (relevant, irrelevant) pairs ranked correctly; a tied pair counts 1/2 (expected over tie
    orders), 1 (best) or 0 (worst).

    NaN unless the query has at least one relevant and one irrelevant item.
    """
    n, r = group_counts(H)
    q = n - r
    N, R = group_totals(H)
    Qn = N - R
    irrelevant_after = Qn[:, None] - np.cumsum(q, axis=1)
    tied = {"expected": 1, "best": 2, "worst": 0}[policy]
    correct = (r * (2 * irrelevant_after + tied * q)).sum(axis=1)  # twice the count, exact in int64
    ok = (R > 0) & (Qn > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(ok, correct / (2.0 * R * np.where(ok, Qn, 1)), np.nan)
