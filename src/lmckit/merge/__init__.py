"""Merging many models: each method returns a :class:`MergeResult` with one permutation per
model (the reference gets the identity) and the merged parameters ``(1/n) Σ π_i(θ_i)``."""

from lmckit.merge.ccmm import ccmm
from lmckit.merge.many import merge_many
from lmckit.merge.result import MergeResult, average_params, merge_with
from lmckit.merge.star import star
from lmckit.merge.ste_mm import ste_mm

__all__ = ["MergeResult", "average_params", "ccmm", "merge_many", "merge_with", "star", "ste_mm"]
