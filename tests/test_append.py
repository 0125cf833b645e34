"""``hashdist ingest --append``: label shapes checked against the dataset, streaming, atomic, exact."""

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import hashdist.data.dataset as dataset_module
from hashdist.api import evaluate
from hashdist.cli import main
from hashdist.data.dataset import open_dataset
from hashdist.data.ingest import append, ingest
from hashdist.errors import InputError
from tests.conftest import write_inputs


def _snapshot(directory) -> dict:
    """Every file under ``directory`` with its bytes, and the names beside it (temporary siblings, locks)."""
    directory = Path(directory)
    files = {f.relative_to(directory).as_posix(): f.read_bytes() for f in directory.rglob("*") if f.is_file()}
    return {"files": files, "siblings": sorted(p.name for p in directory.parent.iterdir())}


def _split_inputs(tmp_path, head_rows, **kw):
    """write_inputs, plus the database codes and labels split into head and tail files."""
    p = write_inputs(tmp_path, **kw)
    for name in ("db", "dbl"):
        arr = np.load(p[name])
        p[f"{name}_head"], p[f"{name}_tail"] = str(tmp_path / f"{name}_head.npy"), str(tmp_path / f"{name}_tail.npy")
        np.save(p[f"{name}_head"], arr[:head_rows])
        np.save(p[f"{name}_tail"], arr[head_rows:])
    return p


def _ingest(out, p, db="db", dbl="dbl", chunk_rows=256):
    return ingest(out, p[db], p["q"], db_labels=p[dbl], query_labels=p["ql"], chunk_rows=chunk_rows,
                  query_chunk_rows=16)


def _refused_by_cli(capsys, dataset, codes, labels, needle):
    """The CLI refuses the append with one line naming the labels file and exit status 2; nothing is written."""
    before, fingerprint = _snapshot(dataset), open_dataset(dataset).fingerprint
    status = main(["ingest", "--append", "--db-codes", codes, "--db-labels", labels, "--out", str(dataset)])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert labels in lines[0] and needle in lines[0], lines[0]
    assert open_dataset(dataset).fingerprint == fingerprint
    assert _snapshot(dataset) == before


@pytest.fixture
def multilabel_64(tmp_path):
    """A dataset with 64 label columns (one 64-bit word), and its input files."""
    p = write_inputs(tmp_path, n_db=300, n_q=10, kind="multilabel", n_concepts=64)
    _ingest(tmp_path / "ml.zarr", p)
    return tmp_path / "ml.zarr", p


def test_multilabel_width_is_compared_in_columns_not_words(tmp_path, capsys, multilabel_64):
    dataset, p = multilabel_64
    narrow = str(tmp_path / "narrow.npy")  # 60 columns fit the same single word as 64
    np.save(narrow, np.load(p["dbl"])[:, :60])
    _refused_by_cli(capsys, dataset, p["db"], narrow, "(300, 60) multi-hot labels but the dataset has 64 label columns")


def test_class_labels_refused_by_a_multilabel_dataset(capsys, multilabel_64):
    dataset, p = multilabel_64
    classes = str(Path(p["dbl"]).with_name("classes.npy"))
    np.save(classes, np.arange(300) % 4)
    _refused_by_cli(capsys, dataset, p["db"], classes,
                    "1-D class labels but the dataset's labels are multi-hot with 64 columns")


def test_multilabel_rows_refused_by_a_class_dataset(tmp_path, capsys):
    p = write_inputs(tmp_path, n_db=300, n_q=10)
    _ingest(tmp_path / "c.zarr", p)
    multi = str(tmp_path / "multi.npy")
    np.save(multi, np.zeros((300, 6), np.uint8))
    _refused_by_cli(capsys, tmp_path / "c.zarr", p["db"], multi,
                    "(300, 6) multi-hot labels but the dataset has 1-D class labels")


@pytest.mark.parametrize("kind, nbits, n_concepts", [("class", 12, 6), ("multilabel", 65, 70)])
def test_append_evaluates_like_one_ingest(tmp_path, kind, nbits, n_concepts):
    p = _split_inputs(tmp_path, 700, n_db=1500, n_q=30, kind=kind, nbits=nbits, n_concepts=n_concepts)
    grown, whole = tmp_path / "grown.zarr", tmp_path / "whole.zarr"
    _ingest(grown, p, "db_head", "dbl_head")  # 700 rows: the last 256-row chunk is partial
    assert main(["ingest", "--append", "--db-codes", p["db_tail"], "--db-labels", p["dbl_tail"],
                 "--out", str(grown)]) == 0
    _ingest(whole, p)
    assert open_dataset(grown).fingerprint == open_dataset(whole).fingerprint
    metrics = [json.dumps(evaluate(d, cache=False)["metrics"], sort_keys=True) for d in (grown, whole)]
    assert metrics[0] == metrics[1]


def test_append_links_the_chunks_it_keeps_and_copies_the_files_it_rewrites(tmp_path):
    p = _split_inputs(tmp_path, 600, n_db=1000, n_q=10)
    dataset = tmp_path / "d.zarr"
    _ingest(dataset, p, "db_head", "dbl_head")  # chunks 0, 1 full; chunk 2 holds 88 of 256 rows
    files = ("database/codes/c/0/0", "database/labels/c/1", "queries/codes/c/0/0", "database/codes/c/2/0",
             "database/labels/c/2", "zarr.json", "database/codes/zarr.json")
    inode = {f: (dataset / f).stat().st_ino for f in files}
    append(dataset, p["db_tail"], p["dbl_tail"])
    kept = {f for f in files if (dataset / f).stat().st_ino == inode[f]}
    assert kept == set(files[:3])  # the same files (hard links), not copies; the rest were rewritten in copies
    ingest(tmp_path / "whole.zarr", p["db"], p["q"], db_labels=p["dbl"], query_labels=p["ql"], chunk_rows=256,
           query_chunk_rows=16)
    assert open_dataset(dataset).fingerprint == open_dataset(tmp_path / "whole.zarr").fingerprint


def test_failed_append_after_written_blocks_leaves_the_dataset_byte_identical(tmp_path, monkeypatch):
    p = write_inputs(tmp_path, n_db=600, n_q=10)
    dataset = tmp_path / "d.zarr"
    _ingest(dataset, p)  # the last chunk is partial, so the append rewrites it first
    more = np.random.default_rng(3).integers(0, 2, (2000, 12)).astype(np.int8)
    more[-1, 0] = 2  # bad value in the last 256-row block only
    np.save(tmp_path / "more.npy", more)
    np.save(tmp_path / "more_labels.npy", np.zeros(2000, np.int64))
    before = _snapshot(dataset)
    flushed = []
    real_flush = dataset_module._ArrayWriter._flush
    monkeypatch.setattr(dataset_module._ArrayWriter, "_flush", lambda w, n: (flushed.append(n), real_flush(w, n)))
    with pytest.raises(InputError, match="code values must be"):
        append(dataset, tmp_path / "more.npy", tmp_path / "more_labels.npy")
    assert len(flushed) >= 7  # the error came mid-stream: the partial chunk and the following ones were written
    after = _snapshot(dataset)
    assert after["siblings"] == before["siblings"]  # no lock file or staging directory left beside it
    assert after["files"] == before["files"]


def test_append_streams_in_memory_bounded_by_chunks(tmp_path):
    p = write_inputs(tmp_path, n_db=5000, n_q=10, nbits=64)
    dataset = tmp_path / "d.zarr"
    _ingest(dataset, p, chunk_rows=4096)
    n = 300_000
    rng = np.random.default_rng(4)
    np.save(tmp_path / "more.npy", rng.integers(0, 2, (n, 64), dtype=np.int8))  # 19.2 MB, memory-mapped
    np.save(tmp_path / "more_labels.npy", rng.integers(0, 4, n))  # 2.4 MB int64
    tracemalloc.start()
    try:
        append(dataset, tmp_path / "more.npy", tmp_path / "more_labels.npy")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Holding all appended rows at once, even packed to words, takes n * 8 bytes = 2.4 MB for the codes alone
    # (concatenating them needed ~7.5 MB). Streaming holds a few 4096-row chunks: one chunk of input is
    # 4096 * 64 = 256 KB of int8 and 32 KB of words, and the traced peak is well under 1 MB.
    assert peak < n * 8, f"traced peak {peak / 1e6:.1f} MB"
    ds = open_dataset(dataset)
    assert ds.n_database == 5000 + n
    assert (ds.labels("database", 5000, 5000 + n) == np.load(tmp_path / "more_labels.npy")).all()
