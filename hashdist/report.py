"""Reports: the JSON document, the terminal table, per-query arrays and the HTML page.

An output directory is written to a temporary sibling and renamed into place, so
it is either the previous complete report or the new one, never half of each.
"""

from __future__ import annotations

import base64
import io
import json
import math
import subprocess
from importlib import metadata
from pathlib import Path

import numpy as np

from hashdist.atomic import staged_directory
from hashdist.errors import InputError

REPORT_MARKER = "hashdist-report"
_PACKAGES = ("hashdist", "numpy", "numba", "zarr", "scipy", "prefect", "prefect-dask", "dask", "distributed")


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def source_commit() -> str | None:
    """The git commit of the hashdist source tree, when it is a checkout."""
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        )
        return out.stdout.strip() or None
    except Exception:
        return None


def provenance(dataset_fingerprint: str, parameters: dict) -> dict:
    return {
        "dataset_fingerprint": dataset_fingerprint,
        "parameters": parameters,
        "packages": {name: _version(name) for name in _PACKAGES},
        "hashdist_commit": source_commit(),
    }


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


# -- terminal table ------------------------------------------------------------


def _fmt(x) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"


def format_table(report: dict) -> str:
    """The headline metrics as an aligned text table (tie policies as columns)."""
    m = report["metrics"]
    rows = [("mAP", m["map"])]
    for k in m["map_at_k"]:
        for norm, v in m["map_at_k"][k].items():
            rows.append((f"mAP@{k} ({norm})", v))
    for name, label in (("precision_at_k", "P@{}"), ("recall_at_k", "R@{}"), ("ndcg_at_k", "NDCG@{}"),
                        ("ndcg_structhash_at_k", "NDCG-SH@{}")):
        for k, v in m[name].items():
            rows.append((label.format(k), v))
    lines = [f"{'metric':<24}{'expected':>10}{'best':>10}{'worst':>10}"]
    lines += [f"{name:<24}{_fmt(v['expected']):>10}{_fmt(v['best']):>10}{_fmt(v['worst']):>10}" for name, v in rows]
    lines.append(f"{'AUC':<24}{_fmt(m['auc']):>10}")
    lines.append("")
    lines.append(f"{'radius':<8}{'P (macro)':>10}{'R (macro)':>10}{'P (micro)':>10}{'R (micro)':>10}{'F-beta':>10}{'mLGAP':>10}")
    for r in m["micro_at_radius"]:
        mi = m["micro_at_radius"][r]
        lines.append(
            f"{r:<8}{_fmt(m['precision_at_radius'][r]):>10}{_fmt(m['recall_at_radius'][r]):>10}"
            f"{_fmt(mi['precision']):>10}{_fmt(mi['recall']):>10}{_fmt(mi['f_beta']):>10}"
            f"{_fmt(m['mlgap_at_radius'][r]):>10}"
        )
    lines.append(f"AUPRC step {_fmt(m['auprc']['step'])}, trapezoid {_fmt(m['auprc']['trapezoid'])}")
    for setting, h in m.get("hashtable", {}).items():
        lines.append(f"hashtable {setting} (L tables of K bits): P {_fmt(h['precision'])}, R {_fmt(h['recall'])}, "
                     f"F-beta {_fmt(h['f_beta'])}")
    usage = report.get("code_usage")
    if usage:
        lines.append(f"code usage: {usage['distinct_codes']} distinct codes, largest bucket {usage['max_bucket']}, "
                     f"{100 * usage['collision_fraction']:.1f}% of items share their code, entropy "
                     f"{usage['entropy_bits']:.2f} bits ({usage['entropy_ratio']:.3f} of B)")
    q = report["queries"]
    lines.append(f"queries: {q['evaluated']} evaluated of {q['total']} ({q['without_relevant']} without relevant items)")
    return "\n".join(lines)


# -- HTML ----------------------------------------------------------------------


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def plots(report: dict, per_query: dict, code_counts: np.ndarray) -> dict[str, str]:
    """Base64 PNGs: PR curve, P/R against radius, AP distribution, mAP interval, code usage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = report["metrics"]
    out = {}
    evaluated = per_query["relevant"] > 0
    figs = {}

    fig, ax = plt.subplots(figsize=(5, 4))
    curve = m["pr_curve"]
    ax.plot([p["recall"] for p in curve], [p["precision"] for p in curve], marker="o", ms=3)
    last = None
    for p in curve:  # label radii where the curve has moved visibly since the last label
        if last is None or abs(p["recall"] - last[0]) + abs(p["precision"] - last[1]) > 0.06:
            ax.annotate(f"r={p['radius']}", (p["recall"], p["precision"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
            last = (p["recall"], p["precision"])
    ax.set(xlabel="recall (micro)", ylabel="precision (micro)", title="PR curve (labels: Hamming radius)",
           xlim=(0, 1.02), ylim=(0, 1.02))
    figs["pr_curve"] = fig

    tp, size = per_query["tp_at_radius"][evaluated], per_query["retrieved_at_radius"][evaluated]
    R = per_query["relevant"][evaluated]
    radii = np.arange(tp.shape[1])
    with np.errstate(invalid="ignore", divide="ignore"):
        p_r = np.where(size > 0, tp / np.maximum(size, 1), 0.0).mean(axis=0) if len(tp) else radii * 0.0
        r_r = (tp / np.maximum(R, 1)[:, None]).mean(axis=0) if len(tp) else radii * 0.0
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot(radii, p_r, label="P@r (macro)")
    ax.plot(radii, r_r, label="R@r (macro)")
    ax.set(xlabel="Hamming radius r", ylabel="value", title="precision and recall against radius", ylim=(0, 1.02))
    ax.legend()
    figs["radius"] = fig

    fig, ax = plt.subplots(figsize=(5, 4))
    ap = per_query["ap/expected"][evaluated]
    ax.hist(ap[~np.isnan(ap)], bins=40, range=(0, 1))
    ax.set(xlabel="AP (expected over tie orders)", ylabel="queries", title="AP distribution")
    figs["ap_distribution"] = fig

    fig, ax = plt.subplots(figsize=(5, 2.2))
    mp = m["map"]
    ax.hlines(0, mp["worst"], mp["best"], lw=6, color="lightsteelblue")
    ax.plot([mp["expected"]], [0], "o", color="navy")
    ax.set(yticks=[], xlabel="mAP", title=f"mAP tie interval: worst {mp['worst']:.4f}, expected "
           f"{mp['expected']:.4f}, best {mp['best']:.4f}")
    figs["map_interval"] = fig

    fig, ax = plt.subplots(figsize=(5, 4))
    # the rank-size steps, one point per run of equal bucket sizes (not one per distinct code)
    sizes, runs = np.unique(np.asarray(code_counts), return_counts=True)
    sizes, runs = sizes[::-1], runs[::-1]
    ranks = np.concatenate([[1], 1 + np.cumsum(runs)])
    ax.plot(ranks, np.append(sizes, sizes[-1:]), drawstyle="steps-post")
    ax.set(xscale="log", yscale="log", xlabel="distinct codes, most used first", ylabel="database items with the code",
           title=f"code usage: {int(runs.sum())} distinct codes")
    figs["code_usage"] = fig

    for name, fig in figs.items():
        out[name] = _png(fig)
        plt.close(fig)
    return out


def render_html(report: dict, images: dict[str, str]) -> str:
    import html

    d = report["dataset"]
    head = (
        f"<h1>hashdist report</h1><p>dataset <code>{html.escape(str(d['path']))}</code>: {d['n_queries']} queries x "
        f"{d['n_database']} database items, {d['nbits']} bits, relevance {d['relevance']}</p>"
    )
    table = f"<pre>{html.escape(format_table(report))}</pre>"
    imgs = "".join(
        f'<figure><img alt="{name}" src="data:image/png;base64,{data}"><figcaption>{name.replace("_", " ")}'
        "</figcaption></figure>"
        for name, data in images.items()
    )
    style = "body{font-family:sans-serif;max-width:1100px;margin:auto}figure{display:inline-block;margin:8px}"
    return f"<!doctype html><html><head><meta charset='utf-8'><title>hashdist report</title><style>{style}</style>" \
           f"</head><body>{head}{table}{imgs}</body></html>"


# -- writing an output directory -----------------------------------------------

PER_QUERY_KEYS = ("relevant", "ap/", "precision_at_k/", "ndcg_at_k/", "lgap_at_radius/")


def check_output_dir(out, overwrite: bool) -> Path:
    """Refuse an existing directory that is not a previous hashdist report, unless overwrite."""
    out = Path(out)
    if out.exists() and not overwrite:
        marker = out / "report.json"
        ok = False
        if out.is_dir() and marker.is_file():
            try:
                ok = json.loads(marker.read_text()).get("format") == REPORT_MARKER
            except Exception:
                ok = False
        if not ok:
            raise InputError(f"{out}: exists and is not a hashdist report directory (pass --overwrite to replace it)")
    return out


def write_per_query(path: Path, per_query: dict) -> None:
    import zarr

    group = zarr.open_group(store=str(path), mode="w")
    for key, values in per_query.items():
        if key.startswith(PER_QUERY_KEYS):
            group.create_array(key.replace("/", "."), data=np.asarray(values))


def write_outputs(
    out, report: dict, per_query: dict, code_counts, *, overwrite: bool = False, html: bool = True, finalize=None
) -> Path:
    """Write report.json, per_query.zarr and report.html atomically into ``out``.

    ``finalize(report)``, if given, runs just before report.json is written (to record timings).
    """
    out = Path(out)
    with staged_directory(check_output_dir(out, overwrite)) as tmp:
        report["outputs"] = {"report_json": str(out / "report.json"), "per_query": str(out / "per_query.zarr"),
                             "report_html": str(out / "report.html") if html else None}
        write_per_query(tmp / "per_query.zarr", per_query)
        if html:
            (tmp / "report.html").write_text(render_html(report, plots(report, per_query, code_counts)))
        if finalize:
            finalize(report)
        (tmp / "report.json").write_text(json.dumps(json_safe(report), indent=2))
    return out
