"""Seeded, class-balanced dataset splits for repeated runs (docs/metrics.md section 5b), stored as Zarr v3.

Store (``hashdist split --out SPLITS.zarr``): arrays ``splits/<strategy>/<run>/<role>``, run "0".."T-1",
each a sorted 1-D int64 array of item indices into the pooled dataset of N items. Group attributes:
``format`` ("hashdist-splits"), ``format_version`` (1), ``n_items`` (N), ``label_kind`` ("class",
"multilabel" or "none"), ``seed``, ``runs`` (T) and ``strategies``: {strategy: {"sizes": {role: size},
"roles": [role, ...], "unused": number of items in no role}}.

Roles, in drawing order:

- ``standard``: ``test_queries``; ``database`` = every other item; then, from the database,
  ``validation_queries``, ``validation_database`` and ``training``, pairwise disjoint (the training
  set never overlaps the validation sets).
- ``improved``: ``test_queries``, ``test_database``, ``validation_queries``, ``validation_database``,
  ``training``, pairwise disjoint.

``training`` is what the other draws leave (in ``standard``: the database minus both validation sets)
unless its size is given; then the items left over belong to no role (``unused``, only ``improved``
has any). Default sizes (DEFAULT_SIZES): 1000 test queries, 5000 test database items, 1000 validation
queries and 5000 validation database items. Validation sizes may be 0 (no validation sets, as in the
literature protocols of hashdist.data.protocols); every other set has at least one item.

Balance: items are grouped by class label; by first label (lowest set column) for multi-hot labels,
items with no label forming a group of their own; all in one group without labels. A set of size s
over C groups takes floor(s / C) items from each and one more from s mod C groups in a seeded order;
a group with fewer items left gives all it has and the others share its shortfall the same way, so
groups that are not exhausted contribute counts differing by at most 1.

Randomness: run t of the strategy with index i in STRATEGIES uses the PCG64 stream of
``numpy.random.SeedSequence([seed, t, i])``, read only as raw 64-bit words (``random_raw``) whose stable
argsort gives every order. The indices therefore depend only on numpy's PCG64 and the inputs: the same
on every machine and numpy version, and whether or not the other strategy is drawn too.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import zarr

from hashdist.data.atomic import check_apart, check_output, read_marker, staged_directory
from hashdist.data.dataset import _create_rows_array, missing_chunk
from hashdist.data.inputs import load_array
from hashdist.errors import InputError, check_integer, is_integer

FORMAT = "hashdist-splits"
FORMAT_VERSION = 1
STRATEGIES = ("standard", "improved")
ROLES = {
    "standard": ("test_queries", "database", "validation_queries", "validation_database", "training"),
    "improved": ("test_queries", "test_database", "validation_queries", "validation_database", "training"),
}
DEFAULT_SIZES = {"test_queries": 1000, "test_database": 5000, "validation_queries": 1000,
                 "validation_database": 5000, "training": None}  # training None: the remainder
MAY_BE_EMPTY = ("validation_queries", "validation_database")
CHUNK = 1 << 20  # indices per Zarr chunk
LABEL_BLOCK_ROWS = 65536  # multi-hot rows read at a time
MAX_ITEMS = 2**30  # the largest N drawn: a run holds about 48 bytes an item (shuffle keys, order, sets), 50 GB here


def _option(role: str) -> str:
    return "--" + role.replace("_", "-")


def _check_options(strategies, runs, seed, sizes) -> tuple[tuple[str, ...], dict]:
    """The requested strategies (deduplicated) and every role's size (None: the remainder); refuses bad values."""
    strategies = (strategies,) if isinstance(strategies, str) else tuple(dict.fromkeys(strategies))
    if not strategies:
        raise InputError("--strategy needs at least one strategy (standard, improved)")
    for name in strategies:
        if name not in STRATEGIES:
            raise InputError(f"--strategy {name}: unknown strategy (choose from {', '.join(STRATEGIES)})")
    check_integer(runs, "--runs")
    check_integer(seed, "--seed", 0)
    sizes = {role: size for role, size in (sizes or {}).items() if size is not None}
    for role, size in sizes.items():
        if role not in DEFAULT_SIZES:
            raise InputError(f"sizes: unknown role {role!r} (choose from {', '.join(DEFAULT_SIZES)})")
        check_integer(size, _option(role), 0 if role in MAY_BE_EMPTY else 1)
    if "test_database" in sizes and "improved" not in strategies:
        raise InputError("--test-database applies only to the improved strategy")
    return strategies, {role: int(sizes[role]) if role in sizes else d for role, d in DEFAULT_SIZES.items()}


def _item_groups(labels, n_items) -> tuple[np.ndarray, str]:
    """(group id 0..C-1 of every item, label kind) from class labels, multi-hot labels or a bare item count."""
    if (labels is None) == (n_items is None):
        raise InputError("give exactly one of --labels and --n-items")
    if labels is None:
        return np.zeros(check_integer(n_items, "--n-items", 1, MAX_ITEMS), np.int64), "none"
    name = "labels"
    if isinstance(labels, (str, os.PathLike)):
        name, labels = str(labels), load_array(labels)
    arr = np.asarray(labels)
    if arr.ndim not in (1, 2):
        raise InputError(f"{name}: labels must be 1-D (classes) or 2-D (multi-hot), got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise InputError(f"{name}: no items (the labels are empty)")
    if arr.shape[0] > MAX_ITEMS:
        raise InputError(f"{name}: {arr.shape[0]:,} items, more than {MAX_ITEMS:,}, the most a split draws")
    if arr.ndim == 1:
        if arr.dtype.kind not in "iu":
            raise InputError(f"{name}: class labels must be integers, got {arr.dtype}")
        return np.unique(arr, return_inverse=True)[1].astype(np.int64), "class"
    if arr.dtype.kind not in "biuf" or arr.shape[1] == 0:
        raise InputError(f"{name}: multi-label matrix must be numeric 0/1 with at least one column")
    first = np.empty(arr.shape[0], np.int64)
    for start in range(0, arr.shape[0], LABEL_BLOCK_ROWS):
        block = np.asarray(arr[start : start + LABEL_BLOCK_ROWS])
        if not np.isin(block, (0, 1)).all():
            raise InputError(f"{name}: multi-label matrix must contain only 0 and 1")
        nonzero = block != 0
        first[start : start + len(block)] = np.where(nonzero.any(axis=1), nonzero.argmax(axis=1), arr.shape[1])
    return np.unique(first, return_inverse=True)[1].astype(np.int64), "multilabel"


def _plan(strategy: str, n: int, sizes: dict) -> tuple[dict, int]:
    """({role: size} in drawing order, items in no role) of ``strategy`` over N = n items; refuses sizes that
    do not fit."""
    need, terms = 0, []
    for role in ROLES[strategy]:
        if role == "database" or sizes[role] is None:
            continue
        need += sizes[role]
        terms.append(f"{_option(role)} {sizes[role]}")
        if need > n:
            raise InputError(f"{terms[-1]}: the {strategy} split needs {need} items ({' + '.join(terms)}) "
                             f"but there are N = {n}")
    if sizes["training"] is None and need == n:
        raise InputError(f"{terms[-1]}: the {strategy} split uses all N = {n} items ({' + '.join(terms)}) and "
                         "leaves none for training")
    plan = {role: n - sizes["test_queries"] if role == "database" else sizes[role] for role in ROLES[strategy]}
    if sizes["training"] is None:
        plan["training"] = n - need
    return plan, 0 if strategy == "standard" else n - sum(plan.values())


def _allocate(avail: np.ndarray, size: int, rank: np.ndarray) -> np.ndarray:
    """Items per group for a set of ``size``: the largest level L with sum(min(avail, L)) <= size from every
    group, one more from the first groups in ``rank`` that have more than L."""
    lo, hi = 0, int(avail.max())
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if np.minimum(avail, mid).sum() <= size else (lo, mid - 1)
    counts = np.minimum(avail, lo)
    extra = size - int(counts.sum())
    counts[rank[avail[rank] > lo][:extra]] += 1
    return counts


def _draw(groups: np.ndarray, group_sizes: np.ndarray, plan: dict, bitgen: np.random.PCG64) -> dict:
    """One run: {role: sorted int64 indices}. Items are shuffled within their groups once; each set takes
    the next items of every group (the standard ``database`` takes all that the test queries leave)."""
    order = np.lexsort((bitgen.random_raw(len(groups)), groups))
    starts = np.cumsum(group_sizes) - group_sizes
    taken = np.zeros_like(group_sizes)
    sets = {}
    for role, size in plan.items():
        rank = np.argsort(bitgen.random_raw(len(group_sizes)), kind="stable")
        counts = _allocate(group_sizes - taken, size, rank)
        offsets = np.cumsum(counts) - counts
        positions = np.repeat(starts + taken - offsets, counts) + np.arange(size)
        sets[role] = np.sort(order[positions]).astype(np.int64)
        if role != "database":
            taken += counts
    return sets


def _runs(groups: np.ndarray, plans: dict, seed: int, runs: int):
    """Yield (strategy, run, {role: indices}) for every strategy in ``plans`` and run 0..runs-1."""
    group_sizes = np.bincount(groups)
    for strategy, (plan, _) in plans.items():
        for t in range(runs):
            bitgen = np.random.PCG64(np.random.SeedSequence([seed, t, STRATEGIES.index(strategy)]))
            yield strategy, t, _draw(groups, group_sizes, plan, bitgen)


def _attrs(n: int, label_kind: str, seed: int, runs: int, plans: dict, groups: np.ndarray | None = None) -> dict:
    strategies = {s: {"sizes": {r: int(v) for r, v in plan.items()}, "roles": list(plan), "unused": int(unused)}
                  for s, (plan, unused) in plans.items()}
    attrs = {"format": FORMAT, "format_version": FORMAT_VERSION, "n_items": int(n), "label_kind": label_kind,
             "seed": int(seed), "runs": int(runs), "strategies": strategies}
    if groups is not None:  # the classes the sets are balanced over, so that other labels can be refused later
        attrs["groups_sha256"] = _groups_digest(groups)
    return attrs


def _groups_digest(groups: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(groups, dtype=np.int64).tobytes()).hexdigest()


def check_drawn_from(path, attrs: dict, labels, name: str = "--labels") -> None:
    """Refuse labels whose classes are not those the store at ``path`` (attributes ``attrs``) was drawn from,
    where it records them (written by :func:`split` from labels): another file, or the right one permuted,
    would silently give sets that are neither balanced nor the recorded ones."""
    expected = attrs.get("groups_sha256")
    if expected is None:
        return
    groups, kind = _item_groups(labels, None)
    if kind != attrs["label_kind"] or _groups_digest(groups) != expected:
        raise InputError(f"{name}: not the labels {path} was drawn from (the items' classes differ)")


def protocol_options(name: str) -> dict:
    """``strategies`` and ``sizes`` of a literature protocol (hashdist.data.protocols) for :func:`make_splits`;
    the validation sets it does not size are empty."""
    from hashdist.data.protocols import get_protocol

    protocol = get_protocol(name)
    return {"strategies": (protocol.strategy,),
            "sizes": {"validation_queries": 0, "validation_database": 0, **protocol.sizes}}


def make_splits(labels=None, n_items=None, *, strategies=STRATEGIES, runs: int = 10, seed: int = 0,
                sizes: dict | None = None) -> dict:
    """{strategy: [{role: sorted int64 indices} for each run]}, drawn as the module docstring describes.

    ``labels``: 1-D integer classes or 2-D 0/1 multi-hot rows of all N items (an array or a .npy path);
    or ``n_items`` = N without labels. ``sizes``: {role: size}, missing roles take DEFAULT_SIZES.
    """
    strategies, sizes = _check_options(strategies, runs, seed, sizes)
    groups, _ = _item_groups(labels, n_items)
    plans = {s: _plan(s, len(groups), sizes) for s in strategies}
    result: dict = {s: [] for s in strategies}
    for strategy, _, sets in _runs(groups, plans, seed, runs):
        result[strategy].append(sets)
    return result


def split(out, labels=None, n_items=None, *, strategies=STRATEGIES, runs: int = 10, seed: int = 0,
          sizes: dict | None = None, overwrite: bool = False) -> dict:
    """Draw like :func:`make_splits` and write the store ``out`` one run at a time; returns its attributes."""
    strategies, sizes = _check_options(strategies, runs, seed, sizes)
    check_apart(out, (labels,))
    groups, label_kind = _item_groups(labels, n_items)
    plans = {s: _plan(s, len(groups), sizes) for s in strategies}
    attrs = _attrs(len(groups), label_kind, seed, runs, plans, groups if label_kind != "none" else None)
    _write(out, attrs, _runs(groups, plans, seed, runs), overwrite)
    return attrs


def write_splits(out, splits: dict, *, n_items: int, label_kind: str = "none", seed: int = 0,
                 overwrite: bool = False) -> dict:
    """Write given splits to ``out``, as ``ingest --splits`` reads them: a :func:`make_splits` result (with the
    N, label kind and seed it was drawn with) or a fixed split of your own, ``{strategy: [{role: indices}, ...]}``
    (the validation roles may be left out: empty). Returns the store's attributes. Every run of a strategy
    must have the same roles and sizes."""
    check_integer(n_items, "n_items")
    if label_kind not in ("class", "multilabel", "none"):
        raise InputError(f"label_kind must be class, multilabel or none, got {label_kind!r}")
    if not isinstance(splits, dict) or not all(isinstance(per_run, (list, tuple)) and
                                                all(isinstance(sets, dict) for sets in per_run)
                                                for per_run in splits.values()):
        raise InputError("splits: expected {strategy: [{role: indices}, ...]}, one dict of index arrays per run")
    _check_options(tuple(splits), 1, seed, None)
    splits = {strategy: [{**{role: np.array([], np.int64) for role in MAY_BE_EMPTY}, **sets} for sets in per_run]
              for strategy, per_run in splits.items()}
    counts = {len(per_run) for per_run in splits.values()}
    if len(counts) != 1 or 0 in counts:
        raise InputError("splits: every strategy needs the same positive number of runs")
    plans = {strategy: _plan_of(strategy, per_run, n_items) for strategy, per_run in splits.items()}
    attrs = _attrs(n_items, label_kind, seed, counts.pop(), plans)
    items = ((s, t, {role: np.sort(np.asarray(sets[role], dtype=np.int64)) for role in ROLES[s]})
             for s, per_run in splits.items() for t, sets in enumerate(per_run))
    _write(out, attrs, items, overwrite)
    return attrs


def _plan_of(strategy: str, per_run: list, n: int) -> tuple[dict, int]:
    """({role: size}, items in no role) of given runs of ``strategy``, checking roles, sizes and indices."""
    plan = {role: len(per_run[0].get(role, ())) for role in ROLES[strategy]}
    for t, sets in enumerate(per_run):
        if set(sets) != set(ROLES[strategy]) or {role: len(sets[role]) for role in plan} != plan:
            raise InputError(f"splits: every {strategy} run needs the roles {', '.join(plan)}, with equal sizes")
        for role, idx in sets.items():
            idx = np.asarray(idx)
            if idx.ndim != 1 or idx.dtype.kind not in "iu" or idx.size and not 0 <= idx.min() <= idx.max() < n:
                raise InputError(f"splits: {strategy} run {t} {role}: need 1-D integer indices in 0..{n - 1}")
    covered = np.zeros(n, bool)
    for idx in per_run[0].values():
        covered[np.asarray(idx)] = True
    return plan, n - int(covered.sum())


def _write(out, attrs: dict, items, overwrite: bool) -> None:
    """Write the store atomically (staged sibling, output lock); refuses an existing output unless ``overwrite``
    and never replaces anything but a splits store."""
    final = check_output(out, "splits store", _is_store, overwrite=overwrite)
    with staged_directory(final) as tmp:
        group = zarr.open_group(store=str(tmp), mode="w", zarr_format=3)
        for strategy, t, sets in items:
            for role, idx in sets.items():
                arr = _create_rows_array(group, f"splits/{strategy}/{t}/{role}", None, np.int64,
                                         min(len(idx), CHUNK) or 1)
                arr.resize((len(idx),))
                arr[:] = idx
        group.attrs.update(attrs)


def _is_store(path: Path) -> bool:
    """Whether ``path`` is a directory hashdist wrote as a splits store (its zarr.json carries the marker)."""
    return read_marker(path / "zarr.json", "attributes", "format") == FORMAT


def _open(path) -> zarr.Group:
    """Open a splits store read-only, checking its format and version."""
    if "://" not in str(path) and not Path(path).exists():
        raise InputError(f"{path}: no such splits store (path does not exist)")
    try:
        group = zarr.open_group(store=str(path), mode="r")
    except Exception:
        raise InputError(f"{path}: not a Zarr group") from None
    attrs = group.attrs
    if attrs.get("format") != FORMAT:
        raise InputError(f"{path}: not a hashdist splits store (format {attrs.get('format')!r})")
    if attrs.get("format_version") != FORMAT_VERSION:
        raise InputError(f"{path}: splits format version {attrs.get('format_version')} is not supported "
                         f"(expected {FORMAT_VERSION})")
    return group


def store_attrs(path) -> dict:
    """The attributes of the splits store at ``path`` (format and version checked)."""
    return dict(_open(path).attrs)


def read_split(path, strategy: str, run: int) -> dict:
    """{role: sorted int64 indices} of one run of a splits store, roles in the store's order."""
    group = _open(path)
    attrs = dict(group.attrs)
    entry = attrs["strategies"].get(strategy)
    if entry is None:
        raise InputError(f"{path}: unknown strategy {strategy!r} (the store has {', '.join(attrs['strategies'])})")
    if not is_integer(run) or not 0 <= run < attrs["runs"]:
        raise InputError(f"{path}: run index {run!r} is out of range 0..{attrs['runs'] - 1}")
    sets = {}
    for role in entry["roles"]:
        name = f"splits/{strategy}/{run}/{role}"
        try:
            array = group[name]
            sets[role] = np.asarray(array[:]).astype(np.int64, copy=False)
        except KeyError:
            raise InputError(f"{path}: {name} is missing (damaged splits store)") from None
        except Exception as exc:  # zarr raises codec errors of several types
            raise InputError(f"{path}: cannot read {name}: {type(exc).__name__}: {exc}") from None
        if (chunk := missing_chunk(array)) is not None:
            raise InputError(f"{path}: {name} chunk {chunk} is missing (damaged splits store)")
        if len(sets[role]) != entry["sizes"][role]:
            raise InputError(f"{path}: {name} has {len(sets[role])} indices but the store records "
                             f"{entry['sizes'][role]}")
    return sets
