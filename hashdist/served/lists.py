"""Served lists in: the files and arrays a deployed index's results come as, read and checked (docs/served.md).

Formats (told apart by their content, never by guessing ids):

- ``.npz`` with ``I`` (Q x K database ids, -1 padding: faiss's ``search``), optionally ``D`` and
  ``time_per_query_s`` (what ``hashdist search`` writes);
- a radius lookup ``.npz`` with ``lims`` (Q + 1), ``I``, optionally ``D``, and ``radius``: the inclusive Hamming
  radius r (faiss's ``range_search(x, radius)`` keeps d < radius, so r = radius - 1);
- ``.npy``: ``I`` alone;
- ann-benchmarks result HDF5: ``neighbors``, ``distances`` (Hamming normalised by B there: multiplied back, and
  checked to be integers) and the attribute ``best_search_time`` (seconds per query);
- multi-index hashing's HDF5 output: ``/refs/<name><i>.res`` (Q x K, 1-based ids; one result set per file);
- TREC run files: ``qid Q0 docno rank score tag``, qid and docno the 0-based query and database indices, each
  query's lines ordered by rank (the score is not read);
- big-ann-benchmarks binary k-NN results: uint32 n, uint32 k, n*k int32 ids, n*k float32 distances.

1-based ids (multi-index hashing's output) only when the user says so: ``NAME=PATH:1based``, or ``one_based: True``
in a dict. Every check names the run, the first offending query and position, and how many entries are affected.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from hashdist.data.dataset import TASK_ARROW, parse_task
from hashdist.errors import InputError

ONE_BASED_SUFFIX = ":1based"
SORTED_ENTRIES_PER_STEP = 1 << 20  # ids sorted at once by the repeat check
_NPY, _NPZ, _HDF5 = b"\x93NUMPY", b"PK\x03\x04", b"\x89HDF\r\n\x1a\n"
_DICT_KEYS = ("I", "D", "lims", "radius", "time_per_query_s", "one_based", "path")


@dataclass(frozen=True)
class ServedList:
    """One served run as read: ``ids`` (Q, K) with -1 padding, or for a radius lookup the ids of every query's set
    one after another with ``lims`` (Q + 1) and ``radius``; ``distances`` as given (their own dtype; NaN past a
    list's end), or None; 0-based ids whatever the input's base. ``first_query``: the query of row 0 (a slice of
    the rows, :meth:`rows`)."""

    name: str
    source: str
    ids: np.ndarray
    distances: np.ndarray | None = None
    lims: np.ndarray | None = None
    radius: int | None = None
    time_per_query_s: float | None = None
    task: str | None = None
    one_based: bool = False
    first_query: int = 0

    @property
    def is_range(self) -> bool:
        return self.lims is not None

    @property
    def nbytes(self) -> int:
        """The bytes of its arrays."""
        return sum(a.nbytes for a in (self.ids, self.distances, self.lims) if a is not None)

    @property
    def n_rows(self) -> int:
        """Its queries' lists (rows)."""
        return len(self.lims) - 1 if self.is_range else int(self.ids.shape[0])

    @property
    def width(self) -> int:
        """K of a k-NN list (its columns); 0 for a radius lookup."""
        return 0 if self.is_range else int(self.ids.shape[1])

    def rows(self, start: int, stop: int) -> ServedList:
        """The lists of queries [start, stop) (views: nothing is copied)."""
        if not self.is_range:
            cut = {"ids": self.ids[start:stop], "distances": None if self.distances is None
                   else self.distances[start:stop]}
        else:
            lo, hi = int(self.lims[start]), int(self.lims[stop])
            cut = {"ids": self.ids[lo:hi], "lims": self.lims[start : stop + 1] - lo,
                   "distances": None if self.distances is None else self.distances[lo:hi]}
        return replace(self, first_query=self.first_query + start, **cut)

    def query_of(self, entries: np.ndarray) -> np.ndarray:
        """The row of each entry (by its index in ``ids`` flattened)."""
        if self.is_range:
            return np.searchsorted(self.lims, entries, side="right") - 1
        return entries // max(self.width, 1)

    def row_start(self, rows: np.ndarray) -> np.ndarray:
        """The flat index of each row's first entry."""
        return self.lims[rows] if self.is_range else rows * self.width

    @property
    def label(self) -> str:
        return f"--served {self.name} ({self.source})"

    def query_of_entries(self) -> np.ndarray:
        """The query of each entry: (Q, K) for a k-NN list, one per id for a radius lookup."""
        if self.is_range:
            return np.repeat(np.arange(len(self.lims) - 1), np.diff(self.lims))
        return np.broadcast_to(np.arange(self.ids.shape[0])[:, None], self.ids.shape)

    def position_of(self, flat_index: int) -> tuple[int, int]:
        """(query, position in its list) of an entry, by its index in ``ids`` flattened."""
        q = int(self.query_of(np.int64(flat_index)))
        return self.first_query + q, int(flat_index - self.row_start(q))


def split_key(key: str) -> tuple[str | None, str]:
    """``'image->text:NAME'`` to (task, NAME); ``'NAME'`` to (None, NAME)."""
    task, sep, name = str(key).replace("\u2192", TASK_ARROW).rpartition(":")
    if not sep or TASK_ARROW not in task:
        return None, str(key).strip()
    return TASK_ARROW.join(parse_task(task)), name.strip()


def parse_served(value) -> dict:
    """The ``served`` option as {key: source}: from ``NAME=PATH`` strings (the command line; ``A->B:NAME=PATH`` for
    a task of a dataset with modalities) or a dict {NAME: source}. Names are checked here; sources when read."""
    if value is None:
        return {}
    if isinstance(value, dict):
        pairs = list(value.items())
    else:
        texts = [value] if isinstance(value, (str, os.PathLike)) else list(value)
        pairs = []
        for text in texts:
            key, sep, path = str(text).partition("=")
            if not sep or not key.strip() or not path.strip():
                raise InputError(f"--served {text!r}: expected NAME=PATH (e.g. ivf16=runs/ivf16.npz), or "
                                 "A->B:NAME=PATH on a dataset with modalities")
            pairs.append((key.strip(), path.strip()))
    out = {}
    for key, source in pairs:
        task, name = split_key(key)
        if not name or any(c in name for c in "/=\\") or name in (".", ".."):
            raise InputError(f"--served {key!r}: a run's name must be non-empty, without '/', '\\' or '='")
        key = f"{task}:{name}" if task else name
        if key in out:
            raise InputError(f"--served {key}: the name is given twice; give each served run its own name")
        out[key] = source
    return out


# -- reading ---------------------------------------------------------------------------------------------------


def _array(x, what: str) -> np.ndarray:
    try:
        if isinstance(x, np.ndarray):
            return x
        return np.from_dlpack(x) if hasattr(x, "__dlpack__") else np.asarray(x)
    except Exception as exc:
        raise InputError(f"{what}: not convertible to a numpy array ({type(exc).__name__})") from None


def _from_python(source, label: str) -> tuple[dict, bool]:
    """Arrays given in Python: I; (I, D); {"I", "D", "lims", "radius", "time_per_query_s", "one_based"}."""
    if isinstance(source, tuple):
        if len(source) != 2:
            raise InputError(f"{label}: a tuple must be (I, D)")
        return {"I": _array(source[0], f"{label} I"), "D": _array(source[1], f"{label} D")}, False
    if isinstance(source, dict):
        unknown = sorted(set(source) - set(_DICT_KEYS))
        if unknown:
            raise InputError(f"{label}: unknown key {unknown[0]!r} (known: {', '.join(_DICT_KEYS)})")
        if "I" not in source:
            raise InputError(f"{label}: a dict needs 'I' (the served ids)")
        fields = {key: _array(v, f"{label} {key}") for key, v in source.items()
                  if key in ("I", "D", "lims") and v is not None}
        for key in ("radius", "time_per_query_s"):
            if source.get(key) is not None:
                fields[key] = np.asarray(source[key])
        return fields, bool(source.get("one_based", False))
    return {"I": _array(source, label)}, False


def _read_npz(path: Path, label: str) -> dict:
    with np.load(path, allow_pickle=False) as z:
        names = set(z.files)
        if "I" not in names:
            raise InputError(f"{label}: a .npz of served lists needs an array 'I' (has {', '.join(sorted(names))})")
        try:  # I narrowed before D is read: the two as read are never held with I's copy
            return {key: narrow_ids(z[key]) if key == "I" else z[key]
                    for key in ("I", "D", "lims", "radius", "time_per_query_s") if key in names}
        except ValueError:
            raise InputError(f"{label}: contains a pickled object array (hashdist never loads pickles)") from None


def narrow_ids(ids: np.ndarray) -> np.ndarray:
    """Integer ids as int32 when every one fits (half of faiss's int64), else int64; anything else as given."""
    if ids.dtype.kind not in "iu" or ids.dtype == np.int32:
        return ids
    if not ids.size or (int(ids.min()) >= -(2**31) and int(ids.max()) < 2**31):
        return ids.astype(np.int32)
    return ids.astype(np.int64, copy=False)


def _read_hdf5(path: Path, label: str, nbits: int) -> dict:
    import h5py

    with h5py.File(path, "r") as f:
        if "neighbors" not in f and isinstance(f.get("refs"), h5py.Group):
            return _read_mih(f["refs"], label)
        if "neighbors" not in f:
            raise InputError(f"{label}: an HDF5 file of served lists needs the dataset 'neighbors' (ann-benchmarks' "
                             f"results) or the group 'refs' (multi-index hashing's; has "
                             f"{', '.join(sorted(f)) or 'nothing'})")
        out = {"I": np.asarray(f["neighbors"])}
        if "distances" in f:
            normalised = np.asarray(f["distances"], dtype=np.float64)
            scaled = normalised * nbits
            finite = np.isfinite(scaled)
            off = finite & (np.abs(np.where(finite, scaled, 0) - np.round(np.where(finite, scaled, 0))) > 1e-3)
            if off.any():
                q, p = np.argwhere(off)[0]
                raise InputError(f"{label}: {int(off.sum())} distances are not multiples of 1/B = 1/{nbits}, first "
                                 f"query {q} position {p} ({normalised[q, p]:g}); ann-benchmarks' Hamming distances "
                                 f"are fractions of the {nbits} bits")
            out["D"] = np.where(finite, np.round(scaled), np.nan)
        if "best_search_time" in f.attrs:
            out["time_per_query_s"] = np.asarray(f.attrs["best_search_time"])
    return out


def _read_mih(refs, label: str) -> dict:
    """Multi-index hashing's HDF5 output (norouzi/mih ``saveRes``): ``/refs/<name><i>.res``, Q x K uint32 ids,
    1-based (read as such only with NAME=PATH:1based); a file of one result set."""
    sets = sorted(name for name in refs if name.endswith(".res"))
    if len(sets) != 1:
        listed = ", ".join(f"/refs/{name}" for name in sets[:4]) + (", ..." if len(sets) > 4 else "")
        raise InputError(f"{label}: a multi-index hashing file of {len(sets)} result sets ({listed or 'none'}); "
                         "hashdist reads a file holding one: copy the set you evaluate into a file of its own")
    return {"I": np.asarray(refs[sets[0]])}


def _read_bigann(path: Path, size: int) -> dict | None:
    """big-ann-benchmarks' k-NN result, when the header's n and k account for the file's size exactly."""
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(8), dtype="<u4")
    if len(header) < 2 or 8 + 8 * int(header[0]) * int(header[1]) != size or not header.all():
        return None
    n, k = map(int, header)
    ids = np.fromfile(path, dtype="<i4", count=n * k, offset=8).reshape(n, k)
    distances = np.fromfile(path, dtype="<f4", count=n * k, offset=8 + 4 * n * k).reshape(n, k)
    return {"I": ids, "D": distances}


def _read_trec(path: Path, label: str, n_queries: int) -> dict | None:
    """A TREC run (qid Q0 docno rank score tag; 0-based indices), None when the file is not one."""
    try:
        lines = [line.split() for line in path.read_text().splitlines() if line.strip()]
    except (UnicodeDecodeError, OSError):
        return None
    if not lines or any(len(fields) != 6 for fields in lines):
        return None
    try:
        table = np.array([(int(f[0]), int(f[2]), int(f[3])) for f in lines], dtype=np.int64).reshape(-1, 3)
    except ValueError:
        bad = next(i for i, f in enumerate(lines) if not all(x.lstrip("-").isdigit() for x in (f[0], f[2], f[3])))
        raise InputError(f"{label}: TREC line {bad + 1}: qid, docno and rank must be integers (the 0-based query "
                         f"and database indices), got {' '.join(lines[bad][:4])}") from None
    qid, doc, rank = table.T
    if len(qid) and (qid.min() < 0 or qid.max() >= n_queries):
        line = int(np.flatnonzero((qid < 0) | (qid >= n_queries))[0])
        raise InputError(f"{label}: TREC line {line + 1} names query {qid[line]}, but the dataset has {n_queries} "
                         "queries (qids are 0-based query indices)")
    order = np.lexsort((rank, qid))
    qid, doc = qid[order], doc[order]
    counts = np.bincount(qid, minlength=n_queries)
    ids = np.full((n_queries, max(int(counts.max(initial=0)), 1)), -1, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    ids[qid, np.arange(len(qid)) - starts[qid]] = doc
    return {"I": ids}


def _read_path(text: str, label: str, n_queries: int, nbits: int) -> dict:
    path = Path(text)
    if not path.is_file():
        raise InputError(f"{label}: no such file")
    try:
        with open(path, "rb") as f:
            magic = f.read(8)
        if magic.startswith(_NPY):
            ids = np.load(path, allow_pickle=False)
            return {"I": ids}
        if magic.startswith(_NPZ):
            return _read_npz(path, label)
        if magic.startswith(_HDF5):
            return _read_hdf5(path, label, nbits)
        found = _read_bigann(path, path.stat().st_size) or _read_trec(path, label, n_queries)
    except InputError:
        raise
    except Exception as exc:  # numpy, zipfile and h5py raise errors of several types for a damaged file
        raise InputError(f"{label}: unreadable ({type(exc).__name__}: {exc})") from None
    if found is None:
        raise InputError(f"{label}: unknown format; served lists come as .npz (I, D; or lims, I, D, radius), .npy, "
                         "ann-benchmarks HDF5, a TREC run or big-ann-benchmarks binary (docs/served.md)")
    return found


def read_served(key: str, source, n_queries: int, n_database: int, nbits: int) -> ServedList:
    """One served run read from a path (``PATH[:1based]``) or Python arrays, and checked against the dataset's
    sizes (:func:`check_served`). The distances are checked against the codes later (hashdist.served.engine)."""
    task, name = split_key(key)
    one_based = False
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if text.endswith(ONE_BASED_SUFFIX):
            text, one_based = text[: -len(ONE_BASED_SUFFIX)], True
        source_name = text
        fields = _read_path(text, f"--served {name} ({text})", n_queries, nbits)
    else:
        source_name = "arrays"
        fields, one_based = _from_python(source, f"served[{name!r}]")
    run = _as_list(name, source_name, fields, task, one_based, nbits)
    check_served(run, n_queries, n_database)
    return run


def _as_list(name: str, source: str, fields: dict, task: str | None, one_based: bool, nbits: int) -> ServedList:
    label = f"--served {name} ({source})"
    ids, lims = fields["I"], fields.get("lims")
    if ids.dtype.kind not in "iu":
        raise InputError(f"{label}: ids (I) must be integers, got {ids.dtype}")
    ids = narrow_ids(ids)
    time = fields.get("time_per_query_s")
    if time is not None:
        if time.size != 1 or not np.issubdtype(time.dtype, np.number) or not math.isfinite(float(time)):
            raise InputError(f"{label}: time_per_query_s must be one finite number")
        time = float(time)
    distances = fields.get("D")
    if distances is not None:
        if not np.issubdtype(distances.dtype, np.number):
            raise InputError(f"{label}: distances (D) must be numbers, got {distances.dtype}")
        if distances.shape != ids.shape:
            raise InputError(f"{label}: D has shape {distances.shape} but I has {ids.shape}")
    if one_based:
        ids = np.where(ids >= 1, ids - 1, np.where(ids == 0, -2, ids))  # -2: id 0, out of range when 1-based
    radius = None
    if lims is not None:
        radius = _check_range_fields(label, fields, ids, lims, nbits)
        lims = lims.astype(np.int64)
    elif "radius" in fields:
        raise InputError(f"{label}: a radius but no lims; a radius lookup holds lims, I (and D) as faiss's "
                         "range_search returns them")
    elif ids.ndim != 2:
        raise InputError(f"{label}: I must be 2-D (queries x K), got shape {ids.shape}")
    return ServedList(name, source, ids, distances, lims, radius, time, task, one_based)


def _check_range_fields(label: str, fields: dict, ids: np.ndarray, lims: np.ndarray, nbits: int) -> int:
    if "radius" not in fields:
        raise InputError(f"{label}: a radius lookup (lims, I) without 'radius'; store the inclusive Hamming radius "
                         "r (faiss's range_search(x, radius) keeps d < radius: r = radius - 1)")
    radius = fields["radius"]
    if radius.size != 1 or radius.dtype.kind not in "iuf" or float(radius) != int(radius) \
            or not 0 <= int(radius) <= nbits:
        raise InputError(f"{label}: radius must be an integer in 0..{nbits} (the inclusive Hamming radius), got "
                         f"{radius.tolist()}")
    if lims.ndim != 1 or lims.dtype.kind not in "iu" or ids.ndim != 1 or not len(lims) or lims[0] != 0 \
            or lims[-1] != len(ids) or (np.diff(lims.astype(np.int64)) < 0).any():
        raise InputError(f"{label}: lims must be non-decreasing integers from 0 to len(I) = {len(ids)}, and I "
                         "1-D: faiss's range_search output")
    return int(radius)


# -- checks ----------------------------------------------------------------------------------------------------


def _refuse(run: ServedList, mask, what: str, detail=None, hint: str = "") -> None:
    """InputError when any entry is flagged (``mask``: a flag per entry, or (how many, the first's flat index)): the
    run, how many entries, the first query and position."""
    if isinstance(mask, tuple):
        count, first = mask
    else:
        count = int(np.count_nonzero(mask))
        first = int(np.flatnonzero(np.asarray(mask).reshape(-1))[0]) if count else -1
    if not count:
        return
    q, p = run.position_of(first)
    shown = f" ({detail(first)})" if detail else ""
    entries = "entry" if count == 1 else "entries"
    raise InputError(f"{run.label}: {what} in {count} {entries}, first at query {q} position {p}{shown}{hint}")


def _one_based_hint(run: ServedList, ids: np.ndarray, n_database: int) -> str:
    if run.one_based:
        return ""
    valid = ids[ids >= 0]
    if len(valid) and (valid == n_database).any():
        return f"; an id equals N = {n_database}: 1-based ids? then give the path as NAME=PATH{ONE_BASED_SUFFIX}"
    if len(valid) and not (valid == 0).any():
        return f"; no id is 0: 1-based ids? then give the path as NAME=PATH{ONE_BASED_SUFFIX}"
    return ""


def check_served(run: ServedList, n_queries: int, n_database: int) -> None:
    """The lists against the dataset's sizes: one row per query, ids in range, no -1 before a valid id, no id twice
    in a row. Each test runs on a slice of rows at a time: a flag per entry and a few MB besides."""
    ids = run.ids
    rows = len(run.lims) - 1 if run.is_range else ids.shape[0]
    if rows != n_queries:
        raise InputError(f"{run.label}: {rows} rows of served lists, but the dataset has {n_queries} queries (one "
                         "row per query, in the dataset's query order)")
    base = "1.." + str(n_database) if run.one_based else "0.." + str(n_database - 1)
    out_of_range = _flags(ids, lambda x: (x < -1) | (x >= n_database))
    if out_of_range[0]:
        _refuse(run, out_of_range, f"ids out of range {base} (-1: padding)",
                lambda i: f"id {0 if ids.reshape(-1)[i] == -2 else _shown(run, i)}",
                _one_based_hint(run, ids, n_database))
    if run.is_range:
        _refuse(run, ids == -1, "-1 (a radius lookup's sets hold no padding)")
        query = run.query_of_entries()
        _refuse_twice(run, query, np.lexsort((ids, query)))
        return
    _refuse(run, _flags(ids, _padding_before_valid), "-1 padding before a valid id (padding is a trailing run only)")
    if _repeats_in_a_row(ids):
        query = run.query_of_entries().reshape(-1)
        _refuse_twice(run, query, np.lexsort((np.arange(ids.size), ids.reshape(-1), query)))


def _flags(ids: np.ndarray, test) -> tuple[int, int]:
    """(how many entries ``test(rows)`` flags, the first one's flat index or -1), over slices of ``ids``' rows,
    SORTED_ENTRIES_PER_STEP entries at a time."""
    row = max(int(np.prod(ids.shape[1:])), 1)
    step = max(1, SORTED_ENTRIES_PER_STEP // row)
    count, first = 0, -1
    for start in range(0, len(ids), step):
        flags = test(ids[start : start + step]).reshape(-1)
        found = int(np.count_nonzero(flags))
        if found and first < 0:
            first = start * row + int(np.flatnonzero(flags)[0])
        count += found
    return count, first


def _padding_before_valid(rows: np.ndarray) -> np.ndarray:
    """-1 entries followed by a valid id in their row."""
    valid = rows >= 0
    later = np.zeros_like(valid)
    later[:, :-1] = np.logical_or.accumulate(valid[:, ::-1], axis=1)[:, ::-1][:, 1:]
    return ~valid & later


def _shown(run: ServedList, flat_index: int) -> int:
    """An entry's id as the input gave it (1-based for a 1-based input)."""
    return int(run.ids.reshape(-1)[flat_index]) + (1 if run.one_based else 0)


def _repeats_in_a_row(ids: np.ndarray) -> bool:
    """Whether a row holds an id twice: a row's repeats are neighbours once sorted (rows sorted a slice at a time,
    a few MB whatever the lists' size)."""
    step = max(1, SORTED_ENTRIES_PER_STEP // max(ids.shape[1], 1))
    for start in range(0, ids.shape[0], step):
        in_row = np.sort(ids[start : start + step], axis=1)
        if ((in_row[:, 1:] == in_row[:, :-1]) & (in_row[:, 1:] >= 0)).any():
            return True
    return False


def _refuse_twice(run: ServedList, query: np.ndarray, order: np.ndarray) -> None:
    """Refuse an id served twice to one query, naming the first repeat in served order (``order``: the entries
    sorted by query, then id, then served position)."""
    flat_ids, query = run.ids.reshape(-1), query.reshape(-1)
    twice = np.zeros(flat_ids.size, dtype=bool)
    same = (flat_ids[order][1:] == flat_ids[order][:-1]) & (query[order][1:] == query[order][:-1])
    twice[order[1:][same & (flat_ids[order][1:] >= 0)]] = True
    _refuse(run, twice, "an id served twice to one query (a list holds each item once)",
            lambda i: f"id {_shown(run, i)}")


def check_width(run: ServedList, ks) -> None:
    """Every cut-off K within a k-NN list's width (a radius lookup has no K)."""
    if not run.is_range and max(ks) > run.ids.shape[1]:
        raise InputError(f"{run.label}: --k {max(ks)} is wider than its lists (K = {run.ids.shape[1]}); evaluate at "
                         f"K <= {run.ids.shape[1]}, or serve longer lists")
