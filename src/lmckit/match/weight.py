"""Weight matching (Git Re-Basin §3.2, Alg. 1): align B to A by its weights alone.

Maximise ``⟨θ_A, π(θ_B)⟩`` — equivalently minimise ``‖θ_A − π(θ_B)‖²`` — over the
permutation groups of a spec. The problem is NP-hard; Alg. 1 is coordinate descent: visit
the groups in a random order and, with every other group held at its current permutation,
solve the linear assignment problem (LAP) on the group's cost matrix
``C_g = Σ_{(tensor, axis) ∈ g} A_(n,-1) B̃_(n,-1)ᵀ`` (:func:`~lmckit.perm.group_cost_matrix`).
Repeat until a sweep changes nothing.

:func:`weight_matching_reference` is that algorithm as written, on one screen.
:func:`weight_matching` computes the same permutations with
:class:`~lmckit.match.weight_matcher.WeightMatcher`, which forms fewer products and keeps
LAP duals between solves (STE-MM Alg. 3); tests hold the two to identical answers.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Literal

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import nn

from lmckit._checks import check_int
from lmckit.errors import ParamsError
from lmckit.lap import LapDuals, assign, assign_heads
from lmckit.match.result import MatchResult, check_duals, check_inputs, matched_names
from lmckit.match.weight_matcher import (
    DeltaPolicy,
    MemoryNeed,
    WeightMatcher,
    acceptance_tolerance,
    copies_step,
    held_groups,
    improves_all,
)
from lmckit.options import Count, checked
from lmckit.params import Params, detached
from lmckit.perm import (
    Permutation,
    PermutationSpec,
    axis_groups,
    coarsen_shared,
    group_cost_matrix,
    lift_shared,
    permute_tensor,
    shared_inside_heads,
)
from lmckit.progress import ProgressCallback, notify


@checked
def weight_matching_reference(
    spec: PermutationSpec,
    params_a: Params,
    params_b: Params,
    *,
    init: Permutation | None = None,
    seed: int = 0,
    max_iter: int = 100,
    include_running_stats: bool = True,
    hold: Sequence[str] = (),
) -> Permutation:
    """Git Re-Basin Alg. 1 as written — the statement of what :func:`weight_matching`
    computes. Every sweep forms every group's cost matrix afresh and solves it with SciPy;
    slow, and meant for tests and for reading. Arguments as in :func:`weight_matching`."""
    check_inputs(spec, params_a, params_b, init, seed)
    params_a, params_b = detached(params_a), detached(params_b)
    names = set(matched_names(params_a, include_running_stats))
    active = {g for g in spec.groups if any(k in names for k, _ in spec.group_axes(g))}
    held = held_groups(spec, hold)
    units = [kept for u in spec.update_units() if (kept := tuple(g for g in u if g in active))]
    perm = init or Permutation.identity(spec)
    rel_tol = acceptance_tolerance(params_a[next(iter(names))].dtype) if names else 0.0
    generator = torch.Generator().manual_seed(seed)
    for _ in range(max_iter):
        improved = False
        for idx in torch.randperm(len(units), generator=generator).tolist():
            if held.issuperset(units[idx]):
                continue
            gains = {
                g: group_cost_matrix(spec, params_a, params_b, perm, g, names=names)
                .detach()
                .to("cpu", torch.float64)
                .numpy()
                for g in units[idx]
            }
            if len(gains) == 1 and units[idx][0] not in spec.heads:
                g = units[idx][0]
                new = {g: linear_sum_assignment(gains[g], maximize=True)[1].astype(np.int64)}
            else:  # groups tied by a head permutation: the two-level assignment
                chosen = assign_heads(gains, spec.heads[units[idx][0]][1], spec.pinned)
                new = {g: p.numpy() for g, p in chosen.items()}
            old = {g: perm[g].numpy() for g in gains}
            if improves_all(gains, old, new, rel_tol):
                perm = perm.replace(**{g: torch.from_numpy(p) for g, p in new.items()})
                improved = True
        for c in spec.copies:  # query heads inside their key/value group, after each sweep
            if c not in held and any(k in names for k, _ in spec.copies_axes(c)):
                found = copies_step(spec, params_a, params_b, dict(perm.items()), c, names, rel_tol)
                if found is not None:
                    perm = perm.replace(**{c: found})
                    improved = True
        if not improved:
            return perm
    return perm


@checked
def weight_matching(
    spec: PermutationSpec,
    params_a: Params,
    params_b: Params,
    *,
    model: nn.Module | None = None,
    data: object = None,
    init: Permutation | None = None,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    duals: Mapping[str, LapDuals] | None = None,
    max_iter: Count = 100,
    restarts: Count = 1,
    include_running_stats: bool = True,
    warm_start: bool = True,
    lap_backend: Literal["jv", "lapjv", "scipy"] = "jv",
    max_memory: Count | None = None,
    hold: Sequence[str] = (),
) -> MatchResult:
    """Find π maximising ``⟨θ_A, π(θ_B)⟩`` by coordinate descent over the groups.

    Args:
        spec: the permutation spec both parameter dicts follow.
        params_a, params_b: reference model A and model B to permute (same keys, shapes,
            dtypes; finite).
        model: accepted for the matchers' common signature (weight matching does not run
            the model).
        data: must be ``None``: weight matching reads no data, and data given to it would
            be a mistake the caller should hear of.
        init: starting permutation (identity by default).
        seed: fixes the random group order of each sweep (and the restarts' starts).
        progress: receives a :class:`~lmckit.progress.Progress` after every sweep
            (``metrics["objective"]``; ``metrics["restart"]`` with ``restarts > 1``).
        duals: per-group LAP duals from an earlier call (``MatchResult.duals``), for a
            warm start; ignored for groups whose size differs.
        max_iter: maximum number of sweeps over all groups.
        restarts: run coordinate descent this many times — first from ``init`` with ``seed``,
            then from seeded random permutations with other group orders — and keep the
            best objective. Coordinate descent stops in local optima; narrow networks hit
            bad ones often.
        include_running_stats: count BatchNorm running means/variances in the objective
            (Git Re-Basin's Alg. 1 matches the weights alone: ``False``). Measured side by
            side (``experiments/rebasin-wm-running-stats-fmnist.toml``, Fashion-MNIST, three
            pairs, BN statistics re-estimated along the path): test loss barrier 0.006 over
            the weights vs 0.008 with the statistics for 3×512 MLPs with BatchNorm, 1.097 vs
            1.039 for VGG-11 ¼ — neither better everywhere.
        warm_start: keep and reuse LAP duals (STE-MM Alg. 3). Off: every LAP starts from
            its reduction duals. Both reach the same permutations.
        lap_backend: ``"jv"`` (default), ``"lapjv"`` or ``"scipy"`` (see
            :func:`lmckit.lap.solve_lap`).
        max_memory: bytes the match may hold (:class:`MemoryNeed`: the two models, the
            groups' cost matrices kept between sweeps, one step's working set). Where the
            kept matrices do not fit, every matrix is formed anew in each solve (the same
            permutations, more products); where not even that fits, the match is refused
            before any work. ``None``: no limit.
        hold: groups to leave where ``init`` has them (the identity by default) — group
            names or shell-style patterns (``"*.attn.*"``), for matching over part of the
            spec, e.g. over the groups a spec had before heads could move. A pattern that
            names no group is refused, and so is a hold that splits groups tied by a head
            permutation. The restarts' random starts keep the held groups at ``init`` too.

    Returns:
        :class:`MatchResult` of the best restart: ``history`` is its objective after each
        sweep (never decreasing for specs without self-maps), ``duals`` its LAP duals for
        reuse, ``info`` holds ``lap_solves``, ``skipped_solves`` (groups whose neighbours
        had not changed since their last solve, so their LAP could not improve),
        ``formed_ahead`` (solves whose cost matrices were formed while the previous
        LAP ran) and, with restarts, ``restart_objectives`` and ``best_restart``.

    For tensors in ``spec.self_maps`` (one group on two axes), each LAP holds the other
    axis at the current permutation (a linearisation); the objective may then wobble.

    Where coordinate descent stops, a group of a few units whose coupled groups act only
    on its tensors (a mixture's experts and the hidden units they share) is tried one swap
    at a time with those groups solved anew (:func:`swap_small_groups`); an improving swap
    starts the descent again, up to :data:`MAX_SWAP_ROUNDS` times. On small random
    Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE configurations, descent alone stopped at about
    0.6 of a planted distance on one or two seeds of five; with the swaps, none did.

    Where each expert permutes its hidden units apart (``spec.head_axes``), every start
    is first refined in the subgroup that shares one permutation inside all experts
    (:func:`~lmckit.perm.shared_inside_heads`, where the swaps above reach the experts)
    and the descent over the whole group starts from that optimum — unless that group's
    cost matrix would exceed :data:`JOINT_COST_BYTES`: then the match stays in the
    subgroup (``info["shared_inside_heads"]``).
    """
    start = time.perf_counter()
    if data is not None:
        raise ParamsError(
            "weight_matching matches the weights alone and takes no data= (activation_matching "
            "and ste_matching use data)"
        )
    check_inputs(spec, params_a, params_b, init, seed)
    check_int("restarts", restarts)
    check_int("max_iter", max_iter)
    check_duals(duals)
    held = held_groups(spec, hold)
    shared = shared_inside_heads(spec)
    too_large = _joint_too_large(spec, params_a) if shared is not None else []
    if shared is not None and too_large:
        coarse = None if init is None else coarsen_shared(spec, shared, init)
        if init is not None and coarse is None:
            raise ParamsError(
                f"init moves the units of {too_large} apart inside their heads, but their "
                f"cost matrices exceed {JOINT_COST_BYTES} bytes, so weight matching matches "
                "them in the subgroup sharing one permutation inside the heads: pass an "
                "init in that subgroup"
            )
        found = weight_matching(
            shared, params_a, params_b, init=coarse, seed=seed, progress=progress,
            duals=duals, max_iter=max_iter, restarts=restarts,
            include_running_stats=include_running_stats, warm_start=warm_start,
            lap_backend=lap_backend, max_memory=max_memory,
            hold=sorted(held & set(shared.groups)),
        )  # fmt: skip
        alignment = lift_shared(spec, shared, found.alignment)
        return replace(
            found,
            alignment=alignment,
            seconds=time.perf_counter() - start,
            info={**found.info, "shared_inside_heads": too_large},
        )
    names = set(matched_names(params_a, include_running_stats))
    delta = _delta_within(MemoryNeed.of(spec, params_a, params_b), max_memory)
    matcher = WeightMatcher(
        spec,
        params_b,
        include_running_stats=include_running_stats,
        lap_backend=lap_backend,
        delta=delta,
    )
    results: list[MatchResult] = []
    sweeps_done = 0
    for restart in range(restarts):
        restart_seed = seed if restart == 0 else _restart_seed(seed, restart)
        start_perm = init if restart == 0 else Permutation.random(spec, restart_seed)
        if held and restart > 0:
            kept = init or Permutation.identity(spec)
            start_perm = start_perm.replace(**{g: kept[g] for g in held})
        if shared is not None:
            start_perm = _from_shared(
                spec, shared, params_a, params_b, start_perm, restart, restart_seed, held,
                dict(max_iter=max_iter, include_running_stats=include_running_stats,
                     warm_start=warm_start, lap_backend=lap_backend, max_memory=max_memory),
            )  # fmt: skip

        # descend; where descent stops, a swap in a small group may lead on (then again)
        start_from, start_duals = start_perm, duals
        for swap_round in range(MAX_SWAP_ROUNDS + 1):

            def report(event, restart=restart, offset=sweeps_done):
                extra = {"restart": restart} if restarts > 1 else {}
                notify(progress, offset + event.step, None, **extra, **event.metrics)

            result = matcher.match(
                params_a,
                init=start_from,
                duals=start_duals,
                max_iter=max_iter,
                seed=restart_seed,
                warm_start=warm_start,
                progress=report if progress is not None else None,
                validate=False,
                distances=False,
                hold=held,
            )
            sweeps_done += result.iterations
            if swap_round == MAX_SWAP_ROUNDS:
                break
            swapped = swap_small_groups(
                spec, params_a, params_b, result.alignment, names=names, hold=held
            )
            if swapped is None:
                break
            start_from, start_duals = swapped, result.duals
        results.append(result)
    objectives = [r.history[-1] for r in results]
    best_index = max(range(restarts), key=lambda i: (objectives[i], -i))
    best = results[best_index]
    info = dict(best.info)
    if restarts > 1:
        info.update(restart_objectives=objectives, best_restart=best_index)
    return MatchResult(
        alignment=best.alignment,
        method=best.method,
        history=best.history,
        iterations=best.iterations,
        seconds=time.perf_counter() - start,
        # one tensor permuted at a time: a permuted copy of B would be a third model
        distance_before=Permutation.identity(spec).distance(params_a, params_b),
        distance_after=best.alignment.distance(params_a, params_b),
        duals=best.duals,
        info=info,
    )


JOINT_COST_BYTES = 2**31
"""The largest cost matrix of a group whose heads lie on another axis (a mixture's hidden
units, ``(E·I)²`` entries: each expert's own permutation) that :func:`weight_matching`
forms. Beyond it — a full-size Mixtral's 8 × 14,336 hidden units would take 52 GB in
float32, against 0.8 GB for one permutation shared by the experts — it matches in the
subgroup sharing one permutation inside the heads and lifts the result
(``info["shared_inside_heads"]`` names the groups)."""


def _joint_too_large(spec: PermutationSpec, params: Params) -> list[str]:
    """The groups inside heads on another axis whose cost matrix exceeds
    :data:`JOINT_COST_BYTES` in the parameters' dtype."""
    itemsize = next((t.element_size() for t in params.values() if t.dtype.is_floating_point), 4)
    return sorted(
        {
            g
            for name, (_, b) in spec.head_axes.items()
            for g in axis_groups(spec.axes[name][b])
            if spec.groups[g] ** 2 * itemsize > JOINT_COST_BYTES
        }
    )


def _from_shared(
    spec: PermutationSpec,
    shared: PermutationSpec,
    params_a: Params,
    params_b: Params,
    start: Permutation | None,
    restart: int,
    seed: int,
    held: frozenset[str],
    options: dict,
) -> Permutation | None:
    """The start of a descent over a spec with groups inside heads on another axis (a
    mixture's hidden units, one permutation per expert): the optimum of the subgroup that
    shares one permutation inside all heads (:func:`~lmckit.perm.shared_inside_heads`),
    found from ``start`` (the first start, or any start with held groups) or a random
    element of the subgroup (a restart), lifted to ``spec``. The full group fits each
    expert's units to noise as readily as to signal while the stream is still wrong: from
    the identity, a top-1-of-8 Mixtral's planted permutation was recovered on 6 of 12
    seeds, and on all 12 from the subgroup's optimum. A start outside the subgroup
    (experts' units moved apart) is kept."""
    if restart > 0 and not held:
        coarse = Permutation.random(shared, seed)
    elif start is None:
        coarse = Permutation.identity(shared)
    else:
        coarse = coarsen_shared(spec, shared, start)
        if coarse is None:
            return start
    found = weight_matching(
        shared, params_a, params_b, init=coarse, seed=seed, hold=sorted(held & set(shared.groups)),
        **options,
    ).alignment  # fmt: skip
    return lift_shared(spec, shared, found)


SMALL_GROUP = 8
"""Groups of at most this many units are tried by :func:`swap_small_groups`."""
MAX_SWAP_ROUNDS = 8
SWAP_FLOPS = 1e11
"""The most multiply-adds :func:`swap_small_groups` spends on one group's swaps (its coupled
groups' cost matrices, formed anew for each swap): about a minute on one CPU core. A
mixture of experts with wide hidden layers (Mixtral's 14,336) exceeds it by far and is
left to restarts."""


def swap_small_groups(
    spec: PermutationSpec,
    params_a: Params,
    params_b: Params,
    perm: Permutation,
    *,
    names: set[str] | None = None,
    hold: frozenset[str] | set[str] = frozenset(),
) -> Permutation | None:
    """A better permutation than ``perm`` one swap away in a small group, or None.

    Coordinate descent solves each group with the others fixed, which is exact for a group
    alone but stops where two groups are coupled: a mixture's experts (a few units) and
    the hidden units every expert shares (their tensors carry the experts too) — with the
    experts wrong, the hidden units match the wrong experts, and with those, no expert
    move alone gains. Here each transposition of a group of at most :data:`SMALL_GROUP`
    units is tried with the groups it couples (those acting only on tensors that carry it)
    solved anew (one assignment each), and the best that raises ``⟨θ_A, π(θ_B)⟩`` over the
    tensors they touch is returned; the caller descends again from it. Head-structured,
    copies and held groups are left alone (they have solvers of their own), and so is a
    group whose swaps would cost more than :data:`SWAP_FLOPS`.
    """
    names = set(params_a) if names is None else names
    skip = set(spec.heads) | set(spec.copies) | set(hold)
    carried = {g: {k for k, _ in spec.group_axes(g) if k in names} for g in spec.groups}
    best: tuple[float, Permutation] | None = None
    for g, n in spec.groups.items():
        if g in skip or not 2 <= n <= SMALL_GROUP or not carried[g]:
            continue
        coupled = [
            h
            for h in spec.groups
            if h != g and h not in skip and carried[h] and carried[h] <= carried[g]
        ]
        if not coupled:
            continue
        touched = carried[g].union(*(carried[h] for h in coupled))
        per_swap = sum(
            spec.groups[h] * sum(params_b[k].numel() for k in carried[h]) for h in coupled
        )
        if n * (n - 1) / 2 * per_swap > SWAP_FLOPS:
            continue

        def objective(p: Permutation, touched=touched) -> float:
            return sum(
                float((params_a[k].double() * permute_tensor(params_b[k], spec, k, p)).sum())
                for k in touched
            )

        now = objective(perm)
        for i in range(n):
            for j in range(i + 1, n):
                index = perm[g].clone()
                index[[i, j]] = index[[j, i]]
                candidate = perm.replace(**{g: index})
                for h in coupled:
                    gains = group_cost_matrix(spec, params_a, params_b, candidate, h, names=names)
                    candidate = candidate.replace(**{h: assign(gains).to(perm[h].device)})
                gain = objective(candidate) - now
                if gain > 1e-9 * max(abs(now), 1.0) and (best is None or gain > best[0]):
                    best = (gain, candidate)
    return None if best is None else best[1]


def _delta_within(need: MemoryNeed, max_memory: int | None) -> DeltaPolicy | None:
    """The engine's cost-matrix policy within ``max_memory`` bytes: kept and updated
    matrices where they fit, formed anew where only that fits; else refused."""
    if max_memory is None or need.total <= max_memory:
        return DeltaPolicy()
    if need.without_kept_costs <= max_memory:
        return None
    from lmckit.budget import ResourceError, human_bytes

    raise ResourceError(
        f"weight matching needs at least {human_bytes(need.without_kept_costs)} "
        f"(the two models {human_bytes(need.models)}, one step's cost matrix and LAP "
        f"{human_bytes(need.working)}; {human_bytes(need.total)} with the "
        f"cost matrices kept between sweeps), more than the {human_bytes(max_memory)} "
        "allowed by max_memory"
    )


def _restart_seed(seed: int, restart: int) -> int:
    """A seed for restart ``restart`` that does not collide with other base seeds."""
    state = np.random.SeedSequence([int(seed), int(restart)]).generate_state(1, np.uint32)
    return int(state[0])
