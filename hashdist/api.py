"""The Python API for notebooks: evaluate a dataset in this process, no Prefect or Dask needed."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from hashdist.cache import resolve_cache
from hashdist.dataset import Dataset, open_dataset
from hashdist.defaults import DEFAULT_BETA, DEFAULT_K, DEFAULT_RADII
from hashdist.engine import Plan, RunResult, make_plan, run_local
from hashdist.kernels.hashtable import parse_hashtable_spec
from hashdist.metrics.conventions import conventions_report
from hashdist.metrics.summary import MetricParams
from hashdist.protocols import get_protocol, protocol_k
from hashdist.report import REPORT_MARKER, provenance, write_outputs


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
) -> tuple[Dataset, MetricParams, Plan, dict]:
    """Open and validate the dataset and parameters and plan the blocks; returns (ds, params, plan, parameters).

    ``k=None``: the protocol's cut-offs with ``protocol`` (hashdist.protocols), else DEFAULT_K. A protocol
    also adds its script's convention.
    """
    ds = open_dataset(dataset)
    if protocol is not None:
        preset = get_protocol(protocol)
        k = protocol_k(preset, ds.n_database) if k is None else k
        conventions = tuple(dict.fromkeys((*conventions, preset.convention)))
    k = DEFAULT_K if k is None else k
    hashtables = tuple(parse_hashtable_spec(spec, ds.nbits) for spec in hashtable)
    settings = tuple(f"{bits}x{tables}" for bits, tables in hashtables)
    params = MetricParams(tuple(k), tuple(radius), float(beta), empty_queries, settings, max_grade, ds.n_database,
                          conventions=tuple(conventions))
    params.validate(ds.nbits)
    plan = make_plan(
        ds,
        relevance=relevance,
        max_radius=params.max_radius,
        query_block_rows=query_block_rows,
        db_block_rows=db_block_rows,
        hashtables=hashtables,
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
    }
    return ds, params, plan, parameters


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


@dataclass
class Evaluation:
    """A finished evaluation: the report document plus the arrays behind its plots."""

    report: dict
    per_query: dict
    code_counts: np.ndarray

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
            out, self.report, self.per_query, self.code_counts, overwrite=overwrite, html=html, finalize=finalize
        )


def evaluate_local(dataset, *, cache=None, threads: int | None = None, progress=None, **options) -> Evaluation:
    """Evaluate in this process with a thread pool; see :func:`evaluate` for the options."""
    t0 = time.time()
    ds, params, plan, parameters = prepare(dataset, **options)
    threads = threads or os.cpu_count() or 1
    result = run_local(plan, params, resolve_cache(cache), threads=threads, progress=progress)
    timing = {"startup_s": 0.0, **result.timing, "write_s": 0.0, "wall_s": time.time() - t0}
    report = build_report(ds, plan, parameters, result, timing, {"kind": "local-threads", "threads": threads})
    return Evaluation(report, result.per_query, result.code_counts)


def evaluate(dataset, *, cache=None, threads: int | None = None, **options) -> dict:
    """Evaluate a dataset in this process and return the report dict.

    Options: k, radius, beta, empty_queries ("exclude" or "zero"), relevance
    ("class", "multilabel", "explicit"), max_grade, query_block_rows, db_block_rows,
    hashtable (settings "KxL": L tables of K-bit substrings), conventions (names of published scripts whose
    mAP@K to reproduce: deephash, hashnet, trec).
    ``cache``: None for the per-user cache, False for none, or a directory.
    """
    return evaluate_local(dataset, cache=cache, threads=threads, **options).report
