"""Ingest codes, labels, ground truth and features from .npy/.npz files into a dataset, streaming.

``.npy`` inputs are memory-mapped and converted chunk by chunk, so a database of
any size is ingested in bounded memory. Every input is validated before the
dataset is renamed into place; on any error nothing is written. Pickled object
arrays are refused, never loaded.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from hashdist.data.atomic import check_apart
from hashdist.data.bits import (
    label_kind,
    numpy_packed_to_words,
    pack_code_block,
    pack_label_block,
)
from hashdist.data.dataset import MAX_NBITS, DatasetWriter
from hashdist.data.inputs import check_scores, load_array
from hashdist.defaults import DEFAULT_CHUNK_ROWS, DEFAULT_QUERY_CHUNK_ROWS
from hashdist.errors import InputError, check_integer, is_integer


def _check_paths(**arguments) -> None:
    """Refuse an array (or anything else) passed where a file path is expected, without printing it."""
    for name, value in arguments.items():
        if value is not None and not isinstance(value, (str, os.PathLike)):
            kind = type(value).__qualname__
            if type(value).__module__ != "builtins":
                kind = f"{type(value).__module__.partition('.')[0]}.{kind}"
            ext = ".npz" if name == "query_relevant" else ".npy"
            raise InputError(f"{name}: expected a path to a {ext} file, got {kind}; for arrays use "
                             "hashdist.evaluate_codes")


def parse_modal_paths(values, flag: str):
    """A code option's values: one plain path, or ``NAME=PATH`` per modality ({name: path}); None if not given.

    A name is a Python identifier (``image``, ``text``); a value that names an existing file is a path even if
    it holds ``=``."""
    if values is None or isinstance(values, (str, os.PathLike)):
        return values
    values = list(values)
    plain = [v for v in values if "=" not in str(v) or Path(v).exists()]
    if len(plain) == len(values):  # plain paths: the last one counts, as for any repeated option
        return values[-1]
    named: dict[str, str] = {}
    for value in values:
        name, eq, path = str(value).partition("=")
        if not eq or not path:
            raise InputError(f"{flag} {value}: with several code files give each as NAME=PATH, e.g. image=Q_img.npy")
        check_modality_name(name, flag)
        if name in named:
            raise InputError(f"{flag}: modality {name!r} is given twice")
        named[name] = path
    return named


def check_modality_name(name, where: str) -> str:
    if not isinstance(name, str) or not name.isidentifier():
        raise InputError(f"{where}: modality name {name!r} is not an identifier (letters, digits, _; e.g. image)")
    return name


def _modal(paths, flag: str) -> dict:
    """{modality or None: (memory-mapped array, path)} of a code option."""
    if isinstance(paths, dict):
        if not paths:
            raise InputError(f"{flag}: no modality given")
        return {check_modality_name(name, flag): (load_array(path), path) for name, path in paths.items()}
    return {None: (load_array(paths), paths)}


def _check_modal_codes(codes: dict, packed: bool, nbits: int | None) -> int:
    """Every code array of both sides: the same width B, the same rows within a side, modalities on both sides
    or on neither; returns B."""
    if (None in codes["database"]) != (None in codes["queries"]):
        raise InputError("--query-codes and --db-codes: give modalities (NAME=PATH) on both sides or on neither")
    width = {}
    for part in ("database", "queries"):
        (first, first_path), *rest = codes[part].values()
        width[part] = _code_width(first, first_path, packed, nbits)
        for arr, path in rest:
            if (bits := _code_width(arr, path, packed, nbits)) != width[part]:
                raise InputError(f"{path}: codes have {bits} bits but {first_path} has {width[part]}")
            if arr.shape[0] != first.shape[0]:
                raise InputError(f"{path}: {arr.shape[0]} rows but {first_path} has {first.shape[0]} (the "
                                 f"modalities of the {part} describe the same items)")
    if width["queries"] != width["database"]:
        raise InputError(f"{next(iter(codes['queries'].values()))[1]}: queries have {width['queries']} bits but the "
                         f"database codes {next(iter(codes['database'].values()))[1]} have {width['database']}")
    return width["database"]


def _code_width(arr: np.ndarray, path, packed: bool, nbits: int | None) -> int:
    if arr.ndim != 2:
        raise InputError(f"{path}: codes must be a 2-D array (rows, bits), got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise InputError(f"{path}: codes are empty (shape {arr.shape})")
    if not packed:
        if arr.shape[1] > MAX_NBITS:
            raise InputError(f"{path}: {arr.shape[1]} bits per code exceeds the maximum {MAX_NBITS}")
        if nbits is not None and nbits != arr.shape[1]:
            raise InputError(f"--nbits {nbits}: the codes in {path} have {arr.shape[1]} bits (--nbits is for --packed)")
        return arr.shape[1]
    if nbits is None:
        raise InputError("--packed needs --nbits B")
    if not is_integer(nbits) or not 1 <= nbits <= MAX_NBITS:
        raise InputError(f"--nbits {nbits}: must be an integer in 1..{MAX_NBITS}")
    if arr.dtype != np.uint8:
        raise InputError(f"{path}: packed codes must be uint8 (numpy packbits), got {arr.dtype}")
    if arr.shape[1] != -(-nbits // 8):
        raise InputError(f"{path}: packed rows have {arr.shape[1]} bytes; --nbits {nbits} needs {-(-nbits // 8)}")
    return nbits


def _code_blocks(arr, path, packed, nbits, chunk_rows):
    """Yield uint64 word blocks of chunk_rows rows, validating values as they stream."""
    seen: frozenset = frozenset()
    for start in range(0, arr.shape[0], chunk_rows):
        block = np.asarray(arr[start : start + chunk_rows])
        if packed:
            yield numpy_packed_to_words(block, nbits, str(path))
        else:
            words, seen = pack_code_block(block, str(path), seen)
            yield words


def _label_blocks(arr, path, kind, chunk_rows):
    for start in range(0, arr.shape[0], chunk_rows):
        yield pack_label_block(np.asarray(arr[start : start + chunk_rows]), path, kind)


def _check_features(arr, path, codes, codes_path) -> None:
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise InputError(f"{path}: features must be a 2-D array (rows, dimensions), got shape {arr.shape}")
    if arr.dtype not in (np.float32, np.float64):
        raise InputError(f"{path}: features must be float32 or float64, got {arr.dtype}")
    if arr.shape[0] != codes.shape[0]:
        raise InputError(f"{path}: {arr.shape[0]} feature rows but {codes.shape[0]} codes in {codes_path}")


def _feature_blocks(arr, path, chunk_rows):
    """Yield feature blocks of chunk_rows rows, refusing NaN and infinity as they stream."""
    for start in range(0, arr.shape[0], chunk_rows):
        block = np.asarray(arr[start : start + chunk_rows])
        if not np.isfinite(block).all():
            row = start + int(np.flatnonzero(~np.isfinite(block).all(axis=1))[0])
            raise InputError(f"{path}: features contain NaN or infinity (row {row})")
        yield block


def load_relevant(path, n_queries: int, n_database: int):
    """Explicit ground truth from an .npz with indptr, indices and optional grades; sorted per query."""
    path = str(path)
    if not Path(path).is_file():
        raise InputError(f"{path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except Exception:
        raise InputError(f"{path}: not a readable .npz file with indptr and indices (pickles are refused)") from None
    if "indptr" not in arrays or "indices" not in arrays:
        raise InputError(f"{path}: needs arrays 'indptr' and 'indices' (CSR), has {', '.join(arrays)}")
    return check_relevant(arrays, path, n_queries, n_database)


def check_relevant(arrays: dict, path, n_queries: int, n_database: int):
    """Validate CSR ground truth (``indptr``, ``indices``, optional ``grades``); sort each query's list.

    ``path`` names the input in errors (a file, or an argument of the Python API).
    """
    indptr, indices = np.asarray(arrays["indptr"]), np.asarray(arrays["indices"])
    grades = None if arrays.get("grades") is None else np.asarray(arrays["grades"])
    if indptr.ndim != 1 or indptr.dtype.kind not in "iu" or indices.dtype.kind not in "iu":
        raise InputError(f"{path}: indptr and indices must be 1-D integer arrays")
    if len(indptr) != n_queries + 1 or indptr[0] != 0 or indptr[-1] != len(indices):
        raise InputError(f"{path}: indptr must have n_queries + 1 = {n_queries + 1} entries from 0 to len(indices)")
    if (np.diff(indptr) < 0).any():
        raise InputError(f"{path}: indptr is not monotone")
    if len(indices) and (indices.min() < 0 or indices.max() >= n_database):
        raise InputError(f"{path}: indices out of range 0..{n_database - 1}")
    if grades is not None and (grades.shape != indices.shape or grades.dtype.kind not in "iu" or (grades < 0).any()):
        raise InputError(f"{path}: grades must be non-negative integers, one per index")
    indices = indices.astype(np.int64).copy()
    grades = None if grades is None else grades.astype(np.int64).copy()
    for q in range(n_queries):
        lo, hi = indptr[q], indptr[q + 1]
        order = np.argsort(indices[lo:hi], kind="stable")
        indices[lo:hi] = indices[lo:hi][order]
        if grades is not None:
            grades[lo:hi] = grades[lo:hi][order]
        if (np.diff(indices[lo:hi]) == 0).any():
            raise InputError(f"{path}: query {q} lists a database index twice")
    return indptr.astype(np.int64), indices, grades


def ingest(
    out,
    db_codes,
    query_codes,
    *,
    db_labels=None,
    query_labels=None,
    query_relevant=None,
    db_features=None,
    query_features=None,
    query_scores=None,
    relevance: str | None = None,
    packed: bool = False,
    nbits: int | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    query_chunk_rows: int = DEFAULT_QUERY_CHUNK_ROWS,
    overwrite: bool = False,
) -> str:
    """Write a dataset from code (and label / ground-truth / feature) files; returns its path. ``db_codes`` and
    ``query_codes``: a path each, or {modality: path} on both sides for a dataset with modalities."""
    inputs = dict(db_codes=db_codes, query_codes=query_codes, db_labels=db_labels, query_labels=query_labels,
                  query_relevant=query_relevant, db_features=db_features, query_features=query_features,
                  query_scores=query_scores)
    _check_paths(**{k: v for k, v in inputs.items() if not isinstance(v, dict)})
    check_apart(out, [p for v in inputs.values() for p in (v.values() if isinstance(v, dict) else [v])])
    check_integer(chunk_rows, "--chunk-rows")
    check_integer(query_chunk_rows, "--query-chunk-rows")
    modal = {"database": _modal(db_codes, "--db-codes"), "queries": _modal(query_codes, "--query-codes")}
    b_db = _check_modal_codes(modal, packed, nbits)
    if None not in modal["queries"] and query_scores is not None:
        raise InputError("--query-scores: not available for a dataset with modalities")
    codes = {part: next(iter(arrays.values())) for part, arrays in modal.items()}  # the rows labels must match
    labels = _load_pair(codes, db_labels, query_labels, "labels", _check_label_pair)
    features = _load_pair(codes, db_features, query_features, "features", _check_feature_pair)
    if not labels and not features and query_relevant is None:
        raise InputError("no relevance information: give --db-labels and --query-labels, --query-relevant, "
                         "or --db-features and --query-features (for hashdist groundtruth)")
    n_queries, n_database = codes["queries"][0].shape[0], codes["database"][0].shape[0]
    scores = None if query_scores is None else check_scores(load_array(query_scores), b_db, n_queries,
                                                            str(query_scores))
    csr = None if query_relevant is None else load_relevant(query_relevant, n_queries, n_database)
    kinds = _relevance_kinds(labels["database"][2] if labels else None, csr is not None, relevance)
    n_labels = labels["database"][0].shape[1] if "multilabel" in kinds else 0
    with DatasetWriter(out, nbits=b_db, relevance=kinds, n_labels=n_labels, chunk_rows=chunk_rows,
                       query_chunk_rows=query_chunk_rows, overwrite=overwrite) as writer:
        for part in ("database", "queries"):
            rows = writer.chunk_rows[part]
            for modality, arrays in modal[part].items():
                for words in _code_blocks(*arrays, packed, b_db, rows):
                    writer.add_codes(part, words, modality)
            for block in _label_blocks(*labels[part], rows) if labels else ():
                writer.add_labels(part, block)
            for block in _feature_blocks(*features[part], rows) if features else ():
                writer.add_features(part, block)
        if csr is not None:
            writer.add_relevant(*csr)
        if scores is not None:
            writer.add_scores(scores)
    return str(out)


def _load_pair(codes: dict, db_path, query_path, what: str, check) -> dict:
    """The database's and the queries' arrays of one kind (labels, features), checked against each other and
    against their codes by ``check``: {part: (array, path, *what check adds)}; {} when neither is given."""
    if (db_path is None) != (query_path is None):
        raise InputError(f"--db-{what} and --query-{what} must be given together")
    if db_path is None:
        return {}
    loaded = {"database": (load_array(db_path), db_path), "queries": (load_array(query_path), query_path)}
    extra = check(loaded, codes)
    return {part: (*loaded[part], *extra) for part in loaded}


def _check_label_pair(labels: dict, codes: dict) -> tuple[str]:
    (dl, db_labels), (ql, query_labels) = labels["database"], labels["queries"]
    kind = label_kind(dl, db_labels)
    if label_kind(ql, query_labels) != kind or dl.shape[1:] != ql.shape[1:]:
        raise InputError(f"{query_labels}: labels of shape {ql.shape} do not match {db_labels} of shape {dl.shape}")
    for part in labels:
        (arr, path), (words, codes_path) = labels[part], codes[part]
        if arr.shape[0] != words.shape[0]:
            raise InputError(f"{path}: {arr.shape[0]} labels but {words.shape[0]} codes in {codes_path}")
    return (kind,)


def _check_feature_pair(features: dict, codes: dict) -> tuple:
    for part in features:
        _check_features(*features[part], *codes[part])
    (df, db_features), (qf, query_features) = features["database"], features["queries"]
    if qf.shape[1] != df.shape[1]:
        raise InputError(f"{query_features}: queries have {qf.shape[1]} feature dimensions but {db_features} has "
                         f"{df.shape[1]}")
    return ()


def _relevance_kinds(labels: str | None, explicit: bool, relevance: str | None) -> tuple[str, ...]:
    """The relevance kinds the inputs support (the labels' kind, explicit ground truth), ``relevance`` (the
    default kind) first."""
    kinds = ([labels] if labels else []) + (["explicit"] if explicit else [])
    if relevance is not None:
        if relevance not in kinds:
            raise InputError(f"--relevance {relevance}: the inputs provide {', '.join(kinds) or 'no relevance data'}")
        kinds.remove(relevance)
        kinds.insert(0, relevance)
    return tuple(kinds)


def _check_append_labels(arr, path, ds) -> str:
    """The kind of appended labels, refusing a kind or width that differs from the dataset's labels."""
    kind = label_kind(arr, path)
    if not ds.has("database/labels"):
        raise InputError(f"{path}: labels given but the dataset {ds.url} has no database labels")
    stored = "class" if ds.array("database/labels").ndim == 1 else "multilabel"
    if kind == "class" and stored == "multilabel":
        raise InputError(f"{path}: 1-D class labels but the dataset's labels are multi-hot with {ds.n_labels} columns")
    if kind == "multilabel" and stored == "class":
        raise InputError(f"{path}: {arr.shape} multi-hot labels but the dataset has 1-D class labels")
    if kind == "multilabel" and arr.shape[1] != ds.n_labels:
        raise InputError(f"{path}: {arr.shape} multi-hot labels but the dataset has {ds.n_labels} label columns")
    return kind


def append(dataset, db_codes, db_labels=None, *, packed: bool = False, nbits: int | None = None) -> str:
    """Append database rows from files to an existing dataset (``hashdist ingest --append``), streaming.
    ``db_codes``: a path, or {modality: path} for each of a dataset's database modalities.

    ``nbits``, if given, must be the dataset's. Every check that needs only shapes runs before anything is
    written; values are validated block by block as they are written into the staged new version.
    """
    from hashdist.data.dataset import append_database_rows, open_dataset

    _check_paths(db_labels=db_labels, **({} if isinstance(db_codes, dict) else {"db_codes": db_codes}))
    ds = open_dataset(dataset)
    if ds.has("database/features"):
        raise InputError(f"{dataset}: cannot append database rows to a dataset with features")
    if nbits is not None and nbits != ds.nbits:
        raise InputError(f"--nbits {nbits}: {dataset} has {ds.nbits}-bit codes")
    modal = _modal(db_codes, "--db-codes")
    expected = set(ds.modalities.get("database", ())) or {None}
    if set(modal) != expected:
        have = ", ".join(sorted(m for m in expected if m)) or "none"
        raise InputError(f"--db-codes: the dataset's database modalities are {have}; append codes for exactly those"
                         + (" as NAME=PATH" if None not in expected else " as one plain path"))
    first, first_path = next(iter(modal.values()))
    for arr, path in modal.values():
        width = _code_width(arr, path, packed, ds.nbits if packed else None)
        if width != ds.nbits:
            raise InputError(f"{path}: codes have {width} bits but the dataset has {ds.nbits}")
        if arr.shape[0] != first.shape[0]:
            raise InputError(f"{path}: {arr.shape[0]} rows but {first_path} has {first.shape[0]}")
    rows = ds.chunk_rows("database")
    labels = None
    if db_labels is not None:
        arr = load_array(db_labels)
        if arr.shape[0] != first.shape[0]:
            raise InputError(f"{db_labels}: {arr.shape[0]} labels but {first.shape[0]} codes in {first_path}")
        labels = _label_blocks(arr, db_labels, _check_append_labels(arr, db_labels, ds), rows)
    words = {("database/codes" if m is None else f"database/codes/{m}"): _code_blocks(arr, path, packed, ds.nbits, rows)
             for m, (arr, path) in modal.items()}
    append_database_rows(ds.url, words, labels)
    return ds.url


class _Rows:
    """Rows ``indices`` (sorted) of a memory-mapped array, sliceable like an array: reads only those rows."""

    def __init__(self, array: np.ndarray, indices: np.ndarray):
        self.array, self.indices = array, indices
        self.shape = (len(indices), *array.shape[1:])
        self.ndim, self.dtype = array.ndim, array.dtype

    def __getitem__(self, rows: slice) -> np.ndarray:
        return np.asarray(self.array[self.indices[rows]])


def split_roles(strategy: str, validation: bool) -> tuple[str, str]:
    """(queries role, database role) of a split run: the test pair, or with ``validation`` the validation pair."""
    if validation:
        return "validation_queries", "validation_database"
    return "test_queries", "database" if strategy == "standard" else "test_database"


def split_record(splits, attrs: dict, strategy: str, run: int, validation: bool, roles: dict) -> dict:
    """A split run's dataset's ``split`` attribute: the store, strategy, run, its two roles, the store's seed
    (from its attributes ``attrs``) and the digest of the two index arrays (``roles``: from
    :func:`hashdist.data.splits.read_split`)."""
    from hashdist.data.dataset import chunk_digest, combine_digests

    query_role, db_role = split_roles(strategy, validation)
    return {"splits": str(splits), "strategy": strategy, "run": int(run), "queries": query_role,
            "database": db_role, "seed": attrs["seed"],
            "indices_sha256": combine_digests((chunk_digest(roles[query_role]), chunk_digest(roles[db_role])))}


def ingest_split(out, codes, labels, splits, *, strategy: str, run: int, validation: bool = False,
                 packed: bool = False, nbits: int | None = None, chunk_rows: int = DEFAULT_CHUNK_ROWS,
                 query_chunk_rows: int = DEFAULT_QUERY_CHUNK_ROWS, overwrite: bool = False) -> str:
    """Write the dataset of one split run from pooled code and label files (``hashdist ingest --splits``).

    Queries are the run's test queries and the database its database (``standard``) or test database
    (``improved``); with ``validation``, the validation queries and validation database. Rows are read
    straight from the memory-mapped pooled files, chunk by chunk. The dataset records the split in its
    ``split`` attribute (store, strategy, run, roles, seed and the digest of the two index arrays).
    """
    from hashdist.data.splits import check_drawn_from, read_split, store_attrs

    _check_paths(codes=codes, labels=labels)
    check_apart(out, (codes, labels, splits))
    roles = read_split(splits, strategy, run)  # validates the store, the strategy and the run index
    attrs = store_attrs(splits)
    query_role, db_role = split_roles(strategy, validation)
    all_codes, all_labels = load_array(codes), load_array(labels)
    n_items = attrs["n_items"]
    for arr, path in ((all_codes, codes), (all_labels, labels)):
        if arr.shape[0] != n_items:
            raise InputError(f"{path}: {arr.shape[0]} rows but the splits in {splits} cover {n_items} items")
    width = _code_width(all_codes, codes, packed, nbits)
    kind = label_kind(all_labels, labels)
    check_drawn_from(splits, attrs, all_labels, str(labels))
    if len(roles[query_role]) == 0 or len(roles[db_role]) == 0:
        raise InputError(f"--strategy {strategy} --run {run}: the {query_role} or {db_role} set of {splits} is empty")
    record = split_record(splits, attrs, strategy, run, validation, roles)
    n_labels = all_labels.shape[1] if kind == "multilabel" else 0
    with DatasetWriter(out, nbits=width, relevance=(kind,), n_labels=n_labels, chunk_rows=chunk_rows,
                       query_chunk_rows=query_chunk_rows, overwrite=overwrite, extra_attrs={"split": record}) as writer:
        for part, role in (("database", db_role), ("queries", query_role)):
            rows = writer.chunk_rows[part]
            for words in _code_blocks(_Rows(all_codes, roles[role]), codes, packed, width, rows):
                writer.add_codes(part, words)
            for block in _label_blocks(_Rows(all_labels, roles[role]), labels, kind, rows):
                writer.add_labels(part, block)
    return str(out)

