"""Two-model matching: every method returns a :class:`MatchResult` whose ``perm`` maps
model B onto model A (``perm.apply(params_b)`` is π(θ_B))."""

from lmckit.match.activation import activation_matching
from lmckit.match.result import MatchResult
from lmckit.match.sinkhorn import sinkhorn_matching
from lmckit.match.ste import ste_matching
from lmckit.match.weight import WeightMatcher, weight_matching

__all__ = [
    "MatchResult",
    "WeightMatcher",
    "activation_matching",
    "sinkhorn_matching",
    "ste_matching",
    "weight_matching",
]
