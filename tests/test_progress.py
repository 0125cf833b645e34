"""What the terminal says: the first line names the work, off a terminal a progress line every PERIOD_S seconds
while a run lasts, and a summary that gives pairs per second only for the pairs computed."""

import time

from hashdist import progress
from hashdist.cli import main


def test_off_a_terminal_a_line_every_period_while_the_run_lasts(monkeypatch, capsys):
    monkeypatch.setattr(progress, "PERIOD_S", 0.05)
    with progress.progress_bar(4, True) as bar:  # pytest's stderr is not a terminal
        for _ in range(4):
            time.sleep(0.08)
            progress.advance(bar, 1, 1000, time.time() - 1)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 3 and all(line.startswith("hashdist: ") and "of 4 blocks after" in line for line in lines)
    assert "pairs/s" in lines[-1]


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
