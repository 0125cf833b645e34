"""The README's Python examples run as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_python_session_examples_run_as_written(capsys):
    section = README.read_text().split("## From a Python session", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 2
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)  # the second block uses the first's names
    printed = capsys.readouterr().out
    assert "'expected'" in printed and "'best'" in printed


def test_weighted_distance_example_holds_the_real_value_in_its_intervals(capsys):
    section = README.read_text().split("## Weighted and asymmetric distances", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    namespace: dict = {}
    exec(compile(block, str(README), "exec"), namespace)
    ap, intervals = namespace["ap"], namespace["intervals"]
    assert all(m["worst"] - 1e-12 <= ap <= m["best"] + 1e-12 for m in intervals.values())
    assert intervals[64]["best"] - intervals[64]["worst"] < 1e-12 < intervals[2]["best"] - intervals[2]["worst"]
    printed = capsys.readouterr().out.splitlines()
    assert printed[1:] == re.findall(r"^# (\d+ \{.*\})$", block, flags=re.M)  # the printed intervals as shown
