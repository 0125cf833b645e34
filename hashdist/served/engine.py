"""Served lists against the dataset: each served id's code (and labels) read once, the entries' distances and
grades recomputed, the distances a list carries checked against them (docs/served.md).

This runs once per run where the run is checked (:meth:`hashdist.options.EvaluateOptions.resolve`): its result, a
:class:`hashdist.served.measures.ServedEntries` per run (two small integers per entry), travels with the metric
items to wherever the exhaustive histograms are reduced (threads, or the Dask workers), and the measures run there.
"""

from __future__ import annotations

import numpy as np

from hashdist.data.dataset import Dataset
from hashdist.engine.plan import Plan
from hashdist.served.lists import ServedList, _refuse
from hashdist.served.measures import ServedEntries
from hashdist.served.pairs import pair_distances, pair_grades


def read_rows(ds: Dataset, name: str, ids: np.ndarray) -> np.ndarray:
    """Rows ``ids`` (sorted, distinct) of a dataset array, each Zarr chunk that holds one read once."""
    chunk = ds.array(name).chunks[0]
    n = ds.array(name).shape[0]
    parts = []
    chunks = ids // chunk
    starts = np.flatnonzero(np.r_[True, chunks[1:] != chunks[:-1]]) if len(ids) else np.zeros(0, np.int64)
    for s, e in zip(starts, np.r_[starts[1:], len(ids)], strict=True):
        c = int(chunks[s])
        rows = ds.read(name, c * chunk, min((c + 1) * chunk, n))
        parts.append(rows[ids[s:e] - c * chunk])
    if parts:
        return np.concatenate(parts)
    return np.zeros((0, *ds.array(name).shape[1:]), dtype=ds.array(name).dtype)


def _relevance(ds: Dataset, plan: Plan, ids: np.ndarray):
    """(the queries' relevance data, the items') as the grades take them."""
    if plan.relevance == "explicit":
        return ds.relevant(0, ds.n_queries), None
    return ds.labels("queries", 0, ds.n_queries), read_rows(ds, "database/labels", ids)


def served_entries(ds: Dataset, plan: Plan, run: ServedList, order: str) -> ServedEntries:
    """A checked served list's entries: distances and grades recomputed from the dataset (the first check: the
    distances the list carries must agree), as the measures take them."""
    flat = run.ids.reshape(-1)
    valid = np.flatnonzero(flat >= 0)
    queries = run.query_of_entries().reshape(-1)[valid].astype(np.int64)
    ids, rows = np.unique(flat[valid], return_inverse=True)
    words = read_rows(ds, "database/codes", ids)
    distance = pair_distances(ds.codes("queries", 0, ds.n_queries), words, queries, rows)
    query_rel, item_rel = _relevance(ds, plan, ids)
    grade = pair_grades(plan.relevance, queries, rows, flat[valid], query_rel, item_rel, plan.grade_top)
    if run.distances is not None:
        given = run.distances.reshape(-1)[valid]
        wrong = np.zeros(flat.size, dtype=bool)
        wrong[valid] = given != distance
        recomputed = dict(zip(valid.tolist(), distance.tolist(), strict=True)) if wrong.any() else {}
        _refuse(run, wrong, "a served distance that disagrees with the codes",
                lambda i: f"served {run.distances.reshape(-1)[i]:g}, recomputed {recomputed[i]}",
                "; normalised distances (a fraction of B) or 1-based ids (NAME=PATH:1based)? hashdist recomputes "
                "every distance from the codes")
    if run.is_range:
        return _range_entries(run, queries, distance, order, ds.n_queries)
    distances = np.full(flat.size, -1, dtype=np.int16)
    grades = np.zeros(flat.size, dtype=np.int16)
    distances[valid], grades[valid] = distance, grade
    return ServedEntries(run.name, distances.reshape(run.ids.shape), grades.reshape(run.ids.shape), order=order,
                         time_per_query_s=run.time_per_query_s)


def _range_entries(run: ServedList, queries: np.ndarray, distance: np.ndarray, order: str, n_queries: int
                   ) -> ServedEntries:
    """A radius lookup's per-query counts. With distances given the index claims each item is within r, so an item
    beyond is faiss's exclusive radius stored as r (an input error); without them the set is candidates, and items
    beyond r lower its precision."""
    if run.distances is not None:
        beyond = np.zeros(run.ids.size, dtype=bool)
        beyond[distance > run.radius] = True
        _refuse(run, beyond, f"a distance beyond the radius r = {run.radius}",
                lambda i: f"distance {distance[i]}",
                "; radius is the inclusive Hamming radius: faiss's range_search(x, radius) keeps d < radius, so "
                "store r = radius - 1")
    served = np.diff(run.lims)
    in_ball = np.bincount(queries[distance <= run.radius], minlength=n_queries)
    return ServedEntries(run.name, radius=run.radius, served=served, in_ball=in_ball, order=order,
                         time_per_query_s=run.time_per_query_s)

