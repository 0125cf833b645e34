"""Every ```python and shell (```bash, ```sh, ```console) block in README.md and docs/*.md runs as written.

The blocks of one file run in the order written, with a fresh temporary directory as the working directory,
so a later block finds the files an earlier one wrote: the Python blocks in one namespace (a later block may
use an earlier block's names), the shell blocks with bash and the installed ``hashdist`` (the test's venv
first on PATH), each within SHELL_TIMEOUT_S seconds. A Python block whose first line is a comment starting
``# not run in tests:`` (followed by the reason, which readers see too) is skipped, and so is a shell block
preceded by an HTML comment ``<!-- not run: REASON -->`` (a SLURM cluster, ``prefect deploy``, a synopsis of
options); the test lists these markers and their reasons. The quick start's set-up (``INSTALL``, a venv and
``pip install``) is what the suite's own venv did: a block starting with it runs without it.
"""

import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = "# not run in tests:"
SHELL_NOT_RUN = re.compile(r"^<!-- not run:(.*)-->$")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$")
SHELLS = ("bash", "sh", "console", "shell")
INSTALL = "python3 -m venv .venv && .venv/bin/pip install -q -e . && "  # the quick start's set-up, done by the suite
SHELL_TIMEOUT_S = 120  # one shell block, at most (the slowest, the README's comparison, takes about 15 s)


class Block(NamedTuple):
    line: int  # the block's first line of source
    language: str
    source: str
    not_run: str | None  # a shell block's "not run" marker: its reason


def fenced_blocks(path: Path) -> list[Block]:
    """Every fenced block of the file, found by scanning its fences: a fence closes at a line of at least as many
    of its characters and nothing else. A shell block's marker is the last non-blank line before its fence."""
    blocks, fence, language, start, lines, before = [], None, "", 0, [], ""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if fence is None:
            match = FENCE.match(line)
            if match:
                fence, language, start, lines = match.group(1), match.group(2).lower(), number + 1, []
                marker = SHELL_NOT_RUN.match(before.strip())
                reason = marker.group(1).strip() if marker else None
            elif line.strip():
                before = line
        elif line.strip() and set(line.strip()) == {fence[0]} and len(line.strip()) >= len(fence):
            blocks.append(Block(start, language, "\n".join(lines) + "\n", reason))
            fence, before = None, ""
        else:
            lines.append(line)
    assert fence is None, f"{path.name}: a fence opened on line {start - 1} is never closed"
    return blocks


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """(first line number, source) of each fence whose info string starts with ``python``."""
    return [(b.line, b.source) for b in fenced_blocks(path) if b.language == "python"]


def shell_blocks(path: Path) -> list[Block]:
    return [b for b in fenced_blocks(path) if b.language in SHELLS]


def markers(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every "not run" marker of the file, wherever it stands."""
    return [(number, line) for number, line in enumerate(path.read_text().splitlines(), 1)
            if line.strip().startswith("<!-- not run")]


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


WITH_BLOCKS = [path for path in DOCS if python_blocks(path) or shell_blocks(path)]


def test_the_pages_with_examples_are_found():
    names = {_name(path) for path in WITH_BLOCKS}
    assert {"README.md", "docs/distances.md", "docs/python-api.md", "docs/cli.md", "docs/protocols.md",
            "docs/cross-modal.md"} <= names


def test_every_shell_block_not_run_says_why():
    """The shell blocks the suite does not run, listed (pytest -s shows them), each with its reason; a marker
    stands right before a shell block."""
    listed = []
    for path in DOCS:
        found = {(b.line, b.not_run) for b in shell_blocks(path) if b.not_run is not None}
        for number, text in markers(path):
            match = SHELL_NOT_RUN.match(text.strip())
            assert match and len(match.group(1).strip()) > 10, f"{_name(path)}:{number}: {text!r} gives no reason"
            listed.append(f"{_name(path)}:{number}: {match.group(1).strip()}")
        assert len(found) == len(markers(path)), f"{_name(path)}: a not-run marker does not precede a shell block"
    print("\nshell blocks not run in the suite:\n" + "\n".join(listed))
    assert listed  # the SLURM and deployment blocks at least


def shell_environment(tmp_path: Path) -> dict:
    """A user's shell: this venv's ``hashdist`` first on PATH, a block cache of the test's own, the temporary
    Prefect API server (no PREFECT_API_URL)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "HASHDIST_CLUSTER_KWARGS")}
    return {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            "HASHDIST_CACHE": str(tmp_path / ".hashdist-cache")}


def run_shell_block(block: Block, where: str, env: dict) -> None:
    """A shell block with bash, stopping at the first failing command; a console block's commands are its lines
    after "$ " (the rest is output)."""
    source = block.source.removeprefix(INSTALL)  # the rest of the quick start runs with the suite's own venv
    if block.language == "console":
        source = "\n".join(line[2:] for line in source.splitlines() if line.startswith("$ ")) + "\n"
    try:
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", source], env=env, capture_output=True,
                              text=True, timeout=SHELL_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{where} ran longer than {SHELL_TIMEOUT_S} s") from None
    assert done.returncode == 0, f"{where} failed with status {done.returncode}:\n{done.stderr[-3000:]}"


def _check_weighted_distance_example(source: str, namespace: dict, printed: list[str]) -> None:
    """The real-valued AP lies in every binned interval, 64 bins close the interval and 2 do not, and the
    intervals printed are the ones the block's comments show."""
    ap, intervals = namespace["ap"], namespace["intervals"]
    assert all(m["worst"] - 1e-12 <= ap <= m["best"] + 1e-12 for m in intervals.values())
    assert intervals[64]["best"] - intervals[64]["worst"] < 1e-12 < intervals[2]["best"] - intervals[2]["worst"]
    assert printed[1:] == re.findall(r"^# (\d+ \{.*\})$", source, flags=re.M)


@pytest.mark.parametrize("path", WITH_BLOCKS, ids=_name)
def test_examples_run_as_written_in_order(path, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    env = shell_environment(tmp_path)
    (tmp_path / ".venv").mkdir()  # the quick start's venv: this one
    (tmp_path / ".venv" / "bin").symlink_to(Path(sys.executable).parent)
    namespace: dict = {"__name__": "__main__"}
    printed_by_file, timed = [], []
    for number, block in enumerate(fenced_blocks(path), 1):
        where = f"{_name(path)}, {block.language} block {number} (line {block.line})"
        if block.language in SHELLS and block.not_run is None:
            started, cpu = time.monotonic(), _children_cpu()
            run_shell_block(block, where, env)
            timed.append(f"{where}: {time.monotonic() - started:.1f} s, {_children_cpu() - cpu:.1f} CPU s")
        if block.language != "python" or block.source.lstrip().startswith(NOT_RUN):
            continue
        code = compile("\n" * (block.line - 1) + block.source, str(path), "exec")  # tracebacks: the file's lines
        try:
            exec(code, namespace)
        except Exception as exc:
            raise AssertionError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
        printed = capsys.readouterr().out.splitlines()
        printed_by_file += printed
        if "intervals[" in block.source:
            _check_weighted_distance_example(block.source, namespace, printed)
    print("\n".join(timed))  # pytest -s: what each shell block took
    if path.name == "README.md":  # the Python-session examples print the tie policies of mAP
        assert any("'expected'" in line and "'best'" in line for line in printed_by_file)


def _children_cpu() -> float:
    """CPU seconds of the finished child processes so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
