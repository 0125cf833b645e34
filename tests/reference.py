"""Independent, item-level, brute-force reference for hashdist's retrieval metrics.

Everything here follows the textbook definitions in docs/metrics.md
(sections 2 and 4) at the level of individual database items and explicit ranked
lists. It deliberately does NOT use any of the spec's closed forms (harmonic
numbers, hypergeometric conditioning, T(N, n), E[DCG] formulas, ...) and never
imports ``hashdist.metrics``: it is the oracle the implementation is tested against.

Data model. One query is a pair of equal-length integer arrays ``dist`` (Hamming
distance of each database item to the query) and ``grade`` (relevance grade of each
item, 0 = irrelevant, >= 1 = relevant). :func:`expand_histogram` turns a histogram
row ``H[q]`` (shape (B+1, G+1)) into such arrays.

Tie policies (docs/metrics.md, section 2), for a metric evaluated on an explicit ranked list:

* ``best`` / ``worst``: the explicit list sorted by distance ascending, then grade
  descending / ascending (:func:`ranked_list`).
* ``expected``:
  - exact: enumerate every distinct arrangement of every tie group (multiset
    permutations of the grades inside each group, all equally likely under a
    uniformly random order of the items), evaluate the metric on each full ranked
    list and average with exact weights (:func:`expected_exact`);
  - Monte Carlo: random shuffles inside tie groups, metric evaluated on each
    sampled list (:func:`expected_mc`), reporting the mean and its standard error.

Exact arithmetic: rational metrics (AP, AP@K, P@K, R@K, AUC, radius metrics,
micro P/R/F, AUPRC) use :class:`fractions.Fraction`; metrics with log discounts
(NDCG) use mpmath at ``MP_DPS`` digits.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from fractions import Fraction

import mpmath
import numpy as np

MP_DPS = 40
mpmath.mp.dps = MP_DPS

NAN = float("nan")
POLICIES = ("expected", "best", "worst")
NORMALISERS = ("retrieved", "min_k_r", "total")


# ----------------------------------------------------------------------------
# items, histograms, Hamming distances
# ----------------------------------------------------------------------------


def expand_histogram(Hq):
    """One histogram row H[q] (shape (B+1, G+1)) -> (dist, grade) int64 arrays, one entry per item."""
    Hq = np.asarray(Hq)
    dist, grade = [], []
    for d in range(Hq.shape[0]):
        for g in range(Hq.shape[1]):
            c = int(Hq[d, g])
            if c < 0:
                raise ValueError(f"negative count H[{d},{g}] = {c}")
            dist.extend([d] * c)
            grade.extend([g] * c)
    return np.array(dist, dtype=np.int64), np.array(grade, dtype=np.int64)


def histogram_from_items(dist, grade, nbits, ngrades):
    """Count items into H[d, g] (shape (nbits+1, ngrades)) one by one."""
    H = np.zeros((nbits + 1, ngrades), dtype=np.int64)
    for d, g in zip(np.asarray(dist).tolist(), np.asarray(grade).tolist(), strict=True):
        H[d, g] += 1
    return H


def hamming_bruteforce(qbits, dbbits):
    """(Q, B) and (N, B) 0/1 arrays -> (Q, N) Hamming distances, bit by bit."""
    qbits = np.asarray(qbits, dtype=np.int64)
    dbbits = np.asarray(dbbits, dtype=np.int64)
    out = np.zeros((qbits.shape[0], dbbits.shape[0]), dtype=np.int64)
    for q in range(qbits.shape[0]):
        out[q] = (dbbits != qbits[q][None, :]).sum(axis=1)
    return out


def grades_class(query_labels, db_labels):
    """(Q, N) grades for class relevance: 1 iff same label."""
    ql = np.asarray(query_labels)
    dl = np.asarray(db_labels)
    return (ql[:, None] == dl[None, :]).astype(np.int64)


def grades_multilabel(query_multihot, db_multihot, max_grade):
    """(Q, N) grades for multi-label relevance: labels in common, capped at max_grade."""
    qm = np.asarray(query_multihot, dtype=np.int64)
    dm = np.asarray(db_multihot, dtype=np.int64)
    out = np.zeros((qm.shape[0], dm.shape[0]), dtype=np.int64)
    for q in range(qm.shape[0]):
        for j in range(dm.shape[0]):
            common = int(np.sum((qm[q] == 1) & (dm[j] == 1)))
            out[q, j] = min(common, max_grade)
    return out


def grades_explicit(lists, n_db, max_grade):
    """(Q, N) grades from explicit per-query {db_index: grade} dicts (grade <= 0 means irrelevant)."""
    out = np.zeros((len(lists), n_db), dtype=np.int64)
    for q, rel in enumerate(lists):
        for j, g in rel.items():
            out[q, j] = min(int(g), max_grade) if g > 0 else 0
    return out


def histograms_bruteforce(dist_matrix, grade_matrix, nbits, ngrades):
    """(Q, N) distances and grades -> (Q, nbits+1, ngrades) histogram by item-by-item counting."""
    Q = dist_matrix.shape[0]
    H = np.zeros((Q, nbits + 1, ngrades), dtype=np.int64)
    for q in range(Q):
        H[q] = histogram_from_items(dist_matrix[q], grade_matrix[q], nbits, ngrades)
    return H


# ----------------------------------------------------------------------------
# ranked lists and tie groups
# ----------------------------------------------------------------------------


def tie_groups(dist, grade):
    """[(d, [grades of the items at distance d]), ...] by ascending d."""
    groups: dict[int, list[int]] = {}
    for d, g in zip(np.asarray(dist).tolist(), np.asarray(grade).tolist(), strict=True):
        groups.setdefault(int(d), []).append(int(g))
    return [(d, sorted(groups[d])) for d in sorted(groups)]


def ranked_list(dist, grade, policy):
    """Explicit ranked grade list: distance ascending; inside ties grade descending (best) / ascending (worst)."""
    if policy not in ("best", "worst"):
        raise ValueError(policy)
    out = []
    for _, gs in tie_groups(dist, grade):
        out.extend(sorted(gs, reverse=(policy == "best")))
    return out


def ranked_list_by_tiebreak(dist, grade, tiebreak_key):
    """Ranked grades for a concrete tie-breaking rule: stable sort by (distance, tiebreak_key)."""
    order = sorted(range(len(dist)), key=lambda i: (int(dist[i]), tiebreak_key[i]))
    return [int(grade[i]) for i in order]


def multiset_permutations(seq):
    """Every distinct ordering of a multiset, each exactly once."""
    counts = Counter(seq)
    keys = sorted(counts)
    n = len(seq)
    prefix: list = []

    def rec():
        if len(prefix) == n:
            yield tuple(prefix)
            return
        for k in keys:
            if counts[k]:
                counts[k] -= 1
                prefix.append(k)
                yield from rec()
                prefix.pop()
                counts[k] += 1

    yield from rec()


def n_arrangements(dist, grade):
    """Number of distinct ranked grade lists: product over tie groups of multinomial coefficients."""
    total = 1
    for _, gs in tie_groups(dist, grade):
        m = math.factorial(len(gs))
        for c in Counter(gs).values():
            m //= math.factorial(c)
        total *= m
    return total


def _equally_likely_arrangements(per_group):
    """Yield (probability, ranked grade list) over the product of each group's orders, all equally likely."""
    total = 1
    for p in per_group:
        total *= len(p)
    prob = Fraction(1, total)
    for combo in itertools.product(*per_group):
        yield prob, [g for part in combo for g in part]


def arrangements(dist, grade):
    """Yield (probability, ranked grade list) for every distinct arrangement of the tie groups.

    Under a uniformly random order of the items inside each tie group every distinct
    multiset permutation of the group's grades has the same probability, and the
    groups are independent, so each full arrangement has probability 1/total.
    """
    return _equally_likely_arrangements([list(multiset_permutations(gs)) for _, gs in tie_groups(dist, grade)])


def arrangements_by_item_permutation(dist, grade):
    """Slow cross-check of :func:`arrangements`: every permutation of the (labelled) items per group."""
    return _equally_likely_arrangements([list(itertools.permutations(gs)) for _, gs in tie_groups(dist, grade)])


# ----------------------------------------------------------------------------
# metrics on one explicit ranked list (exact; None = undefined)
# ----------------------------------------------------------------------------


def _n_relevant(gr):
    return sum(1 for g in gr if g >= 1)


def ap_list(gr):
    """AP = (1/R) * sum over relevant ranks i of precision@i."""
    R = _n_relevant(gr)
    if R == 0:
        return None
    hits, s = 0, Fraction(0)
    for i, g in enumerate(gr, start=1):
        if g >= 1:
            hits += 1
            s += Fraction(hits, i)
    return s / R


def ap_at_k_list(gr, k, normaliser):
    """AP@K: sum of precision@i over relevant i <= K, divided by the chosen normaliser."""
    R = _n_relevant(gr)
    if R == 0:
        return None
    hits, s = 0, Fraction(0)
    for i, g in enumerate(gr[:k], start=1):
        if g >= 1:
            hits += 1
            s += Fraction(hits, i)
    if normaliser == "retrieved":
        return Fraction(0) if hits == 0 else s / hits
    if normaliser == "min_k_r":
        return s / min(k, R)
    if normaliser == "total":
        return s / R
    raise ValueError(normaliser)


def ap_at_radius_list(gr, size):
    """AP of the first ``size`` items (the radius-r set S_r, |S_r| = size, of a list sorted by distance):
    sum of precision@i over its relevant items i, divided by how many there are (0 if none): AP@K
    'retrieved' at K = |S_r| (docs/metrics.md, section 4)."""
    return ap_at_k_list(gr, size, "retrieved")


def precision_at_k_list(gr, k):
    """P@K = (relevant among the first K) / K; a K beyond the list is its length (K > Nall behaves as K = Nall)."""
    return Fraction(_n_relevant(gr[:k]), min(k, len(gr)) or k)


def recall_at_k_list(gr, k):
    R = _n_relevant(gr)
    if R == 0:
        return None
    return Fraction(_n_relevant(gr[:k]), R)


@functools.lru_cache(maxsize=None)
def _log2(x: int):
    """log2 of a positive integer at MP_DPS digits (cached: the enumeration calls it a lot)."""
    return mpmath.log(mpmath.mpf(x), 2)


def dcg_list(gr, k):
    """DCG@K = sum_{i <= K} (2^g_i - 1) / log2(i + 1), in mpmath."""
    s = mpmath.mpf(0)
    for i, g in enumerate(gr[:k], start=1):
        s += mpmath.mpf(2**g - 1) / _log2(i + 1)
    return s


def ndcg_list(gr, k):
    """NDCG@K = DCG@K / IDCG@K, IDCG@K = DCG@K of the grades sorted descending."""
    idcg = dcg_list(sorted(gr, reverse=True), k)
    if idcg == 0:
        return None
    return dcg_list(gr, k) / idcg


def structhash_score(i):
    """StructHash eq. 21 position score: S(1) = 1, S(i) = 1/log2(i) for i > 1."""
    return mpmath.mpf(1) if i == 1 else 1 / _log2(i)


def ndcg_structhash_list(gr, k):
    """StructHash NDCG@K: binary relevance, sum_{i<=K} S(i)[rel_i] / sum_{i<=K} S(i)."""
    if _n_relevant(gr) == 0:
        return None
    num = mpmath.mpf(0)
    for i, g in enumerate(gr[:k], start=1):
        if g >= 1:
            num += structhash_score(i)
    z = mpmath.fsum(structhash_score(i) for i in range(1, min(k, len(gr)) + 1))  # K > Nall: K = Nall
    return num / z


LIST_METRICS = {
    "ap": lambda gr: ap_list(gr),
    "ap_at_k": lambda gr, k, normaliser: ap_at_k_list(gr, k, normaliser),
    "precision_at_k": lambda gr, k: precision_at_k_list(gr, k),
    "recall_at_k": lambda gr, k: recall_at_k_list(gr, k),
    "ap_at_radius": lambda gr, size: ap_at_radius_list(gr, size),
    "ndcg_at_k": lambda gr, k: ndcg_list(gr, k),
    "ndcg_structhash_at_k": lambda gr, k: ndcg_structhash_list(gr, k),
}


def to_float(x):
    """Exact value (Fraction / mpf / int / None) -> float (None -> NaN)."""
    if x is None:
        return NAN
    if isinstance(x, Fraction):
        return x.numerator / x.denominator if abs(x.numerator) < 2**1000 else float(x)
    return float(x)


# ----------------------------------------------------------------------------
# tie policies
# ----------------------------------------------------------------------------


def grade_ordered_exact(metric, dist, grade, policy, **kw):
    """The metric of the grade-first (best) or grade-last (worst) order inside each tie group.

    The spec (section 2) says these are the extremes over tie orders for every metric except
    AP@K 'retrieved'; tests check that claim against :func:`policy_exact` by enumeration.
    """
    return LIST_METRICS[metric](ranked_list(dist, grade, policy), **kw)


def grade_ordered_value(metric, dist, grade, policy, **kw):
    return to_float(grade_ordered_exact(metric, dist, grade, policy, **kw))


def policy_exact(metric, dist, grade, policy, **kw):
    """Exact value of a LIST_METRICS metric under a tie policy, by enumerating every arrangement of the
    tie groups: best / worst are the largest / smallest value, expected the mean."""
    fn = LIST_METRICS[metric]
    if policy in ("best", "worst"):
        values = [fn(gr, **kw) for _, gr in arrangements(dist, grade)]
        if values[0] is None:
            return None
        return max(values) if policy == "best" else min(values)
    if policy != "expected":
        raise ValueError(policy)
    total = None
    undefined = None
    for prob, gr in arrangements(dist, grade):
        v = fn(gr, **kw)
        if undefined is None:
            undefined = v is None
        assert undefined == (v is None), "definedness must not depend on the arrangement"
        if v is None:
            continue
        if isinstance(v, Fraction) or isinstance(v, int):
            term = prob * v
        else:  # mpf
            term = mpmath.mpf(prob.numerator) / prob.denominator * v
        total = term if total is None else total + term
    return None if undefined else total


def policy_value(metric, dist, grade, policy, **kw):
    """Float value of a metric under a policy (expected: exact enumeration)."""
    return to_float(policy_exact(metric, dist, grade, policy, **kw))


def tiebreak_value(metric, dist, grade, tiebreak_key, **kw):
    """Float value of a metric for one concrete tie-breaking rule."""
    return to_float(LIST_METRICS[metric](ranked_list_by_tiebreak(dist, grade, tiebreak_key), **kw))


# --- Monte Carlo: vectorised item-level metrics on sampled ranked lists -------


def sample_ranked_grades(dist, grade, n_samples, rng):
    """(n_samples, N) ranked grade lists: random permutation of the items, then stable sort by distance."""
    dist = np.asarray(dist, dtype=np.int64)
    grade = np.asarray(grade, dtype=np.int64)
    N = len(dist)
    perm = rng.permuted(np.tile(np.arange(N), (n_samples, 1)), axis=1)
    order_in_perm = np.argsort(dist[perm], axis=1, kind="stable")
    order = np.take_along_axis(perm, order_in_perm, axis=1)
    return grade[order]


def _ranks(N):
    return np.arange(1, N + 1, dtype=np.float64)


def ap_matrix(G):
    rel = (G >= 1).astype(np.float64)
    R = rel.sum(axis=1)
    prec = np.cumsum(rel, axis=1) / _ranks(G.shape[1])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(R > 0, (prec * rel).sum(axis=1) / R, np.nan)


def ap_at_k_matrix(G, k, normaliser):
    rel = (G >= 1).astype(np.float64)
    R = rel.sum(axis=1)
    top = rel[:, :k]
    hits = top.sum(axis=1)
    s = (np.cumsum(top, axis=1) / _ranks(top.shape[1]) * top).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        if normaliser == "retrieved":
            v = np.where(hits > 0, s / np.maximum(hits, 1), 0.0)
        elif normaliser == "min_k_r":
            v = s / np.minimum(k, R)
        elif normaliser == "total":
            v = s / R
        else:
            raise ValueError(normaliser)
        return np.where(R > 0, v, np.nan)


def precision_at_k_matrix(G, k):
    return (G[:, :k] >= 1).sum(axis=1) / (min(k, G.shape[1]) or k)  # K > Nall behaves as K = Nall


def recall_at_k_matrix(G, k):
    R = (G >= 1).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(R > 0, (G[:, :k] >= 1).sum(axis=1) / R, np.nan)


def _dcg_matrix(G, k):
    top = G[:, :k]
    disc = 1.0 / np.log2(np.arange(2, top.shape[1] + 2, dtype=np.float64))
    return ((2.0 ** top - 1.0) * disc).sum(axis=1)


def ndcg_matrix(G, k):
    idcg = _dcg_matrix(-np.sort(-G, axis=1), k)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(idcg > 0, _dcg_matrix(G, k) / idcg, np.nan)


def ndcg_structhash_matrix(G, k):
    i = np.arange(1, min(k, G.shape[1]) + 1, dtype=np.float64)  # K > Nall behaves as K = Nall
    S = np.where(i == 1, 1.0, 1.0 / np.log2(np.maximum(i, 2)))
    top = (G[:, :k] >= 1).astype(np.float64)
    R = (G >= 1).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(R > 0, (top * S[: top.shape[1]]).sum(axis=1) / S.sum(), np.nan)


MATRIX_METRICS = {
    "ap": ap_matrix,
    "ap_at_k": ap_at_k_matrix,
    "precision_at_k": precision_at_k_matrix,
    "recall_at_k": recall_at_k_matrix,
    "ndcg_at_k": ndcg_matrix,
    "ndcg_structhash_at_k": ndcg_structhash_matrix,
}


def expected_mc(metric, dist, grade, n_samples, rng, **kw):
    """Monte Carlo estimate of the expected-policy value: (mean, standard error)."""
    if len(dist) == 0:
        v = MATRIX_METRICS[metric](np.zeros((1, 0), dtype=np.int64), **kw)[0]
        return float(v), 0.0
    G = sample_ranked_grades(dist, grade, n_samples, rng)
    vals = MATRIX_METRICS[metric](G, **kw)
    if np.isnan(vals).any():
        assert np.isnan(vals).all()
        return NAN, 0.0
    return float(vals.mean()), float(vals.std(ddof=1) / math.sqrt(n_samples)) if n_samples > 1 else 0.0


# ----------------------------------------------------------------------------
# ROC AUC by pair counting
# ----------------------------------------------------------------------------


def roc_auc_items(dist, grade):
    """Fraction of (relevant, irrelevant) pairs with the relevant item strictly closer; ties count 1/2."""
    dist = np.asarray(dist).tolist()
    grade = np.asarray(grade).tolist()
    rel = [d for d, g in zip(dist, grade, strict=True) if g >= 1]
    irr = [d for d, g in zip(dist, grade, strict=True) if g < 1]
    if not rel or not irr:
        return None
    s = Fraction(0)
    for dr in rel:
        for di in irr:
            if dr < di:
                s += 1
            elif dr == di:
                s += Fraction(1, 2)
    return s / (len(rel) * len(irr))


# ----------------------------------------------------------------------------
# Hamming-radius sets, micro P/R/F, PR curve, AUPRC
# ----------------------------------------------------------------------------


def radius_counts(dist, grade, r):
    """(TP_r, |S_r|, R) by direct counting."""
    tp = size = R = 0
    for d, g in zip(np.asarray(dist).tolist(), np.asarray(grade).tolist(), strict=True):
        inside = d <= r
        relevant = g >= 1
        size += inside
        tp += inside and relevant
        R += relevant
    return tp, size, R


def ap_at_radius_items(dist, grade, r, policy):
    """AP within radius r under a tie policy: the first |S_r| items of every ranked list (the list is sorted
    by distance, so they are S_r whatever the tie order), by enumeration (:func:`policy_exact`)."""
    _, size, _ = radius_counts(dist, grade, r)
    return policy_exact("ap_at_radius", dist, grade, policy, size=size)


def precision_at_radius_items(dist, grade, r):
    tp, size, _ = radius_counts(dist, grade, r)
    return Fraction(0) if size == 0 else Fraction(tp, size)


def recall_at_radius_items(dist, grade, r):
    tp, _, R = radius_counts(dist, grade, r)
    return None if R == 0 else Fraction(tp, R)


def _frac(x):
    return Fraction(x) if not isinstance(x, Fraction) else x


def micro_at_radius_items(queries, r, beta=1.0):
    """queries: list of (dist, grade). Sums TP, FP, FN over queries, then P, R, F_beta (None when 0/0)."""
    TP = FP = FN = 0
    for dist, grade in queries:
        tp, size, R = radius_counts(dist, grade, r)
        TP += tp
        FP += size - tp
        FN += R - tp
    b2 = _frac(beta) ** 2
    P = None if TP + FP == 0 else Fraction(TP, TP + FP)
    Rc = None if TP + FN == 0 else Fraction(TP, TP + FN)
    fden = (1 + b2) * TP + b2 * FN + FP
    F = None if fden == 0 else (1 + b2) * TP / fden
    return dict(precision=P, recall=Rc, f_beta=F, tp=TP, fp=FP, fn=FN)


def pr_curve_items(queries, nbits):
    """Micro PR points for radii 0..nbits, skipping radii where no query retrieves anything."""
    curve = []
    for r in range(nbits + 1):
        m = micro_at_radius_items(queries, r)
        if m["tp"] + m["fp"] == 0:
            continue
        curve.append(dict(radius=r, precision=m["precision"], recall=m["recall"]))
    return curve


def auprc_items(curve):
    """step = sum_r P(r) (R(r) - R(r-1)), R(-1) = 0; trapezoid from (0, P(r_first))."""
    if not curve:
        return dict(step=None, trapezoid=None)
    step = Fraction(0)
    prev_r = Fraction(0)
    for pt in curve:
        step += pt["precision"] * (pt["recall"] - prev_r)
        prev_r = pt["recall"]
    trap = Fraction(0)
    prev_r, prev_p = Fraction(0), curve[0]["precision"]
    for pt in curve:
        trap += (pt["recall"] - prev_r) * (pt["precision"] + prev_p) / 2
        prev_r, prev_p = pt["recall"], pt["precision"]
    return dict(step=step, trapezoid=trap)


# ----------------------------------------------------------------------------
# mLGAP
# ----------------------------------------------------------------------------


def ball_volume(nbits, k):
    """V_k: number of B-bit codes within distance k, counted by the binomial sum (k capped at B)."""
    return sum(math.comb(nbits, i) for i in range(min(k, nbits) + 1))


def ball_volume_by_enumeration(nbits, k):
    """V_k by listing every code (tiny nbits only)."""
    return sum(1 for code in range(2**nbits) if bin(code).count("1") <= k)


def max_bucket_bruteforce(qbits, dbbits, radius):
    """M_k for k = 0..radius: the largest number of database items sharing one code among the
    codes within distance k of the query (0 when the ball holds no item). (Q, radius+1)."""
    qbits = np.asarray(qbits, dtype=np.int64)
    dbbits = np.asarray(dbbits, dtype=np.int64)
    counts = Counter(tuple(row) for row in dbbits.tolist())
    out = np.zeros((qbits.shape[0], radius + 1), dtype=np.int64)
    for q in range(qbits.shape[0]):
        qrow = qbits[q].tolist()
        for code, c in counts.items():
            d = sum(1 for a, b in zip(qrow, code, strict=True) if a != b)
            for k in range(d, radius + 1):
                out[q, k] = max(out[q, k], c)
    return out


def lgap_items(dist, grade, max_bucket_row, nbits, r):
    """LGAP@r = 1/(r+1) sum_{k=0..r} P@d<=k * phi(S_k), phi = |S_k| / (M_k V_k); 0 term for an empty ball."""
    total = Fraction(0)
    for k in range(r + 1):
        tp, size, _ = radius_counts(dist, grade, k)
        Mk = int(max_bucket_row[k])
        Vk = ball_volume(nbits, k)
        if size == 0:
            continue
        precision = Fraction(tp, size)
        phi = Fraction(size, Mk * Vk)
        total += precision * phi
    return total / (r + 1)


# ----------------------------------------------------------------------------
# expected policy for large lists: position-by-position expectation
# ----------------------------------------------------------------------------
#
# For lists far too long to enumerate, the expected-policy value of an additive
# metric is the sum over positions of the expected contribution of that position
# (linearity of expectation). Inside a tie group of n items holding r relevant, under
# a uniformly random order: P(relevant at slot t) = r/n and, given that, the other
# t-1 earlier slots of the group hold (t-1)(r-1)/(n-1) relevant items on average
# (exchangeability). Each position's term is then summed with math.fsum, so the
# result is accurate to ~1e-15 relative even for 10^6 positions. These functions are
# cross-checked against full enumeration on small lists in test_reference_selfcheck.py.


def group_sizes(dist, grade):
    """[(d, n_d, r_d, G_d), ...] ascending d, by counting items (G_d = sum of 2^g - 1)."""
    dist = np.asarray(dist, dtype=np.int64)
    grade = np.asarray(grade, dtype=np.int64)
    out = []
    for d in np.unique(dist).tolist():
        g = grade[dist == d]
        out.append((d, int(g.size), int((g >= 1).sum()), int(sum(2 ** int(x) - 1 for x in g.tolist()))))
    return out


def _slot_terms(N, n, r, Rp, t_max):
    """Expected precision contribution of slots t = 1..t_max of a group (N items before it,
    n items, r relevant, Rp relevant before it): (r/n) * (Rp + 1 + (t-1)(r-1)/(n-1)) / (N + t)."""
    if t_max <= 0 or r == 0:
        return np.zeros(0)
    t = np.arange(1, t_max + 1, dtype=np.float64)
    a = (r - 1) / (n - 1) if n > 1 else 0.0
    return (r / n) * (Rp + 1 + (t - 1) * a) / (N + t)


def expected_ap_positionwise(dist, grade):
    groups = group_sizes(dist, grade)
    R = sum(g[2] for g in groups)
    if R == 0:
        return NAN
    terms, N, Rp = [], 0, 0
    for _, n, r, _ in groups:
        terms.append(_slot_terms(N, n, r, Rp, n))
        N += n
        Rp += r
    return math.fsum(np.concatenate(terms).tolist()) / R


def expected_ap_at_k_positionwise(dist, grade, k, normaliser):
    groups = group_sizes(dist, grade)
    R = sum(g[2] for g in groups)
    if R == 0:
        return NAN
    Nall = sum(g[1] for g in groups)
    N, Rp = 0, 0
    before = []  # terms of complete groups inside the top K
    for _, n, r, _ in groups:
        if N + n <= k:  # complete group inside the top K
            before.append(_slot_terms(N, n, r, Rp, n))
            N += n
            Rp += r
            continue
        # boundary group: holds rank K, m = K - N of its slots are retrieved
        m = k - N
        S_pre = math.fsum(np.concatenate(before).tolist()) if before else 0.0
        if normaliser in ("min_k_r", "total"):
            s_b = math.fsum(_slot_terms(N, n, r, Rp, m).tolist())
            return (S_pre + s_b) / (min(k, R) if normaliser == "min_k_r" else R)
        # retrieved: condition on x relevant items among the m boundary slots; given x,
        # the m slots are a uniformly ordered group of m items holding x relevant
        total = mpmath.mpf(0)
        for x in range(max(0, m - (n - r)), min(r, m) + 1):
            if Rp + x == 0:
                continue
            logp = (mpmath.log(mpmath.binomial(r, x)) + mpmath.log(mpmath.binomial(n - r, m - x))
                    - mpmath.log(mpmath.binomial(n, m)))
            s_x = math.fsum(_slot_terms(N, m, x, Rp, m).tolist())
            total += mpmath.exp(logp) * (mpmath.mpf(S_pre) + s_x) / (Rp + x)
        return float(total)
    # K >= Nall: the whole list
    assert k >= Nall
    S = math.fsum(np.concatenate(before).tolist()) if before else 0.0
    if normaliser == "retrieved":
        return S / R
    return S / (min(k, R) if normaliser == "min_k_r" else R)


def expected_dcg_positionwise(dist, grade, k):
    """E[DCG@K] = sum over positions i <= K of (G_d / n_d) / log2(i + 1)."""
    terms, N = [], 0
    for _, n, _, G in group_sizes(dist, grade):
        t_max = min(n, k - N)
        if t_max <= 0:
            break
        i = np.arange(N + 1, N + t_max + 1, dtype=np.float64)
        terms.append((G / n) / np.log2(i + 1))
        N += n
    return math.fsum(np.concatenate(terms).tolist()) if terms else 0.0


def ideal_dcg_fsum(grade, k):
    g = np.sort(np.asarray(grade, dtype=np.int64))[::-1][:k]
    i = np.arange(1, len(g) + 1, dtype=np.float64)
    return math.fsum(((2.0 ** g - 1.0) / np.log2(i + 1)).tolist())


def expected_ndcg_positionwise(dist, grade, k):
    idcg = ideal_dcg_fsum(grade, k)
    return NAN if idcg == 0 else expected_dcg_positionwise(dist, grade, k) / idcg


# ----------------------------------------------------------------------------
# packing (to feed the kernels; independent of hashdist.data.bits)
# ----------------------------------------------------------------------------


def pack_bits_reference(bits01):
    """(n, B) 0/1 -> (n, ceil(B/64)) uint64, bit i = bit i % 64 of word i // 64."""
    bits01 = np.asarray(bits01)
    n, B = bits01.shape
    W = (B + 63) // 64
    out = np.zeros((n, W), dtype=np.uint64)
    for i in range(n):
        for w in range(W):
            v = 0
            for b in range(64 * w, min(64 * w + 64, B)):
                if bits01[i, b] == 1:
                    v |= 1 << (b - 64 * w)
            out[i, w] = np.uint64(v)
    return out


# ----------------------------------------------------------------------------
# real-valued distances, exactly (docs/metrics.md, section 4b)
# ----------------------------------------------------------------------------


def _common_integers(values):
    """Floats -> (integers n_i, denominator D) with value_i = n_i / D exactly (Fraction of each float64)."""
    fractions = [Fraction(float(v)) for v in values]
    den = math.lcm(*(f.denominator for f in fractions)) if fractions else 1
    return [int(f * den) for f in fractions], den


def exact_weighted_distances(qbits, dbbits, weights):
    """(Q, N) object array of Fractions: sum_i w_i [q_i != j_i], exactly; weights (B,) or (Q, B)."""
    qbits, dbbits = np.asarray(qbits, dtype=np.int64), np.asarray(dbbits, dtype=np.int64)
    rows = np.broadcast_to(np.atleast_2d(np.asarray(weights, dtype=np.float64)), (len(qbits), qbits.shape[1]))
    out = np.empty((len(qbits), len(dbbits)), dtype=object)
    for q in range(len(qbits)):
        ints, den = _common_integers(rows[q])
        totals = (dbbits != qbits[q][None, :]).astype(object) @ np.array(ints, dtype=object)
        out[q] = [Fraction(int(t), den) for t in totals]
    return out


def exact_asymmetric_distances(scores, dbbits):
    """(Q, N) object array of Fractions: -y . b with b = 2 bits - 1 in {-1, +1}^B, exactly."""
    dbbits = np.asarray(dbbits, dtype=np.int64)
    signs = (2 * dbbits - 1).astype(object)
    out = np.empty((len(scores), len(dbbits)), dtype=object)
    for q, row in enumerate(np.asarray(scores, dtype=np.float64)):
        ints, den = _common_integers(row)
        totals = signs @ np.array(ints, dtype=object)
        out[q] = [Fraction(-int(t), den) for t in totals]
    return out


def exact_ranks(values):
    """Dense ranks (int64) of exact values: equal values share a rank, a smaller value has a smaller rank, so
    the ranks are an integer 'distance' with the same ranking and the same tie groups."""
    distinct = sorted(set(values))
    rank = {v: i for i, v in enumerate(distinct)}
    return np.array([rank[v] for v in values], dtype=np.int64)


def auc_list(gr):
    """ROC AUC of one concrete ranked list: the share of (relevant, irrelevant) pairs with the relevant first."""
    n_irr, n_rel = sum(1 for g in gr if g < 1), _n_relevant(gr)
    if n_rel == 0 or n_irr == 0:
        return None
    correct, irrelevant_after = 0, n_irr
    for g in gr:
        if g >= 1:
            correct += irrelevant_after
        else:
            irrelevant_after -= 1
    return Fraction(correct, n_rel * n_irr)


# ----------------------------------------------------------------------------
# cross-modal scripts (docs/metrics.md, section 5c): DCMH's calc_map and DCMH-PyTorch's calc_map_k
# ----------------------------------------------------------------------------
# Transcribed line by line into numpy from the originals, read at these commits:
#   calc_map:   lelan-li/SSAH utils/calc_hammingranking.py (05f9b87e), the DCMH TensorFlow file
#               (jiangqy/DCMH-CVPR2017 DCMH_tensorflow/.../utils/calc_hammingranking.py) verbatim; the same
#               lines in WendellGul/DCMH utils.py (04099f92) and zs-zhong/DJSRH metric.py::calculate_map (f6deff20)
#   calc_map_k: WendellGul/DCMH utils.py (9294e468), torch replaced by numpy
# Codes are {-1,+1} rows, labels {0,1} rows (one-hot for classes); the Hamming distance is the scripts'
# 0.5 * (B - q.b). The only change to calc_map: np.linspace(1, tsum, tsum) is given int(tsum) (a float
# ``num`` raises TypeError on current NumPy). ``kind`` is np.argsort's: the scripts use the default
# ("quicksort", not stable), torch.sort is not stable either; "stable" keeps database order in ties.


def dcmh_hamming(B1, B2):
    """DCMH ``calc_hammingDist``: 0.5 * (q - B1 . B2^T) for {-1,+1} codes."""
    q = B2.shape[1]
    return 0.5 * (q - np.dot(B1, B2.transpose()))


def dcmh_calc_map(qB, rB, query_L, retrieval_L, kind="quicksort"):
    """DCMH ``calc_map``: AP over the whole ranking normalised by R; a query with R = 0 adds 0 to the sum but
    counts in ``num_query``."""
    num_query = query_L.shape[0]
    map = 0
    for iter in range(num_query):
        gnd = (np.dot(query_L[iter, :], retrieval_L.transpose()) > 0).astype(np.float32)
        hamm = dcmh_hamming(qB[iter, :], rB)
        ap = dcmh_ap(gnd, hamm, kind)
        if ap is None:
            continue
        map = map + ap
    map = map / num_query
    return map


def dcmh_ap(gnd, hamm, kind="quicksort"):
    """The body of calc_map's loop for one query (None where it says ``continue``)."""
    tsum = np.sum(gnd)
    if tsum == 0:
        return None
    ind = np.argsort(hamm, kind=kind)
    gnd = gnd[ind]
    count = np.linspace(1, tsum, int(tsum))
    tindex = np.asarray(np.where(gnd == 1)) + 1.0
    return np.mean(count / (tindex))


def dcmh_calc_map_k(qB, rB, query_L, retrieval_L, k=None, kind="quicksort", dtype=np.float32):
    """DCMH-PyTorch ``calc_map_k``: per query, with total = min(k, R), the mean of i / rank_i over the first
    ``total`` relevant items of the whole ranking (not cut at rank k); R = 0 adds 0 but counts in num_query.

    ``dtype``: the script computes in float32 (``.type(torch.float32)``); float64 for comparisons at 1e-12.
    """
    num_query = query_L.shape[0]
    map = 0
    if k is None:
        k = retrieval_L.shape[0]
    for iter in range(num_query):
        q_L = query_L[iter]
        if len(q_L.shape) < 2:
            q_L = q_L[None, :]  # unsqueeze(0)
        gnd = (q_L @ retrieval_L.transpose() > 0).squeeze().astype(dtype)
        hamm = dcmh_hamming(qB[iter, :][None, :], rB)  # calc_hammingDist unsqueezes B1: shape (1, n)
        ap = dcmh_ap_k(gnd, hamm, k, kind, dtype)
        if ap is None:
            continue
        map = map + ap
    map = map / num_query
    return map


def dcmh_ap_k(gnd, hamm, k, kind="quicksort", dtype=np.float32):
    """The body of calc_map_k's loop for one query (None where it says ``continue``)."""
    tsum = np.sum(gnd)
    if tsum == 0:
        return None
    ind = np.argsort(hamm, kind=kind)  # torch.sort(hamm) along the last axis
    ind = ind.reshape(-1)  # ind.squeeze_(): (1, n) -> (n,) (and a 1-item database stays 1-D)
    gnd = gnd[ind]
    total = min(k, int(tsum))
    count = np.arange(1, total + 1).astype(dtype)
    tindex = np.nonzero(gnd)[0][:total].astype(dtype) + dtype(1.0)  # torch.nonzero(gnd)[:total].squeeze() + 1.0
    return np.mean(count / tindex)


def dcmh_scripts_on_ranked(ranked, k=None):
    """(calc_map, calc_map_k) of explicit ranked grade lists, one per query, through the scripts' loop bodies
    (float64): each list is given increasing distances, so every sort keeps its order."""
    aps, aps_k = [], []
    for gr in ranked:
        gnd = (np.asarray(gr, dtype=np.int64) >= 1).astype(np.float64)
        hamm = np.arange(len(gr), dtype=np.float64)
        aps.append(dcmh_ap(gnd, hamm) or 0.0)
        aps_k.append(dcmh_ap_k(gnd, hamm, len(gr) if k is None else k, dtype=np.float64) or 0.0)
    return math.fsum(aps) / len(ranked), math.fsum(aps_k) / len(ranked)


def first_hits_list(gr, k):
    """calc_map_k's value of one ranked list, exactly: with m = min(k, R), (1/m) sum_{i<=m} i / rank_i over the
    first m relevant items (wherever they rank); None when R = 0."""
    m = min(k, _n_relevant(gr))
    if m == 0:
        return None
    hits, s = 0, Fraction(0)
    for rank, g in enumerate(gr, start=1):
        if g >= 1 and hits < m:
            hits += 1
            s += Fraction(hits, rank)
    return s / m


def first_hits_expected_positionwise(dist, grade, k):
    """E[calc_map_k] over tie orders from the distribution of each relevant item's rank (NaN when R = 0).

    In a tie group of n items with r relevant, after N items and R' relevant ones, the j-th relevant item of the
    group (the (R'+j)-th overall) is at group slot x with P = C(x-1, j-1) C(n-x, r-j) / C(n, r) (the j-th
    smallest of r slots drawn from n); the terms (R'+j) P / (N+x) are summed with math.fsum over the first
    m = min(k, R) relevant items. Costs sum over groups of (relevant items used) x n.
    """
    groups = group_sizes(dist, grade)
    R = sum(g[2] for g in groups)
    if R == 0:
        return NAN
    m = min(k, R)
    terms, N, Rp = [], 0, 0
    for _, n, r, _ in groups:
        total = math.comb(n, r)
        for j in range(1, min(r, m - Rp) + 1):
            for x in range(j, n - r + j + 1):
                terms.append((Rp + j) * (math.comb(x - 1, j - 1) * math.comb(n - x, r - j) / total) / (N + x))
        N += n
        Rp += r
        if Rp >= m:
            break
    return math.fsum(terms) / m


# -- small histograms and paper tables, shared by the convention and comparison tests ---------------------


def histogram_of_groups(queries, B=3):
    """(Q, B + 1, 2) histograms of queries given as {distance: (irrelevant, relevant)}."""
    H = np.zeros((len(queries), B + 1, 2), np.int64)
    for q, groups in enumerate(queries):
        for d, counts in groups.items():
            H[q, d] = counts
    return H


def random_group_queries(rng, min_queries, max_queries, max_group):
    """min..max queries on 4 distances, each with 1-3 tie groups of 1..max_group items, any share relevant."""
    queries = []
    for _ in range(int(rng.integers(min_queries, max_queries + 1))):
        groups = {}
        for d in rng.choice(4, size=int(rng.integers(1, 4)), replace=False).tolist():
            n = int(rng.integers(1, max_group + 1))
            r = int(rng.integers(0, n + 1))
            groups[d] = (n - r, r)
        queries.append(groups)
    return queries


def markdown_rows(text):
    """(header, body rows) of a Markdown table, cells stripped."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    split = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return split[0], split[2:]


def intervals_overlap(a, b):
    """Whether two {worst, best} tie intervals share a value."""
    return max(a["worst"], b["worst"]) <= min(a["best"], b["best"])
