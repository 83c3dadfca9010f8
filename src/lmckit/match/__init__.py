"""Two-model matching: every method returns a :class:`MatchResult` whose ``perm`` maps
model B onto model A (``perm.apply(params_b)`` is π(θ_B)).

All matchers share one signature::

    f(spec, params_a, params_b, *, model=None, data=None, init=None, seed=0,
      progress=None, **method_options) -> MatchResult

:data:`METHODS` lists them by name — the names the command line and experiment files
use — with what each needs::

    METHODS["ste"](spec, a, b, model=net, data=dataset, epochs=2)
"""

from lmckit.match.activation import activation_matching
from lmckit.match.result import MatchResult
from lmckit.match.sinkhorn import sinkhorn_matching
from lmckit.match.ste import ste_matching
from lmckit.match.weight import weight_matching, weight_matching_reference
from lmckit.match.weight_matcher import ProfiledWeightMatcher, WeightMatcher
from lmckit.registry import Method

METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "wm",
            weight_matching,
            needs_model=False,
            needs_data=False,
            summary="weight matching, cold LAP solves (Git Re-Basin Alg. 1)",
            fixed={"warm_start": False},
        ),
        Method(
            "wm-fast",
            weight_matching,
            needs_model=False,
            needs_data=False,
            summary="weight matching with dual warm starts (STE-MM Alg. 3); same optimum",
            fixed={"warm_start": True},
        ),
        Method(
            "am",
            activation_matching,
            needs_model=True,
            needs_data=True,
            summary="activation matching on the correlation of units over the data",
            fixed={"method": "correlation"},
        ),
        Method(
            "ste",
            ste_matching,
            needs_model=True,
            needs_data=True,
            summary="straight-through estimator of the midpoint loss (Git Re-Basin Alg. 2)",
        ),
        Method(
            "sinkhorn",
            sinkhorn_matching,
            needs_model=False,
            needs_data=False,
            summary="Sinkhorn re-basin on the weight distance",
            fixed={"objective": "l2"},
            unused=("epochs", "batch_size"),
        ),
        Method(
            "sinkhorn-mid",
            sinkhorn_matching,
            needs_model=True,
            needs_data=True,
            summary="Sinkhorn re-basin on the midpoint loss",
            fixed={"objective": "mid"},
            unused=("steps",),
        ),
    )
}
"""Matchers by name."""

__all__ = [
    "METHODS",
    "MatchResult",
    "ProfiledWeightMatcher",
    "WeightMatcher",
    "activation_matching",
    "sinkhorn_matching",
    "ste_matching",
    "weight_matching",
    "weight_matching_reference",
]
