"""A hashdist dataset: one Zarr v3 group holding codes and relevance data.

Layout (rows are database items or queries)::

    database/codes      (N, W) uint64   bit i of a code = bit i%64 of word i//64
    queries/codes       (Q, W) uint64
    database/labels     (N,) int64 class labels, or (N, LW) uint64 packed multi-hot
    queries/labels      (Q,) or (Q, LW), like database/labels
    queries/relevant/   explicit ground truth as CSR: indptr (Q+1,), indices (nnz,)
                        sorted per query, optional grades (nnz,)
    database/features   (N, D) float32 or float64 real-valued features (optional)
    queries/features    (Q, D), like database/features
    queries/scores      (Q, B) float64 real-valued query vectors for the asymmetric distance (optional; float32 in
                        datasets written before 2026-11-26, read as they are)

A dataset with modalities (cross-modal retrieval, docs/cross-modal.md) holds one code array per named
modality and side instead of ``<side>/codes``: ``database/codes/<modality>`` and ``queries/codes/<modality>``
(same rows and width on one side; the labels are the pair's). Its attribute ``modalities`` names them per
side. A **task** ``a->b`` ranks the database's ``b`` codes against the queries' ``a`` codes; the dataset
opened for a task (:func:`open_dataset` with ``task``) reads those two arrays as ``queries/codes`` and
``database/codes``, so the engine, its plan and its cache work on a task as on a unimodal dataset.

Group attributes: ``format`` ("hashdist-dataset"), ``format_version``, ``nbits``,
``relevance`` (the kinds the data supports, default first), ``n_labels`` for
multi-label data and ``fingerprints``: for every array, the SHA-256 of each row
chunk and of the whole, computed at write time. Blocks of work are keyed on the
chunk fingerprints, so caches survive renames and appends.

Every array is chunked along rows, compressed with zstd and checksummed with
CRC32C, so a corrupted chunk is detected when it is read.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from hashdist.data.atomic import check_output, exclusive, read_marker, staged_directory
from hashdist.data.bits import first_wide_row, n_words
from hashdist.data.validate import FIX, attributes_file, dataset_attributes, label_layout_problem
from hashdist.defaults import DEFAULT_CHUNK_ROWS, DEFAULT_QUERY_CHUNK_ROWS
from hashdist.errors import InputError

FORMAT = "hashdist-dataset"
FORMAT_VERSION = 1
CSR_CHUNK = 1 << 20
MAX_NBITS = 4096
TASK_ARROW = "->"

CODES = ("database/codes", "queries/codes")
CSR = ("queries/relevant/indptr", "queries/relevant/indices", "queries/relevant/grades")
FEATURES = ("database/features", "queries/features")


def _compressors():
    return (ZstdCodec(level=3), Crc32cCodec())


def is_dataset(path: Path) -> bool:
    """Whether ``path`` is a directory hashdist wrote as a dataset (its zarr.json carries the format marker)."""
    return read_marker(path / "zarr.json", "attributes", "format") == FORMAT


def _is_local(url: str) -> bool:
    return "://" not in str(url) or str(url).startswith("file://")


def _local_path(url: str) -> Path:
    return Path(str(url).removeprefix("file://"))


def task_url(url: str) -> str:
    """Where tasks open the dataset ``url``: a local path made absolute, since a cluster's workers run in
    other working directories (on the same file system); other URLs as they are."""
    return str(_local_path(url).absolute()) if _is_local(url) else str(url)


def chunk_digest(block: np.ndarray) -> str:
    """SHA-256 of one chunk's rows, including dtype and shape."""
    block = np.ascontiguousarray(block)
    h = hashlib.sha256(f"{block.dtype.str}{block.shape}".encode())
    h.update(block.tobytes())
    return h.hexdigest()


def content_digest(*arrays) -> str:
    """SHA-256 of arrays as they were read (dtype, shape and bytes of each, in order; ``None`` and tuples of
    arrays allowed): the content a block's cached result is keyed on. At about 0.4 GB/s on one core it is far
    cheaper than the histogram, and hashlib releases the GIL, so threads hash in parallel."""
    h = hashlib.sha256()
    for a in arrays:
        if isinstance(a, tuple):
            h.update(content_digest(*a).encode())
            continue
        a = np.ascontiguousarray(a) if a is not None else np.zeros(0, dtype=np.uint8)
        h.update(f"{a.dtype.str}{a.shape};".encode())
        h.update(a.reshape(-1).view(np.uint8))
    return h.hexdigest()


def combine_digests(parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(str(p).encode())
        h.update(b"\n")
    return h.hexdigest()


@dataclass(frozen=True)
class ArrayFingerprint:
    chunk_rows: int
    chunks: tuple[str, ...]
    rows: int

    @property
    def digest(self) -> str:
        return combine_digests((self.rows, self.chunk_rows, *self.chunks))

    def rows_digest(self, start: int, stop: int) -> str:
        """Fingerprint of rows [start, stop), which must be chunk aligned (stop may be the end)."""
        first, last = start // self.chunk_rows, -(-stop // self.chunk_rows)
        return combine_digests((start, stop, *self.chunks[first:last]))

    def to_json(self) -> dict:
        return {"chunk_rows": self.chunk_rows, "rows": self.rows, "chunks": list(self.chunks), "sha256": self.digest}

    @classmethod
    def from_json(cls, d: dict) -> "ArrayFingerprint":
        return cls(int(d["chunk_rows"]), tuple(d["chunks"]), int(d["rows"]))


def parse_task(task: str) -> tuple[str, str]:
    """``"a->b"`` (or ``"a→b"``) as (query modality, database modality)."""
    a, arrow, b = str(task).replace("\u2192", TASK_ARROW).partition(TASK_ARROW)
    if str(task).endswith("-"):
        raise InputError(f"--task {task!r}: the shell took '>' as a redirection; quote the task, e.g. "
                         f"--task '{task}>text'")
    if not arrow or not a.strip().isidentifier() or not b.strip().isidentifier():
        raise InputError(f"--task {task!r}: expected QUERY_MODALITY->DATABASE_MODALITY, e.g. image->text")
    return a.strip(), b.strip()


def default_tasks(modalities: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The cross tasks ``a->b`` (a != b, queries' order, then the database's); with none, every pair."""
    pairs = [(a, b) for a in modalities["queries"] for b in modalities["database"]]
    cross = [(a, b) for a, b in pairs if a != b] or pairs
    return tuple(f"{a}{TASK_ARROW}{b}" for a, b in cross)


class Dataset:
    """Read access to a hashdist dataset. Open with :func:`open_dataset`.

    On a dataset with modalities, ``task`` (default: the first of :attr:`tasks`) picks the two code arrays
    read as ``queries/codes`` and ``database/codes``; :attr:`fingerprint` then covers that task's view.
    """

    def __init__(self, url: str, group: zarr.Group, task: str | None = None):
        self.url = str(url)
        self.group = group
        checked = dataset_attributes(url, dict(group.attrs), MAX_NBITS)
        self.nbits = checked["nbits"]
        self.relevance_kinds = checked["relevance"]
        self.n_labels = checked["n_labels"]
        self.fingerprints = {k: ArrayFingerprint.from_json(v) for k, v in checked["fingerprints"].items()}
        self.modalities = checked["modalities"]
        self._stored: dict[str, str] = {}  # a task's logical array names -> stored names
        self.task = self._select_task(task) if self.modalities else None
        self._arrays: dict[str, zarr.Array] = {}

    def _select_task(self, task: str | None) -> str:
        """Check ``task`` against the modalities and map ``<side>/codes`` to its arrays (a view: nothing is read)."""
        if set(self.modalities) != {"queries", "database"} or not all(self.modalities.values()):
            raise InputError(f"{self.url}: malformed dataset attributes (modalities)")
        a, b = parse_task(task or self.tasks[0])
        for side, name in (("queries", a), ("database", b)):
            if name not in self.modalities[side]:
                raise InputError(f"--task {task}: the dataset's {side} have no modality {name!r} (they have "
                                 f"{', '.join(self.modalities[side])})")
            stored = f"{side}/codes/{name}"
            if stored not in self.fingerprints:
                raise InputError(f"{self.url}: malformed dataset attributes (no fingerprint of {stored})")
            self._stored[f"{side}/codes"] = stored
            self.fingerprints[f"{side}/codes"] = self.fingerprints[stored]
        return f"{a}{TASK_ARROW}{b}"

    def for_task(self, task: str) -> Dataset:
        """The same dataset (already validated: every modality's arrays) read for another task."""
        return self if task == self.task else Dataset(self.url, self.group, task)

    @property
    def tasks(self) -> tuple[str, ...]:
        """The tasks a run evaluates by default: the cross ones (none for a dataset without modalities)."""
        return default_tasks(self.modalities) if self.modalities else ()

    # -- structure -------------------------------------------------------
    @property
    def n_words(self) -> int:
        return n_words(self.nbits)

    @property
    def n_database(self) -> int:
        return self.fingerprints["database/codes"].rows

    @property
    def n_queries(self) -> int:
        return self.fingerprints["queries/codes"].rows

    @property
    def default_relevance(self) -> str:
        if not self.relevance_kinds:
            if self.has("database/features"):
                raise InputError(f"{self.url}: dataset has no relevance data (run hashdist groundtruth on its "
                                 "features)")
            raise InputError(f"{self.url}: dataset has no relevance data and no features (ingest it again with "
                             "labels or --query-relevant)")
        return self.relevance_kinds[0]

    @property
    def fingerprint(self) -> str:
        """One digest over every array's fingerprint and the format attributes."""
        parts = [FORMAT_VERSION, self.nbits, *self.relevance_kinds, self.n_labels]
        parts += [f"{k}={v.digest}" for k, v in sorted(self.fingerprints.items()) if k not in self._stored]
        if self.task:  # a task's view: its two code arrays stand in for the others'
            parts += [f"task={self.task}"]
        return combine_digests(parts)

    def has(self, name: str) -> bool:
        return name in self.fingerprints

    def chunk_rows(self, part: str) -> int:
        return self.fingerprints[f"{part}/codes"].chunk_rows

    def array(self, name: str) -> zarr.Array:
        if name not in self._arrays:
            stored = self._stored.get(name, name)
            try:
                self._arrays[name] = self.group[stored]
            except KeyError:
                raise InputError(f"{self.url}: dataset has no array {name!r}") from None
            except Exception as exc:  # zarr.json not JSON, or not array metadata: zarr raises many types
                raise InputError(f"{attributes_file(self.url, stored)}: unreadable array metadata "
                                 f"({type(exc).__name__}: {str(exc)[:120]}); {FIX}") from None
        return self._arrays[name]

    def read(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of an array; a corrupted chunk raises InputError naming it."""
        try:
            return np.asarray(self.array(name)[start:stop])
        except InputError:
            raise
        except Exception as exc:  # zarr raises codec errors of several types
            raise self._read_error(name, start, stop, exc) from None

    def _read_error(self, name: str, start: int, stop: int, exc: Exception) -> InputError:
        """The error for rows [start, stop), naming the first chunk that fails alone (zarr's error does not say)."""
        array = self.array(name)
        size = array.chunks[0]
        chunk = start // size
        for i in range(chunk, -(-stop // size)):
            lo, hi = i * size, min((i + 1) * size, array.shape[0])
            try:
                array[lo:hi]
            except Exception as chunk_exc:
                chunk, start, stop, exc = i, lo, hi, chunk_exc
                break
        return InputError(
            f"{self.url}: cannot read {name} rows {start}..{stop} (chunk {chunk}): {type(exc).__name__}: {exc}"
        )

    def codes(self, part: str, start: int, stop: int) -> np.ndarray:
        """Code rows [start, stop); a row with a bit set above ``nbits`` raises InputError (the dataset's
        ``nbits`` is narrower than its codes: every distance would drop those bits)."""
        name = f"{part}/codes"
        words = self.read(name, start, stop)
        row = first_wide_row(words, self.nbits)
        if row is not None:
            raise InputError(f"{self.url}: {self._stored.get(name, name)} row {start + row} has bits set above "
                             f"nbits={self.nbits}: the codes are wider than {self.url}/zarr.json says; ingest them "
                             "again with their real --nbits")
        return words

    def labels(self, part: str, start: int, stop: int) -> np.ndarray:
        return self.read(f"{part}/labels", start, stop)

    def relevant(self, q0: int, q1: int):
        """Explicit ground truth of queries [q0, q1) as (indptr starting at 0, indices, grades)."""
        indptr = self.read("queries/relevant/indptr", q0, q1 + 1).astype(np.int64)
        indices = self.read("queries/relevant/indices", int(indptr[0]), int(indptr[-1])).astype(np.int64)
        if self.has("queries/relevant/grades"):
            grades = self.read("queries/relevant/grades", int(indptr[0]), int(indptr[-1])).astype(np.int64)
        else:
            grades = np.ones(len(indices), dtype=np.int64)
        return indptr - indptr[0], indices, grades

    def relevant_digest(self, q0: int, q1: int) -> str:
        """Content digest of the explicit ground truth of queries [q0, q1)."""
        indptr, indices, grades = self.relevant(q0, q1)
        return combine_digests((chunk_digest(indptr), chunk_digest(indices), chunk_digest(grades)))

    def attrs(self) -> dict:
        return dict(self.group.attrs)


def open_dataset(url, task: str | None = None) -> Dataset:
    """Open and validate a dataset; raise InputError if it is missing or not a hashdist dataset. ``task``: on a
    dataset with modalities, the task ``a->b`` whose code arrays it reads (default: its first task)."""
    url = str(url)
    if _is_local(url) and not _local_path(url).exists():
        raise InputError(f"{url}: no such dataset (path does not exist)")
    make = "make one with hashdist ingest (from .npy/.npz codes and labels) or hashdist synth"
    if url.endswith((".npy", ".npz")):
        raise InputError(f"{url}: a numpy file, not a hashdist dataset; {make}")
    try:
        group = zarr.open_group(store=url, mode="r")
    except Exception:
        raise InputError(f"{url}: not a Zarr dataset; {make}") from None
    attrs = dict(group.attrs)
    if attrs.get("format") != FORMAT:
        raise InputError(f"{url}: not a hashdist dataset (missing format attribute); {make}")
    if attrs.get("format_version") != FORMAT_VERSION:
        raise InputError(
            f"{url}: dataset format version {json.dumps(attrs.get('format_version'))} is not supported (expected "
            f"{FORMAT_VERSION})"
        )
    if task is not None and not attrs.get("modalities"):
        raise InputError(f"--task {task}: {url} has no modalities (one code set per side; ingest codes per "
                         "modality with --query-codes NAME=PATH)")
    ds = Dataset(url, group, task)
    validate_structure(ds)
    return ds


def validate_structure(ds: Dataset) -> None:
    """Check that arrays exist and agree with the recorded attributes (cheap: metadata only)."""
    if not 1 <= ds.nbits <= MAX_NBITS:
        raise InputError(f"{ds.url}: nbits={ds.nbits} is outside 1..{MAX_NBITS}")
    for name, fp in ds.fingerprints.items():
        arr = ds.array(name)
        if arr.shape[0] != fp.rows:
            raise InputError(
                f"{ds.url}: {name} has {arr.shape[0]} rows but its fingerprint records {fp.rows} "
                "(interrupted write?)"
            )
    for part in ("database", "queries"):
        arr = ds.array(f"{part}/codes")
        if arr.ndim != 2 or arr.shape[1] != ds.n_words or arr.dtype != np.uint64:
            raise InputError(
                f"{ds.url}: {part}/codes has shape {arr.shape} {arr.dtype}; nbits={ds.nbits} needs "
                f"(rows, {ds.n_words}) uint64"
            )
        if arr.shape[0] == 0:
            raise InputError(f"{ds.url}: {part}/codes is empty")
        _check_modalities(ds, part, arr)
        if ds.has(f"{part}/labels"):
            _check_labels(ds, part, arr.shape[0])
    if ds.has("queries/relevant/indptr") and ds.array("queries/relevant/indptr").shape[0] != ds.n_queries + 1:
        raise InputError(f"{ds.url}: queries/relevant/indptr must have n_queries + 1 entries")
    if _is_local(ds.url):
        _check_chunk_files(ds)


def _check_labels(ds: Dataset, part: str, rows: int) -> None:
    """A side's labels: a row per code, in the layout of the dataset's label kind."""
    labels = ds.array(f"{part}/labels")
    if labels.shape[0] != rows:
        raise InputError(f"{ds.url}: {part}/labels has {labels.shape[0]} rows but {part}/codes has {rows}")
    for kind in ds.relevance_kinds:
        problem = label_layout_problem(kind, labels.ndim, labels.dtype, labels.shape[-1], n_words(ds.n_labels))
        if problem:
            raise InputError(f"{attributes_file(ds.url, f'{part}/labels')}: {problem} (the dataset's relevance "
                             f"attribute says {kind}); {FIX}")


def _check_modalities(ds: Dataset, part: str, codes: zarr.Array) -> None:
    """Every modality of a side has the rows and the width of the one the task reads."""
    for name in ds.modalities.get(part, ()):
        arr = ds.array(f"{part}/codes/{name}")
        if arr.shape != codes.shape or arr.dtype != codes.dtype:
            raise InputError(f"{ds.url}: {part}/codes/{name} has shape {arr.shape} {arr.dtype}, but the other "
                             f"modalities of the {part} have {codes.shape} {codes.dtype}")


def missing_chunk(array: zarr.Array) -> int | None:
    """The first chunk (along rows) of an array in a local store whose file is missing, or None.

    Zarr reads a missing chunk as fill values, so a lost file would pass for zeros; hashdist writes every
    chunk's file (``write_empty_chunks``), so each one must be there. Stores that are not local are not checked.
    """
    root = getattr(array.store, "root", None)
    if root is None:
        return None
    base = Path(root) / array.path
    for coords in itertools.product(*(range(n) for n in array.cdata_shape)):
        if not (base / array.metadata.encode_chunk_key(coords)).is_file():
            return coords[0]
    return None


def _check_chunk_files(ds: Dataset) -> None:
    """Refuse a local dataset with a chunk file missing."""
    for name in ds.fingerprints:
        if (chunk := missing_chunk(ds.array(name))) is not None:
            raise InputError(f"{ds.url}: {name} chunk {chunk} is missing (damaged dataset)")


# -- writing ----------------------------------------------------------------


class _ArrayWriter:
    """Appends rows to one chunked array, hashing each chunk as it is completed."""

    def __init__(self, array: zarr.Array, chunk_rows: int, chunks=(), rows: int = 0):
        self.array = array
        self.chunk_rows = chunk_rows
        self.digests = list(chunks)
        self.rows = rows
        full = rows // chunk_rows
        self.digests = self.digests[:full]
        tail = self.array[full * chunk_rows : rows] if rows % chunk_rows else None
        self.pending = [np.asarray(tail)] if tail is not None else []
        self.pending_rows = rows - full * chunk_rows
        self.flushed_rows = full * chunk_rows

    def append(self, block: np.ndarray) -> None:
        block = np.asarray(block, dtype=self.array.dtype)
        if block.shape[0] == 0:
            return
        new_rows = self.rows + block.shape[0]
        if new_rows > self.array.shape[0]:
            self.array.resize((new_rows, *self.array.shape[1:]))
        self.rows = new_rows
        self.pending.append(block)
        self.pending_rows += block.shape[0]
        while self.pending_rows >= self.chunk_rows:
            self._flush(self.chunk_rows)

    def _flush(self, nrows: int) -> None:
        joined = np.concatenate(self.pending) if len(self.pending) > 1 else self.pending[0]
        chunk, rest = joined[:nrows], joined[nrows:]
        self.array[self.flushed_rows : self.flushed_rows + nrows] = chunk
        self.digests.append(chunk_digest(chunk))
        self.flushed_rows += nrows
        self.pending = [rest] if len(rest) else []
        self.pending_rows -= nrows

    def close(self) -> ArrayFingerprint:
        if self.pending_rows:
            self._flush(self.pending_rows)
        return ArrayFingerprint(self.chunk_rows, tuple(self.digests), self.rows)


def _create_rows_array(group: zarr.Group, name: str, width: int | None, dtype, chunk_rows: int) -> zarr.Array:
    shape = (0,) if width is None else (0, width)
    chunks = (chunk_rows,) if width is None else (chunk_rows, width)
    return group.create_array(
        name, shape=shape, chunks=chunks, dtype=dtype, compressors=_compressors(), fill_value=0,
        config={"write_empty_chunks": True},  # every chunk has a file, so a lost one is noticed
    )


class DatasetWriter:
    """Writes a dataset chunk by chunk into a temporary sibling and renames it into place on close.

    Use as a context manager; if the body raises, nothing is left behind.
    """

    def __init__(
        self,
        url,
        *,
        nbits: int,
        relevance: tuple[str, ...],
        n_labels: int = 0,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        query_chunk_rows: int = DEFAULT_QUERY_CHUNK_ROWS,
        overwrite: bool = False,
        extra_attrs: dict | None = None,
    ):
        if not 1 <= nbits <= MAX_NBITS:
            raise InputError(f"--nbits {nbits} is outside 1..{MAX_NBITS}")
        self.url = str(url)
        self.nbits = nbits
        self.relevance = tuple(relevance)
        self.n_labels = n_labels
        self.chunk_rows = {"database": chunk_rows, "queries": query_chunk_rows}
        self.extra_attrs = dict(extra_attrs or {})
        self._stage = ExitStack()  # the staged directory of a local output: renamed into place by close()
        if _is_local(self.url):
            final = check_output(_local_path(self.url), "dataset", is_dataset, overwrite=overwrite)
            store = str(self._stage.enter_context(staged_directory(final)))
        else:
            store = self.url
        self.group = zarr.open_group(store=store, mode="w")
        self.writers: dict[str, _ArrayWriter] = {}
        self.fingerprints: dict[str, ArrayFingerprint] = {}
        self.modalities: dict[str, list[str]] = {}  # side -> modality names, in the order written

    def _writer(self, name: str, width: int | None, dtype, chunk_rows: int) -> _ArrayWriter:
        if name not in self.writers:
            array = _create_rows_array(self.group, name, width, dtype, chunk_rows)
            self.writers[name] = _ArrayWriter(array, chunk_rows)
        return self.writers[name]

    def add_codes(self, part: str, words: np.ndarray, modality: str | None = None) -> None:
        """Code rows of one side, or of one of its modalities (a dataset has modalities on both sides or none)."""
        name = f"{part}/codes" if modality is None else f"{part}/codes/{modality}"
        if modality is not None and modality not in self.modalities.setdefault(part, []):
            self.modalities[part].append(modality)
        self._writer(name, n_words(self.nbits), np.uint64, self.chunk_rows[part]).append(words)

    def add_labels(self, part: str, labels: np.ndarray) -> None:
        width = None if labels.ndim == 1 else labels.shape[1]
        dtype = np.int64 if labels.ndim == 1 else np.uint64
        self._writer(f"{part}/labels", width, dtype, self.chunk_rows[part]).append(labels)

    def add_features(self, part: str, features: np.ndarray) -> None:
        """Real-valued feature rows, stored in their own dtype (float32 or float64)."""
        self._writer(f"{part}/features", features.shape[1], features.dtype, self.chunk_rows[part]).append(features)

    def add_scores(self, scores: np.ndarray) -> None:
        """Real-valued query vectors (Q, B) for the asymmetric distance, float64."""
        self._writer("queries/scores", self.nbits, np.float64, self.chunk_rows["queries"]).append(
            np.ascontiguousarray(scores, dtype=np.float64))

    def add_relevant(self, indptr: np.ndarray, indices: np.ndarray, grades: np.ndarray | None) -> None:
        """Explicit ground truth as CSR over all queries (written whole; sizes are modest)."""
        self._writer(CSR[0], None, np.int64, self.chunk_rows["queries"]).append(indptr)
        self._writer(CSR[1], None, np.int64, CSR_CHUNK).append(indices)
        if grades is not None:
            self._writer(CSR[2], None, np.int64, CSR_CHUNK).append(grades)

    def close(self) -> str:
        for name, w in self.writers.items():
            self.fingerprints[name] = w.close()
        attrs = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "nbits": self.nbits,
            "relevance": list(self.relevance),
            "n_labels": self.n_labels,
            "fingerprints": {k: v.to_json() for k, v in sorted(self.fingerprints.items())},
            **({"modalities": self.modalities} if self.modalities else {}),
            **self.extra_attrs,
        }
        self.group.attrs.update(attrs)
        self._stage.close()
        return self.url

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:  # the staged directory is removed; the previous output stays
            self._stage.__exit__(exc_type, exc, tb)
        return False


def _chunk_file(name: str, ndim: int, index: int) -> str:
    """The path of one row chunk's file inside the dataset directory."""
    return f"{name}/c/{index}" + ("/0" if ndim == 2 else "")


def _rewritten_files(ds: Dataset, names) -> set[str]:
    """Chunk files an append rewrites: the partial last chunk of each appended array."""
    files = set()
    for name in names:
        fp = ds.fingerprints[name]
        if fp.rows % fp.chunk_rows:
            files.add(_chunk_file(name, ds.array(name).ndim, fp.rows // fp.chunk_rows))
    return files


def _link_tree(source: Path, target: Path, rewritten: set[str]) -> None:
    """Recreate ``source`` in ``target``: hard links for chunk files, real copies of metadata and ``rewritten``.

    Zarr's LocalStore writes a new file and renames it over the old one, so even a
    rewritten link would leave ``source`` intact; still, every file an append may
    rewrite is a real copy, so no write can reach the files of ``source``.
    """

    def link_or_copy(src, dst):
        rel = Path(src).relative_to(source).as_posix()
        if Path(src).name == "zarr.json" or rel in rewritten:
            return shutil.copy2(src, dst)
        os.link(src, dst)
        return dst

    shutil.copytree(source, target, copy_function=link_or_copy, dirs_exist_ok=True)


def _append_blocks(url, root: Path, name: str, fp: ArrayFingerprint, blocks) -> ArrayFingerprint:
    """Append an iterable of row blocks to one array of dataset ``url`` staged at ``root``; its new fingerprint."""
    array = zarr.open_array(store=str(root), path=name, mode="r+", config={"write_empty_chunks": True})
    writer = _ArrayWriter(array, fp.chunk_rows, fp.chunks, fp.rows)
    for block in blocks:
        if block.shape[1:] != array.shape[1:]:
            raise InputError(f"{url}: appended {name} rows have shape {block.shape[1:]}, dataset's {array.shape[1:]}")
        writer.append(block)
    return writer.close()


def append_database_rows(url, words: dict, labels) -> Dataset:
    """Append database rows (and their labels) to an existing local dataset, streaming; updates fingerprints.

    ``words``: {stored code array name (``database/codes``, or ``database/codes/<modality>`` for each
    modality): iterable of (n, W) uint64 row blocks}; ``labels``: an iterable of label blocks like the
    stored ones (None when the dataset has none). The new version is built in a staged sibling that
    hard-links the chunk files it keeps and copies only the files it rewrites, then renamed into
    place, so an interrupted or failed append leaves the previous complete dataset.
    """
    ds = open_dataset(url)
    if not _is_local(ds.url):
        raise InputError(f"{ds.url}: appending needs a dataset on the local filesystem")
    if ds.has("queries/relevant/indptr"):
        raise InputError(f"{url}: cannot append database rows to a dataset with explicit ground truth")
    if ds.has("database/labels") != (labels is not None):
        raise InputError(f"{url}: appended rows must have labels exactly when the dataset does")
    final = _local_path(ds.url)
    parts = {**words, **({"database/labels": labels} if labels is not None else {})}
    with staged_directory(final) as tmp:
        ds = open_dataset(url)  # again under the lock: the version this append extends
        _link_tree(final, tmp, _rewritten_files(ds, parts))
        group = zarr.open_group(store=str(tmp), mode="r+")
        fingerprints = dict(group.attrs["fingerprints"])
        for name, blocks in parts.items():
            fingerprints[name] = _append_blocks(url, tmp, name, ds.fingerprints[name], blocks).to_json()
        if len({fingerprints[name]["rows"] for name in parts}) > 1:
            raise InputError(f"{url}: appended codes and labels have different numbers of rows")
        group.attrs["fingerprints"] = fingerprints
    return open_dataset(url)


def replace_relevant(url, indptr: np.ndarray, indices: np.ndarray, attrs: dict) -> Dataset:
    """Write explicit ground truth (CSR, grade 1) into an existing local dataset, replacing any previous one.

    The new arrays are written beside the old ones and moved into place; the group
    attributes (``attrs``, e.g. ``relevance``, then the fingerprints) are updated last.
    """
    ds = open_dataset(url)
    if not _is_local(ds.url):
        raise InputError(f"{ds.url}: writing ground truth needs a dataset on the local filesystem")
    final = _local_path(ds.url) / "queries" / "relevant"
    fingerprints = {k: v for k, v in ds.attrs()["fingerprints"].items() if k not in CSR}
    with exclusive(_local_path(ds.url)):
        with staged_directory(final, lock=False) as tmp:
            group = zarr.open_group(store=str(tmp), mode="w")
            for name, values, rows in ((CSR[0], indptr, ds.chunk_rows("queries")), (CSR[1], indices, CSR_CHUNK)):
                writer = _ArrayWriter(_create_rows_array(group, name.rsplit("/", 1)[1], None, np.int64, rows), rows)
                writer.append(values)
                fingerprints[name] = writer.close().to_json()
        root = zarr.open_group(store=ds.url, mode="r+")
        root.attrs.update({**attrs, "fingerprints": dict(sorted(fingerprints.items()))})
    return open_dataset(ds.url)
