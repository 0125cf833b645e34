"""Rendering a comparison: the leaderboard (text, HTML), the pair tests, plots, and the output directory.

Leaderboard columns are the registry's headline measures (``hashdist.metrics.registry``),
expected over tie orders, radius measures at the comparison's largest radius. With repeated
runs (``hashdist.compare.comparison``) every cell is ``mean ± sd`` over the runs (sample sd), the mAP
tie interval is [mean worst, mean best] and the mAP 95% interval is the t interval over runs;
the text adds each run's mAP and mLGAP, the HTML page a table of every run's values per method,
and the paper tables bold the best mean.

A comparison of datasets with modalities holds one such comparison per task (``comparison["tasks"][task]``, in
``comparison["task_order"]``): the text and the page give each task's leaderboard under its heading (the page
opens with the paper table), and the paper tables have a column group per task (I→T, T→I), a column per bit
length in each (or mAP alone when the methods are not models at several bit lengths).
"""

from __future__ import annotations

import html
import itertools
import json
from pathlib import Path
from typing import NamedTuple

import numpy as np

from hashdist.data.atomic import staged_directory
from hashdist.data.dataset import parse_task
from hashdist.kernels.codeusage import rank_size_steps
from hashdist.metrics.registry import BY_KEY, FIELD_LABELS, MEASURES, headline_rows, lookup
from hashdist.metrics.stats import t_interval
from hashdist.report.render import (
    PROVENANCE_CAPTION,
    Figure,
    check_replaceable_dir,
    draw_figures,
    fmt,
    html_figure,
    html_figures,
    html_table,
    log_count_axes,
    page,
    text_table,
)
from hashdist.report.tasks import PRINTED_ARROW, task_label

COMPARISON_MARKER = "hashdist-comparison"


def check_comparison_dir(out, inputs=(), kept=()) -> Path:
    """Refuse an ``out`` that is not new, empty or a previous comparison (which a rerun replaces), and one that
    overlaps an input path (a method's dataset) or the block cache (``kept``)."""
    return check_replaceable_dir(out, inputs, what="comparison", marker_file="comparison.json",
                                 marker=COMPARISON_MARKER, kept=kept)


def write_comparison(out, comparison: dict, occupancy: dict, *, overwrite: bool = False,
                     tables: tuple[str, ...] = ()) -> Path:
    """comparison.json and a self-contained comparison.html, replacing ``out`` atomically; with ``tables``
    ("latex", "markdown") also leaderboard.tex / leaderboard.md, the leaderboard as a table for a paper."""
    from hashdist.report.evaluation import json_safe

    out = Path(out)
    with staged_directory(check_comparison_dir(out)) as tmp:
        comparison["outputs"] = {"comparison_json": str(out / "comparison.json"),
                                 "comparison_html": str(out / "comparison.html")}
        for kind in tables:
            name, render = PAPER_TABLES[kind]
            (tmp / name).write_text(render(comparison))
            comparison["outputs"][f"leaderboard_{kind}"] = str(out / name)
        (tmp / "comparison.json").write_text(json.dumps(json_safe(comparison), indent=2))
        (tmp / "comparison.html").write_text(comparison_page(comparison, occupancy))
    return out


def comparison_page(comparison: dict, occupancy: dict) -> str:
    """comparison.html with its figures (over tasks: ``occupancy`` holds each task's)."""
    if "tasks" not in comparison:
        return render_html(comparison, plots(comparison, occupancy))
    return render_tasks_html(comparison, {task: plots(comparison["tasks"][task], occupancy[task])
                                          for task in comparison["task_order"]})


def _p(x) -> str:
    return fmt(x, 3) if x is None or x != x else f"{x:.3g}"


def n_runs(comparison: dict) -> int:
    """T, the number of runs of every method (1 unless repeated runs)."""
    return comparison["parameters"].get("runs", 1)


def runs_of(method: dict) -> list[dict]:
    """A method's runs, each with dataset, fingerprint, metrics, map_ci, mlgap_ci, code_usage (one run: itself)."""
    return method.get("runs", [method])


def map_interval(method: dict) -> tuple[float, float, float]:
    """(worst, expected, best) mAP of a method; with repeated runs, each the mean over the runs."""
    if "over_runs" in method:
        o = method["over_runs"]
        return o["mAP worst"]["mean"], o["mAP"]["mean"], o["mAP best"]["mean"]
    mp = method["metrics"]["map"]
    return mp["worst"], mp["expected"], mp["best"]


def per_run_labels(r: int) -> dict[str, str]:
    """{pair metric: ``over_runs`` label} of the values paired over runs: mAP (expected) and mLGAP at radius r."""
    return {"map": BY_KEY["map"].label_for(), "mlgap": BY_KEY["mlgap_at_radius"].label_for(r)}


def _mean_sd(summary: dict) -> str:
    return f"{fmt(summary['mean'])} \u00b1 {fmt(summary['sd'])}"


def _ci(lo_hi) -> str:
    return f"[{fmt(lo_hi[0])}, {fmt(lo_hi[1])}]"


def leaderboard_rows(comparison: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows (methods by expected mAP, best first); a * marks an mAP order that depends on ties.
    With repeated runs: mean ± sd over runs, [mean worst, mean best], and the t interval of the mean mAP."""
    r = comparison["parameters"]["lgap_radius"]
    tied = {n for pair in comparison["map_order_depends_on_ties"] for n in pair.split("|")}
    first = comparison["methods"][comparison["ranking"][0]]
    # mAP has columns of its own
    labels = [label for label, _ in headline_rows(runs_of(first)[0]["metrics"], r, exclude=("map",))]
    repeated = n_runs(comparison) > 1
    header = ["method", "bits", *(["mAP mean \u00b1 sd"] if repeated else []), "mAP [worst, best]", "mAP 95% CI",
              *labels]
    rows = []
    for name in comparison["ranking"]:
        m = comparison["methods"][name]
        worst, expected, best = map_interval(m)
        row = [name + (" *" if name in tied else ""), str(m["nbits"])]
        if repeated:
            o = m["over_runs"]
            row += [_mean_sd(o["mAP"]), f"[{fmt(worst)}, {fmt(best)}]", _ci(o["mAP"]["ci"])]
            row += [_mean_sd(o[label]) for label in labels]
        else:
            row += [f"{fmt(expected)} [{fmt(worst)}, {fmt(best)}]", _ci(m["map_ci"])]
            row += [fmt(values["expected"]) for _, values in headline_rows(m["metrics"], r, exclude=("map",))]
        rows.append(row)
    return header, rows


def run_rows(method: dict, labels=None) -> tuple[list[str], list[list[str]]]:
    """Header and rows of a method's repeated runs: per ``over_runs`` label (default all), each run's value,
    the mean, the sample sd and the 95% t interval."""
    o = method["over_runs"]
    header = ["measure", *(f"run {t}" for t in range(len(method["runs"]))), "mean", "sd", "95% CI"]
    rows = [[label, *(fmt(v) for v in o[label]["values"]), fmt(o[label]["mean"]), fmt(o[label]["sd"]),
             _ci(o[label]["ci"])] for label in (labels or o)]
    return header, rows


def _pair_table(comparison: dict) -> tuple[list[str], list[list[str]]]:
    header = ["pair A|B", "metric", "mean(A - B)", "t-test p", "randomisation p", "Holm (randomisation)", "Holm (t)"]
    rows = [[pair, e["metric"], fmt(e["mean_diff"]), _p(e["t_pvalue"]), _p(e["randomization_pvalue"]),
             _p(e["holm_adjusted"]), _p(e["t_holm_adjusted"])]
            for pair, entries in comparison["pairs"].items() for e in entries]
    return header, rows


def format_leaderboard(comparison: dict) -> str:
    """The leaderboard and the significance of each pair as aligned text; with repeated runs also each
    method's mAP and mLGAP of every run; over tasks, each task's under its heading."""
    if "tasks" in comparison:
        return "\n\n".join(f"== {task_label(task)} ==\n\n{format_leaderboard(comparison['tasks'][task])}"
                           for task in comparison["task_order"])
    T = n_runs(comparison)
    if T == 1:
        lines = [text_table("Leaderboard (expected over tie orders)", *leaderboard_rows(comparison))]
    else:
        lines = [text_table(f"Leaderboard over {T} runs (mean \u00b1 sample sd; expected over tie orders; "
                            "95% CI: t over runs)", *leaderboard_rows(comparison))]
    if comparison["map_order_depends_on_ties"]:
        lines.append("* mAP intervals overlap (order depends on tie-breaking): "
                     + ", ".join(comparison["map_order_depends_on_ties"]))
    lines.append("")
    if T > 1:
        labels = list(per_run_labels(comparison["parameters"]["lgap_radius"]).values())
        for name in comparison["ranking"]:
            lines += [text_table(f"{name}: each run", *run_rows(comparison["methods"][name], labels)), ""]
    title = "Paired tests per query" if T == 1 else f"Paired tests over runs (run t with run t, {T} runs)"
    lines.append(text_table(title, *_pair_table(comparison)))
    return "\n".join(lines)


def _colours(comparison: dict) -> dict[str, str]:
    """Each method's colour, the same in every figure."""
    return {name: f"C{i % 10}" for i, name in enumerate(comparison["methods"])}


def _run_lines(plt, comparison: dict, xy, **style):
    """(figure, axes) with a line (x, y) = xy(run) per run of every method, in the method's colour, its first run
    labelled with its name."""
    colours = _colours(comparison)
    fig, ax = plt.subplots(figsize=(5, 4))
    for name, m in comparison["methods"].items():
        for t, run in enumerate(runs_of(m)):
            ax.plot(*xy(run), **style, color=colours[name], label=None if t else name)
    return fig, ax


def _pr_points(run: dict) -> tuple[list, list]:
    curve = run["metrics"]["pr_curve"]
    return [p["recall"] for p in curve], [p["precision"] for p in curve]


def _balance_points(run: dict) -> tuple[np.ndarray, list]:
    balance = run["code_usage"]["bit_balance"]
    return np.arange(len(balance)), balance


def _pr_curves(plt, comparison, occupancy):
    fig, ax = _run_lines(plt, comparison, _pr_points, marker="o", ms=2)
    ax.set(xlabel="recall (micro)", ylabel="precision (micro)", title="PR curves (Hamming radius 0..B)",
           xlim=(0, 1.02), ylim=(0, 1.02))
    ax.legend(fontsize=7)
    return fig


def _length_groups(methods: dict) -> dict[str, list[dict]]:
    """The methods of each group (NAME of NAME@TAG) by bit length, for the groups with more than one length."""
    groups: dict[str, list] = {}
    for m in methods.values():
        groups.setdefault(m["group"], []).append(m)
    return {g: sorted(ms, key=lambda m: m["nbits"]) for g, ms in groups.items() if len({m["nbits"] for m in ms}) > 1}


def _bit_length(plt, comparison, occupancy):
    """mAP and mLGAP against bit length; None when no group has several lengths."""
    lengths = _length_groups(comparison["methods"])
    if not lengths:
        return None
    r = comparison["parameters"]["lgap_radius"]
    repeated = n_runs(comparison) > 1
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    for g, ms in lengths.items():
        bits = [m["nbits"] for m in ms]
        for ax, value in ((axes[0], lambda metrics: metrics["map"]["expected"]),
                          (axes[1], lambda metrics: metrics["mlgap_at_radius"][str(r)])):
            summaries = [t_interval([value(run["metrics"]) for run in runs_of(m)]) for m in ms]
            ax.errorbar(bits, [s[0] for s in summaries], yerr=[s[1] for s in summaries] if repeated else None,
                        marker="o", capsize=3, label=g)
    axes[0].set(xlabel="bits", ylabel="mAP (expected)", title="mAP against bit length")
    axes[1].set(xlabel="bits", ylabel=f"mLGAP@{r}", title=f"mLGAP@{r} against bit length")
    for ax in axes:
        ax.legend(fontsize=7)
    return fig


def _code_occupancy(plt, comparison, occupancy):
    colours = _colours(comparison)
    fig, ax = plt.subplots(figsize=(5, 4))
    x_max = y_max = 1
    for name, runs in occupancy.items():
        for t, sizes in enumerate(runs):
            ranks, counts = rank_size_steps(sizes)
            ax.plot(ranks, counts, drawstyle="steps-post", color=colours[name], label=None if t else name)
            x_max, y_max = max(x_max, ranks[-1]), max(y_max, counts[0])
    log_count_axes(ax, x_max, y_max)
    ax.set(xlabel="distinct codes, most used first", ylabel="database items with the code", title="code occupancy")
    ax.legend(fontsize=7)
    return fig


def _bit_balance(plt, comparison, occupancy):
    fig, ax = _run_lines(plt, comparison, _balance_points, marker=".", lw=0.8)
    ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    ax.set(xlabel="bit", ylabel="fraction of database items with the bit set", title="bit balance", ylim=(0, 1))
    ax.legend(fontsize=7)
    return fig


# the comparison's figures, in page order, each drawn by (pyplot, comparison, occupancy). Repeated runs: one line
# per run in the method's colour; against bit length the mean over runs with sd error bars.
FIGURES = {
    "pr_curves": Figure(_pr_curves, "Micro precision-recall curves over Hamming radii 0..B, one per method (TP, FP, "
                        "FN summed over the evaluated queries at each radius; independent of tie order)."),
    "bit_length": Figure(_bit_length, "mAP (expected over tie orders) and mLGAP at the largest radius against code "
                         "length, for methods named NAME@TAG that share a NAME."),
    "code_occupancy": Figure(_code_occupancy, "Database items per distinct code, most used code first (log-log): a "
                             "steep head means codes collapsed onto few values (the mLGAP paper's Fig. 1)."),
    "bit_balance": Figure(_bit_balance, "Fraction of database items with each bit set; 0.5 (dashed) is a balanced "
                          "bit."),
}


def plots(comparison: dict, occupancy: dict) -> dict[str, str]:
    """Base64 PNGs of :data:`FIGURES`: overlaid PR curves, mAP and mLGAP against bit length (when a group has
    several), code occupancy, bit balance. ``occupancy``: {name: [bucket sizes of each run]}."""
    return draw_figures(FIGURES, comparison, occupancy)


class _RunTexts(NamedTuple):
    """The parts of the comparison page that differ between single and repeated runs."""

    head: str  # the datasets, the queries evaluated and the conventions
    board_caption: str
    runs: str  # the section of every run's values ("" for single runs)
    pair_text: str  # what the paired tests compare
    plot_note: str


def _conventions(p: dict) -> str:
    return ("mAP and the @K columns are expectations over tie orders; mAP@K uses the 'retrieved' normaliser; "
            f"radius measures at radius {p['lgap_radius']}. Definitions: docs/metrics.md of hashdist.")


def _single_run_texts(comparison: dict, h: str = "h2", prefix: str = "") -> _RunTexts:
    methods, q, p = comparison["methods"], comparison["queries"], comparison["parameters"]
    datasets = "".join(f"<li><code>{html.escape(n)}</code>: <code>{html.escape(str(m['dataset']))}</code></li>"
                       for n, m in methods.items())
    head = (f"<ul>{datasets}</ul><p>{q['evaluated']} of {q['total']} queries evaluated (those with relevant "
            f"items). {_conventions(p)}</p>")
    pair_text = (f"Per-query AP (expected) and LGAP@{p['lgap_radius']}; paired t-test and sign-flip randomisation "
                 f"test ({p['permutations']} permutations, seed {p['seed']})")
    return _RunTexts(head, "Methods by expected mAP (95% CI: bootstrap over queries)", "", pair_text, "")


def _repeated_run_texts(comparison: dict, h: str = "h2", prefix: str = "") -> _RunTexts:
    methods, q, p = comparison["methods"], comparison["queries"], comparison["parameters"]
    T = n_runs(comparison)
    datasets = "".join(
        f"<li><code>{html.escape(n)}</code>: "
        + ", ".join(f"run {t} <code>{html.escape(str(run['dataset']))}</code>"
                    for t, run in enumerate(m["runs"]))
        + "</li>" for n, m in methods.items())
    evaluated = ", ".join(f"run {t}: {e} of {n}" for t, (e, n) in enumerate(zip(q["evaluated"], q["total"],
                                                                                strict=True)))
    head = (f"<ul>{datasets}</ul><p>{T} runs; run t of every method has the same queries and ground truth. "
            f"Queries evaluated (those with relevant items): {evaluated}. {_conventions(p)} Over the runs: the mean, "
            f"the sample standard deviation (divisor T - 1) and the 95% interval mean \u00b1 "
            f"t<sub>0.975, T-1</sub> sd / \u221aT.</p>")
    board_caption = (f"Methods by mean expected mAP over {T} runs (mean \u00b1 sample sd; [worst, best]: means "
                     "over runs; 95% CI: t over runs)")
    runs = f"<{h}>Runs</{h}>" + "".join(
        html_table(f"{name}: each run, the mean, sample sd and 95% t interval over {T} runs", *run_rows(m),
                   f"{prefix}runs-{name}") for name, m in methods.items())
    patterns = (f"all 2^{T} = {2**T} sign patterns" if p["exact_randomization"]
                else f"{p['permutations']} random sign patterns, seed {p['seed']}")
    pair_text = (f"Each run's mAP (expected) and mLGAP@{p['lgap_radius']}, run t of one method paired with run t "
                 f"of the other; paired t-test over the {T} runs and sign-flip randomisation test ({patterns})")
    plot_note = ("<p>One line per run, in its method's colour; against bit length the mean over runs with bars "
                 "of one sample sd.</p>")
    return _RunTexts(head, board_caption, runs, pair_text, plot_note)


def _ties_note(comparison: dict) -> str:
    tied = comparison["map_order_depends_on_ties"]
    interval = "[worst, best]" if n_runs(comparison) == 1 else "[mean worst, mean best] over runs"
    return (f"<p>* mAP intervals overlap, so their order depends on tie-breaking: {html.escape(', '.join(tied))}</p>"
            if tied else f"<p>No two methods' mAP intervals {interval} overlap.</p>")


def _usage_table(comparison: dict, prefix: str = "") -> str:
    """Each method's (each run's) code usage."""
    T = n_runs(comparison)
    header = ["method", "bits", "distinct codes", "largest bucket", "items sharing a code", "entropy (bits)",
              "entropy / B"]
    rows = [[name if T == 1 else f"{name} run {t}", str(m["nbits"]), str(u["distinct_codes"]), str(u["max_bucket"]),
             fmt(u["collision_fraction"]), fmt(u["entropy_bits"], 2), fmt(u["entropy_ratio"])]
            for name, m in comparison["methods"].items() for t, u in enumerate(r["code_usage"] for r in runs_of(m))]
    return html_table("How each method's database codes fill the code space", header, rows, f"{prefix}code-usage")


def _sections(comparison: dict, images: dict[str, str], h: str = "h2", prefix: str = "") -> str:
    """A comparison's page below its title and above its provenance, headings ``h``; ``prefix`` makes the
    element ids unique on a page of several comparisons (tasks)."""
    texts = (_single_run_texts if n_runs(comparison) == 1 else _repeated_run_texts)(comparison, h, prefix)
    figures = html_figures(FIGURES, images) if not prefix else "<div class='figures'>" + "".join(
        html_figure(prefix + name, data, FIGURES[name].caption, FIGURES[name].wide) for name, data in images.items()
    ) + "</div>"
    return (
        f"{_headline(comparison)}{texts.head}<{h}>Leaderboard</{h}>"
        + _html_leaderboard(texts.board_caption, *leaderboard_rows(comparison), f"{prefix}leaderboard")
        + _ties_note(comparison)
        + texts.runs
        + f"<{h}>Paired significance</{h}><p>{texts.pair_text}; Holm's correction across all pairs of a metric.</p>"
        + html_table("Paired tests between methods", *_pair_table(comparison), f"{prefix}pairs")
        + f"<{h}>Code usage</{h}>" + _usage_table(comparison, prefix)
        + f"<{h}>Plots</{h}>{texts.plot_note}{figures}"
    )


def render_html(comparison: dict, images: dict[str, str]) -> str:
    body = (f"<h1>hashdist comparison: {html.escape(', '.join(comparison['methods']))}</h1>"
            + _sections(comparison, images) + _provenance(comparison))
    return page(f"hashdist comparison: {', '.join(comparison['methods'])}", body)


def render_tasks_html(comparison: dict, images: dict[str, dict[str, str]]) -> str:
    """The page of a comparison over tasks: the paper table (mAP per task), then each task's comparison as a page
    of datasets without modalities shows it (``images``: each task's figures), then the provenance."""
    order = comparison["task_order"]
    names = ", ".join(comparison["tasks"][order[0]]["methods"])
    labels = ", ".join(map(task_label, order))
    contents = "".join(f"<li><a href='#task-{i}'>{html.escape(task_label(task))}</a></li>"
                       for i, task in enumerate(order))
    intro = (f"<p>Datasets with modalities, compared per task ({html.escape(labels)}): a task a{PRINTED_ARROW}b "
             "ranks the database's b codes against the queries' a codes, and each task is compared on the methods' "
             "views of that task exactly as datasets without modalities are (docs/cross-modal.md). The queries' ground "
             f"truth is the same for every task and method.</p><ul>{contents}</ul>")
    sections = "".join(f"<h2 id='task-{i}'>{html.escape(task_label(task))}</h2>"
                       + _sections(comparison["tasks"][task], images[task], "h3", f"task{i}-")
                       for i, task in enumerate(order))
    body = (f"<h1>hashdist comparison: {html.escape(names)}</h1>{intro}<h2>mAP per task</h2>"
            f"{_html_paper_table(paper_cells(comparison))}{sections}{_provenance(comparison)}")
    return page(f"hashdist comparison: {names} ({labels})", body)


def _html_leaderboard(caption: str, header: list[str], rows: list[list[str]], table_id: str) -> str:
    """The leaderboard, compact enough for the page's column: a header breaks after "@" and before "(" or "[",
    a cell's "[worst, best]" goes on a line of its own, the 95% CI on two lines."""
    def head(text):
        text = html.escape(text).replace("@", "@<wbr>")
        for opening in (" (", " ["):
            first, found, rest = text.partition(opening)
            if found:
                text = f"{first} <span class='nowrap'>{opening.strip()}{rest}</span>"
        return text

    def cell(text):
        first, found, rest = html.escape(text).partition(" [")
        if found and first:
            return f"{first} <br><span class='nowrap interval'>[{rest}</span>"
        if text.startswith("["):  # an interval alone (the 95% CI): on two lines, broken after its comma
            return html.escape(text)
        return f"<span class='nowrap'>{html.escape(text)}</span>"

    heads = "".join(f"<th>{head(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(c)}</td>" for c in row) + "</tr>" for row in rows)
    return (f"<div class='scroll'><table class=\"board\" id=\"{html.escape(table_id)}\"><caption>{html.escape(caption)}"
            f"</caption><thead><tr>{heads}</tr></thead><tbody>{body}</tbody></table></div>")


def _html_paper_table(table: "PaperTable") -> str:
    """The paper table on a page: column groups over their columns, the best of a column in bold, † as in print."""
    groups = "<tr><th></th>" + "".join(f"<th colspan='{n}' style='text-align:center'>{html.escape(label)}</th>"
                                        for label, n in table.groups) + "</tr>" if table.groups else ""
    head = "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in table.header) + "</tr>"

    def cell(text, bold, dagger):
        text = html.escape(text)
        return (f"<b>{text}</b>" if bold else text) + ("\u2020" if dagger else "")

    body = "".join("<tr>" + "".join(f"<td>{cell(*c)}</td>" for c in row) + "</tr>" for row in table.rows)
    return (f"<div class='scroll'><table id='paper-table'><caption>{html.escape(table.caption)}</caption>"
            f"<thead>{groups}{head}</thead><tbody>{body}</tbody></table></div>")


def _headline(comparison: dict) -> str:
    """The leader and how sure: its mAP with the tie interval, and whether tie-breaking can change the order."""
    leader = comparison["ranking"][0]
    worst, expected, best = map_interval(comparison["methods"][leader])
    ties = comparison["map_order_depends_on_ties"]
    sure = (f"tie-breaking can reorder {len(ties)} pair{'s' if len(ties) != 1 else ''} of methods "
            f"({html.escape(', '.join(ties))})" if ties else "no tie-breaking rule can change the order by mAP")
    return (f"<section class='headline'><p class='lead'><b>{html.escape(leader)}</b> leads with mAP "
            f"<b>{fmt(expected)}</b> (any tie order: {fmt(worst)} to {fmt(best)}); {sure}.</p></section>")


def _provenance(comparison: dict) -> str:
    """When and with what the comparison was made, its parameters, and each dataset's fingerprint (over tasks:
    each task's view's)."""
    made = comparison.get("provenance") or {}
    packages = ", ".join(f"{name} {v}" for name, v in (made.get("packages") or {}).items() if v)
    per_task = {task: comparison["tasks"][task] for task in comparison["task_order"]} if "tasks" in comparison \
        else {None: comparison}
    first = next(iter(per_task.values()))
    rows = [["created", str(made.get("created", "n/a"))], ["hashdist commit", str(made.get("hashdist_commit"))],
            ["packages", packages or "n/a"],
            *([f"parameter {k}", json.dumps(v)] for k, v in first["parameters"].items()),
            *([["tasks", ", ".join(map(task_label, per_task))]] if "tasks" in comparison else [])]
    for task, sub in per_task.items():
        rows += [[f"dataset {name}" + (f" run {t}" if n_runs(sub) > 1 else "") + (f" ({task_label(task)})" if task
                                                                                   else ""),
                  f"{run['dataset']} ({run['fingerprint']})"]
                 for name, m in sub["methods"].items() for t, run in enumerate(runs_of(m))]
    return "<h2>Provenance</h2>" + html_table(PROVENANCE_CAPTION, ["what", "value"], rows, "provenance")


# -- tables for papers ----------------------------------------------------------------

def _convention(evaluated: str, map_at_k: bool) -> str:
    """The caption's statement of the conventions (mAP@K's normaliser only where the table has mAP@K)."""
    normaliser = ("; mAP@K normalised by the relevant items retrieved (DeepHash-pytorch's CalcTopMap)" if map_at_k
                  else "")
    return (f"expected over all orders of items tied at one Hamming distance{normaliser}; the mean runs over the "
            f"{evaluated} with relevant items (hashdist's default query set)")


def _by_bit_length(comparison: dict) -> bool:
    """True when the methods are a few models at several code lengths: (group, bits) pairs, all distinct."""
    methods = comparison["methods"].values()
    keys = [(m["group"], m["nbits"]) for m in methods]
    return len({b for _, b in keys}) > 1 and len(set(keys)) == len(keys) and len({g for g, _ in keys}) < len(keys)


def _interval(metrics: dict, measure, value, variant) -> tuple[float, float, float] | None:
    v = lookup(metrics, measure, value, variant)
    return (v["worst"], v["expected"], v["best"]) if isinstance(v, dict) and "expected" in v else None


def _columns(comparison: dict) -> list[tuple[str, object, object, object]]:
    """(label, measure, parameter value, variant) of each headline column, radius measures at the largest radius."""
    r = str(comparison["parameters"]["lgap_radius"])
    first = runs_of(comparison["methods"][comparison["ranking"][0]])[0]["metrics"]
    out = []
    for m in MEASURES:
        if not m.headline:
            continue
        values = [r] if m.parameter == "radius" else list(first[m.key]) if m.parameter else [None]
        for value in values:
            label = m.label_for(value, None)
            out.append((label + (f" {FIELD_LABELS[m.fields[0]]}" if m.fields and not m.policies else ""), m, value,
                        m.headline_variant))
    return out


def _cell_value(metrics: dict, measure, value, variant) -> float:
    v = lookup(metrics, measure, value, variant)
    if isinstance(v, dict):
        v = v["expected"] if "expected" in v else v[measure.fields[0]]
    return v


def _cell(runs: list[dict], measure, value, variant) -> tuple[float, float, tuple | None]:
    """(mean, sample sd, mean (worst, expected, best) or None) of a table cell over a method's runs' metrics."""
    mean, sd, _, _ = t_interval([_cell_value(m, measure, value, variant) for m in runs])
    intervals = [_interval(m, measure, value, variant) for m in runs]
    return mean, sd, None if intervals[0] is None else tuple(np.mean(intervals, axis=0).tolist())


class PaperTable(NamedTuple):
    """The paper table: its header, rows of (text, bold, dagger) cells and caption; ``groups``: (label, columns)
    of the column groups over the header's columns after the first (one per task), none for one comparison."""

    header: list[str]
    rows: list[list[tuple[str, bool, bool]]]
    caption: str
    groups: tuple[tuple[str, int], ...] = ()


def _bit_length_grid(comparison: dict, groups: list[str] | None = None) -> tuple[list[str], list[list], list[int]]:
    """(groups, the method of each group at each bit length or None, bit lengths) of models at several lengths;
    ``groups``: their order (default: by the ranking)."""
    methods = comparison["methods"]
    bits = sorted({m["nbits"] for m in methods.values()})
    groups = groups or list(dict.fromkeys(methods[n]["group"] for n in comparison["ranking"]))
    cell_of = {(m["group"], m["nbits"]): m for m in methods.values()}
    return groups, [[cell_of.get((g, b)) for b in bits] for g in groups], bits


def _filled_rows(labels: list[str], grid: list[list], measure_at: list, T: int) -> list[list[tuple[str, bool, bool]]]:
    """The rows of (text, bold, dagger) cells: row i's label, then column j's measure of the method grid[i][j]
    (None: "-"). Bold: the best value of a column. Dagger: the tie interval overlaps another row's in the column."""
    rows = [[(label, False, False)] for label in labels]
    for j, (measure, value, variant) in enumerate(measure_at):
        cells = {i: _cell([run["metrics"] for run in runs_of(grid[i][j])], measure, value, variant)
                 for i in range(len(labels)) if grid[i][j] is not None}
        means = [mean for mean, _, _ in cells.values() if mean == mean]
        best = max(means) if means else None
        for i in range(len(labels)):
            if i not in cells:
                rows[i].append(("-", False, False))
                continue
            mean, sd, mine = cells[i]
            dagger = mine is not None and any(
                other is not None and max(mine[0], other[0]) <= min(mine[2], other[2])
                for k, (_, _, other) in cells.items() if k != i)
            rows[i].append((fmt(mean) if T == 1 else f"{fmt(mean)} \u00b1 {fmt(sd)}", mean == best, dagger))
    return rows


def _span(counts: list[int]) -> str:
    return f"{counts[0]}{f' to {counts[-1]}' if len(counts) > 1 else ''}"


def _caption(what: str, comparisons: list[dict], map_at_k: bool, scope: str = "") -> str:
    """The paper table's caption: what the cells are, the convention, the bold and the dagger."""
    T = n_runs(comparisons[0])
    if T == 1:
        evaluated = f"{_span(sorted({c['queries']['evaluated'] for c in comparisons}))} queries"
        return (f"{what} of each method{scope}, {_convention(evaluated, map_at_k)}. Bold: best in its column. "
                "\u2020: the tie interval [worst, best] overlaps another method's, so their order depends on how "
                "ties are broken.")
    evaluated = f"{_span(sorted({e for c in comparisons for e in c['queries']['evaluated']}))} queries of each run"
    return (f"{what} of each method{scope}, mean \u00b1 sample standard deviation over {T} runs (one split each), "
            f"{_convention(evaluated, map_at_k)}. Bold: best mean in its column. \u2020: the interval "
            "[mean worst, mean best] over runs overlaps another method's, so their order depends on how ties "
            "are broken.")


def paper_cells(comparison: dict) -> PaperTable:
    """The paper table (header, rows of (text, bold, dagger) cells, caption, column groups).

    Methods x headline metrics, or, when the methods are models at several code lengths, models x
    bit lengths for mAP. Bold: the best value of a column. Dagger: the value's tie interval
    [worst, best] overlaps another row's in that column, so their order depends on tie-breaking.
    Repeated runs: cells are mean ± sample sd over the runs, bold is the best mean and the tie
    interval is [mean worst, mean best]. A comparison over tasks: :func:`task_paper_cells`.
    """
    if "tasks" in comparison:
        return task_paper_cells(comparison)
    methods = comparison["methods"]
    if _by_bit_length(comparison):
        labels, grid, bits = _bit_length_grid(comparison)
        header = ["Method", *(f"{b} bits" for b in bits)]
        measure_at = [(BY_KEY["map"], None, None)] * len(bits)
        what, map_at_k = "mAP", False
    else:
        columns = _columns(comparison)
        header = ["Method", *(c[0] for c in columns)]
        labels = list(comparison["ranking"])
        grid = [[methods[n]] * len(columns) for n in labels]
        measure_at = [c[1:] for c in columns]
        what, map_at_k = "Metrics", any(measure.key == "map_at_k" for measure, _, _ in measure_at)
    rows = _filled_rows(labels, grid, measure_at, n_runs(comparison))
    return PaperTable(header, rows, _caption(what, [comparison], map_at_k))


def task_labels(tasks) -> dict[str, str]:
    """Each task as a paper's column group prints it: I→T when the modalities' initials tell them apart, else
    image→text."""
    pairs = {task: parse_task(task) for task in tasks}
    names = {name for pair in pairs.values() for name in pair}
    initials = {name: name[0].upper() for name in names}
    if len(set(initials.values())) < len(names):
        return {task: task_label(task) for task in tasks}
    return {task: task_label(f"{initials[a]}->{initials[b]}") for task, (a, b) in pairs.items()}


def task_paper_cells(comparison: dict) -> PaperTable:
    """The paper table of a comparison over tasks: a column group per task (I→T, T→I), in each a column per bit
    length when the methods are models at several code lengths (rows: the models), else one column of mAP (rows:
    the methods); rows in the first task's order. Bold and dagger per column, as in :func:`paper_cells`."""
    order = comparison["task_order"]
    subs = [comparison["tasks"][task] for task in order]
    if _by_bit_length(subs[0]):
        labels, _, bits = _bit_length_grid(subs[0])
        parts = [_bit_length_grid(sub, labels)[1] for sub in subs]
        grid = [[method for part in parts for method in part[i]] for i in range(len(labels))]
        columns = [f"{b} bits" for b in bits]
    else:
        labels = list(subs[0]["ranking"])
        grid = [[sub["methods"][name] for sub in subs] for name in labels]
        columns = ["mAP"]
    short = task_labels(order)
    header = ["Method", *(columns * len(order))]
    rows = _filled_rows(labels, grid, [(BY_KEY["map"], None, None)] * (len(header) - 1), n_runs(subs[0]))
    directions = "; ".join(f"{short[task]}: {a} queries against the {b} database"
                           for task in order for a, b in [parse_task(task)])
    return PaperTable(header, rows, _caption("mAP", subs, False, f" per task ({directions})"),
                      tuple((short[task], len(columns)) for task in order))


_LATEX_SPECIAL = {c: "\\" + c for c in "&%$#_{}"} | {"~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                                                      "\\": r"\textbackslash{}"}


def _latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(c, c) for c in text)


def _latex_text(text: str) -> str:
    """Text escaped for LaTeX, with ±, † and → as math."""
    return (_latex_escape(text).replace("\u00b1", r"$\pm$").replace("\u2020", r"$^\dagger$")
            .replace(PRINTED_ARROW, r"$\to$"))


def latex_table(comparison: dict) -> str:
    """The paper table as a LaTeX table (booktabs); column groups (tasks) as a first header row of
    \\multicolumn headings, each with a \\cmidrule under it."""
    table = paper_cells(comparison)

    def cell(text, bold, dagger):
        text = _latex_text(text)
        text = rf"\textbf{{{text}}}" if bold else text
        return text + (r"$^\dagger$" if dagger else "")

    lines = [r"\begin{table}[t]", r"\centering", rf"\caption{{{_latex_text(table.caption)}}}",
             r"\label{tab:hashdist-leaderboard}", rf"\begin{{tabular}}{{l{'r' * (len(table.header) - 1)}}}",
             r"\toprule"]
    if table.groups:
        starts = np.cumsum([2] + [n for _, n in table.groups]).tolist()
        lines.append(" & ".join(["", *(rf"\multicolumn{{{n}}}{{c}}{{{_latex_text(label)}}}"
                                      for label, n in table.groups)]) + r" \\")
        lines.append(" ".join(rf"\cmidrule(lr){{{a}-{b - 1}}}" for a, b in itertools.pairwise(starts)))
    lines += [" & ".join(_latex_text(h) for h in table.header) + r" \\", r"\midrule"]
    lines += [" & ".join(cell(*c) for c in row) + r" \\" for row in table.rows]
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def _flat_header(table: PaperTable) -> list[str]:
    """The header with each column's group label in front ("I→T 16 bits"), for a single header row."""
    labels = [label for label, n in table.groups for _ in range(n)]
    return [table.header[0], *(f"{g} {h}" for g, h in zip(labels, table.header[1:], strict=True))] if labels \
        else table.header


def markdown_table(comparison: dict) -> str:
    """The paper table as a Markdown (GitHub) table with its caption below."""
    table = paper_cells(comparison)
    header = _flat_header(table)

    def cell(text, bold, dagger):
        return (f"**{text}**" if bold else text) + ("\u2020" if dagger else "")

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join([" --- "] + [" ---: "] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(cell(*c) for c in row) + " |" for row in table.rows]
    return "\n".join(lines) + f"\n\nTable: {table.caption}\n"


PAPER_TABLES = {"latex": ("leaderboard.tex", latex_table), "markdown": ("leaderboard.md", markdown_table)}
