"""Weight matching (Git Re-Basin, Alg. 1), with STE-MM's dual warm start (Alg. 3).

Maximise ``⟨θ_A, π(θ_B)⟩`` — equivalently minimise ``‖θ_A − π(θ_B)‖²`` — by coordinate
descent: visit the groups in a random order, and for each solve the linear assignment
problem on ``C_g = Σ_{(param, axis) ∈ g} A_(n,-1) B̃_(n,-1)ᵀ`` with every other group held at
its current permutation. Stop after a sweep that improves nothing (or ``max_iter`` sweeps).

With ``warm_start=True`` every group keeps its LAP duals between solves (and between
calls, through ``duals=``), so once the permutations settle each LAP is nearly solved
before it starts and the time goes to forming ``C_g`` (matrix products).

:class:`WeightMatcher` holds model B's layouts and the permuted copies of them between
calls, for loops that match many A's to one B (STE, STE-MM, MergeMany-like schemes).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from lmckit.lap import LapDuals, solve_lap
from lmckit.match.result import MatchResult, check_inputs, matched_names
from lmckit.perm import Params, Permutation, PermutationSpec, params_distance


@dataclass
class _Term:
    """One (tensor, axis) of a group on the B side: B laid out as ``(n, *rest)`` with the
    other grouped axes of the rest — ``(position in b_moved, group)`` — to permute. The
    permuted B is cached and rebuilt only when one of those groups' permutations changes
    (also across calls of a :class:`WeightMatcher`)."""

    name: str
    axis: int
    b_moved: Tensor
    others: tuple[tuple[int, str], ...]
    cached_perms: tuple[Tensor, ...] | None = None
    cached_b2: Tensor | None = None

    def b2(self, perm: Mapping[str, Tensor]) -> Tensor:
        current = tuple(perm[h] for _, h in self.others)
        if self.cached_perms is None or not all(
            p is q or torch.equal(p, q) for p, q in zip(current, self.cached_perms, strict=True)
        ):
            b = self.b_moved
            for pos, h in self.others:
                b = b.index_select(pos, perm[h])
            self.cached_b2, self.cached_perms = b.reshape(b.shape[0], -1), current
        return self.cached_b2


class WeightMatcher:
    """Weight matching of many parameter sets A against one fixed model B.

    ``WeightMatcher(spec, params_b).match(params_a, ...)`` is
    ``weight_matching(spec, params_a, params_b, ...)``, but B's matrix layouts (and the
    permuted versions of them) are built once and kept, so a loop that re-matches a moving
    A every step pays only for the products.
    """

    def __init__(
        self,
        spec: PermutationSpec,
        params_b: Params,
        *,
        include_running_stats: bool = True,
        lap_backend: str = "lapjv",
    ) -> None:
        self.spec = spec
        self.params_b = params_b
        self.lap_backend = lap_backend
        self.include_running_stats = include_running_stats
        self.names = set(matched_names(params_b, include_running_stats))
        self.terms: dict[str, list[_Term]] = {g: [] for g in spec.groups}
        for g in spec.groups:
            for name, axis in spec.group_axes(g):
                if name not in self.names:
                    continue
                others = tuple(
                    (j + 1 if j < axis else j, h)  # position once `axis` is moved to the front
                    for j, h in enumerate(spec.axes[name])
                    if h is not None and j != axis
                )
                b_moved = params_b[name].movedim(axis, 0).contiguous()
                self.terms[g].append(_Term(name, axis, b_moved, others))
        self.groups = [g for g in spec.groups if self.terms[g]]
        self.grouped = {t.name for g in self.groups for t in self.terms[g]}
        # The groups whose permutations a group's cost matrix depends on. A group whose
        # neighbours have not changed since it was last solved would get the same matrix
        # and cannot improve, so its solve is skipped (self-mapped groups never are).
        self.neighbours = {
            g: tuple(sorted({h for t in self.terms[g] for _, h in t.others})) for g in self.groups
        }

    def match(
        self,
        params_a: Params,
        *,
        init: Permutation | None = None,
        duals: Mapping[str, LapDuals] | None = None,
        max_iter: int = 100,
        seed: int = 0,
        warm_start: bool = True,
        progress: Callable[[int, float], None] | None = None,
        validate: bool = True,
        distances: bool = True,
    ) -> MatchResult:
        """Match B onto ``params_a``; arguments as in :func:`weight_matching`."""
        start = time.perf_counter()
        spec, params_b = self.spec, self.params_b
        if validate:
            check_inputs(spec, params_a, params_b)
        a2 = {
            (t.name, t.axis): params_a[t.name].movedim(t.axis, 0).reshape(spec.groups[g], -1)
            for g in self.groups
            for t in self.terms[g]
        }
        device = next(iter(params_a.values())).device
        init_perm = init or Permutation.identity(spec)
        perm = {g: p.to(device) for g, p in init_perm.items()}
        lap_duals: dict[str, LapDuals] = dict(duals or {}) if warm_start else {}
        floating = params_a[next(iter(self.names))].dtype if self.names else torch.float32
        rel_tol = 1e-12 if floating == torch.float64 else 1e-6
        generator = torch.Generator().manual_seed(seed)
        # The objective is tracked per tensor from the diagonals of the per-term products: a
        # tensor's value is exact once the last of its groups has been solved in a sweep.
        # Linearised self-map tensors are instead evaluated exactly at the end of each sweep.
        constant = _objective(spec, params_a, params_b, perm, self.names - self.grouped)
        contributions: dict[str, float] = {}
        exact_each_sweep = bool(spec.self_maps & self.names)
        history: list[float] = []
        gemm_s = lap_s = 0.0
        solves = sweeps = skipped = flops = 0
        solved_with: dict[str, tuple[Tensor, ...]] = {}
        for sweep in range(max_iter):
            sweeps = sweep + 1
            improved = False
            for idx in torch.randperm(len(self.groups), generator=generator).tolist():
                g = self.groups[idx]
                n = spec.groups[g]
                terms = self.terms[g]
                neighbours = tuple(perm[h] for h in self.neighbours[g])
                last = solved_with.get(g)
                if (
                    last is not None
                    and g not in self.neighbours[g]
                    and all(p is q for p, q in zip(neighbours, last, strict=True))
                ):
                    skipped += 1
                    continue
                t0 = time.perf_counter()
                products = [a2[(t.name, t.axis)] @ t.b2(perm).T for t in terms]
                flops += sum(2 * n * a2[(t.name, t.axis)].numel() for t in terms)
                gains = products[0].clone() if len(products) > 1 else products[0]
                for product in products[1:]:
                    gains += product
                gains64 = gains.detach().to("cpu", torch.float64).numpy()
                t1 = time.perf_counter()
                g_dual = lap_duals.get(g)
                if g_dual is not None and g_dual.u.shape != (n,):
                    g_dual = None
                new, new_dual = solve_lap(
                    gains64, maximize=True, duals=g_dual, backend=self.lap_backend
                )
                lap_s += time.perf_counter() - t1
                gemm_s += t1 - t0
                solves += 1
                if warm_start:
                    lap_duals[g] = new_dual
                rows = np.arange(n)
                old_gain = float(gains64[rows, perm[g].cpu().numpy()].sum())
                new_gain = float(gains64[rows, new.numpy()].sum())
                if new_gain > old_gain + rel_tol * max(abs(old_gain), abs(new_gain), 1e-30):
                    perm[g] = new.to(device)
                    improved = True
                solved_with[g] = tuple(perm[h] for h in self.neighbours[g])
                chosen = perm[g][:, None]
                for term, product in zip(terms, products, strict=True):
                    contributions[term.name] = float(product.gather(1, chosen).double().sum())
            if exact_each_sweep:
                objective = constant + _objective(spec, params_a, params_b, perm, self.grouped)
            else:
                objective = constant + sum(contributions.values())
            history.append(objective)
            if progress is not None:
                progress(sweeps, objective)
            if not improved:
                break
        final = Permutation(spec, {g: p.cpu() for g, p in perm.items()})
        before = after = math.nan
        if distances:
            start_b = params_b if init is None else init_perm.apply(params_b)
            before = params_distance(params_a, start_b)
            after = params_distance(params_a, final.apply(params_b))
        return MatchResult(
            perm=final,
            method="weight_matching[warm]" if warm_start else "weight_matching",
            history=tuple(history),
            iterations=sweeps,
            seconds=time.perf_counter() - start,
            distance_before=before,
            distance_after=after,
            duals=lap_duals if warm_start else None,
            info={
                "gemm_seconds": gemm_s,
                "lap_seconds": lap_s,
                "lap_solves": solves,
                "skipped_solves": skipped,
                "gemm_flops": flops,
                "warm_start": warm_start,
                "lap_backend": self.lap_backend,
            },
        )


def weight_matching(
    spec: PermutationSpec,
    params_a: Params,
    params_b: Params,
    *,
    init: Permutation | None = None,
    duals: Mapping[str, LapDuals] | None = None,
    max_iter: int = 100,
    seed: int = 0,
    include_running_stats: bool = True,
    warm_start: bool = True,
    lap_backend: str = "lapjv",
    progress: Callable[[int, float], None] | None = None,
    validate: bool = True,
    distances: bool = True,
) -> MatchResult:
    """Find π maximising ``⟨θ_A, π(θ_B)⟩`` by coordinate descent over the groups.

    Args:
        spec: the permutation spec both parameter dicts follow.
        params_a, params_b: reference model A and model B to permute (same keys, shapes,
            dtypes; finite).
        init: starting permutation (identity by default).
        duals: per-group LAP duals from an earlier call (``MatchResult.duals``), for a
            warm start; ignored for groups they do not cover.
        max_iter: maximum number of sweeps over all groups.
        seed: fixes the random group order of each sweep.
        include_running_stats: count BatchNorm running means/variances in the objective.
        warm_start: keep and reuse LAP duals (STE-MM Alg. 3). Off: every LAP starts from
            its reduction duals.
        lap_backend: ``"lapjv"`` or ``"scipy"`` (see :func:`lmckit.lap.solve_lap`).
        progress: called as ``progress(sweep, objective)`` after each sweep.
        validate: check the inputs (spec fit, matching shapes, finite values).
        distances: compute ``distance_before``/``distance_after`` (NaN when off; each costs a
            pass over all parameters).

    Returns:
        :class:`MatchResult` with ``history`` the objective after each sweep (for specs
        without self-maps it never decreases), ``duals`` for reuse, and ``info`` holding
        ``gemm_seconds``, ``lap_seconds``, ``lap_solves``, ``skipped_solves`` (groups whose
        neighbours had not changed since their last solve, so their LAP could not improve)
        and ``gemm_flops``.

    For tensors in ``spec.self_maps`` (one group on two axes), each LAP holds the other
    axis at the current permutation (a linearisation); the objective may then wobble.
    """
    if validate:
        check_inputs(spec, params_a, params_b)
    matcher = WeightMatcher(
        spec, params_b, include_running_stats=include_running_stats, lap_backend=lap_backend
    )
    return matcher.match(
        params_a,
        init=init,
        duals=duals,
        max_iter=max_iter,
        seed=seed,
        warm_start=warm_start,
        progress=progress,
        validate=False,
        distances=distances,
    )


def _objective(
    spec: PermutationSpec,
    params_a: Params,
    params_b: Params,
    perm: Mapping[str, Tensor],
    names: set[str],
) -> float:
    """``Σ_{name ∈ names} ⟨A, π(B)⟩`` in float64."""
    total = 0.0
    for name in names:
        b = params_b[name]
        for axis, g in enumerate(spec.axes[name]):
            if g is not None:
                b = b.index_select(axis, perm[g])
        total += float((params_a[name].double() * b.double()).sum())
    return total
