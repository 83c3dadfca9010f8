"""The optimised engine behind :func:`~lmckit.match.weight_matching`.

It runs exactly the coordinate descent of
:func:`~lmckit.match.weight.weight_matching_reference` — same group order, same
acceptance rule, same permutations (tested on every zoo model) — doing less work:

* **B's layouts are built once.** Every (tensor, axis) of a group keeps model B laid out
  with that axis first — a view wherever the layout allows — across calls too, so loops
  that re-match a moving A to one fixed B (STE, STE-MM, MergeMany) pay only for the
  products.
* **Groups that cannot improve are skipped.** A group whose neighbours have not changed
  since its last solve would get the same cost matrix and the same answer.
* **Cost matrices are updated, not re-formed.** A term ``A B̃ᵀ`` of a group's cost matrix
  changes only in the columns of B̃ that a neighbour's new permutation moved; the kept
  matrix gets ``A[:, D] (B̃_new[:, D] − B̃_old[:, D])ᵀ`` over those columns ``D`` (for a
  convolution, the moved input channels × kernel positions), in chunks — unless more
  than :class:`DeltaPolicy`'s fraction of the group's columns moved, or the matrix is
  ``refresh`` sweeps old, when it is formed anew (bounding accumulated rounding). Late
  sweeps move few units, so most of their products cost a few columns. (On a GPU, only
  matrices costly enough to form pay for an update's fixed costs.)
* **Memory stays near the models'.** Only one ``(n, n)`` matrix per group is kept (the
  terms' shares live only in its sum), B̃ — B under the other groups' permutations — is
  formed only while a term is formed and then dropped, and update temporaries are
  chunked to a quarter of a cost matrix.
* **LAP duals are kept** (STE-MM Alg. 3): each group's solve starts from the duals of its
  previous solve — within a call and, through ``duals=``, across calls — so once the
  permutations settle each LAP is nearly solved before it starts.
* **The LAPs overlap the products.** When the next unit in the sweep's order does not
  neighbour the one being solved (its cost matrix cannot change with this solve), its
  products are formed while this LAP runs — the same matrices, formed sooner. On a GPU,
  the cost matrix goes to the CPU by an asynchronous copy and the next products are
  queued on the GPU before the LAP; on a CPU, the LAP runs in a thread (the compiled
  solver releases the GIL) beside the next products (2 cores, planted pairs: 1.1 B Llama
  143.7 s → 130.0 s, GPT-2 124 M 11.5 s → 11.1 s; ``benchmarks/bench_overlap.py``).
* **The objective costs two passes**: ⟨A, π(B)⟩ is evaluated exactly, tensor by tensor
  (products in A's dtype, sums in float64), at the start and for the last sweep; between,
  each accepted solve adds its gain ``Σ_i C[i, p_new(i)] − Σ_i C[i, p_old(i)]`` (exact
  while no tensor has two axes moved by the solved groups; otherwise that sweep is
  re-evaluated, only the tensors whose permutations changed).

Timing and FLOP counting live in :class:`ProfiledWeightMatcher`, a subclass, so the
algorithm carries no instrumentation.
"""

from __future__ import annotations

import fnmatch
import functools
import math
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from lmckit.errors import SpecError
from lmckit.lap import LapDuals, assign_heads, cost_array, solve_lap
from lmckit.match.result import MatchResult, check_inputs, matched_names
from lmckit.params import Params, detached
from lmckit.perm import (
    Permutation,
    PermutationSpec,
    axis_groups,
    axis_index,
    copies_axis_index,
    copies_gains,
    copies_value,
    group_rows,
    permute_spec_axis,
    permute_tensor,
    solve_copies,
)
from lmckit.progress import ProgressCallback, notify

__all__ = [
    "DeltaPolicy",
    "MemoryNeed",
    "ProfiledWeightMatcher",
    "WeightMatcher",
    "acceptance_tolerance",
    "copies_step",
    "held_groups",
    "improves_all",
]


def acceptance_tolerance(dtype: torch.dtype) -> float:
    """Relative gain a new LAP solution must add to replace the current permutation: the
    float32 cost matrices carry ~1e-7 relative rounding, so smaller "gains" are noise."""
    return 1e-12 if dtype == torch.float64 else 1e-6


def improves(gains: np.ndarray, old: np.ndarray, new: np.ndarray, rel_tol: float) -> bool:
    """Whether assignment ``new`` beats ``old`` on ``gains`` by more than ``rel_tol``."""
    old_gain, new_gain = _total(gains, old), _total(gains, new)
    return new_gain > old_gain + rel_tol * max(abs(old_gain), abs(new_gain), 1e-30)


def improves_all(
    gains: Mapping[str, np.ndarray],
    old: Mapping[str, np.ndarray],
    new: Mapping[str, np.ndarray],
    rel_tol: float,
) -> bool:
    """:func:`improves` for groups chosen together: their summed gain decides."""
    if len(gains) == 1:
        g = next(iter(gains))
        return improves(gains[g], old[g], new[g], rel_tol)
    old_gain = sum(_total(c, old[g]) for g, c in gains.items())
    new_gain = sum(_total(c, new[g]) for g, c in gains.items())
    return new_gain > old_gain + rel_tol * max(abs(old_gain), abs(new_gain), 1e-30)


def held_groups(spec: PermutationSpec, hold: Sequence[str]) -> frozenset[str]:
    """The groups of ``spec`` that ``hold`` names — group names or shell-style patterns
    (``"*.attn.*"``) — for a match that leaves them where ``init`` has them.

    Refuses a pattern that names no group (a typo would otherwise match everything) and a
    hold that splits the groups tied by a head permutation (one two-level assignment moves
    them all, so they are held or matched together).
    """
    if isinstance(hold, str):
        raise SpecError(f"hold takes a list of group names or patterns, not the string {hold!r}")
    held: set[str] = set()
    for pattern in hold:
        if not isinstance(pattern, str):
            raise SpecError(f"hold takes group names or patterns (strings), not {pattern!r}")
        named = {g for g in spec.groups if fnmatch.fnmatchcase(g, pattern)}
        if not named:
            raise SpecError(
                f"hold: {pattern!r} names no group of the spec (its groups: "
                f"{', '.join(list(spec.groups)[:6])}{', ...' if len(spec.groups) > 6 else ''})"
            )
        held |= named
    for unit in spec.update_units():
        if 0 < len(held & set(unit)) < len(unit):
            raise SpecError(
                f"hold names {sorted(held & set(unit))} but not {sorted(set(unit) - held)}: "
                "groups tied by a head permutation are held or matched together"
            )
    return frozenset(held)


def copies_step(
    spec: PermutationSpec,
    params_a: Params,
    params_b: Params,
    perm: Mapping[str, Tensor],
    group: str,
    names: set[str],
    rel_tol: float,
) -> Tensor | None:
    """One coordinate step of a copies group (grouped-query attention's query heads inside
    their key/value group; ``PermutationSpec.copies``), every other group held at ``perm``:
    the best copies vector (one exact assignment per key/value head of B) if it beats the
    current one by more than ``rel_tol``, else None. Both weight-matching engines take it
    after each sweep, for each copies group in spec order."""
    gains = copies_gains(spec, params_a, params_b, perm, group, names=names)
    new = solve_copies(gains)
    old_gain, new_gain = copies_value(gains, perm[group]), copies_value(gains, new)
    if new_gain > old_gain + rel_tol * max(abs(old_gain), abs(new_gain), 1e-30):
        return new
    return None


def _total(gains: np.ndarray, p: np.ndarray) -> float:
    """``Σ_i gains[i, p[i]]``, summed in float64 whatever the gains' dtype."""
    return float(gains[np.arange(len(p)), p].sum(dtype=np.float64))


def _as_gains(cost: Tensor) -> np.ndarray:
    """A group's CPU cost matrix as the LAP's gains: a NumPy view in its own dtype (the
    solver reads float32 into its float64 reduced costs exactly, so no float64 copy is
    made). The view shares the kept matrix, which is changed in place only when its group
    is next formed or updated — after this unit's solve has been accepted or not."""
    return cost_array(cost)


class _OnTheWay:
    """A cost matrix on its way to the CPU: on a GPU, an asynchronous copy into pinned
    memory that later GPU work does not wait for; elsewhere, the matrix itself."""

    def __init__(self, cost: Tensor) -> None:
        self.event = None
        if cost.is_cuda:
            self.host = torch.empty(cost.shape, dtype=cost.dtype, pin_memory=True)
            self.host.copy_(cost.detach(), non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = cost

    def gains(self) -> np.ndarray:
        """The LAP's CPU gains (see :func:`_as_gains`), once the copy has arrived."""
        if self.event is not None:
            self.event.synchronize()
        return _as_gains(self.host)


@dataclass
class _Term:
    """One (tensor, axis) of a group on the B side: B with that axis moved to the front
    (a view where the layout allows), the other grouped axes of the tensor — ``(position in
    b_moved, axis)`` — to permute, and the groups acting on them. Its share ``A B̃ᵀ`` of
    the group's cost matrix is kept only inside that sum; ``seen`` says which permutations
    of the other groups the share was formed with."""

    spec: PermutationSpec
    group: str
    name: str
    axis: int
    b_moved: Tensor
    others: tuple[tuple[int, int], ...]  # (position in b_moved, axis of the tensor)
    other_groups: tuple[str, ...]
    # B unpermuted as (n, -1) rows; per column its position along each other axis, and how
    # far apart in columns two neighbouring positions of that axis are
    b_rows: Tensor | None = None
    columns: tuple[Tensor, ...] = ()
    strides: tuple[int, ...] = ()
    seen: tuple[Tensor, ...] | None = None
    flops: int = 0  # of its last contribution to the cost matrix (formed or updated)
    # the copies group reordering B's query heads on this term's own axis (a head-repeated
    # axis of grouped-query attention), or None; such a term is always formed anew
    own_copies: str | None = None
    # whether its own axis or another is read with its heads' axis as one (a mixture's
    # experts: PermutationSpec.head_axes); such a term is always formed anew, since its
    # columns move with the experts and no per-axis offset reads them
    joint: bool = False

    def __post_init__(self) -> None:
        self.joint = any(
            self.spec.head_axis(self.name, i) is not None
            for i in (self.axis, *(axis for _, axis in self.others))
        )
        if self.joint:
            self.b_rows = None
            return
        shape = self.b_moved.shape
        columns, strides = [], []
        for pos, _ in self.others:
            view = [1] * len(shape)
            view[pos] = shape[pos]
            where = torch.arange(shape[pos], device=self.b_moved.device).view(view).expand(shape)
            rows = group_rows(self.spec, self.name, self.axis, self.group, where, 0)
            columns.append(rows[0].clone())
            strides.append(math.prod(shape[pos + 1 :]))
        self.columns, self.strides = tuple(columns), tuple(strides)
        self.b_rows = unit_rows_view(self.spec, self.name, self.axis, self.group, self.b_moved, 0)

    def current(self, perm: Mapping[str, Tensor]) -> tuple[Tensor, ...]:
        """The other groups' permutations in ``perm``."""
        return tuple(perm[h] for h in self.other_groups)

    def b2(self, perm: Mapping[str, Tensor]) -> Tensor:
        """B̃ as an ``(n, -1)`` matrix: B with the other groups' permutations (a new copy;
        not kept, so that at most one lives at a time). Gathered in B's own layout, which
        is contiguous, then viewed with this term's axis first."""
        b = self.b_moved.movedim(0, self.axis)
        for _, other_axis in self.others:
            if self.joint:
                b = permute_spec_axis(b, self.spec, self.name, other_axis, perm)
                continue
            index = axis_index(self.spec, self.name, other_axis, perm)
            assert index is not None
            b = b.index_select(other_axis, index)
        if self.own_copies is not None:
            index = copies_axis_index(self.spec, self.name, self.axis, perm[self.own_copies])
            b = b.index_select(self.axis, index.to(b.device))
        return group_rows(self.spec, self.name, self.axis, self.group, b.movedim(self.axis, 0), 0)

    def form(self, a2: Tensor, perm: Mapping[str, Tensor]) -> Tensor:
        """``A B̃ᵀ`` (``(n, n)``) in full."""
        product = _rows_product(a2, self.b2(perm))
        self.seen = self.current(perm)
        self.flops = 2 * a2.shape[0] * a2.numel()
        return product

    def changed(self, perm: Mapping[str, Tensor]) -> tuple[list[Tensor], list[Tensor], Tensor]:
        """The other axes' index vectors when the share was formed and now, and the columns
        of the ``(n, -1)`` layout whose B̃ entries differ between them."""
        assert self.seen is not None
        before = self._indices(dict(zip(self.other_groups, self.seen, strict=True)))
        after = self._indices(perm)
        return before, after, self._changed_columns(before, after)

    def update(
        self,
        cost: Tensor,
        a2: Tensor,
        perm: Mapping[str, Tensor],
        before: list[Tensor],
        after: list[Tensor],
        cols: Tensor,
    ) -> None:
        """``cost += A[:, D] (B̃_new[:, D] − B̃_old[:, D])ᵀ`` over the changed columns ``D``
        (both read straight from B's unpermuted rows), in chunks that keep the temporaries
        to about a quarter of ``cost``."""
        assert self.b_rows is not None
        n = a2.shape[0]
        for chunk in cols.split(max(1, n // 4)):
            new = _take_columns(self.b_rows, self._sources(after, chunk))
            change = new.sub_(_take_columns(self.b_rows, self._sources(before, chunk)))
            cost.addmm_(_take_columns(a2, chunk), change.T)
        self.seen = self.current(perm)
        self.flops = 2 * n * n * cols.numel()

    def _indices(self, perm: Mapping[str, Tensor]) -> list[Tensor]:
        """The index vector of every other axis under ``perm``."""
        out = []
        for _, other_axis in self.others:
            index = axis_index(self.spec, self.name, other_axis, perm)
            assert index is not None
            out.append(index.to(self.b_moved.device))
        return out

    def _changed_columns(self, before: list[Tensor], after: list[Tensor]) -> Tensor:
        """The columns of the ``(n, -1)`` layout whose B̃ entries differ between two sets of
        the other axes' index vectors."""
        changed = None
        for old, new, where in zip(before, after, self.columns, strict=True):
            moved = (old != new)[where]
            changed = moved if changed is None else changed | moved
        assert changed is not None
        return changed.nonzero().squeeze(1)

    def _sources(self, indices: list[Tensor], cols: Tensor) -> Tensor:
        """For columns ``cols`` of B̃ (B read through the other axes' ``indices``), the
        columns of B's unpermuted rows holding the same entries: a column's position along
        each other axis is replaced by the one the index vector reads there."""
        sources = cols.clone()
        for index, where, stride in zip(indices, self.columns, self.strides, strict=True):
            at = where[cols]
            sources += (index[at] - at) * stride
        return sources


def unit_rows_view(
    spec: PermutationSpec, name: str, axis: int, group: str, t: Tensor, position: int | None = None
) -> Tensor:
    """:func:`~lmckit.perm.group_rows` without a copy where the layout allows one to be
    avoided: the ``(n, -1)`` matrix where it is a view of ``t``; for a plain blocked axis
    whose ``(n, -1)`` layout is no view — a weight's input axis in blocks, as an attention
    output projection's heads — the ``(n, block, -1)`` view, whose rows flatten to the same
    order; for an axis with a head repeat ``r`` (grouped-query attention's output
    projection), the ``(h, d, r, -1)`` view, whose first two axes flatten to the units;
    else the ``(n, -1)`` copy. (Kept for a whole match, such copies of A's and B's output
    projections were 0.74 GB of a 1.1 B Llama's.)"""
    position = axis if position is None else position
    if spec.head_axis(name, axis) is not None:  # rows across two axes: a copy
        return group_rows(spec, name, axis, group, t, position)
    plain = not isinstance(spec.axes[name][axis], tuple) and spec.repeat(name, axis) == 1
    heads, head_repeat = spec.head_layout(name, axis)
    if plain and head_repeat > 1:
        d = spec.groups[group] // heads
        try:
            return t.movedim(position, 0).view(heads, head_repeat, d, -1).transpose(1, 2)
        except RuntimeError:
            return group_rows(spec, name, axis, group, t, position)
    if plain:
        n = spec.groups[group]
        moved = t.movedim(position, 0)
        try:
            return moved.view(n, -1)
        except RuntimeError:  # not expressible as a view: try the blocks
            pass
        blocked = moved.unflatten(0, (n, -1))
        try:
            return blocked.view(n, blocked.shape[1], -1)
        except RuntimeError:
            pass
    return group_rows(spec, name, axis, group, t, position)


def _rows_product(a: Tensor, b: Tensor) -> Tensor:
    """``A_rows B_rowsᵀ`` of ``a`` — ``(n, m)`` or one of :func:`unit_rows_view`'s views —
    and ``b``, ``(n, m)`` in the same column order (a view's layout is copied only for the
    product)."""
    return _as_rows(a) @ b.T


def _as_rows(t: Tensor) -> Tensor:
    """The ``(n, m)`` matrix of one of :func:`unit_rows_view`'s layouts (a copy unless it is
    one already)."""
    if t.dim() == 2:
        return t
    if t.dim() == 3:
        return t.reshape(t.shape[0], -1)
    return t.reshape(t.shape[0] * t.shape[1], -1)


def _take_columns(t: Tensor, index: Tensor) -> Tensor:
    """``t[:, index]`` of an ``(n, m)`` matrix, or of the ``(n, block, m / block)`` view of
    one (:func:`unit_rows_view`). A transposed view (a weight's input axis as rows) is
    gathered by rows of the matrix it views: PyTorch's column gather on such a view is an
    order of magnitude slower."""
    if t.dim() == 4:  # (h, d, r, rest): a head-repeat axis's units are (head, dimension)
        width = t.shape[3]
        taken = t[:, :, torch.div(index, width, rounding_mode="floor"), index % width]
        return taken.reshape(t.shape[0] * t.shape[1], -1)
    if t.dim() == 3:
        width = t.shape[2]
        return t[:, torch.div(index, width, rounding_mode="floor"), index % width]
    if t.dim() == 2 and t.stride(0) == 1 and t.stride(1) != 1:
        return t.T.index_select(0, index).T
    return t.index_select(1, index)


def _repeats(neighbours: tuple[Tensor, ...], last: tuple[Tensor, ...] | None) -> bool:
    """Whether a unit was last solved with exactly these neighbour permutations (the same
    objects: a permutation is replaced, never changed in place), so solving it again would
    repeat that solve."""
    return last is not None and all(p is q for p, q in zip(neighbours, last, strict=True))


def _same(xs: tuple[Tensor, ...], ys: tuple[Tensor, ...] | None) -> bool:
    return ys is not None and all(x is y or torch.equal(x, y) for x, y in zip(xs, ys, strict=True))


@dataclass(frozen=True)
class DeltaPolicy:
    """When :class:`WeightMatcher` updates a group's kept cost matrix instead of forming it
    again: when the columns its terms' neighbours moved are at most ``max_fraction`` of the
    group's columns (beyond that, forming anew costs about as much as the updates' copies
    and products), and it was formed fewer than ``refresh`` sweeps ago (bounding the
    rounding that updates accumulate: ``benchmarks/bench_refresh_drift.py`` measured a
    trained 3×512 MLP's kept matrices within 1.3× the error of a freshly formed float32
    matrix for up to 40 updates, 1.9–2.2× after 48–64; 16 keeps them within 1.22×, and
    spares most weight-matching runs, 11–21 sweeps, one or two re-formations of every
    matrix, which at 8 cost 7–12 % of a run) — and, on a GPU, only when forming it anew
    takes at least ``gpu_min_flops`` multiply-adds ×2: an update there costs a host
    synchronisation and a dozen small kernels (about 2 ms per update measured on an H100,
    where forming a 3×2048 MLP's cost matrix anew takes about 1 ms), so smaller matrices
    are cheaper to form again."""

    max_fraction: float = 0.75
    refresh: int = 16
    gpu_min_flops: float = 1e11

    def updates_pay(self, formation_flops: int, on_gpu: bool) -> bool:
        """Whether updating a kept matrix can beat forming it anew with
        ``formation_flops`` (multiply-adds ×2) on this device."""
        return not on_gpu or formation_flops >= self.gpu_min_flops


@dataclass(frozen=True)
class MemoryNeed:
    """What weight matching certainly holds at its peak, in bytes: a lower bound of its
    resident memory, so that a request refused for it could never have fit (transient
    copies of B's tensors, an update's temporaries, Python's and the libraries' own
    overhead come on top).

    Attributes:
        models: models A and B (each counted in full once read, memory-mapped or not; a
            tensor that two names share, as a tied embedding and head, once).
        kept_costs: one ``(n, n)`` cost matrix per group, kept between sweeps so that later
            sweeps update them over the columns that moved instead of forming them anew.
        working: what one step holds beside them: the largest group's cost matrix while it
            is formed and its LAP's float64 reduced costs.
    """

    models: int
    kept_costs: int
    working: int

    @property
    def total(self) -> int:
        """With the cost matrices kept (the default engine)."""
        return self.models + self.kept_costs + self.working

    @property
    def without_kept_costs(self) -> int:
        """Every cost matrix formed anew in each solve (slower, less memory)."""
        return self.models + self.working

    @classmethod
    def of(cls, spec: PermutationSpec, params_a: Params, params_b: Params) -> MemoryNeed:
        """The need of matching ``params_b`` onto ``params_a`` under ``spec``."""
        sizes = [n for g, n in spec.groups.items() if spec.group_axes(g)]
        itemsize = max((t.element_size() for t in params_a.values()), default=4)
        largest_n = max(sizes, default=0)
        storages = {
            (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel()): t.numel()
            * t.element_size()
            for p in (params_a, params_b)
            for t in p.values()
        }
        kept = sum(n * n * itemsize for n in sizes)
        working = largest_n**2 * (itemsize + 8)
        return cls(models=sum(storages.values()), kept_costs=kept, working=working)


class WeightMatcher:
    """Weight matching of many parameter sets A against one fixed model B.

    ``WeightMatcher(spec, params_b).match(params_a, ...)`` returns what
    ``weight_matching(spec, params_a, params_b, ...)`` returns; the matcher keeps B's
    layouts between calls.

    Args:
        spec: the permutation spec of both models.
        params_b: model B (kept by reference; do not modify it while the matcher lives).
        include_running_stats: count BatchNorm running statistics in the objective.
        lap_backend: ``"jv"`` (default), ``"lapjv"`` or ``"scipy"`` (see
            :func:`lmckit.lap.solve_lap`).
        delta: how cost-matrix terms are updated where only some of B̃'s columns changed
            (:class:`DeltaPolicy`); ``None`` forms every term anew (the earlier engine,
            kept for benchmarks and tests).
        overlap: form the next unit's cost matrices while this unit's LAP runs, where
            they cannot depend on its outcome (same results): on a GPU queued before the
            LAP, on a CPU beside it, the LAP in a thread. ``None`` (default) and ``True``:
            on; ``False``: one step after the other.
    """

    def __init__(
        self,
        spec: PermutationSpec,
        params_b: Params,
        *,
        include_running_stats: bool = True,
        lap_backend: str = "jv",
        delta: DeltaPolicy | None = DeltaPolicy(),
        overlap: bool | None = None,
    ) -> None:
        self.spec = spec
        self.delta = delta
        self.overlap = overlap
        self._sweep = 0
        self.params_b = params_b = detached(params_b)
        self.lap_backend = lap_backend
        self.names = set(matched_names(params_b, include_running_stats))
        self.terms: dict[str, list[_Term]] = {g: [] for g in spec.groups}
        for g in spec.groups:
            for name, axis in spec.group_axes(g):
                if name not in self.names:
                    continue
                others = tuple(
                    # position once `axis` is moved to the front
                    (j + 1 if j < axis else j, j)
                    for j, entry in enumerate(spec.axes[name])
                    if entry is not None and j != axis
                )
                other_groups = tuple(h for _, j in others for h in axis_groups(spec.axes[name][j]))
                own = spec.copies_group(name, axis)
                if own is not None:
                    other_groups += (own,)
                b_moved = params_b[name].movedim(axis, 0)
                self.terms[g].append(
                    _Term(spec, g, name, axis, b_moved, others, other_groups, own_copies=own)
                )
        self.groups = [g for g in spec.groups if self.terms[g]]
        self.copies = [
            c for c in spec.copies if any(k in self.names for k, _ in spec.copies_axes(c))
        ]
        self.grouped = {t.name for g in self.groups for t in self.terms[g]}
        # Each step chooses one unit: a group, or the groups tied by a head permutation.
        self.units = [
            kept
            for unit in spec.update_units()
            if (kept := tuple(g for g in unit if self.terms[g]))
        ]
        # A unit's cost matrices depend on its neighbours' permutations only (a self-mapped
        # group is its own neighbour); if none moved since its last solve, the solve would
        # repeat itself and is skipped.
        self.neighbours = {
            unit: tuple(sorted({h for g in unit for t in self.terms[g] for h in t.other_groups}))
            for unit in self.units
        }
        # Each group's cost matrix as last formed or updated, and the sweep it was formed in.
        self._costs: dict[str, Tensor] = {}
        self._formed: dict[str, int] = {}
        self._tensor_groups = {  # every group on any axis of a grouped tensor
            name: tuple(h for entry in spec.axes[name] if entry for h in axis_groups(entry))
            for name in self.grouped
        }
        # Where no tensor has two axes moved by one unit's groups, the objective is linear
        # in that unit's permutations: a solve changes it by exactly its gain.
        self._linear = {
            unit: not any(
                sum(1 for entry in spec.axes[name] if entry and set(axis_groups(entry)) & set(unit))
                > 1
                for name in self.grouped
            )
            for unit in self.units
        }

    # -- the two steps of a coordinate update; ProfiledWeightMatcher wraps them ----------
    def cost(self, group: str, a2: Mapping[tuple[str, str, int], Tensor], perm) -> Tensor:
        """``C_group = Σ_terms A_(n,-1) B̃_(n,-1)ᵀ`` (``(n, n)``, A's dtype and device) under
        the other groups' permutations in ``perm``.

        Under :class:`DeltaPolicy`: the kept matrix, each term whose neighbours moved since
        updated in place over its changed columns — unless they are more than
        ``max_fraction`` of the group's columns, the matrix is ``refresh`` sweeps old, or it
        is a GPU matrix smaller than ``gpu_min_flops``; then it is formed anew, term by term
        in the spec's order. Only one ``(n, n)`` matrix per group is kept."""
        terms = self.terms[group]
        for t in terms:
            t.flops = 0
        kept, policy = self._costs.get(group), self.delta
        if (
            kept is not None
            and policy is not None
            and not any(t.own_copies or t.joint for t in terms)  # no column update
            and self._sweep - self._formed[group] < policy.refresh
            and policy.updates_pay(
                sum(2 * kept.shape[0] * a2[(group, t.name, t.axis)].numel() for t in terms),
                kept.is_cuda,
            )
        ):
            pending = []
            for t in terms:
                if not _same(t.current(perm), t.seen):
                    pending.append((t, *t.changed(perm)))
            width = sum(a2[(group, t.name, t.axis)].numel() // len(kept) for t in terms)
            if sum(cols.numel() for *_, cols in pending) <= policy.max_fraction * width:
                for t, before, after, cols in pending:
                    t.update(kept, a2[(group, t.name, t.axis)], perm, before, after, cols)
                return kept
        self._costs.pop(group, None)  # one (n, n) matrix per group, even while forming
        cost = None
        for t in terms:
            product = t.form(a2[(group, t.name, t.axis)], perm)
            cost = product if cost is None else cost.add_(product)
        assert cost is not None
        self._costs[group], self._formed[group] = cost, self._sweep
        return cost

    def _objective(
        self,
        params_a: Params,
        perm: Mapping[str, Tensor],
        cache: dict[str, tuple[tuple[Tensor, ...], float]],
    ) -> float:
        """``Σ ⟨A, π(B)⟩`` over the grouped tensors, each recomputed only when a permutation
        on its axes changed since ``cache`` last saw it (products in A's dtype, sums in
        float64)."""
        total = 0.0
        for name in sorted(self.grouped):
            used = tuple(perm[h] for h in self._tensor_groups[name])
            hit = cache.get(name)
            if hit is None or not _same(used, hit[0]):
                value = _tensor_inner(self.spec, params_a, self.params_b, perm, name)
                hit = cache[name] = (used, value)
            total += hit[1]
        return total

    def solve(self, gains: np.ndarray, duals: LapDuals | None) -> tuple[Tensor, LapDuals]:
        """The LAP maximising ``Σ_i gains[i, p[i]]``, warm-started from ``duals``."""
        return solve_lap(gains, maximize=True, duals=duals, backend=self.lap_backend)

    def solve_heads(self, gains: Mapping[str, np.ndarray], heads: int) -> dict[str, Tensor]:
        """The two-level assignment of groups tied by a head permutation (no duals)."""
        return assign_heads(gains, heads, self.spec.pinned)

    # -- the algorithm -------------------------------------------------------------------
    def match(
        self,
        params_a: Params,
        *,
        init: Permutation | None = None,
        duals: Mapping[str, LapDuals] | None = None,
        max_iter: int = 100,
        seed: int = 0,
        warm_start: bool = True,
        progress: ProgressCallback | None = None,
        validate: bool = True,
        distances: bool = True,
        objective: bool = True,
        hold: frozenset[str] = frozenset(),
    ) -> MatchResult:
        """Match B onto ``params_a``; arguments as in :func:`weight_matching`.

        ``validate=False`` skips the input checks, ``distances=False`` the two distance
        passes (``distance_before``/``distance_after`` are then NaN) and ``objective=False``
        the objective's two passes (``history`` is then empty): for callers that re-match
        every step (STE, STE-MM) and checked their inputs once. ``hold``: groups left at
        ``init`` (:func:`held_groups`).

        The objective after each sweep is the exact one at the start plus the gains of the
        accepted solves (linear in a group's permutation: ``Σ_i C[i, p(i)]``), re-evaluated
        exactly after a sweep that moved a group appearing twice in one tensor; the last
        entry of ``history`` is always evaluated exactly.
        """
        start = time.perf_counter()
        spec, params_b = self.spec, self.params_b
        if validate:
            check_inputs(spec, params_a, params_b)
        params_a = detached(params_a)
        a2 = {
            (g, t.name, t.axis): unit_rows_view(spec, t.name, t.axis, g, params_a[t.name])
            for g in self.groups
            for t in self.terms[g]
        }
        device = next(iter(params_a.values())).device
        perm = {g: p.to(device) for g, p in (init or Permutation.identity(spec)).items()}
        lap_duals: dict[str, LapDuals] = dict(duals or {}) if warm_start else {}
        dtype = params_a[next(iter(self.names))].dtype if self.names else torch.float32
        rel_tol = acceptance_tolerance(dtype)
        generator = torch.Generator().manual_seed(seed)
        solved_with: dict[str, tuple[Tensor, ...]] = {}
        history: list[float] = []
        solves = skipped = sweeps = formed_ahead = 0
        overlap = self.overlap is not False
        self._costs.clear()  # formed from another A
        contributions: dict[str, tuple[tuple[Tensor, ...], float]] = {}
        constant = running = math.nan
        if objective:  # tensors outside every group contribute a constant
            constant = _inner(spec, params_a, params_b, perm, self.names - self.grouped)
            running = constant + self._objective(params_a, perm, contributions)
        for sweep in range(1, max_iter + 1):
            sweeps = self._sweep = sweep
            improved = stale = False
            order = [self.units[i] for i in torch.randperm(len(self.units), generator=generator)]
            order = [unit for unit in order if not hold.issuperset(unit)]
            ahead: dict[tuple[str, ...], dict[str, Tensor]] = {}  # formed before their turn
            for position, unit in enumerate(order):
                neighbours = tuple(perm[h] for h in self.neighbours[unit])
                if _repeats(neighbours, solved_with.get(unit)):
                    skipped += 1
                    continue
                costs = ahead.pop(unit, None) or {g: self.cost(g, a2, perm) for g in unit}
                copies = {g: _OnTheWay(c) for g, c in costs.items()}
                old = {g: perm[g].cpu().numpy() for g in unit}
                following = order[position + 1] if position + 1 < len(order) else None
                single = len(unit) == 1 and unit[0] not in spec.heads
                independent = (
                    overlap
                    and following is not None
                    and not set(unit) & set(self.neighbours[following])
                    and not _repeats(
                        tuple(perm[h] for h in self.neighbours[following]),
                        solved_with.get(following),
                    )
                )
                # on a CPU, this unit's LAP runs in a thread while the following unit's
                # products run here; on a GPU, the products are queued before the LAP
                threaded = independent and device.type != "cuda" and single
                if independent and not threaded:
                    # this solve cannot change the following unit's matrices: queue them now
                    ahead[following] = {g: self.cost(g, a2, perm) for g in following}
                    formed_ahead += 1
                unit_gains = {g: c.gains() for g, c in copies.items()}
                solves += 1
                if single:
                    g = unit[0]
                    previous = lap_duals.get(g)
                    if previous is not None and previous.u.shape != (spec.groups[g],):
                        previous = None
                    if threaded:
                        assert following is not None
                        solving = _lap_thread().submit(self.solve, unit_gains[g], previous)
                        ahead[following] = {h: self.cost(h, a2, perm) for h in following}
                        formed_ahead += 1
                        new, new_duals = solving.result()
                    else:
                        new, new_duals = self.solve(unit_gains[g], previous)
                    if warm_start:
                        lap_duals[g] = new_duals
                    chosen = {g: new}
                else:
                    chosen = self.solve_heads(unit_gains, spec.heads[unit[0]][1])
                new = {g: p.numpy() for g, p in chosen.items()}
                if improves_all(unit_gains, old, new, rel_tol):
                    for g in unit:
                        perm[g] = chosen[g].to(device)
                    improved = True
                    if self._linear[unit]:
                        running += sum(_gain(unit_gains[g], old[g], new[g]) for g in unit)
                    else:
                        stale = True
                solved_with[unit] = neighbours  # the permutations these were formed with
            for c in self.copies:  # query heads inside their key/value group
                if c in hold:
                    continue
                found = copies_step(spec, params_a, params_b, perm, c, self.names, rel_tol)
                if found is not None:
                    perm[c] = found.to(device)
                    improved = stale = True
            if objective:
                if stale or not improved:  # the last sweep's value is exact
                    running = constant + self._objective(params_a, perm, contributions)
                history.append(running)
            notify(progress, sweep, None, objective=running if objective else None)
            if not improved:
                break
        if objective and improved:  # stopped by max_iter: the last value exactly too
            history[-1] = constant + self._objective(params_a, perm, contributions)
        final = Permutation(spec, {g: p.cpu() for g, p in perm.items()})
        before = after = math.nan
        if distances:
            before = _distance(spec, params_a, params_b, None)
            after = _distance(spec, params_a, params_b, perm)
        return MatchResult(
            alignment=final,
            method="weight_matching[warm]" if warm_start else "weight_matching",
            history=tuple(history),
            iterations=sweeps,
            seconds=time.perf_counter() - start,
            distance_before=before,
            distance_after=after,
            duals=lap_duals if warm_start else None,
            info={
                "lap_solves": solves,
                "skipped_solves": skipped,
                "formed_ahead": formed_ahead,
                "warm_start": warm_start,
                "lap_backend": self.lap_backend,
            },
        )


class ProfiledWeightMatcher(WeightMatcher):
    """A :class:`WeightMatcher` that also measures where its time goes.

    After :meth:`match`, ``result.info`` also holds ``gemm_seconds`` (forming the cost
    matrices: on a CPU the wall time of it; on a GPU the GPU's time between CUDA events
    around each formation, so that timing does not synchronise away the overlap),
    ``lap_seconds``, ``gemm_flops`` (the multiply-adds done: ``2·n·numel(A_term)`` per
    term formed in full, ``2·n²·|D|`` per term updated over ``|D|`` changed columns) and
    ``full_recompute_flops`` (what forming every term requested in full would have cost).
    Counters accumulate per call.
    """

    def cost(self, group, a2, perm):
        if next(iter(a2.values())).is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = super().cost(group, a2, perm)
            end.record()
            self._gpu_intervals.append((start, end))
        else:
            t0 = time.perf_counter()
            out = super().cost(group, a2, perm)
            self._gemm_seconds += time.perf_counter() - t0
        n = self.spec.groups[group]
        self._flops += sum(t.flops for t in self.terms[group])
        self._full_flops += sum(
            2 * n * a2[(group, t.name, t.axis)].numel() for t in self.terms[group]
        )
        return out

    def solve(self, gains, duals):
        t0 = time.perf_counter()
        out = super().solve(gains, duals)
        self._lap_seconds += time.perf_counter() - t0
        return out

    def solve_heads(self, gains, heads):
        t0 = time.perf_counter()
        out = super().solve_heads(gains, heads)
        self._lap_seconds += time.perf_counter() - t0
        return out

    def match(self, params_a: Params, **kwargs) -> MatchResult:
        """:meth:`WeightMatcher.match`, with timings and FLOPs added to ``info``."""
        self._gemm_seconds = self._lap_seconds = 0.0
        self._flops = self._full_flops = 0
        self._gpu_intervals: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        result = super().match(params_a, **kwargs)
        if self._gpu_intervals:
            torch.cuda.synchronize()
            self._gemm_seconds = sum(s.elapsed_time(e) for s, e in self._gpu_intervals) / 1e3
        result.info.update(
            gemm_seconds=self._gemm_seconds,
            lap_seconds=self._lap_seconds,
            gemm_flops=self._flops,
            full_recompute_flops=self._full_flops,
        )
        return result


@functools.cache
def _lap_thread() -> ThreadPoolExecutor:
    """The thread a CPU overlap runs LAPs in (the compiled solver releases the GIL)."""
    return ThreadPoolExecutor(1, thread_name_prefix="lmckit-lap")


def _gain(gains: np.ndarray, old: np.ndarray, new: np.ndarray) -> float:
    """How much ``Σ_i gains[i, p(i)]`` grows from ``old`` to ``new``."""
    return _total(gains, new) - _total(gains, old)


def _dot64(a: Tensor, b: Tensor, chunk: int = 1 << 22) -> float:
    """``⟨a, b⟩`` with the products in the tensors' dtype and the sum in float64, in chunks
    (the temporaries stay small)."""
    a, b = a.reshape(-1), b.reshape(-1)
    return sum(
        float((a[i : i + chunk] * b[i : i + chunk]).sum(dtype=torch.float64))
        for i in range(0, a.numel(), chunk)
    )


def _distance(
    spec: PermutationSpec, params_a: Params, params_b: Params, perm: Mapping[str, Tensor] | None
) -> float:
    """``params_distance(A, π(B))`` (``perm=None``: of A and B) without a permuted copy of
    B (:meth:`Permutation.distance`)."""
    if perm is None:
        return Permutation.identity(spec).distance(params_a, params_b)
    return Permutation(spec, {g: p.cpu() for g, p in perm.items()}).distance(params_a, params_b)


def _tensor_inner(
    spec: PermutationSpec, params_a: Params, params_b: Params, perm: Mapping[str, Tensor], name: str
) -> float:
    """``⟨A, π(B)⟩`` of one tensor (products in its dtype, the sum in float64)."""
    return _dot64(params_a[name], permute_tensor(params_b[name], spec, name, perm))


def _inner(
    spec: PermutationSpec,
    params_a: Params,
    params_b: Params,
    perm: Mapping[str, Tensor],
    names: set[str],
) -> float:
    """``Σ_{name ∈ names} ⟨A, π(B)⟩``."""
    return sum(_tensor_inner(spec, params_a, params_b, perm, name) for name in sorted(names))
