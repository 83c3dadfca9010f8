"""How each ATen operator relates the axes of its inputs and outputs.

A rule receives the call node and an :class:`Axes` helper and declares, for every tensor
axis it touches, one of three things:

* ``same(x, i, y, j)`` — axis ``i`` of ``x`` and axis ``j`` of ``y`` must carry the same
  permutation for the op to commute with it (elementwise ops, the units of a linear layer,
  a norm's channels, a contraction index of a product);
* ``freeze(x, i, why)`` — no permutation may act on this axis (a spatial axis a kernel
  slides over, an axis an op indexes into, merges or splits);
* nothing — the axis is unconstrained by this op (a sum over it, a broadcast of size 1).

Any operator without a rule freezes every axis of its inputs and outputs, so an op the
tracer does not know can shrink the spec but never make it wrong. Every rule here is
checked by the tracer's equivalence test on the models of ``tests/spec``.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch
from torch import fx

from lmckit.errors import SpecError

aten = torch.ops.aten

Rule = Callable[[fx.Node, "Axes"], None]


class Unit:
    """Axes that no tensor of the graph has: the ``n`` groups of a grouped convolution or a
    GroupNorm, whose channel axes are ``n`` blocks that move whole; one part of a fused
    projection read by ``select``; the common refinement of a reshape that regroups several
    axes into several (``(N, H·d) → (N·H, d)``)."""

    def __init__(self, name: str, shape: int | tuple[int, ...]) -> None:
        self.name = name
        self.shape = (shape,) if isinstance(shape, int) else tuple(shape)


class Axes:
    """What rules see: shapes of nodes and the ways to relate axes."""

    def __init__(
        self,
        same: Callable,
        freeze: Callable,
        frozen: Callable[[Any], bool] = lambda key: False,
        find: Callable[[Any], Any] = lambda key: key,
    ) -> None:
        self._same = same
        self._freeze = freeze
        self._frozen = frozen
        self._find = find
        self.op = ""  # the operator whose rule runs, for error messages
        self.units: list[Unit] = []
        # (merged axis, outer axis, inner axis) of every reshape that split an axis into
        # two or merged two into one (heads × head dimensions), and the blocked axes of every
        # other block relation (a grouped convolution's channels), whose insides must stay
        self.nests: list[tuple[tuple[str, int], tuple[str, int], tuple[str, int]]] = []
        self.fixed_blocks: list[tuple[str, int]] = []
        # (whole axis, its consecutive parts with their lengths) of every cat and split
        self.sums: list[tuple[tuple[str, int], list[tuple[tuple[str, int], int]]]] = []
        # (slice's axis, the axis it cuts, start, end) of every slice that cuts a range
        self.slices: list[tuple[tuple[str, int], tuple[str, int], int, int]] = []
        # a projection's units reshaped into one head, (…, n) → (…, 1, n) — multi-query
        # attention's key or value — as (projection, its axis, reshaped, the 1 axis, the n
        # axis, whether the heads of a grouped-query repeat met it): see single_head
        self.one_heads: list[list[Any]] = []
        self.hold_one_heads = True  # False: those reshapes map through, as any other
        self.one_heads_nested = 0
        # (node, axis) of every axis indexed by followed values: a mixture's experts
        self.indexed: list[tuple[str, int]] = []

    def unit(self, node: fx.Node, n: int | tuple[int, ...], tag: str = "units") -> Unit:
        """New axes of length ``n`` (or of shape ``n``) belonging to ``node``'s op (see
        :class:`Unit`)."""
        made = Unit(f"{node.name}#{tag}", n)
        self.units.append(made)
        return made

    def frozen(self, x: Any, i: int) -> bool:
        """Whether axis ``i`` of ``x`` is frozen by what the rules so far declared."""
        return self._frozen((x.name, i))

    @staticmethod
    def shape(node: Any) -> tuple[int, ...] | None:
        """The static shape of a tensor-valued node (``None`` for anything else)."""
        if isinstance(node, Unit):
            return node.shape
        if not isinstance(node, fx.Node):
            return None
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            if not all(isinstance(s, int) for s in val.shape):
                raise SpecError(data_dependent(node, tuple(val.shape)))
            return tuple(val.shape)
        return None

    def same(self, x: fx.Node, i: int, y: fx.Node, j: int) -> None:
        sx, sy = self.shape(x), self.shape(y)
        if sx is not None and sy is not None and sx[i] != sy[j]:
            raise SpecError(
                f"while tracing {self.op}: a rule joined axis {i} of {x.name} (length {sx[i]}) "
                f"to axis {j} of {y.name} (length {sy[j]}) — the rule is wrong; please report it"
            )
        self._same((x.name, i), (y.name, j))

    def same_blocks(self, unit: fx.Node, i: int, blocked: fx.Node, j: int) -> None:
        """Axis ``j`` of ``blocked`` is axis ``i`` of ``unit`` merged with the axes after it
        (unit-major): it holds one contiguous block per unit, and blocks move with units."""
        su, sb = self.shape(unit), self.shape(blocked)
        assert su is not None and sb is not None
        if sb[j] % su[i]:
            raise SpecError(
                f"while tracing {self.op}: a rule made axis {j} of {blocked.name} (length "
                f"{sb[j]}) blocks of axis {i} of {unit.name} (length {su[i]}) — the rule is "
                "wrong; please report it"
            )
        self._same((unit.name, i), (blocked.name, j))
        self.fixed_blocks.append((blocked.name, j))

    def nest(self, merged: fx.Node, j: int, split: fx.Node, outer: int, inner: int) -> None:
        """Axis ``j`` of ``merged`` is axes ``outer × inner`` of ``split`` (unit-major):
        blocks of ``outer`` whose entries are the ``inner`` axis. The tracer may then
        permute inside each block, per block, as ``inner``'s class allows (heads)."""
        su, sm = self.shape(split), self.shape(merged)
        assert su is not None and sm is not None
        if sm[j] != su[outer] * su[inner]:
            raise SpecError(
                f"while tracing {self.op}: a rule nested axes {outer}, {inner} of {split.name} "
                f"in axis {j} of {merged.name} with mismatched lengths — the rule is wrong; "
                "please report it"
            )
        if not self.frozen(split, inner) and (
            self.frozen(split, outer) or self._cut_into(merged, j, su[outer], su[inner])
        ):
            # The outer axis never moves (a batch merged with attention heads), or the
            # merged axis is already a sum of ``outer`` parts of the inner's length (that
            # merge split back): the merged axis is ``outer`` copies of the inner axis, each
            # moved by its own permutation, and the outer axis indexes the copies.
            self.direct_sum(merged, j, [(split, inner)] * su[outer])
            self.freeze(split, outer, "indexes the parts of a direct sum")
            return
        self._same((split.name, outer), (merged.name, j))
        self.nests.append(((merged.name, j), (split.name, outer), (split.name, inner)))

    def single_head(
        self, x: fx.Node, xs, i: int, node: fx.Node, out, j: int, dropped: Collection[int] = ()
    ) -> bool:
        """The two reshapes of multi-query attention that look like no reshape at all,
        for their head axis has length 1: a key or value projection's units split into
        one head, ``(…, n) → (…, 1, n)``, and that head repeated for the query heads,
        ``(…, 1, r, …) → (…, r, …)`` (axis ``i`` of ``x`` and ``j`` of ``node`` the axes of
        length ``n`` or ``r``). Grouped-query attention nests both (``kv × d``,
        ``kv × r``); here the first is held back (its projection would otherwise *be* the
        head's dimensions, which a parameter may not index) until the second shows that
        the 1 axis is a head: then both nest as grouped-query attention's do, with one
        key/value head, and :meth:`settle_single_heads` declares what is left. ``dropped``:
        the axes of length 1 of ``x`` that the reshape drops — the repeat's 1 axis must be
        one (a batch of one, kept as the output's first axis, is no head). True where the
        reshape was taken here."""
        if not self.hold_one_heads:
            return False
        if (
            len(out) == len(xs) + 1
            and i == len(xs) - 1
            and j == len(out) - 1
            and out[j - 1] == 1
            and _name(x) in _PROJECTIONS
        ):
            self.one_heads.append([x, i, node, j - 1, j, False])
            return True
        if len(xs) == len(out) + 1 and i - 1 in dropped and self.one_heads:
            # an axis of length 1 joins no class (broadcasting), so the head is found by
            # the data path: the held reshapes this one reads, back to their projections
            waiting = {id(h[2]): h for h in self.one_heads}
            held, seen, stack = [], set(), [x]
            while stack:
                at = stack.pop()
                if id(at) in seen or not isinstance(at, fx.Node):
                    continue
                seen.add(id(at))
                if id(at) in waiting:
                    held.append(waiting[id(at)])
                elif _name(at) not in _PROJECTIONS:
                    stack.extend(tensor_args(at))
            if held:
                for h in held:
                    h[5] = True
                    self._same((h[2].name, h[3]), (x.name, i - 1))  # the one head
                self.nest(node, j, x, i - 1, i)
                return True
        return False

    def settle_single_heads(self) -> None:
        """After every rule: a held-back projection reshape (:meth:`single_head`) whose 1
        axis met a head repeat nests (one head of its units); any other maps through."""
        for x, i, node, one, inner, is_head in self.one_heads:
            self.op = f"reshape of {x.name}"
            if is_head:
                self.nest(x, i, node, one, inner)
                self.one_heads_nested += 1
            else:
                self.same(x, i, node, inner)
        self.one_heads = []

    def direct_sum(self, whole: fx.Node, i: int, parts: Sequence[tuple[Any, int]]) -> None:
        """Axis ``i`` of ``whole`` is the consecutive ``parts`` (``(node, axis)`` pairs, in
        order): each part may carry its own permutation, the whole moves as their direct
        sum."""
        sw = self.shape(whole)
        lengths = [(self.shape(p) or ())[j] for p, j in parts]
        assert sw is not None
        if sw[i] != sum(lengths):
            raise SpecError(
                f"while tracing {self.op}: a rule made axis {i} of {whole.name} (length "
                f"{sw[i]}) the sum of parts of lengths {lengths} — the rule is wrong; please "
                "report it"
            )
        kept = [((p.name, j), n) for (p, j), n in zip(parts, lengths, strict=True) if n > 0]
        if len(kept) == 1:
            self._same((whole.name, i), kept[0][0])
        elif kept:
            self.sums.append(((whole.name, i), kept))

    def _cut_into(self, x: Any, i: int, count: int, length: int) -> bool:
        """Whether axis ``i`` of ``x`` is joined to a direct sum of ``count`` parts of
        ``length`` each."""
        root = self._find((x.name, i))
        return any(
            self._find(whole) == root and len(parts) == count and all(n == length for _, n in parts)
            for whole, parts in self.sums
        )

    def freeze(self, x: fx.Node, i: int, why: str) -> None:
        self._freeze((x.name, i), why)

    def freeze_all(self, x: Any, why: str) -> None:
        shape = self.shape(x)
        if shape is not None:
            for i in range(len(shape)):
                self.freeze(x, i, why)

    def same_all(self, x: fx.Node, y: fx.Node, pairs: Sequence[tuple[int, int]]) -> None:
        for i, j in pairs:
            self.same(x, i, y, j)


def tensor_args(node: fx.Node) -> list[fx.Node]:
    """The tensor-valued nodes among a call's arguments (nested lists included)."""
    found: list[fx.Node] = []

    def visit(a: Any) -> None:
        if isinstance(a, fx.Node) and Axes.shape(a) is not None:
            found.append(a)
        elif isinstance(a, list | tuple):
            for b in a:
                visit(b)

    visit(node.args)
    visit(tuple(node.kwargs.values()))
    return found


def _dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


# -- elementwise and broadcasting -----------------------------------------------------------
def elementwise(node: fx.Node, ax: Axes) -> None:
    """Right-aligned broadcasting: an input axis of the output's length carries the output's
    permutation; an axis of length 1 broadcast against it carries none."""
    for x in tensor_args(node):
        _broadcast(ax, x, node)


def _broadcast(ax: Axes, x: fx.Node, node: fx.Node) -> None:
    """``x`` broadcast to ``node``'s shape, right-aligned: its axes of the output's length
    (more than 1) carry the output's permutation."""
    out, shape = ax.shape(node), ax.shape(x)
    if out is None or shape is None:
        return
    offset = len(out) - len(shape)
    for i, n in enumerate(shape):
        j = i + offset
        if j >= 0 and n == out[j] and n > 1:
            ax.same(x, i, node, j)


def fresh_constant(node: fx.Node, ax: Axes) -> None:
    """A tensor created in forward (``arange``, ``full``): its values may differ along its
    axes, so none may be permuted."""
    ax.freeze_all(node, f"{_name(node)} creates a tensor inside forward")


def like_constant(node: fx.Node, ax: Axes) -> None:
    """``zeros_like`` and friends: every entry equal, so any permutation leaves it as it is."""


# -- dense layers ---------------------------------------------------------------------------
def linear(node: fx.Node, ax: Axes) -> None:
    x, w = node.args[0], node.args[1]
    b = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    xs = ax.shape(x)
    assert xs is not None
    for i in range(len(xs) - 1):
        ax.same(x, i, node, i)
    ax.same(x, len(xs) - 1, w, 1)
    ax.same(w, 0, node, len(xs) - 1)
    if isinstance(b, fx.Node):
        ax.same(b, 0, node, len(xs) - 1)


def convolution(node: fx.Node, ax: Axes) -> None:
    """``conv{1,2,3}d(input, weight, bias, stride, padding, dilation, groups)``: channels are
    units, spatial positions are samples (frozen: the kernel slides over them)."""
    x, w = node.args[0], node.args[1]
    b = node.args[2] if len(node.args) > 2 else None
    groups = node.args[6] if len(node.args) > 6 else node.kwargs.get("groups", 1)
    xs, ws = ax.shape(x), ax.shape(w)
    assert xs is not None and ws is not None
    spatial = len(ws) - 2
    batched = len(xs) == spatial + 2
    c = 1 if batched else 0
    if batched:
        ax.same(x, 0, node, 0)
    for k in range(spatial):
        for t, d in ((x, c + 1 + k), (node, c + 1 + k), (w, 2 + k)):
            ax.freeze(t, d, "spatial axis of a convolution")
    if groups == 1:
        ax.same(x, c, w, 1)
        ax.same(w, 0, node, c)
    elif groups == xs[c] == ws[0]:  # depthwise, one filter per channel
        ax.same(x, c, node, c)
        ax.same(w, 0, node, c)
    else:
        # Output group j reads input group j only: moving whole groups alike on the input
        # and the output commutes; channels inside a group stay (those axes freeze).
        units = ax.unit(node, groups)
        for t, d in ((x, c), (node, c), (w, 0)):
            ax.same_blocks(units, 0, t, d)
        ax.freeze(w, 1, f"inside a group of a grouped convolution ({groups} groups)")
    if isinstance(b, fx.Node):
        ax.same(b, 0, node, c)


def batch_norm(node: fx.Node, ax: Axes) -> None:
    """``batch_norm(input, weight, bias, running_mean, running_var, ...)``: per channel."""
    x = node.args[0]
    xs = ax.shape(x)
    assert xs is not None
    for i in range(len(xs)):
        ax.same(x, i, node, i)
    for p in node.args[1:5]:
        if isinstance(p, fx.Node):
            ax.same(p, 0, node, 1)


def layer_norm(node: fx.Node, ax: Axes) -> None:
    """Mean and variance over the normalised axes are symmetric in their entries, so a
    permutation of those axes commutes with the normalisation."""
    x, normalized = node.args[0], node.args[1]
    xs = ax.shape(x)
    assert xs is not None
    for i in range(len(xs)):
        ax.same(x, i, node, i)
    k = len(normalized)
    for p in node.args[2:4]:
        if isinstance(p, fx.Node):
            for j in range(k):
                ax.same(p, j, node, len(xs) - k + j)


def group_norm(node: fx.Node, ax: Axes) -> None:
    """``group_norm(input, num_groups, weight, bias, eps)``: with one group (or one channel
    per group) any channel permutation commutes; otherwise each group's statistics are
    symmetric in its channels, so the channels are ``groups × per group`` (a nest, as heads
    are): whole groups may move, and the channels inside each group by a permutation of
    their own."""
    x, groups = node.args[0], node.args[1]
    xs = ax.shape(x)
    assert xs is not None
    for i in range(len(xs)):
        if i != 1:
            ax.same(x, i, node, i)
    ax.same(x, 1, node, 1)
    for p in node.args[2:4]:
        if isinstance(p, fx.Node):
            ax.same(p, 0, node, 1)
    if groups not in (1, xs[1]):
        ax.nest(node, 1, ax.unit(node, (groups, xs[1] // groups), "groups"), 0, 1)


def embedding(node: fx.Node, ax: Axes) -> None:
    """``embedding(weight, indices)``: rows are addressed by token id (frozen); the feature
    axis is a unit axis."""
    w, idx = node.args[0], node.args[1]
    ids = ax.shape(idx)
    assert ids is not None
    ax.freeze(w, 0, "embedding rows are looked up by token id")
    for i in range(len(ids)):
        ax.same(idx, i, node, i)
    ax.same(w, 1, node, len(ids))


# -- products -------------------------------------------------------------------------------
def matmul(node: fx.Node, ax: Axes) -> None:
    """``a @ b`` with broadcasting batch axes: the contracted axes carry one permutation
    (``Σ_k a_k b_k`` is invariant when both are permuted alike)."""
    _matmul(ax, node.args[0], node.args[1], node)


def baddbmm(node: fx.Node, ax: Axes) -> None:
    """``baddbmm(x, a, b)`` = ``β·x + α·(a @ b)`` (BLOOM's attention scores with ALiBi's
    per-head bias): the batched product as :func:`matmul`, ``x`` broadcast to the output
    as by :func:`elementwise`."""
    _matmul(ax, node.args[1], node.args[2], node)
    _broadcast(ax, node.args[0], node)


def repeat(node: fx.Node, ax: Axes) -> None:
    """``x.repeat(*sizes)``: an axis repeated once maps through; a tiled one (``r > 1``
    copies end to end) freezes on both sides, as do the new leading axes."""
    x, sizes = node.args[0], list(node.args[1])
    xs = ax.shape(x)
    assert xs is not None
    offset = len(sizes) - len(xs)
    for j in range(offset):
        ax.freeze(node, j, "added by repeat")
    for i in range(len(xs)):
        if sizes[i + offset] == 1:
            ax.same(x, i, node, i + offset)
        else:
            ax.freeze(x, i, "tiled by repeat")
            ax.freeze(node, i + offset, "tiled by repeat")


def _matmul(ax: Axes, a: fx.Node, b: fx.Node, node: fx.Node) -> None:
    sa, sb, so = ax.shape(a), ax.shape(b), ax.shape(node)
    assert sa is not None and sb is not None and so is not None
    if len(sa) == 1 or len(sb) == 1:
        if len(sa) == 1 and len(sb) == 1:
            ax.same(a, 0, b, 0)
            return
        if len(sa) == 1:
            ax.same(a, 0, b, len(sb) - 2)
            ax.same(b, len(sb) - 1, node, len(so) - 1)
            _batch(ax, b, sb[:-2], node, so[:-1])
        else:
            ax.same(a, len(sa) - 1, b, 0)
            ax.same(a, len(sa) - 2, node, len(so) - 1)
            _batch(ax, a, sa[:-2], node, so[:-1])
        return
    ax.same(a, len(sa) - 1, b, len(sb) - 2)
    ax.same(a, len(sa) - 2, node, len(so) - 2)
    ax.same(b, len(sb) - 1, node, len(so) - 1)
    _batch(ax, a, sa[:-2], node, so[:-2])
    _batch(ax, b, sb[:-2], node, so[:-2])


def _batch(ax: Axes, x: fx.Node, batch: Sequence[int], out: fx.Node, out_batch: Sequence[int]):
    offset = len(out_batch) - len(batch)
    for i, n in enumerate(batch):
        if n == out_batch[i + offset] and n > 1:
            ax.same(x, i, out, i + offset)


def addmm(node: fx.Node, ax: Axes) -> None:
    """``addmm(bias, x, w_t)`` = ``bias + x @ w_t``."""
    bias, x, w = node.args[0], node.args[1], node.args[2]
    ax.same(x, 1, w, 0)
    ax.same(x, 0, node, 0)
    ax.same(w, 1, node, 1)
    bs = ax.shape(bias)
    if bs is not None:
        offset = 2 - len(bs)
        for i, n in enumerate(bs):
            if n > 1:
                ax.same(bias, i, node, i + offset)


def einsum(node: fx.Node, ax: Axes) -> None:
    """Every occurrence of one subscript letter carries one permutation."""
    equation, operands = node.args[0], node.args[1]
    spec = equation.replace(" ", "")
    if "..." in spec or "->" not in spec:
        for x in [*operands, node]:
            ax.freeze_all(x, "einsum with an implicit output or '...' has no rule")
        return
    inputs, output = spec.split("->")
    seen: dict[str, tuple[fx.Node, int]] = {}
    for x, letters in [*zip(operands, inputs.split(","), strict=True), (node, output)]:
        for i, letter in enumerate(letters):
            if letter in seen:
                ax.same(*seen[letter], x, i)
            else:
                seen[letter] = (x, i)


def attention(node: fx.Node, ax: Axes) -> None:
    """``scaled_dot_product_attention(q, k, v, attn_mask, ...)``: q and k share their
    feature axis (contracted), v shares its feature axis with the output, keys and values
    share their positions, queries and the output share theirs."""
    q, k, v = node.args[0], node.args[1], node.args[2]
    mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
    sq, sk, sv, so = (ax.shape(t) for t in (q, k, v, node))
    assert sq is not None and sk is not None and sv is not None and so is not None
    n = len(sq)
    ax.same(q, n - 1, k, n - 1)
    ax.same(v, n - 1, node, n - 1)
    ax.same(q, n - 2, node, n - 2)
    ax.same(k, n - 2, v, n - 2)
    for i in range(n - 2):
        for t, s in ((q, sq), (k, sk), (v, sv)):
            if s[i] == so[i]:
                ax.same(t, i, node, i)
    if isinstance(mask, fx.Node):
        sm = ax.shape(mask)
        assert sm is not None
        offset = n - len(sm)
        for i, size in enumerate(sm):
            j = i + offset
            if size > 1 and j == n - 2:
                ax.same(mask, i, q, j)
            elif size > 1 and j == n - 1:
                ax.same(mask, i, k, n - 2)
            elif size > 1 and j >= 0:
                ax.same(mask, i, node, j)


# -- shape manipulation ---------------------------------------------------------------------
def transpose(node: fx.Node, ax: Axes) -> None:
    x, d0, d1 = node.args[0], node.args[1], node.args[2]
    n = len(ax.shape(x) or ())
    d0, d1 = _dim(d0, n), _dim(d1, n)
    order = list(range(n))
    order[d0], order[d1] = order[d1], order[d0]
    ax.same_all(x, node, [(order[j], j) for j in range(n)])


def t(node: fx.Node, ax: Axes) -> None:
    x = node.args[0]
    n = len(ax.shape(x) or ())
    ax.same_all(x, node, [(n - 1 - j, j) for j in range(n)])


def swap_last_two(node: fx.Node, ax: Axes) -> None:
    """``x.mT``, ``x.mH``, ``x.adjoint()``: the last two axes swapped."""
    x = node.args[0]
    n = len(ax.shape(x) or ())
    order = list(range(n))
    if n >= 2:
        order[-1], order[-2] = order[-2], order[-1]
    ax.same_all(x, node, [(order[j], j) for j in range(n)])


def permute(node: fx.Node, ax: Axes) -> None:
    x, dims = node.args[0], node.args[1]
    n = len(ax.shape(x) or ())
    ax.same_all(x, node, [(_dim(d, n), j) for j, d in enumerate(dims)])


def movedim(node: fx.Node, ax: Axes) -> None:
    x, source, destination = node.args[0], node.args[1], node.args[2]
    n = len(ax.shape(x) or ())
    source = [source] if isinstance(source, int) else list(source)
    destination = [destination] if isinstance(destination, int) else list(destination)
    moved = dict(zip((_dim(d, n) for d in destination), (_dim(s, n) for s in source), strict=True))
    rest = iter(i for i in range(n) if i not in moved.values())
    ax.same_all(x, node, [(moved[j] if j in moved else next(rest), j) for j in range(n)])


def unsqueeze(node: fx.Node, ax: Axes) -> None:
    x, d = node.args[0], node.args[1]
    n = len(ax.shape(x) or ())
    d = _dim(d, n + 1)
    ax.same_all(x, node, [(i, i if i < d else i + 1) for i in range(n)])


def squeeze(node: fx.Node, ax: Axes) -> None:
    x = node.args[0]
    xs, out = ax.shape(x), ax.shape(node)
    assert xs is not None and out is not None
    dims = node.args[1] if len(node.args) > 1 else None
    if dims is None:
        removed = {i for i, n in enumerate(xs) if n == 1}
    else:
        dims = [dims] if isinstance(dims, int) else list(dims)
        removed = {_dim(d, len(xs)) for d in dims if xs[_dim(d, len(xs))] == 1}
    kept = [i for i in range(len(xs)) if i not in removed]
    ax.same_all(x, node, list(zip(kept, range(len(out)), strict=True)))


def expand(node: fx.Node, ax: Axes) -> None:
    elementwise(node, ax)


def reduction(node: fx.Node, ax: Axes) -> None:
    """``sum``/``mean``/``amax``/``var`` over some axes: the result does not depend on the
    order of the reduced entries, so those axes are unconstrained; kept axes map through."""
    x = node.args[0]
    xs, out = ax.shape(x), ax.shape(node)
    assert xs is not None and out is not None
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if isinstance(dims, bool) or not isinstance(dims, int | list | tuple | type(None)):
        dims = None  # sum.default(x, dtype): everything is reduced
    keepdim = node.kwargs.get("keepdim", False)
    if len(node.args) > 2 and isinstance(node.args[2], bool):
        keepdim = node.args[2]
    if len(ax.shape(node) or ()) == len(xs):
        keepdim = True
    if dims is None or dims == []:
        reduced = set(range(len(xs)))
    else:
        dims = [dims] if isinstance(dims, int) else list(dims)
        reduced = {_dim(d, len(xs)) for d in dims}
    j = 0
    for i in range(len(xs)):
        if i in reduced:
            j += 1 if keepdim else 0
            continue
        ax.same(x, i, node, j)
        j += 1


def softmax(node: fx.Node, ax: Axes) -> None:
    """``softmax(x, dim)`` is permutation-equivariant along ``dim`` and elementwise across
    the other axes: every axis maps to itself."""
    x = node.args[0]
    ax.same_all(x, node, [(i, i) for i in range(len(ax.shape(x) or ()))])


def pooling(node: fx.Node, ax: Axes, spatial: int, what: str = "pooling") -> None:
    """Pooling (or resampling: ``what``) over the last ``spatial`` axes: channels and batch
    map through, the pooled axes are frozen (positions are samples)."""
    x = node.args[0]
    xs = ax.shape(x)
    assert xs is not None
    for i in range(len(xs) - spatial):
        ax.same(x, i, node, i)
    for i in range(len(xs) - spatial, len(xs)):
        ax.freeze(x, i, f"spatial axis of a {what} op")
        ax.freeze(node, i, f"spatial axis of a {what} op")


def pad(node: fx.Node, ax: Axes) -> None:
    """``pad(input, pad, ...)``, ``constant_pad_nd`` and the reflection/replication pads:
    ``pad`` lists (before, after) amounts from the last axis backwards. Axes it does not pad
    map through — the fill is one constant (or copies along the padded axis) in every
    channel, so a permutation of channels commutes with it; a padded axis is frozen (its
    positions change)."""
    x = node.args[0]
    xs = ax.shape(x)
    assert xs is not None
    amounts = list(node.args[1]) if len(node.args) > 1 else list(node.kwargs["pad"])
    padded = set()
    for k in range(len(amounts) // 2):
        if amounts[2 * k] != 0 or amounts[2 * k + 1] != 0:
            padded.add(len(xs) - 1 - k)
    for i in range(len(xs)):
        if i in padded:
            ax.freeze(x, i, "padded axis")
            ax.freeze(node, i, "padded axis")
        else:
            ax.same(x, i, node, i)


def flatten(node: fx.Node, ax: Axes) -> None:
    reshape(node, ax)


def reshape(node: fx.Node, ax: Axes) -> None:
    x = node.args[0]
    xs, out = ax.shape(x), ax.shape(node)
    assert xs is not None and out is not None
    _reshape_map(ax, x, xs, node, out)


def _reshape_map(ax: Axes, x: fx.Node, xs, node: fx.Node, out) -> None:
    """Walk both shapes in step, pairing runs of axes with equal products. A run whose
    non-unit axes are one on each side maps that axis through. A run that merges axes
    (flatten of ``C×H×W``; heads ``H×E`` back into the model width) makes the merged axis
    blocks of its first (outer) axis, and one that splits an axis (the width into heads)
    makes it blocks of the first new axis: the groups then move whole blocks (a convolution's
    channel with its positions, a head with its dimensions). Two axes against one are a
    *nest* (:meth:`Axes.nest`): the inner axis stays free, and the tracer decides afterwards
    whether permutations inside each block can be expressed (heads); with more than two,
    the inner axes are frozen."""
    i = j = 0
    dropped: set[int] = set()  # input axes of length 1 with no output axis of their own
    while i < len(xs) or j < len(out):
        ins, outs = [], []
        pin = pout = 1
        if i < len(xs):
            ins.append(i)
            pin *= xs[i]
            i += 1
        if j < len(out):
            outs.append(j)
            pout *= out[j]
            j += 1
        while pin != pout:
            if pin < pout and i < len(xs):
                ins.append(i)
                pin *= xs[i]
                i += 1
            elif j < len(out):
                outs.append(j)
                pout *= out[j]
                j += 1
            else:
                break
        # trailing size-1 axes join the run they follow
        while i < len(xs) and xs[i] == 1 and (j >= len(out) or out[j] != 1):
            ins.append(i)
            dropped.add(i)
            i += 1
        while j < len(out) and out[j] == 1 and (i >= len(xs) or xs[i] != 1):
            outs.append(j)
            j += 1
        big_in = [d for d in ins if xs[d] > 1]
        big_out = [d for d in outs if out[d] > 1]
        inner = (
            "inside a block (a reshape merged or split it; inner permutations are not expressed)"
        )
        if len(big_in) == 1 and len(big_out) == 1:
            if not ax.single_head(x, xs, big_in[0], node, out, big_out[0], dropped):
                ax.same(x, big_in[0], node, big_out[0])
        elif len(big_in) == 2 and len(big_out) == 1:  # heads × head dims → width
            ax.nest(node, big_out[0], x, big_in[0], big_in[1])
        elif len(big_in) == 1 and (
            _fused_parts(ax, x, big_in[0], node, big_out)
            or _head_fused_parts(ax, x, big_in[0], node, big_out)
        ):
            pass
        elif len(big_in) == 1 and len(big_out) == 2:  # width → heads × head dims
            ax.nest(x, big_in[0], node, big_out[0], big_out[1])
        elif len(big_in) > 1 and len(big_out) == 1:
            ax.same_blocks(x, big_in[0], node, big_out[0])
            for d in big_in[1:]:
                ax.freeze(x, d, inner)
        elif len(big_in) == 1 and len(big_out) > 1:
            ax.same_blocks(node, big_out[0], x, big_in[0])
            for d in big_out[1:]:
                ax.freeze(node, d, inner)
        elif big_in and big_out and _regroup(ax, x, big_in, node, big_out):
            pass
        elif big_in or big_out:
            why = (
                f"reshape {tuple(xs[d] for d in ins)} → {tuple(out[d] for d in outs)} regroups "
                "several axes into several"
            )
            for d in big_in:
                ax.freeze(x, d, why)
            for d in big_out:
                ax.freeze(node, d, why)


def _regroup(ax: Axes, x: fx.Node, ins: list[int], node: fx.Node, outs: list[int]) -> bool:
    """A reshape of several axes into several — ``(N, H·d) → (N·H, d)``, how
    ``nn.MultiheadAttention`` merges the batch with the heads — through the common
    refinement of both sides (``(N, H, d)``, an axis of its own): an axis that is one axis
    of the refinement maps to it, one that is two is their nest (:meth:`Axes.nest`). False
    (nothing declared) when the lengths have no common refinement or an axis spans more
    than two of its axes."""
    xs, out = ax.shape(x), ax.shape(node)
    assert xs is not None and out is not None
    sides = [[xs[d] for d in ins], [out[d] for d in outs]]
    bounds = sorted({p for side in sides for p in _cumulative(side)})
    if any(b % a for a, b in zip([1, *bounds], bounds, strict=False)):
        return False
    spans = []
    for side in sides:
        spans.append([])
        start = 1
        for end in _cumulative(side):
            spans[-1].append([k for k, b in enumerate(bounds) if start < b <= end])
            start = end
    if any(len(span) > 2 for side in spans for span in side):
        return False
    steps = tuple(b // a for a, b in zip([1, *bounds], bounds, strict=False))
    fine = ax.unit(node, steps, "regroup")
    for t, dims, side in ((x, ins, spans[0]), (node, outs, spans[1])):
        for d, span in zip(dims, side, strict=True):
            if len(span) == 1:
                ax.same(fine, span[0], t, d)
    # nests last, so that an outer axis is frozen (a batch) when it is declared
    for t, dims, side in ((x, ins, spans[0]), (node, outs, spans[1])):
        for d, span in zip(dims, side, strict=True):
            if len(span) == 2:
                ax.nest(t, d, fine, span[0], span[1])
    return True


def _cumulative(lengths: Sequence[int]) -> list[int]:
    out, p = [], 1
    for n in lengths:
        p *= n
        out.append(p)
    return out


# Ops that only move, add or drop axes of length 1: where each axis of the input goes.
def _moves(node: fx.Node) -> dict[int, int] | None:
    name = _name(node)
    x = node.args[0] if node.args else None
    xs = Axes.shape(x)
    if xs is None or Axes.shape(node) is None:
        return None
    n = len(xs)
    if name in ("contiguous.default", "clone.default", "alias.default", "detach.default"):
        return {i: i for i in range(n)}
    if name == "transpose.int":
        d0, d1 = _dim(node.args[1], n), _dim(node.args[2], n)
        order = {i: i for i in range(n)}
        order[d0], order[d1] = d1, d0
        return order
    if name == "permute.default":
        return {_dim(d, n): j for j, d in enumerate(node.args[1])}
    if name == "unsqueeze.default":
        d = _dim(node.args[1], n + 1)
        return {i: i if i < d else i + 1 for i in range(n)}
    if name.startswith("squeeze"):
        dims = node.args[1] if len(node.args) > 1 else None
        if dims is None:
            removed = {i for i, k in enumerate(xs) if k == 1}
        else:
            dims = [dims] if isinstance(dims, int) else list(dims)
            removed = {_dim(d, n) for d in dims if xs[_dim(d, n)] == 1}
        kept = [i for i in range(n) if i not in removed]
        return {i: j for j, i in enumerate(kept)}
    return None


def _part_reads(node: fx.Node, axis: int, rest: list[int]):
    """Where the parts of a fused projection are read: follows ``node`` through ops that
    only move axes (:func:`_moves`) to ``select``/``unbind`` along ``axis``. Returns
    ``[(index, reader, {rest axis: its position in the reader})]``, or ``None`` if anything
    else reads ``axis`` (then the axis is not a list of parts)."""
    found = []
    todo = [(node, {axis: axis, **{r: r for r in rest}})]
    while todo:
        at, where = todo.pop()
        for user in at.users:
            name = _name(user)
            if name == "select.int" and user.args[0] is at:
                d = _dim(user.args[1], len(Axes.shape(at) or ()))
                if d != where[axis]:
                    return None
                index = _dim(user.args[2], (Axes.shape(at) or ())[d])
                kept = {r: p - (p > d) for r, p in where.items() if r != axis}
                found.append((index, user, kept))
            elif name == "unbind.int" and user.args[0] is at:
                d = _dim(user.args[1] if len(user.args) > 1 else 0, len(Axes.shape(at) or ()))
                if d != where[axis] or any(u.target is not operator.getitem for u in user.users):
                    return None
                kept = {r: p - (p > d) for r, p in where.items() if r != axis}
                found += [(item.args[1], item, kept) for item in user.users]
            elif (
                (moved := _moves(user)) is not None
                and user.args[0] is at
                and all(a is not at for a in [*user.args[1:], *user.kwargs.values()])
            ):
                todo.append((user, {r: moved[p] for r, p in where.items()}))
            else:
                return None
    return found or None


def _fused_parts(ax: Axes, x: fx.Node, i: int, node: fx.Node, outs: list[int]) -> bool:
    """A fused projection split by a reshape whose first new axis only ``select``/``unbind``
    read — ``unflatten(-1, (3, E))`` then ``[0], [1], [2]`` in ``nn.MultiheadAttention``,
    ``reshape(B, N, 3, H, d).unbind`` in timm-style attention: axis ``i`` of ``x`` is the
    direct sum of the parts (each may move by its own permutation), and each part relates
    to what its reader sees of the other new axes (one: the same axis; two: a nest)."""
    out = ax.shape(node)
    assert out is not None
    first, rest = outs[0], outs[1:]
    if len(rest) > 2 or ax.frozen(node, first):
        return False
    reads = _part_reads(node, first, rest)
    if reads is None:
        return False
    width = 1
    for d in rest:
        width *= out[d]
    parts = [ax.unit(node, width, f"part{k}") for k in range(out[first])]
    ax.direct_sum(x, i, [(p, 0) for p in parts])
    for index, reader, where in reads:
        reader.meta["lmckit_parts"] = set(where.values())
        if len(rest) == 1:
            ax.same(parts[index], 0, reader, where[rest[0]])
        else:
            ax.nest(parts[index], 0, reader, where[rest[0]], where[rest[1]])
    return True


def _head_fused_parts(ax: Axes, x: fx.Node, i: int, node: fx.Node, outs: list[int]) -> bool:
    """A fused projection laid out head by head and split by a reshape into ``(heads,
    parts, d)`` whose middle axis only ``select``/``unbind`` read — BLOOM's and Persimmon's
    ``view(B, S, H, 3, d)`` then ``[..., 0, :]``, ``[..., 1, :]``, ``[..., 2, :]``: axis
    ``i`` of ``x`` nests the heads over a per-head direct sum of the parts (each part's
    ``d`` dimensions may move by its own permutation inside every head, as GPT-NeoX's
    ``(H, 3·d)`` layout split by slices), the readers' head axis is the heads."""
    out = ax.shape(node)
    assert out is not None
    if len(outs) != 3 or ax.frozen(node, outs[1]):
        return False
    heads, middle, inner = outs
    reads = _part_reads(node, middle, [heads, inner])
    if reads is None:
        return False
    layout = ax.unit(node, (out[heads], out[middle] * out[inner]), "heads")
    parts = [ax.unit(node, out[inner], f"part{k}") for k in range(out[middle])]
    ax.nest(x, i, layout, 0, 1)
    ax.direct_sum(layout, 1, [(p, 0) for p in parts])
    ax.same(layout, 0, node, heads)
    for index, reader, where in reads:
        reader.meta["lmckit_parts"] = {where[inner]}  # the heads map through the select
        ax.same(parts[index], 0, reader, where[inner])
    return True


def select(node: fx.Node, ax: Axes) -> None:
    """``select(x, dim, index)``: picks one position — that axis is frozen. The reader of
    one part of a fused projection (:func:`_fused_parts`) does not map the part's axes,
    which belong to its own part, not to every part's shared axis."""
    x, d = node.args[0], node.args[1]
    n = len(ax.shape(x) or ())
    d = _dim(d, n)
    ax.freeze(x, d, "indexed by select")
    own = node.meta.get("lmckit_parts", set())
    ax.same_all(
        x, node, [(i, j) for i in range(n) if i != d if (j := i if i < d else i - 1) not in own]
    )


def unbind(node: fx.Node, ax: Axes) -> None:
    """``unbind(x, dim)``: every position of that axis becomes a result (frozen axis);
    :func:`getitem` maps the other axes."""
    x = node.args[0]
    n = len(ax.shape(x) or ())
    d = _dim(node.args[1] if len(node.args) > 1 else 0, n)
    ax.freeze(x, d, "indexed by unbind")
    node.meta["lmckit_unbind"] = (x, d)


SLICED = "sliced"
"""Why a slice freezes the axis it cuts (a rotary embedding's halves, a partial range)."""

REPEATED = "repeated in place (repeat_interleave)"
"""Why ``repeat_interleave`` freezes its axis (GPT-J's interleaved rotary tables)."""

PINNING = frozenset({SLICED, REPEATED})
"""Freeze reasons of a head's inner axis under which the heads may still move whole: the
dimensions are cut apart or multiplied by a table that every head shares (rotary
embeddings), not indexed by a parameter. The equivalence check confirms each spec."""


def _slice_range(node: fx.Node, length: int) -> tuple[int, int, int, int]:
    """``(dim, begin, stop, step)`` of ``slice(x, dim, start, end, step)`` on an axis of
    ``length`` (``dim`` as given; ``begin``/``stop`` clipped to the axis)."""
    d = node.args[1] if len(node.args) > 1 else 0
    start = node.args[2] if len(node.args) > 2 else None
    end = node.args[3] if len(node.args) > 3 else None
    step = node.args[4] if len(node.args) > 4 else 1
    begin = _dim(start or 0, length) if start is not None else 0
    stop = length if end is None else min(_dim(end, length), length)
    return d, begin, stop, step


# ops whose last output axis is a linear layer's units: a slice of it is part of a projection
_PROJECTIONS = frozenset({"linear.default", "addmm.default", "mm.default"})


def _projection_tiles(x: fx.Node, d: int, ax: Axes) -> list[fx.Node] | None:
    """The slices that cut a fused projection into its parts — Phi-3's
    ``qkv[..., :q], qkv[..., q:q + kv], qkv[..., q + kv:]`` — in order, where every reader
    of the projection's output ``x`` slices its units axis ``d`` and the slices tile it
    (consecutive, no gap, no overlap, at least two); else None. Slices that do not tile a
    projection (a rotary embedding's halves of a head, read beside the whole head) freeze."""
    xs = ax.shape(x)
    if xs is None or d != len(xs) - 1 or _name(x) not in _PROJECTIONS:
        return None
    ranges = []
    for user in x.users:
        if _name(user) != "slice.Tensor" or user.args[0] is not x:
            return None
        ud, begin, stop, step = _slice_range(user, xs[d])
        if _dim(ud, len(xs)) != d or step != 1 or stop <= begin:
            return None
        ranges.append((begin, stop, user))
    ranges.sort(key=lambda r: (r[0], r[1]))
    at = 0
    for begin, stop, _ in ranges:
        if begin != at:
            return None
        at = stop
    if at != xs[d] or len(ranges) < 2:
        return None
    return [user for _, _, user in ranges]


def slice_(node: fx.Node, ax: Axes) -> None:
    """``slice(x, dim, start, end, step)``: the full range maps through; a part freezes —
    unless the slices tile a fused projection's units (:func:`_projection_tiles`): then the
    axis is the direct sum of the slices, each of which may move by its own permutation, as
    ``split`` makes it."""
    x = node.args[0]
    xs = ax.shape(x)
    assert xs is not None
    d = _dim(node.args[1] if len(node.args) > 1 else 0, len(xs))
    start = node.args[2] if len(node.args) > 2 else None
    end = node.args[3] if len(node.args) > 3 else None
    step = node.args[4] if len(node.args) > 4 else 1
    whole = (start in (None, 0)) and (end is None or end >= xs[d]) and step == 1
    tiles = None if whole else _projection_tiles(x, d, ax)
    for i in range(len(xs)):
        if i != d or whole:
            ax.same(x, i, node, i)
    if tiles is not None:
        if not x.meta.get("lmckit_tiled"):  # the first slice declares the sum of them all
            x.meta["lmckit_tiled"] = True
            ax.direct_sum(x, d, [(t, d) for t in tiles])
        return
    if not whole:
        ax.freeze(x, d, SLICED)
        ax.freeze(node, d, SLICED)
        if step == 1:
            begin = _dim(start or 0, xs[d])
            stop = xs[d] if end is None else min(_dim(end, xs[d]), xs[d])
            ax.slices.append(((node.name, d), (x.name, d), begin, stop))


def cat(node: fx.Node, ax: Axes) -> None:
    """``cat(tensors, dim)``: other axes map through; the joined axis is the direct sum of
    the parts' axes (each part may move by its own permutation)."""
    parts = [p for p in node.args[0] if ax.shape(p) is not None]
    out = ax.shape(node)
    assert out is not None
    d = _dim(node.args[1] if len(node.args) > 1 else 0, len(out))
    for p in parts:
        for i in range(len(out)):
            if i != d:
                ax.same(p, i, node, i)
    source = _rejoined(ax, [(p.name, d) for p in parts], out[d])
    if source is not None:
        ax._same((node.name, d), source)
    else:
        ax.direct_sum(node, d, [(p, d) for p in parts])


def _rejoined(ax: Axes, parts: list[tuple[str, int]], length: int) -> tuple[str, int] | None:
    """The axis that ``parts`` cut into consecutive ranges covering it in order — each part
    a slice of it, or joined to one by the ops between (partial rotary embeddings:
    ``cat(rotate(x[..., :r]), x[..., r:])``) — or None. The cat's axis is then that axis
    again (frozen, as the slices froze it), not a sum of parts, so what reads it (the
    query-key product) meets the projection's own axis."""
    if len(parts) < 2:
        return None
    # a part's class may hold slices of several axes (rotary tables join the queries' and
    # the keys' rotated halves): look for one cut axis that every part is a range of
    ranges: list[dict[Any, tuple[int, int, tuple[str, int]]]] = []
    for part in parts:
        root = ax._find(part)
        ranges.append(
            {ax._find(c[1]): (c[2], c[3], c[1]) for c in ax.slices if ax._find(c[0]) == root}
        )
    for source, (_, _, key) in ranges[0].items():
        if not all(source in r for r in ranges):
            continue
        position = 0
        for r in ranges:
            begin, stop, _ = r[source]
            if begin != position:
                break
            position = stop
        else:
            if position == length:
                return key
    return None


def stack(node: fx.Node, ax: Axes) -> None:
    """``stack(tensors, dim)``: every input's axes map through to the output's, skipping
    the new axis, which indexes the inputs (it freezes: its entries are not alike)."""
    parts = [p for p in node.args[0] if ax.shape(p) is not None]
    out = ax.shape(node)
    assert out is not None
    d = _dim(node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0), len(out))
    for p in parts:
        ax.same_all(p, node, [(i, i if i < d else i + 1) for i in range(len(out) - 1)])
    ax.freeze(node, d, "the axis stack makes indexes its inputs")


def repeat_interleave(node: fx.Node, ax: Axes) -> None:
    """``repeat_interleave(x, repeats, dim)``: the other axes map through; the repeated
    axis freezes on both sides (each entry repeated in place: GPT-J's interleaved rotary
    tables)."""
    x = node.args[0]
    xs = ax.shape(x)
    assert xs is not None
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim")
    if dim is None:  # flattened first: nothing maps through
        ax.freeze_all(x, "repeat_interleave without dim flattens its input")
        ax.freeze_all(node, "repeat_interleave without dim flattens its input")
        return
    d = _dim(dim, len(xs))
    for i in range(len(xs)):
        if i != d:
            ax.same(x, i, node, i)
    ax.freeze(x, d, REPEATED)
    ax.freeze(node, d, REPEATED)


def data_dependent(node: fx.Node, sizes: tuple[Any, ...]) -> str:
    """Why a graph with sizes computed from the data cannot be traced: the rules relate
    axes of fixed sizes."""
    return (
        f"{node.name} ({node.target}) has sizes computed from the data ({sizes}): the tracer "
        "relates axes of fixed sizes only, so this model's graph cannot be traced (a boolean "
        "mask's selection, or a split by computed counts as JetMoE's experts dispatch their "
        "tokens, makes such sizes; experts through transformers' interface, as Mixtral's, "
        "trace)"
    )


def split(node: fx.Node, ax: Axes) -> None:
    """``split``/``split_with_sizes``/``chunk``: the split axis is the direct sum of the
    parts (a fused query/key/value projection: each part may move by its own
    permutation). Each part is an axis of its own, read by ``getitem``
    (:func:`getitem`)."""
    x = node.args[0]
    xs = ax.shape(x)
    assert xs is not None
    d = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    d = _dim(d, len(xs))
    sizes = node.args[1]
    if not isinstance(sizes, int) and not all(isinstance(k, int) for k in sizes):
        raise SpecError(data_dependent(node, tuple(sizes)))
    positions = torch.arange(xs[d])
    if str(node.target).startswith("aten.chunk"):
        pieces = positions.chunk(int(sizes))
    else:
        pieces = positions.split(sizes if isinstance(sizes, int) else list(sizes))
    parts = [ax.unit(node, len(p), f"part{k}") for k, p in enumerate(pieces)]
    ax.direct_sum(x, d, [(u, 0) for u in parts])
    node.meta["lmckit_split"] = (x, d, parts)


def getitem(node: fx.Node, ax: Axes) -> None:
    """``operator.getitem`` on a multi-output op: one rule per producer."""
    source = node.args[0]
    if not isinstance(source, fx.Node):
        return
    if "lmckit_split" in source.meta:
        x, d, parts = source.meta["lmckit_split"]
        n = len(ax.shape(x) or ())
        for i in range(n):
            if i != d:
                ax.same(x, i, node, i)
            else:
                ax.same(parts[node.args[1]], 0, node, d)
        return
    if "lmckit_unbind" in source.meta:
        x, d = source.meta["lmckit_unbind"]
        own = node.meta.get("lmckit_parts", set())
        n = len(ax.shape(x) or ())
        pairs = [(i, j) for i in range(n) if i != d if (j := i if i < d else i - 1) not in own]
        ax.same_all(x, node, pairs)
        return
    if "lmckit_topk" in source.meta:
        x, d, values = source.meta["lmckit_topk"]
        n = len(ax.shape(x) or ())
        ax.same_all(x, node, [(i, i) for i in range(n) if i != d])
        ax.freeze(node, d, "topk ranks its entries")
        if node.args[1] == 1:
            node.meta["lmckit_values"] = values
        return
    if source.target in _FIRST_OUTPUT_IS_SAME and node.args[1] == 0:
        x = source.args[0]
        ax.same_all(x, node, [(i, i) for i in range(len(ax.shape(x) or ()))])
        return
    ax.freeze_all(node, f"output {node.args[1]} of {_name(source)} has no rule")


# -- index values -----------------------------------------------------------------------------
# An integer tensor whose *values* index an axis (the experts ``topk`` picks from a router's
# scores) carries that axis's permutation in its values: ``node.meta["lmckit_values"]`` is a
# :class:`Unit` whose axis 0 is joined to the indexed axis. Ops that only move the values
# (reshapes, copies) hand the unit on (:func:`carry_values`); ``index`` reads it; any other op
# that computes with them freezes it, so that values the tracer does not follow never move.
VALUES_USED = "indices whose values {} computes with (the tracer follows values only into index)"


def topk(node: fx.Node, ax: Axes) -> None:
    """``topk(x, k, dim)``: the other axes map through to both results; the ``k`` axis ranks
    the entries (frozen), and the indices' *values* index ``x``'s ``dim`` (a mixture of
    experts' router: permuting the experts permutes the indices it picks, not their order).
    :func:`getitem` reads the results."""
    x = node.args[0]
    xs = ax.shape(x)
    assert xs is not None
    d = _dim(node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", -1), len(xs))
    values = ax.unit(node, xs[d], "values")
    ax.same(values, 0, x, d)
    node.meta["lmckit_topk"] = (x, d, values)


def index(node: fx.Node, ax: Axes) -> None:
    """``x[..., idx, ...]`` (``aten.index.Tensor``) with one integer index tensor: the axes
    before and after the indexed one map through, ``idx``'s axes become the result's in its
    place, and the indexed axis moves with ``idx``'s values where they are followed (see
    :func:`topk`) — else it freezes. Boolean masks and several index tensors freeze all."""
    x, indices = node.args[0], list(node.args[1])
    xs, out = ax.shape(x), ax.shape(node)
    assert xs is not None
    given = [(k, t) for k, t in enumerate(indices) if t is not None]
    idx = given[0][1] if len(given) == 1 else None
    val = idx.meta.get("val") if isinstance(idx, fx.Node) else None
    ids = ax.shape(idx)
    if (
        idx is None
        or out is None
        or ids is None
        or not isinstance(val, torch.Tensor)
        or val.dtype == torch.bool
        or len(out) != len(xs) - 1 + len(ids)
    ):
        why = "indexed by a mask or several index tensors (aten.index)"
        for _, t in given:
            if isinstance(t, fx.Node):
                freeze_values(t, ax, "aten.index")
                ax.freeze_all(t, why)
        ax.freeze_all(x, why)
        if out is not None:
            ax.freeze_all(node, why)
        return
    k = given[0][0]
    for i in range(k):
        ax.same(x, i, node, i)
    for j in range(len(ids)):
        ax.same(idx, j, node, k + j)
    for i in range(k + 1, len(xs)):
        ax.same(x, i, node, i - 1 + len(ids))
    values = idx.meta.get("lmckit_values")
    if values is None:
        ax.freeze(x, k, "indexed by values the tracer does not follow (aten.index)")
    else:
        ax.same(values, 0, x, k)
        ax.indexed.append((x.name, k))


def freeze_values(x: fx.Node, ax: Axes, op: str) -> None:
    """Freeze the axis ``x``'s values index, if it carries one (see :func:`topk`)."""
    values = x.meta.get("lmckit_values")
    if isinstance(values, Unit):
        ax.freeze(values, 0, VALUES_USED.format(op))


def carry_values(node: fx.Node, ax: Axes) -> None:
    """After ``node``'s rule: an op that only moves its input's values hands their unit on;
    every other reader of followed values (but ``index``, which reads them) freezes it."""
    carried = [a for a in _tensor_arg_nodes(node) if "lmckit_values" in a.meta]
    if not carried:
        return
    only = carried[0] if len(carried) == 1 else None
    if node.target in _MOVE_VALUES and only is node.args[0]:
        node.meta["lmckit_values"] = carried[0].meta["lmckit_values"]
        return
    if node.target in _INDEX:
        return
    for a in carried:
        freeze_values(a, ax, _name(node))


def _tensor_arg_nodes(node: fx.Node) -> list[fx.Node]:
    found: list[fx.Node] = []

    def visit(a: Any) -> None:
        if isinstance(a, fx.Node):
            found.append(a)
        elif isinstance(a, list | tuple):
            for b in a:
                visit(b)

    visit(node.args)
    visit(tuple(node.kwargs.values()))
    return found


def _name(node: fx.Node) -> str:
    return str(getattr(node.target, "__name__", node.target))


# -- the table ------------------------------------------------------------------------------
def _ops(*names: str) -> list:
    found = []
    for name in names:
        packet, _, overload = name.partition(".")
        op = getattr(aten, packet, None)
        if op is None:
            continue
        overloads = [overload] if overload else list(op.overloads())
        for o in overloads:
            if hasattr(op, o):
                found.append(getattr(op, o))
    return found


_ELEMENTWISE = (
    "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "neg", "relu", "relu_",
    "gelu", "silu", "silu_", "sigmoid", "tanh", "hardtanh", "hardtanh_", "leaky_relu",
    "leaky_relu_", "elu", "selu", "softplus", "mish", "hardswish", "hardsigmoid", "exp",
    "log", "sqrt", "rsqrt", "pow", "abs", "clamp", "clamp_", "clamp_min", "clamp_max",
    "maximum", "minimum", "where", "clone", "contiguous", "detach", "detach_", "alias",
    "dropout", "dropout_", "feature_dropout", "alpha_dropout", "lift_fresh_copy", "to",
    "_to_copy", "type_as", "copy_", "erf", "tanh_", "sigmoid_", "square", "reciprocal",
    "masked_fill", "masked_fill_", "logical_not", "eq", "ne", "lt", "le", "gt", "ge",
    "bitwise_not", "bitwise_and", "bitwise_or", "sign", "cos", "sin",
)  # fmt: skip
_FIRST_OUTPUT_IS_SAME = set(_ops("max_pool2d_with_indices", "max_pool1d_with_indices"))


def _pooling(spatial: int) -> Rule:
    return lambda node, ax: pooling(node, ax, spatial)


def _resampling(spatial: int) -> Rule:
    """Upsampling (nearest, linear, bilinear, bicubic, trilinear) of the last ``spatial``
    axes: each channel resampled alone, like pooling."""
    return lambda node, ax: pooling(node, ax, spatial, "resampling")


_TABLE: list[tuple[Rule, tuple[str, ...]]] = [
    (elementwise, _ELEMENTWISE),
    (expand, ("expand", "expand_as", "broadcast_to")),
    (
        like_constant,
        (
            "zeros_like",
            "ones_like",
            "empty_like",
            "full_like",
            # created in forward, but every entry equal: no permutation can tell
            "zeros",
            "ones",
            "full",
            "new_zeros",
            "new_ones",
            "new_full",
            "fill",
            "fill_",
        ),
    ),
    (fresh_constant, ("arange", "empty", "new_empty", "randn", "rand", "scalar_tensor")),
    (linear, ("linear",)),
    (convolution, ("conv1d", "conv2d", "conv3d")),
    (batch_norm, ("batch_norm",)),
    (layer_norm, ("layer_norm",)),
    (group_norm, ("group_norm",)),
    (embedding, ("embedding",)),
    (matmul, ("matmul", "bmm", "mm")),
    (baddbmm, ("baddbmm",)),
    (repeat, ("repeat",)),
    (addmm, ("addmm",)),
    (einsum, ("einsum",)),
    (attention, ("scaled_dot_product_attention",)),
    (transpose, ("transpose", "swapaxes")),
    (t, ("t", "numpy_T")),
    (swap_last_two, ("mT", "mH", "adjoint")),
    (permute, ("permute",)),
    (movedim, ("movedim", "moveaxis")),
    (unsqueeze, ("unsqueeze",)),
    (squeeze, ("squeeze",)),
    (reduction, ("sum", "mean", "amax", "amin", "var", "std", "prod", "logsumexp")),
    (softmax, ("softmax", "_softmax", "log_softmax", "_log_softmax")),
    (_pooling(1), ("max_pool1d", "avg_pool1d", "adaptive_avg_pool1d")),
    (
        _pooling(2),
        (
            "max_pool2d",
            "avg_pool2d",
            "adaptive_avg_pool2d",
            "adaptive_max_pool2d",
            "max_pool2d_with_indices",
        ),
    ),
    (_pooling(3), ("max_pool3d", "avg_pool3d", "adaptive_avg_pool3d")),
    (_resampling(1), ("upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_linear1d")),
    (
        _resampling(2),
        (
            "upsample_nearest2d",
            "_upsample_nearest_exact2d",
            "upsample_bilinear2d",
            "_upsample_bilinear2d_aa",
            "upsample_bicubic2d",
            "_upsample_bicubic2d_aa",
        ),
    ),
    (
        _resampling(3),
        ("upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_trilinear3d"),
    ),
    (
        pad,
        (
            "pad",
            "constant_pad_nd",
            "reflection_pad1d",
            "reflection_pad2d",
            "reflection_pad3d",
            "replication_pad1d",
            "replication_pad2d",
            "replication_pad3d",
        ),
    ),
    (flatten, ("flatten",)),
    (reshape, ("view", "reshape", "_unsafe_view", "unflatten")),
    (select, ("select",)),
    (unbind, ("unbind",)),
    (slice_, ("slice",)),
    (cat, ("cat", "concat", "concatenate")),
    (stack, ("stack",)),
    (repeat_interleave, ("repeat_interleave",)),
    (split, ("split", "split_with_sizes", "chunk")),
    (topk, ("topk",)),
    (index, ("index.Tensor",)),
]
RULES: dict[Any, Rule] = {op: rule for rule, names in _TABLE for op in _ops(*names)}
RULES[operator.getitem] = getitem
_INDEX = frozenset(_ops("index.Tensor"))
_MOVE_VALUES = frozenset(
    _ops(
        "view", "reshape", "_unsafe_view", "unflatten", "flatten", "unsqueeze", "squeeze",
        "clone", "contiguous", "alias", "detach", "lift_fresh_copy", "expand", "transpose",
        "permute", "t", "slice", "select", "repeat_interleave",
    )
)  # fmt: skip


def rule_for(target: Any) -> Rule | None:
    """The rule of an op: from the table, else :func:`elementwise` for every op PyTorch
    tags ``pointwise`` (each output entry a function of the inputs' entries at the same,
    broadcast, position — exactly what the rule assumes), so no elementwise operator of
    the ATen set is left without one. The trace's verification checks the result either
    way."""
    rule = RULES.get(target)
    if rule is None and torch.Tag.pointwise in getattr(target, "tags", ()):
        return elementwise
    return rule


# Ops with no tensor result (shape assertions, symbolic sizes) relate nothing.
IGNORED = re.compile(r"^(aten\._assert|aten\.sym_|aten\._assert_tensor_metadata|_operator\.)")
