"""Checks of the split index files a paper's repository ships (docs/metrics.md, section 5c; ``hashdist split
--check``, docs/cli.md).

A split is a set of query indices, a set of database indices and, optionally, a set of training indices, all
into one pool of N items (image-text pairs for cross-modal data: one index names a pair). Index files are read
without pickles: ``.npy`` (or ``.npz`` as ``file.npz:NAME``), text (``.txt``, ``.csv``, ``.tsv``, ``.list``:
integers separated by white space or commas, ``#`` starts a comment) and MATLAB ``.mat`` (``file.mat:NAME``
names the variable; MATLAB v7.3 files are HDF5 and need h5py). A vector may be stored as a row or a column.

Conventions: ``index_base`` 0 (Python) or 1 (MATLAB) is subtracted from every index first. Sizes count
entries, duplicates included; the overlaps and per-label counts count distinct in-range items. Every split must
keep four rules: no duplicate entry within a set, every index in 0..N-1 (with N unknown only negatives are
caught), no query in the database (a leak) and no training item among the queries. A protocol
(hashdist.data.protocols) adds its set sizes and where its training set lies: inside the database ("subset"),
the database itself ("database") or apart from it ("held_out"). Facts about the pool (its size, its number of
labels) that differ from the protocol's are notes, not broken rules: sources differ there.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from hashdist.data.inputs import load_array
from hashdist.data.protocols import Protocol, expected_sizes, get_protocol, training_rule
from hashdist.errors import InputError, check_integer

ROLES = ("queries", "database", "training")
OPTIONS = {"queries": "--query-index", "database": "--db-index", "training": "--train-index"}
TEXT_SUFFIXES = (".txt", ".csv", ".tsv", ".list")
LABEL_BLOCK_ROWS = 65536  # multi-hot rows read at a time
MAX_EXACT_FLOAT = 2**53  # float indices above this are not exact integers


def _split_spec(spec: str, suffix: str) -> tuple[str, str | None]:
    """("path", "NAME") of ``path<suffix>:NAME``; ("path", None) without a name."""
    name, sep, var = spec.partition(suffix + ":")
    return (name + suffix, var) if sep else (spec, None)


def read_indices(spec, option: str) -> np.ndarray:
    """The indices a file holds, as a 1-D int64 array (no base applied); InputError naming ``option`` and the
    fix for anything else. ``spec`` is a path, ``file.mat:NAME`` or ``file.npz:NAME``."""
    spec = os.fspath(spec)
    mat_path, var = _split_spec(spec, ".mat")
    if mat_path.lower().endswith(".mat"):
        array = _read_mat(mat_path, var, option)
    elif spec.lower().endswith(TEXT_SUFFIXES):
        array = _read_text(spec, option)
    elif spec.lower().endswith(".npy") or ".npz" in spec.lower():
        try:
            array = load_array(spec)
        except InputError as exc:
            raise InputError(f"{option} {exc}") from None
    else:
        raise InputError(f"{option} {spec}: unknown index file type (use .npy, .npz, .txt, .csv or .mat)")
    return _as_indices(array, option, spec)


def _read_text(path: str, option: str) -> np.ndarray:
    """Integers separated by white space or commas; ``#`` starts a comment. Integral floats (np.savetxt's
    default format) are accepted."""
    if not Path(path).is_file():
        raise InputError(f"{option} {path}: no such file")
    try:
        text = Path(path).read_text()
    except UnicodeDecodeError:
        raise InputError(f"{option} {path}: not a text file of indices (use .npy for binary data)") from None
    except OSError as exc:
        raise InputError(f"{option} {path}: cannot read it ({exc.strerror})") from None
    tokens = " ".join(line.partition("#")[0] for line in text.splitlines()).replace(",", " ").split()
    try:
        return np.array(tokens, dtype=np.int64)
    except (ValueError, OverflowError):
        pass
    for token in tokens:
        try:
            float(token)
        except ValueError:
            raise InputError(f"{option} {path}: {token[:40]!r} is not an index (the file must hold only integers)") \
                from None
    return np.array(tokens, dtype=np.float64)


def _mat_variables(path: str, option: str) -> list[str] | None:
    """The variable names of a MATLAB v4-v7 file; None for a v7.3 (HDF5) file."""
    from scipy.io import whosmat

    if not Path(path).is_file():
        raise InputError(f"{option} {path}: no such file")
    try:
        return [entry[0] for entry in whosmat(path)]
    except NotImplementedError:  # scipy's answer to a v7.3 file
        return None
    except Exception as exc:
        raise InputError(f"{option} {path}: not a readable .mat file ({type(exc).__name__}: {exc})") from None


def _pick_variable(names: list[str], var: str | None, path: str, option: str) -> str:
    if not names:
        raise InputError(f"{option} {path}: holds no variables")
    if var is None:
        if len(names) != 1:
            raise InputError(f"{option} {path}: holds {len(names)} variables ({', '.join(names)}); name one as "
                             f"{path}:NAME")
        return names[0]
    if var not in names:
        raise InputError(f"{option} {path}: has no variable {var!r} (it has {', '.join(names)}); name one as "
                         f"{path}:NAME")
    return var


def _read_mat(path: str, var: str | None, option: str) -> np.ndarray:
    """One variable of a .mat file: scipy.io.loadmat for v4-v7, h5py (if installed) for v7.3."""
    from scipy.io import loadmat

    names = _mat_variables(path, option)
    if names is None:
        return _read_mat73(path, var, option)
    name = _pick_variable(names, var, path, option)
    try:
        value = loadmat(path, variable_names=[name])[name]
    except Exception as exc:
        raise InputError(f"{option} {path}:{name}: cannot read it ({type(exc).__name__}: {exc})") from None
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
        raise InputError(f"{option} {path}:{name}: not a numeric array (a cell array or struct?); save the "
                         "indices as a numeric vector")
    return value


def _read_mat73(path: str, var: str | None, option: str) -> np.ndarray:
    """One dataset of a MATLAB v7.3 (HDF5) file, read with h5py when it is installed."""
    try:
        import h5py
    except ImportError:
        raise InputError(f"{option} {path}: a MATLAB v7.3 (HDF5) file, which needs h5py (not installed): "
                         "pip install h5py, or save it in MATLAB with save(..., '-v7')") from None
    try:
        with h5py.File(path, "r") as f:
            names = [key for key, item in f.items() if isinstance(item, h5py.Dataset) and not key.startswith("#")]
            name = _pick_variable(names, var, path, option)
            value = np.asarray(f[name][()])
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"{option} {path}: not a readable MATLAB v7.3 file ({type(exc).__name__}: {exc})") from None
    if value.dtype.kind not in "biuf":
        raise InputError(f"{option} {path}:{name}: not a numeric array; save the indices as a numeric vector")
    return value


def _as_indices(array, option: str, source: str) -> np.ndarray:
    """``array`` as a 1-D int64 vector (a row or column matrix is flattened); InputError otherwise."""
    arr = np.asarray(array)
    if arr.ndim == 2 and 1 in arr.shape:
        arr = arr.reshape(-1)
    if arr.ndim != 1:
        raise InputError(f"{option} {source}: indices must be a vector, got shape {arr.shape}")
    if arr.dtype.kind == "b":
        raise InputError(f"{option} {source}: a boolean mask, not indices (save numpy.flatnonzero(mask))")
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.round(arr)) | (np.abs(arr) >= MAX_EXACT_FLOAT)
        if bad.any():
            raise InputError(f"{option} {source}: indices must be whole numbers, found {arr[bad][0].item()!r}")
    elif arr.dtype.kind not in "iu":
        raise InputError(f"{option} {source}: indices must be integers, got dtype {arr.dtype}")
    if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise InputError(f"{option} {source}: an index is larger than any pool")
    if arr.size == 0:
        raise InputError(f"{option} {source}: holds no indices")
    return arr.astype(np.int64)


def _load_labels(labels) -> tuple[str, np.ndarray]:
    """("class", 1-D integer classes) or ("multilabel", 2-D 0/1 rows) of the pool, checked like hashdist split's."""
    name = "--labels"
    if isinstance(labels, (str, os.PathLike)):
        name, labels = f"--labels {os.fspath(labels)}", load_array(labels)
    arr = np.asarray(labels)
    if arr.ndim not in (1, 2) or arr.shape[0] == 0:
        raise InputError(f"{name}: labels must be 1-D (classes) or 2-D (multi-hot) with at least one item, "
                         f"got shape {arr.shape}")
    if arr.ndim == 1:
        if arr.dtype.kind not in "iu":
            raise InputError(f"{name}: class labels must be integers, got {arr.dtype}")
        return "class", arr
    if arr.dtype.kind not in "biuf" or arr.shape[1] == 0:
        raise InputError(f"{name}: multi-label matrix must be numeric 0/1 with at least one column")
    for start in range(0, arr.shape[0], LABEL_BLOCK_ROWS):
        if not np.isin(np.asarray(arr[start : start + LABEL_BLOCK_ROWS]), (0, 1)).all():
            raise InputError(f"{name}: multi-label matrix must contain only 0 and 1")
    return "multilabel", arr


def _pool(labels, n_items) -> dict:
    """The pool: its size N (None when unknown), where N came from, and the labels."""
    if labels is not None and n_items is not None:
        raise InputError("give at most one of --labels and --n-items (the labels give N)")
    if labels is not None:
        kind, values = _load_labels(labels)
        return {"n_items": int(values.shape[0]), "from": "--labels", "label_kind": kind, "values": values}
    if n_items is not None:
        return {"n_items": check_integer(n_items, "--n-items"), "from": "--n-items", "label_kind": None,
                "values": None}
    return {"n_items": None, "from": None, "label_kind": None, "values": None}


def _read_set(value, option: str) -> tuple[np.ndarray, str]:
    """(indices, description) of a file spec or an array-like given in Python."""
    if isinstance(value, (str, os.PathLike)):
        return read_indices(value, option), os.fspath(value)
    return _as_indices(value, option, "(array)"), "(array)"


def _set_stats(idx: np.ndarray, n: int | None) -> tuple[dict, np.ndarray]:
    """({size, distinct, duplicates, out_of_range}, the sorted distinct in-range indices) of one set."""
    in_range = (idx >= 0) if n is None else (idx >= 0) & (idx < n)
    distinct = np.unique(idx)
    stats = {"size": int(idx.size), "distinct": int(distinct.size), "duplicates": int(idx.size - distinct.size),
             "out_of_range": int(idx.size - in_range.sum())}
    return stats, np.unique(idx[in_range])


def _overlaps(items: dict, n: int | None) -> dict:
    """Counts of distinct in-range items shared by the sets (and, N known, in no set)."""
    q, db = items["queries"], items["database"]
    result = {"queries_in_database": int(np.intersect1d(q, db, assume_unique=True).size)}
    if "training" in items:
        t = items["training"]
        inside = int(np.intersect1d(t, db, assume_unique=True).size)
        result.update(training_in_queries=int(np.intersect1d(t, q, assume_unique=True).size),
                      training_in_database=inside, training_outside_database=int(t.size - inside),
                      database_outside_training=int(db.size - inside))
    if n is not None:
        covered = np.unique(np.concatenate(list(items.values())))
        result["in_no_set"] = int(n - covered.size)
    return result


def _rule(name: str, ok: bool | None, detail: str) -> dict:
    return {"rule": name, "ok": ok, "detail": detail}


def _universal_rules(sets: dict, overlaps: dict, n: int | None) -> list[dict]:
    """The rules every split keeps: no duplicates, indices in range, no leak, no training on queries."""
    dups = {role: s["duplicates"] for role, s in sets.items() if s["duplicates"]}
    outside = {role: s["out_of_range"] for role, s in sets.items() if s["out_of_range"]}
    span = f"0..{n - 1:,}" if n is not None else "0.. (N unknown: give --labels or --n-items for the upper end)"
    leak = overlaps["queries_in_database"]
    rules = [
        _rule("no duplicates within a set", not dups,
              ", ".join(f"{role}: {k:,} duplicate entries" for role, k in dups.items()) or "none"),
        _rule(f"every index in {span}", not outside,
              ", ".join(f"{role}: {k:,} out of range" for role, k in outside.items()) or "all in range"),
        _rule("no query in the database", leak == 0,
              f"{leak:,} of {sets['queries']['distinct']:,} queries are in the database" if leak else "none"),
    ]
    if "training" in sets:
        shared = overlaps["training_in_queries"]
        rules.append(_rule("no training item among the queries", shared == 0,
                           f"{shared:,} training items are queries" if shared else "none"))
    return rules


def _size_rule(role: str, actual: int, expected: int | None, preset: Protocol) -> dict:
    if expected is None:
        return _rule(f"{role}: the protocol's size", None, f"{actual:,} (the protocol's is unverified: not checked)")
    return _rule(f"{role}: {expected:,} as {preset.name} says", actual == expected,
                 f"{actual:,}" + ("" if actual == expected else f", not {expected:,}"))


TRAINING_TEXT = {"subset": "training inside the database", "database": "training set = database",
                 "held_out": "training apart from the database"}


def _protocol_rules(preset: Protocol, sets: dict, overlaps: dict) -> list[dict]:
    """The protocol's sizes and where its training set lies."""
    expected = expected_sizes(preset)
    rules = [_size_rule(role, sets[role]["size"], expected[role], preset) for role in ROLES if role in sets]
    where = training_rule(preset)
    if "training" not in sets:
        return rules + [_rule(TRAINING_TEXT[where], None, "no --train-index: not checked")]
    inside, outside = overlaps["training_in_database"], overlaps["training_outside_database"]
    if where == "held_out":
        ok, detail = inside == 0, f"{inside:,} training items are in the database"
    elif where == "subset":
        ok, detail = outside == 0, f"{outside:,} training items are outside the database"
    else:
        missing = overlaps["database_outside_training"]
        ok = outside == 0 and missing == 0
        detail = f"{outside:,} training items outside the database, {missing:,} database items not in training"
    return rules + [_rule(TRAINING_TEXT[where], ok, detail)]


def _balance(pool: dict, items: dict) -> dict | None:
    """Distinct items per class (or per label column, an item counting for each of its labels) in every set."""
    values = pool["values"]
    if values is None:
        return None
    if pool["label_kind"] == "class":
        classes, inverse = np.unique(np.asarray(values), return_inverse=True)
        counts = {role: np.bincount(inverse.reshape(-1)[idx], minlength=classes.size).tolist()
                  for role, idx in items.items()}
        return {"kind": "class", "labels": classes.tolist(), "counts": counts}
    counts, empty = {}, {}
    for role, idx in items.items():
        total, none = np.zeros(values.shape[1], np.int64), 0
        for start in range(0, idx.size, LABEL_BLOCK_ROWS):
            rows = np.asarray(values[idx[start : start + LABEL_BLOCK_ROWS]]) != 0
            total += rows.sum(axis=0)
            none += int((~rows.any(axis=1)).sum())
        counts[role], empty[role] = total.tolist(), none
    return {"kind": "multilabel", "labels": list(range(values.shape[1])), "counts": counts, "no_label": empty}


def _base_notes(raw: dict, sources: dict, n: int | None, index_base: int) -> list[str]:
    """What each set's indices say about their base (MATLAB files are often 1-based): a set with no 0 and N
    itself looks 1-based, a set with a 0 under --index-base 1 looks 0-based."""
    if index_base == 1:
        zero = [role for role, idx in raw.items() if idx.min() == 0]
        return [f"{', '.join(zero)}: an index is 0, so 0-based (out of range with --index-base 1); drop "
                "--index-base 1, or convert the files to one base"] if zero else []
    if n is None:
        from_mat = [role for role, idx in raw.items() if idx.min() >= 1 and ".mat" in sources[role].lower()]
        return [f"{', '.join(from_mat)}: no index is 0 in a .mat file (MATLAB counts from 1): give --labels or "
                "--n-items to check the range, and --index-base 1 if they are 1-based"] if from_mat else []
    one = [role for role, idx in raw.items() if idx.min() >= 1 and idx.max() == n]
    if not one:
        return []
    mixed = [role for role, idx in raw.items() if idx.min() == 0]
    fix = (f"; {', '.join(mixed)} {'has' if len(mixed) == 1 else 'have'} an index 0 (0-based): convert the files "
           "to one base" if mixed else
           "; rerun with --index-base 1")
    return [f"{', '.join(one)}: no index is 0 and the largest is N = {n:,}, so 1-based (MATLAB){fix}"]


def _not_single_label(values) -> int:
    """The number of multi-hot rows without exactly one label."""
    count = 0
    for start in range(0, values.shape[0], LABEL_BLOCK_ROWS):
        per_row = (np.asarray(values[start : start + LABEL_BLOCK_ROWS]) != 0).sum(axis=1)
        count += int((per_row != 1).sum())
    return count


def _pool_notes(preset: Protocol | None, pool: dict) -> list[str]:
    """Where the pool differs from the protocol's (a note: sources differ there)."""
    if preset is None:
        return ["no --protocol: only the rules every split keeps were checked"]
    notes, n, values = [], pool["n_items"], pool["values"]
    if n is not None and n != preset.pooled_items:
        unverified = ", unverified" if "pooled_items" in preset.unverified else ""
        notes.append(f"the pool has N = {n:,} items, {preset.name} {preset.pooled_items:,}{unverified} "
                     "(sources differ: docs/protocols.md)")
    if values is not None and preset.labels is not None:
        multi = pool["label_kind"] == "multilabel"
        have = values.shape[1] if multi else int(np.unique(np.asarray(values)).size)
        if have != preset.labels:
            notes.append(f"the labels have {have} {'columns' if multi else 'classes'}, {preset.name} "
                         f"{preset.labels}")
        if multi and preset.label_kind == "class" and (odd := _not_single_label(values)):
            notes.append(f"{preset.name} is single-label but {odd:,} items have no label or several")
    return notes


def check_split(query, database, training=None, *, labels=None, n_items=None, protocol: str | None = None,
                index_base: int = 0) -> dict:
    """Check a split given as index files (or arrays) into a pool, as the module docstring says; returns the
    JSON-safe report: ``pool``, ``sets`` (per set: size, distinct, duplicates, out_of_range, expected),
    ``overlaps``, ``balance`` (with labels), ``rules`` ({rule, ok: True/False/None (not checked), detail}),
    ``broken`` (the number of rules with ok False) and ``notes``. ``labels``: the pool's 1-D classes or 2-D 0/1
    rows (array or .npy path), or ``n_items`` = N; neither: N unknown."""
    if query is None or database is None:
        raise InputError("--check needs --query-index and --db-index (and optionally --train-index)")
    preset = get_protocol(protocol) if protocol is not None else None
    if index_base not in (0, 1) or isinstance(index_base, bool):
        raise InputError(f"--index-base must be 0 or 1, got {index_base!r}")
    pool = _pool(labels, n_items)
    given = {"queries": query, "database": database, "training": training}
    raw, sources = {}, {}
    for role in ROLES:
        if given[role] is not None:
            raw[role], sources[role] = _read_set(given[role], OPTIONS[role])
    n = pool["n_items"]
    sets, items = {}, {}
    for role, idx in raw.items():
        sets[role], items[role] = _set_stats(idx - index_base, n)
        sets[role]["source"] = sources[role]
        sets[role]["expected"] = expected_sizes(preset)[role] if preset is not None else None
    overlaps = _overlaps(items, n)
    rules = _universal_rules(sets, overlaps, n) + (_protocol_rules(preset, sets, overlaps) if preset else [])
    values = pool["values"]
    label_count = None if values is None else (
        values.shape[1] if pool["label_kind"] == "multilabel" else int(np.unique(np.asarray(values)).size))
    return {
        "protocol": None if preset is None else preset.name, "index_base": index_base,
        "pool": {"n_items": n, "from": pool["from"], "label_kind": pool["label_kind"], "labels": label_count,
                 "protocol_pooled_items": None if preset is None else preset.pooled_items,
                 "protocol_labels": None if preset is None else preset.labels},
        "sets": sets, "overlaps": overlaps, "balance": _balance(pool, items), "rules": rules,
        "broken": sum(rule["ok"] is False for rule in rules),
        "notes": _base_notes(raw, sources, n, index_base) + _pool_notes(preset, pool),
    }


def _table(header: list[str], rows: list[list]) -> list[str]:
    """Aligned text columns: integers right-aligned with thousands separators, text left-aligned."""
    cells = [header] + [[f"{c:,}" if isinstance(c, int) else ("-" if c is None else str(c)) for c in row]
                        for row in rows]
    right = [all(isinstance(row[i], int) or row[i] is None for row in rows) if rows else False
             for i in range(len(header))]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    return ["  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(line, widths, right, strict=True)).rstrip()
            for line in cells]


MAX_LABEL_ROWS = 40  # more labels than this: a per-set summary instead of one row per label


def _balance_lines(balance: dict) -> list[str]:
    roles = list(balance["counts"])
    what = ("items per class" if balance["kind"] == "class" else
            "items per label (an item counts for each of its labels)")
    lines = ["", f"{what}, distinct in-range items"]
    if len(balance["labels"]) <= MAX_LABEL_ROWS:
        rows = [[str(label)] + [balance["counts"][role][i] for role in roles]
                for i, label in enumerate(balance["labels"])]
        if "no_label" in balance:
            rows.append(["(no label)"] + [balance["no_label"][role] for role in roles])
        return lines + _table(["label", *roles], rows)
    rows = []
    for role in roles:
        counts = np.asarray(balance["counts"][role])
        low, high = int(counts.argmin()), int(counts.argmax())
        rows.append([role, int(counts[low]), str(balance["labels"][low]), int(counts[high]),
                     str(balance["labels"][high]), balance.get("no_label", {}).get(role)])
    return lines + _table(["set", "fewest", "label", "most", "label", "no label"], rows) + [
        f"({len(balance['labels'])} labels: --json lists every count)"]


RULE_MARK = {True: "ok", False: "BROKEN", None: "--"}


def format_check(report: dict) -> str:
    """The report of :func:`check_split` as terminal tables."""
    pool = report["pool"]
    n = "N unknown" if pool["n_items"] is None else f"N = {pool['n_items']:,} (from {pool['from']})"
    protocol = f"protocol {report['protocol']}" if report["protocol"] else "no protocol"
    lines = [f"split check: {protocol}, indices {report['index_base']}-based, {n}", ""]
    lines += _table(["set", "file", "entries", "expected", "distinct", "duplicates", "out of range"],
                    [[role, s["source"], s["size"], s["expected"], s["distinct"], s["duplicates"], s["out_of_range"]]
                     for role, s in report["sets"].items()])
    names = {"queries_in_database": "queries in the database", "training_in_queries": "training among the queries",
             "training_in_database": "training in the database",
             "training_outside_database": "training outside the database",
             "database_outside_training": "database items not in training", "in_no_set": "items in no set"}
    lines += [""] + _table(["overlap (distinct in-range items)", "count"],
                           [[names[key], value] for key, value in report["overlaps"].items()])
    lines += [""] + _table(["", "rule", "found"], [[RULE_MARK[r["ok"]], r["rule"], r["detail"]]
                                                   for r in report["rules"]])
    if report["balance"] is not None:
        lines += _balance_lines(report["balance"])
    lines += [""] + [f"note: {note}" for note in report["notes"]]
    broken = report["broken"]
    lines.append(f"{broken} rule{'s' if broken != 1 else ''} broken" if broken else "every rule checked is kept")
    return "\n".join(lines)


def broken_summary(report: dict) -> str:
    """One line naming the broken rules (for stderr)."""
    broken = [f"{r['rule']} ({r['detail']})" for r in report["rules"] if r["ok"] is False]
    return f"split check: {len(broken)} rule{'s' if len(broken) != 1 else ''} broken: " + "; ".join(broken)
