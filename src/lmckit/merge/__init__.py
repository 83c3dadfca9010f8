"""Merging many models: each method returns a :class:`MergeResult` with one permutation per
model (the reference gets the identity) and the merged parameters ``(1/n) Σ π_i(θ_i)``.

All mergers share one signature::

    f(spec, params_list, *, model=None, data=None, reference=-1, seed=0, progress=None,
      **method_options) -> MergeResult

:data:`METHODS` lists them by name, with what each needs.
"""

from lmckit.match import METHODS as MATCHERS
from lmckit.merge.average import average
from lmckit.merge.ccmm import ccmm
from lmckit.merge.many import merge_many
from lmckit.merge.many_orth import merge_many_orthogonal
from lmckit.merge.result import Merger, MergeResult, merge_with
from lmckit.merge.star import star
from lmckit.merge.ste_mm import check_option_combination, check_options_for_count, ste_mm
from lmckit.registry import Method

METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "average",
            average,
            needs_model=False,
            needs_data=False,
            summary="uniform average without alignment (every model weighted alike)",
            unused=("sizes",),
        ),
        Method(
            "fedavg",
            average,
            needs_model=False,
            needs_data=False,
            summary="one-shot FedAvg: average without alignment, each model weighted by the "
            "examples it trained on (McMahan et al.)",
            needs_sizes=True,
        ),
        Method(
            "star-wm",
            star,
            needs_model=False,
            needs_data=False,
            summary="weight-match every model to the reference, then average",
            fixed={"method": "wm-fast"},
            passes_to=MATCHERS["wm-fast"],
        ),
        Method(
            "star-ste",
            star,
            needs_model=True,
            needs_data=True,
            summary="STE-match every model to the reference, then average",
            fixed={"method": "ste"},
            passes_to=MATCHERS["ste"],
        ),
        Method(
            "star-wm-others",
            star,
            needs_model=False,
            needs_data=False,
            summary="star-WM, averaging the n-1 aligned non-reference models (STE-MM Fig. 1)",
            fixed={"method": "wm-fast", "average": "others"},
            passes_to=MATCHERS["wm-fast"],
        ),
        Method(
            "star-ste-others",
            star,
            needs_model=True,
            needs_data=True,
            summary="star-STE, averaging the n-1 aligned non-reference models (STE-MM Fig. 1)",
            fixed={"method": "ste", "average": "others"},
            passes_to=MATCHERS["ste"],
        ),
        Method(
            "merge-many",
            merge_many,
            needs_model=False,
            needs_data=False,
            summary="re-match each model to the mean of the others (Git Re-Basin Alg. 3)",
        ),
        Method(
            "merge-many-orth",
            merge_many_orthogonal,
            needs_model=True,
            needs_data=True,
            summary="MergeMany over orthogonal maps too (transformers: the stream with its "
            "norms folded, each head's dimensions); a merge of the norm-folded models",
        ),
        Method(
            "ste-mm",
            ste_mm,
            needs_model=True,
            needs_data=True,
            summary="multi-model straight-through estimator (STE-MM Alg. 1)",
            check_combination=check_option_combination,
            check_count=check_options_for_count,
        ),
        Method(
            "ccmm",
            ccmm,
            needs_model=False,
            needs_data=False,
            summary="cycle-consistent Frank–Wolfe over all pairwise distances",
        ),
    )
}
"""Mergers by name."""

__all__ = [
    "METHODS",
    "MergeResult",
    "Merger",
    "average",
    "ccmm",
    "merge_many",
    "merge_many_orthogonal",
    "merge_with",
    "star",
    "ste_mm",
]
