"""What every matcher returns, and the input checks they share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from torch import Tensor

from lmckit._checks import check_seed
from lmckit.errors import ParamsError, PermutationError, SpecError
from lmckit.lap import LapDuals
from lmckit.params import (
    Params,
    check_finite,
    check_params_compatible,
    check_products_finite,
    is_running_stat,
)
from lmckit.perm import Permutation, PermutationSpec

if TYPE_CHECKING:
    from lmckit.data import Dataset
    from lmckit.progress import ProgressCallback
    from lmckit.transform import Transform


@dataclass(frozen=True)
class MatchResult:
    """What aligns model B to model A — a permutation, or for the methods beyond
    permutations a transform — and how it was found.

    ``alignment.apply(params_b)`` is π(θ_B), aligned to θ_A (for a transform, of the
    norm-folded models: :func:`lmckit.transform.align`).

    Attributes:
        alignment: a :class:`~lmckit.perm.Permutation`, or a
            :class:`~lmckit.transform.Transform` (``wm-orth``, ``am-full`` …: the methods of
            :data:`lmckit.match.TRANSFORM_METHODS`).
        method: the matcher's name.
        history: the matcher's objective after each iteration (weight matching: the inner
            product ⟨θ_A, π(θ_B)⟩ over the matched tensors after each sweep; STE/Sinkhorn:
            the loss per epoch or step; activation matching: the total matched gain).
        iterations: sweeps (weight matching), optimisation steps (STE, Sinkhorn) or batches
            (activation matching).
        seconds: wall-clock time.
        distance_before, distance_after: ‖θ_A − θ_B‖ and ‖θ_A − π(θ_B)‖ over all
            floating-point tensors.
        duals: per-group LAP duals to warm-start a later call (weight matching, STE).
        info: method-specific extras (settings, counters).
    """

    alignment: Permutation | Transform
    method: str
    history: tuple[float, ...]
    iterations: int
    seconds: float
    distance_before: float
    distance_after: float
    duals: Mapping[str, LapDuals] | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def perm(self) -> Permutation | Transform:
        """The old name of :attr:`alignment` (it held transforms too), kept for one release."""
        return self.alignment


class Matcher(Protocol):
    """The matchers' one signature: B's parameters permuted (or transformed) onto A's.

    ``spec`` describes both parameter dicts; ``model`` runs them (methods that need it say
    so in their registry entry), ``data`` gives examples, ``init`` a starting permutation,
    ``seed`` every random choice, ``progress`` hears one event per step; the remaining
    keyword options are the method's own (:meth:`lmckit.registry.Method.options`).
    """

    def __call__(
        self,
        spec: PermutationSpec,
        params_a: Params,
        params_b: Params,
        *,
        model: Any = None,
        data: Dataset | None = None,
        init: Permutation | None = None,
        seed: int = 0,
        progress: ProgressCallback | None = None,
        **options: Any,
    ) -> MatchResult: ...


def check_inputs(
    spec: PermutationSpec,
    params_a: Params,
    params_b: Params,
    init: Permutation | None = None,
    seed: int = 0,
) -> None:
    """Both dicts fit the spec and each other, every floating tensor is finite, ``init``
    (if any) is a permutation of the spec's groups and ``seed`` a seed.

    Raises:
        SpecError: not a spec, a spec without groups, or dicts that do not fit it.
        ParamsError: a tensor is not finite or the dicts differ (naming it); a bad seed.
        PermutationError: ``init`` is not a permutation of the spec's groups.
    """
    if not isinstance(spec, PermutationSpec):
        raise SpecError(f"spec must be a PermutationSpec, got {type(spec).__name__}")
    if not spec.groups:
        raise SpecError(
            "the spec has no permutation groups, so there is nothing to match or merge (a "
            "traced spec is empty when every axis is frozen: see its report)"
        )
    spec.validate(params_a, what="params_a")
    spec.validate(params_b, what="params_b")
    check_params_compatible(params_a, params_b)
    check_finite(params_a, "model A")
    check_finite(params_b, "model B")
    check_products_finite(params_a, params_b)
    check_init(spec, init)
    check_seed(seed)


def check_init(spec: PermutationSpec, init: Permutation | None) -> None:
    """``init`` is ``None`` or a :class:`Permutation` of ``spec``'s groups and sizes."""
    if init is None:
        return
    if not isinstance(init, Permutation):
        raise PermutationError(f"init must be a Permutation, got {type(init).__name__}")
    if dict(init.spec.groups) != dict(spec.groups):
        raise PermutationError(
            f"init permutes groups {dict(init.spec.groups)}, the spec has {dict(spec.groups)}"
        )


def check_duals(duals: Mapping[str, LapDuals] | None) -> None:
    """``duals`` is ``None`` or a mapping of group names to :class:`~lmckit.lap.LapDuals`
    (``MatchResult.duals`` of an earlier call)."""
    if duals is None:
        return
    if not isinstance(duals, Mapping) or not all(isinstance(d, LapDuals) for d in duals.values()):
        raise ParamsError("duals must map group names to LapDuals (a MatchResult's .duals)")


def matched_names(params: Mapping[str, Tensor], include_running_stats: bool) -> list[str]:
    """Floating tensors that enter weight matching's objective."""
    return [
        k
        for k, t in params.items()
        if t.dtype.is_floating_point and (include_running_stats or not is_running_stat(k))
    ]
