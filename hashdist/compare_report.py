"""Rendering a comparison: the leaderboard (text, HTML), the pair tests, plots, and the output directory.

Leaderboard columns are the registry's headline measures (``hashdist.metrics.registry``),
expected over tie orders, radius measures at the comparison's largest radius.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np

from hashdist.atomic import staged_directory
from hashdist.errors import InputError
from hashdist.metrics.registry import BY_KEY, FIELD_LABELS, MEASURES, headline_rows, lookup
from hashdist.render import fmt, html_figure, html_table, page, png, text_table

COMPARISON_MARKER = "hashdist-comparison"


def check_comparison_dir(out, overwrite: bool) -> Path:
    """Refuse an existing directory that is not a previous comparison, unless overwrite."""
    out = Path(out)
    if out.exists() and not overwrite:
        try:
            ok = out.is_dir() and json.loads((out / "comparison.json").read_text()).get("format") == COMPARISON_MARKER
        except Exception:
            ok = False
        if not ok:
            raise InputError(
                f"{out}: exists and is not a hashdist comparison directory (pass --overwrite to replace it)"
            )
    return out


def write_comparison(out, comparison: dict, occupancy: dict, *, overwrite: bool = False,
                     tables: tuple[str, ...] = ()) -> Path:
    """comparison.json and a self-contained comparison.html, replacing ``out`` atomically; with ``tables``
    ("latex", "markdown") also leaderboard.tex / leaderboard.md, the leaderboard as a table for a paper."""
    from hashdist.report import json_safe

    out = Path(out)
    with staged_directory(check_comparison_dir(out, overwrite)) as tmp:
        comparison["outputs"] = {"comparison_json": str(out / "comparison.json"),
                                 "comparison_html": str(out / "comparison.html")}
        for kind in tables:
            name, render = PAPER_TABLES[kind]
            (tmp / name).write_text(render(comparison))
            comparison["outputs"][f"leaderboard_{kind}"] = str(out / name)
        (tmp / "comparison.json").write_text(json.dumps(json_safe(comparison), indent=2))
        (tmp / "comparison.html").write_text(render_html(comparison, plots(comparison, occupancy)))
    return out


def _p(x) -> str:
    return fmt(x, 3) if x is None or x != x else f"{x:.3g}"


def leaderboard_rows(comparison: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows (methods by expected mAP, best first); a * marks an mAP order that depends on ties."""
    r = comparison["parameters"]["lgap_radius"]
    tied = {n for pair in comparison["map_order_depends_on_ties"] for n in pair.split("|")}
    first = comparison["methods"][comparison["ranking"][0]]["metrics"]
    labels = [label for label, _ in headline_rows(first, r)][1:]  # mAP has its own columns
    header = ["method", "bits", "mAP [worst, best]", "mAP 95% CI", *labels]
    rows = []
    for name in comparison["ranking"]:
        m = comparison["methods"][name]
        mp = m["metrics"]["map"]
        row = [name + (" *" if name in tied else ""), str(m["nbits"]),
               f"{fmt(mp['expected'])} [{fmt(mp['worst'])}, {fmt(mp['best'])}]",
               f"[{fmt(m['map_ci'][0])}, {fmt(m['map_ci'][1])}]"]
        row += [fmt(values["expected"]) for _, values in headline_rows(m["metrics"], r)[1:]]
        rows.append(row)
    return header, rows


def _pair_table(comparison: dict) -> tuple[list[str], list[list[str]]]:
    header = ["pair A|B", "metric", "mean(A - B)", "t-test p", "randomisation p", "Holm (randomisation)", "Holm (t)"]
    rows = [[pair, e["metric"], fmt(e["mean_diff"]), _p(e["t_pvalue"]), _p(e["randomization_pvalue"]),
             _p(e["holm_adjusted"]), _p(e["t_holm_adjusted"])]
            for pair, entries in comparison["pairs"].items() for e in entries]
    return header, rows


def format_leaderboard(comparison: dict) -> str:
    """The leaderboard and the significance of each pair as aligned text."""
    lines = [text_table("Leaderboard (expected over tie orders)", *leaderboard_rows(comparison))]
    if comparison["map_order_depends_on_ties"]:
        lines.append("* mAP intervals overlap (order depends on tie-breaking): "
                     + ", ".join(comparison["map_order_depends_on_ties"]))
    lines.append("")
    lines.append(text_table("Paired tests per query", *_pair_table(comparison)))
    return "\n".join(lines)


def plots(comparison: dict, occupancy: dict) -> dict[str, str]:
    """Base64 PNGs: overlaid PR curves, mAP and mLGAP against bit length, code occupancy, bit balance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = comparison["methods"]
    r = comparison["parameters"]["lgap_radius"]
    figs = {}

    fig, ax = plt.subplots(figsize=(5, 4))
    for name, m in methods.items():
        curve = m["metrics"]["pr_curve"]
        ax.plot([p["recall"] for p in curve], [p["precision"] for p in curve], marker="o", ms=2, label=name)
    ax.set(xlabel="recall (micro)", ylabel="precision (micro)", title="PR curves (Hamming radius 0..B)",
           xlim=(0, 1.02), ylim=(0, 1.02))
    ax.legend(fontsize=7)
    figs["pr_curves"] = fig

    groups: dict[str, list] = {}
    for m in methods.values():
        groups.setdefault(m["group"], []).append(m)
    lengths = {g: sorted(ms, key=lambda m: m["nbits"]) for g, ms in groups.items()
               if len({m["nbits"] for m in ms}) > 1}
    if lengths:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
        for g, ms in lengths.items():
            bits = [m["nbits"] for m in ms]
            axes[0].plot(bits, [m["metrics"]["map"]["expected"] for m in ms], marker="o", label=g)
            axes[1].plot(bits, [m["metrics"]["mlgap_at_radius"][str(r)] for m in ms], marker="o", label=g)
        axes[0].set(xlabel="bits", ylabel="mAP (expected)", title="mAP against bit length")
        axes[1].set(xlabel="bits", ylabel=f"mLGAP@{r}", title=f"mLGAP@{r} against bit length")
        for ax in axes:
            ax.legend(fontsize=7)
        figs["bit_length"] = fig

    fig, ax = plt.subplots(figsize=(5, 4))
    for name, sizes in occupancy.items():
        ax.plot(np.arange(1, len(sizes) + 1), sizes, drawstyle="steps-post", label=name)
    ax.set(xscale="log", yscale="log", xlabel="distinct codes, most used first", ylabel="database items with the code",
           title="code occupancy")
    ax.legend(fontsize=7)
    figs["code_occupancy"] = fig

    fig, ax = plt.subplots(figsize=(5, 4))
    for name, m in methods.items():
        balance = m["code_usage"]["bit_balance"]
        ax.plot(np.arange(len(balance)), balance, marker=".", lw=0.8, label=name)
    ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    ax.set(xlabel="bit", ylabel="fraction of database items with the bit set", title="bit balance", ylim=(0, 1))
    ax.legend(fontsize=7)
    figs["bit_balance"] = fig

    out = {name: png(fig) for name, fig in figs.items()}
    for fig in figs.values():
        plt.close(fig)
    return out


CAPTIONS = {
    "pr_curves": "Micro precision-recall curves over Hamming radii 0..B, one per method (TP, FP, FN summed over "
                 "the evaluated queries at each radius; independent of tie order).",
    "bit_length": "mAP (expected over tie orders) and mLGAP at the largest radius against code length, for methods "
                  "named NAME@TAG that share a NAME.",
    "code_occupancy": "Database items per distinct code, most used code first (log-log): a steep head means codes "
                      "collapsed onto few values (the mLGAP paper's Fig. 1).",
    "bit_balance": "Fraction of database items with each bit set; 0.5 (dashed) is a balanced bit.",
}


def render_html(comparison: dict, images: dict[str, str]) -> str:
    methods, q, p = comparison["methods"], comparison["queries"], comparison["parameters"]
    tied = comparison["map_order_depends_on_ties"]
    note = (f"<p>* mAP intervals overlap, so their order depends on tie-breaking: {html.escape(', '.join(tied))}</p>"
            if tied else "<p>No two methods' mAP intervals [worst, best] overlap.</p>")
    usage_header = ["method", "bits", "distinct codes", "largest bucket", "items sharing a code", "entropy (bits)",
                    "entropy / B"]
    usage_rows = [[name, str(m["nbits"]), str(m["code_usage"]["distinct_codes"]), str(m["code_usage"]["max_bucket"]),
                   fmt(m["code_usage"]["collision_fraction"]), fmt(m["code_usage"]["entropy_bits"], 2),
                   fmt(m["code_usage"]["entropy_ratio"])] for name, m in methods.items()]
    datasets = "".join(f"<li><code>{html.escape(n)}</code>: <code>{html.escape(str(m['dataset']))}</code></li>"
                       for n, m in methods.items())
    figures = "".join(html_figure(name, data, CAPTIONS[name]) for name, data in images.items())
    body = (
        f"<h1>hashdist comparison</h1><ul>{datasets}</ul><p>{q['evaluated']} of {q['total']} queries evaluated "
        f"(those with relevant items). mAP and the @K columns are expectations over tie orders; mAP@K uses the "
        f"'retrieved' normaliser; radius measures at radius {p['lgap_radius']}. Definitions: docs/metrics.md of "
        f"hashdist.</p><h2>Leaderboard</h2>"
        + html_table("Methods by expected mAP (95% CI: bootstrap over queries)", *leaderboard_rows(comparison),
                     "leaderboard")
        + note
        + f"<h2>Paired significance</h2><p>Per-query AP (expected) and LGAP@{p['lgap_radius']}; paired t-test and "
        f"sign-flip randomisation test ({p['permutations']} permutations, seed {p['seed']}); Holm's correction "
        f"across all pairs of a metric.</p>"
        + html_table("Paired tests between methods", *_pair_table(comparison), "pairs")
        + "<h2>Code usage</h2>" + html_table("How each method's database codes fill the code space", usage_header,
                                            usage_rows, "code-usage")
        + f"<h2>Plots</h2>{figures}"
    )
    return page("hashdist comparison", body)


# -- tables for papers ----------------------------------------------------------------

_CONVENTION = ("expected over all orders of items tied at one Hamming distance; mAP@K normalised by the relevant "
               "items retrieved (DeepHash-pytorch's CalcTopMap); the mean runs over the {evaluated} queries with "
               "relevant items (hashdist's default query set)")


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
    first = comparison["methods"][comparison["ranking"][0]]["metrics"]
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


def paper_cells(comparison: dict) -> tuple[list[str], list[list[tuple[str, bool, bool]]], str]:
    """(header, rows of (text, bold, dagger) cells, caption) of the paper table.

    Methods x headline metrics, or, when the methods are models at several code lengths, models x
    bit lengths for mAP. Bold: the best value of a column. Dagger: the value's tie interval
    [worst, best] overlaps another row's in that column, so their order depends on tie-breaking.
    """
    methods = comparison["methods"]
    if _by_bit_length(comparison):
        bits = sorted({m["nbits"] for m in methods.values()})
        groups = list(dict.fromkeys(methods[n]["group"] for n in comparison["ranking"]))
        cell_of = {(m["group"], m["nbits"]): m["metrics"] for m in methods.values()}
        header = ["Method", *(f"{b} bits" for b in bits)]
        grid = [[cell_of.get((g, b)) for b in bits] for g in groups]
        labels = groups
        measure_at = [(BY_KEY["map"], None, None)] * len(bits)
        what = "mAP"
    else:
        columns = _columns(comparison)
        header = ["Method", *(c[0] for c in columns)]
        labels = list(comparison["ranking"])
        grid = [[methods[n]["metrics"]] * len(columns) for n in labels]
        measure_at = [c[1:] for c in columns]
        what = "Metrics"
    rows = [[(label, False, False)] for label in labels]
    for j, (measure, value, variant) in enumerate(measure_at):
        column = [(i, grid[i][j]) for i in range(len(labels)) if grid[i][j] is not None]
        values = {i: _cell_value(m, measure, value, variant) for i, m in column}
        intervals = {i: _interval(m, measure, value, variant) for i, m in column}
        best = max(v for v in values.values() if v == v) if any(v == v for v in values.values()) else None
        for i in range(len(labels)):
            if i not in values:
                rows[i].append(("-", False, False))
                continue
            mine = intervals[i]
            dagger = mine is not None and any(
                other is not None and max(mine[0], other[0]) <= min(mine[2], other[2])
                for k, other in intervals.items() if k != i)
            rows[i].append((fmt(values[i]), values[i] == best, dagger))
    caption = (f"{what} of each method, {_CONVENTION.format(evaluated=comparison['queries']['evaluated'])}. "
               "Bold: best in its column. \u2020: the tie interval [worst, best] overlaps another method's, so "
               "their order depends on how ties are broken.")
    return header, rows, caption


_LATEX_SPECIAL = {c: "\\" + c for c in "&%$#_{}"} | {"~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                                                      "\\": r"\textbackslash{}"}


def _latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(c, c) for c in text)


def latex_table(comparison: dict) -> str:
    """The paper table as a LaTeX table (booktabs)."""
    header, rows, caption = paper_cells(comparison)

    def cell(text, bold, dagger):
        text = _latex_escape(text)
        text = rf"\textbf{{{text}}}" if bold else text
        return text + (r"$^\dagger$" if dagger else "")

    caption = _latex_escape(caption).replace("\u2020", r"$^\dagger$")
    lines = [r"\begin{table}[t]", r"\centering", rf"\caption{{{caption}}}",
             r"\label{tab:hashdist-leaderboard}", rf"\begin{{tabular}}{{l{'r' * (len(header) - 1)}}}", r"\toprule",
             " & ".join(_latex_escape(h) for h in header) + r" \\", r"\midrule"]
    lines += [" & ".join(cell(*c) for c in row) + r" \\" for row in rows]
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def markdown_table(comparison: dict) -> str:
    """The paper table as a Markdown (GitHub) table with its caption below."""
    header, rows, caption = paper_cells(comparison)

    def cell(text, bold, dagger):
        return (f"**{text}**" if bold else text) + ("\u2020" if dagger else "")

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join([" --- "] + [" ---: "] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(cell(*c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + f"\n\nTable: {caption}\n"


PAPER_TABLES = {"latex": ("leaderboard.tex", latex_table), "markdown": ("leaderboard.md", markdown_table)}
