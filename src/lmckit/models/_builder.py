"""Shared mechanics for building a model's :class:`~lmckit.perm.PermutationSpec` from its layers.

Each zoo model walks its own configuration and declares, layer by layer, which group
permutes the output units and which the input units. The builder turns those declarations
into the per-tensor axis lists, so no key list is written by hand and none can drift.
"""

from __future__ import annotations

from torch import nn

from lmckit.perm import PermutationSpec

Group = str | None


class SpecBuilder:
    """Accumulates groups and per-tensor axes; :meth:`build` returns the spec."""

    def __init__(self) -> None:
        self.groups: dict[str, int] = {}
        self.axes: dict[str, tuple[Group, ...]] = {}
        self.self_maps: set[str] = set()

    def group(self, name: str, size: int) -> str:
        """Declare a group (idempotent for the same size) and return its name."""
        if self.groups.setdefault(name, size) != size:
            raise ValueError(f"group {name!r} declared with sizes {self.groups[name]} and {size}")
        return name

    def _add(self, key: str, axes: tuple[Group, ...]) -> None:
        if key in self.axes:
            raise ValueError(f"tensor {key!r} declared twice")
        self.axes[key] = axes

    def dense(self, prefix: str, layer: nn.Linear | nn.Conv2d, out: Group, inp: Group) -> None:
        """A Linear ``(out, in)`` or Conv2d ``(out, in, kh, kw)`` layer and its bias."""
        extra: tuple[Group, ...] = (None,) * (layer.weight.ndim - 2)
        self._add(f"{prefix}.weight", (out, inp, *extra))
        if out is not None and out == inp:
            self.self_maps.add(f"{prefix}.weight")
        if layer.bias is not None:
            self._add(f"{prefix}.bias", (out,))

    def norm(self, prefix: str, layer: nn.Module, group: Group) -> None:
        """A normalisation layer: affine weight/bias and, for BatchNorm, its running statistics."""
        for name, _ in layer.named_parameters(recurse=False):
            self._add(f"{prefix}.{name}", (group,))
        for name, buf in layer.named_buffers(recurse=False):
            if buf is None:
                continue
            self._add(f"{prefix}.{name}", (group,) if buf.ndim == 1 else ())

    def build(self) -> PermutationSpec:
        """The :class:`PermutationSpec` of everything declared."""
        return PermutationSpec(
            groups=self.groups, axes=self.axes, self_maps=frozenset(self.self_maps)
        )
