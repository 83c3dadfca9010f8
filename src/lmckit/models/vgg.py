"""CIFAR-style VGG (Git Re-Basin / STE-MM): 3×3 convs, 5 max-pools, one linear head."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from lmckit.errors import ModelConfigError, ParamsError
from lmckit.models._builder import SpecBuilder
from lmckit.models.norms import check_norm, make_norm, scaled_width
from lmckit.options import check_arguments
from lmckit.perm import PermutationSpec

# Channel counts per conv; "M" is a 2×2 max-pool.
CONFIGS: dict[int, list[int | str]] = {
    11: [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    16: [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
}


class VGG(nn.Module):
    """VGG-11/16 for 32×32 inputs: ``[conv3×3 → norm → ReLU]`` blocks with max-pools, then a
    global average pool (a no-op at 1×1, which 32×32 inputs reach) and one Linear classifier,
    as in the REPAIR / STE-MM CIFAR VGGs.

    Args:
        depth: 11 or 16.
        width_multiplier: scales every conv's channels (``round(c * k)``).
        norm: ``"batch"``, ``"layer"`` (per-position channel LayerNorm) or ``None``.
            Convs carry a bias except before BatchNorm, where it would be redundant.
        in_channels: 1 for (padded) MNIST/Fashion-MNIST, 3 for CIFAR.
        num_classes: outputs.

    Permutation groups: ``conv{i}`` for the output channels of the i-th conv.
    """

    def __init__(
        self,
        depth: int = 11,
        width_multiplier: float = 1.0,
        norm: str | None = "batch",
        in_channels: int = 3,
        num_classes: int = 10,
    ) -> None:
        try:
            check_arguments(VGG.__init__, locals(), where="VGG: ")
        except ParamsError as exc:
            raise ModelConfigError(str(exc)) from None
        super().__init__()
        if depth not in CONFIGS:
            raise ModelConfigError(f"VGG depth must be one of {sorted(CONFIGS)}, got {depth!r}")
        check_norm(norm)
        if in_channels < 1 or num_classes < 1:
            raise ModelConfigError("in_channels and num_classes must be ≥ 1")
        self.config = {
            "name": "vgg",
            "depth": int(depth),
            "width_multiplier": width_multiplier,
            "norm": norm,
            "in_channels": int(in_channels),
            "num_classes": int(num_classes),
        }
        self.plan: list[int | str] = []
        convs, norms = [], []
        c_in = in_channels
        for item in CONFIGS[depth]:
            if item == "M":
                self.plan.append("M")
                continue
            c_out = scaled_width(int(item), width_multiplier)
            convs.append(nn.Conv2d(c_in, c_out, 3, padding=1, bias=norm != "batch"))
            norms.append(make_norm(norm, c_out, conv=True))
            self.plan.append(len(convs) - 1)
            c_in = c_out
        self.convs = nn.ModuleList(convs)
        self.norms = nn.ModuleList(norms) if norm is not None else None
        self.classifier = nn.Linear(c_in, num_classes)
        self.taps = nn.ModuleList(nn.Identity() for _ in convs)  # post-ReLU, for matching

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != 4 or min(x.shape[-2:]) < 32:
            raise ValueError(
                f"VGG expects (N, C, H, W) images of at least 32×32, got shape {tuple(x.shape)} "
                "(pad 28×28 images to 32×32)"
            )
        for step in self.plan:
            if step == "M":
                x = F.max_pool2d(x, 2)
                continue
            x = self.convs[step](x)
            if self.norms is not None:
                x = self.norms[step](x)
            x = self.taps[step](F.relu(x))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.classifier(x)

    def activation_taps(self) -> dict[str, list[str]]:
        """Group -> modules whose outputs ``(N, C, H, W)`` are that conv's post-ReLU channels."""
        return {f"conv{i}": [f"taps.{i}"] for i in range(len(self.convs))}

    def layerwise_layers(self) -> list[dict]:
        """Per conv (``lmckit.analysis.layerwise``): its post-ReLU tap, ReLU input and conv;
        the classifier's logits last."""
        n = len(self.convs)
        layers = [
            {
                "name": f"conv{i + 1}",
                "depth": i + 1,
                "post": f"taps.{i}",
                "pre": f"norms.{i}" if self.norms is not None else f"convs.{i}",
                "linear": f"convs.{i}",
            }
            for i in range(n)
        ]
        return [*layers, {"name": "logits", "depth": n + 1, "post": "", "linear": "classifier"}]

    def permutation_spec(self) -> PermutationSpec:
        """This VGG's spec, built from its configuration."""
        b = SpecBuilder()
        prev = None
        for i, conv in enumerate(self.convs):
            g = b.group(f"conv{i}", conv.out_channels)
            b.dense(f"convs.{i}", conv, out=g, inp=prev)
            if self.norms is not None:
                b.norm(f"norms.{i}", self.norms[i], g)
            prev = g
        b.dense("classifier", self.classifier, out=None, inp=prev)
        return b.build()
