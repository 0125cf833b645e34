"""Every ```python block in README.md and docs/*.md runs as written.

The blocks of one file run in order in one namespace (a later block may use an earlier block's names), with a
fresh temporary directory as the working directory, so files the examples write land there. A block whose
first line is a comment starting ``# not run in tests:`` (followed by the reason, which readers see too) is
skipped.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = "# not run in tests:"
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$")


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """(first line number, source) of each fence whose info string starts with ``python``, found by scanning
    the fences of the file: a fence closes at a line of at least as many of its characters and nothing else."""
    blocks, fence, language, start, lines = [], None, "", 0, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if fence is None:
            match = FENCE.match(line)
            if match:
                fence, language, start, lines = match.group(1), match.group(2).lower(), number + 1, []
        elif line.strip() and set(line.strip()) == {fence[0]} and len(line.strip()) >= len(fence):
            if language == "python":
                blocks.append((start, "\n".join(lines) + "\n"))
            fence = None
        else:
            lines.append(line)
    assert fence is None, f"{path.name}: a fence opened on line {start - 1} is never closed"
    return blocks


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


WITH_BLOCKS = [path for path in DOCS if python_blocks(path)]


def test_the_pages_with_python_examples_are_found():
    names = {_name(path) for path in WITH_BLOCKS}
    assert {"README.md", "docs/distances.md", "docs/python-api.md"} <= names


def _check_weighted_distance_example(source: str, namespace: dict, printed: list[str]) -> None:
    """The real-valued AP lies in every binned interval, 64 bins close the interval and 2 do not, and the
    intervals printed are the ones the block's comments show."""
    ap, intervals = namespace["ap"], namespace["intervals"]
    assert all(m["worst"] - 1e-12 <= ap <= m["best"] + 1e-12 for m in intervals.values())
    assert intervals[64]["best"] - intervals[64]["worst"] < 1e-12 < intervals[2]["best"] - intervals[2]["worst"]
    assert printed[1:] == re.findall(r"^# (\d+ \{.*\})$", source, flags=re.M)


@pytest.mark.parametrize("path", WITH_BLOCKS, ids=_name)
def test_python_examples_run_as_written(path, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__main__"}
    printed_by_file = []
    for number, (line, source) in enumerate(python_blocks(path), 1):
        where = f"{_name(path)}, python block {number} (line {line})"
        if source.lstrip().startswith(NOT_RUN):
            continue
        code = compile("\n" * (line - 1) + source, str(path), "exec")  # tracebacks give the file's line numbers
        try:
            exec(code, namespace)
        except Exception as exc:
            raise AssertionError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
        printed = capsys.readouterr().out.splitlines()
        printed_by_file += printed
        if "intervals[" in source:
            _check_weighted_distance_example(source, namespace, printed)
    if path.name == "README.md":  # the Python-session examples print the tie policies of mAP
        assert any("'expected'" in line and "'best'" in line for line in printed_by_file)
