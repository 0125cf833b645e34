import numpy as np
import pytest

from hashdist.data.bits import n_words, unpack_bits
from hashdist.data.dataset import open_dataset
from hashdist.data.synth import PRESETS, digits_dataset, synth_dataset
from hashdist.errors import InputError


def _all(ds, name):
    part, _, arr = name.partition("/")
    n = ds.n_database if part == "database" else ds.n_queries
    return ds.read(name, 0, n)


def _distinct(words):
    return len(np.unique(words, axis=0))


def _hamming(bits_a, bits_b):
    a = bits_a.astype(np.float64)
    b = bits_b.astype(np.float64)
    return a @ (1 - b).T + (1 - a) @ b.T


# -- synth_dataset -------------------------------------------------------------


def test_presets_have_required_entries():
    assert PRESETS["demo"]["n_database"] == 20_000 and PRESETS["demo"]["n_queries"] == 500
    assert PRESETS["demo"]["nbits"] == 64 and PRESETS["demo"]["n_concepts"] == 24
    assert PRESETS["flickr1m"]["n_database"] == 1_000_000 and PRESETS["flickr1m"]["n_queries"] == 10_000
    assert PRESETS["nuswide"]["n_concepts"] == 81 and PRESETS["nuswide"]["labels"] == "multilabel"
    assert PRESETS["cifar"]["labels"] == "class" and PRESETS["cifar"]["n_classes"] == 10
    assert PRESETS["cifar"]["n_database"] == 59_000 and PRESETS["cifar"]["n_queries"] == 1_000


def test_demo_preset_writes_and_opens(tmp_path):
    url = synth_dataset(tmp_path / "demo", **PRESETS["demo"])
    ds = open_dataset(url)
    assert (ds.n_database, ds.n_queries, ds.nbits) == (20_000, 500, 64)
    assert ds.relevance_kinds == ("multilabel",) and ds.n_labels == 24
    assert ds.attrs()["synth"]["n_concepts"] == 24


@pytest.mark.parametrize("nbits", [1, 13, 64, 100, 130])
def test_class_shapes(tmp_path, nbits):
    url = synth_dataset(tmp_path / "c", n_database=1000, n_queries=37, nbits=nbits, labels="class", n_classes=7,
                        chunk_rows=256, query_chunk_rows=16)
    ds = open_dataset(url)
    assert (ds.n_database, ds.n_queries, ds.nbits) == (1000, 37, nbits)
    assert ds.relevance_kinds == ("class",)
    codes = _all(ds, "database/codes")
    assert codes.shape == (1000, n_words(nbits)) and codes.dtype == np.uint64
    if nbits % 64:  # unused high bits stay clear
        assert not np.any(codes[:, -1] >> np.uint64(nbits % 64))
    labels = _all(ds, "database/labels")
    assert labels.shape == (1000,) and labels.dtype == np.int64
    assert labels.min() >= 0 and labels.max() < 7
    assert _all(ds, "queries/labels").shape == (37,)


def test_multilabel_shapes_and_statistics(tmp_path):
    url = synth_dataset(tmp_path / "m", n_database=20_000, n_queries=300, nbits=32, n_concepts=81,
                        labels_per_item=2.5)
    ds = open_dataset(url)
    assert ds.relevance_kinds == ("multilabel",) and ds.n_labels == 81
    packed = _all(ds, "database/labels")
    assert packed.shape == (20_000, 2) and packed.dtype == np.uint64
    assert not np.any(packed[:, 1] >> np.uint64(81 - 64))
    hot = unpack_bits(packed, 81)
    per_item = hot.sum(axis=1)
    assert per_item.min() >= 1
    assert abs(per_item.mean() - 2.5) < 0.1
    freq = hot.mean(axis=0)
    assert freq[0] > 3 * freq[-1]  # skewed popularity
    assert _all(ds, "queries/labels").shape == (300, 2)


def test_multilabel_cap_at_n_concepts(tmp_path):
    url = synth_dataset(tmp_path / "m", n_database=500, n_queries=10, nbits=16, n_concepts=3, labels_per_item=20)
    hot = unpack_bits(_all(open_dataset(url), "database/labels"), 3)
    assert hot.sum(axis=1).max() == 3 and hot.sum(axis=1).min() >= 1


def test_deterministic_and_seed_dependent(tmp_path):
    kw = dict(n_database=3000, n_queries=50, nbits=48, chunk_rows=1000, collision=0.2)
    a = open_dataset(synth_dataset(tmp_path / "a", **kw, seed=3))
    b = open_dataset(synth_dataset(tmp_path / "b", **kw, seed=3))
    c = open_dataset(synth_dataset(tmp_path / "c", **kw, seed=4))
    assert a.fingerprint == b.fingerprint
    assert a.fingerprint != c.fingerprint


def test_content_independent_of_chunk_rows(tmp_path):
    kw = dict(n_database=3000, n_queries=50, nbits=70, labels="multilabel", seed=1)
    a = open_dataset(synth_dataset(tmp_path / "a", **kw, chunk_rows=1000, query_chunk_rows=7))
    b = open_dataset(synth_dataset(tmp_path / "b", **kw, chunk_rows=4096))
    for name in ("database/codes", "database/labels", "queries/codes", "queries/labels"):
        np.testing.assert_array_equal(_all(a, name), _all(b, name))


def test_collision_increases_shared_codes(tmp_path):
    distinct = []
    for col in (0.0, 0.3, 0.8):
        url = synth_dataset(tmp_path / f"c{col}", n_database=5000, n_queries=10, nbits=32, labels="class",
                            n_classes=10, collision=col)
        distinct.append(_distinct(_all(open_dataset(url), "database/codes")))
    assert distinct[0] > 4900  # well spread
    assert distinct[0] > distinct[1] > distinct[2]


@pytest.mark.parametrize("labels", ["class", "multilabel"])
def test_full_collision_gives_one_code_per_centre(tmp_path, labels):
    url = synth_dataset(tmp_path / "x", n_database=4000, n_queries=20, nbits=64, labels=labels, n_classes=10,
                        n_concepts=12, noise=0.0, collision=1.0)
    ds = open_dataset(url)
    codes, labs = _all(ds, "database/codes"), _all(ds, "database/labels")
    n_centres = 10 if labels == "class" else 12
    uniq, inverse = np.unique(codes, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    assert len(uniq) == n_centres
    if labels == "class":
        # a bijection between classes and codes
        assert len(set(zip(labs.tolist(), inverse.tolist(), strict=True))) == n_centres
    else:
        # items sharing a code all carry the concept whose centre that code is
        hot = unpack_bits(labs, 12).astype(bool)
        common = [np.flatnonzero(hot[inverse == g].all(axis=0)) for g in range(n_centres)]
        assert all(len(c) >= 1 for c in common)
        assert len({int(c[0]) for c in common if len(c) == 1}) == sum(len(c) == 1 for c in common)
    qcodes = _all(ds, "queries/codes")
    assert {tuple(r) for r in qcodes.tolist()} <= {tuple(r) for r in uniq.tolist()}


def test_noise_zero_class_codes_are_centres(tmp_path):
    url = synth_dataset(tmp_path / "x", n_database=2000, n_queries=20, nbits=64, labels="class", n_classes=5,
                        noise=0.0)
    codes = _all(open_dataset(url), "database/codes")
    assert _distinct(codes) == 5


def test_codes_are_class_structured(tmp_path):
    url = synth_dataset(tmp_path / "x", n_database=1500, n_queries=10, nbits=64, labels="class", n_classes=5,
                        noise=0.15)
    ds = open_dataset(url)
    bits = unpack_bits(_all(ds, "database/codes"), 64)
    y = _all(ds, "database/labels")
    d = _hamming(bits, bits)
    same = y[:, None] == y[None, :]
    np.fill_diagonal(same, False)
    # noise 0.15 gives about 2*0.15*0.85*64 = 16 within a class, about 32 across
    assert abs(d[same].mean() - 16.3) < 1.5
    assert abs(d[y[:, None] != y[None, :]].mean() - 32) < 3


def test_overwrite(tmp_path):
    kw = dict(n_database=100, n_queries=5, nbits=8)
    synth_dataset(tmp_path / "x", **kw)
    with pytest.raises(InputError, match="exists"):
        synth_dataset(tmp_path / "x", **kw)
    synth_dataset(tmp_path / "x", **kw, seed=9, overwrite=True)
    assert open_dataset(tmp_path / "x").attrs()["synth"]["seed"] == 9


@pytest.mark.parametrize(
    "kw, option",
    [
        (dict(n_database=0), "--n-database"),
        (dict(n_queries=-1), "--n-queries"),
        (dict(n_database=1.5), "--n-database"),
        (dict(nbits=0), "--nbits"),
        (dict(nbits=4097), "--nbits"),
        (dict(noise=-0.1), "--noise"),
        (dict(noise=1.5), "--noise"),
        (dict(noise=float("nan")), "--noise"),
        (dict(collision=2), "--collision"),
        (dict(labels="graded"), "--labels"),
        (dict(labels_per_item=0.5), "--labels-per-item"),
        (dict(n_concepts=0), "--n-concepts"),
        (dict(n_concepts=4097), "--n-concepts"),
        (dict(n_classes=0), "--n-classes"),
        (dict(seed=-1), "--seed"),
        (dict(chunk_rows=0), "--chunk-rows"),
    ],
)
def test_bad_arguments(tmp_path, kw, option):
    args = dict(n_database=100, n_queries=10)
    args.update(kw)
    with pytest.raises(InputError) as exc:
        synth_dataset(tmp_path / "bad", **args)
    msg = str(exc.value)
    assert option in msg and "\n" not in msg
    assert not (tmp_path / "bad").exists()


# -- digits_dataset ------------------------------------------------------------


@pytest.mark.parametrize("method", ["lsh", "pcah", "itq"])
def test_digits_methods_beat_random(tmp_path, method):
    url = digits_dataset(tmp_path / method, method=method, nbits=32, seed=0)
    ds = open_dataset(url)
    assert (ds.n_database, ds.n_queries, ds.nbits) == (1797 - 297, 297, 32)
    assert ds.relevance_kinds == ("class",)
    attrs = ds.attrs()["synth"]
    assert attrs["method"] == method and attrs["nbits"] == 32
    qb = unpack_bits(_all(ds, "queries/codes"), 32)
    db = unpack_bits(_all(ds, "database/codes"), 32)
    yq, yd = _all(ds, "queries/labels"), _all(ds, "database/labels")
    assert set(np.unique(yd)) == set(range(10))
    d = _hamming(qb, db)
    same = yq[:, None] == yd[None, :]
    ratio = d[same].mean() / d[~same].mean()
    assert ratio < 0.9  # random codes give a ratio of 1
    # balanced-ish bits: not all codes identical
    assert _distinct(_all(ds, "database/codes")) > 500


def test_digits_itq_beats_pcah(tmp_path):
    ratios = {}
    for method in ("pcah", "itq"):
        ds = open_dataset(digits_dataset(tmp_path / method, method=method, nbits=32))
        b = unpack_bits(_all(ds, "database/codes"), 32)
        y = _all(ds, "database/labels")
        d = _hamming(b, b)
        same = y[:, None] == y[None, :]
        np.fill_diagonal(same, False)
        ratios[method] = d[same].mean() / d[y[:, None] != y[None, :]].mean()
    assert ratios["itq"] < ratios["pcah"]


def test_digits_deterministic_and_split(tmp_path):
    a = open_dataset(digits_dataset(tmp_path / "a", method="lsh", nbits=100, n_queries=100, seed=5))
    b = open_dataset(digits_dataset(tmp_path / "b", method="lsh", nbits=100, n_queries=100, seed=5))
    c = open_dataset(digits_dataset(tmp_path / "c", method="lsh", nbits=100, n_queries=100, seed=6))
    assert a.fingerprint == b.fingerprint != c.fingerprint
    assert (a.n_database, a.n_queries, a.nbits) == (1697, 100, 100)


@pytest.mark.parametrize(
    "kw, option",
    [
        (dict(method="sh"), "--method"),
        (dict(method="pcah", nbits=65), "--nbits"),
        (dict(method="itq", nbits=128), "--nbits"),
        (dict(method="lsh", nbits=5000), "--nbits"),
        (dict(nbits=0), "--nbits"),
        (dict(n_queries=0), "--n-queries"),
        (dict(n_queries=1797), "--n-queries"),
        (dict(seed=-3), "--seed"),
    ],
)
def test_digits_bad_arguments(tmp_path, kw, option):
    with pytest.raises(InputError) as exc:
        digits_dataset(tmp_path / "bad", **kw)
    assert option in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "bad").exists()
