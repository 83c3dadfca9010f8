"""Symmetries beyond permutations: orthogonal, invertible and scaling maps of groups, and
norm-gain folding.

A :class:`Transform` holds, for every group of a :class:`~lmckit.perm.PermutationSpec`,
either an index vector (a permutation, the convention of :mod:`lmckit.perm`) or an
``n × n`` matrix ``M`` of the group's kind (``spec.kinds``). A matrix acts on every axis
of its group alike::

    aligned_rows = M @ B_rows          # rows as perm.unit_rows lays them out

so a permutation ``p`` is the matrix with ``M[i, p[i]] = 1``. Because ``M`` is orthogonal
(``M⁻ᵀ = M``), a layer that writes into the group (its output rows) and a layer that reads
from it (its input columns) transform alike, and the network's function is unchanged —
provided nothing elementwise acts on the group between a writer and a reader. Norms do:

* **RMSNorm** ``n(x) = x / rms(x)`` commutes with any orthogonal ``M`` (``rms(Mx) =
  rms(x)``), but its elementwise gain ``g ⊙ n(x)`` does not. :func:`fold_norms` multiplies
  each gain into the linear maps that read the norm (``W ← W diag(g)``) and sets it to
  ones; a transform then leaves the folded gains alone (and refuses unfolded ones).
* **LayerNorm** first subtracts the mean, ``x − (1ᵀx/d) 1``: that commutes with ``M``
  exactly when ``M 1 = 1`` — an orthogonal map of the mean-free subspace, the kind
  ``"orthogonal-mean-free"`` (SliceGPT's observation, without changing the architecture).
  A norm's bias is a vector in the group's space and moves like any other: ``β ← M β``.
* **Attention heads** (head-structured groups): ``q·k`` is unchanged by one orthogonal map
  of each head's query and key dimensions, and ``softmax(·) v`` followed by the output
  projection by one of each head's value dimensions and the output projection's inputs.
  The matrix of such a group is block-permutation: block ``(i, π(i))`` is head ``i``'s
  ``d × d`` orthogonal ``Q_i``.
* **Invertible maps** (kind ``"invertible"``): a layer that reads a group ``z ↦ W z``
  keeps its function under ``z ↦ M z`` when ``W ← W M⁻¹``, so its rows in the
  :func:`~lmckit.perm.group_rows` layout move by ``M⁻ᵀ`` — the places in
  ``spec.duals`` — while writers move by ``M``. Attention's value/output dimensions admit
  any invertible ``N`` per head (``W_V ← N W_V``, ``W_O ← W_O N⁻¹``) and its query/key
  dimensions any invertible ``M`` per head, the key side dual (``(Mq)·(M⁻ᵀk) = q·k``),
  unless rotary embeddings act on them.
* **Scalings** (kind ``"scaling"``): a ReLU-family activation commutes with positive
  per-unit scales, ``relu(s z) = s relu(z)``, so an MLP's hidden units admit a permutation
  times positive scales (not so GELU or SiLU). Readers are dual, as for invertible maps.

:func:`lmckit.tracing.symmetry_kinds` decides each group's kind from the model's graph and
checks it numerically; tests hold every kind to float64 function preservation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

import torch
from torch import Tensor

from lmckit.errors import PermutationError
from lmckit.kinds import KINDS, haar_orthogonal, mean_free_basis
from lmckit.params import Params
from lmckit.perm import (
    Permutation,
    PermutationSpec,
    axis_groups,
    compose_copies,
    copies_axis_index,
    group_rows,
    invert_copies,
    join_heads,
    permute_spec_axis,
    put_group_rows,
    random_index_vectors,
    split_heads,
    tie_outer,
)

__all__ = [
    "Transform",
    "align",
    "align_pair",
    "apply_group_map",
    "fold_norms",
    "haar_orthogonal",
    "mean_free_basis",
    "orthogonal_subgroup",
    "random_group_map",
    "random_map",
    "unfold_norms",
]


class Transform:
    """One map per group of a spec: an index vector (permutation) or an ``n × n`` matrix
    of the group's kind.

    ``transform.apply(params_b)`` is ``T(θ_B)``; the module docstring states the convention.
    Matrices are checked on construction: orthogonal (to 1e-9 in float64), fixing the
    ones vector for ``"orthogonal-mean-free"`` groups, block-permutation per head for
    head-structured groups (groups of one head tie share the head permutation).

    Raises:
        PermutationError: a matrix for a ``"permutation"`` group, a matrix of the wrong
            shape or not orthogonal, or an index vector that is not a permutation.
    """

    __slots__ = ("_duals", "_maps", "spec")

    def __init__(self, spec: PermutationSpec, maps: Mapping[str, Tensor]) -> None:
        if not isinstance(spec, PermutationSpec):
            raise PermutationError(
                f"Transform needs the PermutationSpec its maps act on, got {type(spec).__name__}"
            )
        if not isinstance(maps, Mapping):
            raise PermutationError(
                f"Transform needs maps as {{group: tensor}}, got {type(maps).__name__}"
            )
        if set(maps) != set(spec.groups):
            missing = sorted(set(spec.groups) - set(maps))
            extra = sorted(set(maps) - set(spec.groups))
            raise PermutationError(
                f"transform groups do not match the spec: missing {missing}, unknown {extra}"
            )
        index = {g: m for g, m in maps.items() if torch.as_tensor(m).ndim == 1}
        matrices = {g: torch.as_tensor(m) for g, m in maps.items() if g not in index}
        checked: dict[str, Tensor] = {}
        for g, m in matrices.items():
            n, kind = spec.groups[g], spec.kind(g)
            if not KINDS[kind].matrix:
                raise PermutationError(
                    f"group {g!r} is a permutation group: give it an index vector, not a "
                    "matrix (spec.kinds says which groups admit orthogonal maps)"
                )
            if m.shape != (n, n) or not m.dtype.is_floating_point:
                raise PermutationError(
                    f"group {g!r}: expected a floating {n}×{n} matrix, got {m.dtype} "
                    f"{tuple(m.shape)}"
                )
            if not torch.isfinite(m).all():
                raise PermutationError(f"group {g!r}: the matrix has NaN or infinite entries")
            m64 = m.detach().to("cpu", torch.float64)
            if KINDS[kind].layout:  # per head, on the rotary pairs
                KINDS[kind].check(g, kind, m64, m.dtype, spec.rotary[g], spec.heads[g][1])
            else:
                KINDS[kind].check(g, kind, m64, m.dtype)
            checked[g] = m.detach().to("cpu")
        # a permutation of the spec checks the index vectors and that the groups of a head
        # tie move the heads alike (a matrix group stands in by its head permutation)
        stand_ins = {g: _head_permutation(spec, g, m) for g, m in checked.items()}
        perms = Permutation(spec, {**index, **stand_ins})
        checked.update({g: perms[g] for g in index})
        self.spec = spec
        self._maps = MappingProxyType(checked)
        self._duals: dict[str, Tensor] = {}

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def identity(cls, spec: PermutationSpec) -> Transform:
        """The transform that changes nothing (index vectors ``arange(n)``)."""
        return cls(spec, {g: torch.arange(n) for g, n in spec.groups.items()})

    @classmethod
    def from_permutation(cls, perm: Permutation) -> Transform:
        """``perm`` as a transform (every group an index vector)."""
        return cls(perm.spec, dict(perm.items()))

    @classmethod
    def random(
        cls,
        spec: PermutationSpec,
        generator: torch.Generator | int | None = None,
        *,
        dtype: torch.dtype = torch.float64,
    ) -> Transform:
        """A random element of the spec's symmetry group: Haar-random orthogonal matrices
        for groups of an orthogonal kind (per head, after a head permutation, for
        head-structured groups); for invertible groups ``Q₁ diag(s) Q₂`` with Haar ``Qᵢ``
        and singular values ``s = exp(U(−½, ½))`` (condition number below e); for scaling
        groups a uniform permutation times scales ``exp(U(−1, 1))``; permutations
        elsewhere. Every permutation part of size > 1 (a group's, a head permutation, one
        head's inside) is uniform over those that move — the identity is redrawn
        (:func:`~lmckit.perm.random_index_vectors` with ``moving=True``), so a probe never
        tests a part it left in place. Seeded by ``generator`` (a CPU generator or an
        integer), drawn in the spec's group order."""
        if isinstance(generator, int):
            generator = torch.Generator().manual_seed(generator)
        perms = random_index_vectors(spec, generator, moving=True)
        maps: dict[str, Tensor] = {}
        for g, n in spec.groups.items():
            kind = spec.kind(g)
            if not KINDS[kind].matrix:
                maps[g] = perms[g]
            elif g in spec.heads:
                heads = spec.heads[g][1]
                outer = split_heads(perms[g], heads)
                assert outer is not None
                layout = spec.rotary.get(g)
                blocks = [
                    random_map(kind, n // heads, generator, dtype, layout) for _ in range(heads)
                ]
                maps[g] = head_matrix(outer[0], blocks)
            else:
                maps[g] = random_map(kind, n, generator, dtype)
        return cls(spec, maps)

    # -- access ----------------------------------------------------------------------------
    def __getitem__(self, group: str) -> Tensor:
        return self._maps[group]

    def __iter__(self):
        return iter(self._maps)

    def __len__(self) -> int:
        return len(self._maps)

    def items(self):
        """``(group, index vector or matrix)`` pairs."""
        return self._maps.items()

    def is_matrix(self, group: str) -> bool:
        """Whether ``group`` holds a matrix (otherwise an index vector)."""
        return self._maps[group].ndim == 2

    def matrix(self, group: str, dtype: torch.dtype = torch.float64) -> Tensor:
        """``group``'s map as an ``n × n`` matrix (a permutation's ``M[i, p[i]] = 1``)."""
        return dense_matrix(self._maps[group], dtype)

    def is_permutation(self) -> bool:
        """Whether every group holds an index vector."""
        return all(m.ndim == 1 for m in self._maps.values())

    def to_permutation(self) -> Permutation:
        """The transform as a :class:`~lmckit.perm.Permutation` (every group an index
        vector; raises otherwise)."""
        matrices = [g for g, m in self._maps.items() if m.ndim == 2]
        if matrices:
            raise PermutationError(
                f"groups {matrices[:4]} hold orthogonal matrices, not permutations"
            )
        return Permutation(self.spec, dict(self._maps))

    def replace(self, **groups: Tensor) -> Transform:
        """A copy with the given groups' maps replaced."""
        return Transform(self.spec, {**self._maps, **groups})

    def to_dict(self) -> dict[str, list]:
        """JSON-ready ``{group: [indices] | [[row], …]}``."""
        return {g: m.tolist() for g, m in self._maps.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, list], spec: PermutationSpec) -> Transform:
        """Inverse of :meth:`to_dict` (validated against ``spec``); a missing copies group is
        the identity, as in :meth:`Permutation.from_dict`."""
        if not isinstance(data, Mapping):
            raise PermutationError(
                f"expected a mapping group -> index list or matrix, got {type(data).__name__}"
            )
        maps: dict[str, Tensor] = {}
        for g, values in data.items():
            if not isinstance(values, list) or not values:
                raise PermutationError(f"group {g!r}: expected a non-empty list")
            if isinstance(values[0], list):
                try:
                    maps[g] = torch.tensor(values, dtype=torch.float64)
                except (TypeError, ValueError) as exc:
                    raise PermutationError(
                        f"group {g!r}: not a matrix of numbers ({exc})"
                    ) from None
            else:
                maps[g] = _index_list(g, values)
        for c in spec.copies:  # written before copies groups existed: the same action
            maps.setdefault(c, torch.arange(spec.groups[c]))
        return cls(spec, maps)

    def __repr__(self) -> str:
        sizes = ", ".join(
            f"{g}:{m.shape[0]}{'×' + str(m.shape[1]) if m.ndim == 2 else ''}"
            for g, m in self._maps.items()
        )
        return f"Transform({sizes})"

    # -- algebra ---------------------------------------------------------------------------
    def inverse(self) -> Transform:
        """The transform ``U`` with ``U.apply(self.apply(x)) == x`` (``Mᵀ`` for orthogonal
        matrices, ``M⁻¹`` for invertible and scaling ones)."""
        out = {}
        for g, m in self.items():
            if g in self.spec.copies:
                outer = tie_outer(self.spec, self.spec.copies[g], self)
                out[g] = invert_copies(self.spec, g, m, outer)
            else:
                out[g] = torch.argsort(m) if m.ndim == 1 else KINDS[self.spec.kind(g)].inverse(m)
        return Transform(self.spec, out)

    def dual(self, group: str) -> Tensor:
        """``M⁻ᵀ`` of a matrix group: how its readers (``spec.duals``) move. ``M`` itself
        for orthogonal kinds."""
        m = self._maps[group]
        if m.ndim == 1 or not KINDS[self.spec.kind(group)].dual:
            return m
        if group not in self._duals:
            self._duals[group] = torch.linalg.inv(m.to(torch.float64)).T.to(m.dtype)
        return self._duals[group]

    def compose(self, inner: Transform | Permutation) -> Transform:
        """``self ∘ inner``: applying the result equals ``self.apply(inner.apply(x))``
        (matrices multiply, ``M_self M_inner``; index vectors compose as in
        :meth:`Permutation.compose`)."""
        if isinstance(inner, Permutation):
            inner = Transform.from_permutation(inner)
        if inner.spec.groups != self.spec.groups:
            raise PermutationError("cannot compose transforms of different specs")
        out: dict[str, Tensor] = {}
        for g, m in self._maps.items():
            other = inner._maps[g]
            if g in self.spec.copies:
                inner_heads = tie_outer(self.spec, self.spec.copies[g], inner)
                out[g] = compose_copies(self.spec, g, m, other, inner_heads)
            elif m.ndim == 1 and other.ndim == 1:
                out[g] = other[m]
            else:
                dtype = m.dtype if m.ndim == 2 else other.dtype
                out[g] = self.matrix(g, dtype) @ inner.matrix(g, dtype)
        return Transform(self.spec, out)

    # -- action on parameters --------------------------------------------------------------
    def apply(self, params: Params) -> dict[str, Tensor]:
        """``T(params)``: every tensor with every group's map applied on its axes (validated
        against the spec). Gains in ``spec.folds`` of groups holding a matrix must be folded
        (all ones, :func:`fold_norms`) and are left as they are.

        Returns a new dict of new tensors; the inputs are left untouched.

        Raises:
            PermutationError: an unfolded gain on a group that holds a matrix.
        """
        self.spec.validate(params)
        out: dict[str, Tensor] = {}
        for name, t in params.items():
            moved = transform_tensor(t, self, name)
            out[name] = moved if moved is not t else t.clone()
        return out

    def distance(self, reference: Params, params: Params) -> float:
        """``‖reference − T(params)‖`` over the floating tensors, one tensor at a time."""
        from lmckit.params import check_params_compatible, floating_names, squared_distance

        check_params_compatible(reference, params)
        total = 0.0
        for name in floating_names(reference):
            total += squared_distance(reference[name], transform_tensor(params[name], self, name))
        return math.sqrt(total)


def align_pair(
    alignment: Transform | Permutation, params_a: Params, params_b: Params
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``(A, π(B))`` for a permutation; for a transform, both models with their norm gains
    folded (``alignment.spec.folds``) and the transform applied to B's: the pair whose
    interpolation, merge or distance a caller wants. Inputs are left untouched."""
    if isinstance(alignment, Permutation):
        return dict(params_a), alignment.apply(params_b)
    return align(Transform.identity(_spec_of(alignment)), params_a), align(alignment, params_b)


def align(alignment: Transform | Permutation, params: Params) -> dict[str, Tensor]:
    """One model moved by ``alignment``: ``π(θ)`` for a permutation; for a transform,
    ``T(θ)`` of the model with its norm gains folded (``alignment.spec.folds``)."""
    if isinstance(alignment, Permutation):
        return alignment.apply(params)
    return alignment.apply(fold_norms(_spec_of(alignment), params))


def _spec_of(alignment: object) -> PermutationSpec:
    if not isinstance(alignment, Transform):
        raise PermutationError(
            f"expected a Permutation or a Transform, got {type(alignment).__name__}"
        )
    return alignment.spec


def orthogonal_subgroup(spec: PermutationSpec) -> PermutationSpec:
    """``spec`` with each invertible group orthogonal and each scaling group a permutation:
    the subgroup whose maps keep distances (``‖T(θ)‖ = ‖θ‖``), which weight matching's
    Procrustes steps search. Its transforms are transforms of ``spec`` too."""
    from dataclasses import replace

    return replace(spec, kinds={g: KINDS[k].narrowed for g, k in spec.kinds.items()})


def dense_matrix(m: Tensor, dtype: torch.dtype = torch.float64) -> Tensor:
    """A group's map as an ``n × n`` matrix: a matrix as it is, an index vector ``p`` as
    the permutation matrix with ``M[i, p[i]] = 1``."""
    if m.ndim == 2:
        return m.to(dtype)
    out = torch.zeros(m.numel(), m.numel(), dtype=dtype)
    out[torch.arange(m.numel()), m] = 1
    return out


def transform_tensor(t: Tensor, transform: Transform, name: str) -> Tensor:
    """``t`` (the tensor ``name``) with every group of ``transform`` applied on its axes;
    ``t`` itself where no group acts on it. A folded gain of a matrix group is checked to
    be ones and returned as it is."""
    spec = transform.spec
    if name in spec.folds and transform.is_matrix(spec.gain_group(name)):
        if not bool((t == 1).all()):
            raise PermutationError(
                f"{name!r} is a norm gain of group {spec.gain_group(name)!r}, which this "
                "transform rotates: fold it first (lmckit.transform.fold_norms), since an "
                "elementwise gain does not commute with a rotation"
            )
        return t
    perms: dict[str, Tensor] = {}
    for axis, entry in enumerate(spec.axes[name]):
        copies = spec.copies_group(name, axis)
        if copies is not None:  # B's query heads reordered first (PermutationSpec.copies)
            index = copies_axis_index(spec, name, axis, transform[copies])
            t = t.index_select(axis, index.to(t.device))
        for g in axis_groups(entry):
            m = transform[g]
            if m.ndim == 2:
                t = _move_rows(spec, name, axis, g, t, m, transform.dual(g))
                perms[g] = torch.arange(spec.groups[g])
            else:
                perms[g] = m
        if axis_groups(entry):
            t = permute_spec_axis(t, spec, name, axis, perms)
    return t


def _move_rows(
    spec: PermutationSpec, name: str, axis: int, group: str, t: Tensor, m: Tensor, dual: Tensor
) -> Tensor:
    """``t`` with ``group``'s rows on ``axis`` multiplied by ``m`` — by ``dual`` in the
    segments ``spec.duals`` lists."""
    rows = group_rows(spec, name, axis, group, t)
    found = [(i, n) for i, (g, _, n) in enumerate(spec.segments(name, axis)) if g == group]
    flags = [spec.is_dual(name, axis, i) for i, _ in found]
    if dual is m or not any(flags):
        moved = m.to(t.device, t.dtype) @ rows
    elif all(flags):
        moved = dual.to(t.device, t.dtype) @ rows
    else:  # a fused projection: query and key segments of one axis move differently
        # each segment's columns: its entries per unit (a head-repeated query segment has
        # r times a key segment's) times the other axes' entries
        rest = t.numel() // t.shape[axis]
        widths = [length // spec.groups[group] * rest for _, length in found]
        starts = [sum(widths[:k]) for k in range(len(widths))]
        moved = torch.cat(
            [
                (dual if flag else m).to(t.device, t.dtype) @ rows[:, at : at + width]
                for at, width, flag in zip(starts, widths, flags, strict=True)
            ],
            dim=1,
        )
    return put_group_rows(spec, name, axis, group, t, moved)


def head_matrix(outer: Tensor, blocks: list[Tensor]) -> Tensor:
    """The ``h·d × h·d`` matrix whose block ``(i, outer[i])`` is ``blocks[i]`` (``d × d``):
    head ``i`` of the result is head ``outer[i]`` of the input, rotated by ``blocks[i]``."""
    h, d = len(blocks), blocks[0].shape[0]
    out = blocks[0].new_zeros(h * d, h * d)
    for i, block in enumerate(blocks):
        j = int(outer[i])
        out[i * d : (i + 1) * d, j * d : (j + 1) * d] = block
    return out


def head_blocks(matrix: Tensor, heads: int) -> tuple[Tensor, list[Tensor]] | None:
    """Inverse of :func:`head_matrix`: ``(outer, blocks)``, or None if ``matrix`` is not
    block-permutation with ``heads`` blocks."""
    d = matrix.shape[0] // heads
    norms = matrix.reshape(heads, d, heads, d).abs().sum((1, 3))
    outer = norms.argmax(1)
    if not torch.equal(torch.sort(outer).values, torch.arange(heads)):
        return None
    mask = torch.ones_like(norms, dtype=torch.bool)
    mask[torch.arange(heads), outer] = False
    if bool((norms[mask] > 0).any()):
        return None
    blocks = [
        matrix[i * d : (i + 1) * d, int(outer[i]) * d : (int(outer[i]) + 1) * d]
        for i in range(heads)
    ]
    return outer, blocks


def _head_permutation(spec: PermutationSpec, group: str, matrix: Tensor) -> Tensor:
    """The index vector that moves ``group``'s heads as ``matrix`` does and keeps each
    head's dimensions in place (``arange`` for a group without heads)."""
    n = spec.groups[group]
    if group not in spec.heads:
        return torch.arange(n)
    heads = spec.heads[group][1]
    parts = head_blocks(matrix, heads)
    if parts is None:
        raise PermutationError(
            f"group {group!r} is head-structured ({heads} heads): its matrix mixes dimensions "
            "of different heads"
        )
    d = n // heads
    return join_heads(parts[0], torch.arange(d).expand(heads, d))


def _index_list(group: str, values: list) -> Tensor:
    bad = next((v for v in values if isinstance(v, bool) or not isinstance(v, int)), None)
    if bad is not None:
        raise PermutationError(f"group {group!r}: indices must be integers, found {bad!r}")
    return torch.tensor(values, dtype=torch.long)


def random_map(
    kind: str,
    n: int,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float64,
    layout: tuple[str, int] | None = None,
) -> Tensor:
    """A random ``n × n`` map of ``kind`` (see :meth:`Transform.random`); ``layout``: the
    rotary layout a head's map follows, for the kinds that have one."""
    draw = KINDS[kind].random if kind in KINDS else None
    if draw is None:
        raise PermutationError(f"no random map of kind {kind!r}")
    if KINDS[kind].layout:
        return draw(n, generator, dtype, layout)
    return draw(n, generator, dtype)


def random_group_map(
    spec: PermutationSpec, group: str, kind: str, generator: torch.Generator | None = None
) -> Tensor:
    """A random matrix of ``kind`` for ``group`` alone: per head for a head-structured
    group, with the heads kept in place (so the other groups of its head tie can stay at
    the identity) — what probes of one group's symmetry apply."""
    n = spec.groups[group]
    if group in spec.heads:
        heads = spec.heads[group][1]
        layout = spec.rotary.get(group)
        blocks = [random_map(kind, n // heads, generator, layout=layout) for _ in range(heads)]
        return head_matrix(torch.arange(heads), blocks)
    return random_map(kind, n, generator)


def apply_group_map(
    spec: PermutationSpec,
    params: Params,
    group: str,
    matrix: Tensor,
    dual: Tensor | None = None,
) -> dict[str, Tensor]:
    """``params`` with one matrix group's ``n × n`` map applied on its axes — by ``dual``
    (``M⁻ᵀ``, default ``matrix``: an orthogonal map) in the places ``spec.duals`` lists —
    and every other group at the identity: ``Transform.identity(spec).replace(group=M)
    .apply(params)`` without the transform's checks of ``M`` (an SVD or a product of
    ``n × n`` matrices), for probes that draw their maps themselves. Folded gains of the
    group (ones) are left as they are; other tensors are shared with ``params``."""
    dual = matrix if dual is None else dual
    out = dict(params)
    for name, axis in spec.group_axes(group):
        if name in spec.folds and spec.gain_group(name) == group:
            continue
        out[name] = _move_rows(spec, name, axis, group, out[name], matrix, dual)
    return out


def _gain_on_reader(
    spec: PermutationSpec, name: str, axis: int, group: str, t: Tensor, g: Tensor
) -> Tensor:
    """``t`` (a reader of a norm on ``axis``) times ``diag(g)`` on that axis. A gain with
    one entry per entry of the axis multiplies it entry by entry — the gain then lies on
    the axis as the reader does: BitNet's RMSNorm of the attention output, before the
    output projection, holds each value head once per query head of its group (a head
    repeat); otherwise each unit's entries (its blocks, its segments) take its gain."""
    g = g.to(t.dtype)
    if g.numel() == t.shape[axis]:
        shape = [1] * t.ndim
        shape[axis] = -1
        return t * g.reshape(shape)
    rows = group_rows(spec, name, axis, group, t)
    return put_group_rows(spec, name, axis, group, t, rows * g[:, None])


def fold_norms(spec: PermutationSpec, params: Params) -> dict[str, Tensor]:
    """``params`` with every gain of ``spec.folds`` multiplied into its readers and set to
    ones: ``W ← W diag(g)`` on each reader's axis and the norm's bias (``spec.norm_biases``)
    ``β ← β / g`` — the same function, since each reader sees ``W (g ⊙ n(x) + β) =
    (W diag(g)) (n(x) + β / g)``.

    Returns a new dict (tensors the fold does not touch are shared, not copied).

    Raises:
        PermutationError: a reader named by two gains on one axis (the folds would
            compound; the spec is wrong), or a gain with a zero entry beside a bias (the
            bias cannot be divided by it).
    """
    spec.validate(params)
    out = dict(params)
    seen: dict[tuple[str, int], str] = {}
    for gain, readers in spec.folds.items():
        group = spec.gain_group(gain)
        g = params[gain]
        for name, axis in readers:
            if (name, axis) in seen:
                raise PermutationError(
                    f"{name!r} axis {axis} reads both {seen[name, axis]!r} and {gain!r}"
                )
            seen[name, axis] = gain
            out[name] = _gain_on_reader(spec, name, axis, group, out[name], g)
        bias = spec.norm_biases.get(gain)
        if bias is not None:
            if bool((g == 0).any()):
                raise PermutationError(
                    f"{gain!r} has zero entries: its norm's bias {bias!r} cannot be divided "
                    "by it, so the gain cannot be folded"
                )
            out[bias] = params[bias] / g.to(params[bias].dtype)
        out[gain] = torch.ones_like(g)
    return out


def unfold_norms(
    spec: PermutationSpec, params: Params, gains: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """Inverse of :func:`fold_norms`: put ``gains`` back (``{gain name: g}``, e.g. model
    A's own) and divide them out of their readers, ``W ← W diag(g)⁻¹`` (and ``β ← β ⊙ g``
    for the norm's bias) — the same
    function in the original layout (gains not ones), for users who load the result into
    code that expects trained gains. ``params`` must hold folded (all-ones) gains.

    Raises:
        PermutationError: a gain of ``gains`` not in ``spec.folds``, a zero entry (cannot
            be divided out), or a gain in ``params`` that is not folded.
    """
    spec.validate(params)
    unknown = sorted(set(gains) - set(spec.folds))
    if unknown:
        raise PermutationError(f"gains {unknown[:4]} are not foldable gains of the spec")
    out = dict(params)
    for gain, g in gains.items():
        if not bool((params[gain] == 1).all()):
            raise PermutationError(f"{gain!r} is not folded (not all ones); nothing to unfold")
        if bool((g == 0).any()):
            raise PermutationError(f"{gain!r} has zero entries, which cannot be divided out")
        group = spec.gain_group(gain)
        for name, axis in spec.folds[gain]:
            out[name] = _gain_on_reader(spec, name, axis, group, out[name], 1 / g)
        bias = spec.norm_biases.get(gain)
        if bias is not None:
            out[bias] = params[bias] * g.to(params[bias].dtype)
        out[gain] = g.detach().clone().to(params[gain].dtype)
    return out
