"""A history of evaluations of one index over time, and whether the latest run got worse.

A scheduled run (deploy/prefect.yaml) evaluates an index that changes; each run is appended
to a history store and paired with the run before it on the queries both evaluated.

Store layout (one Zarr v3 group, a directory beside the reports)::

    HISTORY/
      zarr.json               attributes: format "hashdist-history", format_version 1
      runs/                   a group holding one group per run, named by its run id
        20261123T020004123456Z-1a2b3c4d/     (UTC time of the run, then 8 random hex digits)
          zarr.json           attributes: the run's entry (below)
          query     (n,) int64     indices, in the dataset's query set, of the n evaluated queries
          ap        (n,) float64   their AP, expected over tie orders (per_query "ap/expected")
          relevant  (n,) int64     their relevant item counts

A run's entry: ``run`` (its id), ``time`` (UTC, ISO 8601), ``dataset`` (the report's ``path``,
``fingerprint``, ``nbits``, ``n_database``, ``n_queries``, ``relevance``), ``query_set``
(``fingerprint``, ``identity``: the arrays that identify the queries, ``n_queries``),
``settings`` (what per-query AP depends on besides the index: relevance kind, distance, its bins
and bit weights), ``metrics`` (``map`` {expected, best, worst}, ``mlgap`` {radius, value} at the
largest radius, and ``headline``: every row of :func:`hashdist.metrics.registry.headline_rows` as
{label, expected, best, worst}), ``queries`` {total, evaluated, without_relevant}, ``provenance``
(the report's, without package versions) and ``report`` (the report.json path, or null).

Queries are identified by their index within the dataset's query set. Two runs are paired only
when their query sets are the same: the same number of queries with identical labels (without
labels: identical features; without either: identical explicit relevance lists), compared by
content, and the same settings. The query codes are not part of the identity: a retrained model
encodes the same queries anew, and that is exactly what the history should judge. Otherwise the
runs are "not comparable" and nothing is flagged. Runs are ordered by time (then id).

The test (:func:`compare_runs`): over the queries evaluated in both runs (at least one relevant
item), the paired differences d = AP(new) - AP(old); the mean difference, the two-sided sign-flip
randomisation p-value (``permutations`` sign patterns from a fixed ``seed``;
:func:`hashdist.metrics.stats.randomization_pvalue`) and the paired t-test p-value. The decision uses the
randomisation p-value (no assumption on the distribution of d); the t-test is reported beside it.
A run is **flagged** when the randomisation p-value is below ``alpha`` and the mean difference is
a drop larger than ``min_drop`` (default 0: any significant drop).

Appending is atomic: the run's group is built in a hidden temporary sibling inside ``runs/`` and
renamed into place (a new store is built whole and renamed), so a crashed append leaves the store
as it was, readable (readers skip hidden entries; the next append removes the leftover). An append
that cannot be written (a full disk) removes its staging directory and is an InputError naming the
store (one line, exit status 2). Writers take hashdist's advisory lock next to the store
(:func:`hashdist.data.atomic.exclusive`), waiting up to ``wait`` seconds for another writer; readers
need no lock.

Library functions only, no Prefect: :func:`append_run`, :func:`load_history`,
:func:`compare_with_previous`, :func:`record` (append, then compare with the run before) and
:func:`trend` (every run with its comparison with the run before it).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import uuid
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from hashdist.data.atomic import exclusive, temporary_sibling
from hashdist.defaults import DEFAULT_ALPHA, DEFAULT_PERMUTATIONS, DEFAULT_SEED
from hashdist.errors import InputError, check_integer, write_failed
from hashdist.metrics.registry import AP_EXPECTED, headline_rows

FORMAT = "hashdist-history"
FORMAT_VERSION = 1
ARRAYS = ("query", "ap", "relevant")
_SETTINGS = ("distance", "distance_bins", "bit_weights")  # report parameters besides relevance that change AP


class SignificantDrop(Exception):
    """The latest run's AP dropped significantly against the run before it.

    ``verdict`` is :func:`compare_runs`'s dict (its ``message`` is this exception's text), ``evaluation``
    the run's :class:`hashdist.api.Evaluation` when known. The command line then exits with status 3.
    """

    def __init__(self, verdict: dict, evaluation=None):
        super().__init__(verdict["message"])
        self.verdict = verdict
        self.evaluation = evaluation

    def __reduce__(self):
        return type(self), (self.verdict, self.evaluation)


# -- the store -----------------------------------------------------------------


def _is_store(path: Path) -> bool:
    try:
        meta = json.loads((path / "zarr.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and (meta.get("attributes") or {}).get("format") == FORMAT


def check_history_dir(history_dir, *, must_exist: bool = False) -> Path:
    """The store's path; refuse a path that exists and is neither a history store nor an empty directory
    (or, with ``must_exist``, that is not a history store)."""
    path = Path(history_dir)
    if not path.exists():
        if must_exist:
            raise InputError(f"{path}: no such history store (path does not exist)")
        return path
    if _is_store(path):
        meta = json.loads((path / "zarr.json").read_text())["attributes"]
        if meta.get("format_version") != FORMAT_VERSION:
            raise InputError(f"{path}: history format version {meta.get('format_version')} is not supported "
                             f"(expected {FORMAT_VERSION})")
        return path
    if path.is_dir() and not any(path.iterdir()) and not must_exist:
        return path
    raise InputError(f"{path}: not a hashdist history store (no zarr.json with format {FORMAT!r})")


def _utc(when) -> datetime:
    if when is None:
        return datetime.now(timezone.utc)
    if isinstance(when, str):
        try:
            when = datetime.fromisoformat(when)
        except ValueError:
            raise InputError(f"when={when!r}: not an ISO 8601 time") from None
    if not isinstance(when, datetime):
        raise InputError(f"when={when!r}: expected a datetime or an ISO 8601 string")
    return when.replace(tzinfo=timezone.utc) if when.tzinfo is None else when.astimezone(timezone.utc)


def query_set(dataset) -> dict:
    """The identity of a dataset's queries: {fingerprint, identity (the arrays hashed), n_queries}.

    Content digests of ``queries/labels`` if present, else ``queries/features``; without either, the
    recorded fingerprints of the explicit relevance lists (``queries/relevant/*``).
    """
    from hashdist.data.dataset import CSR, chunk_digest, combine_digests, open_dataset

    ds = dataset if hasattr(dataset, "fingerprints") else open_dataset(dataset)
    q = ds.n_queries
    if ds.has("queries/labels"):
        names, parts = ["queries/labels"], [chunk_digest(ds.read("queries/labels", 0, q))]
    elif ds.has("queries/features"):
        names, parts = ["queries/features"], [chunk_digest(ds.read("queries/features", 0, q))]
    else:
        names = [n for n in CSR if ds.has(n)]
        parts = [ds.fingerprints[n].digest for n in names]
    fingerprint = combine_digests([FORMAT, "query-set", q, *(f"{n}={p}" for n, p in zip(names, parts, strict=True))])
    return {"fingerprint": fingerprint, "identity": names, "n_queries": q}


def _json_safe(x):
    from hashdist.report.evaluation import json_safe

    return json_safe(x)


def make_entry(evaluation, when=None) -> tuple[dict, dict[str, np.ndarray]]:
    """(entry, arrays) of one evaluation: the attributes and per-query arrays :func:`append_run` stores.

    Opens the evaluated dataset (report["dataset"]["path"]) for its query set, and refuses it when its
    fingerprint is no longer the evaluated one (it changed since).
    """
    from hashdist.data.dataset import open_dataset

    report = evaluation.report
    d = report["dataset"]
    ds = open_dataset(d["path"])
    if ds.fingerprint != d["fingerprint"]:
        raise InputError(f"{d['path']}: the dataset changed since it was evaluated (fingerprint "
                         f"{ds.fingerprint[:12]} now, {d['fingerprint'][:12]} in the report); not recorded")
    per_query = evaluation.per_query
    relevant = np.asarray(per_query["relevant"], np.int64)
    ap = np.asarray(per_query[AP_EXPECTED], np.float64)
    evaluated = np.flatnonzero((relevant > 0) & np.isfinite(ap))
    moment = _utc(when)
    run_id = f"{moment:%Y%m%dT%H%M%S%fZ}-{uuid.uuid4().hex[:8]}"
    metrics = report["metrics"]
    mlgap = None
    if metrics.get("mlgap_at_radius"):
        r = max(metrics["mlgap_at_radius"], key=float)
        mlgap = {"radius": r, "value": metrics["mlgap_at_radius"][r]}
    parameters = report.get("parameters") or {}
    provenance = {k: v for k, v in (report.get("provenance") or {}).items() if k != "packages"}
    entry = {
        "format": f"{FORMAT}-run",
        "run": run_id,
        "time": f"{moment:%Y-%m-%dT%H:%M:%S.%fZ}",
        "dataset": {k: d.get(k) for k in ("path", "fingerprint", "nbits", "n_database", "n_queries", "relevance")},
        "query_set": query_set(ds),
        "settings": {"relevance": d.get("relevance"), **{k: parameters.get(k) for k in _SETTINGS}},
        "metrics": {"map": metrics["map"], "mlgap": mlgap,
                    "headline": [{"label": label, **values} for label, values in headline_rows(metrics)]},
        "queries": report.get("queries"),
        "provenance": provenance,
        "report": (report.get("outputs") or {}).get("report_json"),
    }
    arrays = {"query": evaluated.astype(np.int64), "ap": ap[evaluated], "relevant": relevant[evaluated]}
    return _json_safe(entry), arrays


def _write_run(path: Path, entry: dict, arrays: dict[str, np.ndarray]) -> None:
    """One run's Zarr group at ``path`` (a fresh directory): the arrays first, then the entry."""
    import zarr
    from zarr.codecs import Crc32cCodec, ZstdCodec

    group = zarr.open_group(store=str(path), mode="w", zarr_format=3)
    for name in ARRAYS:
        values = arrays[name]
        group.create_array(name, data=values, chunks=(max(1, len(values)),),
                           compressors=(ZstdCodec(level=3), Crc32cCodec()),
                           config={"write_empty_chunks": True})  # every chunk has a file: a lost one is noticed
    group.attrs.update(entry)


def _new_store(path: Path) -> None:
    import zarr

    root = zarr.open_group(store=str(path), mode="w", zarr_format=3)
    root.attrs.update({"format": FORMAT, "format_version": FORMAT_VERSION})
    root.create_group("runs")


def _hold_lock(stack: ExitStack, path: Path, wait: float) -> None:
    """Take the store's writer lock, waiting up to ``wait`` seconds for another writer (a lock file that cannot be
    made, as on a read-only filesystem, is refused at once)."""
    stack.enter_context(exclusive(path, wait=wait, busy=f"{path}: another hashdist run has been appending to this "
                                                        f"history for {wait:g} s"))


def append_run(history_dir, evaluation, when=None, *, wait: float = 60.0) -> dict:
    """Append one evaluation (:class:`hashdist.api.Evaluation`) to the history at ``history_dir``, creating
    the store if needed; ``when``: the run's time (datetime, naive = UTC, or ISO string; default now).

    Returns the stored entry (with its ``run`` id). Atomic and locked: see the module docstring.
    """
    path = check_history_dir(history_dir)
    entry, arrays = make_entry(evaluation, when)
    with ExitStack() as stack:
        _hold_lock(stack, path, wait)
        check_history_dir(path)  # again, under the lock
        if not _is_store(path):
            for leftover in path.parent.glob(f".{path.name}.tmp-*"):  # a crashed creation's (we hold the lock)
                shutil.rmtree(leftover, ignore_errors=True)
            tmp = temporary_sibling(path)
            try:
                _new_store(tmp)
                _write_run(tmp / "runs" / entry["run"], entry, arrays)
                if path.exists():
                    path.rmdir()  # an empty directory (checked above)
                os.rename(tmp, path)
            except BaseException as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                if isinstance(exc, OSError):
                    raise write_failed(exc, path, "while creating the history", "no history was created") from exc
                raise
            return entry
        runs = path / "runs"
        for leftover in runs.glob(".*"):  # a crashed append's staging directory (we hold the lock)
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
        final = runs / entry["run"]
        tmp = temporary_sibling(final)
        try:
            _write_run(tmp, entry, arrays)
            os.rename(tmp, final)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, OSError):
                raise write_failed(exc, path, "while appending this run",
                                   "the run was not recorded, the history's earlier runs are unchanged") from exc
            raise
    return entry


def load_history(history_dir, *, arrays: bool = True) -> list[dict]:
    """Every run of the store, oldest first: its entry, plus (with ``arrays``) ``query``, ``ap`` and
    ``relevant`` as numpy arrays. A missing path or one that is not a history store is an InputError."""
    import zarr

    from hashdist.data.dataset import missing_chunk

    path = check_history_dir(history_dir, must_exist=True)
    runs_dir = path / "runs"
    names = sorted(p.name for p in runs_dir.iterdir()  # run groups; not zarr.json, not hidden staging directories
                   if p.is_dir() and not p.name.startswith(".")) if runs_dir.is_dir() else []
    runs = []
    for name in names:
        try:
            group = zarr.open_group(store=str(runs_dir / name), mode="r")
            entry = dict(group.attrs)
            if entry.get("format") != f"{FORMAT}-run":
                raise ValueError("no run entry")
            check_entry(runs_dir / name / "zarr.json", entry)
            if arrays:
                for key in ARRAYS:
                    array = group[key]
                    if (chunk := missing_chunk(array)) is not None:
                        raise InputError(f"{path}: run {name}: {key} chunk {chunk} is missing (damaged history)")
                    entry[key] = np.asarray(array[:])
                check_run_arrays(runs_dir / name, entry)
        except InputError:
            raise
        except Exception as exc:
            raise InputError(f"{path}: run {name} is unreadable ({type(exc).__name__}: {exc})") from None
        runs.append(entry)
    runs.sort(key=lambda e: (e["time"], e["run"]))
    return runs


# -- the one check of a run's entry (every key the comparisons and pages read) ----------------------------


def _number_or_null(x) -> bool:
    return x is None or (isinstance(x, (int, float)) and not isinstance(x, bool))


def _entry_problem(entry: dict) -> tuple[str, str] | None:
    """(key, what is wrong) for the first key of a run entry that is missing or of the wrong type, or None."""
    checks = [("run", lambda e: isinstance(e["run"], str)),
              ("time", lambda e: isinstance(e["time"], str) and bool(_utc(e["time"]))),
              ("dataset.path", lambda e: isinstance(e["dataset"]["path"], str)),
              ("dataset.fingerprint", lambda e: isinstance(e["dataset"]["fingerprint"], str)),
              ("query_set.n_queries", lambda e: type(e["query_set"]["n_queries"]) is int),
              ("query_set.fingerprint", lambda e: isinstance(e["query_set"]["fingerprint"], str)),
              ("query_set.identity", lambda e: isinstance(e["query_set"]["identity"], list)
               and all(isinstance(n, str) for n in e["query_set"]["identity"])),
              ("settings", lambda e: isinstance(e["settings"], dict)),
              *((f"metrics.map.{p}", lambda e, p=p: _number_or_null(e["metrics"]["map"][p]))
                for p in ("expected", "best", "worst")),
              ("metrics.mlgap", lambda e: e["metrics"].get("mlgap") is None or (
                  isinstance(e["metrics"]["mlgap"]["radius"], (str, int, float))
                  and _number_or_null(e["metrics"]["mlgap"]["value"])))]
    for key, valid in checks:
        try:
            if not valid(entry):
                return key, "has the wrong type"
        except (KeyError, TypeError, IndexError):
            return key, "is missing"
        except InputError:
            return key, "is not an ISO 8601 time"
    return None


def check_entry(where: Path, entry: dict) -> None:
    """Refuse a run entry (the attributes in ``where``, a run's zarr.json) missing a key hashdist reads or holding
    a value of the wrong type, in one line naming the file and the key."""
    problem = _entry_problem(entry)
    if problem:
        key, what = problem
        raise InputError(f"{where}: key {key} {what} (damaged or hand-edited history run; remove the run's "
                         "directory)")


def check_run_arrays(where: Path, entry: dict) -> None:
    """A run's per-query arrays: 1-D, the same length, distinct integer query indices within the query set."""
    query, ap, relevant = (entry[k] for k in ARRAYS)
    n = entry["query_set"]["n_queries"]
    if not (query.ndim == ap.ndim == relevant.ndim == 1 and len(query) == len(ap) == len(relevant)) \
            or query.dtype.kind not in "iu" or relevant.dtype.kind not in "iu" or ap.dtype.kind != "f":
        raise InputError(f"{where}: arrays query, ap and relevant must be 1-D of one length (integer, float, "
                         "integer); damaged history run")
    if len(query) and (query.min() < 0 or query.max() >= n or len(np.unique(query)) != len(query)):
        raise InputError(f"{where}/query: query indices must be distinct and in 0..{n - 1}; damaged history run")


# -- comparing runs ------------------------------------------------------------


def comparable(old: dict, new: dict) -> str | None:
    """Why two runs cannot be paired, or None when they can."""
    qa, qb = old["query_set"], new["query_set"]
    if qa["n_queries"] != qb["n_queries"]:
        return f"the query set changed ({qa['n_queries']} queries before, {qb['n_queries']} now)"
    if qa["fingerprint"] != qb["fingerprint"]:
        return (f"the query set changed ({', '.join(qb['identity']) or 'queries'}: fingerprint "
                f"{qa['fingerprint'][:12]} before, {qb['fingerprint'][:12]} now)")
    for key, before in old["settings"].items():
        if new["settings"].get(key) != before:
            return f"the {key.replace('_', ' ')} changed ({before} before, {new['settings'].get(key)} now)"
    return None


def _short(time_text: str) -> str:
    """2026-11-23T02:00:04.123456Z -> 2026-11-23T02:00:04Z"""
    return f"{time_text[:19]}Z"


def _p(x) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"


def compare_runs(old: dict | None, new: dict, *, alpha: float = DEFAULT_ALPHA,
                 permutations: int = DEFAULT_PERMUTATIONS, seed: int = DEFAULT_SEED, min_drop: float = 0.0) -> dict:
    """The verdict on ``new`` against ``old`` (entries of :func:`load_history`, with arrays; ``old`` None for a
    first run). Keys: status ("first run", "not comparable", "compared"), flagged, run, time, previous,
    previous_time, map, previous_map, map_change (report mAP, expected), shared_queries, mean_ap_previous,
    mean_ap, mean_ap_diff (over the shared queries), randomization_pvalue, t_pvalue, significant, drop, alpha,
    permutations, seed, min_drop, reason, message (one line)."""
    from hashdist.metrics.stats import paired_t_pvalue, randomization_pvalue

    check_test_options(alpha, permutations, seed, min_drop)
    verdict = {
        "status": "first run", "flagged": False, "run": new["run"], "time": new["time"],
        "previous": None, "previous_time": None,
        "map": new["metrics"]["map"]["expected"], "previous_map": None, "map_change": None,
        "shared_queries": 0, "mean_ap_previous": None, "mean_ap": None, "mean_ap_diff": None,
        "randomization_pvalue": None, "t_pvalue": None, "significant": False, "drop": False,
        "alpha": alpha, "permutations": permutations, "seed": seed, "min_drop": min_drop,
        "reason": "the first run in the history: nothing to compare with",
    }
    if old is None:
        verdict["message"] = "first run in the history: nothing to compare with"
        return verdict
    verdict.update(previous=old["run"], previous_time=old["time"], previous_map=old["metrics"]["map"]["expected"])
    if verdict["map"] is not None and verdict["previous_map"] is not None:
        verdict["map_change"] = verdict["map"] - verdict["previous_map"]
    reason = comparable(old, new)
    shared, i_old, i_new = np.intersect1d(old["query"], new["query"], assume_unique=True, return_indices=True)
    if reason is None and len(shared) < 2:
        reason = f"{len(shared)} queries evaluated in both runs (a paired test needs at least 2)"
    if reason is not None:
        verdict.update(status="not comparable", reason=reason,
                       message=f"not comparable with the previous run ({_short(old['time'])}): {reason}")
        return verdict
    a, b = np.asarray(new["ap"], float)[i_new], np.asarray(old["ap"], float)[i_old]
    diff = float(np.mean(a - b))
    p_rand = randomization_pvalue(a, b, permutations, seed)
    p_t = paired_t_pvalue(a, b)
    significant = bool(p_rand < alpha)
    drop = diff < -min_drop
    verdict.update(status="compared", shared_queries=int(len(shared)), mean_ap_previous=float(b.mean()),
                   mean_ap=float(a.mean()), mean_ap_diff=diff, randomization_pvalue=p_rand, t_pvalue=p_t,
                   significant=significant, drop=drop, flagged=significant and drop)
    summary = (f"mean AP over {len(shared)} shared queries {b.mean():.4f} -> {a.mean():.4f} ({diff:+.4f}), "
               f"randomisation p = {_p(p_rand)} ({permutations} sign flips, seed {seed}), t-test p = {_p(p_t)}, "
               f"alpha {alpha:g}; run {_short(new['time'])} vs {_short(old['time'])}")
    if verdict["flagged"]:
        verdict["reason"] = "significant drop"
        verdict["message"] = f"mAP dropped significantly: {summary}"
    else:
        verdict["reason"] = ("significant rise" if significant and diff > 0 else
                             "significant drop smaller than min_drop" if significant and diff < 0 else
                             "no significant change")
        verdict["message"] = f"{verdict['reason']}: {summary}"
    return verdict


def check_test_options(alpha, permutations, seed, min_drop) -> None:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise InputError(f"--alpha must be in (0, 1), got {alpha}")
    check_integer(permutations, "--permutations")
    check_integer(seed, "--seed", 0)
    if isinstance(min_drop, bool) or not isinstance(min_drop, (int, float)) or not 0 <= min_drop < 1:
        raise InputError(f"--min-drop must be in [0, 1), got {min_drop}")
    if alpha < 1 / (permutations + 1):  # the randomisation test's p is never below 1 / (P + 1)
        raise InputError(f"--alpha {alpha:g} is below 1 / (--permutations + 1) = {1 / (permutations + 1):.3g}, the "
                         "smallest p-value the test can give: no drop could be flagged")


def compare_with_previous(history_dir, *, run: str | None = None, alpha: float = DEFAULT_ALPHA,
                          permutations: int = DEFAULT_PERMUTATIONS, seed: int = DEFAULT_SEED,
                          min_drop: float = 0.0) -> dict:
    """The verdict (:func:`compare_runs`) on the latest run of the store (or run id ``run``) against the run
    before it."""
    runs = load_history(history_dir)
    if not runs:
        raise InputError(f"{history_dir}: the history holds no runs")
    index = len(runs) - 1
    if run is not None:
        ids = [e["run"] for e in runs]
        if run not in ids:
            raise InputError(f"{history_dir}: no run {run}")
        index = ids.index(run)
    return compare_runs(runs[index - 1] if index else None, runs[index], alpha=alpha, permutations=permutations,
                        seed=seed, min_drop=min_drop)


def record(history_dir, evaluation, when=None, **test_options) -> dict:
    """Append ``evaluation`` and return the verdict on it against the run before it (``test_options``:
    alpha, permutations, seed, min_drop)."""
    check_test_options(test_options.get("alpha", DEFAULT_ALPHA), test_options.get("permutations", DEFAULT_PERMUTATIONS),
                       test_options.get("seed", DEFAULT_SEED), test_options.get("min_drop", 0.0))
    entry = append_run(history_dir, evaluation, when)
    return compare_with_previous(history_dir, run=entry["run"], **test_options)


def trend(history_dir, **test_options) -> dict:
    """Every run, oldest first, with its verdict against the run before it: {history, runs: [{entry without
    arrays, verdict}], verdict (the latest run's, or None), parameters}."""
    options = {"alpha": DEFAULT_ALPHA, "permutations": DEFAULT_PERMUTATIONS, "seed": DEFAULT_SEED, "min_drop": 0.0,
               **test_options}
    check_test_options(**options)
    runs = load_history(history_dir)
    rows = []
    for i, entry in enumerate(runs):
        verdict = compare_runs(runs[i - 1] if i else None, entry, **options)
        rows.append({**{k: v for k, v in entry.items() if k not in ARRAYS}, "verdict": verdict})
    return {"format": f"{FORMAT}-trend", "history": str(history_dir), "runs": rows,
            "verdict": rows[-1]["verdict"] if rows else None, "parameters": options}
