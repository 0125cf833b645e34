"""Metrics as pure functions of Hamming histograms ``H[q, d, g]`` (docs/metrics.md, section 4)."""

from hashdist.metrics.radius import (
    auprc,
    lgap_at_radius,
    micro_at_radius,
    pr_curve,
    precision_at_radius,
    recall_at_radius,
)
from hashdist.metrics.ranking import (
    AP_AT_K_NORMALISERS,
    POLICIES,
    average_precision,
    average_precision_at_k,
    average_precision_at_radius,
    cutoff_grid,
    ndcg_at_k,
    ndcg_structhash_at_k,
    precision_at_k,
    recall_at_k,
    roc_auc,
)
from hashdist.metrics.summary import MetricParams, aggregate, per_query_metrics

__all__ = [
    "AP_AT_K_NORMALISERS",
    "POLICIES",
    "MetricParams",
    "aggregate",
    "auprc",
    "average_precision",
    "average_precision_at_k",
    "average_precision_at_radius",
    "cutoff_grid",
    "lgap_at_radius",
    "micro_at_radius",
    "ndcg_at_k",
    "ndcg_structhash_at_k",
    "per_query_metrics",
    "pr_curve",
    "precision_at_k",
    "precision_at_radius",
    "recall_at_k",
    "recall_at_radius",
    "roc_auc",
]
