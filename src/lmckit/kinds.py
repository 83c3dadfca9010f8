"""The symmetry kinds, as one table: what a group's maps may be, and everything the rest of
lmckit needs to know about each kind — read by the spec's validation (:mod:`lmckit.perm`),
the transforms (:mod:`lmckit.transform`), the tracer's kind checks and every matcher. Nothing
else compares kind names; adding a kind is a row here (its maps drawn, checked, inverted,
narrowed, learned), the tracer's rule that finds it and its test
(`docs/development.md` says how).

A kind's maps act on a group of ``n`` units: for ``"permutation"`` an index vector, for the
others an ``n × n`` matrix ``M`` (per head, after a head permutation, on a head-structured
group). Writers of the group move by ``M``; its readers by ``M`` too when ``M`` is
orthogonal, and by ``M⁻ᵀ`` (the spec's ``duals`` name them) when it is not.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from lmckit.errors import PermutationError

__all__ = [
    "KINDS",
    "ROTARY_STYLES",
    "GroupFacts",
    "Kind",
    "haar_orthogonal",
    "mean_free_basis",
    "rotary_pairs",
    "tried_kinds",
]


def haar_orthogonal(
    n: int, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float64
) -> Tensor:
    """A Haar-random ``n × n`` orthogonal matrix (QR of a Gaussian matrix, signs fixed so
    that the distribution is uniform — Mezzadri 2007)."""
    gaussian = torch.randn(n, n, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(gaussian)
    signs = torch.sign(torch.diagonal(r))
    signs[signs == 0] = 1
    return (q * signs).to(dtype)


def mean_free_basis(n: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """An orthonormal basis of ``R^n`` (columns) whose first vector is ``1/√n``: the
    others span the mean-free subspace. A Householder reflection of ``e_1`` onto ``1/√n``,
    so it is exact and deterministic."""
    ones = torch.full((n,), 1 / math.sqrt(n), dtype=torch.float64)
    v = ones.clone()
    v[0] -= 1
    norm = v.norm()
    if norm.item() == 0:
        return torch.eye(n, dtype=dtype)
    v = v / norm
    return (torch.eye(n, dtype=torch.float64) - 2 * torch.outer(v, v)).to(dtype)


ROTARY_STYLES = ("half", "interleaved")
"""How rotary embeddings pair a head's dimensions (see ``PermutationSpec.rotary``)."""


def rotary_pairs(style: str, rotated: int) -> list[tuple[int, int]]:
    """The dimension pairs a rotary embedding rotates together: ``(j, j + rotated/2)`` for
    ``"half"``, ``(2j, 2j + 1)`` for ``"interleaved"``, ``j < rotated/2``."""
    half = rotated // 2
    if style == "half":
        return [(j, j + half) for j in range(half)]
    return [(2 * j, 2 * j + 1) for j in range(half)]


def _tolerance(dtype: torch.dtype, n: int) -> float:
    return (1e-9 if dtype == torch.float64 else 1e-4) * max(1.0, math.sqrt(n))


# an invertible map this ill-conditioned loses every digit a float32 model has
MAX_CONDITION = 1e8


# -- drawing: a random element of each kind ------------------------------------------------
def _random_orthogonal(n: int, generator, dtype) -> Tensor:
    return haar_orthogonal(n, generator, dtype)


def _random_mean_free(n: int, generator, dtype) -> Tensor:
    basis = mean_free_basis(n, dtype)
    rotation = torch.eye(n, dtype=dtype)
    if n > 1:
        rotation[1:, 1:] = haar_orthogonal(n - 1, generator, dtype)
    return basis @ rotation @ basis.T


def _random_invertible(n: int, generator, dtype) -> Tensor:
    s = torch.exp(torch.rand(n, generator=generator, dtype=torch.float64) - 0.5)
    left, right = haar_orthogonal(n, generator), haar_orthogonal(n, generator)
    return ((left * s) @ right).to(dtype)


def _random_scaling(n: int, generator, dtype) -> Tensor:
    order = torch.randperm(n, generator=generator)
    scales = torch.exp(2 * torch.rand(n, generator=generator, dtype=torch.float64) - 1)
    out = torch.zeros(n, n, dtype=torch.float64)
    out[torch.arange(n), order] = scales
    return out.to(dtype)


def _layout_of(n: int, layout: tuple[str, int] | None) -> tuple[str, int]:
    """A rotary layout, or (a row's self-test on a bare block) every pair rotate-half."""
    return layout if layout is not None else ("half", n - n % 2)


def _rotary_parts(
    n: int, layout: tuple[str, int] | None
) -> tuple[list[tuple[int, int]], list[int]]:
    """The rotated pairs of an ``n``-dimensional head and the dimensions left unrotated."""
    pairs = rotary_pairs(*_layout_of(n, layout))
    paired = {d for pair in pairs for d in pair}
    return pairs, [d for d in range(n) if d not in paired]


def _random_rotary_block(n, generator, dtype, layout, scaled: bool) -> Tensor:
    pairs, free = _rotary_parts(n, layout)
    m = torch.zeros(n, n, dtype=torch.float64)
    for a, b in pairs:
        angle = 2 * math.pi * float(torch.rand(1, generator=generator, dtype=torch.float64))
        scale = math.exp(float(torch.rand(1, generator=generator, dtype=torch.float64)) - 0.5)
        c, s = math.cos(angle), math.sin(angle)
        if scaled:
            c, s = scale * c, scale * s
        m[a, a], m[a, b], m[b, a], m[b, b] = c, -s, s, c
    if free:
        index = torch.tensor(free)
        block = _random_invertible if scaled else _random_orthogonal
        m[index[:, None], index] = block(len(free), generator, torch.float64)
    return m.to(dtype)


def _random_rotary(n, generator, dtype, layout=None) -> Tensor:
    return _random_rotary_block(n, generator, dtype, layout, scaled=False)


def _random_rotary_scaled(n, generator, dtype, layout=None) -> Tensor:
    return _random_rotary_block(n, generator, dtype, layout, scaled=True)


# -- checking: is a float64 matrix a map of the kind? --------------------------------------
def _check_orthogonal(g: str, kind: str, m64: Tensor, dtype: torch.dtype) -> None:
    n = m64.shape[0]
    error = (m64 @ m64.T - torch.eye(n, dtype=torch.float64)).abs().max().item()
    if error > _tolerance(dtype, n):
        raise PermutationError(
            f"group {g!r} is {kind}: its matrix is not orthogonal (|M Mᵀ − I| = {error:.2e})"
        )


def _check_mean_free(g: str, kind: str, m64: Tensor, dtype: torch.dtype) -> None:
    _check_orthogonal(g, kind, m64, dtype)
    drift = (m64.sum(1) - 1).abs().max().item()
    if drift > _tolerance(dtype, m64.shape[0]):
        raise PermutationError(
            f"group {g!r} is orthogonal-mean-free (a LayerNorm's stream): its "
            f"matrix must fix the all-ones vector (|M 1 − 1| = {drift:.2e})"
        )


def _check_invertible(g: str, kind: str, m64: Tensor, dtype: torch.dtype) -> None:
    condition = torch.linalg.cond(m64).item()
    if not condition <= MAX_CONDITION:
        raise PermutationError(
            f"group {g!r}: its matrix is singular or nearly so (condition number "
            f"{condition:.2e} > {MAX_CONDITION:.0e})"
        )


def _check_scaling(g: str, kind: str, m64: Tensor, dtype: torch.dtype) -> None:
    nonzero = m64 != 0
    one_per_line = bool((nonzero.sum(0) == 1).all() and (nonzero.sum(1) == 1).all())
    if not one_per_line or bool((m64 < 0).any()):
        raise PermutationError(
            f"group {g!r} is scaling: its matrix must be a permutation matrix with "
            "positive entries (one per row and column)"
        )


def _check_rotary_block(
    g: str, kind: str, m64: Tensor, dtype: torch.dtype, layout, heads: int, scaled: bool
) -> None:
    """Every head's block (of a block-permutation matrix): a 2 × 2 rotation — scaled, for
    ``rotary-scaled`` — of each rotated pair, nothing between pairs or from a pair to the
    unrotated rest, and an orthogonal (or well-conditioned) map of that rest."""
    n = m64.shape[0]
    d = n // heads
    blocks = m64.reshape(heads, d, heads, d).transpose(1, 2)
    pairs, free = _rotary_parts(d, layout)
    allowed = torch.zeros(d, d, dtype=torch.bool)
    for a, b in pairs:
        allowed[a, a] = allowed[a, b] = allowed[b, a] = allowed[b, b] = True
    for a in free:
        allowed[a, free] = True
    tol = _tolerance(dtype, d)
    for i in range(heads):
        j = int(blocks[i].abs().amax((-2, -1)).argmax())
        block = blocks[i, j]
        stray = block.masked_fill(allowed, 0).abs().max().item()
        if stray > tol:
            raise PermutationError(
                f"group {g!r} is {kind}: its map mixes dimensions the rotary embedding keeps "
                f"apart (|entry| {stray:.2e} outside the frequency pairs)"
            )
        for a, b in pairs:
            c, s = block[a, a], block[b, a]
            drift = max(abs(c - block[b, b]).item(), abs(s + block[a, b]).item())
            radius = math.hypot(c.item(), s.item())
            if drift > tol or (abs(radius - 1) > tol if not scaled else radius < 1e-8):
                raise PermutationError(
                    f"group {g!r} is {kind}: the map of pair {(a, b)} is no "
                    f"{'scaled ' if scaled else ''}rotation (it must commute with the rotary "
                    "embedding's rotation of the pair)"
                )
        if free:
            index = torch.tensor(free)
            rest = block[index[:, None], index]
            (_check_invertible if scaled else _check_orthogonal)(g, kind, rest, dtype)


def _check_rotary(g: str, kind: str, m64: Tensor, dtype, layout=None, heads: int = 1) -> None:
    _check_rotary_block(g, kind, m64, dtype, layout, heads, scaled=False)


def _check_rotary_scaled(g: str, kind: str, m64: Tensor, dtype, layout=None, heads: int = 1):
    _check_rotary_block(g, kind, m64, dtype, layout, heads, scaled=True)


# -- inverting -----------------------------------------------------------------------------
def _transpose(m: Tensor) -> Tensor:
    return m.T.contiguous()


def _inv(m: Tensor) -> Tensor:
    return torch.linalg.inv(m.to(torch.float64)).to(m.dtype)


def _inv_scaling(m: Tensor) -> Tensor:
    # exact zeros off the permutation
    return torch.where(m.T != 0, _inv(m), torch.zeros_like(m))


# -- learning (transform STE): a map as a differentiable function of free parameters ------
def _exp(k: Tensor, basis: Tensor | None) -> Tensor:
    return torch.linalg.matrix_exp(k)


def _exp_skew(k: Tensor, basis: Tensor | None) -> Tensor:
    return torch.linalg.matrix_exp(k - k.T)


def _exp_skew_mean_free(k: Tensor, basis: Tensor | None) -> Tensor:
    assert basis is not None
    inner = torch.block_diag(torch.ones(1, 1, dtype=k.dtype), _exp_skew(k, None))
    return basis @ inner @ basis.T


def _rotary_generator(k: Tensor, layout, scaled: bool) -> Tensor:
    """The generator in the rotary kinds' Lie algebra nearest ``k`` (``(d, d)``): per pair
    ``[[s, −t], [t, s]]`` (``s = 0`` unless scaled), on the unrotated rest ``k − kᵀ`` or
    ``k`` itself; zero elsewhere. Its exponential is a map of the kind."""
    n = k.shape[0]
    pairs, free = _rotary_parts(n, layout)
    out = torch.zeros_like(k)
    for a, b in pairs:
        t = (k[b, a] - k[a, b]) / 2
        s = (k[a, a] + k[b, b]) / 2 if scaled else torch.zeros_like(t)
        out = out.index_put((torch.tensor([a, a, b, b]), torch.tensor([a, b, a, b])),
                            torch.stack([s, -t, t, s]))  # fmt: skip
    if free:
        index = torch.tensor(free)
        rest = k[index[:, None], index]
        out = out.index_put((index[:, None].expand(len(free), len(free)),
                             index[None, :].expand(len(free), len(free))),
                            rest if scaled else rest - rest.T)  # fmt: skip
    return out


def _exp_rotary(k: Tensor, layout) -> Tensor:
    return torch.linalg.matrix_exp(_rotary_generator(k, layout, scaled=False))


def _exp_rotary_scaled(k: Tensor, layout) -> Tensor:
    return torch.linalg.matrix_exp(_rotary_generator(k, layout, scaled=True))


@dataclass(frozen=True)
class GroupFacts:
    """What the traced graph says about one group, on which the kinds it may take depend.

    Attributes:
        size: its number of units.
        heads: it is head-structured (a head's query/key or value/output dimensions).
        layer_norm: its norm gains are LayerNorm's (the stream keeps its mean: only maps
            that fix the all-ones vector commute with the centring).
        readers_dual: its readers can move by ``M⁻ᵀ`` (it has no norm of its own and each
            reader is a linear map the tracer can pair with its writers).
        pinned: its heads move whole (``PermutationSpec.pinned``: rotary dimensions).
    """

    size: int
    heads: bool
    layer_norm: bool
    readers_dual: bool
    pinned: bool = False


@dataclass(frozen=True)
class Kind:
    """One symmetry kind (a row of :data:`KINDS`).

    Attributes:
        name: the kind's name in specs, transform files and reports.
        where: where a model has it, for messages.
        matrix: its maps are matrices (``False``: index vectors — the permutation kind).
        orthogonal: its maps are orthogonal (``M⁻¹ = Mᵀ``): distances are kept and the
            readers move by ``M`` itself.
        dual: its readers move by ``M⁻ᵀ`` (the spec's ``duals`` list them).
        per_head: it may act on a head-structured group (block per head).
        narrowed: the kind of the distance-keeping subgroup weight matching searches
            without data (:func:`lmckit.transform.orthogonal_subgroup`).
        fitted_on_data: least squares on activations refines it after the distance-keeping
            search (``wm-full``, ``am-full``): its maps change distances.
        trial_order: where the tracer tries it (lower first: the larger groups first), or
            ``None`` for the kind every group has without a trial (permutations).
        admits: the tracer's precondition, on the graph's :class:`GroupFacts` — whether
            trying this kind on the group makes sense at all (the trial then decides).
        random: ``random(n, generator, dtype)`` — a random ``n × n`` map of the kind (``None``
            for index-vector kinds: :func:`lmckit.perm.random_index_vectors` draws those).
        check: ``check(group, kind, m64, dtype)`` raises
            :class:`~lmckit.errors.PermutationError` unless the float64 matrix ``m64`` is a
            map of the kind (to the tolerance of ``dtype``).
        inverse: ``inverse(M)`` — ``M⁻¹``.
        learned: ``learned(K, basis)`` — the map of free parameters ``K`` (transform STE:
            ``M = learned(K) M₀``; zero ``K`` is the identity), or ``None`` when the kind is
            not learned by gradient (permutations, scalings).
        free_shape: ``free_shape(n)`` — the shape of ``K`` for one block of ``n`` units.
        needs_basis: ``learned`` takes the group's :func:`mean_free_basis` as its second
            argument (``None`` otherwise; a kind with a ``layout`` takes the group's rotary
            layout there).
        conditioned: its maps are general matrices, bounded by their condition number
            (:data:`MAX_CONDITION`): fits report the worst one.
        layout: its maps follow a group's rotary layout (``PermutationSpec.rotary``):
            ``random`` takes it as a fourth argument, ``check`` as a fifth with the number
            of heads as a sixth.
    """

    name: str
    where: str
    matrix: bool
    orthogonal: bool
    dual: bool
    per_head: bool
    narrowed: str
    fitted_on_data: bool
    trial_order: int | None
    admits: Callable[[GroupFacts], bool]
    random: Callable[[int, torch.Generator | None, torch.dtype], Tensor] | None
    check: Callable[[str, str, Tensor, torch.dtype], None] | None
    inverse: Callable[[Tensor], Tensor]
    learned: Callable[[Tensor, Tensor | None], Tensor] | None = None
    free_shape: Callable[[int], tuple[int, ...]] | None = None
    needs_basis: bool = False
    conditioned: bool = False
    layout: bool = False


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind(
            "permutation",
            where="every hidden layer's units",
            matrix=False, orthogonal=True, dual=False, per_head=True,
            narrowed="permutation", fitted_on_data=False, trial_order=None,
            admits=lambda f: True, random=None, check=None, inverse=torch.argsort,
        ),
        Kind(
            "orthogonal",
            where="a residual stream with RMS norms, a head's dimensions",
            matrix=True, orthogonal=True, dual=False, per_head=True,
            narrowed="orthogonal", fitted_on_data=False, trial_order=1,
            admits=lambda f: (f.heads or not f.layer_norm) and not f.pinned,
            random=_random_orthogonal, check=_check_orthogonal, inverse=_transpose,
            learned=_exp_skew, free_shape=lambda n: (n, n),
        ),
        Kind(
            "orthogonal-mean-free",
            where="a LayerNorm's stream",
            matrix=True, orthogonal=True, dual=False, per_head=False,
            narrowed="orthogonal-mean-free", fitted_on_data=False, trial_order=2,
            # with two units the one map fixing the ones vector besides I is a permutation
            admits=lambda f: not f.heads and f.size > 2,
            random=_random_mean_free, check=_check_mean_free, inverse=_transpose,
            learned=_exp_skew_mean_free, free_shape=lambda n: (n - 1, n - 1), needs_basis=True,
        ),
        Kind(
            "invertible",
            where="a head's dimensions, a stream without norms",
            matrix=True, orthogonal=False, dual=True, per_head=True,
            narrowed="orthogonal", fitted_on_data=True, trial_order=0,
            admits=lambda f: f.readers_dual and not f.pinned,
            random=_random_invertible, check=_check_invertible, inverse=_inv,
            learned=_exp, free_shape=lambda n: (n, n), conditioned=True,
        ),
        Kind(
            "scaling",
            where="the hidden units of a ReLU-family activation",
            matrix=True, orthogonal=False, dual=True, per_head=False,
            narrowed="permutation", fitted_on_data=True, trial_order=3,
            admits=lambda f: f.readers_dual and not f.heads,
            random=_random_scaling, check=_check_scaling, inverse=_inv_scaling,
        ),
        Kind(
            "rotary-scaled",
            where="a head's query/key dimensions under rotary embeddings",
            matrix=True, orthogonal=False, dual=True, per_head=True,
            narrowed="rotary", fitted_on_data=False, trial_order=4,
            admits=lambda f: f.pinned and f.readers_dual,
            random=_random_rotary_scaled, check=_check_rotary_scaled, inverse=_inv,
            learned=_exp_rotary_scaled, free_shape=lambda n: (n, n),
            conditioned=True, layout=True,
        ),
        Kind(
            "rotary",
            where="a head's query/key dimensions under rotary embeddings (a norm on them)",
            matrix=True, orthogonal=True, dual=False, per_head=True,
            narrowed="rotary", fitted_on_data=False, trial_order=5,
            admits=lambda f: f.pinned,
            random=_random_rotary, check=_check_rotary, inverse=_transpose,
            learned=_exp_rotary, free_shape=lambda n: (n, n), layout=True,
        ),
    )
}  # fmt: skip
"""Every kind by name, the default (``"permutation"``) first."""


def tried_kinds(facts: GroupFacts) -> list[str]:
    """The kinds the tracer tries on a group, in trial order, that its facts admit."""
    rows = [k for k in KINDS.values() if k.trial_order is not None and k.admits(facts)]
    return [k.name for k in sorted(rows, key=lambda k: k.trial_order or 0)]
