"""Served lists made with faiss (``hashdist search``): a binary index from a factory string, trained on and filled
with the dataset's database codes, and each setting of its search parameter's lists of the dataset's queries
written as one ``NAME.npz`` (the input of ``hashdist evaluate --served``).

Codes: a dataset stores bit i of a code as bit i % 64 of little-endian uint64 word i // 64 (hashdist.data.bits);
read byte by byte that is bit i % 8 of byte i // 8, faiss's layout of a binary vector of d = 8 ceil(B / 8) bits.
The unused bits of the last byte are zero on both sides, so faiss's distances are the codes' Hamming distances.

A k-NN file holds ``I`` (Q x K int64 database ids, -1 padding, faiss's ``search`` output), ``D`` (Q x K int32
Hamming distances; at padding what faiss puts there, 2^31 - 1), ``k``; a radius file holds ``lims`` (Q + 1 int64),
``I``, ``D`` and ``radius``, the inclusive Hamming radius r (faiss's ``range_search`` is called with r + 1, since it
keeps d < radius). Both hold ``time_per_query_s`` (the wall time of the timed search calls / Q, float64; each
setting's first call, of WARM_UP queries, is untimed), ``index`` (the factory string), ``parameter`` and ``value``
(the search parameter, "" and -1 for an index without one), ``threads``, ``build_s``, ``train_rows``, ``nbits``,
``dataset`` (its fingerprint) and ``task`` ("" without modalities). Nothing here loads faiss until a search is
prepared; ``import hashdist`` never does.
"""

from __future__ import annotations

import json
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from hashdist.data.atomic import check_output as check_owned_output
from hashdist.data.atomic import read_marker, staged_directory
from hashdist.data.dataset import Dataset, open_dataset
from hashdist.errors import InputError
from hashdist.progress import progress_bar

FAISS_EXTRA = "pip install 'hashdist[faiss]'"
QUERY_BATCH = 4096  # queries per search call (the progress bar's step; faiss parallelises over a call's queries)
TRAIN_PER_LIST = 256  # faiss's k-means keeps at most this many training points per centroid
WARM_UP = 16  # queries searched, untimed, before a setting's timed calls
NO_VALUE = -1
SEARCH_FORMAT = "hashdist-search"  # DIR/hashdist.json: marks a directory search wrote (--overwrite replaces it)
SEARCH_MARKER_FILE = "hashdist.json"
# the index classes that take each search parameter, and what the parameter sets
PARAMETERS = {"nprobe": (("IndexBinaryIVF",), "--nprobe", "an IVF index (BIVF...)"),
              "efSearch": (("IndexBinaryHNSW",), "--ef-search", "an HNSW index (BHNSW...)"),
              "nflip": (("IndexBinaryHash", "IndexBinaryMultiHash"), "--nflip", "a hash index (BHash...)")}


def load_faiss():
    """The faiss module; without it, the InputError that names the extra to install."""
    try:
        import faiss
    except ImportError:
        raise InputError(f"hashdist search needs faiss, an optional extra: {FAISS_EXTRA}") from None
    return faiss


def code_bytes(nbits: int) -> int:
    """Bytes of one code as faiss takes it (d = 8 x this many bits)."""
    return (nbits + 7) // 8


def faiss_codes(words: np.ndarray, nbits: int) -> np.ndarray:
    """(n, W) uint64 code words as faiss's binary vectors: (n, ceil(B / 8)) uint8, C-contiguous."""
    as_bytes = np.ascontiguousarray(words, dtype="<u8").view(np.uint8)
    return np.ascontiguousarray(as_bytes[:, : code_bytes(nbits)])


def faiss_message(exc: Exception) -> str:
    """faiss's error in one line: what follows its "Error: " and a failed check's quoted condition."""
    text = " ".join(str(exc).split())
    text = text.rpartition("Error: ")[2] or text
    return re.sub(r"^'[^']*' failed: ", "", text)


class Setting(NamedTuple):
    """One output: the search parameter (faiss's name, or None) and its value."""

    parameter: str | None
    value: int

    def name(self, index: str, radius: int | None) -> str:
        """The output's file name: the index's factory string (characters other than letters, digits, '_', '.'
        and '-' as '_'), the setting, and for a radius lookup ``-rR``."""
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", index)
        name += f"-{self.parameter}{self.value}" if self.parameter else ""
        return name + ("" if radius is None else f"-r{radius}") + ".npz"


class PreparedSearch(NamedTuple):
    """A search checked against its dataset: the dataset (a task's view), the options, faiss, an empty index of
    the factory string (checked; each run builds its own), the settings and the rows to train on (0: the index
    needs no training)."""

    ds: Dataset
    options: Any  # hashdist.options.SearchOptions
    faiss: Any
    index: Any
    settings: tuple[Setting, ...]
    train_rows: int


def prepare(dataset, options, out=None, overwrite: bool = False) -> PreparedSearch:
    """Check ``options`` (a :class:`hashdist.options.SearchOptions`) against faiss and the dataset, and ``out``:
    every refusal comes before the index is built."""
    if out is not None:
        check_output(out, dataset, overwrite)
    faiss = load_faiss()
    ds = open_dataset(dataset, options.task)
    if ds.modalities and options.task is None:
        raise InputError(f"{ds.url} has modalities: give the task searched with --task, one of "
                         f"{', '.join(ds.tasks)}")
    if options.k is not None and options.k > ds.n_database:
        raise InputError(f"--k {options.k} exceeds the database's {ds.n_database:,} items")
    if options.radius is not None and options.radius > ds.nbits:
        raise InputError(f"--radius {options.radius} exceeds the codes' {ds.nbits} bits")
    try:
        index = faiss.index_binary_factory(8 * code_bytes(ds.nbits), options.index)
    except RuntimeError as exc:
        raise InputError(f"--index {options.index}: faiss cannot make it ({faiss_message(exc)})") from None
    _check_shape(index, options.index, 8 * code_bytes(ds.nbits))
    if options.radius is not None and _kind(index) == "IndexBinaryHNSW":
        raise InputError(f"--radius: {options.index} is an HNSW index, which has no range search in faiss; "
                         "use --k, or an IVF, hash or flat index")
    settings = _settings(index, options)
    return PreparedSearch(ds, options, faiss, index, settings, _train_rows(index, options, ds.n_database))


def _check_shape(index, spec: str, d: int) -> None:
    """What faiss's factory takes but cannot search: an IVF index of no list, a hash of more bits than a code's d
    (faiss would read past each code)."""
    if hasattr(index, "nlist") and index.nlist < 1:
        raise InputError(f"--index {spec}: an IVF index needs at least one inverted list")
    hashed = getattr(index, "b", 0) * getattr(index, "nhash", 1)
    if hashed > d:
        raise InputError(f"--index {spec}: hashes {hashed} bits, more than the codes' {d} (faiss's d: the code "
                         "length rounded up to whole bytes)")


def check_output(out, dataset, overwrite: bool) -> None:
    """--out is not an input, and is new, empty, or a directory of lists that search wrote (replaced only with
    --overwrite): hashdist replaces only what it wrote (hashdist.data.atomic.check_output)."""
    check_owned_output(out, "search output", _is_search_output, overwrite=overwrite, inputs=(dataset,))


def _is_search_output(path: Path) -> bool:
    return read_marker(path / SEARCH_MARKER_FILE, "format") == SEARCH_FORMAT


def _kind(index) -> str:
    return type(index).__name__


def _taken_parameter(index) -> str | None:
    """The search parameter ``index`` takes (faiss's name), or None."""
    return next((name for name, (classes, _, _) in PARAMETERS.items() if _kind(index) in classes), None)


def _get(index, parameter: str) -> int:
    return int(index.hnsw.efSearch if parameter == "efSearch" else getattr(index, parameter))


def _set(index, parameter: str | None, value: int) -> None:
    if parameter == "efSearch":
        index.hnsw.efSearch = value
    elif parameter is not None:
        setattr(index, parameter, value)


def _settings(index, options) -> tuple[Setting, ...]:
    """The settings searched: each value of the parameter given, else the index's default (and no parameter for
    an index without one); a parameter the index does not take is refused, as is nprobe above nlist."""
    taken, given = _taken_parameter(index), options.parameter
    if given is not None and given[0] != taken:
        flag, what = PARAMETERS[given[0]][1:]
        has = f"; it takes {PARAMETERS[taken][1]}" if taken else " and takes no search parameter"
        raise InputError(f"{flag}: only for {what}; {options.index} is a faiss {_kind(index)}{has}")
    if given is None:
        return (Setting(taken, _get(index, taken)),) if taken else (Setting(None, NO_VALUE),)
    parameter, values = given
    if parameter == "nprobe" and max(values) > index.nlist:
        raise InputError(f"--nprobe {max(values)} exceeds the {index.nlist} inverted lists of {options.index}")
    if parameter == "nflip" and max(values) > index.b:
        raise InputError(f"--nflip {max(values)} exceeds the {index.b} bits hashed by {options.index}")
    return tuple(Setting(parameter, v) for v in values)


def _train_rows(index, options, n_database: int) -> int:
    """Rows to train on: 0 when the index needs no training (refusing --train-rows then), else --train-rows or
    all up to TRAIN_PER_LIST per inverted list, at least as many as the lists."""
    if index.is_trained:
        if options.train_rows is not None:
            raise InputError(f"--train-rows: {options.index} needs no training")
        return 0
    lists = int(getattr(index, "nlist", 1))
    rows = options.train_rows if options.train_rows is not None else min(n_database, TRAIN_PER_LIST * lists)
    if rows > n_database:
        raise InputError(f"--train-rows {rows} exceeds the database's {n_database:,} items")
    if rows < lists:
        raise InputError(f"--index {options.index}: {lists} inverted lists need at least {lists} training rows, "
                         f"{'--train-rows gives' if options.train_rows is not None else 'the database has'} {rows}")
    return rows


def training_codes(ds: Dataset, rows: int, seed: int) -> np.ndarray:
    """``rows`` database codes drawn uniformly without replacement (seeded), read chunk by chunk, in faiss's
    layout: the sample and one chunk in memory."""
    n, chunk = ds.n_database, ds.chunk_rows("database")
    chosen = np.sort(np.random.default_rng(seed).choice(n, size=rows, replace=False)) if rows < n else None
    parts = []
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        if chosen is None:
            parts.append(faiss_codes(ds.codes("database", start, stop), ds.nbits))
            continue
        lo, hi = np.searchsorted(chosen, (start, stop))
        if hi > lo:
            parts.append(faiss_codes(ds.codes("database", start, stop)[chosen[lo:hi] - start], ds.nbits))
    return np.concatenate(parts)


def build(run: PreparedSearch, bar):
    """A new index of the run's factory string, trained (when it needs it) and filled with the database chunk by
    chunk: (the index, the seconds taken)."""
    ds, started = run.ds, time.perf_counter()
    index = run.faiss.index_binary_factory(run.index.d, run.options.index)  # the prepared one stays empty
    if run.train_rows:
        bar.set_postfix_str(f"training on {run.train_rows:,} rows")
        try:
            index.train(training_codes(ds, run.train_rows, run.options.seed))
        except RuntimeError as exc:
            raise InputError(f"--index {run.options.index}: faiss cannot train it ({faiss_message(exc)})") from None
        bar.update(1)
    bar.set_postfix_str("adding the database")
    chunk = ds.chunk_rows("database")
    for start in range(0, ds.n_database, chunk):
        index.add(faiss_codes(ds.codes("database", start, min(start + chunk, ds.n_database)), ds.nbits))
        bar.update(1)
    return index, time.perf_counter() - started


def search_knn(index, queries: np.ndarray, k: int, bar) -> tuple[dict, float]:
    """faiss's k-NN lists of every query, QUERY_BATCH at a time: ({I, D, k}, seconds spent in faiss)."""
    n = len(queries)
    ids, distances, seconds = np.empty((n, k), np.int64), np.empty((n, k), np.int32), 0.0
    for start in range(0, n, QUERY_BATCH):
        stop = min(start + QUERY_BATCH, n)
        t0 = time.perf_counter()
        d, i = index.search(queries[start:stop], k)
        seconds += time.perf_counter() - t0
        ids[start:stop], distances[start:stop] = i, d
        bar.update(1)
    return {"I": ids, "D": distances, "k": np.int64(k)}, seconds


def search_range(index, queries: np.ndarray, radius: int, bar) -> tuple[dict, float]:
    """faiss's range search at ``radius`` + 1 (it keeps d < radius) of every query: ({lims, I, D, radius = the
    inclusive r}, seconds spent in faiss)."""
    lims, ids, distances, seconds = [np.zeros(1, np.int64)], [], [], 0.0
    for start in range(0, len(queries), QUERY_BATCH):
        t0 = time.perf_counter()
        batch_lims, d, i = index.range_search(queries[start:start + QUERY_BATCH], radius + 1)
        seconds += time.perf_counter() - t0
        lims.append(batch_lims[1:].astype(np.int64) + lims[-1][-1])
        ids.append(i.astype(np.int64))
        distances.append(d.astype(np.int32))  # faiss returns the integer distances as float32
        bar.update(1)
    return {"lims": np.concatenate(lims), "I": np.concatenate(ids), "D": np.concatenate(distances),
            "radius": np.int64(radius)}, seconds


@contextmanager
def faiss_threads(faiss, threads: int | None):
    """faiss's OpenMP threads set to ``threads`` (when given) for the duration; the count in use."""
    before = faiss.omp_get_max_threads()
    if threads is not None:
        faiss.omp_set_num_threads(threads)
    try:
        yield faiss.omp_get_max_threads()
    finally:
        faiss.omp_set_num_threads(before)


def run_search(run: PreparedSearch, out, *, overwrite: bool = False, progress: bool = False) -> list[dict]:
    """Build the index, search every setting and write one ``NAME.npz`` each into ``out`` (staged: the directory
    appears complete or not at all); one summary per file (path, setting, time per query, entries served)."""
    ds, options = run.ds, run.options
    check_output(out, ds.url, overwrite)
    kinds = [r for r in ((options.k, None), (None, options.radius)) if r != (None, None)]
    batches = -(-ds.n_queries // QUERY_BATCH)
    steps = bool(run.train_rows) + -(-ds.n_database // ds.chunk_rows("database"))
    steps += len(run.settings) * len(kinds) * batches
    queries = faiss_codes(ds.codes("queries", 0, ds.n_queries), ds.nbits)
    summaries = []
    with faiss_threads(run.faiss, options.threads) as threads, progress_bar(steps, progress) as bar, \
            staged_directory(out) as staged:
        (staged / SEARCH_MARKER_FILE).write_text(json.dumps({"format": SEARCH_FORMAT, "index": options.index}))
        meta = {"index": np.str_(options.index), "threads": np.int64(threads), "nbits": np.int64(ds.nbits),
                "train_rows": np.int64(run.train_rows), "dataset": np.str_(ds.fingerprint),
                "task": np.str_(ds.task or "")}
        index, build_s = build(run, bar)
        meta["build_s"] = np.float64(build_s)
        for setting in run.settings:
            _set(index, setting.parameter, setting.value)
            index.search(queries[:WARM_UP], 1)  # untimed: faiss's threads and the lists' memory warmed up
            for k, radius in kinds:
                name = setting.name(options.index, radius)
                bar.set_postfix_str(name)
                arrays, seconds = (search_knn(index, queries, k, bar) if k is not None
                                   else search_range(index, queries, radius, bar))
                arrays.update(meta, parameter=np.str_(setting.parameter or ""), value=np.int64(setting.value),
                              time_per_query_s=np.float64(seconds / ds.n_queries))
                np.savez(staged / name, **arrays)
                summaries.append(_summary(Path(out) / name, setting, k, radius, arrays))
    return summaries


def _summary(path: Path, setting: Setting, k: int | None, radius: int | None, arrays: dict) -> dict:
    served = np.diff(arrays["lims"]) if radius is not None else (arrays["I"] >= 0).sum(axis=1)
    return {"path": str(path), "parameter": setting.parameter, "value": setting.value if setting.parameter else None,
            "k": k, "radius": radius, "time_per_query_s": float(arrays["time_per_query_s"]),
            "served_per_query": float(served.mean()), "queries_served_nothing": int((served == 0).sum())}


def format_summaries(summaries: list[dict], options) -> str:
    """The terminal's table: one row per file written."""
    rows = [("file", "setting", "lists", "µs/query", "served/query", "queries served nothing")]
    for s in summaries:
        setting = f"{s['parameter']}={s['value']}" if s["parameter"] else "-"
        lists = f"k={s['k']}" if s["k"] is not None else f"radius<={s['radius']}"
        rows.append((Path(s["path"]).name, setting, lists, f"{s['time_per_query_s'] * 1e6:.1f}",
                     f"{s['served_per_query']:.4g}", str(s["queries_served_nothing"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return f"hashdist search: {options.index}\n" + "\n".join(lines)
