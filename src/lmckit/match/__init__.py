"""Two-model matching: every method returns a :class:`MatchResult` whose ``alignment`` maps
model B onto model A (``alignment.apply(params_b)`` is π(θ_B)).

All matchers share one signature::

    f(spec, params_a, params_b, *, model=None, data=None, init=None, seed=0,
      progress=None, **method_options) -> MatchResult

:data:`METHODS` lists them by name — the names the command line and experiment files
use — with what each needs::

    METHODS["ste"](spec, a, b, model=net, data=dataset, epochs=2)
"""

from lmckit.match.activation import activation_matching
from lmckit.match.result import Matcher, MatchResult
from lmckit.match.sinkhorn import sinkhorn_matching
from lmckit.match.ste import ste_matching
from lmckit.match.symmetries import symmetry_matching
from lmckit.match.weight import weight_matching, weight_matching_reference
from lmckit.match.weight_matcher import ProfiledWeightMatcher, WeightMatcher
from lmckit.registry import Method

_SUMMARIES = {
    "wm": "weight matching",
    "am": "activation matching (Procrustes, least squares)",
    "ste": "weight matching, then the midpoint loss by gradient descent on the maps,",
}
_STE_OPTIONS = ("epochs", "lr", "batch_size")
_UNUSED = {
    ("wm", "orth"): ("n_batches", *_STE_OPTIONS),
    ("wm", "full"): _STE_OPTIONS,  # n_batches: the least squares' activations
    ("am", "orth"): ("restarts", "max_iter", "gain_tol", "max_memory", *_STE_OPTIONS),
    ("am", "full"): ("restarts", "max_iter", "gain_tol", "max_memory", *_STE_OPTIONS),
    ("ste", "orth"): ("max_memory",),
    ("ste", "full"): ("max_memory",),
}

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
            fixed={"statistic": "correlation"},
        ),
        Method(
            "am-ls",
            activation_matching,
            needs_model=True,
            needs_data=True,
            summary="activation matching in Git Re-Basin's least-squares form (§3.1 eq. 1): "
            "the cross-moment E[z_A z_Bᵀ]",
            fixed={"statistic": "cross_moment"},
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
        *(
            Method(
                f"{start}-{symmetries}",
                symmetry_matching,
                needs_model=True,
                needs_data=(start, symmetries) != ("wm", "orth"),
                summary=_SUMMARIES[start]
                + (
                    " with orthogonal maps (stream, heads) beside permutations"
                    if symmetries == "orth"
                    else " over every symmetry the graph admits (orthogonal stream, invertible "
                    "heads, ReLU scalings)"
                    + (
                        ", those beyond rotations by least squares on activations"
                        if start == "wm"
                        else ""
                    )
                )
                + "; a transform of the norm-folded models",
                fixed={"symmetries": symmetries, "start": start},
                unused=_UNUSED[start, symmetries],
            )
            for start in ("wm", "am", "ste")
            for symmetries in ("orth", "full")
        ),
    )
}
"""Matchers by name. Those in :data:`TRANSFORM_METHODS` return a
:class:`~lmckit.transform.Transform` of the norm-folded models, not a permutation."""

TRANSFORM_METHODS = frozenset(f"{s}-{k}" for s in ("wm", "am", "ste") for k in ("orth", "full"))
"""Matchers whose result maps beyond permutations (:func:`symmetry_matching`)."""

__all__ = [
    "METHODS",
    "TRANSFORM_METHODS",
    "MatchResult",
    "Matcher",
    "ProfiledWeightMatcher",
    "WeightMatcher",
    "activation_matching",
    "sinkhorn_matching",
    "ste_matching",
    "symmetry_matching",
    "weight_matching",
    "weight_matching_reference",
]
