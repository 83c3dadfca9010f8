"""Normalisation layers of the zoo, chosen by name.

``"batch"`` is BatchNorm (1-D for MLPs, 2-D for conv nets). ``"layer"`` is LayerNorm over the
feature/channel axis: for conv nets it normalises the C channels at every spatial position,
as flax's ``nn.LayerNorm`` does in Git Re-Basin's LayerNorm VGG/ResNet. Both are equivariant
to permuting channels, so their per-channel weight, bias and running statistics join the
channel's permutation group.
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from lmckit.errors import ModelConfigError

NORMS = (None, "batch", "layer")


class ChannelLayerNorm(nn.LayerNorm):
    """LayerNorm over the channel axis of an ``(N, C, H, W)`` tensor, per spatial position."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.movedim(1, -1)).movedim(-1, 1)


def check_norm(norm: str | None) -> None:
    """Raise :class:`ModelConfigError` for an unknown normalisation name."""
    if norm not in NORMS:
        raise ModelConfigError(f"norm must be one of {NORMS}, got {norm!r}")


def make_norm(norm: str | None, channels: int, *, conv: bool) -> nn.Module | None:
    """The normalisation module for ``channels`` features, or ``None`` when ``norm`` is None."""
    check_norm(norm)
    if norm is None:
        return None
    if norm == "batch":
        return nn.BatchNorm2d(channels) if conv else nn.BatchNorm1d(channels)
    return ChannelLayerNorm(channels) if conv else nn.LayerNorm(channels)


def scaled_width(base: int, width_multiplier: float) -> int:
    """``round(base * width_multiplier)``; a multiplier that leaves no unit is an error."""
    if (
        isinstance(width_multiplier, bool)
        or not isinstance(width_multiplier, int | float)
        or not math.isfinite(width_multiplier)
        or not width_multiplier > 0
    ):
        raise ModelConfigError(
            f"width_multiplier must be a positive number, got {width_multiplier!r}"
        )
    width = round(base * width_multiplier)
    if width < 1:
        raise ModelConfigError(
            f"width_multiplier {width_multiplier:g} leaves a layer of {base} units with none "
            f"(round({base} × {width_multiplier:g}) = {width}); use more than {0.5 / base:.3g}"
        )
    return width
