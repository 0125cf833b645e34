"""Ground truth from real-valued features: epsilon-ball and top-percent neighbours (docs/metrics.md, section 5).

Conventions:

- Distances are Euclidean. The *exact* squared distance of a pair is the float64 sum of squared
  differences over the dimensions in order 0..D-1 (no fused multiply-add); every threshold and
  every membership decision is taken on exact distances, so the ground truth does not depend on
  block sizes, workers or the BLAS library.
- ``epsilon_ball``: relevant iff sqrt(exact) <= epsilon. Unless given, epsilon is the mean over
  ``sample`` seeded database rows of the exact distance to their ``neighbors``-th nearest
  database row, the row itself excluded (a duplicate of it counts, at distance 0).
- ``top_percent``: k = ceil(percent / 100 * N), percent read as the decimal it prints as;
  relevant iff exact <= the k-th smallest exact distance (items tied with the k-th are included).

Blocks first compute *approximate* squared distances as matrix products, ||x||^2 + ||y||^2 - 2 x.y
in the features' dtype, whose error is below ``margin_factor`` x (||x||^2 + ||y||^2) (the rounding
bound of D-term dot products, three times over); only pairs that close to a threshold are
recomputed exactly. The work is a few sweeps over (query block x database block):

- ``smallest``: per query, the k smallest approximate squared distances of the block; merged over
  blocks, the approximate k-th nearest distance, within the margin of the exact one;
- ``band``: per query, given an exact bracket [lo, hi] of its threshold: the rows surely inside
  (approximate < lo - margin) and the rows in the band (approximate within the margin of the
  bracket) with their exact distances, as CSR sorted by database row (exact is NaN if sure).

A smallest sweep then a band sweep give exact k-th distances (top_percent's thresholds, and the
sampled rows' neighbour distances for epsilon); one band sweep around epsilon^2 decides the
epsilon ball. :func:`compute` runs a method given a function that runs one sweep; :func:`run_local`
runs sweeps with threads, ``flows/groundtruth.py`` as Prefect tasks on Dask. No Prefect or Dask here.
"""

from __future__ import annotations

import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from fractions import Fraction

import numpy as np
from threadpoolctl import threadpool_limits

from hashdist.data.dataset import (
    FEATURES,
    Dataset,
    chunk_digest,
    combine_digests,
    open_dataset,
    replace_relevant,
    task_url,
)
from hashdist.defaults import (
    DEFAULT_DB_BLOCK_ROWS,
    GROUNDTRUTH_NEIGHBORS,
    GROUNDTRUTH_QUERY_BLOCK_ROWS,
    GROUNDTRUTH_SAMPLE,
)
from hashdist.engine.blocks import Block, row_ranges
from hashdist.engine.cache import BlockCache, resolve_cache
from hashdist.errors import InputError, check_integer
from hashdist.kernels import cached_njit
from hashdist.progress import progress_bar

GROUNDTRUTH_VERSION = 1
TILE_ELEMENTS = 1 << 24  # approximate distances held at once by one block (64 MiB in float32)
EPSILON_SLACK = 1e-9  # relative widening of epsilon^2 that covers float64 rounding of sqrt and squares


def margin_factor(dim: int, dtype) -> float:
    """Bound on |approximate - exact| squared distance per unit of ||x||^2 + ||y||^2."""
    return 3.0 * (dim + 8) * float(np.finfo(dtype).eps)  # 3 x 2(D+8) unit roundoffs


@cached_njit(nogil=True)
def _exact_sq_distances(x, y, rows, cols):  # pragma: no cover - compiled
    out = np.empty(rows.shape[0], dtype=np.float64)
    for p in range(rows.shape[0]):
        s = 0.0
        for j in range(x.shape[1]):
            t = np.float64(x[rows[p], j]) - np.float64(y[cols[p], j])
            s += t * t
        out[p] = s
    return out


def exact_sq_distances(x: np.ndarray, y: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Exact squared distances of the pairs (x[rows[i]], y[cols[i]]) (see the module conventions)."""
    return _exact_sq_distances(x, y, rows.astype(np.int64), cols.astype(np.int64))


# -- parameters -----------------------------------------------------------------


@dataclass(frozen=True)
class Params:
    """A validated request; options that do not apply to the method are None."""

    method: str
    neighbors: int | None = None
    sample: int | None = None
    seed: int | None = None
    epsilon: float | None = None
    percent: float | None = None
    query_block_rows: int = GROUNDTRUTH_QUERY_BLOCK_ROWS
    db_block_rows: int = DEFAULT_DB_BLOCK_ROWS

    def top_k(self, n_database: int) -> int:
        return math.ceil(Fraction(repr(self.percent)) * n_database / 100)


def check_features(ds: Dataset) -> None:
    if not all(ds.has(name) for name in FEATURES):
        raise InputError(f"{ds.url}: dataset has no features (ingest with --db-features and --query-features)")
    db, qs = (ds.array(name) for name in FEATURES)
    if db.ndim != 2 or qs.ndim != 2 or db.shape[1] != qs.shape[1]:
        raise InputError(f"{ds.url}: queries/features {qs.shape} and database/features {db.shape} do not match")
    if ds.n_database != db.shape[0] or ds.n_queries != qs.shape[0]:
        raise InputError(f"{ds.url}: features and codes have different row counts")


def epsilon_estimate(n: int, neighbors, sample, seed) -> dict:
    """The checked options of estimating epsilon from ``sample`` database rows' ``neighbors``-th nearest row."""
    neighbors = check_integer(GROUNDTRUTH_NEIGHBORS if neighbors is None else neighbors, "--neighbors")
    sample = check_integer(GROUNDTRUTH_SAMPLE if sample is None else sample, "--sample")
    seed = check_integer(0 if seed is None else seed, "--seed", 0)
    if neighbors >= n:
        raise InputError(
            f"--neighbors {neighbors} must be below the {n} database items (a point is not its own neighbour)")
    if sample > n:
        raise InputError(f"--sample {sample} exceeds the {n} database items")
    return dict(neighbors=neighbors, sample=sample, seed=int(seed))


# -- sweeps and their blocks --------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Sweep:
    """One kind of work over every (query block, database block): all a worker needs for any block.

    Queries are the dataset's queries, or with ``sample`` the database rows listed there (their
    features in ``sample_features``), each excluded from its own neighbours.
    """

    url: str
    kind: str  # "smallest" or "band"
    dtype: str  # dtype of the approximate distances
    query_blocks: tuple[tuple[int, int], ...]
    n_db_blocks: int
    blocks: tuple[Block, ...]
    sample: np.ndarray | None = None
    sample_features: np.ndarray | None = None
    k: int = 0  # smallest: values kept per query
    lo: np.ndarray | None = None  # band: exact bracket of each query's threshold (squared distances)
    hi: np.ndarray | None = None


def make_sweep(ds: Dataset, params: Params, kind: str, *, sample=None, sample_features=None, k=0, lo=None, hi=None):
    """Blocks aligned to the feature chunks, each keyed on the fingerprints of what it reads."""
    fp = ds.fingerprints
    dtype = np.result_type(*(ds.array(name).dtype for name in FEATURES)).name
    if sample is None:
        query_blocks = row_ranges(ds.n_queries, params.query_block_rows)

        def query_digest(q0, q1):
            return fp["queries/features"].rows_digest(q0, q1)
    else:
        query_blocks = row_ranges(len(sample), params.query_block_rows)

        def query_digest(q0, q1):
            return combine_digests(("sample", chunk_digest(sample[q0:q1]), chunk_digest(sample_features[q0:q1])))

    db_blocks = row_ranges(ds.n_database, params.db_block_rows)

    def work_digest(q0, q1):
        if kind == "smallest":
            return str(k)
        return combine_digests((chunk_digest(lo[q0:q1]), chunk_digest(hi[q0:q1])))

    blocks = tuple(
        Block(q0, q1, d0, d1, combine_digests(("groundtruth", GROUNDTRUTH_VERSION, kind, dtype, work_digest(q0, q1),
                                               query_digest(q0, q1), fp["database/features"].rows_digest(d0, d1))))
        for q0, q1 in query_blocks
        for d0, d1 in db_blocks
    )
    return Sweep(task_url(ds.url), kind, dtype, tuple(query_blocks), len(db_blocks), blocks, sample, sample_features,
                 k, lo, hi)


def _read_features(ds: Dataset, name: str, start: int, stop: int) -> np.ndarray:
    block = ds.read(name, start, stop)
    if not np.isfinite(block).all():
        raise InputError(f"{ds.url}: {name} rows {start}..{stop} contain NaN or infinity")
    return block


def _approx_sq_distances(x, y, nx, ny) -> np.ndarray:
    d = x @ y.T
    d *= -2
    d += nx[:, None]
    d += ny[None, :]
    return d


def _norms(a: np.ndarray, url: str) -> np.ndarray:
    norms = np.einsum("ij,ij->i", a, a)
    if not np.isfinite(norms).all():
        raise InputError(f"{url}: feature values are too large for {a.dtype} distances")
    return norms


def compute_block(sweep: Sweep, block: Block, ds: Dataset | None = None) -> dict[str, np.ndarray]:
    """One block's result (see the module docstring); reads its own rows."""
    ds = ds or open_dataset(sweep.url)
    if sweep.sample is None:
        x = _read_features(ds, "queries/features", block.q0, block.q1)
        self_cols = None
    else:
        x = sweep.sample_features[block.q0 : block.q1]
        self_cols = sweep.sample[block.q0 : block.q1] - block.d0  # own column, if in this block
    y = _read_features(ds, "database/features", block.d0, block.d1)
    xc, yc = x.astype(sweep.dtype, copy=False), y.astype(sweep.dtype, copy=False)
    nx, ny = _norms(xc, ds.url), _norms(yc, ds.url)
    step = max(1, TILE_ELEMENTS // len(y))
    if sweep.kind == "smallest":
        return _smallest_block(sweep.k, xc, yc, nx, ny, self_cols, step)
    factor = margin_factor(x.shape[1], sweep.dtype)
    margin = factor * (nx.astype(np.float64) + float(ny.max()))
    return _band_block(x, y, xc, yc, nx, ny, sweep.lo[block.q0 : block.q1] - margin,
                       sweep.hi[block.q0 : block.q1] + margin, self_cols, block.d0, step)


def _exclude_self(d: np.ndarray, self_cols: np.ndarray | None) -> None:
    if self_cols is not None:
        rows = np.flatnonzero((self_cols >= 0) & (self_cols < d.shape[1]))
        d[rows, self_cols[rows]] = np.inf


def _distance_tiles(x, y, nx, ny, self_cols, step):
    """(t0, t1, approximate squared distances of queries t0:t1 to the rows of y, a query's own row at infinity),
    ``step`` queries a tile."""
    for t0 in range(0, len(x), step):
        t1 = min(t0 + step, len(x))
        d = _approx_sq_distances(x[t0:t1], y, nx[t0:t1], ny)
        _exclude_self(d, None if self_cols is None else self_cols[t0:t1])
        yield t0, t1, d


def _smallest_block(k, x, y, nx, ny, self_cols, step) -> dict[str, np.ndarray]:
    keep = min(k, len(y))
    smallest = np.empty((len(x), keep), dtype=x.dtype)
    for t0, t1, d in _distance_tiles(x, y, nx, ny, self_cols, step):
        smallest[t0:t1] = np.partition(d, keep - 1, axis=1)[:, :keep] if keep < len(y) else d
    return {"smallest": smallest, "query_norms": nx.astype(np.float64), "db_norm_max": np.float64(ny.max())}


def _band_block(x, y, xc, yc, nx, ny, lo, hi, self_cols, d0, step) -> dict[str, np.ndarray]:
    # thresholds rounded outwards into the approximate dtype
    lo = np.nextafter(lo.astype(xc.dtype), xc.dtype.type(-np.inf))
    hi = np.nextafter(hi.astype(xc.dtype), xc.dtype.type(np.inf))
    all_rows, all_cols, all_exact = [], [], []
    for t0, t1, d in _distance_tiles(xc, yc, nx, ny, self_cols, step):
        rows, cols = np.nonzero(d <= hi[t0:t1, None])  # row-major: by query, then database row
        band = d[rows, cols] >= lo[t0 + rows]
        rows += t0
        exact = np.full(len(rows), np.nan)
        exact[band] = exact_sq_distances(x, y, rows[band], cols[band])
        all_rows.append(rows)
        all_cols.append(cols)
        all_exact.append(exact)
    rows = np.concatenate(all_rows)
    indptr = np.zeros(len(x) + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=len(x)), out=indptr[1:])
    return {"indptr": indptr, "indices": np.concatenate(all_cols).astype(np.int64) + d0,
            "exact": np.concatenate(all_exact)}


def cached_block(sweep: Sweep, block: Block, cache: BlockCache) -> tuple[dict[str, np.ndarray], bool]:
    """(result, True if it came from the cache)."""
    names = {"smallest", "query_norms", "db_norm_max"} if sweep.kind == "smallest" else {"indptr", "indices", "exact"}
    hit = cache.get(block.key)
    if hit is not None and set(hit) == names:
        return hit, True
    result = compute_block(sweep, block)
    cache.put(block.key, result)
    return result, False


# -- merging block results ------------------------------------------------------------


class SmallestMerger:
    """Keeps, per query, the k smallest approximate squared distances over the blocks added so far."""

    def __init__(self, sweep: Sweep):
        self.sweep = sweep
        self.smallest: dict[int, np.ndarray] = {}
        self.query_norms: dict[int, np.ndarray] = {}
        self.db_norm_max = 0.0

    def add(self, block: Block, result: dict[str, np.ndarray]) -> None:
        values = result["smallest"]
        if block.q0 in self.smallest:
            values = np.concatenate([self.smallest[block.q0], values], axis=1)
            if values.shape[1] > self.sweep.k:
                values = np.partition(values, self.sweep.k - 1, axis=1)[:, : self.sweep.k]
        self.smallest[block.q0] = values
        self.query_norms[block.q0] = result["query_norms"]
        self.db_norm_max = max(self.db_norm_max, float(result["db_norm_max"]))

    def brackets(self, dim: int) -> tuple[np.ndarray, np.ndarray]:
        """Per query, [lo, hi] containing the exact k-th smallest squared distance."""
        kth = np.concatenate([self.smallest[q0].max(axis=1) for q0, _ in self.sweep.query_blocks]).astype(np.float64)
        norms = np.concatenate([self.query_norms[q0] for q0, _ in self.sweep.query_blocks])
        bound = margin_factor(dim, self.sweep.dtype) * (norms + self.db_norm_max)
        return kth - bound, kth + bound


class BandMerger:
    """Decides membership per query block once all its database blocks are in.

    With ``k``, members are the rows within the k-th smallest exact distance (which becomes the
    query's threshold); with ``epsilon``, the rows with sqrt(exact) <= epsilon.
    """

    def __init__(self, sweep: Sweep, *, k: int | None = None, epsilon: float | None = None):
        self.sweep, self.k, self.epsilon = sweep, k, epsilon
        self.parts: dict[int, dict[int, dict]] = {}
        self.done: dict[int, tuple[list[np.ndarray], np.ndarray]] = {}

    def add(self, block: Block, result: dict[str, np.ndarray]) -> None:
        parts = self.parts.setdefault(block.q0, {})
        parts[block.d0] = result
        if len(parts) == self.sweep.n_db_blocks:
            self.done[block.q0] = self._select([parts[d0] for d0 in sorted(parts)], block.q1 - block.q0)
            del self.parts[block.q0]

    def _select(self, parts, n_queries):
        members, thresholds = [], np.full(n_queries, np.nan)
        for q in range(n_queries):
            indices = np.concatenate([p["indices"][p["indptr"][q] : p["indptr"][q + 1]] for p in parts])
            exact = np.concatenate([p["exact"][p["indptr"][q] : p["indptr"][q + 1]] for p in parts])
            sure = np.isnan(exact)
            if self.k is None:
                inside = sure | (np.sqrt(exact) <= self.epsilon)
            else:
                need, band = self.k - int(sure.sum()), exact[~sure]
                if not 1 <= need <= len(band):
                    raise RuntimeError(f"query {q}: k-th distance outside its bracket (distance error bound broken)")
                thresholds[q] = np.partition(band, need - 1)[need - 1]
                inside = sure | (exact <= thresholds[q])
            members.append(indices[inside])
        return members, thresholds

    def finish(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(indptr, indices sorted per query, thresholds) over all queries, in query order."""
        members = [m for q0, _ in self.sweep.query_blocks for m in self.done[q0][0]]
        thresholds = np.concatenate([self.done[q0][1] for q0, _ in self.sweep.query_blocks])
        indptr = np.zeros(len(members) + 1, dtype=np.int64)
        np.cumsum([len(m) for m in members], out=indptr[1:])
        indices = np.concatenate(members) if members else np.zeros(0, dtype=np.int64)
        return indptr, indices.astype(np.int64, copy=False), thresholds


# -- the methods ----------------------------------------------------------------------


@dataclass
class GroundTruth:
    """Relevant database rows per query (CSR, grade 1) and how they were found."""

    indptr: np.ndarray
    indices: np.ndarray
    record: dict  # stored as the dataset's ``groundtruth`` attribute


def _nearest(ds: Dataset, params: Params, run_sweep, k: int, **query_set) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact k nearest (with ties at the k-th) of every query: (indptr, indices, k-th squared distances)."""
    smallest = make_sweep(ds, params, "smallest", k=k, **query_set)
    merger = SmallestMerger(smallest)
    run_sweep(smallest, merger)
    lo, hi = merger.brackets(ds.array(FEATURES[0]).shape[1])
    band = make_sweep(ds, params, "band", lo=lo, hi=hi, **query_set)
    members = BandMerger(band, k=k)
    run_sweep(band, members)
    return members.finish()


def estimate_epsilon(ds: Dataset, params: Params, run_sweep) -> tuple[float, np.ndarray]:
    """(epsilon, sampled database rows): the mean exact distance of the sample to its neighbors-th neighbour."""
    rng = np.random.default_rng(params.seed)
    sample = np.sort(rng.choice(ds.n_database, size=params.sample, replace=False)).astype(np.int64)
    features = np.asarray(ds.array("database/features").get_orthogonal_selection((sample, slice(None))))
    if not np.isfinite(features).all():
        raise InputError(f"{ds.url}: database/features contain NaN or infinity")
    _, _, kth = _nearest(ds, params, run_sweep, params.neighbors, sample=sample, sample_features=features)
    return math.fsum(np.sqrt(kth)) / len(sample), sample


def compute(ds: Dataset, params: Params, run_sweep) -> GroundTruth:
    """Run the method; ``run_sweep(sweep, merger)`` must compute every block and ``merger.add`` each result.

    BLAS runs one thread per call meanwhile: blocks run in parallel instead (threads in this process).
    """
    with threadpool_limits(1, user_api="blas"):
        return _compute(ds, params, run_sweep)


def _compute(ds: Dataset, params: Params, run_sweep) -> GroundTruth:
    record = {"method": params.method, "version": GROUNDTRUTH_VERSION,
              "parameters": {k: v for k, v in asdict(params).items()
                             if v is not None and k not in ("method", "query_block_rows", "db_block_rows")},
              "features": {name: ds.fingerprints[name].digest for name in FEATURES}}
    if params.method == "top_percent":
        k = params.top_k(ds.n_database)
        indptr, indices, _ = _nearest(ds, params, run_sweep, k)
        record.update(k=k)
        return GroundTruth(indptr, indices, record)
    epsilon, sample = params.epsilon, []
    if epsilon is None:
        epsilon, sample = estimate_epsilon(ds, params, run_sweep)
    bound = np.full(ds.n_queries, epsilon * epsilon)
    band = make_sweep(ds, params, "band", lo=bound * (1 - EPSILON_SLACK), hi=bound * (1 + EPSILON_SLACK))
    members = BandMerger(band, epsilon=epsilon)
    run_sweep(band, members)
    indptr, indices, _ = members.finish()
    record.update(epsilon=epsilon, sample_indices=[int(i) for i in sample])
    return GroundTruth(indptr, indices, record)


def write(dataset, gt: GroundTruth) -> Dataset:
    """Store the CSR as ``queries/relevant`` of ``dataset`` (a path, URL or open Dataset), replacing any previous
    one, and record how it was made; refuses ground truth computed from other features."""
    ds = dataset if isinstance(dataset, Dataset) else open_dataset(dataset)
    features = {name: ds.fingerprints[name].digest for name in FEATURES if name in ds.fingerprints}
    if gt.record.get("features") != features:
        raise InputError(f"{ds.url}: this ground truth was computed from other features than the dataset's")
    kinds = list(ds.relevance_kinds)
    if "explicit" not in kinds:
        kinds.insert(0 if not ds.has("database/labels") else len(kinds), "explicit")
    record = {**gt.record, "relevant_pairs": int(gt.indptr[-1])}
    return replace_relevant(ds.url, gt.indptr, gt.indices, {"relevance": kinds, "groundtruth": record})


def run_local(ds: Dataset, params: Params, *, cache=None, threads: int | None = None, progress: bool = False
              ) -> tuple[GroundTruth, dict]:
    """Compute the ground truth of a checked request (hashdist.options.GroundTruthOptions.resolve) with a thread
    pool in this process: (ground truth, {blocks, timing}).

    ``progress``: a bar of blocks on stderr while they run, when stderr is a terminal. Nothing is written
    (see :func:`write`).
    """
    t0 = time.time()
    store = resolve_cache(cache)
    blocks = {"computed": 0, "cached": 0}
    with ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool, progress_bar(0, progress) as bar:

        def run_sweep(sweep, merger):
            bar.total += len(sweep.blocks)
            bar.refresh()
            for block, (result, was_cached) in zip(
                sweep.blocks, pool.map(lambda b: cached_block(sweep, b, store), sweep.blocks), strict=True
            ):
                merger.add(block, result)
                blocks["cached" if was_cached else "computed"] += 1
                bar.update(1)

        gt = compute(ds, params, run_sweep)
    return gt, {"blocks": blocks, "timing": {"compute_s": time.time() - t0}}
