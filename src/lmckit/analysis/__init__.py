"""Analyses of aligned models: L2 distances, spectra and singular-vector alignment R(γ),
the Taylor-predicted barrier, three models aligned to one, Git Re-Basin's counterexample,
multi-model metrics and simplex geometry, sharpness, loss landscapes on planes through three
models, and the width study's layerwise diagnostics (LEWC and its conditions), flatness proxy
and random-permutation merges."""

from lmckit.analysis.counterexample import (
    ExhaustiveBarriers,
    counterexample_data,
    counterexample_error,
    counterexample_networks,
    exhaustive_barriers,
)
from lmckit.analysis.distance import Distances, l2_distances
from lmckit.analysis.flatness import Flatness, flatness, random_direction
from lmckit.analysis.geometry import (
    distance_ratios,
    pairwise_distances,
    simplex_geometry,
    triplet_angles,
)
from lmckit.analysis.landscape import Landscape, plane_landscape, triangle_summary
from lmckit.analysis.layerwise import (
    GAUSSIAN_ADDITIVITY_LIMIT,
    Layer,
    Layerwise,
    gaussian_weak_additivity,
    layerwise,
    model_layers,
)
from lmckit.analysis.multi import MultiModelMetrics, multi_model_metrics
from lmckit.analysis.random_permutations import (
    RandomPermutationMerges,
    random_permutation_merges,
)
from lmckit.analysis.sharpness import Sharpness, exact_weighted_hessian_trace, sharpness
from lmckit.analysis.spectral import (
    Alignment,
    LayerSVD,
    alignment,
    conv_operator_singular_values,
    dominant_share,
    effective_rank,
    layer_svds,
    operator_spectra,
    singular_values,
    singular_vector_cosines,
)
from lmckit.analysis.taylor import TaylorBarrier, taylor_barrier
from lmckit.analysis.triplet import ThreeModels, three_models

__all__ = [
    "GAUSSIAN_ADDITIVITY_LIMIT",
    "Alignment",
    "Distances",
    "ExhaustiveBarriers",
    "Flatness",
    "Landscape",
    "Layer",
    "LayerSVD",
    "Layerwise",
    "MultiModelMetrics",
    "RandomPermutationMerges",
    "Sharpness",
    "TaylorBarrier",
    "ThreeModels",
    "alignment",
    "conv_operator_singular_values",
    "counterexample_data",
    "counterexample_error",
    "counterexample_networks",
    "distance_ratios",
    "dominant_share",
    "effective_rank",
    "exact_weighted_hessian_trace",
    "exhaustive_barriers",
    "flatness",
    "gaussian_weak_additivity",
    "l2_distances",
    "layer_svds",
    "layerwise",
    "model_layers",
    "multi_model_metrics",
    "operator_spectra",
    "pairwise_distances",
    "plane_landscape",
    "random_direction",
    "random_permutation_merges",
    "sharpness",
    "simplex_geometry",
    "singular_values",
    "singular_vector_cosines",
    "taylor_barrier",
    "three_models",
    "triangle_summary",
    "triplet_angles",
]
