"""The layout's rules (docs/architecture.md), read from the code's imports: levels that imports only go down,
no import circle, nothing under flows/ imports the CLI, at most 10 modules directly in hashdist/."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# lowest first; a module may import its own level and the levels below it, never one above. hashdist.served spans
# the levels, a module per level (its __init__ imports nothing); the longest matching prefix decides
LEVELS = (
    ("hashdist.errors", "hashdist.defaults", "hashdist.progress"),
    ("hashdist.data", "hashdist.served", "hashdist.served.lists"),
    ("hashdist.kernels", "hashdist.served.pairs"),
    ("hashdist.metrics", "hashdist.served.measures"),
    ("hashdist.engine", "hashdist.served.engine"),
    ("hashdist.options",),
    ("hashdist.report", "hashdist.served.report"),
    ("hashdist.compare",),
    ("hashdist.api", "hashdist.arrays", "hashdist.served.search"),
    ("hashdist.integrations",),
    ("flows",),
    ("hashdist.cli",),
)


def _modules() -> dict[str, Path]:
    found = {}
    for package in ("hashdist", "flows"):
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The project modules ``name`` imports, at the top or inside functions."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            candidates = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in MODULES:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                targets.add(candidate)
                break
    return targets


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _level(name: str) -> int | None:
    """The level of the longest prefix in LEVELS that ``name`` starts with (None: no level)."""
    matches = [(len(p), level) for level, prefixes in enumerate(LEVELS) for p in prefixes
               if name == p or name.startswith(p + ".")]
    return max(matches)[1] if matches else None


def test_every_module_has_a_level():
    assert [name for name in MODULES if name != "hashdist" and _level(name) is None] == []


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n != "hashdist"))
def test_imports_only_go_down(name):
    upward = [t for t in GRAPH[name] if t != "hashdist" and _level(t) > _level(name)]
    assert upward == [], f"{name} (level {_level(name)}) imports a higher level: {upward}"


def test_no_import_circle():
    """A package may import its submodules (its __init__ re-exports); any other way back is a circle."""

    def reach(start):
        seen, todo = set(), [start]
        while todo:
            for target in GRAPH[todo.pop()]:
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        return seen

    circles = []
    for name in MODULES:
        for other in reach(name):
            related = other.startswith(name + ".") or name.startswith(other + ".")
            if name in reach(other) and not related and name < other:
                circles.append((name, other))
    assert circles == []


def test_flows_never_import_the_cli():
    found = [(n, t) for n, ts in GRAPH.items() if n.startswith("flows") for t in ts if t.startswith("hashdist.cli")]
    assert found == []


def test_at_most_ten_modules_directly_in_hashdist():
    flat = [p.name for p in (ROOT / "hashdist").glob("*.py") if p.name != "__init__.py"]
    assert len(flat) <= 10, flat


def test_the_launcher_and_hashdist_itself_load_no_library():
    """The console script's launcher runs before the API server starts: the standard library only."""
    import subprocess
    import sys

    code = ("import sys; import hashdist.cli.launch; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'numba', 'zarr', 'prefect', "
            "'dask', 'distributed') or m.startswith('hashdist.') "
            "and m not in ('hashdist.cli', 'hashdist.cli.launch')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "[]"
