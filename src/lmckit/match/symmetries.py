"""Alignment over more than permutations, in one call: find each group's kind, fold the
norms, match.

The matchers of :mod:`lmckit.match.orthogonal` and :mod:`lmckit.match.activation_transform`
need a spec with kinds and both models' norm gains folded; :func:`symmetry_matching`
does both from the model (:func:`lmckit.tracing.symmetry_kinds` on an example batch) and runs
the stages of one recipe:

* ``start="wm"``: weight matching over permutations, continued over orthogonal maps
  (Procrustes in the same coordinate descent); with ``symmetries="full"`` the invertible
  and scaling groups are then refitted by least squares on the data, keeping the heads
  and units weight matching paired.
* ``start="am"``: every group fitted on activations at once (LAP, Procrustes, least
  squares); ``symmetries="orth"`` restricts each kind to its orthogonal maps.
* ``start="ste"``: weight matching over permutations and orthogonal maps, then the midpoint
  loss minimised over the orthogonal (and, with ``"full"``, invertible) maps by gradient
  descent on their parameterisation (:func:`~lmckit.match.transform_ste.transform_ste_matching`),
  starting from the orthogonal maps: not from ``"wm"``'s least-squares fit, whose
  ill-conditioned maps (condition numbers in the hundreds on our ViTs) put the descent
  where the midpoint is worst.

The result's ``alignment`` is a :class:`~lmckit.transform.Transform` of the *folded* models:
:func:`lmckit.transform.align_pair` folds A and B and applies it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

from torch import Tensor, nn

from lmckit.data import DataSource
from lmckit.errors import ParamsError
from lmckit.kinds import KINDS
from lmckit.match.activation_transform import transform_activation_matching
from lmckit.match.network import example_batch
from lmckit.match.orthogonal import orthogonal_weight_matching
from lmckit.match.result import MatchResult, check_inputs
from lmckit.match.transform_ste import transform_ste_matching
from lmckit.match.weight import weight_matching
from lmckit.options import Count, Positive, checked
from lmckit.params import Params
from lmckit.perm import Permutation, PermutationSpec
from lmckit.progress import ProgressCallback
from lmckit.transform import fold_norms, orthogonal_subgroup

__all__ = ["SYMMETRIES", "descent_bytes", "symmetry_matching"]

Symmetries = Literal["orth", "full"]
SYMMETRIES: tuple[str, ...] = get_args(Symmetries)
"""``"orth"``: permutations and orthogonal maps; ``"full"``: every kind the graph admits
(invertible maps per head, positive scalings of ReLU units too)."""

Start = Literal["wm", "am", "ste"]
STARTS: tuple[str, ...] = get_args(Start)


@checked
def symmetry_matching(
    spec: PermutationSpec,
    params_a: Params,
    params_b: Params,
    *,
    model: nn.Module | None = None,
    data: DataSource | None = None,
    init: Permutation | None = None,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    symmetries: Symmetries = "orth",
    start: Start = "wm",
    example_inputs: Tensor | Sequence[Any] | None = None,
    example_kwargs: Mapping[str, Any] | None = None,
    n_batches: Count | None = None,
    restarts: Count = 1,
    max_iter: Count = 100,
    gain_tol: float | None = None,
    epochs: Count = 1,
    lr: Positive = 1e-3,
    batch_size: Count = 256,
    max_memory: Count | None = None,
) -> MatchResult:
    """Align B to A over the symmetries ``model``'s graph admits (module docstring).

    Args:
        spec: the models' permutation spec (kinds are found here; any given are replaced).
        params_a, params_b: models A and B as trained (norm gains not folded).
        model: a module both fit; its graph decides each group's kind.
        data: an lmckit ``Dataset`` or ``(x, y)`` batches: the activations of ``"am"`` and
            of ``"full"``'s least squares, and the example batch when ``example_inputs``
            is not given (weight matching with ``"orth"`` needs only one of the two).
        init: accepted for the matchers' common signature; must be None.
        seed: weight matching's random order, the activation probe's seed.
        progress: the orthogonal descent's sweeps, or the activation batches.
        symmetries: ``"orth"`` or ``"full"``.
        start: ``"wm"`` (weights first), ``"am"`` (activations) or ``"ste"`` (weights
            first, then the midpoint loss over the continuous maps).
        example_inputs: a batch to read the graph with (default: the first rows of
            ``data``'s first batch).
        example_kwargs: keyword inputs of the example call (a Hugging Face model's).
        n_batches: activations from only the first ``n_batches`` batches.
        restarts: weight matching's restarts.
        max_iter: the orthogonal descent's sweeps at most (``start`` ``"wm"`` or
            ``"ste"``; :func:`~lmckit.match.orthogonal.orthogonal_weight_matching`): each
            sweep raises the objective, so fewer give a valid but less aligned transform.
        gain_tol: the orthogonal descent stops after two sweeps that each gain less than
            this share of its objective (default: the models' dtype's resolution; see
            :func:`~lmckit.match.orthogonal.orthogonal_weight_matching`).
        epochs, lr, batch_size: ``"ste"``'s descent on the midpoint loss
            (:func:`~lmckit.match.transform_ste.transform_ste_matching`).
        max_memory: bytes ``start="wm"`` may hold, the two models included: the kinds
            check runs in float32 where its float64 copies would not fit
            (:func:`~lmckit.tracing.kinds_check_precision`), weight matching keeps its
            cost matrices only where they fit, and the match is refused up front where
            the models, their folded readers and B's moved copy (what the orthogonal
            descent holds) exceed it.

    Returns:
        the last stage's :class:`MatchResult` (``alignment`` a
        :class:`~lmckit.transform.Transform` of the folded models, distances between folded
        models, ``seconds`` of all stages); ``info["stages"]`` lists each stage's method,
        distance and seconds, ``info["kinds"]`` the groups per kind and ``info["stopped"]``
        why the orthogonal descent ended (``None`` without one).

    Raises:
        ParamsError: an unknown ``symmetries`` or ``start``, no model or data, an ``init``,
            ``max_memory`` with a start other than ``"wm"``, or a model whose graph admits
            nothing beyond permutations.
        ResourceError: ``max_memory`` below what the match certainly holds.
    """
    from lmckit.tracing import symmetry_kinds

    started = time.perf_counter()
    if symmetries not in SYMMETRIES:
        raise ParamsError(f"symmetries must be one of {SYMMETRIES}, got {symmetries!r}")
    if start not in STARTS:
        raise ParamsError(f"start must be one of {STARTS}, got {start!r}")
    if init is not None:
        raise ParamsError("symmetry_matching starts from the identity; init is not taken")
    if not isinstance(model, nn.Module):
        raise ParamsError("symmetry_matching needs model= (a torch.nn.Module both models fit)")
    if data is None and (start != "wm" or symmetries == "full"):
        raise ParamsError(
            f"symmetry_matching with start={start!r}, symmetries={symmetries!r} needs data= "
            "(it fits maps on activations)"
        )
    if data is None and example_inputs is None:
        raise ParamsError("symmetry_matching needs example_inputs= or data= to read the graph")
    if max_memory is not None and start != "wm":
        raise ParamsError(
            f"max_memory bounds start='wm' only; start={start!r} holds activations or "
            "gradients it does not count"
        )
    check_inputs(spec, params_a, params_b, None, seed)
    if max_memory is not None:  # before the kinds check, which takes minutes on large models
        _check_descent_fits(spec, params_a, params_b, max_memory, with_folds=False)
    if example_inputs is None:
        example_inputs = example_batch(data, "symmetry_matching")
    report = symmetry_kinds(
        model, example_inputs, spec, example_kwargs=example_kwargs, max_memory=max_memory
    )
    kinds = report.spec
    if symmetries == "orth":
        kinds = orthogonal_subgroup(kinds)
    if not kinds.kinds:
        raise ParamsError(
            f"no group of {type(model).__name__} admits a map beyond permutations (see "
            f"`lmckit spec`): symmetries={symmetries!r} would give permutations"
        )
    if max_memory is not None:
        _check_descent_fits(kinds, params_a, params_b, max_memory)
    folded_a, folded_b = fold_norms(kinds, params_a), fold_norms(kinds, params_b)
    common = dict(model=model, data=data, seed=seed, n_batches=n_batches)
    if start == "am":
        stages = [
            transform_activation_matching(kinds, folded_a, folded_b, progress=progress, **common)
        ]
    else:
        wm = weight_matching(
            kinds, folded_a, folded_b, seed=seed, restarts=restarts, max_memory=max_memory
        )
        orth = orthogonal_weight_matching(
            kinds, folded_a, folded_b, init=wm.alignment, seed=seed, max_iter=max_iter,
            gain_tol=gain_tol,
            progress=progress if start == "wm" else None,  # one stream: the long stage's
        )  # fmt: skip
        stages = [wm, orth]
        refine = [g for g in kinds.groups if KINDS[kinds.kind(g)].fitted_on_data]
        if symmetries == "full" and refine and start == "wm":
            stages.append(
                transform_activation_matching(
                    kinds, folded_a, folded_b, init=stages[-1].alignment, refine=refine, **common
                )
            )
        if start == "ste":
            stages.append(
                transform_ste_matching(
                    kinds,
                    folded_a,
                    folded_b,
                    model=model,
                    data=data,
                    init=stages[-1].alignment,
                    seed=seed,
                    progress=progress,
                    epochs=epochs,
                    lr=lr,
                    batch_size=batch_size,
                    n_batches=n_batches,
                )
            )
    final = stages[-1]
    return MatchResult(
        alignment=final.alignment,
        method=f"{start}-{symmetries}",
        history=final.history,
        iterations=final.iterations,
        seconds=time.perf_counter() - started,
        distance_before=stages[0].distance_before,
        distance_after=final.distance_after,
        info={
            "stages": [
                {"method": r.method, "distance": r.distance_after, "seconds": r.seconds}
                for r in stages
            ],
            "kinds": kinds.kind_counts(),
            "kinds_precision": report.precision,
            "stopped": next((r.info["stopped"] for r in stages if "stopped" in r.info), None),
            "conditions": next(
                (r.info["conditions"] for r in stages if "conditions" in r.info), {}
            ),
        },
    )


@checked
def descent_bytes(spec: PermutationSpec, params_a: Params, params_b: Params) -> dict[str, int]:
    """What the orthogonal descent of ``start="wm"`` certainly holds, in bytes, for a spec
    with kinds and folds: ``models`` (A and B; a tensor two names share, once),
    ``folded`` (the readers and norm biases :func:`~lmckit.transform.fold_norms` writes
    anew, for each model) and ``moved`` (B's floating tensors moved by the current maps).
    A lower bound: one update's temporaries come on top."""
    from lmckit.match.weight_matcher import MemoryNeed

    rewritten = {name for readers in spec.folds.values() for name, _ in readers}
    rewritten |= set(spec.norm_biases.values()) | set(spec.folds)
    folded = sum(
        params[k].numel() * params[k].element_size()
        for params in (params_a, params_b)
        for k in rewritten
    )
    moved = sum(t.numel() * t.element_size() for t in params_b.values() if t.is_floating_point())
    models = MemoryNeed.of(spec, params_a, params_b).models
    return {"models": models, "folded": folded, "moved": moved}


def _check_descent_fits(
    spec: PermutationSpec,
    params_a: Params,
    params_b: Params,
    max_memory: int,
    with_folds: bool = True,
) -> None:
    """Refuse a ``max_memory`` below :func:`descent_bytes`; ``with_folds=False`` (before
    the kinds check has found the folds) counts the models and B's moved copy only."""
    from lmckit.budget import ResourceError, human_bytes

    need = descent_bytes(spec, params_a, params_b)
    if not with_folds:
        need["folded"] = 0
    if sum(need.values()) > max_memory:
        raise ResourceError(
            f"orthogonal weight matching needs at least {human_bytes(sum(need.values()))} "
            f"(the two models {human_bytes(need['models'])}, their folded readers "
            f"{human_bytes(need['folded'])}, B moved {human_bytes(need['moved'])}), more "
            f"than the {human_bytes(max_memory)} allowed by max_memory"
        )
