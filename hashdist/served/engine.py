"""Served lists against the dataset, where the exhaustive histograms are reduced: each metric item (a range of
queries, on a thread or a Dask worker) recomputes its rows' entries' distances and grades from the codes and labels,
each database chunk its entries name read once, and checks the distances the lists carry (docs/served.md).

The process that prepares the run holds the lists as read (checked against the dataset's sizes,
hashdist.served.lists); a metric item gets its rows (:meth:`ServedRun.rows`, views) and returns per-query values
only: the measures (hashdist.served.measures) and, per query, the entries whose given distance disagrees
(:func:`flagged_values`). :func:`refuse_flagged` turns those into the one-line error once every item is in, naming
the first offending query and position and how many entries are affected, before anything is written.
:func:`refuse_early` checks the first queries' entries before any block runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from hashdist.data.dataset import Dataset
from hashdist.engine.plan import Plan
from hashdist.errors import InputError
from hashdist.served.lists import ServedList
from hashdist.served.measures import ServedEntries
from hashdist.served.pairs import group_by_chunk, pair_distances, pair_grades

SAMPLE_ENTRIES = 1 << 12  # entries of the first queries whose given distances are checked before any block runs
FLAGGED = ("count", "position", "given", "recomputed")  # per query: entries flagged, the first's position and values
_DISTANCE_HINT = ("; normalised distances (a fraction of B) or 1-based ids (NAME=PATH:1based)? hashdist recomputes "
                  "every distance from the codes")
_RADIUS_HINT = ("; radius is the inclusive Hamming radius: faiss's range_search(x, radius) keeps d < radius, so "
                "store r = radius - 1")


@dataclass(frozen=True)
class ServedRun:
    """One served run of a prepared evaluation: its lists as read and checked, and how its entries are ranked
    (``order``: by distance with a tie interval, or ``as-served``)."""

    lists: ServedList
    order: str = "distance"

    name = property(lambda self: self.lists.name)
    is_range = property(lambda self: self.lists.is_range)
    radius = property(lambda self: self.lists.radius)
    width = property(lambda self: self.lists.width)
    time_per_query_s = property(lambda self: self.lists.time_per_query_s)
    nbytes = property(lambda self: self.lists.nbytes)

    def rows(self, start: int, stop: int) -> ServedRun:
        """The run restricted to queries [start, stop) (what one metric item takes)."""
        return replace(self, lists=self.lists.rows(start, stop))


def _item_relevance(ds: Dataset, plan: Plan, run: ServedList):
    """The relevance data of the run's queries, as the grades take them."""
    start, stop = run.first_query, run.first_query + run.n_rows
    if plan.relevance == "explicit":
        return ds.relevant(start, stop)
    return ds.labels("queries", start, stop)


def recompute(ds: Dataset, plan: Plan, run: ServedList) -> tuple[np.ndarray, np.ndarray]:
    """(distance, grade) of every entry of ``run``'s rows, flat in entry order (-1 and 0 where there is no entry):
    the entries grouped by the database chunk their id falls in (a counting sort), each chunk read once, its
    entries' pairs computed as the histogram kernels count them."""
    flat = np.ascontiguousarray(run.ids).reshape(-1)
    chunk = ds.array("database/codes").chunks[0]
    n_chunks = -(-ds.n_database // chunk)
    order, bounds = group_by_chunk(flat, chunk, n_chunks)
    start = run.first_query
    query_words = ds.codes("queries", start, start + run.n_rows)
    query_rel = _item_relevance(ds, plan, run)
    distance = np.full(flat.size, -1, dtype=np.int16)
    grade = np.zeros(flat.size, dtype=np.int16)
    for c in np.flatnonzero(np.diff(bounds[: n_chunks + 1])):
        entries = order[bounds[c] : bounds[c + 1]]
        c0, c1 = int(c) * chunk, min((int(c) + 1) * chunk, ds.n_database)
        rows, queries = flat[entries] - c0, run.query_of(entries)
        distance[entries] = pair_distances(query_words, ds.codes("database", c0, c1), queries, rows)
        if plan.relevance != "explicit":
            grade[entries] = pair_grades(plan.relevance, queries, rows, None, query_rel,
                                         ds.labels("database", c0, c1), plan.grade_top)
    if plan.relevance == "explicit":
        valid = np.flatnonzero(flat >= 0)
        grade[valid] = pair_grades("explicit", run.query_of(valid), None, flat[valid], query_rel, None,
                                   plan.grade_top)
    return distance, grade


def flagged_values(run: ServedList, flagged: np.ndarray, given: np.ndarray, recomputed: np.ndarray) -> dict:
    """Per query of ``run``'s rows: how many of its entries are flagged (``flagged``: their flat indices,
    ascending), the first one's position in its list, its given and its recomputed value (-1, NaN, -1: none)."""
    n = run.n_rows
    out = {"count": np.zeros(n, np.int64), "position": np.full(n, -1, np.int64),
           "given": np.full(n, np.nan), "recomputed": np.full(n, -1, np.int64)}
    if len(flagged):
        queries = run.query_of(flagged)
        first_query, first = np.unique(queries, return_index=True)
        entry = flagged[first]
        out["count"] = np.bincount(queries, minlength=n).astype(np.int64)
        out["position"][first_query] = entry - run.row_start(first_query)
        out["given"][first_query] = given[entry]
        out["recomputed"][first_query] = recomputed[entry]
    return out


def served_entries(ds: Dataset, plan: Plan, run: ServedRun) -> tuple[ServedEntries, dict]:
    """A metric item's served run (``run``: its rows): the entries as the measures take them, and the entries whose
    given distance disagrees with the codes (a k-NN list) or lies beyond the radius (a radius lookup), per query
    (:func:`flagged_values`)."""
    lists = run.lists
    distance, grade = recompute(ds, plan, lists)
    given = None if lists.distances is None else lists.distances.reshape(-1)
    if lists.is_range:
        wrong = distance > lists.radius if given is not None else np.zeros(0, bool)
        served = np.diff(lists.lims)
        within = (distance >= 0) & (distance <= lists.radius)
        in_ball = np.bincount(lists.query_of(np.flatnonzero(within)), minlength=lists.n_rows)
        entries = ServedEntries(run.name, radius=lists.radius, served=served, in_ball=in_ball, order=run.order)
    else:
        wrong = (distance >= 0) & (given != distance) if given is not None else np.zeros(0, bool)
        shape = lists.ids.shape
        entries = ServedEntries(run.name, distance.reshape(shape), grade.reshape(shape), order=run.order)
    return entries, flagged_values(lists, np.flatnonzero(wrong), given, distance)


def refuse_flagged(per_query: dict[str, np.ndarray], runs) -> None:
    """Take each run's flagged entries out of the run's per-query values (every query, in order), and refuse the
    first run that has one, in one line: how many entries, the first query and position, the two values."""
    for run in runs:
        keys = [f"served/{run.name}/flagged/{field}" for field in FLAGGED]
        count, position, given, recomputed = (per_query.pop(key) for key in keys)
        total = int(count.sum())
        if not total:
            continue
        q = int(np.flatnonzero(count)[0])
        entries = "entry" if total == 1 else "entries"
        if run.is_range:
            what, shown, hint = f"a distance beyond the radius r = {run.radius}", f"distance {recomputed[q]}", \
                _RADIUS_HINT
        else:
            what, shown, hint = ("a served distance that disagrees with the codes",
                                 f"served {given[q]:g}, recomputed {recomputed[q]}", _DISTANCE_HINT)
        raise InputError(f"{run.lists.label}: {what} in {total} {entries}, first at query {q} position "
                         f"{position[q]} ({shown}){hint}")


def refuse_early(ds: Dataset, plan: Plan, run: ServedRun) -> None:
    """Before any block runs: the given distances of the first queries' entries (about SAMPLE_ENTRIES), so a
    systematic error (normalised distances, 1-based ids read as 0-based) is refused at once, not after the
    exhaustive pass. When one disagrees every entry is checked here, and the line counts them all; otherwise the
    metric items check the rest as they run."""
    lists = run.lists
    if lists.distances is None or not lists.n_rows:
        return
    if lists.is_range:
        rows = int(np.searchsorted(lists.lims, SAMPLE_ENTRIES, side="right"))
    else:
        rows = SAMPLE_ENTRIES // max(lists.width, 1)
    _, flagged = served_entries(ds, plan, run.rows(0, min(max(rows, 1), lists.n_rows)))
    if flagged["count"].any():
        _, flagged = served_entries(ds, plan, run)
        refuse_flagged({f"served/{run.name}/flagged/{key}": value for key, value in flagged.items()}, [run])
