"""Stable harmonic-number differences for the tie-aware closed forms (docs/metrics.md, section 7).

``harmonic_diff(a, b) = H_b - H_a = sum_{i=a+1..b} 1/i`` and
``tie_sum(N, n) = sum_{j=1..n} (j-1)/(N+j) = n - (N+1) * harmonic_diff(N, N+n)``.

Both are summed directly when the range is short, taken from an exact table for
small indices, and otherwise evaluated as ``log1p`` plus Euler-Maclaurin terms
written as sums of positive parts, so nothing cancels even for N ~ 10^7.

All are helpers of jitted code, compiled into their callers: :func:`hashdist.kernels.jit_helper`,
the smallest inlined.
"""

import math
from fractions import Fraction

import numpy as np
from numba import njit

from hashdist.kernels import jit_helper

DIRECT = 32  # ranges up to this length are summed term by term
_EXACT_H = np.array([float(sum((Fraction(1, i) for i in range(1, n + 1)), Fraction(0))) for n in range(DIRECT + 1)])



@jit_helper
def _inverse_power_diff(a, b, p):
    """1/b^p - 1/a^p for 0 < a < b, as -(b-a)/(ab) * sum_{i<p} a^-(p-1-i) b^-i (no cancellation)."""
    ia, ib = 1.0 / a, 1.0 / b
    s = 0.0
    for i in range(p):
        s += ia ** (p - 1 - i) * ib**i
    return -(b - a) * ia * ib * s


@jit_helper
def _em_tail_diff(a, b):
    """(H_b - ln b) - (H_a - ln a) for a >= DIRECT from H_n - ln n - gamma = 1/(2n) - 1/(12n^2) + ..."""
    s = 0.5 * _inverse_power_diff(a, b, 1)
    s += -1.0 / 12 * _inverse_power_diff(a, b, 2)
    s += 1.0 / 120 * _inverse_power_diff(a, b, 4)
    s += -1.0 / 252 * _inverse_power_diff(a, b, 6)
    s += 1.0 / 240 * _inverse_power_diff(a, b, 8)
    return s


@njit(inline="always")
def _direct_diff(a, b):
    s = 0.0
    for i in range(b, a, -1):  # smallest terms first
        s += 1.0 / i
    return s


@jit_helper
def harmonic_diff(a, b):
    """H_b - H_a for integers 0 <= a <= b."""
    if b <= a:
        return 0.0
    if b - a <= DIRECT:
        return _direct_diff(a, b)
    if a >= DIRECT:
        return math.log1p((b - a) / a) + _em_tail_diff(float(a), float(b))
    # a < DIRECT < b: exact head from the table, stable tail from DIRECT
    return (_EXACT_H[DIRECT] - _EXACT_H[a]) + math.log1p((b - DIRECT) / DIRECT) + _em_tail_diff(float(DIRECT), float(b))


@njit(inline="always")
def log1pmx(u):
    """log(1 + u) - u for u >= 0, with full relative accuracy for small u."""
    if u < 0.5:
        power = -u * u  # (-1)^(k+1) u^k for k = 2
        s = power / 2.0
        k = 2
        while k < 200:
            k += 1
            power *= -u
            term = power / k
            s += term
            if abs(term) <= 1e-17 * abs(s):
                break
        return s
    return math.log1p(u) - u


@jit_helper
def tie_sum(N, n):
    """T(N, n) = sum_{j=1..n} (j-1)/(N+j) for integers N >= 0, n >= 0."""
    if n <= DIRECT:
        s = 0.0
        for j in range(n, 0, -1):
            s += (j - 1) / (N + j)
        return s
    if N < DIRECT:
        return n - (N + 1) * harmonic_diff(N, N + n)
    # n - (N+1)(log1p(u) + C) with u = n/N and C the Euler-Maclaurin tail, rearranged:
    # n - (N+1)u = -n/N, and the remaining parts are positive
    u = n / N
    return -n / N - (N + 1) * log1pmx(u) - (N + 1) * _em_tail_diff(float(N), float(N + n))
