"""Bad ingest input named for what it is: file kind, code values, arrays for paths, corrupt chunks, relevance, nbits."""

import numpy as np
import pytest

import hashdist
from hashdist.cli import main
from hashdist.data.bits import check_code_convention
from tests.conftest import assert_refused, ingest_argv


def test_text_file_and_pickled_array_are_named_for_what_they_are(tmp_path, capsys, files):
    out = tmp_path / "out.zarr"
    (tmp_path / "text.npy").write_text("1 2 3\n4 5 6\n")
    line = assert_refused(capsys, ingest_argv(files, out, **{"--db-codes": tmp_path / "text.npy"}),
                          "not a .npy/.npz file", out)
    assert "contains a pickled" not in line
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    line = assert_refused(capsys, ingest_argv(files, out, **{"--db-labels": tmp_path / "obj.npy"}),
                          "pickled object array", out)
    assert "memory-mapped" not in line


def test_convention_error_reports_the_values_found(tmp_path, capsys, files):
    np.save(tmp_path / "neg.npy", np.array([[-1, 0, 0, -1, 0, 0, -1, 0]] * 10, np.int8))
    out = tmp_path / "out.zarr"
    line = assert_refused(capsys, ingest_argv(files, out, **{"--query-codes": tmp_path / "neg.npy"}), "found -1 and 0",
                          out)
    assert "and 1" not in line
    with pytest.raises(hashdist.InputError, match=r"found -1, 0 and 1\)"):
        check_code_convention({-1, 0, 1}, "x")


@pytest.mark.parametrize("argument", ["db_codes", "query_codes", "db_labels", "query_features"])
def test_array_passed_for_a_path_is_refused_briefly(tmp_path, files, argument):
    paths = {"db_codes": files["db"], "query_codes": files["q"], "db_labels": files["dbl"],
             "query_labels": files["ql"]}
    paths[argument] = np.load(files["db"])
    out = tmp_path / "out.zarr"
    with pytest.raises(hashdist.InputError) as info:
        hashdist.ingest(out, paths.pop("db_codes"), paths.pop("query_codes"), **paths)
    message = str(info.value)
    assert message.startswith(f"{argument}: expected a path to a .npy file, got numpy.ndarray"), message
    assert "hashdist.evaluate_codes" in message and "\n" not in message and len(message) < 200
    assert not out.exists()


def test_corrupt_chunk_is_the_one_named(tmp_path, capsys, files):
    data = tmp_path / "data.zarr"
    hashdist.ingest(data, files["db"], files["q"], db_labels=files["dbl"], query_labels=files["ql"], chunk_rows=50)
    (data / "database" / "codes" / "c" / "3" / "0").write_bytes(b"garbage, not a zstd chunk" * 10)
    out = tmp_path / "report"
    for extra in ([], ["--db-block-rows", "100"]):
        assert_refused(capsys, ["evaluate", data, "--engine", "local", "--no-cache", "--out", out, *extra],
                       "database/codes rows 150..200 (chunk 3)", out)


def test_ingest_without_relevance_information_is_refused(tmp_path, capsys, files):
    out = tmp_path / "out.zarr"
    assert_refused(capsys, ingest_argv(files, out, **{"--db-labels": None, "--query-labels": None}),
                   "no relevance information", out)
    df, qf = tmp_path / "df.npy", tmp_path / "qf.npy"
    np.save(df, np.ones((200, 3), np.float32))
    np.save(qf, np.ones((10, 3), np.float32))
    assert main(ingest_argv(files, out, **{"--db-labels": None, "--query-labels": None, "--db-features": df,
                                           "--query-features": qf})) == 0  # features, for hashdist groundtruth


def test_nbits_must_match_unpacked_codes(tmp_path, capsys, files):
    out = tmp_path / "out.zarr"
    assert_refused(capsys, ingest_argv(files, out, **{"--nbits": 5}), "--nbits 5", out)
    assert main(ingest_argv(files, out, **{"--nbits": 8})) == 0
    assert hashdist.open_dataset(out).nbits == 8


def test_append_refuses_what_it_would_ignore(tmp_path, capsys, files):
    """--append adds database rows: a --nbits that is not the dataset's, and the options of a new dataset, are
    refused, and the dataset is left as it was."""
    out = tmp_path / "out.zarr"
    assert main(ingest_argv(files, out)) == 0
    before = hashdist.open_dataset(out).fingerprint
    append = ["ingest", "--append", "--out", out, "--db-codes", files["db"], "--db-labels", files["dbl"]]
    assert_refused(capsys, [*append, "--nbits", "16"], f"--nbits 16: {out} has 8-bit codes")
    assert_refused(capsys, [*append, "--query-codes", files["q"]], "--query-codes: not with --append")
    assert_refused(capsys, [*append, "--relevance", "class"], "--relevance: not with --append")
    assert hashdist.open_dataset(out).fingerprint == before
    assert main([str(a) for a in [*append, "--nbits", "8"]]) == 0


@pytest.mark.parametrize("extra", [["--strategy", "improved"], ["--run", "0"], ["--validation"]])
def test_split_options_without_splits(tmp_path, capsys, files, extra):
    out = tmp_path / "out.zarr"
    assert_refused(capsys, [*ingest_argv(files, out), *extra], f"{extra[0]} goes with --splits", out)


def test_packed_nbits_out_of_range(tmp_path, capsys, files):
    out = tmp_path / "out.zarr"
    packed = tmp_path / "packed.npy"
    np.save(packed, np.zeros((200, 1), np.uint8))
    assert_refused(capsys, [*ingest_argv(files, out, **{"--db-codes": packed, "--query-codes": packed}), "--packed",
                            "--nbits", "0"], "--nbits 0: must be an integer in 1..4096", out)


def test_packed_codes_wider_than_nbits(tmp_path, capsys, files):
    """numpy packbits pads the last byte with 0: a set padding bit means codes wider than --nbits says, which
    dropping the bit would evaluate as other codes."""
    out = tmp_path / "out.zarr"
    packed = tmp_path / "packed.npy"
    rows = np.packbits(np.random.default_rng(0).integers(0, 2, (200, 12), dtype=np.uint8), axis=1)
    np.save(packed, rows)
    argv = [*ingest_argv(files, out, **{"--db-codes": packed, "--query-codes": packed, "--query-labels": files["dbl"]}),
            "--packed", "--nbits"]
    wide = tmp_path / "wide.npy"
    np.save(wide, rows | np.array([0, 1], np.uint8))  # bit 15 of a 12-bit code
    assert_refused(capsys, [*argv, "12", "--db-codes", wide], "packed codes have bits set beyond --nbits 12", out)
    assert main([*argv, "12"]) == 0
    assert_refused(capsys, [*argv, "11", "--overwrite"], "packed codes have bits set beyond --nbits 11")
