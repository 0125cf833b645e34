"""What the terminal says: the first line names the work, off a terminal a progress line every PERIOD_S seconds
while a run lasts, and a summary that gives pairs per second only for the pairs computed."""

import re
import time

import pytest

from hashdist import progress
from hashdist.cli import main


def test_off_a_terminal_a_line_every_period_while_the_run_lasts(monkeypatch, capsys):
    monkeypatch.setattr(progress, "PERIOD_S", 0.05)
    with progress.progress_bar(4, True) as bar:  # pytest's stderr is not a terminal
        for _ in range(4):
            time.sleep(0.08)
            progress.advance(bar, 1, 1000, time.time() - 1)
        time.sleep(0.08)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 3 and all(re.fullmatch(r"hashdist: \d+ s, .+", line) for line in lines), lines
    blocks = [line for line in lines if ", computing blocks: " in line]
    assert blocks and all(re.search(r"computing blocks: [0-3] of 4 done", line) for line in blocks), lines
    assert any("pairs/s" in line for line in blocks)
    assert lines[-1].endswith("reducing the 4 blocks' counts to the metrics"), lines


def _next_line(timeout_s: float = 10.0) -> None:
    """Wait (a bounded time, under any load) until the command's progress prints its next line."""
    [lines], deadline = progress._COMMAND, time.monotonic() + timeout_s
    printed = lines.lines
    while lines.lines == printed and time.monotonic() < deadline:
        time.sleep(0.005)


def test_every_line_names_the_phase_and_a_new_phase_is_said_at_once(monkeypatch, capsys):
    monkeypatch.setattr(progress, "PERIOD_S", 0.05)
    started = time.time() - 30  # the command started 30 s ago
    with progress.reporting(True, "starting the cluster (Prefect and Dask)", started):
        _next_line()
        with progress.progress_bar(2, True) as bar:
            progress.advance(bar, 1, 10, started)
            _next_line()
            progress.advance(bar, 1, 20, started)
        progress.phase("writing the report")
    lines = capsys.readouterr().err.splitlines()
    phases = [re.fullmatch(r"hashdist: (\d+) s, (.+)", line) for line in lines]
    assert all(phases) and all(int(m.group(1)) >= 30 for m in phases), lines
    said = [m.group(2).split(":")[0].split(" the ")[0] for m in phases]
    assert [p for i, p in enumerate(said) if i == 0 or p != said[i - 1]] == [
        "starting", "computing blocks", "reducing", "writing"], lines
    assert "computing blocks: 1 of 2 done" in "\n".join(lines)


def test_no_line_for_a_short_run_or_when_quiet(capsys):
    with progress.progress_bar(2, True) as bar:
        progress.advance(bar, 2, 10, time.time())
    with progress.progress_bar(2, False) as bar:
        progress.advance(bar, 2, 10, time.time())
    assert capsys.readouterr().err == ""


def test_the_first_line_names_the_work_and_a_cached_rerun_computes_nothing(class_dataset, tmp_path, capsys):
    args = ["evaluate", class_dataset, "--out", str(tmp_path / "r"), "--engine", "local", "--cache",
            str(tmp_path / "cache"), "--no-html", "--overwrite", "--query-block-rows", "16", "--db-block-rows", "500"]
    assert main(args) == 0
    first = capsys.readouterr().out.splitlines()
    assert first[0] == ("hashdist evaluate: 70 queries x 3,000 items, 12 bits, class relevance, hamming distance; "
                        "30 blocks of up to 16 x 500; threads in this process")
    assert first[1].startswith("Headline") and "expected [worst, best]" in first[2]
    assert any(line.startswith("blocks: 30 computed, 0 cached of 30; 2.1e+05 pairs computed at ") for line in first)
    assert main(args) == 0
    assert "blocks: 0 computed, 30 cached of 30; nothing to compute: every block came from the cache" in \
        capsys.readouterr().out


@pytest.mark.parametrize("engine", ["local", "flow"])
def test_the_command_says_each_phase_off_a_terminal(class_dataset, tmp_path, capsys, monkeypatch, engine):
    monkeypatch.setattr(progress, "PERIOD_S", 0.002)  # a line at once: every phase is said
    args = ["evaluate", class_dataset, "--out", str(tmp_path / "r"), "--engine", engine, "--no-cache",
            "--query-block-rows", "16", "--db-block-rows", "500", "--threads", "1", "--no-html"]
    assert main(args) == 0
    lines = capsys.readouterr().err.splitlines()
    said = [line.split(" s, ", 1)[1] for line in lines if line.startswith("hashdist: ")]
    # a flow's blocks wait for the cluster; the local engine's start at once (its first phase may go unsaid)
    first = {"local": "loading the dataset and compiling", "flow": "starting the cluster (Prefect and Dask)"}[engine]
    assert said[0] == first or (engine == "local" and said[0].startswith("computing blocks: ")), lines
    order = ["computing blocks: ", "reducing the 30 blocks' counts", "writing the report"]
    places = [next((i for i, text in enumerate(said) if text.startswith(p)), None) for p in order]
    assert None not in places and places == sorted(places), said
    if engine == "local":
        assert main([*args, "--quiet", "--overwrite"]) == 0
        assert "hashdist: " not in capsys.readouterr().err
