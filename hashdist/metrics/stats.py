"""Statistics over per-query (or per-run) values: paired tests, multiple-testing correction, intervals."""

from __future__ import annotations

import math

import numpy as np

_CHUNK = 500  # permutations or bootstrap resamples drawn at a time
_PATTERNS = 4096  # sign patterns enumerated at a time


def paired_t_pvalue(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided paired t-test; when every difference is equal: 1 if they are 0, else 0."""
    from scipy.stats import ttest_rel

    d = np.asarray(a, float) - np.asarray(b, float)
    if len(d) < 2:
        return math.nan
    if np.all(d == d[0]):
        return 1.0 if d[0] == 0 else 0.0
    return float(ttest_rel(a, b).pvalue)


def randomization_pvalue(a: np.ndarray, b: np.ndarray, permutations: int, seed: int) -> float:
    """Two-sided paired sign-flip test of mean(a - b): (1 + #{|permuted mean| >= |observed|}) / (P + 1)."""
    d = np.asarray(a, float) - np.asarray(b, float)
    if len(d) == 0:
        return math.nan
    observed = abs(d.mean())
    tolerance = 1e-12 * np.abs(d).mean()  # equal sums computed in another order
    rng = np.random.default_rng(seed)
    at_least = 0
    for start in range(0, permutations, _CHUNK):
        signs = rng.integers(0, 2, (min(_CHUNK, permutations - start), len(d)), dtype=np.int8) * 2 - 1
        at_least += int((np.abs(signs @ d) / len(d) >= observed - tolerance).sum())
    return (1 + at_least) / (permutations + 1)


def exact_randomization_pvalue(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided paired sign-flip test of mean(a - b) over all 2^n sign patterns (n small, e.g. runs):
    #{patterns with |mean| >= |observed|} / 2^n, the observed pattern included."""
    d = np.asarray(a, float) - np.asarray(b, float)
    n = len(d)
    if n == 0:
        return math.nan
    observed = abs(d.mean())
    tolerance = 1e-12 * np.abs(d).mean()
    at_least = 0
    for start in range(0, 2**n, _PATTERNS):
        codes = np.arange(start, min(start + _PATTERNS, 2**n))
        signs = ((codes[:, None] >> np.arange(n)) & 1).astype(np.int8) * 2 - 1
        at_least += int((np.abs(signs @ d) / n >= observed - tolerance).sum())
    return at_least / 2**n


def holm(pvalues) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order (NaN stays NaN and is not counted)."""
    p = np.asarray(pvalues, float)
    valid = np.flatnonzero(~np.isnan(p))
    order = valid[np.argsort(p[valid], kind="stable")]
    adjusted = np.full(len(p), math.nan)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p[i]))
        adjusted[i] = running
    return adjusted.tolist()


def bootstrap_ci(values: np.ndarray, resamples: int, seed: int, level: float = 0.95) -> list[float]:
    """Percentile bootstrap interval of the mean: [lo, hi]."""
    v = np.asarray(values, float)
    if len(v) == 0:
        return [math.nan, math.nan]
    rng = np.random.default_rng(seed)
    means = np.concatenate([
        v[rng.integers(0, len(v), (min(_CHUNK, resamples - start), len(v)))].mean(axis=1)
        for start in range(0, resamples, _CHUNK)
    ])
    tail = (1 - level) / 2 * 100
    return np.percentile(means, [tail, 100 - tail]).tolist()


def t_interval(values, level: float = 0.95) -> tuple[float, float, float, float]:
    """(mean, sd, lo, hi) of values over T runs: the sample sd (divisor T - 1) and the interval
    mean -+ t_{(1 + level)/2, T - 1} sd / sqrt(T). One run: sd, lo and hi are NaN (no spread to
    estimate); no runs: all NaN; a NaN value makes all four NaN."""
    from scipy.stats import t

    v = np.asarray(values, float)
    if len(v) == 0:
        return math.nan, math.nan, math.nan, math.nan
    mean = float(v.mean())
    if len(v) == 1:
        return mean, math.nan, math.nan, math.nan
    sd = float(v.std(ddof=1))
    half = float(t.ppf((1 + level) / 2, len(v) - 1)) * sd / math.sqrt(len(v))
    return mean, sd, mean - half, mean + half
