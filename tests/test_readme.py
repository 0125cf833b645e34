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
