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
    dataset_name,
    definitions,
    format_table,
    no_relevant_reason,
    plotted_cutoffs,
    provenance,
    provenance_rows,
    tables,
)
from hashdist.report.render import (
    PROVENANCE_CAPTION,
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


# each task's line: its own colour, line style and marker (hollow after the first), so that curves lying on top
# of each other stay apart
TASK_STYLES = (dict(ls="-", marker="o", ms=4), dict(ls="--", marker="s", ms=6, mfc="none"),
               dict(ls=":", marker="^", ms=6, mfc="none"), dict(ls="-.", marker="D", ms=5, mfc="none"))


def task_style(i: int) -> dict:
    return TASK_STYLES[i % len(TASK_STYLES)]


def _curves(plt, report, key: str):
    """Each task's precision-recall curve ``metrics[key]`` in one plot."""
    fig, ax = plt.subplots(figsize=(5, 4))
    for i, (task, sub) in enumerate(report["tasks"].items()):
        curve = sub["metrics"][key]
        ax.plot([p["recall"] for p in curve], [p["precision"] for p in curve], clip_on=False,
                label=task_label(task), **task_style(i))
    ax.legend(fontsize=9)
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
    for i, (task, sub) in enumerate(report["tasks"].items()):
        m = sub["metrics"]["precision_at_n"]
        cutoffs = plotted_cutoffs(sub)
        ax.plot(cutoffs, [m[str(n)]["expected"] for n in cutoffs], label=task_label(task), **task_style(i))
    ax.set(xscale="log", xlabel="cut-off N", ylabel="P@N (macro, expected)", title="precision against N, per task",
           ylim=(0, 1.05))
    ax.legend(fontsize=9)
    return fig


def _intervals_both(plt, report, per_query, bucket_sizes):
    """Each task's tie interval of each headline measure that has one: worst to best as a bar, expected as a
    marker in the task's style, the tasks of a measure side by side."""
    tasks = list(report["tasks"])
    per_task = {t: dict(headline_rows(report["tasks"][t]["metrics"])) for t in tasks}
    labels = [label for label in per_task[tasks[0]]
              if any(per_task[t][label]["worst"] != per_task[t][label]["best"] for t in tasks)]
    if not labels:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 0.25 * len(labels) * len(tasks) + 0.3 * len(labels) + 1.6))
    step = 1.0 / (len(tasks) + 1)
    for i, task in enumerate(tasks):
        ys = [len(labels) - 0.5 - j + ((len(tasks) - 1) / 2 - i) * step for j in range(len(labels))]
        values = [per_task[task][label] for label in labels]
        ax.hlines(ys, [v["worst"] for v in values], [v["best"] for v in values], lw=5, color=f"C{i}", alpha=0.35)
        style = {k: v for k, v in task_style(i).items() if k != "ls"}
        ax.plot([v["expected"] for v in values], ys, ls="none", color=f"C{i}", label=task_label(task), **style)
    ax.set(yticks=[len(labels) - 0.5 - j for j in range(len(labels))], yticklabels=labels, xlim=(0, 1.32),
           xticks=[0, 0.25, 0.5, 0.75, 1],
           ylim=(0, len(labels)), xlabel="expected over tie orders (marker), worst to best order (bar)",
           title="How far the order of tied items can move each headline measure, per task")
    ax.legend(fontsize=9, loc="center right")  # right of 1, where no value lies
    return fig


TASK_FIGURES = {
    "map_interval": Figure(_intervals_both, "Each headline measure under ties, per task: any tie-breaking rule gives "
                           "a value between worst (relevant items last in each tie group) and best (first); "
                           "expected, the value to publish, is the exact mean over all tie orders.", wide=True),
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

    def value(v):
        return f"<b>{fmt(v['expected'])}</b>" + (f" [{fmt(v['worst'])}, {fmt(v['best'])}]"
                                                  if v["worst"] != v["best"] else "")

    values = "; ".join(f"<span class='nowrap'>{task_label(t)} {value(dict(headline_rows(r['metrics']))[label])}"
                       "</span>" for t, r in report["tasks"].items())
    mean = report["task_mean"][label]
    return (f"<section class='headline'><p>{d['n_queries']:,} queries x {d['n_database']:,} database items, "
            f"{d['nbits']}-bit codes, {html.escape(str(d['relevance']))} relevance, {len(report['tasks'])} tasks."
            f"</p><p class='lead'>{html.escape(label)}: {values}; <span class='nowrap'>mean {value(mean)}</span>: "
            "expected over all orders of tied items [worst, best order]; publish expected.</p>"
            + "".join(f"<p class='no-relevant'><b>{html.escape(task_label(t))}: {html.escape(reason)}</b></p>"
                      for t, r in report["tasks"].items() if (reason := no_relevant_reason(r)))
            + "</section>")


def render_tasks_html(report: dict, images: dict[str, str]) -> str:
    """The page of a run over tasks: the headline side by side, the curves of every task in one figure each,
    then each task's tables, the definitions and the provenance."""
    title = f"hashdist report: {dataset_name(report)} ({', '.join(map(task_label, report['tasks']))})"
    head = f"<h1>{html.escape(title)}</h1>{_lead(report)}"
    body = html_table(*tasks_headline(report), "table-tasks")
    for i, (task, sub) in enumerate(report["tasks"].items()):
        body += f"<h3>{html.escape(task_label(task))}</h3>" + "".join(
            html_table(caption, header, rows, f"table-{i}-{j}")
            for j, (caption, header, rows) in enumerate(tables(sub)))
    figures = html_figures(TASK_FIGURES, images)
    glossary = html_definitions(definitions(next(iter(report["tasks"].values()))))
    sources = "<ol>" + "".join(f"<li>{html.escape(c)}</li>" for c in CITATIONS) + "</ol>"
    prov = html_table(PROVENANCE_CAPTION, ["what", "value"], provenance_rows(report), "provenance")
    return page(title,
                f"{head}<h2>Metrics</h2>{body}<h2>Plots</h2>{figures}<h2>Definitions</h2>{glossary}"
                f"<p>The definitions in full: docs/metrics.md and docs/cross-modal.md. Sources:</p>{sources}"
                f"<h2>Provenance</h2>{prov}")


class TaskEvaluation(Evaluation):
    """A finished run over tasks: its report, and per task the arrays behind the figures."""

    def render_page(self) -> str:
        return render_tasks_html(self.report, draw_figures(TASK_FIGURES, self.report, self.per_query,
                                                           self.bucket_sizes))


def where_blocks_run(engine: str, address: str | None = None, cluster_class: str | None = None) -> str:
    """Where a run's blocks run, for its work line: ``engine`` "local" or "flow"; the cluster's scheduler
    ``address`` or per-run ``cluster_class`` (a flow run without either starts an embedded local cluster)."""
    if engine == "local":
        return "threads in this process"
    if address:
        return f"Prefect + Dask on the cluster at {address}"
    return f"Prefect + Dask on {f'a per-run {cluster_class}' if cluster_class else 'an embedded local cluster'}"


def work_line(runs, where: str) -> str:
    """What a run (its PreparedRun per task) is about to do, in one line: the pairs, the code length, the blocks
    and ``where`` they run."""
    first = runs[0]
    ds, plan = first.ds, first.plan
    blocks = sum(len(run.plan.histogram_blocks) for run in runs)
    rows = min(plan.query_block_rows, ds.n_queries), min(plan.db_block_rows, ds.n_database)
    tasks = f" in {len(runs)} tasks ({', '.join(run.plan.task for run in runs)})" if plan.task else ""
    return (f"hashdist evaluate: {ds.n_queries:,} queries x {ds.n_database:,} items{tasks}, {ds.nbits} bits, "
            f"{plan.relevance} relevance, {first.params.distance} distance; {blocks:,} block"
            f"{'s' if blocks != 1 else ''} of up to {rows[0]:,} x {rows[1]:,}; {where}")
