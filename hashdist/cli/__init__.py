"""The ``hashdist`` command line: ``launch`` (the console script) starts what a flow run needs, then
``hashdist.cli.app.main`` parses and runs the command. ``main`` and ``console`` load on first use."""

import importlib


def __getattr__(name: str):
    if name in ("main", "console", "build_parser"):
        return getattr(importlib.import_module("hashdist.cli.app"), name)
    raise AttributeError(f"module 'hashdist.cli' has no attribute {name!r}")
