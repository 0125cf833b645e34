"""What an operator sees of a flow run in Prefect: the run's story in its logs, artifacts keyed by the index, and
events to automate on.

Logs: each flow logs through Prefect's run logger at INFO (:func:`run_log`): the work line, each phase as it
starts and ends with its elapsed time (:class:`hashdist.progress.Phases`, which also names it in the command's
progress lines), block progress every ``hashdist.progress.PERIOD_S`` seconds (:class:`ProgressLog`), the headline
measures as ``expected [worst, best]``, the outputs' absolute paths and the history verdict; bad input and
failures their one line at ERROR (:func:`failures_logged`). The records carry ``hashdist=True``: the command line,
which prints its own lines, keeps them off its terminal
(``flows.runtime.cli_run``) and they still reach the API.

The index: a dataset is named by the slug of its name (the last part of its path, without ``.zarr``) and a short
digest of its absolute location, ``production-1a2b3c4d``. A nightly run over the same path is the same index
whatever its codes (their content fingerprint is a label of the event and in the artifacts' description), so one
artifact key's history, or an automation's resource id, follows one index over time.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import threading
import time
from decimal import ROUND_FLOOR, Decimal
from pathlib import Path

from prefect import get_run_logger

from hashdist import progress
from hashdist.errors import InputError
from hashdist.metrics.registry import headline_rows

RECORD_MARK = "hashdist"  # an attribute of every record hashdist logs (flows.runtime.cli_run keeps them off a terminal)
SLUG_CHARS = 40  # the name's part of a key, at most
EVENT_COMPLETED = "hashdist.evaluation.completed"
EVENT_DROPPED = "hashdist.evaluation.dropped"


def run_log():
    """Prefect's run logger of the flow run in progress, its records marked as hashdist's."""
    return get_run_logger(**{RECORD_MARK: True})


@contextlib.contextmanager
def failures_logged(log, command: str):
    """Bad input and failures inside the block: their one line at ERROR, then raised as they were."""
    try:
        yield
    except InputError as exc:
        log.error(f"hashdist {command}: error: {exc}")
        raise
    except Exception as exc:
        log.error(f"hashdist {command}: failed: {type(exc).__name__}: {exc}")
        raise


class ProgressLog:
    """While a long run's blocks are computed: every PERIOD_S seconds a log line with the blocks done so far, read
    from ``bar`` (hashdist.progress's bar: ``n``, ``total``); none for a run shorter than that."""

    def __init__(self, log, bar):
        self.log, self.bar = log, bar

    def __enter__(self):
        self.started, self._stop = time.time(), threading.Event()
        self._thread = threading.Thread(target=self._report, name="hashdist-progress-log", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _report(self) -> None:
        while not self._stop.wait(progress.PERIOD_S):  # ends with the blocks
            self.log.info(f"blocks: {self.bar.n:,} of {self.bar.total:,} done after "
                          f"{time.time() - self.started:.0f} s")


# -- what the lines and artifacts say ------------------------------------------------------------------------------


def interval(values: dict) -> str:
    """A measure as ``expected [worst, best]`` with 4 decimals."""
    return f"{_fixed(values['expected'])} [{_fixed(values['worst'])}, {_fixed(values['best'])}]"


def _fixed(x) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"


def per_task(report: dict) -> dict:
    """{task or None: its report part}: a dataset with modalities has one per task."""
    return report.get("tasks") or {None: report}


def headline_lines(report: dict) -> list[str]:
    """The headline measures, ``expected [worst, best]``: one line, or one per task."""
    return [f"headline{f' {task}' if task else ''} (expected [worst, best]): "
            + "; ".join(f"{label} {interval(v)}" for label, v in headline_rows(sub["metrics"]))
            for task, sub in per_task(report).items()]


def absolute(path) -> str:
    """A local path made absolute (a URL is left as it is)."""
    text = str(path)
    if text.startswith("file://"):
        text = text[len("file://"):]
    elif "://" in text:
        return text
    return os.path.abspath(text)


# what Markdown or HTML could read as syntax in a path, and control characters (a line break would end a row)
_MARKDOWN_SPECIAL = re.compile(r"[\\`*\[\]()<>&|#%\x00-\x1f\x7f]")


def markdown_text(text: str) -> str:
    """A path (or a name) as inert Markdown text: each character Markdown or HTML could read as syntax, ``%`` and
    control characters percent-encoded (``[y](javascript:x)`` -> ``%5By%5D%28javascript:x%29``); the rest as it is.
    Percent-encoding, not backslashes: Prefect's UI shows a backslash escape as it is."""
    return _MARKDOWN_SPECIAL.sub(lambda m: f"%{ord(m.group()):02X}", str(text))


def file_link(path) -> str:
    """A local file's absolute ``file://`` URL (percent-encoded: no space, bracket or parenthesis left)."""
    return Path(absolute(path)).as_uri()


def slug(text: str) -> str:
    """Lowercase letters, digits and single dashes (Prefect's artifact key rules), at most SLUG_CHARS."""
    words = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return words[:SLUG_CHARS].rstrip("-") or "dataset"


def index_name(location: str) -> str:
    """A dataset's name: the last part of its location, without ``.zarr``."""
    name = absolute(location).rstrip("/").rsplit("/", 1)[-1]
    return name[: -len(".zarr")] if name.endswith(".zarr") and len(name) > 5 else name


def index_id(location: str) -> str:
    """The index as artifact keys and resource ids name it: ``<slug of its name>-<8 hex of its location>``."""
    digest = hashlib.sha256(absolute(location).encode()).hexdigest()[:8]
    return f"{slug(index_name(location))}-{digest}"


def truncated(x) -> str:
    """A measure as a resource label: truncated (not rounded) to 4 decimals, so that a prefix match on it is an
    exact comparison (``0.6*`` matches exactly the values in [0.6, 0.7)); 'n/a' when undefined."""
    if x is None or not math.isfinite(x):
        return "n/a"
    return str(Decimal(repr(float(x))).quantize(Decimal("0.0001"), rounding=ROUND_FLOOR))


def rounded_rows(report: dict) -> list[dict]:
    """The headline table, a row per task and measure, its values rounded to 4 decimals for display."""
    return [{**({"task": task} if task else {}), "metric": label,
             **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in values.items()}}
            for task, sub in per_task(report).items() for label, values in headline_rows(sub["metrics"])]


# -- artifacts and events -------------------------------------------------------------------------------------------


def publish_evaluation(log, report: dict) -> None:
    """An evaluation's artifacts (the headline table, rounded; a link to the report) and its completed events:
    each keyed by the index."""
    from prefect.artifacts import create_table_artifact

    location, fingerprint = absolute(report["dataset"]["path"]), report["dataset"]["fingerprint"]
    index = index_id(location)
    create_table_artifact(table=rounded_rows(report), key=f"hashdist-metrics-{index}",
                          description=f"hashdist headline measures of {markdown_text(location)} (dataset fingerprint "
                          f"{fingerprint[:12]}), rounded to 4 decimals: report.json keeps every digit")
    outputs = report.get("outputs") or {}
    page = outputs.get("report_html") or outputs.get("report_json")
    if page:
        link_artifact(page, f"hashdist-report-{index}", f"hashdist report of {markdown_text(location)}")
    for task, sub in per_task(report).items():
        emit(log, EVENT_COMPLETED, index_resource(report, task),
             {"measures": measures(sub), "report": absolute(outputs["report_json"]) if page else None,
              "report_html": absolute(outputs["report_html"]) if outputs.get("report_html") else None})


def link_artifact(path, key: str, description: str) -> None:
    """A link artifact to the local file ``path``: its absolute ``file://`` URL, its path (escaped) as the text."""
    from prefect.artifacts import create_link_artifact

    create_link_artifact(link=file_link(path), link_text=markdown_text(absolute(path)), key=key,
                         description=description)


def measures(sub: dict) -> dict:
    """The headline measures of a report (or of one task's part): {label: {expected, worst, best}}."""
    return {label: {p: values[p] for p in ("expected", "worst", "best")}
            for label, values in headline_rows(sub["metrics"])}


def index_resource(report: dict, task: str | None = None) -> dict[str, str]:
    """The event resource of the index (of one task's pair, for a dataset with modalities): its id, name, location
    and content fingerprint, the task, and each headline measure's expected value as a label (:func:`truncated`)
    for automations to match (``hashdist.measure.map``: ``0.6*`` and the like)."""
    location = absolute(report["dataset"]["path"])
    sub = per_task(report)[task]
    resource = {"prefect.resource.id": f"hashdist.index.{index_id(location)}" + (f".{slug(task)}" if task else ""),
                "prefect.resource.name": index_name(location) + (f" {task}" if task else ""),
                "hashdist.dataset.location": location,
                "hashdist.dataset.fingerprint": sub["dataset"]["fingerprint"]}
    if task:
        resource["hashdist.task"] = task
    for label, values in measures(sub).items():
        resource[f"hashdist.measure.{slug(label).replace('-', '_')}"] = truncated(values["expected"])
    return resource


def emit(log, event: str, resource: dict, payload: dict) -> None:
    """Emits ``event`` (related to the flow run in progress) to Prefect's API, as Prefect sends its own events (in
    the background; nothing when no API is configured); logs its name and resource."""
    from prefect.context import FlowRunContext
    from prefect.events import emit_event

    context = FlowRunContext.get()
    related = []
    if context is not None and context.flow_run is not None:
        related.append({"prefect.resource.id": f"prefect.flow-run.{context.flow_run.id}",
                        "prefect.resource.role": "flow-run", "prefect.resource.name": context.flow_run.name})
    from hashdist.report.evaluation import json_safe

    sent = emit_event(event=event, resource=resource, related=related, payload=json_safe(payload))
    if sent is not None:
        log.info(f"event {event}: {resource['prefect.resource.id']}")
