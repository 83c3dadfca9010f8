"""Activation matching over every symmetry kind: Procrustes and least squares on the
activations of each group.

Where a group's map ``M`` acts, model B's activations move with it: at a *primal* site
(the output of a layer that writes into the group: queries, values, a norm's output, an
MLP's activation) ``z ↦ M z``; at a *dual* site (keys, for a query/key group) ``z ↦ M⁻ᵀ
z``. So each group's map can be fitted on ``E[z_A z_Bᵀ]`` and the second moments alone, in
closed form and independently of every other group — the analogue of activation matching
(Git Re-Basin §3.1), whose LAP is the permutation case:

* permutation: the LAP of the correlation (as :func:`activation_matching`);
* orthogonal: Procrustes, ``max_M Σ z_Aᵀ M z_B`` → ``M = U Vᵀ`` for ``C_AB = U S Vᵀ``;
  orthogonal-mean-free: the same on the mean-free subspace;
* invertible: least squares, ``min_M Σ ‖z_A − M z_B‖²`` → ``M = C_AB C_BB⁻¹`` (dual sites
  only: ``min Σ ‖z_B − Mᵀ z_A‖²`` → ``M = C_AA⁻¹ C_AB``); a group with both, a query/key
  group, is fitted on its primal (query) sites and its keys follow by ``M⁻ᵀ``;
* scaling: the LAP of the correlation, then per unit ``s = Σ a b / Σ b²`` (1 for a unit
  that never fires);
* head-structured groups: every pair of heads scored — Procrustes' nuclear norm, the
  variance least squares explains (``tr(C_AB C_BB⁻¹ C_BA)``), the LAP value — summed over
  a head tie's groups, the LAP over heads, then each head's map as above.

If B is ``U(A)`` for a transform ``U`` of the spec's kinds, every site of B is ``U``'s map
of A's exactly, and the fit recovers ``U⁻¹`` (up to the conditioning of the moments).

With ``init`` and ``refine``, B is first moved by ``init`` (weight matching's orthogonal
result, say) and only the ``refine`` groups are fitted, keeping their heads' and units'
order: the least-squares refinement of ``lmckit match --symmetries full``.

Which sites are primal and which dual is measured, not assumed: a random map of the
spec's invertible and scaling groups is applied to A, and each site's activations are
compared with ``M z`` and ``M⁻ᵀ z`` (a site that is neither is not used).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from itertools import islice

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor, nn

from lmckit.data import DataSource, as_batches
from lmckit.errors import ParamsError
from lmckit.functional import check_model_fits, module_mode
from lmckit.kinds import KINDS
from lmckit.match.activation import taps_for
from lmckit.match.network import batches_per_pass, require_model_and_data
from lmckit.match.orthogonal import (
    mean_free_procrustes,
    per_head_only,
    procrustes,
    rotary_procrustes,
)
from lmckit.match.result import MatchResult
from lmckit.options import Count, checked
from lmckit.params import Params, detached
from lmckit.perm import (
    Permutation,
    PermutationSpec,
    copies_gains_of_units,
    solve_copies,
    tie_outer,
)
from lmckit.progress import ProgressCallback, notify
from lmckit.tracing import GraphTaps
from lmckit.transform import Transform, head_blocks, head_matrix, random_group_map

__all__ = ["transform_activation_matching"]


class _Moments:
    """Streaming ``Σ z_A z_Bᵀ``, ``Σ z_A z_Aᵀ``, ``Σ z_B z_Bᵀ`` and the sums (float64)."""

    def __init__(self, n: int) -> None:
        z = dict(dtype=torch.float64)
        self.ab, self.aa, self.bb = (torch.zeros(n, n, **z) for _ in range(3))
        self.sa, self.sb = torch.zeros(n, **z), torch.zeros(n, **z)
        self.count = 0

    def add(self, a: Tensor, b: Tensor) -> None:
        a = a.movedim(1, -1).reshape(-1, a.shape[1]).double().cpu()
        b = b.movedim(1, -1).reshape(-1, b.shape[1]).double().cpu()
        self.ab += a.T @ b
        self.aa += a.T @ a
        self.bb += b.T @ b
        self.sa += a.sum(0)
        self.sb += b.sum(0)
        self.count += a.shape[0]

    def correlation(self, eps: float = 1e-12) -> Tensor:
        c = self.count
        mean_a, mean_b = self.sa / c, self.sb / c
        cov = self.ab / c - mean_a[:, None] * mean_b[None, :]
        std_a = (torch.diagonal(self.aa) / c - mean_a**2).clamp_min(0).sqrt()
        std_b = (torch.diagonal(self.bb) / c - mean_b**2).clamp_min(0).sqrt()
        return cov / (std_a[:, None] * std_b[None, :]).clamp_min(eps)


def _pinv(c: Tensor) -> Tensor:
    """The pseudo-inverse of a second moment (symmetric PSD): directions with eigenvalues
    below 1e-12 of the largest (units that never fire) are left out instead of blowing up."""
    values, vectors = torch.linalg.eigh(c)
    keep = values > 1e-12 * values.abs().max().clamp_min(1e-300)
    inverse = torch.where(keep, 1 / values.where(keep, torch.ones_like(values)), 0.0)
    return (vectors * inverse) @ vectors.T


def _least_squares(ab: Tensor, aa: Tensor, bb: Tensor, primal: bool) -> Tensor:
    """``argmin Σ ‖z_A − M z_B‖²`` (primal sites) or ``argmin Σ ‖z_B − Mᵀ z_A‖²`` (dual),
    minimum-norm where the moments are singular."""
    return ab @ _pinv(bb) if primal else _pinv(aa) @ ab


def _explained(ab: Tensor, aa: Tensor, bb: Tensor, primal: bool) -> float:
    """The second moment of A (primal) or B (dual) that least squares explains."""
    if primal:
        return float(((ab @ _pinv(bb)) * ab).sum())
    return float(((_pinv(aa) @ ab) * ab).sum())


def _lap(score: Tensor) -> Tensor:
    return torch.from_numpy(
        linear_sum_assignment(score.numpy(), maximize=True)[1].astype(np.int64)
    ).long()


def _scaling(perm: Tensor, ab: Tensor, bb: Tensor) -> Tensor:
    """The scaling matrix ``M[i, p[i]] = s_i`` with the least-squares scales."""
    n = perm.numel()
    rows = torch.arange(n)
    energy = torch.diagonal(bb)[perm]
    scales = ab[rows, perm] / energy.clamp_min(1e-300)
    # a unit that never fires in B (or never with A's) says nothing about its scale
    silent = (energy <= 1e-12 * energy.max().clamp_min(1e-300)) | (scales <= 0)
    scales = torch.where(silent, torch.ones_like(scales), scales)
    out = torch.zeros(n, n, dtype=torch.float64)
    out[rows, perm] = scales
    return out


class _GroupStats:
    """A group's moments summed over its primal sites (and over its dual sites)."""

    def __init__(self, n: int) -> None:
        self.primal, self.dual = _Moments(n), _Moments(n)
        self.has_primal = self.has_dual = False

    def pick(self) -> tuple[_Moments, bool]:
        return (self.primal, True) if self.has_primal else (self.dual, False)


def _fit_permutation(m: _Moments, primal: bool, n: int, refine: bool) -> Tensor:
    return torch.arange(n) if refine else _lap(m.correlation())


def _fit_scaling(m: _Moments, primal: bool, n: int, refine: bool) -> Tensor:
    return _scaling(_fit_permutation(m, primal, n, refine), m.ab, m.bb)


GROUP_FITS: dict[str, Callable[[_Moments, bool, int, bool], Tensor]] = {
    "permutation": _fit_permutation,
    "scaling": _fit_scaling,
    "invertible": lambda m, primal, n, refine: _least_squares(m.ab, m.aa, m.bb, primal),
    "orthogonal": lambda m, primal, n, refine: procrustes(m.ab),
    "orthogonal-mean-free": lambda m, primal, n, refine: mean_free_procrustes(m.ab),
    # rotary maps act inside heads only (a rotary group is head-structured: HEAD_FITS)
    "rotary": lambda m, primal, n, refine: per_head_only(m.ab),
    "rotary-scaled": lambda m, primal, n, refine: per_head_only(m.ab),
}
"""This matcher's closed-form fit of one group of each kind (:data:`lmckit.kinds.KINDS`)
from the moments of its activations: ``fit(moments, primal, n, refine)`` (``refine``: keep
the permutation part where it is)."""


def _solve_group(spec: PermutationSpec, g: str, stats: _GroupStats, refine: bool) -> Tensor:
    m, primal = stats.pick()
    return GROUP_FITS[spec.kind(g)](m, primal, spec.groups[g], refine)


def _block(c: Tensor, heads: int, i: int, j: int) -> Tensor:
    d = c.shape[0] // heads
    return c[i * d : (i + 1) * d, j * d : (j + 1) * d]


class _HeadPair:
    """The moments of query head ``i`` of A against head ``j`` of B (blocks, on demand)."""

    def __init__(
        self,
        m: _Moments,
        primal: bool,
        heads: int,
        i: int,
        j: int,
        layout: tuple[str, int] | None = None,
        pinned: bool = False,
    ) -> None:
        self.m, self.primal, self.heads, self.i, self.j = m, primal, heads, i, j
        self.layout, self.pinned = layout, pinned
        self.ab = _block(m.ab, heads, i, j)

    def aa_bb(self) -> tuple[Tensor, Tensor]:
        return _block(self.m.aa, self.heads, self.i, self.i), _block(
            self.m.bb, self.heads, self.j, self.j
        )

    def correlation(self) -> Tensor:
        return _block(self.m.correlation(), self.heads, self.i, self.j)


def _score_permutation(pair: _HeadPair) -> float:
    corr = pair.correlation()
    if pair.pinned:  # its heads move whole: each dimension stays where it is
        return float(corr.diagonal().sum())
    rows, cols = linear_sum_assignment(corr.numpy(), maximize=True)
    return float(corr.numpy()[rows, cols].sum())


def _rotary_fit(pair: _HeadPair) -> Tensor:
    assert pair.layout is not None
    return rotary_procrustes(pair.ab, pair.layout)


HEAD_SCORES: dict[str, Callable[[_HeadPair], float]] = {
    "permutation": _score_permutation,
    "orthogonal": lambda pair: float(torch.linalg.svdvals(pair.ab).sum()),
    "invertible": lambda pair: _explained(pair.ab, *pair.aa_bb(), pair.primal),
    # a scaled rotation is fitted as the rotation closest to the moments: an element of the
    # kind, with the scales at 1 (least squares over scaled rotations is not built)
    "rotary": lambda pair: float((_rotary_fit(pair) * pair.ab).sum()),
    "rotary-scaled": lambda pair: float((_rotary_fit(pair) * pair.ab).sum()),
}
"""How well head ``i`` of A matches head ``j`` of B, per kind of a head-structured group
(the kinds with ``per_head``), for the LAP over heads."""

HEAD_FITS: dict[str, Callable[[_HeadPair, bool], Tensor]] = {
    "permutation": lambda pair, refine: (
        torch.arange(pair.ab.shape[0]) if refine or pair.pinned else _lap(pair.correlation())
    ),
    "orthogonal": lambda pair, refine: procrustes(pair.ab),
    "invertible": lambda pair, refine: _least_squares(pair.ab, *pair.aa_bb(), pair.primal),
    "rotary": lambda pair, refine: _rotary_fit(pair),
    "rotary-scaled": lambda pair, refine: _rotary_fit(pair),
}
"""One head's block of a head-structured group, per kind, once the heads are paired."""


def _solve_tie(
    spec: PermutationSpec, groups: tuple[str, ...], stats: Mapping[str, _GroupStats], refine: bool
) -> dict[str, Tensor]:
    """A head tie's maps: head pairs scored per kind, summed, the LAP over heads (the
    identity when refining), then each head's block."""
    heads = spec.heads[groups[0]][1]
    if refine:
        outer = torch.arange(heads)
    else:
        totals = torch.zeros(heads, heads, dtype=torch.float64)
        for g in groups:
            m, primal = stats[g].pick()
            score = HEAD_SCORES[spec.kind(g)]
            layout, pinned = spec.rotary.get(g), g in spec.pinned
            for i in range(heads):
                for j in range(heads):
                    totals[i, j] += score(_HeadPair(m, primal, heads, i, j, layout, pinned))
        outer = _lap(totals)
    out: dict[str, Tensor] = {}
    for g in groups:
        m, primal = stats[g].pick()
        fit = HEAD_FITS[spec.kind(g)]
        d = spec.groups[g] // heads
        layout, pinned = spec.rotary.get(g), g in spec.pinned
        blocks = [
            fit(_HeadPair(m, primal, heads, i, int(outer[i]), layout, pinned), refine)
            for i in range(heads)
        ]
        if not KINDS[spec.kind(g)].matrix:
            out[g] = (outer[:, None] * d + torch.stack(blocks)).reshape(-1)
        else:
            out[g] = head_matrix(outer, blocks)
    return out


def _site_sides(
    spec: PermutationSpec, reader, params: Params, x: Tensor, seed: int
) -> dict[str, bool | None]:
    """Per site: True if it moves by ``M`` under a map of its group, False by ``M⁻ᵀ``, None
    if by neither (measured with a random map of the invertible and scaling groups)."""
    groups = [g for g in spec.groups if KINDS[spec.kind(g)].dual]
    sides: dict[str, bool | None] = {}
    site_group = {site: g for g, sites in reader.taps().items() for site in sites}
    if not groups:
        return {site: True for site in site_group}
    generator = torch.Generator().manual_seed(seed)
    maps = {g: random_group_map(spec, g, spec.kind(g), generator) for g in groups}
    probe = Transform.identity(spec).replace(**maps)
    before = reader(params, x)
    after = reader(probe.apply(params), x)
    for site, g in site_group.items():
        if g not in maps:
            sides[site] = True
            continue
        low_precision = before[site].dtype != torch.float64
        z, moved = _units_last(before[site]), _units_last(after[site])
        scale = z.abs().max().clamp_min(1e-300)
        errors = []
        for matrix in (probe.matrix(g), probe.dual(g).to(torch.float64)):
            predicted = z @ matrix.T.to(z.dtype)
            errors.append(float((predicted - moved).abs().max() / scale))
        tol = 1e-3 if low_precision else 1e-8
        sides[site] = True if errors[0] < tol else False if errors[1] < tol else None
    return sides


def _worst_condition(spec: PermutationSpec, group: str, m: Tensor) -> float:
    """The largest condition number of ``group``'s fitted map (per head block for heads):
    how much its inverse, which moves the readers, amplifies their weights."""
    if group not in spec.heads:
        return float(torch.linalg.cond(m))
    parts = head_blocks(m, spec.heads[group][1])
    assert parts is not None  # maps of head groups are block-permutation (Transform checks)
    return max(float(torch.linalg.cond(block)) for block in parts[1])


def _units_last(t: Tensor) -> Tensor:
    return t.movedim(1, -1).reshape(-1, t.shape[1]).double().cpu()


@checked
def transform_activation_matching(
    spec: PermutationSpec,
    params_a: Params,
    params_b: Params,
    *,
    model: nn.Module | None = None,
    data: DataSource | None = None,
    init: Transform | Permutation | None = None,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    refine: Collection[str] | None = None,
    n_batches: Count | None = None,
    taps: GraphTaps | None = None,
    batch_size: Count = 1000,
) -> MatchResult:
    """Fit each group's map of ``spec``'s kind on activations (module docstring).

    Args:
        spec: a spec with kinds and duals (:func:`lmckit.tracing.symmetry_kinds`).
        params_a, params_b: models A and B, norm gains folded
            (:func:`lmckit.transform.fold_norms`) for groups of an orthogonal kind.
        model: a module both fit, traced for its activation sites (it must trace to
            ``spec``'s groups); run in eval mode.
        data: an lmckit ``Dataset`` (training split, in order) or ``(x, y)`` batches.
        init: a transform B is moved by first (identity by default); the result is the
            fitted map composed with it.
        seed: seeds the probe that sorts the sites into primal and dual.
        progress: a :class:`~lmckit.progress.Progress` after every batch.
        refine: fit only these groups, keeping their heads' and units' order (each other
            group keeps ``init``'s map). All groups by default.
        n_batches: use only the first ``n_batches`` batches.
        taps: a :class:`~lmckit.tracing.GraphTaps` to read the sites with (traced by default).
        batch_size: for a ``Dataset``.

    Returns:
        :class:`MatchResult` whose ``alignment`` is a :class:`~lmckit.transform.Transform`,
        ``iterations`` the batches used, ``info["examples"]`` the examples and
        ``info["unused_sites"]`` the sites that moved by neither ``M`` nor ``M⁻ᵀ``,
        ``info["conditions"]`` each fitted invertible group's largest condition number
        (per head block): least squares fits the writers' activations and lets the
        readers' weights grow by up to this factor. The copies groups (query heads inside
        their key/value group) are chosen after the maps, on a second pass over the data
        with B moved by them; ``info["copies_in_place"]`` names those left in place (no
        activation laid out as their weights, or data that can be read only once).

    Raises:
        ParamsError: no model or data, no batches, a refine group not in the spec, or a
            group whose sites all went unused.
    """
    start = time.perf_counter()
    if n_batches is not None and (isinstance(n_batches, bool) or n_batches < 1):
        raise ParamsError(f"n_batches must be ≥ 1 or None, got {n_batches!r}")
    model = require_model_and_data("transform_activation_matching", model, data)
    if isinstance(init, Permutation):
        init = Transform.from_permutation(init)
    if init is not None and (not isinstance(init, Transform) or init.spec.groups != spec.groups):
        raise ParamsError("init must be a Transform (or Permutation) of the spec's groups")
    init = Transform(spec, dict(init.items())) if init is not None else Transform.identity(spec)
    fitted = set(spec.groups) - set(spec.copies) if refine is None else set(refine)
    unknown = sorted(fitted - set(spec.groups))
    if unknown:
        raise ParamsError(f"refine names groups {unknown[:4]} that the spec does not have")
    spec.validate(params_a, what="params_a")
    spec.validate(params_b, what="params_b")
    check_model_fits(model, params_a, "params_a")
    params_a = detached(params_a)
    moved_b = init.apply(detached(params_b))
    batches = as_batches(data, batch_size=batch_size, shuffle=False, seed=seed)
    total = n_batches if n_batches is not None else batches_per_pass(batches)
    device = next(iter(params_a.values())).device
    reader, sides = None, {}
    stats = {g: _GroupStats(n) for g, n in spec.groups.items()}
    used = examples = 0
    with module_mode(model, False), torch.no_grad():
        for x, _ in islice(batches, n_batches):
            x = x.to(device)
            if reader is None:
                reader = taps if taps is not None else taps_for(model, spec, None, x)
                sides = _site_sides(spec, reader, params_a, x, seed)
                site_group = {s: g for g, sites in reader.taps().items() for s in sites}
            acts_a, acts_b = reader(params_a, x), reader(moved_b, x)
            for site, g in site_group.items():
                side = sides.get(site)
                if side is None or g not in fitted:
                    continue
                a, b = acts_a[site], acts_b[site]
                if a.shape[1] != spec.groups[g]:
                    raise ParamsError(
                        f"site {site} of group {g!r} has {a.shape[1]} units, the group "
                        f"{spec.groups[g]}"
                    )
                target = stats[g].primal if side else stats[g].dual
                target.add(a, b)
                stats[g].has_primal |= side
                stats[g].has_dual |= not side
            used += 1
            examples += len(x)
            notify(progress, used, total)
    if used == 0:
        raise ParamsError("transform_activation_matching got no batches")
    empty = [g for g in fitted if not (stats[g].has_primal or stats[g].has_dual)]
    if empty:
        raise ParamsError(f"groups {sorted(empty)[:4]} have no usable activation site")
    maps: dict[str, Tensor] = {}
    for unit in spec.update_units():
        todo = tuple(g for g in unit if g in fitted)
        if not todo:
            continue
        if unit[0] in spec.heads:
            if len(todo) != len(unit) and refine is None:
                raise ParamsError(f"a head tie's groups {unit} must be fitted together")
            maps.update(_solve_tie(spec, todo, stats, refine is not None))
        else:
            maps[todo[0]] = _solve_group(spec, todo[0], stats[todo[0]], refine is not None)
    identity = Transform.identity(spec)
    step = identity.replace(**maps)
    conditions = {
        g: _worst_condition(spec, g, m) for g, m in maps.items() if KINDS[spec.kind(g)].conditioned
    }
    transform = step.compose(init)
    copies_taps = reader.copies_taps() if isinstance(reader, GraphTaps) else {}
    unmatched = sorted(set(spec.copies) - set(copies_taps)) if refine is None else []
    if refine is None and copies_taps:
        fitted = _fit_copies(
            spec, transform, copies_taps, reader, params_a, params_b, batches, n_batches, device
        )
        if fitted is None:  # data that cannot be read twice (a generator)
            unmatched = sorted(spec.copies)
        else:
            transform = fitted
    return MatchResult(
        alignment=transform,
        method="am-transform" if refine is None else "ls-refine",
        history=(),
        iterations=used,
        seconds=time.perf_counter() - start,
        distance_before=identity.distance(params_a, params_b),
        distance_after=transform.distance(params_a, params_b),
        info={
            "examples": examples,
            "unused_sites": sorted(s for s, side in sides.items() if side is None),
            "conditions": conditions,
            "copies_in_place": unmatched,
        },
    )


def _fit_copies(
    spec: PermutationSpec,
    transform: Transform,
    copies_taps: Mapping[str, list[tuple[str, str, int]]],
    reader: GraphTaps,
    params_a: Params,
    params_b: Params,
    batches,
    n_batches: int | None,
    device: torch.device,
) -> Transform | None:
    """``transform`` with its copies groups (the query heads inside their key/value group)
    chosen on a second pass over the data: B moved by ``transform`` (its copies in place),
    the cross-moments of A's and B's activations laid out as the copies' weight axes, one
    assignment of copies per key/value head (:func:`~lmckit.perm.copies_gains_of_units`,
    re-indexed by B's heads). A head's maps act alike on every copy of it, so moving B's
    copies after fitting them is the objective's exact coordinate step. None where the
    second pass reads no batch (data that can be iterated once)."""
    in_place = {c: torch.arange(spec.groups[c]) for c in spec.copies}
    fitted = transform.replace(**in_place)
    moved_b = fitted.apply(detached(params_b))
    sites = {site for found in copies_taps.values() for site, _, _ in found}
    moments: dict[str, _Moments] = {}
    with torch.no_grad():
        for x, _ in islice(batches, n_batches):
            x = x.to(device)
            acts_a, acts_b = reader(params_a, x), reader(moved_b, x)
            for site in sites:
                if site not in moments:
                    moments[site] = _Moments(acts_a[site].shape[1])
                moments[site].add(acts_a[site], acts_b[site])
    if not moments:
        return None
    identity = Permutation.identity(spec)
    chosen = {}
    for c, found in copies_taps.items():
        aligned = sum(
            copies_gains_of_units(spec, c, weight, axis, moments[site].ab, identity)
            for site, weight, axis in found
        )
        gains = torch.empty_like(aligned)  # indexed by B's heads, as the copies vector is
        gains[tie_outer(spec, spec.copies[c], fitted).cpu()] = aligned
        chosen[c] = solve_copies(gains)
    return transform.replace(**chosen)
