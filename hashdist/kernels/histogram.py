"""Per-block Hamming histograms ``H[q, d, g]``: database items at distance d with grade g.

One kernel template serves every relevance kind. It walks segments (a run of queries
against a run of database items) per tile of 4 queries, a chunk of items at a time,
in two phases: a vectorisable loop computes each pair's histogram cell
(grade * (nbits + 1) + distance) for the chunk, then a scalar loop increments int32
counts at those cells, one slot after another so consecutive increments rarely hit
the same counter. When the cells of two queries fit in a small joint table, a slot
counts a pair of queries jointly (one increment per item for two queries) and the
table's row and column sums become their histograms. No distance matrix is formed.
Distance-only counts of codes of up to four words on CPUs with a scalar POPCNT and no vector
one (x86 without AVX-512 VPOPCNTDQ) take one fused scalar loop instead: 8 or 16 queries a pass,
each item's words loaded once for all of them, and per pair scalar POPCNTs and an increment at
a constant stride.

Multi-label blocks of one- and two-word codes whose label rows recur (the presets' Zipf-distributed
concepts give 7,900 to 25,000 distinct rows per 262,144 items) are grouped by label row
on every CPU with a scalar POPCNT: within a run of equal rows each query's grade is fixed, so a fused loop
counts the run's distances at a per-run offset, and only items whose label row is their own go
through the cell kernel.

Class labels with few relevant pairs take a cheaper route: distances of all items
are counted without grades (the fused loop, else small joint tables), the block is grouped by label so
each query's same-label items form one run, and grade 1 is counted over those runs
only; grade 0 is the difference. Explicit ground truth is applied afterwards as a
correction: each listed (query, item) pair moves one count from grade 0 to its
grade, a merge-walk over the sorted CSR lists.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import threading

import numpy as np

from hashdist.data.atomic import replace_file
from hashdist.defaults import kernels_dir
from hashdist.kernels import cached_njit, listed_in_block
from hashdist.kernels.distinct import distinct_rows
from hashdist.kernels.popcount import hamming, target_popcount

TILE = 4
CHUNK = 512  # database items per phase; a tile's cell buffer stays in L1
MAX_JOINT_CELLS = 258**2  # largest joint table per query pair (B=128 class, B=257 explicit)
MAX_UNROLLED_WORDS = 8
MAX_RELEVANT_FRACTION = 0.2  # class split: at most this share of same-label pairs...
MIN_SPLIT_QUERIES = 256  # ...and enough queries to pay for grouping the block by label (class or multi-label)
MIN_RUN = 2  # multi-label: items sharing a label row that the grouped kernel counts as one run...
MIN_GROUPED_PAIRS = 1 << 27  # ...in blocks of this many pairs or more (~0.1 s; smaller ones gain less than
# the kernel costs to load, or on a first run to compile: about 1.2 s)...
LABEL_SAMPLE = 4096  # ...when, in a strided sample of this many of the block's label rows,
MIN_RECURRING_SHARE = 0.5  # at least this share of the rows recur (grouping then pays for itself)
FUSED_TILES = (8, 16)  # queries a pass of the fused distance-count kernel for one-word codes, and longer ones...
MAX_FUSED_WORDS = 4  # ...of up to this many words (measured at 1, 2 and 4)
GROUPED_TILE = 8  # queries a pass of the grouped multi-label kernel, for codes of up to...
MAX_GROUPED_WORDS = 2  # ...this many words (measured at 1 and 2)


def _distance_terms(words: int, items: str) -> tuple[str, str, str]:
    """Source pieces of a pair's Hamming distance: query t's code (format with t), the database items
    ``items`` (a slice) as c, and the distance of query t to item j of c (format with t)."""
    if words:
        code = "; ".join(f"a{{t}}_{w} = qc[k{{t}}, {w}]" for w in range(words))
        item = "; ".join(f"c{w} = dc[{w}, {items}]" for w in range(words))
        dist = " + ".join(f"popcount64(a{{t}}_{w} ^ c{w}[j])" for w in range(words))
        return code, item, dist
    return "a{t} = qc[k{t}]", f"c = dc[{items}]", "hamming(a{t}, c[j])"


def _loaded_distance_terms(words: int) -> tuple[str, str]:
    """For loops that increment counters as they go: the item j's words loaded once into x0, x1, ..., and
    query t's distance to them (format with t). Indexing c{w}[j] in each query's term instead reloads the
    words after every increment (numba cannot rule out that J aliases the codes): 6-9% of the grouped kernel's
    throughput, half of the fused kernel's at B = 128."""
    load = "; ".join(f"x{w} = c{w}[j]" for w in range(words))
    return load, " + ".join(f"popcount64(a{{t}}_{w} ^ x{w})" for w in range(words))


def _per_query(fmt: str, tile: int, indent: int) -> str:
    """Source lines, one per query t of a tile: ``fmt`` formatted with t, indented."""
    return "\n".join(" " * indent + fmt.format(t=t) for t in range(tile))


def _query_labels(label_words: int) -> str:
    """Source of query t's labels (format with t): its label words l{t}_0, l{t}_1, ..., or its row l{t}."""
    if label_words:
        return "; ".join(f"l{{t}}_{w} = qr[k{{t}}, {w}]" for w in range(label_words))
    return "l{t} = qr[k{t}]"


def _labels_in_common(label_words: int, item_word: str, item_row: str) -> str:
    """Source of the labels query t has in common with an item (format with t): over its label words
    (``item_word`` formatted with w), or over its row ``item_row``."""
    if label_words:
        return " + ".join(f"popcount64(l{{t}}_{w} & {item_word.format(w=w)})" for w in range(label_words))
    return f"common_bits(l{{t}}, {item_row})"


def _grade_terms(kind: str, label_words: int, top: int | None) -> tuple[str, str, str]:
    """Source pieces of a pair's grade in the cell kernel: query t's labels (format with t), the chunk's label
    rows as r (r0, r1, ... word-major for unrolled multilabel words), and the grade of query t and item j."""
    if kind != "multilabel":
        grade = {"none": "0", "class": "(r[j] == l{t})"}[kind]
        return _query_labels(0), "r = dr[j0 : j0 + C]", grade
    if label_words:
        item_label = "; ".join(f"r{w} = dr[{w}, j0 : j0 + C]" for w in range(label_words))
    else:
        item_label = "r = dr[j0 : j0 + C]"
    common = _labels_in_common(label_words, "r{w}[j]", "r[j]")
    return _query_labels(label_words), item_label, common if top is None else f"min({common}, {top})"


def _slot_terms(joint: bool, cell: str) -> tuple[int, str, str, str, str]:
    """Source pieces of the cell kernel's counter slots: (slots, their span, the loops that fill each slot's cell
    buffer from ``cell`` (a pair's cell, format with t), the increments of every slot, the sums of a slot's
    counts into m that zero them)."""
    if joint:
        slots, span = TILE // 2, "ncell * ncell"
        cells = [f"{cell.format(t=2 * s)} * ncell + {cell.format(t=2 * s + 1)}" for s in range(slots)]
        sums = """                for v in range(ncell):
                    m[2 * s + 1, v] = 0
                for u in range(ncell):
                    row = 0
                    for v in range(ncell):
                        x = s * span + u * ncell + v
                        n = J[x]
                        J[x] = 0
                        row += n
                        m[2 * s + 1, v] += n
                    m[2 * s, u] = row"""
    else:
        slots, span = TILE, "ncell"
        cells = [cell.format(t=s) for s in range(slots)]
        sums = """                for u in range(ncell):
                    m[s, u] = J[s * span + u]
                    J[s * span + u] = 0"""
    fill = "\n".join(f"""                cs = cells[{s}]
                for j in range(C):
                    cs[j] = {s} * span + {cells[s]}""" for s in range(slots))
    count = "\n".join(f"                    J[cells[{s}, j]] += 1" for s in range(slots))
    return slots, span, fill, count, sums


def _kernel_source(kind: str, words: int, label_words: int, joint: bool, top: int | None) -> str:
    """Source of one kernel; ``grades`` grades are counted into H's ``ncols`` grade columns (run-time arguments).

    The kernel adds, for each row (q0, q1, d0, d1) of ``segments``, the histograms of
    queries q0:q1 against database items d0:d1, TILE queries at a time; a last partial
    tile repeats its last query and drops the copies' counts. Its work arrays come from
    :func:`_count` (no allocation to compile): the counts J, zero on entry and on exit,
    per-query sums m and the cell buffer.

    ``words`` (``label_words`` for multilabel rows) in 1..MAX_UNROLLED_WORDS unrolls the
    words over word-major database arrays ``dc[w, j]``; 0 loops over each item's row.
    ``joint`` pairs queries (2s, 2s + 1) in slot s of ncell * ncell counts, else each
    query has a slot of ncell counts. ``top`` caps the labels in common of "multilabel" kernels
    (grades - 1): a constant of the source, as a run-time cap costs 4% of their throughput; None when no
    query has more labels than that (:func:`_cap`).
    """
    code, item, dist = _distance_terms(words, "j0 : j0 + C")
    label, item_label, grade = _grade_terms(kind, label_words, top)
    slots, span, fill, count, sums = _slot_terms(joint, f"(({grade}) * nbd + {dist})")
    return f"""
def kernel(qc, qr, dc, dr, H, segments, grades, ncols, J, m, cells):
    nbd = H.shape[1] // ncols
    ncell = grades * nbd
    span = {span}
    for i in range(segments.shape[0]):
        q0, q1, d0, d1 = segments[i, 0], segments[i, 1], segments[i, 2], segments[i, 3]
        for q in range(q0, q1, {TILE}):
{_per_query("k{t} = min(q + {t}, q1 - 1)", TILE, 12)}
{_per_query(code, TILE, 12)}
{_per_query(label, TILE, 12)}
            for j0 in range(d0, d1, {CHUNK}):
                C = min({CHUNK}, d1 - j0)
                {item}
                {item_label}
{fill}
                for j in range(C):
{count}
            for s in range({slots}):
{sums}
            for t in range(min({TILE}, q1 - q)):
                for g in range(grades):
                    for d in range(nbd):
                        H[q + t, d * ncols + g] += m[t, g * nbd + d]
"""


def _fused_source(words: int) -> str:
    """Source of the distance-only kernel (grade 0) for codes of ``words`` in 1..MAX_FUSED_WORDS words.

    For each row (q0, q1, d0, d1) of ``segments``, :func:`_fused_tile` queries at a time, one loop over the items
    computes the queries' distances with scalar POPCNT and increments each query's row of J at once. The
    rows have 64 * words + 1 int32 counts, a constant of the source, and the index is unsigned: a run-time
    row length costs a multiplication per pair, a signed index a negative-index check per increment. A
    last partial tile repeats its last query and drops the copies' counts. J is zero on entry and on exit.
    """
    code, item, _ = _distance_terms(words, "d0:d1")
    load, dist = _loaded_distance_terms(words)
    stride, tile = _fused_row_length(words), _fused_tile(words)
    return f"""
def kernel(qc, dc, H, segments, ncols, J):
    nbd = H.shape[1] // ncols
    for i in range(segments.shape[0]):
        q0, q1, d0, d1 = segments[i, 0], segments[i, 1], segments[i, 2], segments[i, 3]
        {item}
        for q in range(q0, q1, {tile}):
{_per_query("k{t} = min(q + {t}, q1 - 1)", tile, 12)}
{_per_query(code, tile, 12)}
            for j in range(d1 - d0):
                {load}
{_per_query("J[np.uint64({t} * " + str(stride) + ") + np.uint64(" + dist + ")] += 1", tile, 16)}
            for t in range({tile}):
                for d in range(nbd):
                    if t < q1 - q:
                        H[q + t, d * ncols] += J[t * {stride} + d]
                    J[t * {stride} + d] = 0
"""


def _fused_row_length(words: int) -> int:
    """Counts per query in the fused kernel: every distance of codes of ``words`` words."""
    return 64 * words + 1


def _fused_tile(words: int) -> int:
    """Queries a pass of the fused kernel. On znver3 (1,024 x 262,144 clustered codes), one word: 8 queries
    3.0e9 pairs/s, 16 2.85e9; two words: 16 1.77e9, 8 1.65e9; four: 16 and 8 0.8e9."""
    return FUSED_TILES[words > 1]


def _grouped_source(words: int, label_words: int, capped: bool) -> str:
    """Source of the multi-label kernel for codes of ``words`` (1 or 2) over runs of items with equal label rows.

    ``dc`` holds the runs' items word-major, run i being items ``run_starts[i]:run_starts[i + 1]``
    with label row ``run_labels[i]`` (see :func:`_label_runs`). Within a run each query's grade is
    fixed, so its cell offset (query slot + grade row) is computed once per run and the items' loop
    only counts distances: scalar POPCNTs and one increment per pair, as the fused kernel. The counters and
    the items are indexed by unsigned integers: numba checks a signed index for a negative value unless LLVM
    can prove it is not: a third of the throughput for the counters' index; for the items' index, which
    starts at a run-time value, 88 -> 63 ms (1,024 queries x 195,484 items in runs, znver3, 8 queries a pass:
    without the check the loop no longer spills to the stack). J (GROUPED_TILE
    slots of ``grades * nbd`` int32 counts) is zero on entry and on exit. ``label_words`` in 1..MAX_UNROLLED_WORDS
    unrolls the label words (the kernel then compiles in about half the time); 0 loops over each row.
    ``capped``: grades capped at ``grades - 1``, needed only if a query has more labels (:func:`_cap`).
    """
    code, item, _ = _distance_terms(words, ":")
    load, dist = _loaded_distance_terms(words)
    tile = GROUPED_TILE
    common = _labels_in_common(label_words, "r[{w}]", "r")
    grade = f"min({common}, grades - 1)" if capped else f"({common})"
    return f"""
def kernel(qc, qr, dc, run_labels, run_starts, H, grades, ncols, J):
    nbd = H.shape[1] // ncols
    ncell = grades * nbd
    Q = qc.shape[0]
    {item}
    for q in range(0, Q, {tile}):
{_per_query("k{t} = min(q + {t}, Q - 1)", tile, 8)}
{_per_query(code, tile, 8)}
{_per_query(_query_labels(label_words), tile, 8)}
        for i in range(run_labels.shape[0]):
            r = run_labels[i]
{_per_query("o{t} = np.uint64({t} * ncell + " + grade + " * nbd)", tile, 12)}
            for j in range(np.uint64(run_starts[i]), np.uint64(run_starts[i + 1])):
                {load}
{_per_query("J[o{t} + np.uint64(" + dist + ")] += 1", tile, 16)}
        for t in range({tile}):
            for g in range(grades):
                for d in range(nbd):
                    x = t * ncell + g * nbd + d
                    if t < Q - q:
                        H[q + t, d * ncols + g] += J[x]
                    J[x] = 0
"""


_MODULE_HEADER = """\
# generated by hashdist.kernels.histogram; safe to delete
import numpy as np

from hashdist.kernels import cached_njit
from hashdist.kernels.popcount import common_bits, hamming, popcount64
"""


def _compile(kernel_source: str):
    """Write a kernel's source to a module file (named by its digest) and import it.

    A real file lets numba's on-disk cache keep the compiled kernel between processes;
    if the directory is not writable (and holds no copy) the kernel is compiled in memory instead.
    """
    source = _MODULE_HEADER + "\n\n@cached_njit(nogil=True, boundscheck=False)" + kernel_source
    name = "hashdist_kernel_" + hashlib.sha256(source.encode()).hexdigest()[:20]
    try:
        directory = kernels_dir()
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}.py"
        if not path.is_file() or path.read_text() != source:
            replace_file(path, source)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # numba's cache re-imports the defining module by name
        spec.loader.exec_module(module)
        return module.kernel
    except OSError:
        namespace: dict = {}
        exec(source, namespace)  # no source file: cached_njit compiles it without the cache
        return namespace["kernel"]


def _fused_distance_counts() -> bool:
    """Whether distance-only counts take the fused loop: where numba's target has a scalar POPCNT and no vector
    one (x86 without AVX-512 VPOPCNTDQ: there the two-phase loop's vectorised cells count bits by byte-table
    lookups). Fused against two-phase, 1,024 x 262,144 class codes, B = 64 / 128, on an Intel Xeon core: compiling
    for skylake (AVX2) 84 / 168 ms against 110 / 175 ms; for the host (AVX-512 VPOPCNTDQ) 83 / 153 ms against
    78 / 112 ms. AMD Zen 3 and Zen 4 agree (bench/README.md)."""
    scalar, vector = target_popcount()
    return scalar and not vector


def _grouped_multilabel() -> bool:
    """Whether multi-label blocks whose label rows recur may be grouped by label row (a grade per run, then
    distance counts with scalar POPCNTs): wherever numba's target has a scalar POPCNT. Engine-sized flickr1m
    blocks (2,048 x 262,144), grouped against two-phase, on an Intel Xeon core: 0.17 s against 0.31 s (AVX-512),
    0.19 s against 0.41 s compiling for skylake (AVX2); AMD Zen 3 and Zen 4 agree (bench/README.md)."""
    return target_popcount()[0]


_KERNELS: dict = {}
_COMPILE_LOCK = threading.Lock()


def _loaded(key: tuple, source):
    """The kernel of ``source(*key[1:])``, compiled (or loaded from numba's cache) once per process."""
    with _COMPILE_LOCK:
        if key not in _KERNELS:
            _KERNELS[key] = _compile(source(*key[1:]))
    return _KERNELS[key]


def _kernel(kind: str, words: int, label_words: int, joint: bool, top: int | None):
    return _loaded(("cells", kind, words, label_words, joint, top), _kernel_source)


def _fused_kernel(words: int):
    return _loaded(("fused", words), _fused_source)


def _grouped_kernel(words: int, label_words: int, capped: bool):
    return _loaded(("grouped", words, label_words, capped), _grouped_source)


@cached_njit(nogil=True)
def _apply_explicit(qc, dc, db_start, indptr, indices, grades, max_grade, H):
    """Move each listed pair inside this database block from grade 0 to its grade."""
    for q in range(qc.shape[0]):
        p0, p1 = listed_in_block(indptr, indices, q, db_start, dc.shape[0])
        for p in range(p0, p1):
            g = min(grades[p], max_grade)
            if g > 0:
                d = hamming(qc[q], dc[indices[p] - db_start])
                H[q, d, 0] -= 1
                H[q, d, g] += 1


def _as_int32_labels(query_labels, db_labels):
    """Class labels as int32 (faster compares); relabel jointly when they do not fit."""
    ql, dl = np.asarray(query_labels), np.asarray(db_labels)
    info = np.iinfo(np.int32)
    if all(a.size == 0 or (a.min() >= info.min and a.max() <= info.max) for a in (ql, dl)):
        return np.ascontiguousarray(ql, dtype=np.int32), np.ascontiguousarray(dl, dtype=np.int32)
    _, ids = np.unique(np.concatenate([ql, dl]), return_inverse=True)
    ids = ids.astype(np.int32)
    return ids[: len(ql)], ids[len(ql) :]


def as_words(*arrays) -> tuple[np.ndarray, ...]:
    """Code or label word rows as the C-contiguous uint64 arrays the kernels index."""
    return tuple(np.ascontiguousarray(a, dtype=np.uint64) for a in arrays)


def explicit_lists(query_rel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A query block's explicit ground truth, CSR (indptr, indices, grades), as int64 arrays."""
    indptr, indices, grades = (np.ascontiguousarray(a, dtype=np.int64) for a in query_rel)
    return indptr, indices, grades


def n_grades(kind: str, max_grade: int) -> int:
    """Size of the grade axis: 2 for class relevance, max_grade + 1 for graded kinds."""
    return 2 if kind == "class" else max_grade + 1


@cached_njit(nogil=True)
def _scatter_by_label(labels, lo, pos, order):
    """order[pos[l - lo]++] = j for each item j with label l: a counting sort's placement pass."""
    for j in range(labels.shape[0]):
        g = labels[j] - lo
        order[pos[g]] = j
        pos[g] += 1


def _group_by_label(labels, lo, n_labels):
    """Counting sort of items by label - lo in [0, n_labels): (order, starts of each label's run).

    starts has n_labels + 2 entries; label n_labels stands for "none" and has an empty run.
    """
    starts = np.zeros(n_labels + 2, dtype=np.int64)
    starts[1 : n_labels + 1] = np.cumsum(np.bincount(labels - lo, minlength=n_labels))
    starts[n_labels + 1] = starts[n_labels]
    order = np.empty(labels.shape[0], dtype=np.int64)
    _scatter_by_label(labels, lo, starts[:n_labels].copy(), order)
    return order, starts


def _count(qc, qr, items, dr, flat, segments, kind, words, label_words, grades, ncols, nbits, top=None):
    """Add the histograms of segments (q0, q1, d0, d1) to ``flat``; ``top``: the multi-label cap, if any."""
    segments = np.array(segments, dtype=np.int64).reshape(-1, 4)
    segments = segments[(segments[:, 1] > segments[:, 0]) & (segments[:, 3] > segments[:, 2])]
    if not len(segments):
        return
    if kind == "none" and 1 <= words <= MAX_FUSED_WORDS and _fused_distance_counts():
        J = np.zeros(_fused_tile(words) * _fused_row_length(words), np.int32)
        _fused_kernel(words)(qc, items, flat, segments, ncols, J)
        return
    ncell = grades * (nbits + 1)
    joint = ncell**2 <= MAX_JOINT_CELLS
    slots, span = (TILE // 2, ncell * ncell) if joint else (TILE, ncell)
    J, m = np.zeros(slots * span, np.int32), np.empty((TILE, ncell), np.int64)
    cells = np.empty((slots, CHUNK), np.uint32)
    _kernel(kind, words, label_words, joint, top)(qc, qr, items, dr, flat, segments, grades, ncols, J, m, cells)


def _class_split(qc, ql, items, dl, words, nbits):
    """Class histograms as all-items distance counts plus a same-label pass; None if not worth it.

    The database block is grouped by label (a counting sort) so that each query meets
    its relevant items as one contiguous run; grade 1 is counted over those runs only,
    and grade 0 is the distance histogram of all items minus grade 1.
    """
    Q, N = ql.shape[0], dl.shape[0]
    if Q == 0 or N == 0:
        return None
    lo, hi = int(dl.min()), int(dl.max())
    if Q < MIN_SPLIT_QUERIES or hi - lo > N:
        return None
    order, starts = _group_by_label(dl, lo, hi - lo + 1)
    run = np.where((ql >= lo) & (ql <= hi), ql.astype(np.int64) - lo, hi - lo + 1)
    if (starts[run + 1] - starts[run]).sum() > MAX_RELEVANT_FRACTION * Q * N:
        return None
    zq, zd = np.zeros(Q, dtype=np.int32), np.zeros(N, dtype=np.int32)
    H = np.zeros((Q, nbits + 1, 2), dtype=np.int64)
    _count(qc, zq, items, zd, H.reshape(Q, 2 * (nbits + 1)), (0, Q, 0, N), "none", words, 0, 1, 2, nbits)
    grouped = np.take(items, order, axis=1 if words else 0)
    qorder = np.argsort(run, kind="stable")
    qs = np.ascontiguousarray(qc[qorder])
    run = run[qorder]
    first = np.flatnonzero(np.r_[True, run[1:] != run[:-1]])
    segments = np.stack([first, np.r_[first[1:], Q], starts[run[first]], starts[run[first] + 1]], axis=1)
    same = np.zeros((Q, nbits + 1), dtype=np.int64)
    _count(qs, zq, grouped, zd, same, segments, "none", words, 0, 1, 1, nbits)
    H[qorder, :, 1] = same
    H[:, :, 0] -= H[:, :, 1]
    return H


def _labels_recur(labels) -> bool:
    """Whether most label rows of a strided sample of the block recur within the sample."""
    counts = distinct_rows(labels[:: max(1, len(labels) // LABEL_SAMPLE)]).counts
    return counts[counts > 1].sum() >= MIN_RECURRING_SHARE * counts.sum()


def _label_runs(labels):
    """Items grouped by label row: (items in runs of at least MIN_RUN equal rows, in run order; run starts
    in that list; the runs' label rows; the other items). The rows are told apart by hashing (3 ms for 262,144
    rows, where sorting them took 15-25 ms), and the items placed by a counting sort of their runs."""
    rows = distinct_rows(labels)
    long = rows.counts >= MIN_RUN
    n_runs = int(long.sum())
    run_of_row = np.full(len(long), n_runs, dtype=np.int64)  # rows of short runs: one last group, "the rest"
    run_of_row[long] = np.arange(n_runs)
    order, starts = _group_by_label(run_of_row[rows.inverse], 0, n_runs + 1)
    return order[: starts[n_runs]], starts[: n_runs + 1], rows.codes[long], order[starts[n_runs] :]


def _cap(query_labels, max_grade: int) -> int | None:
    """The multi-label kernels' cap on labels in common: ``max_grade``, or None when no query has more labels
    than that, as in every engine run (its max_grade is the most labels a query has). Without the cap the
    grouped kernel took 85 ms against 89 ms (znver3, the kernel bench's B = 64 runs)."""
    most = int(np.bitwise_count(query_labels).sum(axis=1).max(initial=0))
    return max_grade if most > max_grade else None


def _multilabel_grouped(qc, qr, items, dr, words, label_words, grades, nbits, top):
    """Multi-label histograms with the block grouped by label row: runs of MIN_RUN or
    more equal rows by the grouped kernel (a grade per run and query, then distance counts), the other
    items by the cell kernel. ``label_words``: the cell kernel's (0 for rows it loops over); ``top``: the
    cap on labels in common, if any (:func:`_cap`)."""
    Q = qc.shape[0]
    H = np.zeros((Q, nbits + 1, grades), dtype=np.int64)
    flat = H.reshape(Q, (nbits + 1) * grades)
    grouped, starts, run_labels, rest = _label_runs(dr)
    if len(grouped):
        J = np.zeros(GROUPED_TILE * grades * (nbits + 1), dtype=np.int32)
        kernel = _grouped_kernel(words, label_words, top is not None)
        kernel(qc, qr, np.take(items, grouped, axis=1), run_labels, starts, flat, grades, grades, J)
    if len(rest):
        rest_labels = np.ascontiguousarray(dr[rest].T if label_words else dr[rest])
        _count(qc, qr, np.take(items, rest, axis=1), rest_labels, flat, (0, Q, 0, len(rest)), "multilabel",
               words, label_words, grades, grades, nbits, top)
    return H


def histogram_block(
    query_codes: np.ndarray,
    db_codes: np.ndarray,
    nbits: int,
    kind: str,
    query_rel=None,
    db_rel=None,
    *,
    db_start: int = 0,
    max_grade: int = 1,
) -> np.ndarray:
    """Histogram of a query block against a database block, shape (Qb, nbits + 1, n_grades).

    kind="class": query_rel, db_rel are int label vectors; grade = 1 for equal labels.
    kind="multilabel": packed multi-hot word rows; grade = labels in common, capped at max_grade.
    kind="explicit": query_rel = (indptr, indices, grades) CSR over the query block with
    absolute database indices; db_start is the block's first database row.
    """
    qc, dc = as_words(query_codes, db_codes)
    ncols = n_grades(kind, max_grade)
    words = qc.shape[1] if qc.shape[1] <= MAX_UNROLLED_WORDS else 0
    items = np.ascontiguousarray(dc.T) if words else dc  # word-major
    label_words, grades, top = 0, ncols, None
    if kind == "class":
        qr, dr = _as_int32_labels(query_rel, db_rel)
        H = _class_split(qc, qr, items, dr, words, nbits)
        if H is not None:
            return H
    elif kind == "multilabel":
        qr, dr = as_words(query_rel, db_rel)
        label_words = qr.shape[1] if qr.shape[1] <= MAX_UNROLLED_WORDS else 0
        top = _cap(qr, max_grade)
        if 1 <= words <= MAX_GROUPED_WORDS and dr.shape[1] and _grouped_multilabel() \
                and qc.shape[0] >= MIN_SPLIT_QUERIES and qc.shape[0] * dc.shape[0] >= MIN_GROUPED_PAIRS \
                and _labels_recur(dr):
            return _multilabel_grouped(qc, qr, items, dr, words, label_words, ncols, nbits, top)
        if label_words:
            dr = np.ascontiguousarray(dr.T)  # word-major
    elif kind == "explicit":
        grades = 1
        qr = np.zeros(qc.shape[0], dtype=np.int32)
        dr = np.zeros(dc.shape[0], dtype=np.int32)
    else:
        raise ValueError(f"unknown relevance kind {kind!r}")
    H = np.zeros((qc.shape[0], nbits + 1, ncols), dtype=np.int64)
    base_kind = "none" if kind == "explicit" else kind
    _count(qc, qr, items, dr, H.reshape(qc.shape[0], (nbits + 1) * ncols), (0, qc.shape[0], 0, dc.shape[0]),
           base_kind, words, label_words, grades, ncols, nbits, top)
    if kind == "explicit":
        _apply_explicit(qc, dc, db_start, *explicit_lists(query_rel), max_grade, H)
    return H
