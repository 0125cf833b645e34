"""The report of a run over the tasks of a dataset with modalities (cross-modal retrieval, docs/cross-modal.md).

``report["tasks"][task]`` holds what a unimodal report holds (``metrics``, ``queries``, ``conventions``,
``dataset``, ``distance``, ``grades``, ``code_usage``, ``blocks``) for the task ``a->b``; the run's
``parameters``, ``provenance``, ``timing``, ``engine`` and ``throughput`` are given once. ``task_mean``
holds each headline measure's mean over the tasks (the "mean" column of cross-modal papers): expected,
best and worst of the mean, since tie orders are independent across tasks. Per-query arrays are written
per task (``per_query.zarr/<task>/...``).
"""

from __future__ import annotations

import html

import numpy as np

from hashdist.data.dataset import combine_digests
from hashdist.metrics.registry import POLICIES, headline_rows
from hashdist.report.document import Evaluation
from hashdist.report.evaluation import (
    CITATIONS,
    REPORT_MARKER,
    definitions,
    format_table,
    no_relevant_reason,
    plotted_cutoffs,
    provenance,
    provenance_rows,
    tables,
)
from hashdist.report.render import (
    Figure,
    draw_figures,
    fmt,
    html_definitions,
    html_figures,
    html_table,
    page,
    text_table,
)

RUN_KEYS = ("format", "parameters", "provenance", "timing", "engine", "throughput", "outputs")
PRINTED_ARROW = "→"  # how the tables and the page print a task


def task_label(task: str) -> str:
    """``image->text`` as papers print it: ``image→text``."""
    return task.replace("->", PRINTED_ARROW)


def combine_tasks(evaluations: dict[str, Evaluation], timing: dict, wall: float, engine: dict) -> Evaluation:
    """One evaluation of the run from each task's (``evaluations``: task -> its unimodal-shaped evaluation);
    ``timing`` (startup_s, compute_s) gets write_s and the run's ``wall`` seconds."""
    tasks = {task: {k: v for k, v in e.report.items() if k not in RUN_KEYS} for task, e in evaluations.items()}
    first = next(iter(evaluations.values())).report
    dataset = {**{k: first["dataset"][k] for k in ("path", "nbits", "n_database", "n_queries", "relevance")},
               "tasks": list(tasks),
               "fingerprint": combine_digests(f"{t}={r['dataset']['fingerprint']}" for t, r in tasks.items())}
    parameters = {**{k: v for k, v in first["parameters"].items() if k != "task"}, "tasks": list(tasks)}
    pairs = sum(e.report["throughput"]["pairs"] for e in evaluations.values())
    timing = {**timing, "write_s": 0.0, "wall_s": wall}
    report = {"format": REPORT_MARKER, "tasks": tasks, "task_mean": task_mean(tasks), "dataset": dataset,
              "parameters": parameters, "provenance": provenance(dataset["fingerprint"], parameters),
              "timing": timing, "throughput": {"pairs": pairs, "pairs_per_s": pairs / wall if wall else None},
              "engine": engine}
    return TaskEvaluation(report, {t: e.per_query for t, e in evaluations.items()},
                          {t: e.bucket_sizes for t, e in evaluations.items()})


def run_blocks(report: dict) -> dict:
    """The blocks of a run: a unimodal report's, or every task's summed."""
    if "tasks" not in report:
        return report["blocks"]
    keys = ("computed", "cached", "total", "computed_pairs")
    return {k: sum(t["blocks"].get(k) or 0 for t in report["tasks"].values()) for k in keys}


def task_mean(tasks: dict[str, dict]) -> dict[str, dict]:
    """Each headline measure's mean over the tasks, {label: {expected, best, worst}}."""
    rows = [dict(headline_rows(t["metrics"])) for t in tasks.values()]
    return {label: {p: float(np.mean([r[label][p] for r in rows])) for p in POLICIES} for label in rows[0]}


def tasks_headline(report: dict) -> tuple[str, list[str], list[list[str]]]:
    """The headline measures side by side: a column per task and their mean, each "expected [worst, best]"."""

    def cell(v):
        return f"{fmt(v['expected'])} [{fmt(v['worst'])}, {fmt(v['best'])}]" if v["worst"] != v["best"] \
            else fmt(v["expected"])

    per_task = {t: dict(headline_rows(r["metrics"])) for t, r in report["tasks"].items()}
    header = ["metric", *map(task_label, per_task), "mean"]
    rows = [[label, *(cell(per_task[t][label]) for t in per_task), cell(mean)]
            for label, mean in report["task_mean"].items()]
    return ("Headline per task: expected over all orders of tied items [worst, best order]; publish expected",
            header, rows)


def format_tasks_table(report: dict) -> str:
    """The side-by-side headline, then each task's tables as for a unimodal run."""
    parts = [text_table(*tasks_headline(report))]
    for task, sub in report["tasks"].items():
        parts.append(f"== {task_label(task)} ==\n\n{format_table(sub)}")
    return "\n\n".join(parts)


def _curves(plt, report, key: str):
    """Each task's precision-recall curve ``metrics[key]`` in one plot."""
    fig, ax = plt.subplots(figsize=(5, 4))
    for task, sub in report["tasks"].items():
        curve = sub["metrics"][key]
        ax.plot([p["recall"] for p in curve], [p["precision"] for p in curve], marker="o", ms=3, clip_on=False,
                label=task_label(task))
    ax.legend(fontsize=8)
    return fig, ax


def _pr_both(plt, report, per_query, bucket_sizes):
    fig, ax = _curves(plt, report, "pr_curve")
    ax.set(xlabel="recall (micro)", ylabel="precision (micro)", title="PR curves over Hamming radii, per task",
           xlim=(0, 1.05), ylim=(0, 1.05))
    return fig


def _pr_by_rank_both(plt, report, per_query, bucket_sizes):
    fig, ax = _curves(plt, report, "pr_curve_by_rank")
    ax.set(xlabel="recall R@N (macro, expected)", ylabel="precision P@N (macro, expected)",
           title="PR curves by rank, per task", xlim=(0, 1.05), ylim=(0, 1.05))
    return fig


def _precision_at_n_both(plt, report, per_query, bucket_sizes):
    fig, ax = plt.subplots(figsize=(5, 4))
    for task, sub in report["tasks"].items():
        m = sub["metrics"]["precision_at_n"]
        cutoffs = plotted_cutoffs(sub)
        ax.plot(cutoffs, [m[str(n)]["expected"] for n in cutoffs], marker="o", ms=3, label=task_label(task))
    ax.set(xscale="log", xlabel="cut-off N", ylabel="P@N (macro, expected)", title="precision against N, per task",
           ylim=(0, 1.05))
    ax.legend(fontsize=8)
    return fig


TASK_FIGURES = {
    "pr_curves": Figure(_pr_both, "Micro precision-recall curves over Hamming radii 0..B, one per task: TP, FP and "
                        "FN summed over the evaluated queries at each radius (independent of the tie order)."),
    "pr_curves_by_rank": Figure(_pr_by_rank_both, "Precision-recall curves by rank, one per task: (R@N, P@N) over "
                                "the cut-offs N, expected over all orders of tied items, averaged over queries."),
    "precision_at_n": Figure(_precision_at_n_both, "P@N against the cut-off N, one line per task, expected over "
                             "all orders of tied items."),
}


def _lead(report: dict) -> str:
    d = report["dataset"]
    label = next(iter(report["task_mean"]))
    values = ", ".join(f"{task_label(t)} <b>{fmt(dict(headline_rows(r['metrics']))[label]['expected'])}</b>"
                       for t, r in report["tasks"].items())
    mean = report["task_mean"][label]["expected"]
    return (f"<section class='headline'><p>{d['n_queries']:,} queries x {d['n_database']:,} database items, "
            f"{d['nbits']}-bit codes, {html.escape(str(d['relevance']))} relevance, {len(report['tasks'])} tasks."
            f"</p><p class='lead'>{html.escape(label)}: {values}; mean <b>{fmt(mean)}</b> (expected over all "
            "orders of tied items; the table gives each value's [worst, best] order).</p>"
            + "".join(f"<p class='no-relevant'><b>{html.escape(task_label(t))}: {html.escape(reason)}</b></p>"
                      for t, r in report["tasks"].items() if (reason := no_relevant_reason(r)))
            + "</section>")


def render_tasks_html(report: dict, images: dict[str, str]) -> str:
    """The page of a run over tasks: the headline side by side, the curves of every task in one figure each,
    then each task's tables, the definitions and the provenance."""
    head = f"<h1>hashdist report: {html.escape(' / '.join(map(task_label, report['tasks'])))}</h1>{_lead(report)}"
    body = html_table(*tasks_headline(report), "table-tasks")
    for i, (task, sub) in enumerate(report["tasks"].items()):
        body += f"<h3>{html.escape(task_label(task))}</h3>" + "".join(
            html_table(caption, header, rows, f"table-{i}-{j}")
            for j, (caption, header, rows) in enumerate(tables(sub)))
    figures = html_figures(TASK_FIGURES, images)
    glossary = html_definitions(definitions(next(iter(report["tasks"].values()))))
    sources = "<ol>" + "".join(f"<li>{html.escape(c)}</li>" for c in CITATIONS) + "</ol>"
    prov = html_table("Provenance", ["what", "value"], provenance_rows(report), "provenance")
    return page("hashdist report: " + ", ".join(map(task_label, report["tasks"])),
                f"{head}<h2>Metrics</h2>{body}<h2>Plots</h2>{figures}<h2>Definitions</h2>{glossary}"
                f"<p>The definitions in full: docs/metrics.md and docs/cross-modal.md. Sources:</p>{sources}"
                f"<h2>Provenance</h2>{prov}")


class TaskEvaluation(Evaluation):
    """A finished run over tasks: its report, and per task the arrays behind the figures."""

    def render_page(self) -> str:
        return render_tasks_html(self.report, draw_figures(TASK_FIGURES, self.report, self.per_query,
                                                           self.bucket_sizes))
