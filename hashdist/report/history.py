"""The history's trend as a terminal table and as a self-contained HTML page (plot of mAP over runs + table)."""

from __future__ import annotations

import html
from pathlib import Path

from hashdist.data.atomic import check_output, replace_file
from hashdist.errors import InputError
from hashdist.report.render import fmt, has_page_marker, html_figure, html_table, page, png, pyplot, text_table

DEFAULT_PAGE = "history.html"  # the page's name inside the store when `hashdist history` has no --out

PAGE_MARKER = "hashdist-history-page"  # a page that `hashdist history --out` may replace carries it
FLAGS = {"first run": "first run", "not comparable": "not comparable"}


def flag(verdict: dict) -> str:
    """A run's verdict in a word or two: first run, not comparable, DROP, rise, ok."""
    if verdict["status"] in FLAGS:
        return FLAGS[verdict["status"]]
    if verdict["flagged"]:
        return "DROP"
    return "rise" if verdict["significant"] and verdict["mean_ap_diff"] > 0 else "ok"


def _signed(x) -> str:
    return "n/a" if x is None else f"{x:+.4f}"


def _p(x) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _time(text: str) -> str:
    """2026-11-23T02:00:04.123456Z -> 2026-11-23 02:00:04"""
    return text.replace("T", " ")[:19]


def _mlgap_radius(rows) -> str | None:
    radii = {(r["metrics"].get("mlgap") or {}).get("radius") for r in rows}
    return radii.pop() if len(radii) == 1 else None


def trend_table(trend: dict) -> tuple[str, list[str], list[list[str]]]:
    """(caption, header, rows): one row per run, oldest first."""
    rows = trend["runs"]
    r = _mlgap_radius(rows)
    p = trend["parameters"]
    header = ["run", "time (UTC)", "dataset", "mAP", "[worst, best]", f"mLGAP@{r}" if r else "mLGAP",
              "change", "p (randomisation)", "p (t-test)", "verdict"]
    table = []
    for i, row in enumerate(rows, 1):
        m, v = row["metrics"], row["verdict"]
        mlgap = m.get("mlgap")
        mlgap_cell = "n/a" if not mlgap else fmt(mlgap["value"]) + ("" if r else f" (r={mlgap['radius']})")
        table.append([str(i), _time(row["time"]), row["dataset"]["fingerprint"][:12], fmt(m["map"]["expected"]),
                      f"[{fmt(m['map']['worst'])}, {fmt(m['map']['best'])}]", mlgap_cell,
                      _signed(v["mean_ap_diff"]), _p(v["randomization_pvalue"]), _p(v["t_pvalue"]), flag(v)])
    caption = (f"Runs, oldest first. mAP expected over tie orders, [worst, best] over all tie orders; change: mean "
               f"AP difference against the previous run over the queries both evaluated; p: two-sided paired tests "
               f"(sign-flip randomisation, {p['permutations']} patterns, seed {p['seed']}; t-test); DROP: "
               f"randomisation p < {p['alpha']:g} and a drop" + (f" of more than {p['min_drop']:g}" if p["min_drop"]
                                                                  else ""))
    return caption, header, table


def format_trend(trend: dict) -> str:
    """The trend table as aligned text, and the latest verdict."""
    if not trend["runs"]:
        return f"{trend['history']}: no runs yet"
    caption, header, rows = trend_table(trend)
    return f"{text_table(caption, header, rows)}\n\nlatest: {trend['verdict']['message']}"


def plot_map(trend: dict) -> str:
    """mAP (expected) over the runs with the tie band [worst, best]; drops in red; a dashed line where the
    query set or settings changed (not comparable). Base64 PNG."""
    plt = pyplot()
    rows = trend["runs"]
    x = list(range(1, len(rows) + 1))
    expected = [r["metrics"]["map"]["expected"] for r in rows]
    worst = [r["metrics"]["map"]["worst"] for r in rows]
    best = [r["metrics"]["map"]["best"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(5.0, min(12.0, 0.45 * len(rows) + 3)), 3.8))
    ax.fill_between(x, worst, best, step=None, color="lightsteelblue", alpha=0.7, lw=0,
                    label="tie interval [worst, best]")
    ax.vlines(x, worst, best, color="steelblue", lw=1)
    ax.plot(x, expected, marker="o", ms=4, color="navy", label="mAP (expected)")
    dropped = [(i, e) for i, e, r in zip(x, expected, rows, strict=True) if r["verdict"]["flagged"]]
    if dropped:
        ax.plot(*zip(*dropped, strict=True), "o", ms=10, mfc="none", mec="red", mew=2, label="significant drop")
    for i, r in zip(x, rows, strict=True):
        if r["verdict"]["status"] == "not comparable":
            ax.axvline(i - 0.5, color="grey", ls="--", lw=1)
    if len(rows) <= 12:
        ax.set_xticks(x, [f"{i}\n{_time(r['time'])[5:16]}" for i, r in zip(x, rows, strict=True)], fontsize=7)
    ax.set(xlabel="run (UTC time)" if len(rows) <= 12 else "run (times in the table)", ylabel="mAP",
           title=f"mAP over {len(rows)} runs", xlim=(0.5, len(rows) + 0.5))
    ax.legend(fontsize=8, loc="best")
    data = png(fig)
    plt.close(fig)
    return data


def render_history_html(trend: dict) -> str:
    rows = trend["runs"]
    paths = sorted({r["dataset"]["path"] for r in rows})
    p = trend["parameters"]
    name = Path(str(trend["history"]).rstrip("/")).name or "history"
    head = (f"<h1>hashdist history: {html.escape(name)}</h1><p>History <code>{html.escape(trend['history'])}</code>: "
            f"{len(rows)} runs of "
            + ", ".join(f"<code>{html.escape(str(x))}</code>" for x in paths)
            + f". Each run is paired with the run before it on the queries both evaluated (the same query set and "
            f"settings; otherwise not comparable): a significant drop is a two-sided sign-flip randomisation p-value "
            f"below {p['alpha']:g} with a lower mean AP.</p>")
    if not rows:
        return page(f"hashdist history: {name}", head, PAGE_MARKER)
    m = rows[-1]["metrics"]["map"]
    latest = (f"<section class='headline'><p class='lead'>Latest run: mAP <b>{m['expected']:.4f}</b> (any tie order: "
              f"{m['worst']:.4f} to {m['best']:.4f})</p><p id='latest'>Latest: "
              f"{html.escape(trend['verdict']['message'])}</p></section>")
    caption = ("mAP of each run, expected over all orders of items tied at one distance (line), with its tie "
               "interval from the worst to the best tie order (band and bars); red circles: runs whose AP dropped "
               "significantly against the run before; dashed lines: the query set or settings changed, so the runs "
               "on either side are not compared.")
    figure = html_figure("map-trend", plot_map(trend), caption)
    table = html_table(*trend_table(trend), table_id="runs")
    return page(f"hashdist history: {name}", f"{head}{latest}{figure}{table}", PAGE_MARKER)


def check_history_page(path, history) -> Path:
    """Refuse, before any work, a page path that is not new or a previous history page (its marker), or that
    lies in the store ``history`` (its own ``history.html`` excepted, always a page hashdist wrote there)."""
    path = Path(path)
    if path.suffix.lower() not in (".html", ".htm"):
        raise InputError(f"--out {path}: a history page is an .html file; give a path ending in .html")
    if path.is_dir() or not path.parent.is_dir():
        raise InputError(f"--out {path}: not a file in an existing directory")
    own = path.parent.resolve() == Path(history).resolve() and path.name == DEFAULT_PAGE
    return check_output(path, "history page", lambda p: own or has_page_marker(p, PAGE_MARKER), overwrite=None,
                        inputs=() if own else (history,))


def write_history_html(path, trend: dict) -> Path:
    """Write the page to ``path`` atomically (a temporary sibling renamed over it)."""
    path = Path(path)
    replace_file(path, render_history_html(trend))
    return path
