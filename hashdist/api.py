"""The Python API for notebooks: evaluate a dataset in this process, no Prefect or Dask needed."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from hashdist.data.dataset import Dataset, open_dataset
from hashdist.data.inputs import check_scores
from hashdist.data.protocols import get_protocol, protocol_k
from hashdist.defaults import DEFAULT_BETA, DEFAULT_DISTANCE_BINS, DEFAULT_K, DEFAULT_RADII
from hashdist.engine.cache import resolve_cache
from hashdist.engine.run import Plan, RunResult, for_threads, make_plan, run_local
from hashdist.errors import InputError, is_integer
from hashdist.kernels.distance import (
    KINDS,
    DistanceAxis,
    asymmetric_axis,
    check_bins,
    check_weights,
    weighted_axis,
)
from hashdist.kernels.hashtable import parse_hashtable_spec
from hashdist.metrics.conventions import conventions_report
from hashdist.metrics.summary import MetricParams
from hashdist.progress import advance, progress_bar
from hashdist.report.evaluation import REPORT_MARKER, provenance, write_outputs

_NUMBER = (int, float, np.integer, np.floating)


def prepare(
    dataset,
    *,
    k=None,
    radius=DEFAULT_RADII,
    beta: float = DEFAULT_BETA,
    empty_queries: str = "exclude",
    relevance: str | None = None,
    max_grade: int | None = None,
    query_block_rows: int | None = None,
    db_block_rows: int | None = None,
    hashtable=(),
    conventions=(),
    protocol: str | None = None,
    distance: str | None = None,
    bit_weights=None,
    distance_bins: int = DEFAULT_DISTANCE_BINS,
    code_parts: int | None = None,
) -> tuple[Dataset, MetricParams, Plan, dict]:
    """Open and validate the dataset and parameters and plan the blocks; returns (ds, params, plan, parameters).

    ``k=None``: the protocol's cut-offs with ``protocol`` (hashdist.data.protocols), else DEFAULT_K. A protocol
    also adds its script's convention. ``distance``: "hamming", "weighted" (needs ``bit_weights``, an array
    or a .npy path, (B,) or (Q, B)) or "asymmetric" (the dataset's query scores); default "weighted" when
    ``bit_weights`` is given, else "hamming". ``distance_bins``: G, the bins of a real-valued distance.
    ``code_parts``: parts the distinct database codes are split into (default from the database's size;
    results never depend on it, memory per part does). ``k``, ``radius``, ``hashtable`` and ``conventions``
    take one value or a list of them (a string is one value).
    """
    radius = _listed(radius, "--radius / radius=", _NUMBER, "a number")
    hashtable = _listed(hashtable, "--hashtable / hashtable=", str, "a KxL setting")
    conventions = _listed(conventions, "--convention / conventions=", str, "a convention name")
    ds = open_dataset(dataset)
    if protocol is not None:
        preset = get_protocol(protocol)
        k = protocol_k(preset, ds.n_database) if k is None else k
        conventions = tuple(dict.fromkeys((*conventions, preset.convention)))
    k = _listed(DEFAULT_K if k is None else k, "--k / k=", _NUMBER, "a number")
    hashtables = tuple(parse_hashtable_spec(spec, ds.nbits) for spec in hashtable)
    settings = tuple(f"{bits}x{tables}" for bits, tables in hashtables)
    distance = distance or ("weighted" if bit_weights is not None else "hamming")
    if distance not in KINDS:
        raise InputError(f"--distance {distance!r}: unknown (known: {', '.join(KINDS)})")
    radius = tuple(int(r) if float(r).is_integer() else float(r) for r in radius)  # whole: int (report key "2")
    params = MetricParams(k, radius, float(beta), empty_queries, settings, max_grade, ds.n_database,
                          conventions=conventions, distance=distance)
    params.validate(ds.nbits)
    axis = _distance_axis(ds, distance, bit_weights, distance_bins, params.radii)
    if axis is not None:
        params = replace(params, radius_bins=tuple(axis.position(r) for r in params.radii),
                         bin_edges=tuple(axis.upper.tolist()))
    plan = make_plan(
        ds,
        relevance=relevance,
        max_radius=params.max_radius,
        query_block_rows=query_block_rows,
        db_block_rows=db_block_rows,
        hashtables=hashtables,
        distance=axis,
        code_parts=code_parts,
    )
    parameters = {
        "k": list(params.ks),
        "radius": list(params.radii),
        "beta": params.beta,
        "empty_queries": params.empty_queries,
        "relevance": plan.relevance,
        "max_grade": params.max_grade,
        "query_block_rows": plan.query_block_rows,
        "db_block_rows": plan.db_block_rows,
        "hashtable": list(settings),
        "protocol": protocol,
        "conventions": list(params.conventions),
        "distance": distance,
        "bit_weights": bit_weights if isinstance(bit_weights, (str, os.PathLike)) or bit_weights is None else "array",
        "distance_bins": None if axis is None else axis.bins,
    }
    if isinstance(parameters["bit_weights"], os.PathLike):
        parameters["bit_weights"] = str(parameters["bit_weights"])
    return ds, params, plan, parameters


def _listed(value, name: str, kinds, what: str) -> tuple:
    """An option given as one value or an iterable of values (a string is one value), as a tuple of ``kinds``."""
    listed = isinstance(value, Iterable) and not isinstance(value, str) and getattr(value, "ndim", 1)  # not 0-d
    values = tuple(value) if listed else (value,)
    if not all(isinstance(v, kinds) and not isinstance(v, bool) for v in values):
        raise InputError(f"{name}: expected {what} or a list of them, got {value!r}")
    return values


def _distance_axis(ds: Dataset, distance: str, bit_weights, bins, radii) -> DistanceAxis | None:
    """The bins of a weighted or asymmetric distance (hashdist.kernels.distance), or None for plain Hamming."""
    if distance != "weighted" and bit_weights is not None:
        raise InputError(f"--bit-weights: only with --distance weighted, not {distance}")
    if distance == "hamming":
        return None
    bins = check_bins(bins)
    if distance == "weighted":
        if bit_weights is None:
            raise InputError("--distance weighted needs --bit-weights W.npy")
        if isinstance(bit_weights, (str, os.PathLike)):
            from hashdist.data.inputs import load_array

            bit_weights = load_array(bit_weights)
        return weighted_axis(check_weights(bit_weights, ds.nbits, ds.n_queries), bins, radii)
    if not ds.has("queries/scores"):
        raise InputError(f"{ds.url}: --distance asymmetric needs the queries' real-valued scores "
                         "(hashdist ingest --query-scores)")
    scores = check_scores(ds.read("queries/scores", 0, ds.n_queries), ds.nbits, ds.n_queries, "queries/scores")
    return asymmetric_axis(scores, bins, radii, ds.fingerprints["queries/scores"].digest)


def build_report(ds: Dataset, plan: Plan, parameters: dict, result: RunResult, timing: dict, engine: dict) -> dict:
    """The report document (see README: report keys)."""
    wall = timing.get("wall_s") or 0.0
    return {
        "format": REPORT_MARKER,
        "metrics": result.metrics,
        "queries": result.queries,
        "conventions": conventions_report(result.per_query, parameters["conventions"], parameters["k"]),
        "dataset": {
            "path": ds.url,
            "nbits": ds.nbits,
            "n_database": ds.n_database,
            "n_queries": ds.n_queries,
            "relevance": plan.relevance,
            "fingerprint": ds.fingerprint,
        },
        "distance": _distance_report(plan.distance, result.metrics),
        "grades": {"largest": plan.largest_grade, "cap": parameters["max_grade"],
                   "relevant_pairs_capped": int(result.per_query["capped_pairs"].sum())},
        "code_usage": result.code_usage,
        "parameters": parameters,
        "provenance": provenance(ds.fingerprint, parameters),
        "blocks": result.blocks,
        "timing": timing,
        "throughput": {"pairs": plan.pairs, "pairs_per_s": plan.pairs / wall if wall else None},
        "engine": engine,
    }


def _distance_report(axis: DistanceAxis | None, metrics: dict) -> dict:
    """The ranking distance; for a binned one its bins and the width of mAP's certified interval [worst, best]."""
    if axis is None:
        return {"kind": "hamming", "exact": True}
    return {**axis.summary(), "map_interval_width": metrics["map"]["best"] - metrics["map"]["worst"]}


@dataclass
class Evaluation:
    """A finished evaluation: the report document plus the arrays behind its plots."""

    report: dict
    per_query: dict
    bucket_sizes: np.ndarray  # (size, codes) rows of the database's code usage
    verdict: dict | None = None  # a run recorded in a history store: its test against the run before it

    def write(self, out, *, overwrite: bool = False, html: bool = True, started_at: float | None = None):
        """Write report.json, per_query.zarr and report.html into ``out`` (atomically).

        With ``started_at`` (a time.time() value), record write_s and the final wall_s.
        """
        t_write = time.time()

        def finalize(report):
            if started_at is not None:
                now = time.time()
                report["timing"]["write_s"] = now - t_write
                report["timing"]["wall_s"] = now - started_at
                report["throughput"]["pairs_per_s"] = report["throughput"]["pairs"] / report["timing"]["wall_s"]

        return write_outputs(
            out, self.report, self.per_query, self.bucket_sizes, overwrite=overwrite, html=html, finalize=finalize
        )


def evaluate_local(dataset, *, cache=None, threads: int | None = None, progress: bool = False,
                   **options) -> Evaluation:
    """Evaluate in this process with a thread pool; see :func:`evaluate` for the options. ``progress``: a bar
    of histogram blocks on stderr while they run, when stderr is a terminal."""
    t0 = time.time()
    if threads is not None and (not is_integer(threads) or threads < 1):
        raise InputError(f"--threads / threads=: expected a positive integer or None, got {threads!r}")
    ds, params, plan, parameters = prepare(dataset, **options)
    threads = threads or os.cpu_count() or 1
    plan = for_threads(plan, threads)
    lock, pairs = threading.Lock(), [0]  # the blocks' threads report to one bar
    with progress_bar(len(plan.histogram_blocks), progress) as bar:

        def block_done(block, _cached):
            with lock:
                pairs[0] += block.pairs
                advance(bar, 1, pairs[0], t0)

        result = run_local(plan, params, resolve_cache(cache), threads=threads, progress=block_done)
    timing = {"startup_s": 0.0, **result.timing, "write_s": 0.0, "wall_s": time.time() - t0}
    engine = {"kind": "local-threads", "threads": threads, "code_parts": plan.code_parts}
    report = build_report(ds, plan, parameters, result, timing, engine)
    return Evaluation(report, result.per_query, result.bucket_sizes)


def evaluate(dataset, *, cache=None, threads: int | None = None, **options) -> dict:
    """Evaluate a dataset in this process and return the report dict.

    Options: those of :func:`prepare` (k, radius, beta, empty_queries, relevance, max_grade, block rows,
    hashtable, conventions, protocol, distance, bit_weights, distance_bins, code_parts), each the CLI
    option of the same name. ``cache``: None or True for the per-user cache, False for none, or a directory.
    """
    return evaluate_local(dataset, cache=cache, threads=threads, **options).report
