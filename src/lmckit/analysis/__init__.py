"""Analyses of aligned models: multi-model metrics and simplex geometry, sharpness, loss
landscapes on planes through three models."""

from lmckit.analysis.geometry import distance_ratios, pairwise_distances, triplet_angles
from lmckit.analysis.landscape import Landscape, plane_landscape
from lmckit.analysis.multi import MultiModelMetrics, multi_model_metrics
from lmckit.analysis.sharpness import Sharpness, exact_weighted_hessian_trace, sharpness

__all__ = [
    "Landscape",
    "MultiModelMetrics",
    "Sharpness",
    "distance_ratios",
    "exact_weighted_hessian_trace",
    "multi_model_metrics",
    "pairwise_distances",
    "plane_landscape",
    "sharpness",
    "triplet_angles",
]
