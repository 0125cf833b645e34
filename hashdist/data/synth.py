"""Synthetic and small real datasets for demos, tests and benchmarks.

:func:`synth_dataset` writes class-structured random codes of any size, chunk by
chunk in bounded memory. Every class (or, for multi-label data, every concept)
has a random centre code; an item's code is its class centre, or for multi-label
items a per-bit random mix of its concepts' centres, with each bit then flipped
independently with probability ``noise``. With probability ``collision`` an item
instead gets exactly the centre code of its (first) class, so many items share a
code, as with supervised hashing models. With ``prototypes`` P > 0, every class (concept)
instead has P prototype codes (its centre with each bit flipped with probability
``noise``) and an item copies one of its (first) class's prototypes, a fraction
``stray`` of items with one random bit flipped: most items then sit on a few codes per
class, the collapse of supervised codes (preset ``collisions``).

Rows are generated in fixed generation blocks whose size depends only on the
parameters (not on ``chunk_rows``), each from its own random streams seeded by
``(seed, part, block, stream)``. The stored rows therefore depend only on the
parameters and the seed; the fingerprints also depend on the chunk sizes.

:func:`digits_dataset` hashes scikit-learn's bundled 8x8 digits (1,797 images,
10 classes, no download) with LSH, PCA hashing or ITQ.

:func:`features_dataset` writes SIFT-1M-like real-valued features (a Gaussian
mixture) with their LSH or ITQ codes and no labels: ground truth comes from the
features (``hashdist groundtruth``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hashdist.data.atomic import check_apart, check_output, read_marker, staged_directory
from hashdist.data.bits import n_words, pack_bits, unpack_bits
from hashdist.data.dataset import (
    DEFAULT_CHUNK_ROWS,
    DEFAULT_QUERY_CHUNK_ROWS,
    MAX_NBITS,
    DatasetWriter,
)
from hashdist.errors import InputError, check_integer, check_number

__all__ = ["PRESETS", "synth_dataset", "digits_dataset", "features_dataset"]

PRESETS: dict[str, dict] = {
    "demo": dict(
        n_database=20_000, n_queries=500, nbits=64, labels="multilabel", n_concepts=24,
        labels_per_item=1.9, noise=0.05, collision=0.2,
    ),
    "flickr1m": dict(
        n_database=1_000_000, n_queries=10_000, nbits=64, labels="multilabel", n_concepts=24,
        labels_per_item=1.9, noise=0.15, collision=0.0,
    ),
    "nuswide": dict(
        n_database=200_000, n_queries=2_000, nbits=64, labels="multilabel", n_concepts=81,
        labels_per_item=1.9, noise=0.15, collision=0.0,
    ),
    "cifar": dict(
        n_database=59_000, n_queries=1_000, nbits=64, labels="class", n_classes=10,
        noise=0.15, collision=0.0,
    ),
    # cross-modal, MIRFlickr-25K sizes (2,000 queries, 18,015 database, 24 labels): an image and a text code per
    # item; the text code is the image code with each bit flipped again with probability text_noise
    "mirflickr25k-xm": dict(
        n_database=18_015, n_queries=2_000, nbits=64, labels="multilabel", n_concepts=24,
        labels_per_item=1.9, noise=0.08, collision=0.0, text_noise=0.06,
    ),
    # collapsed supervised codes: 200 codes per class hold 99% of the items (about 2% distinct rows)
    "collisions": dict(
        n_database=200_000, n_queries=2_000, nbits=64, labels="class", n_classes=10,
        noise=0.15, collision=0.0, prototypes=200, stray=0.01,
    ),
}

LABEL_KINDS = ("class", "multilabel")
DIGITS_METHODS = ("lsh", "pcah", "itq")
MAX_CLASSES = 1_000_000
MAX_CENTRE_BITS = 1 << 30  # packed class centres (or prototypes) take at most 128 MiB
MAX_CONCEPTS = 4096
ZIPF_EXPONENT = 1.0  # concept c is drawn with weight (c + 1) ** -ZIPF_EXPONENT
ITQ_ITERATIONS = 50
GEN_ELEMENTS = 1 << 21  # rows per generation block * max(nbits, n_concepts, 64)

_PART_IDS = {"database": 0, "queries": 1}
_CENTRES = 2
_PROTOTYPES = 3
# independent random streams within one generation block
_S_LABELS, _S_MIX, _S_NOISE, _S_COLLISION, _S_PROTOTYPE, _S_STRAY, _S_TEXT = range(7)


# -- synthetic codes ----------------------------------------------------------


def _check_choice(value, choices: tuple[str, ...], option: str) -> str:
    """``value`` if it is one of ``choices``; else InputError naming ``option``."""
    if value not in choices:
        raise InputError(f"{option} must be one of {', '.join(choices)}, got {value!r}")
    return value


def _gen_rows(nbits: int, width: int) -> int:
    return max(16, GEN_ELEMENTS // max(nbits, width, 64))


def _rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng([seed, *key])


def _concept_log_weights(n_concepts: int) -> np.ndarray:
    return -ZIPF_EXPONENT * np.log(np.arange(1, n_concepts + 1, dtype=np.float64))


def _draw_concepts(rng: np.random.Generator, n: int, n_concepts: int, labels_per_item: float,
                   log_w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per item: k ~ 1 + Poisson(labels_per_item - 1) capped at n_concepts distinct concepts,
    drawn without replacement with Zipf weights (Gumbel top-k). Returns (lab (n, kmax) with
    -1 padding, in draw order, and k (n,))."""
    k = 1 + rng.poisson(labels_per_item - 1.0, size=n)
    np.minimum(k, n_concepts, out=k)
    kmax = int(k.max())
    keys = log_w[None, :] + rng.gumbel(size=(n, n_concepts))
    if kmax < n_concepts:
        top = np.argpartition(-keys, kmax - 1, axis=1)[:, :kmax]
    else:
        top = np.broadcast_to(np.arange(n_concepts), (n, n_concepts))
    order = np.argsort(-np.take_along_axis(keys, top, axis=1), axis=1, kind="stable")
    lab = np.take_along_axis(top, order, axis=1).astype(np.int64)
    lab[np.arange(kmax)[None, :] >= k[:, None]] = -1
    return lab, k


def _multi_hot_words(lab: np.ndarray, n_labels: int) -> np.ndarray:
    n, kmax = lab.shape
    words = np.zeros((n, n_words(n_labels)), dtype=np.uint64)
    rows = np.arange(n)
    for t in range(kmax):  # each row appears once per column, so |= is safe
        col = lab[:, t]
        ok = col >= 0
        c = col[ok]
        words[rows[ok], c >> 6] |= np.left_shift(np.uint64(1), (c & 63).astype(np.uint64))
    return words


def _check_prototypes(prototypes, stray, n_centres: int, nbits: int) -> tuple[int, float]:
    prototypes = check_integer(prototypes, "--prototypes", 0)
    stray = check_number(stray, "--stray", 0.0, 1.0)
    if prototypes * n_centres * nbits > MAX_CENTRE_BITS:
        raise InputError(f"--prototypes {prototypes} x {n_centres} classes x --nbits {nbits} exceeds "
                         f"{MAX_CENTRE_BITS} prototype bits")
    if stray > 0 and not prototypes:
        raise InputError("--stray needs --prototypes")
    return prototypes, stray


class _Generator:
    def __init__(self, *, nbits, labels, n_classes, n_concepts, labels_per_item, noise, collision, seed,
                 prototypes=0, stray=0.0):
        self.nbits, self.labels, self.noise, self.collision, self.seed = nbits, labels, noise, collision, seed
        self.labels_per_item = labels_per_item
        self.prototypes, self.stray = prototypes, stray
        crng = _rng(seed, _CENTRES)
        if labels == "class":
            self.n_centres = n_classes
            self.width = 1
        else:
            self.n_centres = n_concepts
            self.width = n_concepts
            self.log_w = _concept_log_weights(n_concepts)
        # centres are generated in row blocks so huge class counts never need unpacked bits
        blocks = []
        step = max(1, GEN_ELEMENTS // max(nbits, 64))
        for i in range(0, self.n_centres, step):
            m = min(step, self.n_centres - i)
            blocks.append(pack_bits(crng.integers(0, 2, size=(m, nbits), dtype=np.uint8)))
        self.centre_words = np.concatenate(blocks)
        if labels == "multilabel":  # at most 4096 x 4096 bytes
            self.centre_bits = unpack_bits(self.centre_words, nbits)
        if prototypes:  # prototype p of class c is row c * prototypes + p: its centre plus noise
            prng, blocks = _rng(seed, _PROTOTYPES), []
            for i in range(0, self.n_centres * prototypes, step):
                rows = np.arange(i, min(i + step, self.n_centres * prototypes))
                flips = pack_bits(prng.random((len(rows), nbits), dtype=np.float32) < noise)
                blocks.append(self.centre_words[rows // prototypes] ^ flips)
            self.prototype_words = np.concatenate(blocks)
        self.gen_rows = _gen_rows(nbits, self.width)

    def _copy_prototypes(self, key, primary: np.ndarray) -> np.ndarray:
        """Codes of items whose (first) class is ``primary``: a random prototype each, some with a bit flipped."""
        n = primary.shape[0]
        pick = _rng(*key, _S_PROTOTYPE).integers(0, self.prototypes, size=n, dtype=np.int64)
        words = self.prototype_words[primary * self.prototypes + pick]
        if self.stray > 0:
            rs = _rng(*key, _S_STRAY)
            hit = np.flatnonzero(rs.random(n) < self.stray)
            bit = rs.integers(0, self.nbits, size=hit.shape[0], dtype=np.int64)
            words[hit, bit >> 6] ^= np.left_shift(np.uint64(1), (bit & 63).astype(np.uint64))
        return words

    def block(self, part: str, b: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows of generation block ``b`` of ``part`` (n rows): (code words, labels)."""
        key = (self.seed, _PART_IDS[part], b)
        rl, rm, rn, rc = (_rng(*key, s) for s in (_S_LABELS, _S_MIX, _S_NOISE, _S_COLLISION))
        nbits = self.nbits
        if self.labels == "class":
            primary = rl.integers(0, self.n_centres, size=n, dtype=np.int64)
            labels = primary
            if self.prototypes:
                words = self._copy_prototypes(key, primary)
            else:
                words = self.centre_words[primary]
                if self.noise > 0:
                    words = words ^ pack_bits(rn.random((n, nbits), dtype=np.float32) < self.noise)
        else:
            lab, k = _draw_concepts(rl, n, self.n_centres, self.labels_per_item, self.log_w)
            primary = lab[:, 0]
            labels = _multi_hot_words(lab, self.n_centres)
            if self.prototypes:
                words = self._copy_prototypes(key, primary)
            else:
                if int(k.max()) == 1:
                    bits = self.centre_bits[primary]
                else:
                    slot = rm.integers(0, k[:, None], size=(n, nbits), dtype=np.int64)
                    chosen = np.take_along_axis(lab, slot, axis=1)
                    bits = self.centre_bits[chosen, np.arange(nbits)[None, :]]
                if self.noise > 0:
                    bits ^= (rn.random((n, nbits), dtype=np.float32) < self.noise).view(np.uint8)
                words = pack_bits(bits)
        if self.collision > 0:
            hit = rc.random(n) < self.collision
            words[hit] = self.centre_words[primary[hit]]
        return np.ascontiguousarray(words, dtype=np.uint64), labels

    def blocks(self, part: str, n: int):
        """The (code words, labels) of the first n rows of ``part``, generation block by block."""
        for b, start in enumerate(range(0, n, self.gen_rows)):
            yield self.block(part, b, min(self.gen_rows, n - start))

    def write(self, writer: DatasetWriter, part: str, n: int, text_noise: float | None = None) -> None:
        """The first n rows of ``part``; with ``text_noise``, as modalities ``image`` (the codes) and ``text`` (the
        image codes with each bit flipped again with probability ``text_noise``, from its own random stream)."""
        for b, (words, labels) in enumerate(self.blocks(part, n)):
            if text_noise is None:
                writer.add_codes(part, words)
            else:
                flips = _rng(self.seed, _PART_IDS[part], b, _S_TEXT).random((len(words), self.nbits), dtype=np.float32)
                writer.add_codes(part, words, "image")
                writer.add_codes(part, words ^ pack_bits(flips < text_noise), "text")
            writer.add_labels(part, labels)


def synth_dataset(
    out,
    *,
    n_database: int,
    n_queries: int,
    nbits: int = 64,
    labels: str = "multilabel",
    n_classes: int = 10,
    n_concepts: int = 24,
    labels_per_item: float = 1.9,
    noise: float = 0.15,
    collision: float = 0.0,
    prototypes: int = 0,
    stray: float = 0.0,
    seed: int = 0,
    text_noise: float | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    query_chunk_rows: int = DEFAULT_QUERY_CHUNK_ROWS,
    overwrite: bool = False,
) -> str:
    """Write a synthetic class-structured dataset to ``out`` and return its URL.

    ``labels="class"``: each item has one uniformly drawn class of ``n_classes``;
    labels are stored as int64 class ids (relevance "class").
    ``labels="multilabel"``: each item has ``1 + Poisson(labels_per_item - 1)``
    distinct concepts (capped at ``n_concepts``) drawn with Zipf-like popularity
    (concept 0 the most popular); its code takes each bit from the centre of a
    randomly chosen one of its concepts. Labels are stored packed multi-hot
    (relevance "multilabel"). Queries are independent items of the same distribution.
    ``prototypes`` > 0: an item's code is one of ``prototypes`` fixed codes of its (first) class
    (each the class centre plus ``noise``), a fraction ``stray`` of items with one bit flipped.
    ``text_noise``: a cross-modal dataset with modalities ``image`` (the codes above) and ``text`` (each image
    code with every bit flipped again with probability ``text_noise``: the same item, a noisier modality).
    """
    n_database = check_integer(n_database, "--n-database", 1)
    if text_noise is not None:
        text_noise = check_number(text_noise, "--text-noise", 0.0, 1.0)
    n_queries = check_integer(n_queries, "--n-queries", 1)
    options = _generator_options(nbits=nbits, labels=labels, n_classes=n_classes, n_concepts=n_concepts,
                                 labels_per_item=labels_per_item, noise=noise, collision=collision,
                                 prototypes=prototypes, stray=stray, seed=seed)
    chunk_rows = check_integer(chunk_rows, "--chunk-rows", 1)
    query_chunk_rows = check_integer(query_chunk_rows, "--query-chunk-rows", 1)
    gen = _Generator(**options)
    params, relevance, n_labels = _synth_record(n_database, n_queries, options)
    params["generation_rows"] = gen.gen_rows
    if text_noise is not None:  # recorded only when used: earlier datasets keep their attributes
        params.update(modalities=["image", "text"], text_noise=text_noise)
    with DatasetWriter(
        out, nbits=options["nbits"], relevance=relevance, n_labels=n_labels, chunk_rows=chunk_rows,
        query_chunk_rows=query_chunk_rows, overwrite=overwrite, extra_attrs={"synth": params},
    ) as writer:
        gen.write(writer, "database", n_database, text_noise)
        gen.write(writer, "queries", n_queries, text_noise)
    return writer.url


def _generator_options(*, nbits, labels, n_classes, n_concepts, labels_per_item, noise, collision, prototypes, stray,
                       seed) -> dict:
    """The checked options of :class:`_Generator` for :func:`synth_dataset`."""
    nbits = check_integer(nbits, "--nbits", 1, MAX_NBITS)
    _check_choice(labels, LABEL_KINDS, "--labels")
    n_classes = check_integer(n_classes, "--n-classes", 1, MAX_CLASSES)
    if labels == "class" and n_classes * nbits > MAX_CENTRE_BITS:
        raise InputError(f"--n-classes {n_classes} x --nbits {nbits} exceeds {MAX_CENTRE_BITS} centre bits")
    n_concepts = check_integer(n_concepts, "--n-concepts", 1, MAX_CONCEPTS)
    labels_per_item = check_number(labels_per_item, "--labels-per-item", 1.0)
    noise = check_number(noise, "--noise", 0.0, 1.0)
    collision = check_number(collision, "--collision", 0.0, 1.0)
    prototypes, stray = _check_prototypes(prototypes, stray, n_classes if labels == "class" else n_concepts, nbits)
    seed = check_integer(seed, "--seed", 0)
    return dict(nbits=nbits, labels=labels, n_classes=n_classes, n_concepts=n_concepts,
                labels_per_item=labels_per_item, noise=noise, collision=collision, seed=seed, prototypes=prototypes,
                stray=stray)


def _synth_record(n_database: int, n_queries: int, o: dict) -> tuple[dict, tuple[str, ...], int]:
    """A synthetic dataset's "synth" attributes (without the generation rows), relevance and label count."""
    params = dict(
        kind="synthetic", n_database=n_database, n_queries=n_queries, nbits=o["nbits"], labels=o["labels"],
        noise=o["noise"], collision=o["collision"], seed=o["seed"],
    )
    if o["labels"] == "class":
        params.update(n_classes=o["n_classes"])
        relevance, n_labels = ("class",), 0
    else:
        params.update(n_concepts=o["n_concepts"], labels_per_item=o["labels_per_item"], zipf_exponent=ZIPF_EXPONENT)
        relevance, n_labels = ("multilabel",), o["n_concepts"]
    if o["prototypes"]:  # recorded only when used: earlier datasets keep their attributes
        params.update(prototypes=o["prototypes"], stray=o["stray"])
    return params, relevance, n_labels


POOLED_FORMAT = "hashdist-pooled"  # the marker of a pooled directory (synth --pooled), which --overwrite replaces
POOLED_MARKER_FILE = "hashdist.json"


def _is_pooled(path: Path) -> bool:
    return read_marker(path / POOLED_MARKER_FILE, "format") == POOLED_FORMAT


def _write_pooled(out, n: int, nbits: int, label_shape: tuple, label_dtype, blocks, overwrite: bool) -> str:
    """DIR/codes.npy ((n, nbits) uint8 0/1) and DIR/labels.npy from (code bits, labels) row blocks, staged."""
    out = check_output(out, "pooled directory", _is_pooled, overwrite=overwrite)
    with staged_directory(out) as tmp:
        (tmp / POOLED_MARKER_FILE).write_text(json.dumps({"format": POOLED_FORMAT, "n_items": n, "nbits": nbits}))
        codes = np.lib.format.open_memmap(tmp / "codes.npy", mode="w+", dtype=np.uint8, shape=(n, nbits))
        labels = np.lib.format.open_memmap(tmp / "labels.npy", mode="w+", dtype=label_dtype, shape=(n, *label_shape))
        start = 0
        for bits, lab in blocks:
            codes[start : start + len(bits)] = bits
            labels[start : start + len(bits)] = lab
            start += len(bits)
        codes.flush()
        labels.flush()
        del codes, labels
    return str(out)


def synth_pooled(out, *, n_items: int, nbits: int = 64, labels: str = "multilabel", n_classes: int = 10,
                 n_concepts: int = 24, labels_per_item: float = 1.9, noise: float = 0.15, collision: float = 0.0,
                 prototypes: int = 0, stray: float = 0.0, seed: int = 0, overwrite: bool = False) -> str:
    """Every item of a synthetic dataset, unsplit (``hashdist synth --pooled DIR``), for ``hashdist split``:
    DIR/codes.npy ((N, B) uint8 0/1) and DIR/labels.npy (class ids, or (N, concepts) uint8 multi-hot)."""
    n_items = check_integer(n_items, "--n-items", 2)
    nbits = check_integer(nbits, "--nbits", 1, MAX_NBITS)
    _check_choice(labels, LABEL_KINDS, "--labels")
    n_classes = check_integer(n_classes, "--n-classes", 1, MAX_CLASSES)
    n_concepts = check_integer(n_concepts, "--n-concepts", 1, MAX_CONCEPTS)
    prototypes, stray = _check_prototypes(prototypes, stray, n_classes if labels == "class" else n_concepts, nbits)
    gen = _Generator(nbits=nbits, labels=labels, n_classes=n_classes, n_concepts=n_concepts,
                     labels_per_item=check_number(labels_per_item, "--labels-per-item", 1.0),
                     noise=check_number(noise, "--noise", 0.0, 1.0),
                     collision=check_number(collision, "--collision", 0.0, 1.0), seed=check_integer(seed, "--seed", 0),
                     prototypes=prototypes, stray=stray)

    def blocks():
        for words, lab in gen.blocks("database", n_items):
            yield unpack_bits(words, nbits), lab if labels == "class" else unpack_bits(lab, n_concepts)

    shape, dtype = ((), np.int64) if labels == "class" else ((n_concepts,), np.uint8)
    return _write_pooled(out, n_items, nbits, shape, dtype, blocks(), overwrite)


# -- digits -------------------------------------------------------------------


def _pca_directions(x: np.ndarray, k: int) -> np.ndarray:
    """Top-k principal directions (columns) of centred data x, with a deterministic sign."""
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    p = vt[:k].T
    flip = np.sign(p[np.argmax(np.abs(p), axis=0), np.arange(k)])
    return p * np.where(flip == 0, 1.0, flip)


def _itq_rotation(v: np.ndarray, rng: np.random.Generator, iterations: int = ITQ_ITERATIONS) -> np.ndarray:
    """Iterative Quantization (Gong & Lazebnik 2011): orthogonal R minimising ||B - VR||_F."""
    k = v.shape[1]
    r, _ = np.linalg.qr(rng.standard_normal((k, k)))
    for _ in range(iterations):
        b = np.where(v @ r >= 0, 1.0, -1.0)
        # orthogonal Procrustes: V^T B = U S W^T  ->  R = U W^T
        u, _, wt = np.linalg.svd(v.T @ b)
        r = u @ wt
    return r


def _digits_hashing(method: str, nbits: int, x_train: np.ndarray, rng: np.random.Generator):
    """(mean, projection W) learned on training features: codes are (x - mean) @ W > 0."""
    mean = x_train.mean(axis=0)
    if method == "lsh":
        return mean, rng.standard_normal((x_train.shape[1], nbits))
    w = _pca_directions(x_train - mean, nbits)
    if method == "itq":
        w = w @ _itq_rotation((x_train - mean) @ w, rng)
    return mean, w


def digits_dataset(
    out,
    *,
    method: str = "itq",
    nbits: int = 32,
    n_queries: int = 297,
    seed: int = 0,
    overwrite: bool = False,
    splits=None,
    strategy: str | None = None,
    run: int | None = None,
    validation: bool = False,
) -> str:
    """Hash scikit-learn's bundled digits with LSH, PCAH or ITQ and write a class-labelled dataset.

    Without ``splits``, a seeded permutation puts the first ``n_queries`` images in the queries and the
    rest in the database, and the hashing is learned on the database. With a ``hashdist split`` store
    (1,797 items), the queries and database are that run's (test pair, or validation pair) and the
    hashing is learned on its training set: one dataset per run for repeated-run comparisons.
    """
    from sklearn.datasets import load_digits

    _check_choice(method, DIGITS_METHODS, "--method")
    nbits = check_integer(nbits, "--nbits", 1, MAX_NBITS)
    seed = check_integer(seed, "--seed", 0)
    check_apart(out, (splits,))
    x, y = load_digits(return_X_y=True)
    n, d = x.shape
    if method in ("pcah", "itq") and nbits > d:
        raise InputError(f"--nbits {nbits} exceeds the {d} digit features ({method} needs nbits <= {d})")
    rng = np.random.default_rng(seed)
    params = dict(kind="digits", source="sklearn.datasets.load_digits", method=method, nbits=nbits, seed=seed)
    extra = {}  # a split run's record
    if splits is None:
        n_queries = check_integer(n_queries, "--n-queries", 1, n - 1)
        perm = rng.permutation(n)
        qi, di = perm[:n_queries], perm[n_queries:]
        ti, trained_on = di, "database"
    else:
        qi, di, ti, extra["split"] = _digits_split(splits, strategy, run, validation, y)
        trained_on = "training"
    params.update(n_queries=len(qi), n_database=len(di), trained_on=trained_on)
    mean, w = _digits_hashing(method, nbits, x[ti], rng)
    params["centring"] = f"{params['trained_on']} mean"
    if method == "itq":
        params["itq_iterations"] = ITQ_ITERATIONS
    with DatasetWriter(out, nbits=nbits, relevance=("class",), overwrite=overwrite,
                       extra_attrs={"synth": params, **extra}) as writer:
        for part, rows in (("database", di), ("queries", qi)):
            writer.add_codes(part, pack_bits(_sign_bits(x[rows], mean, w)))
            writer.add_labels(part, y[rows].astype(np.int64))
    return writer.url


def _digits_split(splits, strategy, run, validation: bool, y: np.ndarray):
    """(query rows, database rows, training rows, the split record) of run ``run`` of a ``hashdist split`` store
    of the digits (labels ``y``)."""
    from hashdist.data.ingest import split_record, split_roles
    from hashdist.data.splits import check_drawn_from, read_split, store_attrs

    roles, attrs = read_split(splits, strategy, run), store_attrs(splits)
    if max(int(v.max(initial=-1)) for v in roles.values()) >= len(y):
        raise InputError(f"{splits}: its indices exceed the {len(y)} digits (split it from the digits' labels)")
    check_drawn_from(splits, attrs, y, f"{splits}: the digits' labels")
    query_role, db_role = split_roles(strategy, validation)
    qi, di, ti = roles[query_role], roles[db_role], roles["training"]
    if not len(qi) or not len(di) or not len(ti):
        raise InputError(f"{splits}: run {run} has an empty {query_role}, {db_role} or training set")
    # as ingest --splits records it
    return qi, di, ti, split_record(splits, attrs, strategy, run, validation, roles)


def _sign_bits(x: np.ndarray, mean: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Code bits (uint8 0/1) of features x: the signs of (x - mean) @ w."""
    return ((x - mean) @ w > 0).astype(np.uint8)


def digits_pooled(out, *, method: str = "itq", nbits: int = 32, seed: int = 0, overwrite: bool = False) -> str:
    """The digits unsplit (``hashdist synth --digits METHOD --pooled DIR``): DIR/labels.npy (1,797 class ids)
    for ``hashdist split``, and DIR/codes.npy hashed by a model learned on all of them."""
    from sklearn.datasets import load_digits

    _check_choice(method, DIGITS_METHODS, "--method")
    nbits = check_integer(nbits, "--nbits", 1, MAX_NBITS)
    x, y = load_digits(return_X_y=True)
    mean, w = _digits_hashing(method, nbits, x, np.random.default_rng(check_integer(seed, "--seed", 0)))
    return _write_pooled(out, len(y), nbits, (), np.int64, [(_sign_bits(x, mean, w), y.astype(np.int64))], overwrite)


# -- features -------------------------------------------------------------------

FEATURE_METHODS = ("lsh", "itq")
CLUSTER_STD = 0.5  # within-cluster standard deviation per dimension; centres are N(0, 1)
TRAIN_ROWS = 20_000  # ITQ is trained on this many extra draws from the same mixture
_TRAIN = 2
# random streams of the features generator (centres and hash function share _S_CENTRES' block)
_S_CLUSTER, _S_OFFSET, _S_CENTRES, _S_HASH = range(4)


def _mixture_rows(seed: int, part: int, b: int, n: int, centres: np.ndarray) -> np.ndarray:
    rng_c, rng_o = _rng(seed, part, b, _S_CLUSTER), _rng(seed, part, b, _S_OFFSET)
    cluster = rng_c.integers(0, len(centres), size=n)
    x = rng_o.standard_normal((n, centres.shape[1]), dtype=np.float32)
    x *= np.float32(CLUSTER_STD)
    x += centres[cluster]
    return x


def features_dataset(
    out,
    *,
    n_database: int,
    n_queries: int,
    dim: int = 128,
    nbits: int = 64,
    method: str = "lsh",
    n_clusters: int = 1000,
    seed: int = 0,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    query_chunk_rows: int = DEFAULT_QUERY_CHUNK_ROWS,
    overwrite: bool = False,
) -> str:
    """Write float32 Gaussian-mixture features with LSH or ITQ codes (no labels); returns the URL.

    Items (database and queries alike) pick one of ``n_clusters`` centres drawn from N(0, I)
    uniformly and add N(0, CLUSTER_STD^2 I). Codes are the signs of projections of the
    features centred on the mean centre: random Gaussian directions (``lsh``), or the top
    ``nbits`` principal directions rotated by ITQ (``itq``, nbits <= dim), trained on
    TRAIN_ROWS extra draws. Rows come in fixed generation blocks with their own random
    streams, so they depend only on the parameters and the seed.
    """
    n_database = check_integer(n_database, "--n-database", 1)
    n_queries = check_integer(n_queries, "--n-queries", 1)
    dim = check_integer(dim, "--dim", 1, 65536)
    nbits = check_integer(nbits, "--nbits", 1, MAX_NBITS)
    _check_choice(method, FEATURE_METHODS, "--features")
    if method == "itq" and nbits > dim:
        raise InputError(f"--nbits {nbits} exceeds --dim {dim} (itq needs nbits <= dim)")
    n_clusters = check_integer(n_clusters, "--n-clusters", 1, MAX_CLASSES)
    seed = check_integer(seed, "--seed", 0)
    chunk_rows = check_integer(chunk_rows, "--chunk-rows", 1)
    query_chunk_rows = check_integer(query_chunk_rows, "--query-chunk-rows", 1)

    rng = _rng(seed, _CENTRES, _S_CENTRES)
    centres = rng.standard_normal((n_clusters, dim)).astype(np.float32)
    mean = centres.mean(axis=0, dtype=np.float64)
    hash_rng = _rng(seed, _CENTRES, _S_HASH)
    if method == "lsh":
        w = hash_rng.standard_normal((dim, nbits))
    else:
        train = _mixture_rows(seed, _TRAIN, 0, TRAIN_ROWS, centres) - mean
        w = _pca_directions(train, nbits)
        w = w @ _itq_rotation(train @ w, hash_rng)
    w = w.astype(np.float32)
    gen_rows = _gen_rows(nbits, dim)
    params = dict(kind="features", n_database=n_database, n_queries=n_queries, dim=dim, nbits=nbits, method=method,
                  n_clusters=n_clusters, cluster_std=CLUSTER_STD, seed=seed, generation_rows=gen_rows)
    if method == "itq":
        params.update(itq_iterations=ITQ_ITERATIONS, train_rows=TRAIN_ROWS)
    with DatasetWriter(out, nbits=nbits, relevance=(), chunk_rows=chunk_rows, query_chunk_rows=query_chunk_rows,
                       overwrite=overwrite, extra_attrs={"synth": params}) as writer:
        for part, n in (("database", n_database), ("queries", n_queries)):
            for b, start in enumerate(range(0, n, gen_rows)):
                x = _mixture_rows(seed, _PART_IDS[part], b, min(gen_rows, n - start), centres)
                writer.add_features(part, x)
                writer.add_codes(part, pack_bits(_sign_bits(x, mean.astype(np.float32), w)))
    return writer.url
