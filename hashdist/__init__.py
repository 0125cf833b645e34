"""hashdist: exact, tie-aware, distributed evaluation of learned binary hash codes.

Data flow: ingest -> Zarr dataset -> kernels (partial histograms) -> reduction ->
metrics (pure functions of histograms) -> report.
"""

__version__ = "0.1.0"

from hashdist.api import Evaluation, evaluate, evaluate_local  # noqa: E402
from hashdist.arrays import Evaluator, evaluate_codes  # noqa: E402
from hashdist.dataset import open_dataset  # noqa: E402
from hashdist.errors import InputError  # noqa: E402
from hashdist.ingest import ingest  # noqa: E402

__all__ = ["Evaluation", "Evaluator", "InputError", "__version__", "evaluate", "evaluate_codes", "evaluate_local",
           "ingest", "open_dataset"]
