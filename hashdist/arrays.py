"""Evaluate codes held in memory: arrays in, the report document out, no files written.

:class:`Evaluator` is a streaming, mergeable state for training loops (``add_database``,
``add_queries``, ``merge``, ``compute``): each batch is validated and packed as it arrives, so
memory is the packed database and query codes and labels, never a Q x N matrix.
:func:`evaluate_codes` is one evaluator fed whole arrays. Both write the packed rows into an
in-process Zarr dataset (``memory://``) with the same chunking as ``hashdist ingest`` and run
the same engine as :func:`hashdist.evaluate`, so the report is identical to evaluating the same
data ingested to disk, apart from paths and timing.

Arrays: codes (n, B) of {0,1}, {-1,+1} or bool, or packed ``numpy.packbits`` uint8 rows with
``nbits=B``; labels 1-D integers (classes) or 2-D 0/1 (multi-hot). Anything exposing
``__array__`` or ``__dlpack__`` (a CPU torch tensor) is accepted; torch is never imported. Bad
input raises :class:`hashdist.InputError` (a ``ValueError``) naming the argument; an evaluator
that refused a batch is unchanged and stays usable.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

import numpy as np

from hashdist.api import evaluate_local, options_of
from hashdist.data.bits import (
    check_code_convention,
    label_kind,
    numpy_packed_to_words,
    pack_code_block,
    pack_label_block,
)
from hashdist.data.dataset import MAX_NBITS, DatasetWriter
from hashdist.data.ingest import check_modality_name, check_relevant
from hashdist.data.inputs import check_scores
from hashdist.defaults import DEFAULT_CHUNK_ROWS, DEFAULT_QUERY_CHUNK_ROWS
from hashdist.errors import InputError, is_integer
from hashdist.options import EvaluateOptions

__all__ = ["Evaluator", "evaluate_codes"]


def as_numpy(x, name: str) -> np.ndarray:
    """A numpy view of an array-like: numpy arrays, ``__dlpack__`` or ``__array__`` objects, nested lists."""
    if isinstance(x, np.ndarray):
        return x
    if device_of(x) is not None:  # a tensor on an accelerator: its rows are packed on the CPU
        x = x.cpu()
    if hasattr(x, "detach"):  # a tensor that requires grad exports no DLPack capsule
        x = x.detach()
    try:
        if hasattr(x, "__dlpack__"):
            return np.from_dlpack(x)
        return np.asarray(x)
    except Exception as exc:
        raise InputError(f"{name}: not convertible to a numpy array ({type(exc).__name__}: {exc})") from None


def device_of(x) -> str | None:
    """The device of a tensor on an accelerator (``"cuda:0"``), None for anything on the CPU (torch not imported)."""
    device = getattr(x, "device", None)
    kind = getattr(device, "type", None)
    return str(device) if isinstance(kind, str) and kind != "cpu" else None


class _Part:
    """The packed rows of one side (database or queries): code words (per modality: None for codes without
    modalities), labels and their kinds."""

    def __init__(self):
        self.words: dict[str | None, list[np.ndarray]] = {}
        self.labels: list[np.ndarray] = []
        self.rows = 0
        self.values: set = set()  # code values seen, to refuse a mix of {0,1} and {-1,+1} batches
        self.label_kind: str | None = None  # "class", "multilabel" or None (no labels)
        self.label_columns = 0

    def extend(self, other: _Part) -> None:
        for name, blocks in other.words.items():
            self.words.setdefault(name, []).extend(blocks)
        self.labels += other.labels
        self.rows += other.rows
        self.values |= other.values


class Evaluator:
    """Streaming evaluation state: add database and query batches in any sizes, merge, compute.

    ``nbits``: bits per code (1..MAX_NBITS) when codes are given as packed ``numpy.packbits`` uint8 rows;
    None: the width of the first batch sets B and every later batch must match.
    """

    def __init__(self, nbits: int | None = None):
        if nbits is not None and (not is_integer(nbits) or not 1 <= nbits <= MAX_NBITS):
            raise InputError(f"nbits: expected an integer in 1..{MAX_NBITS} or None, got {nbits!r}")
        self.nbits = None if nbits is None else int(nbits)
        self.packed = nbits is not None
        self.device: str | None = None  # the accelerator the first tensor codes came from (the torch engine's)
        self._parts = {"database": _Part(), "queries": _Part()}

    # -- adding batches ------------------------------------------------------------------

    def add_database(self, codes, labels=None) -> Evaluator:
        """Append database items (codes and, for class or multi-label relevance, their labels)."""
        return self._add("database", codes, labels, "db_codes", "db_labels")

    def add_queries(self, codes, labels=None) -> Evaluator:
        """Append queries (codes and their labels)."""
        return self._add("queries", codes, labels, "query_codes", "query_labels")

    def _add(self, part: str, codes, labels, codes_name: str, labels_name: str) -> Evaluator:
        batch, rows, width, values = self._pack_batch(codes, codes_name)
        self._check_modalities(part, set(batch), codes_name)
        packed_labels, kind, columns = None, None, 0
        if labels is not None:
            packed_labels, kind, columns = _pack_labels(as_numpy(labels, labels_name), labels_name, rows)
        self._check_labels_agree(labels_name, kind, columns)
        side = self._parts[part]
        check_code_convention(side.values | values, codes_name)
        # every check passed: only now does the state change
        self.nbits = width
        self.device = self.device or _codes_device(codes)
        side.values |= values
        for name, words in batch.items():
            side.words.setdefault(name, []).append(words)
        side.rows += rows
        if packed_labels is not None:
            side.labels.append(packed_labels)
            side.label_kind, side.label_columns = kind, columns
        return self

    def _pack_batch(self, codes, name: str) -> tuple[dict, int, int, set]:
        """A batch's codes packed per modality ({None: words} for an array): (words, rows, B, values seen)."""
        arrays = {None: codes} if not isinstance(codes, dict) else {
            check_modality_name(m, name): x for m, x in codes.items()}
        if not arrays:
            raise InputError(f"{name}: an empty dict (give one code array per modality)")
        batch, shapes, values = {}, {}, set()
        for modality, x in arrays.items():
            where = name if modality is None else f"{name}[{modality!r}]"
            words, width, seen = self._pack_codes(as_numpy(x, where), where)
            batch[modality], shapes[where], values = words, (len(words), width), values | seen
        (first, shape), *rest = shapes.items()
        for where, other in rest:
            if other != shape:
                raise InputError(f"{where}: {other[0]} codes of {other[1]} bits but {first} has {shape[0]} of "
                                 f"{shape[1]} (the modalities describe the same items, in one code length)")
        return batch, shape[0], shape[1], values

    def _check_modalities(self, part: str, names: set, where: str) -> None:
        """A side keeps the modalities of its first batch; both sides have modalities or neither does."""
        side = self._parts[part]
        if side.rows and names != set(side.words):
            raise InputError(f"{where}: modalities {_names(names)} but earlier batches have {_names(side.words)}")
        other = self._parts["queries" if part == "database" else "database"]
        if other.rows and (None in names) != (None in other.words):
            raise InputError(f"{where}: give codes per modality (a dict) on both sides or on neither")

    def _pack_codes(self, arr: np.ndarray, name: str) -> tuple[np.ndarray, int, set]:
        if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
            raise InputError(f"{name}: codes must be a non-empty 2-D array (rows, bits), got shape {arr.shape}")
        if self.packed:
            if arr.dtype != np.uint8 or arr.shape[1] != -(-self.nbits // 8):
                raise InputError(f"{name}: packed codes must be uint8 rows of {-(-self.nbits // 8)} bytes for "
                                 f"nbits={self.nbits}, got {arr.dtype} {arr.shape}")
            return numpy_packed_to_words(arr, self.nbits, name, "nbits="), self.nbits, set()
        if arr.shape[1] > MAX_NBITS:
            raise InputError(f"{name}: {arr.shape[1]} bits per code exceeds the maximum {MAX_NBITS}")
        if self.nbits is not None and arr.shape[1] != self.nbits:
            raise InputError(f"{name}: codes have {arr.shape[1]} bits but earlier codes have {self.nbits}")
        words, values = pack_code_block(arr, name)
        return words, arr.shape[1], set(values)

    def _check_labels_agree(self, name: str, kind: str | None, columns: int) -> None:
        """Labels must be given for every batch or none, of one kind and width on both sides."""
        sides = [p for p in self._parts.values() if p.rows]
        if not sides:
            return
        have = next((p for p in sides if p.label_kind), None)
        if (have is None) != (kind is None):
            if have is None:
                raise InputError(f"{name}: labels given, but earlier batches have none")
            raise InputError(f"{name}: labels missing, but earlier batches have {have.label_kind} labels")
        if have is not None and (kind, columns) != (have.label_kind, have.label_columns):
            shape = "1-D class labels" if kind == "class" else f"multi-hot labels with {columns} columns"
            before = "class labels" if have.label_kind == "class" else f"{have.label_columns} label columns"
            raise InputError(f"{name}: {shape}, but earlier batches have {before}")

    # -- combining and computing ----------------------------------------------------------

    def merge(self, other: Evaluator) -> Evaluator:
        """Add another evaluator's database and queries after this one's (e.g. from another process)."""
        if not isinstance(other, Evaluator):
            raise InputError(f"merge: expected an Evaluator, got {type(other).__name__}")
        if other is self:
            raise InputError("merge: an evaluator cannot merge itself (its rows would count twice)")
        if other.nbits is not None and self.nbits is not None and other.nbits != self.nbits:
            raise InputError(f"merge: the other evaluator has {other.nbits}-bit codes, this one {self.nbits}")
        for part in ("database", "queries"):
            mine, theirs = self._parts[part], other._parts[part]
            if mine.rows and theirs.rows and (mine.label_kind, mine.label_columns) != (
                    theirs.label_kind, theirs.label_columns):
                raise InputError(f"merge: the other evaluator's {part} labels differ in kind or width")
            check_code_convention(mine.values | theirs.values, f"merge ({part} codes)")
            if mine.rows and theirs.rows and set(mine.words) != set(theirs.words):
                raise InputError(f"merge: the other evaluator's {part} modalities are {_names(theirs.words)}, this "
                                 f"one's {_names(mine.words)}")
        for part in ("database", "queries"):
            theirs = other._parts[part]
            if theirs.rows:
                if not self._parts[part].rows:
                    self._parts[part].label_kind = theirs.label_kind
                    self._parts[part].label_columns = theirs.label_columns
                self._parts[part].extend(theirs)
        self.nbits = self.nbits or other.nbits
        self.device = self.device or other.device
        return self

    def compute(self, *, relevant=None, query_scores=None, threads: int | None = None,
                options: EvaluateOptions | None = None, **keywords) -> dict:
        """The report document of everything added so far (options as for :func:`hashdist.evaluate`: the object
        or its fields as keywords).

        ``relevant``: explicit ground truth instead of labels, as a CSR triple (indptr, indices[, grades])
        or a list with each query's relevant database indices (an empty one: none); with labels too, it is
        used unless ``relevance=`` picks the labels' kind. ``query_scores``: the queries' real-valued
        vectors (Q, B), ranked by the asymmetric distance -y.b (docs/metrics.md, section 4b);
        ``bit_weights=`` (B,) or (Q, B) ranks by weighted Hamming distance.
        """
        options = options_of("Evaluator.compute", options, keywords)
        db, queries = self._parts["database"], self._parts["queries"]
        for side, name in ((db, "add_database"), (queries, "add_queries")):
            if not side.rows:
                raise InputError(f"{name}: no rows were added")
        scores = None
        if query_scores is not None:
            scores = check_scores(as_numpy(query_scores, "query_scores"), self.nbits, queries.rows, "query_scores")
            options = replace(options, distance=options.distance or "asymmetric")
        if options.device is None and self.device is not None:
            options = replace(options, device=self.device)
        if relevant is not None and options.relevance is None:
            options = replace(options, relevance="explicit")
        url = f"memory://hashdist-{uuid.uuid4().hex}"
        try:
            self._write(url, _relevant_csr(relevant, queries.rows, db.rows), scores)
            report = evaluate_local(url, cache=False, threads=threads, options=options).report
        except InputError as exc:  # named as the caller knows the data, not by the run's in-memory store
            raise InputError(str(exc).replace(url, "<arrays>")) from None
        finally:
            _remove_memory_dataset(url)
        for part in (report, *report.get("tasks", {}).values()):
            part["dataset"]["path"] = "<arrays>"
        return report

    def _write(self, url: str, csr, scores=None) -> None:
        db = self._parts["database"]
        kinds = [db.label_kind] if db.label_kind else []
        if csr is not None:
            kinds.append("explicit")
        if not kinds:
            raise InputError("labels: give labels for database and queries, or relevant=")
        n_labels = db.label_columns if db.label_kind == "multilabel" else 0
        with DatasetWriter(url, nbits=self.nbits, relevance=tuple(kinds), n_labels=n_labels,
                           chunk_rows=DEFAULT_CHUNK_ROWS, query_chunk_rows=DEFAULT_QUERY_CHUNK_ROWS) as writer:
            for part, side in self._parts.items():
                for modality, blocks in side.words.items():
                    for words in blocks:
                        writer.add_codes(part, words, modality)
                for labels in side.labels:
                    writer.add_labels(part, labels)
            if csr is not None:
                writer.add_relevant(*csr)
            if scores is not None:
                writer.add_scores(scores)


def _codes_device(codes) -> str | None:
    return next(filter(None, map(device_of, codes.values() if isinstance(codes, dict) else [codes])), None)


def _names(modalities) -> str:
    return ", ".join(sorted(str(m) for m in modalities if m)) or "none (plain arrays)"


def _pack_labels(arr: np.ndarray, name: str, rows: int) -> tuple[np.ndarray, str, int]:
    if arr.shape[0] != rows:
        raise InputError(f"{name}: {arr.shape[0]} labels but {rows} codes")
    kind = label_kind(arr, name)
    return pack_label_block(arr, name, kind), kind, arr.shape[1] if kind == "multilabel" else 0


def _relevant_csr(relevant, n_queries: int, n_database: int):
    """``relevant`` as validated CSR (indptr, indices, grades or None), or None."""
    if relevant is None:
        return None
    if isinstance(relevant, tuple) and len(relevant) in (2, 3):
        arrays = dict(zip(("indptr", "indices", "grades"), (as_numpy(x, "relevant") for x in relevant),
                          strict=False))
    else:
        lists = [as_numpy(x, "relevant").reshape(-1) for x in relevant]
        if len(lists) != n_queries:
            raise InputError(f"relevant: {len(lists)} lists for {n_queries} queries")
        for q, x in enumerate(lists):
            if len(x) and x.dtype.kind not in "iu":
                raise InputError(f"relevant: query {q}'s list holds {x.dtype}, not integer indices")
        indptr = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)
        indices = np.concatenate([np.zeros(0, np.int64), *(x.astype(np.int64) for x in lists)])
        arrays = {"indptr": indptr, "indices": indices}
    return check_relevant(arrays, "relevant", n_queries, n_database)


def _remove_memory_dataset(url: str) -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    path = url.removeprefix("memory://")
    if fs.exists(path):
        fs.rm(path, recursive=True)


def evaluate_codes(query_codes, db_codes, query_labels=None, db_labels=None, *, relevant=None, nbits=None,
                   query_scores=None, threads: int | None = None, options: EvaluateOptions | None = None,
                   **keywords) -> dict:
    """The report document for in-memory codes (the same as ``hashdist.evaluate`` on them ingested).

    Cross-modal: ``query_codes`` and ``db_codes`` as dicts {modality: codes} (same rows and bits within a side);
    the report then holds ``report["tasks"]["image->text"]`` etc., for the tasks ``tasks=`` names (default: the
    cross tasks).

    ``relevant`` replaces labels with explicit ground truth (a CSR triple or a list of index arrays per
    query, an empty one for none) unless ``relevance=`` picks the labels' kind; ``nbits`` means the codes
    are packed ``numpy.packbits`` rows of that many bits. Options as for :func:`hashdist.evaluate` (an
    :class:`hashdist.options.EvaluateOptions`, or its fields as keywords).
    ``query_scores``: rank by the asymmetric distance to these real-valued query
    vectors.
    Writes no files.
    """
    options = options_of("evaluate_codes", options, keywords)  # a keyword typo fails before any work
    if (query_labels is None) != (db_labels is None):
        raise InputError("query_labels and db_labels must be given together")
    evaluator = Evaluator(nbits)
    evaluator.add_database(db_codes, db_labels)
    evaluator.add_queries(query_codes, query_labels)
    return evaluator.compute(relevant=relevant, query_scores=query_scores, threads=threads, options=options)
