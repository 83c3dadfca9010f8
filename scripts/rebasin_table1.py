"""Git Re-Basin Table 1: how many permutation symmetries a 3×512 MLP, VGG-16 and ResNet-50
have, counted from the group lmckit's tracer finds in each model, beside the paper's
numbers and a reading that reproduces them.

The models are the paper's: the MLP 784-512-512-512-10; VGG-16 in its ImageNet layout
(13 convolutions, two hidden fully connected layers of 4096, 1000 classes); ResNet-50
(bottleneck blocks 3-4-6-3 of widths 64-512, expansion 4, projection shortcuts), written
here as plain PyTorch modules and traced by :func:`lmckit.tracing.trace_report` (its check
that a random element of the group keeps the outputs included), on a small input (four 64×64 images:
the count depends on the channels, not the image size).

Two counts per model: ``traced``, ``log10`` of the order of the group the tracer found
(``Σ_g log10(n_g!)``: a residual stream is one group, shared by every layer that writes
to it); and ``per_layer_floor``, ``Σ_layers ⌊log10(n_l!)⌋`` over every hidden layer's
output width as if each had its own permutation — which equals the paper's three numbers
exactly. Writes ``benchmarks/results/rebasin_table1.json``; run from the repository root:
``python scripts/rebasin_table1.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch
from torch import nn

PAPER = {"mlp": 3498, "vgg16": 35160, "resnet50": 55109, "atoms": 82}
"""Git Re-Basin Table 1's exponents (10^N), as printed."""

OUT = Path("benchmarks/results/rebasin_table1.json")


def vgg16() -> nn.Module:
    """VGG-16 (configuration D) in the ImageNet layout, without dropout or batch norm."""
    layers: list[nn.Module] = []
    channels = 3
    for width in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
                  512, 512, 512, "M"):  # fmt: skip
        if width == "M":
            layers.append(nn.MaxPool2d(2))
            continue
        layers += [nn.Conv2d(channels, int(width), 3, padding=1), nn.ReLU()]
        channels = int(width)
    return nn.Sequential(
        *layers,
        nn.AdaptiveAvgPool2d(7),
        nn.Flatten(),
        nn.Linear(512 * 7 * 7, 4096),
        nn.ReLU(),
        nn.Linear(4096, 4096),
        nn.ReLU(),
        nn.Linear(4096, 1000),
    )


class Bottleneck(nn.Module):
    """ResNet-50's block: 1×1 to ``width``, 3×3, 1×1 to ``4·width``, plus the shortcut (a
    1×1 projection with batch norm where the shape changes)."""

    def __init__(self, inputs: int, width: int, stride: int) -> None:
        super().__init__()
        out = 4 * width
        self.conv1, self.bn1 = nn.Conv2d(inputs, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or inputs != out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(inputs, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        return torch.relu(self.bn3(self.conv3(y)) + self.shortcut(x))


def resnet50() -> nn.Module:
    """ResNet-50 (He et al. 2016) for 1000 classes."""
    blocks: list[nn.Module] = []
    inputs = 64
    for stage, (width, count) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3), strict=True)):
        for b in range(count):
            blocks.append(Bottleneck(inputs, width, 2 if b == 0 and stage > 0 else 1))
            inputs = 4 * width
    return nn.Sequential(
        nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(3, stride=2, padding=1),
        *blocks,
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2048, 1000),
    )


def mlp() -> nn.Module:
    from lmckit.models import build_model

    return build_model("mlp", hidden=[512, 512, 512])


def log10_factorial(n: int) -> float:
    return math.lgamma(n + 1) / math.log(10)


def per_layer_floor(model: nn.Module) -> int:
    """``Σ ⌊log10(n!)⌋`` over the output widths of every linear map and convolution but the
    last (the classes), each counted as its own permutation; shortcut projections are not
    layers of their own (their outputs are the block's)."""
    widths = [
        m.out_features if isinstance(m, nn.Linear) else m.out_channels
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear | nn.Conv2d) and "shortcut" not in name
    ]
    return sum(math.floor(log10_factorial(n)) for n in widths[:-1])


def count(name: str, model: nn.Module, example: torch.Tensor) -> dict:
    from lmckit.tracing import trace_report

    model.eval()
    start = time.perf_counter()
    traced = trace_report(model, example)
    spec = traced.spec
    sizes = sorted(spec.groups.values(), reverse=True)
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "groups": len(spec.groups),
        "largest_groups": sizes[:6],
        "traced": spec.log10_num_symmetries(),
        "per_layer_floor": per_layer_floor(model),
        "paper": PAPER[name],
        "checked_modes": list(traced.checked_modes),
        "precision": traced.precision,
        "seconds": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    torch.manual_seed(0)
    image = torch.randn(4, 3, 64, 64)
    results = {
        "mlp": count("mlp", mlp(), torch.randn(2, 784)),
        "vgg16": count("vgg16", vgg16(), image),
        "resnet50": count("resnet50", resnet50(), image),
        "atoms": {"paper": PAPER["atoms"]},
    }
    document = {
        "what": "Git Re-Basin Table 1: log10 of the number of permutation symmetries",
        "torch": torch.__version__,
        "models": results,
    }
    OUT.write_text(json.dumps(document, indent=2) + "\n")
    json.dump(document, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
