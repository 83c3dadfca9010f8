"""CIFAR ResNet-20 (He et al. 2016) with a width multiplier, as in Git Re-Basin."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from lmckit.errors import ModelConfigError, ParamsError
from lmckit.models._builder import SpecBuilder
from lmckit.models.norms import make_norm, scaled_width
from lmckit.options import check_arguments
from lmckit.perm import PermutationSpec

STAGE_CHANNELS = (16, 32, 64)
BLOCKS_PER_STAGE = 3


class BasicBlock(nn.Module):
    """``relu(norm2(conv2(relu(norm1(conv1(x))))) + shortcut(x))``; the shortcut is a 1×1
    conv + norm when the stage changes width or stride, the identity otherwise."""

    def __init__(self, c_in: int, c_out: int, stride: int, norm: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.norm1 = make_norm(norm, c_out, conv=True)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.norm2 = make_norm(norm, c_out, conv=True)
        self.shortcut: nn.Sequential | None = None
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                make_norm(norm, c_out, conv=True),
            )
        self.tap_inner = nn.Identity()  # activation-matching taps; no state
        self.tap_out = nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        h = self.tap_inner(F.relu(self.norm1(self.conv1(x))))
        h = self.norm2(self.conv2(h))
        return self.tap_out(F.relu(h + (x if self.shortcut is None else self.shortcut(x))))


class ResNet20(nn.Module):
    """ResNet-20 for 32×32 images: stem conv, 3 stages × 3 basic blocks (16k, 32k, 64k
    channels, stride 2 at stages 2 and 3), global average pool, linear head.

    Args:
        width_multiplier: ``k`` above (Git Re-Basin uses 1–32; STE-MM uses 16).
        norm: ``"batch"`` or ``"layer"`` (per-position channel LayerNorm).
        in_channels: 3 for CIFAR, 1 for padded (Fashion-)MNIST.
        num_classes: outputs.

    Permutation groups: ``stage{s}`` for the residual stream of each stage (the stem, every
    block's second conv and the stage's shortcut conv write into it) and ``stage{s}.block{b}``
    for each block's interior channels.
    """

    def __init__(
        self,
        width_multiplier: float = 1.0,
        norm: str = "batch",
        in_channels: int = 3,
        num_classes: int = 10,
    ) -> None:
        try:
            check_arguments(ResNet20.__init__, locals(), where="ResNet20: ")
        except ParamsError as exc:
            raise ModelConfigError(str(exc)) from None
        super().__init__()
        if norm not in ("batch", "layer"):
            raise ModelConfigError(f"ResNet20 norm must be 'batch' or 'layer', got {norm!r}")
        if in_channels < 1 or num_classes < 1:
            raise ModelConfigError("in_channels and num_classes must be ≥ 1")
        self.config = {
            "name": "resnet20",
            "width_multiplier": width_multiplier,
            "norm": norm,
            "in_channels": int(in_channels),
            "num_classes": int(num_classes),
        }
        widths = [scaled_width(c, width_multiplier) for c in STAGE_CHANNELS]
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False)
        self.norm1 = make_norm(norm, widths[0], conv=True)
        stages = []
        c_in = widths[0]
        for s, c_out in enumerate(widths):
            blocks = []
            for b in range(BLOCKS_PER_STAGE):
                stride = 2 if s > 0 and b == 0 else 1
                blocks.append(BasicBlock(c_in, c_out, stride, norm))
                c_in = c_out
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(c_in, num_classes)
        self.tap_stem = nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != 4:
            raise ValueError(f"ResNet20 expects (N, C, H, W) images, got shape {tuple(x.shape)}")
        x = self.tap_stem(F.relu(self.norm1(self.conv1(x))))
        x = self.stages(x)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))

    def activation_taps(self) -> dict[str, list[str]]:
        """Group -> modules whose outputs are its post-ReLU channels: a block interior has one
        tap; a residual stream has every point where the stream is materialised (the stem for
        stage 0 and each block's output), whose statistics activation matching sums."""
        taps: dict[str, list[str]] = {"stage0": ["tap_stem"]}
        for s, stage in enumerate(self.stages):
            for k in range(len(stage)):
                taps[f"stage{s}.block{k}"] = [f"stages.{s}.{k}.tap_inner"]
                taps.setdefault(f"stage{s}", []).append(f"stages.{s}.{k}.tap_out")
        return taps

    def layerwise_layers(self) -> list[dict]:
        """Per conv on the main path (``lmckit.analysis.layerwise``), depth counted along it:
        the stem; each block's first conv (post-ReLU tap, ReLU input norm1) and second conv
        (the block output after the residual add, whose ReLU input no module returns); the
        logits last."""
        layers = [
            {"name": "stem", "depth": 1, "post": "tap_stem", "pre": "norm1", "linear": "conv1"}
        ]
        depth = 1
        for s, stage in enumerate(self.stages):
            for k in range(len(stage)):
                p = f"stages.{s}.{k}"
                layers.append(
                    {
                        "name": f"s{s}b{k}.conv1",
                        "depth": depth + 1,
                        "post": f"{p}.tap_inner",
                        "pre": f"{p}.norm1",
                        "linear": f"{p}.conv1",
                    }
                )
                layers.append(
                    {
                        "name": f"s{s}b{k}.conv2",
                        "depth": depth + 2,
                        "post": f"{p}.tap_out",
                        "linear": f"{p}.conv2",
                    }
                )
                depth += 2
        layers.append({"name": "logits", "depth": depth + 1, "post": "", "linear": "fc"})
        return layers

    def permutation_spec(self) -> PermutationSpec:
        """This ResNet's spec, built from its configuration."""
        b = SpecBuilder()
        stream = b.group("stage0", self.conv1.out_channels)
        b.dense("conv1", self.conv1, out=stream, inp=None)
        b.norm("norm1", self.norm1, stream)
        for s, stage in enumerate(self.stages):
            for k, block in enumerate(stage):
                p = f"stages.{s}.{k}"
                inner = b.group(f"stage{s}.block{k}", block.conv1.out_channels)
                out = b.group(f"stage{s}", block.conv2.out_channels)
                b.dense(f"{p}.conv1", block.conv1, out=inner, inp=stream)
                b.norm(f"{p}.norm1", block.norm1, inner)
                b.dense(f"{p}.conv2", block.conv2, out=out, inp=inner)
                b.norm(f"{p}.norm2", block.norm2, out)
                if block.shortcut is not None:
                    b.dense(f"{p}.shortcut.0", block.shortcut[0], out=out, inp=stream)
                    b.norm(f"{p}.shortcut.1", block.shortcut[1], out)
                elif out != stream:
                    raise AssertionError("identity shortcut must stay in one residual stream")
                stream = out
        b.dense("fc", self.fc, out=None, inp=stream)
        return b.build()
