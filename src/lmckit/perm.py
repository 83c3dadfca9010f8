"""Permutation symmetries of a network, as data.

A :class:`PermutationSpec` says, for every tensor of a ``state_dict``, which permutation
group acts on each of its axes (``None`` for an axis no group acts on). A
:class:`Permutation` holds one index vector per group and applies them to parameter dicts.

Convention (used everywhere in lmckit): for a group with index vector ``p`` of length
``n``, applying the permutation to a tensor ``B`` along an axis of that group gives::

    aligned[..., i, ...] = B[..., p[i], ...]        # i.e. B.index_select(axis, p)

so ``p[i]`` is the unit of model B that is placed at position ``i`` (matched to unit ``i``
of the reference model A). The identity is ``arange(n)``.

Below the model zoo, lmckit only knows parameter dicts (``dict[str, Tensor]``, the keys of
``model.state_dict()``) and a spec; it never inspects a model class.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import torch
from torch import Tensor

from lmckit.errors import PermutationError, SpecError
from lmckit.kinds import KINDS as _KIND_TABLE
from lmckit.kinds import ROTARY_STYLES
from lmckit.params import Params, short_list

__all__ = [
    "KINDS",
    "Params",
    "Permutation",
    "PermutationSpec",
    "axis_index",
    "block_index",
    "compose_copies",
    "copies_axis_index",
    "copies_gains",
    "copies_gains_of_units",
    "copies_value",
    "from_unit_rows",
    "group_cost_matrix",
    "group_rows",
    "head_sum_order",
    "invert_copies",
    "join_heads",
    "permute_axis",
    "permute_spec_axis",
    "permute_tensor",
    "put_group_rows",
    "random_index_vectors",
    "solve_copies",
    "split_heads",
    "tie_outer",
    "unit_rows",
]

# One entry per tensor axis: a group name, None (no group acts on it), or a direct sum —
# a tuple of consecutive segments, each a group name or the length of a fixed segment.
AxisEntry = str | None | tuple[str | int, ...]
Axes = tuple[AxisEntry, ...]


@dataclass(frozen=True)
class PermutationSpec:
    """Which permutation group acts on which axis of which tensor.

    Args:
        groups: group name -> number of units it permutes (``n``).
        axes: parameter name -> one entry per tensor axis: a group name, or ``None`` for an
            axis no group permutes, or a *direct sum*: a tuple of consecutive segments, each
            a group name (``n_g · block`` entries that group moves) or an integer (that many
            entries nothing moves) — the input of a layer after a ``cat`` of two branches'
            outputs, ``("left", "right")``, or a fused query/key/value projection whose query
            and key move with one group and value with another, ``("qk", "qk", "vo")``. A
            group may appear in several segments of one axis; each moves alike. Scalars
            (``num_batches_tracked``) have ``()``. Every tensor of the state_dict must be
            listed, permuted or not, so that validation can catch a spec that drifted from
            its model.
        self_maps: names of tensors allowed to carry one group on two axes: a layer mapping a
            residual stream onto itself (``h ← h + σ(W h)``, W of shape ``(n, n)`` permuted
            as ``P W Pᵀ``). Anywhere else a repeated group is almost always a typo, so it is
            rejected unless declared here.
        blocks: parameter name -> one block length per axis (default 1 everywhere). An axis
            of length ``n·b`` with block ``b`` holds ``n`` contiguous blocks of ``b`` entries
            (unit-major: entry ``u·b + s`` is position ``s`` of unit ``u``), and the group
            moves whole blocks: the flattened ``C×H×W`` input of a linear layer after a
            convolution (``b = H·W``), or the heads of an attention projection (``b`` = the
            head dimension).
        repeats: parameter name -> one repeat count per axis (default 1). An axis with
            repeat ``r`` is ``r`` consecutive segments, each laid out as above, and the group
            acts alike in every segment: a fused query/key/value projection (``r = 3``).
            The axis length is ``r · n · b``. (A direct sum of one group repeated says the
            same; a direct-sum axis takes no repeat.)
        head_repeats: parameter name -> one count per axis (default 1). On an axis of a
            head-structured group (see ``heads``) a count ``r`` lays out each head's ``d``
            units ``r`` times in a row: the axis holds ``h`` heads of ``r·d`` entries (times
            its block), entry ``(i·r + t)·d + s`` carrying unit ``i·d + s`` for every ``t``,
            and the permutation moves them as ``(i, t, s) ← (π(i), t, σ_i(s))``: the query
            heads of grouped-query attention that share a key/value head (its value
            dimensions on the output projection's columns, its key dimensions on the query
            projection's rows), each copy moved alike. An axis with a count > 1 is a plain
            one (no direct sum, no repeat).
        segment_head_repeats: parameter name -> ``{axis: one count per segment}`` of a
            direct-sum axis: a segment of a head-structured group with a count ``r`` > 1 is
            laid out as a head-repeated axis is (see ``head_repeats``: ``h`` heads of ``r·d``
            entries) — Phi-3's fused ``[q | k | v]`` rows under grouped-query attention,
            whose query segment holds each key/value head's dimensions once per query head
            of its group. The segment is ``r`` times the group's entries long; the tie's
            copies group (``copies``) moves its copies as on a head-repeated axis.
        head_sums: parameter name -> one count per axis (default 1). A direct-sum axis
            with a count ``h`` > 1 is laid out head by head: ``h`` blocks, each holding one
            head of every segment in turn — GPT-NeoX's fused projection, whose rows are
            ``[q | k | v]`` per head — instead of each segment whole. Every segment is a
            head-structured group of one tie with ``h`` heads (``heads``); the axis moves
            as the same direct sum laid out segment by segment would (see
            :func:`head_sum_order`). Such an axis takes no block and no repeat.
        head_axes: parameter name -> ``(a, b)``: the tensor's axis ``b`` holds the
            dimensions of a head-structured tie whose *heads lie along axis* ``a`` — a
            mixture's fused expert tensors (``gate_up_proj [E, 2I, H]``, ``down_proj [E, H,
            I]``), whose experts are the heads and whose hidden units each expert may
            permute alone. The two axes read as one, ``a``-major (entry ``(e, s)`` of the
            pair is unit ``e·len_b + s``), and ``axes[name][b]`` describes that joint axis:
            a head-structured group of ``h = len_a`` heads (``p[e·d + s] = π(e)·d +
            σ_e(s)``: expert ``π(e)`` of B, its hidden units read through ``σ_e``), or a
            direct sum of groups of one tie, laid out head by head as in ``head_sums`` (each
            expert's gate units, then its up units). ``axes[name][a]`` is None: the tie's
            head permutation moves it. Neither axis takes a block, a repeat, a head repeat
            or a head sum. :func:`axis_index` gives the joint axis's index vector;
            :func:`permute_spec_axis`, :func:`group_rows` and :func:`put_group_rows` read
            and write the pair.
        heads: group name -> ``(head permutation name, number of heads h)``: a
            *head-structured* group. Its ``n = h·d`` units are ``h`` contiguous heads of
            ``d`` (unit-major), and it moves them by one permutation of the heads and one
            permutation inside each head: ``p[i·d + s] = π(i)·d + σ_i(s)``. Groups naming
            the same head permutation share ``π`` and keep their own ``σ`` — attention's
            query/key dimensions (one group, on Q and K) and value/output dimensions
            (another, on V and O) move with one permutation of the heads. A group of size
            ``h`` (``d = 1``) in such a tie is the head permutation itself.
        pinned: head-structured groups whose permutations move whole heads only (``σ_i`` the
            identity): a head's dimensions that rotary embeddings rotate cannot be permuted
            (each pair has its own frequency), but the heads can, and a kind may still give
            them matrices inside each head (2 × 2 rotations of each frequency pair).
        copies: group name -> head permutation name: a *copies group* of that head tie, for
            grouped-query attention's query heads permuted inside their key/value group. On
            the tie's head-repeated axes (see ``head_repeats``, count ``r``) the ``r`` copies
            of each head are ``r`` query heads that share one key/value head, and any
            permutation of them keeps the function when their query rows and output columns
            move together. The group has ``h·r`` units (``h`` the tie's heads) and acts on no
            axis by itself; its index vector is block-diagonal, ``c[j·r + t] = j·r + ρ_j(t)``,
            one permutation ``ρ_j`` per head *of model B* (indexed by B's head, not by the
            position it is moved to), and it acts before the heads move: a head-repeated axis
            takes ``(i, t, s) ← (π(i), ρ_π(i)(t), σ_i(s))``. Attached to B's heads, it stays
            valid whatever ``π`` a method picks, so a method that does not know copies leaves
            it at the identity (the plain head-repeat action). It is a permutation group (no
            kind).
        rotary: pinned group name -> ``(style, rotated)``: how rotary embeddings pair a
            head's first ``rotated`` dimensions — ``"half"``, ``(j, j + rotated/2)`` (Llama's
            rotate-half), or ``"interleaved"``, ``(2j, 2j + 1)`` (GPT-J) — the layout the
            ``"rotary"`` kinds' maps follow (a 2 × 2 rotation per pair; any map of the kind's
            family on the unrotated rest). :func:`lmckit.tracing.symmetry_kinds` finds it.
        kinds: group name -> the symmetry the group admits beyond permutations (default
            ``"permutation"`` for every group; see :data:`KINDS`): ``"orthogonal"`` — any
            orthogonal ``n × n`` matrix (a head-structured group: one ``d × d`` orthogonal
            block per head, after its head permutation); ``"orthogonal-mean-free"`` — an
            orthogonal matrix that fixes the all-ones vector (the stream of a LayerNorm,
            which subtracts the mean). Permutations are always allowed. A matrix acts on
            every axis of the group alike (``aligned_rows = M @ B_rows``, rows as
            :func:`unit_rows` lays them out); orthogonality makes readers and writers alike.
            ``"invertible"`` — any invertible matrix (per head for a head-structured group):
            writers move by ``M``, the places listed in ``duals`` by ``M⁻ᵀ``;
            ``"scaling"`` — a permutation times positive per-unit scales (the hidden units of
            a ReLU-family activation, ``relu(s z) = s relu(z)`` for ``s > 0``), with
            ``duals`` as for invertible maps.
            :func:`lmckit.tracing.symmetry_kinds` sets them from a model's graph and checks each
            numerically.
        folds: norm gain name -> the ``(tensor, axis)`` pairs that read its output through
            linear maps only. An elementwise gain does not commute with a rotation, so
            :func:`lmckit.transform.fold_norms` multiplies it into those readers and sets it
            to ones; a matrix transform of a group then leaves its (folded) gains alone.
        norm_biases: folded gain name -> the bias its norm adds after the gain
            (``g ⊙ n(x) + β``); folding divides it by the gain (``β ← β / g``) so that the
            norm's output is the same vector before the readers.
        duals: the places that *read* a group — ``(tensor, axis, segment)``, ``segment``
            indexing :meth:`segments` of that axis (0 for a plain axis) — and so move by
            ``M⁻ᵀ`` where writers move by ``M``: the input columns of the linear maps after
            an invertible or scaling group, and, for a query/key group, the key side
            (``q·k = (M q)·(M⁻ᵀ k)``). Orthogonal maps and permutations ignore it
            (``M⁻ᵀ = M``).

    Raises:
        SpecError: a group is used by no axis, has a non-positive size, is named on an axis
            but not declared, or appears twice on one tensor not listed in ``self_maps``.
    """

    groups: Mapping[str, int]
    axes: Mapping[str, Axes]
    self_maps: frozenset[str] = frozenset()
    blocks: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    repeats: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    heads: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    head_repeats: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    head_sums: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    head_axes: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    segment_head_repeats: Mapping[str, Mapping[int, tuple[int, ...]]] = field(default_factory=dict)
    pinned: frozenset[str] = frozenset()
    rotary: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    copies: Mapping[str, str] = field(default_factory=dict)
    kinds: Mapping[str, str] = field(default_factory=dict)
    folds: Mapping[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)
    norm_biases: Mapping[str, str] = field(default_factory=dict)
    duals: frozenset[tuple[str, int, int]] = frozenset()
    _group_axes: Mapping[str, tuple[tuple[str, int], ...]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not isinstance(self.groups, Mapping) or not isinstance(self.axes, Mapping):
            raise SpecError("groups and axes must be mappings ({group: size}, {param: axes})")
        groups: dict[str, int] = {}
        for g, n in self.groups.items():
            if not isinstance(g, str) or isinstance(n, bool) or not isinstance(n, int):
                raise SpecError(f"group {g!r}: expected a name and an integer size, got {n!r}")
            groups[g] = n
        axes: dict[str, Axes] = {}
        for k, v in self.axes.items():
            if not isinstance(k, str) or not isinstance(v, tuple | list):
                raise SpecError(
                    f"axes[{k!r}] must be a tuple with one group name or None per tensor axis, "
                    f"got {v!r}"
                )
            axes[k] = tuple(_axis_entry(k, g) for g in v)
        self_maps = frozenset(self.self_maps)
        if not self_maps <= set(axes):
            raise SpecError(f"self_maps names unknown parameters {sorted(self_maps - set(axes))}")
        blocks = _per_axis_counts("blocks", self.blocks, axes)
        repeats = _per_axis_counts("repeats", self.repeats, axes)
        for g, n in groups.items():
            if n < 1:
                raise SpecError(f"group {g!r} has size {n}; a group must permute at least 1 unit")
        group_axes: dict[str, list[tuple[str, int]]] = {g: [] for g in groups}
        for name, ax in axes.items():
            seen: dict[str, int] = {}
            for i, entry in enumerate(ax):
                if isinstance(entry, tuple) and repeats.get(name, (1,) * len(ax))[i] > 1:
                    raise SpecError(
                        f"parameter {name!r} axis {i} is a direct sum and has a repeat; write "
                        "the repeated segments into the sum instead"
                    )
                for g in axis_groups(entry):
                    if g not in groups:
                        raise SpecError(
                            f"parameter {name!r} axis {i} names group {g!r}, which is not "
                            f"declared in groups (declared: {sorted(groups)})"
                        )
                    if g in seen and name not in self_maps:
                        raise SpecError(
                            f"parameter {name!r} uses group {g!r} twice (axes {seen[g]} and "
                            f"{i}); a group may act on at most one axis of a tensor unless the "
                            "tensor is declared in self_maps"
                        )
                    seen[g] = i
                    group_axes[g].append((name, i))
        heads = _check_heads(self.heads, groups)
        head_repeats = _per_axis_counts("head_repeats", self.head_repeats, axes)
        for name, counts in head_repeats.items():
            for i, r in enumerate(counts):
                entry = axes[name][i]
                if r > 1 and (not isinstance(entry, str) or entry not in heads):
                    raise SpecError(
                        f"head_repeats[{name!r}] axis {i}: a count > 1 needs a head-structured "
                        f"group on the axis (see heads), got {entry!r}"
                    )
                if r > 1 and repeats.get(name, (1,) * len(counts))[i] > 1:
                    raise SpecError(
                        f"head_repeats[{name!r}] axis {i}: an axis takes a repeat or a head "
                        "repeat, not both"
                    )
        head_sums = _per_axis_counts("head_sums", self.head_sums, axes)
        for name, counts in head_sums.items():
            for i, h in enumerate(counts):
                if h > 1:
                    _check_head_sum(name, i, h, axes[name][i], groups, heads, blocks, repeats)
        head_axes = _check_head_axes(
            self.head_axes, axes, groups, heads, blocks, repeats, head_repeats, head_sums
        )
        segment_head_repeats = _check_segment_head_repeats(
            self.segment_head_repeats, axes, heads, head_sums, head_axes
        )
        pinned = frozenset(self.pinned)
        if not pinned <= set(heads):
            raise SpecError(
                f"pinned names {sorted(pinned - set(heads))}, which are not head-structured "
                "groups (see heads)"
            )
        rotary = _check_rotary(self.rotary, groups, heads, pinned)
        kinds = _check_kinds(self.kinds, groups, heads)
        for g, kind in kinds.items():
            if g in pinned and not _KIND_TABLE[kind].layout:
                raise SpecError(
                    f"group {g!r} is pinned (its heads move whole): it takes no {kind} maps, "
                    "only those of a rotary layout"
                )
            if _KIND_TABLE[kind].layout and g not in rotary:
                raise SpecError(
                    f"group {g!r} is {kind}: its maps follow a rotary layout, which rotary "
                    "does not give for it"
                )
        copies = _check_copies(
            self.copies, groups, heads, group_axes, head_repeats, axes, segment_head_repeats
        )
        for g in copies:
            if g in self.kinds and self.kinds[g] != DEFAULT_KIND:
                raise SpecError(
                    f"group {g!r} is a copies group (query heads inside their key/value group): "
                    "it takes permutations only, not a kind"
                )
        unused = [g for g, lst in group_axes.items() if not lst and g not in copies]
        if unused:
            raise SpecError(f"groups {unused} act on no axis of any parameter")
        object.__setattr__(self, "groups", MappingProxyType(groups))
        object.__setattr__(self, "axes", MappingProxyType(axes))
        object.__setattr__(self, "self_maps", self_maps)
        object.__setattr__(self, "blocks", MappingProxyType(blocks))
        object.__setattr__(self, "repeats", MappingProxyType(repeats))
        object.__setattr__(self, "heads", MappingProxyType(heads))
        object.__setattr__(self, "head_repeats", MappingProxyType(head_repeats))
        object.__setattr__(self, "head_sums", MappingProxyType(head_sums))
        object.__setattr__(self, "head_axes", MappingProxyType(head_axes))
        object.__setattr__(self, "segment_head_repeats", MappingProxyType(segment_head_repeats))
        object.__setattr__(self, "pinned", pinned)
        object.__setattr__(self, "rotary", MappingProxyType(rotary))
        object.__setattr__(self, "copies", MappingProxyType(copies))
        object.__setattr__(self, "kinds", MappingProxyType(kinds))
        object.__setattr__(
            self, "_group_axes", MappingProxyType({g: tuple(v) for g, v in group_axes.items()})
        )
        object.__setattr__(self, "folds", MappingProxyType(_check_folds(self)))
        biases = dict(self.norm_biases)
        for gain, bias in biases.items():
            if gain not in self.folds or self.axes.get(bias) != self.axes[gain]:
                raise SpecError(
                    f"norm_biases[{gain!r}] = {bias!r}: expected a folded gain and a bias on "
                    "the same group"
                )
        object.__setattr__(self, "norm_biases", MappingProxyType(biases))
        object.__setattr__(self, "duals", _check_duals(self))

    def group_axes(self, group: str) -> tuple[tuple[str, int], ...]:
        """The ``(parameter name, axis)`` pairs that ``group`` permutes."""
        try:
            return self._group_axes[group]
        except KeyError:
            raise SpecError(f"unknown group {group!r}; groups are {list(self.groups)}") from None

    def block(self, name: str, axis: int) -> int:
        """The block length of ``name``'s ``axis`` (1 unless declared in ``blocks``)."""
        per_axis = self.blocks.get(name)
        return per_axis[axis] if per_axis is not None else 1

    def repeat(self, name: str, axis: int) -> int:
        """The repeat count of ``name``'s ``axis`` (1 unless declared in ``repeats``)."""
        per_axis = self.repeats.get(name)
        return per_axis[axis] if per_axis is not None else 1

    def head_repeat(self, name: str, axis: int) -> int:
        """The head repeat count of ``name``'s ``axis`` (1 unless declared in
        ``head_repeats``)."""
        per_axis = self.head_repeats.get(name)
        return per_axis[axis] if per_axis is not None else 1

    def head_sum(self, name: str, axis: int) -> int:
        """The number of heads a direct-sum axis is laid out by (1 unless declared in
        ``head_sums``)."""
        per_axis = self.head_sums.get(name)
        return per_axis[axis] if per_axis is not None else 1

    def segment_layout(self, name: str, axis: int, segment: int) -> tuple[int, int]:
        """``(heads, head repeat)`` of segment ``segment`` of a direct-sum axis, for
        :func:`unit_rows` and :func:`block_index`: ``(1, 1)`` unless it is head-repeated
        (``segment_head_repeats``)."""
        counts = self.segment_head_repeats.get(name, {}).get(axis)
        r = counts[segment] if counts is not None else 1
        if r == 1:
            return 1, 1
        part = self.axes[name][axis][segment]  # type: ignore[index]
        return self.heads[part][1], r

    def head_axis(self, name: str, axis: int) -> int | None:
        """The axis holding the heads of the group on ``name``'s ``axis`` where the two read
        as one (see ``head_axes``), else None."""
        pair = self.head_axes.get(name)
        return pair[0] if pair is not None and pair[1] == axis else None

    def head_layout(self, name: str, axis: int) -> tuple[int, int]:
        """``(number of heads, head repeat)`` of ``name``'s ``axis`` for
        :func:`unit_rows` and :func:`block_index`: ``(1, 1)`` where no head repeat applies."""
        r = self.head_repeat(name, axis)
        if r == 1:
            return 1, 1
        entry = self.axes[name][axis]
        assert isinstance(entry, str)
        return self.heads[entry][1], r

    def segments(self, name: str, axis: int) -> tuple[tuple[str | None, int, int], ...]:
        """``(group or None, start, length)`` of each segment of ``name``'s ``axis``, in
        entries along the axis: one segment for a plain axis (None for an axis no group
        acts on: its length is not known here and is reported as 0), one per part of a
        direct sum."""
        entry = self.axes[name][axis]
        block = self.block(name, axis)
        if not isinstance(entry, tuple):
            n = (
                0
                if entry is None
                else self.groups[entry] * block * self.repeat(name, axis)
                * self.head_repeat(name, axis)
            )  # fmt: skip
            return ((entry, 0, n),)
        out, start = [], 0
        for k, part in enumerate(entry):
            if isinstance(part, str):
                length = self.groups[part] * block * self.segment_layout(name, axis, k)[1]
            else:
                length = part
            out.append((part if isinstance(part, str) else None, start, length))
            start += length
        return tuple(out)

    def copies_group(self, name: str, axis: int) -> str | None:
        """The copies group acting on ``name``'s ``axis`` (a head-repeated axis of a tie
        that has one, or a direct sum with such a segment; see ``copies``), else None."""
        if not self.copies:
            return None
        entry = self.axes[name][axis]
        if isinstance(entry, tuple):
            repeated = [
                part for k, part in enumerate(entry) if self.segment_layout(name, axis, k)[1] > 1
            ]
            if not repeated:
                return None
            tie = self.heads[repeated[0]][0]  # type: ignore[index]
        elif self.head_repeat(name, axis) == 1:
            return None
        else:
            assert isinstance(entry, str)
            tie = self.heads[entry][0]
        return next((c for c, t in self.copies.items() if t == tie), None)

    def copies_layout(self, group: str) -> tuple[int, int]:
        """``(h, r)`` of a copies group: its tie's heads and the copies of each."""
        h = self.heads[self.head_ties()[self.copies[group]][0]][1]
        return h, self.groups[group] // h

    def copies_axes(self, group: str) -> tuple[tuple[str, int], ...]:
        """The ``(parameter name, axis)`` pairs a copies group moves: the head-repeated axes
        of its tie's groups."""
        plain = [
            (name, i)
            for name, counts in self.head_repeats.items()
            for i, r in enumerate(counts)
            if r > 1 and self.copies_group(name, i) == group
        ]
        summed = [
            (name, i)
            for name, per_axis in self.segment_head_repeats.items()
            for i in per_axis
            if self.copies_group(name, i) == group
        ]
        return tuple(plain + summed)

    def copies_span(self, name: str, axis: int) -> tuple[int, int] | None:
        """``(start, length)`` of the entries a copies group moves on ``name``'s ``axis``:
        the head-repeated segment of a direct sum; None for a plain axis (all of it)."""
        if not isinstance(self.axes[name][axis], tuple):
            return None
        for k, (_, start, length) in enumerate(self.segments(name, axis)):
            if self.segment_layout(name, axis, k)[1] > 1:
                return start, length
        raise SpecError(f"{name!r} axis {axis} has no head-repeated segment")

    def kind(self, group: str) -> str:
        """The symmetry kind of ``group`` (``"permutation"`` unless declared in ``kinds``)."""
        if group not in self.groups:
            raise SpecError(f"unknown group {group!r}; groups are {list(self.groups)}")
        return self.kinds.get(group, DEFAULT_KIND)

    def kind_counts(self) -> dict[str, int]:
        """How many groups have each kind (kinds that no group has are left out)."""
        out: dict[str, int] = {}
        for g in self.groups:
            out[self.kind(g)] = out.get(self.kind(g), 0) + 1
        return out

    def is_dual(self, name: str, axis: int, segment: int = 0) -> bool:
        """Whether the group on ``name``'s ``axis`` (its ``segment``) moves by ``M⁻ᵀ``
        (see ``duals``)."""
        return (name, axis, segment) in self.duals

    def gain_group(self, name: str) -> str:
        """The group a folded gain ``name`` (a key of ``folds``) lives on."""
        entry = self.axes[name][0]
        assert isinstance(entry, str)
        return entry

    def head_ties(self) -> dict[str, tuple[str, ...]]:
        """``{head permutation name: (its head-structured groups, in spec order)}``."""
        ties: dict[str, list[str]] = {}
        for g in self.groups:
            if g in self.heads:
                ties.setdefault(self.heads[g][0], []).append(g)
        return {t: tuple(gs) for t, gs in ties.items()}

    def update_units(self) -> list[tuple[str, ...]]:
        """The groups a coordinate-descent step must choose together, in spec order: each
        untied group alone, each head permutation's groups as one unit (they share ``π``).
        Copies groups are left out: a method that knows them chooses them in its own step
        (see ``copies``)."""
        ties = self.head_ties()
        units, seen = [], set()
        for g in self.groups:
            if g in self.copies:
                continue
            if g in self.heads:
                tie = self.heads[g][0]
                if tie not in seen:
                    seen.add(tie)
                    units.append(ties[tie])
            else:
                units.append((g,))
        return units

    def restrict(self, names: Collection[str]) -> PermutationSpec:
        """The spec of only these tensors (groups that then act on nothing are dropped)."""
        names = set(names)
        axes = {k: v for k, v in self.axes.items() if k in names}
        used = {g for v in axes.values() for entry in v for g in axis_groups(entry)}
        head_repeats = {k: v for k, v in self.head_repeats.items() if k in names}
        ties_left = {
            self.heads[self.axes[k][i]][0]  # type: ignore[index]
            for k, v in head_repeats.items()
            for i, r in enumerate(v)
            if r > 1
        }
        copies = {c: t for c, t in self.copies.items() if t in ties_left}
        used |= set(copies)
        return PermutationSpec(
            groups={g: n for g, n in self.groups.items() if g in used},
            axes=axes,
            self_maps=self.self_maps & names,
            blocks={k: v for k, v in self.blocks.items() if k in names},
            repeats={k: v for k, v in self.repeats.items() if k in names},
            heads={g: v for g, v in self.heads.items() if g in used},
            head_repeats=head_repeats,
            head_sums={k: v for k, v in self.head_sums.items() if k in names},
            head_axes={k: v for k, v in self.head_axes.items() if k in names},
            segment_head_repeats={k: v for k, v in self.segment_head_repeats.items() if k in names},
            pinned=self.pinned & used,
            rotary={g: v for g, v in self.rotary.items() if g in used},
            copies=copies,
            kinds={g: v for g, v in self.kinds.items() if g in used},
            folds={
                k: kept
                for k, v in self.folds.items()
                if k in names and (kept := tuple(r for r in v if r[0] in names))
            },
            norm_biases={
                k: v
                for k, v in self.norm_biases.items()
                if k in names and v in names and any(r[0] in names for r in self.folds[k])
            },
            duals=frozenset(d for d in self.duals if d[0] in names),
        )

    def to_dict(self) -> dict[str, object]:
        """JSON-ready fields (groups, axes, self maps, blocks, repeats, heads): everything
        that decides what a permutation of this spec does."""
        return {
            "groups": dict(self.groups),
            "axes": {
                k: [list(e) if isinstance(e, tuple) else e for e in v] for k, v in self.axes.items()
            },
            "self_maps": sorted(self.self_maps),
            "blocks": {k: list(v) for k, v in self.blocks.items()},
            "repeats": {k: list(v) for k, v in self.repeats.items()},
            "heads": {g: list(v) for g, v in self.heads.items()},
            **(
                {"head_repeats": {k: list(v) for k, v in self.head_repeats.items()}}
                if self.head_repeats
                else {}
            ),
            **(
                {"head_sums": {k: list(v) for k, v in self.head_sums.items()}}
                if self.head_sums
                else {}
            ),
            **(
                {"head_axes": {k: list(v) for k, v in self.head_axes.items()}}
                if self.head_axes
                else {}
            ),
            **(
                {
                    "segment_head_repeats": {
                        k: {str(a): list(c) for a, c in v.items()}
                        for k, v in self.segment_head_repeats.items()
                    }
                }
                if self.segment_head_repeats
                else {}
            ),
            **({"pinned": sorted(self.pinned)} if self.pinned else {}),
            **({"rotary": {g: list(v) for g, v in self.rotary.items()}} if self.rotary else {}),
            **({"copies": dict(self.copies)} if self.copies else {}),
            **({"kinds": dict(self.kinds)} if self.kinds else {}),
            **(
                {"folds": {k: [list(r) for r in v] for k, v in self.folds.items()}}
                if self.folds
                else {}
            ),
            **({"norm_biases": dict(self.norm_biases)} if self.norm_biases else {}),
            **({"duals": sorted(list(d) for d in self.duals)} if self.duals else {}),
        }

    def validate(self, params: Params, *, what: str = "params") -> None:
        """Check that ``params`` has exactly the spec's tensors with matching shapes.

        Raises:
            SpecError: naming the unknown or missing parameters, or the first tensor whose
                number of axes or axis length disagrees with the spec.
        """
        if not isinstance(params, Mapping):
            hint = " (pass model.state_dict())" if hasattr(params, "state_dict") else ""
            raise SpecError(f"{what} must be a dict of tensors{hint}, got {type(params).__name__}")
        not_tensors = [k for k, t in params.items() if not isinstance(t, Tensor)]
        if not_tensors:
            raise SpecError(f"{what} entries {short_list(not_tensors)} are not tensors")
        missing = [k for k in self.axes if k not in params]
        unknown = [k for k in params if k not in self.axes]
        if missing or unknown:
            parts = []
            if missing:
                parts.append(f"missing parameter(s) {short_list(missing)}")
            if unknown:
                parts.append(f"unknown parameter(s) {short_list(unknown)} not in the spec")
            raise SpecError(f"{what} do not match the permutation spec: " + "; ".join(parts))
        for name, ax in self.axes.items():
            t = params[name]
            if t.ndim != len(ax):
                raise SpecError(
                    f"{what}[{name!r}] has {t.ndim} axes (shape {tuple(t.shape)}) but the spec "
                    f"lists {len(ax)}: {ax}"
                )
            for i, g in enumerate(ax):
                if g is None:
                    continue
                joint = self.head_axis(name, i)
                if joint is not None:
                    heads = self.heads[axis_groups(g)[0]][1]
                    length = sum(seg[2] for seg in self.segments(name, i))
                    if t.shape[joint] != heads or heads * t.shape[i] != length:
                        raise SpecError(
                            f"{what}[{name!r}] axes {joint} and {i} have lengths "
                            f"{t.shape[joint]} and {t.shape[i]}, but read as one they hold "
                            f"{heads} heads (axis {joint}) of {length // heads} entries of "
                            f"{g!r} (axis {i})"
                        )
                    continue
                if isinstance(g, tuple):
                    length = sum(seg[2] for seg in self.segments(name, i))
                    if t.shape[i] != length:
                        raise SpecError(
                            f"{what}[{name!r}] axis {i} has length {t.shape[i]} but its direct "
                            f"sum {g} has {length} entries"
                        )
                    continue
                block, repeat = self.block(name, i), self.repeat(name, i)
                head_repeat = self.head_repeat(name, i)
                if t.shape[i] != repeat * head_repeat * self.groups[g] * block:
                    blocks = f" × block {block}" if block > 1 else ""
                    repeats = f" × repeat {repeat}" if repeat > 1 else ""
                    repeats += f" × head repeat {head_repeat}" if head_repeat > 1 else ""
                    raise SpecError(
                        f"{what}[{name!r}] axis {i} has length {t.shape[i]} but group {g!r} has "
                        f"size {self.groups[g]}{blocks}{repeats}"
                    )

    def log10_num_symmetries(self) -> float:
        """log10 of the number of distinct permutations (exact, by lgamma): ``Σ_g log10(n_g!)``
        for plain groups; a head-structured tie of ``h`` heads counts its head permutation once
        (``h!``) and each member's ``h`` permutations inside its heads (``(d!)^h``; none for a
        pinned group); a copies group of ``h`` heads of ``r`` copies, ``(r!)^h``."""
        total = 0.0
        for members in self.head_ties().values():
            total += math.lgamma(self.heads[members[0]][1] + 1)
        for g, n in self.groups.items():
            if g in self.copies:
                h, r = self.copies_layout(g)
                total += h * math.lgamma(r + 1)
            elif g not in self.heads:
                total += math.lgamma(n + 1)
            elif g not in self.pinned:
                h = self.heads[g][1]
                total += h * math.lgamma(n // h + 1)
        return total / math.log(10)


class Permutation:
    """One index vector per group of a :class:`PermutationSpec`.

    ``perm[group]`` is a 1-D ``LongTensor`` ``p`` with ``aligned[..., i, ...] =
    B[..., p[i], ...]`` (see the module docstring). Instances are immutable in use: methods
    return new objects and never modify their inputs.
    """

    __slots__ = ("_perms", "spec")

    def __init__(self, spec: PermutationSpec, perms: Mapping[str, Tensor]) -> None:
        if set(perms) != set(spec.groups):
            missing = sorted(set(spec.groups) - set(perms))
            extra = sorted(set(perms) - set(spec.groups))
            raise PermutationError(
                f"permutation groups do not match the spec: missing {missing}, unknown {extra}"
            )
        checked: dict[str, Tensor] = {}
        for g, n in spec.groups.items():
            p = torch.as_tensor(perms[g])
            if p.ndim != 1 or p.numel() != n:
                raise PermutationError(
                    f"group {g!r}: expected a 1-D index vector of length {n}, got shape "
                    f"{tuple(p.shape)}"
                )
            if p.dtype.is_floating_point or p.dtype.is_complex or p.dtype == torch.bool:
                raise PermutationError(
                    f"group {g!r}: index vector has dtype {p.dtype}, not integer"
                )
            p = p.to(device="cpu", dtype=torch.long)
            if not torch.equal(torch.sort(p).values, torch.arange(n)):
                raise PermutationError(
                    f"group {g!r}: not a permutation of 0..{n - 1} (repeated or out-of-range "
                    "indices)"
                )
            checked[g] = p
        for tie, members in spec.head_ties().items():
            heads = spec.heads[members[0]][1]
            outers = []
            for g in members:
                parts = split_heads(checked[g], heads)
                if parts is None:
                    raise PermutationError(
                        f"group {g!r} is head-structured ({heads} heads of "
                        f"{spec.groups[g] // heads}) but its index vector moves units between "
                        "heads"
                    )
                if g in spec.pinned and not torch.equal(
                    parts[1], torch.arange(parts[1].shape[1]).expand_as(parts[1])
                ):
                    raise PermutationError(
                        f"group {g!r} is pinned (its heads move whole: rotary dimensions) but "
                        "its index vector permutes inside a head"
                    )
                outers.append((g, parts[0]))
            for g, outer in outers[1:]:
                if not torch.equal(outer, outers[0][1]):
                    raise PermutationError(
                        f"groups {outers[0][0]!r} and {g!r} share the head permutation "
                        f"{tie!r} but permute the heads differently"
                    )
        for c in spec.copies:
            _check_copies_vector(spec, c, checked[c])
        self.spec = spec
        self._perms = MappingProxyType(checked)

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def identity(cls, spec: PermutationSpec) -> Permutation:
        """The permutation that changes nothing (``arange(n)`` per group)."""
        return cls(spec, {g: torch.arange(n) for g, n in spec.groups.items()})

    @classmethod
    def random(
        cls, spec: PermutationSpec, generator: torch.Generator | int | None = None
    ) -> Permutation:
        """A uniformly random permutation per group.

        Args:
            generator: a CPU ``torch.Generator``, an integer seed, or ``None`` (global RNG).
                Groups are drawn in the spec's group order, so a seed fixes the result.
        """
        if isinstance(generator, int):
            generator = torch.Generator().manual_seed(generator)
        return cls(spec, random_index_vectors(spec, generator))

    @classmethod
    def from_dict(cls, data: Mapping[str, list[int]], spec: PermutationSpec) -> Permutation:
        """Inverse of :meth:`to_dict` (validated against ``spec``). A copies group the data
        lacks (a file written before they existed) is the identity: the action it had."""
        if not isinstance(data, Mapping):
            raise PermutationError(
                f"expected a mapping group -> list of ints, got {type(data).__name__}"
            )
        perms = {}
        for g, values in data.items():
            # torch.tensor(dtype=long) would truncate 1.7 to 1 and read True as 1: a file
            # holding anything but integers is not a permutation
            if isinstance(values, str | bytes) or not isinstance(values, list | tuple):
                raise PermutationError(
                    f"group {g!r}: expected a list of integers, got {type(values).__name__}"
                )
            bad = next((v for v in values if isinstance(v, bool) or not isinstance(v, int)), None)
            if bad is not None:
                raise PermutationError(
                    f"group {g!r}: indices must be integers, found {bad!r} ({type(bad).__name__})"
                )
            if any(not -(2**63) <= v < 2**63 for v in values):
                raise PermutationError(f"group {g!r}: an index is out of range")
            perms[g] = torch.tensor(list(values), dtype=torch.long)
        for c in spec.copies:  # written before copies groups existed: the same action
            if c not in perms:
                perms[c] = torch.arange(spec.groups[c])
        return cls(spec, perms)

    # -- access ----------------------------------------------------------------------------
    def __getitem__(self, group: str) -> Tensor:
        return self._perms[group]

    def __iter__(self):
        return iter(self._perms)

    def __len__(self) -> int:
        return len(self._perms)

    def items(self):
        """``(group, index vector)`` pairs."""
        return self._perms.items()

    def to_dict(self) -> dict[str, list[int]]:
        """JSON-ready ``{group: [indices]}``."""
        return {g: p.tolist() for g, p in self._perms.items()}

    def replace(self, **groups: Tensor) -> Permutation:
        """A copy with the given groups' index vectors replaced."""
        return Permutation(self.spec, {**self._perms, **groups})

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Permutation):
            return NotImplemented
        return set(self._perms) == set(other._perms) and all(
            torch.equal(p, other._perms[g]) for g, p in self._perms.items()
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        sizes = ", ".join(f"{g}:{p.numel()}" for g, p in self._perms.items())
        return f"Permutation({sizes})"

    def is_identity(self) -> bool:
        """Whether every group's index vector is ``arange(n)``."""
        return all(torch.equal(p, torch.arange(p.numel())) for p in self._perms.values())

    # -- algebra ---------------------------------------------------------------------------
    def inverse(self) -> Permutation:
        """The permutation ``q`` with ``q.apply(self.apply(x)) == x``."""
        out = {g: torch.argsort(p) for g, p in self._perms.items() if g not in self.spec.copies}
        for c, tie in self.spec.copies.items():
            out[c] = invert_copies(self.spec, c, self._perms[c], tie_outer(self.spec, tie, self))
        return Permutation(self.spec, out)

    def compose(self, inner: Permutation) -> Permutation:
        """``self ∘ inner``: applying the result equals ``self.apply(inner.apply(x))``.

        With ``inner.apply(x)[j] = x[q[j]]`` and ``self.apply(y)[i] = y[p[i]]`` the composed
        index vector is ``q[p]`` (a copies group composes by :func:`compose_copies`).
        """
        if inner.spec.groups != self.spec.groups:
            raise PermutationError("cannot compose permutations of different specs")
        out = {g: inner._perms[g][p] for g, p in self._perms.items() if g not in self.spec.copies}
        for c, tie in self.spec.copies.items():
            out[c] = compose_copies(
                self.spec, c, self._perms[c], inner._perms[c], tie_outer(self.spec, tie, inner)
            )
        return Permutation(self.spec, out)

    # -- action on parameters --------------------------------------------------------------
    def distance(self, reference: Params, params: Params) -> float:
        """``params_distance(reference, self.apply(params))`` — the L2 distance over the
        floating tensors — one permuted tensor at a time instead of a permuted copy of
        ``params`` (at a billion parameters, a copy is gigabytes)."""
        from lmckit.params import check_params_compatible, floating_names, squared_distance

        check_params_compatible(reference, params)
        total = 0.0
        for name in floating_names(reference):
            t = permute_tensor(params[name], self.spec, name, self._perms)
            total += squared_distance(reference[name], t)
        return math.sqrt(total)

    def apply(self, params: Params) -> dict[str, Tensor]:
        """Permute every tensor of ``params`` (validated against the spec).

        Returns a new dict of new tensors; the inputs are left untouched.
        """
        self.spec.validate(params)
        out: dict[str, Tensor] = {}
        for name, t in params.items():
            moved = permute_tensor(t, self.spec, name, self._perms)
            out[name] = moved if moved is not t else t.clone()
        return out


def split_heads(index: Tensor, heads: int) -> tuple[Tensor, Tensor] | None:
    """A head-structured index vector ``p[i·d + s] = π(i)·d + σ_i(s)`` as ``(π, σ)`` —
    ``π`` of shape ``(heads,)``, ``σ`` of shape ``(heads, d)`` — or None if ``p`` moves a
    unit out of its head's block."""
    d = index.numel() // heads
    rows = index.view(heads, d)
    outer = rows[:, 0] // d
    if not torch.equal(rows // d, outer[:, None].expand_as(rows)):
        return None
    return outer, rows - outer[:, None] * d


def join_heads(outer: Tensor, inner: Tensor) -> Tensor:
    """Inverse of :func:`split_heads`: ``p[i·d + s] = outer[i]·d + inner[i, s]``."""
    d = inner.shape[1]
    return (outer[:, None] * d + inner).reshape(-1)


def random_index_vectors(
    spec: PermutationSpec, generator: torch.Generator | None = None, *, moving: bool = False
) -> dict[str, Tensor]:
    """One uniformly random index vector per group, drawn in the spec's group order (a
    head-structured group: its ties' head permutation once, then one permutation per head).
    ``moving=True`` redraws every part of size > 1 that came out as the identity."""

    def draw(n: int) -> Tensor:
        p = torch.randperm(n, generator=generator)
        while moving and n > 1 and torch.equal(p, torch.arange(n)):
            p = torch.randperm(n, generator=generator)
        return p

    outers: dict[str, Tensor] = {}
    out: dict[str, Tensor] = {}
    for g, n in spec.groups.items():
        if g in spec.copies:
            h, r = spec.copies_layout(g)
            out[g] = torch.cat([j * r + draw(r) for j in range(h)])
            continue
        if g not in spec.heads:
            out[g] = draw(n)
            continue
        tie, heads = spec.heads[g]
        if tie not in outers:
            outers[tie] = draw(heads)
        if g in spec.pinned:
            inner = torch.arange(n // heads).expand(heads, n // heads)
        else:
            inner = torch.stack([draw(n // heads) for _ in range(heads)])
        out[g] = join_heads(outers[tie], inner)
    return out


def _check_copies(
    given, groups, heads, group_axes, head_repeats, axes, segment_head_repeats=None
) -> dict[str, str]:
    """Validate ``copies``: a declared group per head tie with head repeats, acting on no
    axis, of ``h·r`` units for the tie's ``h`` heads and its one head repeat ``r``."""
    if not isinstance(given, Mapping):
        raise SpecError(
            f"copies must map a copies group to its head permutation, got {type(given).__name__}"
        )
    out: dict[str, str] = {}
    ties = {t for t, _ in heads.values()}
    for c, tie in given.items():
        if c not in groups:
            raise SpecError(f"copies names group {c!r}, which is not declared in groups")
        if tie not in ties:
            raise SpecError(
                f"copies[{c!r}] = {tie!r}, which is no head permutation of heads "
                f"(head permutations: {sorted(ties)})"
            )
        if c in heads:
            raise SpecError(
                f"copies group {c!r} is also head-structured: it is indexed by its tie's heads, "
                "not a member of the tie"
            )
        if group_axes[c]:
            raise SpecError(
                f"copies group {c!r} acts on axes {list(group_axes[c])[:3]}: it acts through its "
                "tie's head-repeated axes only"
            )
        if tie in out.values():
            raise SpecError(f"head permutation {tie!r} has two copies groups")
        h = next(n for t, n in heads.values() if t == tie)
        counts = {
            r
            for name, per_axis in head_repeats.items()
            for i, r in enumerate(per_axis)
            if r > 1 and heads[axes[name][i]][0] == tie
        } | {
            r
            for name, per_axis in (segment_head_repeats or {}).items()
            for i, per_segment in per_axis.items()
            for part, r in zip(axes[name][i], per_segment, strict=True)
            if r > 1 and heads[part][0] == tie
        }
        if len(counts) != 1:
            raise SpecError(
                f"copies group {c!r}: its tie {tie!r} needs exactly one head repeat on its axes, "
                f"found {sorted(counts) or 'none'}"
            )
        r = counts.pop()
        if groups[c] != h * r:
            raise SpecError(
                f"copies group {c!r} has {groups[c]} units; its tie's {h} heads of {r} copies "
                f"need {h * r}"
            )
        out[c] = tie
    return out


def _check_copies_vector(spec: PermutationSpec, group: str, index: Tensor) -> None:
    h, r = spec.copies_layout(group)
    if not torch.equal(index.view(h, r) // r, torch.arange(h)[:, None].expand(h, r)):
        raise PermutationError(
            f"copies group {group!r} ({h} heads of {r} query heads) moves a query head to "
            "another key/value head: only the query heads sharing one key/value head may "
            "be permuted among themselves"
        )


def tie_outer(spec: PermutationSpec, tie: str, maps: Mapping[str, Tensor] | Permutation) -> Tensor:
    """The head permutation ``π`` of ``tie`` read from ``maps`` (index vectors, or
    block-permutation matrices of a transform): ``(h,)``."""
    member = spec.head_ties()[tie][0]
    heads = spec.heads[member][1]
    m = maps[member]
    if m.ndim == 1:
        parts = split_heads(m, heads)
        assert parts is not None
        return parts[0]
    n, d = m.shape[0], m.shape[0] // heads
    norms = m.detach().reshape(heads, d, heads, d).abs().sum((1, 3))
    assert n == heads * d
    return norms.argmax(1)


def invert_copies(spec: PermutationSpec, group: str, copies: Tensor, outer: Tensor) -> Tensor:
    """The copies vector of the inverse of an element whose tie moves heads by ``outer``
    (``π``): ``ρ'_i = ρ_π(i)⁻¹`` (see ``PermutationSpec.copies``)."""
    h, r = spec.copies_layout(group)
    rho = copies.view(h, r) % r
    inv = torch.argsort(rho[outer.to(copies.device)], dim=1)
    return (torch.arange(h, device=copies.device)[:, None] * r + inv).reshape(-1)


def compose_copies(
    spec: PermutationSpec, group: str, outer: Tensor, inner: Tensor, inner_heads: Tensor
) -> Tensor:
    """The copies vector of ``outer ∘ inner`` (apply ``inner`` first), whose tie moves
    heads by ``inner_heads`` (``π'``): ``ρ''_k = ρ'_k ∘ ρ_π'⁻¹(k)``."""
    h, r = spec.copies_layout(group)
    rho_out, rho_in = outer.view(h, r) % r, inner.view(h, r) % r
    back = torch.argsort(inner_heads.to(outer.device))
    composed = torch.gather(rho_in, 1, rho_out[back])
    return (torch.arange(h, device=outer.device)[:, None] * r + composed).reshape(-1)


def copies_axis_index(spec: PermutationSpec, name: str, axis: int, copies: Tensor) -> Tensor:
    """The index along ``name``'s head-repeated ``axis`` that moves its copies as the copies
    vector says and nothing else: ``(j, t, s) ← (j, ρ_j(t), s)``, blocks expanded; on a
    direct sum, its head-repeated segment so and every other entry in place."""
    entry = spec.axes[name][axis]
    if isinstance(entry, tuple):
        segments = spec.segments(name, axis)
        index = torch.arange(sum(length for *_, length in segments), device=copies.device)
        for k, (g, start, length) in enumerate(segments):
            h, r = spec.segment_layout(name, axis, k)
            if r > 1 and g is not None:
                moved = _copies_index(copies, spec.groups[g], h, r, spec.block(name, axis))
                index[start : start + length] = start + moved
        return index
    assert isinstance(entry, str)
    h, r = spec.head_layout(name, axis)
    return _copies_index(copies, spec.groups[entry], h, r, spec.block(name, axis))


def _copies_index(copies: Tensor, n: int, h: int, r: int, block: int) -> Tensor:
    """The copies vector's move of ``h`` heads of ``n / h`` units laid out ``r`` times."""
    d = n // h
    index = (copies.view(h * r, 1) * d + torch.arange(d, device=copies.device)).reshape(-1)
    return block_index(index, block)


def copies_gains(
    spec: PermutationSpec,
    params_a: Params,
    params_b: Params,
    perm: Permutation | Mapping[str, Tensor],
    group: str,
    *,
    names: Collection[str] | None = None,
    moved_b: Callable[[str], Tensor] | None = None,
) -> Tensor:
    """The weight-matching gains of a copies group, every other group held at ``perm``:
    ``G[j, t, u] = ⟨A's copy t of the head B's head j is moved to, B's copy u of head j⟩``
    summed over the group's axes (B with every other group applied), an ``(h, r, r)``
    float64 tensor indexed by B's heads: maximising ``Σ_j Σ_t G[j, t, ρ_j(t)]`` gives the
    best copies (see :func:`solve_copies`).

    Args:
        perm: the other groups' index vectors — or, with ``moved_b``, any maps from which
            :func:`tie_outer` reads the head permutation (a transform's).
        moved_b: tensor name -> B's tensor moved by every group but the copies (default:
            by ``perm``'s index vectors).
    """
    h, r = spec.copies_layout(group)
    outer = tie_outer(spec, spec.copies[group], perm).cpu()
    others = {g: p for g, p in perm.items() if g not in spec.copies}
    gains = torch.zeros(h, r, r, dtype=torch.float64)
    for name, axis in spec.copies_axes(group):
        if names is not None and name not in names:
            continue
        b = permute_tensor(params_b[name], spec, name, others) if moved_b is None else moved_b(name)
        a = params_a[name]
        span = spec.copies_span(name, axis)
        if span is not None:  # a direct sum: its head-repeated segment
            a, b = a.narrow(axis, *span), b.narrow(axis, *span)
        shape = (h, r, -1)  # a head-repeated axis: (head, copy, dimension) unit-major
        a3 = a.movedim(axis, 0).reshape(shape).to(torch.float64)
        b3 = b.movedim(axis, 0).reshape(shape).to(torch.float64)
        gains += torch.einsum("htx,hux->htu", a3, b3).cpu()
    out = torch.empty_like(gains)
    out[outer] = gains
    return out


def copies_gains_of_units(
    spec: PermutationSpec,
    group: str,
    name: str,
    axis: int,
    unit_gains: Tensor,
    perm: Permutation | Mapping[str, Tensor],
) -> Tensor:
    """:func:`copies_gains` from gains between single entries: ``unit_gains[k, l]`` scores
    A's entry ``k`` of ``name``'s head-repeated ``axis`` against B's entry ``l`` (the
    correlation of two activations laid out as that axis, for activation matching). B's
    entries are moved by every group of ``perm`` but the copies; ``G[j, t, u]`` sums the
    scores of A's copy ``t`` and B's copy ``u`` of head ``j`` dimension by dimension. An
    ``(h, r, r)`` float64 tensor indexed by B's heads, as :func:`copies_gains` gives."""
    h, r = spec.copies_layout(group)
    others = {g: p for g, p in perm.items() if g not in spec.copies}
    index = axis_index(spec, name, axis, others)
    scores = unit_gains.to(torch.float64)
    if index is not None:
        scores = scores[:, index.to(scores.device)]
    span = spec.copies_span(name, axis)
    if span is not None:  # a direct sum: its head-repeated segment
        start, length = span
        scores = scores[start : start + length, start : start + length]
    d = scores.shape[0] // (h * r)
    same_head = scores.reshape(h, r, d, h, r, d).diagonal(dim1=0, dim2=3)  # (r, d, r, d, h)
    same_dim = same_head.diagonal(dim1=1, dim2=3)  # (r, r, h, d)
    gains = same_dim.sum(-1).permute(2, 0, 1).cpu()  # (h, r, r)
    out = torch.empty_like(gains)
    out[tie_outer(spec, spec.copies[group], perm).cpu()] = gains
    return out


def copies_value(gains: Tensor, copies: Tensor) -> float:
    """``Σ_j Σ_t gains[j, t, ρ_j(t)]`` of a copies vector, for :func:`copies_gains`' gains:
    the objective up to a constant that the copies do not change."""
    h, r, _ = gains.shape
    picked = copies.cpu().view(h, r) % r
    return float(gains[torch.arange(h)[:, None], torch.arange(r)[None, :], picked].sum())


def solve_copies(gains: Tensor) -> Tensor:
    """The copies vector maximising ``Σ_j Σ_t gains[j, t, ρ_j(t)]`` (one exact linear
    assignment per head): ``c[j·r + t] = j·r + ρ_j(t)``."""
    from lmckit.lap import assign

    h, r, _ = gains.shape
    rows = [assign(gains[j]) for j in range(h)]
    return torch.cat([j * r + torch.as_tensor(p, dtype=torch.long) for j, p in enumerate(rows)])


def _check_rotary(given, groups, heads, pinned) -> dict[str, tuple[str, int]]:
    """Validate ``rotary``: pinned groups, a known style, an even count of rotated
    dimensions within the head."""
    out: dict[str, tuple[str, int]] = {}
    for g, entry in dict(given).items():
        if g not in pinned:
            raise SpecError(f"rotary names {g!r}, which is not a pinned head-structured group")
        d = groups[g] // heads[g][1]
        if (
            not isinstance(entry, tuple | list)
            or len(entry) != 2
            or entry[0] not in ROTARY_STYLES
            or isinstance(entry[1], bool)
            or not isinstance(entry[1], int)
            or entry[1] < 2
            or entry[1] % 2
            or entry[1] > d
        ):
            raise SpecError(
                f"rotary[{g!r}] must be (one of {ROTARY_STYLES}, an even number of rotated "
                f"dimensions in 2..{d}), got {entry!r}"
            )
        out[g] = (str(entry[0]), int(entry[1]))
    return out


def _check_heads(given, groups: Mapping[str, int]) -> dict[str, tuple[str, int]]:
    """Validate ``heads``: declared groups, a positive head count dividing the group size,
    one head count per head permutation."""
    out: dict[str, tuple[str, int]] = {}
    counts: dict[str, int] = {}
    for g, entry in dict(given).items():
        if g not in groups:
            raise SpecError(f"heads names group {g!r}, which is not declared in groups")
        if (
            not isinstance(entry, tuple | list)
            or len(entry) != 2
            or not isinstance(entry[0], str)
            or isinstance(entry[1], bool)
            or not isinstance(entry[1], int)
        ):
            raise SpecError(
                f"heads[{g!r}] must be (head permutation name, number of heads), got {entry!r}"
            )
        tie, h = entry[0], int(entry[1])
        if h < 1 or groups[g] % h:
            raise SpecError(f"heads[{g!r}]: {h} heads do not divide the group's {groups[g]} units")
        if counts.setdefault(tie, h) != h:
            raise SpecError(
                f"head permutation {tie!r} is given {counts[tie]} heads by one group and {h} "
                f"by {g!r}"
            )
        out[g] = (tie, h)
    return out


KINDS = tuple(_KIND_TABLE)
DEFAULT_KIND = KINDS[0]  # "permutation": every group has it
"""The names of the symmetry kinds a group of a :class:`PermutationSpec` can have (see its
``kinds``; each kind's row: :data:`lmckit.kinds.KINDS`)."""


def _check_kinds(given, groups: Mapping[str, int], heads) -> dict[str, str]:
    """Validate ``kinds``: declared groups, known kinds; entries saying ``"permutation"``
    are dropped (the default)."""
    out: dict[str, str] = {}
    for g, kind in dict(given).items():
        if g not in groups:
            raise SpecError(f"kinds names group {g!r}, which is not declared in groups")
        if kind not in KINDS:
            raise SpecError(f"kinds[{g!r}] = {kind!r}; a kind is one of {', '.join(KINDS)}")
        row = _KIND_TABLE[kind]
        if g in heads and not row.per_head:
            per_head = ", ".join(k for k, r in _KIND_TABLE.items() if r.per_head)
            raise SpecError(
                f"kinds[{g!r}]: a head-structured group cannot be {kind!r} (that is "
                f"{row.where}); a head's dimensions are {per_head}"
            )
        if row.matrix:
            out[g] = kind
    return out


def _check_duals(spec: PermutationSpec) -> frozenset[tuple[str, int, int]]:
    """Validate ``duals``: each a ``(tensor, axis, segment)`` whose segment carries a
    group."""
    out = set()
    for entry in spec.duals:
        if not isinstance(entry, tuple | list) or len(entry) != 3:
            raise SpecError(f"duals must hold (tensor, axis, segment) triples, got {entry!r}")
        name, axis, segment = entry
        ax = spec.axes.get(name)
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (axis, segment))
        if ax is None or not ints or not 0 <= axis < len(ax) or ax[axis] is None:
            raise SpecError(f"duals entry {tuple(entry)!r}: no group acts on that tensor axis")
        segments = spec.segments(name, axis)
        if not 0 <= segment < len(segments) or segments[segment][0] is None:
            raise SpecError(
                f"duals entry {tuple(entry)!r}: segment {segment} of that axis is not a group's"
            )
        out.add((name, axis, segment))
    return frozenset(out)


def _check_folds(spec: PermutationSpec) -> dict[str, tuple[tuple[str, int], ...]]:
    """Validate ``folds``: each gain is a 1-D tensor of one group, each reader a tensor
    whose named axis carries that group."""
    out: dict[str, tuple[tuple[str, int], ...]] = {}
    for gain, readers in dict(spec.folds).items():
        ax = spec.axes.get(gain)
        if ax is None or len(ax) != 1 or not isinstance(ax[0], str):
            raise SpecError(f"folds names {gain!r}, which is not a 1-D tensor of one group in axes")
        group = ax[0]
        pairs: list[tuple[str, int]] = []
        for reader in readers:
            if not isinstance(reader, tuple | list) or len(reader) != 2:
                raise SpecError(f"folds[{gain!r}] must list (tensor, axis) pairs, got {reader!r}")
            name, axis = reader[0], reader[1]
            rax = spec.axes.get(name)
            if (
                rax is None
                or isinstance(axis, bool)
                or not isinstance(axis, int)
                or not 0 <= axis < len(rax)
                or group not in axis_groups(rax[axis])
            ):
                raise SpecError(
                    f"folds[{gain!r}]: reader {name!r} axis {axis} does not carry the gain's "
                    f"group {group!r}"
                )
            pairs.append((name, axis))
        if not pairs:
            raise SpecError(f"folds[{gain!r}] lists no reader")
        out[gain] = tuple(pairs)
    return out


def _axis_entry(name: str, entry) -> AxisEntry:
    """One validated entry of ``axes`` (a direct sum as a tuple)."""
    if entry is None or isinstance(entry, str):
        return entry
    if isinstance(entry, tuple | list):
        parts = tuple(entry)
        fixed_ok = all(
            isinstance(p, str) or (isinstance(p, int) and not isinstance(p, bool) and p >= 1)
            for p in parts
        )
        if len(parts) >= 2 and fixed_ok and any(isinstance(p, str) for p in parts):
            return parts
        raise SpecError(
            f"axes[{name!r}]: a direct sum must list at least two segments — group names, or "
            f"positive lengths of fixed segments — with at least one group, got {entry!r}"
        )
    raise SpecError(f"axes[{name!r}] holds something other than group names: {entry!r}")


def axis_groups(entry: AxisEntry) -> tuple[str, ...]:
    """The groups acting on an axis with this ``axes`` entry (each once, in order)."""
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    return tuple(dict.fromkeys(p for p in entry if isinstance(p, str)))


def axis_index(
    spec: PermutationSpec, name: str, axis: int, perms: Mapping[str, Tensor] | Permutation
) -> Tensor | None:
    """The index vector that permutes ``name``'s ``axis`` as ``perms`` say
    (``aligned = t.index_select(axis, index)``), or None where no group acts on it. A
    direct sum moves each segment by its group and leaves fixed segments where they are; a
    head-repeated axis takes its copies group's move first when ``perms`` holds it. For an
    axis read with its heads' axis as one (``PermutationSpec.head_axes``) the vector indexes
    that joint axis (``h·len`` entries): :func:`permute_spec_axis` applies it."""
    entry = spec.axes[name][axis]
    if entry is None:
        return None
    if isinstance(entry, str):
        heads, head_repeat = spec.head_layout(name, axis)
        index = block_index(
            perms[entry], spec.block(name, axis), spec.repeat(name, axis), heads, head_repeat
        )
        copies = spec.copies_group(name, axis)
        if copies is not None and copies in perms:  # the copies move first, on B's heads
            index = copies_axis_index(spec, name, axis, perms[copies].to(index.device))[index]
        return index
    block = spec.block(name, axis)
    device = perms[axis_groups(entry)[0]].device
    pieces = [
        torch.arange(start, start + length, device=device)
        if g is None
        else start + block_index(perms[g], block, 1, *spec.segment_layout(name, axis, k))
        for k, (g, start, length) in enumerate(spec.segments(name, axis))
    ]
    index = torch.cat(pieces)
    copies = spec.copies_group(name, axis)
    if copies is not None and copies in perms:  # the copies move first, on B's heads
        index = copies_axis_index(spec, name, axis, perms[copies].to(index.device))[index]
    order = head_sum_order(spec, name, axis)
    if order is None:
        return index
    # laid out head by head: the segment-by-segment move, read through the reordering
    order = order.to(device)
    return order[index[torch.argsort(order)]]


def permute_spec_axis(
    t: Tensor,
    spec: PermutationSpec,
    name: str,
    axis: int,
    perms: Mapping[str, Tensor] | Permutation,
) -> Tensor:
    """``t`` (the tensor ``name``) with ``axis`` permuted as ``perms`` say; ``t`` itself
    where no group acts on that axis."""
    index = axis_index(spec, name, axis, perms)
    if index is None:
        return t
    joint = spec.head_axis(name, axis)
    if joint is None:
        return t.index_select(axis, index.to(t.device))
    flat = joint_flat(t, joint, axis).index_select(0, index.to(t.device))
    return joint_unflat(flat, joint, axis, tuple(t.shape))


def permute_tensor(
    t: Tensor, spec: PermutationSpec, name: str, perms: Mapping[str, Tensor] | Permutation
) -> Tensor:
    """``t`` (the tensor ``name``) with every axis permuted as ``perms`` say; ``t`` itself
    where no group acts on it."""
    for axis in range(t.ndim):
        t = permute_spec_axis(t, spec, name, axis, perms)
    return t


def group_rows(
    spec: PermutationSpec,
    name: str,
    axis: int,
    group: str,
    t: Tensor,
    position: int | None = None,
) -> Tensor:
    """:func:`unit_rows` of ``group`` on the tensor ``name``: an ``(n, -1)`` matrix whose
    row ``u`` holds every entry unit ``u`` carries — its blocks, its segments of a direct
    sum side by side, across the other axes. ``t`` has ``name``'s axis ``axis`` at
    ``position`` (default ``axis``), its other axes in any layout shared by the two
    tensors compared."""
    position = axis if position is None else position
    n = spec.groups[group]
    joint = spec.head_axis(name, axis)
    if joint is not None:  # the heads' axis and this one, read as one (at position 0)
        order = [i for i in range(t.ndim) if i != axis]
        order.insert(position, axis)
        t, position = joint_flat(t, order.index(joint), position), 0
    if not isinstance(spec.axes[name][axis], tuple):
        return unit_rows(t, position, n, spec.repeat(name, axis), *spec.head_layout(name, axis))
    order = head_sum_order(spec, name, axis)
    if order is not None:  # laid out head by head: read segment by segment
        t = t.index_select(position, order.to(t.device))
    parts = [
        unit_rows(
            t.narrow(position, start, length),
            position,
            n,
            1,
            *spec.segment_layout(name, axis, k),
        )
        for k, (g, start, length) in enumerate(spec.segments(name, axis))
        if g == group
    ]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def put_group_rows(
    spec: PermutationSpec, name: str, axis: int, group: str, t: Tensor, rows: Tensor
) -> Tensor:
    """Inverse of :func:`group_rows`: ``t`` with the entries of ``group`` on ``axis``
    replaced by ``rows`` (``(n, -1)``, laid out as :func:`group_rows` gives them). Out of
    place and differentiable."""
    joint = spec.head_axis(name, axis)
    if joint is not None:  # the heads' axis and this one, written as one
        flat = joint_flat(t, joint, axis)
        out = _put_rows(spec, name, axis, group, flat, 0, rows)
        return joint_unflat(out, joint, axis, tuple(t.shape))
    return _put_rows(spec, name, axis, group, t, axis, rows)


def _put_rows(
    spec: PermutationSpec, name: str, axis: int, group: str, t: Tensor, dim: int, rows: Tensor
) -> Tensor:
    """:func:`put_group_rows` on ``t``, whose dimension ``dim`` is ``name``'s ``axis``."""
    if not isinstance(spec.axes[name][axis], tuple):
        return from_unit_rows(
            rows, dim, tuple(t.shape), spec.repeat(name, axis), *spec.head_layout(name, axis)
        )
    order = head_sum_order(spec, name, axis)
    if order is not None:  # laid out head by head: written segment by segment
        order = order.to(t.device)
        t = t.index_select(dim, order)
    pieces, used = [], 0
    for k, (g, start, length) in enumerate(spec.segments(name, axis)):
        piece = t.narrow(dim, start, length)
        if g == group:
            width = piece.numel() // rows.shape[0]
            layout = spec.segment_layout(name, axis, k)
            piece = from_unit_rows(
                rows[:, used : used + width], dim, tuple(piece.shape), 1, *layout
            )
            used += width
        pieces.append(piece)
    out = torch.cat(pieces, dim=dim)
    return out if order is None else out.index_select(dim, torch.argsort(order))


def shared_inside_heads(spec: PermutationSpec) -> PermutationSpec | None:
    """The subgroup of ``spec`` in which every group whose heads lie on another axis
    (``head_axes``: a mixture's hidden units, its experts the heads) moves the units inside
    every head by one permutation shared by all heads — a plain group of ``d`` units on the
    dimensions' axis, the heads' axis moved by the tie's head permutation as a plain group
    of ``h`` units; None where ``spec`` has no such group. A coarse problem: weight
    matching solves it first (:func:`lift_shared`)."""
    if not spec.head_axes:
        return None
    inner = {g for name, (_, b) in spec.head_axes.items() for g in axis_groups(spec.axes[name][b])}
    ties = {spec.heads[g][0]: spec.heads[g][1] for g in inner}
    groups = dict(spec.groups)
    for g in inner:
        groups[g] //= spec.heads[g][1]
    groups.update(ties)
    axes = dict(spec.axes)
    for name, (a, b) in spec.head_axes.items():
        tie = spec.heads[axis_groups(spec.axes[name][b])[0]][0]
        axes[name] = tuple(tie if i == a else e for i, e in enumerate(axes[name]))
    heads = {g: v for g, v in spec.heads.items() if g not in inner}
    for tie in ties:  # a tie left with its head permutation alone is a plain group
        if [g for g, (t, _) in heads.items() if t == tie] == [tie]:
            del heads[tie]
    return replace(
        spec,
        groups=groups,
        axes=axes,
        heads=heads,
        head_axes={},
        kinds={g: k for g, k in spec.kinds.items() if g not in inner and g not in ties},
    )


def lift_shared(
    spec: PermutationSpec, shared: PermutationSpec, perm: Mapping[str, Tensor]
) -> Permutation:
    """An element of ``shared`` (:func:`shared_inside_heads` of ``spec``) as the element of
    ``spec`` it is: a group inside heads takes ``p[i·d + s] = π(i)·d + σ(s)``, ``π`` its
    tie's head permutation, ``σ`` its shared one."""
    out = {g: perm[g] for g in spec.groups if g in shared.groups}
    for g in spec.groups:
        if g in spec.heads and shared.groups[g] != spec.groups[g]:
            tie, _ = spec.heads[g]
            d = shared.groups[g]
            out[g] = (perm[tie][:, None] * d + perm[g][None, :].to(perm[tie].device)).reshape(-1)
    return Permutation(spec, out)


def coarsen_shared(
    spec: PermutationSpec, shared: PermutationSpec, perm: Mapping[str, Tensor]
) -> Permutation | None:
    """``perm`` (of ``spec``) as an element of ``shared``, or None where it moves the units
    of two heads of a group inside heads differently (it is not in the subgroup)."""
    out = {g: perm[g] for g in shared.groups if g in spec.groups and g not in shared.heads}
    out.update({g: perm[g] for g in shared.groups if g in shared.heads})
    for g in spec.groups:
        if g in spec.heads and shared.groups[g] != spec.groups[g]:
            tie, h = spec.heads[g]
            d = shared.groups[g]
            inside = perm[g].view(h, d) % d
            if not bool((inside == inside[:1]).all()):
                return None
            out[g] = inside[0].clone()
            out[tie] = torch.div(perm[g].view(h, d)[:, 0], d, rounding_mode="floor")
    return Permutation(shared, out)


def joint_flat(t: Tensor, heads_axis: int, axis: int) -> Tensor:
    """``t`` with ``heads_axis`` and ``axis`` read as one axis, first, ``heads_axis``-major
    (``PermutationSpec.head_axes``); the other axes follow in order."""
    moved = t.movedim((heads_axis, axis), (0, 1))
    return moved.reshape(moved.shape[0] * moved.shape[1], *moved.shape[2:])


def joint_unflat(flat: Tensor, heads_axis: int, axis: int, shape: tuple[int, ...]) -> Tensor:
    """Inverse of :func:`joint_flat` for a tensor of ``shape``."""
    pair = flat.unflatten(0, (shape[heads_axis], shape[axis]))
    return pair.movedim((0, 1), (heads_axis, axis))


def head_sum_order(spec: PermutationSpec, name: str, axis: int) -> Tensor | None:
    """For an axis laid out head by head (``PermutationSpec.head_sums``): the order ``o``
    with ``t.index_select(axis, o)`` the same entries laid out segment by segment, as a
    plain direct sum (segment ``k`` of ``n_k`` units: head ``i``'s ``n_k / h`` of them at
    ``i·W + offset_k`` in the head-by-head layout, ``W`` a head's width); None for any
    other axis."""
    h = spec.head_sum(name, axis)
    entry = spec.axes[name][axis]
    if h == 1 and isinstance(entry, tuple) and spec.head_axis(name, axis) is not None:
        h = spec.heads[_segment_groups(entry)[0]][1]  # a joint axis: laid out expert by expert
    if h == 1:
        return None
    widths = [spec.groups[g] // h for g in _segment_groups(entry)]
    width = sum(widths)
    pieces, offset = [], 0
    for w in widths:
        heads = torch.arange(h)[:, None] * width
        pieces.append((heads + offset + torch.arange(w)[None, :]).reshape(-1))
        offset += w
    return torch.cat(pieces)


def _segment_groups(entry: AxisEntry) -> tuple[str, ...]:
    """The groups of a direct-sum entry's segments in order, repeats kept (``("qk", "qk",
    "vo")``); for a plain entry its group."""
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(p for p in entry if isinstance(p, str))


def _check_head_sum(name, axis, h, entry, groups, heads, blocks, repeats) -> None:
    """A head-by-head direct sum: a direct sum of group segments only, each group
    head-structured with ``h`` heads in one tie, on an axis with no block or repeat."""
    where = f"head_sums[{name!r}] axis {axis}"
    if not isinstance(entry, tuple) or not all(isinstance(p, str) for p in entry):
        raise SpecError(
            f"{where}: a count > 1 needs a direct sum of groups alone (no fixed segments), "
            f"got {entry!r}"
        )
    found = [heads.get(g) for g in entry]
    if any(f is None or f[1] != h for f in found) or len({f[0] for f in found}) != 1:
        raise SpecError(
            f"{where}: every segment must be a head-structured group of one tie with {h} "
            f"heads (see heads), got {[(g, heads.get(g)) for g in entry]}"
        )
    per_axis = [blocks.get(name), repeats.get(name)]
    if any(counts is not None and counts[axis] > 1 for counts in per_axis):
        raise SpecError(f"{where}: an axis laid out head by head takes no block or repeat")


def _check_head_axes(
    given, axes, groups, heads, blocks, repeats, head_repeats, head_sums
) -> dict[str, tuple[int, int]]:
    """Validate ``head_axes``: two distinct axes of a listed tensor, the heads' axis free,
    the other a head-structured group (or a direct sum of groups of one tie, nothing
    fixed), neither with a block, repeat, head repeat or head sum."""
    if not isinstance(given, Mapping):
        raise SpecError(f"head_axes must map a tensor to (heads' axis, axis), got {given!r}")
    out: dict[str, tuple[int, int]] = {}
    for name, pair in given.items():
        where = f"head_axes[{name!r}]"
        if name not in axes:
            raise SpecError(f"{where}: {name!r} is not in axes")
        ok = (
            isinstance(pair, tuple | list)
            and len(pair) == 2
            and all(isinstance(i, int) and not isinstance(i, bool) for i in pair)
        )
        if not ok or not all(0 <= i < len(axes[name]) for i in pair) or pair[0] == pair[1]:
            raise SpecError(
                f"{where} must be (heads' axis, dimensions' axis), two distinct axes of the "
                f"tensor's {len(axes[name])}, got {pair!r}"
            )
        a, b = int(pair[0]), int(pair[1])
        if axes[name][a] is not None:
            raise SpecError(
                f"{where}: axis {a} holds the heads and is moved by their tie; its entry must "
                f"be None, got {axes[name][a]!r}"
            )
        entry = axes[name][b]
        parts = _segment_groups(entry)
        found = [heads.get(g) for g in parts]
        if (
            not parts
            or (isinstance(entry, tuple) and len(parts) != len(entry))
            or any(f is None for f in found)
            or len({f[0] for f in found if f}) != 1
        ):
            raise SpecError(
                f"{where}: axis {b} must carry a head-structured group, or a direct sum of "
                f"groups of one tie (see heads), got {entry!r}"
            )
        for what, counts in (
            ("block", blocks), ("repeat", repeats), ("head repeat", head_repeats),
            ("head sum", head_sums),
        ):  # fmt: skip
            per_axis = counts.get(name)
            if per_axis is not None and (per_axis[a] > 1 or per_axis[b] > 1):
                raise SpecError(f"{where}: a joint pair of axes takes no {what}")
        out[name] = (a, b)
    return out


def _check_segment_head_repeats(
    given, axes, heads, head_sums, head_axes
) -> dict[str, dict[int, tuple[int, ...]]]:
    """Validate ``segment_head_repeats``: a direct-sum axis, one positive count per segment,
    > 1 only on a head-structured group's segment, on an axis not laid out head by head or
    read with another (those have their own layouts)."""
    if not isinstance(given, Mapping):
        raise SpecError(f"segment_head_repeats must map a tensor to its axes, got {given!r}")
    out: dict[str, dict[int, tuple[int, ...]]] = {}
    for name, per_axis in given.items():
        if name not in axes:
            raise SpecError(f"segment_head_repeats names {name!r}, which is not in axes")
        if not isinstance(per_axis, Mapping):
            raise SpecError(
                f"segment_head_repeats[{name!r}] must map an axis to one count per segment, "
                f"got {per_axis!r}"
            )
        kept: dict[int, tuple[int, ...]] = {}
        for axis, counts in per_axis.items():
            where = f"segment_head_repeats[{name!r}][{axis!r}]"
            if isinstance(axis, str) and axis.isdigit():  # a JSON key
                axis = int(axis)
            if isinstance(axis, bool) or not isinstance(axis, int):
                raise SpecError(f"{where}: an axis is an integer")
            entry = axes[name][axis] if 0 <= axis < len(axes[name]) else None
            if not isinstance(counts, tuple | list):
                raise SpecError(f"{where}: needs one count per segment, got {counts!r}")
            counts = tuple(counts)
            if not isinstance(entry, tuple) or len(counts) != len(entry):
                raise SpecError(
                    f"{where}: needs a direct-sum axis and one count per segment, got "
                    f"{counts!r} for {entry!r}"
                )
            for part, r in zip(entry, counts, strict=True):
                if isinstance(r, bool) or not isinstance(r, int) or r < 1:
                    raise SpecError(f"{where}: counts must be positive integers, got {r!r}")
                if r > 1 and (not isinstance(part, str) or part not in heads):
                    raise SpecError(
                        f"{where}: a count > 1 needs a head-structured group's segment "
                        f"(see heads), got {part!r}"
                    )
            if (head_sums.get(name) or (1,) * len(axes[name]))[axis] > 1 or name in head_axes:
                raise SpecError(f"{where}: an axis laid out by heads takes no segment repeats")
            if any(r > 1 for r in counts):
                kept[axis] = counts
        if kept:
            out[name] = kept
    return out


def _per_axis_counts(what: str, given, axes) -> dict[str, tuple[int, ...]]:
    """Validate ``blocks``/``repeats``: one positive integer per axis, > 1 only on axes a
    group acts on; entries that are all 1 are dropped."""
    out: dict[str, tuple[int, ...]] = {}
    for k, v in dict(given).items():
        if k not in axes:
            raise SpecError(f"{what} names {k!r}, which is not in axes")
        v = tuple(v)
        if len(v) != len(axes[k]) or not all(
            isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in v
        ):
            raise SpecError(
                f"{what}[{k!r}] must hold one positive integer per axis ({len(axes[k])}), got {v!r}"
            )
        if any(b > 1 and g is None for b, g in zip(v, axes[k], strict=True)):
            raise SpecError(f"{what}[{k!r}] = {v}: a count > 1 on an axis no group acts on")
        if any(b > 1 for b in v):
            out[k] = v
    return out


def block_index(
    index: Tensor, block: int, repeat: int = 1, heads: int = 1, head_repeat: int = 1
) -> Tensor:
    """The element order that moves whole blocks of ``block`` entries as ``index`` moves
    units — ``[index[0]·b, …, index[0]·b + b − 1, index[1]·b, …]`` — alike in each of
    ``repeat`` consecutive segments; with ``head_repeat`` r > 1, the units are ``heads``
    heads of ``d`` laid out ``r`` times per head (see ``PermutationSpec.head_repeats``), each
    copy moved alike."""
    if head_repeat > 1:
        d = index.numel() // heads
        source = index.view(heads, 1, d)
        copy = torch.arange(head_repeat, device=index.device).view(1, head_repeat, 1)
        index = ((torch.div(source, d, rounding_mode="floor") * head_repeat + copy) * d
                 + source % d).reshape(-1)  # fmt: skip
    if block > 1:
        index = (index[:, None] * block + torch.arange(block, device=index.device)).reshape(-1)
    if repeat > 1:
        segment = torch.arange(repeat, device=index.device)[:, None] * index.numel()
        index = (segment + index[None, :]).reshape(-1)
    return index


def permute_axis(t: Tensor, axis: int, index: Tensor, block: int = 1, repeat: int = 1) -> Tensor:
    """``t`` with ``axis`` reordered by a group's index vector (blocks of ``block`` entries
    move together, alike in ``repeat`` segments; see :class:`PermutationSpec`)."""
    return t.index_select(axis, block_index(index.to(t.device), block, repeat))


def unit_rows(
    t: Tensor, axis: int, n: int, repeat: int = 1, heads: int = 1, head_repeat: int = 1
) -> Tensor:
    """``t`` as an ``(n, -1)`` matrix with one row per unit of the group on ``axis``: every
    entry that moves with unit ``u`` (its block, in every segment, every copy of a head
    repeat, across the other axes) in row ``u``. Two tensors laid out alike give
    ``A_rows @ B_rowsᵀ`` = the units' inner products."""
    moved = t.movedim(axis, 0)
    if head_repeat > 1:
        d = n // heads
        return moved.reshape(heads, head_repeat, d, -1).transpose(1, 2).reshape(n, -1)
    if repeat == 1:
        return moved.reshape(n, -1)
    return moved.reshape(repeat, n, -1).transpose(0, 1).reshape(n, -1)


def from_unit_rows(
    rows: Tensor,
    axis: int,
    shape: tuple[int, ...],
    repeat: int = 1,
    heads: int = 1,
    head_repeat: int = 1,
) -> Tensor:
    """Inverse of :func:`unit_rows` for a tensor of ``shape``."""
    moved_shape = (shape[axis], *shape[:axis], *shape[axis + 1 :])
    n = rows.shape[0]
    if head_repeat > 1:
        d = n // heads
        rows = rows.reshape(heads, d, head_repeat, -1).transpose(1, 2)
    elif repeat > 1:
        rows = rows.reshape(n, repeat, -1).transpose(0, 1)
    return rows.reshape(moved_shape).movedim(0, axis)


def group_cost_matrix(
    spec: PermutationSpec,
    params_a: Params,
    params_b: Params,
    perm: Permutation,
    group: str,
    *,
    names: Collection[str] | None = None,
) -> Tensor:
    """The weight-matching LAP gain matrix of one group, others held fixed.

    ``C = Σ_{(param, axis) in group} A_(n,-1) @ B̃_(n,-1)ᵀ`` where ``B̃`` is ``B`` with every
    *other* group of ``perm`` applied and each tensor reshaped with the group's axis first.
    Maximising ``Σ_i C[i, p[i]]`` over ``p`` gives the best index vector for ``group``
    (Git Re-Basin Alg. 1). Non-floating tensors (``num_batches_tracked``) are never in a group.
    For a tensor in ``spec.self_maps`` (the group on two axes) the term of each axis holds the
    other axis at the current ``perm[group]``: a linearisation, exact once ``perm`` is fixed.

    Args:
        names: only these tensors contribute (default: every tensor the group acts on).

    Returns:
        ``(n, n)`` tensor on the parameters' device and dtype; rows index A's units, columns
        B's units. All zeros when no contributing tensor carries the group.
    """
    axes = [(k, i) for k, i in spec.group_axes(group) if names is None or k in names]
    n = spec.groups[group]
    if not axes:
        first = next(t for t in params_a.values() if t.dtype.is_floating_point)
        return first.new_zeros(n, n)
    cost: Tensor | None = None
    for name, axis in axes:
        a = params_a[name]
        b = params_b[name]
        for other_axis in range(b.ndim):
            if other_axis != axis:
                b = permute_spec_axis(b, spec, name, other_axis, perm)
        copies = spec.copies_group(name, axis)
        if copies is not None:  # B's query heads as the copies order them, before σ moves
            b = b.index_select(axis, copies_axis_index(spec, name, axis, perm[copies]).to(b.device))
        a2 = group_rows(spec, name, axis, group, a)
        b2 = group_rows(spec, name, axis, group, b)
        term = a2 @ b2.T
        cost = term if cost is None else cost + term
    assert cost is not None
    return cost
