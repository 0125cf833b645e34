"""mAP as published evaluation scripts compute it, with its tie interval (docs/metrics.md, section 3b).

A convention fixes what is averaged (AP@K with one normaliser, or the cross-modal scripts' measures) and the
queries in the mean; its query set ignores ``--empty-queries``. Per query it reads the registry's AP@K values
(``ap_at_k/K/<normaliser>/<policy>``) or, for ``dcmh``, AP over the whole ranking (``ap/<policy>``).
HashNet's query set (a relevant item in the top K) can depend on the tie order, so ``hashnet`` also needs,
per query, whether and how likely it is in the mean and its worst AP@K given that it is; ``dcmh_topk``
(DCMH-PyTorch's ``calc_map_k``) needs its own per-query values (:func:`per_query_values`).
:func:`conventions_report` turns the per-query values of every query into
``report["conventions"][name]["map_at_k"][str(K)] = {expected, best, worst}`` (``["map"]`` for ``dcmh``,
which has no K); a mean over no query is 0 for ``hashnet`` (as section 3b says) and NaN for the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from hashdist.kernels import cached_njit, jit_helper
from hashdist.metrics import ranking as rk
from hashdist.metrics.harmonic import harmonic_diff, tie_sum
from hashdist.metrics.ranking import _BEST, _WORST, _boundary, _group_precision_sum
from hashdist.metrics.registry import BY_KEY, POLICIES, per_query_key


@dataclass(frozen=True)
class Convention:
    name: str
    reproduces: str  # the script whose number it gives
    normaliser: str  # AP@K normaliser (docs/metrics.md, section 4); "" when the measure is not AP@K
    queries: str  # which queries enter the mean
    key: str = "map_at_k"  # its values in the report: "map_at_k" ({str(K): ...}) or "map" (one, no K)
    measure: str = ""  # what is averaged, when it is not AP@K with a normaliser

    @property
    def averaged(self) -> str:
        """What the convention averages over its queries, in words."""
        return self.measure or f"AP@K '{self.normaliser}'"


CONVENTIONS: tuple[Convention, ...] = (
    Convention("deephash", "DeepHash-pytorch CalcTopMap(topk=K) (also DJSRH/JDSH calculate_top_map(topk=K), "
               "at K = 50)", "retrieved", "every query; 0 for one with no relevant item in the top K"),
    Convention("hashnet", "HashNet's mean_average_precision(R=K)", "retrieved",
               "queries with a relevant item in the top K"),
    Convention("trec", "trec_eval map_cut_K, ranx map@K", "total", "queries with R > 0"),
    Convention("dcmh", "DCMH calc_map (TensorFlow and PyTorch; SSAH, DJSRH/JDSH calculate_map, DGCPN, DSPH; "
               "calc_map_k with k=None)", "", "every query; 0 for one with R = 0", key="map",
               measure="AP over the whole ranking, normalised by R"),
    Convention("dcmh_topk", "DCMH-PyTorch calc_map_k(k=K) (AGAH, DADH, torchcmh, DCHMT)", "",
               "every query; 0 for one with R = 0",
               measure="mean of i / rank_i over the first min(K, R) relevant items, wherever they rank"),
)
BY_NAME = {c.name: c for c in CONVENTIONS}

NEVER, SOMETIMES, ALWAYS = 0, 1, 2  # hashnet: is the query in the mean under no, some, or every tie order


@cached_njit(nogil=True)
def _hashnet_inclusion(n, r, K, state, p, worst):
    """Per query: NEVER/SOMETIMES/ALWAYS in HashNet's mean at K, the probability that it is, and for
    SOMETIMES its worst AP@K 'retrieved' given that it is (NaN otherwise).

    SOMETIMES: no relevant item before the group b holding rank K, and the m slots of b in the top K may
    hold x = 0 or x >= 1 of its r_b relevant items; P(x = 0) = C(n_b - m, r_b) / C(n_b, r_b) =
    C(n_b - r_b, m) / C(n_b, m). Given x >= 1 the value is smallest with the x items in the last x of the
    m slots: (1/x) sum_{i<=x} i/(N_b + m - x + i).
    """
    for q in range(n.shape[0]):
        worst[q] = np.nan
        b, Nb, m = _boundary(n[q], K)
        before = r[q, :b].sum() if b >= 0 else r[q].sum()
        rb = r[q, b] if b >= 0 else 0
        if before > 0 or (rb > 0 and n[q, b] - rb < m):
            state[q] = ALWAYS
            p[q] = 1.0
        elif rb == 0:
            state[q] = NEVER
            p[q] = 0.0
        else:
            nb = n[q, b]
            none_in = 1.0  # the shorter of the two products for P(x = 0)
            if rb <= m:
                for j in range(rb):
                    none_in *= (nb - m - j) / (nb - j)
            else:
                for j in range(m):
                    none_in *= (nb - rb - j) / (nb - j)
            state[q] = SOMETIMES
            p[q] = 1.0 - none_in
            low = np.inf
            for x in range(1, min(rb, m) + 1):
                low = min(low, _group_precision_sum(_WORST, Nb, m, x, 0, m) / x)
            worst[q] = low


def hashnet_key(k, name: str) -> str:
    """Per-query array of hashnet at K: ``state``, ``p`` (probability of being in the mean) or ``worst``."""
    return f"hashnet/{k}/{name}"


def per_query_values(H: np.ndarray, params) -> dict[str, np.ndarray]:
    """What the requested conventions need per query besides the registry's values, at every K of ``params.ks``.

    hashnet: ``state``, ``p`` and ``worst``, the worst AP@K 'retrieved' given that the query is in the mean
    (NaN when it never is). dcmh_topk: its value per tie policy (:func:`dcmh_topk_values`). dcmh reads the
    registry's AP (``ap/<policy>``) and needs nothing more.
    """
    out = {}
    if "hashnet" in params.conventions:
        n, r = rk.group_counts(H)
        for k in params.ks:
            state, p, worst = np.empty(n.shape[0], np.int8), np.empty(n.shape[0]), np.empty(n.shape[0])
            _hashnet_inclusion(n, r, rk.effective_k(k, n.sum(axis=1)), state, p, worst)
            worst = np.where(state == ALWAYS, rk.average_precision_at_k(H, k, "retrieved", "worst"), worst)
            out.update({hashnet_key(k, "state"): state, hashnet_key(k, "p"): p, hashnet_key(k, "worst"): worst})
    if "dcmh_topk" in params.conventions:
        for k in params.ks:
            out.update({dcmh_topk_key(k, policy): dcmh_topk_values(H, k, policy) for policy in POLICIES})
    return out


# -- dcmh_topk: DCMH-PyTorch's calc_map_k --------------------------------------------


_TAIL = 1e-20  # dcmh_topk's expected value: weights below this fraction of the mode's are left out


@jit_helper
def _first_hit_position_window(n, r, J):
    """(lo, weight of lo relative to the mode) of X_J, the position of the J-th of r relevant items in a group of
    n items in random order (1 <= J < r): P(X_J = z) = C(z-1, J-1) C(n-z, r-J) / C(n, r), J <= z <= n-r+J.

    The pmf is log-concave, largest near z = n(J-1)/(r-1) + 1; walking down from there with the ratio
    P(z-1)/P(z) = (z-J)(n-z+1) / ((z-1)(n-z-r+J+1)), lo is where the weight first falls below _TAIL.
    """
    low, high = J, n - r + J
    z = min(max(int(n * ((J - 1) / (r - 1))) + 1, low), high)
    w = 1.0
    while z > low:
        down = w * (float(z - J) * (n - z + 1)) / (float(z - 1) * (n - z - r + J + 1))
        if down < _TAIL:
            break
        w = down
        z -= 1
    return z, w


@jit_helper
def _expected_first_hits(N, n, r, Rp, J):
    """E[sum_{j<=J} (Rp+j) / (N+X_j)] for X_1 < ... < X_r the positions of the r relevant items of a group of n
    items in random order (1 <= J < r), N items and Rp relevant items before the group.

    Given X_J = z the first J-1 relevant items are a random (J-1)-subset of the z-1 slots before it: a group of
    z-1 items holding J-1 relevant, whose expected precision sum is the AP closed form
    ((J-1)/(z-1)) [(Rp+1) dH(N, N+z-1) + ((J-2)/(z-2)) T(N, z-1)]; to it add (Rp+J)/(N+z), and average over
    z with the pmf of X_J. The sweep runs upward from the window's lower end (:func:`_first_hit_position_window`)
    with the pmf's ratio recurrence and dH, T updated by one positive term per step (compensated), until the
    weight past the mode falls below _TAIL. Cost: O(window) <= O(n - r + 1), about 20 standard deviations of
    X_J (~ 20 (n/r) sqrt(J (r-J) / r)); no binomial is ever formed, so nothing overflows.
    """
    z, w = _first_hit_position_window(n, r, J)
    dh, dh_c = harmonic_diff(N, N + z - 1), 0.0
    ts, ts_c = tie_sum(N, z - 1), 0.0
    total, total_w, peak = 0.0, 0.0, w
    while True:
        h, t = dh + dh_c, ts + ts_c
        before = 0.0
        if J > 1:
            a = (J - 2) / (z - 2) if z > 2 else 0.0
            before = ((J - 1) / (z - 1)) * ((Rp + 1) * h + a * t)
        total += w * (before + (Rp + J) / (N + z))
        total_w += w
        if z >= n - r + J:
            break
        dh, dh_c = _add(dh, dh_c, 1.0 / (N + z))
        ts, ts_c = _add(ts, ts_c, (z - 1) / (N + z))
        w *= (float(z) * (n - z - r + J)) / (float(z - J + 1) * (n - z))
        z += 1
        peak = max(peak, w)
        if w < _TAIL * peak:
            break
    return total / total_w


@njit(inline="always")
def _add(s, c, x):
    """Neumaier's compensated s + x: (new sum, new compensation)."""
    t = s + x
    c += (s - t) + x if abs(s) >= abs(x) else (x - t) + s
    return t, c


@jit_helper
def _first_hits_sum(policy, N, n, r, Rp, J):
    """Sum of (Rp+j)/rank_j over the first J (1 <= J <= r) relevant items of a group (docs/metrics.md, 3b).

    best: relevant items first, they take the group's first J slots; worst: last, slots n-r+1..n-r+J; both
    are AP's precision sums over that many slots. J = r: the whole group, AP's closed form for every policy.
    """
    if J == r:
        return _group_precision_sum(policy, N, n, r, Rp, n)
    if policy == _BEST:
        return _group_precision_sum(_BEST, N, n, r, Rp, J)
    if policy == _WORST:
        return _group_precision_sum(_WORST, N, n, r, Rp, n - r + J)
    return _expected_first_hits(N, n, r, Rp, J)


@cached_njit(nogil=True)
def _dcmh_topk(n, r, K, policy, out):
    for q in range(n.shape[0]):
        R = 0
        for d in range(r.shape[1]):
            R += r[q, d]
        if R == 0:
            out[q] = 0.0
            continue
        m = min(K, R)
        S, N, Rp = 0.0, 0, 0
        for d in range(n.shape[1]):
            if Rp + r[q, d] >= m:  # the group holding the m-th relevant item
                S += _first_hits_sum(policy, N, n[q, d], r[q, d], Rp, m - Rp)
                break
            S += _group_precision_sum(policy, N, n[q, d], r[q, d], Rp, n[q, d])
            N += n[q, d]
            Rp += r[q, d]
        out[q] = S / m


def dcmh_topk_values(H, k, policy: str = "expected") -> np.ndarray:
    """DCMH-PyTorch ``calc_map_k(k=K)`` per query: with m = min(K, R), (1/m) sum_{i<=m} i / rank_i over the
    first m relevant items wherever they rank (the list is not cut at K); 0 for a query with R = 0.

    best/worst: relevant items first/last in every tie group (each rank_i is then smallest/largest);
    expected: exact over tie orders. Cost per query: O(groups) plus, for expected, the window of the group
    holding the m-th relevant item (:func:`_expected_first_hits`).
    """
    n, r = rk.group_counts(H)
    out = np.empty(n.shape[0])
    _dcmh_topk(n, r, rk.effective_k(k, n.sum(axis=1)), rk._policy(policy), out)
    return out


def dcmh_topk_key(k, policy: str) -> str:
    """Per-query array of dcmh_topk at K under a tie policy."""
    return f"dcmh_topk/{k}/{policy}"


# -- the means ------------------------------------------------------------------


def _mean(values: np.ndarray) -> float:
    return math.fsum(values.tolist()) / len(values) if len(values) else math.nan


def poisson_binomial(p: np.ndarray) -> np.ndarray:
    """Distribution of the number of successes of independent Bernoulli(p_i), by halves (exact sums of products)."""
    if len(p) <= 1:
        return np.array([1.0 - p[0], p[0]]) if len(p) else np.ones(1)
    half = len(p) // 2
    return np.convolve(poisson_binomial(p[:half]), poisson_binomial(p[half:]))


def expectations_leaving_out(p: np.ndarray, h: np.ndarray) -> np.ndarray:
    """E[h(S_{-q})] for each q, S_{-q} the successes of the Bernoulli(p_i), i != q; ``h`` given at 0..len(p)-1.

    Divide and conquer: for the left half, h is first averaged over the right half's successes, and
    vice versa. Only sums of non-negative products (no deconvolution, nothing cancels); O(len(p)^2) in all,
    about 0.2 s for 5,000 probabilities and 5 s for 20,000.
    """
    if len(p) == 1:
        return h[:1].copy()
    half = len(p) // 2
    left, right = p[:half], p[half:]
    return np.concatenate([expectations_leaving_out(left, np.correlate(h, poisson_binomial(right), "valid")),
                           expectations_leaving_out(right, np.correlate(h, poisson_binomial(left), "valid"))])


def extreme_mean(fixed: np.ndarray, optional: np.ndarray, best: bool) -> float:
    """Largest (best) or smallest mean of ``fixed`` plus any subset of ``optional``; a mean of nothing is 0.

    The optimum takes the optional values in order (largest first for best), each while it beats the mean so far.
    """
    chosen = fixed.tolist()
    total = math.fsum(chosen)
    for v in sorted(optional.tolist(), reverse=best):
        if chosen and not (v > total / len(chosen) if best else v < total / len(chosen)):
            break
        chosen.append(v)
        total += v
    if not chosen:
        return 0.0
    value = math.fsum(chosen) / len(chosen)
    if not len(fixed):  # the empty set, mean 0, is a choice too
        value = max(value, 0.0) if best else min(value, 0.0)
    return value


def _hashnet(expected: np.ndarray, best: np.ndarray, worst: np.ndarray, state: np.ndarray, p: np.ndarray) -> dict:
    """HashNet's mean under ties (docs/metrics.md, section 3b): expected = sum_q E[AP_q 1_q] E[1/(1 + S_{-q})].

    E[AP_q 1_q] is the expected AP@K 'retrieved', which is 0 whenever the top K holds no relevant item. Best and
    worst take each query's extreme AP given that it is in the mean (``best``: AP@K 'retrieved' best, reached
    with a relevant item in the top K) and choose which SOMETIMES queries are in it.
    """
    always, sometimes = state == ALWAYS, state == SOMETIMES
    C, ps = int(always.sum()), p[sometimes]
    weight = np.zeros(len(state))
    if C:  # the other C - 1 always-included queries plus the SOMETIMES ones
        weight[always] = math.fsum((poisson_binomial(ps) / (C + np.arange(len(ps) + 1))).tolist())
    if len(ps):
        weight[sometimes] = expectations_leaving_out(ps, 1.0 / (1 + C + np.arange(len(ps))))
    included = state != NEVER
    return {"expected": math.fsum((expected[included] * weight[included]).tolist()),
            "best": extreme_mean(best[always], best[sometimes], True),
            "worst": extreme_mean(worst[always], worst[sometimes], False)}


def _map_at_k(per_query: dict[str, np.ndarray], name: str, k) -> dict:
    """{expected, best, worst} of a convention reported by K."""
    if name == "dcmh_topk":
        return {policy: _mean(per_query[dcmh_topk_key(k, policy)]) for policy in POLICIES}
    measure, convention = BY_KEY["map_at_k"], BY_NAME[name]
    ap = {policy: per_query[per_query_key(measure, k, convention.normaliser, policy)] for policy in POLICIES}
    if name == "deephash":
        return {policy: _mean(np.nan_to_num(v, nan=0.0)) for policy, v in ap.items()}
    if name == "trec":
        relevant = per_query["relevant"] > 0
        return {policy: _mean(v[relevant]) for policy, v in ap.items()}
    return _hashnet(ap["expected"], ap["best"], per_query[hashnet_key(k, "worst")],
                    per_query[hashnet_key(k, "state")], per_query[hashnet_key(k, "p")])


def conventions_report(per_query: dict[str, np.ndarray], names, ks) -> dict:
    """``{name: {"map_at_k": {str(K): {expected, best, worst}}}}`` from the per-query values of every query;
    ``{"map": {expected, best, worst}}`` for dcmh (AP over the whole ranking: no K)."""
    out = {}
    for name in names:
        if BY_NAME[name].key == "map":  # dcmh: the registry's AP, 0 for R = 0, over every query
            ap = {policy: per_query[per_query_key(BY_KEY["map"], policy=policy)] for policy in POLICIES}
            out[name] = {"map": {policy: _mean(np.nan_to_num(v, nan=0.0)) for policy, v in ap.items()}}
        else:
            out[name] = {"map_at_k": {str(k): _map_at_k(per_query, name, k) for k in ks}}
    return out
