"""Reports: the JSON document, the terminal table, per-query arrays and the HTML page.

An output directory is written to a temporary sibling and renamed into place, so
it is either the previous complete report or the new one, never half of each.
"""

from __future__ import annotations

import datetime
import functools
import html
import json
import math
import subprocess
from importlib import metadata
from pathlib import Path

import numpy as np

from hashdist.data.atomic import staged_directory
from hashdist.kernels.codeusage import rank_size_steps
from hashdist.metrics.conventions import BY_NAME
from hashdist.metrics.registry import AP_EXPECTED, BY_KEY, FIELD_LABELS, MEASURES, POLICIES, headline_rows, lookup
from hashdist.report.render import (
    PROVENANCE_CAPTION,
    Figure,
    check_replaceable_dir,
    draw_figures,
    fmt,
    html_definitions,
    html_figures,
    html_table,
    log_count_axes,
    page,
    text_table,
)
from hashdist.served import report as served_report

__all__ = ["format_table", "render_html", "tables", "write_outputs"]

REPORT_MARKER = "hashdist-report"
_PACKAGES = ("hashdist", "numpy", "numba", "zarr", "scipy", "prefect", "prefect-dask", "dask", "distributed")


@functools.cache  # what this process has loaded: read once
def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def source_commit() -> str | None:
    """The git commit of the hashdist source tree, when it is a checkout (read once: the code this process runs
    was loaded from it)."""
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        )
        return out.stdout.strip() or None
    except Exception:
        return None


def run_provenance() -> dict:
    """When and with what a document was made: the UTC time, the packages' versions and hashdist's commit."""
    return {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "packages": {name: _version(name) for name in _PACKAGES}, "hashdist_commit": source_commit()}


def provenance(dataset_fingerprint: str, parameters: dict) -> dict:
    made = run_provenance()
    return {"created": made["created"], "dataset_fingerprint": dataset_fingerprint, "parameters": parameters,
            "packages": made["packages"], "hashdist_commit": made["hashdist_commit"]}


def json_safe(x):
    """NaN/inf become null so the report is strict JSON."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


# -- tables (the terminal and the HTML page show the same ones) -----------------


def distance_words(report: dict) -> tuple[str, str]:
    """(the ranking distance's name, what counts as a tie) from the report's ``distance`` section."""
    d = report.get("distance") or {"kind": "hamming"}
    if d["kind"] == "hamming":
        return "Hamming distance", "ties"
    name = {"weighted": "weighted Hamming distance", "asymmetric": "asymmetric distance -y.b"}[d["kind"]]
    if d.get("exact"):
        return name, "ties"
    return f"{name} in {d['bins_used']} bins", "ties: items in one bin"


def _in_distance(text: str, report: dict) -> str:
    """A caption written for Hamming distances, for the report's ranking distance (mLGAP stays Hamming)."""
    name, _ = distance_words(report)
    return text if name == "Hamming distance" else text.replace("Hamming", name.removesuffix(" distance"), 1)


# where the report shows each measure of the registry: a row of the ranking table (order-dependent ones, over
# every value but the grid of cut-offs N), a row of the order-free table, a row per radius or hashtable setting,
# or only a figure of FIGURES
PLOTTED = ("precision_at_n", "recall_at_n", "pr_curve", "pr_curve_by_rank")


def _ranked(measure) -> bool:
    return bool(measure.policies) and measure.parameter != "cutoff"


def _order_free(measure) -> bool:
    return not measure.policies and measure.parameter is None and not measure.curve


def _unshown(measures=MEASURES) -> list[str]:
    """Keys of measures no table or figure shows: a measure added to the registry needs a place here."""
    return [x.key for x in measures if not (x.key in PLOTTED or _ranked(x) or _order_free(x)
                                             or x.parameter in ("radius", "hashtable"))]


def tables(report: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """(caption, header, rows) of every tabulated measure of the registry, in registry order."""
    if _unshown():
        raise RuntimeError(f"hashdist.report.evaluation shows no table or figure of the measures {_unshown()}")
    m = report["metrics"]
    name, ties = distance_words(report)
    ranked = [[measure.label_for(value, variant), *(fmt(v[p]) for p in POLICIES)]
              for measure in MEASURES if _ranked(measure)
              for value in (m[measure.key] if measure.parameter else [None])
              for variant in measure.variants or (None,)
              for v in [lookup(m, measure, value, variant)]]
    order_free = [[measure.label_for(), fmt(m[measure.key])] for measure in MEASURES
                  if _order_free(measure) and not measure.fields]
    order_free += [[f"{measure.label_for()} ({field})", fmt(m[measure.key][field])] for measure in MEASURES
                   if _order_free(measure) for field in measure.fields]
    out = [(f"Ranking by {name}; {ties}: expected over all orders, best and worst order", ["metric", *POLICIES],
            ranked),
           ("Independent of tie order", ["metric", "value"], order_free)]
    radius_caption = "Retrieval within Hamming radius r (micro: counts summed over queries)"
    if name != "Hamming distance":
        radius_caption = (f"Retrieval within radius r of the {name.split(' in ')[0]} (micro: counts summed over "
                          "queries); mLGAP stays plain Hamming: at the integer radii, in bits")
    for parameter, caption in (("radius", radius_caption),
                               ("hashtable", "Hashtable-bucket paradigm, L tables of K-bit substrings (micro)")):
        measures = [x for x in MEASURES if x.parameter == parameter]
        values = list(m[measures[0].key]) if measures else []
        if not values:
            continue
        header = [parameter] + [f"{FIELD_LABELS[f]} ({x.column})" if x.column else FIELD_LABELS[f]
                                for x in measures for f in x.fields] + [x.column for x in measures if not x.fields]
        rows = [[value] + [fmt(m[x.key][value][f]) for x in measures for f in x.fields]
                + [fmt(m[x.key][value]) for x in measures if not x.fields] for value in values]
        out.append((caption, header, rows))
    return out + convention_tables(report) + served_report.served_tables(report)


def convention_tables(report: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """(caption, header, rows) per requested convention, the caption naming the script it reproduces."""
    out = []
    for name, values in report.get("conventions", {}).items():
        c = BY_NAME[name]
        what = "mAP@K" if c.key == "map_at_k" else "mAP"
        caption = (f"{name}: {what} as {c.reproduces} computes it ({c.averaged}, mean over {c.queries}; "
                   "docs/metrics.md, section 3b)")
        rows = ([["mAP", *(fmt(values["map"][p]) for p in POLICIES)]] if "map" in values
                else [[f"mAP@{k}", *(fmt(v[p]) for p in POLICIES)] for k, v in values["map_at_k"].items()])
        out.append((caption, ["metric", *POLICIES], rows))
    return out


def _has_interval(v: dict) -> bool:
    """Whether a measure's tie orders move it: best and worst defined and apart."""
    return fmt(v["worst"]) != "n/a" and v["worst"] != v["best"]


def headline_table(report: dict) -> tuple[str, list[str], list[list[str]]]:
    """The headline measures as "expected [worst, best]": the value to publish and what tie order can move it."""
    rows = [[label, (f"{fmt(v['expected'])} [{fmt(v['worst'])}, {fmt(v['best'])}]" if _has_interval(v)
             else fmt(v["expected"])) + radius_context(report, label, short=True)]
            for label, v in headline_rows(report["metrics"])]
    return ("Headline: expected over all orders of tied items [worst, best order]; publish expected",
            ["metric", "expected [worst, best]"], rows)


def format_table(report: dict) -> str:
    """The headline, the metric tables (with the requested conventions) as aligned text, code usage and the
    evaluated query count."""
    parts = [text_table(*headline_table(report)), *(text_table(*t) for t in tables(report))]
    usage = report.get("code_usage")
    if usage:
        parts.append(f"code usage: {usage['distinct_codes']} distinct codes, largest bucket {usage['max_bucket']}, "
                     f"{100 * usage['collision_fraction']:.1f}% of items share their code, entropy "
                     f"{usage['entropy_bits']:.2f} bits ({usage['entropy_ratio']:.3f} of B)")
    q = report["queries"]
    parts.append(f"queries: {q['evaluated']} evaluated of {q['total']} ({q['without_relevant']} without relevant "
                 "items)")
    reason = no_relevant_reason(report)
    if reason:
        parts.append(reason)
    return "\n\n".join(parts)


def no_relevant_reason(report: dict) -> str | None:
    """Why every measure is 0 or undefined, when no query has a relevant database item (docs/metrics.md,
    section 3); None when some query has one."""
    q = report["queries"]
    if q["total"] == 0 or q["without_relevant"] < q["total"]:
        return None
    outcome = ("each counts as 0 (--empty-queries zero), so every mean is 0 and AUC is undefined" if q["evaluated"]
               else "each is excluded from the means, so every mean over queries is undefined (n/a) and every "
               "micro count is 0")
    return (f"No query has a relevant database item: all {q['total']:,} queries have R = 0 under this ground truth "
            f"(labels no database item shares, an empty epsilon ball, or grades all 0); {outcome} (docs/metrics.md, "
            "section 3).")


# -- HTML ----------------------------------------------------------------------


def _pr_points(plt, curve, label, labels: int = 7):
    """A PR curve with at most ``labels`` of its points labelled (label(p)), spread evenly along the curve, each
    label above and right of its point, away from a falling curve and from the other labels; below it near the top
    edge and left of it near the right edge, so that every label stays inside the axes."""
    fig, ax = plt.subplots(figsize=(5, 4))
    x, y = np.array([p["recall"] for p in curve]), np.array([p["precision"] for p in curve])
    ax.plot(x, y, marker="o", ms=3, clip_on=False)
    if not len(curve):
        return fig, ax
    along = np.concatenate([[0.0], np.cumsum(np.hypot(np.diff(x), np.diff(y)))])
    for i in sorted({int(np.argmin(np.abs(along - s))) for s in np.linspace(0, along[-1], labels)}):
        right, top = x[i] > 0.8, y[i] > 0.9
        ax.annotate(label(curve[i]), (x[i], y[i]), fontsize=9, xytext=(-5 if right else 5, -6 if top else 4),
                    textcoords="offset points", ha="right" if right else "left", va="top" if top else "bottom")
    return fig, ax


def _pr_curve(plt, report, per_query, bucket_sizes):
    fig, ax = _pr_points(plt, report["metrics"]["pr_curve"], lambda p: f"r={p['radius']:.4g}")
    ax.set(xlabel="recall (micro)", ylabel="precision (micro)",
           title=_in_distance("PR curve (labels: Hamming radius)", report), xlim=(0, 1.05), ylim=(0, 1.05))
    return fig


def _radius(plt, report, per_query, bucket_sizes):
    evaluated = per_query["relevant"] > 0
    tp, size = per_query["tp_at_radius"][evaluated], per_query["retrieved_at_radius"][evaluated]
    R = per_query["relevant"][evaluated]
    # the columns' radii: 0..B, or a binned distance's upper bin edges
    radii = np.asarray(report.get("distance", {}).get("upper_edges", np.arange(tp.shape[1])), dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        p_r = np.where(size > 0, tp / np.maximum(size, 1), 0.0).mean(axis=0) if len(tp) else radii * 0.0
        r_r = (tp / np.maximum(R, 1)[:, None]).mean(axis=0) if len(tp) else radii * 0.0
    empty = (size == 0).mean(axis=0) if len(tp) else radii * 0.0
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot(radii, p_r, label="P@r (macro; an empty ball counts 0)")
    ax.plot(radii, r_r, label="R@r (macro)")
    ax.plot(radii, empty, ls=":", color="grey", label="share of queries whose ball is empty")
    distance, _ = distance_words(report)
    ax.set(xlabel="Hamming radius r" if distance == "Hamming distance" else f"radius r ({distance})", ylabel="value",
           title="precision and recall against radius", ylim=(0, 1.05))
    ax.legend(fontsize=8)
    return fig


def plotted_cutoffs(report: dict) -> list[int]:
    """The cut-offs N of the report's curves over N up to the database size (a larger K is the database size:
    its values repeat those at Nall, docs/metrics.md section 4)."""
    return [int(n) for n in report["metrics"]["precision_at_n"] if int(n) <= report["dataset"]["n_database"]]


def _precision_at_n(plt, report, per_query, bucket_sizes):
    m = report["metrics"]
    cutoffs = plotted_cutoffs(report)
    fig, ax = plt.subplots(figsize=(5, 4))
    widest = 0.0
    for key, name in (("precision_at_n", "P@N"), ("recall_at_n", "R@N")):
        v = {p: np.array([m[key][str(n)][p] for n in cutoffs], dtype=float) for p in POLICIES}
        (line,) = ax.plot(cutoffs, v["expected"], marker="o", ms=3, label=f"{name} (expected)", clip_on=False)
        ax.fill_between(cutoffs, v["worst"], v["best"], color=line.get_color(), alpha=0.3, lw=0,
                        label=f"{name} worst to best")
        widest = max(widest, float(np.nanmax(v["best"] - v["worst"], initial=0.0)))
    title = "precision and recall against N"
    if widest < 0.02:  # a band thinner than the line would be invisible: say so
        title += f"\n(worst-to-best bands at most {widest:.3f} wide: hidden by the lines)"
    ax.set(xscale="log", xlabel="cut-off N (top N of the Hamming ranking)", ylabel="value (macro)",
           title=title, ylim=(0, 1.05))
    ax.legend(fontsize=8)
    return fig


def _pr_curve_by_rank(plt, report, per_query, bucket_sizes):
    fig, ax = _pr_points(plt, report["metrics"]["pr_curve_by_rank"], lambda p: f"N={p['n']}")
    ax.set(xlabel="recall R@N (macro, expected)", ylabel="precision P@N (macro, expected)",
           title="PR curve by rank (labels: cut-off N)", xlim=(0, 1.05), ylim=(0, 1.05))
    return fig


def _ap_distribution(plt, report, per_query, bucket_sizes):
    fig, ax = plt.subplots(figsize=(5, 4))
    ap = per_query[AP_EXPECTED][per_query["relevant"] > 0]
    counts, edges = np.histogram(ap[~np.isnan(ap)], bins=40, range=(0, 1))
    ax.stairs(counts, edges, fill=True)  # one artist, where ax.hist draws a patch per bar (0.06 s more)
    ax.set(xlabel="AP (expected over tie orders)", ylabel="queries", title="AP distribution")
    return fig


def _map_interval(plt, report, per_query, bucket_sizes):
    """Every headline measure's tie interval in one plot: worst to best as a bar, expected as a dot, in the
    headline's order (measures without a tie interval are left out)."""
    rows = [(label, v) for label, v in headline_rows(report["metrics"]) if v["worst"] != v["best"]]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 0.4 * len(rows) + 1.4))
    ys = np.arange(len(rows))[::-1]
    for y, (_, v) in zip(ys, rows, strict=True):
        ax.hlines(y, v["worst"], v["best"], lw=7, color="lightsteelblue")
        ax.plot([v["expected"]], [y], "o", color="navy", ms=5)
    # the values beside their measure's name, where the layout keeps them inside the figure
    ax.set(yticks=ys, yticklabels=[f"{label}  {v['expected']:.4f} [{v['worst']:.4f}, {v['best']:.4f}]"
                                   for label, v in rows], xlim=(0, 1.02),
           xticks=[0, 0.25, 0.5, 0.75, 1], xlabel="dot: expected; bar: worst to best order",
           title="How far the order of tied items can move each headline measure")
    fig.tight_layout()
    return fig


def _code_usage(plt, report, per_query, bucket_sizes):
    fig, ax = plt.subplots(figsize=(5, 4))
    # the rank-size steps, one point per run of equal bucket sizes (not one per distinct code)
    ranks, sizes = rank_size_steps(bucket_sizes)
    ax.plot(ranks, sizes, drawstyle="steps-post")
    log_count_axes(ax, ranks[-1], sizes[0])
    ax.set(xlabel="distinct codes, most used first", ylabel="database items with the code",
           title=f"code usage: {int(np.asarray(bucket_sizes)[:, 1].sum())} distinct codes")
    return fig


# the report's figures, in page order (the wide one first, so the rest fill rows of two): each drawn by (pyplot,
# report, per_query, bucket_sizes), its caption written for Hamming distances (the page says the report's
# distance: _in_distance)
FIGURES = {
    "map_interval": Figure(_map_interval, "Each headline measure under ties: any tie-breaking rule gives a value "
                           "between worst (relevant items last in each tie group) and best (first); expected, the "
                           "value to publish, is the exact mean over all tie orders.", wide=True),
    "pr_curve": Figure(_pr_curve, "Micro precision-recall curve over Hamming radii 0..B: TP, FP and FN summed over "
                       "the evaluated queries at each radius (labels: radius r). The curve does not depend on how "
                       "ties are ordered."),
    "radius": Figure(_radius, "Macro precision P@r and recall R@r of the items within Hamming radius r, averaged "
                     "over the evaluated queries (P@r = 0 for a query whose radius-r ball is empty)."),
    "precision_at_n": Figure(_precision_at_n, "Precision P@N and recall R@N of the top N items of the Hamming "
                             "ranking against the cut-off N (log scale; N = 1, 2, 5, 10, ... up to the database "
                             "size, and every K), averaged over the evaluated queries: lines expected over all "
                             "orders of tied items, bands from the worst to the best tie order."),
    "pr_curve_by_rank": Figure(_pr_curve_by_rank, "Precision-recall curve by rank: the points (R@N, P@N) over the "
                               "same cut-offs N (labels: N), each expected over all orders of tied items and "
                               "averaged over the evaluated queries (macro), as DeepHash-style evaluation code "
                               "draws it."),
    "ap_distribution": Figure(_ap_distribution, "Distribution of per-query average precision over the full Hamming "
                              "ranking, expected over all orders of items tied at one distance."),
    "served": served_report.FIGURE,
    "code_usage": Figure(_code_usage, "How the database fills the code space: items per distinct code, most used "
                         "code first (log-log). A steep head means many items collapsed onto few codes (the mLGAP "
                         "paper's Fig. 1)."),
}


QUERY_FREE_FIGURES = ("code_usage",)  # drawn from the database alone: also when no query was evaluated


def plots(report: dict, per_query: dict, bucket_sizes: np.ndarray) -> dict[str, str]:
    """Every figure of :data:`FIGURES` as a base64 PNG, by name; with no evaluated query (or no relevant item
    in any query) only those of QUERY_FREE_FIGURES: the others would plot nothing or only zeros."""
    figures = FIGURES
    if no_relevant_reason(report):
        figures = {name: f for name, f in FIGURES.items() if name in QUERY_FREE_FIGURES}
    return draw_figures(figures, report, per_query, bucket_sizes)


# what a label's parameter stands for in the definitions: "mAP@{}" is mAP@K, "P@N={}" is P@N
PARAMETER_SYMBOLS = {"k": "K", "cutoff": "N", "radius": "r", "hashtable": "KxL"}


def definitions(report: dict) -> list[tuple[str, str]]:
    """(term, one-line definition) of each measure the report holds, in registry order."""
    m = report["metrics"]
    return [(measure.label.replace("={}", "").format(PARAMETER_SYMBOLS.get(measure.parameter)),
             measure.description if measure.hamming else _in_distance(measure.description, report))
            for measure in MEASURES if measure.key in m and (measure.parameter is None or m[measure.key])]


CITATIONS = (
    "Ding, Li, Li: Mean Local Group Average Precision (mLGAP): A New Performance Metric for Hashing-based "
    "Retrieval, arXiv 2018 (mLGAP, code usage)",
    "Lin, Shen, Wu: Optimizing Ranking Measures for Compact Binary Code Learning (StructHash), ECCV 2014 (NDCG of "
    "StructHash, AUC, weighted Hamming distance)",
    "Cao, Long, Wang, Yu: HashNet: Deep Learning to Hash by Continuation, ICCV 2017 (the hashnet convention)",
    "DeepHash-pytorch, CalcTopMap (the deephash convention); trec_eval map_cut (the trec convention)",
)


def _headline_html(report: dict) -> str:
    """The page's first block: what was evaluated, and each headline measure with what tie order can do to it."""
    d, q = report["dataset"], report["queries"]
    rows = headline_rows(report["metrics"])
    (label, first), rest = rows[0], rows[1:]
    lead = (f"<p class='lead'><b>{html.escape(label)} {fmt(first['expected'])}</b>: any order of tied items gives "
            f"{fmt(first['worst'])} to {fmt(first['best'])}; publish {fmt(first['expected'])}, the expected value "
            "(the exact mean over all tie orders).</p>")
    if fmt(first["expected"]) == "n/a":
        lead = f"<p class='lead'><b>{html.escape(label)} n/a</b>: undefined, a mean over no query.</p>"
    items = "".join(f"<li>{html.escape(name)} <b>{fmt(v['expected'])}</b>"
                    + (f" [{fmt(v['worst'])}, {fmt(v['best'])}]" if _has_interval(v) else "")
                    + html.escape(radius_context(report, name)) + "</li>" for name, v in rest)
    reason = no_relevant_reason(report)
    why = f"<p class='no-relevant' id='no-relevant'><b>{html.escape(reason)}</b></p>" if reason else ""
    return (f"<section class='headline'><p>{d['n_queries']:,} queries x {d['n_database']:,} database items, "
            f"{d['nbits']}-bit codes, {html.escape(str(d['relevance']))} relevance; {q['evaluated']:,} of "
            f"{q['total']:,} queries evaluated ({q['without_relevant']:,} without relevant items).</p>{why}{lead}"
            f"<ul class='measures'>{items}</ul></section>")


def radius_context(report: dict, label: str, short: bool = False) -> str:
    """What a radius measure's precision needs beside it: its recall and how many queries' balls are empty (a
    precision of 1 over the few queries that retrieve anything is no achievement); "" for other measures.
    ``short``: for the terminal's table."""
    prefix = BY_KEY["micro_at_radius"].label.split("{}")[0]
    if not label.startswith(prefix):
        return ""
    radius, m = label[len(prefix):].split()[0], report["metrics"]
    micro, empty = m["micro_at_radius"][radius], m["retrieved_nothing_at_radius"][radius]
    evaluated = report["queries"]["evaluated"]
    share = f"{100 * empty / evaluated:.0f}%" if evaluated else "n/a"
    if short:
        return f" (R {fmt(micro['recall'])}, {share} of balls empty)"
    return f", R {fmt(micro['recall'])}; {share} of queries ({empty:,} of {evaluated:,}) retrieve nothing within it"


def provenance_rows(report: dict) -> list[list[str]]:
    """Everything that produced the numbers: when, with what, from which data, with which parameters, where."""
    prov, d, t = report["provenance"], report["dataset"], report["timing"]
    packages = ", ".join(f"{name} {v}" for name, v in prov["packages"].items() if v)
    rows = [["created", str(prov.get("created") or "n/a")],
            ["hashdist", f"{prov['packages'].get('hashdist')}, commit {prov.get('hashdist_commit') or 'n/a'}"],
            ["packages", packages], ["dataset", str(d["path"])], ["dataset fingerprint", d["fingerprint"]],
            *([f"parameter {k}", json.dumps(v)] for k, v in report["parameters"].items()),
            ["engine", json.dumps(report["engine"])],
            ["timing", ", ".join(f"{k} {v:.2f} s" for k, v in t.items() if isinstance(v, (int, float)))]]
    return rows


def dataset_name(report: dict) -> str:
    """The dataset's directory name, as the page's title gives it."""
    return Path(str(report["dataset"]["path"]).rstrip("/")).name or "dataset"


def render_html(report: dict, images: dict[str, str]) -> str:
    name = dataset_name(report)
    head = f"<h1>hashdist report: {html.escape(name)}</h1>{_headline_html(report)}"
    body = "".join(html_table(caption, header, rows, f"table-{i}")
                   for i, (caption, header, rows) in enumerate(tables(report)))
    figures = html_figures(FIGURES, images, lambda text: _in_distance(text, report))
    glossary = html_definitions(definitions(report))
    sources = ("<p>The definitions in full: docs/metrics.md in hashdist's repository. Sources:</p><ol>"
               + "".join(f"<li>{html.escape(c)}</li>" for c in CITATIONS) + "</ol>")
    prov = html_table(PROVENANCE_CAPTION, ["what", "value"], provenance_rows(report), "provenance")
    return page(f"hashdist report: {name}", f"{head}<h2>Metrics</h2>{body}<h2>Plots</h2>{figures}"
                f"<h2>Definitions</h2>{glossary}{sources}<h2>Provenance</h2>{prov}")


# -- writing an output directory -----------------------------------------------

PER_QUERY_KEYS = ("relevant", *(f"{m.per_query_name or m.key}/" for m in MEASURES if m.stored_per_query))


def check_output_dir(out, inputs=(), kept=()) -> Path:
    """Refuse an ``out`` that is not new, empty or a previous hashdist report (which a rerun replaces), and one
    that overlaps an input path (the dataset) or the block cache (``kept``)."""
    return check_replaceable_dir(out, inputs, what="report", marker_file="report.json", marker=REPORT_MARKER,
                                 kept=kept)


def write_per_query(path: Path, per_query: dict) -> None:
    import zarr

    _write_arrays(zarr.open_group(store=str(path), mode="w"), per_query)


def _write_arrays(group, per_query: dict) -> None:
    """The per-query arrays into ``group``; a run over tasks has a dict per task, written as a subgroup."""
    for key, values in per_query.items():
        if isinstance(values, dict):
            _write_arrays(group.create_group(key), values)
        elif key.startswith(PER_QUERY_KEYS) or served_report.stored(key):
            group.create_array(key.replace("/", "."), data=np.asarray(values))


def write_outputs(
    out, report: dict, per_query: dict, render_page, *, overwrite: bool = False, html: bool = True, finalize=None
) -> Path:
    """Write report.json, per_query.zarr and report.html (``render_page()``) atomically into ``out``.

    ``finalize(report)``, if given, runs just before report.json is written (to record timings).
    """
    out = Path(out)
    with staged_directory(check_output_dir(out, (report["dataset"]["path"],))) as tmp:
        report["outputs"] = {"report_json": str(out / "report.json"), "per_query": str(out / "per_query.zarr"),
                             "report_html": str(out / "report.html") if html else None}
        write_per_query(tmp / "per_query.zarr", per_query)
        if html:
            (tmp / "report.html").write_text(render_page())
        if finalize:
            finalize(report)
        (tmp / "report.json").write_text(json.dumps(json_safe(report), indent=2))
    return out
