"""The report document of an evaluation (see docs/report.md) and :class:`Evaluation`, which carries it with the
arrays behind its figures and writes them."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from hashdist.data.dataset import Dataset
from hashdist.engine.plan import Plan
from hashdist.engine.reduction import RunResult
from hashdist.kernels.distance import DistanceAxis
from hashdist.metrics.conventions import conventions_report
from hashdist.report.evaluation import REPORT_MARKER, plots, provenance, render_html, write_outputs


def build_report(ds: Dataset, plan: Plan, parameters: dict, result: RunResult, timing: dict, engine: dict) -> dict:
    """The report document (docs/report.md)."""
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
        **({"served": result.served} if result.served else {}),
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
        """Write report.json, per_query.zarr and report.html into ``out`` (atomically): a new path, an empty
        directory or a previous report (``overwrite`` is accepted for older callers and replaces nothing else).

        With ``started_at`` (a time.time() value), record write_s and the final wall_s.
        """
        t_write = time.time()

        def finalize(report):
            if started_at is not None:
                now = time.time()
                report["timing"]["write_s"] = now - t_write
                report["timing"]["wall_s"] = now - started_at
                report["throughput"]["pairs_per_s"] = report["throughput"]["pairs"] / report["timing"]["wall_s"]

        return write_outputs(out, self.report, self.per_query, self.render_page, overwrite=overwrite, html=html,
                             finalize=finalize)

    def render_page(self) -> str:
        """report.html: the report with its figures."""
        return render_html(self.report, plots(self.report, self.per_query, self.bucket_sizes))
