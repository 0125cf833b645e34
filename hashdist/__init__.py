"""hashdist: exact, tie-aware, distributed evaluation of learned binary hash codes.

Data flow: data (ingest -> Zarr dataset) -> kernels (partial histograms) -> engine (blocks, cache,
reduction) -> metrics (pure functions of histograms) -> report; the Python API and the CLI on top,
``flows/`` as Prefect + Dask orchestration. The public names below load on first use, so
``import hashdist`` (and the ``hashdist`` command's launcher) costs nothing until one is used.
"""

import importlib

__version__ = "0.1.0"

_PUBLIC = {
    "Evaluation": "hashdist.api", "evaluate": "hashdist.api", "evaluate_local": "hashdist.api",
    "Evaluator": "hashdist.arrays", "evaluate_codes": "hashdist.arrays",
    "open_dataset": "hashdist.data.dataset", "ingest": "hashdist.data.ingest", "InputError": "hashdist.errors",
    "EvaluateOptions": "hashdist.options", "CompareOptions": "hashdist.options",
    "GroundTruthOptions": "hashdist.options", "ExecutionOptions": "hashdist.options",
    "search": "hashdist.api", "SearchOptions": "hashdist.options",
}
__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'hashdist' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # loaded once
    return value


def __dir__():
    return sorted(__all__)
