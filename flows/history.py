"""Watching an index over time from the ``evaluate`` flow: record the run, test it against the previous one,
publish the trend as a Prefect artifact, and end the run Failed on a significant drop.

The statistics and the store are ``hashdist.compare.history`` (pure library functions); this module adds only
Prefect's artifacts and states. In the flow, after the outputs are written::

    if history is not None:
        verdict = watch(evaluation, history)
        if verdict["flagged"]:
            return drop_state(verdict, evaluation)

``drop_state`` is a ``Failed`` state whose message is the verdict's one line ("mAP dropped significantly:
..."): the flow run ends Failed with that message (its ``prefect.flow-run.Failed`` event carries it as
``prefect.state-message``, which deploy/automation-history.yaml matches), the written outputs stay, and a
caller of the flow function gets :class:`hashdist.compare.history.SignificantDrop` raised, holding the verdict and
the evaluation.
"""

from __future__ import annotations

from prefect.artifacts import create_markdown_artifact
from prefect.states import Failed

from flows.observe import (
    EVENT_DROPPED,
    absolute,
    emit,
    index_id,
    index_resource,
    markdown_text,
    measures,
    run_log,
)
from hashdist.compare.history import SignificantDrop, compare_runs, load_history, record
from hashdist.report.history import flag

ARTIFACT_KEY = "hashdist-history"  # and the index: hashdist-history-<name>-<digest of its location>
TREND_ROWS = 10  # runs shown in the artifact's table (the most recent)


def trend_markdown(history_dir, verdict: dict, runs: list[dict]) -> str:
    """The artifact: the verdict, the test, and the most recent runs as a Markdown table."""
    lines = [f"## hashdist history: {'significant drop' if verdict['flagged'] else verdict['reason']}", "",
             verdict["message"], ""]
    if verdict["status"] == "compared":
        lines += [
            f"Paired over {verdict['shared_queries']} queries evaluated in both runs (AP expected over tie orders): "
            f"mean difference {verdict['mean_ap_diff']:+.4f}, sign-flip randomisation p = "
            f"{verdict['randomization_pvalue']:.3g} ({verdict['permutations']} patterns, seed {verdict['seed']}), "
            f"paired t-test p = {verdict['t_pvalue']:.3g}; flagged when the randomisation p < {verdict['alpha']:g} "
            "and the mean AP dropped.", ""]
    lines += ["| run | time (UTC) | dataset | mAP | [worst, best] | verdict |", "| --- | --- | --- | --- | --- | --- |"]
    previous = None
    rows = []
    for i, entry in enumerate(runs, 1):
        rows.append((i, entry, previous))
        previous = entry
    for i, entry, before in rows[-TREND_ROWS:]:
        m = entry["metrics"]["map"]
        v = verdict if entry["run"] == verdict["run"] else compare_runs(
            before, entry, alpha=verdict["alpha"], permutations=verdict["permutations"], seed=verdict["seed"],
            min_drop=verdict["min_drop"])
        lines.append(f"| {i} | {entry['time'][:19].replace('T', ' ')} | `{entry['dataset']['fingerprint'][:12]}` | "
                     f"{m['expected']:.4f} | [{m['worst']:.4f}, {m['best']:.4f}] | {flag(v)} |")
    store = markdown_text(absolute(history_dir))
    lines += ["", f"History store: {store} (hashdist history {store} for the full trend and its HTML page)."]
    return "\n".join(lines)


def watch(evaluation, history_dir, log=None, **test_options) -> dict:
    """Append ``evaluation`` to the history at ``history_dir``, compare it with the previous run
    (:func:`hashdist.compare.history.record`; ``test_options``: alpha, permutations, seed, min_drop), log the
    verdict, publish the markdown artifact ``hashdist-history-<index>``, emit ``hashdist.evaluation.dropped`` on a
    significant drop, and return the verdict. Call it inside a flow run (``log``: its run logger)."""
    log = log or run_log()
    verdict = record(history_dir, evaluation, **test_options)
    log.info(f"history {absolute(history_dir)}: {verdict['message']}")
    runs = load_history(history_dir)
    report = evaluation.report
    create_markdown_artifact(markdown=trend_markdown(history_dir, verdict, runs),
                             key=f"{ARTIFACT_KEY}-{index_id(report['dataset']['path'])}",
                             description=f"hashdist history: {markdown_text(verdict['message'][:200])}")
    if verdict["flagged"]:
        test = {k: verdict.get(k) for k in ("message", "mean_ap_diff", "randomization_pvalue", "t_pvalue",
                                             "shared_queries", "alpha", "min_drop")}
        emit(log, EVENT_DROPPED, index_resource(report),
             {"measures": measures(report), "verdict": test, "history": absolute(history_dir),
              "report": absolute(report["outputs"]["report_json"]) if report.get("outputs") else None})
    return verdict


def drop_state(verdict: dict, evaluation=None):
    """The flow's final state on a significant drop: Failed, its message the verdict's one line; a caller of the
    flow function gets :class:`hashdist.compare.history.SignificantDrop` (with the verdict and the evaluation)
    raised."""
    return Failed(message=verdict["message"], data=SignificantDrop(verdict, evaluation))
