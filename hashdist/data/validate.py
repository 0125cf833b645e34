"""The one check of a dataset's group attributes: every attribute hashdist reads, its type and range, before any
of them is used. A malformed value (a hand-edited or damaged ``zarr.json``) is refused in one line naming the
file and the key (docs/errors.md, "Malformed files and extreme sizes")."""

from __future__ import annotations

import json
import re

from hashdist.errors import InputError

RELEVANCE_KINDS = ("class", "multilabel", "explicit")
LABELS = ("database/labels", "queries/labels")
RELEVANT = ("queries/relevant/indptr", "queries/relevant/indices")
_SHA256 = re.compile(r"[0-9a-f]{64}")
FIX = "rewrite the dataset with hashdist ingest"


def attributes_file(url: str, name: str | None = None) -> str:
    """The zarr.json that holds the attributes of the dataset ``url`` (or of its array ``name``)."""
    return f"{str(url).rstrip('/')}/{name + '/' if name else ''}zarr.json"


def _refuse(url: str, key: str, problem: str) -> InputError:
    return InputError(f"{attributes_file(url)}: attribute {key} {problem}; {FIX}")


def _shown(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _integer(url: str, key: str, value, low: int, high: int | None = None) -> int:
    """``value`` as an int in [low, high]; a bool, float or string is refused (JSON true is not 1 bit)."""
    if type(value) is not int or value < low or (high is not None and value > high):
        bounds = f"{low}..{high}" if high is not None else f">= {low}"
        raise _refuse(url, key, f"must be an integer {bounds}, got {_shown(value)}")
    return value


def _fingerprint(url: str, name: str, entry) -> dict:
    """One array's fingerprint: chunk_rows, rows and one SHA-256 per row chunk."""
    key = f"fingerprints[{name!r}]"
    if not isinstance(entry, dict):
        raise _refuse(url, key, f"must be an object, got {_shown(entry)}")
    for field in ("chunk_rows", "rows", "chunks"):
        if field not in entry:
            raise _refuse(url, key, f"has no {field!r}")
    chunk_rows = _integer(url, f"{key}.chunk_rows", entry["chunk_rows"], 1)
    rows = _integer(url, f"{key}.rows", entry["rows"], 0)
    chunks = entry["chunks"]
    if not isinstance(chunks, list) or not all(isinstance(c, str) and _SHA256.fullmatch(c) for c in chunks):
        raise _refuse(url, f"{key}.chunks", "must be a list of SHA-256 hex digests")
    if len(chunks) != -(-rows // chunk_rows):
        raise _refuse(url, f"{key}.chunks", f"has {len(chunks)} digests for {rows} rows of {chunk_rows} a chunk")
    return {"chunk_rows": chunk_rows, "rows": rows, "chunks": chunks}


def _relevance(url: str, value) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(k, str) and k in RELEVANCE_KINDS for k in value) \
            or len(set(value)) != len(value) or {"class", "multilabel"} <= set(value):
        raise _refuse(url, "relevance", f"must be a list of distinct kinds of {', '.join(RELEVANCE_KINDS)} (class "
                      f"or multilabel, not both), got {_shown(value)}")
    return tuple(value)


def _modalities(url: str, value) -> dict[str, tuple[str, ...]]:
    """{} or {"queries": [names], "database": [names]}, each name an identifier."""
    if value is None or value == {}:
        return {}
    if not isinstance(value, dict) or set(value) != {"queries", "database"} or not all(
            isinstance(names, list) and names and all(isinstance(n, str) and n.isidentifier() for n in names)
            for names in value.values()):
        raise _refuse(url, "modalities", 'must be {"queries": [names], "database": [names]}, got '
                      f"{_shown(value)}")
    return {side: tuple(names) for side, names in value.items()}


def _needed_arrays(relevance: tuple[str, ...], modalities: dict) -> list[tuple[str, str]]:
    """(array, why) for every array whose fingerprint the attributes must hold."""
    if modalities:
        needed = [(f"{side}/codes/{name}", "the codes") for side, names in modalities.items() for name in names]
    else:
        needed = [("database/codes", "the codes"), ("queries/codes", "the codes")]
    for kind in relevance:
        arrays = RELEVANT if kind == "explicit" else LABELS
        needed += [(name, f"relevance {kind!r}") for name in arrays]
    return needed


def dataset_attributes(url: str, attrs, max_nbits: int) -> dict:
    """The checked attributes of the dataset at ``url``: nbits, relevance (a tuple of kinds), n_labels,
    fingerprints ({array: {chunk_rows, rows, chunks}}) and modalities ({side: names}, or {})."""
    if not isinstance(attrs, dict):
        raise InputError(f"{attributes_file(url)}: attributes must be a JSON object; {FIX}")
    for key in ("nbits", "relevance", "fingerprints"):
        if key not in attrs:
            raise _refuse(url, key, "is missing")
    nbits = _integer(url, "nbits", attrs["nbits"], 1, max_nbits)
    relevance = _relevance(url, attrs["relevance"])
    n_labels = _integer(url, "n_labels", attrs.get("n_labels", 0), 1 if "multilabel" in relevance else 0)
    modalities = _modalities(url, attrs.get("modalities"))
    if not isinstance(attrs["fingerprints"], dict):
        raise _refuse(url, "fingerprints", f"must be an object, got {_shown(attrs['fingerprints'])}")
    fingerprints = {str(name): _fingerprint(url, name, entry) for name, entry in attrs["fingerprints"].items()}
    for name, why in _needed_arrays(relevance, modalities):
        if name not in fingerprints:
            raise _refuse(url, "fingerprints", f"has no entry {name!r} (needed by {why})")
    return {"nbits": nbits, "relevance": relevance, "n_labels": n_labels, "fingerprints": fingerprints,
            "modalities": modalities}


def label_layout_problem(kind: str, ndim: int, dtype, width: int, label_words: int) -> str | None:
    """What is wrong with a labels array of this shape and dtype for relevance ``kind``, or None."""
    if kind == "class" and (ndim != 1 or dtype.kind not in "iu"):
        return f"class labels must be 1-D integers, found {ndim}-D {dtype}"
    if kind == "multilabel" and (ndim != 2 or dtype != "uint64" or width != label_words):
        return f"multi-hot labels must be (rows, {label_words}) uint64, found {ndim}-D {dtype} of width {width}"
    return None
