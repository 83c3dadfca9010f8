"""Weight matching over orthogonal symmetries as well as permutations.

The objective is weight matching's, ``max ⟨θ_A, T(θ_B)⟩`` (equivalently ``min ‖θ_A −
T(θ_B)‖²``), now over a :class:`~lmckit.transform.Transform`: an orthogonal matrix for
each group whose kind allows one (``spec.kinds``, :func:`lmckit.tracing.symmetry_kinds`), a
permutation elsewhere. The coordinate descent is Git Re-Basin Alg. 1's: visit the update
units in a random order; with every other group fixed, the objective is linear in the
group's map, ``⟨M, C⟩`` with the same gain matrix ``C`` as weight matching's LAP, and its
best map has a closed form per kind:

* permutation: the LAP of ``C``;
* orthogonal: Procrustes, ``M = U Vᵀ`` for ``C = U S Vᵀ`` (value ``Σ S``);
* orthogonal-mean-free: Procrustes on the mean-free subspace — with ``B`` an orthonormal
  basis whose first vector is ``1/√n``, ``M = B diag(1, R) Bᵀ`` where ``R`` solves
  Procrustes on ``(Bᵀ C B)[1:, 1:]``;
* head-structured groups (one head permutation ``π`` shared by a tie): for every pair of
  heads ``(i, j)`` the best block — Procrustes (nuclear norm of the ``d × d`` block) or a
  LAP — then the LAP over heads of the summed block optima, exactly as
  :func:`lmckit.lap.assign_heads` separates the permutation case.

A map is replaced only when it raises the objective by more than a relative tolerance,
so the objective never decreases (specs without self-maps) and the descent stops when a
sweep changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor, nn

from lmckit._checks import check_int
from lmckit.errors import PermutationError
from lmckit.kinds import KINDS, rotary_pairs
from lmckit.match.result import MatchResult, check_inputs
from lmckit.options import Count, checked
from lmckit.params import Params, detached
from lmckit.perm import (
    Permutation,
    PermutationSpec,
    copies_gains,
    group_rows,
    put_group_rows,
    solve_copies,
    tie_outer,
)
from lmckit.progress import ProgressCallback, notify
from lmckit.transform import (
    Transform,
    dense_matrix,
    head_matrix,
    mean_free_basis,
    orthogonal_subgroup,
    transform_tensor,
)

__all__ = ["orthogonal_weight_matching", "procrustes", "rotary_procrustes"]


def procrustes(gains: Tensor) -> Tensor:
    """The orthogonal ``M`` maximising ``⟨M, gains⟩ = Σ_ij M_ij gains_ij``: ``U Vᵀ`` for
    ``gains = U S Vᵀ`` (float64)."""
    u, _, vh = torch.linalg.svd(gains.to(torch.float64))
    return u @ vh


def mean_free_procrustes(gains: Tensor) -> Tensor:
    n = gains.shape[0]
    basis = mean_free_basis(n)
    inner = basis.T @ gains.to(torch.float64) @ basis
    rotation = torch.eye(n, dtype=torch.float64)
    rotation[1:, 1:] = procrustes(inner[1:, 1:])
    return basis @ rotation @ basis.T


def rotary_procrustes(gains: Tensor, layout: tuple[str, int]) -> Tensor:
    """The map of a rotary head maximising ``⟨M, gains⟩`` over the maps that commute with
    the rotary embedding (``gains``: ``(..., d, d)``, batched over the leading axes): per
    rotated pair ``(a, b)`` the 2 × 2 rotation by ``atan2(g_ba − g_ab, g_aa + g_bb)`` (value
    ``hypot(g_aa + g_bb, g_ba − g_ab)``), and Procrustes on the unrotated dimensions."""
    g = gains.to(torch.float64)
    d = g.shape[-1]
    out = torch.zeros_like(g)
    pairs = rotary_pairs(*layout)
    for a, b in pairs:
        cos, sin = g[..., a, a] + g[..., b, b], g[..., b, a] - g[..., a, b]
        radius = torch.hypot(cos, sin)
        safe = torch.where(radius > 0, radius, torch.ones_like(radius))
        cos = torch.where(radius > 0, cos / safe, torch.ones_like(radius))
        sin = torch.where(radius > 0, sin / safe, torch.zeros_like(radius))
        out[..., a, a], out[..., a, b], out[..., b, a], out[..., b, b] = cos, -sin, sin, cos
    paired = {x for pair in pairs for x in pair}
    free = torch.tensor([x for x in range(d) if x not in paired], dtype=torch.long)
    if len(free):
        out[..., free[:, None], free] = procrustes(g[..., free[:, None], free])
    return out


def _solve_tie(spec: PermutationSpec, gains: dict[str, Tensor]) -> dict[str, Tensor]:
    """Best maps of a head tie's groups given their gain matrices (see the module
    docstring): block optima per head pair, then the LAP over heads."""
    heads = spec.heads[next(iter(gains))][1]
    totals = np.zeros((heads, heads))
    best: dict[str, list[list[Tensor]]] = {}
    for g, c in gains.items():
        d = c.shape[0] // heads
        blocks = c.reshape(heads, d, heads, d).transpose(1, 2)
        if g in spec.pinned and not KINDS[spec.kind(g)].matrix:  # whole heads: the traces
            totals += blocks.diagonal(dim1=-2, dim2=-1).sum(-1).to(torch.float64).numpy()
            best[g] = [[torch.arange(d)] * heads for _ in range(heads)]
        elif not KINDS[spec.kind(g)].matrix:  # a LAP per pair of heads
            best[g] = []
            for i in range(heads):
                row = []
                for j in range(heads):
                    rows, cols = linear_sum_assignment(blocks[i, j].numpy(), maximize=True)
                    totals[i, j] += float(blocks[i, j].numpy()[rows, cols].sum())
                    row.append(torch.from_numpy(cols).long())
                best[g].append(row)
        else:  # Procrustes per pair of heads, all heads² in one batched SVD
            layout = spec.rotary.get(g)
            maps = procrustes(blocks) if layout is None else rotary_procrustes(blocks, layout)
            totals += (maps * blocks.to(torch.float64)).sum((-2, -1)).numpy()
            best[g] = [list(row) for row in maps]
    _, outer_np = linear_sum_assignment(totals, maximize=True)
    outer = torch.from_numpy(outer_np).long()
    out: dict[str, Tensor] = {}
    for g, rows in best.items():
        chosen = [rows[i][int(outer[i])] for i in range(heads)]
        if not KINDS[spec.kind(g)].matrix:
            d = spec.groups[g] // heads
            out[g] = (outer[:, None] * d + torch.stack(chosen)).reshape(-1)
        else:
            out[g] = head_matrix(outer, chosen)
    return out


def _assignment(gains: Tensor) -> Tensor:
    return torch.from_numpy(linear_sum_assignment(gains.numpy(), maximize=True)[1]).long()


def per_head_only(gains: Tensor) -> Tensor:
    """The fit-table entry of a kind whose maps act inside heads only (the rotary kinds): a
    group without heads cannot have it (the spec refuses one), so reaching it is an error."""
    raise PermutationError("rotary maps act inside heads: a rotary group is head-structured")


FITS: dict[str, Callable[[Tensor], Tensor]] = {
    "permutation": _assignment,
    "orthogonal": lambda gains: procrustes(gains),
    "orthogonal-mean-free": lambda gains: mean_free_procrustes(gains),
    "rotary": per_head_only,
}
"""The best map of one group of each distance-keeping kind (the ``narrowed`` kinds of
:data:`lmckit.kinds.KINDS`: this matcher runs on :func:`~lmckit.transform.orthogonal_subgroup`)
given its gain matrix ``Σ W_A W̃_Bᵀ`` — the assignment, or Procrustes."""


def _solve(spec: PermutationSpec, group: str, gains: Tensor) -> Tensor:
    return FITS[spec.kind(group)](gains)


def _value(map_: Tensor, gains: Tensor) -> float:
    """``⟨M, gains⟩`` for a matrix or an index vector."""
    if map_.ndim == 1:
        return float(gains[torch.arange(gains.shape[0]), map_].sum())
    return float((map_.to(gains.dtype) * gains).sum())


def _step(transform: Transform, new: dict[str, Tensor]) -> float:
    """The largest entry change of the matrices in ``new`` against ``transform``'s
    (an index vector that changes counts as 1)."""
    step = 0.0
    for g, m in new.items():
        old = transform[g]
        if old.ndim == 1 and m.ndim == 1:
            step = max(step, 0.0 if torch.equal(old, m) else 1.0)
        else:
            step = max(step, (transform.matrix(g) - dense_matrix(m)).abs().max().item())
    return step


def _move(
    spec: PermutationSpec, current: dict[str, Tensor], group: str, old: Tensor, new: Tensor
) -> None:
    """Replace ``group``'s map ``old`` by ``new`` in the transformed tensors ``current``:
    apply ``new ∘ old⁻¹`` on every axis of the group (an index when both are index
    vectors, ``argsort(old)[new]``; a matrix otherwise)."""
    if old.ndim == 1 and new.ndim == 1:
        index, matrix = torch.argsort(old)[new], None
    else:
        index, matrix = None, dense_matrix(new) @ dense_matrix(old).T
    for name, axis in spec.group_axes(group):
        if name not in current:
            continue
        t = current[name]
        rows = group_rows(spec, name, axis, group, t)
        moved = (
            rows.index_select(0, index.to(rows.device))
            if matrix is None
            else matrix.to(rows.device, rows.dtype) @ rows
        )
        current[name] = put_group_rows(spec, name, axis, group, t, moved)


@checked
def orthogonal_weight_matching(
    spec: PermutationSpec,
    params_a: Params,
    params_b: Params,
    *,
    model: nn.Module | None = None,
    data: object = None,
    init: Transform | Permutation | None = None,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    max_iter: Count = 100,
    rel_tol: float = 1e-10,
    step_tol: float = 1e-12,
    gain_tol: float | None = None,
) -> MatchResult:
    """Find ``T`` maximising ``⟨θ_A, T(θ_B)⟩`` over the spec's kinds (module docstring).

    Args:
        spec: a spec with kinds (:func:`lmckit.tracing.symmetry_kinds`); groups without one are
            permuted, so a spec without kinds gives weight matching's permutations. Weight
            matching searches the distance-keeping part of each kind
            (:func:`~lmckit.transform.orthogonal_subgroup`): invertible groups get orthogonal
            maps, scaling groups permutations (their scales are fitted on activations:
            :func:`~lmckit.match.least_squares_refinement`).
        params_a, params_b: models A and B with their norm gains folded
            (:func:`lmckit.transform.fold_norms` of each), same keys and shapes, finite.
        model, data: accepted for the matchers' common signature; unused.
        init: starting transform (identity by default).
        seed: fixes the random order of the update units in each sweep.
        progress: receives the objective after every sweep.
        max_iter: maximum number of sweeps.
        rel_tol: a permutation is replaced only when it raises the objective by more than
            ``rel_tol`` times its magnitude.
        step_tol: an orthogonal map (the exact optimum of its group, given the others) is
            replaced when it moves an entry by more than ``step_tol``; the descent stops
            when a sweep replaces nothing. (Near the optimum the objective changes by the
            square of the maps' error, below float64 resolution long before the maps
            converge: the maps' own change is the test that recovers them to 1e-10.)
        gain_tol: the descent also stops after two sweeps in a row that each raise the
            objective by at most ``gain_tol`` times its magnitude; 0 turns the test off.
            ``None`` (default): the resolution of the models' dtype — off in float64, where
            the step test ends the descent; ``torch.finfo(dtype).eps`` below it, where
            rounding of the moved weights keeps the maps from settling to ``step_tol`` and
            the descent would run to ``max_iter`` (on the study's trained float32 Llamas it
            made 99.99 % of its gain by sweep 28–44 and ran to 100; with the test it stops
            at sweep 44–70, 1e-6 short: ``benchmarks/bench_wm_orth.py``).

    Returns:
        :class:`MatchResult` whose ``alignment`` is a :class:`~lmckit.transform.Transform`
        (``perm.apply(params_b)`` is ``T(θ_B)``), ``history`` the objective after each
        sweep, ``info["kinds"]`` the number of groups per kind, ``info["stopped"]`` why the
        descent ended (``"converged"``: a sweep replaced nothing; ``"gain_tol"``;
        ``"max_iter"``) and ``info["gain_tol"]`` the tolerance it used.

    Raises:
        PermutationError: a gain of a rotated group is not folded in A or B.
    """
    start = time.perf_counter()
    check_inputs(spec, params_a, params_b, None, seed)
    check_int("max_iter", max_iter)
    for what, value in (("rel_tol", rel_tol), ("step_tol", step_tol), ("gain_tol", gain_tol)):
        if what == "gain_tol" and value is None:
            continue
        if not isinstance(value, int | float) or isinstance(value, bool) or not value >= 0:
            raise PermutationError(f"{what} must be a non-negative number, got {value!r}")
    if isinstance(init, Permutation):
        init = Transform.from_permutation(init)
    if init is not None and (not isinstance(init, Transform) or init.spec.groups != spec.groups):
        raise PermutationError("init must be a Transform (or Permutation) of the spec's groups")
    given, spec = spec, orthogonal_subgroup(spec)
    if init is not None:
        init = Transform(spec, dict(init.items()))
    params_a, params_b = detached(params_a), detached(params_b)
    rotated = {g for g in spec.groups if KINDS[spec.kind(g)].matrix}
    gains_of_rotated = {k for k in spec.folds if spec.gain_group(k) in rotated}
    for what, params in (("A", params_a), ("B", params_b)):
        unfolded = [k for k in gains_of_rotated if not bool((params[k] == 1).all())]
        if unfolded:
            raise PermutationError(
                f"model {what}'s norm gains {unfolded[:3]} are not folded: fold both models "
                "first (lmckit.transform.fold_norms), since a gain does not commute with a "
                "rotation"
            )
    names = [
        k for k, t in params_a.items() if t.dtype.is_floating_point and k not in gains_of_rotated
    ]
    transform = init or Transform.identity(spec)
    current = {k: transform_tensor(params_b[k], transform, k) for k in names}
    units = spec.update_units()
    generator = torch.Generator().manual_seed(seed)

    def objective() -> float:
        return sum(float((params_a[k].double() * current[k].double()).sum()) for k in names)

    if gain_tol is None:
        dtype = params_a[names[0]].dtype if names else torch.float64
        gain_tol = 0.0 if dtype == torch.float64 else torch.finfo(dtype).eps
    history: list[float] = []
    total = objective()
    sweeps = small_gains = 0
    stopped = "max_iter"
    for _ in range(max_iter):
        sweeps += 1
        changed = False
        for idx in torch.randperm(len(units), generator=generator).tolist():
            unit = units[idx]
            gains = {g: _gains(spec, params_a, current, transform, g, names) for g in unit}
            if len(unit) == 1 and unit[0] not in spec.heads:
                new = {unit[0]: _solve(spec, unit[0], gains[unit[0]])}
            else:
                new = _solve_tie(spec, gains)
            old_value = sum(_value(transform[g], gains[g]) for g in unit)
            new_value = sum(_value(new[g], gains[g]) for g in unit)
            slack = rel_tol * max(abs(total), 1e-300)
            if all(new[g].ndim == 1 for g in unit):
                if new_value - old_value <= slack:
                    continue
            elif new_value < old_value - slack or _step(transform, new) <= step_tol:
                continue
            for g in unit:
                _move(spec, current, g, transform[g], new[g])
            transform = transform.replace(**new)
            changed = True
        for c in spec.copies:  # query heads inside their key/value group
            moved = _copies_step(spec, params_a, params_b, transform, current, c, names, rel_tol)
            if moved is not None:
                transform = moved
                changed = True
        previous, total = total, objective()
        history.append(total)
        notify(progress, sweeps, max_iter, objective=total)
        if not changed:
            stopped = "converged"
            break
        small = gain_tol > 0 and total - previous <= gain_tol * abs(total)
        small_gains = small_gains + 1 if small else 0
        if small_gains == 2:
            stopped = "gain_tol"
            break
    counts = spec.kind_counts()
    transform = Transform(given, dict(transform.items()))
    return MatchResult(
        alignment=transform,
        method="wm-orth",
        history=tuple(history),
        iterations=sweeps,
        seconds=time.perf_counter() - start,
        distance_before=Transform.identity(spec).distance(params_a, params_b),
        distance_after=transform.distance(params_a, params_b),
        info={"kinds": counts, "stopped": stopped, "gain_tol": gain_tol},
    )


def _copies_step(
    spec: PermutationSpec,
    params_a: Params,
    params_b: Params,
    transform: Transform,
    current: dict[str, Tensor],
    group: str,
    names: list[str],
    rel_tol: float,
) -> Transform | None:
    """One step of a copies group (``current`` updated in place when it is taken), the
    better of two moves if either raises the objective by more than ``rel_tol``:

    * the exact coordinate step, every other map held (one assignment per key/value head);
    * a joint move that escapes where the tie's matrices were fitted to the wrong copies:
      the copies chosen by gains that no map of the head changes — the nuclear norm
      ``‖A_copy B_copyᵀ‖_*``, the best orthogonal fit of each pair of copies alone — then the
      tie's maps fitted anew to them (planted zoo Llama: 2.72 of 13.4 left by coordinate
      steps alone; 0 with the joint move)."""
    tie = spec.copies[group]
    members = spec.head_ties()[tie]
    wanted = [k for k, _ in spec.copies_axes(group) if k in names]
    if not wanted:
        return None
    touched = sorted(
        {k for g in members for k, _ in spec.group_axes(g) if k in current} | set(wanted)
    )
    h, r = spec.copies_layout(group)
    outer = tie_outer(spec, tie, transform)
    without = transform.replace(**{group: torch.arange(spec.groups[group])})
    moved = {k: transform_tensor(params_b[k], without, k) for k in wanted}
    exact = copies_gains(
        spec, params_a, params_b, transform, group, names=wanted, moved_b=moved.__getitem__
    )
    invariant = torch.zeros(h, r, r, dtype=torch.float64)
    for name, axis in spec.copies_axes(group):
        if name in moved:
            a, b = params_a[name], moved[name]
            span = spec.copies_span(name, axis)
            if span is not None:  # a direct sum: its head-repeated segment
                a, b = a.narrow(axis, *span), b.narrow(axis, *span)
            entry = spec.axes[name][axis]
            if isinstance(entry, tuple):  # the group of the head-repeated segment
                entry = next(
                    p for k, p in enumerate(entry) if spec.segment_layout(name, axis, k)[1] > 1
                )
            d = spec.groups[entry] // h  # type: ignore[index]
            a4 = a.movedim(axis, 0).reshape(h, r, d, -1).to(torch.float64)
            b4 = b.movedim(axis, 0).reshape(a4.shape).to(torch.float64)
            cross = torch.einsum("htdx,huex->htude", a4, b4)
            invariant += torch.linalg.matrix_norm(cross, ord="nuc").cpu()
    invariant_b = torch.empty_like(invariant)
    invariant_b[outer.cpu()] = invariant

    def inner(t: Transform) -> tuple[float, dict[str, Tensor]]:
        out = {k: transform_tensor(params_b[k], t, k) for k in touched}
        return sum(float((params_a[k].double() * out[k].double()).sum()) for k in touched), out

    before = sum(float((params_a[k].double() * current[k].double()).sum()) for k in touched)
    best, best_value, best_current = None, before, None
    step = transform.replace(**{group: solve_copies(exact)})
    value, tensors = inner(step)
    if value > best_value + rel_tol * max(abs(best_value), 1e-300):
        best, best_value, best_current = step, value, tensors
    joint = transform.replace(**{group: solve_copies(invariant_b)})
    trial = {**current, **inner(joint)[1]}
    refit = _solve_tie(spec, {g: _gains(spec, params_a, trial, joint, g, names) for g in members})
    joint = joint.replace(**refit)
    value, tensors = inner(joint)
    if value > best_value + rel_tol * max(abs(best_value), 1e-300):
        best, best_value, best_current = joint, value, tensors
    if best is not None:
        assert best_current is not None
        current.update(best_current)
    return best


def _gains(
    spec: PermutationSpec,
    params_a: Params,
    current: dict[str, Tensor],
    transform: Transform,
    group: str,
    names: list[str],
) -> Tensor:
    """``C_g``: the gain matrix of ``group`` with every other group at its current map
    (``Σ A_rows B_otherᵀ``, where ``B_other`` is B with ``group``'s own map undone), as a
    CPU float64 matrix."""
    n = spec.groups[group]
    wanted = set(names)
    gram = torch.zeros(n, n, dtype=torch.float64)
    for name, axis in spec.group_axes(group):
        if name not in wanted:
            continue
        a = group_rows(spec, name, axis, group, params_a[name]).to(torch.float64)
        b = group_rows(spec, name, axis, group, current[name]).to(torch.float64)
        gram += (a @ b.T).cpu()
    m = transform[group]
    if m.ndim == 1:  # B_other rows = B_cur rows permuted back
        return gram[:, torch.argsort(m)]
    return gram @ m.to(torch.float64)
