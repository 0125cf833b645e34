"""What people see of the served runs (docs/served.md): a table with a row per run, a captioned figure, and which
per-query arrays per_query.zarr keeps. hashdist.report.evaluation places them in the terminal output and the page.
"""

from __future__ import annotations

from hashdist.report.render import Figure, fmt

# per-query arrays of a served run that per_query.zarr keeps: neighbour recall and served AP@K, and a radius
# lookup's counts (the rest stay in memory)
STORED = ("neighbours/recall_at_k/", "ap_at_k/", "range/")


def stored(key: str) -> bool:
    """Whether per_query.zarr keeps this per-query array (``served/NAME/...``)."""
    parts = key.split("/", 2)
    return len(parts) == 3 and parts[0] == "served" and parts[2].startswith(STORED)


def _interval(v: dict) -> str:
    text = fmt(v["expected"])
    return text if v["worst"] == v["best"] else f"{text} [{fmt(v['worst'])}, {fmt(v['best'])}]"


def _against(served: dict, exhaustive: dict) -> str:
    return f"{fmt(served['expected'])} / {fmt(exhaustive['expected'])}"


def served_tables(report: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """(caption, header, rows): the k-NN runs at each K, a row per run; the radius lookups, a row per run."""
    served = report.get("served") or {}
    knn = {name: s for name, s in served.items() if s["kind"] == "knn"}
    ranged = {name: s for name, s in served.items() if s["kind"] == "range"}
    out = []
    if knn:
        metrics = report["metrics"]
        rows = [[name, k, _interval(s["neighbours"]["recall_at_k"][k]), fmt(s["neighbours"]["lenient_at_k"][k]),
                 fmt(s["neighbours"]["exact_at_k"][k]),
                 _against(s["metrics"]["map_at_k"][k]["retrieved"], metrics["map_at_k"][k]["retrieved"]),
                 _against(s["metrics"]["precision_at_k"][k], metrics["precision_at_k"][k]),
                 _time(s)] for name, s in knn.items() for k in s["neighbours"]["recall_at_k"]]
        out.append(("Served lists against the exhaustive ranking: neighbour recall@K expected over tie orders "
                    "[worst, best] (publish expected); lenient (ann-benchmarks' d <= d_K); exact (share of queries "
                    "served a valid top K); mAP@K and P@K of what is served / of the exhaustive ranking",
                    ["run", "K", "recall@K", "lenient", "exact", "mAP@K served / exhaustive",
                     "P@K served / exhaustive", "time per query"], rows))
    if ranged:
        rows = [[name, s["range"]["radius"], fmt(s["range"]["recall"]), fmt(s["range"]["precision"]),
                 fmt(s["range"]["micro"]["recall"]), fmt(s["range"]["micro"]["precision"]),
                 s["range"]["queries_with_empty_ball"], s["range"]["queries_served_nothing"], _time(s)]
                for name, s in ranged.items()]
        out.append(("Served radius lookups against the Hamming ball d <= r: recall (mean over queries with a "
                    "non-empty ball), precision (mean over every query, 0 when nothing is served), micro",
                    ["run", "r", "recall", "precision", "micro R", "micro P", "empty balls", "served nothing",
                     "time per query"], rows))
    return out


def _time(section: dict) -> str:
    t = section.get("time_per_query_s")
    return "n/a" if t is None else f"{t * 1e3:.4g} ms"


def _figure(plt, report, per_query, bucket_sizes):
    """Neighbour recall@K (expected, worst-to-best bar) against served mAP@K per run, or against the time per
    query when every run carries one; at the largest K."""
    knn = {name: s for name, s in (report.get("served") or {}).items() if s["kind"] == "knn"}
    if not knn:
        return None
    k = str(max(int(k) for k in next(iter(knn.values()))["neighbours"]["recall_at_k"]))
    timed = all("time_per_query_s" in s for s in knn.values())
    fig, ax = plt.subplots(figsize=(5, 4))
    for name, s in knn.items():
        recall = s["neighbours"]["recall_at_k"][k]
        x = s["time_per_query_s"] * 1e3 if timed else s["metrics"]["map_at_k"][k]["retrieved"]["expected"]
        ax.vlines(x, recall["worst"], recall["best"], color="lightsteelblue", lw=5)
        ax.plot([x], [recall["expected"]], "o", color="navy", ms=5)
        ax.annotate(name, (x, recall["expected"]), xytext=(5, 3), textcoords="offset points", fontsize=8)
    if timed:
        ax.set(xscale="log", xlabel="search time per query (ms)")
    else:
        exhaustive = report["metrics"]["map_at_k"][k]["retrieved"]["expected"]
        ax.axvline(exhaustive, ls=":", color="grey", label=f"exhaustive mAP@{k}")
        ax.set(xlabel=f"served mAP@{k} (expected)")
        ax.legend(fontsize=8)
    ax.set(ylabel=f"neighbour recall@{k}", ylim=(0, 1.05), title=f"served runs at K = {k}")
    return fig


FIGURE = Figure(_figure, "Each served run's neighbour recall@K at the largest K: the dot is the expected value over "
                "the orders of the items tied at the K-th exhaustive distance, the bar worst to best (any tie-breaking "
                "reference list lies inside); against the search time per query when every run carries one, else "
                "against the mAP@K of what the run serves (dotted: the exhaustive ranking's).")
