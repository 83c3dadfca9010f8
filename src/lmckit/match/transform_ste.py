"""The midpoint loss minimised over the continuous symmetries: Git Re-Basin's STE objective,
with the orthogonal and invertible maps parameterised instead of projected.

Git Re-Basin's STE (§3.3) minimises the loss of the midpoint ``½(θ_A + π(θ_B))`` over
permutations, which are discrete, so it differentiates through a projection. An orthogonal
or invertible group is a smooth manifold: here each of its maps is written as
``M = R(K) M₀`` with ``M₀`` the starting map and

* orthogonal: ``R = exp(K − Kᵀ)`` (a rotation; ``K = 0`` is ``M₀``);
* orthogonal-mean-free: the same on the mean-free subspace, ``R = B diag(1, exp(K − Kᵀ)) Bᵀ``;
* invertible: ``R = exp(K)`` (always invertible);
* per head for head-structured groups (``R`` block-diagonal, so ``M₀``'s head pairing is
  kept),

and ``K`` follows the gradient of the midpoint loss (Adam) — no straight-through estimate
is needed. Permutation and scaling groups keep ``M₀``'s maps. The maps act on B exactly as a
:class:`~lmckit.transform.Transform` does (readers of invertible groups by ``M⁻ᵀ``), so the
result is a symmetry of B for every ``K``: only the path between A and B changes.
"""

from __future__ import annotations

import time
from itertools import islice

import torch
from torch import Tensor, nn

from lmckit.data import DataSource, as_batches
from lmckit.errors import ParamsError
from lmckit.functional import check_model_fits, module_mode
from lmckit.kinds import KINDS
from lmckit.match.network import (
    batch_loss,
    batches_per_pass,
    check_training_options,
    optimise,
    require_model_and_data,
)
from lmckit.match.result import MatchResult
from lmckit.options import Count, Positive, checked
from lmckit.params import Params, detached
from lmckit.perm import Permutation, PermutationSpec
from lmckit.progress import ProgressCallback, notify
from lmckit.transform import Transform, mean_free_basis, transform_tensor

__all__ = ["transform_ste_matching"]


class _Maps:
    """What :func:`~lmckit.transform.transform_tensor` reads of a transform, with
    differentiable matrices."""

    def __init__(self, spec: PermutationSpec, maps: dict[str, Tensor]) -> None:
        self.spec = spec
        self._maps = maps
        self._duals: dict[str, Tensor] = {}

    def __getitem__(self, group: str) -> Tensor:
        return self._maps[group]

    def is_matrix(self, group: str) -> bool:
        return self._maps[group].ndim == 2

    def dual(self, group: str) -> Tensor:
        m = self._maps[group]
        if m.ndim == 1 or not KINDS[self.spec.kind(group)].dual:
            return m
        if group not in self._duals:
            self._duals[group] = torch.linalg.inv(m).T
        return self._duals[group]


def _maps(spec: PermutationSpec, start: Transform, params: dict[str, Tensor]) -> dict[str, Tensor]:
    """Every group's map as a function of the free parameters ``params``."""
    out: dict[str, Tensor] = {}
    for g in spec.groups:
        if g not in params:
            out[g] = start[g]
            continue
        row, m0, k = KINDS[spec.kind(g)], start.matrix(g), params[g]
        assert row.learned is not None
        if g in spec.heads:
            heads = spec.heads[g][1]
            layout = spec.rotary.get(g) if row.layout else None  # the pairs a map keeps
            rotation = torch.block_diag(*(row.learned(k[i], layout) for i in range(heads)))
        else:
            basis = mean_free_basis(spec.groups[g]) if row.needs_basis else None
            rotation = row.learned(k, basis)
        out[g] = rotation @ m0
    return out


def _free_parameters(spec: PermutationSpec) -> dict[str, Tensor]:
    params: dict[str, Tensor] = {}
    for g, n in spec.groups.items():
        row = KINDS[spec.kind(g)]
        if row.free_shape is None:  # not learned by gradient
            continue
        if g in spec.heads:
            heads = spec.heads[g][1]
            shape: tuple[int, ...] = (heads, *row.free_shape(n // heads))
        else:
            shape = row.free_shape(n)
        params[g] = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    return params


def _moved(
    spec: PermutationSpec, maps: dict[str, Tensor], params_b: Params, like: Params
) -> dict[str, Tensor]:
    """``T(θ_B)`` differentiably in ``maps`` (computed in float64, returned in the dtypes
    of ``like``'s tensors)."""
    holder = _Maps(spec, maps)
    return {
        name: transform_tensor(t.to(torch.float64), holder, name).to(like[name].dtype)
        if t.dtype.is_floating_point
        else t
        for name, t in params_b.items()
    }


@checked
def transform_ste_matching(
    spec: PermutationSpec,
    params_a: Params,
    params_b: Params,
    *,
    model: nn.Module | None = None,
    data: DataSource | None = None,
    init: Transform | Permutation | None = None,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    epochs: Count = 1,
    lr: Positive = 1e-3,
    batch_size: Count = 256,
    n_batches: Count | None = None,
) -> MatchResult:
    """Minimise the midpoint loss over the orthogonal and invertible maps (module docstring).

    Args:
        spec: a spec with kinds (:func:`lmckit.tracing.symmetry_kinds`).
        params_a, params_b: models A and B with their norm gains folded.
        model: a module both fit (run in eval mode: dropout off).
        data: an lmckit ``Dataset`` (training split, shuffled by ``seed``) or batches.
        init: the starting transform ``M₀`` (weight matching's orthogonal result, say;
            identity by default).
        seed: the batch order.
        progress: after every step, with the midpoint loss.
        epochs, lr, batch_size: Adam on the map parameters over this many passes.
        n_batches: steps per epoch at most.

    Returns:
        :class:`MatchResult` whose ``alignment`` is the final :class:`~lmckit.transform.Transform`
        and ``history`` the midpoint loss of every step.

    Raises:
        ParamsError: no model or data, bad options, or a spec with no continuous group.
    """
    started = time.perf_counter()
    model = require_model_and_data("transform_ste_matching", model, data)
    check_training_options("transform_ste_matching", epochs=epochs, lr=lr, batch_size=batch_size)
    if n_batches is not None and (isinstance(n_batches, bool) or n_batches < 1):
        raise ParamsError(f"n_batches must be ≥ 1 or None, got {n_batches!r}")
    if isinstance(init, Permutation):
        init = Transform.from_permutation(init)
    start = Transform(spec, dict(init.items())) if init is not None else Transform.identity(spec)
    spec.validate(params_a, what="params_a")
    spec.validate(params_b, what="params_b")
    check_model_fits(model, params_a, "params_a")
    free = _free_parameters(spec)
    if not free:
        raise ParamsError(
            "the spec has no orthogonal or invertible group to optimise (the midpoint descent "
            "leaves permutations and scalings where they start: use wm-full or am-full)"
        )
    params_a, params_b = detached(params_a), detached(params_b)
    optimizer = torch.optim.Adam(list(free.values()), lr=lr)
    history: list[float] = []
    steps = 0
    total = batches_per_pass(as_batches(data, batch_size=batch_size, shuffle=True, seed=seed))
    with module_mode(model, False):
        for epoch in range(epochs):
            batches = as_batches(data, batch_size=batch_size, shuffle=True, seed=seed + epoch)
            for x, y in islice(batches, n_batches):
                if y is None:
                    raise ParamsError(
                        "transform_ste_matching needs labelled batches (x, y): it minimises "
                        "the midpoint's loss"
                    )
                device = next(iter(params_a.values())).device
                moved = _moved(spec, _maps(spec, start, free), params_b, params_a)
                mid = {
                    k: (params_a[k] + moved[k].to(device)) / 2
                    if params_a[k].dtype.is_floating_point
                    else params_a[k]
                    for k in params_a
                }
                loss = batch_loss(model, mid, x.to(device), y.to(device))
                history.append(optimise(optimizer, loss, "transform_ste_matching", steps))
                steps += 1
                notify(progress, steps, (total or 0) * epochs or None, loss=history[-1])
    with torch.no_grad():
        final = {g: m.detach() for g, m in _maps(spec, start, free).items()}
    transform = Transform(spec, final)
    identity = Transform.identity(spec)
    return MatchResult(
        alignment=transform,
        method="ste-transform",
        history=tuple(history),
        iterations=steps,
        seconds=time.perf_counter() - started,
        distance_before=identity.distance(params_a, params_b),
        distance_after=transform.distance(params_a, params_b),
        info={"epochs": epochs, "lr": lr},
    )
